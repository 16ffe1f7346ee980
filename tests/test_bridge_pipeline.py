"""The bridge end to end: metrics topic on the embedded broker → bridge → a real OTLP/gRPC collector."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import confluent_kafka
import grpc
import prometheus_client
import pytest
from kafka import KafkaConsumer, TopicPartition

from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from kcm_bridge import config as bridge_config
from kcm_bridge.pipeline import Bridge, _BatchTicket
from kcm_common import contract, points
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaConfigError, KafkaSettings, ensure_topic
from kcm_common.logs import where_blocked
from kcm_sandbox.broker import EmbeddedBroker
from fake_collector import FakeCollector
from payloads import client_metrics
from ports import CountingProxy, reserved_port
from test_sandbox_clients import _subscribe, running_producer

BACKENDS = ("confluent-kafka", "kafka-python")
# Tansu holds each JoinGroup for half the session timeout: keep it short.
CONSUMER_PROPERTIES = "session.timeout.ms=3000\nheartbeat.interval.ms=500\nauto.offset.reset=earliest\n"


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes | None]]]],
             timestamp_ms: int = 0) -> None:
    # One record per batch keeps Tansu's watermarks exact. Timestamp 0: now.
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=timestamp_ms)
    assert producer.flush(20) == 0


def _push(client_id: str, instance: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    value, headers = contract.encode(client_metrics(client_id), content_encoding="zstd",
                                     attributes={"client_id": client_id, "client_instance_id": instance,
                                                 "client_software_name": "librdkafka",
                                                 "client_source_address": "10.0.0.7", "principal": "User:alice"})
    return instance.encode(), value, headers


def _request_client_ids(request) -> list[str]:
    return [str(points.attributes(resource_metrics.resource.attributes).get("client_id"))
            for resource_metrics in request.resource_metrics]


def _client_ids(exports) -> list[str]:
    return [client_id for export in exports for client_id in _request_client_ids(export.request)]


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    reader = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (found,) = reader.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=10)
    finally:
        reader.close()
    return None if found.offset < 0 else found.offset


def _config(tmp_path, bootstrap: str, topic: str, endpoint: str | list[str], backend: str,
            overrides: dict | None = None) -> bridge_config.BridgeConfig:
    properties = tmp_path / "consumer.properties"
    properties.write_text(CONSUMER_PROPERTIES)
    values = {("kafka", "bootstrap_servers"): bootstrap, ("kafka", "command_config"): str(properties),
              ("kafka", "topics"): [topic], ("kafka", "group_id"): f"bridge-{topic}", ("kafka", "client"): backend,
              ("batch", "linger_ms"): 50, ("retry", "initial_backoff_s"): 0.1, ("retry", "max_backoff_s"): 0.5}
    values.update(overrides or {})
    endpoints = [endpoint] if isinstance(endpoint, str) else endpoint
    return bridge_config.load(env={}, overrides=values, endpoints=endpoints, insecure=True)


@contextmanager
def running_bridge(config: bridge_config.BridgeConfig) -> Iterator[Bridge]:
    bridge = Bridge(config)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(bridge.run()), daemon=True)
    thread.start()
    try:
        yield bridge
    finally:
        bridge.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), (f"the bridge did not stop within 30 s; its thread is at:\n"
                                       f"{where_blocked(thread, frames=40)}")
    assert result == [0]


@contextmanager
def _unstarted_bridge(config: bridge_config.BridgeConfig) -> Iterator[Bridge]:
    """A bridge whose steps a test drives itself (no consuming loop); its export pool and channels closed after."""
    bridge = Bridge(config)
    try:
        yield bridge
    finally:
        for pool in bridge._pools.values():
            pool.shutdown()
        for endpoint in bridge._endpoints:
            endpoint.close()


def outcome_of_run(bridge: Bridge, timeout: float) -> object:
    """What `bridge.run()` returned or raised within `timeout` seconds (None if it had not ended: stopped at once)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(bridge.run())
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        bridge.stop(at_once=True)
        thread.join(30)
    return outcome[0] if outcome else None


@pytest.fixture
def closed_port() -> Iterator[Callable[[], int]]:
    """Loopback ports nothing listens on, so connecting is refused, until a collector starts there: each is held
    bound (not listening) to the test's end, so no other socket takes it meanwhile (ports.reserved_port)."""
    with ExitStack() as held:
        yield lambda: held.enter_context(reserved_port())


def _produce_pushes(bootstrap: str, topic: str, total: int) -> None:
    """`total` pushes of as many clients, one record each."""
    _produce(bootstrap, topic, [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}") for i in range(total)])


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)


def test_a_batch_the_collector_refuses_for_good_is_dropped_logged_and_counted_and_the_rest_flows(
        broker, new_topic, collector, tmp_path, caplog):
    topic = new_topic()
    _produce(broker.bootstrap, topic, [_push("refused", "00000000-0000-0000-0000-000000000001")])
    collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT, message="bad request")
    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, "confluent-kafka")
    with caplog.at_level(logging.ERROR, logger="kcm.bridge"), running_bridge(config) as bridge:
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 1, 30, "commit past the refusal")
        collector.fail_next(grpc.StatusCode.UNIMPLEMENTED, message="unknown service")
        _produce(broker.bootstrap, topic, [_push("unimplemented", "00000000-0000-0000-0000-000000000003")])
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 2, 30, "commit past the second")
        collector.fail_next(grpc.StatusCode.UNAUTHENTICATED, message="bad token")
        _produce(broker.bootstrap, topic, [_push("unauthenticated", "00000000-0000-0000-0000-000000000004")])
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 3, 30, "commit past the third")
        _produce(broker.bootstrap, topic, [_push("accepted", "00000000-0000-0000-0000-000000000002")])
        assert collector.wait_for(lambda exports: "accepted" in _client_ids(exports), timeout=30)
    assert _client_ids(collector.exports) == ["accepted"] and collector.rejected_calls == 3
    assert bridge.metrics.value(bridge.metrics.export_failures, code="INVALID_ARGUMENT") == 1
    assert bridge.metrics.value(bridge.metrics.export_failures, code="UNIMPLEMENTED") == 1
    assert bridge.metrics.value(bridge.metrics.export_failures, code="UNAUTHENTICATED") == 1
    assert bridge.metrics.value(bridge.metrics.retries) == 0
    refusals = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert refusals == [
        f"export to {collector.endpoint} rejected with INVALID_ARGUMENT: bad request; dropping the batch of 2 points "
        "(not retryable)",
        f"export to {collector.endpoint} rejected with UNIMPLEMENTED: unknown service; dropping the batch of 2 points "
        "(not retryable); is the endpoint an OTLP/gRPC metrics receiver (port 4317 of a collector)?",
        f"export to {collector.endpoint} rejected with UNAUTHENTICATED: bad token; dropping the batch of 2 points "
        "(not retryable); check the endpoint's headers (an expired or missing token?); the headers were read again"]


@pytest.mark.parametrize("poisoned", [[5], [0, 7], list(range(8))], ids=["one", "two", "all"])
def test_records_the_collector_calls_invalid_cost_only_themselves_not_their_batch(broker, new_topic, collector,
                                                                                tmp_path, caplog, poisoned):
    # A collector validating what it is sent refuses a whole request for one record it dislikes (INVALID_ARGUMENT,
    # final per the OTLP spec): the bridge splits the batch to deliver the rest.
    topic = new_topic()
    clients = [f"poison-{i}" if i in poisoned else f"client-{i}" for i in range(8)]
    _produce(broker.bootstrap, topic, [_push(client, f"00000000-0000-0000-0000-{i:012d}")
                                       for i, client in enumerate(clients)])
    refused = {client for client in clients if client.startswith("poison")}
    collector.refuse_when(lambda request: not refused.isdisjoint(_request_client_ids(request)),
                          message="invalid metric name")
    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, "confluent-kafka",
                     {("batch", "linger_ms"): 3000})   # the eight records make one batch
    with caplog.at_level(logging.ERROR, logger="kcm.bridge"), running_bridge(config) as bridge:
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 8, 30, "commit past all eight")
    delivered = sorted(_client_ids(collector.exports))
    assert delivered == sorted(set(clients) - refused)   # each once
    drops = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert all("rejected with INVALID_ARGUMENT: invalid metric name; dropping" in line for line in drops), drops
    (drop,) = drops
    if len(poisoned) == 8:   # the collector refuses everything: every split, within the bound of 4·log2(8)
        assert "dropping the batch of 16 points" in drop and collector.rejected_calls == 1 + 14
    else:
        assert (f"dropping {len(poisoned)} of the batch's 8 records ({2 * len(poisoned)} points; the others were "
                "delivered)") in drop
        assert collector.rejected_calls == 1 + 3 * len(poisoned)   # the batch, then the half holding each, down
    assert bridge.metrics.value(bridge.metrics.export_failures, code="INVALID_ARGUMENT") == collector.rejected_calls
    assert bridge.metrics.value(bridge.metrics.points) == 2 * len(delivered)


