"""Metrics payloads shaped like what real clients push, for tests that need one built by hand."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData


def _attrs(**values: object) -> list[KeyValue]:
    pairs = []
    for key, value in values.items():
        any_value = AnyValue()
        if isinstance(value, bool):
            any_value.bool_value = value
        elif isinstance(value, int):
            any_value.int_value = value
        elif isinstance(value, float):
            any_value.double_value = value
        else:
            any_value.string_value = str(value)
        pairs.append(KeyValue(key=key, value=any_value))
    return pairs


def client_metrics(client_id: str = "payments-producer", t_ns: int = 1_700_000_000_000_000_000) -> MetricsData:
    """Metrics shaped like librdkafka's push: an empty resource, scope = client name, a gauge and a DELTA sum."""
    data = MetricsData()
    resource_metrics = data.resource_metrics.add()
    scope_metrics = resource_metrics.scope_metrics.add()
    scope_metrics.scope.CopyFrom(InstrumentationScope(name=client_id))
    gauge = scope_metrics.metrics.add(name="org.apache.kafka.producer.node.request.latency.avg", unit="ms")
    gauge.gauge.data_points.add(time_unix_nano=t_ns, as_double=12.5).attributes.extend(_attrs(node_id="1"))
    total = scope_metrics.metrics.add(name="org.apache.kafka.producer.record.send.total")
    total.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    total.sum.is_monotonic = True
    total.sum.data_points.add(start_time_unix_nano=t_ns - 10**9, time_unix_nano=t_ns, as_int=42).attributes.extend(
        _attrs(topic="payments")
    )
    return data
