"""OTLP metrics turn into the plain points tail, the bridge and the rollups share, every point kind and value kind."""

from __future__ import annotations

import math

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_common import points

T0, T1 = 1_700_000_000_000_000_000, 1_700_000_060_000_000_000


def _data_with(metric: metrics_pb2.Metric) -> MetricsData:
    data = MetricsData()
    data.resource_metrics.add().scope_metrics.add().metrics.append(metric)
    return data


def test_histogram_keeps_buckets_and_bounds_in_order():
    metric = metrics_pb2.Metric(name="request.latency")
    metric.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    metric.histogram.data_points.add(start_time_unix_nano=T0, time_unix_nano=T1, count=6, sum=31.5,
                                     bucket_counts=[1, 2, 0, 3], explicit_bounds=[1.0, 5.0, 10.0])

    [result] = points.metric_dicts(_data_with(metric))

    assert result == {"name": "request.latency", "type": "histogram", "temporality": "delta", "monotonic": None,
                      "points": [{"time_unix_nano": T1, "start_time_unix_nano": T0, "attributes": {}, "count": 6,
                                  "sum": 31.5, "bucket_counts": [1, 2, 0, 3], "explicit_bounds": [1.0, 5.0, 10.0]}]}


def test_histogram_without_a_sum_says_so():
    metric = metrics_pb2.Metric(name="h")
    metric.histogram.data_points.add(count=2, bucket_counts=[2])

    [result] = points.metric_dicts(_data_with(metric))

    assert result["points"][0]["sum"] is None
    assert result["temporality"] is None


def test_exponential_histogram_keeps_scale_zero_count_and_both_bucket_ranges():
    metric = metrics_pb2.Metric(name="exp")
    metric.exponential_histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    point = metric.exponential_histogram.data_points.add(time_unix_nano=T1, count=9, sum=12.0, scale=3,
                                                         zero_count=2)
    point.positive.offset = -2
    point.positive.bucket_counts.extend([1, 4])
    point.negative.offset = 5
    point.negative.bucket_counts.extend([2])

    [result] = points.metric_dicts(_data_with(metric))

    assert result["type"] == "exponential_histogram"
    assert result["temporality"] == "cumulative"
    assert result["points"] == [{"time_unix_nano": T1, "start_time_unix_nano": 0, "attributes": {}, "count": 9,
                                 "sum": 12.0, "scale": 3, "zero_count": 2,
                                 "positive": {"offset": -2, "bucket_counts": [1, 4]},
                                 "negative": {"offset": 5, "bucket_counts": [2]}}]


def test_summary_keeps_quantiles_in_order():
    metric = metrics_pb2.Metric(name="s")
    point = metric.summary.data_points.add(time_unix_nano=T1, count=4, sum=10.0)
    point.quantile_values.add(quantile=0.5, value=2.0)
    point.quantile_values.add(quantile=0.99, value=7.5)

    [result] = points.metric_dicts(_data_with(metric))

    assert (result["type"], result["temporality"], result["monotonic"]) == ("summary", None, None)
    assert result["points"][0]["quantile_values"] == [{"quantile": 0.5, "value": 2.0},
                                                      {"quantile": 0.99, "value": 7.5}]
    assert (result["points"][0]["count"], result["points"][0]["sum"]) == (4, 10.0)


def test_nan_gauges_from_java_clients_stay_nan_and_integer_sums_stay_integers():
    gauge = metrics_pb2.Metric(name="org.apache.kafka.producer.record.queue.time.avg")
    gauge.gauge.data_points.add(as_double=math.nan)
    total = metrics_pb2.Metric(name="org.apache.kafka.producer.record.send.total")
    total.sum.is_monotonic = True
    total.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    total.sum.data_points.add(as_int=7)
    data = _data_with(gauge)
    data.resource_metrics[0].scope_metrics[0].metrics.append(total)

    nan_metric, sum_metric = points.metric_dicts(data)

    assert math.isnan(nan_metric["points"][0]["value"])
    assert sum_metric["points"][0]["value"] == 7 and isinstance(sum_metric["points"][0]["value"], int)
    assert (sum_metric["temporality"], sum_metric["monotonic"]) == ("delta", True)


def test_a_point_without_a_value_reads_as_none():
    metric = metrics_pb2.Metric(name="g")
    metric.gauge.data_points.add(time_unix_nano=T1)

    assert points.metric_dicts(_data_with(metric))[0]["points"][0]["value"] is None


