"""Protobuf wire-format helpers: walk and build OTLP messages without decoding them, and count their points."""

from __future__ import annotations

from collections.abc import Iterator

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


def fields(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, end) of each top-level field; ValueError if malformed."""
    position, size = 0, len(data)
    while position < size:
        start = position
        try:
            tag, position = _read_varint(data, position)
            wire_type = tag & 7
            if wire_type == LEN:
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
        except IndexError:
            raise ValueError("truncated protobuf varint") from None
        if position > size or tag >> 3 == 0:
            raise ValueError("truncated or malformed protobuf field")
        yield tag >> 3, wire_type, start, value_start, position


def count_points(metrics_data: bytes) -> int:
    """Data points in a serialised MetricsData; raises ValueError unless it parses as one.

    The C (upb) parser is faster than walking the fields in Python, and it checks the whole message.
    """
    try:
        metrics = MetricsData.FromString(metrics_data)
    except Exception as err:  # protobuf's DecodeError, or recursion limits on hostile input
        raise ValueError(f"not an OTLP MetricsData protobuf: {err}") from None
    total = 0
    for resource_metrics in metrics.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total
