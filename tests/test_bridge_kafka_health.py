"""Kafka rejecting the bridge's credentials: reported once per backoff period, /readyz not ready, retried, no
traceback and no password, the same with both consumer backends."""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from kcm_bridge import config as bridge_config
from kcm_bridge import pipeline as bridge_module
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_common.otlp_export import RetryPolicy
from kcm_bridge.health import KafkaHealth
from kcm_sandbox.broker import EmbeddedBroker
from ports import reserved_port
from test_bridge_pipeline import BACKENDS, running_bridge

PASSWORD = "hunter2-not-in-any-log"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _readyz_answers(port: int, times: int = 16, every_s: float = 0.25) -> list[int]:
    """What /readyz answers, `times` times `every_s` apart (some 4 s: several of the bridge's Kafka checks)."""
    answers = []
    for _ in range(times):
        try:
            answers.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status)
        except urllib.error.HTTPError as refused:
            answers.append(refused.code)
        time.sleep(every_s)
    return answers


def test_kafka_health_reports_once_per_backoff_period_and_recovers():
    clock = _Clock()
    health = KafkaHealth(RetryPolicy(initial_backoff_s=1, max_backoff_s=4, multiplier=2, jitter=0), clock)
    assert not health.ok and health.check_due()
    assert health.failed("rejected") == 1
    assert health.failed("rejected again") is None and not health.check_due()
    clock.now += 1
    assert health.check_due() and health.failed("rejected") == 2
    clock.now += 2
    assert health.failed("rejected") == 4
    clock.now += 4
    assert health.failed("rejected") == 4
    assert health.recovered() and health.ok and not health.check_due()
    assert health.failed("brokers down") == 1 and not health.ok
    assert health.recovered()
    assert KafkaHealth().recovered() is False, "a first success is not a recovery"


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejected_credentials_are_reported_once_per_backoff_and_readyz_says_not_ready(
        backend, authenticating_broker, tmp_path, collector, caplog):
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\n"
                          f"sasl.password={PASSWORD}\nsession.timeout.ms=3000\n")
    config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
        ("kafka", "bootstrap_servers"): authenticating_broker, ("kafka", "command_config"): str(properties),
        ("kafka", "client"): backend, ("kafka", "connect_timeout_s"): 2, ("metrics_port",): 0,
        ("metrics_host",): "127.0.0.1"})
    caplog.set_level(logging.INFO)
    with running_bridge(config) as bridge:
        deadline = time.monotonic() + 30
        while not any(r.levelno == logging.ERROR and r.name == "kcm.bridge" for r in caplog.records):
            assert time.monotonic() < deadline, "no error reported within 30 s"
            time.sleep(0.1)
        time.sleep(6)
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{bridge.metrics_port}/readyz", timeout=5)
        assert answer.value.code == 503
        assert not bridge.ready

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]   # kafka-python's own: silenced (conftest)
    reports = [r.getMessage() for r in errors if r.name == "kcm.bridge"]
    assert 2 <= len(reports) <= 5, reports   # backoff 1, 2, 4 s... over some 6-10 s
    assert len(errors) == len(reports), [r.getMessage() for r in errors]   # librdkafka's own FAIL lines are not
    assert all("credentials" in report for report in reports), reports
    if backend == "confluent-kafka":   # kafka-python cannot tell: its SCRAM code fails on the broker's error reply
        assert "Kafka rejected the SASL credentials for user alice" in reports[-1]
    assert not [r for r in caplog.records if PASSWORD in r.getMessage() or r.exc_info]
    assert collector.exports == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kafka_that_is_not_up_yet_is_retried_and_consumed_once_it_is(backend, tmp_path, collector, caplog):
    """Pods start in any order: the bridge waits, not ready, saying what answers at the address, then consumes."""
    from kcm_sandbox.runner import Sandbox, SandboxOptions

    with reserved_port() as port:   # refusing connections until the sandbox listens there
        properties = tmp_path / "client.properties"
        properties.write_text("session.timeout.ms=3000\nheartbeat.interval.ms=500\n")
        config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
            ("kafka", "bootstrap_servers"): f"127.0.0.1:{port}", ("kafka", "command_config"): str(properties),
            ("kafka", "client"): backend, ("kafka", "connect_timeout_s"): 2, ("metrics_port",): 0,
            ("metrics_host",): "127.0.0.1"})
        caplog.set_level(logging.INFO)
        with running_bridge(config) as bridge:
            deadline = time.monotonic() + 30
            while not any("refuses connections" in r.getMessage() for r in caplog.records if r.name == "kcm.bridge"):
                assert time.monotonic() < deadline, "nothing reported within 30 s"
                time.sleep(0.1)
            time.sleep(3)   # several reconnect attempts: the outage is reported per backoff period, not per attempt
            noisy = [r.getMessage() for r in caplog.records
                     if r.name.startswith("kcm.bridge") and r.levelno == logging.WARNING]
            assert noisy == [], noisy
            # Errors: only the bridge's own report, once per backoff period (1, 2, 4 s...), never a line per attempt.
            errors = [(r.name, r.getMessage()) for r in caplog.records
                      if r.name.startswith("kcm.bridge") and r.levelno >= logging.ERROR]
            assert errors and all(name == "kcm.bridge" and message.startswith("cannot reach Kafka")
                                  for name, message in errors)
            assert len(errors) <= 4, errors
            assert not bridge.ready
            sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", port)))
            sandbox.start()
            try:
                deadline = time.monotonic() + 60
                while not bridge.ready:
                    assert time.monotonic() < deadline, "not ready within 60 s of Kafka starting"
                    time.sleep(0.2)
            finally:
                sandbox.stop()
        assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("backend", BACKENDS)