def test_every_attribute_value_kind_becomes_json_ready_data():
    nested = KeyValueList(values=[KeyValue(key="inner", value=AnyValue(int_value=3))])
    pairs = [
        KeyValue(key="s", value=AnyValue(string_value="x")),
        KeyValue(key="b", value=AnyValue(bool_value=True)),
        KeyValue(key="i", value=AnyValue(int_value=-4)),
        KeyValue(key="d", value=AnyValue(double_value=2.5)),
        KeyValue(key="bytes", value=AnyValue(bytes_value=b"\x00\xff")),
        KeyValue(key="array", value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a"),
                                                                            AnyValue(int_value=1)]))),
        KeyValue(key="kvlist", value=AnyValue(kvlist_value=nested)),
        KeyValue(key="empty", value=AnyValue()),
    ]

    assert points.attributes(pairs) == {"s": "x", "b": True, "i": -4, "d": 2.5, "bytes": "AP8=",
                                        "array": ["a", 1], "kvlist": {"inner": 3}, "empty": None}


def test_metrics_come_out_in_payload_order_across_resources_and_scopes():
    data = MetricsData()
    for resource_index in range(2):
        resource_metrics = data.resource_metrics.add()
        for scope_index in range(2):
            scope = resource_metrics.scope_metrics.add()
            scope.metrics.add(name=f"m{resource_index}{scope_index}").gauge.data_points.add(as_int=1)

    assert [m["name"] for m in points.metric_dicts(data)] == ["m00", "m01", "m10", "m11"]


def test_a_payload_is_measured_against_a_limit_by_everything_a_walk_would_build():
    data = MetricsData()
    resource_metrics = data.resource_metrics.add()                                     # 1 resource
    resource_metrics.resource.attributes.add(key="a").value.string_value = "x"         # 1 attribute
    scope = resource_metrics.scope_metrics.add()                                       # 1 scope
    gauge = scope.metrics.add(name="g").gauge                                          # 1 metric
    point = gauge.data_points.add(as_int=1)                                            # 1 point
    point.attributes.add(key="k").value.array_value.values.add(int_value=1)            # 1 attribute, 1 nested value
    histogram = scope.metrics.add(name="h").histogram                                  # 1 metric
    histogram.data_points.add(bucket_counts=[1, 2, 3], explicit_bounds=[1.0, 2.0])     # 1 point, 5 buckets and bounds

    assert not points.holds_more_than(data, 14)
    assert points.holds_more_than(data, 13)


def test_millions_of_empty_points_in_a_few_bytes_are_too_many():
    data = MetricsData()
    data.resource_metrics.add().scope_metrics.add().metrics.add(name="bomb")
    metric = data.resource_metrics[0].scope_metrics[0].metrics[0]
    metric.MergeFromString(b"\x2a" + _varint(2 * 2_000_000) + b"\x0a\x00" * 2_000_000)  # a gauge of 2 M empty points
    assert len(metric.gauge.data_points) == 2_000_000

    assert points.holds_more_than(data, 100_000)
    assert not points.holds_more_than(data, 2_000_003)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def test_scope_attributes_nested_maps_and_negative_buckets_count_against_the_limit_too():
    data = MetricsData()
    scope = data.resource_metrics.add().scope_metrics.add()                             # 1 resource, 1 scope
    scope.scope.attributes.add(key="s").value.string_value = "x"                       # 1 scope attribute
    gauge = scope.metrics.add(name="g").gauge                                          # 1 metric
    point = gauge.data_points.add(as_int=1)                                            # 1 point
    point.attributes.add(key="m").value.kvlist_value.values.add(key="n").value.int_value = 1   # 1 attribute, 1 nested
    exponential = scope.metrics.add(name="e").exponential_histogram                    # 1 metric
    exponential.data_points.add().negative.bucket_counts.extend([1, 2, 3])             # 1 point, 3 negative buckets

    assert not points.holds_more_than(data, 12)
    assert points.holds_more_than(data, 11)


def test_a_sum_that_is_not_monotonic_says_so():
    total = metrics_pb2.Metric(name="org.apache.kafka.consumer.assigned.partitions")
    total.sum.is_monotonic = False
    total.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    total.sum.data_points.add(as_int=3)
    (metric,) = points.metric_dicts(_data_with(total))
    assert (metric["monotonic"], metric["temporality"]) == (False, "cumulative")
