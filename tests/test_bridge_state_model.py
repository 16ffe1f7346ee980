"""Seeded random operation sequences against the bridge's two pieces of state, each step checked against a reference
model written from the documented rules: delta → cumulative and commit positions (docs/bridge.md, Delivery). A failure
names its seed: `run_offsets(_offset_ops(random.Random(seed)), ...)` replays it, and more seeds hunt further."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from itertools import count

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (AGGREGATION_TEMPORALITY_CUMULATIVE,
                                                        AGGREGATION_TEMPORALITY_DELTA, MetricsData,
                                                        NumberDataPoint)

from kcm_bridge.offsets import OffsetTracker, Ticket
from kcm_bridge.temporality import DeltaToCumulative

P0, P1, P2 = ("metrics", 0), ("metrics", 1), ("metrics", 2)
PARTITIONS = (P0, P1, P2)
SECOND = 10**9
T0 = 1_700_000_000 * SECOND
INT64 = (-2**63, 2**63 - 1)
SEQUENCES = 400


# -- commit positions -----------------------------------------------------------------------------------------------

class _Positions:
    """From first principles: per partition the records consumed since it was assigned, each with the ticket that
    finishes it (None: skipped); a position is the lowest record whose ticket is unfinished, else one past the last."""

    def __init__(self) -> None:
        self.records: dict[tuple, list[tuple[int, Ticket | None]]] = {}
        self.committed: dict[tuple, int] = {}
        self.remaining: dict[int, int] = {}   # id(ticket) -> its deliveries still out

    def unfinished(self, ticket: Ticket | None) -> bool:
        return ticket is not None and self.remaining[id(ticket)] > 0

    def position(self, partition: tuple) -> int | None:
        records = self.records.get(partition)
        if not records:
            return None
        waiting = [offset for offset, ticket in records if self.unfinished(ticket)]
        return min(waiting) if waiting else records[-1][0] + 1

    def to_commit(self) -> dict[tuple, int]:
        positions = {p: self.position(p) for p in self.records}
        return {p: o for p, o in positions.items() if o is not None and o != self.committed.get(p)}

    def waiting_tickets(self, partition: tuple) -> dict[int, Ticket]:
        return {id(t): t for _, t in self.records.get(partition, ()) if self.unfinished(t)}

    def waiting_runs(self, partition: tuple) -> int:
        """Runs of records added one after another with one ticket, not finished: the most spans there can be."""
        runs, last = 0, None
        for _, ticket in self.records.get(partition, ()):
            if ticket is not None and ticket is not last:
                runs += self.unfinished(ticket)
                last = ticket
        return runs


def _offset_ops(rng: random.Random) -> list[tuple]:
    """A pipeline's calls as data; targets are random numbers resolved against what exists when replayed. In a quiet
    sequence positions are seldom asked for and letters often stuck: finished spans pile up behind them between adds."""
    quiet = rng.random() < 0.3
    weights = {"poll": 32, "flush": 10, "finish": 24, "refuse": 4, "unstick": 2, "commit": 12, "position": 4,
               "revoke": 6, "assign": 6}
    if quiet:
        weights.update(finish=60, commit=0.2, position=0, revoke=0.2, assign=0.2)
    ops: list[tuple] = []
    for kind in rng.choices(list(weights), list(weights.values()), k=rng.randint(40, 160) * (2 if quiet else 1)):
        if kind == "poll":
            size = rng.randint(40, 150) if rng.random() < 0.05 else rng.choice([1, 1, 2, 3, 5, 8])
            kinds = rng.choices(["batch", "skip", "letter", "stuck"], [70, 10, 16, 4] if quiet else [70, 10, 19, 1],
                                k=size)
            ops.append((kind, tuple((rng.randrange(1 << 30), what, rng.choice([0, 0, 0, 0, 1, 3])) for what in kinds)))
        elif kind == "flush":
            ops.append((kind, rng.choice([1, 1, 2, 3])))
        elif kind in ("finish", "unstick"):
            ops.append((kind, rng.randrange(1 << 30)))
        elif kind == "refuse":
            ops.append((kind, rng.randrange(1 << 30), rng.randint(1, 3)))
        elif kind == "commit":
            ops.append((kind, rng.choice([-1, -1, rng.randrange(1 << 30)])))
        elif kind == "position":
            ops.append((kind, rng.randrange(len(PARTITIONS))))
        elif kind == "revoke":
            ops.append((kind, rng.randrange(1, 1 << len(PARTITIONS)),
                        tuple(rng.randrange(1 << 30) for _ in range(rng.randint(0, 3))), rng.random() < 0.5))
        else:
            ops.append((kind, rng.randrange(1 << 30), rng.randint(-40, 40)))
    return ops


@dataclass
class _Pipeline:
    """How pipeline.py drives the tracker: an open batch ticket, flushed to endpoints, dead letters of their own."""
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    model: _Positions = field(default_factory=_Positions)
    owned: set = field(default_factory=lambda: set(PARTITIONS))
    next_offset: dict = field(default_factory=lambda: dict.fromkeys(PARTITIONS, 0))
    batch: Ticket = field(default_factory=Ticket)
    batch_records: int = 0
    out: list[Ticket] = field(default_factory=list)        # flushed batches and letters, in order of creation
    stuck: list[Ticket] = field(default_factory=list)      # letters a dead-letter topic keeps refusing
    batches: set = field(default_factory=set)              # ids of flushed batch tickets
    peak: dict = field(default_factory=lambda: dict.fromkeys(PARTITIONS, 0))   # most pending spans since assigned

    def __post_init__(self) -> None:
        self.model.remaining[id(self.batch)] = 1

    def outstanding(self, among: list[Ticket]) -> list[Ticket]:
        return [t for t in among if self.model.remaining[id(t)] > 0]

    def add(self, partition: tuple, gap: int, ticket: Ticket | None) -> None:
        offset = self.next_offset[partition] + gap
        self.next_offset[partition] = offset + 1
        self.tracker.add(partition, offset, ticket)
        self.model.records.setdefault(partition, []).append((offset, ticket))

    def flush(self, parts: int) -> None:
        if not self.batch_records:
            return
        self.batch.set_parts(parts)
        self.model.remaining[id(self.batch)] = parts
        self.out.append(self.batch)
        self.batches.add(id(self.batch))
        self.batch, self.batch_records = Ticket(), 0
        self.model.remaining[id(self.batch)] = 1

    def finish(self, ticket: Ticket, where: str) -> None:
        self.model.remaining[id(ticket)] -= 1
        ended = ticket.finish_part()
        assert ended == (self.model.remaining[id(ticket)] == 0) == ticket.done, where

    def apply(self, op: tuple, where: str) -> None:
        kind = op[0]
        if kind == "poll":
            for pick, what, gap in op[1]:
                if not self.owned:
                    break
                partition = sorted(self.owned)[pick % len(self.owned)]
                if what == "batch":
                    self.add(partition, gap, self.batch)
                    self.batch_records += 1
                elif what == "skip":
                    self.add(partition, gap, None)
                else:
                    letter = Ticket()
                    self.model.remaining[id(letter)] = 1
                    (self.stuck if what == "stuck" else self.out).append(letter)
                    self.add(partition, gap, letter)
        elif kind == "flush":
            self.flush(op[1])
        elif kind in ("finish", "unstick"):
            waiting = self.outstanding(self.out if kind == "finish" else self.stuck)
            if waiting:
                self.finish(waiting[op[1] % len(waiting)], where)
        elif kind == "refuse":   # a collector refused records: their letters are parts too, added while it is out
            waiting = [t for t in self.outstanding(self.out) if id(t) in self.batches]
            if waiting:
                ticket = waiting[op[1] % len(waiting)]
                ticket.add_parts(op[2])
                self.model.remaining[id(ticket)] += op[2]
        elif kind == "commit":
            self.commit(op[1], None, where)
        elif kind == "position":
            partition = PARTITIONS[op[1]]
            assert self.tracker.commit_position(partition) == self.model.position(partition), where
        elif kind == "revoke":
            self.revoke(op, where)
        elif kind == "assign":
            free = sorted(set(PARTITIONS) - self.owned)
            if free:
                partition = free[op[1] % len(free)]
                self.owned.add(partition)
                self.next_offset[partition] = max(0, self.next_offset[partition] + op[2])   # reset, or moved on

    def commit(self, mask: int, only: set | None, where: str) -> None:
        positions = self.tracker.to_commit()
        assert positions == self.model.to_commit(), where
        if only is not None:
            positions = {p: o for p, o in positions.items() if p in only}
        chosen = {p: o for i, (p, o) in enumerate(sorted(positions.items())) if mask == -1 or mask >> i & 1}
        self.tracker.committed(chosen)
        self.model.committed.update(chosen)

    def revoke(self, op: tuple, where: str) -> None:
        _, mask, finishes, commit_first = op
        gone = {p for i, p in enumerate(PARTITIONS) if mask >> i & 1} & self.owned
        if not gone:
            return
        self.flush(1)
        for pick in finishes:   # what ended within revoke_timeout_s
            waiting = self.outstanding(self.out)
            if waiting:
                self.finish(waiting[pick % len(waiting)], where)
        if commit_first:
            self.commit(-1, gone, where)
        expected: dict[int, Ticket] = {}
        for partition in gone:
            expected.update(self.model.waiting_tickets(partition))
        returned = self.tracker.forget(sorted(gone))
        assert len(returned) == len({id(t) for t in returned}), f"{where}: a ticket returned twice"
        assert {id(t) for t in returned} == set(expected), where
        for partition in gone:
            self.model.records.pop(partition, None)
            self.model.committed.pop(partition, None)
            self.peak[partition] = 0
        self.owned -= gone
        positions = self.tracker.to_commit()
        assert not gone & set(positions), f"{where}: a revoked partition still to commit"
        assert all(self.tracker.commit_position(p) is None for p in gone), where

    def check(self, where: str, positions: bool) -> None:
        waiting = {partition: self.model.waiting_tickets(partition) for partition in PARTITIONS}
        for partition in PARTITIONS:
            # Each unfinished ticket once, however many runs of records it holds there.
            pending = self.tracker.pending([partition])
            assert pending == len(waiting[partition]), f"{where}: {partition} pending {pending}"
            self.peak[partition] = max(self.peak[partition], self.model.waiting_runs(partition))
            spans = len(self.tracker._spans.get(partition, ()))
            assert spans <= max(64, 2 * self.peak[partition]), f"{where}: {spans} spans kept on {partition}"
        everywhere = {key for tickets in waiting.values() for key in tickets}   # a batch may hold several partitions
        assert self.tracker.pending() == len(everywhere), where
        # The oldest stuck letters (from before a revoke, maybe) and the latest tickets: holds scans the spans.
        stuck, out = self.outstanding(self.stuck), self.outstanding(self.out)
        for ticket in stuck[:2] + stuck[-2:] + out[-3:] + [self.batch]:
            assert not ticket.done, where
            for partition in PARTITIONS:
                held = id(ticket) in waiting[partition]
                assert self.tracker.holds(partition, ticket) == held, f"{where}: holds {partition}"
        if positions:
            assert self.tracker.to_commit() == self.model.to_commit(), where
            for partition in PARTITIONS:
                assert self.tracker.commit_position(partition) == self.model.position(partition), where


def run_offsets(ops: list[tuple], seed: object, eager: bool) -> None:
    """Replay `ops` on a tracker and the model, checking every step (positions too when `eager`: asking for them
    sweeps, so the other sequences leave the sweeping to `add`)."""
    pipeline = _Pipeline()
    for step, op in enumerate(ops):
        where = f"seed {seed}, step {step} ({op[0]})"
        pipeline.apply(op, where)
        pipeline.check(where, eager or op[0] in ("commit", "position"))
    pipeline.flush(1)
    for ticket in pipeline.out + pipeline.stuck:
        while pipeline.model.remaining[id(ticket)] > 0:
            pipeline.finish(ticket, f"seed {seed}, draining")
    expected = {p: pipeline.next_offset[p] for p in pipeline.model.records if pipeline.model.records[p]}
    assert {p: pipeline.tracker.commit_position(p) for p in expected} == expected, f"seed {seed}, drained"
    assert pipeline.tracker.pending() == 0, f"seed {seed}, drained"


def test_commit_positions_follow_the_lowest_unfinished_record_through_random_pipelines():
    for seed in range(SEQUENCES):
        rng = random.Random(seed)
        run_offsets(_offset_ops(rng), seed, eager=rng.random() < 0.5)


# -- delta → cumulative ---------------------------------------------------------------------------------------------

RESOURCES = [(), (("host", "h1"),), (("host", "h1"), ("zone", "z1")), (("zone", "z1"), ("host", "h1")),
             (("host", 1),)]
SCOPES = [("ab", "1"), ("ab", "2"), ("a", "1")]       # the version is not part of a stream; "ab"+"c" is not "a"+"bc"
NAMES = ["c", "bc", "requests"]
POINT_ATTRIBUTES = [(), (("topic", "t"),), (("topic", "t"), ("partition", "0")), (("partition", "0"), ("topic", "t")),
                    (("topic", 7),)]
KINDS = ["delta", "delta", "delta", "cumulative", "unspecified", "gauge"]


def _identity(attributes: tuple) -> frozenset:
    return frozenset((key, type(value).__name__, value) for key, value in attributes)


@dataclass
class _Stream:
    partition: tuple
    start: int
    total: int | float
    last: int
    seen: float
    keep: float
    updated: int


class _Totals:
    """The documented rules, kept plainly: a stream's total is the sum of its deltas since it (re)started."""

    def __init__(self, max_streams: int, idle_expiry_s: float) -> None:
        self.max_streams, self.idle_expiry_s = max_streams, idle_expiry_s
        self.streams: dict[tuple, _Stream] = {}
        self.dropped = self.evicted = 0
        self.clock = count()

    def by_last_update(self) -> list[tuple]:
        return sorted(self.streams, key=lambda key: self.streams[key].updated)

    def convert(self, record: tuple, instance: str, partition: tuple, now_s: float,
                push_interval_s: float | None) -> list[list[tuple]]:
        """Each delta sum's points as they must come out: (time, start, kind of value, value, attributes)."""
        keep = self.idle_expiry_s
        if push_interval_s is not None:
            keep = max(keep, 2 * min(push_interval_s, 3600))
        for key in self.by_last_update():   # in order of last update, up to the first not idle long enough
            if now_s - self.streams[key].seen < self.streams[key].keep:
                break
            del self.streams[key]
        out = []
        for resource, scopes in record:
            for scope, _version, metrics in scopes:
                for name, kind, points in metrics:
                    if kind != "delta":
                        continue
                    out.append([])
                    for attributes, start, time, value in points:
                        key = (instance, _identity(resource), scope, name, _identity(attributes))
                        converted = self.accumulate(key, partition, start, time, value, now_s, keep)
                        if converted is not None:
                            out[-1].append((time, *converted, _identity(attributes)))
        return out

    def accumulate(self, key: tuple, partition: tuple, start: int, time: int, value: int | float, now_s: float,
                   keep: float) -> tuple | None:
        stream = self.streams.get(key)
        if stream is None:
            while len(self.streams) >= self.max_streams:
                del self.streams[self.by_last_update()[0]]
                self.evicted += 1
            stream = self.streams[key] = _Stream(partition, start or time, 0, time, now_s, keep, 0)
        elif time <= stream.last:
            self.dropped += 1
            return None
        stream.partition = partition   # where its client is read now
        stream.last, stream.seen, stream.keep, stream.updated = time, now_s, keep, next(self.clock)
        is_int = isinstance(value, int)
        if not is_int and not math.isfinite(value):
            return stream.start, "as_double", _number(value)
        total = stream.total + value
        if not math.isfinite(total) if isinstance(total, float) else not INT64[0] <= total <= INT64[1]:
            stream.start, total = start or time, value   # a counter reset: its own start
        stream.total = total
        # Once doubles mixed in, the total is a double: an int point stays an int only while it is whole and in int64.
        if is_int and (isinstance(total, int) or total.is_integer() and INT64[0] <= total <= INT64[1]):
            return stream.start, "as_int", int(total)
        return stream.start, "as_double", _number(float(total))

    def forget(self, partitions: tuple) -> None:
        for key in [k for k, s in self.streams.items() if s.partition in partitions]:
            del self.streams[key]


