"""Model test of the sandbox gateway's request routing and answer ordering, over several raw loopback connections
that pipeline seeded random mixes of requests without waiting for answers in between.

The reference is written from docs/sandbox.md ("What it implements, as Apache Kafka 4.3.1 does", "One client cannot
freeze it", "Differences from a real broker"): the broker answers what the gateway passes through (its own answer,
asked of it directly once, is the reference for those parts), the gateway answers the KIP-714 APIs and CLIENT_METRICS
configs from a per-connection dict of subscriptions, requests mixing CLIENT_METRICS with topics or brokers are split
and their answers merged in request order, DeleteTopics refuses the metrics topic with 73 and deletes the others,
and ApiVersions v3+ records the client software while v0-v2 reset it to `unknown`. Every answer on a connection must
come back in request order with its request's correlation id (acks=0 produce requests get none), and must not depend
on what the other connections pipeline meanwhile: each connection owns its subscriptions (matching only its own
client id) and its topics.
"""

from __future__ import annotations

import random
import re
import struct
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
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
from kafka.protocol.admin.topics import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder
from payloads import client_metrics
from test_sandbox_protocol import KafkaConnection, metrics_records

from kcm_common.contract import compress, decode
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)
from kcm_sandbox.runner import Sandbox, SandboxOptions

SEEDS = (714, 4331, 16, 2026)
CONNECTIONS = 4
ROUNDS = 6
BATCH = (6, 12)          # requests pipelined per round, at least and at most

TOPIC, BROKER, CLIENT_METRICS = 2, 4, 16
SET, DELETE = 0, 1
INVALID_REQUEST, TOPIC_ALREADY_EXISTS, TOPIC_DELETION_DISABLED = 42, 36, 73
UNKNOWN_SUBSCRIPTION_ID = 117
SOURCE_DEFAULT, SOURCE_CLIENT_METRICS = 5, 7
ZERO = uuid.UUID(int=0)

# The gateway's own APIs in ApiVersions (docs: GetTelemetrySubscriptions v0, PushTelemetry v0, ListConfigResources
# v0-v1); the config APIs whose CLIENT_METRICS resources it answers may be capped at what it parses.
OWN_VERSIONS = {71: (0, 0), 72: (0, 0), 74: (0, 1)}
CONFIG_APIS = (32, 33, 44)
DESCRIBE_ORDER = ("interval.ms", "match", "metrics")   # a Java HashMap's order
DEFAULTS = {"interval.ms": "300000", "match": "", "metrics": ""}
DEFAULT_INTERVAL_MS = 300000
DEFAULT_COMPRESSION = [4, 3, 1, 2]                     # zstd, lz4, gzip, snappy
TELEMETRY_MAX_BYTES = 1048576
UNKNOWN = "unknown"

# Every interval at least a minute, so a second push of a client within the test is always too soon.
INTERVALS = ("60000", "120000", "300000", "3600000")
METRIC_LISTS = ("org.apache.kafka.producer.", "org.apache.kafka.consumer.,org.apache.kafka.producer.",
                "org.apache.kafka.client.", "*")
SOFTWARE = (("kcm-alpha", "1.0"), ("kcm-beta", "2.3.4"), ("librdkafka", "2.6.1"))
INVALID_SOFTWARE = (("bad name", "1"), ("kcm-alpha", "-1"))
# (key, value) an IncrementalAlterConfigs or AlterConfigs refuses with INVALID_REQUEST, and the word its message names.
REFUSED_CONFIGS = ((("push.interval", "1000"), "push.interval"), (("interval.ms", "99"), "interval.ms"),
                   (("interval.ms", "3600001"), "interval.ms"))
METRICS = compress(client_metrics().SerializeToString(), "zstd")
TIMEOUT_S = 10.0


# --- the reference model ------------------------------------------------------------------------------------------


@dataclass
class Instance:
    """A client instance the gateway assigned: what its Get matched, under the attributes of that Get."""

    instance_id: uuid.UUID
    subscription_id: int
    software_name: str
    matched: tuple
    pushed: str = ""       # "", "accepted" or "refused"