def test_a_record_the_collector_keeps_failing_retryably_is_isolated_and_dead_lettered_the_rest_delivered(
        broker, new_topic, collector, tmp_path, caplog):
    """One abusive record must not stall the others: a request the collector fails retryably (for ever, here) while
    it answers an empty request is split by client instance after `poison_after_s`; the others go, and the client it
    fails for goes to the dead-letter topic once it has failed for `poison_after_s` and 20 attempts while the
    collector took other data (here: the pushes of other clients that keep coming, on the other export thread)."""
    caplog.set_level(logging.WARNING, logger="kcm.bridge")
    topic, dead_letters = new_topic(), new_topic(prefix="dlq")
    clients = ["poison-0"] + [f"client-{i}" for i in range(1, 8)]   # first: the others must go before it is judged
    _produce(broker.bootstrap, topic, [_push(client, f"00000000-0000-0000-0000-{i:012d}")
                                       for i, client in enumerate(clients)])
    collector.refuse_when(lambda request: "poison-0" in _request_client_ids(request), grpc.StatusCode.UNAVAILABLE,
                          "cannot process this")
    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, "confluent-kafka",
                     {("delivery", "poison_after_s"): 2.0, ("delivery", "dead_letter_topic"): dead_letters,
                      ("retry", "initial_backoff_s"): 0.05, ("retry", "max_backoff_s"): 0.15})
    produced, stop = [8], threading.Event()

    def steady() -> None:   # once the batch is being retried: other clients' pushes, each a client of its own
        while not stop.wait(0.2):
            _produce(broker.bootstrap, topic, [_push(f"steady-{produced[0]}",
                                                     f"10000000-0000-0000-0000-{produced[0]:012d}")])
            produced[0] += 1

    started = time.monotonic()
    with running_bridge(config) as bridge:
        _wait(lambda: collector.rejected_calls > 0, 30, "the batch failing")
        pushing = threading.Thread(target=steady, daemon=True)
        pushing.start()
        try:
            _wait(lambda: bridge.metrics.value(bridge.metrics.dead_lettered) == 1, 90, "the poisoned client set aside")
        finally:
            stop.set()
            pushing.join(10)
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == produced[0], 60,
              "commit past every record")
    assert time.monotonic() - started >= 4.0   # not before it had failed for poison_after_s, as a request and alone
    delivered = _client_ids(collector.exports)
    assert sorted(delivered) == sorted(clients[1:] + [f"steady-{i}" for i in range(8, produced[0])])   # each once
    assert bridge.metrics.value(bridge.metrics.dead_lettered) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and r.name == "kcm.bridge"]
    (error,) = errors
    assert re.fullmatch(
        f"export to {re.escape(collector.endpoint)}: the collector kept failing 1 client instance\\(s\\) for 2 s or "
        r"more and 20 attempts or more while it took other data \(failed with UNAVAILABLE for \d+ s \(\d+ attempts\) "
        r"while the collector answered an empty request: cannot process this\); dead-lettering 1 of the batch's 8 "
        f"records \\(2 points\\) to {re.escape(dead_letters)} \\(reason failing-at-collector\\)", error), error
    assert any("the batch of 8 records was split by client instance: 7 delivered in " in r.getMessage()
               and r.getMessage().endswith(" requests, 1 dead-lettered") for r in caplog.records)
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, consumer_timeout_ms=3000)
    reader.assign([TopicPartition(dead_letters, 0)])
    reader.seek_to_beginning()
    (letter,) = list(reader)
    reader.close()
    assert dict(letter.headers)["kcm.dlq.reason"] == b"failing-at-collector"
    assert dict(letter.headers)["kcm.dlq.offset"] == b"0"


@pytest.mark.parametrize("case", ["all-data-failing", "collector-down", "no-dead-letter-topic"])
def test_records_are_never_set_aside_while_the_collector_fails_all_data_or_without_a_dead_letter_topic(
        broker, new_topic, collector, closed_port, tmp_path, caplog, case):
    """A collector failing every request with data (an overload: its memory limiter) while it answers empty ones
    is not a poison: nothing is set aside, and all goes once it recovers. A collector down is not asked to judge
    (the batch goes whole once it is back). Nor is anything set aside without a dead-letter topic (at least once):
    the bridge says once what it sees, and retries."""
    caplog.set_level(logging.WARNING, logger="kcm.bridge")
    topic, dead_letters = new_topic(), new_topic(prefix="dlq")
    clients = ["poison-0"] + [f"client-{i}" for i in range(1, 8)]
    _produce(broker.bootstrap, topic, [_push(client, f"00000000-0000-0000-0000-{i:012d}")
                                       for i, client in enumerate(clients)])
    failing = {"poison-0"} if case == "no-dead-letter-topic" else set(clients)
    collector.refuse_when(lambda request: not failing.isdisjoint(_request_client_ids(request)),
                          grpc.StatusCode.UNAVAILABLE, "overloaded")
    overrides = {("batch", "linger_ms"): 1000, ("delivery", "poison_after_s"): 1.0}
    if case != "no-dead-letter-topic":
        overrides[("delivery", "dead_letter_topic")] = dead_letters
    port = closed_port()
    endpoint = f"127.0.0.1:{port}" if case == "collector-down" else collector.endpoint
    config = _config(tmp_path, broker.bootstrap, topic, endpoint, "confluent-kafka", overrides)
    with ExitStack() as stack, running_bridge(config) as bridge:
        failures = bridge.metrics.export_failures
        _wait(lambda: bridge.metrics.value(failures) >= 10, 60, "ten failed exports")
        time.sleep(1.0)   # past poison_after_s once more
        assert bridge.metrics.value(bridge.metrics.dead_lettered) == 0
        assert (_committed(broker.bootstrap, config.kafka.group_id, topic) or 0) < 8
        if case == "collector-down":
            collector = stack.enter_context(FakeCollector(port=port))
        collector.clear_faults()
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 8, 60, "commit past all eight")
    assert sorted(set(_client_ids(collector.exports))) == sorted(clients)
    assert bridge.metrics.value(bridge.metrics.dead_lettered) == 0
    if case == "collector-down":   # not split: one request, every client
        assert [len(export.request.resource_metrics) for export in collector.exports] == [8]
    told = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and r.name == "kcm.bridge"]
    if case == "no-dead-letter-topic":
        (line,) = told
        assert line.startswith(f"export of 8 records to {collector.endpoint} has failed for ") and line.endswith(
            "while the collector answers an empty request: it may be failing on some of these records; they are "
            "retried for ever (set delivery.dead_letter_topic to have such records set aside)"), line
    else:
        assert told == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_records_the_collector_calls_invalid_go_to_the_dead_letter_topic_as_they_were_read(
        backend, broker, new_topic, collector, tmp_path, caplog):
    topic, dead_letters = new_topic(), new_topic(prefix="dlq")
    clients = [f"poison-{i}" if i in (0, 7) else f"client-{i}" for i in range(8)]
    records = [_push(client, f"00000000-0000-0000-0000-{i:012d}") for i, client in enumerate(clients)]
    _produce(broker.bootstrap, topic, records)
    collector.refuse_when(lambda request: any(c.startswith("poison") for c in _request_client_ids(request)),
                          message="invalid metric name")
    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, backend,
                     {("batch", "linger_ms"): 3000, ("delivery", "dead_letter_topic"): dead_letters})
    with caplog.at_level(logging.ERROR, logger="kcm.bridge"), running_bridge(config) as bridge:
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 8, 30, "commit past all eight")
    assert sorted(_client_ids(collector.exports)) == [c for c in sorted(clients) if c.startswith("client")]
    assert bridge.metrics.value(bridge.metrics.dead_lettered) == 2
    assert bridge.metrics.value(bridge.metrics.decode_failures) == 0   # they decoded: the collector refused them
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert (f"invalid metric name; dead-lettering 2 of the batch's 8 records (4 points; the others were delivered) "
            f"to {dead_letters} (not retryable)") in line

    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, consumer_timeout_ms=3000)
    reader.assign([TopicPartition(dead_letters, 0)])
    reader.seek_to_beginning()
    dead = sorted(reader, key=lambda r: int(dict(r.headers)["kcm.dlq.offset"]))
    reader.close()
    assert [(r.key, r.value) for r in dead] == [(key, value) for key, value, _ in (records[0], records[7])]
    for letter, offset in zip(dead, (b"0", b"7")):
        headers = dict(letter.headers)
        assert headers["kcm.dlq.reason"] == b"refused-by-collector" and headers["kcm.dlq.offset"] == offset
        assert headers["content-encoding"] == b"zstd" and headers["kcm.dlq.topic"] == topic.encode()


@pytest.mark.parametrize("first_invalid", [True, False])
def test_records_split_out_of_a_refused_batch_are_each_judged_by_their_own_refusal(tmp_path, collector, caplog,
                                                                                    first_invalid):
    """The halves of a batch refused as invalid may be refused for other reasons too: invalid records still go to
    the dead-letter topic, and records refused for the endpoint's credentials never do, whatever the order."""
    import grpc

    from kcm_bridge.consumer import Record

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge, caplog.at_level(logging.ERROR, logger="kcm.bridge"):
        parts = []
        for offset, client in enumerate(("first", "second")):
            record = Record("metrics", 0, offset, *_push(client, f"00000000-0000-0000-0000-00000000000{offset}"))
            parts.append((*bridge._prepare(record), record.key, record, ("metrics", 0)))
        refusals = [(grpc.StatusCode.INVALID_ARGUMENT, "bad metric"), (grpc.StatusCode.UNAUTHENTICATED, "token")]
        collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT, message="the batch")
        for code, message in (refusals if first_invalid else refusals[::-1]):
            collector.fail_next(code, message=message)
        bridge._export(bridge._endpoints[0], parts, _BatchTicket())
        invalid = "first" if first_invalid else "second"
        assert [(letter.record.offset, letter.reason) for letter in bridge._letters_due] == [
            (0 if first_invalid else 1, "refused-by-collector")], invalid
    lines = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert len(lines) == 2
    assert "rejected with INVALID_ARGUMENT: bad metric; dead-lettering 1 of the batch's 2 records" in lines[0]
    assert "rejected with UNAUTHENTICATED: token; dropping 1 of the batch's 2 records" in lines[1]


