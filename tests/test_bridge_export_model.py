"""Model-based test of the bridge's OTLP/gRPC export: seeded random workloads through the real `Bridge.run` (its
consuming loop, batching, routing and export threads, and kcm_common's `Endpoint` retry loop) to real OTLP/gRPC
fake collectors on loopback, each behind a byte-counting proxy and answering from a seeded script of OK, retryable
codes, RESOURCE_EXHAUSTED with a RetryInfo, partial success and permanent codes. Only the Kafka consumer and the
dead-letter producer are fakes.

Every call each collector received is checked against a reference written from docs/bridge.md ("## Delivery":
Export, Routing, Balancing within an endpoint, Order; "## Full example configuration": batch, retry, compression;
"## Metrics and probes"), not from the code:
- Batching: no request above `batch.max_points` points or `batch.max_bytes` bytes but a lone record; a batch not
  full (the next record would have fitted) is sent only once `linger_ms` have passed since it opened, and no later
  than about `linger_ms` after (or after the export before it on the endpoint's one thread).
- Routing: `fanout` gives every endpoint every record, once, in the order read, in the same batches; `hash` gives
  each client instance (its `client_instance_id` header, else its key) one endpoint, records with neither all one
  endpoint, and adding or removing an endpoint moves only the instances it takes or had (a third from two to three).
- Retries: only CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS and RESOURCE_EXHAUSTED
  with a RetryInfo are retried, the same request again; each wait is the exponential backoff with jitter
  (`initial_backoff_s · multiplier^(k-1)`, less at most `jitter` of it), never below a RetryInfo delay, and never
  above `max_backoff_s`; UNAUTHENTICATED and PERMISSION_DENIED too with `retry_refused_credentials: true`. Partial
  success is not retried; other codes are not retried and the batch is dropped (committed, never dead-lettered),
  logged with its code once per batch, saying what to check where the docs say so.
  INVALID_ARGUMENT / RESOURCE_EXHAUSTED without RetryInfo split the batch in halves, within 4·(⌊log2 n⌋ + 1) extra
  requests, down to the records refused.
- An endpoint sends `concurrency` exports at once, no more; an open batch holding the whole in-flight budget is sent
  at once, not after its `linger_ms`.
- `compression: gzip` shrinks what goes over the wire; `none` sends it as it is. `balancing: round_robin` spreads an
  endpoint's exports over the addresses of its name, `pick_first` keeps them on one.
- Metrics: `kcm_bridge_points_exported_total` and `kcm_bridge_points_rejected_total` (partial success) per endpoint,
  `kcm_bridge_export_failures_total{code}` for every failed attempt, `kcm_bridge_export_retries_total` for every
  retried one, `kcm_bridge_export_seconds` once per request, including its retries.

A failure names its seed: `_run(seed, tmp_path, monkeypatch, caplog)` replays the workload (threads interleave
differently).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_bridge import pipeline
from kcm_bridge.consumer import Record
from kcm_bridge.pipeline import Bridge
from kcm_common import contract
from fake_collector import FakeCollector, data_point_count
from ports import CountingProxy
import test_bridge_export
from test_bridge_pipeline import _config

TOPIC = "metrics"
DLQ_TOPIC = "metrics-dlq"
SEEDS = range(16)
ID_ATTRIBUTE = "kcm.model.id"
# docs/bridge.md, Delivery/Export: the codes retried; RESOURCE_EXHAUSTED only with a RetryInfo (a "throttle" here).
RETRYABLE = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                       grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})
# Codes that are neither retried nor split on (INVALID_ARGUMENT and RESOURCE_EXHAUSTED split the batch: own tests).
PERMANENT = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INTERNAL,
             grpc.StatusCode.UNKNOWN, grpc.StatusCode.ALREADY_EXISTS)
# "Other codes are not retried: the batch is dropped ...; a batch failed with INTERNAL, UNKNOWN or FAILED_PRECONDITION
# never reaches a dead_letter_topic (the refusals split below and failing-at-collector do)": none of these does.
NOT_DEAD_LETTERED = frozenset(code.name for code in PERMANENT)
CREDENTIALS = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})   # "the log line says whether they [headers] changed"
# "logged, with what to check for UNIMPLEMENTED, UNAUTHENTICATED, PERMISSION_DENIED and RESOURCE_EXHAUSTED".
HINTED = frozenset({"UNIMPLEMENTED", *CREDENTIALS})
EARLY_S = 0.005      # a wait measured this much short of its bound (clock steps, the call's own time) is not early
LATE_S = 0.5         # a busy machine's scheduling on top of a wait's upper bound
SETTLE_S = 15.0


# -- the workload, as data ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    """A record to produce: its client instance header, key, points and padding (bytes)."""

    partition: int
    client: str | None
    key: bytes | None
    points: int
    pad: int

    @property
    def instance(self) -> str | None:
        """Its client instance as the docs define it: the client_instance_id header, or its key; None: neither."""
        if self.client is not None:
            return self.client
        return None if self.key is None else "key:" + self.key.decode()


@dataclass(frozen=True)
class _Answer:
    kind: str                         # ok, retry (a retryable code), throttle (RetryInfo), partial, permanent
    code: grpc.StatusCode | None = None
    delay_s: float = 0.0
    rejected: int = 0

    @property
    def code_name(self) -> str | None:
        if self.kind == "throttle":
            return "RESOURCE_EXHAUSTED"
        return self.code.name if self.code is not None else None

    @property
    def failed(self) -> bool:
        return self.kind in ("retry", "throttle", "permanent")

    @property
    def retried(self) -> bool:
        return self.kind in ("retry", "throttle")


OK = _Answer("ok")


@dataclass
class _Workload:
    seed: int
    partitions: int
    endpoints: int
    routing: str
    compression: list[str]
    scripts: list[list[_Answer]]
    max_points: int
    max_bytes: int
    linger_ms: int
    initial_s: float
    max_backoff_s: float
    multiplier: float
    jitter: float
    dlq: bool
    backlog: list[_Spec]
    live: list[tuple[float, _Spec]]    # (gap before it, record) produced while the bridge runs
    retry_auth: list[bool] = field(default_factory=list)   # endpoints' retry_refused_credentials

    def retried(self, answer: _Answer, endpoint: int) -> bool:
        """Whether the export retries after `answer`: a retryable code or a RetryInfo, and with
        `retry_refused_credentials: true` UNAUTHENTICATED and PERMISSION_DENIED too ("retried with backoff")."""
        return answer.retried or (self.retry_auth[endpoint] and answer.code_name in CREDENTIALS)

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.endpoints} endpoints ({self.routing}, compression {self.compression}), "
                f"{self.partitions} partitions, max_points {self.max_points}, max_bytes {self.max_bytes}, linger_ms "
                f"{self.linger_ms}, retry {self.initial_s}·{self.multiplier}^k ≤ {self.max_backoff_s} jitter "
                f"{self.jitter}, retry_refused_credentials {self.retry_auth}, dead letters {self.dlq}, "
                f"{len(self.backlog)} + {len(self.live)} records, scripts "
                f"{[[a.kind if a.code is None else a.code.name for a in s] for s in self.scripts]}")


def _workload(seed: int) -> _Workload:
    rng = random.Random(seed)
    partitions, endpoints = rng.randint(1, 3), rng.choice([1, 2, 2, 3])
    instances = [f"i{n}" for n in range(rng.randint(2, 8))]
    keys = [f"k{n}".encode() for n in range(rng.randint(0, 3))]

    def record() -> _Spec:
        kind = rng.random()
        if kind < 0.75 or (not keys and kind < 0.9):
            client = rng.choice(instances)
            client_key: tuple = (client, client.encode())
        elif kind < 0.9:
            client_key = (None, rng.choice(keys))
        else:
            client_key = (None, None)
        return _Spec(rng.randrange(partitions), *client_key, rng.randint(3, 12),
                     rng.choice([0, 400, 1200, 2500, 5000]))

    max_backoff_s = rng.choice([0.03, 0.08, 0.15])

    def answer() -> _Answer:
        kind = rng.choices(["ok", "retry", "throttle", "partial", "permanent"], [3, 3, 1.5, 1.5, 1.5])[0]
        if kind == "retry":
            return _Answer(kind, rng.choice(sorted(RETRYABLE, key=lambda c: c.name)))
        if kind == "throttle":   # a delay past the cap too: it is honoured only up to max_backoff_s
            return _Answer(kind, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           delay_s=rng.choice([0.0, max_backoff_s / 2, 2.0]))
        if kind == "partial":
            return _Answer(kind, rejected=rng.randint(0, 3))
        if kind == "permanent":
            return _Answer(kind, rng.choice(PERMANENT))
        return OK

    workload = _Workload(
        seed, partitions, endpoints, rng.choice(["fanout", "hash"]) if endpoints > 1 else "fanout",
        [rng.choice(["gzip", "none"]) for _ in range(endpoints)],
        [[answer() for _ in range(rng.randint(0, 10))] for _ in range(endpoints)],
        rng.randint(10, 60), rng.choice([1500, 6000, 20000, 2 * 1024 * 1024]), rng.choice([0, 20, 80, 150]),
        rng.choice([0.005, 0.01, 0.02]), max_backoff_s, rng.choice([1.0, 1.5, 2.0, 3.0]),
        rng.choice([0.0, 0.2, 0.5]), rng.random() < 0.4,
        [record() for _ in range(rng.randint(5, 60))],
        [(rng.choice([0.0, 0.0, 0.01, 0.04, 0.1]), record()) for _ in range(rng.randint(0, 20))])
    workload.retry_auth = [rng.random() < 0.3 for _ in range(endpoints)]
    return workload


# -- the fakes: Kafka consumer, dead-letter producer; the collectors are real gRPC servers ------------------------

class _Topic:
    """The metrics topic the bridge reads: its records, when each was handed to the bridge, what it committed."""

    def __init__(self, partitions: int) -> None:
        self.lock = threading.Lock()
        self.records: list[list[Record]] = [[] for _ in range(partitions)]
        self.specs: dict[int, _Spec] = {}
        self.position = [0] * partitions
        self.committed: dict[int, int] = {}
        self.handed: list[int] = []               # record ids in the order read
        self.handed_at: dict[int, float] = {}
        self.letters: list[tuple[str, Record, str]] = []
        self.rng = random.Random(partitions)

    def produce(self, spec: _Spec) -> int:
        with self.lock:
            rid = len(self.specs)
            self.specs[rid] = spec
            data = MetricsData()
            resource_metrics = data.resource_metrics.add()
            resource_metrics.resource.attributes.add(key=ID_ATTRIBUTE).value.string_value = str(rid)
            if spec.pad:
                resource_metrics.resource.attributes.add(key="pad").value.string_value = "x" * spec.pad
            metric = resource_metrics.scope_metrics.add().metrics.add(name="model.points")
            for point in range(spec.points):
                metric.gauge.data_points.add(time_unix_nano=1_700_000_000 * 10**9 + point, as_int=rid)
            value, headers = contract.encode(data, attributes={"client_instance_id": spec.client} if spec.client
                                             else {})
            offset = len(self.records[spec.partition])
            self.records[spec.partition].append(Record(TOPIC, spec.partition, offset, spec.key, value, headers))
            return rid

    def poll(self, most: int) -> list[Record]:
        with self.lock:
            taken: list[Record] = []
            for partition in self.rng.sample(range(len(self.records)), len(self.records)):
                while len(taken) < most and self.position[partition] < len(self.records[partition]):
                    taken.append(self.records[partition][self.position[partition]])
                    self.position[partition] += 1
            now = time.monotonic()
            for record in taken:
                rid = _record_id(record)
                self.handed.append(rid)
                self.handed_at[rid] = now
            return taken

    def all_committed(self) -> bool:
        with self.lock:
            return all(self.committed.get(p, 0) == len(records) for p, records in enumerate(self.records))


def _record_id(record: Record) -> int:
    data = MetricsData.FromString(contract.decode(record.value, record.headers).metrics.SerializeToString())
    return _rid(data.resource_metrics[0])


def _rid(resource_metrics) -> int:
    return int(next(a.value.string_value for a in resource_metrics.resource.attributes if a.key == ID_ATTRIBUTE))


class _Consumer:
    """The bridge's Kafka consumer: every partition assigned, records as the topic holds them."""

    def __init__(self, topic: _Topic) -> None:
        self.topic = topic

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        records = self.topic.poll(max_records)
        if not records:
            time.sleep(min(timeout_s, 0.005))
        return records

    def check(self, timeout_s, stop=None) -> None:
        pass

    def commit(self, positions) -> None:
        with self.topic.lock:
            for (_, partition), offset in positions.items():
                self.topic.committed[partition] = offset

    def pause(self, partitions) -> None:
        pass

    def resume(self, partitions) -> None:
        pass

    def assignment(self) -> list[tuple[str, int]]:
        return [(TOPIC, p) for p in range(len(self.topic.records))]

    def high_watermarks(self, partitions, ask_s=0.0) -> dict:
        with self.topic.lock:
            return {(t, p): len(self.topic.records[p]) for t, p in partitions}

    def close(self) -> None:
        pass


