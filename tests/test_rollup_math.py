"""Golden rollups, hand-computed: gauges with NaN, delta and cumulative sums with resets, histograms; and 1h merged
from 1m equals 1h computed from the points directly."""

from __future__ import annotations

import math

import pytest

from kcm_rollups.aggregate import rollup
from kcm_rollups.decode import POINTS_SCHEMA
from kcm_rollups.histograms import histogram_quantile
from kcm_rollups.windows import Resolution
from spark_support import spark  # noqa: F401  (the session-scoped fixture)

T0 = 1_699_999_200  # a whole hour since the epoch
MINUTE, HOUR = Resolution(60, "1m"), Resolution(3600, "1h")
_offsets = iter(range(10**6))


def point(metric: str, seconds: float, instance: str = "i1", **fields) -> dict:
    """A decoded point of client `app` received T0 + `seconds`."""
    row = {name: None for name in POINTS_SCHEMA.names}
    row.update(topic="t", partition=0, offset=next(_offsets), record_micros=int((T0 + seconds) * 1_000_000),
               client_instance_id=instance, client_id="app", client_software_name="librdkafka",
               client_software_version="2.3.0", record_first=True, metric=metric, type="gauge",
               time_ns=int((T0 + seconds) * 1e9), start_ns=0, attributes="{}")
    row.update(fields)
    return row


def rows_of(spark, points, resolutions=(MINUTE, HOUR), **options) -> dict:
    frame = spark.createDataFrame(points, POINTS_SCHEMA)
    return {(r["resolution"], r["window_start"].timestamp() - T0, r["metric"], tuple(r["bounds"] or ())): r.asDict()
            for r in rollup(frame, resolutions, **options).collect()}


def test_gauge_statistics_count_nan_separately_and_never_let_it_poison_min_max_avg(spark):
    rows = rows_of(spark, [point("g", 1, "i1", value=1.0), point("g", 2, "i2", value=3.0),
                           point("g", 3, "i1", value=math.nan), point("g", 4, "i2", value=2.0),
                           point("g", 61, "i1", value=10.0)])
    first = rows[("1m", 0, "g", ())]
    assert (first["count"], first["nan_count"], first["min"], first["max"], first["sum"], first["avg"]) == (
        3, 1, 1.0, 3.0, 6.0, 2.0)
    assert (first["last"], first["instances"], first["p50"], first["p99"]) == (2.0, 2, 2.0, 3.0)
    assert first["increase"] is None and first["rate"] is None and first["window_end"].timestamp() == T0 + 60
    second = rows[("1m", 60, "g", ())]
    assert (second["count"], second["nan_count"], second["min"], second["last"], second["instances"]) == (
        1, 0, 10.0, 10.0, 1)
    hour = rows[("1h", 0, "g", ())]
    assert (hour["count"], hour["nan_count"], hour["min"], hour["max"], hour["sum"], hour["avg"], hour["last"]) == (
        4, 1, 1.0, 10.0, 16.0, 4.0, 10.0)
    assert (hour["instances"], hour["p50"], hour["p99"]) == (2, 2.0, 10.0)
    assert len(rows) == 3


def test_delta_sums_add_up_to_increase_and_rate_per_second(spark):
    delta = {"type": "sum", "temporality": "delta", "monotonic": True}
    rows = rows_of(spark, [point("s", 1, "i1", value=5.0, **delta), point("s", 30, "i1", value=7.0, **delta),
                           point("s", 10, "i2", value=4.0, **delta), point("s", 70, "i1", value=3.0, **delta)])
    assert (rows[("1m", 0, "s", ())]["increase"], rows[("1m", 0, "s", ())]["rate"]) == (16.0, 16.0 / 60)
    assert rows[("1m", 0, "s", ())]["count"] == 3 and rows[("1m", 0, "s", ())]["min"] is None
    assert rows[("1m", 60, "s", ())]["increase"] == 3.0
    assert (rows[("1h", 0, "s", ())]["increase"], rows[("1h", 0, "s", ())]["rate"]) == (19.0, 19.0 / 3600)