@dataclass
class Client:
    """One connection's view: its identity, subscriptions (name -> {key: value}), topics and client instances."""

    number: int
    client_id: str
    prefix: str
    log_topic: str
    software: tuple[str, str] | None = None      # None: never sent ApiVersions v3+, or reset by v0-v2
    subscriptions: dict[str, dict[str, str]] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)
    created: int = 0
    records: int = 0                              # records produced to log_topic
    instances: list[Instance] = field(default_factory=list)
    pushes: list[tuple[uuid.UUID, str, tuple[str, str] | None]] = field(default_factory=list)

    def software_name(self) -> str:
        return self.software[0] if self.software else UNKNOWN

    def matching(self, software_name: str) -> tuple:
        """The subscriptions matching this client, as a hashable snapshot (every `key=regex` must full-match)."""
        attributes = {"client_id": self.client_id, "client_software_name": software_name}
        matched = []
        for name, configs in sorted(self.subscriptions.items()):
            patterns = [item.split("=", 1) for item in configs.get("match", "").split(",") if item]
            if all(key in attributes and re.fullmatch(regex, attributes[key]) for key, regex in patterns):
                matched.append((name, tuple(sorted(configs.items()))))
        return tuple(matched)


def effective(matched: tuple) -> tuple[frozenset[str], int]:
    """Requested metrics (unioned, `*` wins) and push interval (the smallest, default 300000) of a matched set. As
    Kafka's ClientMetricsManager, the default takes part in the minimum: a longer subscribed interval is not used."""
    metrics: set[str] = set()
    intervals = [DEFAULT_INTERVAL_MS]
    for _, configs in matched:
        values = dict(configs)
        metrics.update(item for item in values.get("metrics", "").split(",") if item)
        intervals.append(int(values.get("interval.ms", DEFAULT_INTERVAL_MS)))
    if "*" in metrics:
        metrics = {"*"}
    return frozenset(metrics), min(intervals)


def described(configs: dict[str, str] | None) -> list[tuple[str, str, int]]:
    """DescribeConfigs of one subscription: every key in Kafka's order, set ones with source 7, others defaulted."""
    configs = configs or {}
    return [(key, configs[key], SOURCE_CLIENT_METRICS) if key in configs else (key, DEFAULTS[key], SOURCE_DEFAULT)
            for key in DESCRIBE_ORDER]


class RawAnswer:
    """An answer checked as bytes (after its correlation id)."""

    @staticmethod
    def decode(payload: bytes, version: int, header: bool) -> bytes:
        return bytes(payload)


@dataclass
class Step:
    """One request pipelined on a connection and what its answer must be (None: no answer is due)."""

    request: Any
    response_class: Any | None
    check: Any            # check(response) asserts the answer against the reference
    what: str


# --- the sandbox, and what the broker answers itself -------------------------------------------------------------


@dataclass
class World:
    sandbox: Sandbox
    broker_versions: dict[int, tuple[int, int]]
    static_topic: str
    missing_topic: str
    metadata: dict[int, dict]                     # Metadata version -> the broker's answer for the two topics
    describe: dict[tuple[int, int, str], dict]    # (version, type, name) -> the broker's result for that resource
    alter: dict[tuple[int, str], dict]            # (version, "own" or missing topic) -> the broker's result
    accepted_pushes: list[tuple[uuid.UUID, str, tuple[str, str] | None]] = field(default_factory=list)


def body(message: Any) -> dict:
    """A decoded message as plain data, without its header."""
    data = message.to_dict()
    data.pop("header", None)
    return data


def metadata_request(version: int, topics: list[str]) -> Any:
    return MetadataRequest[version](topics=[MetadataRequest.MetadataRequestTopic(name=name) for name in topics],
                                    allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                                    include_topic_authorized_operations=False)


def describe_request(version: int, resources: list[tuple[int, str]]) -> Any:
    return DescribeConfigsRequest[version](resources=[(kind, name, None) for kind, name in resources],
                                           include_synonyms=False, include_documentation=False)


def incremental_request(version: int, resources: list[tuple[int, str, list]]) -> Any:
    return IncrementalAlterConfigsRequest[version](resources=resources, validate_only=False)