class _DeadLetters:
    def __init__(self, topic: _Topic) -> None:
        self.topic = topic

    def send(self, topic, record, reason, on_done) -> None:
        with self.topic.lock:
            self.topic.letters.append((topic, record, reason))
        on_done(True)

    def flush(self, timeout_s) -> None:
        pass

    def close(self, timeout_s) -> None:
        pass


@dataclass(frozen=True)
class _Call:
    at: float
    ids: tuple[int, ...]
    points: int
    size: int
    sizes: tuple[int, ...]   # each record's bytes in the request (what batch.max_bytes counts)
    answer: _Answer


class _Scripted(FakeCollector):
    """A fake collector answering its calls in turn from a script (then OK), recording every call, failed or not."""

    def __init__(self, script: list[_Answer], host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.script = deque(script)
        self.calls: list[_Call] = []
        self._one_at_a_time = threading.Lock()   # the queued fault is the one this call takes

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext):  # noqa: N802 (gRPC name)
        with self._one_at_a_time:
            answer = self.script.popleft() if self.script and request.resource_metrics else OK
            self.calls.append(_Call(time.monotonic(), tuple(_rid(rm) for rm in request.resource_metrics),
                                    data_point_count(request), request.ByteSize(),
                                    tuple(ExportMetricsServiceRequest(resource_metrics=[rm]).ByteSize()
                                          for rm in request.resource_metrics), answer))
            if answer.kind in ("retry", "permanent"):
                self.fail_next(answer.code, message=f"scripted {answer.code.name}")
            elif answer.kind == "throttle":
                self.throttle_next(answer.delay_s)
            elif answer.kind == "partial":
                self.reject_partially_next(answer.rejected, message="scripted partial rejection")
            return super().Export(request, context)


