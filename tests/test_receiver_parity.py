"""The sandbox's two receivers, fed the same pushes, write the same contract v1 records.

Only what one of them can know differs: the subscription id (the Python receiver sits in the gateway; Kafka's plugin
API never hands it over) and the push interval (not given to a plugin before the Kafka 4.2 API).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.java_receiver import JavaReceiver
from kcm_sandbox.receiver import TopicReceiver
from kcm_sandbox.runner import Sandbox, SandboxError
from kcm_sandbox.telemetry import ClientIdentity, PushResult
from test_sandbox_protocol import NONE, KafkaConnection, announce_software, new_client, push

ONLY_PYTHON_KNOWS = {"subscription_id"}


def _pushes(sandbox) -> list[tuple[uuid.UUID, ClientIdentity, PushResult]]:
    """What the sandbox's gateway hands its receiver for real pushes: from a client that announced its software
    and from a bare one (a null client id, no ApiVersions v3+)."""
    metrics = MetricsData()
    gauge = metrics.resource_metrics.add().scope_metrics.add().metrics.add()
    gauge.name = "org.apache.kafka.producer.record.queue.time.avg"
    gauge.gauge.data_points.add().as_double = float("nan")
    payload = metrics.SerializeToString()
    handed: list[tuple[uuid.UUID, ClientIdentity, PushResult]] = []
    receive = sandbox.gateway.receiver

    def capture(*push: Any) -> None:
        handed.append(push)
        receive(*push)

    sandbox.gateway.receiver = capture
    try:
        with KafkaConnection(sandbox.bootstrap, client_id="orders-1") as full:
            announce_software(full, "apache-kafka-java", "4.3.0")
            instance_id, subscription_id = new_client(full)
            assert push(full, instance_id, subscription_id, payload=payload, compression=NONE) == 0
            with KafkaConnection(sandbox.bootstrap, client_id=None) as bare:
                bare_id, bare_subscription = new_client(bare)
                assert push(bare, bare_id, bare_subscription, payload=payload, compression=NONE) == 0
            assert push(full, instance_id, subscription_id, payload=payload, compression=NONE, terminating=True) == 0
    finally:
        sandbox.gateway.receiver = receive
    return handed


def _read(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes, dict[str, str]]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        records: list[tuple[bytes, bytes, dict[str, str]]] = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records += [(r.key, r.value, {k: v.decode() for k, v in r.headers}) for r in batch]
        return records
    finally:
        consumer.close()


@pytest.mark.parametrize("api", ["3.8", "4.2"])
def test_both_receivers_write_the_same_records_apart_from_what_only_one_knows(sandbox, api):
    settings = KafkaSettings(sandbox.bootstrap)
    ensure_topic(settings, "from-python", 1)
    ensure_topic(settings, "from-java", 1)
    python = TopicReceiver(settings, "from-python", 111, "kcm-sandbox")
    java = JavaReceiver(sandbox.bootstrap, "from-java", 111, "kcm-sandbox", api=api)
    pushes = _pushes(sandbox)
    try:
        for handed in pushes:
            python(*handed)
            java(*handed)
    finally:
        python.close()
        java.close()  # flushes what the plugin still holds

    written_by_python = _read(sandbox.bootstrap, "from-python", len(pushes))
    written_by_java = _read(sandbox.bootstrap, "from-java", len(pushes))
    assert len(written_by_python) == len(written_by_java) == len(pushes)
    for (py_key, py_value, py_headers), (java_key, java_value, java_headers) in zip(written_by_python,
                                                                                     written_by_java):
        assert py_key == java_key and py_value == java_value
        only_python = ONLY_PYTHON_KNOWS | ({"push_interval_ms"} if api == "3.8" else set())
        assert {k: v for k, v in py_headers.items() if k not in only_python} == java_headers
    assert [headers["subscription_id"] for _, _, headers in written_by_python] == [
        str(result.subscription_id) for _, _, result in pushes]
    full_python, bare_python, bare_java = written_by_python[0][2], written_by_python[1][2], written_by_java[1][2]
    assert (full_python["client_software_name"], full_python["client_software_version"]) == ("apache-kafka-java",
                                                                                             "4.3.0")
    for unknown in ("client_software_name", "client_software_version"):
        assert unknown not in bare_python and unknown not in bare_java
    # A broker never has a null client id (RequestHeader.parse reads it as ""): the plugin writes it empty.
    assert bare_python["client_id"] == bare_java["client_id"] == ""


def test_a_push_with_no_client_id_is_written_with_the_empty_one_and_one_without_metrics_not_at_all(sandbox):
    settings = KafkaSettings(sandbox.bootstrap)
    ensure_topic(settings, "no-client-id-python", 1)
    ensure_topic(settings, "no-client-id-java", 1)
    python = TopicReceiver(settings, "no-client-id-python", 111, "kcm-sandbox")
    java = JavaReceiver(sandbox.bootstrap, "no-client-id-java", 111, "kcm-sandbox")
    pushed = PushResult(error_code=0, throttle_time_ms=0, payload=b"\n\x00", subscription_id=1,
                        push_interval_ms=1000, terminating=False)
    no_metrics = dataclasses.replace(pushed, payload=b"")   # a subscription selecting none of the client's metrics
    identity = ClientIdentity(None, "unknown", "unknown", "127.0.0.1", 40000)
    try:
        for handed in (no_metrics, pushed):
            python(uuid.uuid4(), identity, handed)
            java(uuid.uuid4(), identity, handed)
    finally:
        python.close()
        java.close()

    # Neither writes the push without metrics (readers would count an empty value as undecodable): the first
    # record is the one after it.
    (python_record,) = _read(sandbox.bootstrap, "no-client-id-python", 1)
    (java_record,) = _read(sandbox.bootstrap, "no-client-id-java", 1)
    assert python_record[1] == java_record[1] == b"\n\x00"
    assert python_record[2]["client_id"] == java_record[2]["client_id"] == ""


def test_while_its_receiver_starts_the_sandbox_accepts_a_push_without_metrics_and_refuses_one_with():
    # The gateway serves before the metrics topic and receiver exist: a push with nothing to write is accepted then,
    # as once the receiver is up, while one with metrics is refused (the gateway answers INVALID_RECORD).
    starting = Sandbox()
    pushed = PushResult(error_code=0, throttle_time_ms=0, payload=b"\n\x00", subscription_id=1,
                        push_interval_ms=1000, terminating=False)
    identity = ClientIdentity("orders", "apache-kafka-java", "4.3.0", "127.0.0.1", 40000)
    starting._receive(uuid.uuid4(), identity, dataclasses.replace(pushed, payload=b""))
    with pytest.raises(SandboxError, match="the metrics topic is not ready yet"):
        starting._receive(uuid.uuid4(), identity, pushed)