TOPIC_CHANGE = [("retention.ms", SET, "86400000")]
# A topic that does not exist, altered but never described: the embedded broker keeps configs of topics it does not
# have, and its DescribeConfigs v0 of a topic with configs is malformed (a broker quirk; merged, the gateway answers
# it UNKNOWN_SERVER_ERROR: test_sandbox_protocol).
ALTERED_MISSING = "route-missing-altered"


@pytest.fixture(scope="module")
def world() -> World:
    """One sandbox for the module, and the broker's own answers (asked of it directly) to what is passed through."""
    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0)))
    sandbox.start()
    try:
        static_topic, missing_topic, scratch = "route-static", "route-missing", "route-scratch"
        for name in (static_topic, scratch):
            ensure_topic(KafkaSettings(sandbox.bootstrap), name, 1)
        with KafkaConnection(sandbox.upstream_bootstrap) as broker:
            versions = broker.call(ApiVersionsRequest[3](client_software_name="kcm-test", client_software_version="1"),
                                   ApiVersionsResponse)
            metadata = {v: body(broker.call(metadata_request(v, [static_topic, missing_topic]), MetadataResponse))
                        for v in (1, 8)}
            describe = {}
            for version in range(5):
                for kind, name in ((TOPIC, static_topic), (TOPIC, missing_topic), (BROKER, "0")):
                    (result,) = broker.call(describe_request(version, [(kind, name)]), DescribeConfigsResponse).results
                    describe[(version, kind, name)] = body(result)
            alter = {}
            for version in range(2):
                for key, name in (("own", scratch), ("missing", ALTERED_MISSING)):
                    (result,) = broker.call(incremental_request(version, [(TOPIC, name, TOPIC_CHANGE)]),
                                            IncrementalAlterConfigsResponse).responses
                    alter[(version, key)] = body(result)
        # The broker advertises the gateway's address (docs: "it must advertise the --listen address").
        assert [(b["host"], b["port"]) for b in metadata[8]["brokers"]] == [("127.0.0.1", sandbox.gateway.port)]
        yield World(sandbox, {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys},
                    static_topic, missing_topic, metadata, describe, alter)
    finally:
        sandbox.stop()


# --- a pipelining connection ---------------------------------------------------------------------------------------


class Pipe(KafkaConnection):
    """A raw connection that sends a whole batch of requests in one write, with correlation ids of its choosing."""

    def __init__(self, bootstrap: str, client_id: str, rng: random.Random) -> None:
        super().__init__(bootstrap, client_id=client_id)
        self.sock.settimeout(TIMEOUT_S)
        self.next_id = rng.randrange(1, 2**31 - 100_000)

    def pipeline(self, steps: list[Step]) -> list[tuple[Step, int]]:
        """Send every step's request at once; returns (step, correlation id) in request order."""
        sent, data = [], b""
        for step in steps:
            correlation_id = self.next_id
            self.next_id += random.Random(correlation_id).randrange(1, 1000)   # not consecutive
            step.request.with_header(correlation_id=correlation_id, client_id=self.client_id)
            data += bytes(step.request.encode(header=True, framed=True))
            sent.append((step, correlation_id))
        self.sock.sendall(data)
        return sent

    def answers(self, sent: list[tuple[Step, int]]) -> None:
        """Read the answers due, in request order, each checked against its step."""
        for step, correlation_id in sent:
            if step.response_class is None:
                continue
            payload = self.read_frame()
            assert payload is not None, f"the gateway closed the connection instead of answering {step.what}"
            (answered,) = struct.unpack_from(">i", payload)
            assert answered == correlation_id, f"{step.what}: answer for {answered}, expected {correlation_id}"
            try:
                step.check(step.response_class.decode(payload, version=step.request.API_VERSION, header=True))
            except AssertionError as failure:
                raise AssertionError(f"{self.client_id}: {step.what}: {failure}") from failure


# --- the random steps ------------------------------------------------------------------------------------------------


def produce_request(version: int, topic: str, acks: int) -> Any:
    records = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1024)
    records.append(timestamp=int(time.time() * 1000), key=None, value=b"routed")
    records.close()
    fields = {"transactional_id": None} if version >= 3 else {}
    return ProduceRequest[version](acks=acks, timeout_ms=5000, topic_data=[(topic, [(0, records.buffer())])], **fields)


