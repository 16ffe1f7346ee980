"""Seeded random scenarios of the whole bridge (`Bridge.run`: its consuming loop, batching, export threads, retries,
splitting, isolation, dead letters, revokes, restarts and shutdown) against fakes: a Kafka topic of one to four
partitions holding records of several client instances (header, key only, neither; some undecodable), one to three
collectors (fanout or hash routing, one to three export threads each) that accept, take a while, fail retryably for a
while, refuse records as invalid or requests as too large, refuse credentials (retried or not), answer with partial
success or keep failing some clients' records, and a dead-letter topic that fails for a while. The collectors are the
real `kcm_common.otlp_export.Endpoint` (its retry loop included) with only the gRPC call answered in-process.

Every commit, export call, dead letter and poll is checked against a reference written from docs/bridge.md
(Delivery, Order, Rebalance, SIGTERM, Endpoint down, Undecodable records), not from the code:
- Commit: per partition, never backwards, never for a partition not owned, and never past a record not yet exported
  to every endpoint it goes to (fanout: each; hash: its client instance's one) or dead-lettered, or dropped where the
  docs say a record is dropped (refused as invalid or too large without a dead-letter topic, refused credentials,
  undecodable without a dead-letter topic). A record the collector does not refuse itself is dropped only where the
  bounded splitting of its batch may have run out. After the failures end, everything is committed.
- Order: each client instance's records reach each collector in the order read (within one assignment of its
  partition), none twice; a batch sharing a client instance with an export not yet ended is not sent meanwhile; no
  record of a revoked partition is sent after the revoke (but a request already on its way); hash routing keeps each
  instance on one endpoint; one endpoint down holds back no deliveries to the others.
- Dead letters: as read, for the documented reasons only, once per refusing endpoint; `failing-at-collector` only
  after 20 failures that each followed a delivery of other data, over at least `poison_after_s`.
- A revoke and a graceful shutdown commit what was exported (a shutdown exports the open batch too); run() returns 0;
  no export starts after the shutdown deadline.
- In-flight budget: what was read and is not yet exported or dead-lettered stays near `max_inflight_bytes` (the
  bytes awaiting export plus one fetch sized to the rest of the budget).

A failure names its seed and step: `_run_scenario(seed, tmp_path, monkeypatch)` replays the script (the threads'
interleaving differs from run to run)."""

from __future__ import annotations

import bisect
import dataclasses
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsPartialSuccess,
                                                                            ExportMetricsServiceRequest,
                                                                            ExportMetricsServiceResponse)
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_bridge import pipeline
from kcm_bridge.consumer import Record
from kcm_bridge.pipeline import Bridge, tune_interpreter
from kcm_common import contract
from kcm_common.retry import RetryPolicy
from test_bridge_pipeline import _config

TOPIC = "metrics"
DLQ_TOPIC = "metrics-dlq"
SCENARIOS = 40
# docs/bridge.md, Delivery: the reasons a collector's refusal puts on a dead letter.
REFUSED, FAILING = "refused-by-collector", "failing-at-collector"
READ_ATTRIBUTE = "kcm.model.read"   # each read of a record carries its own id, so the collectors can tell reads apart
# A request already on its way when a revoke ends may still arrive (Rebalance): one that starts this soon after it
# may have been decided before it (a thread handed the GIL over between deciding and calling).
ON_ITS_WAY_S = 0.03
FINAL_WAIT_S = 20.0


# -- the scenario, as data -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    """A record on the topic: its client (client_instance_id header), key, and what the collectors make of it."""

    partition: int
    client: str | None
    key: bytes | None
    undecodable: bool
    bad: frozenset[int]      # endpoints that refuse it as invalid (INVALID_ARGUMENT)
    poison: frozenset[int]   # endpoints that fail it retryably until the failures end
    points: int
    pad: int

    @property
    def group(self) -> str | None:
        """Its client instance as the docs define it: the client_instance_id header, or its key; None: neither."""
        if self.client is not None:
            return self.client
        return f"key:{self.key.decode()}" if self.key is not None else None


@dataclass
class _Scenario:
    seed: int
    partitions: int
    endpoints: int
    routing: str
    concurrency: list[int]
    retry_auth: list[bool]
    size_limit: list[int | None]   # records per request the collector takes (RESOURCE_EXHAUSTED without RetryInfo)
    partial: list[float]
    dlq: bool
    poison_after_s: float
    max_points: int
    max_bytes: int
    linger_ms: int
    max_inflight: int
    revoke_timeout_s: float
    shutdown_timeout_s: float
    backlog: list[_Spec]
    steps: list[tuple] = field(default_factory=list)
    # With a dead-letter topic and records a collector keeps failing: the other clients' pushes while those records
    # are still failing at the end, long enough for them to be set aside (Order, failing-at-collector).
    tail: list[_Spec] = field(default_factory=list)
    # Pushes arriving just before the last SIGTERM, and how long before it.
    burst: list[_Spec] = field(default_factory=list)
    burst_s: float = 0.0
    # With several endpoints and a budget nothing waits for: pushes while the first collector is down.
    aside: list[_Spec] = field(default_factory=list)
    dlq_failing: bool = False   # the dead-letter topic refuses writes from the start (not authorised yet, say)

    def describe(self) -> str:
        return (f"{self.partitions} partitions, {self.endpoints} endpoints ({self.routing}, concurrency "
                f"{self.concurrency}, retry credentials {self.retry_auth}, size limits {self.size_limit}), "
                f"dead letters {self.dlq} (failing at first: {self.dlq_failing}), poison_after_s "
                f"{self.poison_after_s}, max_points {self.max_points}, "
                f"max_bytes {self.max_bytes}, linger_ms {self.linger_ms}, max_inflight_bytes {self.max_inflight}, "
                f"revoke_timeout_s {self.revoke_timeout_s}, shutdown_timeout_s {self.shutdown_timeout_s}")


