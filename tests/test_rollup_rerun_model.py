"""Seeded random sequences of rollup runs over one output directory, checked after every run against a reference
written from docs/rollups.md (Windows, What each row holds, Output and re-runs, the CLI options), not from the code.

Each sequence has a fresh two-partition topic (and a second one, read now and then in its place: a topic that no
longer holds the records of windows written earlier, as after retention) on a real embedded broker, a fresh output
directory and a "now" that moves forward between runs, across a UTC midnight. Records arrive between runs, most at
the time they are written, some back-dated into windows already written, a quarter on a window's first millisecond.
The runs go through `run_rollup`, the entry point `kcm rollup` calls, with the clock frozen at the sequence's now:
`--from/--to` (half of them an earlier run's range again), `--from` alone (`--to` defaults to now), `--last`, and
offsets (earliest/latest, or per partition a starting and/or ending offset cutting it, at its end or first record
too), at `1m,1h`, `1h,1m`, `1m`, `1h`, `5m,1h` or `1m,1d`, with the default dimensions or `--group-by client_id`.
Some runs are repeated at once.

The reference keeps, per (resolution, window), the rows it must hold: per client and metric the `count` and the gauge's
`sum` or the delta sum's `increase`, and the window's `partial`; the per-window math itself is
tests/test_rollup_model.py's. Checked after each run:
- a time range is widened to whole windows of the run's coarsest resolution; every window of its resolutions inside it
  is replaced by what the topic holds there (a window without records is removed, and a partition left empty too);
  rows of other resolutions and of windows outside it stay;
- offsets replace exactly the windows they compute; windows a starting (ending) offset cuts are partial up to the
  window of the first record read (from that of the last one read);
- a window that has not ended at now is partial, and a later run over it completes it; one ending at now has ended;
- rows are written under `resolution=`/`date=` of their window's start (UTC), never twice for one key;
- partitions a run neither writes nor replaces windows of keep their very files; other entries in the output
  (`_`- and `.`-named ones, an empty directory) stay; a directory holding other files is refused, nothing changed;
- the summary: rows written, windows per resolution, input records; the top rows are the latest coarsest window's;
- the same run again gives the same output, column by column.
A failure names its seed and step (set SEEDS to that seed to replay it).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet
import pytest
from kafka import KafkaProducer
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.metrics.v1 import metrics_pb2

import kcm_rollups.job as job
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.broker import EmbeddedBroker
import spark_support

spark = spark_support.spark   # the suite's one SparkSession, a fixture found by pytest under this name

SEEDS = tuple(range(1, 11))
BASE_S = int(datetime(2025, 12, 31, 22, 0, tzinfo=timezone.utc).timestamp())   # 22:00: runs cross a date (a year)
SIZES = {"1m": 60, "5m": 300, "1h": 3600, "1d": 86400}
CLIENTS = ("app-a", "app-b", "app-c")
GAUGE, SENT = "model.queue.size", "model.records.sent"
SOFTWARE = ("librdkafka", "2.3.0")
DEFAULT_GROUP = ("client_id", "client_software_name", "client_software_version", "attributes")
RESOLUTION_TEXTS = ("1m,1h", "1m,1h", "1m,1h", "1h,1m", "1m", "1h", "5m,1h", "1m,1d")
PARTITIONS = 2
TOP = 10


@dataclass(frozen=True)
class Record:
    """A push on a topic: written at `at_ms` (its Kafka timestamp) by `client`, a gauge sample and a delta."""

    at_ms: int
    client: str
    gauge: int
    sent: int
    partition: int = 0


@dataclass(frozen=True)
class Run:
    """One `kcm rollup` at `now_s` over topic `topic` (0: the sequence's, 1: its other): a time range (start/end,
    or last), or offsets (starting/ending: (partition, offset) pairs, -2 earliest, -1 latest; left out: the same)."""

    now_s: float
    topic: int
    resolutions: str
    group_by: tuple[str, ...]
    start_s: float | None = None
    end_s: float | None = None
    last_s: int | None = None
    starting: tuple[tuple[int, int], ...] = ()
    ending: tuple[tuple[int, int], ...] = ()

    def sizes(self) -> list[tuple[str, int]]:
        labels = {label.strip() for label in self.resolutions.split(",")}
        return sorted(((label, SIZES[label]) for label in labels), key=lambda item: item[1])

    def span(self) -> tuple[int, int] | None:
        """docs: `[from, to)` (`--to` defaults to now) or `[now - last, now)`, widened to whole coarsest windows."""
        if self.last_s is not None:
            start, end = self.now_s - self.last_s, self.now_s
        elif self.start_s is not None:
            start, end = self.start_s, self.end_s if self.end_s is not None else self.now_s
        else:
            return None
        coarsest = self.sizes()[-1][1]
        return math.floor(start / coarsest) * coarsest, math.ceil(end / coarsest) * coarsest


@dataclass
class Window:
    """What the output must hold for one (resolution, window start): rows by (client, metric, software) as
    (count, sum or increase), and whether the window is partial."""

    rows: dict[tuple[str, str, tuple[str, str] | None], tuple[int, float]]
    partial: bool


@dataclass
class Sequence:
    """One output directory and its topics as the runs go: what the topics hold and what the output must hold."""

    seed: int
    output: Path
    topics: tuple[str, str]
    records: tuple[list[Record], list[Record]] = field(default_factory=lambda: ([], []))
    expected: dict[tuple[str, int], Window] = field(default_factory=dict)
    step: int = 0
    ranges: list[tuple[float, float]] = field(default_factory=list)   # the --from/--to of the runs so far
    seen: dict[str, int] = field(default_factory=dict)   # what the sequence exercised: coverage, over all seeds

    def where(self, what: str) -> str:
        return f"seed {self.seed}, step {self.step}: {what}"


@pytest.fixture(scope="module")
def kafka() -> Any:
    """One broker for the whole file: every sequence has topics of its own."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        yield KafkaSettings(broker.bootstrap)
    finally:
        broker.stop()


