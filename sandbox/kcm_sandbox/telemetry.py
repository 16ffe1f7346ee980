"""GetTelemetrySubscriptions and PushTelemetry as Apache Kafka's ClientMetricsManager answers them (KIP-714).

Pure apart from the per-client state it keeps: time comes from an injected clock, sockets and the
metrics topic belong to the gateway. The rules, their order and their error codes follow Apache Kafka 4.3.1's
`ClientMetricsManager`, `ClientMetricsInstance` and `ClientMetricsInstanceMetadata`.
"""

from __future__ import annotations

import base64
import dataclasses
import heapq
import ipaddress
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import regex
from kafka.record.util import calc_crc32c

from kcm_common.contract import (
    COMPRESSION_IDS,
    CONTENT_TYPE_HEADER,
    CONTENT_TYPE_PROTOBUF,
    LZ4_MAGIC,
    DecodeError,
    decode,
    decompress,
)
from kcm_common.client_metrics import ALL_METRICS, DEFAULT_INTERVAL_MS, Subscription
from kcm_common.java import compile_pattern, copy_capacity, hash_order
from kcm_common.codes import (
    INVALID_RECORD,
    INVALID_REQUEST,
    NONE,
    TELEMETRY_TOO_LARGE,
    THROTTLING_QUOTA_EXCEEDED,
    UNKNOWN_SUBSCRIPTION_ID,
    UNSUPPORTED_COMPRESSION_TYPE,
)
from kcm_sandbox.store import SubscriptionStore

ZERO_UUID = uuid.UUID(int=0)
METADATA_TOPIC_ID = uuid.UUID(int=1)
RESERVED_UUIDS = frozenset({ZERO_UUID, METADATA_TOPIC_ID})  # org.apache.kafka.common.Uuid.RESERVED

DEFAULT_ACCEPTED_COMPRESSION = (4, 3, 1, 2)  # zstd, lz4, gzip, snappy: ClientMetricsManager's order
DEFAULT_TELEMETRY_MAX_BYTES = 1048576
UNKNOWN_SOFTWARE = "unknown"  # ClientInformation.EMPTY: what Kafka records when ApiVersions v3+ was not sent
CACHE_MAX_SIZE = 16384
CACHE_EXPIRY_MS = 60000
_LZ4_BLOCK_INDEPENDENCE = 0x20   # the FLG byte's bit 5
_GET_AGAIN_AFTER = (UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE)
# Java has no bound on a match; one catastrophic pattern must not stall every client on the event loop.
MATCH_TIMEOUT_S = 0.05
# (pattern, value) pairs that ran out of time, so a client repeating one costs that time once, not per request.
_SLOW_MATCHES_MAX = 256
_slow_matches: OrderedDict[tuple[str, str], None] = OrderedDict()

log = logging.getLogger("kcm.sandbox")


@dataclass(frozen=True)
class ClientIdentity:
    """What the broker knows of the connection a request came on; None for an attribute it does not have."""

    client_id: str | None
    software_name: str | None
    software_version: str | None
    source_address: str | None
    source_port: int | None


@dataclass(frozen=True)
class GetResult:
    """A GetTelemetrySubscriptions response; on error every field but the error is zero, as in Kafka."""

    error_code: int
    throttle_time_ms: int
    client_instance_id: uuid.UUID
    subscription_id: int
    accepted_compression_types: list[int]
    push_interval_ms: int
    telemetry_max_bytes: int
    delta_temporality: bool
    requested_metrics: list[str]
    error_message: str | None = None


@dataclass(frozen=True)
class PushResult:
    """A PushTelemetry response plus what a receiver writes with an accepted push."""

    error_code: int
    throttle_time_ms: int
    payload: bytes | None  # decompressed MetricsData when accepted and non-empty
    subscription_id: int
    push_interval_ms: int
    terminating: bool
    error_message: str | None = None
    # Between `admit` and `unpack`: the metrics as sent, and their compression type id.
    compressed: bytes | None = None
    compression_type: int = 0


