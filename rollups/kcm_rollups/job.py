"""The rollup job: read the metrics topic, decode in Spark, roll up, and replace exactly the computed windows in Parquet.

`run_rollup(...)` is the one entry point: `kcm rollup`, `spark-submit` and the demo all call it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings, KafkaUnavailableError, check_reachable, is_utf8, rejected_message
from kcm_common.librdkafka import librdkafka_config
from kcm_rollups.aggregate import DEFAULT_DIMENSIONS, GROUPABLE
from kcm_rollups.windows import EARLIEST_TIME, Resolution, parse_resolutions, widen
from kcm_rollups.windows import label as duration_label

if TYPE_CHECKING:
    from kcm_rollups.otlp import OtlpTarget

log = logging.getLogger("kcm.rollup")
# The authentication check's librdkafka logger: failures reach its error callback and are reported once, by it.
_QUIET_LIBRDKAFKA = logging.getLogger("kcm.rollup.check")
_QUIET_LIBRDKAFKA.setLevel(logging.CRITICAL)

DEFAULT_LOOKBACK_SECONDS = 300
# The masters Spark starts with: SparkContext's local forms, and the cluster managers spark-submit knows.
_MASTER_URL = re.compile(r"local(\[([1-9][0-9]*|\*)(\s*,\s*[0-9]+)?\])?"
                         r"|local-cluster\[\s*[0-9]+\s*,\s*[0-9]+\s*,\s*[0-9]+\s*\]|(spark|k8s)://.+|yarn")
# The columns of the top rows, a run's other dimensions after `client_id` (rows differing only in those would read the
# same); `attributes` only when a row has any.
TOP_COLUMNS = ("resolution", "window_start", "partial", "client_id", "metric", "type", "instances", "count", "avg",
               "p99", "last", "increase", "rate")


@dataclass(frozen=True)
class RollupOptions:
    """What one run reads and writes; `start`/`end` select records by Kafka timestamp, widened to whole windows."""

    kafka: KafkaSettings
    topic: str
    output: str
    resolutions: tuple[Resolution, ...]
    start: datetime | None = None
    end: datetime | None = None
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    dimensions: tuple[str, ...] = DEFAULT_DIMENSIONS
    lookback_seconds: int = DEFAULT_LOOKBACK_SECONDS
    min_partitions: int | None = None
    top: int = 10
    otlp: OtlpTarget | None = None   # also export the rows written (kcm_rollups.otlp)

    def __post_init__(self) -> None:
        from kcm_rollups.source import EARLIEST, LATEST

        if not is_utf8(self.output):
            # Spark's JVM takes paths as UTF-8: a byte that is not (argv is read with surrogateescape) fails in py4j.
            raise UserError(f"--output {self.output!r} is not UTF-8 text; give a path Spark can take")
        unknown = [name for name in self.dimensions if name not in GROUPABLE]
        if unknown:
            raise UserError(f"cannot group by {unknown[0]!r}; choose from {', '.join(GROUPABLE)}")
        if self.start and self.end and self.start >= self.end:
            raise UserError(f"--from {self.start.isoformat()} is not before --to {self.end.isoformat()}")
        if self.start and not self.end and self.start >= datetime.now(timezone.utc):
            raise UserError(f"--from {self.start.isoformat()} is in the future: nothing to roll up yet")
        starting, ending = (_check_offsets(flag, text, self.topic) for flag, text in (
            ("--starting-offsets", self.starting_offsets), ("--ending-offsets", self.ending_offsets)))
        if self.start and (starting != EARLIEST or ending != LATEST):
            # A range replaces every window in it; offsets would cut some of those windows' records out.
            raise UserError("--starting-offsets/--ending-offsets cannot be combined with a time range "
                            "(--from/--to/--last), whose windows must be recomputed whole; give one or the other")
        for partition, start in (starting.get(self.topic, {}) if isinstance(starting, dict) else {}).items():
            end = ending.get(self.topic, {}).get(partition) if isinstance(ending, dict) else None
            if end is not None and end >= 0 and start >= 0 and start > end:
                raise UserError(f"--starting-offsets starts partition {partition} at {start}, after where "
                                f"--ending-offsets ends it ({end})")

    def window_range(self) -> tuple[int, int] | None:
        """[start, end) in epoch seconds widened to whole windows of the coarsest resolution; None without times."""
        if self.start is None:
            return None
        end = self.end or datetime.now(timezone.utc)
        return widen(self.start.timestamp(), end.timestamp(), self.resolutions[-1].seconds)


def _check_offsets(flag: str, text: str, topic: str) -> int | dict[str, dict[str, int]]:
    """Spark's offsets syntax, checked before a Spark session starts; raises UserError naming the flag."""
    from kcm_rollups.source import EARLIEST, LATEST, KafkaSourceError, offset_spec

    option = "startingOffsets" if flag == "--starting-offsets" else "endingOffsets"
    try:
        spec = offset_spec(option, text, EARLIEST if option == "startingOffsets" else LATEST, label=flag)
    except KafkaSourceError as err:
        raise UserError(str(err)) from None
    if isinstance(spec, dict) and set(spec) != {topic}:
        raise UserError(f"{flag} names the topics {', '.join(sorted(spec)) or '(none)'}, but the job reads {topic!r}")
    return spec


