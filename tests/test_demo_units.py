"""The demo's parts on their own, fast: push counting, the live view's cells, the collector, the workload's clients,
the pipeline's start and stop order, and `kcm demo`'s options, with fakes for the broker, the clients and the bridge."""

from __future__ import annotations

import io
import json
import math
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from rich.console import Console

from kcm_common.errors import UserError
from kcm_demo.fleet import Fleet
from kcm_demo.view import fleet_table
from test_demo_fleet import _delta, _demo_fleet, _gauge, _render, _request

LATENCY = "org.apache.kafka.producer.request.latency.avg"
SECOND_NS = 1_000_000_000


def _without(request: ExportMetricsServiceRequest, *keys: str) -> ExportMetricsServiceRequest:
    """The push with these resource attributes left out."""
    for resource_metrics in request.resource_metrics:
        kept = [kv for kv in resource_metrics.resource.attributes if kv.key not in keys]
        del resource_metrics.resource.attributes[:]
        resource_metrics.resource.attributes.extend(kept)
    return request


def _with(request: ExportMetricsServiceRequest, **attributes: str) -> ExportMetricsServiceRequest:
    for resource_metrics in request.resource_metrics:
        for key, value in attributes.items():
            resource_metrics.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request


def _pushes_at(*times_ns: int, interval_ms: str | None = None) -> int:
    fleet = Fleet()
    for time_ns in times_ns:
        fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0), time_unix_nano=time_ns,
                              interval_ms=interval_ms), received_s=1.0)
    [client] = fleet.clients()
    return client.pushes


# --- push counting -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("interval_ms", "gap_ns", "pushes"), [
    ("1000", 600_000_000, 2),      # more than half a 1 s interval apart: two pushes
    ("60000", 10 * SECOND_NS, 2),  # a long interval: a final push 10 s after the last is still a push of its own
    ("0", 4_000_000, 1),           # an interval below Kafka's 100 ms minimum: points 4 ms apart are one push
    ("5000", 90_000_000, 1),       # a cold JVM's push spread over 90 ms
])
def test_points_are_one_push_within_half_the_interval_bounded_to_50_ms_and_1_s(interval_ms, gap_ns, pushes):
    assert _pushes_at(SECOND_NS, SECOND_NS + gap_ns, interval_ms=interval_ms) == pushes


def test_a_push_seen_again_after_a_later_one_is_not_counted_twice():
    assert _pushes_at(SECOND_NS, 6 * SECOND_NS, SECOND_NS, 11 * SECOND_NS, 6 * SECOND_NS) == 3


def test_pushes_are_counted_past_the_recent_ones_remembered_in_the_table_and_the_summary():
    fleet = Fleet()
    for push in range(20):
        fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0),
                              time_unix_nano=(push + 1) * 5 * SECOND_NS), received_s=10.0)
    [client] = fleet.clients()
    row = next(line for line in _render(fleet, 200) if "payments-producer" in line)

    assert client.summary()["pushes"] == 20
    assert row.replace("│", " ").split()[-1] == "20", row


def test_every_export_is_counted_for_the_views_title():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0)), received_s=1.0)
    fleet.ingest(_request("", "ghost", _gauge(LATENCY, 1.0)), received_s=1.0)

    assert fleet.exports == 2


# --- what a client instance is -----------------------------------------------------------------------------------

def test_a_push_without_identity_attributes_keeps_what_earlier_pushes_said():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0)), received_s=1.0)
    fleet.ingest(_with(_without(_request("i-1", "", _gauge(LATENCY, 2.0), time_unix_nano=5 * SECOND_NS),
                                "client_software_name", "client_software_version"), client_software_version=""),
                 received_s=6.0)

    [client] = fleet.clients()
    summary = client.summary()

    assert (summary["client_id"], summary["client_software_name"], summary["client_software_version"]) == (
        "payments-producer", "librdkafka", "2.6.1")


def test_the_summary_names_the_source_address_and_port_and_an_address_alone_without_a_port():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0), port="50001"), received_s=1.0)
    fleet.ingest(_request("i-2", "orders-producer", _gauge(LATENCY, 1.0), address="10.0.0.7", port=None),
                 received_s=1.0)

    sources = {client.client_id: client.summary()["client_source"] for client in fleet.clients()}

    assert sources == {"payments-producer": "127.0.0.1:50001", "orders-producer": "10.0.0.7"}


