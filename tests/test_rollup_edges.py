"""The rollup job, its math, windows and histogram quantiles at their edges: behaviour a mutation review (session 24)
found no test pinned (a cumulative stream that did not change, a point exactly at `--from`, a histogram without
bounds, re-runs over part of a date, argument bounds). Spark tests share the one session-scoped SparkSession."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import pytest
from pyspark.sql import functions as F

from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings
from kcm_rollups.aggregate import rollup
from kcm_rollups.decode import POINTS_SCHEMA
from kcm_rollups.histograms import histogram_quantile
from kcm_rollups.job import RollupOptions, RollupResult, default_master, parse_dimensions, top_rows, write_rollups
from kcm_rollups.windows import Resolution, parse_duration, parse_resolutions, parse_time, widen
from spark_support import spark  # noqa: F401  (the session-scoped fixture)
from test_rollup_math import CUMULATIVE, HOUR, MINUTE, T0, point, rows_of

UTC = timezone.utc


def _options(resolutions: str = "1m,1h", **fields) -> RollupOptions:
    return RollupOptions(kafka=KafkaSettings("127.0.0.1:1"), topic="t", output="/tmp/unused",
                         resolutions=parse_resolutions(resolutions), **fields)


def _at(seconds: int) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, UTC)


# --- windows.py: ranges, resolutions, durations, times (pure Python) ---------------------------------------------

def test_a_range_is_widened_out_to_whole_windows_of_the_coarsest_resolution_and_an_aligned_end_stays():
    assert widen(T0 + 10, T0 + 70, 60) == (T0, T0 + 120)
    assert widen(T0, T0 + 120, 60) == (T0, T0 + 120)
    # 10:20 to 10:40 with 1m,1h: the whole hour, or its 1h window would be rewritten from twenty minutes of records.
    assert _options(start=_at(20 * 60), end=_at(40 * 60)).window_range() == (T0, T0 + 3600)


def test_resolutions_are_taken_in_any_order_each_once_finest_first_with_their_shortest_labels():
    assert parse_resolutions("1h, 1m,60s") == (Resolution(60, "1m"), Resolution(3600, "1h"))
    assert parse_resolutions("90s,30s") == (Resolution(30, "30s"), Resolution(90, "90s"))
    assert parse_resolutions("2d") == (Resolution(172800, "2d"),)


@pytest.mark.parametrize("text, message", [
    ("7m", "resolution 7m does not divide a day"),
    (",", "--resolution needs at least one window size"),
])
def test_a_resolution_that_does_not_divide_a_day_or_none_at_all_is_a_user_error(text, message):
    with pytest.raises(UserError, match=message):
        parse_resolutions(text)


def test_a_century_is_the_longest_duration_taken():
    assert parse_duration("36500d") == 36500 * 86400
    with pytest.raises(UserError, match="is longer than a century"):
        parse_duration("36501d")


def test_times_run_from_the_epoch_itself_to_just_before_9000():
    assert parse_time("1970-01-01T00:00:00Z") == parse_time("19700101") == datetime(1970, 1, 1, tzinfo=UTC)
    assert parse_time("8999-12-31T23:59:59Z") == datetime(8999, 12, 31, 23, 59, 59, tzinfo=UTC)
    with pytest.raises(UserError, match="is outside 1970-01-01 to 9000-01-01"):
        parse_time("9000-01-01T00:00:00Z")


@pytest.mark.parametrize("text, meant", [
    ("20261129", datetime(2026, 11, 29, tzinfo=UTC)),   # ISO 8601's basic format: not 1970-08-23 as seconds
    ("20261129T1030Z", datetime(2026, 11, 29, 10, 30, tzinfo=UTC)),
    ("1764432000", datetime(2025, 11, 29, 16, tzinfo=UTC)),
    ("1764432000.25", datetime(2025, 11, 29, 16, 0, 0, 250000, tzinfo=UTC)),
    ("100000000", datetime(1973, 3, 3, 9, 46, 40, tzinfo=UTC)),
])
def test_a_compact_date_is_a_date_and_epoch_seconds_are_read_in_full(text, meant):
    assert parse_time(text) == meant


@pytest.mark.parametrize("text, as_seconds", [("2026", "1970-01-01T00:33:46Z"), ("0", "1970-01-01T00:00:00Z"),
                                              ("99999999", "1973-03-03T09:46:39Z"), ("202611", "1970-01-03T08:16:51Z")])
def test_a_number_too_short_for_epoch_seconds_is_refused_not_read_back_to_1970(text, as_seconds):
    """A year or a date without dashes, read as seconds, would make a range from 1970 that replaces every window
    since with what the topic still holds."""
    with pytest.raises(UserError) as refused:
        parse_time(text, "--from")
    assert str(refused.value) == (f"--from {text!r} read as epoch seconds is {as_seconds}: write a date in ISO 8601 "
                                  "(2026-01-31 or 2026-01-31T10:00:00Z), or epoch seconds in full (date +%s)")


def test_a_lowercase_z_and_a_zoneless_time_are_utc_whatever_the_machines_zone(monkeypatch):
    assert parse_time("2026-01-31T10:00:00z") == datetime(2026, 1, 31, 10, tzinfo=UTC)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_time("2026-01-31T10:00:00") == datetime(2026, 1, 31, 10, tzinfo=UTC)
    finally:
        monkeypatch.undo()
        time.tzset()


# --- histograms.py ---------------------------------------------------------------------------------------------------

def test_histogram_quantile_takes_the_first_bucket_reaching_the_rank_as_prometheus_does():
    # rank 1 of 2: reached by the first bucket's upper bound, not pushed into the +Inf bucket past an empty one.
    assert histogram_quantile(0.5, [1.0, 2.0], [1, 0, 1]) == 1.0
    # An OTLP histogram may have no bounds (one bucket, -Inf to +Inf): nothing to interpolate in, no IndexError.
    assert histogram_quantile(0.5, [], [5]) is None


# --- job.py: argument checks, summary (pure Python) ----------------------------------------------------------------

def test_a_time_range_that_ends_where_it_starts_is_refused():
    with pytest.raises(UserError, match="is not before --to"):
        _options(start=_at(0), end=_at(0))


def test_offset_ranges_that_read_nothing_or_end_at_latest_are_not_reversed_and_empty_json_names_no_topic():
    _options(starting_offsets='{"t":{"0":5}}', ending_offsets='{"t":{"0":5}}')     # an empty range
    _options(starting_offsets='{"t":{"0":5}}', ending_offsets='{"t":{"0":-1}}')    # -1: up to the latest offset
    with pytest.raises(UserError, match=r"--starting-offsets names the topics \(none\), but the job reads 't'"):
        _options(starting_offsets="{}")


def test_without_a_master_the_job_runs_on_every_local_core_but_under_spark_submit_on_the_one_given(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert default_master(None) == "local[*]"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40123")
    assert default_master(None) is None


def test_group_by_names_each_dimension_once_and_skips_empty_items():
    assert parse_dimensions("client_id, principal,client_id,") == ("client_id", "principal")


def test_the_summary_puts_every_count_on_its_own_line():
    result = RollupResult(input_records=12, decode_errors={"empty": 1, "decompress-failed": 2}, points=30,
                          rows_written=7, windows={"1m": 5, "1h": 1}, window_range=(_at(0), _at(7200)), seconds=3.04,
                          stage_seconds={"read, decode and aggregate": 2.0, "write": 1.04},
                          exported=("otel:4317", 40, 0))
    assert result.summary_lines() == [
        "windows from 2023-11-14T22:00:00+00:00 .. 2023-11-15T00:00:00+00:00",
        "input records 12, decode errors: decompress-failed 2, empty 1",
        "points 30, rows written 7, windows 5 × 1m, 1 × 1h",
        "exported 40 OTLP data points to otel:4317",
        "took 3.0 s (read, decode and aggregate 2.0 s, write 1.0 s)"]
    quiet = RollupResult(input_records=0, decode_errors={}, points=0, rows_written=0, windows={}, window_range=None,
                         seconds=0.5, exported=("otel:4317", 9, 3))
    assert quiet.summary_lines() == [
        "windows from whole offset range", "input records 0, decode errors: none",
        "points 0, rows written 0, windows none",
        "exported 9 OTLP data points to otel:4317, 3 rejected by the receiver", "took 0.5 s"]


# --- aggregate.py: counters, histograms, boundaries (Spark) -------------------------------------------------------

DELTA = {"type": "sum", "temporality": "delta", "monotonic": True}


def test_a_delta_counter_point_without_a_value_adds_nothing_and_counters_have_no_nan_count_nor_sum(spark):
    rows = rows_of(spark, [point("s", 1, value=5.0, **DELTA), point("s", 2, value=math.nan, **DELTA),
                           point("s", 3, value=7.0, **DELTA)])
    minute, hour = rows[("1m", 0, "s", ())], rows[("1h", 0, "s", ())]
    assert (minute["increase"], minute["count"], minute["nan_count"], minute["sum"], minute["last"]) == (
        12.0, 3, 0, None, 7.0)
    assert (hour["increase"], hour["window_end"].timestamp()) == (12.0, T0 + 3600)


def test_a_cumulative_counter_or_histogram_that_did_not_change_adds_nothing_not_its_whole_value(spark):
    histogram = {"type": "histogram", "temporality": "cumulative", "bounds": [1.0], "start_ns": 1}
    rows = rows_of(spark, [
        point("c", 1, value=100.0, start_ns=1, **CUMULATIVE), point("c", 20, value=100.0, start_ns=1, **CUMULATIVE),
        point("c", 70, value=130.0, start_ns=1, **CUMULATIVE),
        point("k", 1, count=5, sum=5.0, bucket_counts=[3, 2], **histogram),
        point("k", 20, count=5, sum=5.0, bucket_counts=[3, 2], **histogram),
        point("k", 70, count=7, sum=9.0, bucket_counts=[3, 4], **histogram),
    ], resolutions=(MINUTE,))
    assert (rows[("1m", 0, "c", ())]["increase"], rows[("1m", 60, "c", ())]["increase"]) == (0.0, 30.0)
    unchanged, grown = rows[("1m", 0, "k", (1.0,))], rows[("1m", 60, "k", (1.0,))]
    assert (unchanged["count"], unchanged["bucket_counts"], unchanged["sum"], unchanged["avg"]) == (
        0, [0, 0], 0.0, None)
    assert (grown["count"], grown["bucket_counts"], grown["sum"], grown["avg"]) == (2, [0, 2], 4.0, 2.0)


def test_a_cumulative_histogram_whose_bucket_drops_is_a_reset_never_a_negative_bucket(spark):
    histogram = {"type": "histogram", "temporality": "cumulative", "bounds": [1.0], "start_ns": 1}
    rows = rows_of(spark, [point("k", 1, count=5, sum=5.0, bucket_counts=[3, 2], **histogram),
                           point("k", 20, count=7, sum=9.0, bucket_counts=[1, 6], **histogram)], resolutions=(MINUTE,))
    window = rows[("1m", 0, "k", (1.0,))]
    assert (window["count"], window["bucket_counts"], window["sum"]) == (7, [1, 6], 9.0)


def _range_increase(spark, points) -> float:
    """The increase a run over the second hour counts (lookback 5 minutes)."""
    rows = rows_of(spark, points, resolutions=(HOUR,), since_micros=(T0 + 3600) * 10**6,
                   read_from_micros=(T0 + 3300) * 10**6)
    return sum(r["increase"] for r in rows.values())


def _counter_at(received_s: int, value: float, point_s: int | None = None) -> dict:
    return point("c", received_s, "i1", value=value, start_ns=1, time_ns=(T0 + (point_s or received_s)) * 10**9,
                 **CUMULATIVE)


def test_a_point_received_exactly_at_the_range_start_belongs_to_the_range_not_to_the_run_before(spark):
    # Received at --from, older than A (received in the lookback): the run before counted up to A, so it adds nothing.
    late = [_counter_at(3360, 100.0), _counter_at(3540, 300.0), _counter_at(3600, 200.0, point_s=3480),
            _counter_at(3900, 350.0)]
    assert _range_increase(spark, late) == 350.0 - 300.0
    # A received at --from is in the range: the run before never saw it, so B, older and received later, still counts.
    early = [_counter_at(3360, 100.0), _counter_at(3600, 300.0, point_s=3540), _counter_at(3660, 200.0, point_s=3480),
             _counter_at(3900, 350.0)]
    assert _range_increase(spark, early) == 350.0 - 100.0


def test_a_window_holding_only_a_histogram_point_the_run_before_counted_has_zero_observations_not_unknown(spark):
    def at(received_s: int, count: int, point_s: int | None = None) -> dict:
        return point("h", received_s, "i1", count=count, sum=float(count), bucket_counts=[count, 0], bounds=[1.0],
                     type="histogram", temporality="cumulative", start_ns=1,
                     time_ns=(T0 + (point_s or received_s)) * 10**9)

    rows = rows_of(spark, [at(3360, 100), at(3540, 300), at(3660, 200, point_s=3480)], resolutions=(HOUR,),
                   since_micros=(T0 + 3600) * 10**6, read_from_micros=(T0 + 3300) * 10**6)
    window = rows[("1h", 3600, "h", (1.0,))]
    assert (window["count"], window["sum"], window["bucket_counts"]) == (0, 0.0, [0, 0])


def test_a_record_without_points_rolls_up_to_no_row(spark):
    empty = point(None, 5, type=None, time_ns=None, start_ns=None, attributes=None)
    assert set(rows_of(spark, [empty, point("g", 10, value=1.0)])) == {("1m", 0, "g", ()), ("1h", 0, "g", ())}


def test_last_is_the_sample_received_last_not_the_one_with_the_latest_point_time(spark):
    rows = rows_of(spark, [point("g", 10, value=1.0, time_ns=(T0 + 50) * 10**9),
                           point("g", 20, value=2.0, time_ns=(T0 + 5) * 10**9)], resolutions=(MINUTE,))
    window = rows[("1m", 0, "g", ())]
    assert (window["last"], window["last_at"].timestamp()) == (2.0, T0 + 20)


# --- job.py: writing, window counts, top rows (Spark, no Kafka) ------------------------------------------------

def _rows(spark, points: list[dict], resolutions: str = "1m,1h"):
    frame = spark.createDataFrame(points, POINTS_SCHEMA)
    return rollup(frame, parse_resolutions(resolutions)).withColumn("partial", F.lit(False)).withColumn(
        "date", F.date_format("window_start", "yyyy-MM-dd")).localCheckpoint()


def _written(spark, output: str) -> list[tuple]:
    return sorted((r["resolution"], r["window_start"].replace(tzinfo=UTC).timestamp() - T0, r["metric"], r["max"])
                  for r in spark.read.parquet(output).collect())


def test_the_windows_written_are_counted_once_per_window_over_every_date(spark, tmp_path):
    # Two metrics in a minute of each of two dates (T0 + 2h is midnight): 8 rows, 2 windows of each resolution.
    points = [point(m, s, value=1.0) for m in ("a", "b") for s in (10, 7210)]
    assert write_rollups(spark, _rows(spark, points), str(tmp_path / "out"), (T0, T0 + 3 * 3600), ("1m", "1h")) == (
        8, {"1m": 2, "1h": 2})


@pytest.mark.parametrize("seconds", [(10, 7210, 7270), ()])
def test_what_rows_hold_is_the_same_observed_as_they_materialise_and_counted_by_a_query(spark, seconds):
    from pyspark.sql import Observation

    from kcm_rollups.job import RowsHeld, _rows_seen

    points = [point(m, s, value=1.0) for m in ("a", "b") for s in seconds]
    frame = spark.createDataFrame(points, POINTS_SCHEMA)
    rows = rollup(frame, parse_resolutions("1m,1h")).withColumn("date", F.date_format("window_start", "yyyy-MM-dd"))
    seen = Observation("test-rows")
    materialised = rows.observe(seen, *_rows_seen(("1m", "1h"))).localCheckpoint(eager=True)
    observed = RowsHeld.observed(seen.get, materialised, ("1m", "1h"))
    # Nothing observed grows with the windows: every task would send it to the driver.
    assert set(seen.get) == {"rows", "partitions", "latest 1m", "latest 1h"}
    assert observed == RowsHeld.counted(materialised, ("1m", "1h"))
    latest = {label: None if at is None else at.replace(tzinfo=UTC).timestamp() - T0
              for label, at in observed.latest.items()}
    if seconds:   # two dates (T0 + 2h is midnight): 2 metrics x (3 minutes + 2 hours)
        assert (observed.rows, observed.windows, latest) == (10, {"1m": 3, "1h": 2}, {"1m": 7260, "1h": 7200})
        dates = [datetime.fromtimestamp(T0 + s, UTC).strftime("%Y-%m-%d") for s in (0, 7200)]
        assert dates[0] != dates[1] and observed.partitions == {(r, d) for r in ("1m", "1h") for d in dates}
    else:
        assert (observed.rows, observed.windows, observed.partitions, latest) == (
            0, {}, frozenset(), {"1m": None, "1h": None})


def test_a_range_rerun_that_finds_no_records_any_more_keeps_the_other_windows_of_its_dates(spark, tmp_path):
    output = str(tmp_path / "out")
    write_rollups(spark, _rows(spark, [point("g", 10, value=1.0), point("g", -3590, value=3.0)]), output,
                  (T0 - 3 * 3600, T0 + 3600), ("1m", "1h"))
    # The hour [T0, T0 + 1h) again, its records gone: its rows go, the earlier hour of the same date stays.
    assert write_rollups(spark, _rows(spark, []), output, (T0, T0 + 3600), ("1m", "1h")) == (0, {})
    assert _written(spark, output) == [("1h", -3600, "g", 3.0), ("1m", -3600, "g", 3.0)]


def test_an_offsets_run_replaces_the_windows_it_computed_and_never_duplicates_them(spark, tmp_path):
    output = str(tmp_path / "out")
    write_rollups(spark, _rows(spark, [point("g", 10, value=1.0)]), output, None, ("1m", "1h"))
    write_rollups(spark, _rows(spark, [point("g", 20, value=5.0), point("g", 70, value=2.0)]), output, None,
                  ("1m", "1h"))
    assert _written(spark, output) == [("1h", 0, "g", 5.0), ("1m", 0, "g", 5.0), ("1m", 60, "g", 2.0)]


def test_the_top_rows_are_the_latest_windows_most_instances_first_and_no_more_than_asked(spark):
    rows = _rows(spark, [point("a", 10, "i1", value=1.0), point("a", 3610, "i1", value=1.0),
                         point("b", 3610, "i1", value=1.0), point("b", 3620, "i2", value=1.0),
                         point("c", 3610, "i1", value=1.0)])
    assert [(r["metric"], r["instances"], r["window_start"].replace(tzinfo=UTC).timestamp() - T0)
            for r in top_rows(rows, "1h", 2)] == [("b", 2, 3600), ("a", 1, 3600)]
    # The latest window as run() observed it gives the same rows, without asking for it.
    from kcm_rollups.job import RowsHeld

    latest = RowsHeld.counted(rows, ("1m", "1h")).latest
    assert top_rows(rows, "1h", 2, latest["1h"]) == top_rows(rows, "1h", 2)
    assert [(r["metric"], r["window_start"]) for r in top_rows(rows, "1m", 5, latest["1m"])] == [
        (metric, datetime.fromtimestamp(T0 + 3600, UTC)) for metric in "bac"]   # b: two instances


def test_the_top_rows_show_the_dimensions_rows_differ_in_and_their_window_in_utc_whatever_the_machines_zone(
        spark, monkeypatch):
    """Rows of one metric differing only in attributes, software or a `--group-by` column must not print the same;
    Spark hands a timestamp to Python in the machine's zone, without saying which."""
    points = [point("lat", 10, "i1", value=1.0, attributes='{"node.id":"111"}'),
              point("lat", 11, "i1", value=2.0, attributes='{"node.id":"-1"}'),
              point("lat", 12, "i2", value=3.0, client_software_version="2.4.0"),
              point("lat", 13, "i3", value=4.0, principal="User:ops")]
    frame = spark.createDataFrame(points, POINTS_SCHEMA)
    dimensions = ("client_id", "client_software_version", "attributes", "principal")
    rows = rollup(frame, parse_resolutions("1m"), dimensions).withColumn("partial", F.lit(False))
    monkeypatch.setenv("TZ", "Pacific/Chatham")
    time.tzset()
    try:
        top = top_rows(rows, "1m", 10, dimensions=dimensions)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [list(row) for row in top] == [[
        "resolution", "window_start", "partial", "client_id", "client_software_version", "attributes", "principal",
        "metric", "type", "instances", "count", "avg", "p99", "last", "increase", "rate"]] * 4
    assert sorted((r["avg"], r["client_software_version"], r["attributes"], r["principal"]) for r in top) == [
        (1.0, "2.3.0", '{"node.id":"111"}', None), (2.0, "2.3.0", '{"node.id":"-1"}', None),
        (3.0, "2.4.0", None, None), (4.0, "2.3.0", None, "User:ops")]   # no attributes: none shown
    assert {r["window_start"] for r in top} == {datetime.fromtimestamp(T0, UTC)}
    assert top[0]["window_start"].utcoffset().total_seconds() == 0


