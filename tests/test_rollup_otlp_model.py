"""Model-based test of the rollup job's OTLP export, against docs/rollups.md ("Exporting to an OpenTelemetry
collector", with "What each row holds" for the statistics a row has, and "Windows" for which rows are partial).

A reference model written from the docs turns seeded random rollup rows (every statistic, NaN and null ones, gauge,
sum and histogram rows, several resolutions, many --group-by dimensions, histogram bounds) into the data points a
receiver must get: one gauge per non-NaN non-null statistic named `<metric>.<statistic>`, stamped with the window's
start and end, carrying the point attributes, `kcm.rollup.resolution` and a histogram row's bounds as a double array,
with the client identity and every other grouped dimension as resource attributes, under scope `kcm.rollup`. The real
export sends them to a real OTLP/gRPC receiver on loopback (tests/fake_collector.py) which is compared with the model
point for point, together with request sizes (about 5,000 points), gzip on the wire, partial-success rejections,
retries of the documented transient codes and the one-line failure of the others. Through the job itself
(`kcm_rollups.job.run` on the suite's SparkSession, a topic of seeded random pushes) the rows exported are compared
with the rows written: partial rows never, rows of a coarsest window still open not with a time range, every ended
window with offsets only.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import grpc
import pytest
from kafka import KafkaProducer

from kcm_common.errors import UserError
from kcm_common.otlp_export import RetryPolicy
from kcm_rollups.job import RollupOptions, RollupResult, parse_resolutions, run
from kcm_rollups.otlp import OtlpTarget, export, resource_columns
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from payloads import client_metrics
from ports import CountingProxy
from spark_support import spark  # noqa: F401  (the session-scoped fixture)

SEEDS = (714, 2026, 31337, 5, 99)
FAST = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05)   # the documented 1-15 s backoff, shrunk

# From the docs: the statistics, in the table's words, each exported as `<metric>.<statistic>`.
DOC_STATISTICS = ("instances", "count", "nan_count", "min", "max", "sum", "avg", "last", "p50", "p95", "p99",
                  "increase", "rate")
IDENTITY = ("client_id", "client_software_name", "client_software_version")
OTHER_DIMENSIONS = ("client_instance_id", "client_source_address", "client_source_port", "principal",
                    "listener_name", "security_protocol", "broker_id", "cluster_id", "subscription_id")
REQUEST_POINTS = 5000
TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "ABORTED", "OUT_OF_RANGE", "DATA_LOSS")
HINTED = ("UNIMPLEMENTED", "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED")
PERMANENT = ("INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "FAILED_PRECONDITION", "INTERNAL", "UNKNOWN",
             *HINTED)
RESOLUTION_SETS = (("1m", "1h"), ("10s", "1m"), ("1m", "1h", "1d"), ("5m",))
SECONDS = {"10s": 10, "1m": 60, "5m": 300, "1h": 3600, "1d": 86400}
DAY = 1_767_225_600   # 2026-01-01T00:00:00Z


# ---- rows as the job writes them (window bounds in microseconds, as the export takes them) ----

def _double(rng: random.Random) -> float | None:
    return rng.choice([None, math.nan, math.inf, -math.inf] + [round(rng.uniform(-1e6, 1e6), 3)] * 8)


def random_row(rng: random.Random, dimensions: tuple[str, ...]) -> dict:
    resolution = rng.choice(rng.choice(RESOLUTION_SETS))
    size = SECONDS[resolution]
    start = DAY + rng.randrange(0, 3 * 86400 // size) * size
    kind = rng.choice(["gauge", "sum", "histogram"])
    row = {name: None for name in DOC_STATISTICS}
    row.update(resolution=resolution, metric=rng.choice(["org.apache.kafka.producer.node.request.latency",
                                                         "org.apache.kafka.consumer.fetch.manager.records",
                                                         "http.server.duration", "m"]),
               start_micros=start * 1_000_000, end_micros=(start + size) * 1_000_000, bounds=None,
               instances=rng.choice([None, 1, rng.randrange(1, 10_000)]))
    if rng.random() < 0.8:
        row["attributes"] = json.dumps(rng.choice([
            {}, {"node_id": str(rng.randrange(5))}, {"topic": rng.choice(["a", "b"]), "partition": rng.randrange(3)},
            {"flag": rng.random() < 0.5, "ratio": 0.25, "tags": ["x", "y"]}, {"nested": {"k": "v", "n": 2}}]))
    else:
        row["attributes"] = None   # no attributes at all
    if kind == "gauge":
        row.update(count=rng.choice([None, 0, rng.randrange(1, 1000)]), nan_count=rng.choice([0, rng.randrange(9)]),
                   **{name: _double(rng) for name in ("min", "max", "sum", "avg", "last", "p50", "p95", "p99")})
    elif kind == "sum":
        increase = _double(rng)
        row.update(count=rng.randrange(1, 100), nan_count=0, increase=increase,
                   rate=None if increase is None else increase / size)
    else:
        row.update(count=rng.choice([None, rng.randrange(0, 10**12)]), nan_count=0, sum=_double(rng),
                   avg=_double(rng), p50=_double(rng), p95=_double(rng), p99=_double(rng),
                   bounds=rng.choice([[], [1.0], [0.5, 5.0, 25.0], [float(b) for b in range(1, rng.randrange(2, 30))]]))
    for name in dimensions:
        if name != "attributes":
            row[name] = rng.choice([None, f"{name}-{rng.randrange(4)}", "ünïcode spaced"])
    return row


def random_dimensions(rng: random.Random) -> tuple[str, ...]:
    extra = rng.sample(OTHER_DIMENSIONS, rng.randrange(0, len(OTHER_DIMENSIONS) + 1))
    return tuple(rng.sample(IDENTITY + ("attributes",), rng.randrange(1, 5))) + tuple(extra)


# ---- the model: the data points a receiver must get for a row ----

def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _frozen(value):
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("list", tuple(_frozen(v) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float) and value == int(value) and not math.isinf(value):
        return ("float", value)
    return (type(value).__name__, value)


def model_points(row: dict, dimensions: tuple[str, ...]) -> list[tuple]:
    """One gauge point per statistic the row has, as (resource, scope, name, start, end, attributes, value)."""
    resource_names = IDENTITY + tuple(name for name in dimensions if name not in IDENTITY + ("attributes",))
    resource = tuple(sorted((name, ("str", str(row[name]))) for name in resource_names if row.get(name) is not None))
    attributes = {"kcm.rollup.resolution": row["resolution"], **json.loads(row["attributes"] or "{}")}
    if row["bounds"] is not None:
        attributes["kcm.rollup.bounds"] = [float(bound) for bound in row["bounds"]]
    return [(resource, "kcm.rollup", f"{row['metric']}.{statistic}", row["start_micros"] * 1000,
             row["end_micros"] * 1000, _frozen(attributes), float(row[statistic]))
            for statistic in DOC_STATISTICS if _present(row[statistic])]


# ---- what the receiver got ----

def _python(value: AnyValue):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _python(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def received_points(exports) -> list[tuple]:
    found = []
    for export_call in exports:
        for resource_metrics in export_call.request.resource_metrics:
            resource = tuple(sorted((kv.key, (kv.value.WhichOneof("value").removesuffix("ing_value"),
                                              _python(kv.value))) for kv in resource_metrics.resource.attributes))
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    assert metric.WhichOneof("data") == "gauge", metric.name
                    for point in metric.gauge.data_points:
                        attrs = {kv.key: _python(kv.value) for kv in point.attributes}
                        assert len(attrs) == len(point.attributes), "an attribute key given twice"
                        bounds = [kv.value for kv in point.attributes if kv.key == "kcm.rollup.bounds"]
                        for bound in (b for array in bounds for b in array.array_value.values):
                            assert bound.WhichOneof("value") == "double_value"
                        found.append((resource, scope_metrics.scope.name, metric.name, point.start_time_unix_nano,
                                      point.time_unix_nano, _frozen(attrs),
                                      float(getattr(point, point.WhichOneof("value")))))
    return found


def request_sizes(exports) -> list[int]:
    return [sum(len(m.gauge.data_points) for r in e.request.resource_metrics for s in r.scope_metrics
                for m in s.metrics) for e in exports]


# ---- the export alone: seeded random rows ----

@pytest.mark.parametrize("seed", SEEDS)
def test_every_statistic_a_row_has_reaches_the_receiver_as_the_docs_describe_it(seed, collector):
    rng = random.Random(seed)
    dimensions = random_dimensions(rng)
    rows = [random_row(rng, dimensions) for _ in range(rng.choice([1, 40, 1500, 2500]))]
    expected = [p for row in rows for p in model_points(row, dimensions)]
    assert export(rows, OtlpTarget(collector.endpoint), retry=FAST, resource_names=resource_columns(dimensions)) == (
        len(expected), 0)
    assert Counter(received_points(collector.exports)) == Counter(expected)
    sizes = request_sizes(collector.exports)
    assert sum(sizes) == len(expected)
    # About 5,000 points a request: every full one within a row's statistics of it, none empty.
    assert all(0 < size < REQUEST_POINTS + len(DOC_STATISTICS) for size in sizes), sizes
    assert all(size > REQUEST_POINTS - len(DOC_STATISTICS) for size in sizes[:-1]), sizes
    assert len(sizes) <= len(expected) // (REQUEST_POINTS - len(DOC_STATISTICS)) + 1


def test_directed_edges_of_a_row_reach_the_receiver_as_modelled(collector):
    """Each documented edge alone: NaN, null, infinite and zero statistics; a histogram row's bounds (even none, even
    written as integers); no attributes; an identity column that is null; a dimension besides the identity."""
    base = {name: None for name in DOC_STATISTICS} | {
        "resolution": "1h", "metric": "lat", "attributes": '{"node_id":"1"}', "bounds": None,
        "start_micros": DAY * 1_000_000, "end_micros": (DAY + 3600) * 1_000_000, "client_id": "orders",
        "client_software_name": None, "client_software_version": "2.3.0", "principal": "User:alice"}
    rows = [
        base | {"count": 0, "nan_count": 0, "min": math.inf, "max": -math.inf, "avg": math.nan, "p99": None},
        base | {"count": None, "sum": math.nan, "avg": math.nan, "bounds": [], "nan_count": 0},
        base | {"count": 3, "bounds": [1, 2.5], "p50": 1.25, "attributes": None},
        base | {"increase": 0.0, "rate": 0.0, "instances": 1, "attributes": "{}"},
        base | {name: 1.5 for name in DOC_STATISTICS} | {"resolution": "1m", "end_micros": (DAY + 60) * 1_000_000},
        base,   # nothing to send
    ]
    dimensions = ("client_id", "principal", "attributes")
    expected = [p for row in rows for p in model_points(row, dimensions)]
    assert export(rows, OtlpTarget(collector.endpoint), retry=FAST, resource_names=resource_columns(dimensions)) == (
        len(expected), 0)
    assert Counter(received_points(collector.exports)) == Counter(expected)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_directed_edges_reach_the_receiver_as_modelled(seed, collector):
    rng = random.Random(seed)
    dimensions = ("client_id", "principal", "attributes", "broker_id")
    rows = []
    for statistic in DOC_STATISTICS:   # each statistic alone, in every documented state
        for value in (None, math.nan, math.inf, -math.inf, 0, 0.0, rng.randrange(1, 10**15), rng.uniform(-9, 9)):
            row = random_row(rng, dimensions)
            row.update({name: None for name in DOC_STATISTICS}, **{statistic: value})
            rows.append(row)
    expected = [p for row in rows for p in model_points(row, dimensions)]
    assert export(rows, OtlpTarget(collector.endpoint), retry=FAST, resource_names=resource_columns(dimensions)) == (
        len(expected), 0)
    assert len(expected) == len(DOC_STATISTICS) * 6
    assert Counter(received_points(collector.exports)) == Counter(expected)


# ---- gzip on the wire ----

def test_requests_are_gzip_compressed_on_the_wire(collector):
    rng = random.Random(SEEDS[0])
    dimensions = ("client_id", "client_software_name", "attributes", "principal")
    rows = [random_row(rng, dimensions) for _ in range(800)]
    relay = CountingProxy(collector.endpoint)
    try:
        sent, _ = export(rows, OtlpTarget(relay.endpoint), retry=FAST, resource_names=resource_columns(dimensions))
    finally:
        relay.close()
    serialized = sum(e.request.ByteSize() for e in collector.exports)
    assert sent == len([p for row in rows for p in model_points(row, dimensions)]) and serialized > 100_000
    # Rows repeat their names and attributes: gzip takes most of it away; plain protobuf would be all of it.
    assert relay.sent < serialized / 2, (relay.sent, serialized)


# ---- partial success, retries, refusals ----

def _rows_for(rng: random.Random, points_wanted: int) -> list[dict]:
    rows, points = [], 0
    while points < points_wanted:
        row = random_row(rng, ("client_id",))
        if model_points(row, ("client_id",)):
            rows.append(row)
            points += len(model_points(row, ("client_id",)))
    return rows


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_points_the_receiver_rejects_are_counted_and_shown_in_the_summary(seed, collector):
    rng = random.Random(seed)
    rows = _rows_for(rng, 12_000)
    expected = [p for row in rows for p in model_points(row, ("client_id",))]
    requests = len(expected) // (REQUEST_POINTS - len(DOC_STATISTICS)) + 1
    rejections = [rng.choice([0, 0, 1, rng.randrange(1, 200)]) for _ in range(requests)]
    for rejected in rejections:
        collector.reject_partially_next(rejected, message="some points were out of order")
    sent, rejected = export(rows, OtlpTarget(collector.endpoint), retry=FAST)
    delivered = len(collector.exports)
    assert sent == len(expected) and rejected == sum(rejections[:delivered]) and delivered >= 3
    result = RollupResult(input_records=1, decode_errors={}, points=1, rows_written=len(rows), windows={},
                          window_range=None, seconds=0.1, exported=(collector.endpoint, sent, rejected))
    [line] = [line for line in result.summary_lines() if "OTLP" in line]
    assert str(sent) in line and collector.endpoint in line
    assert (str(rejected) in line and "rejected" in line) if rejected else "rejected" not in line


@pytest.mark.parametrize("code", [*TRANSIENT, "RESOURCE_EXHAUSTED with RetryInfo"])
def test_a_transient_failure_is_retried_with_a_warning_each_time_and_the_rows_still_arrive(code, collector, caplog):
    rng = random.Random(f"{code}-{SEEDS[1]}")
    rows = _rows_for(rng, 30)
    expected = [p for row in rows for p in model_points(row, ("client_id",))]
    failures = rng.randrange(1, 4)
    if code.startswith("RESOURCE_EXHAUSTED"):
        collector.throttle_next(0.02, times=failures)
    else:
        collector.fail_next(getattr(grpc.StatusCode, code), times=failures, message="try later")
    with caplog.at_level(logging.WARNING):
        assert export(rows, OtlpTarget(collector.endpoint), retry=FAST) == (len(expected), 0)
    assert Counter(received_points(collector.exports)) == Counter(expected)
    assert collector.rejected_calls == failures and collector.pending_faults() == 0
    retries = [r for r in caplog.records if r.levelno == logging.WARNING and collector.endpoint in r.getMessage()]
    assert len(retries) == failures, [r.getMessage() for r in retries]


@pytest.mark.parametrize("code", PERMANENT)
def test_a_refusal_for_good_stops_the_export_in_one_line_naming_receiver_code_and_message(code, collector, caplog):
    rng = random.Random(f"{code}-{SEEDS[2]}")
    rows = _rows_for(rng, 3 * REQUEST_POINTS + 100)
    before = rng.randrange(0, 3)   # requests delivered before the refusal
    for _ in range(before):
        collector.reject_partially_next(0, message="")
    collector.fail_next(getattr(grpc.StatusCode, code), message=f"receiver says no to {code.lower()}")
    with caplog.at_level(logging.WARNING), pytest.raises(UserError) as refused:
        export(rows, OtlpTarget(collector.endpoint), retry=FAST)
    message = str(refused.value)
    assert "\n" not in message
    assert collector.endpoint in message and code in message and f"receiver says no to {code.lower()}" in message
    assert len(collector.exports) == before and collector.rejected_calls == 1   # stopped: not retried, nothing after
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    collector.clear_faults()
    # What to check is added for the codes the docs name, and only for them.
    plain = _rest(_refusal(collector, "INVALID_ARGUMENT"), collector.endpoint, "INVALID_ARGUMENT")
    if code in HINTED:
        assert len(_rest(message, collector.endpoint, code)) > len(plain) + 10, message
    else:
        assert _rest(message, collector.endpoint, code) == plain, message


def _refusal(collector, code: str) -> str:
    collector.fail_next(getattr(grpc.StatusCode, code), message=f"receiver says no to {code.lower()}")
    with pytest.raises(UserError) as refused:
        export(_rows_for(random.Random(1), 1), OtlpTarget(collector.endpoint), retry=FAST)
    return str(refused.value)


def _rest(message: str, endpoint: str, code: str) -> str:
    """The failure's words besides the receiver, the code, its message and any number."""
    return re.sub(r"\d+", "N", message.replace(endpoint, "").replace(code, "").replace(
        f"receiver says no to {code.lower()}", ""))