@pytest.fixture
def frozen(monkeypatch, spark):
    """`run_rollup` on the suite's session, with the job's clock at `frozen.now_s` (`--last`, a `--to` left out,
    and which windows have ended all read it)."""

    class Clock:
        now_s = float(BASE_S)

    class FrozenDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.fromtimestamp(Clock.now_s, tz or timezone.utc)

    monkeypatch.setattr(job, "datetime", FrozenDatetime)
    monkeypatch.setattr(job, "_started", lambda master: spark)
    return Clock


def _push(record: Record) -> bytes:
    data = metrics_pb2.MetricsData()
    scope = data.resource_metrics.add().scope_metrics.add()
    scope.scope.CopyFrom(InstrumentationScope(name=record.client))
    t_ns = record.at_ms * 10**6
    scope.metrics.add(name=GAUGE).gauge.data_points.add(time_unix_nano=t_ns, as_double=float(record.gauge))
    sent = scope.metrics.add(name=SENT)
    sent.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    sent.sum.is_monotonic = True
    sent.sum.data_points.add(start_time_unix_nano=t_ns - 10**9, time_unix_nano=t_ns, as_int=record.sent)
    return data.SerializeToString()


def _produce(kafka: KafkaSettings, sequence: Sequence, topic: int, records: list[Record]) -> None:
    producer = KafkaProducer(**kafka.client_options())
    try:
        for record in records:
            headers = [("client_id", record.client.encode()), ("client_instance_id", f"{record.client}-0".encode()),
                       ("client_software_name", SOFTWARE[0].encode()),
                       ("client_software_version", SOFTWARE[1].encode())]
            # One record per batch: offsets and the broker's end offsets are exact.
            producer.send(sequence.topics[topic], value=_push(record), key=record.client.encode(), headers=headers,
                          partition=record.partition, timestamp_ms=record.at_ms).get(timeout=10)
    finally:
        producer.close()
    sequence.records[topic].extend(records)


# -- the reference, from docs/rollups.md -----------------------------------------------------------------------------

def _read_by(run: Run, records: list[Record]) -> list[Record]:
    """docs: a time range takes the records whose Kafka timestamp is in it (widened); offsets take [start, end)."""
    span = run.span()
    if span is not None:
        return [r for r in records if span[0] * 1000 <= r.at_ms < span[1] * 1000]
    read = []
    for partition in range(PARTITIONS):
        start, end = _offsets(run, partition, records)
        read += _in(partition, records)[start:end]
    return read


