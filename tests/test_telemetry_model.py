"""Model-based test: the sandbox's KIP-714 telemetry against a reference written from Apache Kafka 4.3.1's source.

Seeded random scenarios mix CLIENT_METRICS config changes (IncrementalAlterConfigs and AlterConfigs through
`config_apis.split`, the gateway's seam) with GetTelemetrySubscriptions and PushTelemetry from several clients
(`TelemetryManager`, driven with an injected clock, as the gateway drives it), and compare every answer with
`KafkaModel` below: error codes, client instance and subscription ids, requested metrics and their order, push
interval, accepted compression types, DeltaTemporality, throttling, termination, payloads handed to the receiver,
which subscriptions match, client state expiry and disconnects, and the broker's `instance-count`.

The reference follows Apache Kafka 4.3.1 as tagged in confluentinc/kafka (branch 4.3, commit 26b251a451ce,
"Bump version to 4.3.1"), not kcm's code:
- server/.../ClientMetricsManager.java: updateSubscription (135-157), processGet... (159-186), processPush...
  (188-229), clientInstance (266-316), createClientInstance (330-361), computeSubscriptionId (368-372),
  validateGetRequest (390-400), validatePushRequest (402-436), the expiration task and disconnect listener;
- server/.../metrics/ClientMetricsInstance.java (maybeUpdateGet/PushRequestTimestamp),
  ClientMetricsInstanceMetadata.java (attributes, isMatch), ClientMetricsConfigs.java (validate 143-178,
  parseMatchingPatterns 191-217);
- clients/.../config/ConfigDef.java (LIST parsing, parseValue 531-554 dropping repeats, ValidList 1028-1092);
- metadata/.../controller/ConfigurationControlManager.java (incrementalAlterConfigResource 275-335, getParts);
- ClientTelemetryExporterPlugin / DefaultClientTelemetryPayload / PushTelemetryRequest.metricsData /
  ClientTelemetryUtils.decompress (218-237): bounded decompression, a failure answered INVALID_RECORD;
- Lz4BlockInputStream / Lz4BlockOutputStream.FLG (a frame with dependent blocks is refused), SnappyInputStream
  (xerial framing or a raw block), GZIPInputStream, zstd-jni.
Java's own rules the reference needs (String.hashCode, HashMap/HashSet and ConcurrentHashMap iteration order,
String.split/trim, Integer.parseInt, Uuid.toString/hashCode, InetAddress.getHostAddress) are re-implemented here.

Two deviations that docs/sandbox.md ("Differences from a real broker") documents as deliberate are adopted:
a payload that is not OTLP metrics is INVALID_RECORD, and when subscriptions' metrics share a Java hash bucket the
union may follow another subscription order than the broker's ConcurrentHashMap (the reference then accepts any
subscription order, with the subscription id Kafka's formula gives for the order answered).

Java's rules are checked against a JVM by `test_the_reference_agrees_with_a_jvm` when `javac` is on the PATH.

What this test found the sandbox answering otherwise than Kafka 4.3.1, since mended (each has a minimal test at the
end): a repeated list item (`metrics=a.,a.`) was refused instead of dropped; an LZ4 frame with dependent blocks was
accepted instead of INVALID_RECORD; an expired client state unmapped the connection it was created on (only while it
still named that client), not the one of its last request, and expiry ran lazily, so it could unmap a connection a
newer client state had taken meanwhile. A difference in a config change's answer, or in what a push's export
answers, is recorded and the run goes on with the model following the sandbox; any other ends the run.

`KCM_TELEMETRY_MODEL_SEEDS=N` runs N seeds per family instead of the default; `KCM_TELEMETRY_MODEL_SEED=S` one seed.
"""

from __future__ import annotations

import base64
import collections
import functools
import gzip
import ipaddress
import itertools
import math
import os
import random
import re
import shutil
import struct
import subprocess
import uuid
from dataclasses import dataclass, field

import crc32c
import lz4.frame
import pytest
import snappy
import zstandard
from kafka.protocol.admin.configs import AlterConfigsRequest, IncrementalAlterConfigsRequest
from payloads import client_metrics

from kcm_sandbox import config_apis, telemetry
from kcm_sandbox.store import SubscriptionStore
from kcm_sandbox.telemetry import ClientIdentity, TelemetryManager

# --- Kafka constants (Errors, CompressionType, ClientMetricsConfigs, ClientMetricsManager) -------------------------

NONE, INVALID_CONFIG, INVALID_REQUEST = 0, 40, 42
UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD, THROTTLING_QUOTA_EXCEEDED = 76, 87, 89
UNKNOWN_SUBSCRIPTION_ID, TELEMETRY_TOO_LARGE = 117, 118
CLIENT_METRICS = 16
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
SUPPORTED_COMPRESSION_TYPES = [4, 3, 1, 2]  # ZSTD, LZ4, GZIP, SNAPPY
KNOWN_COMPRESSION_IDS = range(5)  # CompressionType.forId
DEFAULT_TELEMETRY_MAX_BYTES = 1048576
INTERVAL_MS_DEFAULT, MIN_INTERVAL_MS, MAX_INTERVAL_MS = 300000, 100, 3600000
CACHE_EXPIRY_MS = 60000
ALL = "*"
CONFIG_NAMES = ("metrics", "interval.ms", "match")
LIST_CONFIGS = ("metrics", "match")
ATTRIBUTES = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
              "client_source_address", "client_source_port")
ZERO_UUID, ONE_UUID = uuid.UUID(int=0), uuid.UUID(int=1)
RESERVED = (ZERO_UUID, ONE_UUID)  # Uuid.RESERVED: METADATA_TOPIC_ID (= ONE_UUID), ZERO_UUID
START_MS = 1_700_000_000_000
STATS: collections.Counter[str] = collections.Counter()  # paths the scenarios reached (see the last test)
EXPIRY_SLACK_MS = 3  # Kafka's expiry runs on a timer thread: the model never lands this close to an expiry


class KafkaError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# --- Java behaviour the broker's answers depend on ------------------------------------------------------------------

_JAVA_TRIM = "".join(chr(c) for c in range(0x21))
_COMMA_WITH_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]*,[ \t\n\x0b\f\r]*")


def java_hash(text: str) -> int:
    """String.hashCode (as an unsigned 32-bit value)."""
    units = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for i in range(0, len(units), 2):
        value = (31 * value + (units[i] << 8) + units[i + 1]) & 0xFFFFFFFF
    return value


def spread(text: str) -> int:
    """HashMap.hash / ConcurrentHashMap.spread (the low bits are what pick a bin)."""
    h = java_hash(text)
    return h ^ (h >> 16)


def java_split(text: str, separator: str) -> list[str]:
    """String.split(separator) for a one-character literal: trailing empty strings removed; "" gives [""]."""
    if text == "":
        return [""]
    parts = text.split(separator)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def java_trim(text: str) -> str:
    return text.strip(_JAVA_TRIM)


class JavaHashSet:
    """java.util.HashSet<String>: bins in index order, insertion order within a bin, resize preserves it."""

    def __init__(self, table_size: int = 16) -> None:
        self.bins: list[list[str]] = [[] for _ in range(table_size)]
        self.size = 0

    @classmethod
    def copy_of(cls, items: list[str]) -> JavaHashSet:
        """new HashSet<>(collection): HashMap(max((int) (n / .75f) + 1, 16)), table = tableSizeFor(that)."""
        wanted = max(int(len(items) / 0.75) + 1, 16)
        table = 1
        while table < wanted:
            table *= 2
        result = cls(table)
        for item in items:
            result.add(item)
        return result

    def add(self, item: str) -> None:
        index = spread(item) & (len(self.bins) - 1)
        chain = self.bins[index]
        if item in chain:
            return
        chain.append(item)
        if len(chain) > 8:  # putVal: binCount >= TREEIFY_THRESHOLD - 1 -> treeifyBin, which resizes below 64 bins
            assert len(self.bins) < 64, "the model does not implement tree bins"
            self._resize()
        self.size += 1
        if self.size > int(len(self.bins) * 0.75):
            self._resize()

    def _resize(self) -> None:
        items = list(self)
        self.bins = [[] for _ in range(len(self.bins) * 2)]
        for item in items:  # lo/hi split keeps the relative order of each old bin
            self.bins[spread(item) & (len(self.bins) - 1)].append(item)

    def bucket(self, item: str) -> int:
        return spread(item) & (len(self.bins) - 1)

    def __iter__(self):
        for chain in self.bins:
            yield from chain

    def __contains__(self, item: str) -> bool:
        return item in self.bins[self.bucket(item)]