def test_the_summary_carries_the_broker_side_attributes_the_receiver_added():
    fleet = Fleet()
    fleet.ingest(_with(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0)), principal="User:ANONYMOUS",
                       broker_id="0", cluster_id="c-1", listener_name="PLAINTEXT", subscription_id="7"),
                 received_s=1.0)

    [client] = fleet.clients()

    assert client.summary()["broker"] == {"broker_id": "0", "cluster_id": "c-1", "listener_name": "PLAINTEXT",
                                          "principal": "User:ANONYMOUS"}


def test_clients_are_listed_by_client_id_then_instance_id():
    fleet = Fleet()
    for instance, client_id in (("i-1", "zeta"), ("i-3", "alpha"), ("i-2", "alpha")):
        fleet.ingest(_request(instance, client_id, _gauge(LATENCY, 1.0)), received_s=1.0)

    assert [(c.client_id, c.instance_id) for c in fleet.clients()] == [("alpha", "i-2"), ("alpha", "i-3"),
                                                                     ("zeta", "i-1")]


def test_the_clients_read_are_a_snapshot_later_pushes_do_not_change():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0)), received_s=1.0)
    [before] = fleet.clients()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 7.0), _gauge("other", 1.0),
                          time_unix_nano=5 * SECOND_NS), received_s=6.0)

    assert before.values == {LATENCY: 1.0}


# --- metric values -----------------------------------------------------------------------------------------------

def _cumulative(name: str, value: int) -> metrics_pb2.Metric:
    metric = _delta(name, value)
    metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    return metric


def test_cumulative_sums_keep_their_latest_value_not_a_total():
    fleet = Fleet()
    total = "org.apache.kafka.producer.record.send.total"
    fleet.ingest(_request("i-1", "payments-producer", _cumulative(total, 10)), received_s=1.0)
    fleet.ingest(_request("i-1", "payments-producer", _cumulative(total, 25), time_unix_nano=5 * SECOND_NS),
                 received_s=6.0)

    [client] = fleet.clients()

    assert client.values[total] == 25.0


def test_a_metric_with_no_number_is_left_out_not_shown_as_nan():
    histogram = metrics_pb2.Metric(name="org.apache.kafka.producer.histogram")
    histogram.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    histogram.histogram.data_points.add(count=3, sum=1.5)
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", histogram, _gauge(LATENCY, 1.0)), received_s=1.0)

    [client] = fleet.clients()

    assert client.summary()["metrics"] == {LATENCY: 1.0}


def test_infinite_values_are_summarised_as_null_so_each_line_is_standard_json():
    total = "org.apache.kafka.producer.record.error.total"
    overflowing = _delta(total, 0)
    overflowing.sum.data_points[0].as_double = math.inf
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, math.inf), overflowing), received_s=1.0)

    [client] = fleet.clients()

    assert json.loads(json.dumps(client.summary(), allow_nan=False))["metrics"] == {LATENCY: None, total: None}


def test_a_headline_prefers_librdkafkas_metric_over_javas_when_a_client_sends_both():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 3.0),
                          _gauge("org.apache.kafka.producer.node.request.latency.avg", 8.0)), received_s=1.0)

    [client] = fleet.clients()

    assert client.headline("produce ms") == 3.0


# --- the live view's cells ---------------------------------------------------------------------------------------

def _row(fleet: Fleet, client_id: str, now_s: float = 12.5) -> list[str]:
    console = Console(width=250, record=True, color_system=None)
    console.print(fleet_table(fleet, now_s=now_s, title="kcm demo"))
    line = next(line for line in console.export_text().splitlines() if f" {client_id} " in line)
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_the_view_shows_a_dash_for_a_metric_not_sent_nan_as_nan_and_large_numbers_with_separators():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 12_345.6),
                          _gauge("org.apache.kafka.producer.record.queue.time.avg", math.nan)), received_s=10.0)

    cells = _row(fleet, "payments-producer")

    # client id, software, source, produce ms, queue ms, fetch ms, rebalances, age s, metrics, pushes
    assert cells[3:7] == ["12,346", "NaN", "-", "-"], cells


@pytest.mark.parametrize(("value", "shown"), [(-12_345.6, "-12,346"), (-1.25, "-1.25"), (0.5, "0.50"), (7.0, "7")])
def test_the_view_shows_negative_numbers_as_it_shows_positive_ones(value, shown):
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, value)), received_s=10.0)

    assert _row(fleet, "payments-producer")[3] == shown


