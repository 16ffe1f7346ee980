"""Real librdkafka clients (confluent-kafka) through the sandbox: normal traffic, and the telemetry they push.

Subscriptions are set with kafka-python's admin client, as an operator would, before or while clients run.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import confluent_kafka
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from kcm_common import contract
from kcm_common.contract import DecodedRecord
from kcm_common.kafka import KafkaSettings, ensure_topic

INTERVAL_MS = 500


def _subscribe(sandbox, name: str, **configs: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
    try:
        result = admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, name, configs=configs)],
                                     raise_on_unknown=False)
    finally:
        admin.close()
    assert "Error" not in repr(result), result


def _unsubscribe(sandbox, name: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, name,
                                            configs={key: ("DELETE", None) for key in ("metrics", "interval.ms", "match")})],
                            raise_on_unknown=False)
    finally:
        admin.close()


class MetricsTopic:
    """Reads the sandbox's metrics topic from the start, keeping every decoded push."""

    def __init__(self, sandbox) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, fetch_max_wait_ms=100)
        partitions = [TopicPartition(sandbox.options.topic, p)
                      for p in sorted(self._consumer.partitions_for_topic(sandbox.options.topic))]
        self._consumer.assign(partitions)
        self._consumer.seek_to_beginning(*partitions)
        self.pushes: list[tuple[float, str, DecodedRecord]] = []  # (the record's timestamp in s, key, record)

    def poll(self) -> None:
        for records in self._consumer.poll(timeout_ms=200).values():
            for record in records:
                self.pushes.append((record.timestamp / 1000, record.key.decode(), contract.decode(record.value, record.headers)))

    def wait_for(self, predicate: Callable[[list[DecodedRecord]], bool], timeout: float) -> list[DecodedRecord]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if predicate(self.records()):
                return self.records()
        raise AssertionError(f"no such pushes within {timeout}s; got {len(self.pushes)}: "
                             f"{[r.attributes.get('client_id') for r in self.records()]}")

    def records(self, client_id: str | None = None) -> list[DecodedRecord]:
        return [r for _, _, r in self.pushes if client_id is None or r.attributes.get("client_id") == client_id]

    def close(self) -> None:
        self._consumer.close()


def _wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(0.05)


def metric_names(record: DecodedRecord) -> set[str]:
    return {m.name for rm in record.metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def metrics_topic(sandbox) -> Iterator[MetricsTopic]:
    reader = MetricsTopic(sandbox)
    yield reader
    reader.close()


@contextmanager
def running_producer(sandbox, client_id: str, **config: str) -> Iterator[confluent_kafka.Producer]:
    """A librdkafka producer that keeps producing (so it has live metrics) on a background poll loop."""
    producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "client.id": client_id,
                                         "linger.ms": 5, **config})
    stop = False

    def pump() -> None:
        while not stop:
            producer.produce("traffic", value=b"payload")
            producer.poll(0.05)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield producer
    finally:
        stop = True
        thread.join(timeout=5)
        producer.flush(5)


def test_producer_and_consumer_work_through_the_sandbox_and_push_telemetry(sandbox, metrics_topic):
    _subscribe(sandbox, "everything", metrics="*", **{"interval.ms": str(INTERVAL_MS)})
    ensure_topic(KafkaSettings(sandbox.bootstrap), "orders", partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "client.id": "orders-producer"})
    for i in range(20):
        producer.produce("orders", key=str(i).encode(), value=f"order-{i}".encode())
    assert producer.flush(10) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": sandbox.bootstrap, "client.id": "orders-consumer",
                                         "group.id": "orders-audit", "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition("orders", 0, confluent_kafka.OFFSET_BEGINNING)])
        values, deadline = [], time.monotonic() + 20
        while len(values) < 20 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert values == [f"order-{i}".encode() for i in range(20)]

        records = metrics_topic.wait_for(
            lambda rs: any(r.attributes.get("client_id") == "orders-producer" for r in rs)
            and any(r.attributes.get("client_id") == "orders-consumer" for r in rs), timeout=30)
    finally:
        consumer.close()
        del producer

    producer_push = next(r for r in records if r.attributes["client_id"] == "orders-producer")
    consumer_push = next(r for r in records if r.attributes["client_id"] == "orders-consumer")
    assert any(name.startswith("org.apache.kafka.producer.") for name in metric_names(producer_push))
    assert any(name.startswith("org.apache.kafka.consumer.") for name in metric_names(consumer_push))
    # confluent-kafka-python names itself; the librdkafka version is part of the software version.
    assert producer_push.attributes["client_software_name"] == "confluent-kafka-python"
    assert re.search(r"rdkafka-\d+\.\d+\.\d+", producer_push.attributes["client_software_version"])
    assert producer_push.attributes["client_source_address"] == "127.0.0.1"
    assert producer_push.attributes["push_interval_ms"] == str(INTERVAL_MS)
    assert producer_push.attributes["terminating"] in ("true", "false")
    instance_keys = {key for _, key, r in metrics_topic.pushes if r.attributes["client_id"] == "orders-producer"}
    assert instance_keys == {producer_push.attributes["client_instance_id"]}


def test_fire_and_forget_produce_gets_no_answer_and_later_requests_still_get_theirs(sandbox):
    # acks=0 Produce requests have no response: the gateway must not wait for one, or every later answer on
    # that connection would be handed to the wrong request.
    ensure_topic(KafkaSettings(sandbox.bootstrap), "fire-and-forget", partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "acks": 0, "linger.ms": 0})
    for i in range(50):
        producer.produce("fire-and-forget", value=f"m{i}".encode())
        producer.poll(0)
    assert producer.flush(10) == 0
    assert "fire-and-forget" in producer.list_topics(timeout=10).topics
    del producer

    consumer = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, consumer_timeout_ms=5000)
    consumer.assign([TopicPartition("fire-and-forget", 0)])
    consumer.seek_to_beginning()
    values = [record.value for record in consumer]
    consumer.close()
    assert values == [f"m{i}".encode() for i in range(50)]