def test_the_cumulative_pass_counts_a_point_received_exactly_at_the_range_start(spark):
    from kcm_rollups.aggregate import partial_state, with_cumulative_increases
    from kcm_rollups.job import add_cumulative

    empty = partial_state(with_cumulative_increases(spark.createDataFrame([], POINTS_SCHEMA)), 60)
    points = spark.createDataFrame([point("c", 3540, value=100.0, start_ns=1, **CUMULATIVE),
                                    point("c", 3600, value=130.0, start_ns=1, **CUMULATIVE)], POINTS_SCHEMA)
    state, missed = add_cumulative(empty, points, _options("1m"), (T0 + 3600) * 10**6, (T0 + 3300) * 10**6)
    assert [(r["window_start"].timestamp() - T0, r["increase"]) for r in state.collect()] == [(3600, 30.0)]
    assert missed == 0


@pytest.mark.parametrize("since_micros", [None, 1_000])
def test_the_cumulative_pass_keeps_records_below_each_partitions_read_end_and_elsewhere_only_the_lookback(
        spark, since_micros):
    from kcm_rollups.job import _seen_by_first_pass

    big = 2**40   # offsets past 32 bits beside small ones in one map
    rows = [(0, 4, 500), (0, 5, 500), (1, big - 1, 2_000), (1, big, 2_000), (2, 0, 500), (2, 1, 2_000)]
    frame = spark.createDataFrame(rows, "partition int, offset long, record_micros long")
    kept = frame.filter(_seen_by_first_pass({0: 5, 1: big}, since_micros)).orderBy("partition", "offset").collect()
    expected = [(0, 4), (1, big - 1)] + ([(2, 0)] if since_micros is not None else [])   # partition 2: not read
    assert [(r["partition"], r["offset"]) for r in kept] == expected
    assert frame.filter(_seen_by_first_pass({}, since_micros)).count() == (3 if since_micros is not None else 0)


@pytest.mark.parametrize(("since", "until", "kept"), [
    (None, None, ["a", "b", "c", "none"]), (2_000_000, None, ["b", "c"]), (None, 3_000_000, ["a", "b"]),
    (2_000_000, 3_000_000, ["b"])])
def test_records_outside_a_time_range_cross_to_python_without_their_payload(spark, since, until, kept):
    from kcm_rollups.job import _payload_in_range_only
    from kcm_rollups.source import kafka_schema

    stamps = {"a": 1, "b": 2, "c": 3, "none": None}
    rows = [(name.encode(), name.encode(), "t", 0, i, None if at is None else datetime.fromtimestamp(at, timezone.utc),
             0, [("h", name.encode())]) for i, (name, at) in enumerate(stamps.items())]
    records = spark.createDataFrame(rows, kafka_schema(True))
    out = _payload_in_range_only(records, since, until).orderBy("offset").collect()
    assert [r["offset"] for r in out] == [0, 1, 2, 3]   # every record still there, for its offset
    assert [r["value"].decode() for r in out if r["value"] is not None] == kept
    assert all((r["key"] is None) == (r["value"] is None) == (r["headers"] is None) for r in out)
