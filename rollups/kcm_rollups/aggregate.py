"""Rollup math over decoded points: epoch-aligned windows, per-type statistics, coarser windows merged from finer.

Every rollup row carries mergeable state (count, nan_count, min, max, sum, last/last_at, a KLL sketch, an HLL sketch of
instances, increase, histogram buckets); `finish` derives avg, quantiles, instances and rate from that state, so a
window computed from points and one merged from finer windows end up with the same columns. See docs/rollups.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType

from kcm_rollups.decode import INT64_MAX
from kcm_rollups.histograms import QUANTILES, histogram_quantile
from kcm_rollups.windows import Resolution

DEFAULT_DIMENSIONS: tuple[str, ...] = ("client_id", "client_software_name", "client_software_version", "attributes")
# Columns a user may group by: the client identity, the other contract headers, and the point attributes.
GROUPABLE: tuple[str, ...] = DEFAULT_DIMENSIONS + (
    "client_instance_id", "client_source_address", "client_source_port", "principal", "listener_name",
    "security_protocol", "broker_id", "cluster_id", "subscription_id")
STATE_COLUMNS: tuple[str, ...] = ("count", "nan_count", "min", "max", "sum", "last", "last_at", "kll_sketch",
                                  "instances_sketch", "increase", "bounds", "bucket_counts")
_HISTOGRAM_TYPES = ("histogram", "exponential_histogram", "summary")
_MICROS = 1_000_000


def window_start(micros: Column, size_seconds: int) -> Column:
    """The epoch-aligned start (a UTC timestamp) of the window of `size_seconds` holding `micros`."""
    return F.timestamp_seconds(F.floor(micros / F.lit(size_seconds * _MICROS)) * F.lit(size_seconds))


def _gauge_like() -> Column:
    # Non-monotonic cumulative sums (up-down counters) are levels, not counts: they roll up like gauges.
    return (F.col("type") == "gauge") | ((F.col("type") == "sum") & ~F.col("monotonic")
                                         & (F.col("temporality") == "cumulative"))


def _counter() -> Column:
    return (F.col("type") == "sum") & ~_gauge_like()


def needs_previous() -> Column:
    """True for points whose increase depends on their stream's previous point: cumulative counters and histograms.
    A counter point without a value (null, NaN) is not one: it must not become the next point's predecessor."""
    counter = _counter() & F.col("value").isNotNull() & ~F.isnan("value")
    return F.coalesce((F.col("temporality") == "cumulative") & (counter | F.col("type").isin(*_HISTOGRAM_TYPES)),
                      F.lit(False))


def with_increases(points: DataFrame, read_from_micros: int | None = None,
                   since_micros: int | None = None) -> DataFrame:
    """Add `increase` to sum points and `d_count/d_sum/d_buckets` to histogram points: deltas as they are, cumulative
    points as the difference to their stream's previous point, or the new value after a reset (drop, new start)."""
    # Only cumulative points need their stream's previous point: the rest skip the shuffle and sort of the window.
    return with_direct_increases(points.filter(~needs_previous())).unionByName(
        with_cumulative_increases(points.filter(needs_previous()), read_from_micros, since_micros))


def with_direct_increases(points: DataFrame) -> DataFrame:
    """with_increases for points that do not need their predecessor (see needs_previous)."""
    counter = _counter() & ~F.isnan("value")
    histogram = F.col("type").isin(*_HISTOGRAM_TYPES)
    return points.select(
        "*", F.when(counter, F.col("value")).alias("increase"), F.when(histogram, F.col("count")).alias("d_count"),
        F.when(histogram, _known_sum(F.col("count"), F.col("sum"))).alias("d_sum"),
        F.when(histogram, F.col("bucket_counts")).alias("d_buckets"))


def _known_sum(count: Column, total: Column) -> Column:
    """A histogram point's sum, or NaN (unknown) if it counts observations without one (OTLP's sum is optional):
    added up, a window's sum and avg are then NaN, not the sum of some points over the count of all."""
    return F.when(count.isNotNull(), F.coalesce(total, F.lit(float("nan"))))


