"""The real receiver plugin inside the sandbox (`--receiver java`), and real Java clients beside librdkafka.

Every push the gateway accepts goes to kcm's Java plugin through the Kafka interface a broker uses; the plugin's own
KafkaProducer writes the contract v1 record back through the sandbox.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from java_clients import JavaClient
from kcm_cli.main import build_parser
from kcm_cli.sandbox import options_from
from kcm_common import contract
from kcm_common.errors import UserError
from kcm_common.contract import DecodedRecord, compress
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.java_receiver import JavaReceiver
from kcm_sandbox.telemetry import ClientIdentity, PushResult
from test_receiver_parity import _read
from test_sandbox_clients import _subscribe, running_producer
from test_sandbox_protocol import ZSTD, KafkaConnection, _metrics_of_size, announce_software, new_client, push

INTERVAL_MS = 500
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass
class Written:
    """One record of the metrics topic: raw as written, and decoded with the shared codec."""

    key: str
    value: bytes
    headers: dict[str, str]
    decoded: DecodedRecord


class TopicRecords:
    """Everything written to a topic from its start, read with a deadline."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100)
        partitions = [TopicPartition(topic, p) for p in sorted(self._consumer.partitions_for_topic(topic))]
        self._consumer.assign(partitions)
        self._consumer.seek_to_beginning(*partitions)
        self.records: list[Written] = []

    def wait_for(self, predicate: Callable[[list[Written]], bool], timeout: float = 45.0) -> list[Written]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for batch in self._consumer.poll(timeout_ms=200).values():
                for record in batch:
                    headers = {name: value.decode() for name, value in record.headers}
                    self.records.append(Written(record.key.decode(), record.value, headers,
                                                contract.decode(record.value, record.headers)))
            if predicate(self.records):
                return self.records
        raise AssertionError(f"not within {timeout}s; got {[(r.headers.get('client_id'), r.headers.get('terminating')) for r in self.records]}")

    def of(self, client_id: str) -> list[Written]:
        return [record for record in self.records if record.headers.get("client_id") == client_id]

    def close(self) -> None:
        self._consumer.close()


@pytest.fixture
def topic_records() -> Iterator[Callable[..., TopicRecords]]:
    opened: list[TopicRecords] = []

    def open_(sandbox, topic: str | None = None) -> TopicRecords:
        reader = TopicRecords(sandbox.bootstrap, topic or sandbox.options.topic)
        opened.append(reader)
        return reader

    yield open_
    for reader in opened:
        reader.close()


