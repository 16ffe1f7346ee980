"""The bridge: consume → decode → enrich → batch → export → commit, at least once.

One thread owns the consumer (poll, batching, commits, rebalance callbacks); exports run on a thread pool and
finish tickets. An offset is committed only when every record at or below it on its partition was exported or
dead-lettered (see offsets.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_common import contract
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings, KafkaUnavailableError, check_reachable
from kcm_common.logs import where_blocked
from kcm_common.names import ATTRIBUTE_HEADERS
from kcm_common.otlp_export import Endpoint, Outcome, refusal_hint
from kcm_common.pacing import PacedLog
from kcm_common.retry import backoff_s, wait_unless

from kcm_bridge.config import BridgeConfig, ConfigError
from kcm_bridge.consumer import (Consumer, DeadLetterProducer, Partition, Record, open_consumer,
                                 open_dead_letter_producer, split_properties)
from kcm_bridge.enrich import Added, Enricher
from kcm_bridge.export import open_endpoint
from kcm_bridge.health import KAFKA_RETRY, KafkaHealth
from kcm_bridge.metrics import UNPROCESSABLE, BridgeMetrics, serve
from kcm_bridge.offsets import OffsetTracker, Ticket
from kcm_bridge.temporality import MAX_PAYLOAD_BYTES, DeltaToCumulative
from kcm_bridge.wire import count_points

log = logging.getLogger("kcm.bridge")
# While paused no fetch brings a high watermark: the lag asks for one, this long at most per commit interval.
_WATERMARK_ASK_S = 1.0
_SESSION_TIMEOUT_MS = 45_000   # the consumer's default (librdkafka, and Kafka's since KIP-735)
_TURN_MARGIN_S = 10.0

# Records asked of one poll. Each record is read (its headers, 16 of them from the receiver, become Python objects)
# and prepared right after the poll that fetched it: after consume(500) reading a record's headers took 3.6 µs, the
# batch having left the CPU's caches, after consume(100) 1.2 µs (bench/bridge_throughput.py's topic).
_POLL_RECORDS = 100
# The consuming thread holds the GIL most of the time. An export thread needs it a few times per export (to start
# the call, to take the answer), and waited each time for CPython's switch interval, 5 ms by default: exports lagged,
# the in-flight budget filled and the consuming thread waited for it, a third of its time on the benchmark. A tenth
# of that interval took the bridge from 25k to 33k records/s there. Set for the whole process by `kcm bridge`.
SWITCH_INTERVAL_S = 0.0005
# The reason given to a record a collector refused as invalid (INVALID_ARGUMENT) or too large (RESOURCE_EXHAUSTED
# without a retry delay: over its message size limit), alone or in the smallest part of its batch the splitting reached.
REFUSED = "refused-by-collector"
# The reason given to the records of a client instance a collector kept failing retryably on their own for
# `delivery.poison_after_s` while it took other data (see Bridge._isolate).
FAILING = "failing-at-collector"
# Not a gRPC code: an export the bridge stopped retrying because it kept failing while the collector answered (_Watch).
_KEPT_FAILING = "KEPT_FAILING"
# The refusals that may be about some records of a request only: a smaller request (its other records) may pass.
_SPLIT_CODES = frozenset({"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"})
# A part of a request found failing (_isolate) is split again, or sent after the others, after this many attempts.
_PART_ATTEMPTS = 2
# A client instance's records are set aside only after at least this many failures that each followed a delivery of
# other data (as well as over `poison_after_s`): see _Trail.
_POISON_ATTEMPTS = 20
# The consuming thread's time for dead-letter writes per loop turn (at least one goes each turn), so a dead-letter
# topic that blocks (kafka-python waits up to 200 ms for metadata) or a thousand refused records cannot hold it.
_DEAD_LETTER_TURN_S = 0.05
# A paused loop's poll, or its wait for exports to end: how late it may resume after the exports that held the
# in-flight budget end (a whole half-second poll per pause, while the collector was the slower side, was time spent
# fetching nothing).
_PAUSED_POLL_S = 0.05
# A pause first only stops taking records: the Kafka client keeps what it prefetched. Pausing its partitions drops
# that, and after each resume librdkafka took 0.1-0.5 s to fetch again: with a backlog the bridge paused a few times
# a second and waited half its time (bench/bridge_throughput.py). A pause that lasts this long (an endpoint slow or
# down) pauses the partitions in the client too, whose poll then goes on (group callbacks, errors, Kafka's health).
_CLIENT_PAUSE_AFTER_S = 1.0
# What a header set means is worked out once: clients repeat theirs on every push. Bounded in entries and in the
# size of a cached set, so hostile headers cannot grow it.
_HEADER_CACHE_ENTRIES = 4096
_HEADER_CACHE_MAX_BYTES = 1024
# Python's objects for one record waiting for the dead-letter topic (Record, headers list, ticket, letter): measured
# at some 500 bytes beside its own bytes.
_HELD_RECORD_OVERHEAD = 512


def tune_interpreter() -> None:
    """Hand the GIL over between threads as often as a bridge needs (SWITCH_INTERVAL_S, or more often if so set):
    for a process that runs a bridge, as `kcm bridge` does."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


class _HeaderFacts(NamedTuple):
    media: str                 # content type without parameters, lower case; "" when absent
    encoding: str
    plain: bool                # uncompressed protobuf: the value is the payload
    instance: str | None       # client_instance_id
    added: Added               # the resource attributes enrichment adds, encoded
    push_interval_s: float | None  # how often the client pushes, when the record says


class Preparer:
    """Turns a record into enriched MetricsData bytes and its point count; raises contract.DecodeError."""

    def __init__(self, enricher: Enricher, converter: DeltaToCumulative | None = None) -> None:
        self._enricher = enricher
        self._converter = converter
        self._facts: dict[tuple[tuple[str, bytes | None], ...], _HeaderFacts] = {}
        self.last_instance: str | None = None   # the client_instance_id header of the record prepared last

    def __call__(self, record: Record) -> tuple[bytes, int]:
        key = tuple(record.headers)
        facts = self._facts.get(key)
        if facts is None:
            facts = self._read_headers(key)
        self.last_instance = facts.instance
        value = record.value
        if not value:
            raise contract.DecodeError("empty", "record has no value; expected an OTLP MetricsData payload")
        if facts.plain and len(value) <= contract.DEFAULT_MAX_DECOMPRESSED_BYTES:
            payload = value
        else:
            payload = _payload(record, facts)
        contract.check_message_count(payload)  # before anything parses it (the conversion, the point count)
        if self._converter is not None:
            payload = _to_cumulative(payload, self._converter, record, facts)
        try:
            enriched = self._enricher.apply(payload, facts.added)
            return enriched, count_points(enriched)
        except contract.DecodeError:   # enrichment's own refusal (too-large), with its reason
            raise
        # The wire walk and the point count raise ValueError on a broken message; AnyValue parsing its own error.
        except Exception as err:
            raise contract.DecodeError("invalid-protobuf", f"value is not an OTLP MetricsData protobuf: {err}") from err

    def _read_headers(self, raw: tuple[tuple[str, bytes | None], ...]) -> _HeaderFacts:
        headers, size = {}, 0
        for name, value in raw:
            size += len(name) + len(value or b"")
            if value is not None:
                headers[name] = value if isinstance(value, str) else bytes(value).decode("utf-8", errors="replace")
        attributes = {name: headers[name] for name in ATTRIBUTE_HEADERS if name in headers}
        media = headers.get(contract.CONTENT_TYPE_HEADER, "").split(";", 1)[0].strip().lower()
        encoding = headers.get(contract.CONTENT_ENCODING_HEADER) or "none"
        facts = _HeaderFacts(media, encoding,
                             media == contract.CONTENT_TYPE_PROTOBUF and encoding.strip().lower() == "none",
                             attributes.get("client_instance_id"), self._enricher.encode(attributes),
                             _push_interval_s(attributes.get("push_interval_ms")))
        if size <= _HEADER_CACHE_MAX_BYTES:
            if len(self._facts) >= _HEADER_CACHE_ENTRIES:
                del self._facts[next(iter(self._facts))]   # the oldest entry
            self._facts[raw] = facts
        return facts