def _in(partition: int, records: list[Record]) -> list[Record]:
    """A partition's records, by offset (one record per batch: an offset per record, from 0)."""
    return [r for r in records if r.partition == partition]


def _offsets(run: Run, partition: int, records: list[Record]) -> tuple[int, int]:
    start, end = dict(run.starting).get(partition, -2), dict(run.ending).get(partition, -1)
    return (0 if start == -2 else start), (len(_in(partition, records)) if end == -1 else end)


def _cuts(run: Run, records: list[Record]) -> tuple[int | None, int | None]:
    """docs (Windows, Edges): windows up to the one of the first record read in a partition a starting offset cuts
    (the latest such), or of its last record when nothing of it is read; from the one of the last record read in a
    partition an ending offset cuts (the earliest such), or of its first record when nothing of it is read."""
    firsts, lasts = [], []
    for partition in range(PARTITIONS):
        held = _in(partition, records)
        start, end = _offsets(run, partition, records)
        if 0 < start < len(held):
            firsts.append(held[start].at_ms)
        elif 0 < start == len(held):
            firsts.append(held[-1].at_ms)
        if 0 < end < len(held):
            lasts.append(held[end - 1].at_ms)
        elif end == 0 < len(held):
            lasts.append(held[0].at_ms)
    return max(firsts, default=None), min(lasts, default=None)


def _computed(run: Run, records: list[Record]) -> dict[tuple[str, int], Window]:
    """The windows a run computes, each from the records it reads there, partial as docs/rollups.md (Windows) says."""
    read = _read_by(run, records)
    cut_up_to_ms, cut_from_ms = _cuts(run, records) if run.span() is None else (None, None)
    software = SOFTWARE if "client_software_name" in run.group_by else None
    windows: dict[tuple[str, int], Window] = {}
    for label, size in run.sizes():
        for record in read:
            start = record.at_ms // (size * 1000) * size
            partial = (start + size > run.now_s
                       or (cut_up_to_ms is not None and start * 1000 <= cut_up_to_ms)
                       or (cut_from_ms is not None and (start + size) * 1000 > cut_from_ms))
            window = windows.setdefault((label, start), Window({}, partial))
            for metric, value in ((GAUGE, record.gauge), (SENT, record.sent)):
                count, total = window.rows.get((record.client, metric, software), (0, 0.0))
                window.rows[(record.client, metric, software)] = (count + 1, total + value)
    return windows


def _replaced(run: Run, expected: dict[tuple[str, int], Window], computed: dict) -> set[tuple[str, int]]:
    """docs: a time range replaces every window of its resolutions inside it; offsets the windows they computed."""
    span = run.span()
    if span is None:
        return set(computed)
    labels = {label for label, _ in run.sizes()}
    return {key for key in expected if key[0] in labels and span[0] <= key[1] < span[1]} | set(computed)


def _may_change(run: Run, computed: dict) -> set[tuple[str, str]]:
    """The (resolution, date) partitions a run may rewrite: those of its windows; all others keep their files."""
    span = run.span()
    if span is None:
        return {(label, _date(start)) for label, start in computed}
    days = [*range(span[0], span[1], 3600), span[1] - 1]
    return {(label, _date(day)) for label, _ in run.sizes() for day in days}


