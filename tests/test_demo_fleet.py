"""The demo's fleet model: what each client instance pushed, as the live view and the jsonl summary show it."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from rich.console import Console

from kcm_demo.fleet import Fleet
from kcm_demo.view import fleet_table


def _request(instance: str, client_id: str, *metrics: metrics_pb2.Metric, software: str = "librdkafka",
             address: str | None = "127.0.0.1", port: str | None = "50000", time_unix_nano: int = 1,
             resource_per_metric: bool = False, interval_ms: str | None = None,
             terminating: str | None = None) -> ExportMetricsServiceRequest:
    """One push as the bridge exports it; Java clients put each metric in a ResourceMetrics of its own."""
    request = ExportMetricsServiceRequest()
    identity = {"client_instance_id": instance, "client_id": client_id, "client_software_name": software,
                "client_software_version": "2.6.1", "client_source_address": address, "client_source_port": port,
                "push_interval_ms": interval_ms, "terminating": terminating}
    for group in ([[metric] for metric in metrics] if resource_per_metric else [list(metrics)]):
        resource_metrics = request.resource_metrics.add()
        for key, value in identity.items():
            if value is not None:
                resource_metrics.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
        for metric in group:
            for point in getattr(metric, metric.WhichOneof("data")).data_points:
                point.time_unix_nano = time_unix_nano
        resource_metrics.scope_metrics.add().metrics.extend(group)
    return request


def _gauge(name: str, *values: float) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=name)
    for node, value in enumerate(values):
        point = metric.gauge.data_points.add(as_double=value)
        point.attributes.append(KeyValue(key="node.id", value=AnyValue(int_value=node)))
    return metric


def _delta(name: str, value: int) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=name)
    metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    metric.sum.is_monotonic = True
    metric.sum.data_points.add(as_int=value)
    return metric


def test_gauges_keep_the_latest_value_of_the_slowest_node_and_deltas_add_up():
    fleet = Fleet()
    latency = "org.apache.kafka.producer.request.latency.avg"
    total = "org.apache.kafka.producer.record.send.total"
    fleet.ingest(_request("i-1", "payments", _gauge(latency, 3.0, 9.5), _delta(total, 10)), received_s=100.0)
    fleet.ingest(_request("i-1", "payments", _gauge(latency, 2.0, 4.0), _delta(total, 5), time_unix_nano=10**9),
                 received_s=101.0)

    [client] = fleet.clients()

    assert client.values == {latency: 4.0, total: 15.0}
    assert client.headline("produce ms") == 4.0
    assert client.headline("fetch ms") is None
    assert (client.pushes, client.last_push_s, client.source) == (2, 101.0, "127.0.0.1:50000")


def test_nan_averages_are_kept_as_nan_and_summarised_as_null():
    fleet = Fleet()
    fleet.ingest(_request("j-1", "orders", _gauge("org.apache.kafka.consumer.fetch.manager.fetch.latency.avg",
                                                  math.nan), software="apache-kafka-java"), received_s=1.0)

    [client] = fleet.clients()

    assert math.isnan(client.headline("fetch ms"))
    assert client.summary()["metrics"] == {"org.apache.kafka.consumer.fetch.manager.fetch.latency.avg": None}
    assert client.summary()["client_software_name"] == "apache-kafka-java"


def test_exports_without_a_client_instance_are_ignored_and_clients_sort_by_client_id():
    fleet = Fleet()
    fleet.ingest(_request("i-2", "zeta", _delta("x", 1)), received_s=1.0)
    fleet.ingest(_request("i-1", "alpha", _delta("x", 1), address=None), received_s=1.0)
    anonymous = _request("", "ghost", _delta("x", 1))
    fleet.ingest(anonymous, received_s=1.0)

    assert [c.client_id for c in fleet.clients()] == ["alpha", "zeta"]
    assert fleet.clients()[0].source == "-"


def test_the_table_shows_each_client_with_its_headline_values():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer",
                          _gauge("org.apache.kafka.producer.record.queue.time.avg", 0.25)), received_s=10.0)
    console = Console(width=200, record=True, color_system=None)

    console.print(fleet_table(fleet, now_s=12.5, title="kcm demo"))
    text = console.export_text()

    row = next(line for line in text.splitlines() if "payments-producer" in line)
    assert "librdkafka 2.6.1" in row and "0.25" in row and "2.5" in row


def test_a_push_spread_over_many_resource_metrics_counts_once():
    fleet = Fleet()
    for push in range(1, 4):
        pushed_ns = push * 5_000_000_000
        for metric in range(5):  # each metric collected a few ms after the previous, as Java clients do
            fleet.ingest(_request("i-java", "inventory", _gauge(f"org.apache.kafka.producer.m{metric}", 1.0),
                                  time_unix_nano=pushed_ns + metric * 4_000_000, resource_per_metric=True),
                         received_s=float(push))

    [client] = fleet.clients()

    assert client.pushes == 3 and len(client.values) == 5



def test_a_cold_jvms_first_push_spread_over_90_ms_counts_once_at_a_5_s_interval():
    fleet = Fleet()
    for push in range(2):
        pushed_ns = 10**9 + push * 5_000_000_000
        for metric in range(10):   # 10 ms apart: 90 ms from the first to the last
            fleet.ingest(_request("i-java", "inventory", _gauge(f"org.apache.kafka.consumer.m{metric}", 1.0),
                                  time_unix_nano=pushed_ns + metric * 10_000_000, resource_per_metric=True,
                                  interval_ms="5000"), received_s=float(push))

    [client] = fleet.clients()

    assert client.pushes == 2


def test_a_terminating_push_soon_after_a_regular_one_counts_as_a_push_of_its_own():
    """A client closing 0.26 s after its last push at a 5 s interval: two pushes, not one (its window is 1 s)."""
    fleet = Fleet()
    for pushed_ns, terminating in ((10**9, "false"), (10**9 + 260_000_000, "true")):
        for metric in range(3):   # a Java client's push: a ResourceMetrics per metric, a few ms apart
            fleet.ingest(_request("i-java", "inventory", _gauge(f"org.apache.kafka.consumer.m{metric}", 1.0),
                                  time_unix_nano=pushed_ns + metric * 4_000_000, resource_per_metric=True,
                                  interval_ms="5000", terminating=terminating), received_s=1.0)

    [client] = fleet.clients()

    assert client.pushes == 2


DEMO_CLIENTS = (("inventory-java-consumer", "apache-kafka-java"), ("inventory-java-producer", "apache-kafka-java"),
                ("orders-consumer", "confluent-kafka-python"), ("orders-producer", "confluent-kafka-python"),
                ("payments-consumer", "confluent-kafka-python"), ("payments-producer", "confluent-kafka-python"))


def _demo_fleet(rebalances: bool = True) -> Fleet:
    """The demo's six clients, each from its own port on 127.0.0.1; with a rebalance count for the Java consumer."""
    fleet = Fleet()
    for port, (client_id, software) in enumerate(DEMO_CLIENTS, start=50000):
        if client_id.endswith("-producer"):
            metrics = [_gauge("org.apache.kafka.producer.request.latency.avg", 1.79),
                       _gauge("org.apache.kafka.producer.record.queue.time.avg", 25.31)]
        else:
            metrics = [_gauge("org.apache.kafka.consumer.fetch.manager.fetch.latency.avg", 500.4)]
        if rebalances and client_id == "inventory-java-consumer":
            metrics.append(_delta("org.apache.kafka.consumer.coordinator.rebalance.total", 1))
        fleet.ingest(_request(f"i-{port}", client_id, *metrics, software=software, port=str(port)), received_s=10.0)
    return fleet