def test_a_refused_record_holds_its_batch_uncommitted_until_its_dead_letter_is_written(tmp_path, collector):
    from kcm_bridge.consumer import Record

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        dead_letters = bridge._dead_letters = _FlakyDeadLetters(failures=1)
        pushes = [_push(client, f"00000000-0000-0000-0000-00000000000{i}") for i, client in enumerate(("ok", "bad"))]
        bridge._add([Record("metrics", 0, offset, key, value, headers)
                     for offset, (key, value, headers) in enumerate(pushes)])
        # The values read are held for the dead-letter topic beside the enriched bytes, and count against the budget.
        held = sum(len(part[0]) + len(part[3].value) for part in bridge._batch.parts)
        assert bridge._inflight_bytes() == held and [part[3].offset for part in bridge._batch.parts] == [0, 1]
        collector.refuse_when(lambda request: "bad" in _request_client_ids(request))
        bridge._flush()
        _wait(lambda: bridge._letters_due, 10, "the refused record handed over")
        assert bridge._tracker.to_commit() == {("metrics", 0): 0} and bridge._inflight_bytes() > 0
        _wait(lambda: (bridge._serve_dead_letters(0), dead_letters.written)[1], 10, "the dead letter written")
        assert dead_letters.written == [("metrics-dlq", 1, "refused-by-collector")]
        assert bridge.metrics.value(bridge.metrics.dead_letter_failures) == 1
        assert bridge._tracker.to_commit() == {("metrics", 0): 2} and bridge._inflight_bytes() == 0
    assert _client_ids(collector.exports) == ["ok"]


def test_a_revoke_writes_the_dead_letters_of_refused_records_before_it_commits(tmp_path, collector):
    from kcm_bridge.consumer import Record

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        partition = ("metrics", 0)
        dead_letters = bridge._dead_letters = _FlakyDeadLetters(failures=0)
        consumer = bridge._consumer = _CommittingConsumer([partition], high=2)
        bridge._kafka.recovered()  # Kafka answers
        key, value, headers = _push("bad", "00000000-0000-0000-0000-000000000001")
        bridge._add([Record("metrics", 0, 0, key, value, headers)])
        collector.refuse_when(lambda request: True)
        bridge._on_revoke([partition])   # exports the open batch, then waits for it: the dead letter included
        assert dead_letters.written == [("metrics-dlq", 0, "refused-by-collector")]
        assert consumer.commits == [{partition: 1}]


def test_with_retry_refused_credentials_a_batch_is_held_until_the_collector_accepts_them(broker, new_topic, collector,
                                                                                         tmp_path):
    # An expired or rotated token: not dropped as the OTLP spec's "permanent" would have it, and not committed past.
    topic = new_topic()
    _produce(broker.bootstrap, topic, [_push("held", "00000000-0000-0000-0000-000000000001")])
    collector.fail_next(grpc.StatusCode.UNAUTHENTICATED, times=10_000)
    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, "confluent-kafka")
    config = dataclasses.replace(config, endpoints=[
        dataclasses.replace(endpoint, retry_refused_credentials=True) for endpoint in config.endpoints])
    with running_bridge(config) as bridge:
        _wait(lambda: bridge.metrics.value(bridge.metrics.export_failures, code="UNAUTHENTICATED") >= 3, 30,
              "refusals")
        assert _committed(broker.bootstrap, config.kafka.group_id, topic) in (None, 0)  # not past the held record
        collector.clear_faults()  # the token is fixed
        assert collector.wait_for(lambda exports: "held" in _client_ids(exports), timeout=30)
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 1, 30, "the commit once accepted")
    assert _client_ids(collector.exports) == ["held"]
    refused = bridge.metrics.value(bridge.metrics.export_failures, code="UNAUTHENTICATED")
    assert refused == collector.rejected_calls == bridge.metrics.value(bridge.metrics.retries) >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_collector_outage_loses_nothing_and_corrupt_records_go_to_the_dead_letter_topic(
        backend, broker, new_topic, collector, tmp_path):
    topic, dead_letters = new_topic(), new_topic(prefix="dlq")
    records = [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}") for i in range(30)]
    corrupt = [(b"bad-zstd", b"\x28\xb5\x2f\xfd garbage", [("content-encoding", b"zstd"), ("client_id", b"x")]),
               (b"bad-proto", b"\xff\xff\xff", [("client_id", b"y"), ("traceparent", None)])]
    written_at = int(time.time() * 1000) - 3_600_000   # an hour ago: the dead letters keep it
    _produce(broker.bootstrap, topic, records[:10])
    _produce(broker.bootstrap, topic, corrupt, timestamp_ms=written_at)
    _produce(broker.bootstrap, topic, records[10:])
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=4)
    collector.throttle_next(0.2)

    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, backend,
                     {("delivery", "dead_letter_topic"): dead_letters})
    with running_bridge(config) as bridge:
        assert collector.wait_for(lambda exports: len(set(_client_ids(exports))) >= 30, timeout=60)
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 32, 30, "commit of all 32")

    assert set(_client_ids(collector.exports)) == {f"client-{i}" for i in range(30)}
    assert collector.rejected_calls == 5
    # Every failed attempt is counted, though each export was delivered in the end (a loaded machine may add some).
    assert bridge.metrics.value(bridge.metrics.retries) >= 5
    assert bridge.metrics.value(bridge.metrics.export_failures, code="UNAVAILABLE") >= 4
    assert bridge.metrics.value(bridge.metrics.export_failures, code="RESOURCE_EXHAUSTED") >= 1
    assert bridge.metrics.value(bridge.metrics.decode_failures, reason="decompress-failed") == 1
    assert bridge.metrics.value(bridge.metrics.decode_failures, reason="invalid-protobuf") == 1
    assert bridge.metrics.value(bridge.metrics.dead_lettered) == 2
    resource = next(points.attributes(rm.resource.attributes) for export in collector.exports
                    for rm in export.request.resource_metrics)
    assert resource["client_software_name"] == "librdkafka"
    assert resource["client_source_address"] == "10.0.0.7"
    assert resource["client_instance_id"].startswith("00000000-0000-0000-0000-")

    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, consumer_timeout_ms=3000)
    reader.assign([TopicPartition(dead_letters, 0)])
    reader.seek_to_beginning()
    dead = list(reader)
    reader.close()
    assert [(r.key, r.value) for r in dead] == [(key, value) for key, value, _ in corrupt]
    reasons = [dict(r.headers)["kcm.dlq.reason"] for r in dead]
    assert reasons == [b"decompress-failed", b"invalid-protobuf"]
    assert dict(dead[0].headers)["content-encoding"] == b"zstd"
    assert dict(dead[1].headers)["kcm.dlq.offset"] == b"11"
    assert [r.timestamp for r in dead] == [written_at, written_at]
    # A null header value is kept as null (kafka-python's producer takes none: it leaves such a header out).
    expected = [("client_id", b"y")] + ([("traceparent", None)] if backend == "confluent-kafka" else [])
    assert dead[1].headers[:-4] == expected


def test_kcm_bridge_command_forwards_real_client_pushes_and_exits_cleanly_on_sigterm(
        sandbox, collector, tmp_path):
    _subscribe(sandbox, "everything", metrics="*", **{"interval.ms": "500"})
    properties = tmp_path / "bridge.properties"
    properties.write_text("session.timeout.ms=6000\nheartbeat.interval.ms=1000\nauto.offset.reset=earliest\n")
    log_path = tmp_path / "bridge.log"
    with running_producer(sandbox, "bridge-demo-producer"), open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kcm_cli.main", "bridge", "--bootstrap-server", sandbox.bootstrap,
             "--command-config", str(properties), "--topic", sandbox.options.topic, "--group-id", "kcm-demo-bridge",
             "--endpoint", collector.endpoint, "--insecure"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            arrived = collector.wait_for(lambda exports: "bridge-demo-producer" in _client_ids(exports), timeout=60)
            assert arrived, log_path.read_text()
            time.sleep(3)   # six more push intervals of a subscription that matches every client
        finally:
            code = _terminate(process)
    assert code == 0, log_path.read_text()
    # A reader of the metrics topic must not add to it: the bridge's own librdkafka client pushes nothing there.
    assert set(_client_ids(collector.exports)) == {"bridge-demo-producer"}
    resource = next(points.attributes(rm.resource.attributes) for export in collector.exports
                    for rm in export.request.resource_metrics
                    if points.attributes(rm.resource.attributes).get("client_id") == "bridge-demo-producer")
    assert resource["client_software_name"] == "confluent-kafka-python"
    assert resource["client_source_address"] == "127.0.0.1"
    assert resource["push_interval_ms"] == "500"
    assert len(resource["client_instance_id"]) == 36
    assert "Traceback" not in log_path.read_text()
    assert (_committed(sandbox.bootstrap, "kcm-demo-bridge", sandbox.options.topic) or 0) > 0


def test_kcm_bridge_logs_json_lines_with_log_format_json(closed_port, tmp_path):
    entries = _json_lines_until_kafka_is_reported_down(
        tmp_path, "--bootstrap-server", f"127.0.0.1:{closed_port()}", "--endpoint", "127.0.0.1:9", "--insecure",
        "--log-format", "json")
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    assert any(e["level"] == "ERROR" and "cannot reach Kafka" in e["message"] for e in entries), entries


def test_with_json_chosen_in_the_file_the_warning_about_a_misspelt_variable_is_a_json_line_too(closed_port, tmp_path):
    """The one line that says a setting was not applied must reach a log pipeline that parses JSON lines."""
    config_path = tmp_path / "bridge.yaml"
    config_path.write_text(f"kafka: {{bootstrap_servers: '127.0.0.1:{closed_port()}'}}\n"
                           "endpoints: [{endpoint: '127.0.0.1:9', insecure: true}]\nlog_format: json\n")
    entries = _json_lines_until_kafka_is_reported_down(tmp_path, "--config", str(config_path),
                                                       env={"KCM_BRIDGE_BATCH_LINGER": "5"})
    warnings = [e for e in entries if e["level"] == "WARNING" and "KCM_BRIDGE_BATCH_LINGER" in e["message"]]
    assert [w["message"].split(" (")[0] for w in warnings] == ["ignoring KCM_BRIDGE_BATCH_LINGER: not a bridge setting"]


