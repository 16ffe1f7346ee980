"""The rollup state computed next to the decoder (kcm_rollups.partial, pyarrow + DataSketches) equals the state Spark
computes from the points (aggregate.partial_state), batch by batch merged: every column, sketches by what they say."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from kcm_rollups.aggregate import DEFAULT_DIMENSIONS, needs_previous, partial_state, with_direct_increases
from kcm_rollups.decode import POINTS_SCHEMA
from kcm_rollups.partial import merge_batches, partial_batches, state_schema
from spark_support import spark  # noqa: F401  (the session-scoped fixture)
from test_rollup_math import point

QUANTILE_RANKS = [0.0, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
DELTA = {"type": "sum", "temporality": "delta", "monotonic": True}
CUMULATIVE = {"type": "sum", "temporality": "cumulative", "monotonic": True}
UP_DOWN = {"type": "sum", "temporality": "cumulative", "monotonic": False}
UP_DOWN_DELTA = {"type": "sum", "temporality": "delta", "monotonic": False}   # changes, not a level: summed
HISTOGRAM = {"type": "histogram", "temporality": "delta", "bounds": [1.0, 5.0]}


def golden_points() -> list[dict]:
    return [
        point("g", 1, "i1", value=1.0), point("g", 2, "i2", value=3.0), point("g", 3, "i1", value=math.nan),
        point("g", 4, "i2", value=2.0), point("g", 61, "i1", value=10.0),
        point("g", 5, "i3", value=7.0, partition=1), point("g", 5, "i4", value=8.0, partition=0),
        # The same record time: `last` is the later (partition, offset), not the later offset.
        point("tie", 5, "i3", value=7.0, partition=1), point("tie", 5, "i4", value=8.0, partition=0),
        point("g", 6, "i1", value=2.5, attributes='{"node":"1"}'),
        point("g", 7, "i1", value=4.0, client_id=None),
        point("nan-only", 8, "i1", value=math.nan),
        point("s", 1, "i1", value=5.0, **DELTA), point("s", 30, "i2", value=7.0, **DELTA),
        point("s", 31, "i2", value=math.nan, **DELTA), point("s", 70, "i1", value=3.0, **DELTA),
        point("c", 5, "i1", value=100.0, start_ns=1, **CUMULATIVE),
        point("c", 20, "i1", value=130.0, start_ns=1, **CUMULATIVE),
        point("c", 21, "i1", value=None, start_ns=1, **CUMULATIVE),  # no recorded value: no increase, no predecessor
        point("updown", 9, "i1", value=4.0, **UP_DOWN), point("updown", 19, "i2", value=-2.0, **UP_DOWN),
        point("ud", 11, "i1", value=5.0, **UP_DOWN_DELTA), point("ud", 12, "i2", value=-3.0, **UP_DOWN_DELTA),
        # Exponential histograms (OTel SDKs' default) contribute their count and sum, not one observation a push.
        point("eh", 13, "i1", count=7, sum=21.0, type="exponential_histogram", temporality="delta"),
        point("eh", 14, "i2", count=3, sum=3.0, type="exponential_histogram", temporality="delta"),
        point("h", 10, "i1", count=3, sum=6.0, bucket_counts=[1, 1, 1], **HISTOGRAM),
        point("h", 20, "i2", count=2, sum=12.0, bucket_counts=[0, 0, 2], **HISTOGRAM),
        point("h", 25, "i2", count=1, sum=2.0, bucket_counts=[0, 1, 0],
              **{**HISTOGRAM, "bounds": [1.0, 5.0, 10.0]}),
        point("hc", 26, "i1", count=4, sum=9.0, bucket_counts=[2, 2, 0],
              **{**HISTOGRAM, "temporality": "cumulative"}),
        # Histograms without buckets (decoded as null) beside one with a single bucket: counted, never a null bucket.
        point("nb", 27, "i1", count=2, sum=3.0, **{**HISTOGRAM, "bounds": []}),
        point("nb", 28, "i2", count=1, sum=1.0, bucket_counts=[1], **{**HISTOGRAM, "bounds": []}),
        # A histogram point without a sum (OTLP's is optional) beside one with: the window's sum is unknown (NaN).
        point("ns", 29, "i1", count=3, bucket_counts=[1, 1, 1], **HISTOGRAM),
        point("ns", 30, "i2", count=1, sum=4.0, bucket_counts=[0, 1, 0], **HISTOGRAM),
        {**point(None, 40, "i5", type=None, time_ns=None, attributes=None), "error": "empty"},
        {**point(None, 41, "i5", type=None, time_ns=None, attributes=None), "error": "decompress-failed"},
        point("g", 50, None, value=6.0),
        # Other writers' points without an instance id: their resources count as instances.
        point("g", 51, None, value=5.0, resource='{"service.name":"a"}'),
        point("g", 52, None, value=4.0, resource='{"service.name":"b"}'),
        # A producer-set time far in the future (beyond 2^53 microseconds): rolled up as Spark does, not a failure.
        {**point("far", 0, "i1", value=1.0), "record_micros": 32_503_680_000_000_123, "time_ns": 1},
        # Bounds Spark groups as one: -0.0 is 0.0.
        point("z", 11, "i1", count=1, sum=0.5, bucket_counts=[1, 0], **{**HISTOGRAM, "bounds": [-0.0]}),
        point("z", 12, "i2", count=1, sum=0.5, bucket_counts=[0, 1], **{**HISTOGRAM, "bounds": [0.0]}),
    ]


def reference_state(points, dimensions=DEFAULT_DIMENSIONS, size_seconds=60):
    """What Spark computes from the points: first_pass's grouping, as aggregate.partial_state."""
    tagged = with_direct_increases(points.withColumn("needs_previous", needs_previous()))
    return partial_state(tagged, size_seconds, dimensions, extra_keys=("error", "needs_previous"),
                         extra=(F.sum(F.col("record_first").cast("long")).alias("records"),
                                F.count("metric").alias("points")))