def with_cumulative_increases(points: DataFrame, read_from_micros: int | None = None,
                              since_micros: int | None = None) -> DataFrame:
    """with_increases for points that need their predecessor: each stream's points in order, through a window.
    A stream's first point adds its whole value if it started at or after `read_from_micros` (the start of what was
    read, so the counter began from zero inside it), else nothing (the job reads a lookback for its predecessor).
    A point received from `since_micros` on (the range) but older than one received before it (the lookback) adds
    nothing: the run before counted its stream up to that newer point, so its span would be counted twice."""
    counter = _counter() & ~F.isnan("value")
    histogram = F.col("type").isin(*_HISTOGRAM_TYPES)
    # Without an instance id (other writers), the resource tells one client's stream from another's; OTLP's metric
    # identity includes the instrumentation scope. A stream's points are in the order of their own time (each is the
    # total from its start time to its time), not of delivery: a retried or reordered push is no reset.
    stream = Window.partitionBy("client_instance_id", "resource", "scope", "metric", "attributes").orderBy(
        "time_ns", "record_micros", "partition", "offset")
    started_inside = _started_since(read_from_micros)
    stale = F.lit(False)
    if since_micros is not None:
        newest_before = F.max(F.when(F.col("record_micros") < F.lit(since_micros), F.col("time_ns"))).over(
            Window.partitionBy("client_instance_id", "resource", "scope", "metric", "attributes"))
        stale = F.coalesce((F.col("record_micros") >= F.lit(since_micros)) & (F.col("time_ns") < newest_before),
                           F.lit(False))
    prev_value, prev_start = F.lag("value").over(stream), F.lag("start_ns").over(stream)
    reset = (F.col("value") < prev_value) | (F.col("start_ns") != prev_start)
    prev_count, prev_sum = F.lag("count").over(stream), F.lag("sum").over(stream)
    prev_buckets, prev_bounds = F.lag("bucket_counts").over(stream), F.lag("bounds").over(stream)
    h_reset = ((F.col("count") < prev_count) | (F.col("start_ns") != prev_start)
               | ~F.equal_null(F.col("bounds"), prev_bounds)
               | F.exists(F.zip_with("bucket_counts", prev_buckets, lambda a, b: a < b), lambda less: less))
    h_first = prev_count.isNull()

    def h_delta(column: str, difference: Column, nothing: Column) -> Column:
        return F.when(histogram, F.when(stale, nothing).when(h_first, F.when(started_inside, F.col(column)))
                      .when(h_reset, F.col(column)).otherwise(difference))

    d_count = h_delta("count", F.col("count") - prev_count, F.lit(0).cast("long"))
    return points.select(
        "*",
        F.when(counter, F.when(stale, F.lit(0.0)).when(prev_value.isNull(), F.when(started_inside, F.col("value")))
               .when(reset, F.col("value")).otherwise(F.col("value") - prev_value)).alias("increase"),
        d_count.alias("d_count"),
        _known_sum(d_count, h_delta("sum", F.col("sum") - prev_sum, F.lit(0.0))).alias("d_sum"),
        h_delta("bucket_counts", F.zip_with("bucket_counts", prev_buckets, lambda a, b: a - b),
                F.transform("bucket_counts", lambda _: F.lit(0).cast("long"))).alias("d_buckets"))


def _started_since(read_from_micros: int | None) -> Column:
    """Whether a point's start time (0: unknown) is at or after `read_from_micros`; never without a bound."""
    bound = None if read_from_micros is None else read_from_micros * 1000
    if bound is None or bound > INT64_MAX:  # start_ns is a long: a bound beyond it is after every start
        return F.lit(False)
    return (F.col("start_ns") > 0) & (F.col("start_ns") >= F.lit(bound))


def saturating_sum(column: str) -> Column:
    """SUM of a count column that stays at INT64_MAX instead of overflowing (one client pushing absurd histogram
    counts must not fail the job for every other); null when every value is (a window where nothing was added)."""
    return F.expr(f"CAST({_capped(f'SUM(CAST(`{column}` AS DECIMAL(38,0)))')} AS BIGINT)")


def sum_arrays(column: str) -> Column:
    # Element-wise sum of equal-length arrays (histograms with the same bounds, so the same bucket count); each
    # element saturates at INT64_MAX as saturating_sum does.
    return F.expr(f"aggregate(collect_list(`{column}`), CAST(NULL AS ARRAY<BIGINT>), (acc, x) -> coalesce(zip_with("
                  f"acc, x, (a, b) -> CAST({_capped('CAST(a AS DECIMAL(20,0)) + b')} AS BIGINT)), x))")