@dataclass
class _Run:
    workload: _Workload
    topic: _Topic
    collectors: list[_Scripted]
    names: list[str]
    proxies: list[CountingProxy]
    bridge: Bridge
    logs: list[logging.LogRecord] = field(default_factory=list)


def _bridge(tmp_path, monkeypatch, topic: _Topic, names: list[str], overrides: dict, dlq: bool = False,
            endpoint_options: list[dict] | None = None) -> Bridge:
    monkeypatch.setattr(pipeline, "open_consumer", lambda *args, **kwargs: _Consumer(topic))
    monkeypatch.setattr(pipeline, "open_dead_letter_producer", lambda backend, settings: _DeadLetters(topic))
    monkeypatch.setattr(pipeline, "check_reachable", lambda *args, **kwargs: None)
    values = {("delivery", "commit_interval_s"): 0.02, ("delivery", "poison_after_s"): 0,
              ("delivery", "max_inflight_bytes"): 64 * 1024 * 1024, **overrides}
    if dlq:
        values[("delivery", "dead_letter_topic")] = DLQ_TOPIC
    config = _config(tmp_path, "127.0.0.1:9", TOPIC, names, "confluent-kafka", values)
    options = endpoint_options or [{}] * len(names)
    config = dataclasses.replace(config, endpoints=[dataclasses.replace(e, **o)
                                                    for e, o in zip(config.endpoints, options)])
    return Bridge(config)


