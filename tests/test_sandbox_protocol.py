"""The sandbox gateway on a real socket: KIP-714 and CLIENT_METRICS answered as Apache Kafka 4.x answers them,
every other API passed through to the embedded broker."""

from __future__ import annotations

import itertools
import logging
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListConfigResourcesRequest,
    ListConfigResourcesResponse,
)
from kafka.protocol.admin.topics import DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from payloads import client_metrics

from kcm_common.codes import INVALID_CONFIG, INVALID_REQUEST, UNKNOWN_SERVER_ERROR, UNSUPPORTED_VERSION
from kcm_common.contract import compress, decode
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)

TIMEOUT_S = 5.0
CLIENT_METRICS = 16
TOPIC = 2
SOURCE_CLIENT_METRICS, SOURCE_DEFAULT = 7, 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
NONE, GZIP, ZSTD = 0, 1, 4
UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD, THROTTLING_QUOTA_EXCEEDED = 76, 87, 89
UNKNOWN_SUBSCRIPTION_ID, TELEMETRY_TOO_LARGE = 117, 118
TOPIC_DELETION_DISABLED = 73
ZERO = uuid.UUID(int=0)
METRICS = client_metrics().SerializeToString()


class KafkaConnection:
    """A bare Kafka-protocol socket: frames requests, reads framed answers, never waits longer than TIMEOUT_S."""

    def __init__(self, bootstrap: str, client_id: str | None = "kcm-protocol-test") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.client_id = client_id
        self._correlation_ids = itertools.count(1)

    def send(self, request: Any) -> int:
        correlation_id = next(self._correlation_ids)
        request.with_header(correlation_id=correlation_id, client_id=self.client_id)
        self.sock.sendall(request.encode(header=True, framed=True))
        return correlation_id

    def receive(self, response_class: Any, version: int, correlation_id: int) -> Any:
        frame = self.read_frame()
        assert frame is not None, "the gateway closed the connection instead of answering"
        response = response_class.decode(frame, version=version, header=True)
        assert response.header.correlation_id == correlation_id
        return response

    def call(self, request: Any, response_class: Any) -> Any:
        return self.receive(response_class, request.API_VERSION, self.send(request))

    def read_frame(self) -> bytes | None:
        prefix = self._read(4)
        if not prefix:
            return None
        (size,) = struct.unpack(">i", prefix)
        payload = self._read(size)
        assert len(payload) == size, "the gateway closed the connection in the middle of an answer"
        return payload

    def closed_by_peer(self) -> bool:
        """Whether the gateway has closed its end (end of stream or reset) rather than sending anything."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def unframed(request: Any, client_id: str = "kcm-protocol-test") -> bytes:
    request.with_header(correlation_id=1, client_id=client_id)
    return bytes(request.encode(header=True))


# --- KIP-714 calls -----------------------------------------------------------------------------------------------


def get_subscriptions(connection: KafkaConnection, instance_id: uuid.UUID = ZERO) -> Any:
    return connection.call(GetTelemetrySubscriptionsRequest[0](client_instance_id=instance_id),
                           GetTelemetrySubscriptionsResponse)


def new_client(connection: KafkaConnection) -> tuple[uuid.UUID, int]:
    """A Get with a zero instance id: the (instance id, subscription id) the gateway assigned."""
    response = get_subscriptions(connection)
    assert response.error_code == 0
    return response.client_instance_id, response.subscription_id


def push(connection: KafkaConnection, instance_id: uuid.UUID, subscription_id: int, *,
         payload: bytes | None = None, compression: int = ZSTD, terminating: bool = False) -> int:
    """A PushTelemetry; by default the sample metrics, zstd-compressed. Returns the error code."""
    if payload is None:
        payload = compress(METRICS, "zstd") if compression == ZSTD else METRICS
    request = PushTelemetryRequest[0](client_instance_id=instance_id, subscription_id=subscription_id,
                                      terminating=terminating, compression_type=compression, metrics=payload)
    response = connection.call(request, PushTelemetryResponse)
    assert response.throttle_time_ms == 0
    return response.error_code


def api_versions_request(version: int) -> Any:
    software = {"client_software_name": "kcm-test", "client_software_version": "1"} if version >= 3 else {}
    return ApiVersionsRequest[version](**software)


def announce_software(connection: KafkaConnection, name: str, version: str) -> None:
    response = connection.call(ApiVersionsRequest[3](client_software_name=name, client_software_version=version),
                               ApiVersionsResponse)
    assert response.error_code == 0


# --- config calls -------------------------------------------------------------------------------------------------


@pytest.fixture
def admin(sandbox) -> KafkaAdminClient:
    client = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000))
    yield client
    client.close()


def subscribe(admin: KafkaAdminClient, name: str, **configs: str) -> None:
    """SET `interval_ms="100"`-style configs on a subscription through kafka-python's admin client."""
    resource = ConfigResource(ConfigResourceType.CLIENT_METRICS, name,
                              configs={key.replace("_", "."): value for key, value in configs.items()})
    assert admin.alter_configs([resource], raise_on_unknown=False, incremental=True) == {"client_metrics": {name: "OK"}}


def incremental_alter(connection: KafkaConnection, name: str, *ops: tuple[str, int, str | None],
                      validate_only: bool = False) -> int:
    request = IncrementalAlterConfigsRequest[1](resources=[(CLIENT_METRICS, name, list(ops))],
                                                validate_only=validate_only)
    (result,) = connection.call(request, IncrementalAlterConfigsResponse).responses
    assert (result.resource_type, result.resource_name) == (CLIENT_METRICS, name)
    return result.error_code


def legacy_alter(connection: KafkaConnection, name: str, configs: dict[str, str]) -> int:
    request = AlterConfigsRequest[2](resources=[(CLIENT_METRICS, name, list(configs.items()))], validate_only=False)
    (result,) = connection.call(request, AlterConfigsResponse).responses
    assert (result.resource_type, result.resource_name) == (CLIENT_METRICS, name)
    return result.error_code


def described(connection: KafkaConnection, name: str) -> dict[str, tuple[str | None, int]]:
    """DescribeConfigs v4 of one subscription: {key: (value, config source)}."""
    request = DescribeConfigsRequest[4](resources=[(CLIENT_METRICS, name, None)], include_synonyms=False,
                                        include_documentation=False)
    (result,) = connection.call(request, DescribeConfigsResponse).results
    assert (result.error_code, result.resource_type, result.resource_name) == (0, CLIENT_METRICS, name)
    return {entry.name: (entry.value, entry.config_source) for entry in result.configs}


def listed(connection: KafkaConnection, version: int, resource_types: list[int] | None = None) -> list[tuple[str, int]]:
    """ListConfigResources at `version`: [(name, resource type)]."""
    fields = {"resource_types": resource_types or []} if version >= 1 else {}
    response = connection.call(ListConfigResourcesRequest[version](**fields), ListConfigResourcesResponse)
    assert response.error_code == 0
    return [(entry.resource_name, entry.resource_type) for entry in response.config_resources]