@pytest.mark.parametrize(("value", "shown"), [(-math.inf, "-inf"), (math.inf, "inf")])
def test_a_delta_sum_adding_up_to_an_infinity_is_shown_not_a_crash_of_the_view(value, shown):
    # Gauges keep their finite values only (NaN if none); a delta sum adds whatever comes, infinities included.
    rebalances = _delta("org.apache.kafka.consumer.coordinator.rebalance.total", 0)
    rebalances.sum.data_points[0].as_double = value
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-consumer", rebalances), received_s=10.0)

    assert _row(fleet, "payments-consumer")[6] == shown


def test_the_age_is_never_negative_when_a_push_arrives_after_the_views_clock():
    fleet = Fleet()
    fleet.ingest(_request("i-1", "payments-producer", _gauge(LATENCY, 1.0)), received_s=20.0)

    assert _row(fleet, "payments-producer", now_s=19.0)[7] == "0.0"


def test_a_narrow_terminal_keeps_the_source_column_when_clients_push_from_different_addresses():
    fleet = _demo_fleet()
    fleet.ingest(_request("i-remote", "remote-producer", _gauge(LATENCY, 1.0), address="10.1.2.3", port="40000"),
                 received_s=10.0)

    text = "\n".join(_render(fleet, 120))

    assert "all from" not in text and "10.1.2.3" in text, text


def test_a_very_narrow_terminal_still_shows_every_client_id_in_full():
    text = "\n".join(_render(_demo_fleet(), 60))

    assert all(client_id in text for client_id in ("inventory-java-consumer", "inventory-java-producer")), text


def test_a_narrow_terminal_shows_the_software_without_its_version_one_line_per_client():
    narrow = _render(_demo_fleet(), 100)

    assert "2.6.1" not in "\n".join(narrow)
    assert len([line for line in narrow if line.strip()]) == 4 + 6, "\n".join(narrow)   # title, 2 heading lines, rule


def test_a_terminal_exactly_as_wide_as_the_table_shows_it_whole():
    width = max(len(line.rstrip()) for line in _render(_demo_fleet(), 250))

    assert "127.0.0.1:50003" in "\n".join(_render(_demo_fleet(), width))


# --- the embedded collector --------------------------------------------------------------------------------------

def test_the_collector_hands_every_export_to_its_callback_on_loopback_and_stops_listening():
    from kcm_demo.collector import OtlpCollector

    received: list[ExportMetricsServiceRequest] = []
    request = _request("i-1", "payments-producer", _gauge(LATENCY, 1.0))
    with OtlpCollector(received.append) as collector:
        assert collector.endpoint.startswith("127.0.0.1:") and collector.port > 0
        with grpc.insecure_channel(collector.endpoint) as channel:
            metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(request, timeout=5)
        endpoint = collector.endpoint

    assert received == [request]
    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as failed:
        metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(request, timeout=1)
    assert failed.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_the_collector_listens_on_the_port_asked_for():
    import socket

    from kcm_demo.collector import OtlpCollector

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with OtlpCollector(lambda request: None, port=port) as collector:
        assert collector.endpoint == f"127.0.0.1:{port}"


# --- the workload's clients --------------------------------------------------------------------------------------

class _FakeKafka:
    """A stand-in for confluent_kafka: records each client's configuration and calls."""

    def __init__(self, buffer_errors: int = 0, close_blocks: threading.Event | None = None) -> None:
        self.producers: list[dict] = []
        self.consumers: list[dict] = []
        self.buffer_errors = buffer_errors
        self.close_blocks = close_blocks
        self.lock = threading.Lock()
        self.delivered = self.consumed = 0   # records reported delivered, messages returned without an error
        fake = self

        class Producer:
            def __init__(self, config):
                self.record = {"config": config, "produced": 0, "polls": 0, "flush": None}
                self.reports = []
                with fake.lock:
                    fake.producers.append(self.record)

            def produce(self, topic, value, key, on_delivery):
                with fake.lock:
                    if fake.buffer_errors:
                        fake.buffer_errors -= 1
                        raise BufferError("queue full")
                self.record["produced"] += 1
                self.reports.append(on_delivery)

            def poll(self, timeout):
                self.record["polls"] += 1
                reports, self.reports = self.reports, []
                for report in reports:   # every other poll's reports are failures
                    failed = self.record["polls"] % 2 == 0
                    with fake.lock:
                        fake.delivered += not failed
                    report("Message timed out" if failed else None, None)

            def flush(self, *args):
                self.record["flush"] = args

        class Consumer:
            def __init__(self, config):
                self.record = {"config": config, "topics": None, "poll_timeouts": set(), "closed": False}
                with fake.lock:
                    fake.consumers.append(self.record)

            def subscribe(self, topics):
                self.record["topics"] = topics

            def poll(self, timeout=None):
                self.record["poll_timeouts"].add(timeout)
                time.sleep(0.01)
                self.record["polls"] = self.record.get("polls", 0) + 1
                failed = self.record["polls"] % 3 == 0   # as a partition's end reported as an error
                with fake.lock:
                    fake.consumed += not failed
                return types.SimpleNamespace(error=lambda: "_PARTITION_EOF" if failed else None)

            def close(self):
                if fake.close_blocks is not None:
                    fake.close_blocks.wait(10)
                self.record["closed"] = True

        self.module = types.SimpleNamespace(Producer=Producer, Consumer=Consumer)


