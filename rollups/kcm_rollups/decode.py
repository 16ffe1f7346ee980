"""Decode metrics-topic records inside Spark: `mapInArrow` picks the contract headers out vectorised, runs the shared
codec and flattens columnar into one row per data point.

Each point's client identity comes from the headers, else from its own ResourceMetrics' resource (a record may hold
several), else (the instance id) from the record key. A point left without an instance id carries its resource
attributes as canonical JSON (`resource`): what tells other writers' clients, and their cumulative streams, apart.

A record that does not follow the contract, holds a point the columns cannot (INVALID_POINT) or has a time windows
cannot (INVALID_TIMESTAMP), becomes one row with its `error` reason; it never fails the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DoubleType, IntegerType, LongType, StringType,
                               StructField, StructType)

from kcm_common import contract, points
from kcm_common.names import ATTRIBUTE_HEADERS
from kcm_rollups.windows import LATEST_TIME

IDENTITY = ("client_instance_id", "client_id", "client_software_name", "client_software_version")  # instance first
# Contract headers other than the client identity ride through decoding unchanged, to group by if asked.
CARRIED = tuple(name for name in ATTRIBUTE_HEADERS if name not in IDENTITY)
_CODEC_HEADERS = (contract.CONTENT_TYPE_HEADER, contract.CONTENT_ENCODING_HEADER)

POINTS_SCHEMA = StructType(
    [StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("offset", LongType()),
     StructField("record_micros", LongType())]
    + [StructField(name, StringType()) for name in IDENTITY + CARRIED]
    + [StructField("resource", StringType()), StructField("record_first", BooleanType()),
       StructField("metric", StringType()), StructField("type", StringType()),
       StructField("temporality", StringType()), StructField("monotonic", BooleanType()),
       StructField("time_ns", LongType()), StructField("start_ns", LongType()),
       StructField("attributes", StringType()), StructField("value", DoubleType()),
       StructField("count", LongType()), StructField("sum", DoubleType()),
       StructField("bucket_counts", ArrayType(LongType())), StructField("bounds", ArrayType(DoubleType())),
       StructField("error", StringType()), StructField("error_message", StringType())]
)
_HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
# What `flatten` takes: the Kafka source's columns with a string key and the record time in microseconds.
DECODE_INPUT_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.binary()), ("topic", pa.string()),
                                 ("partition", pa.int32()), ("offset", pa.int64()), ("record_micros", pa.int64()),
                                 ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])
_ARROW_TYPES = {
    "string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "boolean": pa.bool_(), "double": pa.float64(),
    "array<bigint>": pa.list_(pa.int64()), "array<double>": pa.list_(pa.float64()),
}
_TEMPORALITY = {metrics_pb2.AGGREGATION_TEMPORALITY_DELTA: "delta",
                metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative"}
# Besides the codec's reasons: a point the rollup columns cannot hold (a uint64 beyond int64, buckets that do not
# match the bounds). The whole record becomes the error row, as for the codec's reasons.
INVALID_POINT = "invalid-point"
# And a record whose Kafka timestamp is at or beyond LATEST_TIME: its windows could not be dates (nor, near the end
# of 64-bit microseconds, be computed at all).
INVALID_TIMESTAMP = "invalid-timestamp"
_LATEST_MICROS = int(LATEST_TIME.timestamp()) * 1_000_000
INT64_MAX = 2**63 - 1  # the largest count the columns hold: sums of counts saturate here
_POINT_COLUMNS = ("metric", "type", "temporality", "monotonic", "time_ns", "start_ns", "attributes", "value",
                  "count", "sum", "bucket_counts", "bounds", "error", "error_message")


def decode_input(records: DataFrame) -> DataFrame:
    """The Kafka source's rows reduced to what `flatten` needs (see DECODE_INPUT_SCHEMA)."""
    # Headers are picked out in Python, vectorised: Spark's higher-order functions cost ~10x more CPU here.
    headers = F.col("headers") if "headers" in records.columns else F.lit(None).cast(_HEADERS_TYPE)
    return records.select(
        F.col("key").cast("string").alias("key"), "value", "topic", "partition", "offset",
        F.unix_micros("timestamp").alias("record_micros"), headers.alias("headers"))