def metrics_records(sandbox, expected: int, timeout_s: float = 15.0) -> list[Any]:
    """Every record on the metrics topic: waits for `expected`, then half a second more for any extra one."""
    consumer = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100, request_timeout_ms=int(TIMEOUT_S * 1000) + 1000)
    try:
        consumer.assign([TopicPartition(sandbox.options.topic, 0)])
        consumer.seek_to_beginning()
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        settle = time.monotonic() + 0.5
        while time.monotonic() < settle:
            for batch in consumer.poll(timeout_ms=100).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


# --- ApiVersions ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3, 4])
def test_api_versions_adds_the_kip714_apis_and_keeps_every_upstream_api(sandbox, version):
    with KafkaConnection(sandbox.bootstrap) as gateway, KafkaConnection(sandbox.upstream_bootstrap) as upstream:
        through_gateway = gateway.call(api_versions_request(version), ApiVersionsResponse)
        direct = upstream.call(api_versions_request(version), ApiVersionsResponse)

    offered = {k.api_key: (k.min_version, k.max_version) for k in through_gateway.api_keys}
    upstream_offers = {k.api_key: (k.min_version, k.max_version) for k in direct.api_keys}
    assert through_gateway.error_code == 0
    assert offered[71] == (0, 0) and offered[72] == (0, 0) and offered[74] == (0, 1)
    assert offered[0] == upstream_offers[0] and offered[3] == upstream_offers[3]  # Produce, Metadata
    # Config APIs are capped at what the gateway can parse to split off CLIENT_METRICS resources.
    assert offered[32] == (0, min(upstream_offers[32][1], DescribeConfigsRequest.max_version))
    assert offered[44] == (0, min(upstream_offers[44][1], IncrementalAlterConfigsRequest.max_version))
    assert offered[33] == (0, AlterConfigsRequest.max_version)
    passed_through = {key: upstream_offers[key] for key in upstream_offers if key not in (32, 33, 44, 71, 72, 74)}
    assert {key: offered[key] for key in passed_through} == passed_through
    assert set(offered) == set(upstream_offers) | {33, 72, 74}


def test_api_versions_at_a_version_too_new_gets_a_v0_unsupported_version_answer_listing_what_is_supported(sandbox):
    request = api_versions_request(3)
    request.with_header(correlation_id=41, client_id="future-client")
    raw = bytearray(request.encode(header=True, framed=True))
    raw[6:8] = (99).to_bytes(2, "big")  # ApiVersions v99

    with KafkaConnection(sandbox.bootstrap) as gateway:
        gateway.sock.sendall(bytes(raw))
        answer = ApiVersionsResponse.decode(gateway.read_frame(), version=0, header=True)

    assert answer.header.correlation_id == 41
    assert answer.error_code == 35  # UNSUPPORTED_VERSION
    offered = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert offered[18] == (0, 4) and offered[71] == (0, 0) and offered[72] == (0, 0)


# --- CLIENT_METRICS validation ------------------------------------------------------------------------------------

INVALID_CONFIGS = [
    pytest.param({"metrics": "org.apache.kafka.", "push.interval": "1000"}, INVALID_REQUEST, id="unknown-key"),
    pytest.param({"interval.ms": "50"}, INVALID_REQUEST, id="interval-below-100"),
    pytest.param({"interval.ms": "3600001"}, INVALID_REQUEST, id="interval-above-one-hour"),
    pytest.param({"interval.ms": "soon"}, INVALID_CONFIG, id="interval-not-an-integer"),
    pytest.param({"interval.ms": "1.5"}, INVALID_CONFIG, id="interval-not-an-integer-decimal"),
    pytest.param({"match": "client_colour=red"}, INVALID_CONFIG, id="unknown-match-key"),
    pytest.param({"match": "client_id"}, INVALID_CONFIG, id="match-without-pattern"),
    pytest.param({"match": "client_id=["}, INVALID_CONFIG, id="invalid-regex"),
]


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "legacy"])
@pytest.mark.parametrize(("configs", "code"), INVALID_CONFIGS)
def test_admin_client_gets_kafkas_error_code_for_an_invalid_subscription(admin, configs, code, incremental):
    resource = ConfigResource(ConfigResourceType.CLIENT_METRICS, "bad", configs=dict(configs))

    result = admin.alter_configs([resource], raise_on_unknown=False, incremental=incremental)

    assert result["client_metrics"]["bad"].startswith(f"[Error {code}] ")
    assert admin.list_config_resources() == {}


@pytest.mark.parametrize(("configs", "code"), INVALID_CONFIGS)
def test_raw_alter_requests_get_kafkas_error_code_and_store_nothing(sandbox, configs, code):
    with KafkaConnection(sandbox.bootstrap) as connection:
        incremental = incremental_alter(connection, "bad", *[(key, SET, value) for key, value in configs.items()])
        legacy = legacy_alter(connection, "bad", configs)
        validated = incremental_alter(connection, "bad", *[(key, SET, value) for key, value in configs.items()],
                                      validate_only=True)

        assert (incremental, legacy, validated) == (code, code, code)
        assert listed(connection, 0) == []


def test_each_resource_of_an_alter_request_is_answered_on_its_own(sandbox):
    request = IncrementalAlterConfigsRequest[1](resources=[
        (CLIENT_METRICS, "too-fast", [("interval.ms", SET, "99")]),
        (CLIENT_METRICS, "fastest", [("interval.ms", SET, "100")]),
        (CLIENT_METRICS, "slowest", [("interval.ms", SET, "3600000")]),
    ], validate_only=False)
    with KafkaConnection(sandbox.bootstrap) as connection:
        results = connection.call(request, IncrementalAlterConfigsResponse).responses

        assert [(r.resource_name, r.error_code) for r in results] == [("too-fast", 42), ("fastest", 0), ("slowest", 0)]
        assert results[0].error_message and results[1].error_message is None
        assert listed(connection, 0) == [("fastest", CLIENT_METRICS), ("slowest", CLIENT_METRICS)]