def test_non_monotonic_delta_sums_add_up_their_changes_like_other_delta_sums_not_as_a_gauge(spark):
    # An UpDownCounter sent as deltas: each point is a change, so the window's increase is their net sum (negative
    # too); only a non-monotonic *cumulative* sum is a level, rolled up as a gauge.
    delta = {"type": "sum", "temporality": "delta", "monotonic": False}
    rows = rows_of(spark, [point("u", 1, value=5.0, **delta), point("u", 20, value=-3.0, **delta),
                           point("u", 70, value=-4.0, **delta)])
    first, second = rows[("1m", 0, "u", ())], rows[("1m", 60, "u", ())]
    assert (first["increase"], first["min"], first["max"], first["last"]) == (2.0, None, None, -3.0)
    assert (second["increase"], rows[("1h", 0, "u", ())]["increase"]) == (-4.0, -2.0)
    level = {"type": "sum", "temporality": "cumulative", "monotonic": False}
    gauge = rows_of(spark, [point("l", 1, value=5.0, **level), point("l", 20, value=3.0, **level)])[("1m", 0, "l", ())]
    assert (gauge["min"], gauge["max"], gauge["last"], gauge["increase"]) == (3.0, 5.0, 3.0, None)


CUMULATIVE = {"type": "sum", "temporality": "cumulative", "monotonic": True}
COUNTER_POINTS = [
    point("c", 5, "i1", value=100.0, start_ns=1, **CUMULATIVE),
    point("c", 20, "i1", value=130.0, start_ns=1, **CUMULATIVE),   # +30
    point("c", 40, "i1", value=10.0, start_ns=1, **CUMULATIVE),    # dropped: a reset, +10
    point("c", 65, "i1", value=25.0, start_ns=1, **CUMULATIVE),    # +15, next minute
    point("c", 10, "i2", value=50.0, start_ns=7, **CUMULATIVE),
    point("c", 30, "i2", value=70.0, start_ns=7, **CUMULATIVE),    # +20
    point("c", 50, "i2", value=80.0, start_ns=9, **CUMULATIVE),    # new start time: a reset, +80
]


def test_cumulative_sums_become_increases_with_resets_and_never_go_negative(spark):
    rows = rows_of(spark, COUNTER_POINTS)
    assert rows[("1m", 0, "c", ())]["increase"] == 140.0
    assert rows[("1m", 60, "c", ())]["increase"] == 15.0
    assert rows[("1h", 0, "c", ())]["increase"] == 155.0
    assert rows[("1m", 0, "c", ())]["last"] == 80.0 and rows[("1m", 0, "c", ())]["count"] == 6


def test_points_before_since_only_serve_as_predecessors(spark):
    rows = rows_of(spark, COUNTER_POINTS, since_micros=(T0 + 15) * 1_000_000)
    assert rows[("1m", 0, "c", ())]["increase"] == 140.0
    assert rows[("1m", 0, "c", ())]["count"] == 4


def test_cumulative_streams_without_an_instance_id_are_told_apart_by_their_resource(spark):
    """Other writers' records carry no instance id: two services' counters of one metric are two streams (not one
    that seems to reset at every alternation), and each resource counts as an instance."""
    a, b = '{"service.name":"a"}', '{"service.name":"b"}'
    pushes = [(1, 100.0, a), (2, 5.0, b), (3, 110.0, a), (4, 6.0, b), (5, 120.0, a), (6, 7.0, b)]
    rows = rows_of(spark, [point("c", s, None, value=v, start_ns=1, resource=r, **CUMULATIVE) for s, v, r in pushes],
                   resolutions=(MINUTE,))
    assert (rows[("1m", 0, "c", ())]["increase"], rows[("1m", 0, "c", ())]["instances"]) == (10.0 + 10.0 + 1.0 + 1.0, 2)