def _number(value: int | float) -> int | float | str:
    return "nan" if value != value else value


def _value(rng: random.Random, as_int: bool) -> int | float:
    if as_int:
        r = rng.random()
        if r < 0.05:
            return rng.choice([1, -1]) * (2**63 - rng.randint(1, 4)) if rng.random() < 0.8 else -2**63
        return rng.choice([rng.randint(-3, 50), rng.randint(1, 4)]) if r < 0.9 else rng.randint(2**60, 2**62)
    r = rng.random()
    if r < 0.06:
        return rng.choice([math.nan, math.inf, -math.inf])
    if r < 0.1:
        return rng.choice([1.7e308, -1.7e308])
    return rng.uniform(-3, 50)


def _totals_ops(rng: random.Random, idle_expiry_s: float) -> list[tuple]:
    """convert, re-deliver and forget calls as data: records as nested tuples, times on a clock moving on."""
    # A metric keeps its kind of value, but in some sequences its points mix ints and doubles.
    as_int = {name: rng.random() < 0.5 for name in NAMES} if rng.random() < 0.8 else {name: None for name in NAMES}
    palette = [rng.sample(choices, rng.randint(1, len(choices)))   # few streams, so that they live on
               for choices in (RESOURCES, SCOPES, NAMES, POINT_ATTRIBUTES)]
    homes = {"a": P0, "b": P1, "": rng.choice(PARTITIONS)}   # contract keys keep an instance on one partition
    ops: list[tuple] = []
    now = 0.0
    for _ in range(rng.randint(15, 50)):
        r = rng.random()
        if r < 0.07:
            ops.append(("forget", tuple(rng.sample(PARTITIONS, rng.randint(1, 2)))))
            continue
        if r < 0.09:   # the topic was given more partitions: an instance's key now hashes to another
            homes[rng.choice(list(homes))] = rng.choice(PARTITIONS)
            continue
        now += rng.choice([0, 1, 1, 1, 2, 3]) if rng.random() < 0.85 else \
            rng.choice([idle_expiry_s - 3, idle_expiry_s - 1, idle_expiry_s, idle_expiry_s + 0.5, 1200, 1800, 7200])
        interval = rng.choice([None, None, None, 1, 30, 900, 4000, 10**9])
        if r < 0.15:
            ops.append(("redeliver", rng.randrange(1 << 30), now, interval))
        else:
            instance = rng.choice(list(homes))
            record = _record(rng, T0 + int(now * SECOND), palette, as_int)
            ops.append(("convert", record, instance, homes[instance], now, interval))
    return ops