def test_the_default_backoff_starts_at_about_a_second_and_a_longer_delay_the_receiver_asks_for_is_waited(collector):
    rows = _rows_for(random.Random(SEEDS[4]), 5)
    collector.fail_next(grpc.StatusCode.UNAVAILABLE)
    started = time.monotonic()
    assert export(rows, OtlpTarget(collector.endpoint))[0] > 0
    waited = time.monotonic() - started
    assert 0.75 <= waited < 1.6, waited   # 1 s, less a jitter
    collector.throttle_next(1.4)   # RESOURCE_EXHAUSTED with a RetryInfo delay longer than the first backoff
    started = time.monotonic()
    assert export(rows, OtlpTarget(collector.endpoint))[0] > 0
    assert 1.4 <= time.monotonic() - started < 2.2
    assert collector.rejected_calls == 2 and len(collector.exports) == 2


def test_a_request_still_failing_when_its_time_is_up_is_one_line_naming_receiver_and_code(collector):
    rows = _rows_for(random.Random(SEEDS[3]), 20)
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=10_000, message="collector restarting")
    with pytest.raises(UserError) as gave_up:
        export(rows, OtlpTarget(collector.endpoint), retry=FAST, give_up_after_s=0.3)
    message = str(gave_up.value)
    assert "\n" not in message and collector.endpoint in message and "UNAVAILABLE" in message
    assert "collector restarting" in message and collector.rejected_calls >= 2 and collector.exports == []
    collector.clear_faults()