class Generator:
    """Draws one connection's requests and applies them to its reference model as they are drawn (answers come in
    request order, so the model after step i is what step i+1 sees)."""

    def __init__(self, world: World, client: Client, rng: random.Random) -> None:
        self.world = world
        self.client = client
        self.rng = rng
        self.names = [f"{client.prefix}-sub-{letter}" for letter in "abcd"]
        self.kinds = [self.api_versions, self.metadata, self.produce, self.produce, self.list_offsets,
                      self.create_topics, self.delete_topics, self.get, self.get, self.push, self.push,
                      self.incremental, self.incremental, self.legacy_alter, self.describe, self.describe,
                      self.list_resources]

    def batch(self) -> list[Step]:
        return [self.rng.choice(self.kinds)() for _ in range(self.rng.randint(*BATCH))]

    # passthrough --------------------------------------------------------------------------------------------------

    def api_versions(self) -> Step:
        version = self.rng.randrange(5)
        client = self.client
        if version < 3:
            client.software, code = None, 0
            request = ApiVersionsRequest[version]()
        else:
            invalid = self.rng.random() < 0.25
            name, software_version = self.rng.choice(INVALID_SOFTWARE if invalid else SOFTWARE)
            request = ApiVersionsRequest[version](client_software_name=name, client_software_version=software_version)
            code = INVALID_REQUEST if invalid else 0
            if not invalid:
                client.software = (name, software_version)
        broker = self.world.broker_versions
        if code:
            def refused(payload: bytes) -> None:
                # kafka-python decodes an error body as v0: read it as Kafka writes it, at the request's version
                # (error code, an empty compact api_keys array, throttle time, no tagged fields).
                assert payload[4:] == struct.pack(">hbib", INVALID_REQUEST, 1, 0, 0)
            return Step(request, RawAnswer, refused, f"ApiVersions v{version} {name!r} {software_version!r}")

        def check(response: Any) -> None:
            assert response.error_code == 0
            versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            # AlterConfigs too: the embedded broker has none, and the gateway serves it ("Differences").
            assert set(versions) == set(broker) | set(OWN_VERSIONS) | {33}
            assert {k: versions[k] for k in OWN_VERSIONS} == OWN_VERSIONS
            passed = set(broker) - set(OWN_VERSIONS) - set(CONFIG_APIS)
            assert {k: versions[k] for k in passed} == {k: broker[k] for k in passed}
        return Step(request, ApiVersionsResponse, check, f"ApiVersions v{version}")

    def metadata(self) -> Step:
        version = self.rng.choice((1, 8))
        expected = self.world.metadata[version]
        request = metadata_request(version, [self.world.static_topic, self.world.missing_topic])

        def check(response: Any) -> None:
            assert body(response) == expected
        return Step(request, MetadataResponse, check, f"Metadata v{version}")

    def produce(self) -> Step:
        client = self.client
        version, acks = self.rng.choice((3, 7, 9)), self.rng.choice((0, 1, 1))
        offset = client.records
        client.records += 1
        request = produce_request(version, client.log_topic, acks)
        if acks == 0:
            return Step(request, None, None, f"Produce v{version} acks=0")

        def check(response: Any) -> None:
            ((topic, ((partition, error_code, base_offset, *_),)),) = [
                (t.name, [(p.index, p.error_code, p.base_offset) for p in t.partition_responses])
                for t in response.responses]
            assert (topic, partition, error_code, base_offset) == (client.log_topic, 0, 0, offset)
        return Step(request, ProduceResponse, check, f"Produce v{version} acks=1")

    def list_offsets(self) -> Step:
        end = self.client.records
        request = ListOffsetsRequest[5](replica_id=-1, isolation_level=0,
                                        topics=[(self.client.log_topic, [(0, 0, -1)])])

        def check(response: Any) -> None:
            assert [(p.error_code, p.offset) for t in response.topics for p in t.partitions] == [(0, end)]
        return Step(request, ListOffsetsResponse, check, "ListOffsets v5")

    def create_topics(self) -> Step:
        client = self.client
        names = []
        if client.topics and self.rng.random() < 0.4:
            names.append(self.rng.choice(sorted(client.topics)))
        for _ in range(self.rng.randint(0 if names else 1, 2)):
            names.append(f"{client.prefix}-t{client.created}")
            client.created += 1
        expected = [(name, TOPIC_ALREADY_EXISTS if name in client.topics else 0) for name in names]
        client.topics.update(names)
        version = self.rng.choice((2, 4, 5))
        request = CreateTopicsRequest[version](topics=[CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[]) for name in names],
            timeout_ms=5000, validate_only=False)

        def check(response: Any) -> None:
            assert [(t.name, t.error_code) for t in response.topics] == expected
        return Step(request, CreateTopicsResponse, check, f"CreateTopics v{version} {names}")

    def delete_topics(self) -> Step:
        client, metrics_topic = self.client, self.world.sandbox.options.topic
        names = [metrics_topic]
        if client.topics and self.rng.random() < 0.8:
            doomed = self.rng.choice(sorted(client.topics))
            client.topics.discard(doomed)
            names.append(doomed)
        self.rng.shuffle(names)
        version = self.rng.choice((1, 4, 6))
        if version <= 5:
            request = DeleteTopicsRequest[version](topic_names=names, timeout_ms=5000)
        else:
            request = DeleteTopicsRequest[version](timeout_ms=5000, topics=[
                DeleteTopicsRequest.DeleteTopicState(name=name, topic_id=None) for name in names])
        expected = {name: TOPIC_DELETION_DISABLED if name == metrics_topic else 0 for name in names}

        def check(response: Any) -> None:
            results = response.responses
            assert sorted(r.name for r in results) == sorted(names)
            assert {r.name: r.error_code for r in results} == expected
            if version >= 5:
                (refusal,) = [r.error_message for r in results if r.name == metrics_topic]
                assert metrics_topic in refusal
        return Step(request, DeleteTopicsResponse, check, f"DeleteTopics v{version} {names}")

    # the gateway's own ---------------------------------------------------------------------------------------------

    def get(self) -> Step:
        client = self.client
        software_name = client.software_name()
        matched = client.matching(software_name)
        metrics, interval = effective(matched)
        request = GetTelemetrySubscriptionsRequest[0](client_instance_id=ZERO)

        def check(response: Any) -> None:
            assert response.error_code == 0
            assert response.client_instance_id not in (None, ZERO)
            assert all(response.client_instance_id != i.instance_id for i in client.instances)
            assert (set(response.requested_metrics), len(response.requested_metrics)) == (metrics, len(metrics))
            assert response.push_interval_ms == interval
            assert list(response.accepted_compression_types) == DEFAULT_COMPRESSION
            assert (response.telemetry_max_bytes, response.delta_temporality) == (TELEMETRY_MAX_BYTES, True)
            client.instances.append(Instance(response.client_instance_id, response.subscription_id, software_name,
                                             matched))
        return Step(request, GetTelemetrySubscriptionsResponse, check, f"Get ({software_name}, {matched} matched)")

    def push(self) -> Step:
        """A push by a client instance an earlier round's Get made (its ids are known by now), or by the zero id."""
        client = self.client
        candidates = []
        for instance in client.instances:
            # Pushed once is enough: a second push is too soon (89) only until any subscription change, made on any
            # connection, re-evaluates the client, so its answer is not this connection's alone.
            if instance.pushed:
                continue
            now = client.matching(instance.software_name)
            if now == instance.matched:
                candidates.append((instance, 0))
            elif effective(now) != effective(instance.matched):
                candidates.append((instance, UNKNOWN_SUBSCRIPTION_ID))
            # The same metrics and interval from another set of subscriptions: the docs leave the id open.
        if not candidates or self.rng.random() < 0.15:
            instance_id, subscription_id, code, instance = ZERO, 0, INVALID_REQUEST, None
        else:
            instance, code = self.rng.choice(candidates)
            instance_id, subscription_id = instance.instance_id, instance.subscription_id
            if instance.pushed == "":
                instance.pushed = "accepted" if code == 0 else "refused"
        if code == 0:
            client.pushes.append((instance_id, client.client_id, client.software))
        request = PushTelemetryRequest[0](client_instance_id=instance_id, subscription_id=subscription_id,
                                          terminating=False, compression_type=4, metrics=METRICS)

        def check(response: Any) -> None:
            assert response.error_code == code
        return Step(request, PushTelemetryResponse, check, f"Push {instance_id} (expect {code})")

    def subscription_ops(self, name: str) -> tuple[list[tuple[str, int, str | None]], int, str]:
        """IncrementalAlterConfigs ops for one subscription; applies them to the model. Returns (ops, code, word).
        A subscription always keeps a `match` naming this client's id, unless every key goes, so no other
        connection's clients ever match it."""
        client = self.client
        if self.rng.random() < 0.15:
            (key, value), word = self.rng.choice(REFUSED_CONFIGS)
            ops = [("match", SET, self.match_value()), (key, SET, value)]
            self.rng.shuffle(ops)
            return ops, INVALID_REQUEST, word
        current = dict(client.subscriptions.get(name, {}))
        while True:
            ops = []
            for key in DESCRIBE_ORDER:
                roll = self.rng.random()
                if roll < 0.45:
                    ops.append((key, SET, self.value(key)))
                elif roll < 0.65:
                    ops.append((key, DELETE, None))
            after = dict(current)
            for key, operation, value in ops:
                if operation == SET:
                    after[key] = value
                else:
                    after.pop(key, None)
            if ops and (not after or "match" in after):
                break
        self.rng.shuffle(ops)
        if after:
            client.subscriptions[name] = after
        else:   # deleting every key removes the subscription
            client.subscriptions.pop(name, None)
        return ops, 0, ""

    def match_value(self) -> str:
        cid = re.escape(self.client.client_id)
        return self.rng.choice((f"client_id={cid}", f"client_id={cid},client_software_name=unknown",
                                f"client_id={cid},client_software_name=kcm-alpha",
                                f"client_software_name=kcm-beta,client_id={cid}", f"client_id={cid}-other"))

    def value(self, key: str) -> str:
        if key == "match":
            return self.match_value()
        return self.rng.choice(INTERVALS if key == "interval.ms" else METRIC_LISTS)

    def incremental(self) -> Step:
        """IncrementalAlterConfigs of a few subscriptions, with or without topics beside them (split and merged)."""
        version = self.rng.randrange(2)
        expected = []
        resources = []
        for name in self.rng.sample(self.names, self.rng.randint(1, 3)):
            ops, code, word = self.subscription_ops(name)
            resources.append((CLIENT_METRICS, name, ops))
            expected.append((CLIENT_METRICS, name, code, word))
        if self.rng.random() < 0.5:
            topics = [("own", self.client.log_topic), ("missing", ALTERED_MISSING)]
            for key, topic in self.rng.sample(topics, self.rng.randint(1, 2)):
                at = self.rng.randint(0, len(resources))
                resources.insert(at, (TOPIC, topic, TOPIC_CHANGE))
                expected.insert(at, dict(self.world.alter[(version, key)], resource_name=topic))
        request = incremental_request(version, resources)

        def check(response: Any) -> None:
            assert len(response.responses) == len(expected)
            for result, want in zip(response.responses, expected):
                if isinstance(want, dict):
                    assert body(result) == want
                    continue
                kind, name, code, word = want
                assert (result.resource_type, result.resource_name, result.error_code) == (kind, name, code)
                assert word in (result.error_message or "")
        return Step(request, IncrementalAlterConfigsResponse, check,
                    f"IncrementalAlterConfigs v{version} {[r[:2] for r in resources]}")

    def legacy_alter(self) -> Step:
        """AlterConfigs replaces a subscription's every key (none left: it is gone); a topic beside it is refused."""
        client = self.client
        version = self.rng.randrange(3)
        resources, expected = [], []
        for name in self.rng.sample(self.names, self.rng.randint(1, 2)):
            roll = self.rng.random()
            if roll < 0.15:
                (key, value), word = self.rng.choice(REFUSED_CONFIGS)
                configs, code = [("match", self.match_value()), (key, value)], INVALID_REQUEST
            else:
                chosen = {"match": self.match_value()} if roll < 0.85 else {}
                if chosen:
                    for key in ("interval.ms", "metrics"):
                        if self.rng.random() < 0.6:
                            chosen[key] = self.value(key)
                configs, code, word = list(chosen.items()), 0, ""
                if chosen:
                    client.subscriptions[name] = chosen
                else:
                    client.subscriptions.pop(name, None)
            resources.append((CLIENT_METRICS, name, configs))
            expected.append((CLIENT_METRICS, name, code, word))
        if self.rng.random() < 0.4:
            at = self.rng.randint(0, len(resources))
            resources.insert(at, (TOPIC, client.log_topic, [("retention.ms", "86400000")]))
            expected.insert(at, (TOPIC, client.log_topic, INVALID_REQUEST, ""))
        request = AlterConfigsRequest[version](resources=resources, validate_only=False)

        def check(response: Any) -> None:
            assert [(r.resource_type, r.resource_name, r.error_code) for r in response.responses] == [
                want[:3] for want in expected]
            for result, (_, _, _, word) in zip(response.responses, expected):
                assert word in (result.error_message or "")
        return Step(request, AlterConfigsResponse, check, f"AlterConfigs v{version} {[r[:2] for r in resources]}")

    def describe(self) -> Step:
        """DescribeConfigs of subscriptions (set or not), maybe beside a topic, a missing topic and a broker."""
        version = self.rng.randrange(5)
        resources = [(CLIENT_METRICS, name) for name in self.rng.sample(self.names, self.rng.randint(0, 3))]
        others = [(TOPIC, self.world.static_topic), (TOPIC, self.world.missing_topic), (BROKER, "0")]
        for resource in self.rng.sample(others, self.rng.randint(0 if resources else 1, 2)):
            resources.insert(self.rng.randint(0, len(resources)), resource)
        expected = [("model", name, described(self.client.subscriptions.get(name))) if kind == CLIENT_METRICS
                    else ("broker", name, self.world.describe[(version, kind, name)]) for kind, name in resources]
        request = describe_request(version, resources)

        def check(response: Any) -> None:
            assert [(r.resource_type, r.resource_name) for r in response.results] == resources
            for result, (source, name, want) in zip(response.results, expected):
                if source == "broker":
                    assert body(result) == want
                else:
                    assert result.error_code == 0
                    if version == 0:   # v0 tells only whether a value is the default
                        want = [(key, value, source == SOURCE_DEFAULT) for key, value, source in want]
                        assert [(c.name, c.value, c.is_default) for c in result.configs] == want
                    else:
                        assert [(c.name, c.value, c.config_source) for c in result.configs] == want
        return Step(request, DescribeConfigsResponse, check, f"DescribeConfigs v{version} {resources}")

    def list_resources(self) -> Step:
        version = self.rng.randrange(2)
        fields = {"resource_types": self.rng.choice(([], [CLIENT_METRICS]))} if version else {}
        expected = sorted(self.client.subscriptions)
        prefix = self.client.prefix

        def check(response: Any) -> None:
            assert response.error_code == 0
            assert sorted(r.resource_name for r in response.config_resources
                          if r.resource_name.startswith(prefix + "-")) == expected
            assert {r.resource_type for r in response.config_resources} <= {CLIENT_METRICS}
        return Step(ListConfigResourcesRequest[version](**fields), ListConfigResourcesResponse, check,
                    f"ListConfigResources v{version}")


