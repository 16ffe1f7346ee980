"""What the demo knows of each client instance, built from the OTLP exports that reach its collector.

Pure: feed it `ExportMetricsServiceRequest`s with the time they arrived; read rows for the live view or the
jsonl summary. Delta sums are accumulated, cumulative sums and gauges keep their latest value; a metric with
one point per node (librdkafka's `node.id`) shows the largest, i.e. the slowest node.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from kcm_common import points
from kcm_common.names import BROKER_ATTRIBUTES

# Columns of the live view: heading -> metric names to try in order (librdkafka first, then Java's).
# Headings are short so that ten columns fit a terminal: produce request latency, record queue time, fetch latency.
HEADLINE_METRICS: dict[str, tuple[str, ...]] = {
    "produce ms": ("org.apache.kafka.producer.request.latency.avg",
                   "org.apache.kafka.producer.node.request.latency.avg"),
    "queue ms": ("org.apache.kafka.producer.record.queue.time.avg",),
    "fetch ms": ("org.apache.kafka.consumer.fetch.manager.fetch.latency.avg",),
    "rebalances": ("org.apache.kafka.consumer.coordinator.rebalance.total",),
}


_SAME_PUSH_MIN_NS = 50_000_000
_SAME_PUSH_MAX_NS = 1_000_000_000


def same_push_window_ns(push_interval_ms: object) -> int:
    """How far apart two point times of one push may be: half the push interval (a cold JVM spreads its first
    collection over ~100 ms), within 50 ms and 1 s; 50 ms when the interval is unknown."""
    try:
        half_ns = int(str(push_interval_ms)) * 500_000
    except ValueError:
        return _SAME_PUSH_MIN_NS
    return min(max(half_ns, _SAME_PUSH_MIN_NS), _SAME_PUSH_MAX_NS)


@dataclass
class ClientInstance:
    """One client instance as seen through its pushes."""

    instance_id: str
    client_id: str = "-"
    software_name: str = "-"
    software_version: str = "-"
    source: str = "-"                           # address:port
    source_address: str = "-"
    pushes: int = 0
    last_push_s: float = 0.0
    values: dict[str, float] = field(default_factory=dict)
    broker: dict[str, str] = field(default_factory=dict)
    # Collection times of the latest pushes. Java clients spread one push over a ResourceMetrics per metric, with
    # point times a few ms apart (up to ~100 ms on a cold JVM); pushes are an interval apart (at least 100 ms, Kafka's
    # smallest interval.ms). So a push is a point time far from every recent one, not a new ResourceMetrics.
    recent_push_times: deque[int] = field(default_factory=lambda: deque(maxlen=16))

    def count_push(self, time_unix_nano: int, window_ns: int = _SAME_PUSH_MIN_NS) -> None:
        """Count a push the first time a point collected at least `window_ns` from the recent pushes is seen."""
        if all(abs(time_unix_nano - seen) >= window_ns for seen in self.recent_push_times):
            self.recent_push_times.append(time_unix_nano)
            self.pushes += 1

    def headline(self, heading: str) -> float | None:
        """The value shown under a live-view heading, or None when this client sends none of its metrics."""
        for name in HEADLINE_METRICS[heading]:
            if name in self.values:
                return self.values[name]
        return None

    def summary(self) -> dict[str, Any]:
        """The jsonl summary object: identity, push count, and every metric's last value (NaN and infinities as
        null, so every line is standard JSON)."""
        return {
            "client_instance_id": self.instance_id,
            "client_id": self.client_id,
            "client_software_name": self.software_name,
            "client_software_version": self.software_version,
            "client_source": self.source,
            "pushes": self.pushes,
            "broker": dict(sorted(self.broker.items())),
            "metrics": {name: value if math.isfinite(value) else None for name, value in sorted(self.values.items())},
        }


class Fleet:
    """Every client instance the collector has heard of, keyed by client instance id."""

    def __init__(self) -> None:
        self._clients: dict[str, ClientInstance] = {}
        # Exports arrive on gRPC threads while the view reads: one lock, and readers get copies.
        self._lock = threading.Lock()
        self.exports = 0

    def ingest(self, request: ExportMetricsServiceRequest, received_s: float) -> None:
        with self._lock:
            self.exports += 1
            for resource_metrics in request.resource_metrics:
                self._ingest_resource(resource_metrics, received_s)

    def _ingest_resource(self, resource_metrics: ResourceMetrics, received_s: float) -> None:
        resource = points.attributes(resource_metrics.resource.attributes)
        instance_id = str(resource.get("client_instance_id") or "")
        if not instance_id:
            return  # not a KIP-714 push (kcm's bridge always sets this attribute)
        client = self._clients.setdefault(instance_id, ClientInstance(instance_id))
        client.client_id = str(resource.get("client_id") or client.client_id)
        client.software_name = str(resource.get("client_software_name") or client.software_name)
        client.software_version = str(resource.get("client_software_version") or client.software_version)
        address = resource.get("client_source_address")
        if address:
            client.source_address = str(address)
            port = resource.get("client_source_port")
            client.source = f"{address}:{port}" if port else str(address)
        # Only the broker side (the receiver) knows these: proof the push came through the receiver and the topic.
        client.broker = {key: str(resource[key]) for key in BROKER_ATTRIBUTES if key in resource}
        client.last_push_s = received_s
        # A client's last push (terminating: on close) may come soon after a regular one, whatever its interval.
        window_ns = (_SAME_PUSH_MIN_NS if str(resource.get("terminating")).lower() == "true"
                     else same_push_window_ns(resource.get("push_interval_ms")))
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                metric_dict = points.metric_dict(metric)
                for time_unix_nano in {point["time_unix_nano"] for point in metric_dict["points"]}:
                    client.count_push(time_unix_nano, window_ns)
                _apply(client.values, metric_dict)

    def clients(self) -> list[ClientInstance]:
        """Copies of every client instance, ordered by client id, then instance id."""
        with self._lock:
            copies = [dataclasses.replace(c, values=dict(c.values), recent_push_times=deque(c.recent_push_times, maxlen=16))
                      for c in self._clients.values()]
        return sorted(copies, key=lambda c: (c.client_id, c.instance_id))


def _apply(values: dict[str, float], metric: points.MetricDict) -> None:
    numbers = [p["value"] for p in metric["points"] if isinstance(p.get("value"), (int, float))]
    if not numbers:
        return
    name = metric["name"]
    if metric["type"] == "sum" and metric["temporality"] == "delta":
        values[name] = values.get(name, 0.0) + float(sum(numbers))
    else:
        finite = [float(n) for n in numbers if math.isfinite(n)]
        values[name] = max(finite) if finite else math.nan
