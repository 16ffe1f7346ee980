"""A batch PySpark data source that reads Kafka with the schema and option names of Spark's own Kafka source.

Used when the spark-sql-kafka connector is not on the classpath: `spark.read.format("kcm_kafka")` then yields
the same columns (`key value topic partition offset timestamp timestampType [headers]`) as `format("kafka")`.
The driver plans one offset range per input partition; each `read` assigns, seeks, yields large Arrow batches and
raises rather than returning fewer records than its range holds.
With the kcm option `kcm.decode=points` it yields decoded points (`decode.POINTS_SCHEMA`) instead, decoded in the
same Python worker that read them: the same rows as `decode.decode_points` over the records, without carrying every
record value through the JVM and back. With `kcm.decode=state` it goes one step further and yields the rollup state
of the finest windows per batch (`partial.state_schema`, options `kcm.window` and `kcm.dimensions`), for
`partial.merge_batches` to merge. In both decode modes `kcm.sinceMicros`/`kcm.untilMicros` drop records outside
that time range before they are decoded.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

SOURCE_NAME = "kcm_kafka"
EARLIEST, LATEST = -2, -1  # Spark's sentinels inside startingOffsets/endingOffsets JSON
# Records per Arrow batch a read yields. Decoding turns a whole batch into Python objects (some ten points a record)
# before its columns are built: 20,000 records at a time cost the worker twice the kernel time of 5,000 (memory
# mapped and returned), some 0.3 s a run of bench/rollup_throughput.py. State is computed over some 50,000 points at
# a time (partial.STATE_POINTS), gathered from several batches, so smaller batches do not mean more rows to merge.
_BATCH_RECORDS = 5_000
# Records asked of one consume(): each is turned into Python objects (value, 16 headers) right after the call that
# fetched it. Asking for a whole Arrow batch at once cost 16 µs of CPU per record, the records having left the CPU's
# caches by the time their headers were read; 100 at a time, 4 µs (bench/rollup_throughput.py's records).
_CONSUME_RECORDS = 100
_DEFAULT_POLL_TIMEOUT_MS = 30_000
DECODE_OPTION = "kcm.decode"
COLUMNS_OPTION = "kcm.columns"  # with kcm.decode=points: only these point columns (a Python source cannot prune)
# With kcm.decode=state: the window (seconds) and dimensions of the rollup state, and the record times it covers.
WINDOW_OPTION, DIMENSIONS_OPTION = "kcm.window", "kcm.dimensions"
SINCE_OPTION, UNTIL_OPTION = "kcm.sinceMicros", "kcm.untilMicros"
_DECODE_MODES = ("records", "points", "state")

_BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_HEADERS_FIELD = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                              StructField("value", BinaryType())])))


class KafkaSourceError(ValueError):
    """Options that do not describe a readable range, or a range Kafka can no longer serve in full."""


def kafka_schema(include_headers: bool) -> StructType:
    """The schema of Spark's Kafka source (`headers` only with includeHeaders=true)."""
    return StructType(_BASE_FIELDS + ([_HEADERS_FIELD] if include_headers else []))


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records [start, end) of one topic partition; `open_end` when `end` came from the broker's end offset."""

    topic: str
    partition: int
    start: int
    end: int
    open_end: bool = False