@dataclass
class RollupResult:
    """What a run did: the summary it prints and the top rows of its coarsest resolution."""

    input_records: int
    decode_errors: dict[str, int]
    points: int
    rows_written: int
    windows: dict[str, int]
    window_range: tuple[datetime, datetime] | None
    seconds: float
    top_rows: list[dict[str, Any]] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    exported: tuple[str, int, int] | None = None  # (endpoint, data points sent, data points rejected)

    def summary_lines(self) -> list[str]:
        errors = ", ".join(f"{reason} {n}" for reason, n in sorted(self.decode_errors.items())) or "none"
        windows = ", ".join(f"{n} × {label}" for label, n in self.windows.items()) or "none"
        span = (f"{self.window_range[0].isoformat()} .. {self.window_range[1].isoformat()}"
                if self.window_range else "whole offset range")
        exported = []
        if self.exported:
            endpoint, sent, rejected = self.exported
            exported = [f"exported {sent} OTLP data points to {endpoint}"
                        + (f", {rejected} rejected by the receiver" if rejected else "")]
        return [f"windows from {span}",
                f"input records {self.input_records}, decode errors: {errors}",
                f"points {self.points}, rows written {self.rows_written}, windows {windows}",
                *exported,
                f"took {self.seconds:.1f} s" + (" (" + ", ".join(
                    f"{stage} {seconds:.1f} s" for stage, seconds in self.stage_seconds.items()) + ")"
                    if self.stage_seconds else "")]


def read_records(spark: Any, options: RollupOptions, read_from_s: int | None = None) -> Any:
    """The metrics topic as a DataFrame shaped like Spark's Kafka source (Spark's connector when present)."""
    from kcm_rollups.session import kafka_format

    return _reader(spark, kafka_format(spark), options, read_from_s).load()


def read_points(spark: Any, options: RollupOptions, read_from_s: int | None = None,
                until_s: int | None = None, columns: tuple[str, ...] = ()) -> Any:
    """Decoded points (decode.POINTS_SCHEMA) of the records with timestamps in [read_from_s, until_s): decoded by
    kcm's source in the worker that read them, else by `decode_points` after Spark's connector."""
    from pyspark.sql import functions as F

    from kcm_rollups.decode import decode_points
    from kcm_rollups.session import kafka_format
    from kcm_rollups.source import COLUMNS_OPTION, DECODE_OPTION, SINCE_OPTION, SOURCE_NAME, UNTIL_OPTION

    source = kafka_format(spark)
    if source == SOURCE_NAME:
        reader = (_reader(spark, source, options, read_from_s).option(DECODE_OPTION, "points")
                  .option(COLUMNS_OPTION, ",".join(columns)))
        # Records outside the range are dropped before they are decoded; the filters below keep the contract.
        for option, seconds in ((SINCE_OPTION, read_from_s), (UNTIL_OPTION, until_s)):
            if seconds is not None:
                reader = reader.option(option, str(seconds * 1_000_000))
        points = reader.load()
        micros = F.col("record_micros")
    else:
        points = _reader(spark, source, options, read_from_s).load()
        micros = F.unix_micros("timestamp")
    if read_from_s is not None:
        points = points.filter(micros >= F.lit(read_from_s * 1_000_000))
    if until_s is not None:
        points = points.filter(micros < F.lit(until_s * 1_000_000))
    return points if source == SOURCE_NAME else decode_points(points)


def kafka_options(source: str, settings: KafkaSettings) -> dict[str, str]:
    """The `kafka.`-prefixed client options for `source`: Java spellings for Spark's connector (a JVM client),
    the properties as given for kcm's source (it validates them as every kcm command does)."""
    from kcm_common.kafka_java import java_client_properties
    from kcm_rollups.source import SOURCE_NAME

    properties = settings.properties if source == SOURCE_NAME else java_client_properties(settings)
    return {f"kafka.{key}": value for key, value in properties.items()}


def read_state(spark: Any, options: RollupOptions, since_s: int | None = None, until_s: int | None = None) -> Any:
    """The finest windows' rollup state (partial.state_schema) of the records with timestamps in [since_s, until_s),
    one row per group and run of batches: computed by kcm's source in the worker that read the records, else by
    `partial.partial_batches` in `mapInArrow` after Spark's connector. `partial.merge_batches` merges the rows."""
    from kcm_rollups.session import kafka_format
    from kcm_rollups.source import DECODE_OPTION, DIMENSIONS_OPTION, SINCE_OPTION, SOURCE_NAME, UNTIL_OPTION, \
        WINDOW_OPTION

    since = since_s * 1_000_000 if since_s is not None else None
    until = until_s * 1_000_000 if until_s is not None else None
    source = kafka_format(spark)
    reader = _reader(spark, source, options, since_s)
    if source == SOURCE_NAME:
        reader = (reader.option(DECODE_OPTION, "state").option(WINDOW_OPTION, str(options.resolutions[0].seconds))
                  .option(DIMENSIONS_OPTION, ",".join(options.dimensions)))
        for option, micros in ((SINCE_OPTION, since), (UNTIL_OPTION, until)):
            if micros is not None:
                reader = reader.option(option, str(micros))
        return reader.load()
    return state_of_records(reader.load(), options, since, until)


def state_of_records(records: Any, options: RollupOptions, since_micros: int | None = None,
                     until_micros: int | None = None) -> Any:
    """read_state for a DataFrame shaped like Spark's Kafka source (its connector's): decoded and aggregated in
    `mapInArrow`. Records outside the time range reach it only for their offsets (how far the read went), without
    key, value and headers."""
    from kcm_rollups.decode import decode_input, flatten_batches
    from kcm_rollups.partial import (noting_read_ends, partial_batches, read_ends_batch, state_input_columns,
                                     state_schema)

    size, dimensions = options.resolutions[0].seconds, options.dimensions
    columns = state_input_columns(dimensions)
    records = _payload_in_range_only(records, since_micros, until_micros)

    def state_of(batches: Any) -> Any:
        # Records out of the time range are dropped here, not before: how far the read went counts them too.
        read_ends: dict[int, int] = {}
        points = flatten_batches(noting_read_ends(batches, read_ends, since_micros, until_micros), columns=columns)
        yield from partial_batches(points, size, dimensions)
        if read_ends:
            yield read_ends_batch(read_ends, dimensions)

    return decode_input(records).mapInArrow(state_of, state_schema(dimensions))