def test_a_stream_that_started_inside_what_was_read_counts_its_first_value_as_after_a_reset(spark):
    """Without a predecessor, a start time at or after where the read began means the counter (or cumulative
    histogram) started from zero inside it: its first value is its increase, as after a reset. An earlier start, or
    an unknown one (0), leaves the first point without an increase."""
    read_from_s = T0 - 300
    began = read_from_s * 10**9
    histogram = {"type": "histogram", "temporality": "cumulative", "bounds": [1.0]}
    rows = rows_of(spark, [
        point("c", 30, "inside", value=7.0, start_ns=began + 10**10, **CUMULATIVE),
        point("c", 90, "inside", value=9.0, start_ns=began + 10**10, **CUMULATIVE),
        point("c", 30, "before", value=50.0, start_ns=began - 1, **CUMULATIVE),
        point("c", 90, "before", value=60.0, start_ns=began - 1, **CUMULATIVE),
        point("c", 40, "unknown", value=4.0, start_ns=0, **CUMULATIVE),
        point("h", 30, "at", count=3, sum=6.0, bucket_counts=[1, 2], start_ns=began, **histogram),
        point("h", 40, "at", count=5, sum=9.0, bucket_counts=[2, 3], start_ns=began, **histogram),
    ], resolutions=(MINUTE,), read_from_micros=read_from_s * 1_000_000)
    assert (rows[("1m", 0, "c", ())]["increase"], rows[("1m", 60, "c", ())]["increase"]) == (7.0, 2.0 + 10.0)
    counted = rows[("1m", 0, "h", (1.0,))]
    assert (counted["count"], counted["sum"], counted["bucket_counts"]) == (5, 9.0, [2, 3])


def test_a_cumulative_point_without_a_value_is_skipped_like_nan_and_keeps_its_streams_increase(spark):
    for missing in (None, math.nan):  # OTLP's "no recorded value" point decodes to null
        rows = rows_of(spark, [point("c", 1, "i1", value=10.0, **CUMULATIVE), point("c", 2, "i1", value=missing,
                                                                                      **CUMULATIVE),
                               point("c", 3, "i1", value=25.0, **CUMULATIVE)])
        assert [(r["resolution"], r["count"], r["increase"], r["last"]) for r in rows.values()] == [
            ("1m", 3, 15.0, 25.0), ("1h", 3, 15.0, 25.0)], missing


def test_histograms_merge_buckets_when_bounds_agree_and_estimate_quantiles_like_prometheus(spark):
    histogram = {"type": "histogram", "temporality": "delta"}
    cumulative = {"type": "histogram", "temporality": "cumulative"}
    rows = rows_of(spark, [
        point("h", 1, "i1", count=4, sum=12.0, bounds=[1.0, 5.0, 10.0], bucket_counts=[1, 2, 1, 0], **histogram),
        point("h", 2, "i2", count=2, sum=6.0, bounds=[1.0, 5.0, 10.0], bucket_counts=[0, 2, 0, 0], **histogram),
        point("h", 3, "i1", count=1, sum=3.0, bounds=[2.0, 4.0], bucket_counts=[0, 1, 0], **histogram),
        point("k", 1, "i1", count=2, sum=2.0, bounds=[1.0, 2.0], bucket_counts=[1, 1, 0], **cumulative),
        point("k", 9, "i1", count=5, sum=9.0, bounds=[1.0, 2.0], bucket_counts=[1, 3, 1], **cumulative),
    ], resolutions=(MINUTE,))
    merged = rows[("1m", 0, "h", (1.0, 5.0, 10.0))]
    assert (merged["bucket_counts"], merged["count"], merged["sum"], merged["avg"]) == ([1, 4, 1, 0], 6, 18.0, 3.0)
    assert merged["p50"] == pytest.approx(3.0) and merged["p95"] == pytest.approx(8.5)
    assert merged["p99"] == pytest.approx(9.7) and merged["instances"] == 2
    other = rows[("1m", 0, "h", (2.0, 4.0))]
    assert (other["bucket_counts"], other["count"], other["p50"]) == ([0, 1, 0], 1, 3.0)
    counted = rows[("1m", 0, "k", (1.0, 2.0))]
    assert (counted["bucket_counts"], counted["count"], counted["sum"]) == ([0, 2, 1], 3, 7.0)