def _date(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d")


# -- the output, as written -------------------------------------------------------------------------------------------

def _epoch(value: datetime) -> int:
    return int((value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp())


def _rows(output: Path) -> list[dict[str, Any]]:
    """Every row under `output`, read file by file, with the partition it lies in as `resolution` and `date`."""
    rows = []
    for file in sorted(output.glob("resolution=*/date=*/*.parquet")):
        resolution, date = file.parent.parent.name.split("=", 1)[1], file.parent.name.split("=", 1)[1]
        for row in pyarrow.parquet.read_table(file).to_pylist():
            rows.append({**row, "resolution": resolution, "date": date})
    return rows


def _files(output: Path) -> dict[str, tuple[int, int]]:
    """Every file under `output` with its size and modification time: what a run must leave alone."""
    return {str(path.relative_to(output)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in output.rglob("*") if path.is_file()}


def _observed(sequence: Sequence) -> dict[tuple[str, int], Window]:
    """The output as the reference's windows, after checking what every row must satisfy."""
    windows: dict[tuple[str, int], Window] = {}
    keys = set()
    for row in _rows(sequence.output):
        start, end = _epoch(row["window_start"]), _epoch(row["window_end"])
        where = sequence.where(f"row {row['resolution']} {row['window_start']} {row['client_id']} {row['metric']}")
        assert end - start == SIZES[row["resolution"]] and start % SIZES[row["resolution"]] == 0, where
        assert row["date"] == _date(start), where + ": under the date of another day"
        key = (row["resolution"], start, row["metric"], row["type"], row["client_id"],
               row.get("client_software_name"), row.get("client_software_version"), row.get("attributes"))
        assert key not in keys, where + ": written twice"
        keys.add(key)
        assert row["instances"] == 1, where
        software = (row["client_software_name"], row["client_software_version"]) if row.get(
            "client_software_name") is not None else None
        value = row["sum"] if row["metric"] == GAUGE else row["increase"]
        assert row["type"] == ("gauge" if row["metric"] == GAUGE else "sum"), where
        window = windows.setdefault((row["resolution"], start), Window({}, row["partial"]))
        assert window.partial == row["partial"], where + ": rows of one window disagree on partial"
        window.rows[(row["client_id"], row["metric"], software)] = (row["count"], value)
    return windows


def _whole_rows(output: Path) -> list[tuple]:
    return sorted(tuple(sorted((k, repr(v)) for k, v in row.items())) for row in _rows(output))


# -- a sequence ------------------------------------------------------------------------------------------------------

def _execute(kafka: KafkaSettings, frozen: Any, sequence: Sequence, run: Run) -> Any:
    frozen.now_s = run.now_s
    topic = sequence.topics[run.topic]
    chosen: dict[str, Any] = {"resolutions": run.resolutions, "dimensions": run.group_by}
    if run.last_s is not None:
        chosen["last"] = timedelta(seconds=run.last_s)
    elif run.start_s is not None:
        chosen["start"] = datetime.fromtimestamp(run.start_s, timezone.utc)
        if run.end_s is not None:
            chosen["end"] = datetime.fromtimestamp(run.end_s, timezone.utc)
    else:
        if run.starting:
            chosen["starting_offsets"] = json.dumps({topic: {str(p): offset for p, offset in run.starting}})
        if run.ending:
            chosen["ending_offsets"] = json.dumps({topic: {str(p): offset for p, offset in run.ending}})
    return job.run_rollup(kafka.bootstrap_servers, topic, str(sequence.output), **chosen)


def _run_and_check(kafka: KafkaSettings, frozen: Any, sequence: Sequence, run: Run) -> None:
    """Run once, then check the output, the files left alone and the summary against the reference."""
    sequence.step += 1
    where = sequence.where(repr(run))
    records = sequence.records[run.topic]
    computed = _computed(run, records)
    replaced = _replaced(run, sequence.expected, computed)
    before = dict(sequence.expected)
    files = _files(sequence.output) if sequence.output.exists() else {}
    result = _execute(kafka, frozen, sequence, run)

    for key in replaced:
        sequence.expected.pop(key, None)
    sequence.expected.update(computed)
    observed = _observed(sequence)
    assert observed == sequence.expected, where + _difference(observed, sequence.expected)
    partitions = {(label, _date(start)) for label, start in sequence.expected}
    on_disk = {(p.parent.name.split("=", 1)[1], p.name.split("=", 1)[1])
               for p in sequence.output.glob("resolution=*/date=*")}
    assert on_disk == partitions, where + ": a partition left empty stays, or one is missing"
    may_change = _may_change(run, computed)
    after = _files(sequence.output)
    for name, stat in files.items():
        parts = Path(name).parts
        if len(parts) >= 3 and parts[0].startswith("resolution=") and parts[1].startswith("date="):
            if (parts[0].split("=", 1)[1], parts[1].split("=", 1)[1]) in may_change:
                continue
        assert after.get(name) == stat, where + f": {name} was changed, outside the run's windows"

    assert result.rows_written == sum(len(w.rows) for w in computed.values()), where
    windows: dict[str, int] = {}
    for label, _ in computed:
        windows[label] = windows.get(label, 0) + 1
    assert result.windows == windows, where
    assert result.input_records == len(_read_by(run, records)), where
    coarsest = run.sizes()[-1][0]
    latest = max((start for label, start in computed if label == coarsest), default=None)
    if latest is None:
        assert result.top_rows == [], where
    else:
        window = computed[(coarsest, latest)]
        top = {(r["client_id"], r["metric"]): (r["count"], r["partial"], _epoch(r["window_start"]))
               for r in result.top_rows}
        assert len(result.top_rows) == min(TOP, len(window.rows)), where
        assert top == {(client, metric): (count, window.partial, latest)
                       for (client, metric, _), (count, _) in window.rows.items()}, where + ": top rows"

    # What the sequence exercised, for the coverage check over all seeds.
    for key, window in computed.items():
        old = before.get(key)
        if old is not None and old.partial and not window.partial:
            _saw(sequence, "a partial window completed")
        if old is not None and not old.partial and old.rows != window.rows:
            _saw(sequence, "a written window rewritten with records that came later")
        if window.partial and key[1] + SIZES[key[0]] <= run.now_s:
            _saw(sequence, "a window cut by offsets")
        if key[1] + SIZES[key[0]] == run.now_s:
            _saw(sequence, "a window ending at now")
    if any(key not in computed for key in replaced if key in before):
        _saw(sequence, "a window without records removed")
    labels = {label for label, _ in run.sizes()}
    span = run.span()
    if span and any(key[0] not in labels and span[0] <= key[1] < span[1] for key in sequence.expected):
        _saw(sequence, "another resolution's windows in the range kept")


def _saw(sequence: Sequence, what: str) -> None:
    sequence.seen[what] = sequence.seen.get(what, 0) + 1


def _difference(observed: dict, expected: dict) -> str:
    lines = []
    for key in sorted(set(observed) | set(expected)):
        if observed.get(key) != expected.get(key):
            lines.append(f"  {key}: written {observed.get(key)}, expected {expected.get(key)}")
    return "\n" + "\n".join(lines[:12])


def _records(rng: random.Random, count: int, since_s: float, until_s: float) -> list[Record]:
    """`count` records written in [since_s, until_s): a quarter at the very start of a minute, some of an hour (a
    window's first millisecond, where a cut or a range's end lies)."""
    records = []
    for _ in range(count):
        at_ms = rng.randrange(int(since_s * 1000), int(until_s * 1000))
        snapped = at_ms - at_ms % rng.choice((1, 1, 1, 60_000, 3_600_000))
        records.append(Record(at_ms=snapped if snapped >= since_s * 1000 else at_ms, client=rng.choice(CLIENTS),
                              gauge=rng.randint(0, 100), sent=rng.randint(1, 50), partition=rng.randrange(PARTITIONS)))
    return records


def _random_run(rng: random.Random, sequence: Sequence, now_s: float) -> Run:
    topic = 1 if rng.random() < 0.3 else 0
    common = {"now_s": now_s, "topic": topic, "resolutions": rng.choice(RESOLUTION_TEXTS),
              "group_by": ("client_id",) if rng.random() < 0.15 else DEFAULT_GROUP}
    kind = rng.choices(("range", "last", "from", "offsets"), (40, 15, 10, 35))[0]
    if kind == "range":
        if sequence.ranges and rng.random() < 0.5:
            start, end = rng.choice(sequence.ranges)   # a re-run of an earlier range, later
            common["topic"] = rng.choice((0, 1))
        else:
            start = rng.randint(BASE_S - 1800, int(now_s) + 600) + rng.choice((0, 0, 0.25))
            end = start + rng.choice((1, 59, 61, 900, 3600, 7200)) + rng.randint(0, 400)
        sequence.ranges.append((start, end))
        return Run(start_s=start, end_s=end, **common)
    if kind == "last":
        return Run(last_s=rng.choice((60, 600, 3600, 4200, 7200)), **common)
    if kind == "from":
        return Run(start_s=now_s - rng.randint(30, 5400), **common)
    starting, ending = [], []
    for partition in range(PARTITIONS):
        count = len(_in(partition, sequence.records[topic]))
        start = rng.choice((None, -2, 0, rng.randint(0, count), rng.randint(0, count)))
        if start is not None:
            starting.append((partition, start))
        end = rng.choice((None, None, -1, rng.randint(max(start or 0, 0), count)))
        if end is not None and 0 < end == start < count:
            end = count   # nothing read, but neither at the partition's end nor at its first record: docs are silent
        if end is not None:
            ending.append((partition, end))
    return Run(starting=tuple(starting), ending=tuple(ending), **common)


def _sequence(kafka: KafkaSettings, frozen: Any, spark: Any, tmp_path: Path, seed: int) -> Sequence:
    rng = random.Random(seed)
    topics = (f"reruns-{seed}-a", f"reruns-{seed}-b")
    for topic in topics:
        ensure_topic(kafka, topic, PARTITIONS)
    sequence = Sequence(seed=seed, output=tmp_path / f"out-{seed}", topics=topics)
    extras = {}
    if rng.random() < 0.5:
        # Entries the docs let an output hold beside the rollups: Spark's `_`/`.` ones and an empty directory.
        (sequence.output / "lost+found").mkdir(parents=True)
        (sequence.output / "_notes").write_text("kept")
        (sequence.output / ".hidden").write_text("kept")
        extras = _files(sequence.output)
    now_s = BASE_S + rng.randint(20 * 60, 150 * 60)
    _produce(kafka, sequence, 0, _records(rng, rng.randint(10, 30), BASE_S - 1800, now_s))
    _produce(kafka, sequence, 1, _records(rng, rng.randint(2, 8), BASE_S - 1800, now_s))
    for index in range(rng.randint(2, 4)):
        if index:
            previous, now_s = now_s, now_s + rng.randint(0, 90 * 60)
            late = _records(rng, rng.randint(0, 3), BASE_S - 1800, now_s)   # back-dated: windows already written
            fresh = _records(rng, rng.randint(0, 8), previous, now_s) if now_s > previous else []
            if rng.random() < 0.3:
                now_s = now_s // 60 * 60 + 60   # a minute ending right at now, with a record
                fresh += _records(rng, 1, now_s - 60, now_s)
            _produce(kafka, sequence, 0, late + fresh)
        run = _random_run(rng, sequence, now_s)
        _run_and_check(kafka, frozen, sequence, run)
        if rng.random() < 0.15:
            whole = _whole_rows(sequence.output)
            _run_and_check(kafka, frozen, sequence, run)
            assert _whole_rows(sequence.output) == whole, sequence.where("the same run twice differs")
            _saw(sequence, "a run repeated")
        assert {k: v for k, v in _files(sequence.output).items() if k in extras} == extras, sequence.where("extras")
    return sequence


def test_random_sequences_of_runs_replace_exactly_their_windows(kafka, frozen, spark, tmp_path):
    seen: dict[str, int] = {}
    runs = 0
    for seed in SEEDS:
        sequence = _sequence(kafka, frozen, spark, tmp_path, seed)
        runs += sequence.step
        for what, count in sequence.seen.items():
            seen[what] = seen.get(what, 0) + count
    print("exercised:", seen, "runs:", runs)
    assert set(seen) == {"a partial window completed", "a written window rewritten with records that came later",
                         "a window cut by offsets", "a window without records removed",
                         "another resolution's windows in the range kept", "a run repeated",
                         "a window ending at now"}, seen


def test_an_output_holding_other_files_is_refused_with_nothing_changed(kafka, frozen, tmp_path):
    """docs: a directory holding anything but `resolution=` directories, `_`/`.` entries and empty directories is
    one line, with nothing changed."""
    sequence = _directed(kafka, tmp_path, "refused")
    _produce(kafka, sequence, 0, [Record(at_ms=(BASE_S + 30) * 1000, client="app-a", gauge=3, sent=4)])
    run = Run(now_s=BASE_S + 7200, topic=0, resolutions="1m,1h", group_by=DEFAULT_GROUP, start_s=BASE_S,
              end_s=BASE_S + 3600)
    _run_and_check(kafka, frozen, sequence, run)
    (sequence.output / "reports").mkdir()
    (sequence.output / "reports" / "q1.csv").write_text("a,b\n")
    files = _files(sequence.output)
    with pytest.raises(UserError, match="holds files that are not kcm rollups"):
        _execute(kafka, frozen, sequence, run)
    assert _files(sequence.output) == files


def _directed(kafka: KafkaSettings, tmp_path: Path, name: str) -> Sequence:
    sequence = Sequence(seed=0, output=tmp_path / name, topics=(f"reruns-{name}-a", f"reruns-{name}-b"))
    for topic in sequence.topics:
        ensure_topic(kafka, topic, PARTITIONS)
    return sequence


def test_a_range_the_topic_no_longer_holds_removes_its_windows_and_the_partitions_left_empty(kafka, frozen,
                                                                                           tmp_path):
    """A range over midnight written from one topic, then re-run over the other (as after retention deleted the
    records): the new day's windows have no records any more, so they go, their partitions with them; the old day's
    are rewritten from what is left. Then a window still open at now is partial, and a later run (`--from` alone,
    more than an hour back) completes it. Last, offsets computing an hour but not its first minute keep that
    minute's row, and cut windows up to the latest of the two partitions' cuts (one read from its fourth record, the
    other from its end)."""
    sequence = _directed(kafka, tmp_path, "emptied")
    midnight = BASE_S + 7200
    _produce(kafka, sequence, 0, [Record((midnight - 1800) * 1000, "app-a", 1, 2),
                                  Record((midnight + 1800) * 1000, "app-b", 3, 4, partition=1),
                                  Record(midnight * 1000, "app-b", 5, 6)])
    _produce(kafka, sequence, 1, [Record((midnight - 900) * 1000, "app-c", 5, 6)])
    both = {"resolutions": "1m,1h", "group_by": DEFAULT_GROUP, "start_s": midnight - 3600, "end_s": midnight + 3600}
    _run_and_check(kafka, frozen, sequence, Run(now_s=midnight + 7200, topic=0, **both))
    assert {key[1] for key in sequence.expected} >= {midnight, midnight + 1800}
    _run_and_check(kafka, frozen, sequence, Run(now_s=midnight + 7200, topic=1, **both))
    assert not list(sequence.output.glob(f"resolution=*/date={_date(midnight)}"))
    # Open at now (minute 10 of the new day's first hour), then complete.
    _produce(kafka, sequence, 0, [Record((midnight + 600) * 1000, "app-a", 7, 8)])
    _run_and_check(kafka, frozen, sequence, Run(now_s=midnight + 630, topic=0, resolutions="1m,1h",
                                                group_by=DEFAULT_GROUP, last_s=3600))
    assert sequence.expected[("1h", midnight)].partial and sequence.expected[("1m", midnight + 600)].partial
    _produce(kafka, sequence, 0, [Record((midnight + 605) * 1000, "app-a", 9, 10),
                                  Record((midnight + 1200) * 1000, "app-c", 11, 12),
                                  Record((midnight + 7210) * 1000, "app-c", 13, 14)])
    _run_and_check(kafka, frozen, sequence, Run(now_s=midnight + 7260, topic=0, resolutions="1m,1h",
                                                group_by=DEFAULT_GROUP, start_s=midnight + 1))
    assert not sequence.expected[("1h", midnight)].partial and sequence.expected[("1m", midnight + 600)].rows[
        ("app-a", SENT, SOFTWARE)] == (2, 18.0)
    assert ("1m", midnight + 7200) in sequence.expected
    _run_and_check(kafka, frozen, sequence, Run(now_s=midnight + 7260, topic=0, resolutions="1m,1h",
                                                group_by=DEFAULT_GROUP, starting=((0, 3), (1, 1))))
    assert ("1m", midnight) in sequence.expected and sequence.expected[("1m", midnight + 1200)].partial


def test_a_range_leaves_the_partitions_of_other_days_unread(kafka, frozen, tmp_path):
    """docs (Output and re-runs): other partitions are left alone, and not even read. A file that is not Parquet in
    the partition of the day before a range's (an hour after midnight) must not make the run fail."""
    sequence = _directed(kafka, tmp_path, "neighbour")
    midnight = BASE_S + 7200
    _produce(kafka, sequence, 0, [Record((midnight + 3600 + 30) * 1000, "app-a", 1, 2)])
    neighbour = sequence.output / "resolution=1m" / f"date={_date(midnight - 1)}"
    neighbour.mkdir(parents=True)
    (neighbour / "part-0.parquet").write_bytes(b"not parquet")
    _execute(kafka, frozen, sequence, Run(now_s=midnight + 7200, topic=0, resolutions="1m,1h",
                                          group_by=DEFAULT_GROUP, start_s=midnight + 3600, end_s=midnight + 7200))
    assert (neighbour / "part-0.parquet").read_bytes() == b"not parquet"