def _payload_in_range_only(records: Any, since_micros: int | None, until_micros: int | None) -> Any:
    """Kafka-source-shaped `records` with key, value and headers nulled outside [since_micros, until_micros) (and
    for a record without a timestamp): such records still cross to Python, for their offsets, but nothing more."""
    from pyspark.sql import functions as F

    if since_micros is None and until_micros is None:
        return records
    micros = F.unix_micros("timestamp")
    inside = F.lit(True)
    if since_micros is not None:
        inside = inside & (micros >= F.lit(since_micros))
    if until_micros is not None:
        inside = inside & (micros < F.lit(until_micros))
    return records.withColumns({name: F.when(inside, F.col(name)) for name in ("key", "value", "headers")
                                if name in records.columns})


def _reader(spark: Any, source: str, options: RollupOptions, read_from_s: int | None) -> Any:
    reader = (spark.read.format(source)
              .option("kafka.bootstrap.servers", options.kafka.bootstrap_servers)
              .option("subscribe", options.topic)
              .option("startingOffsets", options.starting_offsets)
              .option("endingOffsets", options.ending_offsets)
              .option("includeHeaders", "true"))
    for key, value in kafka_options(source, options.kafka).items():
        reader = reader.option(key, value)
    if read_from_s is not None and options.starting_offsets == "earliest":
        # Only narrows the scan: records are still filtered on their timestamp, since a lookup may answer early.
        reader = (reader.option("startingTimestamp", str(read_from_s * 1000))
                  .option("startingOffsetsByTimestampStrategy", "latest"))
    if options.min_partitions:
        reader = reader.option("minPartitions", str(options.min_partitions))
    return reader


def run_rollup(bootstrap_servers: str, topic: str, output: str, *, start: datetime | None = None,
               end: datetime | None = None, last: timedelta | None = None, resolutions: str = "1m,1h",
               command_config: str | None = None, master: str | None = None, **options: Any) -> RollupResult:
    """Roll up `topic` into Parquet at `output`; `last` means the range [now - last, now). Returns the summary."""
    if last is not None:
        end = datetime.now(timezone.utc)
        if last > end - EARLIEST_TIME:
            raise UserError(f"--last {duration_label(int(last.total_seconds()))} reaches back before "
                            f"{EARLIEST_TIME:%Y-%m-%d}: Kafka timestamps count from 1970; give a shorter duration")
        start = end - last
    settings = KafkaSettings.from_cli(bootstrap_servers, command_config)
    rollup_options = RollupOptions(kafka=settings, topic=topic, output=output,
                                   resolutions=parse_resolutions(resolutions), start=start, end=end, **options)
    master = default_master(master)
    check_reachable(settings)
    if topic not in check_authenticates(settings):   # said now, not once Spark has started (10 s and more)
        raise UserError(f"topic {topic!r} does not exist on {settings.describe()}; "
                        "check --topic and that the brokers' telemetry receiver writes there")
    quiet = _Py4jSendTraceback()
    for name in quiet.LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    try:
        return run(_started(master), rollup_options)
    except UserError:
        raise
    except Exception as err:
        # The Python source runs in Spark's Python workers: its errors come back wrapped in Spark's.
        found = re.search(r"KafkaSourceError: (.+)", str(err))
        if found is None:
            raise
        # The source speaks of Spark's option names; who ran `kcm rollup` gave its flags.
        raise UserError(re.sub(r"\b(startingOffsets|endingOffsets)\b", lambda m: _FLAG_OF_OPTION[m.group(1)],
                               found.group(1).strip())) from None
    finally:
        for name in quiet.LOGGERS:
            logging.getLogger(name).removeFilter(quiet)


_FLAG_OF_OPTION = {"startingOffsets": "--starting-offsets", "endingOffsets": "--ending-offsets"}


def _cut_by_offsets(options: RollupOptions) -> Any:
    """Windows an offset range may have cut (a time range never cuts one: it is widened to whole windows): each
    partition started at an offset past its first record lacks the records before, so every window up to the one of
    the first record read there (the latest such, over partitions) is cut; likewise every window from the one of the
    last record read in a partition ended before its end. Their rows hold only the range's records: partial."""
    from pyspark.sql import functions as F

    cut = F.lit(False)
    if options.window_range() or (options.starting_offsets == "earliest" and options.ending_offsets == "latest"):
        return cut
    first, last = _cut_record_times(options)
    if first is not None:
        cut = cut | (F.unix_micros("window_start") <= F.lit(first))
    if last is not None:
        cut = cut | (F.unix_micros("window_end") > F.lit(last))
    return cut


