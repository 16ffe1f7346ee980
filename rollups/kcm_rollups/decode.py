"""Decode metrics-topic records inside Spark: `mapInArrow` picks the contract headers out vectorised, runs the shared
codec and flattens columnar into one row per data point.

Each point's client identity comes from the headers, else from its own ResourceMetrics' resource (a record may hold
several), else (the instance id) from the record key. A point left without an instance id carries its resource
attributes as canonical JSON (`resource`): what tells other writers' clients, and their cumulative streams, apart.

A record that does not follow the contract, holds a point the columns cannot (INVALID_POINT), has a time windows
cannot (INVALID_TIMESTAMP) or would expand far past its size (TOO_LARGE), becomes one row with its `error` reason; it
never fails the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
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
    + [StructField("resource", StringType()), StructField("scope", StringType()),
       StructField("record_first", BooleanType()),
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
# A small record may expand into far more than its bytes: a 1 KB compressed record can hold millions of empty points,
# or one long text (a header, a resource, a scope or metric name) that each of its points copies. Past these bounds
# it is one TOO_LARGE error row (the codec's and the bridge's reason for the same), not gigabytes, nor an Arrow column
# past its 2 GiB that fails the batch and with it the job. A KIP-714 push (at most 1 MiB) stays far below them.
TOO_LARGE = "too-large"
MAX_POINTS = 100_000               # data points in one record
MAX_IDENTITY_CHARS = 4096          # one client identity value (header, resource attribute, key) or contract header
MAX_RECORD_TEXT = 32 * 1024**2     # characters of text a record's rows hold together
MAX_BATCH_TEXT = 256 * 1024**2     # characters of text after which flatten_batches starts another batch of points
_POINT_COLUMNS = ("scope", "metric", "type", "temporality", "monotonic", "time_ns", "start_ns", "attributes",
                  "value", "count", "sum", "bucket_counts", "bounds", "error", "error_message")


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


def flatten_batches(batches: Iterator[pa.RecordBatch], max_text: int | None = MAX_BATCH_TEXT,
                    columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: each batch of records into batches of points, a new one once a batch holds
    `max_text` characters of text (None: never), so that no text column nears Arrow's 2 GiB. With `columns` (names
    of POINTS_SCHEMA, in its order) the batches hold only those: the others are never built. Which records are
    error rows, and where batches are cut, does not depend on them."""
    fields = [field for field in POINTS_SCHEMA if columns is None or field.name in columns]
    if columns is not None and len(fields) != len(set(columns)):
        raise ValueError(f"not columns of POINTS_SCHEMA: {sorted(set(columns) - set(POINTS_SCHEMA.names))}")
    for batch in batches:
        yield from _Flattener(batch, fields).batches(max_text)


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
    by column, into one batch (flatten_batches cuts a large one into several)."""
    return next(_Flattener(batch, list(POINTS_SCHEMA)).batches(None))


class _Flattener:
    """The records of one input batch, read column by column once, flattened into batches of points."""

    def __init__(self, batch: pa.RecordBatch, fields: list[StructField]) -> None:
        self._batch = batch
        self._fields = fields
        self._values = batch.column("value").to_pylist()
        # Spark's binary-to-string cast of the key does not check it is UTF-8 (the key is the producer's): read as
        # bytes and replaced as the codec replaces them, rather than failing the batch and with it the job.
        self._keys = utf8_text(batch.column("key").cast(pa.binary())).to_pylist()
        self._times = batch.column("record_micros").to_pylist()
        self._headers = header_columns(batch.column("headers"), _CODEC_HEADERS + ATTRIBUTE_HEADERS)
        self._header_values = {name: self._headers[name].to_pylist() for name in _CODEC_HEADERS + IDENTITY}
        # An empty or blank identity header names no one: absent, so the resource or key may.
        self._given = [[_present(item) for item in identity]
                       for identity in zip(*(self._header_values[name] for name in IDENTITY))]
        # Carried headers ride on every point of their record: their length per record, and the longest one.
        lengths = [pc.utf8_length(self._headers[name]).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
                   for name in CARRIED]
        self._carried_chars = np.sum(lengths, axis=0).tolist() if lengths else [0] * len(self._values)
        self._carried_longest = np.max(lengths, axis=0).tolist() if lengths else [0] * len(self._values)
        self._resource_text = _AttributesText()

    def batches(self, max_text: int | None) -> Iterator[pa.RecordBatch]:
        rows = _Rows()
        for i in range(len(self._values)):
            self._add(rows, i)
            if max_text is not None and rows.text >= max_text and i + 1 < len(self._values):
                yield self._built(rows)
                rows = _Rows()
        yield self._built(rows)

    def _add(self, rows: _Rows, i: int) -> None:
        """Record `i`'s rows: a row per data point, or one row (its error, or none for a record without points)."""
        built, given = rows.built, self._given[i]
        start = len(built.record)
        try:
            if self._times[i] is None or not 0 <= self._times[i] < _LATEST_MICROS:
                raise NotRollable(f"the record's Kafka timestamp is not from 1970-01-01 to before "
                                  f"{LATEST_TIME:%Y-%m-%d}", INVALID_TIMESTAMP)
            record_headers = [(name, column[i]) for name, column in self._header_values.items()
                              if column[i] is not None]
            resources, text = built.add_points(i, contract.decode(self._values[i], record_headers).metrics)
            parts = [self._part(given, i, resource, count) for resource, count in resources]
            text += sum(count * chars for _, _, count, chars in parts) + self._carried_chars[i] * (
                len(built.record) - start)
            # A record without points keeps its identity (headers, key) on its one row: bounded the same.
            longest = max((self._carried_longest[i], *(max(map(len, filter(None, found)), default=0)
                                                       for found, *_ in parts or [self._part(given, i, None, 1)])))
            if longest > MAX_IDENTITY_CHARS:
                raise NotRollable(f"a client identity or contract header value of {longest} characters, more than "
                                  f"{MAX_IDENTITY_CHARS}", TOO_LARGE)
            if text > MAX_RECORD_TEXT:
                raise NotRollable(f"its {len(built.record) - start} points would hold {text} characters of text "
                                  f"(identity, headers, resource, scope, metric, attributes), more than "
                                  f"{MAX_RECORD_TEXT}", TOO_LARGE)
        except (contract.DecodeError, NotRollable) as err:
            built.drop_rows(start)
            self._add_empty(rows, i, given, err.reason, str(err))
            return
        if not parts:  # a valid record without points still counts as input
            self._add_empty(rows, i, given, None, None)
            return
        for found, resource, count, _ in parts:
            rows.add_part(found, resource, count)
        rows.first += [True] + [False] * (len(built.record) - start - 1)
        rows.text += text

    def _add_empty(self, rows: _Rows, i: int, given: list[str | None], reason: str | None,
                   message: str | None) -> None:
        """One row for record `i` without a point: undecodable (`reason`), or valid but empty."""
        rows.built.add_empty(i, reason, message)
        found, _, _, chars = self._part(given, i, None, 1)
        rows.add_part(found, None, 1)
        rows.first.append(True)
        rows.text += chars + self._carried_chars[i]

    def _part(self, given: list[str | None], i: int, resource: Any,
              count: int) -> tuple[list[str | None], str | None, int, int]:
        """The client identity of record `i`'s `count` points of `resource` (headers, else resource attributes, else
        for the instance id the key; an empty or blank value is absent), their resource text if that leaves them
        without an instance id, and the characters of both."""
        found = given
        if None in given:
            attributes = points.attributes(resource.attributes) if resource is not None else {}
            found = [header or _present(attributes.get(name)) for name, header in zip(IDENTITY, given)]
            found[0] = _present(self._keys[i]) if found[0] is None else found[0]  # the instance id, last from the key
            found = [None if item is None else str(item) for item in found]
        text = self._resource_text(resource.attributes) if found[0] is None and resource is not None else None
        return found, text, count, sum(map(len, filter(None, found))) + len(text or "")

    def _built(self, rows: _Rows) -> pa.RecordBatch:
        """The batch of `rows`; if Arrow cannot hold it, an error row per record instead, counted as decode errors
        rather than failing the job."""
        try:
            return rows.batch(self._batch, self._headers, self._fields)
        except (pa.ArrowException, MemoryError) as err:
            message = f"its points do not fit in an Arrow batch ({type(err).__name__}: {str(err)[:200]})"
        failed = _Rows()
        for i in dict.fromkeys(rows.built.record):
            self._add_empty(failed, i, self._given[i], TOO_LARGE, message)
        return failed.batch(self._batch, self._headers, self._fields)


