"""OTLP metrics as plain, JSON-ready Python data: one typed dict per metric with its points.

This is the shape `kcm tail`, the bridge and the rollups share; its keys are what `kcm tail --output jsonl` prints.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any, Literal, TypedDict

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, MetricsData
from opentelemetry.proto.metrics.v1 import metrics_pb2

MetricType = Literal["gauge", "sum", "histogram", "exponential_histogram", "summary"]
Temporality = Literal["delta", "cumulative"]


class PointBase(TypedDict):
    time_unix_nano: int
    start_time_unix_nano: int
    attributes: dict[str, Any]


class NumberPoint(PointBase):
    """A gauge or sum point; `value` is None when the point carries no value."""

    value: int | float | None


class HistogramPoint(PointBase):
    count: int
    sum: float | None
    bucket_counts: list[int]
    explicit_bounds: list[float]


class Buckets(TypedDict):
    offset: int
    bucket_counts: list[int]


class ExponentialHistogramPoint(PointBase):
    count: int
    sum: float | None
    scale: int
    zero_count: int
    positive: Buckets
    negative: Buckets


class Quantile(TypedDict):
    quantile: float
    value: float


class SummaryPoint(PointBase):
    count: int
    sum: float
    quantile_values: list[Quantile]


Point = NumberPoint | HistogramPoint | ExponentialHistogramPoint | SummaryPoint


class MetricDict(TypedDict):
    """One metric: `temporality` is set for sums and histograms, `monotonic` for sums only."""

    name: str
    type: MetricType | None
    temporality: Temporality | None
    monotonic: bool | None
    points: list[Point]


_TEMPORALITY: dict[int, Temporality] = {
    metrics_pb2.AGGREGATION_TEMPORALITY_DELTA: "delta",
    metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
}


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as JSON-friendly Python data (bytes become base64 text)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


def attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key/value pairs as a dict (a repeated key keeps its last value)."""
    return {pair.key: any_value(pair.value) for pair in pairs}


def _point_base(point: Any) -> PointBase:
    return {
        "time_unix_nano": point.time_unix_nano,
        "start_time_unix_nano": point.start_time_unix_nano,
        "attributes": attributes(point.attributes),
    }


def _number_point(point: metrics_pb2.NumberDataPoint) -> NumberPoint:
    kind = point.WhichOneof("value")
    return {**_point_base(point), "value": getattr(point, kind) if kind else None}


def _histogram_point(point: metrics_pb2.HistogramDataPoint) -> HistogramPoint:
    return {
        **_point_base(point),
        "count": point.count,
        "sum": point.sum if point.HasField("sum") else None,
        "bucket_counts": list(point.bucket_counts),
        "explicit_bounds": list(point.explicit_bounds),
    }


def _exponential_point(point: metrics_pb2.ExponentialHistogramDataPoint) -> ExponentialHistogramPoint:
    return {
        **_point_base(point),
        "count": point.count,
        "sum": point.sum if point.HasField("sum") else None,
        "scale": point.scale,
        "zero_count": point.zero_count,
        "positive": {"offset": point.positive.offset, "bucket_counts": list(point.positive.bucket_counts)},
        "negative": {"offset": point.negative.offset, "bucket_counts": list(point.negative.bucket_counts)},
    }


def _summary_point(point: metrics_pb2.SummaryDataPoint) -> SummaryPoint:
    return {
        **_point_base(point),
        "count": point.count,
        "sum": point.sum,
        "quantile_values": [{"quantile": q.quantile, "value": q.value} for q in point.quantile_values],
    }


def metric_dict(metric: Metric) -> MetricDict:
    """One metric as `{name, type, temporality, monotonic, points}`."""
    kind = metric.WhichOneof("data")
    temporality: Temporality | None = None
    monotonic: bool | None = None
    points: list[Point] = []
    if kind == "gauge":
        points = [_number_point(p) for p in metric.gauge.data_points]
    elif kind == "sum":
        temporality = _TEMPORALITY.get(metric.sum.aggregation_temporality)
        monotonic = metric.sum.is_monotonic
        points = [_number_point(p) for p in metric.sum.data_points]
    elif kind == "histogram":
        temporality = _TEMPORALITY.get(metric.histogram.aggregation_temporality)
        points = [_histogram_point(p) for p in metric.histogram.data_points]
    elif kind == "exponential_histogram":
        temporality = _TEMPORALITY.get(metric.exponential_histogram.aggregation_temporality)
        points = [_exponential_point(p) for p in metric.exponential_histogram.data_points]
    elif kind == "summary":
        points = [_summary_point(p) for p in metric.summary.data_points]
    return {"name": metric.name, "type": kind, "temporality": temporality, "monotonic": monotonic, "points": points}


def holds_more_than(data: MetricsData, limit: int) -> bool:
    """Whether the payload holds more than `limit` resources, scopes, metrics, data points, attributes (nested values
    included), buckets and quantiles: what walking it builds, counted before anything is built and never past
    `limit`. A 1.5 KB zstd record can hold 8 million empty points; as dicts they take gigabytes."""
    budget = [limit]

    def spend(count: int) -> bool:
        budget[0] -= count
        return budget[0] < 0

    def values(pairs: Any) -> bool:  # KeyValues or AnyValues, with what they nest
        if spend(len(pairs)):
            return True
        for item in pairs:
            value = item.value if isinstance(item, KeyValue) else item
            kind = value.WhichOneof("value")
            if kind == "array_value" and values(value.array_value.values):
                return True
            if kind == "kvlist_value" and values(value.kvlist_value.values):
                return True
        return False

    if spend(len(data.resource_metrics)):
        return True
    for resource_metrics in data.resource_metrics:
        if values(resource_metrics.resource.attributes) or spend(len(resource_metrics.scope_metrics)):
            return True
        for scope_metrics in resource_metrics.scope_metrics:
            if values(scope_metrics.scope.attributes) or spend(len(scope_metrics.metrics)):
                return True
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                data_points = getattr(metric, kind).data_points if kind else ()
                if spend(len(data_points)):
                    return True
                for point in data_points:
                    if values(point.attributes):
                        return True
                    if kind == "histogram":
                        buckets = len(point.bucket_counts) + len(point.explicit_bounds)
                    elif kind == "exponential_histogram":
                        buckets = len(point.positive.bucket_counts) + len(point.negative.bucket_counts)
                    elif kind == "summary":
                        buckets = len(point.quantile_values)
                    else:
                        buckets = 0
                    if spend(buckets):
                        return True
    return False


def metric_dicts(data: MetricsData) -> list[MetricDict]:
    """Every metric of the payload, across resources and scopes, in payload order."""
    return [
        metric_dict(metric)
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    ]