def decode_points(records: DataFrame) -> DataFrame:
    """One row per data point (or per undecodable record) of Kafka-source-shaped `records`; see POINTS_SCHEMA."""
    return decode_input(records).mapInArrow(flatten_batches, POINTS_SCHEMA)


def flatten_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: each batch of records into a batch of points."""
    for batch in batches:
        yield flatten(batch)


def header_columns(headers: pa.Array, names: tuple[str, ...]) -> dict[str, pa.Array]:
    """The value of each named header per record, as UTF-8 strings; the last non-null value of a repeated header
    wins, as in the codec."""
    count = len(headers)
    entries = headers.flatten()
    parents = pc.list_parent_indices(headers).to_numpy()
    keys, values = entries.field("key"), entries.field("value")
    usable = pc.and_(entries.is_valid(), values.is_valid())
    found = {}
    for name in names:
        matches = np.flatnonzero(pc.and_(usable, pc.equal(keys, name)).fill_null(False).to_numpy(zero_copy_only=False))
        owners = parents[matches]
        # Matches come in record order: the last one of each record is where the owner changes next.
        last = np.append(owners[1:] != owners[:-1], True) if len(owners) else np.zeros(0, bool)
        chosen = np.full(count, -1, np.int64)
        chosen[owners[last]] = matches[last]
        found[name] = utf8_text(values.take(pa.array(chosen, mask=chosen < 0)))
    return found


def utf8_text(raw: pa.Array) -> pa.Array:
    """Binary values as strings, as Spark's cast does; bytes that are not UTF-8 are replaced as the codec does."""
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", errors="replace") for v in raw.to_pylist()],
                        pa.string())