def _record(rng: random.Random, t: int, palette: list[list], as_int: dict[str, bool]) -> tuple:
    """A push: (resource, scopes) of (scope, version, metrics) of (name, kind, points) of (attributes, start, time,
    value); a point may come late, or twice."""
    resources, scopes, names, point_attributes = palette

    def points(name: str) -> tuple:
        return tuple((rng.choice(point_attributes), rng.choice([t - SECOND, t - 9 * SECOND, 0]),
                      t + rng.choice([0] * 12 + [1, -SECOND, -30 * SECOND]),
                      _value(rng, rng.random() < 0.5 if as_int[name] is None else as_int[name]))
                     for _ in range(rng.randint(1, 3)))

    def metrics() -> tuple:
        return tuple((name, rng.choice(KINDS), points(name)) for name in rng.choices(names, k=rng.randint(1, 3)))

    return tuple((rng.choice(resources), tuple((*rng.choice(scopes), metrics()) for _ in range(rng.choice([1, 1, 2]))))
                 for _ in range(rng.choice([1, 1, 2])))


def _attributes(attributes: tuple) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=v))
            for k, v in attributes]


def _metrics_data(record: tuple) -> MetricsData:
    data = MetricsData()
    for resource, scopes in record:
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.extend(_attributes(resource))
        for scope, version, metrics in scopes:
            scope_metrics = resource_metrics.scope_metrics.add()
            scope_metrics.scope.name, scope_metrics.scope.version = scope, version
            for name, kind, points in metrics:
                metric = scope_metrics.metrics.add(name=name)
                if kind == "gauge":
                    target = metric.gauge.data_points
                else:
                    metric.sum.aggregation_temporality = {"delta": AGGREGATION_TEMPORALITY_DELTA, "unspecified": 0,
                                                          "cumulative": AGGREGATION_TEMPORALITY_CUMULATIVE}[kind]
                    target = metric.sum.data_points
                for attributes, start, time, value in points:
                    point = target.add(start_time_unix_nano=start, time_unix_nano=time)
                    point.attributes.extend(_attributes(attributes))
                    if isinstance(value, int):
                        point.as_int = value
                    else:
                        point.as_double = value
    return data


