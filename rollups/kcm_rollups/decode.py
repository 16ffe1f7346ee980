"""Decode metrics-topic records inside Spark: contract headers pulled out in SQL, then `mapInArrow` running the
shared codec and a columnar flatten into one row per data point.

A record that does not follow the contract becomes one row with its `error` reason; it never fails the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from opentelemetry.proto.metrics.v1 import metrics_pb2
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BooleanType, DoubleType, IntegerType, LongType, StringType, StructField,
                               StructType)

from kcm_common import contract, points
from kcm_common.names import ATTRIBUTE_HEADERS

IDENTITY = ("client_instance_id", "client_id", "client_software_name", "client_software_version")
# Contract headers other than the client identity ride through decoding unchanged, to group by if asked.
CARRIED = tuple(name for name in ATTRIBUTE_HEADERS if name not in IDENTITY)
_CODEC_HEADERS = (contract.CONTENT_TYPE_HEADER, contract.CONTENT_ENCODING_HEADER)

POINTS_SCHEMA = StructType(
    [StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("offset", LongType()),
     StructField("record_micros", LongType())]
    + [StructField(name, StringType()) for name in IDENTITY + CARRIED]
    + [StructField("record_first", BooleanType()),
       StructField("metric", StringType()), StructField("type", StringType()),
       StructField("temporality", StringType()), StructField("monotonic", BooleanType()),
       StructField("time_ns", LongType()), StructField("start_ns", LongType()),
       StructField("attributes", StringType()), StructField("value", DoubleType()),
       StructField("count", LongType()), StructField("sum", DoubleType()),
       StructField("bucket_counts", ArrayType(LongType())), StructField("bounds", ArrayType(DoubleType())),
       StructField("error", StringType()), StructField("error_message", StringType())]
)
_ARROW_TYPES = {
    "string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "boolean": pa.bool_(), "double": pa.float64(),
    "array<bigint>": pa.list_(pa.int64()), "array<double>": pa.list_(pa.float64()),
}
_TEMPORALITY = {metrics_pb2.AGGREGATION_TEMPORALITY_DELTA: "delta",
                metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative"}
_POINT_COLUMNS = ("metric", "type", "temporality", "monotonic", "time_ns", "start_ns", "attributes", "value",
                  "count", "sum", "bucket_counts", "bounds", "error", "error_message")


def _column_name(header: str) -> str:
    return header.replace("-", "_")


def _header(name: str) -> Column:
    # Kafka allows repeated headers: the last non-null value wins, as in the codec.
    values = F.filter("headers", lambda h: (h["key"] == F.lit(name)) & h["value"].isNotNull())
    return F.try_element_at(F.transform(values, lambda h: h["value"].cast("string")), F.lit(-1))


def with_contract_headers(records: DataFrame) -> DataFrame:
    """The Kafka source's rows reduced to what decoding needs, the contract headers as string columns."""
    has_headers = "headers" in records.columns
    headers = [(_header(name) if has_headers else F.lit(None).cast("string")).alias(_column_name(name))
               for name in _CODEC_HEADERS + ATTRIBUTE_HEADERS]
    return records.select(
        F.col("key").cast("string").alias("key"), "value", "topic", "partition", "offset",
        F.unix_micros("timestamp").alias("record_micros"), *headers)


def decode_points(records: DataFrame) -> DataFrame:
    """One row per data point (or per undecodable record) of Kafka-source-shaped `records`; see POINTS_SCHEMA."""
    return with_contract_headers(records).mapInArrow(flatten_batches, POINTS_SCHEMA)


