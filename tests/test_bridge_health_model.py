"""What the bridge reports about its own health while Kafka and the collector come and go, against a reference state
machine written from docs/bridge.md (Metrics and probes; Kafka down or credentials rejected; Endpoint down;
SIGTERM/SIGINT), not from the code.

The state is (Kafka reachable or cut; the collector up or down; records produced, delivered). From it the model
expects:
- `/readyz`: 200 exactly while Kafka answers with the configured credentials and the bridge is not shutting down; a
  collector being down does not change it. `/healthz`: 200 throughout (the loop keeps coming round; a draining bridge
  stays healthy).
- `/metrics`: counters never go backwards; with Kafka and the collector up every record produced is consumed,
  exported and committed (`kcm_bridge_committed_offset`), `kcm_bridge_lag`, `kcm_bridge_inflight_bytes` and
  `kcm_bridge_paused` come back to 0; with the collector down and more than `max_inflight_bytes` waiting
  `kcm_bridge_paused` is 1, `kcm_bridge_export_failures_total{code="UNAVAILABLE"}` and
  `kcm_bridge_export_retries_total` both move, and the lag counts what was produced meanwhile.
- Log lines: an outage is reported at ERROR once per backoff period at most (`retrying in …, not ready until then`),
  naming the address; each recovery says `answers again` once; pause and resume (INFO) alternate; no line, scrape or
  probe answer ever holds the endpoint's header secret or the SASL password.
Seeded random sequences of those events run against the real bridge (`Bridge.run` in this process, as the other
bridge tests do), with Kafka behind a loopback relay that is cut and mended, and a real gRPC collector stopped and
started on one port; directed cases cover Kafka unreachable from the start, refused credentials, and a stop during an
outage. A failure names its seed and step."""

from __future__ import annotations

import functools
import logging
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kcm_bridge import config as bridge_config
from kcm_bridge import pipeline
from kcm_bridge.health import KafkaHealth
from kcm_bridge.pipeline import Bridge
from kcm_common.retry import RetryPolicy
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.broker import EmbeddedBroker
from fake_collector import FakeCollector
from ports import reserved_port
from test_bridge_kafka_health import _check_kafka_every_second, _Relay
from test_bridge_pipeline import CONSUMER_PROPERTIES, _client_ids, _produce, _push

TOPIC = "health-model"
SECRET = "s3cret-header-value-never-logged"
PASSWORD = "hunter2-health-model-password"
SEEDS = (1, 3)   # between them: outages of each end alone and together, pushes waiting for the collector
# docs/bridge.md, Kafka down: backoff 1 s doubling to 30 s in production; the tests check every 0.5 s then 1 s
# (_check_kafka_every_second), so an outage of d seconds is reported at most 2 + d times.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 1.0
CONNECT_TIMEOUT_S = 1.0
SHUTDOWN_TIMEOUT_S = 2.0
MAX_INFLIGHT_BYTES = 3000
# How long a change may take to show: a check period, the check itself (probe + request, each up to
# connect_timeout_s), and a group join (session.timeout.ms 3 s in CONSUMER_PROPERTIES), on a busy 2-core machine.
NOTICE_S = 20.0
COUNTERS = ("kcm_bridge_records_consumed_total", "kcm_bridge_points_exported_total",
            "kcm_bridge_export_failures_total", "kcm_bridge_export_retries_total", "kcm_bridge_bytes_consumed_total")


# -- observing the bridge ---------------------------------------------------------------------------------------------

def _get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


@dataclass
class _Probe:
    port: int

    def status(self, path: str) -> int:
        return self.answer(path)[0]

    def answer(self, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
        return _get(f"http://127.0.0.1:{self.port}{path}", timeout_s)

    def metrics(self) -> dict[str, float]:
        """Every sample, summed over its labels but `topic`/`partition`/`code` (name{code=X} keeps X)."""
        status, text = self.answer("/metrics")
        assert status == 200
        assert SECRET not in text and PASSWORD not in text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if "code" in sample.labels:
                    samples[f"{name}{{code={sample.labels['code']}}}"] = (
                        samples.get(f"{name}{{code={sample.labels['code']}}}", 0.0) + sample.value)
                samples[name] = samples.get(name, 0.0) + sample.value
        return samples


def _wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s} s"
        time.sleep(0.1)