def run_connection(world: World, seed: int, number: int) -> Client:
    """One connection's rounds: each round pipelined whole, then its answers read and checked in order."""
    rng = random.Random(f"{seed}/{number}")
    prefix = f"route-{seed}-c{number}"
    client = Client(number, client_id=f"{prefix}-app", prefix=prefix, log_topic=f"{prefix}-log")
    generator = Generator(world, client, rng)
    with Pipe(world.sandbox.bootstrap, client.client_id, rng) as pipe:
        for _ in range(ROUNDS):
            pipe.answers(pipe.pipeline(generator.batch()))
    return client


@pytest.mark.parametrize("seed", SEEDS)
def test_pipelined_random_requests_on_concurrent_connections_are_answered_in_order_as_the_model_says(world, seed):
    for number in range(CONNECTIONS):
        ensure_topic(KafkaSettings(world.sandbox.bootstrap), f"route-{seed}-c{number}-log", 1)

    with ThreadPoolExecutor(max_workers=CONNECTIONS) as pool:
        clients = [future.result(timeout=60) for future in
                   [pool.submit(run_connection, world, seed, number) for number in range(CONNECTIONS)]]

    # Each accepted push is one record, keyed by its instance id, with the pushing connection's client identity:
    # the software name and version only if the last ApiVersions on it was a valid v3+.
    world.accepted_pushes.extend(push for client in clients for push in client.pushes)
    records = metrics_records(world.sandbox, expected=len(world.accepted_pushes))
    ours = {instance_id for instance_id, _, _ in (p for client in clients for p in client.pushes)}
    seen = []
    for record in records:
        instance_id = uuid.UUID(record.key.decode())
        if instance_id in ours:
            attributes = decode(record.value, record.headers).attributes
            seen.append((instance_id, attributes["client_id"], (attributes["client_software_name"],
                         attributes["client_software_version"]) if "client_software_name" in attributes else None))
    assert sorted(seen, key=str) == sorted((p for client in clients for p in client.pushes), key=str)
    assert any(client.pushes for client in clients)   # the seed reached the receiver at all