def flatten_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: each batch of records into a batch of points."""
    for batch in batches:
        yield flatten(batch)


def flatten(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode every record of `batch` with the shared codec and flatten its data points column by column."""
    values = batch.column("value").to_pylist()
    keys = batch.column("key").to_pylist()
    header_columns = {name: batch.column(_column_name(name)).to_pylist() for name in _CODEC_HEADERS + IDENTITY}
    out: dict[str, list[Any]] = {name: [] for name in _POINT_COLUMNS}
    record_index: list[int] = []
    first: list[bool] = []
    identity: dict[str, list[Any]] = {name: [] for name in IDENTITY}
    for i, value in enumerate(values):
        headers = [(name, column[i]) for name, column in header_columns.items() if column[i] is not None]
        start = len(record_index)
        try:
            decoded = contract.decode(value, headers)
        except contract.DecodeError as err:
            _append_error(out, err.reason, str(err))
            record_index.append(i)
            resource: dict[str, Any] = {}
        else:
            missing = any(header_columns[name][i] is None for name in IDENTITY)
            resource = points.resource_attributes(decoded.metrics) if missing else {}
            _append_points(out, record_index, i, decoded.metrics)
            if len(record_index) == start:  # a valid record without points still counts as input
                _append_error(out, None, None)
                record_index.append(i)
        for name in IDENTITY:
            found = header_columns[name][i] or resource.get(name)
            if found is None and name == "client_instance_id":
                found = keys[i]
            identity[name].append(None if found is None else str(found))
        first += [True] + [False] * (len(record_index) - start - 1)
    indices = pa.array(record_index, pa.int64())
    arrays = []
    for field in POINTS_SCHEMA:
        if field.name in ("topic", "partition", "offset", "record_micros") or field.name in CARRIED:
            arrays.append(batch.column(_column_name(field.name)).take(indices))
        elif field.name in IDENTITY:
            arrays.append(pa.array(identity[field.name], pa.string()).take(indices))
        elif field.name == "record_first":
            arrays.append(pa.array(first, pa.bool_()))
        else:
            arrays.append(pa.array(out[field.name], _ARROW_TYPES[field.dataType.simpleString()]))
    return pa.RecordBatch.from_arrays(arrays, names=POINTS_SCHEMA.names)


def _append_error(out: dict[str, list[Any]], reason: str | None, message: str | None) -> None:
    for name in _POINT_COLUMNS:
        out[name].append(None)
    out["error"][-1] = reason
    out["error_message"][-1] = message


def _attributes_text(pairs: Any) -> str:
    # Canonical (sorted) JSON, so equal attribute sets group together whatever order a client sent them in.
    if not pairs:
        return "{}"
    return json.dumps(points.attributes(pairs), sort_keys=True, separators=(",", ":"), default=str)


def _append_points(out: dict[str, list[Any]], record_index: list[int], i: int,
                   data: metrics_pb2.MetricsData) -> None:
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                body = getattr(metric, kind)
                temporality = _TEMPORALITY.get(getattr(body, "aggregation_temporality", 0))
                monotonic = body.is_monotonic if kind == "sum" else None
                for point in body.data_points:
                    record_index.append(i)
                    out["metric"].append(metric.name)
                    out["type"].append(kind)
                    out["temporality"].append(temporality)
                    out["monotonic"].append(monotonic)
                    out["time_ns"].append(point.time_unix_nano)
                    out["start_ns"].append(point.start_time_unix_nano)
                    out["attributes"].append(_attributes_text(point.attributes))
                    if kind in ("gauge", "sum"):
                        number = point.WhichOneof("value")
                        out["value"].append(float(getattr(point, number)) if number else None)
                        out["count"].append(None)
                        out["sum"].append(None)
                        out["bucket_counts"].append(None)
                        out["bounds"].append(None)
                    else:
                        out["value"].append(None)
                        out["count"].append(point.count)
                        out["sum"].append(point.sum if kind == "summary" or point.HasField("sum") else None)
                        histogram = kind == "histogram"
                        out["bucket_counts"].append(list(point.bucket_counts) if histogram else None)
                        out["bounds"].append(list(point.explicit_bounds) if histogram else None)
                    out["error"].append(None)
                    out["error_message"].append(None)