class ConcurrentHashMapOrder:
    """Iteration order of ClientMetricsManager.subscriptionMap (a ConcurrentHashMap of at most 8 names: 16 bins,
    no resize, no tree bins): bins in index order, a new key appended to its bin, a replaced value kept in place."""

    def __init__(self) -> None:
        self.bins: list[list[str]] = [[] for _ in range(16)]

    def put(self, key: str) -> None:
        chain = self.bins[spread(key) & 0x7FFFFFFF & 15]
        if key not in chain:
            chain.append(key)

    def remove(self, key: str) -> None:
        chain = self.bins[spread(key) & 0x7FFFFFFF & 15]
        if key in chain:
            chain.remove(key)

    def keys(self) -> list[str]:
        return [key for chain in self.bins for key in chain]


def uuid_text(value: uuid.UUID) -> str:
    """Uuid.toString: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def uuid_hash(value: uuid.UUID) -> int:
    """Uuid.hashCode: (int) (xor >> 32) ^ (int) xor, xor = msb ^ lsb (unsigned 32-bit here)."""
    xor = (value.int >> 64) ^ (value.int & 0xFFFFFFFFFFFFFFFF)
    return ((xor >> 32) ^ xor) & 0xFFFFFFFF


def int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def subscription_id(ordered_metrics: list[str], interval: int, instance: uuid.UUID) -> int:
    """computeSubscriptionId: CRC32C of Set.toString() + interval (UTF-8), (int) crc ^ Uuid.hashCode."""
    text = "[" + ", ".join(ordered_metrics) + "]" + str(interval)
    return int32(crc32c.crc32c(text.encode("utf-8")) ^ uuid_hash(instance))


def host_address(address: str) -> str:
    """InetAddress.getHostAddress of a socket's peer (IPv6 uncompressed, IPv4-mapped as IPv4)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return ":".join(format(int(group, 16), "x") for group in ip.exploded.split(":"))
    return str(ip)


def parse_list(raw: str) -> list[str]:
    """ConfigDef.parseType(LIST) of a string, then parseValue's ValidList handling (4.3.1): repeats are dropped
    with a warning (KAFKA-19875), an empty item is a ConfigException (INVALID_CONFIG)."""
    trimmed = java_trim(raw)
    items = [] if not trimmed else _COMMA_WITH_WHITESPACE.split(trimmed)  # Pattern.split(trimmed, -1)
    items = list(dict.fromkeys(items))
    if "" in items:
        raise KafkaError(INVALID_CONFIG)
    return items


def parse_int(raw: str) -> int:
    """ConfigDef.parseType(INT): Integer.parseInt(trimmed); a NumberFormatException is INVALID_CONFIG."""
    trimmed = java_trim(raw)
    if not re.fullmatch(r"[+-]?[0-9]+", trimmed) or not -(2**31) <= int(trimmed) < 2**31:
        raise KafkaError(INVALID_CONFIG)
    return int(trimmed)


# --- match patterns: a pool whose Java and Python (re, ASCII) meanings are the same -------------------------------

MATCH_POOL: dict[str, list[str]] = {
    "client_id": ["payments-.*", "orders-[a-z]+", ".*", "payments-producer", "(payments|orders)-.*", ".+consumer",
                  "svc-.*", "rdkafka"],
    "client_software_name": ["apache-kafka-java", "librdkafka", "apache-kafka-java|librdkafka", "lib.*", "unknown",
                             "confluent-kafka-.*"],
    "client_software_version": [r"2\.6\..*", r"4\.[0-9]+\.[0-9]+", ".*-SNAPSHOT", r"\d+\.\d+\.\d+", "unknown"],
    "client_source_address": [r"10\.0\.0\.[0-9]+", r"127\.0\.0\.1", "0:0:0:0:0:0:0:1", r"10\..*",
                              "2001:db8:0:0:0:0:0:1", "::1"],
    "client_source_port": ["4000[0-9]", "[0-9]{5}", "5[0-9]*", "4001[0-2]"],
    "client_instance_id": ["[A-M].*", ".*[0-9].*", ".*", "[a-z_-].*"],
}
# Patterns Pattern.compile refuses, and entries ClientMetricsConfigs.parseMatchingPatterns refuses (INVALID_CONFIG).
INVALID_PATTERNS = frozenset({"(", "[a-", "*x", "a)", "+"})
BAD_MATCH_ENTRIES = ["client_id=(", "client_id=[a-", "client_software_name=*x", "client_id=a)", "client_name=x",
                     "client_id", "client_id=", "client_id==", " =x", "client_id=+"]
METRICS_POOL = ["org.apache.kafka.producer.", "org.apache.kafka.consumer.",
                "org.apache.kafka.producer.node.request.latency", "org.apache.kafka.consumer.fetch.manager.",
                "org.apache.kafka.producer.record.", "org.apache.kafka.client.", "a.", "b.", "c.",
                "org.\U0001F600.", "client.", "kafka.", "x.y.", "org.apache.kafka.plugins."]
# Bins of a 16-bin ConcurrentHashMap: aa-first 4; payments, ops.audit, zz-last 7; orders 10; team-b 13.
SUBSCRIPTION_NAMES = ["payments", "ops.audit", "zz-last", "orders", "team-b", "aa-first"]
GOOD_INTERVALS = ["100", "101", "250", "999", "1000", "5000", "60000", "299999", "300000", "300001", "3600000",
                  " 1000 ", "+500", "007"]
BAD_INTERVALS = ["99", "0", "-1", "3600001", "abc", "1.5", "", "2147483648"]


def java_matches(pattern: str, value: str) -> bool:
    """Pattern.compile(pattern).matcher(value).matches() for the patterns of MATCH_POOL."""
    return re.fullmatch(pattern, value, flags=re.ASCII) is not None


# --- the reference: Apache Kafka 4.3.1's broker -------------------------------------------------------------------


@dataclass
class SubscriptionInfo:
    name: str
    metrics: JavaHashSet
    interval: int
    match: dict[str, str]


@dataclass
class Instance:
    """ClientMetricsInstance, plus the subscription ids the documented ordering freedom allows (one, normally)."""

    client_instance_id: uuid.UUID
    attributes: dict[str, str | None]
    version: int
    interval: int
    orders: dict[int, list[str]]  # subscription id -> requested metrics in that order
    kafka_id: int
    kafka_order: list[str]
    last_get: float = float("-inf")  # Kafka's 0 against a wall clock
    last_push: float = float("-inf")
    terminating: bool = False
    last_error: int = NONE
    expiry: int = 0
    task_connection: str = ""

    def maybe_update_get(self, now: int) -> bool:
        if now - max(self.last_get, self.last_push) >= self.interval:
            self.last_get = now
            return True
        return False

    def maybe_update_push(self, now: int) -> bool:
        # The first clause (a push right after a Get may come early) never decides: a Get is accepted only one
        # interval after the last push, and a Get let through after an error leaves lastGetRequestTimestamp alone.
        accept = self.last_get > self.last_push or now - self.last_push >= self.interval
        if accept:
            self.last_push = now
        return accept


@dataclass
class Expected:
    error: int
    payload: bytes | None = None
    interval: int | None = None
    either: tuple[int, ...] = ()  # for a push whose subscription id is only known to be one of several


def validate_configs(name: str, configs: dict[str, str]) -> None:
    """ClientMetricsConfigs.validate (4.3.1), reached through ControllerConfigurationValidator."""
    if not name:
        raise KafkaError(INVALID_REQUEST)
    if any(key not in CONFIG_NAMES for key in configs):
        raise KafkaError(INVALID_REQUEST)
    # CONFIG.parse: every key (all of its failures are INVALID_CONFIG), then the range, then the patterns.
    parse_list(configs.get("metrics", ""))
    interval = parse_int(configs["interval.ms"]) if "interval.ms" in configs else INTERVAL_MS_DEFAULT
    match = parse_list(configs.get("match", ""))
    if "interval.ms" in configs and not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
        raise KafkaError(INVALID_REQUEST)
    parse_match(match)