def test_a_cumulative_histogram_whose_bounds_change_starts_over_as_after_a_reset(spark):
    # A client re-registering a histogram with other buckets (an upgrade, a changed View), same start time: its
    # counts are not comparable with the old bounds' (subtracting them took arrays of different lengths apart).
    cumulative = {"type": "histogram", "temporality": "cumulative", "start_ns": 1}
    rows = rows_of(spark, [
        point("kb", 1, count=2, sum=2.0, bounds=[1.0, 2.0], bucket_counts=[1, 1, 0], **cumulative),
        point("kb", 5, count=3, sum=3.5, bounds=[1.0, 2.0], bucket_counts=[1, 2, 0], **cumulative),
        point("kb", 9, count=4, sum=9.0, bounds=[1.0, 2.0, 5.0], bucket_counts=[1, 2, 1, 0], **cumulative),
    ], resolutions=(MINUTE,))
    before, after = rows[("1m", 0, "kb", (1.0, 2.0))], rows[("1m", 0, "kb", (1.0, 2.0, 5.0))]
    assert (before["count"], before["bucket_counts"], before["sum"]) == (1, [0, 1, 0], 1.5)
    assert (after["count"], after["bucket_counts"], after["sum"]) == (4, [1, 2, 1, 0], 9.0)


def test_exponential_histograms_contribute_their_count_and_sum(spark):
    delta = {"type": "exponential_histogram", "temporality": "delta"}
    cumulative = {"type": "exponential_histogram", "temporality": "cumulative", "start_ns": 1}
    rows = rows_of(spark, [point("e", 1, count=7, sum=21.0, **delta), point("e", 2, "i2", count=3, sum=3.0, **delta),
                           point("ec", 1, count=10, sum=10.0, **cumulative),
                           point("ec", 20, count=14, sum=30.0, **cumulative)], resolutions=(MINUTE,))
    window = rows[("1m", 0, "e", ())]
    assert (window["count"], window["sum"], window["avg"], window["p50"]) == (10, 24.0, 2.4, None)
    assert (rows[("1m", 0, "ec", ())]["count"], rows[("1m", 0, "ec", ())]["sum"]) == (4, 20.0)


def test_summaries_count_and_sum_are_cumulative_so_a_window_gets_their_increase(spark):
    """OTLP defines a summary point's count and sum as running totals since its start: each push repeats the
    history, so a window adds their differences, as for cumulative histograms, with a new start time a reset."""
    summary = {"type": "summary", "temporality": "cumulative"}
    rows = rows_of(spark, [
        point("q", 1, "i1", count=10, sum=20.0, start_ns=1, **summary),
        point("q", 20, "i1", count=20, sum=40.0, start_ns=1, **summary),
        point("q", 40, "i1", count=30, sum=60.0, start_ns=1, **summary),
        point("q", 50, "i1", count=4, sum=8.0, start_ns=2, **summary),     # restarted: its own count
    ], resolutions=(MINUTE,))
    window = rows[("1m", 0, "q", ())]
    assert (window["count"], window["sum"], window["avg"]) == (24, 48.0, 2.0)