class _Running:
    """`bridge.run()` on a thread of its own."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge, self.result = bridge, []
        self.thread = threading.Thread(target=lambda: self.result.append(bridge.run()), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.bridge.stop()
        self.thread.join(20)
        assert not self.thread.is_alive(), "the bridge did not stop within 20 s"
        assert self.result == [0]


def _settle(topic: _Topic, running: _Running, seconds: float = SETTLE_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and running.thread.is_alive():
        if topic.all_committed():
            return True
        time.sleep(0.01)
    return topic.all_committed()


def _sample(bridge: Bridge, name: str, **labels: str) -> float:
    return bridge.metrics.registry.get_sample_value(name, labels) or 0.0


# -- the reference -------------------------------------------------------------------------------------------------

def _requests(calls: list[_Call]) -> list[list[_Call]]:
    """An endpoint's calls as requests (the attempts of each, in order), by first attempt: a retry sends the same
    records again, and no record is in two batches."""
    requests: dict[tuple[int, ...], list[_Call]] = {}
    for call in calls:
        requests.setdefault(call.ids, []).append(call)
    return list(requests.values())


def _wait_bounds(w: _Workload, failures: int, answer: _Answer) -> tuple[float, float]:
    """Retry: "exponential backoff with jitter, capped"; a RetryInfo delay "is honoured as the least wait, never
    shorter than the backoff, capped at retry.max_backoff_s"."""
    base = w.initial_s * w.multiplier ** (failures - 1)
    low, high = base * (1 - w.jitter), base
    if answer.kind == "throttle":
        low, high = max(low, answer.delay_s), max(high, answer.delay_s)
    return min(low, w.max_backoff_s), min(high, w.max_backoff_s)


