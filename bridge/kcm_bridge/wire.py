"""Protobuf wire-format helpers: walk and build OTLP messages without decoding them, and count their points."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

LEN = 2
_VARINT, _I64, _I32 = 0, 1, 5
# Field numbers from opentelemetry/proto/metrics/v1/metrics.proto.
RESOURCE_METRICS = 1        # MetricsData / ExportMetricsServiceRequest


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field."""
    return varint((number << 3) | LEN) + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def fields(data: bytes, limit: int = 0) -> list[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, end) of each top-level field, or of the first `limit` when
    it is positive (the rest is not walked); ValueError if malformed."""
    found: list[tuple[int, int, int, int, int]] = []
    position, size = 0, len(data)
    try:
        while position < size:
            start = position
            # Tags and lengths of the messages walked here are mostly one byte: read those inline.
            tag = data[position]
            if tag < 0x80:
                position += 1
            else:
                tag, position = _read_varint(data, position)
            wire_type = tag & 7
            if wire_type == LEN:
                length = data[position]
                if length < 0x80:
                    position += 1
                else:
                    length, position = _read_varint(data, position)
                value_start, position = position, position + length
            elif wire_type == _VARINT:
                value_start = position
                _, position = _read_varint(data, position)
            elif wire_type == _I64:
                value_start, position = position, position + 8
            elif wire_type == _I32:
                value_start, position = position, position + 4
            else:
                raise ValueError(f"unsupported protobuf wire type {wire_type}")
            if position > size or tag >> 3 == 0:
                raise ValueError("truncated or malformed protobuf field")
            found.append((tag >> 3, wire_type, start, value_start, position))
            if limit and len(found) == limit:
                break
    except IndexError:
        raise ValueError("truncated protobuf varint") from None
    return found


def count_points(metrics_data: bytes) -> int:
    """Data points in a serialised MetricsData; raises ValueError unless it parses as one."""
    try:
        metrics = _MergedMetricsData.FromString(metrics_data).resource_metrics.scope_metrics.metrics
    except Exception as err:  # protobuf's DecodeError, or recursion limits on hostile input
        raise ValueError(f"not an OTLP MetricsData protobuf: {err}") from None
    total = len(metrics.gauge.data_points) + len(metrics.sum.data_points)
    # Clients rarely send these kinds; asking first is cheaper than building their empty lists.
    if metrics.HasField("histogram"):
        total += len(metrics.histogram.data_points)
    if metrics.HasField("exponential_histogram"):
        total += len(metrics.exponential_histogram.data_points)
    if metrics.HasField("summary"):
        total += len(metrics.summary.data_points)
    return total


def _merged_metrics_data() -> type[Message]:
    """OTLP's MetricsData schema with `resource_metrics`, `scope_metrics` and `metrics` singular, not repeated.

    A parser merges every occurrence of a singular message field into one, so every metric of a payload collapses
    into one Metric whose point lists hold all its points: one parse (upb, in C) checks every byte exactly as the
    real schema does, and counting is five `len` calls instead of a Python walk over each metric (several times
    less CPU per record). The data kinds leave their oneof, or a later metric's kind would clear an earlier one's
(so one metric carrying two kinds, which no encoder writes, counts the points of both).
    """
    real = MetricsData.DESCRIPTOR.file
    file = descriptor_pb2.FileDescriptorProto()
    real.CopyToProto(file)
    package = "kcm.bridge.merged"
    old_prefix, new_prefix = f".{file.package}.", f".{package}."
    file.name, file.package = "kcm_bridge/merged_metrics.proto", package
    file.ClearField("options")
    singular = {"MetricsData": "resource_metrics", "ResourceMetrics": "scope_metrics", "ScopeMetrics": "metrics"}
    for message in file.message_type:
        for added in message.field:
            if added.type_name.startswith(old_prefix):
                added.type_name = new_prefix + added.type_name[len(old_prefix):]
            if singular.get(message.name) == added.name:
                added.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            if message.name == "Metric" and added.HasField("oneof_index"):
                added.ClearField("oneof_index")
        if message.name == "Metric":
            message.ClearField("oneof_decl")
    pool = descriptor_pool.DescriptorPool()
    for dependency in real.dependencies:
        dependency_proto = descriptor_pb2.FileDescriptorProto()
        dependency.CopyToProto(dependency_proto)
        pool.Add(dependency_proto)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.MetricsData"))


_MergedMetricsData = _merged_metrics_data()