def _json_lines_until_kafka_is_reported_down(tmp_path, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    """Run `kcm bridge ARGS` against a Kafka that is not there until it says so, stop it (exit 0) and return its log
    lines, each of which must be JSON."""
    import json
    import os

    log_path = tmp_path / "bridge.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "kcm_cli.main", "bridge", *args],
                                   env={**os.environ, **(env or {})},
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait(lambda: "cannot reach Kafka" in log_path.read_text(), 30, "the bridge reporting Kafka down")
        finally:
            code = _terminate(process)
    assert code == 0, log_path.read_text()
    return [json.loads(line) for line in log_path.read_text().splitlines()]


def _start_kcm_bridge(config_path, log_path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "kcm_cli.main", "bridge", "--config", str(config_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _terminate(process: subprocess.Popen | None, timeout_s: float = 30) -> int | None:
    """SIGTERM and wait; killed if it has not exited within `timeout_s`. Its exit code (None: it had to be killed)."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        return None


def _draining_against_a_down_collector(broker, topic: str, port: int, tmp_path, group: str | None = None):
    """A bridge config (its path) for one record in `topic`, a collector that is down at `port` and a long drain."""
    _produce(broker.bootstrap, topic, [_push("waiting", "00000000-0000-0000-0000-000000000001")])
    properties = tmp_path / "consumer.properties"
    properties.write_text(CONSUMER_PROPERTIES)
    config_path = tmp_path / "bridge.yaml"
    config_path.write_text(
        f"kafka: {{bootstrap_servers: '{broker.bootstrap}', command_config: '{properties}', topics: [{topic}]"
        + (f", group_id: {group}" if group else "") + "}\n"
        f"endpoints: [{{endpoint: '127.0.0.1:{port}', insecure: true}}]\n"
        "retry: {initial_backoff_s: 0.1, max_backoff_s: 0.5}\n"
        "delivery: {shutdown_timeout_s: 120}\n")
    return config_path


def test_a_second_ctrl_c_stops_without_waiting_for_exports_and_commits_nothing_unexported(
        closed_port, broker, new_topic, tmp_path):
    topic = new_topic()
    config_path = _draining_against_a_down_collector(broker, topic, closed_port(), tmp_path, group="impatient")
    log_path = tmp_path / "bridge.log"
    process = _start_kcm_bridge(config_path, log_path)
    try:
        _wait(lambda: "UNAVAILABLE" in log_path.read_text(), 60, "an export retrying")
        process.send_signal(signal.SIGINT)
        _wait(lambda: "draining (at most 120s; a second signal stops at once)" in log_path.read_text(), 10,
              "the drain")
        time.sleep(1.0)
        assert process.poll() is None   # still waiting for the collector
        stopping = time.monotonic()
        process.send_signal(signal.SIGINT)
        code = process.wait(30)
        took = time.monotonic() - stopping
    finally:
        _terminate(process)
    text = log_path.read_text()
    assert code == 0 and took < 10, (took, text)
    assert "SIGINT received again: stopping without waiting for exports" in text and "Traceback" not in text
    assert _committed(broker.bootstrap, "impatient", topic) in (None, 0)   # the record is read again next time


def test_one_sigterm_delivered_twice_at_once_drains_and_only_a_later_one_stops_at_once(
        closed_port, broker, new_topic, tmp_path):
    """GNU `timeout` (a process-group kill) delivers its SIGTERM twice within a millisecond: taken as a second
    signal, it skipped the drain."""
    topic = new_topic()
    config_path = _draining_against_a_down_collector(broker, topic, closed_port(), tmp_path)
    log_path = tmp_path / "bridge.log"
    process = _start_kcm_bridge(config_path, log_path)
    try:
        _wait(lambda: "UNAVAILABLE" in log_path.read_text(), 60, "an export retrying")
        # As `timeout` does: to the child, then to its group. 50 ms apart, not 1: a signal sent while the same one
        # is still pending is merged with it, and the process would see one.
        os.kill(process.pid, signal.SIGTERM)
        time.sleep(0.05)
        os.kill(process.pid, signal.SIGTERM)
        _wait(lambda: "draining (at most 120s" in log_path.read_text(), 10, "the drain")
        time.sleep(2.0)
        assert process.poll() is None, log_path.read_text()   # still draining, waiting for the collector
        process.send_signal(signal.SIGTERM)   # a deliberate second one, later
        code = process.wait(30)
    finally:
        _terminate(process)
    text = log_path.read_text()
    assert code == 0, text
    assert "SIGTERM received again within 1s: taken as the same request" in text
    assert text.count("SIGTERM received again: stopping without waiting for exports") == 1, text


def test_healthz_fails_once_the_consuming_loop_is_stuck_names_where_once_and_recovers(closed_port, tmp_path,
                                                                                     monkeypatch, caplog):
    """A call that never returns inside the loop (here the back-pressure step) gets the pod restarted: /healthz
    503 after stall_timeout_s, one ERROR naming the call; healthy again once the loop comes round."""
    from kcm_bridge import pipeline

    monkeypatch.setattr(pipeline, "_check_stall_timeout", lambda config, tuning: None)   # its bound: tested apart
    config = _config(tmp_path, f"127.0.0.1:{closed_port()}", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("stall_timeout_s",): 2, ("metrics_port",): 0, ("metrics_host",): "127.0.0.1"})
    stuck, release = threading.Event(), threading.Event()
    bridge = Bridge(config)
    real = bridge._backpressure

    def backpressure_that_never_returns() -> None:
        if stuck.is_set():
            release.wait(30)
        real()

    bridge._backpressure = backpressure_that_never_returns
    caplog.set_level(logging.ERROR, logger="kcm.bridge")
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    try:
        _wait(lambda: bridge.metrics_port is not None, 10, "serving /healthz")
        from test_bridge_units import _get

        def answer() -> tuple[int, str]:
            status, body, _ = _get(f"http://127.0.0.1:{bridge.metrics_port}/healthz")
            return status, body.decode()

        # Turning (checking a Kafka that is not there, with backoff; a turn is 0.5 s and a probe, under load once
        # over 1 s): past the limit, still healthy.
        time.sleep(2.5)
        assert answer() == (200, "ok\n")
        stuck.set()
        _wait(lambda: answer()[0] == 503, 10, "/healthz failing")
        status, text = answer()
        assert text.startswith("stalled: the consuming loop has not come round for "), text
        assert text.endswith("s (stall_timeout_s 2)\n"), text
        stalls = [r.getMessage() for r in caplog.records if "has not come round" in r.getMessage()]
        assert len(stalls) == 1 and "in backpressure_that_never_returns" in stalls[0], stalls
        stuck.clear()
        release.set()
        _wait(lambda: answer() == (200, "ok\n"), 10, "/healthz ok again")
    finally:
        release.set()
        bridge.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_a_stall_timeout_a_healthy_turn_could_reach_is_refused_naming_what_it_must_exceed(tmp_path):
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("stall_timeout_s",): 80, ("kafka", "connect_timeout_s"): 10})
    (tmp_path / "consumer.properties").write_text("session.timeout.ms=45000\n")   # the consumer's default
    with pytest.raises(bridge_config.ConfigError, match=r"^stall_timeout_s \(80\) must be above 80s, the longest one "
                       r"turn of the consuming loop may take: session.timeout.ms \(45s, a commit\), twice "
                       r"kafka.connect_timeout_s \(a Kafka check\), delivery.revoke_timeout_s and 10s; raise it, or "
                       r"give 0 to turn the check off$"):
        Bridge(config)
    (tmp_path / "consumer.properties").write_text("session.timeout.ms=44000\n")
    with _unstarted_bridge(config) as bridge:   # 79 s: accepted
        assert bridge.health_problem() is None
    off = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka", {("stall_timeout_s",): 0})
    with _unstarted_bridge(off) as bridge:
        bridge._turned -= 10 ** 6
        assert bridge.health_problem() is None


def test_a_draining_bridge_stays_healthy_and_a_stall_is_logged_once_per_stall(tmp_path, caplog):
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka")
    caplog.set_level(logging.ERROR, logger="kcm.bridge")
    with _unstarted_bridge(config) as bridge:
        assert config.stall_timeout_s == 300   # the default
        bridge._turned = time.monotonic() - 301
        assert bridge.health_problem() == ("stalled: the consuming loop has not come round for 301s "
                                           "(stall_timeout_s 300)")
        assert bridge.health_problem() is not None
        assert sum("has not come round" in r.getMessage() for r in caplog.records) == 1
        bridge._turned = time.monotonic() - 302   # came round once, then stuck again: a new stall
        assert bridge.health_problem() is not None
        assert sum("has not come round" in r.getMessage() for r in caplog.records) == 2
        bridge.stop()
        assert bridge.health_problem() is None


@pytest.mark.timeout(60)
def test_a_kafka_client_that_never_returns_from_close_cannot_hold_the_shutdown(closed_port, tmp_path):
    """Past shutdown_timeout_s + connect_timeout_s + 5 s of SIGTERM, `kcm bridge` says where it is blocked and
    exits 1, rather than waiting for Kubernetes to kill it, silently."""
    config_path = tmp_path / "bridge.yaml"
    config_path.write_text(f"kafka: {{bootstrap_servers: '127.0.0.1:{closed_port()}', connect_timeout_s: 1}}\n"
                           "endpoints: [{endpoint: '127.0.0.1:9', insecure: true}]\n"
                           "delivery: {shutdown_timeout_s: 1}\n")
    blocked = ("import threading, sys\n"
               "from kcm_bridge.consumer import ConfluentConsumer\n"
               "ConfluentConsumer.close = lambda self: threading.Event().wait()\n"
               "from kcm_cli.main import main\n"
               f"sys.exit(main(['bridge', '--config', {str(config_path)!r}]))\n")
    log_path = tmp_path / "bridge.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", blocked], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    try:
        _wait(lambda: "cannot reach Kafka" in log_path.read_text(), 30, "the bridge reporting Kafka down")
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        took = time.monotonic() - stopping
    finally:
        _terminate(process, 5)
    text = log_path.read_text()
    assert code == 1 and 7 <= took < 15, (code, took, text)
    assert "the bridge did not stop within 7s of being asked" in text and "in <lambda>" in text, text
    assert "self._consumer.close()" in text, text   # where: the blocked call, innermost frames last


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_mid_stream_and_restart_delivers_every_point_at_least_once(
        backend, broker, new_topic, collector, tmp_path):
    topic = new_topic()
    total = 300
    _produce_pushes(broker.bootstrap, topic, total)
    properties = tmp_path / "consumer.properties"
    properties.write_text(CONSUMER_PROPERTIES)
    config_path = tmp_path / "bridge.yaml"
    config_path.write_text(
        f"kafka: {{bootstrap_servers: '{broker.bootstrap}', command_config: '{properties}', topics: [{topic}],"
        f" group_id: killed, client: {backend}}}\n"
        f"endpoints: [{{endpoint: '{collector.endpoint}', insecure: true}}]\n"
        "batch: {max_points: 20, linger_ms: 20}\n"
        "delivery: {commit_interval_s: 0.1}\n")
    log_path = tmp_path / "bridge.log"

    first = _start_kcm_bridge(config_path, log_path)
    try:
        assert collector.wait_for(lambda exports: len(_client_ids(exports)) >= 60, timeout=60), log_path.read_text()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    delivered_before_kill = len(set(_client_ids(collector.exports)))

    second = _start_kcm_bridge(config_path, log_path)
    try:
        everything = collector.wait_for(lambda exports: len(set(_client_ids(exports))) == total, timeout=90)
    finally:
        code = _terminate(second)
    assert everything, log_path.read_text()
    assert code == 0
    ids = _client_ids(collector.exports)
    assert set(ids) == {f"client-{i}" for i in range(total)}
    assert delivered_before_kill < total, "the kill came too late to test a restart"
    # Duplicates are the price of at least once: only records after the last commit come twice.
    assert len(ids) - total < total
    assert _committed(broker.bootstrap, "killed", topic) == total


def _sum_points(request_or_data, instance: str | None = None) -> Iterator[tuple[tuple, int, int, float]]:
    """(stream key, start, time, value) of every sum point."""
    for resource_metrics in request_or_data.resource_metrics:
        owner = instance or str(points.attributes(resource_metrics.resource.attributes).get("client_instance_id"))
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.WhichOneof("data") != "sum":
                    continue
                for point in metric.sum.data_points:
                    key = (owner, metric.name, tuple(sorted(points.attributes(point.attributes).items())))
                    value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                    yield key, point.start_time_unix_nano, point.time_unix_nano, value


def test_delta_sums_from_real_clients_become_running_totals_of_the_raw_deltas(sandbox, collector, tmp_path):
    _subscribe(sandbox, "everything", metrics="org.apache.kafka.producer.", **{"interval.ms": "300"})
    config = _config(tmp_path, sandbox.bootstrap, sandbox.options.topic, collector.endpoint, "confluent-kafka",
                     {("temporality", "delta_to_cumulative"): True})
    with running_producer(sandbox, "delta-producer"), running_bridge(config):
        assert collector.wait_for(lambda exports: _client_ids(exports).count("delta-producer") >= 5, timeout=60)

    reader = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, consumer_timeout_ms=3000)
    reader.assign([TopicPartition(sandbox.options.topic, 0)])
    reader.seek_to_beginning()
    raw: dict[tuple, list[tuple[int, float]]] = {}
    for record in reader:
        decoded = contract.decode(record.value, record.headers)
        for key, _, t_ns, value in _sum_points(decoded.metrics, decoded.attributes["client_instance_id"]):
            raw.setdefault(key, []).append((t_ns, value))
    reader.close()

    checked = 0
    starts: dict[tuple, set[int]] = {}
    for export in collector.exports:
        for key, start, t_ns, value in _sum_points(export.request):
            expected = sum(v for t, v in raw[key] if t <= t_ns)
            assert value == pytest.approx(expected), key
            starts.setdefault(key, set()).add(start)
            checked += 1
    assert checked >= 5
    # librdkafka's producer sums stay 0 on an idle connection; growth is covered by test_bridge_temporality.
    assert any(len(raw[key]) >= 3 for key in starts)
    temporalities = {metric.sum.aggregation_temporality for export in collector.exports
                     for rm in export.request.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
                     if metric.WhichOneof("data") == "sum"}
    assert temporalities == {AGGREGATION_TEMPORALITY_CUMULATIVE}
    assert all(len(s) == 1 for s in starts.values()), "a stream changed its start time without losing state"


def test_a_re_delivered_push_of_delta_sums_only_is_committed_and_sends_no_metric_without_points(
        broker, new_topic, collector, tmp_path):
    """With delta → cumulative, a push read twice (a client retrying it) was exported as sums with no points."""
    topic = new_topic()
    data = client_metrics("sums-only")
    del data.resource_metrics[0].scope_metrics[0].metrics[0]   # the gauge: a push of one delta sum
    value, headers = contract.encode(data, content_encoding="zstd",
                                     attributes={"client_instance_id": "00000000-0000-0000-0000-000000000001",
                                                 "client_id": "sums-only"})
    record = (b"00000000-0000-0000-0000-000000000001", value, headers)
    _produce(broker.bootstrap, topic, [record, record, _push("after", "00000000-0000-0000-0000-000000000002")])
    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, "confluent-kafka",
                     {("temporality", "delta_to_cumulative"): True})
    with running_bridge(config):
        assert collector.wait_for(lambda exports: "after" in _client_ids(exports), timeout=60)
        _wait(lambda: _committed(broker.bootstrap, f"bridge-{topic}", topic) == 3, 30, "the three records committed")
    resources = [rm for export in collector.exports for rm in export.request.resource_metrics]
    sums_only = [metric for rm in resources if points.attributes(rm.resource.attributes)["client_id"] == "sums-only"
                 for sm in rm.scope_metrics for metric in sm.metrics]
    assert len(sums_only) == 1 and len(sums_only[0].sum.data_points) == 1   # the first push, not the empty second
    assert all(len(getattr(metric, metric.WhichOneof("data")).data_points)
               for rm in resources for sm in rm.scope_metrics for metric in sm.metrics)
    assert all(rm.scope_metrics for export in collector.exports for rm in export.request.resource_metrics)


def test_hash_routing_keeps_each_client_instance_on_one_endpoint(broker, new_topic, collector, tmp_path):
    topic = new_topic()
    instances = [f"00000000-0000-0000-0000-{i:012d}" for i in range(12)]
    _produce(broker.bootstrap, topic, [_push(f"client-{i}", instance) for _ in range(3)
                                       for i, instance in enumerate(instances)])
    with FakeCollector() as second:
        config = _config(tmp_path, broker.bootstrap, topic, [collector.endpoint, second.endpoint],
                         "confluent-kafka", {("routing",): "hash", ("batch", "max_points"): 8, ("metrics_port",): 0,
                          ("metrics_host",): "127.0.0.1"})
        with running_bridge(config) as bridge:
            assert _wait_for_total([collector, second], 36)
            # A batch went to some endpoints only: done once those accepted it, so it is committed and its bytes
            # freed (waiting for every endpoint, nothing was ever committed and reading paused for good).
            _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 36, 30, "commit of all 36")
            _wait(lambda: bridge.metrics.value(bridge.metrics.inflight_bytes) == 0, 10, "in-flight bytes freed")
            base = f"http://127.0.0.1:{bridge.metrics_port}"
            assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
            assert urllib.request.urlopen(base + "/readyz", timeout=5).status == 200
            exposition = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert f'kcm_bridge_points_exported_total{{endpoint="{second.endpoint}"}}' in exposition
        assert "kcm_bridge_records_consumed_total 36.0" in exposition
        first_ids, second_ids = set(_client_ids(collector.exports)), set(_client_ids(second.exports))
    assert first_ids and second_ids, "hashing sent every instance to one endpoint"
    assert first_ids.isdisjoint(second_ids)
    assert first_ids | second_ids == {f"client-{i}" for i in range(12)}


def test_fanout_commits_only_what_every_endpoint_accepted(closed_port, broker, new_topic, collector, tmp_path):
    """Fanout (the default): the healthy endpoint gets everything at once, but nothing is committed while the other
    is down; once it is back it gets everything too, and the commit reaches the end."""
    topic = new_topic()
    _produce_pushes(broker.bootstrap, topic, 20)
    down = closed_port()
    config = _config(tmp_path, broker.bootstrap, topic, [collector.endpoint, f"127.0.0.1:{down}"], "confluent-kafka",
                     {("batch", "max_points"): 8, ("delivery", "commit_interval_s"): 0.1})
    assert config.routing == "fanout"
    with running_bridge(config) as bridge:
        assert collector.wait_for(lambda exports: len(set(_client_ids(exports))) == 20, timeout=60)
        _wait(lambda: bridge.metrics.value(bridge.metrics.retries) >= 3, 30, "retries to the endpoint that is down")
        assert (_committed(broker.bootstrap, config.kafka.group_id, topic) or 0) == 0
        with FakeCollector(port=down) as late:
            assert late.wait_for(lambda exports: len(set(_client_ids(exports))) == 20, timeout=60)
            _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 20, 30, "commit of all 20")
    assert bridge.metrics.value(bridge.metrics.export_failures, code="UNAVAILABLE") >= 3


def _wait_for_total(collectors: list[FakeCollector], count: int, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(len(_client_ids(c.exports)) for c in collectors) >= count:
            return True
        time.sleep(0.05)
    return False


def test_two_replicas_share_partitions_across_a_rebalance_and_a_sigkill(broker, new_topic, collector, tmp_path):
    topic = new_topic(partitions=4)
    first_half = [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}") for i in range(100)]
    second_half = [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}") for i in range(100, 200)]
    _produce(broker.bootstrap, topic, first_half)
    properties = tmp_path / "consumer.properties"
    properties.write_text(CONSUMER_PROPERTIES)
    config_path = tmp_path / "bridge.yaml"
    config_path.write_text(
        f"kafka: {{bootstrap_servers: '{broker.bootstrap}', command_config: '{properties}', topics: [{topic}],"
        f" group_id: replicas}}\n"
        f"endpoints: [{{endpoint: '{collector.endpoint}', insecure: true}}]\n"
        "batch: {max_points: 20, linger_ms: 20}\n"
        "delivery: {commit_interval_s: 0.1}\n")
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    replica_a = _start_kcm_bridge(config_path, log_a)
    replica_b = None
    try:
        assert collector.wait_for(lambda exports: len(_client_ids(exports)) >= 20, timeout=60), log_a.read_text()
        replica_b = _start_kcm_bridge(config_path, log_b)
        _wait(lambda: "assigned " + topic in log_b.read_text(), 60, "replica B joining the group")
        _produce(broker.bootstrap, topic, second_half)
        replica_a.send_signal(signal.SIGKILL)
        replica_a.wait(10)
        everything = collector.wait_for(lambda exports: len(set(_client_ids(exports))) == 200, timeout=90)
        assert everything, log_b.read_text()
    finally:
        codes = [_terminate(process) for process in (replica_a, replica_b)]
    assert codes[1] == 0
    assert "revoking" in log_a.read_text(), "replica A never gave partitions to B"
    assert set(_client_ids(collector.exports)) == {f"client-{i}" for i in range(200)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_endpoint_down_pauses_consumption_with_bounded_memory_and_loses_nothing(closed_port, 
        backend, broker, new_topic, tmp_path):
    topic = new_topic()
    total = 120
    _produce_pushes(broker.bootstrap, topic, total)
    port = closed_port()
    config = _config(tmp_path, broker.bootstrap, topic, f"127.0.0.1:{port}", backend,
                     {("batch", "max_points"): 4, ("delivery", "max_inflight_bytes"): 3000})
    with running_bridge(config) as bridge:
        _wait(lambda: bridge.metrics.value(bridge.metrics.paused) == 1, 60, "pausing while the endpoint is down")
        time.sleep(1.0)  # were fetching not bounded, the whole backlog would arrive meanwhile
        consumed_while_down = bridge.metrics.value(bridge.metrics.records)
        assert consumed_while_down < total / 2
        assert bridge.metrics.value(bridge.metrics.inflight_bytes) < 2 * 3000
        # Nothing exported yet: the lag is what the partition's fetches reported, never more than was produced.
        _wait(lambda: bridge.metrics.value(bridge.metrics.lag, topic=topic, partition="0") > 0, 30, "lag reported")
        assert bridge.metrics.value(bridge.metrics.lag, topic=topic, partition="0") <= total
        # Paused, nothing is fetched, yet the lag follows what is produced meanwhile (the watermark is asked for).
        _produce(broker.bootstrap, topic, [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}")
                                           for i in range(total, total + 30)])
        _wait(lambda: bridge.metrics.value(bridge.metrics.lag, topic=topic, partition="0") == total + 30, 30,
              "the lag to count records produced while paused")
        total += 30
        with FakeCollector(port=port) as back:
            assert back.wait_for(lambda exports: len(set(_client_ids(exports))) == total, timeout=90)
            _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == total, 30, "final commit")
            _wait(lambda: bridge.metrics.value(bridge.metrics.lag, topic=topic, partition="0") == 0, 30, "no lag")
    assert bridge.metrics.value(bridge.metrics.paused) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_shutdown_while_kafka_is_down_is_bounded_and_commits_nothing_it_cannot(closed_port, 
        backend, broker, new_topic, tmp_path, caplog):
    """Kafka gone: exports still finish, but a commit would wait for the group coordinator up to the session timeout
    (12 s here: past the bound below; Tansu holds each JoinGroup for half of it); the loop does not try, and
    SIGTERM's drain ends within its own bound."""
    topic = new_topic()
    total = 10
    _produce_pushes(broker.bootstrap, topic, total)
    port = closed_port()
    config = _config(tmp_path, broker.bootstrap, topic, f"127.0.0.1:{port}", backend,
                     {("delivery", "shutdown_timeout_s"): 3, ("kafka", "connect_timeout_s"): 2})
    (tmp_path / "consumer.properties").write_text(
        "session.timeout.ms=12000\nheartbeat.interval.ms=2000\nauto.offset.reset=earliest\n")
    caplog.set_level(logging.INFO)
    with running_bridge(config) as bridge:
        _wait(lambda: bridge.metrics.value(bridge.metrics.records) == total, 60, "consuming every record")
        broker.stop()
        _wait(lambda: not bridge.ready, 30, "noticing that Kafka is down")
        with FakeCollector(port=port) as back:
            assert back.wait_for(lambda exports: len(set(_client_ids(exports))) == total, timeout=30)
            time.sleep(2 * config.delivery.commit_interval_s)   # commits fall due meanwhile
            stopping = time.monotonic()
    took = time.monotonic() - stopping
    assert took < 10, f"shutdown took {took:.1f}s with Kafka down"
    assert any("cannot be reached: exported records are left uncommitted" in r.getMessage()
               for r in caplog.records if r.name == "kcm.bridge")


def test_kafka_python_refusing_its_settings_stops_the_bridge_with_one_line_not_endless_retries(broker, new_topic,
                                                                                              tmp_path):
    # kafka-python checks some settings only once it has bootstrapped, when the bridge's first check builds it.
    config = _config(tmp_path, broker.bootstrap, new_topic(), "127.0.0.1:9", "kafka-python")
    (tmp_path / "consumer.properties").write_text("session.timeout.ms=1000\nheartbeat.interval.ms=2000\n")
    error = outcome_of_run(Bridge(config), 60)
    assert isinstance(error, UserError) and str(error).startswith(
        "the Kafka client rejected its settings: Heartbeat interval must be lower than the session timeout"), error


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encrypted_client_key_without_its_pass_phrase_is_refused_when_the_bridge_starts(backend, tmp_path):
    # Left to the Kafka client, kafka-python's OpenSSL would ask for it on the terminal.
    from test_kafka_settings import _encrypted_pem_pair

    cert, key = _encrypted_pem_pair(tmp_path)
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", backend)
    (tmp_path / "consumer.properties").write_text(f"{CONSUMER_PROPERTIES}security.protocol=SSL\n"
                                                  f"ssl.certificate.location={cert}\nssl.key.location={key}\n")
    with pytest.raises(KafkaConfigError, match=f"the key '{key}' is encrypted and no pass phrase was given"):
        Bridge(config)


def test_a_record_that_fails_in_an_unforeseen_way_costs_that_record_only(tmp_path, monkeypatch):
    """Whatever preparing one record raises, the record is counted (reason `unprocessable`) and skipped, and the
    records around it are batched as usual; nothing escapes into the consuming thread."""
    from kcm_bridge import pipeline
    from kcm_bridge.consumer import Record

    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka")
    with _unstarted_bridge(config) as bridge:
        real = bridge._prepare

        def prepare(record):
            if record.offset == 1:
                raise OverflowError("cannot convert float infinity to integer")
            return real(record)
        prepare.last_instance = None

        monkeypatch.setattr(bridge, "_prepare", prepare)
        key, value, headers = _push("app", "00000000-0000-0000-0000-000000000001")
        bridge._add([Record("metrics", 0, offset, key, value, headers) for offset in range(3)])
        assert bridge.metrics.value(bridge.metrics.decode_failures, reason=pipeline.UNPROCESSABLE) == 1
        assert len(bridge._batch.parts) == 2


def test_a_batch_refused_as_a_whole_whose_parts_are_all_taken_is_delivered_and_nothing_is_dropped(
        tmp_path, collector, caplog):
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    with _unstarted_bridge(config) as bridge:
        records = []
        for index in range(3):
            payload = _push(f"app-{index}", f"00000000-0000-0000-0000-00000000000{index}")[1]
            request = contract.decode(payload, [("content-encoding", b"zstd")]).metrics.SerializeToString()
            records.append((request, 2, b"", None, ("metrics", 0)))
        collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT, message="request too large")
        assert bridge._export(bridge._endpoints[0], records, _BatchTicket()).delivered
    exports = collector.exports
    assert len(exports) == 2 and [len(e.request.resource_metrics) for e in exports] in ([1, 2], [2, 1])
    assert [r.levelno for r in caplog.records if r.name == "kcm.bridge"] == [logging.WARNING]
    assert "the batch of 3 records was delivered in 2 smaller requests" in caplog.text
    assert bridge.metrics.value(bridge.metrics.points) == 6


def test_a_collector_claiming_more_rejected_points_than_sent_or_fewer_than_none_finishes_the_batch(
        tmp_path, collector):
    """Partial success with a count beyond the batch (or below zero) is the server's error: the batch still counts as
    exported, so its records can be committed. A count within it splits the batch's points between the counters."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    with _unstarted_bridge(config) as bridge:
        payload = _push("app", "00000000-0000-0000-0000-000000000001")[1]
        request = contract.decode(payload, [("content-encoding", b"zstd")]).metrics.SerializeToString()
        collector.reject_partially_next(10**6)
        part = (request, 12, b"", None, ("metrics", 0))
        assert bridge._export(bridge._endpoints[0], [part], _BatchTicket()).delivered
        collector.reject_partially_next(-5)
        assert bridge._export(bridge._endpoints[0], [part], _BatchTicket()).rejected_points == 0
        assert bridge.metrics.value(bridge.metrics.rejected) == 12
        assert bridge.metrics.value(bridge.metrics.points) == 12
        # The usual partial success, some points of many: those are rejected, the rest exported.
        collector.reject_partially_next(5)
        assert bridge._export(bridge._endpoints[0], [part], _BatchTicket()).rejected_points == 5
        assert bridge.metrics.value(bridge.metrics.rejected) == 12 + 5
        assert bridge.metrics.value(bridge.metrics.points) == 12 + 7


class _PausingConsumer:
    """Keeps each partition's pause flag across revoke and re-assign, as librdkafka does."""

    def __init__(self, assignment):
        self.assigned, self.paused = list(assignment), set()

    def assignment(self):
        return list(self.assigned)

    def pause(self, partitions):
        self.paused |= set(partitions)

    def resume(self, partitions):
        self.paused -= set(partitions)


def test_a_partition_paused_before_a_rebalance_is_resumed_when_it_comes_back(tmp_path, monkeypatch):
    from kcm_bridge import pipeline

    monkeypatch.setattr(pipeline, "_CLIENT_PAUSE_AFTER_S", 0.0)   # every pause pauses the client's partitions
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("delivery", "max_inflight_bytes"): 1000})
    with _unstarted_bridge(config) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = _PausingConsumer([partition])
        bridge._batch.size = 5000            # export is behind: pause
        bridge._backpressure()
        assert consumer.paused == {partition} and bridge.metrics.value(bridge.metrics.paused) == 1
        consumer.assigned = []               # a rebalance revokes everything...
        bridge._on_revoke([partition])
        bridge._batch.size = 0               # ...while the exports catch up
        bridge._backpressure()
        assert bridge.metrics.value(bridge.metrics.paused) == 0
        consumer.assigned = [partition]      # the partition comes back, still paused inside the client
        bridge._on_assign([partition])
        bridge._backpressure()
        assert consumer.paused == set()