@dataclass(frozen=True)
class SourceOptions:
    """The Spark Kafka source options this data source honours, validated once on the driver."""

    client_options: Mapping[str, Any] = field(repr=False)  # credentials among them
    librdkafka_config: Mapping[str, Any] = field(repr=False)
    topics: tuple[str, ...]
    starting: str
    ending: str
    starting_timestamp_ms: int | None
    include_headers: bool
    min_partitions: int
    poll_timeout_ms: int
    decode: str = "records"
    columns: tuple[str, ...] = ()
    window_seconds: int = 60
    dimensions: tuple[str, ...] = ()
    since_micros: int | None = None
    until_micros: int | None = None
    # Where a partition starts when the startingTimestamp lookup finds no record at or after it: Spark's default
    # "error" fails the read; "latest" starts it at its end.
    by_timestamp_strategy: str = "error"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        from kcm_common.kafka import KafkaSettings
        from kcm_common.librdkafka import librdkafka_config

        options = {key.lower(): value for key, value in options.items()}
        bootstrap = options.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise KafkaSourceError("option kafka.bootstrap.servers is required")
        topics = tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise KafkaSourceError("option subscribe (a comma-separated list of topics) is required")
        if "endingtimestamp" in options:
            raise KafkaSourceError("endingTimestamp is not supported: a broker's time lookup may answer short; "
                                   "read to endingOffsets and filter on the timestamp column instead")
        properties = {key[len("kafka."):]: value for key, value in options.items()
                      if key.startswith("kafka.") and key != "kafka.bootstrap.servers"}
        settings = KafkaSettings(bootstrap, properties)
        client_options = settings.client_options()
        starting_timestamp = options.get("startingtimestamp")
        decode = options.get(DECODE_OPTION, "records").lower()
        if decode not in _DECODE_MODES:
            raise KafkaSourceError(f"option {DECODE_OPTION} must be {', '.join(_DECODE_MODES)}, not {decode!r}")
        since, until = options.get(SINCE_OPTION.lower()), options.get(UNTIL_OPTION.lower())
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise KafkaSourceError(f"option startingOffsetsByTimestampStrategy must be 'error' or 'latest', not "
                                   f"{options['startingoffsetsbytimestampstrategy']!r}")
        window = _whole_number(WINDOW_OPTION, options.get(WINDOW_OPTION, "60"))
        if window <= 0:
            raise KafkaSourceError(f"option {WINDOW_OPTION} must be a number of seconds above 0, not {window}")
        return cls(
            client_options=client_options,
            librdkafka_config=librdkafka_config(settings),
            topics=topics,
            starting=options.get("startingoffsets", "earliest"),
            ending=options.get("endingoffsets", "latest"),
            starting_timestamp_ms=_whole_number("startingTimestamp", starting_timestamp)
            if starting_timestamp is not None else None,
            include_headers=options.get("includeheaders", "false").lower() == "true",
            min_partitions=_whole_number("minPartitions", options.get("minpartitions", "1")),
            poll_timeout_ms=_whole_number("kafkaConsumer.pollTimeoutMs",
                                          options.get("kafkaconsumer.polltimeoutms", str(_DEFAULT_POLL_TIMEOUT_MS))),
            decode=decode,
            columns=_point_columns(options.get(COLUMNS_OPTION, "")),
            window_seconds=window,
            dimensions=_point_columns(options.get(DIMENSIONS_OPTION, ""), DIMENSIONS_OPTION),
            since_micros=_whole_number(SINCE_OPTION, since) if since is not None else None,
            until_micros=_whole_number(UNTIL_OPTION, until) if until is not None else None,
            by_timestamp_strategy=strategy,
        )


def _point_columns(text: str, option: str = COLUMNS_OPTION) -> tuple[str, ...]:
    from kcm_rollups.decode import POINTS_SCHEMA

    columns = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in columns if name not in POINTS_SCHEMA.names]
    if unknown:
        raise KafkaSourceError(f"option {option} names {unknown[0]!r}, not a point column")
    return columns


