"""The columnar flatten that `mapInArrow` runs: one row per data point, identity from headers, resource or key, and
one row with its reason per record that does not follow the contract."""

from __future__ import annotations

import pyarrow as pa
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kcm_rollups.decode import (DECODE_INPUT_SCHEMA, MAX_IDENTITY_CHARS, MAX_POINTS, MAX_RECORD_TEXT, POINTS_SCHEMA,
                                 TOO_LARGE, flatten, flatten_batches, header_columns)
from kcm_rollups.source import Record, records_to_decode_input
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


def test_a_valid_record_without_points_is_one_row_without_an_error_and_spares_the_batch():
    """A client's resource with a scope and no metrics (nothing subscribed yet) raised a TypeError that failed the
    whole rollup job."""
    idle = metrics_pb2.MetricsData()
    idle.resource_metrics.add().scope_metrics.add().scope.name = "librdkafka"
    out = flatten(records_batch([("idle", idle.SerializeToString(), {"client_id": "idle-client"}),
                                 ("busy", client_metrics().SerializeToString(), {})])).to_pylist()
    assert [(r["client_instance_id"], r["error"], r["metric"] is None) for r in out] == [
        ("idle", None, True), ("busy", None, False), ("busy", None, False)]


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
        ("sizes", "summary", "cumulative", None, 2, 10.0, None, None, None),  # OTLP: cumulative
        (None, None, None, None, None, None, None, None, "empty"),
    ]


def test_a_record_with_a_point_the_columns_cannot_hold_is_one_row_with_its_reason_and_spares_the_batch():
    good = client_metrics("billing").SerializeToString()
    late = client_metrics("orders")
    gauge = late.resource_metrics[0].scope_metrics[0].metrics[0]
    gauge.gauge.data_points[0].time_unix_nano = 2**63  # a valid fixed64, beyond a signed 64-bit time
    uncountable = client_metrics("orders")
    histogram = uncountable.resource_metrics[0].scope_metrics[0].metrics.add(name="latency")
    histogram.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    histogram.histogram.data_points.add(count=2**64 - 1, bucket_counts=[2**64 - 1, 0], explicit_bounds=[1.0])
    rows = flatten(records_batch([("a", good, {}), ("b", late.SerializeToString(), {}),
                                  ("c", uncountable.SerializeToString(), {})])).to_pylist()
    assert [(r["client_instance_id"], r["error"], r["metric"], r["time_ns"], r["count"], r["record_first"])
            for r in rows] == [
        ("a", None, "org.apache.kafka.producer.node.request.latency.avg", 1_700_000_000_000_000_000, None, True),
        ("a", None, "org.apache.kafka.producer.record.send.total", 1_700_000_000_000_000_000, None, False),
        ("b", "invalid-point", None, None, None, True), ("c", "invalid-point", None, None, None, True)]
    assert "time_unix_nano" in rows[2]["error_message"] and "count" in rows[3]["error_message"]


def test_histogram_buckets_must_number_one_more_than_the_bounds_or_be_absent_with_the_bounds():
    def pushed(**point) -> bytes:
        data = client_metrics("orders")
        latency = data.resource_metrics[0].scope_metrics[0].metrics.add(name="latency")
        latency.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
        latency.histogram.data_points.add(**point)
        return data.SerializeToString()

    rows = flatten(records_batch([
        ("short", pushed(count=3, bucket_counts=[1, 2], explicit_bounds=[1.0, 5.0]), {}),
        ("bare", pushed(count=3, explicit_bounds=[1.0, 5.0]), {}),
        ("plain", pushed(count=4, sum=9.0), {}),  # OTLP: a histogram without buckets has no bounds either
    ])).to_pylist()
    assert [(r["client_instance_id"], r["error"]) for r in rows] == [
        ("short", "invalid-point"), ("bare", "invalid-point"), ("plain", None), ("plain", None), ("plain", None)]
    assert "2 bucket counts for 2 bounds" in rows[0]["error_message"]
    assert "0 bucket counts for 2 bounds" in rows[1]["error_message"]
    assert (rows[4]["metric"], rows[4]["count"], rows[4]["sum"], rows[4]["bucket_counts"]) == ("latency", 4, 9.0, None)