def _broker_identity(bootstrap: str) -> tuple[str, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return str(cluster["brokers"][0]["broker_id"]), cluster["cluster_id"]


def _just_after_a_push(caplog, client_id: str, timeout: float = 30.0) -> None:
    """Return as the gateway accepts the next push of `client_id`."""
    def accepted() -> int:
        return sum(f"client_id={client_id} " in m and "push accepted" in m for m in caplog.messages)

    before, deadline = accepted(), time.monotonic() + timeout
    while accepted() == before:
        assert time.monotonic() < deadline, f"no push of {client_id} within {timeout}s"
        time.sleep(0.005)


def _gauges(record: Written) -> list[float]:
    return [point.as_double for rm in record.decoded.metrics.resource_metrics for sm in rm.scope_metrics
            for metric in sm.metrics for point in metric.gauge.data_points]


@pytest.mark.parametrize("api", ["3.8", "4.2"])
def test_the_java_plugin_writes_every_push_of_librdkafka_and_java_clients_in_contract_v1(
        sandbox_factory, topic_records, caplog, api):
    caplog.set_level("INFO", logger="kcm.sandbox")
    sandbox = sandbox_factory(receiver="java", receiver_api=api)
    _subscribe(sandbox, "everything", metrics="*", **{"interval.ms": str(INTERVAL_MS)})
    ensure_topic(KafkaSettings(sandbox.bootstrap), "traffic", partitions=1)
    topic = topic_records(sandbox)
    with JavaClient(sandbox.bootstrap, client_id="java-orders", role="producer", topic="traffic"), \
            running_producer(sandbox, "rdkafka-orders"):
        topic.wait_for(lambda _: topic.of("rdkafka-orders") and topic.of("java-orders"))
        # librdkafka's last push on close says it is the last one, but only when no push is in flight (best effort,
        # rd_kafka_telemetry_schedule_termination): close it just after one was answered, pushes 500 ms apart.
        _just_after_a_push(caplog, "rdkafka-orders")
    topic.wait_for(lambda _: any(r.headers["terminating"] == "true" for r in topic.of("rdkafka-orders")))
    accepted = {client: sum(f"client_id={client} " in m and "push accepted" in m for m in caplog.messages)
                for client in ("rdkafka-orders", "java-orders")}
    topic.wait_for(lambda _: all(len(topic.of(client)) >= count for client, count in accepted.items()))
    assert {client: len(topic.of(client)) for client in accepted} == accepted

    broker_id, cluster_id = _broker_identity(sandbox.bootstrap)
    software = {"rdkafka-orders": "confluent-kafka-python", "java-orders": "apache-kafka-java"}
    for record in topic.records:
        headers = record.headers
        assert record.key == headers["client_instance_id"] == str(uuid.UUID(record.key))
        assert headers["client_software_name"] == software[headers["client_id"]]
        assert headers["client_software_version"]
        assert headers["client_source_address"] == "127.0.0.1"
        assert int(headers["client_source_port"]) > 0
        assert (headers["principal"], headers["listener_name"], headers["security_protocol"]) == (
            "User:ANONYMOUS", "PLAINTEXT", "PLAINTEXT")
        assert (headers["broker_id"], headers["cluster_id"]) == (broker_id, cluster_id)
        assert (headers["content-type"], headers["content-encoding"]) == ("application/x-protobuf", "none")
        # The plugin API never gives the subscription id; only the 4.2 API gives the push interval.
        assert "subscription_id" not in headers
        assert headers.get("push_interval_ms") == (str(INTERVAL_MS) if api == "4.2" else None)
        assert record.decoded.attributes["client_id"] == headers["client_id"]
    java_names = {metric.name for r in topic.of("java-orders") for rm in r.decoded.metrics.resource_metrics
                  for sm in rm.scope_metrics for metric in sm.metrics}
    assert "org.apache.kafka.producer.record.send.total" in java_names
    assert len(java_names) > 50


def test_java_clients_are_matched_by_their_software_name_and_librdkafka_is_not(sandbox, topic_records):
    _subscribe(sandbox, "java-only", metrics="org.apache.kafka.", match="client_software_name=apache-kafka-java",
               **{"interval.ms": str(INTERVAL_MS)})
    ensure_topic(KafkaSettings(sandbox.bootstrap), "inventory", partitions=1)
    topic = topic_records(sandbox)
    with running_producer(sandbox, "rdkafka-inventory"), \
            JavaClient(sandbox.bootstrap, client_id="java-inventory-consumer", role="consumer", topic="inventory"):
        records = topic.wait_for(lambda _: len(topic.of("java-inventory-consumer")) >= 2)
    assert {r.headers["client_software_name"] for r in records} == {"apache-kafka-java"}
    assert topic.of("rdkafka-inventory") == []
    consumer_names = {metric.name for r in records for rm in r.decoded.metrics.resource_metrics
                      for sm in rm.scope_metrics for metric in sm.metrics}
    assert any(name.startswith("org.apache.kafka.consumer.") for name in consumer_names)


@pytest.mark.parametrize("codec", ["zstd", "lz4", "gzip", "snappy"])
def test_java_client_pushes_with_each_codec_are_decoded_exactly(sandbox_factory, topic_records, caplog, codec):
    sandbox = sandbox_factory(compression=[CODEC_IDS[codec]])
    _subscribe(sandbox, "everything", metrics="*", **{"interval.ms": str(INTERVAL_MS)})
    ensure_topic(KafkaSettings(sandbox.bootstrap), "traffic", partitions=1)
    topic = topic_records(sandbox)
    caplog.set_level("INFO", logger="kcm.sandbox")
    with JavaClient(sandbox.bootstrap, client_id=f"java-{codec}", role="producer", topic="traffic"):
        records = topic.wait_for(lambda _: topic.of(f"java-{codec}"))
    accepted = [m for m in caplog.messages if f"client_id=java-{codec}" in m and "push accepted" in m]
    assert accepted and all(f"compression {codec}" in message for message in accepted), accepted
    record = records[0]
    # Decoding loses nothing: the decoded metrics serialise back to the very bytes the client sent.
    assert record.decoded.metrics.SerializeToString() == record.value
    assert any(math.isnan(value) for value in _gauges(record)), "Java sends NaN for averages over nothing"
    assert len(record.value) > 2000


@pytest.mark.parametrize("receiver", ["python", "java"])
def test_a_java_client_whose_subscription_selects_none_of_its_metrics_is_accepted_and_writes_nothing(
        sandbox_factory, topic_records, caplog, receiver):
    # Such a client pushes an empty MetricsData every interval (its zstd frame is 9 bytes): a broker accepts it and
    # hands the plugin an empty buffer, which kcm's receivers skip (readers would count an empty record undecodable).
    caplog.set_level("INFO", logger="kcm.sandbox")
    sandbox = sandbox_factory(receiver=receiver)
    handed: list[int] = []
    receive = sandbox.gateway.receiver

    def counting(instance_id, identity, push):
        handed.append(len(push.payload))
        return receive(instance_id, identity, push)

    sandbox.gateway.receiver = counting
    _subscribe(sandbox, "nothing-it-has", metrics="org.apache.kafka.no.such.metric", match="client_id=java-silent",
               **{"interval.ms": str(INTERVAL_MS)})
    _subscribe(sandbox, "marker", metrics="*", match="client_id=rdkafka-marker", **{"interval.ms": str(INTERVAL_MS)})
    ensure_topic(KafkaSettings(sandbox.bootstrap), "traffic", partitions=1)
    topic = topic_records(sandbox)

    def accepted(client_id: str) -> list[str]:
        return [m for m in caplog.messages if f"client_id={client_id} " in m and "push accepted" in m]

    with JavaClient(sandbox.bootstrap, client_id="java-silent", role="producer", topic="traffic"):
        deadline = time.monotonic() + 45
        while len(accepted("java-silent")) < 3:
            assert time.monotonic() < deadline, caplog.messages[-20:]
            time.sleep(0.05)
    refused = [m for m in caplog.messages if "client_id=java-silent " in m and "push refused" in m]
    assert refused == [] and all("(0 bytes," in m for m in accepted("java-silent")), accepted("java-silent")
    assert handed and set(handed) == {0}, handed   # handed on, empty, as a broker hands its plugin
    # A client with metrics, pushing after them: its record comes after any the empty pushes would have written
    # (the plugin writes in the order it is handed pushes).
    with running_producer(sandbox, "rdkafka-marker"):
        topic.wait_for(lambda _: topic.of("rdkafka-marker"))
    assert {record.headers["client_id"] for record in topic.records} == {"rdkafka-marker"}
    assert all(record.value for record in topic.records)


def test_a_push_of_a_large_telemetry_max_bytes_is_written_whole_by_the_java_receiver(sandbox_factory):
    # 40 MiB: more than the plugin's default queue (16 MiB) and its producer's default buffer (32 MiB) hold.
    sandbox = sandbox_factory(receiver="java", telemetry_max_bytes=40 << 20)
    metrics = _metrics_of_size(40 << 20)
    with KafkaConnection(sandbox.bootstrap, client_id="c" * 32767) as connection:  # the longest client id
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id, payload=compress(metrics, "zstd"), compression=ZSTD) == 0

    # Read raw: kcm's readers refuse payloads above 16 MiB unless told otherwise.
    (record,) = _read(sandbox.bootstrap, sandbox.options.topic, 1)
    assert record[:2] == (str(instance_id).encode(), metrics)
    assert sandbox.problem() is None