def test_a_pause_pauses_the_clients_partitions_only_once_it_has_lasted(tmp_path):
    """Pausing partitions in librdkafka drops what it prefetched, and fetching that again after each resume took it
    0.1-0.5 s: a bridge reading a backlog paused a few times a second and waited half its time. A pause first only
    stops taking records; an endpoint slow or down for _CLIENT_PAUSE_AFTER_S pauses the partitions in the client."""
    from kcm_bridge import pipeline

    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("delivery", "max_inflight_bytes"): 1000})
    with _unstarted_bridge(config) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = _PausingConsumer([partition])
        bridge._batch.size = 5000            # export is behind: take no more records
        bridge._backpressure()
        assert bridge.metrics.value(bridge.metrics.paused) == 1 and consumer.paused == set()
        bridge._paused_since -= pipeline._CLIENT_PAUSE_AFTER_S   # still behind that much later
        bridge._backpressure()
        assert consumer.paused == {partition}
        bridge._batch.size = 0               # caught up
        bridge._backpressure()
        assert bridge.metrics.value(bridge.metrics.paused) == 0 and consumer.paused == set()


def test_consumption_paused_over_the_budget_resumes_only_at_half_of_it(tmp_path, monkeypatch):
    """Hysteresis: resuming as soon as the bytes dip under the budget would flap pause/resume (and log both) at every
    turn of a bridge exporting at the edge of it."""
    from kcm_bridge import pipeline

    monkeypatch.setattr(pipeline, "_CLIENT_PAUSE_AFTER_S", 0.0)   # every pause pauses the client's partitions
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("delivery", "max_inflight_bytes"): 1000})
    with _unstarted_bridge(config) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = _PausingConsumer([partition])
        for size, paused in ((1001, True), (1000, True), (750, True), (501, True), (500, False), (900, False),
                             (1001, True)):
            bridge._batch.size = size
            bridge._backpressure()
            assert (consumer.paused == {partition}) is paused, (size, consumer.paused)
            assert bridge.metrics.value(bridge.metrics.paused) == (1 if paused else 0)