def test_brokers_advertising_an_address_out_of_reach_keep_it_not_ready_and_are_named(backend, misadvertised_broker,
                                                                                    collector, caplog, monkeypatch):
    """The bootstrap address answers metadata; consuming needs the brokers it names: never 'answers again'."""
    # A check can end before librdkafka has tried the advertised address (under load, once): then it only says
    # brokers are down, and the production backoff (1, 2, 4 … 30 s) left one more check inside the 30 s below.
    _check_kafka_every_second(monkeypatch)
    broker, unreachable = misadvertised_broker
    config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
        ("kafka", "bootstrap_servers"): broker.bootstrap, ("kafka", "client"): backend,
        ("kafka", "connect_timeout_s"): 2, ("metrics_port",): 0, ("metrics_host",): "127.0.0.1"})
    caplog.set_level(logging.INFO)
    with running_bridge(config) as bridge:
        _wait_until(lambda: any(unreachable in r.getMessage() for r in caplog.records), 30, "the report")
        time.sleep(4)   # more checks: each must find the brokers out of reach
        assert not bridge.ready
    lines = [r.getMessage() for r in caplog.records if r.name == "kcm.bridge"]
    assert not [line for line in lines if "answers again" in line], lines
    assert (f"Kafka at {broker.bootstrap} answers, but its brokers advertise {unreachable}, which this client could "
            "not reach") in "\n".join(lines)


class _Relay:
    """A loopback TCP relay on `port` to the port `upstream()` names: `cut` closes every connection through it and
    refuses new ones, `mend` relays again."""

    def __init__(self, port: int, upstream: Callable[[], int]) -> None:
        self.port, self._upstream = port, upstream
        self._server: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def mend(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))   # SO_REUSEADDR: beside reserved_port's socket
        with self._lock:
            self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            server, self._server = self._server, None
            open_sockets, self._open = self._open, []
        for sock in ([server] if server else []) + open_sockets:
            _close(sock)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                downstream, _ = server.accept()
                upstream = socket.create_connection(("127.0.0.1", self._upstream()))
            except OSError:
                if self._server is not server:
                    return
                continue
            with self._lock:
                if self._server is not server:   # cut meanwhile
                    _close(downstream), _close(upstream)
                    return
                self._open += [downstream, upstream]
            threading.Thread(target=self._pipe, args=(downstream, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, downstream), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        _close(source), _close(target)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)   # wakes a thread blocked in accept or recv on it
    except OSError:
        pass
    sock.close()


