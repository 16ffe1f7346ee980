"""Random fleets rolled up and compared, row by row and column by column, with a reference written from
docs/rollups.md alone.

A seeded generator makes cases of a few clients pushing gauges (NaN, infinities), up-down counters, delta sums,
cumulative counters (drops, new start times, gaps, values missing, duplicates, late and reordered deliveries),
histograms (bounds that agree, bounds that do not, re-registered ones) and count-and-sum types across an hour boundary;
the cases share one DataFrame, told apart by `client_id`. Each fleet is read as a run with offsets only, a run over
both hours and a run over the second hour with its lookback, rolled up by `aggregate.rollup` and by the job's own path
(per-batch state of `kcm_rollups.partial`, `first_pass`, `add_cumulative`, `rollup_state`). The reference computes
every window from the points, the hours too (never from their minutes).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

import pytest
from pyspark.sql import functions as F

from kcm_common.kafka import KafkaSettings
from kcm_rollups.aggregate import DEFAULT_DIMENSIONS, rollup, rollup_state
from kcm_rollups.decode import POINTS_SCHEMA
from kcm_rollups.job import RollupOptions, add_cumulative, first_pass
from spark_support import spark  # noqa: F401  (the session-scoped fixture)
from test_rollup_math import HOUR, MINUTE, T0, point
from test_rollup_partial import batch_state

RESOLUTIONS = (MINUTE, HOUR)
SEEDS = (1, 2)
CASES = 6
SPAN_S = 480          # clients push from T0 - 8 minutes to T0 + 8 minutes: sixteen minutes across an hour
LOOKBACK_S = 300      # the job's default
KLL_EXACT = 200       # docs: quantiles exact up to 200 samples
KLL_RANK_ERROR = 0.027    # past them: twice KLL's single-quantile rank error at k=200 (1.33%, 99% confidence)
HLL_ERROR = 0.02          # as test_rollup_partial allows an HLL of lgK=12
QUANTILES = (("p50", 50), ("p95", 95), ("p99", 99))
SOFTWARE = (("librdkafka", "2.3.0"), ("librdkafka", "2.4.0"), ("apache-kafka-java", "3.7.0"))
ATTRIBUTES = ("{}", '{"node_id":"1"}', '{"node_id":"2","topic":"orders"}')
SCOPES = (None, '["lib-a","1.0"]', '["lib-b","2.0"]')
BOUNDS = ([1.0, 5.0, 10.0], [2.0, 4.0], [-5.0, 0.0, 5.0], [])
OPTIONS = RollupOptions(kafka=KafkaSettings("127.0.0.1:9"), topic="t", output="/nowhere", resolutions=RESOLUTIONS)


class Reading(NamedTuple):
    """What a run reads: records from `read_from_s`, rolled up from `since_s` (seconds from T0; None: offsets)."""

    name: str
    since_s: int | None
    read_from_s: int | None

    def reads(self, p: dict) -> bool:
        return self.read_from_s is None or p["record_micros"] >= (T0 + self.read_from_s) * 10**6

    def rolls_up(self, p: dict) -> bool:
        return self.since_s is None or p["record_micros"] >= (T0 + self.since_s) * 10**6


READINGS = (Reading("offsets only", None, None), Reading("both hours", -3600, -3600 - LOOKBACK_S),
            Reading("second hour", 0, -LOOKBACK_S))


# The fleet: each client pushes all its streams at once, one record a push, at its own interval.

def dyadic(rng: random.Random, low: int, high: int) -> float:
    """A quarter in [low/4, high/4]: sums of these are exact in any order, so no tolerance hides a wrong one."""
    return rng.randint(low, high) / 4


def ns(seconds: float) -> int:
    """T0 + `seconds` in nanoseconds, exactly for whole seconds (a bound compared with `>=` must not be rounded)."""
    return T0 * 10**9 + round(seconds * 1e9)


def missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def gauge_stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
    def push(t: float) -> dict:
        roll = rng.random()
        value = math.nan if roll < 0.1 else rng.choice((math.inf, -math.inf)) if roll < 0.11 else dyadic(rng, -400, 400)
        return {"type": "gauge", "value": value}
    return push


def level_stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
    def push(t: float) -> dict:   # an up-down counter sent cumulative: a level, rolled up as a gauge
        value = math.nan if rng.random() < 0.05 else dyadic(rng, -40, 200)
        return {"type": "sum", "temporality": "cumulative", "monotonic": False, "value": value, "start_ns": 1}
    return push


def delta_stream(monotonic: bool) -> Callable[[random.Random, float], Callable[[float], dict]]:
    def stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
        def push(t: float) -> dict:
            value = math.nan if rng.random() < 0.05 else dyadic(rng, 0 if monotonic else -40, 40)
            return {"type": "sum", "temporality": "delta", "monotonic": monotonic, "value": value}
        return push
    return stream


def first_start(rng: random.Random, first_s: float) -> int:
    """Unknown, long before anything read, exactly where a reading starts, or shortly before the first push."""
    return rng.choice((0, ns(-7200), *(ns(r.read_from_s) for r in READINGS if r.read_from_s is not None),
                       ns(first_s - rng.uniform(0, 400))))


def counter_stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
    state = {"value": dyadic(rng, 0, 4000), "start": first_start(rng, first_s)}

    def push(t: float) -> dict:
        roll = rng.random()
        if roll < 0.07:      # restarted, its start time kept: a drop
            state["value"] = dyadic(rng, 0, 20)
        elif roll < 0.12:    # restarted with a new start time, whatever its value
            state["start"], state["value"] = ns(t - rng.uniform(0, 5)), dyadic(rng, 0, 4000)
        else:
            state["value"] += dyadic(rng, 0, 60)
        roll = rng.random()
        value = None if roll < 0.03 else math.nan if roll < 0.06 else state["value"]
        return {"type": "sum", "temporality": "cumulative", "monotonic": True, "value": value,
                "start_ns": state["start"]}
    return push


def delta_histogram_stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
    bounds = rng.choice(BOUNDS)

    def push(t: float) -> dict:
        # Without bounds OTLP allows one bucket (everything) or none.
        buckets = [rng.randint(0, 6) for _ in range(len(bounds) + 1)] if bounds or rng.random() < 0.5 else None
        count = sum(buckets) if buckets else rng.randint(0, 6)
        total = None if rng.random() < 0.04 else dyadic(rng, 0, 40 * count)
        return {"type": "histogram", "temporality": "delta", "bounds": list(bounds), "bucket_counts": buckets,
                "count": count, "sum": total}
    return push


def cumulative_histogram_stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
    bounds = rng.choice(BOUNDS[:3])
    state = {"bounds": bounds, "buckets": [rng.randint(0, 20) for _ in range(len(bounds) + 1)],
             "sum": dyadic(rng, 0, 400), "start": first_start(rng, first_s)}

    def push(t: float) -> dict:
        roll = rng.random()
        if roll < 0.06:      # restarted, its start time kept: every bucket at most what it was
            state["buckets"] = [min(b, rng.randint(0, 2)) for b in state["buckets"]]
            state["sum"] = dyadic(rng, 0, 8)
        elif roll < 0.1:     # restarted with a new start time
            state["start"] = ns(t - rng.uniform(0, 5))
            state["buckets"] = [rng.randint(0, 20) for _ in state["buckets"]]
            state["sum"] = dyadic(rng, 0, 400)
        elif roll < 0.13:    # re-registered with other bounds (an upgrade), its start time kept
            state["bounds"] = rng.choice([b for b in BOUNDS[:3] if b != state["bounds"]])
            state["buckets"] = [rng.randint(0, 20) for _ in range(len(state["bounds"]) + 1)]
        else:
            state["buckets"] = [b + rng.randint(0, 5) for b in state["buckets"]]
            state["sum"] += dyadic(rng, 0, 80)
        return {"type": "histogram", "temporality": "cumulative", "bounds": list(state["bounds"]),
                "bucket_counts": list(state["buckets"]), "count": sum(state["buckets"]),
                "sum": None if rng.random() < 0.03 else state["sum"], "start_ns": state["start"]}
    return push


def exponential_stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
    def push(t: float) -> dict:
        count = rng.randint(0, 30)
        return {"type": "exponential_histogram", "temporality": "delta", "count": count,
                "sum": dyadic(rng, 0, 20 * count)}
    return push


def count_and_sum_stream(kind: str) -> Callable[[random.Random, float], Callable[[float], dict]]:
    """A cumulative summary or exponential histogram: a count and a sum, differenced per stream."""
    def stream(rng: random.Random, first_s: float) -> Callable[[float], dict]:
        state = {"count": rng.randint(0, 100), "sum": dyadic(rng, 0, 400), "start": first_start(rng, first_s)}

        def push(t: float) -> dict:
            if rng.random() < 0.08:
                state.update(count=rng.randint(0, 5), sum=dyadic(rng, 0, 20), start=ns(t - rng.uniform(0, 5)))
            else:
                state["count"] += rng.randint(0, 10)
                state["sum"] += dyadic(rng, 0, 40)
            return {"type": kind, "temporality": "cumulative", "count": state["count"], "sum": state["sum"],
                    "start_ns": state["start"]}
        return push
    return stream


STREAMS = {"g": gauge_stream, "level": level_stream, "d": delta_stream(True), "dn": delta_stream(False),
           "c": counter_stream, "h": delta_histogram_stream, "hc": cumulative_histogram_stream,
           "e": exponential_stream, "ec": count_and_sum_stream("exponential_histogram"),
           "q": count_and_sum_stream("summary")}


def fleet(seed: int, cases: int = CASES) -> list[dict]:
    """The points of `cases` random cases (client ids `s<seed>c<case>-app<n>`), one of them holding a gauge pushed
    every 2 s (past KLL's exact 200 samples in an hour)."""
    rng = random.Random(seed)
    offsets, taken = itertools.count(), set()
    points = []
    dense = rng.randrange(cases)
    for case in range(cases):
        apps = [f"s{seed}c{case}-app{n}" for n in range(rng.randint(1, 2))]
        for member in range(rng.randint(1, 4) + (case == dense)):
            dense_member = case == dense and member == 0
            if rng.random() < 0.2 and not dense_member:   # another writer: no instance id, its resource instead
                identity = {"client_instance_id": None, "resource": json.dumps({"service.name": f"{apps[0]}-{member}"})}
            else:
                identity = {"client_instance_id": f"s{seed}c{case}-i{member}"}
            name, version = rng.choice(SOFTWARE)
            identity.update(client_id=rng.choice(apps), client_software_name=name, client_software_version=version)
            # Some push less often than the lookback: their first point in a range has no predecessor.
            interval = 2.0 if dense_member else rng.choice((10.0, 20.0, 30.0, 60.0, 60.0, 400.0))
            skew_ns = rng.choice((0, 0, rng.randint(-30, 30) * 10**9))   # the client's clock against the broker's
            first_s = -SPAN_S + rng.uniform(0, interval)
            metrics = ["g"] if dense_member else rng.sample(sorted(STREAMS), rng.randint(3, len(STREAMS)))
            streams = []
            for metric in metrics:
                for attributes in rng.sample(ATTRIBUTES, rng.choice((1, 1, 2))):
                    scopes = rng.sample(SCOPES, 2) if rng.random() < 0.15 else [rng.choice(SCOPES)]
                    streams += [(metric, attributes, scope, lag, STREAMS[metric](rng, first_s))
                                for lag, scope in enumerate(scopes)]
            t = first_s
            while t < SPAN_S:
                if rng.random() >= 0.08:   # else a gap: a push lost
                    fields = [dict(metric=metric, attributes=attributes, scope=scope,
                                   time_ns=ns(t) + skew_ns + lag * 10**6,
                                   **push(t)) for metric, attributes, scope, lag, push in streams]
                    late = rng.random() < 0.1
                    received = t + (rng.uniform(5, 150) if late else rng.uniform(0.001, 2))
                    if rng.random() < 0.03:   # on a window's first or last microsecond
                        received = math.ceil(received / 60) * 60 - rng.choice((0, 1e-6))
                    points += record(rng, identity, fields, received, offsets, taken)
                    if rng.random() < 0.04:   # written twice by an at-least-once writer
                        points += record(rng, identity, fields, received + rng.uniform(1, 200), offsets, taken)
                t += interval * rng.uniform(0.8, 1.2)
    return points


def record(rng: random.Random, identity: dict, fields: list[dict], received_s: float, offsets: itertools.count,
           taken: set[int]) -> list[dict]:
    """One record's points: received at a microsecond no other record has."""
    micros = T0 * 10**6 + round(received_s * 1e6)
    while micros in taken:
        micros += 1
    taken.add(micros)
    where = {"partition": rng.randrange(3), "offset": next(offsets), "record_micros": micros}
    return [point(f["metric"], 0, **{**identity, **{k: v for k, v in f.items() if k != "metric"}, **where,
                                     "record_first": i == 0}) for i, f in enumerate(fields)]


# The reference: docs/rollups.md's rules, in plain Python.

Key = tuple


def kind_of(p: dict) -> str:
    """docs: gauges and non-monotonic cumulative sums are levels; other sums are counted; the rest histograms."""
    if p["type"] == "gauge" or (p["type"] == "sum" and p["temporality"] == "cumulative" and not p["monotonic"]):
        return "gauge"
    return "counter" if p["type"] == "sum" else "histogram"


def key_of(p: dict, seconds: int, label: str) -> Key:
    window = p["record_micros"] // (seconds * 10**6) * seconds - T0   # epoch-aligned, by the record's time
    return (label, window, p["metric"], p["type"], p["client_id"], p["client_software_name"],
            p["client_software_version"], p["attributes"],
            tuple(p["bounds"]) if p["type"] == "histogram" else None)   # bounds: a key column of histograms only


def whole(p: dict) -> float | tuple:
    """What a point adds on its own: a counter's value, a histogram's count, sum (NaN: unknown) and buckets."""
    if kind_of(p) == "counter":
        return p["value"]
    return p["count"], math.nan if p["sum"] is None else p["sum"], p["bucket_counts"]


def cumulative_increases(points: list[dict], reading: Reading) -> dict[int, float | tuple | None]:
    """By id() of the point, what each cumulative point adds (None: nothing): per stream in the order of the points' own
    time, the difference to the previous point, or the whole value after a drop or a new start time."""
    streams = defaultdict(list)
    for p in points:
        counted = kind_of(p) == "counter" and not missing(p["value"])   # a point without a value is nobody's previous
        if p["temporality"] == "cumulative" and (counted or kind_of(p) == "histogram"):
            streams[p["client_instance_id"], p["resource"], p["scope"], p["metric"], p["attributes"]].append(p)
    added = {}
    read_from = None if reading.read_from_s is None else ns(reading.read_from_s)
    for stream in streams.values():
        stream.sort(key=lambda p: (p["time_ns"], p["record_micros"], p["partition"], p["offset"]))
        newest_before = max((p["time_ns"] for p in stream if not reading.rolls_up(p)), default=None)
        previous = None
        for p in stream:
            if reading.rolls_up(p) and newest_before is not None and p["time_ns"] < newest_before:
                added[id(p)] = None          # its span was counted by the run before
            elif previous is None:
                inside = read_from is not None and p["start_ns"] and p["start_ns"] >= read_from
                added[id(p)] = whole(p) if inside else None
            elif reset(previous, p):
                added[id(p)] = whole(p)
            else:
                added[id(p)] = difference(previous, p)
            previous = p
    return added


def reset(previous: dict, p: dict) -> bool:
    if p["start_ns"] != previous["start_ns"]:
        return True
    if kind_of(p) == "counter":
        return p["value"] < previous["value"]
    # A histogram re-registered with other bounds starts over too (test_rollup_math says so; the docs do not).
    return p["count"] < previous["count"] or p["bounds"] != previous["bounds"]


def difference(previous: dict, p: dict) -> float | tuple:
    if kind_of(p) == "counter":
        return p["value"] - previous["value"]
    known = p["sum"] is not None and previous["sum"] is not None
    buckets = None if p["bucket_counts"] is None else [a - b for a, b in zip(p["bucket_counts"],
                                                                               previous["bucket_counts"])]
    return p["count"] - previous["count"], p["sum"] - previous["sum"] if known else math.nan, buckets


def reference_rows(points: list[dict], reading: Reading) -> dict[Key, dict]:
    """Rows by key (see key_of) of the points `reading` reads, each window computed from the points."""
    read = [p for p in points if reading.reads(p)]
    added = cumulative_increases(read, reading)
    rows = {}
    for resolution in RESOLUTIONS:
        windows = defaultdict(list)
        for p in read:
            if reading.rolls_up(p):
                windows[key_of(p, resolution.seconds, resolution.label)].append(p)
        for key, window in windows.items():
            rows[key] = reference_row(sorted(window, key=lambda p: (p["record_micros"], p["time_ns"])), added,
                                      resolution.seconds)
    return rows


def reference_row(window: list[dict], added: dict, seconds: int) -> dict:
    """One row of `window`'s points, in record order; `added` says what each cumulative point adds."""
    row = dict.fromkeys(("count", "min", "max", "sum", "avg", "last", "last_at", "p50", "p95", "p99", "increase",
                         "rate", "bucket_counts"))
    row.update(nan_count=0, instances=Approximately(len({p["client_instance_id"] or p["resource"] for p in window})))
    kind = kind_of(window[0])
    valued = [p for p in window if not missing(p["value"])]
    if valued and kind != "histogram":
        row.update(last=valued[-1]["value"], last_at=valued[-1]["record_micros"])
    if kind == "gauge":
        samples = [p["value"] for p in valued]
        row.update(count=len(samples), nan_count=sum(p["value"] is not None and math.isnan(p["value"]) for p in window))
        if samples:
            total = sum(samples)
            row.update(min=min(samples), max=max(samples), sum=total, avg=total / len(samples))
            row.update({name: Quantile(samples, percent) for name, percent in QUANTILES})
        return row
    if kind == "counter":
        increases = [p["value"] if p["temporality"] == "delta" else added.get(id(p)) for p in window]
        increase = sum(i for i in increases if not missing(i))
        row.update(count=len(window), increase=increase, rate=increase / seconds)
        return row
    parts = [whole(p) if p["temporality"] == "delta" else added[id(p)] for p in window]
    parts = [part for part in parts if part is not None]
    count, total = sum(c for c, _, _ in parts), sum(s for _, s, _ in parts)
    row.update(count=count, sum=total, avg=total / count if count else None)
    buckets = [b for _, _, b in parts if b is not None]
    if buckets:
        row["bucket_counts"] = [sum(column) for column in zip(*buckets)]
        row.update({name: prometheus_quantile(percent / 100, window[0]["bounds"], row["bucket_counts"])
                    for name, percent in QUANTILES})
    return row


def prometheus_quantile(q: float, bounds: list[float], buckets: list[int]) -> float | None:
    """Prometheus' histogram_quantile over OTLP buckets (bucket i is (bounds[i-1], bounds[i]], the last +Inf)."""
    total = sum(buckets)
    if not bounds or total == 0:
        return None
    rank = q * total
    cumulative = list(itertools.accumulate(buckets))
    index = bisect.bisect_left(cumulative, rank)
    if index == len(bounds):
        return bounds[-1]          # the +Inf bucket: its lower bound
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    lower = 0.0 if index == 0 else bounds[index - 1]
    below = 0 if index == 0 else cumulative[index - 1]
    return pytest.approx(lower + (bounds[index] - lower) * (rank - below) / buckets[index], rel=1e-9)


class Approximately(int):
    """A distinct count, equal to any estimate within HLL's error."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and abs(other - int(self)) <= HLL_ERROR * int(self)

    __hash__ = int.__hash__


class Quantile:
    """A sketch's quantile of `samples`: the exact nearest rank up to KLL_EXACT samples; past them one of the samples
    whose rank is within KLL's error."""

    def __init__(self, samples: list[float], percent: int) -> None:
        self.samples, self.q = sorted(samples), percent / 100
        self.exact = self.samples[max(1, -(-len(samples) * percent // 100)) - 1]

    def __eq__(self, other: object) -> bool:
        if len(self.samples) <= KLL_EXACT or not isinstance(other, float):
            return other == self.exact
        n = len(self.samples)
        below, through = bisect.bisect_left(self.samples, other), bisect.bisect_right(self.samples, other)
        return through > below and below / n - KLL_RANK_ERROR <= self.q <= through / n + KLL_RANK_ERROR

    def __repr__(self) -> str:
        return f"Quantile({self.exact!r} of {len(self.samples)})"


# The code under test, and the comparison.

def rolled_up(spark, points: list[dict], reading: Reading) -> dict[str, dict[Key, dict]]:
    """Rows by path ("rollup": aggregate.rollup over the points; "job": the job's passes) and key."""
    read = spark.createDataFrame([p for p in points if reading.reads(p)], POINTS_SCHEMA)
    since = None if reading.since_s is None else (T0 + reading.since_s) * 10**6
    read_from = None if reading.read_from_s is None else (T0 + reading.read_from_s) * 10**6
    direct = rollup(read, RESOLUTIONS, since_micros=since, read_from_micros=read_from)
    # As job.run: the first pass's state from the records in the range, batch by batch, then the cumulative pass.
    state, counts, _ = first_pass(batch_state(spark, read if since is None else read.filter(
        F.col("record_micros") >= since), 3, size_seconds=RESOLUTIONS[0].seconds), OPTIONS)
    if counts.cumulative:
        state, _ = add_cumulative(state, read, OPTIONS, since, read_from)
    job = rollup_state(state, RESOLUTIONS, DEFAULT_DIMENSIONS, counts.histograms > 0)
    rows: dict[str, dict[Key, dict]] = {"rollup": {}, "job": {}}
    both = direct.withColumn("path", F.lit("rollup")).unionByName(job.withColumn("path", F.lit("job")))
    for r in both.selectExpr("*", "unix_seconds(window_start) AS start_s", "unix_seconds(window_end) AS end_s",
                             "unix_micros(last_at) AS last_micros").collect():
        key = (r["resolution"], r["start_s"] - T0, r["metric"], r["type"], r["client_id"], r["client_software_name"],
               r["client_software_version"], r["attributes"], None if r["bounds"] is None else tuple(r["bounds"]))
        rows[r["path"]][key] = {**r.asDict(), "last_at": r["last_micros"], "length": r["end_s"] - r["start_s"]}
    return rows


COLUMNS = ("count", "nan_count", "min", "max", "sum", "avg", "last", "last_at", "p50", "p95", "p99", "increase",
           "rate", "instances", "bucket_counts")


def normalised(row: dict, key: Key, counted: bool) -> dict:
    """Nothing added is nothing, whether it shows as null or zero (the docs do not say which)."""
    row = dict(row)
    if counted:
        row["increase"], row["rate"] = row["increase"] or 0.0, row["rate"] or 0.0
    if key[3] in ("histogram", "exponential_histogram", "summary") and not row["count"]:
        row.update(count=0, sum=row["sum"] or 0.0)
        if key[8]:
            row["bucket_counts"] = row["bucket_counts"] or [0] * (len(key[8]) + 1)
    return row


def same(expected: object, actual: object) -> bool:
    if isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected):
        return math.isnan(actual)
    return expected == actual


def mismatches(spark, seed: int, reading: Reading, cases: int = CASES) -> list[str]:
    """What the code's rows (both paths) get wrong against the reference, one line each."""
    points = fleet(seed, cases)
    expected = reference_rows(points, reading)
    found = []
    for path, actual in rolled_up(spark, points, reading).items():
        where = f"seed {seed}, {reading.name}, {path}"
        found += [f"{where}: no row {key}" for key in sorted(set(expected) - set(actual), key=repr)]
        found += [f"{where}: unexpected row {key}" for key in sorted(set(actual) - set(expected), key=repr)]
        for key in sorted(set(expected) & set(actual), key=repr):
            counted = expected[key]["increase"] is not None   # the reference's counted sums always have one
            want, got = normalised(expected[key], key, counted), normalised(actual[key], key, counted)
            found += [f"{where}: {key} {column}: expected {want[column]!r}, got {got[column]!r}"
                      for column in COLUMNS if not same(want[column], got[column])]
            if got["length"] != {r.label: r.seconds for r in RESOLUTIONS}[key[0]]:
                found.append(f"{where}: {key} ends {got['length']} s after its start")
    return found


@pytest.mark.parametrize("reading", READINGS, ids=[r.name for r in READINGS])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_fleets_roll_up_as_the_docs_say_in_every_window_both_paths(spark, seed, reading):
    found = mismatches(spark, seed, reading)
    assert not found, f"seed {seed}, {reading.name}: {len(found)} mismatches, first:\n" + "\n".join(found[:20])


def test_the_random_fleets_hold_every_case_the_comparison_is_meant_to_cover():
    """Without these the comparison above would pass for want of cases."""
    points = [p for seed in SEEDS for p in fleet(seed)]
    seen = set()
    streams = defaultdict(list)
    for p in points:
        streams[p["client_id"], p["client_instance_id"], p["resource"], p["scope"], p["metric"], p["attributes"],
                p["type"]].append(p)
        seen |= {name for name, holds in (
            ("NaN gauge", p["type"] == "gauge" and p["value"] is not None and math.isnan(p["value"])),
            ("infinite gauge", p["type"] == "gauge" and p["value"] is not None and math.isinf(p["value"])),
            ("counter without a value", p["type"] == "sum" and p["monotonic"] and p["value"] is None),
            ("other writer", p["client_instance_id"] is None), ("before the hour", p["record_micros"] < T0 * 10**6),
            ("histogram without a sum", p["type"] == "histogram" and p["sum"] is None),
            ("histogram without bounds", p["type"] == "histogram" and p["bounds"] == []),
            ("on a window's edge", p["record_micros"] % 60_000_000 in (0, 59_999_999)),
            ("start where a reading starts", p["start_ns"] in (ns(-300), ns(-3900)))) if holds}
    for (_, _, _, _, metric, _, kind), stream in streams.items():
        by_time = sorted(stream, key=lambda p: p["time_ns"])
        newest_before_the_hour = max((p["time_ns"] for p in stream if p["record_micros"] < T0 * 10**6), default=0)
        pairs = list(zip(by_time, by_time[1:]))
        seen |= {name for name, holds in (
            ("dense gauge", metric == "g" and len(stream) > 400),
            ("pushes further apart than the lookback", any(
                b["time_ns"] - a["time_ns"] > LOOKBACK_S * 10**9 and b["record_micros"] > T0 * 10**6
                for a, b in pairs)),
            ("late delivery", any(a["record_micros"] > b["record_micros"] for a, b in pairs)),
            ("duplicate", any(a["time_ns"] == b["time_ns"] for a, b in pairs)),
            ("counter drop", metric == "c" and any(
                not missing(a["value"]) and not missing(b["value"]) and b["value"] < a["value"]
                and a["start_ns"] == b["start_ns"] for a, b in pairs)),
            ("new start time", metric in ("c", "hc", "q") and any(a["start_ns"] != b["start_ns"] for a, b in pairs)),
            ("bounds changed", metric == "hc" and any(a["bounds"] != b["bounds"] for a, b in pairs)),
            ("stale in the second hour", any(
                p["record_micros"] >= T0 * 10**6 and p["time_ns"] < newest_before_the_hour for p in stream))) if holds}
    scopes, bounds = defaultdict(set), defaultdict(set)
    for p in points:
        scopes[p["client_instance_id"], p["metric"], p["attributes"]].add(p["scope"])
        if p["type"] == "histogram":
            bounds[p["client_id"], p["metric"], p["attributes"]].add(tuple(p["bounds"]))
    seen |= {"two scopes"} if any(len(s) > 1 for s in scopes.values()) else set()
    seen |= {"bounds that disagree"} if any(len(b) > 1 for b in bounds.values()) else set()
    assert seen >= {"NaN gauge", "infinite gauge", "counter without a value", "other writer", "before the hour",
                    "histogram without a sum", "histogram without bounds", "on a window's edge",
                    "start where a reading starts", "dense gauge", "pushes further apart than the lookback",
                    "late delivery", "duplicate", "counter drop", "new start time", "bounds changed",
                    "stale in the second hour", "two scopes", "bounds that disagree"}