def test_metric_prefixes_limit_what_clients_push(sandbox, metrics_topic):
    prefix = "org.apache.kafka.producer.node.request.latency."
    _subscribe(sandbox, "latency-only", metrics=prefix, **{"interval.ms": str(INTERVAL_MS)})

    with running_producer(sandbox, "latency-producer"):
        records = metrics_topic.wait_for(lambda rs: len(rs) >= 2, timeout=30)

    names = set().union(*(metric_names(r) for r in records))
    assert names, "pushes carried no metrics"
    assert all(name.startswith(prefix) for name in names), names


def test_match_selectors_pick_some_clients_and_not_others(sandbox, metrics_topic):
    _subscribe(sandbox, "payments-only", metrics="*", match="client_id=payments-.*",
               **{"interval.ms": str(INTERVAL_MS)})

    with running_producer(sandbox, "payments-1"), running_producer(sandbox, "orders-1"):
        metrics_topic.wait_for(lambda rs: len([r for r in rs if r.attributes["client_id"] == "payments-1"]) >= 3,
                               timeout=30)

    assert metrics_topic.records("orders-1") == []


def test_software_name_selector_matches_what_the_client_reports(sandbox, metrics_topic):
    _subscribe(sandbox, "rdkafka", metrics="*", match="client_software_name=librdkafka",
               **{"interval.ms": str(INTERVAL_MS)})

    with running_producer(sandbox, "plain-python"), running_producer(
            sandbox, "declares-librdkafka", **{"client.software.name": "librdkafka"}):
        metrics_topic.wait_for(lambda rs: len(rs) >= 2, timeout=30)

    assert {r.attributes["client_id"] for r in metrics_topic.records()} == {"declares-librdkafka"}
    assert metrics_topic.records()[0].attributes["client_software_name"] == "librdkafka"


def test_pushes_arrive_at_roughly_the_subscribed_interval(sandbox, metrics_topic):
    _subscribe(sandbox, "every-second", metrics="*", **{"interval.ms": "1000"})

    with running_producer(sandbox, "steady"):
        metrics_topic.wait_for(lambda rs: len(rs) >= 6, timeout=60)

    times = [t for t, _, r in metrics_topic.pushes]
    gaps = sorted(b - a for a, b in zip(times[1:], times[2:]))  # the first push may come early after the Get
    median = gaps[len(gaps) // 2]
    # Early pushes would be refused as too soon; a loaded machine may delay them, but not by whole intervals.
    assert 0.7 <= median <= 3.0, gaps


def test_changing_and_deleting_a_subscription_changes_and_stops_pushes(sandbox, metrics_topic, caplog):
    caplog.set_level(logging.INFO, logger="kcm.sandbox")
    _subscribe(sandbox, "tuning", metrics="org.apache.kafka.producer.node.", **{"interval.ms": str(INTERVAL_MS)})

    with running_producer(sandbox, "tuned"):
        metrics_topic.wait_for(lambda rs: len(rs) >= 2, timeout=30)
        _subscribe(sandbox, "tuning", metrics="org.apache.kafka.producer.produce.",
                   **{"interval.ms": str(INTERVAL_MS)})
        records = metrics_topic.wait_for(
            lambda rs: any(all(n.startswith("org.apache.kafka.producer.produce.") for n in metric_names(r))
                           and metric_names(r) for r in rs), timeout=30)
        old_ids = {r.attributes["subscription_id"] for r in records[:2]}
        new_ids = {r.attributes["subscription_id"] for r in records
                   if all(n.startswith("org.apache.kafka.producer.produce.") for n in metric_names(r))}
        assert old_ids.isdisjoint(new_ids)

        _unsubscribe(sandbox, "tuning")
        # The client learns of the deletion at its next push (a stale subscription id) and fetches again.
        _wait_until(lambda: any("client_id=tuned " in m and "metrics (none)" in m for m in caplog.messages), 30)
        accepted = sum("client_id=tuned " in m and "push accepted" in m for m in caplog.messages)
        metrics_topic.wait_for(lambda rs: len(rs) >= accepted, timeout=30)
        # Then nothing more for several push intervals: the client has nothing to push.
        window_end = time.monotonic() + 4 * INTERVAL_MS / 1000
        while time.monotonic() < window_end:
            metrics_topic.poll()

    assert len(metrics_topic.records()) == accepted, "pushes went on after the subscription was deleted"


@pytest.mark.parametrize("codec", ["zstd", "lz4", "gzip", "snappy"])
def test_every_compression_type_is_negotiated_and_decoded(sandbox_factory, codec, caplog):
    sandbox = sandbox_factory(compression=[{"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]])
    _subscribe(sandbox, "all", metrics="*", **{"interval.ms": str(INTERVAL_MS)})
    reader = MetricsTopic(sandbox)
    caplog.set_level(logging.INFO, logger="kcm.sandbox")
    try:
        with running_producer(sandbox, f"{codec}-producer"):
            records = reader.wait_for(lambda rs: len(rs) >= 2, timeout=30)
    finally:
        reader.close()

    assert all(any(n.startswith("org.apache.kafka.producer.") for n in metric_names(r)) for r in records)
    accepted = [m for m in caplog.messages if "push accepted" in m]
    assert accepted and all(f"compression {codec}" in m for m in accepted), accepted