def _lines(caplog, since: int = 0) -> list[logging.LogRecord]:
    return [r for r in caplog.records[since:] if r.name.startswith("kcm.bridge")]


def _assert_nothing_secret(caplog) -> None:
    for record in caplog.records:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        assert SECRET not in text and PASSWORD not in text, text


def _kafka_reports(caplog, since: int = 0) -> list[str]:
    return [r.getMessage() for r in _lines(caplog, since) if r.levelno >= logging.ERROR]


def _assert_paced(caplog, first_s: float = BACKOFF_FIRST_S, most_s: float = BACKOFF_MAX_S) -> None:
    """Once per backoff period: within one outage (up to its `answers again`), the n-th report comes at least the
    n-th backoff (`first_s`, then `most_s`) after the one before."""
    last, gaps = None, 0
    for record in _lines(caplog):
        if "answers again" in record.getMessage():
            last, gaps = None, 0
        elif record.levelno >= logging.ERROR:
            if last is not None:
                least = first_s if gaps == 0 else most_s
                assert record.created - last >= least - 0.1, (record.created - last, record.getMessage())
                gaps += 1
            last = record.created


# -- the world: Kafka behind a relay, a collector on a fixed port, the bridge ------------------------------------------

class _Collectors:
    """The collector on one port, stopped and started again; every export any of its lives took."""

    def __init__(self, port: int) -> None:
        self.port, self.up = port, False
        self._lives: list[FakeCollector] = []

    def start(self) -> None:
        life = FakeCollector(port=self.port)
        life.start()
        self._lives.append(life)
        self.up = True

    def stop(self) -> None:
        self._lives[-1].stop()
        self.up = False

    def client_ids(self) -> list[str]:
        return [client for life in self._lives for client in _client_ids(life.exports)]


def _config(tmp_path, bootstrap: str, collector_port: int, **overrides) -> bridge_config.BridgeConfig:
    """The bridge's settings, from a file as a deployment gives them: the endpoint's header holds a secret."""
    (tmp_path / "consumer.properties").write_text(overrides.pop("properties", CONSUMER_PROPERTIES))
    (tmp_path / "bridge.yaml").write_text(
        f"endpoints:\n  - endpoint: '127.0.0.1:{collector_port}'\n    insecure: true\n"
        f"    headers: {{x-api-key: {SECRET}}}\n")
    values = {("kafka", "bootstrap_servers"): bootstrap,
              ("kafka", "command_config"): str(tmp_path / "consumer.properties"), ("kafka", "topics"): [TOPIC],
              ("kafka", "group_id"): "health-model", ("kafka", "connect_timeout_s"): CONNECT_TIMEOUT_S,
              ("batch", "linger_ms"): 20, ("retry", "initial_backoff_s"): 0.1, ("retry", "max_backoff_s"): 0.5,
              ("delivery", "max_inflight_bytes"): MAX_INFLIGHT_BYTES, ("delivery", "commit_interval_s"): 0.2,
              ("delivery", "shutdown_timeout_s"): SHUTDOWN_TIMEOUT_S, ("metrics_port",): 0,
              ("metrics_host",): "127.0.0.1"}
    values.update({tuple(key.split("__")): value for key, value in overrides.items()})
    return bridge_config.load(tmp_path / "bridge.yaml", env={}, overrides=values)


@dataclass
class _Run:
    bridge: Bridge
    thread: threading.Thread
    result: list = field(default_factory=list)
    ended: list[float] = field(default_factory=list)   # when run() returned

    @property
    def probe(self) -> _Probe:
        assert self.bridge.metrics_port is not None
        return _Probe(self.bridge.metrics_port)


@contextmanager
def _running(config: bridge_config.BridgeConfig) -> Iterator[_Run]:
    bridge = Bridge(config)

    def target() -> None:
        run.result.append(bridge.run())
        run.ended.append(time.monotonic())
    run = _Run(bridge, threading.Thread(target=target, daemon=True))
    run.thread.start()
    try:
        _wait_until(lambda: bridge.metrics_port is not None, 10, "serving /metrics")
        yield run
    finally:
        bridge.stop()
        run.thread.join(timeout=30)
        assert not run.thread.is_alive(), "the bridge did not stop within 30 s"
    assert run.result == [0]