def _scenario(seed: int) -> _Scenario:
    rng = random.Random(seed)
    partitions, endpoints = rng.randint(1, 4), rng.choice([1, 2, 2, 3])
    routing = rng.choice(["fanout", "hash"]) if endpoints > 1 else "fanout"
    dlq = rng.random() < 0.6
    max_points = rng.choice([2, 4, 8, 16, 24])
    undecodable, bad, poison = rng.choice([0, 0.03]), rng.choice([0, 0.02, 0.05]), rng.choice([0, 0, 0.01, 0.04])
    clients = {p: [f"i{p}.{j}" for j in range(rng.randint(1, 4))] for p in range(partitions)}
    keys = {p: [f"k{p}.{j}" for j in range(rng.randint(0, 2))] for p in range(partitions)}

    def some(chance: float) -> frozenset[int]:
        if rng.random() >= chance:
            return frozenset()
        if routing == "hash":   # which endpoint a client goes to is the bridge's choice: refused wherever it goes
            return frozenset(range(endpoints))
        return frozenset(e for e in range(endpoints) if rng.random() < 0.6) or frozenset({0})

    def records(count: int) -> list[_Spec]:
        made = []
        for _ in range(count):
            partition = rng.randrange(partitions)
            kind = rng.random()
            if kind < 0.75 or not keys[partition] and kind < 0.9:
                client = rng.choice(clients[partition])
                client_key: tuple = (client, client.encode())
            elif kind < 0.9:
                client_key = (None, rng.choice(keys[partition]).encode())
            else:
                client_key = (None, None)   # neither header nor key: not ordered
            broken = rng.random() < undecodable
            made.append(_Spec(partition, *client_key, broken, frozenset() if broken else some(bad),
                              frozenset() if broken else some(poison), rng.randint(1, 3), rng.choice([0, 0, 40, 200])))
        return made

    scenario = _Scenario(
        seed, partitions, endpoints, routing, [rng.choice([1, 2, 2, 3]) for _ in range(endpoints)],
        [rng.random() < 0.3 for _ in range(endpoints)],
        [rng.choice([None, None, max(2, max_points // 3)]) for _ in range(endpoints)],
        [rng.choice([0, 0, 0.15]) for _ in range(endpoints)], dlq,
        rng.choice([0, 0.01, 0.03]) if dlq else rng.choice([0, 120]), max_points,
        rng.choice([2 * 1024 * 1024, 2 * 1024 * 1024, 1500]), rng.choice([0, 2, 10, 30]),
        rng.choice([1200, 3000, 8000, 1 << 20]), rng.choice([0, 0.05, 0.3]), rng.choice([0.2, 1.0, 1.0]),
        records(rng.randint(10, 80)))
    weights = {"produce": 20, "mode": 22, "dlq": 5 if dlq else 0, "revoke": 8, "assign": 8, "restart": 4, "wait": 25}
    for kind in rng.choices(list(weights), list(weights.values()), k=rng.randint(8, 20)):
        if kind == "produce":
            scenario.steps.append(("produce", records(rng.randint(3, 40))))
        elif kind == "mode":
            mode = rng.choice(["up", "up", "slow", "down", "flaky", "auth"])
            scenario.steps.append(("mode", rng.randrange(endpoints), mode))
        elif kind == "dlq":
            scenario.steps.append(("dlq", rng.choice(["failing", "failing", "ok"])))
        elif kind in ("revoke", "assign"):
            scenario.steps.append((kind, frozenset(p for p in range(partitions) if rng.random() < 0.6)))
        elif kind == "restart":
            scenario.steps.append(("restart", rng.random() < 0.3))
        else:   # time passes while clients keep pushing
            scenario.steps.append(("wait", rng.choice([0.02, 0.05, 0.1]), records(rng.randint(0, 8))))
    scenario.burst, scenario.burst_s = records(rng.randint(5, 30)), rng.choice([0.0, 0.005, 0.02])
    if endpoints > 1 and scenario.max_inflight >= 1 << 20:
        scenario.aside = records(rng.randint(5, 20))
    scenario.dlq_failing = dlq and rng.random() < 0.4
    specs = scenario.backlog + [spec for step in scenario.steps if step[0] in ("produce", "wait") for spec in step[-1]]
    if dlq and scenario.poison_after_s and any(spec.poison for spec in specs):
        # Clients of their own, one record each: no batch of theirs waits for the failing records' export.
        scenario.tail = [_Spec(n % partitions, f"t{n}", f"t{n}".encode(), False, frozenset(), frozenset(), 1, 0)
                         for n in range(60)]
    return scenario


# -- the reference ---------------------------------------------------------------------------------------------------

class _Read:
    """One reading of a record by one member in one assignment of its partition (`epoch`), and what became of it at
    each endpoint: `last` outcome ("accept", "split": refused as invalid or too large, "auth": credentials refused,
    "retry": failed retryably), the first request that held it (its size, how many refused records, any failing
    one), its dead letters by reason, and per endpoint its retryable failures as **Order** counts them against a
    client: `trail[e]` = [the last two failures' times, how many followed a delivery of other data since the
    failure before the previous, the first of those, whether the latest one did]."""

    __slots__ = ("accepted", "epoch", "failed", "headers", "key", "last", "letters", "offset", "rid", "root", "sent",
                 "spec", "split_at", "trail", "value")

    def __init__(self, rid: int, spec: _Spec, offset: int, epoch: int, key, value: bytes, headers: list) -> None:
        self.rid, self.spec, self.offset, self.epoch = rid, spec, offset, epoch
        self.key, self.value, self.headers = key, value, headers
        self.accepted: set[int] = set()
        self.last: dict[int, str] = {}
        self.failed: set[int] = set()
        self.split_at: set[int] = set()
        self.sent: set[int] = set()
        self.root: dict[int, tuple[int, int, bool]] = {}
        self.letters: Counter[str] = Counter()
        self.trail: dict[int, list] = {}

    def __str__(self) -> str:
        return (f"{TOPIC}/{self.spec.partition}@{self.offset} (client {self.spec.group}, read #{self.rid} in "
                f"assignment {self.epoch})")


class _World:
    """The fake topic, group and collectors' shared state, and the reference checks. Called from the bridge's threads
    (consumer, export threads, dead-letter producer) and the driver, under one lock; never calls the bridge."""

    def __init__(self, scenario: _Scenario) -> None:
        self.s = scenario
        self.lock = threading.Lock()
        self.step = "start"
        self.violations: list[str] = []
        self.topic: list[list[_Spec]] = [[] for _ in range(scenario.partitions)]
        self.committed: dict[int, int] = {}
        self.epoch: dict[int, int] = {}
        self.position: dict[int, int] = {}
        self.assigned: set[int] = set()
        self.revoking: set[int] = set()
        self.member: object | None = None
        self.reads: dict[int, _Read] = {}
        self.by_offset: dict[tuple[int, int, int], _Read] = {}
        self.by_value: dict[bytes, _Read] = {}
        self.revoked_at: dict[tuple[int, int], float] = {}
        self.routes: dict[str | None, int] = {}
        self.order: dict[tuple, int] = {}
        self.in_flight: dict[int, dict[int, frozenset]] = {e: {} for e in range(scenario.endpoints)}
        self.delivered_at: dict[int, float] = {e: -1.0 for e in range(scenario.endpoints)}
        self.collectors: list[_Collector] = []
        # The running bridge's shutdown deadline (`shutdown_timeout_s` from when its drain began; the moment a
        # second signal came): infinite until it stops.
        self.deadline: Callable[[], float] = lambda: float("inf")
        self.unfinished: dict[int, _Read] = {}
        self.unfinished_bytes = 0
        self.most_unfinished = 0
        self.largest = 0
        self.calls = 0
        self.healed = False
        self.read_at: dict[int, float] = {}
        self.dlq_failing = False
        self.budget_told = False

    # -- bookkeeping --
    def violation(self, message: str) -> None:
        if len(self.violations) < 30:
            self.violations.append(f"seed {self.s.seed}, step {self.step}: {message}")

    def produce(self, specs: list[_Spec]) -> None:
        with self.lock:
            for spec in specs:
                self.topic[spec.partition].append(spec)

    def name(self, endpoint: int) -> str:
        return f"collector-{endpoint}"

    def routes_of(self, read: _Read) -> list[int] | None:
        if self.s.routing == "fanout":
            return list(range(self.s.endpoints))
        route = self.routes.get(read.spec.group)
        return None if route is None else [route]

    def problem(self, read: _Read) -> str | None:
        """Why `read` is not yet exported or dead-lettered (or dropped as the docs say); None when it is."""
        if read.spec.undecodable:
            if self.s.dlq and not read.letters:
                return "it is undecodable and its dead letter is not written"
            return None
        routes = self.routes_of(read)
        if routes is None:
            return "it was sent to no endpoint"
        refused = failing = 0
        for endpoint in routes:
            if endpoint in read.accepted:
                continue
            last = read.last.get(endpoint)
            if last == "auth" and not self.s.retry_auth[endpoint]:
                continue   # "The refused batch itself is dropped"
            if last == "split":
                why = self.needless_drop(read, endpoint)
                if why:
                    return why
                refused += 1
                continue
            if last == "retry" and self.s.dlq and self.s.poison_after_s:
                failing += 1   # settled only by its dead letter (failing-at-collector)
                continue
            return f"it was not delivered to {self.name(endpoint)} (last outcome there: {last or 'never sent'})"
        if self.s.dlq and read.letters[REFUSED] < refused:
            return f"it was refused by {refused} endpoint(s) and has {read.letters[REFUSED]} {REFUSED} dead letters"
        if self.s.dlq and read.letters[FAILING] < failing:
            return f"it is still failing at {failing} endpoint(s) and has no {FAILING} dead letter"
        return None

    def needless_drop(self, read: _Read, endpoint: int) -> str | None:
        """Refused as part of a request, `read` (which the collector does not refuse itself) may end dropped or
        dead-lettered only where the splitting may have run out: "split in halves, ... down to the records it
        refuses; only those are dropped", within 4·(⌊log2 n⌋ + 1) extra requests, and a part of one client instance
        being isolated is dropped whole."""
        if endpoint in read.spec.bad:
            return None
        size, bad, poisoned = read.root[endpoint]
        limit = self.s.size_limit[endpoint]
        if (bad >= 3 or poisoned or (limit is not None and size > limit and (bad or size > 4 * limit))
                or (self.s.dlq and self.s.poison_after_s and read.failed)):
            return None
        return (f"it is not refused by {self.name(endpoint)} but its last request there was, and it was not sent "
                f"again (its batch of {size} records held {bad} refused one(s): the splitting goes down to them)")

    def refresh(self, read: _Read) -> None:
        if read.rid in self.unfinished and self.problem(read) is None:
            del self.unfinished[read.rid]
            self.unfinished_bytes -= len(read.value)

    def held_back(self, down: int, before: float) -> str | None:
        """Commit: "Each endpoint has its own export threads (`concurrency`), so one that is down never holds back
        deliveries to the others". A record of a partition owned, read before `before`, that has not reached an
        endpoint up (hash: its own, when it is known), while `down` is down."""
        for read in self.reads.values():
            partition = read.spec.partition
            if (partition not in self.assigned or read.epoch != self.epoch[partition] or read.spec.undecodable
                    or self.read_at[read.rid] >= before):
                continue
            for endpoint in self.routes_of(read) or ():
                last = read.last.get(endpoint)
                set_aside = last == "split" or last == "retry" and read.letters[FAILING]
                if endpoint != down and endpoint not in read.accepted and not set_aside:
                    late = time.monotonic() - self.read_at[read.rid]
                    return (f"{read} has not reached {self.name(endpoint)} {late:.2f}s after it was read, "
                            f"while {self.name(down)} is down (one endpoint down never holds back "
                            "deliveries to the others)")
        return None

    def calm(self) -> bool:
        """Every collector up and taking the credentials, the dead-letter topic writing, no record failing: the
        exports of what was read end at once."""
        return (all(c.mode in ("up", "slow") for c in self.collectors) and not self.dlq_failing
                and (self.healed or not any(r.spec.poison for r in self.unfinished.values())))

    def waiting(self) -> list[int]:
        """The reads (of each partition's latest assignment) not exported or dead-lettered, by read order."""
        return sorted(r.rid for r in self.reads.values() if r.epoch == self.epoch[r.spec.partition] and self.problem(r))

    def exported_below(self, partition: int, waiting: list[int] | None = None) -> int:
        """The offset below which the partition's records (of this assignment) were all exported or dead-lettered,
        and so were the other records of their batches. "A batch ... counts as exported when each accepted it": a
        batch is read in one run of at most `max_points` records (one point or more each), so a record counts as
        exported once every record read that close to it is."""
        epoch, span = self.epoch[partition], self.s.max_points
        waiting = sorted(self.unfinished) if waiting is None else waiting
        for offset in range(self.committed.get(partition, 0), self.position[partition]):
            read = self.by_offset[partition, epoch, offset]
            near = bisect.bisect_left(waiting, read.rid - span + 1)
            if near < len(waiting) and waiting[near] < read.rid + span:
                return offset
        return self.position[partition]

    # -- the consumer's side (the bridge's consuming thread) --
    def fetch(self, member: object, paused: set[int], most: int, rng: random.Random) -> list[Record]:
        with self.lock:
            self._check_budget()
            records: list[Record] = []
            if self.member is not member:
                return records
            for partition in rng.sample(sorted(self.assigned - paused), len(self.assigned - paused)):
                while len(records) < most and self.position[partition] < len(self.topic[partition]):
                    records.append(self._read(partition))
                    if rng.random() < 0.3:
                        break
            return records

    def _read(self, partition: int) -> Record:
        offset = self.position[partition]
        self.position[partition] = offset + 1
        spec, rid = self.topic[partition][offset], len(self.reads)
        data = MetricsData()
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.add(key=READ_ATTRIBUTE).value.string_value = str(rid)
        if spec.pad:
            resource_metrics.resource.attributes.add(key="pad").value.string_value = "x" * spec.pad
        metric = resource_metrics.scope_metrics.add().metrics.add(name="model.offset")
        for point in range(spec.points):
            metric.gauge.data_points.add(time_unix_nano=1_700_000_000 * 10**9 + point, as_int=offset)
        value = data.SerializeToString()
        if spec.undecodable:
            value = b"\xff not a payload " + str(rid).encode()
        value, headers = contract.encode(value, attributes={"client_instance_id": spec.client} if spec.client else {})
        read = _Read(rid, spec, offset, self.epoch[partition], spec.key, value, headers)
        self.reads[rid] = self.by_offset[partition, read.epoch, offset] = self.by_value[value] = read
        self.largest = max(self.largest, len(value))
        self.read_at[rid] = time.monotonic()
        self.unfinished[rid] = read
        self.unfinished_bytes += len(value)
        self.refresh(read)
        return Record(TOPIC, partition, offset, spec.key, value, headers)

    def _check_budget(self) -> None:
        """Endpoint down: "when more than max_inflight_bytes await export the bridge stops taking records and
        resumes at half"; "Fetches are sized to the remaining budget". What was read and is not finished: what awaits
        export (at most the budget and the record that crossed it) plus one fetch sized to the rest of the budget."""
        self.most_unfinished = max(self.most_unfinished, self.unfinished_bytes)
        bound = 2 * self.s.max_inflight + 4 * self.largest
        if self.unfinished_bytes > bound and not self.budget_told:
            self.budget_told = True
            self.violation(f"{self.unfinished_bytes} bytes read and not yet exported or dead-lettered when the bridge "
                           f"polled again (max_inflight_bytes {self.s.max_inflight}, bound {bound})")

    def assign(self, member: object, partitions: set[int]) -> list[int]:
        with self.lock:
            if self.member is not member:
                return []
            taken = sorted(partitions - self.assigned)
            for partition in taken:
                self.epoch[partition] = self.epoch.get(partition, 0) + 1
                self.position[partition] = self.committed.get(partition, 0)
                self.assigned.add(partition)
            return taken

    def revoke_started(self, member: object, partitions: set[int]) -> tuple[dict[int, int], bool]:
        with self.lock:
            if self.member is not member:
                return {}, False
            self.revoking |= partitions & self.assigned
            return {p: self.exported_below(p) for p in partitions & self.assigned}, self.calm()

    def revoke_ended(self, exported: dict[int, int], check: bool, calm: bool) -> None:
        """Rebalance: "waits up to revoke_timeout_s for those partitions' exports, commits what was exported and
        forgets the rest": at least what was exported when it began, and when nothing failed meanwhile (their exports
        ended within the wait), what was exported when it ended."""
        with self.lock:
            now = time.monotonic()
            if check and calm and self.calm():
                exported = {p: self.exported_below(p) for p in exported}
            for partition in exported:
                if check and self.committed.get(partition, 0) < exported[partition]:
                    self.violation(f"the revoke of partition {partition} committed {self.committed.get(partition, 0)}"
                                   f", not what was exported before it began: everything below {exported[partition]}")
                self.revoked_at[partition, self.epoch[partition]] = now
                self.assigned.discard(partition)
                self.revoking.discard(partition)
                for rid in [rid for rid, r in self.unfinished.items() if r.spec.partition == partition]:
                    self.unfinished_bytes -= len(self.unfinished.pop(rid).value)

    def commit(self, member: object, positions: dict) -> None:
        """Commit: "per partition, the offset of the first record not yet exported or dead-lettered"."""
        with self.lock:
            for (topic, partition), offset in positions.items():
                owned = self.member is member and (partition in self.assigned or partition in self.revoking)
                if topic != TOPIC or not owned:
                    self.violation(f"committed {topic}/{partition}@{offset} without owning the partition")
                    continue
                before = self.committed.get(partition, 0)
                if offset < before:
                    self.violation(f"the commit of partition {partition} went back from {before} to {offset}")
                for at in range(before, offset):
                    read = self.by_offset.get((partition, self.epoch[partition], at))
                    why = "it was not read in this assignment" if read is None else self.problem(read)
                    if why:
                        self.violation(f"committed {partition}@{offset} past {read or f'offset {at}'}: {why}")
                        break
                self.committed[partition] = offset

    # -- the collectors' side (export threads) --
    def call_started(self, endpoint: int, reads: list[_Read]) -> int:
        with self.lock:
            self.calls += 1
            call, now = self.calls, time.monotonic()
            if now > self.deadline() + ON_ITS_WAY_S:
                self.violation(f"an export to {self.name(endpoint)} started {now - self.deadline():.3f}s after the "
                               "shutdown deadline (after it, no export or split request is started)")
            bad = sum(1 for r in reads if endpoint in r.spec.bad)
            poisoned = any(endpoint in r.spec.poison for r in reads)
            holding = set()
            for read in reads:
                revoked = self.revoked_at.get((read.spec.partition, read.epoch))
                if revoked is not None and now - revoked > ON_ITS_WAY_S:
                    self.violation(f"{read} was sent to {self.name(endpoint)} {now - revoked:.3f}s after its partition "
                                   "was revoked (exports of the forgotten records stop)")
                if self.s.routing == "hash":
                    route = self.routes.setdefault(read.spec.group, endpoint)
                    if route != endpoint:
                        self.violation(f"hash routing sent client {read.spec.group} to {self.name(endpoint)} and to "
                                       f"{self.name(route)}")
                read.sent.add(endpoint)
                read.root.setdefault(endpoint, (len(reads), bad, poisoned))
                if read.spec.group is not None and revoked is None:
                    holding.add((read.spec.group, read.spec.partition, read.epoch))
            for other, held in self.in_flight[endpoint].items():
                if held & holding:
                    self.violation(f"two requests holding client {sorted(held & holding)[0][0]} were out to "
                                   f"{self.name(endpoint)} at once (Order: a batch sharing a client instance with an "
                                   "export not yet ended is sent once that one is delivered or given up)")
            self.in_flight[endpoint][call] = frozenset(holding)
            return call

    def call_ended(self, endpoint: int, call: int, reads: list[_Read], outcome: str) -> None:
        with self.lock:
            now = time.monotonic()
            del self.in_flight[endpoint][call]
            for read in reads:
                read.last[endpoint] = outcome
                if outcome == "retry":
                    read.failed.add(endpoint)
                    self._failed(endpoint, read, now)
                elif outcome == "split":
                    read.split_at.add(endpoint)
                elif outcome == "accept":
                    self._accepted(endpoint, read)
                self.refresh(read)
            if outcome == "accept":
                self.delivered_at[endpoint] = now

    def _failed(self, endpoint: int, read: _Read, now: float) -> None:
        """Order: a failure counts against a client when it "followed a delivery of other data (one since their
        failure before the previous)"; counted generously (the bridge sees each a little later than this)."""
        failed, fresh, since, _ = read.trail.setdefault(endpoint, [[], 0, None, False])
        followed = bool(failed) and self.delivered_at[endpoint] > failed[0] - 0.01
        failed[:] = (failed + [now])[-2:]
        read.trail[endpoint][1:] = [fresh + followed, since if since is not None or not followed else now, followed]

    def _accepted(self, endpoint: int, read: _Read) -> None:
        if endpoint in read.accepted:
            self.violation(f"{read} was delivered to {self.name(endpoint)} twice (retries and partial successes do "
                           "not send again what was delivered)")
        read.accepted.add(endpoint)
        if read.spec.group is None:
            return   # "Records with neither header nor key are not ordered"
        key = (endpoint, read.spec.group, read.spec.partition, read.epoch)
        latest = self.order.get(key, -1)
        if read.offset < latest:
            self.violation(f"{read} reached {self.name(endpoint)} after offset {latest} of the same client (Order: "
                           "each client instance's records reach a collector in the order they were read)")
        self.order[key] = max(latest, read.offset)

    def decide(self, collector: _Collector, reads: list[_Read]) -> tuple[str, grpc.RpcError | None, int]:
        """What the collector answers: (outcome, the error raised, points rejected)."""
        with self.lock:
            endpoint, mode, rng = collector.index, collector.mode, collector.rng
            if mode == "down":
                return "retry", _Refusal(grpc.StatusCode.UNAVAILABLE, "connection refused"), 0
            if mode == "auth":
                outcome = "retry" if self.s.retry_auth[endpoint] else "auth"
                return outcome, _Refusal(grpc.StatusCode.UNAUTHENTICATED, "bad token"), 0
            if mode == "flaky" and rng.random() < 0.4:
                code = rng.choice([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                   grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED])
                return "retry", _Refusal(code, "flaky", retry_after_s=0.003), 0
            if any(endpoint in r.spec.bad for r in reads):
                return "split", _Refusal(grpc.StatusCode.INVALID_ARGUMENT, "invalid metric"), 0
            if not self.healed and any(endpoint in r.spec.poison for r in reads):
                return "retry", _Refusal(grpc.StatusCode.UNAVAILABLE, "collector bug"), 0
            limit = self.s.size_limit[endpoint]
            if limit is not None and len(reads) > limit:
                return "split", _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "message larger than max"), 0
            if rng.random() < self.s.partial[endpoint]:
                return "accept", None, 1
            return "accept", None, 0

    # -- the dead-letter producer's side (the consuming thread) --
    def letter(self, topic: str, record: Record, reason: str) -> bool:
        with self.lock:
            if self.dlq_failing:
                return False
            read = self.by_value.get(record.value)
            if topic != DLQ_TOPIC or read is None:
                self.violation(f"a dead letter to {topic} of a record never read: {record.value[:40]!r}")
                return True
            if (record.key, record.headers) != (read.key, read.headers):
                self.violation(f"the dead letter of {read} is not the record as it was read")
            read.letters[reason] += 1
            if read.spec.undecodable:
                if reason in (REFUSED, FAILING) or sum(read.letters.values()) > 1:
                    self.violation(f"undecodable {read} dead-lettered with {dict(read.letters)}")
            elif reason == REFUSED and read.letters[reason] > len(read.split_at):
                self.violation(f"{read} dead-lettered as {REFUSED} {read.letters[reason]} times, refused (as invalid "
                               f"or too large) by {len(read.split_at)} endpoint(s)")
            elif reason == FAILING and (read.letters[reason] > len(read.failed) or not self._poisoned(read)):
                self.violation(f"{read} dead-lettered as {FAILING} ({read.letters[reason]} letters), failed "
                               f"retryably by {len(read.failed)} endpoint(s), trails {read.trail}: only when 20 of "
                               "their failed attempts each followed a delivery of other data, over at least "
                               f"poison_after_s ({self.s.poison_after_s}), the latest one too")
            elif reason not in (REFUSED, FAILING):
                self.violation(f"{read}, which decodes, dead-lettered as {reason}")
            self.refresh(read)
            return True


    def _poisoned(self, read: _Read) -> bool:
        return any(fresh >= 20 and latest and failed[-1] - since >= self.s.poison_after_s - 0.01
                   for failed, fresh, since, latest in read.trail.values()) and bool(self.s.poison_after_s)


class _Refusal(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> None:
        super().__init__(details)
        self._code, self._details, self._trailing = code, details, ()
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after_s is not None:   # retryable: it says when
            info = error_details_pb2.RetryInfo()
            info.retry_delay.FromNanoseconds(int(retry_after_s * 1e9))
            status = status_pb2.Status(code=code.value[0], message=details)
            status.details.add().Pack(info)
            self._trailing = (("grpc-status-details-bin", status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._trailing


class _Collector:
    """One collector: the gRPC call of the bridge's real Endpoint, answered in-process."""

    def __init__(self, world: _World, index: int, seed: int) -> None:
        self.world, self.index = world, index
        self.rng = random.Random(seed * 31 + index)
        self.mode = "up"

    def __call__(self, request: bytes, timeout=None, metadata=None, compression=None) -> ExportMetricsServiceResponse:
        world = self.world
        if not request:   # the empty request: whether the collector is up and takes the credentials
            if self.mode in ("down", "auth"):
                raise _Refusal(grpc.StatusCode.UNAVAILABLE if self.mode == "down" else grpc.StatusCode.UNAUTHENTICATED,
                               "no")
            return ExportMetricsServiceResponse()
        rids = [int(next(a.value.string_value for a in rm.resource.attributes if a.key == READ_ATTRIBUTE))
                for rm in ExportMetricsServiceRequest.FromString(request).resource_metrics]
        reads = [world.reads[rid] for rid in rids]
        call = world.call_started(self.index, reads)
        if self.mode == "slow":   # takes everything, each request 80 ms after it came
            time.sleep(0.08)
        elif self.rng.random() < 0.3:
            time.sleep(self.rng.random() * 0.002)   # a request takes a while: exports side by side overlap
        outcome, error, rejected = world.decide(self, reads)
        world.call_ended(self.index, call, reads, outcome)
        if error is not None:
            raise error
        return ExportMetricsServiceResponse(partial_success=ExportMetricsPartialSuccess(
            rejected_data_points=rejected, error_message="one point too old" if rejected else ""))


class _DeadLetters:
    def __init__(self, world: _World) -> None:
        self.world = world

    def send(self, topic, record, reason, on_done) -> None:
        on_done(self.world.letter(topic, record, reason))

    def flush(self, timeout_s) -> None:
        pass

    def close(self, timeout_s) -> None:
        pass


class _Member:
    """The bridge's consumer: one group member. Rebalances the driver asks for happen inside `poll`, as the Kafka
    clients call their callbacks; closing it revokes what it holds, as confluent-kafka's close does."""

    def __init__(self, world: _World, on_assign, on_revoke, check_revokes: bool) -> None:
        self.world, self.on_assign, self.on_revoke = world, on_assign, on_revoke
        self.check_revokes = check_revokes
        self.rng = random.Random(world.s.seed)
        self.paused: set[int] = set()
        self.ops: list[tuple[str, set[int], threading.Event]] = []
        self.ops_lock = threading.Lock()
        with world.lock:
            world.member = self
        self.first = self.ask("assign", set(range(world.s.partitions)))

    def ask(self, kind: str, partitions: set[int]) -> threading.Event:
        done = threading.Event()
        with self.ops_lock:
            self.ops.append((kind, partitions, done))
        return done

    def _rebalance(self) -> None:
        with self.ops_lock:
            ops, self.ops = self.ops, []
        for kind, partitions, done in ops:
            if kind == "assign":
                taken = self.world.assign(self, partitions)
                if taken:
                    self.on_assign([(TOPIC, p) for p in taken])
            else:
                self._revoke(partitions, check=self.check_revokes)
            done.set()

    def _revoke(self, partitions: set[int], check: bool) -> None:
        exported, calm = self.world.revoke_started(self, partitions)
        if exported:
            started = time.monotonic()
            self.on_revoke([(TOPIC, p) for p in sorted(exported)])
            # Ended well within revoke_timeout_s: the wait saw those partitions' exports end.
            ended = time.monotonic() - started < self.world.s.revoke_timeout_s - 0.1
            self.world.revoke_ended(exported, check, calm and ended)

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        self._rebalance()
        records = self.world.fetch(self, self.paused, max_records, self.rng)
        if not records:
            time.sleep(min(timeout_s, 0.005))
        return records

    def check(self, timeout_s, stop=None) -> None:
        pass

    def commit(self, positions) -> None:
        self.world.commit(self, dict(positions))

    def pause(self, partitions) -> None:
        self.paused |= {p for _, p in partitions}

    def resume(self, partitions) -> None:
        self.paused -= {p for _, p in partitions}

    def assignment(self) -> list[tuple[str, int]]:
        with self.world.lock:
            return [(TOPIC, p) for p in sorted(self.world.assigned)] if self.world.member is self else []

    def high_watermarks(self, partitions, ask_s=0.0) -> dict:
        with self.world.lock:
            return {(t, p): len(self.world.topic[p]) for t, p in partitions}

    def close(self) -> None:
        with self.world.lock:
            held = set(self.world.assigned) if self.world.member is self else set()
        self._revoke(held, check=False)   # within the shutdown's deadline, checked by the driver
        with self.world.lock:
            if self.world.member is self:
                self.world.member = None


# -- the driver ------------------------------------------------------------------------------------------------------

class _Running:
    """One `Bridge.run()` on its own thread, its endpoints' gRPC calls answered by the world's collectors."""

    def __init__(self, world: _World, config, collectors: list[_Collector]) -> None:
        self.world = world
        self.bridge = Bridge(config)
        for endpoint, collector in zip(self.bridge._endpoints, collectors):
            endpoint._call = collector
        self.outcome: list[object] = []
        with world.lock:
            world.deadline = lambda: self.bridge._drain_deadline
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"bridge-model-{world.s.seed}")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome.append(self.bridge.run())
        except BaseException as error:   # reported by the driver, with the seed and step
            self.outcome.append(error)

    def stop(self, at_once: bool) -> None:
        """SIGTERM (or a second Ctrl-C): "stop fetching, export the open batch, wait up to shutdown_timeout_s,
        commit, exit 0"; with everything exported by then, everything exported is committed."""
        world = self.world
        with world.lock:
            member = world.member
            exported = {p: world.exported_below(p) for p in world.assigned} if member is not None else {}
            calm = world.calm()
        stopped = time.monotonic()
        self.bridge.stop(at_once=at_once)
        self.thread.join(world.s.shutdown_timeout_s + 10)
        took = time.monotonic() - stopped
        if self.thread.is_alive():
            world.violation(f"the bridge did not stop within shutdown_timeout_s ({world.s.shutdown_timeout_s}) + 10 s")
            return
        if self.outcome != [0]:
            world.violation(f"run() ended with {self.outcome!r}, not 0")
        if at_once or world.s.shutdown_timeout_s < 1:
            return
        with world.lock:
            # Nothing failing, and the drain ended well before its deadline: the exports out (the open batch's too)
            # all ended before its commit.
            if calm and world.calm() and took < world.s.shutdown_timeout_s - 0.2:
                waiting = world.waiting()
                exported = {p: world.exported_below(p, waiting) for p in exported}
                if world.s.max_inflight >= 1 << 20:   # a budget nothing waits for: everything read was taken
                    for read in world.reads.values():
                        if read.spec.partition in exported and read.epoch == world.epoch[read.spec.partition] and (
                                why := world.problem(read)):
                            world.violation(f"after a shutdown with every collector up, {read} was read but not "
                                            f"exported (the open batch is exported at SIGTERM): {why}")
                            break
            for partition, offset in exported.items():
                if world.committed.get(partition, 0) < offset:
                    world.violation(f"the shutdown committed {world.committed.get(partition, 0)} on partition "
                                    f"{partition}, not what was exported before it began: everything below {offset}")


def _run_scenario(seed: int, tmp_path, monkeypatch) -> _World:
    s = _scenario(seed)
    world = _World(s)
    collectors = world.collectors = [_Collector(world, e, seed) for e in range(s.endpoints)]
    letters = _DeadLetters(world)
    members: list[_Member] = []

    def open_consumer(backend, settings, tuning, group_id, topics, on_assign, on_revoke):
        members.append(_Member(world, on_assign, on_revoke, check_revokes=s.revoke_timeout_s >= 0.3))
        return members[-1]

    monkeypatch.setattr(pipeline, "open_consumer", open_consumer)
    monkeypatch.setattr(pipeline, "open_dead_letter_producer", lambda backend, settings: letters)
    monkeypatch.setattr(pipeline, "check_reachable", lambda *args, **kwargs: None)
    # Dead-letter retries and the client-side pause, as the docs describe them but sooner.
    monkeypatch.setattr(pipeline, "KAFKA_RETRY", RetryPolicy(initial_backoff_s=0.002, max_backoff_s=0.01))
    monkeypatch.setattr(pipeline, "_CLIENT_PAUSE_AFTER_S", 0.05)
    tune_interpreter()

    overrides = {("routing",): s.routing, ("batch", "max_points"): s.max_points, ("batch", "max_bytes"): s.max_bytes,
                 ("batch", "linger_ms"): s.linger_ms, ("retry", "initial_backoff_s"): 0.002,
                 ("retry", "max_backoff_s"): 0.01, ("delivery", "max_inflight_bytes"): s.max_inflight,
                 ("delivery", "commit_interval_s"): 0.02, ("delivery", "revoke_timeout_s"): s.revoke_timeout_s,
                 ("delivery", "shutdown_timeout_s"): s.shutdown_timeout_s,
                 ("delivery", "poison_after_s"): s.poison_after_s}
    if s.dlq:
        overrides[("delivery", "dead_letter_topic")] = DLQ_TOPIC
    config = _config(tmp_path, "127.0.0.1:9", TOPIC, [f"collector-{e}.model:4317" for e in range(s.endpoints)],
                     "confluent-kafka", overrides)
    config = dataclasses.replace(config, endpoints=[
        dataclasses.replace(e, concurrency=c, retry_refused_credentials=a)
        for e, c, a in zip(config.endpoints, s.concurrency, s.retry_auth)])

    def settle(done: threading.Event, what: str, bridge: _Running | None = None) -> None:
        deadline = time.monotonic() + s.revoke_timeout_s + 5
        while not done.wait(0.01):
            if not (bridge or running).thread.is_alive() or time.monotonic() > deadline:
                world.violation(f"{what} was not carried out by the bridge's next polls within 5 s")
                return

    def start() -> _Running:
        started = _Running(world, config, collectors)
        deadline = time.monotonic() + 5
        while len(members) < restarts + 1 and started.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if len(members) < restarts + 1:
            world.violation(f"the bridge opened no consumer within 5 s ({started.outcome})")
            return started
        settle(members[-1].first, "the first assignment", started)
        return started

    world.produce(s.backlog)
    world.dlq_failing = s.dlq_failing
    restarts = 0
    running = start()
    try:
        for number, step in enumerate(s.steps):
            args = [f"{len(a)} records" if isinstance(a, list) else sorted(a) if isinstance(a, frozenset) else a
                    for a in step[1:]]
            world.step = f"{number} ({step[0]} {', '.join(map(str, args))})"
            kind = step[0]
            if kind == "produce":
                world.produce(step[1])
            elif kind == "mode":
                with world.lock:
                    collectors[step[1]].mode = step[2]
            elif kind == "dlq":
                with world.lock:
                    world.dlq_failing = step[1] == "failing"
            elif kind in ("revoke", "assign") and members:
                settle(members[-1].ask(kind, set(step[1])), f"{kind} {sorted(step[1])}")
            elif kind == "restart":
                running.stop(at_once=step[1])
                if world.violations:
                    break
                restarts += 1
                running = start()
            else:   # the clients' pushes arrive spread over the wait
                for spec in step[2]:
                    time.sleep(step[1] / (len(step[2]) + 1))
                    world.produce([spec])
                time.sleep(step[1] / (len(step[2]) + 1))
            time.sleep(0.01)
            if world.violations:
                break

        world.step = "final (the failures end)"
        with world.lock:
            for collector in collectors:
                collector.mode = "up"
            world.dlq_failing = False
        if not world.violations and members:
            settle(members[-1].ask("assign", set(range(s.partitions))), "assign all")
        if s.tail and not world.violations:
            world.step = "final (the records failing at the collectors go on failing while other data flows)"
            for spec in s.tail:
                world.produce([spec])
                time.sleep(0.012)
            world.step = "final (the failures ended)"
        with world.lock:
            world.healed = True
        if s.aside and not world.violations and members:
            world.step = "final (one collector down, the others up, pushes arriving)"
            with world.lock:
                collectors[0].mode = "down"
            for spec in s.aside:
                world.produce([spec])
                time.sleep(0.01)
            time.sleep(0.3)
            with world.lock:
                why = world.held_back(0, time.monotonic() - 0.3)
                if why:
                    world.violation(why)
                collectors[0].mode = "up"
            world.step = "final (the failures ended)"
        if not world.violations and members:
            deadline = time.monotonic() + FINAL_WAIT_S
            while time.monotonic() < deadline and running.thread.is_alive():
                with world.lock:
                    done = all(world.committed.get(p, 0) == len(world.topic[p]) for p in range(s.partitions))
                if done:
                    break
                time.sleep(0.02)
            else:
                with world.lock:
                    behind = {p: (world.committed.get(p, 0), len(world.topic[p])) for p in range(s.partitions)
                              if world.committed.get(p, 0) != len(world.topic[p])}
                    stuck = [f"{r}: {world.problem(r)}" for r in list(world.unfinished.values())[:3]]
                world.violation(f"after the failures ended, not everything was committed within {FINAL_WAIT_S}s "
                                f"(partition: (committed, end) {behind}; unfinished {stuck})")
        world.step = "final shutdown (SIGTERM while the last pushes are read and exported)"
        if not world.violations:
            with world.lock:   # the exports still out when the signal comes
                for collector in collectors:
                    collector.mode = "slow"
            world.produce(s.burst)
            time.sleep(s.burst_s)
        running.stop(at_once=False)
    finally:
        if running.thread.is_alive():
            running.bridge.stop(at_once=True)
            running.thread.join(30)
    return world


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(SCENARIOS))
def test_random_scenarios_keep_the_documented_delivery_commit_and_order_promises(seed, tmp_path, monkeypatch,
                                                                                   caplog):
    caplog.set_level(logging.CRITICAL, logger="kcm")   # each retry is a WARNING: thousands of lines per scenario
    world = _run_scenario(seed, tmp_path, monkeypatch)
    assert not world.violations, "\n".join([f"scenario: {world.s.describe()}", *world.violations])
    assert world.calls > 0