def test_a_push_of_telemetry_max_bytes_from_a_client_with_the_longest_identity_is_written_whole_by_the_java_receiver(
        sandbox_factory):
    # The record's headers carry the client id and software name and version, up to 32 KiB each: the plugin's
    # producer refused the record (larger than its buffer.memory) when the host left 64 KiB for them.
    sandbox = sandbox_factory(receiver="java", telemetry_max_bytes=32 << 20)
    metrics = _metrics_of_size(32 << 20)
    with KafkaConnection(sandbox.bootstrap, client_id="c" * 32767) as connection:
        announce_software(connection, "n" * 32000, "v" * 32000)
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id, payload=compress(metrics, "zstd"), compression=ZSTD) == 0

    (record,) = _read(sandbox.bootstrap, sandbox.options.topic, 1)
    assert record[:2] == (str(instance_id).encode(), metrics)
    assert record[2]["client_software_version"] == "v" * 32000
    assert sandbox.problem() is None


def test_a_push_too_large_for_the_jvm_fails_alone_and_the_java_receiver_serves_on(sandbox):
    java = JavaReceiver(sandbox.bootstrap, sandbox.options.topic, 1, "c")  # sized for 1 MiB pushes: a 128 MiB heap
    identity = ClientIdentity("huge", "apache-kafka-java", "4.3.0", "127.0.0.1", 40000)
    try:
        for size, fails in [(160 << 20, True), (1000, False)]:
            handed = PushResult(error_code=0, throttle_time_ms=0, payload=bytes(size), subscription_id=1,
                                push_interval_ms=1000, terminating=False)
            if fails:
                with pytest.raises(RuntimeError, match="OutOfMemoryError"):
                    java(uuid.uuid4(), identity, handed)
            else:
                java(uuid.uuid4(), identity, handed)
        assert java.problem() is None
    finally:
        java.close()
    (record,) = _read(sandbox.bootstrap, sandbox.options.topic, 1)
    assert record[1] == bytes(1000)