class _Rows:
    """The rows of one batch of points being built: the point columns, and per part (a record's ResourceMetrics, or
    a record without points) its client identity, its resource and how many rows it holds."""

    def __init__(self) -> None:
        self.built = _PointColumns()
        self.identity: dict[str, list[str | None]] = {name: [] for name in IDENTITY}
        self.resources: list[str | None] = []
        self.part_rows: list[int] = []
        self.first: list[bool] = []
        self.text = 0  # characters of text the rows hold, counted as added

    def add_part(self, identity: list[str | None], resource: str | None, count: int) -> None:
        for name, item in zip(IDENTITY, identity):
            self.identity[name].append(item)
        self.resources.append(resource)
        self.part_rows.append(count)

    def batch(self, records: pa.RecordBatch, headers: dict[str, pa.Array],
              fields: list[StructField]) -> pa.RecordBatch:
        built = self.built
        indices = pa.array(built.record, pa.int64())
        parts_of_rows = pa.array(np.repeat(np.arange(len(self.part_rows), dtype=np.int64), self.part_rows))
        arrays = []
        for field in fields:
            if field.name in ("topic", "partition", "offset", "record_micros"):
                arrays.append(records.column(field.name).take(indices))
            elif field.name in CARRIED:
                arrays.append(headers[field.name].take(indices))
            elif field.name in IDENTITY:
                arrays.append(pa.array(self.identity[field.name], pa.string()).take(parts_of_rows))
            elif field.name == "resource":
                arrays.append(pa.array(self.resources, pa.string()).take(parts_of_rows))
            elif field.name == "record_first":
                arrays.append(pa.array(self.first, pa.bool_()))
            else:
                arrays.append(built.column(field.name, _ARROW_TYPES[field.dataType.simpleString()]))
        return pa.RecordBatch.from_arrays(arrays, names=[field.name for field in fields])