def _payload(record: Record, facts: _HeaderFacts) -> bytes:
    """The MetricsData bytes of a compressed or non-protobuf value; raises contract.DecodeError."""
    payload = b""
    if facts.media in ("", contract.CONTENT_TYPE_PROTOBUF):
        payload = contract.decompress(record.value, facts.encoding)
        if not payload:
            raise contract.DecodeError("empty", "record value decompresses to nothing")
    if facts.media != contract.CONTENT_TYPE_PROTOBUF and (not payload or contract.may_be_json(payload)):
        # JSON (or an unknown content type, which decode rejects with its reason): the slow, full path.
        payload = contract.decode(record.value, record.headers).metrics.SerializeToString()
    return payload


def _held_size(record: Record) -> int:
    """What holding `record` for the dead-letter topic costs in memory: its bytes and its objects, so a topic of
    empty records (tombstones) waiting for a dead-letter topic that refuses them still fills the in-flight budget."""
    headers = sum(len(name) + len(value or b"") for name, value in record.headers)
    return len(record.value or b"") + len(record.key or b"") + headers + _HELD_RECORD_OVERHEAD


def _push_interval_s(text: str | None) -> float | None:
    """The push_interval_ms header in seconds; None when absent or not a positive whole number."""
    digits = (text or "").strip()
    if not digits.isascii() or not digits.isdigit() or len(digits) > 12:   # KIP-714's intervals fit an int32
        return None
    return int(digits) / 1000 or None


def _to_cumulative(payload: bytes, converter: DeltaToCumulative, record: Record, facts: _HeaderFacts) -> bytes:
    # The one step that needs the decoded message: only taken when conversion is on.
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise contract.DecodeError("too-large", f"{len(payload)} bytes of MetricsData: delta→cumulative conversion "
                                                f"parses at most {MAX_PAYLOAD_BYTES} per record")
    try:
        metrics = MetricsData.FromString(payload)
    except Exception as err:
        raise contract.DecodeError("invalid-protobuf", f"value is not an OTLP MetricsData protobuf: {err}") from err
    key = facts.instance or (record.key or b"").decode("utf-8", errors="replace")
    if converter.convert(metrics, key, (record.topic, record.partition), push_interval_s=facts.push_interval_s):
        return metrics.SerializeToString()
    return payload


# One record in a batch: its enriched MetricsData bytes, its data points, the client instance it comes from when hash
# routing or ordering needs it (its client_instance_id header, else its key; b"": not ordered), the record itself when
# a dead-letter topic is configured (a record the collector refuses is written there as it was read), and its
# partition (a revoke may take it from under the batch).
Part = tuple[bytes, int, str | bytes, Record | None, Partition]


@dataclass
class _DeadLetter:
    record: Record
    reason: str
    ticket: Ticket
    attempts: int = 1
    due: float = 0.0


class _Watch:
    """Asked after each retryable failure of a batch's request (`Endpoint.export`'s `stop_retrying`): whether to stop
    retrying it as a request the collector keeps failing for its data (Bridge._isolate takes it from there). Only
    after `after_s` of failing, and only while the collector accepts an empty request: it is up and takes the
    credentials, so an outage never stops a retry. Without a dead-letter topic (`fires` false) it never stops one (at
    least once), and says once what it sees."""

    __slots__ = ("_after_s", "_endpoint", "_fires", "_records", "_started", "_told")

    def __init__(self, endpoint: Endpoint, records: int, after_s: float, fires: bool) -> None:
        self._endpoint, self._records, self._after_s, self._fires = endpoint, records, after_s, fires
        self._started, self._told = time.monotonic(), False

    def __call__(self, attempt: int) -> bool:
        failing_s = time.monotonic() - self._started
        if failing_s < self._after_s or self._told or not self._endpoint.answers():
            return False
        if not self._fires:
            self._told = True
            log.error("export of %d records to %s has failed for %.0f s while the collector answers an empty "
                      "request: it may be failing on some of these records; they are retried for ever (set "
                      "delivery.dead_letter_topic to have such records set aside)", self._records,
                      self._endpoint.name, failing_s)
            return False
        return True


class _Trail:
    """How the records of a part have been failing (Bridge._isolate). `failed`: when their last two requests
    failed; `fresh`: whether the last failure followed a delivery of other data (one since the failure before the
    previous: a part sent again after waiting behind the others fails twice before it is judged); `since`: the first
    such failure; `attempts`: how many failures were such (failures while the collector takes nothing, or is down,
    say nothing against these records)."""

    __slots__ = ("attempts", "failed", "fresh", "since")

    def __init__(self, failed: tuple[float, ...] = (), since: float | None = None, attempts: int = 0) -> None:
        self.failed: deque[float] = deque(failed, maxlen=2)
        self.since, self.attempts, self.fresh = since, attempts, False

    def copy(self) -> _Trail:
        """For a half: which failures are fresh is judged as before; what counts against a client starts over (a
        neighbour split off beside a poisoned client must not inherit its count)."""
        return _Trail(tuple(self.failed))

    def failure(self, now: float, delivered_at: float) -> None:
        self.fresh = bool(self.failed) and delivered_at > self.failed[0]
        self.failed.append(now)
        if self.fresh:   # only a failure while the collector takes other data counts against them
            self.since = now if self.since is None else self.since
            self.attempts += 1

    def poisoned(self, now: float, down_at: float, after_s: float) -> bool:
        """Whether to give up on them: _POISON_ATTEMPTS failures that each followed a delivery of other data, the
        latest one too, over `after_s` (since the collector last stopped answering, if later)."""
        return (self.fresh and self.since is not None and self.attempts >= _POISON_ATTEMPTS
                and now - max(self.since, down_at) >= after_s)


class _Turn:
    """Records of one batch for an endpoint, sent as one request once the earlier exports it waits for have ended."""

    __slots__ = ("instances", "parts", "start", "waiting_for", "then")

    def __init__(self, parts: list[Part], start: Callable[[_Turn], None]) -> None:
        self.instances = frozenset(part[2] for part in parts if part[2])
        self.parts, self.start = parts, start
        self.waiting_for = 0            # earlier exports not ended yet that hold one of its client instances
        self.then: list[_Turn] = []     # later exports waiting for this one


