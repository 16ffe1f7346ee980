"""OTLP metrics as plain Python data: one dict per metric with its points (for `kcm tail` and the rollups)."""

from __future__ import annotations

import base64
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, MetricsData
from opentelemetry.proto.metrics.v1 import metrics_pb2

_TEMPORALITY = {
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


def attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {pair.key: any_value(pair.value) for pair in pairs}


def resource_attributes(data: MetricsData) -> dict[str, Any]:
    """The resource attributes of every ResourceMetrics in the payload, merged (later ones win)."""
    merged: dict[str, Any] = {}
    for resource_metrics in data.resource_metrics:
        merged.update(attributes(resource_metrics.resource.attributes))
    return merged


def _point_base(point: Any) -> dict[str, Any]:
    return {
        "time_unix_nano": point.time_unix_nano,
        "start_time_unix_nano": point.start_time_unix_nano,
        "attributes": attributes(point.attributes),
    }


def _number_point(point: metrics_pb2.NumberDataPoint) -> dict[str, Any]:
    kind = point.WhichOneof("value")
    return {**_point_base(point), "value": getattr(point, kind) if kind else None}


def _histogram_point(point: metrics_pb2.HistogramDataPoint) -> dict[str, Any]:
    return {
        **_point_base(point),
        "count": point.count,
        "sum": point.sum if point.HasField("sum") else None,
        "bucket_counts": list(point.bucket_counts),
        "explicit_bounds": list(point.explicit_bounds),
    }


def _exponential_point(point: metrics_pb2.ExponentialHistogramDataPoint) -> dict[str, Any]:
    return {
        **_point_base(point),
        "count": point.count,
        "sum": point.sum if point.HasField("sum") else None,
        "scale": point.scale,
        "zero_count": point.zero_count,
        "positive": {"offset": point.positive.offset, "bucket_counts": list(point.positive.bucket_counts)},
        "negative": {"offset": point.negative.offset, "bucket_counts": list(point.negative.bucket_counts)},
    }


def _summary_point(point: metrics_pb2.SummaryDataPoint) -> dict[str, Any]:
    return {
        **_point_base(point),
        "count": point.count,
        "sum": point.sum,
        "quantile_values": [{"quantile": q.quantile, "value": q.value} for q in point.quantile_values],
    }


def metric_dict(metric: Metric) -> dict[str, Any]:
    """One metric as `{name, type, temporality, monotonic, points}`."""
    kind = metric.WhichOneof("data")
    temporality: str | None = None
    monotonic: bool | None = None
    points: list[dict[str, Any]] = []
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


def metric_dicts(data: MetricsData) -> list[dict[str, Any]]:
    """Every metric of the payload, across resources and scopes, in payload order."""
    return [
        metric_dict(metric)
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    ]