def flatten(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode every record of `batch` (DECODE_INPUT_SCHEMA) with the shared codec and flatten its data points column
    by column."""
    values = batch.column("value").to_pylist()
    # Spark's binary-to-string cast of the key does not check it is UTF-8 (the key is the producer's): read as
    # bytes and replaced as the codec replaces them, rather than failing the batch and with it the job.
    keys = utf8_text(batch.column("key").cast(pa.binary())).to_pylist()
    times = batch.column("record_micros").to_pylist()
    headers = header_columns(batch.column("headers"), _CODEC_HEADERS + ATTRIBUTE_HEADERS)
    header_values = {name: headers[name].to_pylist() for name in _CODEC_HEADERS + IDENTITY}
    built = _PointColumns()
    resource_text = _AttributesText()
    first: list[bool] = []
    # Per resource of each record (the OpenTelemetry Collector's Kafka exporter batches several into one): the client
    # identity, the resource that keeps streams apart where there is no instance id, and how many rows it holds.
    identity: dict[str, list[Any]] = {name: [] for name in IDENTITY}
    resources: list[str | None] = []
    part_rows: list[int] = []
    for i, value in enumerate(values):
        record_headers = [(name, column[i]) for name, column in header_values.items() if column[i] is not None]
        start = len(built.record)
        parts: list[tuple[Any, int]] = [(None, 1)]
        try:
            if times[i] is None or times[i] >= _LATEST_MICROS:
                raise NotRollable(f"the record's Kafka timestamp is not before {LATEST_TIME:%Y-%m-%d}",
                                   INVALID_TIMESTAMP)
            decoded = contract.decode(value, record_headers)
            parts = built.add_points(i, decoded.metrics) or parts
        except (contract.DecodeError, NotRollable) as err:
            built.drop_rows(start)
            built.add_empty(i, err.reason, str(err))
        else:
            if len(built.record) == start:  # a valid record without points still counts as input
                built.add_empty(i, None, None)
        given = [header_values[name][i] for name in IDENTITY]
        for resource, rows in parts:
            found = given
            if None in given:
                attributes = points.attributes(resource.attributes) if resource is not None else {}
                found = [header or attributes.get(name) for name, header in zip(IDENTITY, given)]
                found[0] = keys[i] if found[0] is None else found[0]  # the instance id, last from the key
                found = [None if item is None else str(item) for item in found]
            for name, text in zip(IDENTITY, found):
                identity[name].append(text)
            resources.append(resource_text(resource.attributes) if found[0] is None and resource is not None else None)
            part_rows.append(rows)
        first += [True] + [False] * (len(built.record) - start - 1)
    indices = pa.array(built.record, pa.int64())
    parts_of_rows = pa.array(np.repeat(np.arange(len(part_rows), dtype=np.int64), part_rows))
    arrays = []
    for field in POINTS_SCHEMA:
        if field.name in ("topic", "partition", "offset", "record_micros"):
            arrays.append(batch.column(field.name).take(indices))
        elif field.name in CARRIED:
            arrays.append(headers[field.name].take(indices))
        elif field.name in IDENTITY:
            arrays.append(pa.array(identity[field.name], pa.string()).take(parts_of_rows))
        elif field.name == "resource":
            arrays.append(pa.array(resources, pa.string()).take(parts_of_rows))
        elif field.name == "record_first":
            arrays.append(pa.array(first, pa.bool_()))
        else:
            arrays.append(built.column(field.name, _ARROW_TYPES[field.dataType.simpleString()]))
    return pa.RecordBatch.from_arrays(arrays, names=POINTS_SCHEMA.names)


class NotRollable(ValueError):
    """A record the rollup cannot hold (a point beyond its columns, a time beyond its windows): one error row."""

    def __init__(self, message: str, reason: str = INVALID_POINT) -> None:
        super().__init__(message)
        self.reason = reason


class _AttributesText:
    """Canonical (sorted) JSON of point attributes, so equal attribute sets group together whatever order a client
    sent them in; memoised on the serialised pairs, since the same few sets repeat in every push."""

    def __init__(self) -> None:
        self._known: dict[bytes, str] = {}

    def __call__(self, pairs: Any) -> str:
        if not pairs:
            return "{}"
        key = b"".join(pair.SerializeToString() for pair in pairs)
        text = self._known.get(key)
        if text is None:
            text = json.dumps(points.attributes(pairs), sort_keys=True, separators=(",", ":"), default=str)
            self._known[key] = text
        return text


class _PointColumns:
    """The point columns of one batch being built: a list per column every point fills, and sparse entries (by row)
    for what only histograms, summaries and undecodable records fill."""

    _DENSE = ("metric", "type", "temporality", "monotonic", "time_ns", "start_ns", "attributes", "value")

    def __init__(self) -> None:
        self.record: list[int] = []
        self.dense: dict[str, list[Any]] = {name: [] for name in self._DENSE}
        self.sparse: dict[str, dict[int, Any]] = {name: {} for name in _POINT_COLUMNS if name not in self._DENSE}
        self._attributes_text = _AttributesText()

    def add_empty(self, i: int, reason: str | None, message: str | None) -> None:
        """A row for record `i` without a point: undecodable (`reason`), or valid but empty."""
        if reason is not None:
            self.sparse["error"][len(self.record)] = reason
            self.sparse["error_message"][len(self.record)] = message
        self.record.append(i)
        for column in self.dense.values():
            column.append(None)

    def drop_rows(self, start: int) -> None:
        """Forget the rows from `start` on: those of a record found invalid halfway through its points."""
        del self.record[start:]
        for column in self.dense.values():
            del column[start:]
        for entries in self.sparse.values():   # keyed by row, in the order rows were added: the dropped ones last
            while entries and next(reversed(entries)) >= start:
                entries.popitem()

    def add_points(self, i: int, data: metrics_pb2.MetricsData) -> list[tuple[Any, int]]:
        """A row per data point of record `i`; returns each resource with how many rows it added, in row order."""
        # Python's per-point cost is what limits decoding: bound appends, no per-point dict lookups.
        record, dense, sparse, text = self.record.append, self.dense, self.sparse, self._attributes_text
        metric_name, metric_type = dense["metric"].append, dense["type"].append
        temporality_of, monotonic_of = dense["temporality"].append, dense["monotonic"].append
        time_ns, start_ns = dense["time_ns"].append, dense["start_ns"].append
        attributes, value = dense["attributes"].append, dense["value"].append
        parts = []
        for resource_metrics in data.resource_metrics:
            before = len(self.record)
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    if kind is None:
                        continue
                    name = metric.name
                    if kind == "gauge":  # most points: spare the lookups below (a failing getattr is slow)
                        body, temporality, monotonic = metric.gauge, None, None
                    else:
                        body = getattr(metric, kind)
                        # A summary has no temporality field: OTLP defines its count and sum as cumulative.
                        temporality = ("cumulative" if kind == "summary"
                                       else _TEMPORALITY.get(body.aggregation_temporality))
                        monotonic = body.is_monotonic if kind == "sum" else None
                    number = kind in ("gauge", "sum")
                    for point in body.data_points:
                        point_time, point_start = point.time_unix_nano, point.start_time_unix_nano
                        if point_time > INT64_MAX or point_start > INT64_MAX:
                            raise NotRollable(f"metric {name!r}: time_unix_nano {point_time} or "
                                               f"start_time_unix_nano {point_start} is beyond a signed 64-bit time")
                        if not number:
                            row = len(self.record)
                            sparse["count"][row] = _counted(name, "count", point.count)
                            if kind == "summary" or point.HasField("sum"):
                                sparse["sum"][row] = point.sum
                            if kind == "histogram":
                                sparse["bucket_counts"][row] = _buckets(name, point)
                                sparse["bounds"][row] = list(point.explicit_bounds)
                        record(i)
                        metric_name(name)
                        metric_type(kind)
                        temporality_of(temporality)
                        monotonic_of(monotonic)
                        time_ns(point_time)
                        start_ns(point_start)
                        attributes(text(point.attributes))
                        if number:
                            which = point.WhichOneof("value")
                            value(None if which is None else float(point.as_double if which == "as_double"
                                                                   else point.as_int))
                        else:
                            value(None)
            if len(self.record) > before:
                parts.append((resource_metrics.resource, len(self.record) - before))
        return parts

    def column(self, name: str, arrow_type: pa.DataType) -> pa.Array:
        if name in self.dense:
            return pa.array(self.dense[name], arrow_type)
        entries = self.sparse[name]
        if not entries:
            return pa.nulls(len(self.record), arrow_type)
        filled: list[Any] = [None] * len(self.record)
        for row, item in entries.items():
            filled[row] = item
        return pa.array(filled, arrow_type)


def _counted(metric: str, field: str, count: int) -> int:
    """A uint64 count as the int64 the columns hold, else NotRollable."""
    if count > INT64_MAX:
        raise NotRollable(f"metric {metric!r}: {field} {count} is beyond a signed 64-bit count")
    return count


def _buckets(metric: str, point: Any) -> list[int] | None:
    """A histogram point's bucket counts (None without buckets); NotRollable unless there is one more than bounds,
    or none and no bounds, as OTLP requires."""
    counts, bounds = point.bucket_counts, point.explicit_bounds
    if len(counts) != len(bounds) + 1 and (counts or bounds):
        raise NotRollable(f"metric {metric!r}: a histogram point with {len(counts)} bucket counts for "
                           f"{len(bounds)} bounds (OTLP needs {len(bounds) + 1}, or none and no bounds)")
    if not counts:
        return None
    _counted(metric, "bucket count", max(counts))
    return list(counts)