def test_a_reply_not_read_in_time_stops_the_java_receiver_rather_than_answer_the_next_push_with_it(
        sandbox, monkeypatch):
    """A reply later than its timeout stays in the pipe: read for the next push, every push after would get the one
    before's answer (a written push refused INVALID_RECORD, which stops a Java client's telemetry until it restarts).
    The receiver says it is out of step instead, and the sandbox stops on it as when the JVM dies."""
    from kcm_sandbox import java_receiver

    java = JavaReceiver(sandbox.bootstrap, sandbox.options.topic, 1, "c")
    identity = ClientIdentity("late", "apache-kafka-java", "4.3.0", "127.0.0.1", 40000)
    handed = PushResult(error_code=0, throttle_time_ms=0, payload=b"\n\x00", subscription_id=1,
                        push_interval_ms=1000, terminating=False)
    try:
        monkeypatch.setattr(java_receiver, "_REPLY_TIMEOUT_S", 0.0)   # the JVM stalls past the timeout
        with pytest.raises(RuntimeError, match="no answer from the Java receiver within 0 s"):
            java(uuid.uuid4(), identity, handed)
        monkeypatch.setattr(java_receiver, "_REPLY_TIMEOUT_S", 10.0)
        time.sleep(0.5)   # the late reply is in the pipe now
        with pytest.raises(RuntimeError, match="out of step with the pushes"):
            java(uuid.uuid4(), identity, handed)
        assert "out of step" in (java.problem() or "")
    finally:
        java.close()