def _check(run: _Run, enriched: dict[int, int]) -> list[str]:
    w, topic, problems = run.workload, run.topic, []

    def problem(text: str) -> None:
        if len(problems) < 20:
            problems.append(text)

    handed = list(topic.handed)
    specs = topic.specs
    per_endpoint = [_requests(c.calls) for c in run.collectors]

    for e, requests in enumerate(per_endpoint):
        name = run.names[e]
        failures: dict[str, int] = {}
        retries = exported = rejected = 0
        for request in requests:
            ids = request[0].ids
            for attempt, call in enumerate(request, 1):
                if call.answer.failed:
                    failures[call.answer.code_name] = failures.get(call.answer.code_name, 0) + 1
                if attempt < len(request):
                    if not w.retried(call.answer, e):
                        problem(f"{name}: request {ids[:5]}… was sent again after {call.answer} (not retryable)")
                        continue
                    retries += 1
                    low, high = _wait_bounds(w, attempt, call.answer)
                    gap = request[attempt].at - call.at
                    if not low - EARLY_S <= gap <= high + LATE_S:
                        problem(f"{name}: retry {attempt} of request {ids[:5]}… after {call.answer} came "
                                f"{gap:.3f}s after it, not within [{low:.3f}, {high:.3f}] s")
            last = request[-1].answer
            if w.retried(last, e):
                problem(f"{name}: request {ids[:5]}… failed with {last} and was never retried")
            if last.kind in ("ok", "partial"):
                points = request[-1].points
                taken = min(last.rejected, points)
                exported += points - taken
                rejected += taken
            for call in request:
                if len(ids) > 1 and (call.points > w.max_points or call.size > w.max_bytes):
                    problem(f"{name}: a request of {len(ids)} records held {call.points} points and {call.size} "
                            f"bytes (batch.max_points {w.max_points}, batch.max_bytes {w.max_bytes})")
                    break
        bridge = run.bridge
        for code in {*failures, *(a.code_name for a in w.scripts[e] if a.failed)}:
            counted = _sample(bridge, "kcm_bridge_export_failures_total", endpoint=name, code=code)
            if counted != failures.get(code, 0):
                problem(f"{name}: kcm_bridge_export_failures_total{{code={code}}} is {counted}, the collector "
                        f"failed {failures.get(code, 0)} attempts with it")
        for metric, expected in (("kcm_bridge_export_retries_total", retries),
                                 ("kcm_bridge_points_exported_total", exported),
                                 ("kcm_bridge_points_rejected_total", rejected),
                                 ("kcm_bridge_export_seconds_count", len(requests))):
            if _sample(bridge, metric, endpoint=name) != expected:
                problem(f"{name}: {metric} is {_sample(bridge, metric, endpoint=name)}, expected {expected}")
        buckets = [float(s.labels["le"]) for m in bridge.metrics.registry.collect() for s in m.samples
                   if s.name == "kcm_bridge_export_seconds_bucket" and s.labels.get("endpoint") == name]
        if requests and max((b for b in buckets if b != math.inf), default=0) < 300:
            problem(f"{name}: kcm_bridge_export_seconds buckets end at {sorted(buckets)[-2:]}, not up to 300 s")
        took = sum(request[-1].at - request[0].at for request in requests)
        if _sample(bridge, "kcm_bridge_export_seconds_sum", endpoint=name) < took - 0.01:
            problem(f"{name}: kcm_bridge_export_seconds_sum is below the {took:.3f}s the requests' retries took")

        # Logs: a refusal for good once per request with its code (credentials: headers read again); partial
        # success logged.
        lines = [r.getMessage() for r in run.logs if r.levelno >= logging.WARNING]
        for code in {a.code_name for a in w.scripts[e] if a.kind == "permanent" and not w.retried(a, e)}:
            refused = sum(1 for request in requests if request[-1].answer.kind == "permanent"
                          and request[-1].answer.code_name == code)
            said = [line for line in lines if name in line and code in line and "retrying" not in line]
            if len(said) != refused:
                problem(f"{name}: {refused} requests refused for good with {code}, {len(said)} lines say so")
            if code in CREDENTIALS and not all("headers" in line for line in said):
                problem(f"{name}: a refusal with {code} does not say what became of the headers: {said}")
            if code in HINTED and not all("check" in line or "?" in line for line in said):
                problem(f"{name}: a refusal with {code} does not say what to check: {said}")
        partials = sum(1 for request in requests if request[-1].answer.kind == "partial")
        said = [line for line in lines if name in line and "partial" in line]
        if len(said) != partials:
            problem(f"{name}: {partials} partial successes, {len(said)} lines say so")

    # Routing and order: which endpoint got which records, exactly once, in the order read.
    if w.routing == "fanout":
        routes = {rid: set(range(w.endpoints)) for rid in handed}
    else:
        owner: dict[str | None, set[int]] = {}
        for e, requests in enumerate(per_endpoint):
            for request in requests:
                for rid in request[0].ids:
                    owner.setdefault(specs[rid].instance, set()).add(e)
        for instance, endpoints in owner.items():
            if len(endpoints) > 1:
                problem(f"hash routing sent client instance {instance} (None: neither header nor key) to endpoints "
                        f"{sorted(endpoints)}")
        routes = {rid: owner.get(specs[rid].instance, set()) for rid in handed}
        for rid in handed:
            if not routes[rid]:
                problem(f"record {rid} (client instance {specs[rid].instance}) was sent to no endpoint")
    for e, requests in enumerate(per_endpoint):
        got = [rid for request in requests for rid in request[0].ids]
        expected = [rid for rid in handed if e in routes[rid]]
        if got != expected:
            problem(f"{run.names[e]} was sent records {got[:30]}…, not each of its records once in the order read "
                    f"{expected[:30]}…")
    if sorted(set(handed)) != sorted(specs):
        problem(f"the bridge read {len(set(handed))} of the {len(specs)} records")

    # Batches (fanout: every endpoint's requests are the batches): the same at every endpoint; a batch not full is
    # sent linger_ms after it opened, not before.
    if w.routing == "fanout":
        batches = [request[0].ids for request in per_endpoint[0]]
        for e, requests in enumerate(per_endpoint[1:], 1):
            if [request[0].ids for request in requests] != batches:
                problem(f"{run.names[e]} got other batches than {run.names[0]}")
        linger = w.linger_ms / 1000
        previous_end = 0.0
        for index, request in enumerate(per_endpoint[0]):
            ids, sent = request[0].ids, request[0].at
            opened = topic.handed_at[ids[0]]
            after = per_endpoint[0][index + 1][0].ids[0] if index + 1 < len(per_endpoint[0]) else None
            fits = after is not None and (request[0].points + specs[after].points <= w.max_points
                                          and request[0].size + enriched[after] <= w.max_bytes)
            if (fits or after is None) and sent < opened + linger - EARLY_S:
                problem(f"batch {ids[:5]}… was sent {sent - opened:.3f}s after it opened, before linger_ms "
                        f"({w.linger_ms}), though the next record ({after}) would have fitted in it")
            if sent > max(opened + linger, previous_end) + LATE_S:
                problem(f"batch {ids[:5]}… was sent {sent - opened:.3f}s after it opened (linger_ms {w.linger_ms})")
            previous_end = max(previous_end, request[-1].at)

    # Compression: what went over the wire, against the requests' own bytes.
    for e, proxy in enumerate(run.proxies):
        total = sum(call.size for call in run.collectors[e].calls)
        gzip = w.compression[e] == "gzip"
        if total > 20000 and (proxy.sent < total / 2) != gzip:
            problem(f"{run.names[e]} (compression {w.compression[e]}): {proxy.sent} bytes on the wire for "
                    f"{total} bytes of requests")

    # Permanent failures drop the batch: committed, and never dead-lettered.
    if not topic.all_committed():
        problem(f"not everything was committed: {topic.committed} of {[len(r) for r in topic.records]}")
    for _, record, reason in topic.letters:
        rid = _record_id(record)
        finals = {e: request[-1].answer for e, requests in enumerate(per_endpoint) for request in requests
                  if rid in request[0].ids}
        if all(a.kind in ("ok", "partial") or a.code_name in NOT_DEAD_LETTERED for a in finals.values()):
            problem(f"record {rid} was dead-lettered ({reason}) though its refusals were {finals}")
    return problems