class _CommittingConsumer(_PausingConsumer):
    """Records commits, and reports a high watermark per assigned partition."""

    def __init__(self, assignment, high: int) -> None:
        super().__init__(assignment)
        self.commits, self.high = [], high

    def commit(self, positions):
        self.commits.append(dict(positions))

    def high_watermarks(self, partitions, ask_s):
        return {partition: self.high for partition in partitions}


def test_committed_offset_and_lag_are_reported_per_partition_and_removed_when_it_is_revoked(tmp_path):
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka")
    with _unstarted_bridge(config) as bridge:
        kept, moved = ("metrics", 0), ("metrics", 1)
        consumer = bridge._consumer = _CommittingConsumer([kept, moved], high=10)
        bridge._kafka.recovered()  # Kafka answers
        for partition in (kept, moved):
            for offset in range(4):  # four records exported (no ticket: nothing outstanding) on each
                bridge._tracker.add(partition, offset, None)
        bridge._commit()
        bridge._report_lag()
        assert consumer.commits == [{kept: 4, moved: 4}]
        for partition in ("0", "1"):
            assert bridge.metrics.value(bridge.metrics.committed, topic="metrics", partition=partition) == 4
            assert bridge.metrics.value(bridge.metrics.lag, topic="metrics", partition=partition) == 6

        consumer.assigned = [kept]
        bridge._on_revoke([moved])
        exposition = prometheus_client.generate_latest(bridge.metrics.registry).decode()
    assert 'kcm_bridge_committed_offset{partition="0",topic="metrics"} 4.0' in exposition
    assert 'kcm_bridge_lag{partition="0",topic="metrics"} 6.0' in exposition
    assert 'partition="1"' not in exposition  # the next owner reports the partition that moved