def _seen(point: NumberDataPoint) -> tuple:
    which = point.WhichOneof("value")
    attributes = tuple((kv.key, kv.value.int_value if kv.value.HasField("int_value") else kv.value.string_value)
                       for kv in point.attributes)
    return point.time_unix_nano, point.start_time_unix_nano, which, _number(getattr(point, which)), \
        _identity(attributes)


def run_totals(ops: list[tuple], seed: object, max_streams: int, idle_expiry_s: float) -> None:
    """Replay `ops` on a converter and the model, comparing every point that comes out."""
    converter, model = DeltaToCumulative(max_streams, idle_expiry_s), _Totals(max_streams, idle_expiry_s)
    converted: list[tuple] = []
    for step, op in enumerate(ops):
        where = f"seed {seed}, step {step} ({op[0]}; max_streams={max_streams}, idle_expiry_s={idle_expiry_s})"
        if op[0] == "forget":
            converter.forget(op[1])
            model.forget(op[1])
        else:
            if op[0] == "redeliver":
                if not converted:
                    continue
                record, instance, partition = converted[op[1] % len(converted)][1:4]
                now_s, interval = op[2:]
            else:
                _, record, instance, partition, now_s, interval = op
                converted.append(op)
            data = _metrics_data(record)
            metrics = [m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics]
            deltas = [m.sum.aggregation_temporality == AGGREGATION_TEMPORALITY_DELTA for m in metrics]
            before = [m.SerializeToString() for m in metrics]
            expected = model.convert(record, instance, partition, now_s, interval)
            changed = converter.convert(data, instance, partition, now_s=now_s, push_interval_s=interval)
            assert changed == any(deltas), where
            assert [m.SerializeToString() for m, delta in zip(metrics, deltas) if not delta] == \
                [b for b, delta in zip(before, deltas) if not delta], f"{where}: a metric not a delta sum changed"
            converted_sums = [m.sum for m, delta in zip(metrics, deltas) if delta]
            assert all(s.aggregation_temporality == AGGREGATION_TEMPORALITY_CUMULATIVE for s in converted_sums), where
            assert [[_seen(p) for p in s.data_points] for s in converted_sums] == expected, where
        assert len(converter) == len(model.streams) <= max_streams, where
        assert (converter.dropped_points, converter.evicted_streams) == (model.dropped, model.evicted), where


def test_cumulative_sums_equal_the_deltas_since_each_streams_last_reset_through_random_pushes():
    for seed in range(SEQUENCES):
        rng = random.Random(seed)
        max_streams, idle_expiry_s = rng.choice([1, 2, 3, 5, 8, 40, 1000, 1000]), rng.choice([5, 10, 60, 600])
        run_totals(_totals_ops(rng, idle_expiry_s), seed, max_streams, idle_expiry_s)

