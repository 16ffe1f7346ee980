"""Specification of the metrics-topic contract v1 codec (common/kcm_common/contract.py)."""

from __future__ import annotations

import gzip
import json
import pickle
import time
import tracemalloc
import zlib
from collections.abc import Callable

import cramjam
import lz4.frame
import pytest
import zstandard
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_DELTA,
    Exemplar,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from kcm_common.contract import (
    ATTRIBUTE_HEADERS,
    COMPRESSION_IDS,
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_PROTOBUF,
    ENCODINGS,
    DecodeError,
    compress,
    decode,
    decompress,
    encode,
)

REASONS = {
    "unknown-encoding",
    "decompress-failed",
    "too-large",
    "invalid-protobuf",
    "invalid-json",
    "empty",
    "unknown-content-type",
}
COMPRESSED = [encoding for encoding in ENCODINGS if encoding != "none"]
CONTENT_TYPES = [CONTENT_TYPE_PROTOBUF, CONTENT_TYPE_JSON]
TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")
SPAN_ID = bytes.fromhex("eee19b7ec3c1b174")
START_NS = 1_700_000_000_000_000_000
NOW_NS = START_NS + 30_000_000_000


def attr(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def client_metrics() -> MetricsData:
    """What a Java producer pushes: a gauge, a monotonic delta sum and a latency histogram."""
    point_attrs = [attr("topic", "orders"), attr("partition", "3")]
    gauge = Metric(
        name="org.apache.kafka.producer.record.queue.time.max",
        unit="ms",
        gauge=Gauge(
            data_points=[NumberDataPoint(time_unix_nano=NOW_NS, as_double=12.5, attributes=point_attrs)]
        ),
    )
    delta_sum = Metric(
        name="org.apache.kafka.producer.topic.record.send.total",
        description="records sent",
        sum=Sum(
            aggregation_temporality=AGGREGATION_TEMPORALITY_DELTA,
            is_monotonic=True,
            data_points=[
                NumberDataPoint(
                    start_time_unix_nano=START_NS,
                    time_unix_nano=NOW_NS,
                    as_int=4321,
                    attributes=point_attrs,
                    exemplars=[Exemplar(time_unix_nano=NOW_NS, as_int=7, trace_id=TRACE_ID, span_id=SPAN_ID)],
                )
            ],
        ),
    )
    histogram = Metric(
        name="org.apache.kafka.producer.request.latency",
        unit="ms",
        histogram=Histogram(
            aggregation_temporality=AGGREGATION_TEMPORALITY_DELTA,
            data_points=[
                HistogramDataPoint(
                    start_time_unix_nano=START_NS,
                    time_unix_nano=NOW_NS,
                    count=10,
                    sum=123.0,
                    min=1.0,
                    max=40.0,
                    bucket_counts=[2, 5, 3],
                    explicit_bounds=[5.0, 20.0],
                    attributes=[attr("node_id", "1")],
                )
            ],
        ),
    )
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource(attributes=[attr("service.name", "checkout")]),
                scope_metrics=[
                    ScopeMetrics(
                        scope=InstrumentationScope(name="org.apache.kafka", version="3.9.0"),
                        metrics=[gauge, delta_sum, histogram],
                    )
                ],
            )
        ]
    )


ATTRIBUTES = {
    "client_instance_id": "2a1e4c7e-7b4f-4f4e-9d1f-0c3c6e0b7f11",
    "client_id": "checkout-producer",
    "client_software_name": "apache-kafka-java",
    "client_software_version": "3.9.0",
    "client_source_address": "10.0.0.7",
    "client_source_port": "51234",
    "principal": "User:checkout",
    "listener_name": "PLAINTEXT",
    "security_protocol": "PLAINTEXT",
    "broker_id": "1",
    "cluster_id": "MkU3OEVBNTcwNTJENDM2Qk",
    "subscription_id": "1234",
    "push_interval_ms": "30000",
    "terminating": "false",
}


def reason_of(value: bytes | None, headers: list[tuple[str, bytes]] | None = None, **kwargs: int) -> str:
    with pytest.raises(DecodeError) as caught:
        decode(value, headers, **kwargs)
    assert str(caught.value) and "\n" not in str(caught.value)
    return caught.value.reason