def parse_match(entries: list[str]) -> dict[str, str]:
    """parseMatchingPatterns: split("="), exactly two parts, a known attribute, a valid pattern; a HashMap."""
    patterns: dict[str, str] = {}
    for entry in entries:
        parts = java_split(entry, "=")
        if len(parts) != 2 or java_trim(parts[0]) not in ATTRIBUTES or java_trim(parts[1]) in INVALID_PATTERNS:
            raise KafkaError(INVALID_CONFIG)
        patterns[java_trim(parts[0])] = java_trim(parts[1])
    return patterns


@functools.lru_cache(maxsize=4096)
def union_orders(matching: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[tuple[str, ...], ...]:
    """createClientInstance's metric union for subscriptions in this order (first result), then every order
    another subscription order could give (docs/sandbox.md: the sandbox may union in another order)."""

    def union(order: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[str, ...]:
        subscribed = JavaHashSet()  # new HashSet<>(), then addAll(info.metrics()) in subscriptionMap's order
        for _, metrics in order:
            for metric in metrics:
                subscribed.add(metric)
        if any(ALL in metrics for _, metrics in order):
            return (ALL,)
        return tuple(subscribed)

    kafka = union(matching)
    results = [kafka]
    if len(matching) > 1 and kafka != (ALL,):
        subscribed = JavaHashSet()
        for metric in kafka:
            subscribed.add(metric)
        owners: dict[int, set[str]] = {}
        for name, metrics in matching:
            for metric in metrics:
                owners.setdefault(subscribed.bucket(metric), set()).add(name)
        if any(len(names) > 1 for names in owners.values()):
            for order in itertools.permutations(matching):
                candidate = union(order)
                if candidate not in results:
                    results.append(candidate)
    return tuple(results)


class KafkaModel:
    """ClientMetricsManager and the controller's config handling, as Apache Kafka 4.3.1 has them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.configs: dict[str, dict[str, str]] = {}
        self.subscriptions: dict[str, SubscriptionInfo] = {}
        self.order = ConcurrentHashMapOrder()
        self.version = 0
        self.cache: dict[uuid.UUID, Instance] = {}
        self.connections: dict[str, uuid.UUID] = {}
        self.expired_at: list[int] = []  # when instances were dropped by their expiration task
        self.documented_order_differences = 0
        self.stats = STATS

    # CLIENT_METRICS configs (ConfigAdminManager.preprocess, ConfigurationControlManager, updateSubscription)
    # Each returns the error code and the configs to apply (None: nothing changes); `apply` makes the change.
    def incremental_alter(self, name: str, ops: list[tuple[str, int, str | None]],
                          validate_only: bool) -> tuple[int, dict[str, str] | None]:
        keys = [key for key, _, _ in ops]
        if len(set(keys)) != len(keys):
            return INVALID_REQUEST, None
        current = self.configs.get(name, {})
        records: dict[str, str | None] = {}
        for key, op, value in ops:
            old = current.get(key)
            new = old
            if op == SET:
                new = value
            elif op == DELETE:
                new = None
            else:
                if key not in LIST_CONFIGS:  # configSchema.isSplittable
                    return INVALID_CONFIG, None
                parts = [part for part in java_split(old if old is not None else "", ",") if part]  # getParts
                for item in java_split(value or "", ","):
                    if op == APPEND and item not in parts:
                        parts.append(item)
                    elif op == SUBTRACT and item in parts:
                        parts.remove(item)
                new = ",".join(parts)
            if new != old:
                records[key] = new
        updated = dict(current)
        for key, value in records.items():
            if value is None:
                updated.pop(key, None)
            else:
                updated[key] = value
        return self._commit(name, updated, bool(records), validate_only)

    def legacy_alter(self, name: str, configs: dict[str, str],
                     validate_only: bool) -> tuple[int, dict[str, str] | None]:
        current = self.configs.get(name, {})
        return self._commit(name, dict(configs), configs != current, validate_only)

    def _commit(self, name: str, updated: dict[str, str], changed: bool,
                validate_only: bool) -> tuple[int, dict[str, str] | None]:
        try:
            validate_configs(name, updated)
        except KafkaError as error:
            self.stats[f"alter {error.code}"] += 1
            return error.code, None
        self.stats["alter 0"] += 1
        return NONE, None if validate_only or not changed else updated

    def apply(self, name: str, updated: dict[str, str]) -> None:
        """The controller's ConfigRecords replayed, then the broker's updateSubscription with the full configs."""
        if updated:
            self.configs[name] = updated
        else:
            self.configs.pop(name, None)
        self._update_subscription(name, updated)

    def _update_subscription(self, name: str, props: dict[str, str]) -> None:
        if not props:
            if name in self.subscriptions:
                del self.subscriptions[name]
                self.order.remove(name)
                self.version += 1
            return
        interval = parse_int(props["interval.ms"]) if "interval.ms" in props else INTERVAL_MS_DEFAULT
        metrics = parse_list(props.get("metrics", ""))
        self.subscriptions[name] = SubscriptionInfo(name, JavaHashSet.copy_of(metrics), interval,
                                                    parse_match(parse_list(props.get("match", ""))))
        self.order.put(name)
        self.version += 1

    # client instances
    def matching(self, attributes: dict[str, str | None]) -> list[SubscriptionInfo]:
        found = []
        for name in self.order.keys():
            info = self.subscriptions[name]
            if all(attributes.get(key) is not None and java_matches(pattern, attributes[key])
                   for key, pattern in info.match.items()):
                found.append(info)
        return found

    def _create(self, instance_id: uuid.UUID, attributes: dict[str, str | None], connection: str) -> Instance:
        found = self.matching(attributes)
        interval = min([INTERVAL_MS_DEFAULT] + [info.interval for info in found])
        orders = union_orders(tuple((info.name, tuple(info.metrics)) for info in found))
        ids = {subscription_id(list(order), interval, instance_id): list(order) for order in orders}
        kafka_id = subscription_id(list(orders[0]), interval, instance_id)
        instance = Instance(instance_id, attributes, self.version, interval, ids, kafka_id, list(orders[0]))
        self.stats["instance created" if instance_id not in self.cache else "instance re-evaluated"] += 1
        self.stats["ordering freedom (documented)"] += len(ids) > 1
        self.cache[instance_id] = instance
        self.connections[connection] = instance_id
        return instance

    def advance(self, now: int) -> None:
        """The expiration timer tasks due by now (the model never runs a request within EXPIRY_SLACK_MS of one)."""
        for instance in sorted(self.cache.values(), key=lambda item: item.expiry):
            if instance.expiry < now:
                self.connections.pop(instance.task_connection, None)
                del self.cache[instance.client_instance_id]
                self.expired_at.append(instance.expiry)
                self.stats["instance expired"] += 1

    def client_instance(self, instance_id: uuid.UUID, attributes: dict[str, str | None], connection: str,
                        now: int) -> Instance:
        instance = self.cache.get(instance_id)
        if instance is None:
            instance = self._create(instance_id, attributes, connection)
        elif instance.version < self.version:
            instance = self._create(instance_id, instance.attributes, connection)
        instance.expiry = now + max(CACHE_EXPIRY_MS, instance.interval * 3)
        instance.task_connection = connection
        return instance

    def disconnect(self, connection: str) -> None:
        instance_id = self.connections.pop(connection, None)
        if instance_id is not None:
            self.stats["instance dropped on disconnect"] += instance_id in self.cache
            self.cache.pop(instance_id, None)

    def get(self, instance: Instance, now: int) -> Expected:
        if not instance.maybe_update_get(now):
            if instance.last_error not in (UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE):
                self.stats["get 89"] += 1
                return Expected(THROTTLING_QUOTA_EXCEEDED)
            self.stats[f"get early after {instance.last_error}"] += 1
        instance.last_error = NONE
        self.stats["get 0"] += 1
        return Expected(NONE)

    def push(self, instance: Instance, sent_id: int, terminating: bool, compression: int, payload: Payload,
             now: int) -> Expected:
        error = NONE
        either: tuple[int, ...] = ()
        if instance.terminating:
            error = INVALID_REQUEST
        elif not instance.maybe_update_push(now):
            if not terminating:
                error = THROTTLING_QUOTA_EXCEEDED
            else:
                self.stats["terminating push skips the throttle"] += 1
        if error == NONE and sent_id not in instance.orders:
            error = UNKNOWN_SUBSCRIPTION_ID
        elif error == NONE and len(instance.orders) > 1:
            either = (UNKNOWN_SUBSCRIPTION_ID,)  # the documented ordering freedom: the sandbox picked one id
        if error == NONE and compression not in KNOWN_COMPRESSION_IDS:
            error = UNSUPPORTED_COMPRESSION_TYPE
        elif error == NONE and payload.data is not None and len(payload.data) > self.max_bytes:
            error = TELEMETRY_TOO_LARGE
        instance.terminating = terminating  # the `finally` of processPushTelemetryRequest
        if error == NONE and payload.data:
            content = payload.content
            if content is None or len(content) > self.max_bytes or not payload.metrics_data:
                error = INVALID_RECORD
        self.stats[f"push {error}"] += 1
        instance.last_error = error
        if error != NONE:
            return Expected(error, either=either)
        if payload.data:
            return Expected(NONE, payload=payload.content, interval=instance.interval, either=either)
        return Expected(NONE, either=either)


# --- payloads --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    kind: str
    data: bytes | None
    content: bytes | None  # what Kafka's decompression yields (None: it throws), before the size bound
    metrics_data: bool = True  # the content is OTLP MetricsData (or empty)

    def __repr__(self) -> str:
        size = None if self.data is None else len(self.data)
        return f"Payload({self.kind}, {size} bytes)"


@functools.lru_cache(maxsize=None)
def metrics_of_size(size: int) -> bytes:
    """A valid MetricsData serialized to exactly `size` bytes (>= ~260)."""
    data = client_metrics()
    scope = data.resource_metrics[0].scope_metrics[0].scope
    for schema in range(6):
        data.resource_metrics[0].schema_url = "s" * schema
        scope.name = ""
        base = len(data.SerializeToString())
        for length in range(max(0, size - base - 8), max(0, size - base) + 1):
            scope.name = "p" * length
            encoded = data.SerializeToString()
            if len(encoded) == size:
                return encoded
    raise AssertionError(f"no MetricsData of {size} bytes")


SMALL_METRICS = client_metrics().SerializeToString()
GARBAGE = b"\xff\xff\xff\xff\xff"  # an unterminated varint: no protobuf message at all
XERIAL_MAGIC = b"\x82SNAPPY\x00"


def xerial(data: bytes) -> bytes:
    """snappy-java's SnappyOutputStream framing (what Java clients send)."""
    out = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    for start in range(0, max(len(data), 1), 32 * 1024):
        block = snappy.compress(data[start:start + 32 * 1024])
        out += struct.pack(">i", len(block)) + block
    return out


def compress(data: bytes, compression: int) -> bytes:
    if compression == 1:
        return gzip.compress(data, mtime=0)
    if compression == 2:
        return snappy.compress(data)  # a raw block: SnappyInputStream falls back to it without the xerial header
    if compression == 3:
        return lz4.frame.compress(data, block_linked=False)
    if compression == 4:
        return zstandard.ZstdCompressor().compress(data)
    return data


@functools.lru_cache(maxsize=None)
def linked_lz4() -> tuple[bytes, bytes]:
    content = metrics_of_size(150_000)
    frame = lz4.frame.compress(content, block_linked=True)
    assert not frame[4] & 0x20, "expected an LZ4 frame with dependent blocks"
    return content, frame


CORRUPT = {
    1: b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xffnot deflate at all",
    2: b"\xff\xff\xff\xff\xff\x01\x02",
    3: b"\x04\x22\x4d\x18\x60\x40\x00garbage-after-header",
    4: b"\x28\xb5\x2f\xfdgarbage-after-magic",
}


@functools.lru_cache(maxsize=256)
def make_payload(kind: str, compression: int, max_bytes: int) -> Payload:
    codec = compression if compression in KNOWN_COMPRESSION_IDS else 0
    if kind == "absent":
        return Payload(kind, None, None)
    if kind == "empty":
        return Payload(kind, b"", None)
    if kind == "metrics":
        return Payload(kind, compress(SMALL_METRICS, codec), SMALL_METRICS)
    if kind in ("at-max", "over-max"):
        content = metrics_of_size(max_bytes + (kind == "over-max"))
        return Payload(kind, compress(content, codec), content)
    if kind == "bomb":
        content = bytes(4 * max_bytes)
        return Payload(kind, compress(content, codec), content, metrics_data=False)
    if kind == "oversize":
        return Payload(kind, bytes(max_bytes + 1 + max_bytes % 7), None)
    if kind == "garbage":
        return Payload(kind, compress(GARBAGE, codec), GARBAGE, metrics_data=False)
    if kind == "corrupt":
        return Payload(kind, CORRUPT.get(codec, GARBAGE), None if codec else GARBAGE, metrics_data=False)
    if kind == "truncated":
        return Payload(kind, compress(metrics_of_size(2000), codec)[:-5], None)
    if kind == "compressed-empty":
        return Payload(kind, compress(b"", codec), b"")
    if kind == "xerial":
        return Payload(kind, xerial(SMALL_METRICS), SMALL_METRICS)
    if kind == "lz4-linked":
        # Lz4BlockInputStream.readHeader -> FLG.validate: "Dependent block stream is unsupported".
        return Payload(kind, linked_lz4()[1], None)
    if kind == "lz4-big":
        content = metrics_of_size(150_000)
        return Payload(kind, lz4.frame.compress(content, block_linked=False), content)
    raise AssertionError(kind)


# payload kind -> the codecs it is sent with (other kinds: any, including ids Kafka does not know)
PAYLOAD_CODECS = {"xerial": (2,), "lz4-linked": (3,), "lz4-big": (3,), "truncated": (1, 3, 4), "bomb": (1, 2, 3, 4),
                  "compressed-empty": (1, 2, 3, 4)}


# --- the scenario driver ---------------------------------------------------------------------------------------------


@dataclass
class Connection:
    connection_id: str
    port: int


@dataclass
class Client:
    name: str
    client_id: str | None
    software_name: str | None
    software_version: str | None
    address: str
    connections: list[Connection] = field(default_factory=list)
    instance_id: uuid.UUID | None = None
    subscription_id: int = 0

    def identity(self, connection: Connection) -> ClientIdentity:
        return ClientIdentity(self.client_id, self.software_name, self.software_version, self.address,
                              connection.port)

    def attributes(self, instance_id: uuid.UUID, connection: Connection) -> dict[str, str | None]:
        """ClientMetricsInstanceMetadata of a request on `connection`."""
        return {
            "client_instance_id": uuid_text(instance_id),
            "client_id": self.client_id,
            "client_software_name": self.software_name,
            "client_software_version": self.software_version,
            "client_source_address": host_address(self.address),
            "client_source_port": str(connection.port),
        }


class Seconds:
    """The injected clock: seconds whose product with 1000.0 is exactly the model's integer millisecond."""

    def __init__(self, now_ms: int) -> None:
        self.set(now_ms)

    def set(self, now_ms: int) -> None:
        value = now_ms / 1000
        for direction in (float("inf"), float("-inf")):
            candidate = value
            for _ in range(4):
                if candidate * 1000.0 == now_ms:
                    self.value = candidate
                    return
                candidate = math.nextafter(candidate, direction)
        raise AssertionError(f"no float seconds for {now_ms} ms")

    def __call__(self) -> float:
        return self.value


class IdSource:
    """uuid4 for the sandbox: seeded, with candidates Kafka's generateNewClientId must skip injected at times."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.queue: list[uuid.UUID] = []

    def __call__(self) -> uuid.UUID:
        if self.queue:
            return self.queue.pop(0)
        return uuid.UUID(int=self.rng.getrandbits(128))


FAMILIES = {
    # op weights: get, push, time, alter, connection, reserved
    "ladder": dict(get=25, push=40, time=25, alter=5, connection=0, reserved=3),
    "codecs": dict(get=15, push=55, time=20, alter=5, connection=0, reserved=1),
    "configs": dict(get=25, push=20, time=18, alter=35, connection=0, reserved=1),
    "connections": dict(get=25, push=27, time=25, alter=6, connection=15, reserved=1),
    "mixed": dict(get=22, push=33, time=20, alter=14, connection=8, reserved=2),
}
PAYLOAD_KINDS = {
    "ladder": {"metrics": 70, "empty": 10, "absent": 5, "oversize": 5, "compressed-empty": 5, "at-max": 5},
    "codecs": {"metrics": 25, "empty": 4, "absent": 3, "oversize": 6, "at-max": 8, "over-max": 8, "bomb": 5,
               "garbage": 6, "corrupt": 8, "truncated": 6, "compressed-empty": 5, "xerial": 6, "lz4-linked": 4,
               "lz4-big": 4},
    "configs": {"metrics": 85, "empty": 10, "absent": 5},
    "connections": {"metrics": 80, "empty": 15, "absent": 5},
    "mixed": {"metrics": 50, "empty": 6, "absent": 3, "oversize": 4, "at-max": 4, "over-max": 4, "bomb": 3,
              "garbage": 4, "corrupt": 4, "truncated": 3, "compressed-empty": 4, "xerial": 4, "lz4-linked": 3,
              "lz4-big": 3},
}
STEPS = {"ladder": 90, "codecs": 70, "configs": 80, "connections": 90, "mixed": 100}


class Mismatch(AssertionError):
    def __init__(self, message: str, seed: int) -> None:
        super().__init__(message)
        self.seed = seed


class Scenario:
    def __init__(self, family: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.family, self.seed = family, seed
        self.rng = random.Random(f"{family}-{seed}")
        rng = self.rng
        self.max_bytes = DEFAULT_TELEMETRY_MAX_BYTES if rng.random() < 0.6 else rng.randrange(400, 3000)
        self.now = START_MS + rng.randrange(0, 10**6)
        self.clock = Seconds(self.now)
        self.ids = IdSource(random.Random(f"ids-{family}-{seed}"))
        monkeypatch.setattr(telemetry.uuid, "uuid4", self.ids)
        self.store = SubscriptionStore()
        self.manager = TelemetryManager(self.store, telemetry_max_bytes=self.max_bytes, clock=self.clock)
        self.model = KafkaModel(self.max_bytes)
        self.connection_numbers = itertools.count(1)
        self.clients = [self._new_client(index) for index in range(rng.randrange(2, 5))]
        self.trace: list[str] = []
        self.mismatches: list[Mismatch] = []
        self.completed = False  # ran every step (soft differences aside)
        self.step = 0
        self.instance_count_checks = 0

    # generation helpers
    def _new_client(self, index: int) -> Client:
        rng = self.rng
        client = Client(
            name=f"client{index}",
            client_id=rng.choice(["payments-producer", "payments-consumer", "orders-consumer", "orders-x", "",
                                  "rdkafka", "svc-\u00e9t\u00e9"] + ([None] if rng.random() < 0.1 else [])),
            software_name=rng.choice(["apache-kafka-java", "librdkafka", "confluent-kafka-python", "unknown"]
                                     + ([None] if rng.random() < 0.1 else [])),
            software_version=rng.choice(["4.3.0", "2.6.1", "4.1.0-SNAPSHOT", "3.9.1", "unknown"]),
            address=rng.choice(["10.0.0.7", "10.0.0.8", "127.0.0.1", "::1", "::ffff:10.0.0.9", "2001:db8::1"]),
        )
        self._open(client)
        return client

    def _open(self, client: Client) -> Connection:
        connection = Connection(f"conn-{next(self.connection_numbers)}",
                                self.rng.choice([self.rng.randrange(40000, 40013), self.rng.randrange(50000, 50004)]))
        client.connections.append(connection)
        return connection

    def _weighted(self, weights: dict[str, int]) -> str:
        return self.rng.choices(list(weights), weights=list(weights.values()))[0]

    def fail(self, what: str, kafka: object, kcm: object, soft: bool = False) -> None:
        """Report a difference; a soft one (after which the model can follow the sandbox) lets the run go on."""
        history = "\n    ".join(self.trace[-12:])
        mismatch = Mismatch(
            f"seed={self.seed} family={self.family} step={self.step}: {what}\n  Kafka 4.3.1: {kafka!r}\n"
            f"  kcm:         {kcm!r}\n  max_bytes={self.max_bytes}; last steps:\n    {history}\n"
            f"  rerun: KCM_TELEMETRY_MODEL_SEED={self.seed} pytest tests/test_telemetry_model.py -k {self.family}",
            self.seed)
        if not soft:
            raise mismatch
        self.mismatches.append(mismatch)

    def check(self, what: str, kafka: object, kcm: object, soft: bool = False) -> bool:
        if kafka != kcm:
            self.fail(what, kafka, kcm, soft)
        return kafka == kcm

    # the run
    def run(self) -> list[Mismatch]:
        """The differences found: any soft ones, then the hard one that ended the run, if any."""
        try:
            for _ in range(self.rng.randrange(0, 4)):
                self.step += 1
                self.op_alter(initial=True)
            weights = FAMILIES[self.family]
            for _ in range(STEPS[self.family]):
                self.step += 1
                op = self._weighted(weights)
                getattr(self, f"op_{op}")()
            self.completed = True
        except Mismatch as mismatch:
            self.mismatches.append(mismatch)
        return self.mismatches

    def _set_time(self, target: int) -> None:
        """Move the clock to `target` (never backwards), away from any instance's expiry."""
        target = max(target, self.now)
        moved = True
        while moved:
            moved = False
            for instance in self.model.cache.values():
                if abs(target - instance.expiry) <= EXPIRY_SLACK_MS:
                    target = instance.expiry + EXPIRY_SLACK_MS + 1
                    moved = True
        self.now = target
        self.clock.set(target)

    def op_time(self) -> None:
        rng = self.rng
        client = rng.choice(self.clients)
        instance = self.model.cache.get(client.instance_id) if client.instance_id else None
        interval = instance.interval if instance else INTERVAL_MS_DEFAULT
        choices = [0, 1, interval - 1, interval, interval + 1, interval // 2, rng.randrange(0, 2 * interval + 1),
                   rng.randrange(0, 1000), rng.randrange(0, 4_000_000)]
        if instance is not None:
            choices += [instance.expiry - self.now + rng.choice([-40, 40])] * 2
        delta = max(0, rng.choice(choices))
        self._set_time(self.now + delta)
        self.trace.append(f"{self.step}: time +{delta} ms -> {self.now}")

    def _before_request(self) -> None:
        self._set_time(self.now)
        self.model.advance(self.now)

    def _connection(self, client: Client) -> Connection:
        if len(client.connections) > 1 and self.rng.random() < 0.4:
            return self.rng.choice(client.connections)
        return client.connections[0]

    def op_get(self) -> None:
        rng = self.rng
        client = rng.choice(self.clients)
        connection = self._connection(client)
        roll = rng.random()
        if client.instance_id is None or roll < 0.08:
            requested = rng.choice([ZERO_UUID, None])
        elif roll < 0.11:
            requested = rng.choice([ONE_UUID, uuid.UUID(int=rng.getrandbits(128))])
        else:
            requested = client.instance_id
        if requested in (None, ZERO_UUID) and rng.random() < 0.3:
            # Candidates Uuid.randomUuid / generateNewClientId never return: reserved, "-..." text, in use.
            dash = uuid.UUID(bytes=b"\xf8" + rng.randbytes(15))
            pool = [ZERO_UUID, ONE_UUID, dash] + list(self.model.cache)[:2]
            self.ids.queue = rng.sample(pool, rng.randrange(1, len(pool) + 1))
        self._before_request()
        result = self.manager.get_subscriptions(requested, client.identity(connection),
                                                connection_id=connection.connection_id)
        self.ids.queue = []
        self.trace.append(f"{self.step}: {client.name} get({requested}) on {connection.connection_id} at "
                          f"{self.now} -> {result.error_code} id={result.subscription_id} "
                          f"every {result.push_interval_ms} {result.requested_metrics}")
        if requested in (None, ZERO_UUID):
            assigned = result.client_instance_id
            if (result.error_code != NONE or assigned in RESERVED or uuid_text(assigned).startswith("-")
                    or assigned in self.model.cache):
                self.fail("a Get without an instance id gets a new, unused, non-reserved id whose text does not "
                          "start with '-'", "a fresh id and error 0", (result.error_code, assigned))
            instance_id = assigned
        else:
            instance_id = requested
        instance = self.model.client_instance(instance_id, client.attributes(instance_id, connection),
                                              connection.connection_id, self.now)
        expected = self.model.get(instance, self.now)
        self.check("GetTelemetrySubscriptions error code", expected.error, result.error_code)
        self.check("throttle_time_ms", 0, result.throttle_time_ms)
        if expected.error != NONE:
            self.check("an error answer carries nothing else (getErrorResponse)",
                       (ZERO_UUID, 0, [], 0, 0, False, []),
                       (result.client_instance_id, result.subscription_id, result.accepted_compression_types,
                        result.push_interval_ms, result.telemetry_max_bytes, result.delta_temporality,
                        result.requested_metrics))
        else:
            self.check("client instance id", instance_id, result.client_instance_id)
            self.check("accepted compression types", SUPPORTED_COMPRESSION_TYPES, result.accepted_compression_types)
            self.check("telemetry max bytes", self.max_bytes, result.telemetry_max_bytes)
            self.check("delta temporality", True, result.delta_temporality)
            self.check("push interval (min of the matching subscriptions, at most 300000)", instance.interval,
                       result.push_interval_ms)
            kafka = (instance.kafka_id, instance.kafka_order)
            answered = (result.subscription_id, list(result.requested_metrics))
            if instance.orders.get(answered[0]) != answered[1]:
                self.fail("subscription id and requested metrics (the union of the matching subscriptions "
                          f"{[info.name for info in self.model.matching(instance.attributes)]})", kafka, answered)
            if answered != kafka and len(instance.orders) > 1:
                self.model.documented_order_differences += 1
            instance.orders = {answered[0]: answered[1]}
            client.instance_id, client.subscription_id = instance_id, result.subscription_id
        self._check_instance_count()

    def op_push(self) -> None:
        rng = self.rng
        client = rng.choice(self.clients)
        connection = self._connection(client)
        if client.instance_id is None or rng.random() < 0.03:
            instance_id = uuid.UUID(int=rng.getrandbits(128))
        else:
            instance_id = client.instance_id
        sent_id = client.subscription_id
        if rng.random() < 0.12:
            sent_id = rng.choice([sent_id + 1, sent_id ^ 0x40000000, 0, rng.getrandbits(31)])
        terminating = rng.random() < 0.07
        kind = self._weighted(PAYLOAD_KINDS[self.family])
        if kind in PAYLOAD_CODECS:
            compression = rng.choice(PAYLOAD_CODECS[kind])
        elif rng.random() < 0.06:
            compression = rng.choice([5, 6, 127, -1, -128])
        else:
            compression = rng.choice([4, 4, 3, 1, 2, 0])
        payload = make_payload(kind, compression, self.max_bytes)
        self._push(client, connection, instance_id, sent_id, terminating, compression, payload)

    def op_reserved(self) -> None:
        client = self.rng.choice(self.clients)
        connection = self._connection(client)
        instance_id = self.rng.choice([ZERO_UUID, ONE_UUID, None])
        self._push(client, connection, instance_id, client.subscription_id, self.rng.random() < 0.3,
                   4, make_payload("metrics", 4, self.max_bytes))

    def _push(self, client: Client, connection: Connection, instance_id: uuid.UUID | None, sent_id: int,
              terminating: bool, compression: int, payload: Payload) -> None:
        self._before_request()
        result = self.manager.push(instance_id, sent_id, terminating, compression, payload.data,
                                   client.identity(connection), connection_id=connection.connection_id)
        self.trace.append(f"{self.step}: {client.name} push({instance_id}, sub={sent_id}, term={terminating}, "
                          f"codec={compression}, {payload!r}) on {connection.connection_id} at {self.now} "
                          f"-> {result.error_code}")
        looked_up = instance_id is not None and instance_id not in RESERVED
        if not looked_up:
            expected = Expected(INVALID_REQUEST)
        else:
            instance = self.model.client_instance(instance_id, client.attributes(instance_id, connection),
                                                  connection.connection_id, self.now)
            expected = self.model.push(instance, sent_id, terminating, compression, payload, self.now)
            if expected.either and result.error_code in expected.either:
                # The sandbox's id for this instance was not the one sent: what Kafka's own order could give.
                instance.orders.pop(sent_id, None)
                instance.last_error = result.error_code
                self._check_instance_count()
                return
            if expected.either:
                instance.orders = {sent_id: instance.orders[sent_id]}
        # A difference only in what the export answers (the ladder before it agreed) leaves the same client state
        # but for the error remembered: the model follows the sandbox and the run goes on.
        exported = looked_up and bool(payload.data) and {expected.error, result.error_code} <= {NONE, INVALID_RECORD}
        if not self.check(f"PushTelemetry error code for {payload!r}", expected.error, result.error_code, exported):
            instance.last_error = result.error_code
            return
        self.check("throttle_time_ms", 0, result.throttle_time_ms)
        if expected.error == NONE and payload.data:
            self.check("the decompressed payload handed to the receiver", expected.payload, result.payload)
            self.check("the push interval handed to the exporter (ClientTelemetryContext)", expected.interval,
                       result.push_interval_ms)
            self.check("the terminating flag handed to the exporter", terminating, result.terminating)
        elif result.error_code != NONE or not payload.data:
            self.check("nothing is handed to the receiver", None, result.payload)
        if looked_up:  # a reserved id is refused before the broker looks at its clients
            self._check_instance_count()

    def _check_instance_count(self) -> None:
        """ClientMetricsStats `instance-count` (the cache size); the sandbox sweeps expired clients at most once a
        second, so the check skips moments within a second of an expiry."""
        if any(self.now - 1001 <= at <= self.now for at in self.model.expired_at):
            return
        self.instance_count_checks += 1
        self.check("instance-count (client instances held)", len(self.model.cache), self.manager.client_count())

    def op_connection(self) -> None:
        rng = self.rng
        client = rng.choice(self.clients)
        if len(client.connections) < 3 and rng.random() < 0.5:
            connection = self._open(client)
            self.trace.append(f"{self.step}: {client.name} opens {connection.connection_id}:{connection.port}")
            return
        connection = rng.choice(client.connections)
        client.connections.remove(connection)
        self._set_time(self.now)
        self.model.advance(self.now)
        self.manager.connection_closed(connection.connection_id)
        self.model.disconnect(connection.connection_id)
        self.trace.append(f"{self.step}: {client.name} closes {connection.connection_id} at {self.now}")
        if not client.connections:
            self._open(client)

    # config changes
    def _metrics_value(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            return ""
        if roll < 0.18:
            return rng.choice(["*", "*,a.", " * "])
        items = rng.sample(METRICS_POOL, rng.randrange(1, 4))
        if rng.random() < 0.05:
            items.append(items[0])  # a repeated item: ConfigDef drops it (KAFKA-19875)
        if rng.random() < 0.03:
            items.insert(1, "")  # an empty item: ValidList refuses it
        return rng.choice([",", ", ", " , "]).join(items)

    def _match_entry(self) -> str:
        rng = self.rng
        key = rng.choice(list(MATCH_POOL))
        if key == "client_instance_id" and rng.random() < 0.5:
            known = [client.instance_id for client in self.clients if client.instance_id is not None]
            if known:
                return f"client_instance_id={re.escape(uuid_text(rng.choice(known)))}"
        pattern = rng.choice(MATCH_POOL[key])
        return rng.choice([f"{key}={pattern}", f" {key} = {pattern} ", f"{key}={pattern}="])

    def _match_value(self) -> str:
        rng = self.rng
        if rng.random() < 0.15:
            return ""
        entries = [self._match_entry() for _ in range(rng.randrange(1, 3))]
        if rng.random() < 0.05:
            entries.append(rng.choice(BAD_MATCH_ENTRIES))
        return ",".join(entries)

    def _value(self, key: str) -> str:
        if key == "metrics":
            return self._metrics_value()
        if key == "match":
            return self._match_value()
        if key == "interval.ms":
            return self.rng.choice(BAD_INTERVALS if self.rng.random() < 0.12 else GOOD_INTERVALS)
        return "x"

    def op_alter(self, initial: bool = False) -> None:
        rng = self.rng
        name = rng.choice(SUBSCRIPTION_NAMES)
        validate_only = not initial and rng.random() < 0.08
        if not initial and rng.random() < 0.12:
            configs = {key: self._value(key) for key in rng.sample(CONFIG_NAMES, rng.randrange(0, 4))}
            request = AlterConfigsRequest[2](resources=[(CLIENT_METRICS, name, list(configs.items()))],
                                             validate_only=validate_only)
            expected, updated = self.model.legacy_alter(name, configs, validate_only)
            what = f"AlterConfigs {name} {configs}"
        else:
            if not initial and rng.random() < 0.1:
                ops = [(key, DELETE, None) for key in CONFIG_NAMES]
            else:
                keys = rng.sample(CONFIG_NAMES, rng.randrange(1, 4))
                if not initial and rng.random() < 0.04:
                    keys.append(rng.choice(["interval", "foo", keys[0]]))  # unknown, or a key named twice
                ops = []
                for key in keys:
                    op = SET if initial else rng.choices([SET, DELETE, APPEND, SUBTRACT], [60, 12, 18, 10])[0]
                    if op in (APPEND, SUBTRACT) and key in LIST_CONFIGS:
                        value = (rng.choice(METRICS_POOL) if key == "metrics" else self._match_entry().strip())
                    else:
                        value = None if op == DELETE else self._value(key)
                    ops.append((key, op, value))
            request = IncrementalAlterConfigsRequest[1](resources=[(CLIENT_METRICS, name, ops)],
                                                        validate_only=validate_only)
            expected, updated = self.model.incremental_alter(name, ops, validate_only)
            what = f"IncrementalAlterConfigs {name} {ops}"
        wire = type(request).decode(bytes(request.encode()), version=request.API_VERSION)
        generation = self.store.generation
        answer = config_apis.split(wire, self.store).local[0]
        self.trace.append(f"{self.step}: {what}{' (validate only)' if validate_only else ''} -> {answer.error_code}"
                          f"; subscriptions {self.model.order.keys()}")
        if self.check(f"{what} error code", expected, answer.error_code, soft=True):
            if updated is not None:
                self.model.apply(name, updated)
        elif self.store.generation != generation:
            # The model follows the change the sandbox made (if any), so that the run goes on.
            self.model.apply(name, self.store.configs(name))


def _seeds() -> list[int]:
    if "KCM_TELEMETRY_MODEL_SEED" in os.environ:
        return [int(os.environ["KCM_TELEMETRY_MODEL_SEED"])]
    return list(range(int(os.environ.get("KCM_TELEMETRY_MODEL_SEEDS", "200"))))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_telemetry_matches_kafka_4_3_1(family: str) -> None:
    """Every seed of the family runs to its end or to its first difference; differences are reported grouped by
    what differs, each group with its first seed, step and the steps that led there."""
    groups: dict[str, list[Mismatch]] = {}
    seeds = _seeds()
    differing = 0
    for seed in seeds:
        with pytest.MonkeyPatch.context() as monkeypatch:
            scenario = Scenario(family, seed, monkeypatch)
            found = scenario.run()
        STATS["scenarios completed"] += scenario.completed
        differing += bool(found)
        kinds = set()
        for mismatch in found:
            kind = "\n".join(str(mismatch).split("\n")[:3]).split(": ", 1)[1]
            kind = re.sub(r"AlterConfigs \S+ (\{.*\}|\[.*\])", "AlterConfigs ...", kind)
            if kind not in kinds:
                kinds.add(kind)
                groups.setdefault(kind, []).append(mismatch)
    if groups:
        report = [f"{family}: {differing} of {len(seeds)} seeds differ from Kafka 4.3.1"]
        for found in sorted(groups.values(), key=len, reverse=True):
            report.append(f"\n--- {len(found)} seed(s) ({', '.join(str(m.seed) for m in found[:12])}"
                          f"{', ...' if len(found) > 12 else ''}); the first:\n{found[0]}")
        pytest.fail("\n".join(report), pytrace=False)


# --- the reference's own facts, checked against values Kafka's source gives ------------------------------------------


def test_the_reference_java_helpers_agree_with_java():
    assert int32(java_hash("hello")) == 99162322 and java_hash("\U0001F600") == 1772899  # Java's hashCode()
    assert java_split("client_id=a=", "=") == ["client_id", "a"] and java_split("=x", "=") == ["", "x"]
    assert java_split("client_id==", "=") == ["client_id"] and java_split("", "=") == [""]
    assert parse_list(" a. ,b.,a. ") == ["a.", "b."]
    with pytest.raises(KafkaError):
        parse_list("a.,,b.")
    assert uuid_text(uuid.UUID(int=1)) == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert host_address("::1") == "0:0:0:0:0:0:0:1" and host_address("::ffff:10.0.0.9") == "10.0.0.9"
    ordered = JavaHashSet.copy_of(["b.", "x.y.", "a."])
    assert list(ordered) == ["b.", "x.y.", "a."]  # "b." and "x.y." share bin 12: insertion order


JVM_CHECK = r"""
import java.io.*; import java.net.InetAddress; import java.nio.ByteBuffer; import java.util.*;
import java.util.concurrent.ConcurrentHashMap; import java.util.regex.Pattern; import java.util.zip.CRC32C;
import static java.nio.charset.StandardCharsets.UTF_8;
public class Check { public static void main(String[] a) throws Exception {
  BufferedReader in = new BufferedReader(new InputStreamReader(System.in, UTF_8)); String line;
  PrintStream out = new PrintStream(System.out, true, "UTF-8");
  while ((line = in.readLine()) != null) { String[] f = line.split("\t", -1); String r;
    switch (f[0]) {
      case "union": { Set<String> u = new HashSet<>(); for (int i = 1; i < f.length; i++)
          u.addAll(new HashSet<>(f[i].isEmpty() ? List.of() : Arrays.asList(f[i].split("\u0001", -1))));
        r = u.toString(); break; }
      case "chm": { Map<String, Integer> m = new ConcurrentHashMap<>(); for (int i = 1; i < f.length; i++)
          if (f[i].startsWith("+")) m.put(f[i].substring(1), i); else m.remove(f[i].substring(1));
        r = String.join(",", m.keySet()); break; }
      case "split": r = String.join("\u0001", f[1].split("=")) + "|" + f[1].split("=").length; break;
      case "int": try { r = "" + Integer.parseInt(f[1].trim()); } catch (NumberFormatException e) { r = "NFE"; } break;
      case "match": r = "" + Pattern.compile(f[1]).matcher(f[2]).matches(); break;
      case "compile": try { Pattern.compile(f[1]); r = "ok"; } catch (Exception e) { r = "bad"; } break;
      case "crc": { byte[] b = f[1].getBytes(UTF_8); CRC32C c = new CRC32C(); c.update(b, 0, b.length);
        r = "" + (int) c.getValue(); break; }
      case "uuid": { long m = Long.parseUnsignedLong(f[1], 16), l = Long.parseUnsignedLong(f[2], 16), x = m ^ l;
        r = Base64.getUrlEncoder().withoutPadding().encodeToString(ByteBuffer.allocate(16).putLong(m).putLong(l)
            .array()) + " " + ((int) (x >> 32) ^ (int) x); break; }
      case "addr": r = InetAddress.getByName(f[1]).getHostAddress(); break;
      case "hash": r = "" + f[1].hashCode(); break;
      default: r = "?"; }
    out.println(r); } } }
"""


def test_the_reference_agrees_with_a_jvm(tmp_path):
    """The reference's Java rules (HashSet union order as createClientInstance builds it, ConcurrentHashMap order
    after puts and removes, String.split, Integer.parseInt, the match pattern pool under java.util.regex, CRC32C,
    Uuid.toString/hashCode, getHostAddress, String.hashCode) give what Java 17 gives."""
    if not shutil.which("javac") or not shutil.which("java"):
        pytest.skip("no JDK on the PATH")
    (tmp_path / "Check.java").write_text(JVM_CHECK)
    subprocess.run(["javac", "-d", str(tmp_path), str(tmp_path / "Check.java")], check=True, timeout=120)
    rng = random.Random(714)
    cases: list[tuple[str, str]] = []
    for _ in range(1500):
        subscriptions = [rng.sample(METRICS_POOL, rng.randrange(0, 6)) for _ in range(rng.randrange(1, 5))]
        if any(ALL in metrics for metrics in subscriptions):
            continue
        union = union_orders(tuple((f"s{i}", tuple(JavaHashSet.copy_of(metrics)))
                                   for i, metrics in enumerate(subscriptions)))[0]
        cases.append(("union\t" + "\t".join("\u0001".join(metrics) for metrics in subscriptions),
                      "[" + ", ".join(union) + "]"))
    for _ in range(1000):
        order, ops = ConcurrentHashMapOrder(), []
        for _ in range(rng.randrange(1, 12)):
            name = rng.choice(SUBSCRIPTION_NAMES)
            if rng.random() < 0.3:
                order.remove(name)
                ops.append("-" + name)
            else:
                order.put(name)
                ops.append("+" + name)
        cases.append(("chm\t" + "\t".join(ops), ",".join(order.keys())))
    for text in ["client_id=a", "client_id=a=", "=x", "client_id", "client_id=", "client_id==", "a==b", "x=y=z", "=="]:
        parts = java_split(text, "=")
        cases.append((f"split\t{text}", "\u0001".join(parts) + f"|{len(parts)}"))
    for text in GOOD_INTERVALS + BAD_INTERVALS + ["-2147483648", "2147483647", "+-1", "1_000"]:
        try:
            cases.append((f"int\t{text}", str(parse_int(text))))
        except KafkaError:
            cases.append((f"int\t{text}", "NFE"))
    values = ["payments-producer", "orders-consumer", "orders-x", "", "rdkafka", "svc-\u00e9t\u00e9", "librdkafka",
              "apache-kafka-java", "confluent-kafka-python", "unknown", "4.3.0", "2.6.1", "4.1.0-SNAPSHOT", "10.0.0.7",
              "127.0.0.1", "0:0:0:0:0:0:0:1", "10.0.0.9", "2001:db8:0:0:0:0:0:1", "40000", "40012", "50003", "4001",
              "AAAAAAAAAAAAAAAAAAAAAQ", "-xYz_09abc", "M9", "a_b-c"]
    for patterns in MATCH_POOL.values():
        for pattern in patterns:
            cases += [(f"match\t{pattern}\t{value}", str(java_matches(pattern, value)).lower()) for value in values]
    cases += [(f"compile\t{pattern}", "bad") for pattern in INVALID_PATTERNS]
    for _ in range(300):
        instance = uuid.UUID(int=rng.getrandbits(128))
        cases.append((f"compile\t{re.escape(uuid_text(instance))}", "ok"))
        cases.append((f"uuid\t{instance.hex[:16]}\t{instance.hex[16:]}",
                      f"{uuid_text(instance)} {int32(uuid_hash(instance))}"))
        text = "[" + ", ".join(rng.sample(METRICS_POOL, rng.randrange(0, 5))) + "]" + str(rng.randrange(100, 10**7))
        cases.append((f"crc\t{text}", str(int32(crc32c.crc32c(text.encode())))))
    for address in ["10.0.0.7", "127.0.0.1", "::1", "::ffff:10.0.0.9", "2001:db8::1", "fe80::1:0:0:abcd"]:
        cases.append((f"addr\t{address}", host_address(address)))
    cases += [(f"hash\t{text}", str(int32(java_hash(text)))) for text in METRICS_POOL + SUBSCRIPTION_NAMES]
    run = subprocess.run(["java", "-cp", str(tmp_path), "Check"], input="\n".join(line for line, _ in cases) + "\n",
                         capture_output=True, text=True, encoding="utf-8", timeout=120, check=True)
    answers = run.stdout.split("\n")
    assert [(line, ours, java) for (line, ours), java in zip(cases, answers) if ours != java] == []
    assert len(answers) > len(cases)


# --- minimal repros of where the sandbox answers otherwise than Kafka 4.3.1 ------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.seconds = 2_000_000.0

    def __call__(self) -> float:
        return self.seconds


JAVA = ClientIdentity("payments-producer", "apache-kafka-java", "4.3.0", "10.0.0.7", 40001)


def test_a_repeated_list_item_is_dropped_not_refused():
    """ConfigDef.parseValue (4.3.1, 542-549; KAFKA-19875) drops repeated LIST items with a warning before
    ValidList.ensureValid (1071) could see them, so `metrics=a.,a.` is accepted as [a.]."""
    store = SubscriptionStore()
    request = IncrementalAlterConfigsRequest[1](resources=[(CLIENT_METRICS, "dups", [("metrics", SET, "a.,a.")])],
                                                validate_only=False)
    wire = IncrementalAlterConfigsRequest[1].decode(bytes(request.encode()))
    answer = config_apis.split(wire, store).local[0]
    assert answer.error_code == NONE, answer.error_message


def test_an_lz4_frame_with_dependent_blocks_is_an_invalid_record():
    """Lz4BlockInputStream.readHeader -> Lz4BlockOutputStream.FLG.validate (4.3.1, 317-318) throws "Dependent block
    stream is unsupported"; ClientMetricsManager.processPushTelemetryRequest (219-223) answers INVALID_RECORD."""
    manager = TelemetryManager(SubscriptionStore(), clock=_Clock())
    got = manager.get_subscriptions(None, JAVA)
    result = manager.push(got.client_instance_id, got.subscription_id, False, 3, linked_lz4()[1], JAVA)
    assert result.error_code == INVALID_RECORD


def test_a_client_state_expiring_unmaps_the_connection_of_its_last_request():
    """ClientMetricsManager (4.3.1): a client instance is mapped to the connection it was created on (326), each
    request schedules the expiry task with that request's connection (310-313), and the task removes that
    connection's mapping, whichever instance it names, and the instance (546-550). A later disconnect of the
    creating connection (480-496) then drops the client's new state: its next Get is not throttled."""
    store = SubscriptionStore()
    store.incremental_alter("fast", [("interval.ms", SET, "1000")])
    clock = _Clock()
    manager = TelemetryManager(store, clock=clock)
    client = manager.get_subscriptions(None, JAVA, connection_id="c1").client_instance_id
    clock.seconds += 1.0
    assert manager.get_subscriptions(client, JAVA, connection_id="c2").error_code == NONE  # expiry task on c2
    clock.seconds += 61.0  # expired: Kafka unmaps c2 (not c1) and forgets the client
    assert manager.get_subscriptions(client, JAVA, connection_id="c3").error_code == NONE  # state again, on c3
    manager.connection_closed("c1")  # c1 still names the client in Kafka: its state goes
    assert manager.client_count() == 0
    assert manager.get_subscriptions(client, JAVA, connection_id="c3").error_code == NONE


def test_a_client_state_expiring_just_before_a_new_one_takes_its_connection_leaves_the_new_one_mapped():
    """Kafka's expiry task runs when due, before any later request: the state a later request creates on the same
    connection keeps its mapping, and a disconnect then drops it (a sweep run once a second instead, or only at the
    disconnect, unmapped the newer state's connection and kept it)."""
    clock = _Clock()
    manager = TelemetryManager(SubscriptionStore(), clock=clock)
    assert manager.get_subscriptions(None, JAVA, connection_id="c1").error_code == NONE   # expires after 900 s
    clock.seconds += 899.9995
    assert manager.get_subscriptions(None, JAVA, connection_id="c2").error_code == NONE
    clock.seconds += 0.001   # the first state's task has run: c1 unmapped, that state gone
    assert manager.get_subscriptions(None, JAVA, connection_id="c1").error_code == NONE   # a new state on c1
    clock.seconds += 0.5
    manager.connection_closed("c1")
    assert manager.client_count() == 1   # c2's only


# --- the scenarios keep reaching the paths they are meant to test ------------------------------------------------


def test_the_scenarios_reached_every_path():
    """Runs after the scenarios (same file, same worker): each path of the model was taken by some scenario."""
    if STATS["scenarios completed"] < 400:
        pytest.skip("needs the default seeds (it checks what they reached)")
    wanted = ["get 0", "get 89", f"get early after {UNKNOWN_SUBSCRIPTION_ID}",
              f"get early after {UNSUPPORTED_COMPRESSION_TYPE}", "terminating push skips the throttle",
              "instance created", "instance re-evaluated", "instance expired",
              "instance dropped on disconnect", "ordering freedom (documented)", "alter 0", "alter 40", "alter 42"]
    wanted += [f"push {code}" for code in (NONE, INVALID_REQUEST, THROTTLING_QUOTA_EXCEEDED, UNKNOWN_SUBSCRIPTION_ID,
                                           UNSUPPORTED_COMPRESSION_TYPE, TELEMETRY_TOO_LARGE, INVALID_RECORD)]
    assert [path for path in wanted if not STATS[path]] == [], dict(STATS)