# --- directed cases ------------------------------------------------------------------------------------------------


def test_a_connection_closed_mid_pipeline_does_not_disturb_the_others(world):
    topic = "route-closer"
    ensure_topic(KafkaSettings(world.sandbox.bootstrap), topic, 1)
    leaver_client = Client(90, client_id="route-leaver", prefix="route-leaver", log_topic=topic)
    stayer_client = Client(91, client_id="route-stayer", prefix="route-stayer", log_topic=f"{topic}-stayer")
    ensure_topic(KafkaSettings(world.sandbox.bootstrap), stayer_client.log_topic, 1)
    leaver_gen = Generator(world, leaver_client, random.Random(1))
    stayer_gen = Generator(world, stayer_client, random.Random(2))
    with Pipe(world.sandbox.bootstrap, stayer_client.client_id, random.Random(3)) as stayer:
        stayer.answers(stayer.pipeline([stayer_gen.get()]))
        leaver = Pipe(world.sandbox.bootstrap, leaver_client.client_id, random.Random(4))
        leaver.pipeline([leaver_gen.get(), leaver_gen.incremental(), leaver_gen.produce(), leaver_gen.api_versions(),
                         leaver_gen.describe(), leaver_gen.produce(), leaver_gen.get()] * 8)
        steps = [stayer_gen.push(), stayer_gen.produce(), stayer_gen.incremental(), stayer_gen.describe(),
                 stayer_gen.metadata(), stayer_gen.get(), stayer_gen.list_offsets(), stayer_gen.list_resources()]
        sent = stayer.pipeline(steps)
        leaver.close()   # with most of its answers unread
        stayer.answers(sent)
        stayer.answers(stayer.pipeline([stayer_gen.produce(), stayer_gen.list_offsets(), stayer_gen.describe()]))
    with Pipe(world.sandbox.bootstrap, "route-after", random.Random(5)) as after:
        after_gen = Generator(world, Client(92, "route-after", "route-after", topic), random.Random(6))
        after.answers(after.pipeline([after_gen.api_versions(), after_gen.metadata(), after_gen.list_resources()]))


def test_produce_with_acks_0_gets_no_answer_and_later_requests_still_answer_in_order(world):
    topic = "route-fire-and-forget"
    ensure_topic(KafkaSettings(world.sandbox.bootstrap), topic, 1)
    client = Client(93, client_id="route-ff", prefix="route-ff", log_topic=topic)
    generator = Generator(world, client, random.Random(7))
    steps = []
    for version in (3, 7, 9):
        steps.append(Step(produce_request(version, topic, 0), None, None, f"Produce v{version} acks=0"))
        client.records += 1
        steps.append(generator.list_offsets())
    steps.append(generator.get())
    with Pipe(world.sandbox.bootstrap, client.client_id, random.Random(8)) as pipe:
        pipe.answers(pipe.pipeline(steps))
        pipe.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):   # nothing more is due: no answer for the acks=0 requests
            pipe.sock.recv(1)