def zeros_compressed(encoding: str, size: int) -> bytes:
    """A decompression bomb: `size` zero bytes, compressed without holding them all in memory."""
    chunk, chunks = b"\0" * (1 << 20), size >> 20
    if encoding == "gzip":
        compressor = zlib.compressobj(9, wbits=31)
        return b"".join(compressor.compress(chunk) for _ in range(chunks)) + compressor.flush()
    if encoding == "zstd":
        compressor = zstandard.ZstdCompressor().compressobj()
        return b"".join(compressor.compress(chunk) for _ in range(chunks)) + compressor.flush()
    if encoding == "lz4":
        compressor = lz4.frame.LZ4FrameCompressor()
        parts = [compressor.begin()] + [compressor.compress(chunk) for _ in range(chunks)]
        return b"".join(parts) + compressor.flush()
    return compress(b"\0" * size, encoding)


# --- round trips and headers -------------------------------------------------------------------


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_encode_then_decode_returns_the_same_metrics_and_attributes(encoding: str, content_type: str) -> None:
    metrics = client_metrics()
    value, headers = encode(
        metrics, attributes=ATTRIBUTES, content_type=content_type, content_encoding=encoding
    )
    record = decode(value, headers)
    assert record.metrics == metrics
    assert record.attributes == ATTRIBUTES


def test_encode_writes_content_headers_first_then_attributes_in_contract_order() -> None:
    shuffled = dict(reversed(list(ATTRIBUTES.items())))
    _, headers = encode(client_metrics(), attributes=shuffled, content_encoding="zstd")
    assert headers[:2] == [("content-type", b"application/x-protobuf"), ("content-encoding", b"zstd")]
    assert [name for name, _ in headers[2:]] == list(ATTRIBUTE_HEADERS)
    assert all(isinstance(raw, bytes) for _, raw in headers)


def test_encode_always_writes_content_headers_even_without_attributes() -> None:
    value, headers = encode(client_metrics())
    assert headers == [("content-type", b"application/x-protobuf"), ("content-encoding", b"none")]
    assert value == client_metrics().SerializeToString()


def test_encode_writes_already_serialised_metrics_unchanged() -> None:
    payload = client_metrics().SerializeToString()
    value, headers = encode(payload, attributes={"client_id": "a"}, content_encoding="lz4")
    assert decompress(value, "lz4") == payload
    assert decode(value, headers).metrics == client_metrics()
    with pytest.raises(ValueError, match="protobuf"):
        encode(payload, content_type=CONTENT_TYPE_JSON)


def test_encode_rejects_an_attribute_that_is_not_a_contract_header() -> None:
    with pytest.raises(ValueError, match="client_rack"):
        encode(client_metrics(), attributes={"client_id": "a", "client_rack": "r1"})


@pytest.mark.parametrize("bad", [{"content_type": "text/plain"}, {"content_encoding": "brotli"}])
def test_encode_rejects_unknown_content_type_or_encoding(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad.values()))):
        encode(client_metrics(), **bad)