@dataclass
class _ClientInstance:
    # ClientMetricsInstance: times are ms; -inf stands for Kafka's 0 ("never"), which a wall clock always beats.
    client_instance_id: uuid.UUID
    attributes: dict[str, str | None]
    subscription_id: int
    generation: int
    metrics: tuple[str, ...]
    push_interval_ms: int
    connection_id: str | None   # of the latest request: Kafka's expiry task, scheduled by each request, unmaps it
    expires_at_ms: float = 0.0
    last_get_ms: float = float("-inf")
    last_push_ms: float = float("-inf")
    terminating: bool = False
    last_error: int = NONE
    scheduled: bool = False   # has an entry in the manager's expiry queue

    def accept_get(self, now_ms: float) -> bool:
        """maybeUpdateGetRequestTimestamp: a Get is due one push interval after the last Get or Push."""
        if now_ms - max(self.last_get_ms, self.last_push_ms) >= self.push_interval_ms:
            self.last_get_ms = now_ms
            return True
        return False

    def accept_push(self, now_ms: float) -> bool:
        """maybeUpdatePushRequestTimestamp: the first push after a Get may come early (clients jitter)."""
        if self.last_get_ms > self.last_push_ms or now_ms - self.last_push_ms >= self.push_interval_ms:
            self.last_push_ms = now_ms
            return True
        return False