def test_validate_only_accepts_a_valid_subscription_without_storing_it(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        assert incremental_alter(connection, "dry-run", ("metrics", SET, "*"), validate_only=True) == 0
        assert listed(connection, 0) == []


# --- describe and list ----------------------------------------------------------------------------------------------


def test_describe_shows_exactly_what_incremental_set_append_subtract_and_delete_left(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.", interval_ms="60000",
              match="client_id=payments-.*")
    with KafkaConnection(sandbox.bootstrap) as connection:
        assert described(connection, "payments") == {
            "metrics": ("org.apache.kafka.producer.", SOURCE_CLIENT_METRICS),
            "interval.ms": ("60000", SOURCE_CLIENT_METRICS),
            "match": ("client_id=payments-.*", SOURCE_CLIENT_METRICS),
        }

        assert incremental_alter(connection, "payments", ("metrics", APPEND, "org.apache.kafka.consumer.")) == 0
        assert described(connection, "payments")["metrics"] == (
            "org.apache.kafka.producer.,org.apache.kafka.consumer.", SOURCE_CLIENT_METRICS)

        assert incremental_alter(connection, "payments", ("metrics", SUBTRACT, "org.apache.kafka.producer.")) == 0
        assert described(connection, "payments")["metrics"] == ("org.apache.kafka.consumer.", SOURCE_CLIENT_METRICS)

        assert incremental_alter(connection, "payments", ("match", DELETE, None), ("interval.ms", SET, "120000")) == 0
        assert described(connection, "payments") == {
            "metrics": ("org.apache.kafka.consumer.", SOURCE_CLIENT_METRICS),
            "interval.ms": ("120000", SOURCE_CLIENT_METRICS),
            "match": ("", SOURCE_DEFAULT),
        }

    modified = admin.describe_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "payments")])
    entries = modified["client_metrics"]["payments"]
    assert {key: (entry["value"], entry["config_source"]) for key, entry in entries.items()} == {
        "metrics": ("org.apache.kafka.consumer.", "DYNAMIC_CLIENT_METRICS_CONFIG"),
        "interval.ms": ("120000", "DYNAMIC_CLIENT_METRICS_CONFIG"),
    }


def test_legacy_alter_configs_replaces_every_config_and_an_empty_one_removes_the_subscription(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.", interval_ms="60000",
              match="client_id=payments-.*")
    with KafkaConnection(sandbox.bootstrap) as connection:
        assert legacy_alter(connection, "payments", {"metrics": "*"}) == 0
        assert described(connection, "payments") == {
            "metrics": ("*", SOURCE_CLIENT_METRICS),
            "interval.ms": ("300000", SOURCE_DEFAULT),
            "match": ("", SOURCE_DEFAULT),
        }

        assert legacy_alter(connection, "payments", {}) == 0
        assert listed(connection, 0) == []