def _whole_number(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise KafkaSourceError(f"option {name} must be a whole number, not {text!r}") from None


def offset_spec(name: str, text: str, default: int, label: str | None = None) -> int | dict[str, dict[str, int]]:
    """"earliest" / "latest" as EARLIEST / LATEST, or Spark's JSON {"topic": {"0": 23, "1": -2}} as a dict; errors
    name the option `label` (default: "option <name>").

    As Spark's batch reads: startingOffsets is never latest (-1), endingOffsets never earliest (-2)."""
    label = label or f"option {name}"
    refused, refused_word = (LATEST, "latest") if name == "startingOffsets" else (EARLIEST, "earliest")
    word = text.strip().lower()
    if word == refused_word:
        raise KafkaSourceError(f"{label} cannot be '{refused_word}' in a batch read")
    if word in ("earliest", "latest"):
        return EARLIEST if word == "earliest" else LATEST
    try:
        spec = json.loads(text)
        if not isinstance(spec, dict) or not all(
                isinstance(parts, dict) and all(re.fullmatch(r"[0-9]+", str(p)) and type(o) is int
                                                and EARLIEST <= o < 2**63 for p, o in parts.items())
                for parts in spec.values()):
            raise ValueError
    except (ValueError, RecursionError):   # RecursionError: nested deeper than json can read
        words = '"earliest"' if name == "startingOffsets" else '"latest"'
        shown = repr(text) if len(text) <= 120 else f"{text[:120]!r}… ({len(text)} characters)"
        raise KafkaSourceError(f'{label} must be {words} or JSON like '
                               f'{{"topic":{{"0":23,"1":{default}}}}}, not {shown}') from None
    if any(o == refused for parts in spec.values() for o in parts.values()):
        raise KafkaSourceError(f"{label} cannot hold {refused} ({refused_word}) in a batch read, as in Spark")
    return {topic: {str(int(p)): o for p, o in parts.items()} for topic, parts in spec.items()}


def plan_ranges(options: SourceOptions) -> list[OffsetRange]:
    """Resolve the options into one offset range per topic partition (empty ranges dropped)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from kcm_common.kafka import ADVERTISED_PROBE_S, advertised_brokers, unreachable_advertised

    starting = offset_spec("startingOffsets", options.starting, EARLIEST)
    ending = offset_spec("endingOffsets", options.ending, LATEST)
    consumer = None
    try:
        consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, **options.client_options)
        try:
            partitions = []
            for topic in options.topics:
                numbers = consumer.partitions_for_topic(topic)
                if not numbers:
                    raise KafkaSourceError(f"topic {topic!r} does not exist")
                partitions += [TopicPartition(topic, n) for n in sorted(numbers)]
            earliest = consumer.beginning_offsets(partitions)
            latest = consumer.end_offsets(partitions)
            by_time = {}
            if options.starting_timestamp_ms is not None:
                by_time = consumer.offsets_for_times({tp: options.starting_timestamp_ms for tp in partitions})
        finally:
            consumer.close()
    except KafkaError as exc:
        # Planning runs on the driver; a one-line error beats kafka-python's traceback inside Spark's.
        detail = str(exc).strip() or type(exc).__name__
        servers = ",".join(options.client_options.get("bootstrap_servers", ()))
        hint = (unreachable_advertised(servers, advertised_brokers(consumer), ADVERTISED_PROBE_S)
                if consumer is not None else None)
        raise KafkaSourceError(f"cannot plan the offset ranges: Kafka at {servers} failed ({detail}); "
                               f"{hint or 'check --bootstrap-server and --command-config'}") from None
    for option, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        named = {(topic, number) for topic, offsets in (spec.items() if isinstance(spec, dict) else ())
                 for number in offsets}
        unknown = sorted(named - {(tp.topic, str(tp.partition)) for tp in partitions})
        if unknown:
            topic, number = unknown[0]
            known = ", ".join(str(tp.partition) for tp in partitions if tp.topic == topic)
            raise KafkaSourceError(f"{option} names partition {number} of {topic!r}, which has "
                                   f"{'partitions ' + known if known else 'no partitions'}")
    ranges = []
    for tp in partitions:
        start = _pick(starting, tp, EARLIEST, earliest[tp], latest[tp])
        if options.starting_timestamp_ms is not None:
            # A time lookup only narrows the scan: the job filters on record timestamps anyway.
            found = by_time.get(tp)
            if found is None and options.by_timestamp_strategy == "error":
                raise KafkaSourceError(
                    f"{tp.topic}-{tp.partition} holds no record at or after startingTimestamp "
                    f"{options.starting_timestamp_ms} (startingOffsetsByTimestampStrategy 'error', Spark's "
                    "default); give 'latest' to start such a partition at its end")
            start = max(start, found.offset if found is not None else latest[tp])
        end = _pick(ending, tp, LATEST, earliest[tp], latest[tp])
        open_end = not isinstance(ending, dict) or ending.get(tp.topic, {}).get(str(tp.partition), LATEST) == LATEST
        if start < earliest[tp]:
            raise KafkaSourceError(f"startingOffsets asks for {tp.topic}-{tp.partition} from offset {start}, "
                                   f"but its records start at {earliest[tp]} (deleted by retention?)")
        if end > start:
            ranges.append(OffsetRange(tp.topic, tp.partition, start, end, open_end))
    return split_ranges(ranges, options.min_partitions)


def _pick(spec: int | dict[str, dict[str, int]], tp: Any, default: int, earliest: int, latest: int) -> int:
    offset = spec if isinstance(spec, int) else spec.get(tp.topic, {}).get(str(tp.partition), default)
    return {EARLIEST: earliest, LATEST: latest}.get(offset, offset)


def split_ranges(ranges: list[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """Split ranges in proportion to their size until there are at least `min_partitions` of them (fewer only when
    there are fewer offsets: a piece never holds less than one), each into pieces differing by one offset at most."""
    total = sum(r.end - r.start for r in ranges)
    if len(ranges) >= min_partitions or total == 0:
        return ranges
    out = []
    for r in ranges:
        size = r.end - r.start
        pieces = min(size, max(1, math.ceil(size * min_partitions / total)))
        bounds = [r.start + size * i // pieces for i in range(pieces + 1)]
        for i in range(pieces):
            out.append(OffsetRange(r.topic, r.partition, bounds[i], bounds[i + 1], r.open_end and i == pieces - 1))
    return out


class Record(NamedTuple):
    """One Kafka record as the Arrow builders below take it (timestamp in ms, Spark's timestampType numbering)."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    headers: list[tuple[str, bytes | None]]


def read_range(options: SourceOptions, offsets: OffsetRange,
               read_ends: dict[int, int] | None = None) -> Iterator[list[Record]]:
    """Every record of `offsets` in lists of Records; raises KafkaSourceError if Kafka cannot serve it all. Once all
    is read, `read_ends` (if given) holds for the partition the offset after the last record taken (past an open end
    when the broker under-reported it)."""
    # confluent-kafka (librdkafka) costs a third of kafka-python's CPU per record, and this loop runs in every task.
    import confluent_kafka

    consumer = confluent_kafka.Consumer({
        "client.id": "kcm-rollup", **options.librdkafka_config,
        "group.id": "kcm-rollup", "enable.auto.commit": False,  # assigned, never joins the group
        "auto.offset.reset": "error", "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024, "fetch.wait.max.ms": 100,
        "logger": logging.getLogger("kcm.rollup.librdkafka")})
    try:
        assigned = confluent_kafka.TopicPartition(offsets.topic, offsets.partition, offsets.start)
        consumer.assign([assigned])
        rows: list[Record] = []
        position = offsets.start
        waited_since = time.monotonic()
        problems: list[str] = []   # the last error librdkafka reported without giving up (say, reading not allowed)
        while position < offsets.end:
            # Asking for no more than the range holds: consume() waits out its timeout for a batch it cannot fill.
            polled = _consume(consumer, offsets, position, min(_CONSUME_RECORDS, offsets.end - position), 0.5,
                              problems)
            if not polled:
                # Offsets without a record (transaction markers, compacted away) move the position, not the data.
                position = max(position, consumer.position([assigned])[0].offset)
                if position >= offsets.end:
                    break
                if (time.monotonic() - waited_since) * 1000 > options.poll_timeout_ms:
                    why = (f"Kafka's last error: {problems[-1]}" if problems
                           else "is endingOffsets beyond the end?")
                    raise KafkaSourceError(
                        f"{offsets.topic}-{offsets.partition} returned records up to offset {position} only, within "
                        f"{options.poll_timeout_ms} ms; the range ends at {offsets.end} ({why})")
                continue
            waited_since = time.monotonic()
            problems.clear()   # whatever went wrong before, records come again
            position = polled[-1].offset + 1
            if offsets.open_end and position >= offsets.end:
                # A broker that under-reports its end offset (Tansu counts batches) must not cut off the tail of the
                # batch that crosses it: librdkafka queues a fetched batch whole, so take what is queued already.
                while tail := _consume(consumer, offsets, position, _CONSUME_RECORDS, 0, problems):
                    polled += tail
                    position = tail[-1].offset + 1
            rows += polled if offsets.open_end else [record for record in polled if record.offset < offsets.end]
            if len(rows) >= _BATCH_RECORDS:
                yield rows
                rows = []
        if rows:
            yield rows
        if read_ends is not None:
            end = position if offsets.open_end else offsets.end
            read_ends[offsets.partition] = max(end, read_ends.get(offsets.partition, end))
    finally:
        consumer.close()


def _consume(consumer: Any, offsets: OffsetRange, position: int, count: int, timeout_s: float,
             problems: list[str]) -> list[Record]:
    """The records `consume` gives; raises KafkaSourceError for an error that ends the read, and keeps the last other
    one in `problems` (librdkafka retries it; the read's timeout then names it)."""
    import confluent_kafka

    from kcm_common.librdkafka import message_headers

    records = []
    for message in consumer.consume(count, timeout_s):
        error = message.error()
        if error is None:
            kind, timestamp = message.timestamp()
            # librdkafka numbers timestamp types from 0 = none, Spark from -1 = none.
            try:
                headers = message_headers(message) or []
            except Exception:  # noqa: BLE001 - a header name that is not UTF-8 (any producer may write one)
                # confluent-kafka cannot read such headers; the record goes on without them (decoding then says
                # what it makes of the value), never failing the job. Never asked again: see message_headers.
                headers = []
            records.append(Record(message.key(), message.value(), message.topic(), message.partition(),
                                  message.offset(), timestamp, kind - 1, headers))
        elif error.code() in (confluent_kafka.KafkaError._AUTO_OFFSET_RESET,
                              confluent_kafka.KafkaError.OFFSET_OUT_OF_RANGE):
            raise KafkaSourceError(f"{offsets.topic}-{offsets.partition} no longer holds offset {position} "
                                   "(deleted by retention?); rerun with a later range")
        elif error.fatal():
            raise KafkaSourceError(f"reading {offsets.topic}-{offsets.partition} failed: {error.str()}")
        else:
            problems[:] = [error.str()]
    return records


def records_to_arrow(records: list[Record], schema: pa.Schema) -> pa.RecordBatch:
    """Records as one Arrow batch with the Kafka source's columns."""
    columns: dict[str, list[Any]] = {
        "key": [r.key for r in records],
        "value": [r.value for r in records],
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "timestamp": [_micros(r.timestamp) for r in records],
        "timestampType": [r.timestamp_type for r in records],
    }
    arrays = [pa.array(columns[f.name], f.type) for f in schema if f.name != "headers"]
    if "headers" in schema.names:
        # A record without headers has none (null), not an empty list, as in Spark's source.
        arrays.insert(schema.get_field_index("headers"), headers_array([r.headers or None for r in records],
                                                                       schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def headers_array(headers: list[Any], kind: pa.ListType) -> pa.ListArray:
    """Records' headers (each a list of (name, value) pairs, or None for none) as one Arrow list<struct<key, value>>
    array of type `kind`. Built from flat columns: pyarrow converting a list of pairs into structs took 10 µs for a
    record's 16 headers, flat lists of names and values about 1 µs."""
    names = [name for pairs in headers if pairs for name, _ in pairs]
    values = [value for pairs in headers if pairs for _, value in pairs]
    offsets = pa.array(list(itertools.accumulate((len(pairs) if pairs else 0 for pairs in headers), initial=0)),
                       pa.int32())
    fields = list(kind.value_type)
    entries = pa.StructArray.from_arrays([pa.array(names, fields[0].type), pa.array(values, fields[1].type)],
                                         fields=fields)
    missing = [pairs is None for pairs in headers]
    return pa.ListArray.from_arrays(offsets, entries, type=kind, mask=pa.array(missing) if any(missing) else None)


def _micros(timestamp_ms: int) -> int | None:
    """A Kafka timestamp in microseconds; None beyond what 64 bits hold (decoding makes that record an error row)."""
    micros = timestamp_ms * 1000
    return micros if -2**63 <= micros < 2**63 else None


def records_to_decode_input(records: list[Any]) -> pa.RecordBatch:
    """Records (or kafka-python's ConsumerRecords) as one batch of what `decode.flatten` takes (DECODE_INPUT_SCHEMA)."""
    from kcm_rollups.decode import DECODE_INPUT_SCHEMA, utf8_text

    columns = [
        utf8_text(pa.array([r.key for r in records], pa.binary())),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([_micros(r.timestamp) for r in records], pa.int64()),
        headers_array([r.headers for r in records], DECODE_INPUT_SCHEMA.field("headers").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=DECODE_INPUT_SCHEMA)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """CPython's cyclic garbage collector off while a task reads (and the Python worker sends what it yields): the
    5,000 records of a batch are some hundred thousand Python objects (values, header names and values, their
    pairs), whose allocations set off thousands of collections: reading cost 12-16 µs of CPU per record with the
    collector on, 6 with it off (the benchmark's records). Reading makes no reference cycles: every object is still
    freed when its last reference goes. What was on before is on again after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class KafkaReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._schema = schema

    def partitions(self) -> list[OffsetRange]:
        return plan_ranges(self._options)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        with _collector_paused():
            yield from self._read(partition)

    def _read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return  # nothing was planned (every range empty): PySpark still reads one partition it made up
        if self._options.decode == "state":
            from kcm_rollups.decode import flatten_batches
            from kcm_rollups.partial import partial_batches, read_ends_batch, state_input_columns

            options = self._options
            read_ends: dict[int, int] = {}
            batches = self._in_time(read_range(options, partition, read_ends))
            points = flatten_batches((records_to_decode_input(records) for records in batches),
                                     columns=state_input_columns(options.dimensions))
            yield from partial_batches(points, options.window_seconds, options.dimensions)
            yield read_ends_batch(read_ends, options.dimensions)   # how far it read, for the job's cumulative pass
            return
        if self._options.decode == "points":
            from kcm_rollups.decode import flatten_batches

            columns = list(self._options.columns) or None
            batches = self._in_time(read_range(self._options, partition))
            for points in flatten_batches((records_to_decode_input(records) for records in batches), columns=columns):
                yield points.select(columns) if columns else points
            return
        schema = to_arrow_schema(self._schema, timezone="UTC")
        for records in read_range(self._options, partition):
            yield records_to_arrow(records, schema)


    def _in_time(self, batches: Iterator[list[Record]]) -> Iterator[list[Record]]:
        """Only records with timestamps in [kcm.sinceMicros, kcm.untilMicros): filtered before decoding."""
        since, until = self._options.since_micros, self._options.until_micros
        if since is None and until is None:
            yield from batches
            return
        low = -math.inf if since is None else since / 1000
        high = math.inf if until is None else until / 1000
        for records in batches:
            kept = [record for record in records if low <= record.timestamp < high]
            if kept:
                yield kept


class KafkaDataSource(DataSource):
    """`spark.read.format("kcm_kafka")`: Spark's Kafka source options and schema, planned with kafka-python and read
    with confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        if self.options.get(DECODE_OPTION, "").lower() == "state":
            from kcm_rollups.partial import state_schema

            return state_schema(_point_columns(self.options.get(DIMENSIONS_OPTION, ""), DIMENSIONS_OPTION))
        if self.options.get(DECODE_OPTION, "").lower() == "points":
            from kcm_rollups.decode import POINTS_SCHEMA

            columns = _point_columns(self.options.get(COLUMNS_OPTION, "")) or POINTS_SCHEMA.names
            return StructType([POINTS_SCHEMA[name] for name in columns])
        return kafka_schema(self.options.get("includeHeaders", "false").lower() == "true")

    def reader(self, schema: StructType) -> KafkaReader:
        return KafkaReader(SourceOptions.parse(self.options), schema)
