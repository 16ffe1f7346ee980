"""The columnar flatten that `mapInArrow` runs: one row per data point, identity from headers, resource or key, and
one row with its reason per record that does not follow the contract."""

from __future__ import annotations

import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kcm_rollups.decode import DECODE_INPUT_SCHEMA, POINTS_SCHEMA, flatten, header_columns
from payloads import client_metrics


def records_batch(records: list[tuple[str, bytes, dict | list]]) -> pa.RecordBatch:
    """What `decode_input` hands to mapInArrow: (key, value, headers as a dict or a list of pairs) per record."""
    def pairs(headers):
        if headers is None:  # Spark's Kafka source without includeHeaders
            return None
        items = headers.items() if isinstance(headers, dict) else headers
        return [(name, value.encode() if isinstance(value, str) else value) for name, value in items]

    return pa.RecordBatch.from_pydict(
        {"key": [k for k, _, _ in records], "value": [v for _, v, _ in records], "topic": ["t"] * len(records),
         "partition": [0] * len(records), "offset": list(range(len(records))),
         "record_micros": [1_000_000 * i for i in range(len(records))],
         "headers": [pairs(h) for _, _, h in records]}, schema=DECODE_INPUT_SCHEMA)


def test_points_are_flattened_with_identity_from_headers_resource_or_key():
    headed = client_metrics("orders")
    plain = client_metrics("billing")
    plain.resource_metrics[0].resource.attributes.append(
        KeyValue(key="client_id", value=AnyValue(string_value="billing-app")))
    batch = records_batch([
        ("id-1", headed.SerializeToString(), {"client_id": "orders-app", "client_instance_id": "id-1",
                                              "client_software_name": "librdkafka", "principal": "User:orders"}),
        ("id-2", plain.SerializeToString(), {}),  # a plain OTLP record from another writer: no headers at all
    ])
    out = flatten(batch)
    assert out.schema.names == POINTS_SCHEMA.names
    rows = out.to_pylist()
    assert [(r["client_id"], r["client_instance_id"], r["metric"].rsplit(".", 1)[-1]) for r in rows] == [
        ("orders-app", "id-1", "avg"), ("orders-app", "id-1", "total"),
        ("billing-app", "id-2", "avg"), ("billing-app", "id-2", "total")]
    assert [r["record_first"] for r in rows] == [True, False, True, False]
    assert rows[0]["principal"] == "User:orders" and rows[0]["client_software_name"] == "librdkafka"
    assert (rows[0]["type"], rows[0]["value"], rows[0]["attributes"]) == ("gauge", 12.5, '{"node_id":"1"}')
    assert (rows[1]["type"], rows[1]["temporality"], rows[1]["monotonic"], rows[1]["value"]) == (
        "sum", "delta", True, 42.0)
    assert all(r["error"] is None for r in rows)


def test_records_that_break_the_contract_become_one_row_with_their_reason():
    good = client_metrics().SerializeToString()
    out = flatten(records_batch([
        ("a", b"\x00garbage", {"content-encoding": "gzip"}),
        ("b", good, {"content-type": "text/plain"}),
        ("c", b"", {}),
        ("d", good, {"content-encoding": "brotli"}),
    ])).to_pylist()
    assert [(r["client_instance_id"], r["error"], r["metric"], r["record_first"]) for r in out] == [
        ("a", "decompress-failed", None, True), ("b", "unknown-content-type", None, True),
        ("c", "empty", None, True), ("d", "unknown-encoding", None, True)]
    assert all(r["error_message"] for r in out)


def test_the_last_non_null_value_of_a_repeated_header_wins():
    batch = records_batch([
        ("a", b"x", [("client_id", "old"), ("client_id", "new"), ("client_id", None), ("principal", "User:a")]),
        ("b", b"x", []),
        ("c", b"x", [("client_id", None)]),
        ("d", b"x", [("client_id", "only"), ("client_id", b"\xff")]),
        ("e", b"x", None),
    ])
    found = header_columns(batch.column("headers"), ("client_id", "principal"))
    assert found["client_id"].to_pylist() == ["new", None, None, "\ufffd", None]
    assert found["principal"].to_pylist() == ["User:a", None, None, None, None]


def test_histogram_and_summary_points_fill_their_own_columns_on_their_own_rows():
    data = client_metrics("orders")
    scope = data.resource_metrics[0].scope_metrics[0]
    histogram = scope.metrics.add(name="latency")
    histogram.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    histogram.histogram.data_points.add(count=3, sum=7.5, bucket_counts=[1, 2, 0], explicit_bounds=[1.0, 5.0])
    summary = scope.metrics.add(name="sizes")
    summary.summary.data_points.add(count=2, sum=10.0)
    rows = flatten(records_batch([("a", data.SerializeToString(), {}), ("b", b"", {})])).to_pylist()
    picked = [(r["metric"], r["type"], r["temporality"], r["value"], r["count"], r["sum"], r["bucket_counts"],
               r["bounds"], r["error"]) for r in rows]
    assert picked == [
        ("org.apache.kafka.producer.node.request.latency.avg", "gauge", None, 12.5, None, None, None, None, None),
        ("org.apache.kafka.producer.record.send.total", "sum", "delta", 42.0, None, None, None, None, None),
        ("latency", "histogram", "delta", None, 3, 7.5, [1, 2, 0], [1.0, 5.0], None),
        ("sizes", "summary", None, None, 2, 10.0, None, None, None),
        (None, None, None, None, None, None, None, None, "empty"),
    ]