def _cut_record_times(options: RollupOptions, timeout_s: float = 10.0) -> tuple[int | None, int | None]:
    """In microseconds: the latest time of the first record read in a partition whose starting offset cuts records
    off, and the earliest of the last record read in one whose ending offset does (None where none does)."""
    from kafka import KafkaConsumer, TopicPartition

    starting = _check_offsets("--starting-offsets", options.starting_offsets, options.topic)
    ending = _check_offsets("--ending-offsets", options.ending_offsets, options.topic)
    consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, **options.kafka.client_options())
    firsts, lasts = [], []
    try:
        for spec, found, is_start in ((starting, firsts, True), (ending, lasts, False)):
            named = {TopicPartition(options.topic, int(p)): offset
                     for p, offset in (spec.get(options.topic, {}) if isinstance(spec, dict) else {}).items()
                     if offset >= 0}  # -2 and -1 are earliest and latest: no cut
            if not named:
                continue
            first, end = consumer.beginning_offsets(list(named)), consumer.end_offsets(list(named))
            for tp, offset in named.items():
                if (offset <= first[tp]) if is_start else (offset >= end[tp]):
                    continue  # at the partition's first record (or end): nothing cut off
                # Nothing read there (a start at its end, an end at its first record): the windows up to its last
                # record lack it and those before, or the windows from its first record on lack that and the rest.
                nothing = (offset >= end[tp]) if is_start else (offset <= first[tp])
                at = (end[tp] - 1 if is_start else first[tp]) if nothing else (offset if is_start else offset - 1)
                record = _record_from(consumer, tp, at, timeout_s)
                if record is not None and (is_start or nothing or record.offset < offset) and record.timestamp >= 0:
                    found.append(record.timestamp * 1000)
    finally:
        consumer.close()
    return (max(firsts) if firsts else None), (min(lasts) if lasts else None)


def _record_from(consumer: Any, tp: Any, offset: int, timeout_s: float) -> Any:
    """The first record of `tp` at or after `offset`, or None if none comes within `timeout_s`."""
    consumer.assign([tp])
    consumer.seek(tp, offset)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=200).get(tp, [])
        if records:
            return records[0]
    return None


def _started(master: str) -> Any:
    """The Spark session on `master`; a UserError naming the master when Spark cannot start there (no Java, a cluster
    manager without its configuration, a master that does not answer), not Spark's traceback."""
    from kcm_rollups.session import spark_session

    try:
        return spark_session(master)
    except Exception as err:
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UserError(f"cannot start Spark with --master {master}: {first[:300]}; check the master (and for yarn "
                        "HADOOP_CONF_DIR or YARN_CONF_DIR), and that Java 17 or later is installed") from None


class _Py4jSendTraceback(logging.Filter):
    """py4j logs a traceback on the root logger for a call to the JVM that broke ("… while sending command."): on
    Ctrl-C (PySpark's handler cancels the jobs from inside the interrupted call) that is four tracebacks of noise, and
    when the JVM dies the error that follows says so. So is the one its `py4j.clientserver` logger adds when Ctrl-C
    interrupts a call while Spark starts (the connection it then closes is broken)."""

    LOGGERS = ("", "py4j.clientserver")   # the root logger, and py4j's own (a filter sees only its logger's records)

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not ((record.name == "root" and message.endswith("while sending command."))
                    or (record.name == "py4j.clientserver"
                        and message.startswith("Exception occurred while shutting down connection")))


def check_authenticates(settings: KafkaSettings, timeout_s: float = 10.0) -> set[str]:
    """The topics Kafka's metadata names; raise KafkaUnavailableError unless a metadata request with these settings
    gets through, saying whether the credentials were refused (the first thing a job should learn, not a Spark
    task's timeout)."""
    import confluent_kafka
    import confluent_kafka.admin

    refused: list[str] = []
    down: list[str] = []

    def on_error(error: Any) -> None:
        if error.code() == confluent_kafka.KafkaError._AUTHENTICATION:  # noqa: SLF001 (librdkafka's local codes)
            refused.append(error.str())
        else:
            down.append(error.str())

    admin = confluent_kafka.admin.AdminClient({**librdkafka_config(settings), "error_cb": on_error,
                                               "logger": _QUIET_LIBRDKAFKA})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return set(admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic()))).topics)
        except confluent_kafka.KafkaException as exc:
            admin.poll(0)  # serves error_cb
            if refused:
                raise KafkaUnavailableError(rejected_message(settings, refused[-1])) from None
            if time.monotonic() >= deadline:
                detail = down[-1] if down else exc.args[0].str()
                raise KafkaUnavailableError(f"cannot read metadata from Kafka at {settings.bootstrap_servers} "
                                            f"({detail}): check --bootstrap-server and --command-config") from None


def default_master(master: str | None) -> str | None:
    """`master` if given (UserError unless Spark would take it); none under spark-submit (it chose one); else every
    local core."""
    if master:
        if not _MASTER_URL.fullmatch(master):
            raise UserError(f"--master {master!r} is not a Spark master URL: local, local[N], local[*], local[N,F], "
                            "spark://HOST:PORT, k8s://https://HOST:PORT or yarn")
        return master
    return None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*]"