def test_a_commit_kafka_refuses_is_not_recorded_and_the_next_one_commits_the_same_positions(tmp_path):
    """A commit fails during a rebalance or a coordinator move: recorded as done, an idle partition's position was
    never committed again (its records exported again after the next restart) and the gauge showed an offset Kafka
    never stored."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka")

    class Refusing(_CommittingConsumer):
        refusals = 1

        def commit(self, positions):
            if self.refusals:
                self.refusals -= 1
                raise RuntimeError("REBALANCE_IN_PROGRESS")
            super().commit(positions)

    with _unstarted_bridge(config) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = Refusing([partition], high=10)
        bridge._kafka.recovered()
        for offset in range(4):
            bridge._tracker.add(partition, offset, None)
        bridge._commit()
        assert consumer.commits == [] and bridge._tracker.to_commit() == {partition: 4}
        assert 'kcm_bridge_committed_offset{' not in prometheus_client.generate_latest(
            bridge.metrics.registry).decode()
        bridge._commit()   # nothing new was read: the same position, committed this time
        assert consumer.commits == [{partition: 4}] and bridge._tracker.to_commit() == {}
        assert bridge.metrics.value(bridge.metrics.committed, topic="metrics", partition="0") == 4


def test_the_confluent_consumer_commits_synchronously_so_a_refusal_reaches_the_bridge(kafka, new_topic):
    """The bridge records a commit as done when `commit` returns. With librdkafka's asynchronous commit a refusal
    would come later, to nobody, and the bridge would count offsets Kafka never stored as committed."""
    from kcm_bridge.consumer import open_consumer

    topic = new_topic()
    # A short session: Tansu holds each JoinGroup for half of it, and the first commit waits for the join.
    consumer = open_consumer("confluent-kafka", kafka, {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500},
                             f"bridge-{topic}", [topic], lambda _: None, lambda _: None)
    try:
        consumer.poll(1.0, 10)
        consumer.commit({(topic, 0): 5})
        assert _committed(kafka.bootstrap_servers, f"bridge-{topic}", topic) == 5
        with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_TOPIC_OR_PART"):
            consumer.commit({(f"{topic}-deleted", 0): 3})
    finally:
        consumer.close()


class _FlakyDeadLetters:
    """A dead-letter producer whose first `failures` writes fail."""

    def __init__(self, failures: int) -> None:
        self.failures, self.written = failures, []

    def send(self, topic, record, reason, on_done):
        if self.failures:
            self.failures -= 1
            on_done(False)
        else:
            self.written.append((topic, record.offset, reason))
            on_done(True)

    def flush(self, timeout_s):
        pass

    def close(self, timeout_s):
        pass


def test_a_failed_dead_letter_write_is_retried_and_its_record_committed_only_once_written(tmp_path, monkeypatch):
    from kcm_bridge import pipeline
    from kcm_bridge.consumer import Record
    from kcm_common.retry import RetryPolicy

    monkeypatch.setattr(pipeline, "KAFKA_RETRY", RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.1,
                                                            multiplier=2.0, jitter=0.0))
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        dead_letters = bridge._dead_letters = _FlakyDeadLetters(failures=2)
        partition = ("metrics", 0)
        bridge._add([Record("metrics", 0, 0, b"k", b"\xff not a payload", [])])
        assert bridge._tracker.to_commit().get(partition, 0) == 0 and bridge._inflight_bytes() > 0
        _wait(lambda: (bridge._serve_dead_letters(0), dead_letters.written)[1], 5, "the dead letter written")
        assert dead_letters.written == [("metrics-dlq", 0, "invalid-protobuf")]
        assert bridge.metrics.value(bridge.metrics.dead_letter_failures) == 2
        assert bridge.metrics.value(bridge.metrics.dead_lettered) == 1
        assert bridge._tracker.to_commit() == {partition: 1} and bridge._inflight_bytes() == 0


def test_empty_records_waiting_for_a_refusing_dead_letter_topic_fill_the_budget_and_pause_reading(tmp_path):
    from kcm_bridge.consumer import Record

    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq", ("delivery", "max_inflight_bytes"): 100_000})
    with _unstarted_bridge(config) as bridge:
        bridge._dead_letters = _FlakyDeadLetters(failures=10**9)
        bridge._add([Record("metrics", 0, offset, None, None, []) for offset in range(500)])   # tombstones
        assert bridge._tracker.pending() == 500   # each waits for its dead letter
        assert bridge._inflight_bytes() >= 500 * 256 > config.delivery.max_inflight_bytes
        assert bridge._poll_size() == 1   # the next polls fetch one record at a time, and backpressure pauses


@pytest.mark.parametrize("backend", BACKENDS)
def test_shutdown_with_exports_outstanding_ends_within_its_own_timeout(closed_port, backend, broker, new_topic,
                                                                     tmp_path):
    """Closing the consumer revokes its partitions: that revoke must not wait `revoke_timeout_s` again for exports
    the shutdown already gave up on."""
    topic = new_topic()
    _produce(broker.bootstrap, topic, [_push("client-0", "00000000-0000-0000-0000-000000000000")])
    port = closed_port()
    config = _config(tmp_path, broker.bootstrap, topic, f"127.0.0.1:{port}", backend,
                     {("delivery", "shutdown_timeout_s"): 1, ("delivery", "revoke_timeout_s"): 6})
    with running_bridge(config) as bridge:
        _wait(lambda: bridge.metrics.value(bridge.metrics.records) == 1, 60, "consuming the record")
        stopping = time.monotonic()
    took = time.monotonic() - stopping
    assert took < 4, f"shutdown took {took:.1f}s with shutdown_timeout_s 1"
    assert _committed(broker.bootstrap, config.kafka.group_id, topic) in (None, 0)   # nothing past the record


def test_records_that_expand_past_the_in_flight_budget_wait_unprepared_and_fetching_pauses(tmp_path, collector):
    """Small compressed records may decompress a thousandfold: one poll's worth must not all be held decoded. They
    are prepared as the budget allows, the rest wait undecoded, in order, and every one is exported in the end."""
    from kcm_bridge.consumer import Record

    key, value, headers = _push("app", "00000000-0000-0000-0000-000000000001")
    with _unstarted_bridge(_config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")) as probe:
        size = len(probe._prepare(Record("metrics", 0, 0, key, value, headers))[0])
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "max_inflight_bytes"): 3 * size, ("batch", "max_points"): 10**6})
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _PausingConsumer([("metrics", 0)])
        records = [Record("metrics", 0, offset, key, value, headers) for offset in range(20)]
        bridge._take(records)
        assert bridge._inflight_bytes() <= 3 * size and len(bridge._held) == 17
        bridge._backpressure()
        assert bridge._paused and bridge.metrics.value(bridge.metrics.paused) == 1   # takes no more records
        peak = 0
        deadline = time.monotonic() + 30
        while (bridge._held or bridge._batch.parts or bridge._tracker.pending()) and time.monotonic() < deadline:
            bridge._flush()
            time.sleep(0.05)
            bridge._take([])
            peak = max(peak, bridge._inflight_bytes())
        assert peak <= 4 * size and not bridge._held
        assert bridge._tracker.to_commit() == {("metrics", 0): 20}
        bridge._backpressure()
        assert not bridge._paused and bridge._consumer.paused == set()
        assert len(_client_ids(collector.exports)) == 20


def test_an_open_batch_that_keeps_the_bridge_paused_goes_at_once_not_after_its_linger(tmp_path, broker, collector):
    """With batch.max_bytes near or above delivery.max_inflight_bytes, the open batch alone filled the budget, fetching
    paused, and nothing sent it before its linger (up to a year): 1500 records took 28.7 s with a 3 s linger."""
    records = [_push(f"app-{i % 7}", f"00000000-0000-0000-0000-{i:012d}") for i in range(200)]
    _produce(broker.bootstrap, "metrics", records)
    budget = 20 * max(len(value) for _, value, _ in records)   # some 20 enriched records
    config = _config(tmp_path, broker.bootstrap, "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "max_inflight_bytes"): budget, ("batch", "max_points"): 10**6,
                      ("batch", "linger_ms"): 120_000})
    with running_bridge(config):
        # All but the last batch, which (below the budget, the bridge not paused) rightly waits for its linger.
        arrived = collector.wait_for(lambda exports: _resources(exports) >= 150, 30)
    assert arrived, f"{_resources(collector.exports)} of 200 records exported within 30 s; the linger is 120 s"


def _resources(exports) -> int:
    return sum(len(export.request.resource_metrics) for export in exports)


def test_kafka_python_dead_letters_with_writes_still_out_flush_and_close_without_raising():
    """kafka-python raises from flush/close while a write is out: at shutdown or on a revoke that must not escape."""
    from kafka.errors import KafkaTimeoutError

    from kcm_bridge.consumer import KafkaPythonDeadLetters

    class _Stuck:
        def flush(self, timeout=None):
            raise KafkaTimeoutError("Timeout waiting for future")

        def close(self, timeout=None):
            self.flush(timeout)

    letters = KafkaPythonDeadLetters(KafkaSettings("127.0.0.1:9"))
    letters._producer = _Stuck()
    letters.flush(0.05)
    letters.close(0)


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_closed_dead_letters_leave_no_connection_to_kafka(broker, client):
    """A closed bridge lets go of Kafka: librdkafka keeps its connections until its client is destroyed, and Tansu
    stops on SIGTERM only once every client has disconnected (a client left connected cost every test that
    dead-lettered 5 s of the broker's kill grace)."""
    from kcm_bridge.consumer import Record, open_dead_letter_producer

    letters, outcomes = open_dead_letter_producer(client, KafkaSettings(broker.bootstrap)), []
    record = Record("metrics", 0, 7, b"key", b"value", [], None, 1_700_000_000_000)
    deadline = time.monotonic() + 30
    while not outcomes and time.monotonic() < deadline:   # the first write may wait for the topic to be created
        letters.send("dlq", record, "invalid-protobuf", outcomes.append)
        letters.flush(5)
        if outcomes == [False]:
            outcomes.clear()
            time.sleep(0.2)
    assert outcomes == [True]
    letters.close(5)
    assert broker.stop(), "the broker had to be killed: a dead-letter client stayed connected after close"


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_a_large_dead_letter_is_written_compressed_as_the_receiver_writes_the_metrics_topic(tmp_path, client):
    """The records a collector refuses as too large are the ones most likely dead-lettered: the receiver wrote them
    zstd-compressed within the metrics topic's max.message.bytes, so written uncompressed, one would exceed a
    dead-letter topic of the same limit (Tansu enforces none: what the client sends is measured) and its partition
    would never be committed past it."""
    from kcm_bridge.consumer import Record, open_dead_letter_producer

    value = contract.encode(client_metrics("large"))[0] * 20_000   # some 4 MiB of repetitive protobuf
    assert len(value) > 4 * 2**20
    with reserved_port() as port:
        proxy = CountingProxy(f"127.0.0.1:{port}")
        broker = EmbeddedBroker(port=port, advertised=proxy.endpoint, log_path=tmp_path / "tansu.log")
        broker.start()
    try:
        ensure_topic(KafkaSettings(proxy.endpoint), "dlq", 1)   # created on a first write, Tansu's would have 4
        letters, outcomes = open_dead_letter_producer(client, KafkaSettings(proxy.endpoint)), []
        record = Record("metrics", 0, 7, b"key", value, [], None, 1_700_000_000_000)
        letters.send("dlq", record, "refused-by-collector", outcomes.append)
        letters.flush(20)
        letters.close(5)
        assert outcomes == [True]
        assert proxy.sent < 2**20, f"{proxy.sent} bytes sent to write a {len(value)}-byte dead letter"
        reader = confluent_kafka.Consumer({"bootstrap.servers": proxy.endpoint, "group.id": "check",
                                           "fetch.max.bytes": 64 * 2**20, "max.partition.fetch.bytes": 64 * 2**20})
        try:
            reader.assign([confluent_kafka.TopicPartition("dlq", 0, 0)])
            deadline, read = time.monotonic() + 20, None
            while read is None and time.monotonic() < deadline:
                read = reader.poll(0.5)
            assert read is not None and read.error() is None and read.value() == value
        finally:
            reader.close()
    finally:
        broker.stop()
        proxy.close()


def test_a_flood_of_one_kind_of_event_is_logged_once_per_period_with_a_count(caplog):
    """A refusing dead-letter topic or a corrupt stream: one line per period, then how many were held back."""
    from kcm_common.pacing import PacedLog

    now = [100.0]
    paced = PacedLog(logging.getLogger("kcm.bridge.test"), logging.ERROR, period_s=10, clock=lambda: now[0])
    caplog.set_level(logging.ERROR)
    for offset in range(50):
        paced("dead-lettering metrics/0@%d failed: %s", offset, "Broker: Topic authorization failed")
    now[0] += 10
    paced("dead-lettering metrics/0@%d failed: %s", 50, "Broker: Topic authorization failed")
    lines = [r.getMessage() for r in caplog.records if r.name == "kcm.bridge.test"]
    assert lines == ["dead-lettering metrics/0@0 failed: Broker: Topic authorization failed",
                     "dead-lettering metrics/0@50 failed: Broker: Topic authorization failed "
                     "(49 more like it in the last 10s)"]