def _check_kafka_every_second(monkeypatch) -> None:
    """The bridge checks a failing Kafka every second at most, not up to 30 s apart (the production backoff)."""
    monkeypatch.setattr(bridge_module, "KafkaHealth", functools.partial(KafkaHealth, RetryPolicy(
        initial_backoff_s=0.5, max_backoff_s=1.0, multiplier=2.0, jitter=0.0)))


def test_kafka_python_stays_not_ready_while_the_group_coordinator_is_unreachable_though_bootstrap_answers(
        tmp_path, collector, caplog, monkeypatch):
    """The bootstrap address answering proves nothing about the broker that coordinates the group: the bridge
    stays not ready, without an 'answers again' line, until that broker answers too."""
    with reserved_port() as relay_port:   # connections refused while the relay is cut, and the port stays ours
        broker = EmbeddedBroker(advertised=f"127.0.0.1:{relay_port}", log_path=tmp_path / "tansu.log")
        relay = _Relay(relay_port, lambda: broker.port)
        relay.mend()
        broker.start()
        try:
            ensure_topic(KafkaSettings(broker.bootstrap), "coordinated")
            properties = tmp_path / "client.properties"
            properties.write_text("session.timeout.ms=3000\nheartbeat.interval.ms=500\n")
            config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
                ("kafka", "bootstrap_servers"): broker.bootstrap, ("kafka", "command_config"): str(properties),
                ("kafka", "topics"): ["coordinated"], ("kafka", "client"): "kafka-python",
                ("kafka", "connect_timeout_s"): 2})
            caplog.set_level(logging.INFO, logger="kcm.bridge")
            _check_kafka_every_second(monkeypatch)
            with running_bridge(config) as bridge:
                _wait_until(lambda: bridge.ready, 60, "ready")
                relay.cut()   # the leader and coordinator (the broker at its advertised address) gone
                _wait_until(lambda: not bridge.ready, 30, "not ready once the coordinator is gone")
                down_since = len(caplog.records)
                deadline = time.monotonic() + 4   # checks after 0.5, 1, 1 and 1 s: every one must fail
                while time.monotonic() < deadline:
                    assert not bridge.ready, "ready while the group coordinator cannot be reached"
                    time.sleep(0.05)
                said = [r.getMessage() for r in caplog.records[down_since:] if r.name == "kcm.bridge"]
                assert not [line for line in said if "answers again" in line], said
                assert any("group coordinator" in line for line in said), said

                relay.mend()
                _wait_until(lambda: bridge.ready, 60, "ready again once the coordinator answers")
                assert any("answers again" in r.getMessage() for r in caplog.records[down_since:])
        finally:
            relay.cut()
            broker.stop()
    assert not [r for r in caplog.records if r.exc_info]


def _wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s} s"
        time.sleep(0.1)


def _error_event(code: int, text: str):
    """A librdkafka error event, as the consumer's error callback receives it."""
    class Event:
        def code(self) -> int:
            return code

        def str(self) -> str:
            return text

        def fatal(self) -> bool:
            return False
    return Event()


def _serving_events(event, caplog):
    """A ConfluentConsumer whose librdkafka serves `event` once per consume, and no records."""
    from kcm_bridge.consumer import ConfluentConsumer
    from kcm_common.kafka import KafkaSettings

    class Serving:
        def consume(self, count, timeout):
            consumer._on_error(event)
            return []

    consumer = ConfluentConsumer(KafkaSettings("127.0.0.1:1"), {}, "g", ["t"], lambda _: None, lambda _: None)
    consumer._consumer.close()  # serves what librdkafka queued meanwhile (127.0.0.1:1 is down): forget it
    consumer._consumer = Serving()
    consumer._problem, consumer._new_problem, consumer._broker_failure = None, False, None
    caplog.set_level(logging.DEBUG, logger="kcm.bridge")
    return consumer