def _capped(total: str) -> str:
    """SQL of `total` capped at INT64_MAX, null when it is null (LEAST would skip the null and answer INT64_MAX)."""
    return f"CASE WHEN {total} > {INT64_MAX}L THEN {INT64_MAX}L ELSE {total} END"


def _keys(dimensions: Sequence[str]) -> list[str]:
    return ["window_start", "metric", "type", *dimensions, "bounds"]


def partial_state(points: DataFrame, size_seconds: int, dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
                  extra_keys: Sequence[str] = (), extra: Sequence[Column] = ()) -> DataFrame:
    """Rollup state per (window, metric, type, dimensions, bounds, *extra_keys) of points that already went through
    with_increases; `extra` aggregates are added to the state columns."""
    gauge = _gauge_like()
    value = F.when(~F.isnan("value"), F.col("value"))
    level = F.when(gauge, value)
    last_value = F.when(gauge | _counter(), value)
    order = F.when(last_value.isNotNull(), F.struct("record_micros", "partition", "offset", "time_ns"))
    histogram = F.col("type").isin(*_HISTOGRAM_TYPES)
    keyed = points.withColumns({
        "window_start": window_start(F.col("record_micros"), size_seconds),
        "bounds": F.when(F.col("type") == "histogram", F.col("bounds")),
        "_counted": F.when(gauge, level.isNotNull().cast("long")).when(histogram, F.col("d_count")).otherwise(
            F.lit(1))})
    return keyed.groupBy(*_keys(dimensions), *extra_keys).agg(
        saturating_sum("_counted").alias("count"),
        F.sum(F.when(gauge & F.isnan("value"), 1).otherwise(0)).cast("long").alias("nan_count"),
        F.min(level).alias("min"),
        F.max(level).alias("max"),
        F.sum(F.when(histogram, F.col("d_sum")).otherwise(level)).alias("sum"),
        F.max_by(last_value, order).alias("last"),
        F.max(F.when(last_value.isNotNull(), F.timestamp_micros("record_micros"))).alias("last_at"),
        F.kll_sketch_agg_double(level).alias("kll_sketch"),
        # Points without an instance id (other writers) count one instance per resource.
        F.hll_sketch_agg(F.coalesce("client_instance_id", "resource")).alias("instances_sketch"),
        F.sum(F.when(_counter(), F.col("increase"))).alias("increase"),
        sum_arrays("d_buckets").alias("bucket_counts"),
        *extra,
    )


def merge_state(state: DataFrame, size_seconds: int | None, dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
                extra_keys: Sequence[str] = (), extra: Sequence[Column] = (),
                last_order: str = "last_at") -> DataFrame:
    """Rollup state of coarser windows of `size_seconds` (None: the same windows), merged from rollup state rows
    (never from points); `last` is the one latest by `last_order` (SQL text)."""
    coarse = state if size_seconds is None else state.withColumn(
        "window_start", window_start(F.unix_micros("window_start"), size_seconds))
    # In SQL text: built from Column functions, these aggregates took some 500 calls to the JVM a merge.
    return coarse.groupBy(*_keys(dimensions), *extra_keys).agg(
        saturating_sum("count").alias("count"),
        *(F.expr(text) for text in (
            "SUM(nan_count) AS nan_count", "MIN(`min`) AS `min`", "MAX(`max`) AS `max`", "SUM(`sum`) AS `sum`",
            f"MAX_BY(`last`, CASE WHEN `last` IS NOT NULL THEN {last_order} END) AS `last`",
            "MAX(last_at) AS last_at", "kll_merge_agg_double(kll_sketch) AS kll_sketch",
            "hll_union_agg(instances_sketch) AS instances_sketch", "SUM(increase) AS increase")),
        sum_arrays("bucket_counts").alias("bucket_counts"),
        *extra,
    )


def _quantiles_of(bounds, bucket_counts):  # untyped: PySpark would read type hints as a pandas UDF's
    if bounds is None or bucket_counts is None:
        return None
    return [histogram_quantile(q, bounds, bucket_counts) for _, q in QUANTILES]