def _present(text: Any) -> Any:
    """`text`, or None if it is empty or blank: an empty header, attribute or key names no one."""
    return None if text is None or (isinstance(text, str) and not text.strip()) else text


class NotRollable(ValueError):
    """A record the rollup cannot hold (a point beyond its columns, a time beyond its windows): one error row."""

    def __init__(self, message: str, reason: str = INVALID_POINT) -> None:
        super().__init__(message)
        self.reason = reason


class _AttributesText:
    """Canonical (sorted) JSON of point attributes, so equal attribute sets group together whatever order a client
    sent them in; memoised on the serialised pairs, since the same few sets repeat in every push."""

    def __init__(self) -> None:
        self._known: dict[bytes | tuple[bytes, ...], str] = {}

    def __call__(self, pairs: Any) -> str:
        if not pairs:
            return "{}"
        # Each pair's bytes apart: joined, [{a: no value}, {"": "x"}] would be the bytes of [{a: "x"}] (proto3 leaves
        # empty fields out). One pair (most points) spares building a tuple.
        key = pairs[0].SerializeToString() if len(pairs) == 1 else tuple(p.SerializeToString() for p in pairs)
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
        self._scopes: dict[tuple[str, str], str | None] = {}
        # The scope column by runs (the row each starts at, the scope's text): a scope's rows are consecutive.
        self.scope_runs: list[tuple[int, str | None]] = []

    def add_empty(self, i: int, reason: str | None, message: str | None) -> None:
        """A row for record `i` without a point: undecodable (`reason`), or valid but empty."""
        self.scope_runs.append((len(self.record), None))
        if reason is not None:
            self.sparse["error"][len(self.record)] = reason
            self.sparse["error_message"][len(self.record)] = message
        self.record.append(i)
        for column in self.dense.values():
            column.append(None)

    def drop_rows(self, start: int) -> None:
        """Forget the rows from `start` on: those of a record found invalid halfway through its points."""
        del self.record[start:]
        while self.scope_runs and self.scope_runs[-1][0] >= start:
            self.scope_runs.pop()
        for column in self.dense.values():
            del column[start:]
        for entries in self.sparse.values():   # keyed by row, in the order rows were added: the dropped ones last
            while entries and next(reversed(entries)) >= start:
                entries.popitem()

    def add_points(self, i: int, data: metrics_pb2.MetricsData) -> tuple[list[tuple[Any, int]], int]:
        """A row per data point of record `i`: each resource with how many rows it added, in row order, and the
        characters of scope, metric and attribute text the rows hold. NotRollable (too-large) past MAX_POINTS."""
        # Python's per-point cost is what limits decoding: bound appends, no per-point dict lookups.
        record, dense, sparse, text, scopes = (self.record.append, self.dense, self.sparse, self._attributes_text,
                                               self._scopes)
        metric_name, metric_type = dense["metric"].append, dense["type"].append
        temporality_of, monotonic_of = dense["temporality"].append, dense["monotonic"].append
        time_ns, start_ns = dense["time_ns"].append, dense["start_ns"].append
        attributes, value = dense["attributes"].append, dense["value"].append
        parts = []
        start = len(self.record)
        counted = chars = 0
        for resource_metrics in data.resource_metrics:
            before = len(self.record)
            for scope_metrics in resource_metrics.scope_metrics:
                # A cumulative stream is one scope's (OTLP's metric identity includes it): its name and version.
                scope = scope_metrics.scope
                scope_key = (scope.name, scope.version)
                scope_text = scopes.get(scope_key, False)
                if scope_text is False:
                    scope_text = scopes[scope_key] = (json.dumps(scope_key, separators=(",", ":"))
                                                      if scope.name or scope.version else None)
                scope_start = len(self.record)
                self.scope_runs.append((scope_start, scope_text))
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
                    data_points = body.data_points
                    counted += len(data_points)  # before the points are walked: a small record may hold millions
                    if counted > MAX_POINTS:
                        raise NotRollable(f"more than {MAX_POINTS} data points in one record", TOO_LARGE)
                    number = kind in ("gauge", "sum")
                    for point in data_points:
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
                if scope_text is not None:
                    chars += len(scope_text) * (len(self.record) - scope_start)
            if len(self.record) > before:
                parts.append((resource_metrics.resource, len(self.record) - before))
        return parts, chars + sum(map(len, dense["metric"][start:])) + sum(map(len, dense["attributes"][start:]))

    def column(self, name: str, arrow_type: pa.DataType) -> pa.Array:
        if name == "scope":
            starts = np.array([start for start, _ in self.scope_runs] + [len(self.record)], np.int64)
            runs = np.repeat(np.arange(len(self.scope_runs), dtype=np.int64), np.diff(starts))
            return pa.array([text for _, text in self.scope_runs], arrow_type).take(pa.array(runs))
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