def test_one_broker_down_is_a_warning_at_most_once_a_minute_not_a_line_per_reconnect(caplog):
    import confluent_kafka

    consumer = _serving_events(_error_event(
        confluent_kafka.KafkaError._TRANSPORT,
        "127.0.0.1:9093/2: Connect to ipv4#127.0.0.1:9093 failed: Connection refused"), caplog)
    consumer.poll(0, 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "nothing answered yet: an outage"
    consumer._answered = True  # as after a successful check: Kafka answers, one broker does not
    for _ in range(5):
        consumer.poll(0, 1)

    (line,) = [r for r in caplog.records if r.name.startswith("kcm.bridge") and "cannot be reached" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "a broker cannot be reached (127.0.0.1:9093/2: Connect to" in line.getMessage()
    assert "wait until it is back" in line.getMessage()


def test_an_address_that_answers_but_not_as_kafka_is_a_warning_at_most_once_a_minute(caplog):
    """librdkafka reports each connection attempt to, say, an HTTP port as an error event: with the bridge's own
    paced 'does not answer as a Kafka broker' report beside it, that was a WARNING twice a second, for ever."""
    import confluent_kafka

    consumer = _serving_events(_error_event(
        confluent_kafka.KafkaError._BAD_MSG,
        "127.0.0.1:8080/bootstrap: Receive failed: Invalid response size 1213486160 (0..100000000): "
        "increase receive.message.max.bytes (after 0ms in state APIVERSION_QUERY)"), caplog)
    for _ in range(5):
        consumer.poll(0, 1)
    lines = [r for r in caplog.records if r.name.startswith("kcm.bridge") and r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "Invalid response size" in lines[0].getMessage()


def test_asked_watermarks_fall_back_to_the_fetched_ones_and_take_turns():
    """A partition without a leader, or a request that times out, leaves the last fetched watermark; the next round
    of requests starts where the last one ran out of time."""
    import confluent_kafka
    from kafka import TopicPartition

    from kcm_bridge.consumer import ConfluentConsumer, KafkaPythonConsumer

    asked = []

    class Librdkafka:
        def get_watermark_offsets(self, tp, timeout=None, cached=False):
            if cached:
                return (0, 10 + tp.partition)
            asked.append(tp.partition)
            time.sleep(0.3)  # a slow leader: only some partitions fit in the budget
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(confluent_kafka.KafkaError._TIMED_OUT))

    confluent = ConfluentConsumer.__new__(ConfluentConsumer)
    confluent._consumer, confluent._tp, confluent._exception = Librdkafka(), confluent_kafka.TopicPartition, \
        confluent_kafka.KafkaException
    confluent._ask_from = 0
    partitions = [("t", p) for p in range(4)]
    assert confluent.high_watermarks(partitions, ask_s=0.5) == {("t", p): 10 + p for p in range(4)}
    first = list(asked)
    asked.clear()
    confluent.high_watermarks(partitions, ask_s=0.5)
    assert asked and asked[0] not in first, (first, asked)

    class KafkaPython:
        def end_offsets(self, tps, timeout_ms=None):
            raise KeyError(tps[1])  # kafka-python 3.0.12 when a partition's leader is unknown

        def highwater(self, tp):
            return 20 + tp.partition

    legacy = KafkaPythonConsumer.__new__(KafkaPythonConsumer)
    legacy._consumer, legacy._tp = KafkaPython(), TopicPartition
    assert legacy.high_watermarks([("t", 0), ("t", 1)], ask_s=1.0) == {("t", 0): 20, ("t", 1): 21}


@pytest.mark.parametrize("refused", ["group", "topic"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kafka_acls_refusing_the_group_or_topic_keep_it_not_ready_naming_the_acl_until_granted(
        backend, refused, sandbox, tmp_path, collector, caplog, monkeypatch):
    """Credentials accepted, then READ on the group or topic refused (the usual KafkaUser mistake): /readyz said 200
    while nothing was consumed, with at most a WARNING a minute (nothing at all for a topic with kafka-python)."""
    from kafka.protocol.metadata import MetadataResponse
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

    from kcm_sandbox import gateway
    from test_bridge_pipeline import _produce, _push

    group, topic, acl = "acl-group", "kafka-client-metrics", [True]   # acl[0]: still refusing
    route = gateway._Connection._route

    async def refusing(self, frame_bytes, header):   # what a broker with ACLs answers a principal without READ
        if acl[0] and refused == "group" and header.api_key == 10:
            version = header.api_version
            if version >= 4:
                answer = FindCoordinatorResponse[version](throttle_time_ms=0, coordinators=[
                    FindCoordinatorResponse.Coordinator(key=group, node_id=-1, host="", port=-1, error_code=30,
                                                        error_message="Group authorization failed")])
            else:
                answer = FindCoordinatorResponse[version](throttle_time_ms=0, error_code=30, node_id=-1, host="",
                                                          port=-1, error_message="Group authorization failed")
            return gateway._done(gateway._encode(answer, header))
        answer = await route(self, frame_bytes, header)
        if not (acl[0] and refused == "topic" and header.api_key == 3 and answer is not None):
            return answer

        async def without_the_topic():
            metadata = MetadataResponse.decode(await answer, version=header.api_version, header=True)
            for described in metadata.topics:
                if described.name == topic:
                    described.error_code, described.partitions = 29, []
            metadata.with_header(correlation_id=metadata.header.correlation_id)
            return bytes(metadata.encode(header=True))
        return without_the_topic()

    _produce(sandbox.bootstrap, topic, [_push("app", "00000000-0000-0000-0000-000000000001")])
    monkeypatch.setattr(gateway._Connection, "_route", refusing)
    _check_kafka_every_second(monkeypatch)   # the grant is seen within a second or so
    properties = tmp_path / "client.properties"
    properties.write_text("session.timeout.ms=3000\nheartbeat.interval.ms=500\n")
    config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
        ("kafka", "bootstrap_servers"): sandbox.bootstrap, ("kafka", "command_config"): str(properties),
        ("kafka", "group_id"): group, ("kafka", "client"): backend, ("kafka", "connect_timeout_s"): 2,
        ("metrics_port",): 0, ("metrics_host",): "127.0.0.1"})
    caplog.set_level(logging.INFO)
    with running_bridge(config) as bridge:
        grant = f"READ on group {group}" if refused == "group" else f"READ on topic(s) {topic}"
        _wait_until(lambda: any(r.levelno == logging.ERROR and grant in r.getMessage() for r in caplog.records
                                if r.name == "kcm.bridge"), 30, "an error naming the ACL to grant")
        # Through several checks: a check that passes would make it ready between refusals.
        answers = _readyz_answers(bridge.metrics_port)
        assert set(answers) == {503} and collector.exports == [], answers

        acl[0] = False   # granted
        _wait_until(lambda: bridge.ready and collector.exports, 60, "ready and exporting once granted")


class _Tarpit:
    """A loopback server that accepts connections and never answers: a hung Kafka. `reached` is set by the first
    connection."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.reached = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            self._held.append(connection)
            self.reached.set()

    def close(self) -> None:
        for sock in [self._server, *self._held]:
            _close(sock)


@pytest.fixture
def tarpit():
    server = _Tarpit()
    yield server
    server.close()


def _stopped_after(delay_s: float) -> threading.Event:
    stop = threading.Event()
    threading.Timer(delay_s, stop.set).start()
    return stop


def test_a_check_of_a_kafka_that_never_answers_ends_soon_after_it_is_stopped(tarpit):
    """The probe waits connect_timeout_s for a hung Kafka, unless the process shuts down meanwhile."""
    from kcm_common.kafka import STOPPED_CHECKING, KafkaUnavailableError, check_reachable

    began = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=STOPPED_CHECKING):
        check_reachable(KafkaSettings(tarpit.address), 30, _stopped_after(0.5))
    assert time.monotonic() - began < 2
    # Not stopped, it still waits out its timeout, and says what it found.
    began = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="does not answer as a Kafka broker"):
        check_reachable(KafkaSettings(tarpit.address), 1.0, threading.Event())
    assert 0.9 < time.monotonic() - began < 2.5


def test_the_confluent_consumer_check_of_a_kafka_that_never_answers_ends_soon_after_it_is_stopped(tarpit):
    from kcm_bridge.consumer import ConfluentConsumer
    from kcm_common.kafka import STOPPED_CHECKING, KafkaUnavailableError

    consumer = ConfluentConsumer(KafkaSettings(tarpit.address), {}, "g", ["t"], lambda _: None, lambda _: None)
    try:
        began = time.monotonic()
        with pytest.raises(KafkaUnavailableError, match=STOPPED_CHECKING):
            consumer.check(30, _stopped_after(2.5))   # past a slice: asking again must not end it either
        assert 2.4 < time.monotonic() - began < 4.5
        began = time.monotonic()
        with pytest.raises(KafkaUnavailableError) as err:   # not stopped: its own timeout, as without a stop event
            consumer.check(2.5, threading.Event())
        assert 2.4 < time.monotonic() - began < 4.5
        assert STOPPED_CHECKING not in str(err.value)
    finally:
        consumer.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sigterm_while_checking_a_hung_kafka_stops_the_bridge_within_seconds(backend, tarpit, collector, caplog):
    """Stopping must not wait for a check of a Kafka that never answers (connect_timeout_s may be a minute, past the
    pod's grace period); nor is a check cut short reported as Kafka's failure."""
    config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
        ("kafka", "bootstrap_servers"): tarpit.address, ("kafka", "client"): backend,
        ("kafka", "connect_timeout_s"): 60})
    caplog.set_level(logging.INFO)
    bridge = bridge_module.Bridge(config)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(bridge.run()), daemon=True)
    thread.start()
    assert tarpit.reached.wait(30), "the bridge never asked Kafka"
    time.sleep(0.5)
    began = time.monotonic()
    bridge.stop()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the bridge did not stop within 15 s of being asked while checking Kafka"
    assert result == [0]
    assert time.monotonic() - began < 5
    said = [r.getMessage() for r in caplog.records if r.name.startswith("kcm.bridge") and r.levelno >= logging.ERROR]
    assert said == [], said


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_topic_that_does_not_exist_keeps_it_not_ready_naming_the_topic_each_period_until_created(
        backend, broker, tmp_path, collector, caplog, monkeypatch):
    """A misspelt --topic: /readyz said 200 while nothing was consumed, after a single WARNING from librdkafka."""
    from test_bridge_pipeline import _produce, _push

    topic = "kafka-client-metrcs"   # misspelt, and not created (yet)
    _check_kafka_every_second(monkeypatch)
    properties = tmp_path / "client.properties"
    properties.write_text("session.timeout.ms=3000\nheartbeat.interval.ms=500\n")
    config = bridge_config.load(env={}, endpoints=[collector.endpoint], insecure=True, overrides={
        ("kafka", "bootstrap_servers"): broker.bootstrap, ("kafka", "command_config"): str(properties),
        ("kafka", "topics"): [topic], ("kafka", "client"): backend, ("kafka", "connect_timeout_s"): 2,
        ("metrics_port",): 0, ("metrics_host",): "127.0.0.1"})
    caplog.set_level(logging.INFO)

    def reports() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "kcm.bridge" and r.levelno >= logging.WARNING
                and f"topic(s) {topic} do not exist" in r.getMessage()]

    with running_bridge(config) as bridge:
        _wait_until(lambda: reports(), 30, "a report naming the missing topic")
        answers = _readyz_answers(bridge.metrics_port)   # through several checks: each must find it missing
        assert set(answers) == {503}, answers
        assert len(reports()) >= 2, reports()   # said again each backoff period, not once

        ensure_topic(KafkaSettings(broker.bootstrap), topic, 1)
        _produce(broker.bootstrap, topic, [_push("app", "00000000-0000-0000-0000-000000000001")])
        _wait_until(lambda: bridge.ready and collector.exports, 60, "ready and exporting once the topic exists")
    assert not [r for r in caplog.records if r.exc_info]