def _run_workload(monkeypatch, kafka: _FakeKafka, seconds: float = 0.3, stop_timeout_s: float = 5.0,
                  rate: float = 200.0):
    from kcm_demo.workload import App, Workload

    monkeypatch.setitem(sys.modules, "confluent_kafka", kafka.module)
    workload = Workload("127.0.0.1:9092", apps=(App("payments", rate), App("orders", rate)))
    workload.start()
    time.sleep(seconds)
    started = time.monotonic()
    workload.stop(stop_timeout_s)
    return workload, time.monotonic() - started


def test_each_app_runs_a_producer_and_a_consumer_group_with_the_client_ids_it_names(monkeypatch):
    kafka = _FakeKafka()
    workload, _ = _run_workload(monkeypatch, kafka)

    producer_ids = sorted(p["config"]["client.id"] for p in kafka.producers)
    consumer_ids = sorted(c["config"]["client.id"] for c in kafka.consumers)
    assert sorted(workload.client_ids()) == sorted(producer_ids + consumer_ids)
    assert producer_ids == ["orders-producer", "payments-producer"]
    consumer = next(c for c in kafka.consumers if c["config"]["client.id"] == "payments-consumer")
    # The embedded broker holds each JoinGroup for half the session timeout: a short one, classic protocol.
    assert {key: consumer["config"][key] for key in ("group.id", "session.timeout.ms", "group.protocol",
                                                       "auto.offset.reset")} == {
        "group.id": "payments-app", "session.timeout.ms": 6000, "group.protocol": "classic",
        "auto.offset.reset": "earliest"}
    assert consumer["topics"] == ["payments"]


def test_the_workload_counts_the_records_delivered_and_consumed_not_those_that_failed(monkeypatch):
    kafka = _FakeKafka()
    workload, _ = _run_workload(monkeypatch, kafka, seconds=0.5)

    assert workload.produced == kafka.delivered > 0
    assert workload.consumed == kafka.consumed > 0
    assert workload.produced < sum(p["produced"] for p in kafka.producers)   # some were reported failed
    assert workload.consumed < sum(c["polls"] for c in kafka.consumers)


def test_producers_keep_their_rate_serve_delivery_reports_and_ride_out_a_full_queue(monkeypatch):
    kafka = _FakeKafka(buffer_errors=2)
    _run_workload(monkeypatch, kafka, seconds=0.5)

    assert all(p["produced"] >= 10 and p["polls"] >= 10 for p in kafka.producers), kafka.producers


def test_stopping_the_workload_flushes_within_a_bound_closes_consumers_and_polls_with_a_timeout(monkeypatch):
    kafka = _FakeKafka()
    workload, took_s = _run_workload(monkeypatch, kafka)

    assert took_s < 2 and not any(thread.is_alive() for thread in workload._threads)
    assert all(p["flush"] and p["flush"][0] <= 10 for p in kafka.producers), kafka.producers
    assert all(c["closed"] and None not in c["poll_timeouts"] for c in kafka.consumers), kafka.consumers


def test_stopping_the_workload_gives_up_on_a_client_that_will_not_close_within_the_bound(monkeypatch):
    release = threading.Event()
    try:
        _, took_s = _run_workload(monkeypatch, _FakeKafka(close_blocks=release), seconds=0.1, stop_timeout_s=0.3)
    finally:
        release.set()

    assert took_s < 2


# --- the pipeline: start order, stop order, exit codes -----------------------------------------------------------