def _enriched_sizes(run: _Run) -> dict[int, int]:
    """Each record's bytes in a request (what batch.max_bytes counts), from any request that carried it."""
    return {rid: size for collector in run.collectors for call in collector.calls
            for rid, size in zip(call.ids, call.sizes)}


def _run(seed: int, tmp_path, monkeypatch, caplog) -> tuple[_Run, list[str]]:
    w = _workload(seed)
    topic = _Topic(w.partitions)
    collectors = [_Scripted(script) for script in w.scripts]
    for collector in collectors:
        collector.start()
    proxies = [CountingProxy(c.endpoint) for c in collectors]
    names = [p.endpoint for p in proxies]
    overrides = {("routing",): w.routing, ("batch", "max_points"): w.max_points, ("batch", "max_bytes"): w.max_bytes,
                 ("batch", "linger_ms"): w.linger_ms, ("retry", "initial_backoff_s"): w.initial_s,
                 ("retry", "max_backoff_s"): w.max_backoff_s, ("retry", "multiplier"): w.multiplier,
                 ("retry", "jitter"): w.jitter}
    bridge = _bridge(tmp_path, monkeypatch, topic, names, overrides, dlq=w.dlq,
                     endpoint_options=[{"concurrency": 1, "compression": c, "retry_refused_credentials": a}
                                       for c, a in zip(w.compression, w.retry_auth)])
    run = _Run(w, topic, collectors, names, proxies, bridge)
    try:
        for spec in w.backlog:
            topic.produce(spec)
        running = _Running(bridge)
        try:
            for gap, spec in w.live:
                time.sleep(gap)
                topic.produce(spec)
            settled = _settle(topic, running)
        finally:
            running.stop()
        run.logs = [r for r in caplog.records if r.name.startswith("kcm")]
        problems = [] if settled else [f"not everything was committed within {SETTLE_S}s: {topic.committed}"]
        return run, problems + _check(run, _enriched_sizes(run))
    finally:
        for proxy in proxies:
            proxy.close()
        for collector in collectors:
            collector.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_workloads_are_batched_routed_retried_and_counted_as_documented(seed, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="kcm")
    run, problems = _run(seed, tmp_path, monkeypatch, caplog)
    assert not problems, "\n".join([run.workload.describe(), *problems])
    assert sum(len(c.calls) for c in run.collectors) > 0


# -- directed cases ------------------------------------------------------------------------------------------------

def _serve(collectors: list[FakeCollector]) -> None:
    for collector in collectors:
        collector.start()


def _drive(bridge: Bridge, topic: _Topic, specs: list[_Spec], gap_s: float = 0.0) -> None:
    """Run the bridge over `specs` (produced `gap_s` apart) until everything is committed, then stop it."""
    if not gap_s:
        for spec in specs:
            topic.produce(spec)
    running = _Running(bridge)
    try:
        for spec in specs if gap_s else ():
            time.sleep(gap_s)
            topic.produce(spec)
        assert _settle(topic, running), f"not everything was committed: {topic.committed}"
    finally:
        running.stop()


def _owners(collectors: list[_Scripted], topic: _Topic) -> dict[str | None, set[int]]:
    owners: dict[str | None, set[int]] = {}
    for e, collector in enumerate(collectors):
        for call in collector.calls:
            for rid in call.ids:
                owners.setdefault(topic.specs[rid].instance, set()).add(e)
    return owners


def test_hash_routing_moves_only_the_instances_an_added_or_removed_endpoint_takes_or_had(tmp_path, monkeypatch):
    """Routing: rendezvous hashing of the endpoint names with the client_instance_id header, or the key when it has
    none; records with neither all to one endpoint; adding an endpoint moves only what the new one takes (a third
    from two to three), removing one only what it had."""
    rng = random.Random(11)
    instances = [f"instance-{rng.getrandbits(40):x}" for _ in range(90)]
    # Each instance once by its header (its key another), once by its key alone; and records with neither.
    specs = [_Spec(0, i, f"other-{n}".encode(), 1, 0) for n, i in enumerate(instances)]
    specs += [_Spec(0, None, i.encode(), 1, 0) for i in instances] + [_Spec(0, None, None, 1, 0)] * 6
    collectors = [_Scripted([]) for _ in range(3)]
    _serve(collectors)
    try:
        names = [c.endpoint for c in collectors]
        placed: list[dict[str, int]] = []
        for chosen in ([0, 1, 2], [0, 1], [0, 1, 2], [1, 2]):
            for collector in collectors:
                collector.calls.clear()
            topic = _Topic(1)
            monkeypatch.undo()
            bridge = _bridge(tmp_path, monkeypatch, topic, [names[e] for e in chosen],
                             {("routing",): "hash", ("batch", "linger_ms"): 20})
            _drive(bridge, topic, specs)
            owners = _owners(collectors, topic)
            assert all(len(endpoints) == 1 for endpoints in owners.values()), owners
            for instance in instances:   # the header and the key name the same instance: one endpoint
                assert owners[instance] == owners["key:" + instance], instance
            placed.append({instance: next(iter(owners[instance])) for instance in instances})
        three, two, again, other_two = placed
        assert again == three   # the same names, the same endpoints
        counts = [sum(1 for e in three.values() if e == n) for n in range(3)]
        assert min(counts) >= 12, counts   # some 30 each
        for instance in instances:   # removed: only the instances the removed endpoint had move
            assert two[instance] == three[instance] or three[instance] == 2, instance
            assert other_two[instance] == three[instance] or three[instance] == 0, instance
        moved = sum(1 for instance in instances if two[instance] != three[instance])
        assert 12 <= moved <= 48, moved   # a third of 90 going from two endpoints to three
    finally:
        for collector in collectors:
            collector.stop()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dlq", [False, True], ids=["dropped", "dead-lettered"])