def test_a_record_time_no_window_can_hold_is_one_row_with_its_reason_and_spares_the_batch():
    good = client_metrics("orders").SerializeToString()
    # Producers set Kafka timestamps: one beyond 64-bit microseconds, one that 64 bits hold but no date does.
    records = [Record(f"k{i}".encode(), good, "t", 0, i, timestamp_ms, 1, [])
               for i, timestamp_ms in enumerate([1_700_000_000_000, 9_300_000_000_000_000, 9_000_000_000_000_000])]
    batch = records_to_decode_input(records)
    assert batch.column("record_micros").to_pylist() == [1_700_000_000_000_000, None, 9_000_000_000_000_000_000]
    rows = flatten(batch).to_pylist()
    assert [(r["client_instance_id"], r["error"], r["metric"] is not None) for r in rows] == [
        ("k0", None, True), ("k0", None, True), ("k1", "invalid-timestamp", False), ("k2", "invalid-timestamp", False)]
    assert all("9000-01-01" in r["error_message"] for r in rows[2:])


def test_a_key_that_is_not_utf8_is_read_with_replacements_never_failing_the_batch():
    """Spark's Kafka source casts the binary key to a string without checking it: the batch's string column may
    hold bytes that are not UTF-8 (any producer may write such a key), as kcm's own source never hands over."""
    good = client_metrics().SerializeToString()
    batch = records_batch([("placeholder", good, {}), ("ok", good, {})])
    keys = pa.array([b"\xff\xfe-not-utf8", b"ok"], pa.binary())
    unchecked = pa.Array.from_buffers(pa.string(), len(keys), keys.buffers())   # what Spark's cast hands over
    batch = batch.set_column(batch.schema.get_field_index("key"), "key", unchecked)
    rows = flatten(batch).to_pylist()
    assert [r["client_instance_id"] for r in rows] == ["\ufffd\ufffd-not-utf8"] * 2 + ["ok"] * 2
    assert all(r["error"] is None for r in rows)


def test_each_resource_of_a_record_gives_its_points_their_identity_and_anonymous_ones_their_resource():
    """The OpenTelemetry Collector's Kafka exporter batches several resources into one plain OTLP record (no headers,
    no key): each point takes its identity from its own resource, and a point left without an instance id carries
    that resource, which is what tells its streams from other writers'."""
    def resource(data: metrics_pb2.MetricsData, metric: str, attributes: dict[str, str]) -> None:
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.extend(
            KeyValue(key=key, value=AnyValue(string_value=value)) for key, value in attributes.items())
        resource_metrics.scope_metrics.add().metrics.add(name=metric).gauge.data_points.add(as_double=1.0)

    batched = metrics_pb2.MetricsData()
    resource(batched, "of.a", {"service.name": "a", "client_id": "app-A"})
    resource(batched, "of.b", {"service.instance.id": "b-1", "service.name": "b"})
    keyed = metrics_pb2.MetricsData()
    resource(keyed, "of.k", {"client_id": "app-K"})
    rows = flatten(records_batch([
        (None, batched.SerializeToString(), {}),
        ("id-1", client_metrics("orders").SerializeToString(), {"client_instance_id": "id-1"}),
        ("k2", keyed.SerializeToString(), {}),
    ])).to_pylist()
    assert [(r["metric"].rsplit(".", 1)[-1], r["client_id"], r["client_instance_id"], r["resource"]) for r in rows] == [
        ("a", "app-A", None, '{"client_id":"app-A","service.name":"a"}'),
        ("b", None, None, '{"service.instance.id":"b-1","service.name":"b"}'),
        ("avg", None, "id-1", None), ("total", None, "id-1", None),
        ("k", "app-K", "k2", None)]
    assert [r["record_first"] for r in rows] == [True, False, True, False, True]