def run(spark: Any, options: RollupOptions, now: datetime | None = None) -> RollupResult:
    """The job on an existing session: read, decode, roll up, write, summarise."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from kcm_rollups.aggregate import rollup_state

    began = time.monotonic()
    stages: dict[str, float] = {}

    def finished(stage: str) -> None:
        stages[stage] = time.monotonic() - began - sum(stages.values())

    # A typo, a filesystem Spark lacks or a directory of other files costs seconds, not a whole pass.
    output_entries(spark, options.output)
    now = now or datetime.now(timezone.utc)
    span = options.window_range()
    read_from = max(0, span[0] - options.lookback_seconds) if span else None
    since_micros, until = (span[0] * 1_000_000, span[1]) if span else (None, None)
    state, counts, read_ends = first_pass(read_state(spark, options, span[0] if span else None, until), options)
    finished("read, decode and aggregate")
    if counts.cumulative:
        # Only what the cumulative pass reads crosses from the Python workers to the JVM.
        columns = tuple(dict.fromkeys(CUMULATIVE_INPUTS + options.dimensions))
        state, unpreceded = add_cumulative(state, read_points(spark, options, read_from, until, columns), options,
                                           since_micros, read_from * 1_000_000 if span else None, read_ends)
        finished("cumulative points")
        if span and unpreceded:
            log.warning("%d cumulative stream(s) found no point in the --lookback of %s before their first in the "
                        "range: their increase up to it is counted by no run; give a --lookback longer than the "
                        "longest push interval", unpreceded, duration_label(options.lookback_seconds))
    rows = rollup_state(state, options.resolutions, options.dimensions, counts.histograms > 0)
    labels = tuple(r.label for r in options.resolutions)
    seen = Observation("kcm-rollup-rows")   # what write_rollups and top_rows need, counted as the rows materialise
    rows = rows.withColumn("partial", (F.col("window_end") > F.lit(now)) | _cut_by_offsets(options)).withColumn(
        "date", F.date_format("window_start", "yyyy-MM-dd")).observe(seen, *_rows_seen(labels)).localCheckpoint(
        eager=True)
    held = RowsHeld.observed(seen.get, rows, labels)
    finished("finish")
    rows_written, windows = write_rollups(spark, rows, options.output, span, labels, held)
    windows = {r.label: windows[r.label] for r in options.resolutions if r.label in windows}  # finest first
    finished("write")
    exported = None
    if options.otlp is not None:
        from kcm_rollups.otlp import export_rows

        # Windows still open are left out: their values are incomplete and their end lies in the future, where
        # backends drop samples. So are the finer windows of a coarsest window still open: the run that finds it
        # ended (the next scheduled one, with its lateness margin) exports them all, once, with its late records
        # (a backend keeps the first sample of a timestamp and refuses the second).
        # Only a time range recomputes whole windows: runs chained by offsets never read those minutes again.
        ended = ~F.col("partial")
        if span is not None:
            coarsest = options.resolutions[-1].seconds
            closes = (F.floor(F.unix_seconds("window_start") / coarsest) + 1) * coarsest
            ended = ended & (closes <= F.lit(int(now.timestamp())))
        exported = (options.otlp.endpoint, *export_rows(rows.filter(ended), options.otlp, options.dimensions))
        finished("OTLP export")
    top = top_rows(rows, options.resolutions[-1].label, options.top, held.latest[options.resolutions[-1].label],
                   options.dimensions)
    finished("summary")
    return RollupResult(
        input_records=counts.records,
        decode_errors=counts.decode_errors,
        points=counts.points,
        rows_written=rows_written,
        windows=windows,
        window_range=(datetime.fromtimestamp(span[0], timezone.utc), datetime.fromtimestamp(span[1], timezone.utc))
        if span else None,
        seconds=time.monotonic() - began,
        top_rows=top,
        stage_seconds=stages,
        exported=exported,
    )


# The decoded point columns the cumulative pass reads besides the dimensions.
CUMULATIVE_INPUTS: tuple[str, ...] = ("partition", "offset", "record_micros", "client_instance_id", "resource",
                                      "scope", "metric", "type", "temporality", "monotonic", "time_ns", "start_ns",
                                      "attributes", "value", "count", "sum", "bucket_counts", "bounds", "error")


@dataclass(frozen=True)
class PassCounts:
    """What the first pass counted: records read (decode errors included), points decoded, cumulative points (they
    need `add_cumulative`), histogram state rows (only then does `finish` need its histogram UDF), records per decode
    error reason."""

    records: int
    points: int
    cumulative: int
    histograms: int
    decode_errors: dict[str, int]


def first_pass(state_rows: Any, options: RollupOptions) -> tuple[Any, PassCounts, dict[int, int]]:
    """One pass over the records: the finest windows' state of every point that needs no predecessor; what it
    counted; and per partition read the offset after the last record read (the cumulative pass takes no record the
    first did not see: one appended since). `state_rows` is what `read_state` gives: state per batch, computed where
    the records were decoded."""
    # Cumulative points are rare (KIP-714 brokers ask clients for deltas) and get a pass of their own.
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from kcm_rollups.partial import merge_batches
    from kcm_rollups.session import BYPASS_PARTIAL_AGGREGATION, session_conf

    # Counted while the merged state is materialised, not by a job of their own. Decode errors are rare: only their
    # reasons are observed, and their records counted by a query when there are any.
    seen = Observation("kcm-rollup-first-pass")
    counted = F.col("read_partition").isNull()   # the other rows say how far a read went
    merged = merge_batches(state_rows, options.dimensions).observe(
        seen,
        F.sum(F.when(counted, F.col("records"))).alias("records"),
        F.sum(F.when(counted & F.col("error").isNull(), F.col("points"))).alias("points"),
        F.sum(F.when(counted & F.col("needs_previous"), F.col("points"))).alias("cumulative"),
        F.count(F.when(counted & (F.col("type") == "histogram"), True)).alias("histograms"),
        F.collect_set(F.when(counted, F.col("error"))).alias("errors"),
        F.collect_list(F.when(~counted, F.struct("read_partition", "read_end"))).alias("read_ends"))
    # A key's rows come from the batches of one task or a few (the records are in time order): merged after the
    # shuffle only (read stage's JVM time 0.7-1.0 -> 0.2 CPU-s at 1M points).
    with session_conf(state_rows.sparkSession, {BYPASS_PARTIAL_AGGREGATION: "true"}):
        state = merged.localCheckpoint(eager=True)
    metrics = seen.get
    errors = {}
    if metrics["errors"]:
        errors = {row["error"]: row["records"] for row in state.filter(counted & F.col("error").isNotNull())
                  .groupBy("error").agg(F.sum("records").alias("records")).collect()}
    counts = PassCounts(records=metrics["records"] or 0, points=metrics["points"] or 0,
                        cumulative=metrics["cumulative"] or 0, histograms=metrics["histograms"], decode_errors=errors)
    read_ends = {row["read_partition"]: row["read_end"] for row in metrics["read_ends"]}   # merged: one a partition
    good = state.filter(F.col("error").isNull() & F.col("metric").isNotNull() & ~F.col("needs_previous"))
    return good.drop("error", "needs_previous", "records", "points", "read_partition", "read_end"), counts, read_ends


def add_cumulative(state: Any, points: Any, options: RollupOptions, since_micros: int | None,
                   read_from_micros: int | None = None, read_ends: dict[int, int] | None = None) -> tuple[Any, int]:
    """`state` merged with the state of the cumulative `points` (read from `read_from_micros`), each turned into an
    increase by its predecessor; and how many streams found none for their first point from `since_micros` on.
    With `read_ends` (first_pass's), only points of records the first pass read too, or could have: see
    `_seen_by_first_pass`."""
    from pyspark.sql import functions as F

    from kcm_rollups.aggregate import merge_state, needs_previous, partial_state, with_cumulative_increases

    finest = options.resolutions[0].seconds
    wanted = F.col("error").isNull() & F.col("metric").isNotNull() & needs_previous()
    if read_ends is not None:
        wanted = wanted & _seen_by_first_pass(read_ends, since_micros)
    cumulative = with_cumulative_increases(points.filter(wanted), read_from_micros, since_micros)
    if since_micros is not None:
        cumulative = cumulative.filter(F.col("record_micros") >= F.lit(since_micros))
    # Only a stream's first point can be left without an increase (counters) or a count (histograms, summaries).
    unpreceded = F.col("increase").isNull() & F.col("d_count").isNull()
    added = partial_state(cumulative, finest, options.dimensions, extra=(
        F.count(F.when(unpreceded, True)).alias("unpreceded"),)).localCheckpoint(eager=True)
    missed = added.agg(F.sum("unpreceded")).first()[0] or 0
    both = state.unionByName(added.drop("unpreceded"))
    return merge_state(both, None, options.dimensions).localCheckpoint(eager=True), missed  # both in finest windows


def _seen_by_first_pass(read_ends: dict[int, int], since_micros: int | None) -> Any:
    """Points of records below the first pass's read end in each partition it read; in any other partition (the
    first pass found nothing of the range there) only records from before the range, predecessors from the lookback.
    A record appended between the two passes is left out: the first pass's counts and rows never saw it."""
    from pyspark.sql import functions as F

    ends = [column for partition, end in sorted(read_ends.items())
            for column in (F.lit(partition).cast("int"), F.lit(end).cast("long"))]
    end = F.try_element_at(F.create_map(*ends), F.col("partition")) if ends else F.lit(None).cast("long")
    before = F.col("record_micros") < F.lit(since_micros) if since_micros is not None else F.lit(False)
    return F.when(end.isNull(), before).otherwise(F.col("offset") < end)


