"""The finest windows' rollup state computed next to the decoder, in the Python worker, before anything reaches the
JVM: the same columns, with the same SQL semantics, as `aggregate.partial_state` over the points of `job.first_pass`.

Decoding leaves some ten points per record; grouping them by window and dimensions where they are made means the
JVM receives one row per group and run of batches (some 30x fewer rows than points) and merges those (`merge_batches`),
instead of receiving every point and aggregating it. The sketches are Apache DataSketches' KLL (doubles, k=200) and HLL
(lgConfigK=12, HLL_8), built with the `datasketches` package: the same binary forms Spark's `kll_sketch_agg_double`
and `hll_sketch_agg` build, so Spark merges them with `kll_merge_agg_double` and `hll_union_agg`.
Null handling follows Spark SQL's three-valued logic, so the rows match `partial_state`'s exactly (tests compare).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DoubleType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from kcm_rollups.decode import INT64_MAX

_HISTOGRAM_TYPES = ("histogram", "exponential_histogram", "summary")
_KLL_K = 200          # Spark's default for kll_sketch_agg_double
_HLL_LG_K = 12        # Spark's default for hll_sketch_agg
_MICROS = 1_000_000
# Point rows gathered before their state is computed: each state holds a row per group, which the JVM merges; the
# batches that make them up stay small, since decoding builds Python objects for a whole batch at a time. States of
# 200,000 points gave the JVM 5% fewer rows at 1M points, but held 70 MB more at their peak: pages a fresh Python
# worker has the kernel zero, which made a first run's read tasks 0.3-0.5 s longer each.
STATE_POINTS = 50_000
# And at most this many bytes of them, as one batch of points (decode.MAX_BATCH_TEXT) holds: state concatenates their
# columns, and a text column past 2 GiB fails.
STATE_BYTES = 256 * 1024**2
# Besides `aggregate.STATE_COLUMNS`: the order of `last` (to merge it exactly) and the error counts of first_pass.
_ORDER = (("last_micros", LongType()), ("last_partition", IntegerType()), ("last_offset", LongType()),
          ("last_time_ns", LongType()))
# The point columns `partial_state` reads, besides the dimensions: decoding builds no others for it.
_STATE_INPUT = ("partition", "offset", "record_micros", "client_instance_id", "resource", "record_first", "metric",
                "type", "temporality", "monotonic", "time_ns", "value", "count", "sum", "bucket_counts", "bounds",
                "error")
# Only in read_ends_batch's rows (null in all others): a partition, and the offset after the last record read in it.
_READ_END = (("read_partition", IntegerType()), ("read_end", LongType()))


def state_schema(dimensions: Sequence[str]) -> StructType:
    """The rows `partial_batches` yields: keys, then state."""
    from kcm_rollups.decode import POINTS_SCHEMA

    return StructType(
        [StructField("window_start", TimestampType()), StructField("metric", StringType()),
         StructField("type", StringType())]
        + [POINTS_SCHEMA[name] for name in dimensions]
        + [StructField("bounds", ArrayType(DoubleType())), StructField("error", StringType()),
           StructField("needs_previous", BooleanType()),
           StructField("count", LongType()), StructField("nan_count", LongType()), StructField("min", DoubleType()),
           StructField("max", DoubleType()), StructField("sum", DoubleType()), StructField("last", DoubleType()),
           *[StructField(name, kind) for name, kind in _ORDER],
           StructField("last_at", TimestampType()), StructField("kll_sketch", BinaryType()),
           StructField("instances_sketch", BinaryType()), StructField("increase", DoubleType()),
           StructField("bucket_counts", ArrayType(LongType())), StructField("records", LongType()),
           StructField("points", LongType()), *[StructField(name, kind) for name, kind in _READ_END]])


def state_input_columns(dimensions: Sequence[str]) -> list[str]:
    """The columns of decode.POINTS_SCHEMA, in its order, that `partial_state` needs for these dimensions."""
    from kcm_rollups.decode import POINTS_SCHEMA

    return [name for name in POINTS_SCHEMA.names if name in _STATE_INPUT or name in dimensions]


def read_ends_batch(ends: dict[int, int], dimensions: Sequence[str]) -> pa.RecordBatch:
    """State rows saying how far a read went: per partition the offset after the last record it read (`read_end`),
    every other column null (records and points 0). `job.first_pass` gathers them to pin the cumulative pass."""
    schema = _arrow_schema(dimensions)
    given = {"read_partition": pa.array(list(ends), pa.int32()), "read_end": pa.array(list(ends.values()), pa.int64()),
             "records": pa.array([0] * len(ends), pa.int64()), "points": pa.array([0] * len(ends), pa.int64())}
    return pa.RecordBatch.from_arrays([given.get(f.name, pa.nulls(len(ends), f.type)) for f in schema], schema=schema)


def noting_read_ends(batches: Iterator[pa.RecordBatch], read_ends: dict[int, int], since_micros: int | None,
                     until_micros: int | None) -> Iterator[pa.RecordBatch]:
    """Batches of records (decode.DECODE_INPUT_SCHEMA) with record times in [since_micros, until_micros), noting in
    `read_ends` per partition the offset after the last record read, in the range or not (see read_ends_batch)."""
    for batch in batches:
        if not batch.num_rows:
            continue
        furthest = pa.table({"partition": batch.column("partition"), "offset": batch.column("offset")}).group_by(
            "partition").aggregate([("offset", "max")])
        for partition, offset in zip(furthest.column("partition").to_pylist(),
                                     furthest.column("offset_max").to_pylist()):
            read_ends[partition] = max(offset + 1, read_ends.get(partition, offset + 1))
        micros = batch.column("record_micros")
        kept = [pc.greater_equal(micros, since_micros)] if since_micros is not None else []
        kept += [pc.less(micros, until_micros)] if until_micros is not None else []
        if kept:
            batch = batch.filter(_and(*kept))  # a null time is outside any range
        if batch.num_rows:
            yield batch


def partial_batches(batches: Iterator[pa.RecordBatch], size_seconds: int, dimensions: Sequence[str],
                    min_points: int = STATE_POINTS, max_bytes: int = STATE_BYTES) -> Iterator[pa.RecordBatch]:
    """Batches of points (decode.POINTS_SCHEMA columns) as rollup state (`state_schema`): one state for each run of
    consecutive batches holding at least `min_points` rows between them, or as many as fit in `max_bytes` (a batch
    larger on its own: alone), the last run whatever remains."""
    schema = _arrow_schema(dimensions)
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if pending and size + batch.nbytes > max_bytes:
            yield from _state_batch(pending, size_seconds, dimensions, schema)
            pending, rows, size = [], 0, 0
        pending.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if rows >= min_points:
            yield from _state_batch(pending, size_seconds, dimensions, schema)
            pending, rows, size = [], 0, 0
    if pending:
        yield from _state_batch(pending, size_seconds, dimensions, schema)


def _state_batch(points: list[pa.RecordBatch], size_seconds: int, dimensions: Sequence[str],
                 schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    state = partial_state(points[0] if len(points) == 1 else pa.Table.from_batches(points), size_seconds, dimensions)
    if state.num_rows:
        yield pa.RecordBatch.from_arrays([state.column(f.name).combine_chunks() if f.name in state.column_names
                                          else pa.nulls(state.num_rows, f.type) for f in schema], schema=schema)


def _arrow_schema(dimensions: Sequence[str]) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(state_schema(dimensions), timezone="UTC")


def _and(*conditions: pa.Array) -> pa.Array:
    result = conditions[0]
    for condition in conditions[1:]:
        result = pc.and_kleene(result, condition)
    return result


def _or(left: pa.Array, right: pa.Array) -> pa.Array:
    return pc.or_kleene(left, right)


def _when(condition: pa.Array, value: pa.Array) -> pa.Array:
    """SQL `CASE WHEN condition THEN value END`: null where the condition is false or null."""
    return pc.if_else(condition.fill_null(False), value, pa.nulls(len(value), value.type))


def partial_state(points: pa.RecordBatch | pa.Table, size_seconds: int, dimensions: Sequence[str]) -> pa.Table:
    """The rollup state of `points` per (window, metric, type, dimensions, bounds, error, needs_previous)."""
    table = pa.Table.from_batches([points]) if isinstance(points, pa.RecordBatch) else points
    if not table.num_rows:
        return pa.table({})
    # Only what is read below: sorting takes every column it is given.
    table = table.select(state_input_columns(dimensions))
    # Ascending (record time, partition, offset, point time): `last` is then the last non-null value of its group.
    table = table.sort_by([("record_micros", "ascending"), ("partition", "ascending"), ("offset", "ascending"),
                           ("time_ns", "ascending")])
    col = {name: table.column(name).combine_chunks() for name in table.column_names}
    kind, temporality, value = col["type"], col["temporality"], col["value"]
    cumulative = pc.equal(temporality, "cumulative")
    is_sum = pc.equal(kind, "sum")
    gauge = _or(pc.equal(kind, "gauge"), _and(is_sum, pc.invert(col["monotonic"]), cumulative))
    counter = _and(is_sum, pc.invert(gauge))
    histogram = pc.is_in(kind, pa.array(_HISTOGRAM_TYPES)).fill_null(False)
    nan = pc.is_nan(value).fill_null(False)
    counted = _and(counter, pc.is_valid(value), pc.invert(nan))
    needs_previous = _and(cumulative, _or(counted, histogram)).fill_null(False)
    number = _when(pc.invert(nan), value)
    level = _when(gauge, number)
    last_value = _when(_or(gauge, counter), number)
    has_last = pc.is_valid(last_value)
    count = pc.if_else(gauge.fill_null(False), pc.cast(pc.is_valid(level), pa.int64()),
                       pc.if_else(histogram, col["count"], pa.scalar(1, pa.int64())))
    # Spark's floor(micros / size) * size, in microseconds, with unchecked casts as Spark converts: a record time
    # beyond 2^53 microseconds (after year 2255) is rounded, never an error that would fail the job.
    size = size_seconds * _MICROS
    window = pc.multiply(pc.cast(pc.floor(pc.divide(pc.cast(col["record_micros"], pa.float64(), safe=False), size)),
                                 pa.int64(), safe=False), size)
    bounds = _when(pc.equal(kind, "histogram"), col["bounds"])
    bounds_key, bounds_by_key = _list_key(bounds)
    work = pa.table({
        "window": window, "metric": col["metric"], "type": kind,
        **{f"d_{name}": col[name] for name in dimensions}, "bounds_key": bounds_key, "error": col["error"],
        "needs_previous": needs_previous,
        "count": count, "nan": pc.cast(pc.and_(gauge.fill_null(False), nan), pa.int64()),
        # A histogram point without a sum adds NaN (unknown), as aggregate._known_sum.
        "level": level, "sum": pc.if_else(histogram, col["sum"].fill_null(float("nan")), level), "last": last_value,
        "last_micros": _when(has_last, col["record_micros"]), "last_partition": _when(has_last, col["partition"]),
        "last_offset": _when(has_last, col["offset"]), "last_time_ns": _when(has_last, col["time_ns"]),
        "increase": _when(counter, _when(counted, value)),
        "instance": pc.coalesce(col["client_instance_id"], col["resource"]),  # as aggregate.partial_state counts them
        "row": pa.array(np.arange(table.num_rows, dtype=np.int64)),
        "records": pc.cast(col["record_first"], pa.int64()), "metric_valid": pc.cast(pc.is_valid(col["metric"]),
                                                                                      pa.int64()),
    })
    keys = ["window", "metric", "type", *(f"d_{name}" for name in dimensions), "bounds_key", "error",
            "needs_previous"]
    buckets = _when(histogram, col["bucket_counts"])
    has_buckets = bool(pc.any(pc.is_valid(buckets)).as_py())
    # Arrow's int64 sum wraps around: where counts this large could pass 2^63 - 1, they are added up in Python and
    # saturate there, as aggregate.saturating_sum does.
    huge = (pc.max(count).as_py() or 0) * table.num_rows > INT64_MAX
    grouped = work.group_by(keys, use_threads=False).aggregate([
        ("count", "list" if huge else "sum"), ("nan", "sum"), ("level", "min"), ("level", "max"), ("sum", "sum"),
        ("last", "last"), ("last_micros", "last"), ("last_partition", "last"), ("last_offset", "last"),
        ("last_time_ns", "last"), ("last_micros", "max"), ("level", "list"), ("instance", "distinct"),
        ("increase", "sum"), ("records", "sum"), ("metric_valid", "sum"), *([("row", "list")] if has_buckets else [])])
    return _finish(grouped, dimensions, bounds_by_key, buckets if has_buckets else None)


def _list_key(bounds: pa.Array) -> tuple[pa.Array, dict[bytes, list[float | None]]]:
    """A groupable key for each list of bounds (null for null), and the lists by key."""
    if not pc.any(pc.is_valid(bounds)).as_py():
        return pa.nulls(len(bounds), pa.binary()), {}
    by_key: dict[bytes, list[float | None]] = {}
    keys: list[bytes | None] = []
    for item in bounds.to_pylist():
        if item is None:
            keys.append(None)
            continue
        # As Spark's grouping: -0.0 is 0.0 and every NaN is one NaN (repr keeps None, nan and the rest apart).
        normalised = [None if v is None else v + 0.0 for v in item]
        key = repr(normalised).encode()
        by_key.setdefault(key, normalised)
        keys.append(key)
    return pa.array(keys, pa.binary()), by_key


def _finish(grouped: pa.Table, dimensions: Sequence[str], bounds_by_key: dict[bytes, list[float | None]],
            buckets_of_rows: pa.Array | None) -> pa.Table:
    import datasketches

    levels = grouped.column("level_list").combine_chunks()
    offsets = levels.offsets.to_numpy()
    values = levels.values.to_numpy(zero_copy_only=False)  # nulls become NaN, and a level is never NaN
    instances = grouped.column("instance_distinct").to_pylist()
    kll, hll = [], []
    hll_cache: dict[tuple[str, ...], bytes] = {}
    for index, ids in enumerate(instances):
        sketch = datasketches.kll_doubles_sketch(_KLL_K)
        present = values[offsets[index]:offsets[index + 1]]
        present = present[~np.isnan(present)]
        if len(present):
            sketch.update(present)
        kll.append(sketch.serialize())
        members = tuple(sorted(i for i in ids if i is not None))
        packed = hll_cache.get(members)
        if packed is None:
            distinct = datasketches.hll_sketch(_HLL_LG_K, datasketches.tgt_hll_type.HLL_8)
            for member in members:
                distinct.update(member)
            packed = hll_cache[members] = distinct.serialize_compact()
        hll.append(packed)
    keys = grouped.column("bounds_key").to_pylist()
    buckets: list[list[int | None] | None] = [None] * grouped.num_rows
    if buckets_of_rows is not None:
        chosen = buckets_of_rows.to_pylist()
        for index, rows in enumerate(grouped.column("row_list").to_pylist()):
            buckets[index] = _sum_arrays([chosen[row] for row in rows])
    window = grouped.column("window")
    last_at = grouped.column("last_micros_max")
    return pa.table({
        "window_start": window.cast(pa.timestamp("us", tz="UTC")),
        "metric": grouped.column("metric"), "type": grouped.column("type"),
        **{name: grouped.column(f"d_{name}") for name in dimensions},
        "bounds": pa.array([bounds_by_key.get(key) if key is not None else None for key in keys],
                           pa.list_(pa.float64())),
        "error": grouped.column("error"), "needs_previous": grouped.column("needs_previous"),
        "count": _saturated_sums(grouped.column("count_list")) if "count_list" in grouped.column_names
        else grouped.column("count_sum"), "nan_count": grouped.column("nan_sum").fill_null(0),
        "min": grouped.column("level_min"), "max": grouped.column("level_max"), "sum": grouped.column("sum_sum"),
        "last": grouped.column("last_last"), "last_micros": grouped.column("last_micros_last"),
        "last_partition": grouped.column("last_partition_last"), "last_offset": grouped.column("last_offset_last"),
        "last_time_ns": grouped.column("last_time_ns_last"),
        "last_at": last_at.cast(pa.timestamp("us", tz="UTC")),
        "kll_sketch": pa.array(kll, pa.binary()), "instances_sketch": pa.array(hll, pa.binary()),
        "increase": grouped.column("increase_sum"), "bucket_counts": pa.array(buckets, pa.list_(pa.int64())),
        "records": grouped.column("records_sum"), "points": grouped.column("metric_valid_sum").fill_null(0),
    })


def _saturated_sums(lists: pa.ChunkedArray) -> pa.Array:
    """Each list's sum (null for only nulls, as SQL's SUM), at most INT64_MAX."""
    sums = []
    for values in lists.to_pylist():
        present = [value for value in values if value is not None]
        sums.append(min(sum(present), INT64_MAX) if present else None)
    return pa.array(sums, pa.int64())


def _sum_arrays(arrays: list[Any]) -> list[int | None] | None:
    """aggregate.sum_arrays: `aggregate(collect_list(x), null, (acc, x) -> coalesce(zip_with(acc, x, +), x))` with
    nulls skipped, element-wise sums saturating at INT64_MAX, a shorter array's missing elements null."""
    total: list[int | None] | None = None
    for array in arrays:
        if array is None:
            continue
        if total is None:
            total = list(array)
            continue
        width = max(len(total), len(array))
        total = [None if i >= len(total) or i >= len(array) or total[i] is None or array[i] is None
                 else min(total[i] + array[i], INT64_MAX) for i in range(width)]
    return total


def merge_batches(state: Any, dimensions: Sequence[str]) -> Any:
    """The Spark side: one row per key from the per-batch state rows, merged as `aggregate.merge_state` merges
    windows, `last` by its full order, with the error counts of first_pass; and one row per partition a read went
    through (`read_ends_batch`), with the furthest `read_end`."""
    from pyspark.sql import functions as F

    from kcm_rollups.aggregate import merge_state

    return merge_state(state, None, dimensions, extra_keys=("error", "needs_previous", "read_partition"),
                       extra=(F.sum("records").alias("records"), F.sum("points").alias("points"),
                              F.max("read_end").alias("read_end")),
                       last_order=f"struct({', '.join(name for name, _ in _ORDER)})")