def test_a_collector_refusing_every_record_costs_a_bounded_number_of_requests(seed, dlq, tmp_path, monkeypatch,
                                                                            caplog):
    """Export: INVALID_ARGUMENT splits the batch in halves down to the records refused; "bounded at
    4·(⌊log2 n⌋ + 1) extra requests for a batch of n records"; the refused records are dropped (committed) or
    written to the dead-letter topic as they were read with `kcm.dlq.reason: refused-by-collector`, once each; one
    log line per batch and refusal code says how many."""
    rng = random.Random(seed)
    count = rng.randint(5, 60)
    specs = [_Spec(0, f"i{rng.randrange(8)}", None, rng.randint(1, 4), 0) for _ in range(count)]
    collector = FakeCollector()
    collector.refuse_when(lambda request: True, grpc.StatusCode.INVALID_ARGUMENT)
    _serve([collector])
    caplog.set_level(logging.WARNING, logger="kcm")
    try:
        topic = _Topic(1)
        bridge = _bridge(tmp_path, monkeypatch, topic, [collector.endpoint],
                         {("batch", "linger_ms"): 200, ("batch", "max_points"): 10_000}, dlq=dlq,
                         endpoint_options=[{"concurrency": rng.choice([1, 2])}])
        _drive(bridge, topic, specs)
    finally:
        collector.stop()
    bound = 1 + 4 * (int(math.log2(count)) + 1)
    assert 1 <= collector.rejected_calls <= bound, (count, collector.rejected_calls)
    assert collector.exports == []
    name = collector.endpoint
    assert _sample(bridge, "kcm_bridge_export_failures_total", endpoint=name,
                   code="INVALID_ARGUMENT") == collector.rejected_calls
    assert _sample(bridge, "kcm_bridge_points_exported_total", endpoint=name) == 0
    if dlq:
        read = [record for records in topic.records for record in records]
        assert sorted(((r.key, r.value, r.headers) for _, r, _ in topic.letters), key=repr) == sorted(
            ((r.key, r.value, r.headers) for r in read), key=repr)
        assert {(t, reason) for t, _, reason in topic.letters} == {(DLQ_TOPIC, "refused-by-collector")}
    else:
        assert topic.letters == []
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "INVALID_ARGUMENT" in
             r.getMessage()]
    points = sum(spec.points for spec in specs)
    assert len(lines) == 1 and (str(points) in lines[0] or str(count) in lines[0]), lines