@dataclass(frozen=True)
class RowsHeld:
    """What rollup rows hold: how many, the windows of each resolution, the (resolution, date) partitions they fall
    in, and each resolution's latest window start (None without rows)."""

    rows: int
    windows: dict[str, int]
    partitions: frozenset[tuple[str, str]]
    latest: dict[str, datetime | None]

    @classmethod
    def observed(cls, metrics: dict[str, Any], rows: Any, labels: tuple[str, ...]) -> RowsHeld:
        """From the metrics `_rows_seen(labels)` observed over the materialised `rows` of those resolutions; their
        windows counted by a query (every task would send the driver a set of all window starts to observe: 8 bytes
        a window a task, past spark.driver.maxResultSize for a week of 1s windows)."""
        from pyspark.sql import functions as F

        counted = {row["resolution"]: row["windows"] for row in rows.groupBy("resolution").agg(
            F.count_distinct("window_start").alias("windows")).collect()}
        windows = {label: counted[label] for label in labels if counted.get(label)}
        return cls(rows=metrics["rows"], windows=windows,
                   partitions=frozenset((row["resolution"], row["date"]) for row in metrics["partitions"]),
                   latest={label: metrics[f"latest {label}"] for label in labels})

    @classmethod
    def counted(cls, rows: Any, labels: tuple[str, ...]) -> RowsHeld:
        """By a query over materialised `rows` of those resolutions (when nothing observed them)."""
        return cls.observed(rows.agg(*_rows_seen(labels)).first().asDict(recursive=False), rows, labels)


def _rows_seen(labels: tuple[str, ...]) -> list[Any]:
    """Aggregates over rollup rows giving RowsHeld: to observe as they materialise, or to ask for."""
    # Only bounded values: the partitions are as many as the run's days times its resolutions.
    from pyspark.sql import functions as F

    latest = [F.max(F.when(F.col("resolution") == label, F.col("window_start"))).alias(f"latest {label}")
              for label in labels]
    return [F.count(F.lit(1)).alias("rows"), F.collect_set(F.struct("resolution", "date")).alias("partitions"),
            *latest]