def test_histogram_counts_past_64_bits_saturate_instead_of_failing_the_job(spark):
    """uint64 counts each fit a long, but their sum need not: it stays at 2^63 - 1 (one client's absurd counts never
    fail the job for the others), in the finest windows and in every merge of them."""
    histogram = {"type": "histogram", "temporality": "delta", "bounds": [1.0]}
    cumulative = {"type": "histogram", "temporality": "cumulative", "bounds": [1.0]}
    big = 2**62
    rows = rows_of(spark, [
        point("h", 1, "i1", count=big, sum=1.0, bucket_counts=[big, 0], **histogram),
        point("h", 2, "i2", count=big, sum=1.0, bucket_counts=[big - 1, 1], **histogram),
        point("h", 3, "i3", count=5, sum=1.0, bucket_counts=[5, 0], **histogram),
        point("h", 61, "i1", count=big, sum=1.0, bucket_counts=[0, big], **histogram),
        point("k", 1, "i1", count=0, sum=0.0, bucket_counts=[0, 0], start_ns=1, **cumulative),
        point("k", 2, "i1", count=2**63 - 1, sum=1.0, bucket_counts=[2**63 - 1, 0], start_ns=1, **cumulative),
        point("k", 1, "i2", count=0, sum=0.0, bucket_counts=[0, 0], start_ns=1, **cumulative),
        point("k", 2, "i2", count=5, sum=1.0, bucket_counts=[4, 1], start_ns=1, **cumulative),
        point("small", 5, "i4", count=3, sum=3.0, bucket_counts=[1, 2], **histogram),
    ])
    top = 2**63 - 1
    first = rows[("1m", 0, "h", (1.0,))]
    assert (first["count"], first["bucket_counts"], first["p50"]) == (top, [top, 1], pytest.approx(0.5))
    assert (rows[("1m", 60, "h", (1.0,))]["count"], rows[("1m", 60, "h", (1.0,))]["bucket_counts"]) == (big, [0, big])
    hour = rows[("1h", 0, "h", (1.0,))]
    assert (hour["count"], hour["bucket_counts"], hour["sum"]) == (top, [top, big + 1], 4.0)
    counted = rows[("1m", 0, "k", (1.0,))]
    assert (counted["count"], counted["bucket_counts"], counted["sum"]) == (top, [top, 1], 2.0)
    assert (rows[("1h", 0, "small", (1.0,))]["count"], rows[("1h", 0, "small", (1.0,))]["bucket_counts"]) == (3, [1, 2])


def test_histogram_quantile_follows_prometheus_at_the_edges():
    assert histogram_quantile(0.5, [1.0, 2.0], [0, 0, 4]) == 2.0  # all in +Inf: its lower bound
    assert histogram_quantile(0.5, [4.0], [2, 0]) == 2.0          # lowest bucket interpolates from zero
    assert histogram_quantile(0.5, [1.0], [0, 0]) is None
    assert histogram_quantile(0.5, [1.0, 5.0], [1, None, 0]) is None  # a bucket merged from unequal lists
    assert histogram_quantile(0.5, [-5.0, 0.0], [4, 0, 0]) == -5.0  # a lowest bound at or below zero: that bound


def test_an_hour_merged_from_minutes_equals_the_hour_computed_from_points(spark):
    gauge_points = [point("g", s, f"i{s % 3}", value=float(s % 17) if s % 11 else math.nan)
                    for s in range(0, 3600, 37)]
    counter = [point("c", s, f"i{s % 2}", value=float(s * 3 if s < 1800 else s - 1800), **CUMULATIVE)
               for s in range(0, 3600, 53)]
    points = gauge_points + counter
    merged = {k: v for k, v in rows_of(spark, points).items() if k[0] == "1h"}
    direct = rows_of(spark, points, resolutions=(HOUR,))
    assert set(merged) == set(direct) == {("1h", 0, "g", ()), ("1h", 0, "c", ())}
    for key, row in direct.items():
        compared = [name for name in row if name not in ("kll_sketch", "instances_sketch")]
        assert {n: merged[key][n] for n in compared} == {n: row[n] for n in compared}, key


def test_one_clients_counters_of_one_name_in_two_instrumentation_scopes_are_two_streams(spark):
    """OTLP's metric identity includes the instrumentation scope: an SDK app with two libraries that each count
    `requests.total` pushes two streams, not one that seems to reset at every alternation."""
    a, b = '["lib-a","1.0"]', '["lib-b","1.0"]'
    pushes = [(1, 100.0, a), (1, 5.0, b), (20, 110.0, a), (20, 6.0, b), (40, 120.0, a), (40, 7.0, b)]
    rows = rows_of(spark, [point("c", s, "i1", value=v, start_ns=1, scope=scope, **CUMULATIVE)
                           for s, v, scope in pushes], resolutions=(MINUTE,))
    assert rows[("1m", 0, "c", ())]["increase"] == (110 - 100) + (120 - 110) + (6 - 5) + (7 - 6)