def _halving_requests(count: int, limit: int) -> int:
    """Extra requests splitting a batch of `count` records in halves takes until each part is within `limit`."""
    if count <= limit:
        return 0
    return 2 + _halving_requests(count // 2, limit) + _halving_requests(count - count // 2, limit)


@pytest.mark.parametrize("seed", range(4))
def test_a_collector_limiting_request_size_gets_every_record_in_smaller_requests(seed, tmp_path, monkeypatch):
    """Export: RESOURCE_EXHAUSTED without a RetryInfo (over the collector's message size limit) is split in halves,
    each exported on its own and settled before the next, down to what the collector refuses: a collector that takes
    `limit` records a request gets every record, once, in the order read, when the halving fits the bound."""
    rng = random.Random(100 + seed)
    count = rng.randint(4, 48)
    limit = rng.randint(max(1, count // 6), count - 1)
    specs = [_Spec(0, f"i{rng.randrange(5)}", None, 1, rng.choice([0, 300])) for _ in range(count)]
    collector = _Scripted([])
    collector.refuse_when(lambda request: len(request.resource_metrics) > limit, grpc.StatusCode.RESOURCE_EXHAUSTED)
    _serve([collector])
    try:
        topic = _Topic(1)
        bridge = _bridge(tmp_path, monkeypatch, topic, [collector.endpoint],
                         {("batch", "linger_ms"): 200, ("batch", "max_points"): 10_000})
        _drive(bridge, topic, specs)
    finally:
        collector.stop()
    assert _halving_requests(count, limit) <= 4 * (int(math.log2(count)) + 1), "the workload must fit the bound"
    taken = [export.request for export in collector.exports]
    assert all(len(request.resource_metrics) <= limit for request in taken)
    assert [_rid(rm) for request in taken for rm in request.resource_metrics] == topic.handed
    # Halves of ⌊m/2⌋ and ⌈m/2⌉ records, whichever goes first: each part above the limit is refused once.
    assert collector.rejected_calls == _halving_requests(count, limit) // 2
    assert _sample(bridge, "kcm_bridge_points_exported_total", endpoint=collector.endpoint) == count


def _gaps(collector: _Scripted) -> list[float]:
    return [b.at - a.at for a, b in zip(collector.calls, collector.calls[1:])]


def test_backoff_grows_by_the_multiplier_up_to_the_cap_and_jitter_spreads_it(tmp_path, monkeypatch):
    """Retry: exponential backoff (initial_backoff_s · multiplier^(k-1)) with jitter, capped at max_backoff_s."""
    unavailable = _Answer("retry", grpc.StatusCode.UNAVAILABLE)
    steady = _Scripted([unavailable] * 6)
    spread = _Scripted([unavailable] * 12)
    _serve([steady, spread])
    try:
        for collector, jitter in ((steady, 0.0), (spread, 0.8)):
            topic = _Topic(1)
            monkeypatch.undo()
            bridge = _bridge(tmp_path, monkeypatch, topic, [collector.endpoint],
                             {("batch", "linger_ms"): 0, ("retry", "initial_backoff_s"): 0.05,
                              ("retry", "multiplier"): 2.0, ("retry", "max_backoff_s"): 0.5,
                              ("retry", "jitter"): jitter})
            _drive(bridge, topic, [_Spec(0, "i", b"i", 2, 0)])
    finally:
        steady.stop()
        spread.stop()
    expected = [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    gaps = _gaps(steady)
    # 0.15 s of scheduling allowed on top of each wait (a loaded machine): a wait one step longer (0.4 for 0.2) fails.
    assert len(gaps) == 6 and all(w - EARLY_S <= g <= w + 0.15 for g, w in zip(gaps, expected)), gaps
    gaps = _gaps(spread)[4:]   # at the cap: 0.5 less up to 80 %
    assert len(gaps) == 8 and all(0.1 - EARLY_S <= g <= 0.5 + 0.15 for g in gaps), gaps
    assert max(gaps) - min(gaps) > 0.02, gaps   # jittered, not one fixed wait


# One endpoint name resolving to two collectors' addresses, as a headless Service's does to its pods.
two_addresses = test_bridge_export.two_addresses


@pytest.mark.parametrize("balancing", ["pick_first", "round_robin"])
def test_balancing_within_an_endpoint_as_configured(two_addresses, balancing, tmp_path, monkeypatch):
    """Balancing within an endpoint: `pick_first` sends every export to one address, `round_robin` each to the next
    in turn; nothing is lost or sent twice either way."""
    topic = _Topic(1)
    bridge = _bridge(tmp_path, monkeypatch, topic, ["collectors:4317"], {("batch", "linger_ms"): 0},
                     endpoint_options=[{"balancing": balancing, "concurrency": 1}])
    _drive(bridge, topic, [_Spec(0, f"i{n % 4}", None, 1, 0) for n in range(30)], gap_s=0.004)
    got = [_rid(rm) for c in two_addresses for export in c.exports for rm in export.request.resource_metrics]
    assert sorted(got) == sorted(topic.specs)
    counts = sorted(len(c.exports) for c in two_addresses)
    if balancing == "pick_first":
        assert counts[0] == 0, counts
    else:
        assert counts[0] >= 5, counts


@pytest.mark.parametrize("concurrency", [1, 2, 3])
def test_an_endpoint_sends_at_most_its_concurrency_of_exports_at_once_and_uses_them(concurrency, tmp_path,
                                                                                    monkeypatch):
    """`concurrency`: the endpoint's own export threads; batches that share no client instance go `concurrency` at a
    time (Order)."""
    collector = FakeCollector()
    collector.stall_next(0.12, times=1000)   # each export takes a while: later ones wait for a thread
    _serve([collector])
    try:
        topic = _Topic(1)
        bridge = _bridge(tmp_path, monkeypatch, topic, [collector.endpoint],
                         {("batch", "linger_ms"): 0, ("batch", "max_points"): 2},
                         endpoint_options=[{"concurrency": concurrency}])
        _drive(bridge, topic, [_Spec(0, f"i{n}", None, 2, 0) for n in range(8)])
    finally:
        collector.stop()
    assert collector.most_in_progress == concurrency
    assert sorted(_rid(rm) for e in collector.exports for rm in e.request.resource_metrics) == sorted(topic.specs)


def test_an_open_batch_holding_the_whole_inflight_budget_is_sent_at_once_not_after_its_linger(tmp_path, monkeypatch):
    """Endpoint down: "An open batch that keeps reading paused with nothing else in flight (`batch.max_bytes` near or
    above `max_inflight_bytes`) is sent at once rather than after its `linger_ms`"."""
    collector = _Scripted([])
    _serve([collector])
    try:
        topic = _Topic(1)
        bridge = _bridge(tmp_path, monkeypatch, topic, [collector.endpoint],
                         {("batch", "linger_ms"): 5000, ("delivery", "max_inflight_bytes"): 4000})
        started = time.monotonic()
        _drive(bridge, topic, [_Spec(0, f"i{n % 3}", None, 1, 900) for n in range(12)])
        took = time.monotonic() - started
    finally:
        collector.stop()
    assert took < 2.5, took   # several batches, none waiting its 5 s linger
    assert len(collector.calls) >= 3
    assert [rid for call in collector.calls for rid in call.ids] == topic.handed