def python_state(spark, points, batches, dimensions=DEFAULT_DIMENSIONS, size_seconds=60, min_points=1):
    """The points cut into `batches` batches, state computed over runs of them holding `min_points` (1: each batch
    its own state), merged by Spark."""
    return merge_batches(batch_state(spark, points, batches, dimensions, size_seconds, min_points), dimensions).drop(
        "read_partition", "read_end")


def batch_state(spark, points, batches, dimensions=DEFAULT_DIMENSIONS, size_seconds=60, min_points=1):
    """python_state's state rows before Spark merges them: one set per run of batches, as kcm's source yields them."""
    table = points.toArrow().combine_chunks()
    step = max(1, math.ceil(table.num_rows / batches))
    pieces = [table.slice(i, step).to_batches()[0] for i in range(0, table.num_rows, step)]
    states = list(partial_batches(iter(pieces), size_seconds, dimensions, min_points))
    state = pa.Table.from_batches(states, schema=pa.schema([f for f in _arrow(dimensions)]))
    return spark.createDataFrame(state, state_schema(dimensions))


def _arrow(dimensions):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(state_schema(dimensions), timezone="UTC")


def comparable(frame) -> list[tuple]:
    """Rows sorted, sketches replaced by what they answer (count, quantiles, distinct estimate); floats compare equal
    within a relative 1e-9, since Spark adds a window's values in whatever order its merges meet them."""
    described = frame.select(
        "*", F.hll_sketch_estimate("instances_sketch").alias("instances"),
        F.kll_sketch_get_n_double("kll_sketch").alias("kll_n"),
        F.when(F.kll_sketch_get_n_double("kll_sketch") > 0, F.kll_sketch_get_quantile_double(
            "kll_sketch", F.array(*[F.lit(q) for q in QUANTILE_RANKS]))).alias("quantiles"),
    ).drop("kll_sketch", "instances_sketch")
    rows = []
    for row in described.collect():
        values = row.asDict()
        rows.append(tuple(sorted((k, close_values(v)) for k, v in values.items())))
    return sorted(rows, key=lambda row: repr(ordering_key(row)))