def test_one_clients_counter_with_two_attribute_sets_is_two_streams(spark):
    """KIP-714 counters are per attribute set (per node, per topic-partition): two series of one metric from one
    instance, pushed together, must not be taken for one stream that resets at every alternation."""
    one, two = '{"node_id":"1"}', '{"node_id":"2"}'
    pushes = [(1, 100.0, one), (1, 5.0, two), (20, 110.0, one), (20, 6.0, two), (40, 120.0, one), (40, 7.0, two)]
    frame = spark.createDataFrame([point("c", s, "i1", value=v, start_ns=1, attributes=attributes, **CUMULATIVE)
                                   for s, v, attributes in pushes], POINTS_SCHEMA)
    increases = {r["attributes"]: r["increase"] for r in rollup(frame, (MINUTE,)).collect()}
    assert increases == {one: (110 - 100) + (120 - 110), two: (6 - 5) + (7 - 6)}


def test_a_cumulative_point_delivered_after_a_newer_one_is_taken_in_its_own_time_order_not_as_a_reset(spark):
    """Each cumulative point is its stream's total from its start time to its time: the stream's order is that of its
    points' times. A writer that delivers an older point after a newer one (a retried batch, an exporter's parallel
    queue) changes no increase."""
    def at(received_s: int, value: float, point_s: int) -> dict:
        return point("c", received_s, "i1", value=value, start_ns=1, time_ns=(T0 + point_s) * 10**9, **CUMULATIVE)

    rows = rows_of(spark, [at(10, 110.0, 20), at(11, 100.0, 10), at(30, 120.0, 30)], resolutions=(MINUTE,))
    assert rows[("1m", 0, "c", ())]["increase"] == 120.0 - 100.0


def test_a_point_delivered_after_a_newer_one_across_two_runs_ranges_is_counted_once(spark):
    """The run of the first hour counts the stream up to A; the next run reads A in its lookback and B, older than A
    but received after the hour, in its range: B's span (P to B) lies inside what the first run counted."""
    def at(received_s: int, value: float, point_s: int | None = None) -> dict:
        return point("c", received_s, "i1", value=value, start_ns=1, time_ns=(T0 + (point_s or received_s)) * 10**9,
                     **CUMULATIVE)

    points = [at(3360, 100.0), at(3540, 300.0), at(3660, 200.0, point_s=3480), at(3900, 350.0)]   # P, A, B, Q

    def increase(since_s: int, until_s: int, lookback_s: int = 300) -> float:
        read = [p for p in points if T0 + since_s - lookback_s <= p["record_micros"] / 1e6 < T0 + until_s]
        rows = rows_of(spark, read, resolutions=(HOUR,), since_micros=(T0 + since_s) * 10**6,
                       read_from_micros=(T0 + since_s - lookback_s) * 10**6)
        return sum(r["increase"] for r in rows.values())

    assert increase(0, 7200) == 350.0 - 100.0   # one run over both hours
    assert increase(0, 3600) + increase(3600, 7200) == 350.0 - 100.0