class _FakePipeline:
    """Sandbox, subscriptions, collector, bridge and workload of `kcm demo` replaced by recorders: what started and
    stopped, in order. The workload's start makes one client push through the collector's callback."""

    def __init__(self, monkeypatch, tmp_path: Path) -> None:
        import kcm_demo.collector
        import kcm_demo.run
        import kcm_demo.workload
        import kcm_sandbox.runner

        self.events: list[str] = []
        self.times: dict[str, float] = {}
        self.bridge_error: Exception | None = None
        self.on_workload_start = lambda: None
        self.on_subscriptions = lambda: None
        self.on_bridge = lambda: None
        self.sandbox_options = None
        self.out = io.StringIO()
        self.workdir = tmp_path / "demo-logs"
        pipeline = self

        def event(name: str) -> None:
            pipeline.events.append(name)
            pipeline.times[name] = time.monotonic()

        class Sandbox:
            bootstrap = "127.0.0.1:9092"

            def __init__(self, options):
                pipeline.sandbox_options = options

            def start(self):
                event("sandbox start")

            def stop(self):
                event("sandbox stop")

        class Collector:
            endpoint = "127.0.0.1:4317"

            def __init__(self, on_export):
                pipeline.on_export = on_export

            def start(self):
                event("collector start")

            def stop(self):
                event("collector stop")

        class Bridge:
            def check_alive(self):
                if pipeline.bridge_error is not None:
                    raise pipeline.bridge_error

            def stop(self):
                event("bridge stop")

        def start_bridge(bootstrap, endpoint, workdir):
            event("bridge start")
            pipeline.on_bridge()
            return Bridge()

        def apply_subscriptions(bootstrap, path):
            event("subscriptions")
            pipeline.on_subscriptions()
            return ["subscription demo-producers: create"]

        class Workload:
            produced, consumed = 1_234, 1_230

            def __init__(self, bootstrap):
                pass

            def client_ids(self):
                return ["payments-producer"]

            def start(self):
                event("workload start")
                pipeline.on_export(_request("i-1", "payments-producer", _gauge(LATENCY, 2.5)))
                pipeline.on_workload_start()

            def stop(self):
                event("workload stop")

        def rollup(bootstrap, workdir, out):
            event("rollup")
            out.write("rollup: Parquet in somewhere\n")

        monkeypatch.setattr(kcm_sandbox.runner, "Sandbox", Sandbox)
        monkeypatch.setattr(kcm_demo.collector, "OtlpCollector", Collector)
        monkeypatch.setattr(kcm_demo.workload, "Workload", Workload)
        monkeypatch.setattr(kcm_demo.run, "_start_bridge", start_bridge)
        monkeypatch.setattr(kcm_demo.run, "_apply_subscriptions", apply_subscriptions)
        monkeypatch.setattr(kcm_demo.run, "_rollup", rollup)
        monkeypatch.setattr(kcm_demo.run, "_FINAL_PUSH_GRACE_S", 0.3)

    def run(self, interrupted: threading.Event | None = None, **options) -> int:
        from kcm_demo.run import DemoOptions, run_demo

        return run_demo(DemoOptions(**{"duration_s": 0.1, "output": "jsonl", "java": "no", **options}), self.out,
                        self.workdir, interrupted)


@pytest.fixture
def fake_pipeline(monkeypatch, tmp_path) -> _FakePipeline:
    return _FakePipeline(monkeypatch, tmp_path)


STARTED_AND_STOPPED = ["sandbox start", "subscriptions", "collector start", "bridge start", "workload start",
                       "workload stop", "bridge stop", "collector stop", "sandbox stop"]


def test_the_demo_stops_in_reverse_order_prints_a_jsonl_line_per_client_and_exits_0(fake_pipeline):
    code = fake_pipeline.run(rollup=True)

    assert code == 0 and fake_pipeline.workdir.is_dir()
    assert fake_pipeline.events == [*STARTED_AND_STOPPED[:-1], "rollup", "sandbox stop"]
    [line] = fake_pipeline.out.getvalue().splitlines()   # the rollup's text lines are not among the JSON lines
    assert json.loads(line)["client_id"] == "payments-producer"
    # The clients' final pushes have a grace period before the bridge stops; the run itself keeps to its duration.
    assert fake_pipeline.times["bridge stop"] - fake_pipeline.times["workload stop"] >= 0.3
    assert fake_pipeline.times["workload stop"] - fake_pipeline.times["workload start"] < 0.9


@pytest.mark.parametrize(("step", "events"), [
    ("subscriptions", ["sandbox start", "subscriptions", "sandbox stop"]),
    ("bridge", ["sandbox start", "subscriptions", "collector start", "bridge start", "bridge stop", "collector stop",
                "sandbox stop"]),
])
def test_ctrl_c_while_starting_stops_what_started_starts_nothing_more_and_exits_130(fake_pipeline, step, events):
    interrupted = threading.Event()
    setattr(fake_pipeline, f"on_{step}", interrupted.set)

    assert fake_pipeline.run(interrupted, rollup=True) == 130
    assert fake_pipeline.events == events