def write_rollups(spark: Any, new: Any, output: str, span: tuple[int, int] | None,
                  resolutions: tuple[str, ...], held: RowsHeld | None = None) -> tuple[int, dict[str, int]]:
    """Replace exactly this run's windows under `output` with the materialised rows `new` (all windows of a time range
    in `resolutions`, else the ones computed), keeping all others; returns the number of rows and of windows per
    resolution. `held`: what `new` holds, if already known."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException
    from pyspark.sql import functions as F

    held = held or RowsHeld.counted(new, resolutions)
    windows = dict(held.windows)
    rows_written = held.rows
    partitions = set(held.partitions)
    # Earlier rows matter only in the partitions this run writes, or whose windows its range replaces: only those are
    # read (their files' footers too), so a run costs the same however many days the output holds.
    wanted = set(partitions)
    if span is not None:
        utc = spark.conf.get("spark.sql.session.timeZone") in _UTC
        wanted |= {(resolution, date) for resolution in resolutions for date in _dates_around(span, utc)}
    existing = _existing_rollups(spark, output, wanted)
    combined = new
    if existing is not None:
        if span is not None:
            # This run's windows: in its range and of its resolutions (other resolutions' rows there stay).
            replaced = (F.col("window_start") >= F.timestamp_seconds(F.lit(span[0]))) & (
                F.col("window_start") < F.timestamp_seconds(F.lit(span[1]))) & F.col("resolution").isin(list(resolutions))
            partitions |= {(r["resolution"], r["date"])
                           for r in existing.filter(replaced).select("resolution", "date").distinct().collect()}
            old = _in_partitions(existing, partitions).filter(~replaced)
        else:
            old = _in_partitions(existing, partitions).join(
                new.select("resolution", "window_start").distinct(), ["resolution", "window_start"], "left_anti")
        # Materialised before the overwrite deletes the files it was read from.
        combined = new.unionByName(old, allowMissingColumns=True).localCheckpoint(eager=True)
    if not partitions:
        return 0, windows
    try:
        (combined.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
         .partitionBy("resolution", "date").parquet(output))
    except (CapturedException, Py4JJavaError) as err:
        raise UserError(f"cannot write the rollups to --output {output}: {_first_line(err)}") from None
    # A partition whose every window was replaced by nothing is not rewritten by the overwrite: remove it. Partitions
    # with new rows are kept for sure; only the others need a look.
    emptied = partitions - held.partitions
    if emptied:
        emptied -= {(r["resolution"], r["date"]) for r in combined.select("resolution", "date").distinct().collect()}
    for resolution, date in sorted(emptied):
        _HadoopPath(spark, f"{output.rstrip('/')}/resolution={resolution}/date={date}").delete()
    return rows_written, windows


# Names of UTC for `spark.sql.session.timeZone` (kcm's own session sets "UTC"): dates written are then UTC dates.
_UTC = frozenset({"UTC", "Z", "GMT", "Etc/UTC", "+00:00"})


def _dates_around(span: tuple[int, int], utc: bool) -> list[str]:
    """Every date (yyyy-MM-dd) a window starting in `span` is written under: those of its first and last second and
    all between, in a session whose time zone is UTC (`utc`, kcm's own); in any other (a session of the Python API's
    caller), a day more on either side."""
    margin = timedelta(days=0 if utc else 1)
    first = datetime.fromtimestamp(span[0], timezone.utc).date() - margin
    last = datetime.fromtimestamp(max(span[0], span[1] - 1), timezone.utc).date() + margin
    return [(first + timedelta(days=day)).isoformat() for day in range((last - first).days + 1)]


def _existing_rollups(spark: Any, output: str, wanted: set[tuple[str, str]]) -> Any:
    """The rows earlier runs wrote under `output` in those of the (resolution, date) partitions `wanted` that exist,
    None if none does; UserError if `output` holds anything but kcm rollups."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    entries = output_entries(spark, output)
    if entries is None:
        return None
    root = output.rstrip("/")
    paths = []
    try:
        dates: dict[str, set[str]] = {}   # the date directories of each resolution, listed once
        for resolution, date in sorted(wanted):
            directory = f"{root}/resolution={resolution}"
            if entries.get(f"resolution={resolution}") and resolution not in dates:
                dates[resolution] = {name for name, is_dir in _HadoopPath(spark, directory).children() if is_dir}
            if f"date={date}" in dates.get(resolution, ()):
                paths.append(f"{directory}/date={date}")
    except (CapturedException, Py4JJavaError) as err:   # another account's directory, an object store refusing
        raise UserError(f"cannot read --output {output}: {_first_line(err)}") from None
    if not paths:
        return None
    try:
        existing = _read_partitioned_as_text(spark, output, paths)
    except (CapturedException, Py4JJavaError) as err:
        if "UNABLE_TO_INFER_SCHEMA" in str(err):
            return None   # partitions without Parquet (a failed run's, or made by hand): nothing to keep
        raise _not_rollups(output, f"files that are not kcm rollups ({_first_line(err)})") from None
    if not {"resolution", "date", "window_start"} <= set(existing.columns):
        raise _not_rollups(output, "Parquet that is not kcm rollups (no resolution, date and window_start columns)")
    return existing