def test_deleting_every_key_removes_the_subscription_from_list_config_resources(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.", interval_ms="60000")
    subscribe(admin, "orders", metrics="*")
    with KafkaConnection(sandbox.bootstrap) as connection:
        everything = [("orders", CLIENT_METRICS), ("payments", CLIENT_METRICS)]
        assert listed(connection, 0) == everything
        assert listed(connection, 1) == everything
        assert listed(connection, 1, [CLIENT_METRICS]) == everything

        assert incremental_alter(connection, "payments", ("metrics", DELETE, None), ("interval.ms", DELETE, None)) == 0

        assert listed(connection, 0) == [("orders", CLIENT_METRICS)]
        assert listed(connection, 1) == [("orders", CLIENT_METRICS)]
        assert described(connection, "payments") == {
            "metrics": ("", SOURCE_DEFAULT), "interval.ms": ("300000", SOURCE_DEFAULT), "match": ("", SOURCE_DEFAULT)}
    assert admin.list_config_resources() == {"client_metrics": ["orders"]}


def test_describe_mixing_topic_and_subscriptions_answers_each_in_request_order(sandbox, admin):
    admin.create_topics([NewTopic("orders", num_partitions=1, replication_factor=1)])
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.")
    resources = [(CLIENT_METRICS, "payments", ["metrics"]), (TOPIC, "orders", None), (CLIENT_METRICS, "absent", None)]
    request = DescribeConfigsRequest[4](resources=resources, include_synonyms=False, include_documentation=False)
    topic_only = DescribeConfigsRequest[4](resources=[(TOPIC, "orders", None)], include_synonyms=False,
                                           include_documentation=False)
    with KafkaConnection(sandbox.bootstrap) as gateway, KafkaConnection(sandbox.upstream_bootstrap) as upstream:
        results = gateway.call(request, DescribeConfigsResponse).results
        (upstream_topic,) = upstream.call(topic_only, DescribeConfigsResponse).results

    assert [(r.resource_type, r.resource_name, r.error_code) for r in results] == [
        (CLIENT_METRICS, "payments", 0), (TOPIC, "orders", 0), (CLIENT_METRICS, "absent", 0)]
    assert [(c.name, c.value, c.config_source) for c in results[0].configs] == [
        ("metrics", "org.apache.kafka.producer.", SOURCE_CLIENT_METRICS)]
    assert results[1] == upstream_topic
    assert {c.name: (c.value, c.config_source) for c in results[2].configs} == {
        "metrics": ("", SOURCE_DEFAULT), "interval.ms": ("300000", SOURCE_DEFAULT), "match": ("", SOURCE_DEFAULT)}


def test_a_merged_answer_the_broker_wrote_malformed_answers_its_resources_with_an_error_and_keeps_the_connection(
        sandbox, admin, caplog):
    """The embedded broker's DescribeConfigs v0 of a topic whose configs were changed cannot be read: mixed with a
    subscription, the topic gets UNKNOWN_SERVER_ERROR (a WARNING, no traceback), the subscription its answer, and
    the connection serves on. Asked at v1 the same resources merge."""
    admin.create_topics([NewTopic("changed", num_partitions=1, replication_factor=1)])
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.")
    resources = [(TOPIC, "changed", None), (CLIENT_METRICS, "payments", ["metrics"])]
    with KafkaConnection(sandbox.bootstrap) as gateway:
        change = IncrementalAlterConfigsRequest[0](resources=[(TOPIC, "changed", [("retention.ms", 0, "86400000")])],
                                                   validate_only=False)
        assert [r.error_code for r in gateway.call(change, IncrementalAlterConfigsResponse).responses] == [0]
        answers = [gateway.call(DescribeConfigsRequest[version](resources=resources, include_synonyms=False,
                                                                include_documentation=False),
                                DescribeConfigsResponse).results for version in (0, 1)]

    (topic, subscription), (topic_v1, subscription_v1) = answers
    assert (topic.resource_name, topic.error_code, topic.configs) == ("changed", UNKNOWN_SERVER_ERROR, [])
    assert "DescribeConfigs v0 answer could not be read" in topic.error_message
    assert (subscription.resource_name, subscription.error_code) == ("payments", 0)
    assert [(c.name, c.value) for c in subscription.configs] == [("metrics", "org.apache.kafka.producer.")]
    assert (topic_v1.error_code, subscription_v1.error_code) == (0, 0)
    assert ("retention.ms", "86400000") in [(c.name, c.value) for c in topic_v1.configs]
    said = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"] and not any(r.exc_info for r in caplog.records)


def test_describe_with_synonyms_lists_each_set_key_as_its_own_client_metrics_synonym(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.")
    request = DescribeConfigsRequest[4](resources=[(CLIENT_METRICS, "payments", None)], include_synonyms=True,
                                        include_documentation=False)
    with KafkaConnection(sandbox.bootstrap) as connection:
        (result,) = connection.call(request, DescribeConfigsResponse).results

    assert {c.name: [(s.name, s.value, s.source) for s in c.synonyms] for c in result.configs} == {
        "metrics": [("metrics", "org.apache.kafka.producer.", SOURCE_CLIENT_METRICS)],
        "interval.ms": [],
        "match": [],
    }


def test_a_subscription_named_twice_in_one_describe_is_answered_twice_with_its_own_keys(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.")
    request = DescribeConfigsRequest[4](resources=[(CLIENT_METRICS, "payments", ["metrics"]),
                                                   (CLIENT_METRICS, "payments", ["match"])],
                                        include_synonyms=False, include_documentation=False)
    with KafkaConnection(sandbox.bootstrap) as connection:
        results = connection.call(request, DescribeConfigsResponse).results

    assert [[c.name for c in result.configs] for result in results] == [["metrics"], ["match"]]


def test_describe_lists_entries_in_kafkas_hash_map_order_with_documentation_only_when_asked(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.")

    def describe(include_documentation: bool) -> list[tuple[str, str | None]]:
        request = DescribeConfigsRequest[4](resources=[(CLIENT_METRICS, "payments", None)], include_synonyms=False,
                                            include_documentation=include_documentation)
        with KafkaConnection(sandbox.bootstrap) as connection:
            (result,) = connection.call(request, DescribeConfigsResponse).results
        return [(entry.name, entry.documentation) for entry in result.configs]

    # ConfigHelperUtils.createResponseConfig streams AbstractConfig values: a java.util.HashMap.
    assert describe(True) == [("interval.ms", "Metrics push interval in milliseconds"),
                              ("match", "Client match criteria"), ("metrics", "Telemetry metric name prefix list")]
    assert describe(False) == [("interval.ms", None), ("match", None), ("metrics", None)]


@pytest.mark.parametrize("api", ["incremental", "legacy"])
def test_a_resource_named_twice_in_one_alter_is_refused_for_every_copy_and_nothing_changes(sandbox, api):
    if api == "incremental":
        request = IncrementalAlterConfigsRequest[1](resources=[
            (CLIENT_METRICS, "twice", [("interval.ms", SET, "1000")]),
            (CLIENT_METRICS, "once", [("interval.ms", SET, "2000")]),
            (TOPIC, "no-such-topic", [("retention.ms", SET, "1000")]),
            (CLIENT_METRICS, "twice", [("metrics", SET, "*")]),
            (TOPIC, "no-such-topic", [("retention.ms", SET, "2000")]),
        ], validate_only=False)
        response_class = IncrementalAlterConfigsResponse
    else:
        request = AlterConfigsRequest[2](resources=[
            (CLIENT_METRICS, "twice", [("interval.ms", "1000")]),
            (CLIENT_METRICS, "once", [("interval.ms", "2000")]),
            (TOPIC, "no-such-topic", [("retention.ms", "1000")]),
            (CLIENT_METRICS, "twice", [("metrics", "*")]),
            (TOPIC, "no-such-topic", [("retention.ms", "2000")]),
        ], validate_only=False)
        response_class = AlterConfigsResponse
    with KafkaConnection(sandbox.bootstrap) as connection:
        results = connection.call(request, response_class).responses

        assert [(r.resource_name, r.error_code, r.error_message) for r in results] == [
            ("twice", INVALID_REQUEST, "Each resource must appear at most once."),
            ("once", 0, None),
            ("no-such-topic", INVALID_REQUEST, "Each resource must appear at most once."),
            ("twice", INVALID_REQUEST, "Each resource must appear at most once."),
            ("no-such-topic", INVALID_REQUEST, "Each resource must appear at most once."),
        ]
        assert listed(connection, 0) == [("once", CLIENT_METRICS)]


def test_a_key_repeated_in_one_legacy_alter_is_an_invalid_request_and_changes_nothing(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        assert legacy_alter(connection, "kept", {"interval.ms": "1000"}) == 0
        request = AlterConfigsRequest[2](resources=[
            (CLIENT_METRICS, "kept", [("interval.ms", "2000"), ("interval.ms", "3000")])], validate_only=False)
        (result,) = connection.call(request, AlterConfigsResponse).responses

        assert (result.error_code, result.error_message) == (INVALID_REQUEST, "Error due to duplicate config keys")
        assert described(connection, "kept")["interval.ms"] == ("1000", SOURCE_CLIENT_METRICS)


def test_list_config_resources_answers_a_type_kafka_does_not_list_with_unsupported_version(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        assert incremental_alter(connection, "orders", ("metrics", SET, "*")) == 0
        response = connection.call(ListConfigResourcesRequest[1](resource_types=[CLIENT_METRICS, 64]),
                                   ListConfigResourcesResponse)

    assert (response.error_code, response.config_resources) == (UNSUPPORTED_VERSION, [])


@pytest.mark.parametrize(("pattern", "accepted"), [
    (r"client_id=(?P<name>payments)", False),  # Python-only named group
    (r"client_id=(?#comment)payments", False),  # Python-only comment group
    (r"client_id=pay{ments", False),  # Java refuses a "{" that is not a quantifier
    (r"client_id=\p{Alpha}+", True),  # Java's POSIX class
    (r"client_id=\Qpay.ments\E", True),  # Java's quoting
    (r"client_id=(?<name>payments)", True),  # Java's named group
])
def test_match_patterns_are_read_as_java_regexes(sandbox, pattern, accepted):
    with KafkaConnection(sandbox.bootstrap) as connection:
        code = incremental_alter(connection, "java", ("match", SET, pattern))

    assert code == (0 if accepted else INVALID_CONFIG)


@pytest.mark.parametrize(("pattern", "client_id", "matched"), [
    (r"client_id=pay\d+", "pay\u0661\u0662", False),  # Arabic-Indic digits: not \d in Java
    (r"client_id=pay\d+", "pay12", True),
    (r"client_id=\w+", "p\u00e4yments", False),  # a-umlaut: not \w in Java
    (r"client_id=a\sb", "a\u00a0b", False),  # no-break space: not \s in Java
    (r"client_id=\p{Alpha}+", "payments", True),
    (r"client_id=\Qpay.ments\E", "payXments", False),
    (r"client_id=\Qpay.ments\E", "pay.ments", True),
])
def test_match_patterns_match_as_java_does(sandbox, pattern, client_id, matched):
    with KafkaConnection(sandbox.bootstrap, client_id=client_id) as connection:
        assert incremental_alter(connection, "java", ("metrics", SET, "org.apache.kafka."), ("match", SET, pattern)) == 0
        response = get_subscriptions(connection)

    assert response.requested_metrics == (["org.apache.kafka."] if matched else [])


# --- GetTelemetrySubscriptions ------------------------------------------------------------------------------------


def test_get_with_a_zero_instance_id_assigns_one_and_an_immediate_second_get_is_throttled(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        first = get_subscriptions(connection)
        second = get_subscriptions(connection, first.client_instance_id)

    assert first.error_code == 0
    assert first.client_instance_id not in (None, ZERO, uuid.UUID(int=1))
    assert first.accepted_compression_types == [4, 3, 1, 2]
    assert (first.push_interval_ms, first.telemetry_max_bytes, first.delta_temporality) == (300000, 1048576, True)
    assert first.requested_metrics == []
    assert second.error_code == THROTTLING_QUOTA_EXCEEDED
    assert second.client_instance_id in (None, ZERO) and second.subscription_id == 0


def test_get_answers_the_metrics_and_interval_of_the_subscriptions_matching_the_connection(sandbox, admin):
    subscribe(admin, "payments", metrics="org.apache.kafka.producer.", interval_ms="1000",
              match=r"client_id=payments-.*,client_software_name=librdkafka,client_source_address=127\.0\.0\.1")
    subscribe(admin, "everyone", metrics="org.apache.kafka.consumer.", interval_ms="200000")

    with KafkaConnection(sandbox.bootstrap, client_id="payments-1") as payments:
        announce_software(payments, "librdkafka", "2.6.1")
        matched = get_subscriptions(payments)
    with KafkaConnection(sandbox.bootstrap, client_id="payments-2") as java:
        announce_software(java, "apache-kafka-java", "4.0.0")
        unmatched = get_subscriptions(java)
    with KafkaConnection(sandbox.bootstrap, client_id="orders") as orders:
        announce_software(orders, "librdkafka", "2.6.1")
        other = get_subscriptions(orders)

    assert sorted(matched.requested_metrics) == ["org.apache.kafka.consumer.", "org.apache.kafka.producer."]
    assert matched.push_interval_ms == 1000
    assert (unmatched.requested_metrics, unmatched.push_interval_ms) == (["org.apache.kafka.consumer."], 200000)
    assert (other.requested_metrics, other.push_interval_ms) == (["org.apache.kafka.consumer."], 200000)
    assert len({matched.client_instance_id, unmatched.client_instance_id, other.client_instance_id}) == 3


def test_a_client_that_never_sent_api_versions_v3_matches_as_software_unknown(sandbox, admin):
    subscribe(admin, "unnamed", metrics="org.apache.kafka.", match="client_software_name=unknown")

    with KafkaConnection(sandbox.bootstrap) as connection:
        response = get_subscriptions(connection)

    assert response.requested_metrics == ["org.apache.kafka."]


def test_a_null_client_id_matches_as_the_empty_client_id_as_kafka_reads_it(sandbox, admin):
    # RequestHeader.parse: "we treat a null client ID as equivalent to an empty client ID".
    subscribe(admin, "any-client-id", metrics="org.apache.kafka.producer.", match="client_id=.*")

    with KafkaConnection(sandbox.bootstrap, client_id=None) as connection:
        response = get_subscriptions(connection)

    assert response.requested_metrics == ["org.apache.kafka.producer."]


@pytest.mark.parametrize(("name", "version"), [
    ("lib rdkafka", "2.6.1"), ("librdkafka", "2.6.1-"), ("-librdkafka", "1"), ("", "1"), ("librédkafka", "1"),
])
def test_api_versions_v3_with_software_outside_kafkas_pattern_is_an_invalid_request_and_not_recorded(
        sandbox, admin, name, version):
    subscribe(admin, "by-software", metrics="org.apache.kafka.", match="client_software_name=librdkafka")

    with KafkaConnection(sandbox.bootstrap) as connection:
        announce_software(connection, "librdkafka", "2.6.1")
        correlation_id = connection.send(ApiVersionsRequest[3](client_software_name=name,
                                                               client_software_version=version))
        refused = connection.read_frame()
        # The refused request recorded nothing: the client still matches as the software it announced first.
        matched = get_subscriptions(connection)

    # Kafka answers at the request's version (kafka-python would decode an error body as v0): correlation id,
    # error code, an empty compact api_keys array, throttle time 0, no tagged fields.
    assert refused == struct.pack(">ihbib", correlation_id, INVALID_REQUEST, 1, 0, 0)
    assert matched.requested_metrics == ["org.apache.kafka."]


def test_api_versions_v0_to_v2_reset_the_recorded_software_to_unknown(sandbox, admin):
    subscribe(admin, "unnamed", metrics="org.apache.kafka.", match="client_software_name=unknown")

    with KafkaConnection(sandbox.bootstrap) as connection:
        announce_software(connection, "librdkafka", "2.6.1")
        assert connection.call(ApiVersionsRequest[2](), ApiVersionsResponse).error_code == 0
        response = get_subscriptions(connection)

    assert response.requested_metrics == ["org.apache.kafka."]


def test_client_state_is_forgotten_when_the_connection_that_created_it_closes(sandbox):
    with KafkaConnection(sandbox.bootstrap) as first:
        instance_id, _ = new_client(first)
        assert get_subscriptions(first, instance_id).error_code == THROTTLING_QUOTA_EXCEEDED

    with KafkaConnection(sandbox.bootstrap) as second:
        deadline = time.monotonic() + TIMEOUT_S
        while (response := get_subscriptions(second, instance_id)).error_code != 0 and time.monotonic() < deadline:
            time.sleep(0.05)

    assert response.error_code == 0 and response.client_instance_id == instance_id


# --- PushTelemetry ladder -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("instance_id", [ZERO, uuid.UUID(int=1)], ids=["zero", "reserved-metadata-topic-id"])
def test_push_with_a_zero_or_reserved_instance_id_is_an_invalid_request(sandbox, instance_id):
    with KafkaConnection(sandbox.bootstrap) as connection:
        _, subscription_id = new_client(connection)

        assert push(connection, instance_id, subscription_id) == INVALID_REQUEST


def test_push_with_a_stale_subscription_id_is_unknown_and_a_get_is_then_allowed_at_once(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        assert get_subscriptions(connection, instance_id).error_code == THROTTLING_QUOTA_EXCEEDED

        assert push(connection, instance_id, subscription_id + 1) == UNKNOWN_SUBSCRIPTION_ID

        again = get_subscriptions(connection, instance_id)
        assert (again.error_code, again.client_instance_id, again.subscription_id) == (0, instance_id, subscription_id)


def test_push_from_an_instance_id_the_gateway_never_assigned_is_an_unknown_subscription(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        assert push(connection, uuid.uuid4(), 0) == UNKNOWN_SUBSCRIPTION_ID


def test_after_a_subscription_change_the_old_id_is_unknown_and_the_new_one_is_fetched_at_once(sandbox, admin):
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, old_id = new_client(connection)
        subscribe(admin, "everything", metrics="*", interval_ms="1000")

        assert push(connection, instance_id, old_id) == UNKNOWN_SUBSCRIPTION_ID
        fresh = get_subscriptions(connection, instance_id)
        assert fresh.error_code == 0 and fresh.subscription_id != old_id
        assert (fresh.requested_metrics, fresh.push_interval_ms) == (["*"], 1000)
        # As in Kafka's ClientMetricsInstance, a Get let through after the error does not restart the push clock.
        assert push(connection, instance_id, fresh.subscription_id) == THROTTLING_QUOTA_EXCEEDED
        assert _accepted_within(3.0, lambda: push(connection, instance_id, fresh.subscription_id))


def test_push_with_an_unknown_compression_type_is_unsupported_and_a_get_is_then_allowed_at_once(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)

        assert push(connection, instance_id, subscription_id, compression=5) == UNSUPPORTED_COMPRESSION_TYPE
        assert get_subscriptions(connection, instance_id).error_code == 0


def test_push_in_a_known_codec_the_gateway_did_not_offer_is_accepted_as_kafka_does(sandbox_factory):
    # Kafka's validatePushRequest refuses only ids CompressionType.forId does not know; a codec other than the
    # offered ones is logged and accepted.
    sandbox = sandbox_factory(compression=[4])
    with KafkaConnection(sandbox.bootstrap) as connection:
        offered = get_subscriptions(connection)
        assert offered.accepted_compression_types == [4]

        gzipped = compress(METRICS, "gzip")
        assert push(connection, offered.client_instance_id, offered.subscription_id, payload=gzipped,
                    compression=GZIP) == 0


def test_push_too_soon_after_an_accepted_push_is_throttled_until_one_interval_has_passed(sandbox, admin):
    subscribe(admin, "fast", metrics="org.apache.kafka.", interval_ms="1000")
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)

        assert push(connection, instance_id, subscription_id) == 0  # the first push after a Get may come early
        started = time.monotonic()
        assert push(connection, instance_id, subscription_id) == THROTTLING_QUOTA_EXCEEDED
        assert _accepted_within(3.0, lambda: push(connection, instance_id, subscription_id))
        assert time.monotonic() - started >= 0.5  # throttled for (most of) the interval, not let through at once


def _accepted_within(seconds: float, push_once: Callable[[], int]) -> bool:
    """Push every 50 ms until one is accepted (throttled pushes do not move the push clock), for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code = push_once()
        if code == 0:
            return True
        assert code == THROTTLING_QUOTA_EXCEEDED, code
        time.sleep(0.05)
    return False


def _metrics_of_size(size: int) -> bytes:
    """Sample metrics serialised to exactly `size` bytes, by lengthening the scope name."""
    guess = size - len(client_metrics("").SerializeToString())
    for name_length in range(max(guess - 16, 1), guess + 1):
        payload = client_metrics("c" * name_length).SerializeToString()
        if len(payload) == size:
            return payload
    raise AssertionError(f"no sample metrics of exactly {size} bytes")


def test_push_larger_than_telemetry_max_bytes_is_too_large_and_one_of_exactly_the_limit_is_accepted(sandbox_factory):
    sandbox = sandbox_factory(telemetry_max_bytes=512)
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        assert get_subscriptions(connection).telemetry_max_bytes == 512
        too_large = push(connection, instance_id, subscription_id, payload=_metrics_of_size(513), compression=NONE)

        instance_id, subscription_id = new_client(connection)
        at_the_limit = push(connection, instance_id, subscription_id, payload=_metrics_of_size(512), compression=NONE)

    assert (too_large, at_the_limit) == (TELEMETRY_TOO_LARGE, 0)


@pytest.mark.parametrize("telemetry_max_bytes", [1048576, 3000000])
@pytest.mark.parametrize("compression", [NONE, ZSTD])
def test_a_push_of_exactly_telemetry_max_bytes_lands_on_the_metrics_topic(sandbox_factory, telemetry_max_bytes,
                                                                          compression):
    sandbox = sandbox_factory(telemetry_max_bytes=telemetry_max_bytes)
    metrics = _metrics_of_size(telemetry_max_bytes)
    payload = compress(metrics, "zstd") if compression == ZSTD else metrics
    with KafkaConnection(sandbox.bootstrap, client_id="c" * 32767) as connection:  # the longest client id
        instance_id, subscription_id = new_client(connection)

        assert push(connection, instance_id, subscription_id, payload=payload, compression=compression) == 0

    (record,) = metrics_records(sandbox, expected=1)
    assert record.key == str(instance_id).encode()
    assert decode(record.value, record.headers).metrics.SerializeToString() == metrics


def test_telemetry_max_bytes_limits_the_bytes_sent_even_when_they_decompress_within_it(sandbox_factory):
    small = MetricsData()
    scope_metrics = small.resource_metrics.add().scope_metrics.add()
    scope_metrics.metrics.add(name="org.apache.kafka.producer.x").gauge.data_points.add(as_double=1.5)
    small = small.SerializeToString()
    gzipped = compress(small, "gzip")  # gzip's header makes a tiny payload bigger
    assert len(gzipped) > len(small)
    sandbox = sandbox_factory(telemetry_max_bytes=len(small))
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        compressed = push(connection, instance_id, subscription_id, payload=gzipped, compression=GZIP)

        instance_id, subscription_id = new_client(connection)
        uncompressed = push(connection, instance_id, subscription_id, payload=small, compression=NONE)

    assert (compressed, uncompressed) == (TELEMETRY_TOO_LARGE, 0)


def test_push_that_decompresses_beyond_telemetry_max_bytes_is_an_invalid_record(sandbox_factory):
    # Kafka 4.0-4.3.0 accept it, 4.3.1 (followed here) answers INVALID_RECORD,
    # only trunk answers TELEMETRY_TOO_LARGE.
    sandbox = sandbox_factory(telemetry_max_bytes=512)
    expanding = compress(client_metrics("c" * 2000).SerializeToString(), "zstd")
    assert len(expanding) <= 512
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)

        assert push(connection, instance_id, subscription_id, payload=expanding) == INVALID_RECORD


@pytest.mark.parametrize(("compression", "payload"), [
    pytest.param(NONE, b"\xff\xff\xff\xff", id="uncompressed-garbage"),
    pytest.param(ZSTD, b"\x28\xb5\x2f\xfd" + b"\xff" * 16, id="zstd-garbage"),
    pytest.param(GZIP, b"\x1f\x8b" + b"\x00" * 16, id="gzip-garbage"),
    pytest.param(ZSTD, compress(b"\xff\xff\xff\xff", "zstd"), id="zstd-of-garbage"),
])
def test_undecodable_push_is_an_invalid_record(sandbox, compression, payload):
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)

        refused = push(connection, instance_id, subscription_id, payload=payload, compression=compression)

    assert refused == INVALID_RECORD


def test_a_push_the_metrics_topic_does_not_take_is_dropped_and_logged_not_refused(sandbox, caplog):
    """Refused (INVALID_RECORD, what Kafka answers for a plugin that throws), a Java client stops pushing until it
    restarts; kcm's plugin drops and counts instead, and so does the sandbox's receiver."""
    from kafka import KafkaProducer

    receiver = sandbox._receiver
    working = receiver._producer
    receiver._producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{_closed_port()}", max_block_ms=200,
                                       api_version=(2, 8))  # no probe of the dead address at construction
    try:
        with KafkaConnection(sandbox.bootstrap) as connection:
            instance_id, subscription_id = new_client(connection)

            assert push(connection, instance_id, subscription_id) == 0
    finally:
        receiver._producer.close(timeout=0)
        receiver._producer = working
    (line,) = [r for r in caplog.records if r.name == "kcm.sandbox.receiver"]
    assert line.levelname == "ERROR" and f"client instance {instance_id}" in line.getMessage()
    assert "dropped" in line.getMessage()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("terminating_again", [False, True])
def test_after_an_accepted_terminating_push_a_further_push_is_an_invalid_request(sandbox, terminating_again):
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id) == 0
        assert push(connection, instance_id, subscription_id, terminating=True) == 0  # not throttled: terminating

        assert push(connection, instance_id, subscription_id, terminating=terminating_again) == INVALID_REQUEST


def test_accepted_pushes_land_on_the_metrics_topic_in_contract_v1(sandbox):
    with KafkaConnection(sandbox.bootstrap, client_id="payments-producer") as connection:
        announce_software(connection, "librdkafka", "2.6.1")
        refused_id, refused_subscription = new_client(connection)
        garbage = b"\xff" * 4
        assert push(connection, refused_id, refused_subscription, payload=garbage, compression=NONE) == INVALID_RECORD
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id) == 0
        assert push(connection, instance_id, subscription_id, terminating=True) == 0
        source_port = connection.sock.getsockname()[1]

    records = metrics_records(sandbox, expected=2)

    assert [record.key for record in records] == [str(instance_id).encode()] * 2
    decoded = [decode(record.value, record.headers) for record in records]
    assert all(record.metrics == client_metrics() for record in decoded)
    expected = {
        "client_instance_id": str(instance_id),
        "client_id": "payments-producer",
        "client_software_name": "librdkafka",
        "client_software_version": "2.6.1",
        "client_source_address": "127.0.0.1",
        "client_source_port": str(source_port),
        "principal": "User:ANONYMOUS",
        "subscription_id": str(subscription_id),
        "push_interval_ms": "300000",
    }
    assert [{key: record.attributes[key] for key in expected} for record in decoded] == [expected, expected]
    assert [record.attributes["terminating"] for record in decoded] == ["false", "true"]


def _delete_topics(version: int, names: list[str]) -> Any:
    if version <= 5:
        return DeleteTopicsRequest[version](topic_names=names, timeout_ms=5000)
    return DeleteTopicsRequest[version](timeout_ms=5000, topics=[
        DeleteTopicsRequest.DeleteTopicState(name=name, topic_id=None) for name in names])


@pytest.mark.parametrize("version", [0, 4, 6])
def test_deleting_the_metrics_topic_is_refused_and_pushes_still_land_on_it_while_other_topics_are_deleted(
        sandbox, version):
    # The embedded broker would acknowledge writes to the deleted topic: accepted pushes would vanish.
    metrics_topic = sandbox.options.topic
    ensure_topic(KafkaSettings(sandbox.bootstrap), "doomed", 1)
    with KafkaConnection(sandbox.bootstrap) as connection:
        answers = [connection.call(_delete_topics(version, names), DeleteTopicsResponse).responses
                   for names in ([metrics_topic, "doomed"], [metrics_topic])]
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id) == 0

    assert [{result.name: result.error_code for result in results} for results in answers] == [
        {metrics_topic: TOPIC_DELETION_DISABLED, "doomed": 0}, {metrics_topic: TOPIC_DELETION_DISABLED}]
    admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
    try:
        topics = admin.list_topics()
    finally:
        admin.close()
    assert metrics_topic in topics and "doomed" not in topics
    assert [record.key for record in metrics_records(sandbox, expected=1)] == [str(instance_id).encode()]


def test_deleting_the_metrics_topic_by_its_id_is_refused_too(sandbox):
    # DeleteTopics v6+ may give a topic id and no name: the gateway asks the broker for the metrics topic's id.
    metrics_topic = sandbox.options.topic
    ensure_topic(KafkaSettings(sandbox.bootstrap), "doomed-by-id", 1)
    admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
    try:
        ids = {t["name"]: uuid.UUID(str(t["topic_id"])) for t in admin.describe_topics([metrics_topic, "doomed-by-id"])}
        answers = [admin.delete_topics(topics, raise_errors=False)["topics"]
                   for topics in ([ids[metrics_topic], ids["doomed-by-id"]], [ids[metrics_topic]])]
        topics = admin.list_topics()
    finally:
        admin.close()

    refused = {ids[metrics_topic]: TOPIC_DELETION_DISABLED}
    assert [{uuid.UUID(str(r["topic_id"])): r["error_code"] for r in results} for results in answers] == [
        {**refused, ids["doomed-by-id"]: 0}, refused]
    assert metrics_topic in topics and "doomed-by-id" not in topics
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id) == 0
    assert str(instance_id).encode() in [record.key for record in metrics_records(sandbox, expected=1)]


# --- pipelining and concurrency -------------------------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_request_order(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        push_request = PushTelemetryRequest[0](client_instance_id=instance_id, subscription_id=subscription_id,
                                               terminating=False, compression_type=ZSTD,
                                               metrics=compress(METRICS, "zstd"))
        versions_request = api_versions_request(3)
        list_request = ListConfigResourcesRequest[0]()
        # The push waits for the metrics topic, the ApiVersions for the upstream broker; the list is answered at once.
        ids = [connection.send(push_request), connection.send(versions_request), connection.send(list_request)]

        pushed = connection.receive(PushTelemetryResponse, 0, ids[0])
        versions = connection.receive(ApiVersionsResponse, 3, ids[1])
        listing = connection.receive(ListConfigResourcesResponse, 0, ids[2])

    assert (pushed.error_code, versions.error_code, listing.error_code) == (0, 0, 0)


def test_fifty_concurrent_clients_each_get_a_subscription_and_push_successfully(sandbox):
    clients = 50
    start = threading.Barrier(clients, timeout=TIMEOUT_S * 2)

    def get_and_push(number: int) -> tuple[uuid.UUID, int, int]:
        with KafkaConnection(sandbox.bootstrap, client_id=f"client-{number}") as connection:
            start.wait()
            got = get_subscriptions(connection)
            return got.client_instance_id, got.error_code, push(connection, got.client_instance_id,
                                                                got.subscription_id)

    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(get_and_push, number) for number in range(clients)]
        results = [future.result(timeout=30) for future in futures]

    assert [(get_error, push_error) for _, get_error, push_error in results] == [(0, 0)] * clients
    instance_ids = {instance_id for instance_id, _, _ in results}
    assert len(instance_ids) == clients
    records = metrics_records(sandbox, expected=clients)
    assert sorted(record.key for record in records) == sorted(str(i).encode() for i in instance_ids)


# --- robustness -----------------------------------------------------------------------------------------------------


def _header(api_key: int, version: int, client_id: bytes = b"kcm") -> bytes:
    return struct.pack(">hhih", api_key, version, 1, len(client_id)) + client_id


_GET = unframed(GetTelemetrySubscriptionsRequest[0](client_instance_id=uuid.uuid4()))
_PUSH = unframed(PushTelemetryRequest[0](client_instance_id=uuid.uuid4(), subscription_id=1, terminating=False,
                                         compression_type=0, metrics=METRICS))

BAD_INPUT = [
    pytest.param(struct.pack(">i", -1), id="negative-frame-size"),
    pytest.param(struct.pack(">i", 100 * 1024 * 1024 + 1), id="frame-above-100-MiB"),
    pytest.param(frame(b"\x00\x47\x00"), id="frame-shorter-than-a-header"),
    pytest.param(frame(struct.pack(">hhih", 71, 0, 1, 50) + b"kcm"), id="client-id-past-the-frame"),
    pytest.param(frame(_GET[:-8]), id="truncated-get-telemetry-subscriptions"),
    pytest.param(frame(_PUSH[:-40]), id="truncated-push-telemetry"),
    pytest.param(frame(_header(71, 5) + b"\x00" + bytes(17)), id="get-telemetry-subscriptions-v5"),
    pytest.param(frame(_header(72, 1) + b"\x00" + bytes(40)), id="push-telemetry-v1"),
]


@pytest.mark.parametrize("bad", BAD_INPUT)
def test_a_malformed_request_closes_its_connection_and_the_gateway_keeps_serving(sandbox, bad):
    with KafkaConnection(sandbox.bootstrap) as bystander:
        with KafkaConnection(sandbox.bootstrap) as connection:
            connection.sock.sendall(bad)
            assert connection.closed_by_peer()

        with KafkaConnection(sandbox.bootstrap) as fresh:
            response = fresh.call(api_versions_request(3), ApiVersionsResponse)
            assert response.error_code == 0 and 71 in {k.api_key for k in response.api_keys}
        assert bystander.call(api_versions_request(3), ApiVersionsResponse).error_code == 0


def test_a_frame_cut_short_by_the_client_closes_only_that_connection(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        connection.sock.sendall(struct.pack(">i", 100) + b"x" * 10)
        connection.sock.shutdown(socket.SHUT_WR)
        assert connection.closed_by_peer()

    with KafkaConnection(sandbox.bootstrap) as fresh:
        assert new_client(fresh)[0] != ZERO


def test_answers_due_before_a_malformed_request_are_still_sent_before_the_connection_closes(sandbox):
    with KafkaConnection(sandbox.bootstrap) as connection:
        correlation_id = connection.send(api_versions_request(3))
        connection.sock.sendall(frame(_header(71, 5) + b"\x00" + bytes(17)))

        assert connection.receive(ApiVersionsResponse, 3, correlation_id).error_code == 0
        assert connection.closed_by_peer()


def test_an_unreachable_upstream_broker_closes_the_client_connection_but_not_the_gateway(sandbox, caplog):
    sandbox.broker.stop()

    for _ in range(2):
        with KafkaConnection(sandbox.bootstrap) as connection:
            connection.send(api_versions_request(3))
            assert connection.closed_by_peer()

    assert any("cannot reach the upstream broker" in message for message in caplog.messages)
    assert not any(record.exc_info for record in caplog.records if record.name == "kcm.sandbox")


def test_a_client_resetting_its_connection_is_not_reported_as_an_upstream_failure(sandbox, caplog):
    caplog.set_level(logging.DEBUG, logger="kcm.sandbox")
    for _ in range(3):  # what kcm's own reachability probe does: ask, read part of the answer, close
        with KafkaConnection(sandbox.bootstrap) as connection:
            connection.send(api_versions_request(3))
            connection.sock.recv(4)
            connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    deadline = time.monotonic() + 10
    while sum("connection ended" in message for message in caplog.messages) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum("connection ended" in message for message in caplog.messages) == 3
    assert not [record for record in caplog.records if record.name == "kcm.sandbox" and record.levelno >= logging.WARNING]
    with KafkaConnection(sandbox.bootstrap) as fresh:
        assert new_client(fresh)[0] != ZERO


def test_advertised_versions_keep_the_gateways_own_kip714_apis_and_cap_config_apis_at_what_it_parses():
    from kcm_sandbox.gateway import _api_version_entries

    offered = {e.api_key: (e.min_version, e.max_version)
               for e in _api_version_entries({32: (0, 99), 44: (0, 99), 71: (0, 9), 72: (0, 9)})}
    assert offered[32] == (0, DescribeConfigsRequest.max_version)
    assert offered[44] == (0, IncrementalAlterConfigsRequest.max_version)
    assert offered[71] == (0, 0) and offered[72] == (0, 0)


def test_a_receiver_that_throws_makes_the_push_an_invalid_record(sandbox, caplog):
    # What Kafka answers when its exporter plugin throws; the sandbox's Java receiver does when its JVM fails.
    def broken(*_):
        raise RuntimeError("the plugin threw")

    sandbox.gateway.receiver = broken
    with KafkaConnection(sandbox.bootstrap) as connection:
        instance_id, subscription_id = new_client(connection)
        assert push(connection, instance_id, subscription_id) == INVALID_RECORD
    assert any("could not write the push to the metrics topic: the plugin threw" in m for m in caplog.messages)


def test_a_legacy_alter_of_a_topic_the_broker_cannot_alter_is_refused_beside_an_applied_subscription(sandbox):
    # The embedded broker has no AlterConfigs (33): the topic is answered INVALID_REQUEST, the subscription applied.
    request = AlterConfigsRequest[2](resources=[(TOPIC, "some-topic", [("retention.ms", "1000")]),
                                                (CLIENT_METRICS, "sub", [("interval.ms", "1000")])],
                                     validate_only=False)
    with KafkaConnection(sandbox.bootstrap) as connection:
        results = connection.call(request, AlterConfigsResponse).responses
        assert [(r.resource_name, r.error_code) for r in results] == [("some-topic", INVALID_REQUEST), ("sub", 0)]
        assert listed(connection, 0) == [("sub", CLIENT_METRICS)]


def test_a_legacy_alter_that_only_validates_stores_nothing(sandbox):
    request = AlterConfigsRequest[2](resources=[(CLIENT_METRICS, "dry", [("interval.ms", "1000")])],
                                     validate_only=True)
    with KafkaConnection(sandbox.bootstrap) as connection:
        (result,) = connection.call(request, AlterConfigsResponse).responses
        assert result.error_code == 0
        assert listed(connection, 0) == []


@pytest.mark.parametrize("types", [[TOPIC], [32]], ids=["topic", "group"])
def test_listing_a_type_kafka_lists_but_the_sandbox_cannot_is_an_invalid_request(sandbox, types):
    with KafkaConnection(sandbox.bootstrap) as connection:
        response = connection.call(ListConfigResourcesRequest[1](resource_types=types), ListConfigResourcesResponse)
    assert (response.error_code, response.config_resources) == (INVALID_REQUEST, [])