def test_a_histogram_point_delivered_after_a_newer_one_across_two_runs_ranges_is_counted_once(spark):
    """As for counters: a cumulative histogram (or summary) point older than one the run before counted adds nothing,
    or its span is counted twice (request counts and latency sums inflated by at-least-once redelivery)."""
    def at(received_s: int, count: int, point_s: int | None = None) -> dict:
        return point("h", received_s, "i1", count=count, sum=float(count), bucket_counts=[count, 0], bounds=[1.0],
                     type="histogram", temporality="cumulative", start_ns=1,
                     time_ns=(T0 + (point_s or received_s)) * 10**9)

    points = [at(3360, 100), at(3540, 300), at(3660, 200, point_s=3480), at(3900, 350)]   # P, A, B, Q

    def counted(since_s: int, until_s: int, lookback_s: int = 300) -> tuple[int, float]:
        read = [p for p in points if T0 + since_s - lookback_s <= p["record_micros"] / 1e6 < T0 + until_s]
        rows = rows_of(spark, read, resolutions=(HOUR,), since_micros=(T0 + since_s) * 10**6,
                       read_from_micros=(T0 + since_s - lookback_s) * 10**6)
        return sum(r["count"] for r in rows.values()), sum(r["sum"] for r in rows.values())

    assert counted(0, 7200) == (350 - 100, 250.0)   # one run over both hours
    first, second = counted(0, 3600), counted(3600, 7200)
    assert (first[0] + second[0], first[1] + second[1]) == (350 - 100, 250.0)


def test_a_histogram_window_holding_points_without_a_sum_has_an_unknown_sum_and_avg(spark):
    """OTLP's histogram sum is optional: 10 observations with sum 100 and 10 without one, all in (5, 20], gave avg 5.
    Such a window's sum and avg are NaN (unknown) through every merge; windows whose points all have sums keep
    theirs."""
    histogram = {"type": "histogram", "temporality": "delta", "bounds": [5.0, 20.0]}
    cumulative = {"type": "histogram", "temporality": "cumulative", "bounds": [5.0, 20.0], "start_ns": 1}
    rows = rows_of(spark, [
        point("h", 1, "i1", count=10, sum=100.0, bucket_counts=[0, 10, 0], **histogram),
        point("h", 2, "i2", count=10, bucket_counts=[0, 10, 0], **histogram),
        point("h", 61, "i1", count=4, sum=40.0, bucket_counts=[0, 4, 0], **histogram),
        point("k", 1, "i1", count=2, bucket_counts=[0, 2, 0], **cumulative),
        point("k", 2, "i1", count=6, bucket_counts=[0, 6, 0], **cumulative),
    ])
    unknown = [rows[key] for key in (("1m", 0, "h", (5.0, 20.0)), ("1h", 0, "h", (5.0, 20.0)),
                                     ("1m", 0, "k", (5.0, 20.0)))]
    assert [(r["count"], math.isnan(r["sum"]), math.isnan(r["avg"])) for r in unknown] == [
        (20, True, True), (24, True, True), (4, True, True)]
    known = rows[("1m", 60, "h", (5.0, 20.0))]
    assert (known["count"], known["sum"], known["avg"]) == (4, 40.0, 10.0)


@pytest.mark.parametrize("kind", ["histogram", "exponential_histogram", "summary"])
def test_a_window_holding_only_a_streams_first_cumulative_count_has_none_not_a_saturated_one(spark, kind):
    """A stream's first cumulative point adds nothing (no predecessor): its window's count is unknown, and the hour
    holds only what was added. Spark's LEAST skips nulls: a capped sum of nothing was 2^63 - 1."""
    cumulative = {"type": kind, "temporality": "cumulative", "start_ns": 1}
    bounded = {"bounds": [1.0], "bucket_counts": [1, 2]} if kind == "histogram" else {}
    later = {"bounds": [1.0], "bucket_counts": [2, 3]} if kind == "histogram" else {}
    rows = rows_of(spark, [point("h", 5, count=3, sum=6.0, **bounded, **cumulative),
                           point("h", 65, count=5, sum=10.0, **later, **cumulative)])
    bounds = (1.0,) if kind == "histogram" else ()
    first, second, hour = (rows[("1m", 0, "h", bounds)], rows[("1m", 60, "h", bounds)],
                           rows[("1h", 0, "h", bounds)])
    assert (first["count"], first["avg"]) == (None, None)
    assert (second["count"], second["sum"], hour["count"], hour["sum"]) == (2, 4.0, 2, 4.0)
    if kind == "histogram":
        assert (first["bucket_counts"], second["bucket_counts"], hour["bucket_counts"]) == (None, [1, 1], [1, 1])