# Runs once per histogram rollup row, not per point: a plain Python UDF is cheap enough here.
_histogram_quantiles = F.udf(_quantiles_of, ArrayType(DoubleType()))


def finish(state: DataFrame, resolution: Resolution, dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
           histograms: bool = True) -> DataFrame:
    """Output rows: the state plus avg, p50/p95/p99, instances and rate, nulls where a column does not apply.
    `histograms` False says `state` holds no histogram rows: their quantiles' Python UDF is then left out of the
    plan (Spark would still start it on every partition, some 0.3 s a run)."""
    # In SQL text: built from Column functions, this projection took some 800 calls to the JVM (0.1-0.2 s a run).
    ranks = ", ".join(f"{q!r}D" for _, q in QUANTILES)
    gauge_quantiles = F.expr("CASE WHEN kll_sketch IS NOT NULL AND type != 'histogram' AND min IS NOT NULL "
                             f"THEN kll_sketch_get_quantile_double(kll_sketch, array({ranks})) END")
    # Histogram rows apart: Spark sends every row of a projection holding a Python UDF to a Python worker, whatever
    # the condition around it. And the quantiles in a projection of their own, so p50/p95/p99 do not each repeat
    # the sketch work.
    if histograms:
        histogram = F.coalesce(F.col("type") == "histogram", F.lit(False))
        state = state.filter(~histogram).withColumn("_quantiles", gauge_quantiles).unionByName(
            state.filter(histogram).withColumn("_quantiles", _histogram_quantiles("bounds", "bucket_counts")))
    else:
        state = state.withColumn("_quantiles", gauge_quantiles)
    return state.selectExpr(
        f"'{resolution.label}' AS resolution",
        "window_start",
        f"window_start + INTERVAL {resolution.seconds} SECONDS AS window_end",
        "metric", "type", *(f"`{name}`" for name in dimensions),
        *(f"CAST(NULL AS STRING) AS {name}" for name in DEFAULT_DIMENSIONS if name not in dimensions),
        "hll_sketch_estimate(instances_sketch) AS instances",
        "`count`", "nan_count", "`min`", "`max`", "`sum`",
        "CASE WHEN `sum` IS NOT NULL AND `count` > 0 THEN `sum` / `count` END AS avg",
        "`last`", "last_at",
        *(f"_quantiles[{i}] AS {name}" for i, (name, _) in enumerate(QUANTILES)),
        "increase",
        f"increase / {float(resolution.seconds)!r}D AS rate",
        "bounds", "bucket_counts", "kll_sketch", "instances_sketch",
    )


def rollup(points: DataFrame, resolutions: Sequence[Resolution], dimensions: Sequence[str] = DEFAULT_DIMENSIONS,
           since_micros: int | None = None, read_from_micros: int | None = None) -> DataFrame:
    """Rows of every resolution for decoded `points` (errors dropped): the finest from points, each coarser merged
    from the one before. Points before `since_micros` serve only as predecessors of cumulative points;
    `read_from_micros` is where what was read starts (see with_cumulative_increases)."""
    points = with_increases(points.filter(F.col("error").isNull() & F.col("metric").isNotNull()), read_from_micros,
                            since_micros)
    if since_micros is not None:
        points = points.filter(F.col("record_micros") >= F.lit(since_micros))
    # Materialised once: the finest rows and every coarser merge read it, instead of each recomputing it from points.
    state = partial_state(points, resolutions[0].seconds, dimensions).localCheckpoint(eager=True)
    return rollup_state(state, resolutions, dimensions)


def rollup_state(state: DataFrame, resolutions: Sequence[Resolution],
                 dimensions: Sequence[str] = DEFAULT_DIMENSIONS, histograms: bool = True) -> DataFrame:
    """Rows of every resolution from the (materialised) state of the finest one (`histograms`: see `finish`)."""
    outputs = []
    for index, resolution in enumerate(resolutions):
        if index:
            state = merge_state(state, resolution.seconds, dimensions)
        outputs.append(finish(state, resolution, dimensions, histograms))
    result = outputs[0]
    for output in outputs[1:]:
        result = result.unionByName(output)
    return result