@contextmanager
def _kafka_behind_relay(tmp_path) -> Iterator[tuple[EmbeddedBroker, _Relay]]:
    """A broker advertising a relay's port: cutting the relay is Kafka gone for the bridge, mending it is Kafka back."""
    with reserved_port() as relay_port:
        broker = EmbeddedBroker(advertised=f"127.0.0.1:{relay_port}", log_path=tmp_path / "tansu.log")
        relay = _Relay(relay_port, lambda: broker.port)
        relay.mend()
        broker.start()
        try:
            ensure_topic(KafkaSettings(broker.bootstrap), TOPIC)
            yield broker, relay
        finally:
            relay.cut()
            broker.stop()


# -- the reference ----------------------------------------------------------------------------------------------------

@dataclass
class _Model:
    """The documented state and what follows from it."""

    kafka_up: bool = True
    collector_up: bool = True
    produced: int = 0
    produced_while_down: int = 0   # pushes since the collector went down (what waits for it)
    outages: list[float] = field(default_factory=list)   # how long each ended Kafka outage lasted
    down_since: float | None = None

    @property
    def ready(self) -> bool:
        return self.kafka_up

    @property
    def settled(self) -> bool:
        """Everything produced is exported and committed."""
        return self.kafka_up and self.collector_up

    @property
    def backs_up(self) -> bool:
        """More than max_inflight_bytes wait for the collector (a push is ~1 KiB enriched): reading pauses."""
        return self.kafka_up and not self.collector_up and self.produced_while_down >= 6


def _steps(seed: int) -> list[tuple[str, int]]:
    """6-8 events: Kafka cut or mended, the collector stopped or started, pushes produced (only while Kafka is up)."""
    rng = random.Random(seed)
    kafka_up, collector_up, steps = True, True, []
    for _ in range(rng.randint(6, 8)):
        choices = ["kafka", "collector"] + (["produce", "produce"] if kafka_up else [])
        kind = rng.choice(choices)
        if kind == "kafka":
            kafka_up = not kafka_up
            steps.append(("kafka_up" if kafka_up else "kafka_down", 0))
        elif kind == "collector":
            collector_up = not collector_up
            steps.append(("collector_up" if collector_up else "collector_down", 0))
        else:
            steps.append(("produce", rng.choice([1, 3, 8])))
    if not kafka_up:
        steps.append(("kafka_up", 0))
    if not collector_up:
        steps.append(("collector_up", 0))
    return steps