def _gauges(count: int, resource: dict[str, str] | None = None, metric: str = "g") -> metrics_pb2.MetricsData:
    """One resource with `count` empty gauge points of one metric."""
    data = metrics_pb2.MetricsData()
    resource_metrics = data.resource_metrics.add()
    resource_metrics.resource.attributes.extend(
        KeyValue(key=key, value=AnyValue(string_value=value)) for key, value in (resource or {}).items())
    gauge = resource_metrics.scope_metrics.add().metrics.add(name=metric).gauge
    for _ in range(count):
        gauge.data_points.add()
    return data


def test_a_record_that_would_expand_far_past_its_size_is_one_too_large_row_and_spares_the_batch():
    """A small compressed record may hold a hundred thousand points, or a long text every point would copy (a
    resource, a metric name, a header, an identity): each such record is one `too-large` row, the rest decode."""
    good = client_metrics("orders").SerializeToString()
    command_line = {"process.command_line": "java " + "-D" * 2000}  # a resource kept as text: no instance id
    rows = flatten(records_batch([
        ("ok", good, {}),
        ("many", _gauges(MAX_POINTS + 1).SerializeToString(), {}),
        (None, _gauges(MAX_RECORD_TEXT // 2000, command_line).SerializeToString(), {}),
        ("named", _gauges(3000, metric="m" * 20_000).SerializeToString(), {}),
        ("long-id", _gauges(2, {"client_id": "x" * (MAX_IDENTITY_CHARS + 1)}).SerializeToString(), {}),
        ("header", good, {"principal": "User:" + "p" * MAX_IDENTITY_CHARS}),
        ("ok-2", good, {}),
    ])).to_pylist()
    assert [(r["client_instance_id"], r["error"]) for r in rows] == [
        ("ok", None), ("ok", None), ("many", TOO_LARGE), (None, TOO_LARGE), ("named", TOO_LARGE),
        ("long-id", TOO_LARGE), ("header", TOO_LARGE), ("ok-2", None), ("ok-2", None)]
    assert f"more than {MAX_POINTS} data points" in rows[2]["error_message"]
    assert all(f"more than {MAX_RECORD_TEXT}" in r["error_message"] for r in rows[3:5])
    assert all(f"more than {MAX_IDENTITY_CHARS}" in r["error_message"] for r in rows[5:7])
    # Up to the bounds a record is whole: a resource of this size on fewer points is kept as it came.
    kept = flatten(records_batch([(None, _gauges(100, command_line).SerializeToString(), {})])).to_pylist()
    assert len(kept) == 100 and all(r["error"] is None and "-D-D" in r["resource"] for r in kept)


def test_batches_of_points_are_cut_by_their_text_and_hold_the_same_rows():
    """flatten_batches starts another batch of points once one holds `max_text` characters, so that many records
    just within their own bound never take a text column past Arrow's 2 GiB (which failed the job)."""
    records = records_batch([(f"id-{i}", client_metrics(f"app-{i}").SerializeToString(),
                              {"client_id": f"app-{i}", "principal": "User:" + "u" * 1000}) for i in range(10)])
    whole = flatten(records)
    cut = list(flatten_batches([records], max_text=3000))
    assert len(cut) == 5 and all(batch.num_rows == 4 for batch in cut)
    assert pa.Table.from_batches(cut).to_pylist() == whole.to_pylist()
    assert [batch.num_rows for batch in flatten_batches([records])] == [20]


def test_batches_of_only_some_columns_hold_those_of_the_whole_rows_with_the_same_errors_and_cuts():
    """With `columns`, flatten_batches builds only those (the state path needs 21 of 35 with the default dimensions):
    the same values, the same error rows, batches cut where the whole rows are; a name POINTS_SCHEMA lacks is
    refused."""
    from kcm_rollups.partial import state_input_columns

    good = [(f"id-{i}", client_metrics(f"app-{i}").SerializeToString(),
             {"client_id": f"app-{i}", "principal": "User:" + "u" * 1000}) for i in range(6)]
    records = records_batch(good[:3] + [("bad", b"\x0a\xff", {})] + good[3:])
    columns = state_input_columns(("client_id", "attributes"))
    assert "principal" not in columns and "topic" not in columns and "resource" in columns
    whole = list(flatten_batches([records], max_text=3000))
    some = list(flatten_batches([records], max_text=3000, columns=columns))
    assert len(some) == len(whole) > 1 and all(batch.schema.names == columns for batch in some)
    assert [b.to_pylist() for b in some] == [b.select(columns).to_pylist() for b in whole]
    assert sum(row["error"] is not None for b in some for row in b.to_pylist()) == 1
    try:
        list(flatten_batches([records], columns=["metric", "no_such_column"]))
    except ValueError as err:
        assert "no_such_column" in str(err)
    else:
        raise AssertionError("an unknown column was accepted")


def test_an_empty_or_blank_key_header_or_attribute_names_no_one_so_resources_keep_other_writers_apart():
    """Producers that send b"" rather than a null key, or an empty instance-id header, must not make every resource
    of their records one instance (and one cumulative stream): an empty value is absent."""
    def service(name: str, **extra: str) -> bytes:
        return _gauges(1, {"service.name": name, **extra}).SerializeToString()

    rows = flatten(records_batch([
        ("", service("a"), {}),
        ("", service("b"), {"client_instance_id": ""}),
        (" ", service("c", client_id=""), {"client_id": " "}),
        ("", service("d"), {"client_instance_id": "", "client_id": "", "client_software_name": "",
                            "client_software_version": ""}),
        ("", service("e", **{"client_instance_id": "from-resource"}), {"client_instance_id": ""}),
    ])).to_pylist()
    assert [(r["client_instance_id"], r["client_id"], r["resource"]) for r in rows] == [
        (None, None, '{"service.name":"a"}'), (None, None, '{"service.name":"b"}'),
        (None, None, '{"client_id":"","service.name":"c"}'), (None, None, '{"service.name":"d"}'),
        ("from-resource", None, None)]


def test_a_record_without_a_timestamp_is_one_row_with_its_reason_not_a_1969_window():
    """Kafka takes CreateTime -1 (no timestamp) from a raw producer: no window before 1970 can hold it, and no time
    range could ever re-run one."""
    good = client_metrics("orders").SerializeToString()
    records = [Record(b"k0", good, "t", 0, 0, -1, 0, []), Record(b"k1", good, "t", 0, 1, 0, 0, [])]
    rows = flatten(records_to_decode_input(records)).to_pylist()
    assert [(r["client_instance_id"], r["error"]) for r in rows] == [
        ("k0", "invalid-timestamp"), ("k1", None), ("k1", None)]
    assert "1970-01-01" in rows[0]["error_message"]


def test_attribute_lists_whose_pairs_join_to_the_same_bytes_keep_their_own_text():
    """proto3 leaves empty fields out, so [{a: no value}, {"": "x"}] joined is the bytes of [{a: "x"}]: memoised on
    the joined bytes, whichever came first gave the other its text (its grouping, and for resources its stream)."""
    from kcm_rollups.decode import _AttributesText

    split = [KeyValue(key="a"), KeyValue(key="", value=AnyValue(string_value="x"))]
    whole = [KeyValue(key="a", value=AnyValue(string_value="x"))]
    assert b"".join(p.SerializeToString() for p in split) == whole[0].SerializeToString()
    text = _AttributesText()
    assert text(split) != text(whole) == _AttributesText()(whole) == '{"a":"x"}'