class _InOrder:
    """Keeps each client instance's records in the order they were read on their way to one endpoint, after a
    failed and retried export too: a batch holding records of a client instance that an earlier export not yet ended
    holds is sent only once that one ends. Exports go side by side, `concurrency` at a time, and one that waits takes
    no thread meanwhile. (Back ends refuse a sample older than one they have, and a cumulative sum arriving older than
    the last looks like a counter reset.) Records with neither client instance nor key are not ordered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str | bytes, _Turn] = {}   # each client instance's last export not ended
        # An export that could not be handed to the threads (can't start new thread): for the consuming thread to
        # raise, as it does when that happens to it; meanwhile the exports waiting for that one are not held up.
        self.failure: BaseException | None = None

    def take(self, parts: list[Part], start: Callable[[_Turn], None]) -> None:
        """Send `parts` with `start(turn)`, now or when the exports it waits for have ended; from the consuming
        thread, in the order batches are handed over; `end(turn)` when its export ends. (Sending only a batch's records
        that must wait later, and the rest at once, cut batches into ever smaller requests while a backlog of a
        fleet of some thousand clients is read.)"""
        turn = _Turn(parts, start)
        with self._lock:
            earlier = {id(t): t for t in map(self._latest.get, turn.instances) if t is not None}
            for waited in earlier.values():
                waited.then.append(turn)
            turn.waiting_for = len(earlier)
            self._latest.update(dict.fromkeys(turn.instances, turn))
        if not earlier:
            try:
                start(turn)
            except BaseException:
                self.end(turn)   # never sent: later batches of its clients must not wait for it
                raise

    def end(self, turn: _Turn) -> None:
        """The export ended (delivered, refused or given up): start the ones that waited for it alone."""
        ended = [turn]
        while ended:
            for later in self._ended(ended.pop()):
                try:
                    later.start(later)
                except Exception as error:   # never sent, so it ends here: the exports waiting for it go on
                    log.exception("handing a waiting export to the export threads failed; its records stay "
                                  "uncommitted")
                    self.failure = self.failure or error
                    ended.append(later)

    def _ended(self, turn: _Turn) -> list[_Turn]:
        """Forget `turn`; the exports that were waiting for it alone."""
        with self._lock:
            for instance in turn.instances:
                if self._latest.get(instance) is turn:
                    del self._latest[instance]
            due = []
            for later in turn.then:
                later.waiting_for -= 1
                if later.waiting_for == 0:
                    due.append(later)
            turn.then = []
        return due


class _BatchTicket(Ticket):
    """A batch's ticket: a part per export of it (one per endpoint it goes to) and per record a collector refused that
    goes to the dead-letter topic. Its bytes count against the in-flight budget until its exports have ended, then
    only its letters' own: a dead-letter topic that keeps refusing must not pin whole batches. `revoked`: partitions
    a revoke could not wait for, whose records it no longer sends (the next owner reads and sends them again)."""

    __slots__ = ("exports", "letters", "revoked")

    def __init__(self) -> None:
        super().__init__()
        self.exports = 0
        self.letters = 0
        self.revoked: frozenset[Partition] = frozenset()


def _owned(parts: list[Part], ticket: _BatchTicket) -> list[Part]:
    """`parts` but the records of partitions revoked from under their batch."""
    gone = ticket.revoked
    return [part for part in parts if part[4] not in gone] if gone else parts


@dataclass
class _Batch:
    ticket: _BatchTicket = field(default_factory=_BatchTicket)
    parts: list[Part] = field(default_factory=list)
    points: int = 0
    size: int = 0              # enriched bytes: what the request carries
    kept: int = 0              # original values held for the dead-letter topic besides them
    opened: float = field(default_factory=time.monotonic)


def _check_stall_timeout(config: BridgeConfig, tuning: Mapping[str, Any]) -> None:
    """`stall_timeout_s` above the longest one turn of the consuming loop may take: a commit waiting for the group
    coordinator (session.timeout.ms), a Kafka check (its probe and its request, each up to kafka.connect_timeout_s),
    a revoke (delivery.revoke_timeout_s), and a margin (a lag query, a busy machine)."""
    if not config.stall_timeout_s:
        return
    session_s = tuning.get("session.timeout.ms", _SESSION_TIMEOUT_MS) / 1000
    longest = session_s + 2 * config.kafka.connect_timeout_s + config.delivery.revoke_timeout_s + _TURN_MARGIN_S
    if config.stall_timeout_s <= longest:
        raise ConfigError(
            f"stall_timeout_s ({config.stall_timeout_s:g}) must be above {longest:g}s, the longest one turn of the "
            f"consuming loop may take: session.timeout.ms ({session_s:g}s, a commit), twice kafka.connect_timeout_s "
            f"(a Kafka check), delivery.revoke_timeout_s and {_TURN_MARGIN_S:g}s; raise it, or give 0 to turn the "
            "check off")


class Bridge:
    """Runs the pipeline until `stop()`; `run()` returns 0 after a clean drain."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self.metrics = BridgeMetrics()
        security, self._tuning = split_properties(config.kafka_properties())
        self._settings = KafkaSettings(config.kafka.bootstrap_servers, security)
        self._settings.validate()  # TLS/SASL properties, and that the TLS files load, now: a bad one is named
        self._converter = (DeltaToCumulative(config.temporality.max_streams, config.temporality.idle_expiry_s)
                           if config.temporality.delta_to_cumulative else None)
        self._prepare = Preparer(Enricher(config.enrich), self._converter)
        self._stopping = threading.Event()
        self._drain_deadline = float("inf")
        self._endpoints = [open_endpoint(e, config.retry, self._give_up, functools.partial(self._failed, e.endpoint))
                           for e in config.endpoints]
        # One pool per endpoint, of its concurrency: an endpoint down (its exports retrying) never takes the
        # workers another endpoint's exports need. With more than one worker, exports sharing a client instance
        # take turns (_InOrder); one worker sends in order anyway.
        self._pools = {id(endpoint): ThreadPoolExecutor(max_workers=e.concurrency,
                                                        thread_name_prefix=f"kcm-bridge-export-{index}")
                       for index, (endpoint, e) in enumerate(zip(self._endpoints, config.endpoints))}
        self._order = {id(endpoint): _InOrder()
                       for endpoint, e in zip(self._endpoints, config.endpoints) if e.concurrency > 1}
        self._tracker = OffsetTracker()
        self._batch = _Batch()
        # Bytes of flushed batches and waiting dead letters whose tickets have not finished: kept as a sum, not
        # summed over the tickets, which a dead letter the topic keeps refusing would let pile up behind it.
        self._inflight = 0
        self._inflight_lock = threading.Lock()   # tickets finish on export and producer threads
        # Hash routing: each client instance's endpoint, worked out once (bounded like the header cache).
        self._hashing = config.routing == "hash" and len(self._endpoints) > 1
        # Records carry their client instance for hash routing and for keeping each instance's exports in order.
        # And for _isolate, which may send the client instances of a batch in any order.
        self._keyed = (self._hashing or any(e.concurrency > 1 for e in config.endpoints)
                       or bool(config.delivery.poison_after_s and config.delivery.dead_letter_topic))
        self._routes: dict[str | bytes, Endpoint] = {}
        self._delivered_at: dict[int, float] = {}   # per endpoint: when it last took a request (_isolate)
        self._unanswered_at: dict[int, float] = {}   # per endpoint: when it last failed an empty request (_isolate)
        # Dead letters to write from the consuming thread: failed writes to retry (appended from producer threads)
        # and records a collector refused (appended from export threads).
        self._letters_due: deque[_DeadLetter] = deque()
        self._held: list[Record] = []   # fetched, not yet prepared: the in-flight budget was spent
        self._rng = random.Random()
        self._rejected_log = PacedLog(log, logging.WARNING)   # a corrupt stream is counted per record, logged paced
        self._paused = False   # taking no records: the exports hold the in-flight budget
        self._paused_since = 0.0
        self._client_paused = False   # the assigned partitions paused in the Kafka client (_CLIENT_PAUSE_AFTER_S)
        self._freed = threading.Event()   # set when an export's end frees in-flight bytes
        self._average_size = 1024.0
        self._assignment_changed = False
        self._consumer: Consumer | None = None
        self._dead_letters: DeadLetterProducer | None = None
        self._ready = False
        self._kafka = KafkaHealth()
        self.metrics_port: int | None = None  # the bound port once serving (config may say 0: any free port)
        _check_stall_timeout(config, self._tuning)
        self._turned = time.monotonic()   # when the consuming loop last came round (/healthz)
        self._stall_reported: float | None = None   # the `_turned` of the stall last logged
        self._loop = threading.current_thread()   # the thread running `run()`, once it does

    # -- control -------------------------------------------------------------------------------------------
    def stop(self, at_once: bool = False) -> None:
        """Ask the bridge to stop fetching, drain and exit (safe from signal handlers and other threads). `at_once`
        (a second Ctrl-C) also stops waiting for exports: what was exported is committed, the rest is read again by
        the next consumer of those partitions. `delivery.shutdown_timeout_s` counts from the first call: a revoke
        waiting for exports when it comes (inside a poll) waits no longer than the drain would."""
        wait = 0.0 if at_once else self.config.delivery.shutdown_timeout_s
        # The drain, and a revoke under way, keep the earliest deadline asked for.
        self._drain_deadline = min(self._drain_deadline, time.monotonic() + wait)
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def ready(self) -> bool:
        """Consuming: Kafka answers with these credentials, and the bridge is not shutting down."""
        return self._ready and self._kafka.ok and not self._stopping.is_set()

    def health_problem(self) -> str | None:
        """Why /healthz fails: the consuming loop has not come round for `stall_timeout_s`, stuck in a call that
        never returns (Kubernetes then restarts the bridge; offsets follow exports, so nothing is lost). None while
        it turns, with the check off, and once draining (bounded on its own). A stall is logged once, with where."""
        limit = self.config.stall_timeout_s
        turned = self._turned
        stalled = time.monotonic() - turned
        if not limit or stalled < limit or self._stopping.is_set():
            return None
        if self._stall_reported != turned:
            self._stall_reported = turned
            log.error("the consuming loop has not come round for %.0fs (stall_timeout_s %g): /healthz fails, so "
                      "that Kubernetes restarts the bridge; what was exported and not committed is read again. "
                      "It is blocked at:\n%s", stalled, limit, where_blocked(self._loop))
        return f"stalled: the consuming loop has not come round for {stalled:.0f}s (stall_timeout_s {limit:g})"

    def _give_up(self) -> bool:
        return self._stopping.is_set() and time.monotonic() >= self._drain_deadline

    # -- main loop -----------------------------------------------------------------------------------------
    def run(self) -> int:
        """Consume until stopped, then flush, commit and close within `delivery.shutdown_timeout_s`."""
        config = self.config
        self._loop, self._turned = threading.current_thread(), time.monotonic()
        server = None
        if config.metrics_port is not None:
            try:
                server = serve(self.metrics, config.metrics_host, config.metrics_port, lambda: self.ready,
                               self.health_problem)
            except OSError as err:
                raise UserError(f"metrics_port {config.metrics_port}: cannot listen on {config.metrics_host} "
                                f"({err.strerror}); pick another --metrics-port, or another metrics_host") from None
            self.metrics_port = server.server_address[1]
            log.info("serving /metrics, /healthz and /readyz on port %d", self.metrics_port)
        if config.delivery.dead_letter_topic:
            self._dead_letters = open_dead_letter_producer(config.kafka.client, self._settings)
        self._consumer = open_consumer(config.kafka.client, self._settings, self._tuning, config.kafka.group_id,
                                       config.kafka.topics, self._on_assign, self._on_revoke)
        self._ready = True
        log.info("bridging %s (group %s, %s) to %s", ",".join(config.kafka.topics), config.kafka.group_id,
                 self._settings.describe(), ", ".join(e.name for e in self._endpoints))
        last_commit = time.monotonic()
        try:
            while not self._stopping.is_set():
                self._turned = time.monotonic()
                linger = config.batch.linger_ms / 1000
                if self._batch.parts:
                    timeout = max(0.0, min(0.1, self._batch.opened + linger - time.monotonic()))
                else:   # paused, a poll returns nothing: the exports ending is what resumes it, soon after they do
                    timeout = _PAUSED_POLL_S if self._paused else 0.5
                if self._paused and not self._client_paused:
                    self._freed.wait(min(timeout, _PAUSED_POLL_S))   # no poll: the client keeps its prefetch
                    self._freed.clear()
                    self._take([])
                else:
                    self._take(self._poll(timeout))
                self._backpressure()
                # Still paused with nothing in flight (after this turn's exports ended), the open batch is what
                # holds the budget (batch.max_bytes near or above it): waiting for its linger frees nothing.
                if self._batch.parts and (time.monotonic() - self._batch.opened >= linger
                                          or (self._paused and not self._inflight)):
                    self._flush()
                self._serve_dead_letters(0)
                for order in self._order.values():
                    if order.failure is not None:   # as when handing an export over fails on this thread
                        raise RuntimeError(f"an export could not be handed to the export threads ({order.failure}); "
                                           "stopping: a restart reads its records again") from order.failure
                if time.monotonic() - last_commit >= config.delivery.commit_interval_s:
                    self._commit()
                    self._report_lag()
                    last_commit = time.monotonic()
        finally:
            self._drain()
            if server is not None:
                server.shutdown()
                server.server_close()   # its socket too: a probe then is refused, not left waiting
        return 0

    def _poll(self, timeout: float) -> list[Record]:
        """One poll; while Kafka cannot be used, checks it again with backoff and reports it once per period."""
        assert self._consumer is not None
        try:
            if self._kafka.check_due():
                # The probe names what answers at the address (nothing, not Kafka, no TLS); then a request proves
                # the credentials. Kafka may simply not be up yet when the bridge starts: the same retry covers it.
                # A SIGTERM meanwhile ends them (within a second), not connect_timeout_s later: the drain is next.
                check_reachable(self._settings, self.config.kafka.connect_timeout_s, self._stopping)
                self._consumer.check(self.config.kafka.connect_timeout_s, self._stopping)
                if self._kafka.recovered():
                    log.info("Kafka at %s answers again: consuming", self._settings.bootstrap_servers)
            return self._consumer.poll(timeout, self._poll_size())
        except KafkaUnavailableError as problem:
            if self._stopping.is_set():   # a check cut short says nothing about Kafka
                return []
            delay = self._kafka.failed(str(problem))
            if delay is not None:
                log.error("%s; retrying in %.0fs, not ready until then", problem, delay)
            self._stopping.wait(timeout)
            return []

    def _poll_size(self) -> int:
        """Records to fetch at most: what fits in the in-flight budget at the average size seen, so memory stays
        bounded by the budget even when a whole backlog is ready to fetch."""
        budget = self.config.delivery.max_inflight_bytes - self._inflight_bytes()
        return max(1, min(_POLL_RECORDS, int(budget // self._average_size)))

    def _take(self, polled: list[Record]) -> None:
        """Records held back earlier, then the polled ones, in order, as far as the in-flight budget goes."""
        records = self._held + polled if self._held else polled
        self._held = []
        if records:
            self._add(records)

    def _add(self, records: list[Record]) -> None:
        """Prepare and batch records in order until the in-flight budget is spent; the rest wait in `_held` (and
        fetching pauses) until exports free it: small compressed records may expand a thousandfold. The hot loop, so
        it keeps what it uses in locals."""
        prepare, track = self._prepare, self._tracker.add
        keep = self._dead_letters is not None
        keyed = self._keyed
        max_points, max_bytes = self.config.batch.max_points, self.config.batch.max_bytes
        batch, consumed, added = self._batch, 0, 0
        room = self.config.delivery.max_inflight_bytes - self._inflight_bytes()
        busy = self._inflight > 0   # with nothing in flight one record always goes, however large
        for index, record in enumerate(records):
            if added >= room and (index or busy):
                self._held = records[index:]
                records = records[:index]
                break
            consumed += len(record.value or b"")
            if record.unreadable is not None:   # the Kafka client could not read all of it (consumer.py)
                self._reject(record, (record.topic, record.partition), UNPROCESSABLE, record.unreadable)
                continue
            try:
                payload, points = prepare(record)
            except contract.DecodeError as err:
                self._reject(record, (record.topic, record.partition), err.reason, str(err))
                continue
            except Exception as err:  # an input nobody foresaw must cost that record, never the bridge
                log.debug("preparing %s/%d@%d failed", record.topic, record.partition, record.offset, exc_info=True)
                self._reject(record, (record.topic, record.partition), UNPROCESSABLE,
                             f"{type(err).__name__}: {err}")
                continue
            size = len(payload)
            if batch.parts and (batch.points + points > max_points or batch.size + size > max_bytes):
                self._flush()
                batch = self._batch
            if not batch.parts:
                batch.opened = time.monotonic()
            instance = (prepare.last_instance or record.key or b"") if keyed else b""   # b"": not ordered
            partition = (record.topic, record.partition)
            batch.parts.append((payload, points, instance, record if keep else None, partition))
            batch.points += points
            batch.size += size
            added += size
            if keep and payload is not record.value:
                kept = len(record.value or b"")
                batch.kept += kept
                added += kept
            track(partition, record.offset, batch.ticket)
        self.metrics.records.inc(len(records))
        self.metrics.bytes.inc(consumed)
        if added and records:
            # Enriched bytes per record, for sizing fetches to the in-flight budget.
            self._average_size += (added / len(records) - self._average_size) / 4

    def _reject(self, record: Record, partition: Partition, reason: str, message: str) -> None:
        """Dead-letter (or count and skip) a record the bridge cannot export; `reason` is a contract decode reason
        or UNPROCESSABLE."""
        self.metrics.decode_failures.labels(reason).inc()
        where = f"{record.topic}/{record.partition}@{record.offset}"
        topic = self.config.delivery.dead_letter_topic
        # A record the client could read nothing of (kafka-python, see consumer.py) leaves nothing to write.
        nothing = record.unreadable is not None and record.key is None and record.value is None
        if self._dead_letters is None or topic is None or nothing:
            self._rejected_log("skipping undecodable record %s (%s): %s", where, reason, message)
            self._tracker.add(partition, record.offset, None)
            return
        self._rejected_log("dead-lettering undecodable record %s to %s (%s): %s", where, topic, reason, message)
        # Held (and counted against the in-flight budget) until written: a dead-letter topic that refuses the
        # record is retried with backoff, so its partition is never committed past it.
        ticket = Ticket(size=_held_size(record))
        self._hold(ticket)
        self._tracker.add(partition, record.offset, ticket)
        self._dead_letter(_DeadLetter(record, reason, ticket))

    def _dead_letter(self, letter: _DeadLetter) -> None:
        assert self._dead_letters is not None and self.config.delivery.dead_letter_topic is not None

        def done(ok: bool) -> None:   # from the producer's thread or poll
            if ok:
                self.metrics.dead_lettered.inc()
                self._finish(letter.ticket)
                return
            self.metrics.dead_letter_failures.inc()
            letter.due = time.monotonic() + backoff_s(letter.attempts, KAFKA_RETRY, self._rng)
            letter.attempts += 1
            self._letters_due.append(letter)

        self._dead_letters.send(self.config.delivery.dead_letter_topic, letter.record, letter.reason, done)

    def _serve_dead_letters(self, timeout_s: float) -> None:
        """Deliver the dead-letter producer's reports (waiting up to `timeout_s` for writes out), then write the
        letters that are due: retries whose backoff has passed, and records a collector refused. The consuming
        thread's turn, bounded in time, so a failing dead-letter topic cannot hold the loop."""
        if self._dead_letters is None:
            return
        self._dead_letters.flush(timeout_s)
        now = time.monotonic()
        for _ in range(len(self._letters_due)):
            letter = self._letters_due.popleft()
            if letter.due > now or time.monotonic() - now >= _DEAD_LETTER_TURN_S:
                self._letters_due.append(letter)
            elif self._tracker.holds((letter.record.topic, letter.record.partition), letter.ticket):
                self._dead_letter(letter)
            else:
                self._finish(letter.ticket)   # its partition was revoked: the next owner reads the record again

    def _flush(self) -> None:
        """Hand the open batch to the exporters: every endpoint (fanout) or each client instance's endpoint (hash)."""
        batch, self._batch = self._batch, _Batch()
        if not batch.parts:
            return
        if self._hashing:
            groups: dict[int, tuple[Endpoint, list[Part]]] = {}
            routes = self._routes
            for part in batch.parts:
                endpoint = routes.get(part[2])
                if endpoint is None:
                    if len(routes) >= _HEADER_CACHE_ENTRIES:
                        routes.clear()
                    endpoint = routes[part[2]] = _rendezvous(part[2], self._endpoints)
                groups.setdefault(id(endpoint), (endpoint, []))[1].append(part)
            work = list(groups.values())
        else:
            work = [(endpoint, batch.parts) for endpoint in self._endpoints]
        batch.ticket.size = batch.size + batch.kept
        batch.ticket.set_parts(len(work))
        batch.ticket.exports = len(work)
        self._hold(batch.ticket)
        for endpoint, parts in work:
            order = self._order.get(id(endpoint))
            if order is None:
                self._start(endpoint, parts, batch.ticket, None, None)
            else:
                order.take(parts, functools.partial(self._start_turn, endpoint, batch.ticket, order))

    def _start(self, endpoint: Endpoint, parts: list[Part], ticket: _BatchTicket, order: _InOrder | None,
               turn: _Turn | None) -> None:
        """Hand an export to the endpoint's threads (from the consuming thread, or the export thread whose end let
        this one start)."""
        try:
            future = self._pools[id(endpoint)].submit(self._export_in_turn, endpoint, parts, ticket, order, turn)
        except RuntimeError:
            if self._stopping.is_set():   # the threads were shut down (the drain's deadline): read again later
                return
            raise
        future.add_done_callback(lambda f: self._exported(f, ticket))

    def _start_turn(self, endpoint: Endpoint, ticket: _BatchTicket, order: _InOrder, turn: _Turn) -> None:
        self._start(endpoint, turn.parts, ticket, order, turn)

    def _export_in_turn(self, endpoint: Endpoint, records: list[Part], ticket: _BatchTicket, order: _InOrder | None,
                        turn: _Turn | None) -> Outcome:
        try:
            return self._export(endpoint, records, ticket)
        finally:
            if order is not None and turn is not None:
                order.end(turn)

    def _export(self, endpoint: Endpoint, records: list[Part], ticket: _BatchTicket) -> Outcome:
        """Export a batch's records as one request. A batch the collector refuses as invalid (INVALID_ARGUMENT) or
        too large (RESOURCE_EXHAUSTED without a retry delay) is split in halves, down to the records it refuses: one
        bad or oversized record must not cost every other client in its batch its data. The halves go in order, each
        settled (split again as needed) before the next is sent, so the records taken still arrive in the order read.
        The splitting is bounded (4·bit_length(records) extra requests), so a collector refusing everything costs a few
        requests per batch, not one per record. A batch the collector keeps failing retryably while it answers an
        empty request (for `delivery.poison_after_s`, with a dead-letter topic) is split by client instance instead
        (_isolate). The records refused in the end go to the dead-letter topic when there is one, and `ticket` waits
        for those writes too. Records of partitions revoked from under the batch (a revoke that could not wait for it)
        are no longer sent, nor retried: their next owner sends them, and copies sent later would reach the collector
        after its newer records."""
        if self._give_up():   # the shutdown deadline passed while this waited: the next owner reads it again
            return Outcome(False, 0, abandoned=True)
        attempts = 0
        while records := _owned(records, ticket):
            outcome = self._send(endpoint, records, ticket, self._watch(endpoint, len(records)))
            attempts += outcome.attempts
            if not outcome.abandoned or self._give_up():
                break   # else a revoke took some of its records meanwhile: the rest go again
        if not records:   # every record's partition was revoked: settled, their next owner sends them
            return Outcome(True, attempts)
        if outcome.error == _KEPT_FAILING:
            return self._isolate(endpoint, records, ticket, outcome, len(records))
        if outcome.error not in _SPLIT_CODES or outcome.delivered or outcome.abandoned or len(records) == 1:
            self._refused(endpoint, outcome, records, len(records), ticket)
            return outcome
        budget, sent, taken = 4 * len(records).bit_length() - 2, 1, 0   # each split takes two requests of it
        # Records refused for good by their gRPC code, with the (first) outcome of that code: each reason decides
        # for its own records (invalid ones may be dead-lettered, those refused for credentials never are).
        dropped: dict[str | None, tuple[Outcome, list[Part]]] = {}
        half = len(records) // 2
        unsent = [records[half:], records[:half]]   # a stack: the first half on top
        while unsent:
            if self._give_up():   # the shutdown deadline: uncommitted, the next owner sends all of it again
                return Outcome(False, sent, abandoned=True)
            chunk = _owned(unsent.pop(), ticket)
            if not chunk:
                continue
            sent += 1
            result = self._send(endpoint, chunk, ticket, self._watch(endpoint, len(chunk)))
            if result.abandoned:
                if self._give_up():
                    return result
                unsent.append(chunk)   # a revoke took some of its records meanwhile: the rest go again
                continue
            if result.delivered:
                taken += len(chunk)
                continue
            if result.error == _KEPT_FAILING:
                # The chunk and every record after it, in the order read: _isolate sends them by client instance.
                for why, parts in dropped.values():
                    self._refused(endpoint, why, parts, len(records), ticket, rest="")
                rest = chunk + [part for later in reversed(unsent) for part in later]
                return self._isolate(endpoint, rest, ticket, result, len(records), taken)
            if result.error in _SPLIT_CODES and len(chunk) > 1 and budget >= 2:
                budget -= 2
                half = len(chunk) // 2
                unsent += [chunk[half:], chunk[:half]]
            else:
                dropped.setdefault(result.error, (result, []))[1].extend(chunk)
        for why, parts in dropped.values():
            self._refused(endpoint, why, parts, len(records), ticket)
        if not dropped and not ticket.revoked:   # refused as a whole, every part taken (a collector limiting size so)
            log.warning("export to %s rejected with %s: %s; the batch of %d records was delivered in %d smaller "
                        "requests", endpoint.name, outcome.error, outcome.detail, len(records), sent - 1)
        return Outcome(True, sent)   # what the collector takes was delivered

    def _isolate(self, endpoint: Endpoint, records: list[Part], ticket: _BatchTicket, outcome: Outcome,
                 total: int, delivered: int = 0) -> Outcome:
        """Deliver the records of a request the collector kept failing retryably (`outcome`) while it answered an
        empty request, but the client instances it fails for; `records` are `total` of the batch's, of which
        `delivered` were delivered already.

        They are split by client instance: each instance's records stay together and in the order read, and parts
        share no instance, so they may go in any order. After _PART_ATTEMPTS failed attempts (the collector still
        answering) a part of several instances is split in two (the halves go to the back, carrying on its _Trail;
        bounded like _export's while the collector takes nothing, one per instance once it takes other data
        between two of the part's failures), and a part of one instance waits behind the others. A part of one
        instance is given up (dead-lettered) only when _Trail.poisoned: _POISON_ATTEMPTS failures that each followed
        a delivery of other data, over `poison_after_s`, the last one too (failures while the collector takes
        nothing, or is down, do not count; an outage starts the time over; a half starts at zero). So nothing is
        set aside in an outage, nor while the collector fails all data (its memory limiter, say), nor, but by a long
        run of bad luck, for it failing some requests of every client (a rate limiter); and a client whose records
        fail with nothing else reaching the collector (this batch's other parts delivered, no other export thread
        taking any) is retried, not set aside. A round of parts that delivers nothing waits as a retry does before
        the next. Refusals for good are split by instance and dropped
        as in _export, within a budget of their own (a part of one instance that is refused is dropped whole)."""
        after_s, retry = self.config.delivery.poison_after_s, self.config.retry
        # Splits for refusals, and splits of parts failing while the collector takes nothing, each bounded as _export's.
        budget = blind = 4 * len(records).bit_length() - 2
        sent, fruitless, rounds = 0, 0, 0
        pending: deque[tuple[list[Part], _Trail]] = deque((part, _Trail()) for part in _by_instance(records))
        refused: dict[str | None, tuple[Outcome, list[Part]]] = {}
        failing: list[list[Part]] = []   # given up
        key = id(endpoint)

        while pending:
            if self._give_up():   # the shutdown deadline: uncommitted, the next owner sends all of it again
                return Outcome(False, sent, abandoned=True)
            if fruitless > len(pending):   # every part failed since the last delivery: wait as a retry would
                fruitless, rounds = 0, rounds + 1
                if wait_unless(backoff_s(rounds, retry, self._rng), self._give_up):
                    return Outcome(False, sent, abandoned=True)
            part, trail = pending.popleft()
            if not (part := _owned(part, ticket)):
                continue
            halves = _by_instance(part)
            struck = [False]   # a failure of this send followed a delivery of other data

            def settle(attempt: int, trail: _Trail = trail, one: bool = len(halves) == 1, others: bool = bool(pending),
                       blind: int = blind, struck: list[bool] = struck) -> bool:
                now = time.monotonic()
                trail.failure(now, self._delivered_at.get(key, -math.inf))
                struck[0] = struck[0] or trail.fresh
                if attempt < _PART_ATTEMPTS:
                    return False
                if not endpoint.answers():   # down: the time starts over for every part (see _Trail.poisoned)
                    self._unanswered_at[key] = now
                    return False
                if one:
                    return others or trail.poisoned(now, self._unanswered_at.get(key, -math.inf), after_s)
                return others or struck[0] or blind >= 2

            sent += 1
            result = self._send(endpoint, part, ticket, settle)
            if result.delivered:
                fruitless, rounds, delivered = 0, 0, delivered + len(part)
                continue
            fruitless += 1
            stopped = result.error == _KEPT_FAILING
            if result.abandoned:
                if self._give_up():
                    return result
                pending.appendleft((part, trail))   # a revoke took some of its records meanwhile: the rest go again
            elif len(halves) > 1 and stopped and (struck[0] or blind >= 2):
                if not struck[0]:   # while the collector takes nothing, splits are bounded; after, one per instance
                    blind -= 2
                pending.extend((half, trail.copy()) for half in halves)
            elif len(halves) > 1 and result.error in _SPLIT_CODES and budget >= 2:
                budget -= 2
                pending.extend((half, trail.copy()) for half in halves)
            elif stopped and len(halves) == 1 and trail.poisoned(
                    time.monotonic(), self._unanswered_at.get(key, -math.inf), after_s):
                failing.append(part)
            elif stopped:   # the others first: their delivery shows the collector takes data
                pending.append((part, trail))
            else:   # refused for good
                refused.setdefault(result.error, (result, []))[1].extend(part)
        for why, parts in refused.values():
            self._refused(endpoint, why, parts, total, ticket, rest="")
        if failing:
            parts = [record for part in failing for record in part]
            self._refused(endpoint, outcome, parts, total, ticket, quiet=True)
            log.error("export to %s: the collector kept failing %d client instance(s) for %.0f s or more and %d "
                      "attempts or more while it took other data (%s); dead-lettering %s to %s (reason %s)",
                      endpoint.name, len(failing), after_s, _POISON_ATTEMPTS, outcome.detail,
                      _share(parts, total, ""), self.config.delivery.dead_letter_topic, FAILING)
        log.warning("export to %s %s; the batch of %d records was split by client instance: %d delivered in %d "
                    "requests%s", endpoint.name, outcome.detail, total, delivered, sent,
                    f", {len(parts)} dead-lettered" if failing else "")
        return Outcome(True, sent)

    def _watch(self, endpoint: Endpoint, records: int) -> _Watch | None:
        after_s = self.config.delivery.poison_after_s
        if not after_s:
            return None
        return _Watch(endpoint, records, after_s, fires=self.config.delivery.dead_letter_topic is not None)

    def _send(self, endpoint: Endpoint, records: list[Part], ticket: _BatchTicket,
              watch: Callable[[int], bool] | None = None) -> Outcome:
        started = time.monotonic()
        # Concatenated MetricsData are byte-identical to one ExportMetricsServiceRequest; retried until delivered,
        # refused, the shutdown deadline, a revoke taking one of its records' partitions, or `watch` finding that
        # the collector keeps failing it while it answers.
        outcome = endpoint.export(b"".join(record[0] for record in records), give_up=lambda: bool(
            ticket.revoked) and not ticket.revoked.isdisjoint(record[4] for record in records), stop_retrying=watch)
        if outcome.delivered:
            self._delivered_at[id(endpoint)] = time.monotonic()
        elif outcome.stopped:
            outcome = dataclasses.replace(outcome, error=_KEPT_FAILING, detail=(
                f"failed with {outcome.error} for {time.monotonic() - started:.0f} s ({outcome.attempts} attempts) "
                f"while the collector answered an empty request{': ' + outcome.detail if outcome.detail else ''}"))
        labels = {"endpoint": endpoint.name}
        self.metrics.export_seconds.labels(**labels).observe(time.monotonic() - started)
        if outcome.delivered:
            points = sum(record[1] for record in records)
            rejected = min(outcome.rejected_points, points)   # a server claiming more counts as rejecting all
            self.metrics.points.labels(**labels).inc(points - rejected)
            self.metrics.rejected.labels(**labels).inc(rejected)
        return outcome

    def _refused(self, endpoint: Endpoint, outcome: Outcome, records: list[Part], total: int,
                 ticket: Ticket, rest: str = "; the others were delivered", quiet: bool = False) -> None:
        """Log records refused for good (unless `quiet`: the caller says it); those refused as invalid or too large,
        or failing at the collector (_isolate), are handed to the consuming thread for the dead-letter topic when
        there is one (the others were refused for the endpoint's sake, not their own)."""
        if outcome.error is None or outcome.delivered or outcome.abandoned:
            return
        topic = self.config.delivery.dead_letter_topic
        reason = FAILING if outcome.error == _KEPT_FAILING else REFUSED
        letters = [_DeadLetter(record[3], reason, ticket) for record in records
                   if (outcome.error in _SPLIT_CODES or outcome.error == _KEPT_FAILING) and record[3] is not None]
        which = _share(records, total, rest)
        action = f"dead-lettering {which} to {topic}" if letters else f"dropping {which}"
        if not quiet:
            log.error("export to %s rejected with %s: %s; %s (not retryable)%s%s", endpoint.name, outcome.error,
                      outcome.detail, action, refusal_hint(outcome.error), outcome.note)
        if letters:
            ticket.add_parts(len(letters))   # before this export's own part ends, so the ticket cannot end first
            with self._inflight_lock:   # what the batch counts once its exports have ended
                ticket.letters += sum(_held_size(letter.record) for letter in letters)
            self._letters_due.extend(letters)

    def _failed(self, endpoint: str, code: str, retrying: bool) -> None:
        """Each failed attempt, as it happens: the counters move during an outage, not once it is over."""
        self.metrics.export_failures.labels(endpoint, code).inc()
        if retrying:
            self.metrics.retries.labels(endpoint=endpoint).inc()

    def _exported(self, future: Future[Outcome], ticket: _BatchTicket) -> None:
        try:
            outcome = future.result()
        except CancelledError:   # never started: the shutdown deadline passed first
            return
        except Exception:
            if self._give_up():   # a channel closed under it at the shutdown deadline
                return
            log.exception("export failed unexpectedly; its records stay uncommitted")
            return
        # An abandoned export (shutdown deadline) leaves its records uncommitted for the next owner.
        if not outcome.abandoned:
            with self._inflight_lock:
                ticket.exports -= 1
                freed = ticket.exports == 0
                if freed:   # from now on the batch holds only its letters (undelivered as yet)
                    self._inflight -= ticket.size - ticket.letters
                    ticket.size = ticket.letters
            self._finish(ticket)
            if freed:   # a fanout batch's other exports still hold its bytes until the last ends
                self._freed.set()

    def _hold(self, ticket: Ticket) -> None:
        """Count a ticket's bytes against the in-flight budget until it finishes."""
        with self._inflight_lock:
            self._inflight += ticket.size

    def _finish(self, ticket: Ticket) -> None:
        """End one of a ticket's deliveries (from any thread); the last one frees its bytes."""
        if ticket.finish_part():
            with self._inflight_lock:
                self._inflight -= ticket.size
            self._freed.set()

    def _inflight_bytes(self) -> int:
        return self._inflight + self._batch.size + self._batch.kept

    def _backpressure(self) -> None:
        """Take no records while too much is unexported (an endpoint is slow or down), and after
        _CLIENT_PAUSE_AFTER_S pause every partition in the Kafka client; resume at half."""
        assert self._consumer is not None
        inflight = self._inflight_bytes()
        self.metrics.inflight_bytes.set(inflight)
        limit = self.config.delivery.max_inflight_bytes
        now = time.monotonic()
        if not self._paused and (inflight > limit or self._held):
            self._paused = True
            self._paused_since = now
            # Flow control whenever export is the slower side; a failing endpoint logs its own retries as warnings.
            log.info("%d bytes await export (limit %d)%s: pausing consumption until endpoints catch up",
                     inflight, limit, f", {len(self._held)} records wait to be decoded" if self._held else "")
        elif self._paused and inflight <= limit // 2 and not self._held:
            self._paused = False
            log.info("endpoints caught up: resuming consumption")
        client_paused = self._paused and now - self._paused_since >= _CLIENT_PAUSE_AFTER_S
        if client_paused != self._client_paused:
            self._client_paused = client_paused
            self._assignment_changed = True
        if self._assignment_changed:
            # Every assigned partition follows the bridge's state, new ones too: librdkafka keeps a partition's pause
            # across a rebalance, so one paused before a revoke would come back paused and never be resumed.
            assignment = self._consumer.assignment()
            (self._consumer.pause if self._client_paused else self._consumer.resume)(assignment)
            self._assignment_changed = False
        self.metrics.paused.set(1 if self._paused else 0)

    def _commit(self, only: list[Partition] | None = None) -> None:
        assert self._consumer is not None
        positions = self._tracker.to_commit()
        if only is not None:
            positions = {p: o for p, o in positions.items() if p in only}
        if not positions:
            return
        if not self._kafka.ok:
            # Known unreachable: librdkafka would wait for the group coordinator up to the session timeout (45 s by
            # default), stalling this loop and the shutdown bound. Nothing is lost: the records stay uncommitted.
            log.debug("Kafka unreachable: not committing %s yet", _describe(positions))
            return
        try:
            self._consumer.commit(positions)
        except Exception as err:  # a commit during a rebalance fails; the next owner re-reads from the last one
            # While Kafka is down this fails every interval: the outage itself is reported once per backoff period.
            (log.warning if self._kafka.ok else log.debug)("commit of %s failed: %s", _describe(positions), err)
            return
        self._tracker.committed(positions)
        for (topic, partition), offset in positions.items():
            self.metrics.committed.labels(topic, str(partition)).set(offset)
        log.debug("committed %s", _describe(positions))

    def _report_lag(self) -> None:
        """Per assigned partition, how many records are not yet exported or dead-lettered: from the high watermark
        its last fetch reported, or, while fetching is paused, one asked for (up to a second in all); a partition
        nothing was read from yet is left out until it is."""
        assert self._consumer is not None
        ask_s = _WATERMARK_ASK_S if self._paused and self._kafka.ok else 0.0
        for (topic, partition), high in self._consumer.high_watermarks(self._consumer.assignment(), ask_s).items():
            position = self._tracker.commit_position((topic, partition))
            if position is not None:
                self.metrics.lag.labels(topic, str(partition)).set(max(0, high - position))

    # -- rebalances ----------------------------------------------------------------------------------------
    def _on_assign(self, partitions: list[Partition]) -> None:
        log.info("assigned %s", ", ".join(f"{t}/{p}" for t, p in partitions) or "nothing")
        self._assignment_changed = True

    def _on_revoke(self, partitions: list[Partition]) -> None:
        """Export what is open, wait a bounded time for those partitions' exports, commit them, forget them."""
        log.info("revoking %s", ", ".join(f"{t}/{p}" for t, p in partitions) or "nothing")
        self._flush()
        # Closing the consumer at shutdown revokes too, and a stop may come while a revoke waits: the wait stays
        # within the shutdown's own deadline.
        deadline = time.monotonic() + self.config.delivery.revoke_timeout_s
        while self._tracker.pending(partitions) and time.monotonic() < min(deadline, self._drain_deadline):
            self._serve_dead_letters(0.05)
            time.sleep(0.02)
        shutting_down = self._drain_deadline < deadline
        self._commit(only=partitions)
        late = [ticket for ticket in self._tracker.forget(partitions) if isinstance(ticket, _BatchTicket)]
        if late:
            # Not sent any more (waiting exports skip them, retried ones stop): the next owner reads them again, and
            # copies sent later would reach the collector after its newer records (or this member's, if it gets
            # the partitions back).
            gone = frozenset(partitions)
            for ticket in late:
                ticket.revoked |= gone
            exporting = sum(1 for ticket in late if ticket.exports)   # the others wait for dead-letter writes only
            if exporting:
                within = ("by the shutdown's deadline" if shutting_down else
                          f"within revoke_timeout_s ({self.config.delivery.revoke_timeout_s:g}s)")
                log.warning("%d batches of the revoked partitions were not exported %s: their records are left to the "
                            "next owner", exporting, within)
        for topic, partition in partitions:  # the next owner reports them
            for gauge in (self.metrics.lag, self.metrics.committed):
                try:
                    gauge.remove(topic, str(partition))
                except KeyError:
                    pass
        gone = set(partitions)
        self._held = [r for r in self._held if (r.topic, r.partition) not in gone]   # the next owner reads them
        if self._converter is not None:
            self._converter.forget(partitions)
        self._assignment_changed = True

    # -- shutdown ------------------------------------------------------------------------------------------
    def _drain(self) -> None:
        """Stop fetching, export what is open, commit what was exported, close; bounded by the shutdown timeout."""
        self._stopping.set()
        self._drain_deadline = min(self._drain_deadline,
                                   time.monotonic() + self.config.delivery.shutdown_timeout_s)
        if self._consumer is not None:
            self._flush()
            while self._tracker.pending() and time.monotonic() < self._drain_deadline:
                self._serve_dead_letters(0.05)
                time.sleep(0.02)
            left = self._tracker.pending()
            if left:
                log.warning("shutdown timeout: %d batches or dead-letter writes not finished; their records stay "
                            "uncommitted and will be re-read", left)
            if not self._kafka.ok and self._tracker.to_commit():
                log.warning("Kafka at %s cannot be reached: exported records are left uncommitted and will be "
                            "read again", self._settings.bootstrap_servers)
            self._commit()
            self._consumer.close()
        if self._dead_letters is not None:
            self._dead_letters.close(max(0.0, self._drain_deadline - time.monotonic()))
        # Exports still running (past the deadline, or of partitions revoked earlier) give up rather than retry on
        # the channels closed under them.
        self._drain_deadline = min(self._drain_deadline, time.monotonic())
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for endpoint in self._endpoints:
            endpoint.close()
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        log.info("bridge stopped")


def _share(records: list[Part], total: int, rest: str) -> str:
    """How much of a batch of `total` records `records` are, for a log line."""
    points = sum(record[1] for record in records)
    if len(records) == total:
        return f"the batch of {points} points"
    return f"{len(records)} of the batch's {total} records ({points} points{rest})"


def _by_instance(parts: list[Part]) -> list[list[Part]]:
    """`parts` in two by client instance, each in the order read (records with neither instance nor key are not
    ordered: each counts as one of its own); one part when they all share one."""
    keys = [part[2] or index for index, part in enumerate(parts)]
    instances = list(dict.fromkeys(keys))
    if len(instances) < 2:
        return [parts]
    first = set(instances[:len(instances) // 2])
    return [[part for part, key in zip(parts, keys) if key in first],
            [part for part, key in zip(parts, keys) if key not in first]]


def _rendezvous(instance: str | bytes, endpoints: list[Endpoint]) -> Endpoint:
    """The endpoint a client instance goes to: the highest hash of (endpoint, instance). Adding or removing an
    endpoint moves only the instances it wins or had, not most of them as `hash % len(endpoints)` would."""
    identity = b"\0" + (instance.encode("utf-8", "surrogatepass") if isinstance(instance, str) else instance)
    return max(endpoints, key=lambda e: hashlib.blake2b(e.name.encode() + identity, digest_size=8).digest())


def _describe(positions: dict[Partition, int]) -> str:
    return ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(positions.items()))