def test_ctrl_c_right_after_the_sandbox_started_applies_no_subscriptions(fake_pipeline):
    interrupted = threading.Event()
    interrupted.set()

    assert fake_pipeline.run(interrupted) == 130
    assert fake_pipeline.events == ["sandbox start", "sandbox stop"]


def test_ctrl_c_while_the_clients_run_skips_the_grace_period_and_the_rollup_and_exits_130(fake_pipeline):
    interrupted = threading.Event()
    fake_pipeline.on_workload_start = interrupted.set

    assert fake_pipeline.run(interrupted, duration_s=30, rollup=True) == 130
    assert fake_pipeline.events == STARTED_AND_STOPPED


@pytest.mark.parametrize("output", ["jsonl", "live"])
def test_a_bridge_that_dies_ends_the_demo_with_its_error_at_once_and_stops_everything(fake_pipeline, monkeypatch,
                                                                                      output):
    import kcm_demo.run

    monkeypatch.setattr(kcm_demo.run, "_FINAL_PUSH_GRACE_S", 5.0)
    fake_pipeline.bridge_error = UserError("the demo's bridge exited with code 1: boom")
    started = time.monotonic()

    with pytest.raises(UserError, match="bridge exited with code 1"):
        fake_pipeline.run(duration_s=30, output=output)
    assert time.monotonic() - started < 3
    assert fake_pipeline.events == STARTED_AND_STOPPED


def test_the_live_view_names_every_client_including_the_java_ones(fake_pipeline, monkeypatch, capsys):
    import kcm_demo.run

    monkeypatch.setattr(kcm_demo.run, "java_available", lambda: True)
    monkeypatch.setattr(kcm_demo.run, "_receiver_jar_exists", lambda: True)
    monkeypatch.setattr(kcm_demo.run, "_start_java_clients", lambda stack, bootstrap, workdir, interrupted: [
        "inventory-java-producer"])

    assert fake_pipeline.run(output="live", java="yes", refresh_s=0.05) == 0
    assert fake_pipeline.sandbox_options.receiver == "java"
    screen = capsys.readouterr().out
    assert "clients: payments-producer, inventory-java-producer" in screen
    assert "the apps' records: 1,234 produced, 1,230 consumed" in screen
    # Not a terminal here (`| tee`, a file): the view once, at the end, wide, its last line ended.
    assert screen.count("kcm demo  sandbox") == 1 and screen.endswith("\n"), screen
    assert max(len(line) for line in screen.splitlines()) > 80, screen