# ---- which rows the job exports ----

def _exported_by(collector, since: int) -> list[tuple]:
    return received_points(collector.exports[since:])


def _model_of_run(spark, output: str, now: datetime, ranged: bool, dimensions: tuple[str, ...]) -> tuple[list, list]:
    """The rows written (read back) and the points the docs say the run exports of them."""
    written = [r.asDict() for r in spark.read.parquet(output).collect()]
    expected = []
    for row in written:
        start = row["window_start"].replace(tzinfo=timezone.utc)
        end = row["window_end"].replace(tzinfo=timezone.utc)
        hour_ends = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)   # the coarsest: 1h
        if row["partial"] or (ranged and hour_ends > now):
            continue
        micros = {"start_micros": int(start.timestamp()) * 1_000_000, "end_micros": int(end.timestamp()) * 1_000_000}
        expected += model_points(row | micros, dimensions)
    return written, expected


def test_the_job_exports_the_rows_written_whose_windows_ended_as_the_docs_choose_them(spark, kafka, new_topic,
                                                                                     tmp_path, collector):
    rng = random.Random(SEEDS[0])
    topic = new_topic()
    hour = (datetime.now(timezone.utc) - timedelta(hours=6)).replace(minute=0, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    # Seven records in each of two hours, at random seconds.
    moments = sorted(hour + timedelta(hours=h, seconds=rng.randrange(0, 3600)) for h in (0, 1) for _ in range(7))
    for at in moments:   # one record per batch: offsets name records exactly
        instance = f"i{rng.randrange(4)}"
        producer.send(topic, value=client_metrics(f"app{rng.randrange(2)}").SerializeToString(),
                      key=instance.encode(), timestamp_ms=int(at.timestamp() * 1000),
                      headers=[("client_id", rng.choice([b"orders", b"billing"]))]).get(timeout=10)
    producer.close()
    dimensions = ("client_id", "client_software_name", "client_software_version", "attributes", "client_instance_id")
    # Inside the second hour (after its first record), and after both: with a time range and with offsets only.
    inside = max(moments[-1] - timedelta(minutes=1), hour + timedelta(hours=1, minutes=1)).replace(second=30)
    cut = {"starting_offsets": json.dumps({topic: {"0": 2}}), "ending_offsets": json.dumps({topic: {"0": 12}})}
    runs = [(inside, True, {}), (hour + timedelta(hours=2, minutes=10), True, {}), (inside, False, cut)]
    for number, (now, ranged, offsets) in enumerate(runs):
        output = str(tmp_path / f"out{number}")
        since = len(collector.exports)
        span = {"start": hour, "end": now} if ranged else {}
        options = RollupOptions(kafka=kafka, topic=topic, output=output, resolutions=parse_resolutions("1m,1h"),
                                dimensions=dimensions, otlp=OtlpTarget(collector.endpoint), **span, **offsets)
        result = run(spark, options, now=now)
        written, expected = _model_of_run(spark, output, now, ranged, dimensions)
        if ranged:   # partial: not ended when the run started
            assert all(r["partial"] == (r["window_end"].replace(tzinfo=timezone.utc) > now) for r in written)
        assert Counter(_exported_by(collector, since)) == Counter(expected), number
        assert result.exported == (collector.endpoint, len(expected), 0), number
        assert f"exported {len(expected)} OTLP data points to {collector.endpoint}" in result.summary_lines()
        if number == 0:   # the minutes of the second hour that ended are not exported yet, with a time range
            second_hour = hour.replace(tzinfo=None) + timedelta(hours=1)
            assert any(not r["partial"] and r["window_start"] >= second_hour for r in written)
        if offsets:   # with offsets only they are, but not the windows the offsets cut
            assert any(p[3] >= (hour + timedelta(hours=1)).timestamp() * 10**9 for p in expected)
            assert any(r["partial"] and r["window_end"] <= now.replace(tzinfo=None) for r in written)