def _check(model: _Model, run: _Run, collectors: _Collectors, before: dict[str, float], where: str,
           caplog) -> dict[str, float]:
    """Wait (within the documented bounds) for what the model expects, then compare every observable."""
    probe = run.probe
    expected_ready = 200 if model.ready else 503
    _wait_until(lambda: probe.status("/readyz") == expected_ready, NOTICE_S, f"/readyz {expected_ready} ({where})")
    if model.settled:
        produced = [f"client-{n}" for n in range(model.produced)]
        _wait_until(lambda: set(produced) <= set(collectors.client_ids()), NOTICE_S, f"every push exported ({where})")

        def caught_up() -> bool:
            now = probe.metrics()
            return (now.get("kcm_bridge_committed_offset", 0) == model.produced and now["kcm_bridge_paused"] == 0
                    and now["kcm_bridge_inflight_bytes"] == 0 and now.get("kcm_bridge_lag", 0) == 0)
        _wait_until(caught_up, NOTICE_S, f"committed {model.produced}, lag 0, not paused ({where})")
    if model.backs_up:
        _wait_until(lambda: probe.metrics()["kcm_bridge_paused"] == 1, NOTICE_S, f"paused ({where})")
        first = probe.metrics()
        # Paused because more than max_inflight_bytes await export; it resumes only at half.
        assert first["kcm_bridge_inflight_bytes"] > MAX_INFLIGHT_BYTES // 2, (where, first)
        _wait_until(lambda: (probe.metrics()['kcm_bridge_export_failures_total{code=UNAVAILABLE}']
                             > first['kcm_bridge_export_failures_total{code=UNAVAILABLE}']
                             and probe.metrics()["kcm_bridge_export_retries_total"]
                             > first["kcm_bridge_export_retries_total"]), NOTICE_S,
                    f"export failures and retries moving while the collector is down ({where})")
        committed = first.get("kcm_bridge_committed_offset", 0)
        _wait_until(lambda: probe.metrics().get("kcm_bridge_lag", 0) == model.produced - committed, NOTICE_S,
                    f"lag {model.produced} - {committed} while paused ({where})")
    # Held for a while: no flapping between checks.
    for _ in range(3):
        assert probe.status("/readyz") == expected_ready, where
        assert probe.answer("/healthz") == (200, "ok\n"), where
        time.sleep(0.1)
    now = probe.metrics()
    for name in COUNTERS:
        assert now.get(name, 0) >= before.get(name, 0), f"{name} went backwards ({where})"
    assert now["kcm_bridge_paused"] in (0, 1) and now["kcm_bridge_inflight_bytes"] >= 0
    # Endpoint down: more than max_inflight_bytes waiting means reading is paused (resumed at half).
    if now["kcm_bridge_inflight_bytes"] > MAX_INFLIGHT_BYTES:
        assert now["kcm_bridge_paused"] == 1, (where, now["kcm_bridge_inflight_bytes"])
    if model.settled:
        assert now["kcm_bridge_records_consumed_total"] >= model.produced, where
    _assert_nothing_secret(caplog)
    return now