def kafka_uuid_text(value: uuid.UUID) -> str:
    """The text Kafka's Uuid.toString gives: URL-safe base64 without padding (what `client_instance_id` matches)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def java_host_address(address: str) -> str:
    """An address as InetAddress.getHostAddress prints it (IPv6 uncompressed, IPv4-mapped as IPv4)."""
    host, percent, scope = address.partition("%")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return ":".join(f"{int(group, 16):x}" for group in ip.exploded.split(":")) + percent + scope
    return str(ip)


def client_attributes(client_instance_id: uuid.UUID, identity: ClientIdentity) -> dict[str, str | None]:
    """The attributes match patterns test, as ClientMetricsInstanceMetadata collects them."""
    address = identity.source_address
    return {
        "client_instance_id": kafka_uuid_text(client_instance_id),
        "client_id": identity.client_id,
        "client_software_name": identity.software_name,
        "client_software_version": identity.software_version,
        "client_source_address": None if address is None else java_host_address(address),
        "client_source_port": None if identity.source_port is None else str(identity.source_port),
    }


def matches(match: Iterable[tuple[str, str]], attributes: Mapping[str, str | None]) -> bool:
    """Whether every pattern full-matches its attribute; a missing attribute never matches, no patterns match all.

    A match that runs longer than MATCH_TIMEOUT_S counts as no match, then and for the same value afterwards.
    """
    for key, pattern in match:
        value = attributes.get(key)
        if value is None:
            return False
        if (pattern, value) in _slow_matches:
            _slow_matches.move_to_end((pattern, value))
            return False
        try:
            if _compiled(pattern).fullmatch(value, timeout=MATCH_TIMEOUT_S) is None:
                return False
        except TimeoutError:
            log.warning("match pattern %s=%s gave up on a %d-character value after %.0f ms; treated as no match",
                        key, pattern, len(value), MATCH_TIMEOUT_S * 1000)
            _slow_matches[(pattern, value)] = None
            if len(_slow_matches) > _SLOW_MATCHES_MAX:
                _slow_matches.popitem(last=False)
            return False
    return True


def resolve(subscriptions: Iterable[Subscription], attributes: Mapping[str, str | None]) -> tuple[list[str], int]:
    """The requested metrics and push interval for a client: union of matching subscriptions, `*` wins, min interval."""
    interval = DEFAULT_INTERVAL_MS
    added: list[str] = []
    all_metrics = False
    for subscription in sorted(subscriptions, key=lambda item: item.name):
        if matches(subscription.match, attributes):
            all_metrics = all_metrics or ALL_METRICS in subscription.metrics
            added += hash_order(subscription.metrics, copy_capacity(len(subscription.metrics)))
            interval = min(interval, subscription.interval_ms)
    if all_metrics:
        return [ALL_METRICS], interval
    return hash_order(added), interval


def subscription_id(metrics: Sequence[str], push_interval_ms: int, client_instance_id: uuid.UUID) -> int:
    """ClientMetricsManager.computeSubscriptionId: CRC32C of `Set.toString() + interval`, XOR Uuid.hashCode."""
    text = "[" + ", ".join(metrics) + "]" + str(push_interval_ms)
    crc = calc_crc32c(text.encode("utf-8", errors="replace")) & 0xFFFFFFFF
    bits = client_instance_id.int
    folded = (bits >> 64) ^ (bits & 0xFFFFFFFFFFFFFFFF)
    value = crc ^ (((folded >> 32) ^ folded) & 0xFFFFFFFF)
    return value - (1 << 32) if value >= 1 << 31 else value


def new_client_instance_id() -> uuid.UUID:
    """Uuid.randomUuid: a random v4 UUID that is not reserved and whose Kafka text does not start with '-'."""
    while True:
        candidate = uuid.uuid4()
        if candidate not in RESERVED_UUIDS and not kafka_uuid_text(candidate).startswith("-"):
            return candidate


class TelemetryManager:
    """ClientMetricsManager: per-client subscription state, Get throttling and the Push validation ladder."""

    def __init__(
        self,
        store: SubscriptionStore,
        accepted_compression: Sequence[int] = DEFAULT_ACCEPTED_COMPRESSION,
        telemetry_max_bytes: int = DEFAULT_TELEMETRY_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._accepted_compression = list(accepted_compression)
        self._max_bytes = telemetry_max_bytes
        self._clock = clock
        self._instances: OrderedDict[uuid.UUID, _ClientInstance] = OrderedDict()
        self._connections: dict[str, uuid.UUID] = {}
        self._subscriptions: list[Subscription] = []
        self._subscriptions_generation: int | None = None
        # Kafka's expiry timer tasks: (due, sequence, instance), one entry per instance, moved on when its expiry was
        # extended; entries of instances replaced or evicted are skipped (and dropped when they outnumber the rest).
        self._expiries: list[tuple[float, int, _ClientInstance]] = []
        self._sequence = itertools.count()

    def get_subscriptions(
        self, client_instance_id: uuid.UUID | None, identity: ClientIdentity, *, connection_id: str | None = None
    ) -> GetResult:
        """Answer a GetTelemetrySubscriptions; a zero (or None, as kafka-python decodes it) id gets a new one."""
        now = self._now_ms()
        if client_instance_id is None or client_instance_id == ZERO_UUID:
            client_instance_id = self._unused_instance_id()
        instance = self._instance(client_instance_id, identity, connection_id, now)
        # Kafka 4.x lets a client that was just told its subscription or codec is wrong fetch again at once.
        if not instance.accept_get(now) and instance.last_error not in _GET_AGAIN_AFTER:
            return GetResult(
                error_code=THROTTLING_QUOTA_EXCEEDED,
                throttle_time_ms=0,
                client_instance_id=ZERO_UUID,
                subscription_id=0,
                accepted_compression_types=[],
                push_interval_ms=0,
                telemetry_max_bytes=0,
                delta_temporality=False,
                requested_metrics=[],
                error_message=_too_soon(client_instance_id),
            )
        instance.last_error = NONE
        return GetResult(
            error_code=NONE,
            throttle_time_ms=0,
            client_instance_id=client_instance_id,
            subscription_id=instance.subscription_id,
            accepted_compression_types=list(self._accepted_compression),
            push_interval_ms=instance.push_interval_ms,
            telemetry_max_bytes=self._max_bytes,
            delta_temporality=True,
            requested_metrics=list(instance.metrics),
        )

    def push(
        self,
        client_instance_id: uuid.UUID | None,
        subscription_id: int,
        terminating: bool,
        compression_type: int,
        metrics: bytes | None,
        identity: ClientIdentity,
        *,
        connection_id: str | None = None,
    ) -> PushResult:
        """Answer a PushTelemetry; an accepted, non-empty push carries the decompressed MetricsData as `payload`."""
        result = self.admit(client_instance_id, subscription_id, terminating, compression_type, metrics, identity,
                            connection_id=connection_id)
        if result.compressed is None:
            return result
        return self.settle(client_instance_id, self.unpack(result))

    def admit(
        self,
        client_instance_id: uuid.UUID | None,
        subscription_id: int,
        terminating: bool,
        compression_type: int,
        metrics: bytes | None,
        identity: ClientIdentity,
        *,
        connection_id: str | None = None,
    ) -> PushResult:
        """The PushTelemetry ladder without decompressing; a result with `compressed` set still needs `unpack`
        (which may run on another thread) and then `settle`."""
        if client_instance_id is None or client_instance_id in RESERVED_UUIDS:
            text = "null" if client_instance_id is None else kafka_uuid_text(client_instance_id)
            return PushResult(
                INVALID_REQUEST, 0, None, subscription_id, 0, terminating,
                f"Invalid request from the client [{text}], invalid client instance id",
            )
        now = self._now_ms()
        instance = self._instance(client_instance_id, identity, connection_id, now)
        failure = self._check_push(instance, subscription_id, terminating, compression_type, metrics, now)
        # Kafka records the flag in a `finally`, so even a rejected push can end (or reset) termination.
        instance.terminating = terminating
        if failure is not None:
            instance.last_error = failure[0]
            return PushResult(failure[0], 0, None, subscription_id, instance.push_interval_ms, terminating, failure[1])
        if metrics:
            return PushResult(NONE, 0, None, subscription_id, instance.push_interval_ms, terminating,
                              compressed=bytes(metrics), compression_type=compression_type)
        instance.last_error = NONE
        return PushResult(NONE, 0, None, subscription_id, instance.push_interval_ms, terminating)

    def unpack(self, admitted: PushResult) -> PushResult:
        """Decompress and check an admitted push; touches no shared state, so it may run off the event loop."""
        # Kafka 4.3.1 decompresses at most telemetry.max.bytes and hands the data to its exporter; ours is the
        # metrics topic, so a payload beyond the limit or not MetricsData fails as an exporter does: INVALID_RECORD.
        assert admitted.compressed is not None
        try:
            if COMPRESSION_IDS[admitted.compression_type] == "lz4":
                _check_kafka_lz4(admitted.compressed)
            payload = decompress(admitted.compressed, COMPRESSION_IDS[admitted.compression_type], self._max_bytes)
            if payload:
                decode(payload, [(CONTENT_TYPE_HEADER, CONTENT_TYPE_PROTOBUF)], max_decompressed_bytes=self._max_bytes)
        except DecodeError as err:
            return dataclasses.replace(admitted, error_code=INVALID_RECORD, error_message=str(err), compressed=None)
        # Handed on even when empty, as Kafka hands its exporter whatever a non-empty push decompresses to.
        return dataclasses.replace(admitted, payload=payload, compressed=None)

    def settle(self, client_instance_id: uuid.UUID | None, result: PushResult) -> PushResult:
        """Record an unpacked push's outcome as the client's last error (Kafka's lastKnownError)."""
        instance = self._instances.get(client_instance_id) if client_instance_id is not None else None
        if instance is not None:
            instance.last_error = result.error_code
        return result

    def connection_closed(self, connection_id: str) -> None:
        """Forget the client whose state was created on this connection, as Kafka's disconnect listener does."""
        self._expire(self._now_ms())   # Kafka's expiry tasks due by now have run, unmapping their connections
        client_instance_id = self._connections.pop(connection_id, None)
        if client_instance_id is not None:
            self._instances.pop(client_instance_id, None)

    def client_count(self) -> int:
        """How many client instances are held (Kafka's `instance-count` metric)."""
        self._expire(self._now_ms())
        return len(self._instances)

    def _check_push(
        self,
        instance: _ClientInstance,
        subscription_id: int,
        terminating: bool,
        compression_type: int,
        metrics: bytes | None,
        now: float,
    ) -> tuple[int, str] | None:
        # ClientMetricsManager.validatePushRequest, in its order.
        who = kafka_uuid_text(instance.client_instance_id)
        if instance.terminating:
            return INVALID_REQUEST, (
                f"Client [{who}] sent the previous request with state terminating to TRUE, "
                "can not accept any requests after that"
            )
        if not instance.accept_push(now) and not terminating:
            return THROTTLING_QUOTA_EXCEEDED, _too_soon(instance.client_instance_id)
        if subscription_id != instance.subscription_id:
            return UNKNOWN_SUBSCRIPTION_ID, f"Unknown client subscription id for the client [{who}]"
        if compression_type not in COMPRESSION_IDS:
            return UNSUPPORTED_COMPRESSION_TYPE, (
                f"Unknown compression type [{compression_type}] is received in telemetry request from [{who}]"
            )
        if metrics is not None and len(metrics) > self._max_bytes:
            return TELEMETRY_TOO_LARGE, (
                f"Telemetry request from [{who}] is larger than the maximum allowed size [{self._max_bytes}]"
            )
        return None

    def _instance(
        self, client_instance_id: uuid.UUID, identity: ClientIdentity, connection_id: str | None, now: float
    ) -> _ClientInstance:
        # ClientMetricsManager.clientInstance: create, or re-evaluate after a subscription change, then extend expiry.
        self._expire(now)
        generation = self._store.generation
        instance = self._instances.get(client_instance_id)
        if instance is None:
            instance = self._create(client_instance_id, client_attributes(client_instance_id, identity), connection_id)
        elif instance.generation != generation:
            # A fresh instance keeps the first request's attributes but resets timers, errors and termination.
            instance = self._create(client_instance_id, instance.attributes, connection_id)
        self._instances.move_to_end(client_instance_id)
        instance.expires_at_ms = now + max(CACHE_EXPIRY_MS, instance.push_interval_ms * 3)
        instance.connection_id = connection_id
        if not instance.scheduled:
            self._schedule(instance)
        return instance

    def _create(
        self, client_instance_id: uuid.UUID, attributes: dict[str, str | None], connection_id: str | None
    ) -> _ClientInstance:
        metrics, interval = resolve(self._current_subscriptions(), attributes)
        instance = _ClientInstance(
            client_instance_id=client_instance_id,
            attributes=attributes,
            subscription_id=subscription_id(metrics, interval, client_instance_id),
            generation=self._store.generation,
            metrics=tuple(metrics),
            push_interval_ms=interval,
            connection_id=connection_id,
        )
        self._instances[client_instance_id] = instance
        if connection_id is not None:
            self._connections[connection_id] = client_instance_id
        while len(self._instances) > CACHE_MAX_SIZE:
            self._drop(next(iter(self._instances.values())))
        return instance

    def _current_subscriptions(self) -> list[Subscription]:
        if self._subscriptions_generation != self._store.generation:
            self._subscriptions = self._store.subscriptions()
            self._subscriptions_generation = self._store.generation
        return self._subscriptions

    def _expire(self, now: float) -> None:
        # The expiry tasks due by `now`, in their order, as Kafka's timer runs them before the request at `now`.
        while self._expiries and self._expiries[0][0] <= now:
            _, _, instance = heapq.heappop(self._expiries)
            if self._instances.get(instance.client_instance_id) is not instance:
                continue   # replaced by a re-evaluation, evicted or dropped on disconnect: its task was cancelled
            instance.scheduled = False
            if instance.expires_at_ms > now:
                self._schedule(instance)   # extended by a request since: its task is the later one
            else:
                self._expired(instance)

    def _schedule(self, instance: _ClientInstance) -> None:
        if len(self._expiries) > 2 * len(self._instances) + 1024:   # mostly cancelled tasks: keep memory bounded
            self._expiries = [entry for entry in self._expiries
                              if self._instances.get(entry[2].client_instance_id) is entry[2]]
            heapq.heapify(self._expiries)
        heapq.heappush(self._expiries, (instance.expires_at_ms, next(self._sequence), instance))
        instance.scheduled = True

    def _expired(self, instance: _ClientInstance) -> None:
        # ExpirationTimerTask.run: unmaps the connection of the request that scheduled it, whichever client the
        # connection names by then (a later disconnect of the connection the client was created on still drops
        # whatever client state that connection names).
        self._instances.pop(instance.client_instance_id, None)
        if instance.connection_id is not None:
            self._connections.pop(instance.connection_id, None)

    def _drop(self, instance: _ClientInstance) -> None:
        # Evicted from the cache (its size limit). Kafka's expiry task would unmap its connection later; ours is
        # gone with the instance, so the mapping goes now if it still names this client.
        self._instances.pop(instance.client_instance_id, None)
        if instance.connection_id and self._connections.get(instance.connection_id) == instance.client_instance_id:
            del self._connections[instance.connection_id]

    def _unused_instance_id(self) -> uuid.UUID:
        while (candidate := new_client_instance_id()) in self._instances:
            pass
        return candidate

    def _now_ms(self) -> float:
        return self._clock() * 1000.0


def _check_kafka_lz4(data: bytes) -> None:
    """Kafka's own LZ4 reader (Lz4BlockInputStream.readHeader, FLG.validate) refuses a frame whose blocks depend on
    the ones before (what Python's lz4.frame writes past 64 KiB by default); other LZ4 readers take it."""
    if len(data) >= 5 and data[:4] == LZ4_MAGIC and not data[4] & _LZ4_BLOCK_INDEPENDENCE:
        raise DecodeError("decompress-failed", "lz4 payload is corrupt: Dependent block stream is unsupported")


def _too_soon(client_instance_id: uuid.UUID) -> str:
    return f"Request from the client [{kafka_uuid_text(client_instance_id)}] arrived before the next push interval time"


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return compile_pattern(pattern)
