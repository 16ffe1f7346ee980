"""A batch PySpark data source that reads Kafka with the schema and option names of Spark's own Kafka source.

Used when the spark-sql-kafka connector is not on the classpath: `spark.read.format("kcm_kafka")` then yields
the same columns (`key value topic partition offset timestamp timestampType [headers]`) as `format("kafka")`.
The driver plans one offset range per input partition; each `read` assigns, seeks, polls in large batches and
raises rather than returning fewer records than its range holds.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

SOURCE_NAME = "kcm_kafka"
EARLIEST, LATEST = -2, -1  # Spark's sentinels inside startingOffsets/endingOffsets JSON
_BATCH_RECORDS = 20_000
_DEFAULT_POLL_TIMEOUT_MS = 30_000

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

    client_options: Mapping[str, Any]
    topics: tuple[str, ...]
    starting: str
    ending: str
    starting_timestamp_ms: int | None
    include_headers: bool
    min_partitions: int
    poll_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        from kcm_common.kafka import KafkaSettings

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
        client_options = KafkaSettings(bootstrap, properties).client_options()
        starting_timestamp = options.get("startingtimestamp")
        return cls(
            client_options=client_options,
            topics=topics,
            starting=options.get("startingoffsets", "earliest"),
            ending=options.get("endingoffsets", "latest"),
            starting_timestamp_ms=_whole_number("startingTimestamp", starting_timestamp)
            if starting_timestamp is not None else None,
            include_headers=options.get("includeheaders", "false").lower() == "true",
            min_partitions=_whole_number("minPartitions", options.get("minpartitions", "1")),
            poll_timeout_ms=_whole_number("kafkaConsumer.pollTimeoutMs",
                                          options.get("kafkaconsumer.polltimeoutms", str(_DEFAULT_POLL_TIMEOUT_MS))),
        )


def _whole_number(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise KafkaSourceError(f"option {name} must be a whole number, not {text!r}") from None


def _offset_spec(name: str, text: str, default: int) -> int | dict[str, dict[str, int]]:
    # "earliest" / "latest", or Spark's JSON {"topic": {"0": 23, "1": -2}}.
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        if name == "endingOffsets" and word == "earliest":
            raise KafkaSourceError("endingOffsets cannot be 'earliest'")
        return EARLIEST if word == "earliest" else LATEST
    try:
        spec = json.loads(text)
        if not isinstance(spec, dict) or not all(
                isinstance(parts, dict) and all(isinstance(o, int) for o in parts.values()) for parts in spec.values()):
            raise ValueError
        return {topic: {str(p): o for p, o in parts.items()} for topic, parts in spec.items()}
    except ValueError:
        raise KafkaSourceError(f'option {name} must be "earliest", "latest" or JSON like '
                               f'{{"topic":{{"0":23,"1":{default}}}}}, not {text!r}') from None


def plan_ranges(options: SourceOptions) -> list[OffsetRange]:
    """Resolve the options into one offset range per topic partition (empty ranges dropped)."""
    from kafka import KafkaConsumer, TopicPartition

    starting = _offset_spec("startingOffsets", options.starting, EARLIEST)
    ending = _offset_spec("endingOffsets", options.ending, LATEST)
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
    ranges = []
    for tp in partitions:
        start = _pick(starting, tp, EARLIEST, earliest[tp], latest[tp])
        if options.starting_timestamp_ms is not None:
            # A time lookup only narrows the scan: the job filters on record timestamps anyway.
            found = by_time.get(tp)
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
    """Split ranges in proportion to their size until there are at least `min_partitions` of them."""
    total = sum(r.end - r.start for r in ranges)
    if len(ranges) >= min_partitions or total == 0:
        return ranges
    out = []
    for r in ranges:
        pieces = max(1, math.ceil((r.end - r.start) * min_partitions / total))
        step = math.ceil((r.end - r.start) / pieces)
        starts = list(range(r.start, r.end, step))
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            out.append(OffsetRange(r.topic, r.partition, start, r.end if last else start + step,
                                   r.open_end and last))
    return out


def read_range(options: SourceOptions, offsets: OffsetRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Every record of `offsets` as Arrow batches of `schema`; raises KafkaSourceError if Kafka cannot serve it all."""
    # With an open end the poll that reaches `end` is kept whole: a broker that under-reports its end offset
    # (Tansu counts batches) must not cut off the tail of the last batch.
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    tp = TopicPartition(offsets.topic, offsets.partition)
    consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, auto_offset_reset="none",
                             max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
                             fetch_max_wait_ms=100, **options.client_options)
    try:
        consumer.assign([tp])
        consumer.seek(tp, offsets.start)
        rows: list[Any] = []
        position = offsets.start
        waited_since = time.monotonic()
        while position < offsets.end:
            try:
                # No record cap: kafka-python then hands over whole fetched batches, so the tail of the batch
                # that crosses an under-reported end is never left behind in its buffer.
                polled = consumer.poll(timeout_ms=500, max_records=sys.maxsize).get(tp, [])
            except OffsetOutOfRangeError:
                raise KafkaSourceError(f"{tp.topic}-{tp.partition} no longer holds offset {position} "
                                       "(deleted by retention?); rerun with a later range") from None
            if not polled:
                if (time.monotonic() - waited_since) * 1000 > options.poll_timeout_ms:
                    raise KafkaSourceError(
                        f"{tp.topic}-{tp.partition} returned records up to offset {position} only, within "
                        f"{options.poll_timeout_ms} ms; the range ends at {offsets.end} (is endingOffsets beyond the end?)")
                continue
            waited_since = time.monotonic()
            if not offsets.open_end:
                polled = [record for record in polled if record.offset < offsets.end]
            rows += polled
            position = max(consumer.position(tp), polled[-1].offset + 1 if polled else position)
            if len(rows) >= _BATCH_RECORDS:
                yield records_to_arrow(rows, schema)
                rows = []
        if rows:
            yield records_to_arrow(rows, schema)
    finally:
        consumer.close()


def records_to_arrow(records: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    """kafka-python ConsumerRecords as one Arrow batch with the Kafka source's columns."""
    columns: dict[str, list[Any]] = {
        "key": [r.key for r in records],
        "value": [r.value for r in records],
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "timestamp": [r.timestamp * 1000 for r in records],
        "timestampType": [r.timestamp_type for r in records],
    }
    if "headers" in schema.names:
        columns["headers"] = [[(name, value) for name, value in r.headers] for r in records]
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


class KafkaReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._schema = schema

    def partitions(self) -> list[OffsetRange]:
        return plan_ranges(self._options)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        yield from read_range(self._options, partition, to_arrow_schema(self._schema, timezone="UTC"))


class KafkaDataSource(DataSource):
    """`spark.read.format("kcm_kafka")`: Spark's Kafka source options and schema, read with kafka-python."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return kafka_schema(self.options.get("includeHeaders", "false").lower() == "true")

    def reader(self, schema: StructType) -> KafkaReader:
        return KafkaReader(SourceOptions.parse(self.options), schema)