def test_encode_as_json_writes_otlp_json_with_hex_ids_and_integer_enums() -> None:
    value, _ = encode(client_metrics(), content_type=CONTENT_TYPE_JSON)
    document = json.loads(value)
    sum_metric = document["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][1]["sum"]
    assert sum_metric["aggregationTemporality"] == AGGREGATION_TEMPORALITY_DELTA
    assert sum_metric["dataPoints"][0]["exemplars"][0]["traceId"] == TRACE_ID.hex()
    assert sum_metric["dataPoints"][0]["exemplars"][0]["spanId"] == SPAN_ID.hex()


def test_only_contract_headers_become_attributes() -> None:
    value, _ = encode(client_metrics())
    headers = [("client_id", b"c1"), ("traceparent", b"00-abc"), ("Client_Id", b"other"), ("broker_id", b"2")]
    assert decode(value, headers).attributes == {"client_id": "c1", "broker_id": "2"}


def test_header_values_may_be_str_null_repeated_or_bad_utf8() -> None:
    value, _ = encode(client_metrics())
    headers = [
        ("client_id", b"first"),
        ("client_id", "second"),
        ("principal", None),
        ("cluster_id", b"k\xff1"),
    ]
    assert decode(value, headers).attributes == {"client_id": "second", "cluster_id": "k\ufffd1"}


def test_content_type_with_parameters_is_accepted() -> None:
    value, _ = encode(client_metrics(), content_type=CONTENT_TYPE_JSON)
    headers = [("content-type", b"Application/JSON; charset=utf-8")]
    assert decode(value, headers).metrics == client_metrics()


def test_compression_ids_follow_kip_714() -> None:
    assert COMPRESSION_IDS == {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    assert tuple(COMPRESSION_IDS.values()) == ENCODINGS


# --- records from other writers ----------------------------------------------------------------


def test_headerless_plain_protobuf_decodes() -> None:
    record = decode(client_metrics().SerializeToString())
    assert record.metrics == client_metrics()
    assert record.attributes == {}


def test_headerless_proto3_json_as_the_collector_writes_it_decodes() -> None:
    value = json_format.MessageToJson(client_metrics()).encode()
    assert decode(value).metrics == client_metrics()


@pytest.mark.parametrize("prefix", [b"\n", b"\r\n  ", b"\xef\xbb\xbf", b"\xef\xbb\xbf\n"],
                         ids=["newline", "crlf-and-spaces", "bom", "bom-and-newline"])
def test_headerless_json_after_a_newline_or_a_byte_order_mark_decodes(prefix: bytes) -> None:
    # A pretty-printed file or a Windows editor's, produced without headers (kcat -P).
    value = prefix + json_format.MessageToJson(client_metrics(), indent=2).encode()
    assert decode(value).metrics == client_metrics()


def test_headerless_protobuf_whose_first_bytes_read_as_newline_and_brace_is_protobuf() -> None:
    data = MetricsData()
    resource = data.resource_metrics.add().resource
    resource.attributes.add(key="k").value.string_value = "v" * 112
    value = data.SerializeToString()
    assert value[:2] == b"\n{"  # field 1 with a length of 123: "{" after JSON whitespace
    assert decode(value).metrics == data


def test_a_corrupt_headerless_protobuf_starting_with_newline_and_brace_is_invalid_protobuf() -> None:
    data = MetricsData()
    data.resource_metrics.add().resource.attributes.add(key="k").value.string_value = "v" * 112
    assert reason_of(data.SerializeToString()[:-5]) == "invalid-protobuf"


def test_headerless_otlp_json_with_camel_case_keys_decodes() -> None:
    value = (
        b'{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"x",'
        b'"gauge":{"dataPoints":[{"asDouble":1.5,"timeUnixNano":"1"}]}}]}]}]}'
    )
    point = decode(value).metrics.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    assert (point.as_double, point.time_unix_nano) == (1.5, 1)


def test_otlp_json_with_snake_case_keys_hex_ids_and_unknown_fields_decodes() -> None:
    document = {
        "resource_metrics": [
            {
                "schema_url": "https://opentelemetry.io/schemas/1.21.0",
                "future_field": {"a": 1},
                "scope_metrics": [
                    {
                        "metrics": [
                            {
                                "name": "records",
                                "sum": {
                                    "aggregation_temporality": 1,
                                    "is_monotonic": True,
                                    "data_points": [
                                        {
                                            "as_int": "5",
                                            "exemplars": [
                                                {
                                                    "as_int": 1,
                                                    "trace_id": TRACE_ID.hex(),
                                                    "span_id": SPAN_ID.hex(),
                                                }
                                            ],
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                ],
            }
        ]
    }
    value = json.dumps(document).encode()
    metrics = decode(value, [("content-type", b"application/json")]).metrics
    metric = metrics.resource_metrics[0].scope_metrics[0].metrics[0]
    assert metric.sum.aggregation_temporality == AGGREGATION_TEMPORALITY_DELTA
    assert metric.sum.data_points[0].as_int == 5
    assert metric.sum.data_points[0].exemplars[0].trace_id == TRACE_ID
    assert metric.sum.data_points[0].exemplars[0].span_id == SPAN_ID


def test_compressed_headerless_json_is_recognised_after_decompression() -> None:
    value = compress(json_format.MessageToJson(client_metrics()).encode(), "gzip")
    assert decode(value, [("content-encoding", b"gzip")]).metrics == client_metrics()


# The raw snappy block format is one block by definition, so it has no concatenation.
@pytest.mark.parametrize("encoding", ["gzip", "lz4", "zstd"])
def test_concatenated_frames_decompress_as_one_stream(encoding: str) -> None:
    assert decompress(compress(b"abc", encoding) + compress(b"def", encoding), encoding) == b"abcdef"


# --- every reason, caused ----------------------------------------------------------------------


def test_unknown_encoding() -> None:
    value, _ = encode(client_metrics())
    assert reason_of(value, [("content-encoding", b"brotli")]) == "unknown-encoding"
    with pytest.raises(DecodeError, match="brotli") as caught:
        decompress(value, "brotli")
    assert caught.value.reason == "unknown-encoding"


@pytest.mark.parametrize("encoding", COMPRESSED)
@pytest.mark.parametrize("damage", ["truncated", "corrupted", "trailing-garbage", "not-compressed"])
def test_corrupt_compressed_data_is_decompress_failed(encoding: str, damage: str) -> None:
    good = compress(client_metrics().SerializeToString() * 20, encoding)
    bad = {
        "truncated": good[: len(good) // 2],
        "corrupted": good[:4] + bytes(b ^ 0x5A for b in good[4:]),
        "trailing-garbage": good + b"\x07garbage",
        "not-compressed": b"\x07\x08\x09 plainly not a compressed stream",
    }[damage]
    assert reason_of(bad, [("content-encoding", encoding.encode())]) == "decompress-failed"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_payload_beyond_the_cap_is_too_large(encoding: str) -> None:
    value, headers = encode(client_metrics(), content_encoding=encoding)
    size = len(client_metrics().SerializeToString())
    assert decode(value, headers, max_decompressed_bytes=size).metrics == client_metrics()
    assert reason_of(value, headers, max_decompressed_bytes=size - 1) == "too-large"


@pytest.mark.parametrize("encoding", ["gzip", "lz4", "zstd"])
def test_decompression_bomb_is_rejected_without_inflating_it(encoding: str) -> None:
    bomb = zeros_compressed(encoding, 256 << 20)
    assert len(bomb) < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as caught:
            decompress(bomb, encoding, max_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "too-large"
    assert peak < 8 << 20


def _xerial(*blocks: bytes) -> bytes:
    header = b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
    framed = [len(raw := bytes(cramjam.snappy.compress_raw(block))).to_bytes(4, "big") + raw for block in blocks]
    return header + b"".join(framed)


def test_snappy_also_reads_the_xerial_framing_java_clients_push() -> None:
    payload = client_metrics().SerializeToString()
    half = len(payload) // 2

    assert decompress(_xerial(payload[:half], payload[half:]), "snappy") == payload
    with pytest.raises(DecodeError) as truncated:
        decompress(_xerial(payload)[:-3], "snappy")
    assert truncated.value.reason == "decompress-failed"
    with pytest.raises(DecodeError) as too_large:
        decompress(_xerial(payload, payload), "snappy", max_bytes=len(payload) + 1)
    assert too_large.value.reason == "too-large"


def test_snappy_bomb_is_rejected_from_its_length_preamble() -> None:
    # A preamble claiming 4 GiB followed by nothing: rejected before any allocation is attempted.
    claims_4gib = b"\xff\xff\xff\xff\x0f" + b"\0" * 8
    with pytest.raises(DecodeError) as caught:
        decompress(claims_4gib, "snappy", max_bytes=1 << 20)
    assert caught.value.reason == "too-large"


@pytest.mark.parametrize(
    "value",
    [b"\x0a\xff\x01", b"\x0a\x05\x0a\x03", b"\xff\xff\xff\xff", b"\x0b"],
    ids=["length-past-end", "nested-truncated", "bad-varint", "unsupported-wire-type"],
)
def test_malformed_protobuf_is_invalid_protobuf(value: bytes) -> None:
    assert reason_of(value) == "invalid-protobuf"
    assert reason_of(value, [("content-type", CONTENT_TYPE_PROTOBUF.encode())]) == "invalid-protobuf"


def length_delimited(field_number: int, payload: bytes) -> bytes:
    size, varint = len(payload), bytearray()
    while size > 0x7F:
        varint.append(size & 0x7F | 0x80)
        size >>= 7
    varint.append(size)
    return bytes([field_number << 3 | 2]) + bytes(varint) + payload


def test_deeply_nested_protobuf_is_invalid_protobuf() -> None:
    # AnyValue.kvlist_value nested far beyond the parser's depth limit, inside a resource attribute.
    any_value = length_delimited(1, b"leaf")
    for _ in range(200):
        any_value = length_delimited(6, length_delimited(1, length_delimited(2, any_value)))
    attribute = length_delimited(2, any_value)
    value = length_delimited(1, length_delimited(1, length_delimited(1, attribute)))
    assert reason_of(value) == "invalid-protobuf"


@pytest.mark.parametrize(
    "value",
    [
        b"{not json",
        b'{"resourceMetrics": 5}',
        b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"gauge": '
        b'{"dataPoints": [{"asDouble": "many"}]}}]}]}]}',
        b'{"resourceMetrics": [{"resource": {"attributes": [{"key": "k\xff"}]}}]}',
        b"[1, 2, 3]",
        b"{" * 100_000,
    ],
    ids=["syntax", "wrong-shape", "wrong-type", "bad-utf8", "not-an-object", "deep-nesting"],
)
def test_malformed_json_is_invalid_json(value: bytes) -> None:
    assert reason_of(value, [("content-type", CONTENT_TYPE_JSON.encode())]) == "invalid-json"


def test_otlp_json_of_more_objects_than_the_bound_is_too_large_before_it_is_parsed() -> None:
    from kcm_common.contract import MAX_JSON_OBJECTS

    def gauge_of(points: int) -> bytes:
        return (b'{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":['
                + b",".join([b"{}"] * points) + b"]}}]}]}]}")

    headers = [("content-type", CONTENT_TYPE_JSON.encode())]
    assert reason_of(gauge_of(MAX_JSON_OBJECTS), headers) == "too-large"
    assert reason_of(gauge_of(MAX_JSON_OBJECTS).lstrip(b" "), []) == "too-large"   # headerless too
    small = decode(gauge_of(1000), headers).metrics
    assert len(small.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points) == 1000


@pytest.mark.parametrize(("item", "times"), [(b"[[]]", 1_000_002), (b"[]", 1_000_002), (b"1", 1_000_002),
                                             (b"[[[[[[[[]]]]]]]]", 30_000)],
                         ids=["nested-arrays", "arrays", "numbers", "deeply-nested-arrays"])
def test_otlp_json_of_more_values_or_arrays_than_the_bound_is_too_large_before_it_is_parsed(item: bytes,
                                                                                         times: int) -> None:
    """Only objects were counted: 16 MiB of `[[]],` (1.5 KB of zstd) took 4.7 s and 610 MiB in json.loads, and then
    passed as an empty MetricsData; commas alone let `[[[[[[[[]]]]]]]],` build eight lists per comma."""
    from kcm_common.contract import MAX_JSON_OBJECTS

    many = b'{"x":[' + b",".join([item] * times) + b"]}"   # past 1,000,000 values, or 200,000 arrays
    value = compress(many, "zstd")
    assert len(value) < 100_000
    assert reason_of(value, [("content-type", CONTENT_TYPE_JSON.encode()), ("content-encoding", b"zstd")]) \
        == "too-large"
    fewer = b'{"x":[' + b",".join([item] * (MAX_JSON_OBJECTS // 4 // max(1, item.count(b"[")))) + b"]}"
    assert len(decode(fewer, [("content-type", CONTENT_TYPE_JSON.encode())]).metrics.resource_metrics) == 0


def _nested(tag: int, body: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes((value,))


def _points(points: bytes) -> bytes:
    """MetricsData{resource_metrics{scope_metrics{metrics{gauge{`points`}}}}} on the wire."""
    return _nested(0x0A, _nested(0x12, _nested(0x12, _nested(0x2A, points))))


def test_protobuf_building_more_messages_than_the_bound_is_too_large_before_it_is_parsed() -> None:
    """16 MiB of empty data points (1.5 KB of zstd) parsed into 8 million messages, some 670 MiB: a bridge pod's limit
    is 512 MiB, and it would read the record again after its restart."""
    from kcm_common.message_bound import MAX_MESSAGES

    hostile = compress(_points(b"\x0a\x00" * (MAX_MESSAGES + 1)), "zstd")
    assert len(hostile) < 100_000
    for headers in ([("content-encoding", b"zstd")],
                    [("content-type", CONTENT_TYPE_PROTOBUF.encode()), ("content-encoding", b"zstd")]):
        assert reason_of(hostile, headers) == "too-large"


def test_a_group_field_in_front_does_not_hide_the_messages_behind_it() -> None:
    """The walk stopped at a group's tag and called the payload small; protobuf skips groups and parsed the rest."""
    from kcm_common.message_bound import MAX_MESSAGES

    hostile = compress(b"\x9b\x06\x9c\x06" + b"\x0a\x00" * (MAX_MESSAGES + 1), "zstd")   # a group, then messages
    assert reason_of(hostile, [("content-encoding", b"zstd")]) == "too-large"


def test_an_endless_varint_is_read_no_further_than_protobuf_reads_one() -> None:
    """A varint has 10 bytes at most: 2 MB of 0xFF (91 bytes of zstd) was read as one growing number, for hours."""
    from kcm_common.message_bound import builds_more_than

    started = time.process_time()
    assert not builds_more_than(b"\xff" * 2_000_001 + b"\x00")   # malformed: the parser says so
    assert reason_of(compress(b"\xff" * 2_000_001 + b"\x00", "zstd"), [("content-encoding", b"zstd")]) \
        == "invalid-protobuf"
    assert time.process_time() - started < 5


def test_a_large_protobuf_within_the_bound_is_counted_exactly_and_decodes() -> None:
    from kcm_common.message_bound import builds_more_than

    point = MetricsData()
    gauge_point = point.resource_metrics.add().scope_metrics.add().metrics.add(name="g").gauge.data_points.add(
        time_unix_nano=1, as_double=1.5)
    gauge_point.attributes.add(key="topic").value.string_value = "orders"
    one = point.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].SerializeToString()
    points = 60_000
    payload = _points(_nested(0x0A, one) * points)
    built = 4 + points * 3  # the four levels, then each point with its KeyValue and AnyValue
    assert len(payload) > 2 * built  # long enough to be walked, not let through by its size
    assert not builds_more_than(payload, built) and builds_more_than(payload, built - 1)
    decoded = decode(compress(payload, "zstd"), [("content-encoding", b"zstd")]).metrics
    assert len(decoded.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points) == points


def test_headerless_value_that_looks_like_json_but_is_not_is_invalid_json() -> None:
    assert reason_of(b'{"resourceMetrics": ') == "invalid-json"


@pytest.mark.parametrize("value", [None, b""])
def test_missing_value_is_empty(value: bytes | None) -> None:
    assert reason_of(value, [("content-type", CONTENT_TYPE_PROTOBUF.encode())]) == "empty"


@pytest.mark.parametrize("encoding", COMPRESSED)
def test_value_that_decompresses_to_nothing_is_empty(encoding: str) -> None:
    assert reason_of(compress(b"", encoding), [("content-encoding", encoding.encode())]) == "empty"


@pytest.mark.parametrize(
    "content_type", [b"text/plain", b"application/x-protobuf-but-not", b"application/grpc"]
)
def test_other_content_types_are_unknown_content_type(content_type: bytes) -> None:
    value, _ = encode(client_metrics())
    assert reason_of(value, [("content-type", content_type)]) == "unknown-content-type"


def test_decode_error_survives_pickling_with_its_reason() -> None:
    with pytest.raises(DecodeError) as caught:
        decode(b"")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.reason, str(copy)) == ("empty", str(caught.value))
    assert isinstance(copy, ValueError)


# --- properties: hostile input only ever yields DecodeError ------------------------------------

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER_CHOICES = st.tuples(
    st.sampled_from([None, *CONTENT_TYPES]),
    st.sampled_from([None, *ENCODINGS]),
)


def record_headers(content_type: str | None, encoding: str | None) -> list[tuple[str, bytes]]:
    headers = [] if content_type is None else [("content-type", content_type.encode())]
    return headers + ([] if encoding is None else [("content-encoding", encoding.encode())])


def decodes_or_rejects(value: bytes, headers: list[tuple[str, bytes]]) -> None:
    try:
        record = decode(value, headers, max_decompressed_bytes=1 << 16)
    except DecodeError as err:
        assert err.reason in REASONS
        assert str(err)
    else:
        assert isinstance(record.metrics, MetricsData)


@PROPERTY
@given(value=st.binary(max_size=512), choice=HEADER_CHOICES)
def test_random_bytes_decode_or_raise_decode_error(
    value: bytes, choice: tuple[str | None, str | None]
) -> None:
    decodes_or_rejects(value, record_headers(*choice))


@PROPERTY
@given(
    content_type=st.sampled_from(CONTENT_TYPES),
    encoding=st.sampled_from(ENCODINGS),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=7)), max_size=4),
    keep=st.floats(min_value=0.0, max_value=1.0),
    header_choice=HEADER_CHOICES,
)
def test_damaged_valid_records_decode_or_raise_decode_error(
    content_type: str,
    encoding: str,
    flips: list[tuple[int, int]],
    keep: float,
    header_choice: tuple[str | None, str | None],
) -> None:
    value, headers = encode(
        client_metrics(), attributes=ATTRIBUTES, content_type=content_type, content_encoding=encoding
    )
    damaged = bytearray(value[: max(1, round(len(value) * keep))])
    for position, bit in flips:
        damaged[position % len(damaged)] ^= 1 << bit
    decodes_or_rejects(bytes(damaged), headers)
    # The same damaged bytes read under the wrong or missing headers must be just as safe.
    decodes_or_rejects(bytes(damaged), record_headers(*header_choice))


@PROPERTY
@given(
    data=st.binary(max_size=256),
    encoding=st.sampled_from(ENCODINGS),
    cap=st.integers(min_value=0, max_value=300),
)
def test_compress_round_trips_and_the_cap_is_exact(data: bytes, encoding: str, cap: int) -> None:
    packed = compress(data, encoding)
    if len(data) <= cap:
        assert decompress(packed, encoding, max_bytes=cap) == data
    else:
        with pytest.raises(DecodeError) as caught:
            decompress(packed, encoding, max_bytes=cap)
        assert caught.value.reason == "too-large"


def test_gzip_output_is_standard_gzip() -> None:
    assert gzip.decompress(compress(b"hello", "gzip")) == b"hello"


def _empty_frames(encoding: str, total: int) -> bytes:
    one = compress(b"", encoding)
    return one * (total // len(one))


def _best_time(action: Callable[[], object], runs: int = 5) -> float:
    """The least CPU time of this thread `action` took: time the machine gave other processes does not count."""
    best = float("inf")
    for _ in range(runs):
        start = time.thread_time()
        action()
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize("encoding", ["gzip", "lz4", "zstd"])
def test_many_empty_frames_decompress_in_time_linear_in_the_input(encoding: str) -> None:
    # A push of ~100k empty frames once cost time quadratic in its size (each frame copied what followed it).
    small, large = _empty_frames(encoding, 256 << 10), _empty_frames(encoding, 1 << 20)
    assert decompress(large, encoding, max_bytes=1) == b""

    ratio = _best_time(lambda: decompress(large, encoding)) / _best_time(lambda: decompress(small, encoding))

    assert ratio < 8, f"4x the input took {ratio:.1f}x the time"


@pytest.mark.parametrize("unknown", [b"\x28\x01", b"\x29" + b"\0" * 8, b"\x2d" + b"\0" * 4, b"\x2a\x03\0\0\0"],
                         ids=["varint", "fixed64", "fixed32", "length-delimited"])
def test_an_unknown_field_of_any_wire_type_in_front_does_not_hide_the_messages_behind_it(unknown) -> None:
    """Each wire type is stepped over by its own width: one stepped wrongly (a fixed32 as 8 bytes) loses the walk's
    place, and 1.2 million empty ResourceMetrics behind it were parsed whole."""
    from kcm_common.message_bound import MAX_MESSAGES, builds_more_than

    hostile = unknown + b"\x2a\x03\0\0\0" + b"\x0a\x00" * (MAX_MESSAGES + 200_000)
    assert builds_more_than(hostile)
    assert reason_of(compress(hostile, "zstd"), [("content-encoding", b"zstd")]) == "too-large"


def test_content_encoding_is_read_whatever_its_case_and_surrounding_space() -> None:
    value = compress(MetricsData().SerializeToString() + b"\x0a\x00", "gzip")
    assert len(decode(value, [("content-encoding", b" GZIP ")]).metrics.resource_metrics) == 1


@pytest.mark.parametrize("flag", [True, False])
def test_encode_writes_boolean_attributes_as_true_and_false(flag) -> None:
    _, headers = encode(MetricsData(), attributes={"terminating": flag, "client_id": "c"})
    assert dict(headers)["terminating"] == (b"true" if flag else b"false")
    assert decode(*encode(b"\x0a\x00", attributes={"terminating": flag})).attributes["terminating"] == (
        "true" if flag else "false")