def _check_log(model: _Model, caplog, bootstrap: str, where: str) -> None:
    """The whole run's lines against the model: paced outage reports naming the address, one recovery line per
    outage, pause and resume alternating, no traceback."""
    lines = _lines(caplog)
    reports = _kafka_reports(caplog)
    for report in reports:
        assert report.endswith("not ready until then") and "retrying in" in report, (where, report)
        assert bootstrap in report, (where, report)   # naming the address it cannot use
    allowed = sum(2 + outage / BACKOFF_MAX_S for outage in model.outages)
    if model.down_since is not None:
        allowed += 2 + (time.monotonic() - model.down_since) / BACKOFF_MAX_S
    assert len(reports) <= allowed, (where, len(reports), allowed, reports)
    _assert_paced(caplog)
    if model.outages:
        assert reports, f"an outage never reported ({where})"
    recoveries = [r.getMessage() for r in lines if "answers again" in r.getMessage()]
    assert len(recoveries) == len(model.outages), (where, recoveries, model.outages)
    assert all(r.levelno == logging.INFO for r in lines if "answers again" in r.getMessage())
    flow = [("pause" if "pausing consumption" in r.getMessage() else "resume") for r in lines
            if "pausing consumption" in r.getMessage() or "resuming consumption" in r.getMessage()]
    assert flow == ["pause", "resume"] * (len(flow) // 2) + ["pause"] * (len(flow) % 2), (where, flow)
    assert not [r for r in lines if r.exc_info], where


# -- seeded random sequences ------------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_outages_of_kafka_and_the_collector_are_reported_as_documented(seed, tmp_path, caplog, monkeypatch):
    _check_kafka_every_second(monkeypatch)
    caplog.set_level(logging.INFO)
    steps = _steps(seed)
    with reserved_port() as collector_port, _kafka_behind_relay(tmp_path) as (broker, relay):
        collectors = _Collectors(collector_port)
        collectors.start()
        model = _Model()
        config = _config(tmp_path, f"127.0.0.1:{relay.port}", collector_port)
        try:
            with _running(config) as run:
                metrics = _check(model, run, collectors, {}, f"seed {seed}, start", caplog)
                for number, (kind, count) in enumerate(steps):
                    where = f"seed {seed}, step {number} {kind} {count or ''} of {steps}"
                    if kind == "kafka_down":
                        relay.cut()
                        model.kafka_up, model.down_since = False, time.monotonic()
                    elif kind == "kafka_up":
                        relay.mend()
                        model.kafka_up = True
                        model.outages.append(time.monotonic() - model.down_since)
                        model.down_since = None
                    elif kind == "collector_down":
                        collectors.stop()
                        model.collector_up, model.produced_while_down = False, 0
                    elif kind == "collector_up":
                        collectors.start()
                        model.collector_up = True
                    else:
                        _produce(broker.bootstrap, TOPIC, [_push(f"client-{n}", f"00000000-0000-0000-0000-{n:012d}")
                                                           for n in range(model.produced, model.produced + count)])
                        model.produced += count
                        if not model.collector_up:
                            model.produced_while_down += count
                    metrics = _check(model, run, collectors, metrics, where, caplog)
                    _check_log(model, caplog, f"127.0.0.1:{relay.port}", where)
        finally:
            if collectors.up:
                collectors.stop()
    _assert_nothing_secret(caplog)


# -- directed cases ---------------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_kafka_unreachable_from_the_start_is_not_ready_but_alive_then_consumes(tmp_path, caplog, monkeypatch):
    """Pods start in any order: not ready, /healthz 200, paced reports naming the address, nothing consumed; once
    Kafka answers, ready, one `answers again`, and the backlog exported and committed."""
    _check_kafka_every_second(monkeypatch)
    caplog.set_level(logging.INFO)
    with reserved_port() as collector_port, _kafka_behind_relay(tmp_path) as (broker, relay):
        _produce(broker.bootstrap, TOPIC, [_push(f"client-{n}", f"00000000-0000-0000-0000-{n:012d}")
                                           for n in range(3)])
        relay.cut()
        collectors = _Collectors(collector_port)
        collectors.start()
        try:
            with _running(_config(tmp_path, f"127.0.0.1:{relay.port}", collector_port)) as run:
                began = time.monotonic()
                _wait_until(lambda: _kafka_reports(caplog), NOTICE_S, "a report")
                time.sleep(1.5)   # a few more checks, each failing
                probe = run.probe
                assert probe.status("/readyz") == 503 and probe.answer("/healthz") == (200, "ok\n")
                metrics = probe.metrics()
                assert metrics["kcm_bridge_records_consumed_total"] == 0 and metrics["kcm_bridge_paused"] == 0
                reports = _kafka_reports(caplog)
                assert 2 <= len(reports) <= 2 + (time.monotonic() - began) / BACKOFF_MAX_S, reports
                assert all(f"127.0.0.1:{relay.port}" in r and "retrying in" in r for r in reports), reports
                model = _Model(produced=3, outages=[time.monotonic() - began])
                relay.mend()
                _check(model, run, collectors, metrics, "Kafka back", caplog)
                _check_log(model, caplog, f"127.0.0.1:{relay.port}", "Kafka back")
                # Stopped while a push waits for the collector: not ready at once, Kafka up or not; alive meanwhile.
                collectors.stop()
                _produce(broker.bootstrap, TOPIC, [_push("client-3", f"00000000-0000-0000-0000-{3:012d}")])
                _wait_until(lambda: run.probe.metrics()["kcm_bridge_records_consumed_total"] >= 4, NOTICE_S, "read")
                assert probe.status("/readyz") == 200
                run.bridge.stop()
                assert probe.status("/readyz") == 503 and probe.answer("/healthz") == (200, "ok\n")
        finally:
            if collectors.up:
                collectors.stop()


@pytest.mark.timeout(60)
def test_refused_credentials_keep_it_alive_not_ready_reported_without_the_password(authenticating_broker, tmp_path,
                                                                                  caplog, monkeypatch):
    """Credentials refused: /healthz 200 (a restart would not help), /readyz 503 on every check, nothing consumed,
    an ERROR per backoff period naming the credentials and the user, never the password. The periods here (1 s,
    then 2 s) are longer than librdkafka's reconnect backoff (1 s): its refusals in between are not reported."""
    monkeypatch.setattr(pipeline, "KafkaHealth", functools.partial(KafkaHealth, RetryPolicy(
        initial_backoff_s=1.0, max_backoff_s=2.0, multiplier=2.0, jitter=0.0)))
    caplog.set_level(logging.INFO)
    with reserved_port() as collector_port:
        collectors = _Collectors(collector_port)
        collectors.start()
        properties = ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\n"
                      f"sasl.password={PASSWORD}\n" + CONSUMER_PROPERTIES)
        try:
            with _running(_config(tmp_path, authenticating_broker, collector_port, properties=properties)) as run:
                began = time.monotonic()
                _wait_until(lambda: _kafka_reports(caplog), NOTICE_S, "a report")
                answers = []
                for _ in range(20):
                    answers.append((run.probe.status("/readyz"), run.probe.status("/healthz")))
                    time.sleep(0.25)
                assert set(answers) == {(503, 200)}, answers
                metrics = run.probe.metrics()
                assert metrics["kcm_bridge_records_consumed_total"] == 0
                assert metrics.get("kcm_bridge_points_exported_total", 0) == 0 and metrics["kcm_bridge_paused"] == 0
                reports = _kafka_reports(caplog)
                assert 2 <= len(reports) <= 2 + (time.monotonic() - began) / 2.0, reports
                _assert_paced(caplog, 1.0, 2.0)
                assert all("credentials" in r and "not ready until then" in r for r in reports), reports
                assert "Kafka rejected the SASL credentials for user alice" in reports[-1], reports
                status, body = run.probe.answer("/readyz")
                assert (status, body) == (503, "not ready\n")
        finally:
            collectors.stop()
    _assert_nothing_secret(caplog)
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.timeout(60)
def test_a_stop_during_an_outage_of_both_ends_within_the_bound_not_ready_healthy_and_says_nothing_is_committed(
        tmp_path, caplog, monkeypatch):
    """SIGTERM with Kafka cut and the collector down, records read and waiting: /readyz 503 at once, /healthz 200
    while draining, run() returns 0 within shutdown_timeout_s (plus connect_timeout_s for a check under way), and
    the log says exported records stay uncommitted rather than committing."""
    _check_kafka_every_second(monkeypatch)
    caplog.set_level(logging.INFO)
    with reserved_port() as collector_port, _kafka_behind_relay(tmp_path) as (broker, relay):
        collectors = _Collectors(collector_port)
        collectors.start()
        # Commits only at the first interval, 60 s on: what was exported stays uncommitted until the stop.
        config = _config(tmp_path, f"127.0.0.1:{relay.port}", collector_port, delivery__commit_interval_s=60)
        with _running(config) as run:
            _produce(broker.bootstrap, TOPIC, [_push("client-0", "00000000-0000-0000-0000-000000000000")])
            _wait_until(lambda: collectors.client_ids() == ["client-0"], NOTICE_S, "the first push exported")
            collectors.stop()
            _produce(broker.bootstrap, TOPIC, [_push(f"client-{n}", f"00000000-0000-0000-0000-{n:012d}")
                                               for n in range(1, 4)])
            _wait_until(lambda: run.probe.metrics()["kcm_bridge_records_consumed_total"] >= 4, NOTICE_S, "read")
            relay.cut()
            _wait_until(lambda: run.probe.status("/readyz") == 503, NOTICE_S, "not ready once Kafka is cut")
            probe = run.probe
            assert probe.answer("/healthz") == (200, "ok\n")
            stopping = time.monotonic()
            run.bridge.stop()
            assert probe.status("/readyz") == 503
            draining = []
            while run.thread.is_alive() and time.monotonic() - stopping < 30:
                try:
                    draining.append(probe.answer("/healthz", timeout_s=0.5))
                except OSError:   # the server stops answering as run() returns
                    break
                time.sleep(0.2)
            run.thread.join(timeout=30)
            took = run.ended[0] - stopping
            with pytest.raises(ConnectionRefusedError):   # the endpoints' socket is closed with them
                socket.create_connection(("127.0.0.1", probe.port), timeout=2).close()
        assert took <= SHUTDOWN_TIMEOUT_S + CONNECT_TIMEOUT_S + 2.0, took
        assert draining and set(draining) == {(200, "ok\n")}, draining
        said = [r.getMessage() for r in _lines(caplog) if r.levelno >= logging.WARNING]
        assert [line for line in said if "Kafka" in line and "uncommitted" in line], said
        assert collectors.client_ids() == ["client-0"]
    _assert_nothing_secret(caplog)