class Close(float):
    """A float equal to any number within a relative 1e-9 of it (NaN equals NaN)."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return NotImplemented
        if math.isnan(self) or math.isnan(other):
            return math.isnan(self) and math.isnan(other)
        return math.isclose(self, other, rel_tol=1e-9, abs_tol=1e-12)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # equal values may differ in their bits: never a set member or a key


def close_values(value):
    if isinstance(value, float):
        return Close(value)
    if isinstance(value, (list, tuple)):
        return tuple(close_values(v) for v in value)
    return value


def ordering_key(value):
    """For ordering only: floats to 6 significant digits, so sub-ulp noise cannot reorder rows."""
    if isinstance(value, float):
        return "nan" if value != value else float(f"{value:.6g}")
    if isinstance(value, tuple):
        return tuple(ordering_key(v) for v in value)
    return value


def test_close_floats_tolerate_summation_order_and_nothing_more():
    assert 0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1 and Close(0.1 + 0.2 + 0.3) == 0.3 + 0.2 + 0.1
    assert Close(math.nan) == math.nan and Close(1.0) != math.nan
    assert Close(16427997.9) != 16427998.0 and Close(2.0) != 2.000001
    assert (("sum", Close(0.1 + 0.2)),) == (("sum", 0.3),) and [Close(1.0)] != [1.0001]


@pytest.mark.parametrize("batches", [1, 3, 7])
def test_python_state_merged_over_batches_equals_spark_state_from_points(spark, batches):
    points = spark.createDataFrame(golden_points(), POINTS_SCHEMA)
    expected = comparable(reference_state(points))
    assert len(expected) >= 14
    assert comparable(python_state(spark, points, batches)) == expected


def _job_options():
    from kcm_common.kafka import KafkaSettings
    from kcm_rollups.job import RollupOptions
    from kcm_rollups.windows import parse_resolutions

    return RollupOptions(kafka=KafkaSettings("127.0.0.1:9"), topic="t", output="/nowhere",
                         resolutions=parse_resolutions("1m"))


def test_first_pass_merges_the_batches_state_after_the_shuffle_only_and_counts_while_it_materialises(spark,
                                                                                                     monkeypatch):
    """Keys barely repeat within a task (records come in time order), so first_pass has Spark skip its partial
    aggregation: the plan it materialises has none (merge_batches' own plan has). Its state is the same, and what it
    counts (observed on that one job) equals the points' own counts."""
    from kcm_rollups.job import PassCounts, first_pass
    from kcm_rollups.partial import read_ends_batch

    # Three more points of the last cumulative record: points and records differ.
    more = [{**point("c", 20, "i2", value=float(v), start_ns=1, **CUMULATIVE), "record_first": False}
            for v in (1, 2, 3)]
    points = spark.createDataFrame(golden_points() + more, POINTS_SCHEMA)
    ends = [read_ends_batch({0: 7, 1: 3}, DEFAULT_DIMENSIONS), read_ends_batch({0: 12}, DEFAULT_DIMENSIONS)]
    state_rows = batch_state(spark, points, 5).unionByName(spark.createDataFrame(
        pa.Table.from_batches(ends), state_schema(DEFAULT_DIMENSIONS))).repartition(3)
    plans = []
    frames = type(state_rows)   # Spark 4's classic DataFrame, under pyspark.sql.DataFrame
    checkpoint = frames.localCheckpoint

    def planned(frame, eager=True):
        plans.append(frame._jdf.queryExecution().executedPlan().toString())
        return checkpoint(frame, eager=eager)
    monkeypatch.setattr(frames, "localCheckpoint", planned)
    state, counts, read_ends = first_pass(state_rows, _job_options())
    assert len(plans) == 1 and "kll_merge_agg_double" in plans[0]
    assert "partial_" not in plans[0]
    assert "partial_kll_merge_agg_double" in merge_batches(state_rows, DEFAULT_DIMENSIONS)._jdf.queryExecution(
    ).executedPlan().toString()
    expected = python_state(spark, points, 1).filter(
        F.col("error").isNull() & F.col("metric").isNotNull() & ~F.col("needs_previous")).drop(
        "error", "needs_previous", "records", "points")
    assert len(comparable(expected)) >= 10
    assert comparable(state) == comparable(expected)
    decoded = points.filter(F.col("error").isNull())
    assert counts == PassCounts(
        records=points.filter("record_first").count(), points=decoded.count(),
        cumulative=decoded.filter(needs_previous()).count(),
        histograms=reference_state(points).filter(F.col("type") == "histogram").count(),
        decode_errors={"decompress-failed": 1, "empty": 1})
    assert counts.cumulative >= 3 and counts.histograms >= 4
    assert read_ends == {0: 12, 1: 3}


def test_without_decode_errors_the_first_pass_runs_no_job_but_the_merge(spark):
    from kcm_rollups.job import first_pass
    from kcm_rollups.session import BYPASS_PARTIAL_AGGREGATION, session_conf

    points = spark.createDataFrame([p for p in golden_points() if p["error"] is None], POINTS_SCHEMA)
    state_rows = batch_state(spark, points, 3).repartition(2).localCheckpoint(eager=True)
    tracker = spark.sparkContext.statusTracker()

    def jobs_of(action):
        before = set(tracker.getJobIdsForGroup(None))
        result = action()
        return len(set(tracker.getJobIdsForGroup(None)) - before), result
    with session_conf(spark, {BYPASS_PARTIAL_AGGREGATION: "true"}):
        merge_only, _ = jobs_of(lambda: merge_batches(state_rows, DEFAULT_DIMENSIONS).localCheckpoint(eager=True))
    jobs, (_, counts, _) = jobs_of(lambda: first_pass(state_rows, _job_options()))
    assert counts.records == points.count() and not counts.decode_errors
    assert merge_only >= 1 and jobs == merge_only


def test_state_is_computed_over_runs_of_batches_holding_enough_points_and_merges_to_the_same(spark, monkeypatch):
    import kcm_rollups.partial as partial

    points = spark.createDataFrame(golden_points(), POINTS_SCHEMA)
    table = points.toArrow().combine_chunks()
    pieces = [table.slice(i, 3).to_batches()[0] for i in range(0, table.num_rows, 3)]   # 3 points each
    computed = []
    state_of = partial.partial_state
    monkeypatch.setattr(partial, "partial_state", lambda points, *args: computed.append(points.num_rows) or state_of(
        points, *args))
    assert list(partial_batches(iter(pieces), 60, DEFAULT_DIMENSIONS, min_points=7))
    # Runs of three batches (9 points, the first to reach 7), the rest last.
    assert computed == [9] * (len(pieces) // 3) + ([table.num_rows % 9] if table.num_rows % 9 else [])
    computed.clear()   # and never more bytes at once than max_bytes: a batch larger on its own goes alone
    assert list(partial_batches(iter(pieces), 60, DEFAULT_DIMENSIONS, min_points=10**9, max_bytes=1))
    assert computed == [piece.num_rows for piece in pieces]
    computed.clear()
    both = pieces[0].nbytes + pieces[1].nbytes
    list(partial_batches(iter(pieces[:3]), 60, DEFAULT_DIMENSIONS, min_points=10**9, max_bytes=both))
    assert computed == [pieces[0].num_rows + pieces[1].num_rows, pieces[2].num_rows]
    monkeypatch.undo()
    expected = comparable(reference_state(points))
    assert comparable(python_state(spark, points, len(pieces), min_points=7)) == expected


def test_other_dimensions_and_windows_give_the_same_state(spark):
    points = spark.createDataFrame(golden_points(), POINTS_SCHEMA)
    dimensions = ("client_instance_id", "attributes")
    expected = comparable(reference_state(points, dimensions, 30))
    assert comparable(python_state(spark, points, 2, dimensions, 30)) == expected


@pytest.mark.parametrize("batches", [1, 2, 4])
def test_counts_past_64_bits_saturate_in_both_paths_and_across_batches(spark, batches):
    big = 2**62
    points = spark.createDataFrame([
        point("h", 1, "i1", count=big, sum=1.0, bucket_counts=[big, 0], **HISTOGRAM | {"bounds": [1.0]}),
        point("h", 2, "i2", count=3, sum=1.0, bucket_counts=[3, 0], **HISTOGRAM | {"bounds": [1.0]}),
        point("h", 3, "i3", count=big, sum=1.0, bucket_counts=[big - 2, 2], **HISTOGRAM | {"bounds": [1.0]}),
        point("h", 4, "i4", count=2**63 - 1, sum=1.0, bucket_counts=[1, 2**63 - 2], **HISTOGRAM | {"bounds": [1.0]}),
        point("g", 5, "i1", value=1.0),
    ], POINTS_SCHEMA)
    expected = comparable(reference_state(points))
    assert sorted((dict(row)["metric"], dict(row)["count"], dict(row)["bucket_counts"]) for row in expected) == [
        ("g", 1, None), ("h", 2**63 - 1, (2**63 - 1, 2**63 - 1))]
    assert comparable(python_state(spark, points, batches)) == expected


def test_sketches_of_many_values_merge_as_sparks_do(spark):
    """Past k=200 a KLL sketch compacts (randomly): quantiles stay within its error bound, counts stay exact."""
    many = [point("g", i % 60, f"i{i % 300}", value=float(i)) for i in range(5000)]
    points = spark.createDataFrame(many, POINTS_SCHEMA)
    row = python_state(spark, points, 4).select(
        F.kll_sketch_get_n_double("kll_sketch").alias("n"), F.hll_sketch_estimate("instances_sketch").alias("d"),
        F.kll_sketch_get_quantile_double("kll_sketch", F.array(F.lit(0.5), F.lit(0.9))).alias("q")).collect()
    assert [r["n"] for r in row] == [5000]
    assert abs(row[0]["d"] - 300) <= 6          # HLL lgK=12: ~1.6% standard error
    assert abs(row[0]["q"][0] - 2500) <= 0.02 * 5000 and abs(row[0]["q"][1] - 4500) <= 0.02 * 5000


def test_last_across_batches_is_the_later_partition_and_offset_when_record_times_are_equal(spark):
    early_partition = point("tie", 5, "i4", value=8.0, partition=0)
    late_partition = point("tie", 5, "i3", value=7.0, partition=1)
    for order in ([early_partition, late_partition], [late_partition, early_partition]):
        state = python_state(spark, spark.createDataFrame(order, POINTS_SCHEMA), batches=2)
        assert [row["last"] for row in state.collect()] == [7.0], order