def test_the_plugins_warnings_reach_the_sandbox_log_at_their_level_and_its_producers_config_never_does(
        sandbox, caplog):
    """What the plugin logs into a broker's log is logged by kcm.sandbox.java_receiver at the same level (before, the
    host had no SLF4J provider and every line was lost); Kafka's own producer logs only WARN and above, even at DEBUG,
    so its config dump at INFO (credentials among it) never reaches the log."""
    caplog.set_level("DEBUG", logger="kcm.sandbox")   # the host then logs at DEBUG too: Kafka's floor must hold
    secret = "S3CRET-of-the-plugin-producer"
    java = JavaReceiver(sandbox.bootstrap, sandbox.options.topic, 1, "c", extra_config={
        "kcm.receiver.queue.max.bytes": "4096",
        "kcm.receiver.producer.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{secret}";'})
    identity = ClientIdentity("loud", "apache-kafka-java", "4.3.0", "127.0.0.1", 40000)
    try:
        for size in (5000, 1000):   # larger than the whole queue: dropped and warned of; then one written
            java(uuid.uuid4(), identity, PushResult(error_code=0, throttle_time_ms=0, payload=bytes(size),
                                                    subscription_id=1, push_interval_ms=1000, terminating=False))
        (record,) = _read(sandbox.bootstrap, sandbox.options.topic, 1)   # the producer ran
        assert record[1] == bytes(1000)
    finally:
        java.close()   # the host has written every line it logs by the time it exits
    ours = [r for r in caplog.records if r.name == "kcm.sandbox.java_receiver"]
    dropped = [r for r in ours if "push dropped: larger than the whole queue, kcm.receiver.queue.max.bytes" in
               r.getMessage()]
    assert [(r.levelname, r.getMessage().split(": ")[:2]) for r in dropped] == [
        ("WARNING", ["java receiver", "dev.kcm.receiver.TopicWriter"])], [r.getMessage() for r in ours]
    assert any(r.levelname == "INFO" and "kcm receiver: writing client pushes to topic" in r.getMessage()
               for r in ours)
    kafka = [r for r in ours if r.getMessage().startswith("java receiver: org.apache.kafka.")]
    assert all(r.levelno >= logging.WARNING for r in kafka), [r.getMessage() for r in kafka]
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert secret not in everything and "ProducerConfig values" not in everything
    assert "sasl.jaas.config = " not in everything


def test_bad_plugin_config_fails_start_up_with_the_property_named(sandbox):
    with pytest.raises(UserError, match=r"kcm\.receiver\.queue\.max\.bytes"):
        JavaReceiver(sandbox.bootstrap, "kafka-client-metrics", 1, "c", extra_config={
            "kcm.receiver.queue.max.bytes": "plenty"})


def test_the_plugin_config_reaches_the_jvm_in_its_environment_never_on_its_command_line(sandbox):
    # `ps` shows every user a command line: the producer's credentials must not be there.
    secret = "S3CRET-not-on-the-command-line"
    java = JavaReceiver(sandbox.bootstrap, "kafka-client-metrics", 1, "c",
                        extra_config={"kcm.receiver.producer.client.id": secret})
    try:
        pid = java._process.pid
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        environment = Path(f"/proc/{pid}/environ").read_bytes()
    finally:
        java.close()
    assert b"kcm.receiver.topic" not in command_line and secret.encode() not in command_line
    assert b"KCM_JAVA_CONFIG=" in environment and secret.encode() in environment


def test_the_cli_picks_the_receiver_and_its_api():
    args = build_parser().parse_args(["sandbox", "--listen", "127.0.0.1:0", "--receiver", "java",
                                      "--receiver-api", "3.8"])
    options = options_from(args)
    assert (options.receiver, options.receiver_api) == ("java", "3.8")
    assert options_from(build_parser().parse_args(["sandbox", "--listen", "127.0.0.1:0"])).receiver == "python"


def test_kcm_sandbox_runs_with_the_java_receiver_and_stops_cleanly_on_sigint():
    process = subprocess.Popen([sys.executable, "-m", "kcm_cli.main", "sandbox", "--listen", "127.0.0.1:0",
                                "--receiver", "java"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = process.stdout.readline()
        assert "kcm sandbox: bootstrap 127.0.0.1:" in banner, process.stderr.read() if not banner else banner
        bootstrap = banner.split("bootstrap ")[1].split()[0]
        _subscribe(SimpleNamespace(bootstrap=bootstrap), "all", metrics="*", **{"interval.ms": "500"})
        reader = TopicRecords(bootstrap, "kafka-client-metrics")
        try:
            with JavaClient(bootstrap, client_id="cli-java", role="producer", topic="traffic"):
                reader.wait_for(lambda _: reader.of("cli-java"))
        finally:
            reader.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_without_java_the_java_receiver_is_refused_in_one_line():
    env = {**os.environ, "PATH": "/nonexistent"}
    done = subprocess.run([sys.executable, "-m", "kcm_cli.main", "sandbox", "--listen", "127.0.0.1:0",
                           "--receiver", "java"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2
    assert "java" in done.stderr and "--receiver python" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