def output_entries(spark: Any, output: str) -> dict[str, bool] | None:
    """What `--output` holds at its top level (name: is a directory), None if it does not exist yet; UserError if it
    is a file, cannot be listed, or holds anything but kcm rollups: `resolution=...` directories, entries Spark sets
    aside (`_SUCCESS`, hidden ones) and empty directories (`lost+found` on a volume of its own)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    target = output_target(spark, output)
    if not target.exists():
        return None
    root = output.rstrip("/")

    def may_stay(name: str, is_dir: bool) -> bool:
        return is_dir and (name.startswith("resolution=") or not _HadoopPath(spark, f"{root}/{name}").holds_files())

    try:
        entries = dict(item for item in target.children() if not item[0].startswith(("_", ".")))
        foreign = sorted(name for name, is_dir in entries.items() if not may_stay(name, is_dir))
    except (CapturedException, Py4JJavaError) as err:   # another account's directory, an object store refusing
        raise UserError(f"cannot read --output {output}: {_first_line(err)}") from None
    if foreign:
        raise _not_rollups(output, f"files that are not kcm rollups ({', '.join(foreign[:3])})")
    return entries


def _not_rollups(output: str, what: str) -> UserError:
    return UserError(f"--output {output} holds {what}; give a new directory or one earlier runs wrote")


def output_target(spark: Any, output: str) -> _HadoopPath:
    """`--output` as a Hadoop path that is a directory or nothing yet; UserError if it is a file, or if Spark cannot
    open its filesystem (an unknown scheme, s3a:// without hadoop-aws, refused credentials)."""
    from py4j.protocol import Py4JJavaError

    try:
        target = _HadoopPath(spark, output)
        is_file = target.is_file()
    except Py4JJavaError as err:
        raise UserError(f"cannot write the rollups to --output {output}: {_first_line(err)}") from None
    if is_file:
        raise UserError(f"--output {output} is a file; give a directory (new, or one earlier runs wrote)")
    return target


def _in_partitions(frame: Any, partitions: set[tuple[str, str]]) -> Any:
    from functools import reduce

    from pyspark.sql import functions as F

    conditions = [(F.col("resolution") == r) & (F.col("date") == d) for r, d in sorted(partitions)]
    return frame.filter(reduce(lambda a, b: a | b, conditions)) if conditions else frame.limit(0)


def _read_partitioned_as_text(spark: Any, path: str, partitions: list[str]) -> Any:
    """The Parquet of the partition directories `partitions` under `path`, with its partition columns as strings:
    Spark would otherwise guess their types, and `resolution=1d` reads as the number 1.0 (Java parses "1d" as a
    double). With every file's columns (Spark takes one file's by default, and rows an earlier run wrote with other
    --group-by dimensions would lose theirs when rewritten), and the paths taken as they are, not as patterns (`[a]`
    or `{a}` in a directory name)."""
    from kcm_rollups.session import session_conf

    with session_conf(spark, {"spark.sql.sources.partitionColumnTypeInference.enabled": "false"}):
        return spark.read.option("mergeSchema", "true").option("basePath", path).parquet(
            *(_literal(partition) for partition in partitions))


_GLOB_CHARACTERS = re.compile(r"[\\\[\]{}*?]")   # what Hadoop's glob patterns give a meaning: each escaped


def _literal(path: str) -> str:
    """`path` as a Hadoop glob matching only itself: its path part escaped, never a URI's authority (`[::1]:8020`)."""
    scheme, separator, rest = path.partition("://")
    if not separator:
        return _GLOB_CHARACTERS.sub(r"\\\g<0>", path)
    authority, slash, tail = rest.partition("/")
    return scheme + separator + authority + slash + _GLOB_CHARACTERS.sub(r"\\\g<0>", tail)


def _first_line(error: Any) -> str:
    # A Py4JJavaError's own text starts "An error occurred while calling o123.parquet"; the Java exception says why.
    text = str(getattr(error, "java_exception", None) or getattr(error, "_desc", None) or error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:300]


class _HadoopPath:
    # Through Hadoop's FileSystem, so object stores (s3a://, gs://) work as local paths do.
    def __init__(self, spark: Any, path: str) -> None:
        self._path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)
        self._fs = self._path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def exists(self) -> bool:
        return bool(self._fs.exists(self._path))

    def is_file(self) -> bool:
        return self.exists() and bool(self._fs.getFileStatus(self._path).isFile())

    def delete(self) -> None:
        self._fs.delete(self._path, True)

    def holds_files(self) -> bool:
        """Whether this directory, or any below it, holds a file."""
        return bool(self._fs.listFiles(self._path, True).hasNext())

    def children(self) -> list[tuple[str, bool]]:
        """Each entry of this directory: its name, and whether it is a directory."""
        return [(status.getPath().getName(), bool(status.isDirectory())) for status in self._fs.listStatus(self._path)]


def top_rows(rows: Any, resolution: str, limit: int, latest: datetime | None = None,
             dimensions: tuple[str, ...] = DEFAULT_DIMENSIONS) -> list[dict[str, Any]]:
    """The rows of the latest window of `resolution` (`latest`, if known), most instances first, as plain dicts for
    printing: TOP_COLUMNS with the run's other `dimensions` after `client_id`, `window_start` an aware UTC datetime
    (Spark hands timestamps to Python in the machine's zone, without one)."""
    from pyspark.sql import functions as F

    finest = rows.filter(F.col("resolution") == resolution)
    if latest is None:
        latest = finest.agg(F.max("window_start")).first()[0]
    if latest is None:
        return []
    chosen = finest.filter(F.col("window_start") == latest).orderBy(
        F.desc("instances"), "metric", "client_id").limit(limit)
    at = TOP_COLUMNS.index("client_id") + 1
    columns = [*TOP_COLUMNS[:at], *(name for name in dimensions if name not in TOP_COLUMNS), *TOP_COLUMNS[at:]]
    picked = chosen.select(*(F.unix_micros(name).alias(name) if name == "window_start" else F.col(f"`{name}`")
                             for name in columns))
    return [{**row, "window_start": EARLIEST_TIME + timedelta(microseconds=row["window_start"]),
             **({"attributes": None} if row.get("attributes") == "{}" else {})}
            for row in (r.asDict() for r in picked.collect())]


def parse_dimensions(text: str) -> tuple[str, ...]:
    """`--group-by client_id,attributes` as a tuple of column names, each once."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