def _render(fleet: Fleet, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(fleet_table(fleet, now_s=12.5, title="client instances", width=console.width))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_narrow_terminals_show_every_client_id_in_full_with_its_numbers(width):
    lines = _render(_demo_fleet(), width)

    assert max(len(line.rstrip()) for line in lines) <= width
    rows = {client_id: next((line for line in lines if client_id in line.replace("│", " ").split()), None)
            for client_id, _ in DEMO_CLIENTS}
    assert None not in rows.values(), "\n".join(lines)
    assert "25.31" in rows["payments-producer"] and "500" in rows["orders-consumer"], "\n".join(lines)
    header = " ".join(lines[1:3]).split()
    assert {"produce", "queue", "fetch", "rebalances", "age", "metrics", "pushes"} <= set(header), "\n".join(lines)


def test_narrow_terminals_drop_the_shared_source_address_and_keep_rebalances_only_when_pushed():
    with_count = "\n".join(_render(_demo_fleet(rebalances=True), 100))
    without_count = "\n".join(_render(_demo_fleet(rebalances=False), 100))
    wide = "\n".join(_render(_demo_fleet(rebalances=False), 200))

    assert "127.0.0.1:" not in with_count and "all from 127.0.0.1" in with_count
    assert "rebalances" in with_count and "rebalances" not in without_count
    row = next(line for line in with_count.splitlines() if "inventory-java-consumer" in line)
    assert row.split()[-4:] == ["1", "2.5", "2", "1"], row   # rebalances, age s, metrics, pushes
    # Wide enough for every column: nothing is dropped, each client's own source port is shown.
    assert "127.0.0.1:50003" in wide and "rebalances" in wide and "confluent-kafka-python 2.6.1" in wide