def test_in_a_terminal_log_lines_go_above_the_live_view_not_into_it(monkeypatch):
    """The sandbox logs each push at INFO: written to the terminal's stderr they landed inside the table, and each
    left a stale copy of the header behind (`make demo` in a terminal)."""
    import io
    import logging
    import threading

    from rich.console import Console

    import kcm_demo.run
    from kcm_demo.fleet import Fleet

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=120)
    stderr = Terminal()
    monkeypatch.setattr(kcm_demo.run.sys, "stderr", stderr)
    handler = logging.StreamHandler(stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    said: list[bool] = []

    def check() -> None:
        if not said:
            logging.getLogger("kcm.sandbox").warning("client c: push accepted")
            said.append(True)

    pipeline = kcm_demo.run.Pipeline(bootstrap="127.0.0.1:9092", receiver="the Python receiver",
                                     collector="127.0.0.1:4317", client_ids=["c"])
    try:
        kcm_demo.run._live(Fleet(), pipeline, time.monotonic() + 0.5, threading.Event(), 0.05, check,
                           lambda: (0, 0), console=console)
    finally:
        root.removeHandler(handler)
    assert "push accepted" not in stderr.getvalue()
    assert "client c: push accepted" in terminal.getvalue()
    assert handler.stream is stderr   # put back

    # stderr elsewhere (`2> demo.log`): the lines stay there.
    log_file = io.StringIO()
    monkeypatch.setattr(kcm_demo.run.sys, "stderr", log_file)
    handler = logging.StreamHandler(log_file)
    root.addHandler(handler)
    said.clear()
    try:
        kcm_demo.run._live(Fleet(), pipeline, time.monotonic() + 0.3, threading.Event(), 0.05, check,
                           lambda: (0, 0), console=console)
    finally:
        root.removeHandler(handler)
    assert "client c: push accepted" in log_file.getvalue()


@pytest.mark.parametrize(("choice", "available", "wanted"), [
    ("no", True, False), ("auto", True, True), ("auto", False, False), ("yes", True, True),
])
def test_java_is_used_when_asked_for_or_when_auto_finds_it(monkeypatch, choice, available, wanted):
    import kcm_demo.run

    monkeypatch.setattr(kcm_demo.run, "java_available", lambda: available)
    monkeypatch.setattr(kcm_demo.run, "_receiver_jar_exists", lambda: available)

    assert kcm_demo.run._want_java(choice) is wanted


def test_java_yes_without_java_is_a_mistake_before_anything_starts(monkeypatch):
    import kcm_demo.run

    monkeypatch.setattr(kcm_demo.run, "java_available", lambda: False)
    with pytest.raises(UserError, match="--java yes needs `java` on PATH"):
        kcm_demo.run._want_java("yes")


# --- the demo's child processes ----------------------------------------------------------------------------------

def test_a_child_is_stopped_with_sigterm_and_its_log_closed(tmp_path):
    from kcm_demo.run import _Process

    child = _Process("bridge", ["sleep", "30"], tmp_path / "bridge.log")
    started = time.monotonic()
    child.stop(timeout_s=5)

    assert child.popen.returncode == -signal.SIGTERM and time.monotonic() - started < 2
    assert child._log.closed


def test_a_child_ignoring_sigterm_is_killed_after_the_bound(tmp_path):
    from kcm_demo.run import _Process

    child = _Process("bridge", ["sh", "-c", "trap '' TERM; echo ready; sleep 30"], tmp_path / "bridge.log")
    deadline = time.monotonic() + 5
    while b"ready" not in (tmp_path / "bridge.log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    child.stop(timeout_s=0.3)

    assert child.popen.returncode == -signal.SIGKILL


def test_a_child_that_exited_is_reported_with_its_code_and_the_last_lines_of_its_log(tmp_path):
    from kcm_demo.run import _Process

    alive = _Process("bridge", ["sleep", "30"], tmp_path / "alive.log")
    dead = _Process("bridge", ["sh", "-c", "for i in 1 2 3 4 5 6 7; do echo line $i; done; exit 3"],
                    tmp_path / "dead.log")
    try:
        dead.popen.wait(5)
        alive.check_alive()
        with pytest.raises(UserError) as failed:
            dead.check_alive()
    finally:
        alive.stop(timeout_s=5)
        dead.stop(timeout_s=5)

    assert str(failed.value) == ("the demo's bridge exited with code 3: line 3 | line 4 | line 5 | line 6 | line 7")


def test_failed_subscriptions_are_one_line_naming_the_reason_and_the_command_is_bounded(monkeypatch):
    import kcm_demo.run

    calls = []

    def run(argv, **kwargs):
        calls.append(kwargs)
        return subprocess.CompletedProcess(argv, 2, "", "kcm subscriptions: broker 127.0.0.1:1 unreachable\n")

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(UserError) as failed:
        kcm_demo.run._apply_subscriptions("127.0.0.1:1", Path("examples/demo"))

    assert str(failed.value) == "applying the demo subscriptions failed: broker 127.0.0.1:1 unreachable"
    assert calls[0].get("timeout")


def test_the_demos_bridge_ignores_settings_meant_for_a_real_one(monkeypatch, tmp_path):
    import kcm_demo.run

    started = {}
    monkeypatch.setattr(kcm_demo.run, "_Process", lambda name, argv, log_path, env: started.update(argv=argv, env=env))
    monkeypatch.setenv("KCM_BRIDGE_METRICS_PORT", "9464")
    kcm_demo.run._start_bridge("127.0.0.1:9092", "127.0.0.1:4317", tmp_path)

    argv = started["argv"]
    assert "KCM_BRIDGE_METRICS_PORT" not in started["env"]
    assert argv[argv.index("--endpoint") + 1] == "127.0.0.1:4317" and "--insecure" in argv
    assert argv[argv.index("--group-id") + 1] == "kcm-demo-bridge"
    assert "session.timeout.ms=6000" in (tmp_path / "bridge-client.properties").read_text()


def test_the_java_consumer_joins_a_group_and_ctrl_c_starts_no_java_client(monkeypatch, tmp_path):
    from contextlib import ExitStack

    import kcm_demo.run
    import kcm_sandbox.java_clients

    created = []

    class JavaClient:
        def __init__(self, bootstrap, client_id, role, topic, extra_config, log_path):
            self.client_id = client_id
            created.append((role, extra_config))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(kcm_sandbox.java_clients, "JavaClient", JavaClient)
    with ExitStack() as stack:
        ids = kcm_demo.run._start_java_clients(stack, "127.0.0.1:9092", tmp_path, threading.Event())
    assert ids == ["inventory-java-producer", "inventory-java-consumer"]
    assert created == [("producer", {}), ("consumer", {"group.id": "inventory-java-app"})]

    created.clear()
    interrupted = threading.Event()
    interrupted.set()
    with ExitStack() as stack, pytest.raises(kcm_demo.run._Interrupted):
        kcm_demo.run._start_java_clients(stack, "127.0.0.1:9092", tmp_path, interrupted)
    assert created == []


def test_the_rollup_prints_its_top_rows_without_empty_cells_and_gives_back_ctrl_c(monkeypatch, tmp_path):
    import kcm_demo.run

    def run_rollup(*args, **kwargs):
        signal.signal(signal.SIGINT, lambda *_: None)   # as PySpark does
        return types.SimpleNamespace(top_rows=[{"resolution": "1m", "client_id": "payments-producer",
                                                "avg": 1.23456789, "node": None}],
                                     summary_lines=lambda: ["input records 12, decode errors none"])

    monkeypatch.setitem(sys.modules, "kcm_rollups.job", types.SimpleNamespace(run_rollup=run_rollup))
    handler = signal.getsignal(signal.SIGINT)
    out = io.StringIO()
    try:
        kcm_demo.run._rollup("127.0.0.1:9092", tmp_path, out)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, handler)

    assert out.getvalue().splitlines()[1:] == ["resolution=1m  client_id=payments-producer  avg=1.235",
                                               "rollup: input records 12, decode errors none"]


def test_the_demos_logs_go_where_kcm_demo_dir_says(monkeypatch, tmp_path):
    from kcm_demo.run import default_workdir

    monkeypatch.setenv("KCM_DEMO_DIR", str(tmp_path / "logs"))
    assert default_workdir() == tmp_path / "logs"
    monkeypatch.delenv("KCM_DEMO_DIR")
    assert default_workdir() == Path(__file__).resolve().parents[1] / "build" / "demo"
    monkeypatch.setenv("KCM_DEMO_DIR", "")   # empty is unset, not the current directory
    assert default_workdir() == Path(__file__).resolve().parents[1] / "build" / "demo"


# --- `kcm demo`'s options ----------------------------------------------------------------------------------------

@pytest.fixture
def demo_command(monkeypatch):
    """`kcm demo` with the demo itself and its signal handlers replaced by recorders: what it was asked to run."""
    import importlib.util

    import kcm_cli.demo
    import kcm_demo.run

    calls: dict = {}

    def run_demo(options, out, workdir, interrupted):
        calls.update(options=options, out=out, interrupted=interrupted)
        if "raise" in calls:
            raise calls["raise"]
        return 0

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in kcm_cli.demo._ROLLUP_MODULES
                        else real(name, *a))
    monkeypatch.setattr(kcm_demo.run, "run_demo", run_demo)
    monkeypatch.setattr(kcm_cli.demo, "on_stop_signals", lambda on_signal: calls.update(on_signal=on_signal))
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "")   # so that what `kcm demo` sets is undone after the test
    monkeypatch.delenv("GRPC_ENABLE_FORK_SUPPORT")
    return calls


def test_kcm_demo_defaults_to_a_live_minute_with_java_when_found(demo_command):
    from kcm_cli.main import main

    assert main(["demo"]) == 0
    options = demo_command["options"]
    assert (options.duration_s, options.output, options.rollup, options.java) == (60.0, "live", False, "auto")
    assert demo_command["out"] is sys.stdout
    demo_command["on_signal"](signal.SIGTERM)
    assert demo_command["interrupted"].is_set()
    import os
    assert os.environ["GRPC_ENABLE_FORK_SUPPORT"] == "false"


def test_kcm_demo_passes_on_every_option(demo_command, tmp_path):
    from kcm_cli.main import main

    assert main(["demo", "--duration", "86400", "--output", "jsonl", "--rollup", "--java", "no",
                 "--subscriptions", str(tmp_path)]) == 0
    options = demo_command["options"]
    assert (options.duration_s, options.output, options.rollup, options.java, options.subscriptions) == (
        86400.0, "jsonl", True, "no", tmp_path)


def test_a_demo_that_cannot_start_is_a_one_line_error(demo_command, capsys):
    from kcm_cli.main import main

    demo_command["raise"] = OSError(98, "Address already in use")

    assert main(["demo"]) == 2
    assert capsys.readouterr().err == "kcm demo: the demo could not start: [Errno 98] Address already in use\n"
