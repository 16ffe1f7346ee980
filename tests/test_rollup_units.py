"""The rollup's source, decode and partial-state modules in pure Python: no Spark, no broker.

The Kafka clients are replaced by fakes: kafka-python's KafkaConsumer for planning, confluent-kafka's Consumer for
reading, so offset planning and the read loop are pinned in milliseconds."""

from __future__ import annotations

import gc
import math
from collections import namedtuple
from typing import Any

import confluent_kafka
import kafka
import pyarrow as pa
import pytest

from kcm_rollups import source
from kcm_rollups.source import (EARLIEST, LATEST, KafkaReader, KafkaSourceError, OffsetRange, Record, SourceOptions,
                                offset_spec, plan_ranges, read_range, records_to_decode_input, split_ranges)

_OffsetAndTimestamp = namedtuple("_OffsetAndTimestamp", "offset timestamp")


def _options(**fields: Any) -> SourceOptions:
    parsed = SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})
    return SourceOptions(**{**{f: getattr(parsed, f) for f in SourceOptions.__dataclass_fields__}, **fields})


# ---------------------------------------------------------------- split_ranges


def test_split_ranges_cover_every_offset_once_and_only_the_last_piece_of_an_open_range_is_open():
    pieces = split_ranges([OffsetRange("t", 0, 10, 20, True), OffsetRange("t", 1, 0, 3, False)], 6)
    by_partition = {p: [(r.start, r.end, r.open_end) for r in pieces if r.partition == p] for p in (0, 1)}
    covered = sorted((r.partition, o) for r in pieces for o in range(r.start, r.end))
    assert covered == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(3)]   # every offset once
    assert [open_end for *_, open_end in by_partition[0]] == [False] * (len(by_partition[0]) - 1) + [True]
    assert not any(open_end for *_, open_end in by_partition[1])
    assert len(pieces) >= 6


def test_split_ranges_reach_min_partitions_when_ranges_share_it_and_never_make_a_zero_step():
    # Two ranges of 5 and minPartitions 3: each needs ceil(5 * 3 / 10) = 2 pieces, not floor's 1.
    assert len(split_ranges([OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 5)], 3)) >= 3
    # More partitions asked for than records: one record a piece, never range() with a step of 0.
    assert [(r.start, r.end) for r in split_ranges([OffsetRange("t", 0, 0, 3, True)], 10)] == [(0, 1), (1, 2), (2, 3)]


def test_ranges_already_as_many_as_min_partitions_are_left_whole():
    ranges = [OffsetRange("t", 0, 0, 1), OffsetRange("t", 1, 0, 9, True)]
    assert split_ranges(ranges, 2) == ranges


# ---------------------------------------------------------------- offset_spec / options


@pytest.mark.parametrize("name, text, message", [
    ("startingOffsets", '{"t": {"0": true}}', "must be"),            # a JSON boolean is not offset 1
    ("startingOffsets", '{"t": {"0": 9223372036854775808}}', "must be"),  # beyond a signed 64-bit offset
    ("endingOffsets", '{"t": {"0": -2}}', "cannot hold -2 (earliest)"),   # would read nothing, silently
    ("startingOffsets", '{"t": {"0": -1}}', "cannot hold -1 (latest)"),
])
def test_offsets_json_refuses_what_spark_refuses(name, text, message):
    with pytest.raises(KafkaSourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        offset_spec(name, text, EARLIEST if name == "startingOffsets" else LATEST)


def test_ending_timestamp_is_refused_rather_than_ignored():
    with pytest.raises(KafkaSourceError, match="endingTimestamp is not supported"):
        SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t", "endingTimestamp": "5"})


@pytest.mark.parametrize("given, strategy", [(None, "error"), ("LATEST", "latest"), (" error ", "error"),
                                             ("earliest", None), ("", None)])
def test_the_starting_offsets_by_timestamp_strategy_is_error_or_latest_as_in_spark(given, strategy):
    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    if given is not None:
        options["startingOffsetsByTimestampStrategy"] = given
    if strategy is None:
        with pytest.raises(KafkaSourceError, match="startingOffsetsByTimestampStrategy must be 'error' or 'latest'"):
            SourceOptions.parse(options)
    else:
        assert SourceOptions.parse(options).by_timestamp_strategy == strategy


# ---------------------------------------------------------------- plan_ranges (fake kafka-python consumer)


class _FakePlanner:
    """kafka-python's KafkaConsumer as plan_ranges uses it: topic t, partitions 0 and 1."""

    earliest = {0: 5, 1: 0}
    latest = {0: 20, 1: 8}
    by_time: dict[int, int | None] = {0: 12, 1: None}

    def __init__(self, **_: Any) -> None:
        pass

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0, 1} if topic == "t" else None

    def beginning_offsets(self, partitions):
        return {tp: self.earliest[tp.partition] for tp in partitions}

    def end_offsets(self, partitions):
        return {tp: self.latest[tp.partition] for tp in partitions}

    def offsets_for_times(self, wanted):
        return {tp: None if self.by_time[tp.partition] is None else _OffsetAndTimestamp(self.by_time[tp.partition], 0)
                for tp in wanted}

    def close(self) -> None:
        pass


@pytest.fixture
def planner(monkeypatch):
    monkeypatch.setattr(kafka, "KafkaConsumer", _FakePlanner)

    def plan(**fields: Any) -> list[tuple[int, int, int, bool]]:
        return [(r.partition, r.start, r.end, r.open_end) for r in plan_ranges(_options(**fields))]
    return plan


def test_partitions_the_offsets_json_leaves_out_read_from_earliest_to_latest(planner):
    assert planner(starting='{"t": {"0": 7}}', ending='{"t": {"0": 9}}') == [(0, 7, 9, False), (1, 0, 8, True)]


def test_only_an_end_from_the_broker_is_an_open_end(planner):
    assert planner(ending='{"t": {"0": 15, "1": -1}}') == [(0, 5, 15, False), (1, 0, 8, True)]


def test_a_starting_timestamp_after_every_record_of_a_partition_reads_nothing_of_it_with_the_latest_strategy(planner):
    assert planner(starting_timestamp_ms=1, by_timestamp_strategy="latest") == [(0, 12, 20, True)]
    with pytest.raises(KafkaSourceError, match="t-1 holds no record at or after startingTimestamp 1 "):
        planner(starting_timestamp_ms=1)   # Spark's default strategy: error


def test_a_start_before_the_records_retention_kept_is_an_error_not_a_short_read(planner):
    with pytest.raises(KafkaSourceError, match="from offset 2, but its records start at 5"):
        planner(starting='{"t": {"0": 2, "1": -2}}')


def test_offsets_json_naming_a_partition_the_topic_lacks_is_an_error(planner):
    with pytest.raises(KafkaSourceError, match="endingOffsets names partition 7 of 't', which has partitions 0, 1"):
        planner(ending='{"t": {"7": 3}}')


# ---------------------------------------------------------------- read_range (fake confluent-kafka consumer)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _Error:
    def __init__(self, code: int, fatal: bool = False) -> None:
        self._code, self._fatal = code, fatal

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return self._fatal

    def str(self) -> str:
        return f"error {self._code}"


class _Message:
    def __init__(self, offset: int, error: _Error | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self):
        return self._error

    def timestamp(self):
        return 1, 1_000 + self._offset

    def headers(self):
        return None

    def key(self):
        return None

    def value(self):
        return b"v%d" % self._offset

    def topic(self):
        return "t"

    def partition(self):
        return 0

    def offset(self):
        return self._offset


class _FakeReader:
    """confluent-kafka's Consumer: `script` is what each consume() returns in turn (then nothing); `end` is where
    position() says the partition's records end; each consume() call advances `clock` by `tick` seconds."""

    script: list[list[_Message]] = []
    end = 0
    clock: _Clock | None = None
    tick = 0.0
    asked: list[int] = []

    def __init__(self, config: dict) -> None:
        self.position_now = 0

    def assign(self, partitions) -> None:
        self.position_now = partitions[0].offset

    def consume(self, count: int, timeout: float) -> list[_Message]:
        type(self).asked.append(count)
        if self.clock is not None:
            self.clock.now += self.tick
        batch = self.script.pop(0) if self.script else []
        batch = batch[:count]
        if batch and batch[-1].error() is None:
            self.position_now = batch[-1].offset() + 1
        return batch

    def position(self, partitions):
        return [confluent_kafka.TopicPartition("t", 0, max(self.position_now, self.end))]

    def close(self) -> None:
        pass


@pytest.fixture
def reader(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(confluent_kafka, "Consumer", _FakeReader)
    monkeypatch.setattr(source, "time", clock)
    monkeypatch.setattr(_FakeReader, "clock", clock)
    monkeypatch.setattr(_FakeReader, "asked", [])

    def read(script, offsets: OffsetRange, end: int = 0, tick: float = 0.0, poll_timeout_ms: int = 1500):
        monkeypatch.setattr(_FakeReader, "script", [list(batch) for batch in script])
        monkeypatch.setattr(_FakeReader, "end", end)
        monkeypatch.setattr(_FakeReader, "tick", tick)
        return [r.offset for batch in read_range(_options(poll_timeout_ms=poll_timeout_ms), offsets) for r in batch]
    return read


def test_offsets_without_a_record_at_the_end_of_a_range_end_it_rather_than_time_out(reader):
    # Records 0 and 1, then a transaction's commit marker at 2: the range [0, 3) is read whole.
    assert reader([[_Message(0), _Message(1)]], OffsetRange("t", 0, 0, 3), end=3, tick=1.0) == [0, 1]


def test_the_poll_timeout_counts_from_the_last_record_not_from_the_start_of_the_read(reader):
    # A record every other poll, a second apart: never 1.5 s without one, though the read lasts 8 s.
    script = [batch for o in range(4) for batch in ([_Message(o)], [])]
    assert reader(script, OffsetRange("t", 0, 0, 4), tick=1.0) == [0, 1, 2, 3]


def test_a_tail_queued_past_an_under_reported_end_is_read(reader):
    # The broker said the partition ends at 2; librdkafka had fetched the whole batch 0..4.
    script = [[_Message(o) for o in range(5)]]
    script = [script[0][:2], script[0][2:]]
    assert reader(script, OffsetRange("t", 0, 0, 2, open_end=True)) == [0, 1, 2, 3, 4]


def test_no_more_records_are_asked_for_than_a_range_holds(reader):
    assert reader([[_Message(o) for o in range(3)]], OffsetRange("t", 0, 0, 3)) == [0, 1, 2]
    assert _FakeReader.asked == [3]


def test_an_offset_retention_deleted_is_named_as_such(reader):
    gone = _Message(0, _Error(confluent_kafka.KafkaError.OFFSET_OUT_OF_RANGE))
    with pytest.raises(KafkaSourceError, match="t-0 no longer holds offset 0 .deleted by retention"):
        reader([[gone]], OffsetRange("t", 0, 0, 3), tick=1.0)


def test_a_fatal_consumer_error_fails_the_read_at_once_with_its_reason(reader):
    fatal = _Message(0, _Error(confluent_kafka.KafkaError._FATAL, fatal=True))
    with pytest.raises(KafkaSourceError, match="reading t-0 failed: error"):
        reader([[fatal]], OffsetRange("t", 0, 0, 3), tick=1.0)


def test_an_error_librdkafka_retries_is_named_when_the_read_times_out(reader):
    # Read not allowed (the topic's Describe is, so planning worked): librdkafka reports it and retries; the read
    # times out naming it, not blaming endingOffsets. Records arriving in between clear what was said before.
    denied = _Message(0, _Error(confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaSourceError, match=r"t-0 returned records up to offset 0 only, within 1500 ms; the range "
                                               rf"ends at 3 \(Kafka's last error: error "
                                               rf"{confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED}\)"):
        reader([[denied]], OffsetRange("t", 0, 0, 3), tick=1.0)
    with pytest.raises(KafkaSourceError, match=r"the range ends at 3 \(is endingOffsets beyond the end\?\)"):
        reader([[denied], [_Message(0)]], OffsetRange("t", 0, 0, 3), tick=1.0)


def test_a_read_asks_for_few_records_at_a_time_and_yields_them_in_large_batches(reader, monkeypatch):
    # Records are turned into Python objects right after the consume() that fetched them (still in the CPU's caches);
    # the Arrow batches stay large.
    monkeypatch.setattr(source, "_CONSUME_RECORDS", 2)
    monkeypatch.setattr(source, "_BATCH_RECORDS", 4)
    monkeypatch.setattr(_FakeReader, "script", [[_Message(0), _Message(1)], [_Message(2), _Message(3)], [_Message(4)]])
    batches = list(read_range(_options(), OffsetRange("t", 0, 0, 5)))
    assert _FakeReader.asked == [2, 2, 1]
    assert [[r.offset for r in batch] for batch in batches] == [[0, 1, 2, 3], [4]]


def test_a_read_runs_without_the_cyclic_collector_and_puts_it_back_however_it_ends(reader, monkeypatch):
    monkeypatch.setattr(source, "_BATCH_RECORDS", 1)
    schema = source.kafka_schema(True)
    for ended_early in (False, True):
        monkeypatch.setattr(_FakeReader, "script", [[_Message(0)], [_Message(1)]])
        read = KafkaReader(_options(), schema).read(OffsetRange("t", 0, 0, 2))
        assert next(read).column("offset").to_pylist() == [0]
        assert not gc.isenabled()
        if ended_early:
            read.close()   # Spark stops reading a partition (a LIMIT, a failed task)
        else:
            assert [b.column("offset").to_pylist() for b in read] == [[1]]
        assert gc.isenabled()
    gc.disable()
    try:   # a collector someone turned off stays off
        monkeypatch.setattr(_FakeReader, "script", [[_Message(0)]])
        assert len(list(KafkaReader(_options(), schema).read(OffsetRange("t", 0, 0, 1)))) == 1
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("headers", [
    [[("content-type", b"application/x-protobuf"), ("empty", b""), ("null", None)], [], None, [("é", b"\xff")]],
    [None, None], [[], []], [],
    [[(f"h{i}", bytes([i]) * i) for i in range(n)] for n in range(20)],
])
def test_headers_become_the_arrow_array_pyarrow_itself_would_make(headers):
    from kcm_rollups.decode import DECODE_INPUT_SCHEMA

    for kind in (DECODE_INPUT_SCHEMA.field("headers").type,   # what decoding takes, and Spark's Kafka source's
                 source.to_arrow_schema(source.kafka_schema(True), timezone="UTC").field("headers").type):
        built = source.headers_array(headers, kind)
        assert built.type == kind and built.equals(pa.array(headers, kind))


class _Builder:
    """SparkSession.builder, recording the settings a session would start with (no JVM is started)."""

    def __init__(self) -> None:
        self.settings: dict[str, str] = {}

    def appName(self, name):  # noqa: N802 (PySpark's names)
        return self

    def master(self, master):
        self.settings["master"] = master
        return self

    def config(self, key, value):
        self.settings[key] = value
        return self

    def getOrCreate(self):  # noqa: N802
        return type("Session", (), {"dataSource": type("Sources", (), {"register": lambda self, source: None})()})()


@pytest.mark.parametrize("master, config, expected", [
    ("local[2]", {}, "-XX:TieredStopAtLevel=1 -Dlog4j.configurationFile=file://"),
    ("local[*]", {"spark.driver.defaultJavaOptions": "-Xss4m"}, "-Xss4m"),   # the caller's own wins
    ("spark://h:7077", {}, None), (None, {}, None),   # a cluster's JVMs are its own (or spark-submit's) to set
])
def test_a_local_master_s_jvm_compiles_with_c1_only_unless_told_otherwise(monkeypatch, master, config, expected):
    from kcm_rollups import session

    builder = _Builder()
    monkeypatch.setattr(session, "SparkSession", type("SparkSession", (), {"builder": builder}))
    monkeypatch.setenv("PYSPARK_PYTHON", "python")   # setdefault'ed by a local master: kept out of this process
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    session.spark_session(master, config=config)
    options = builder.settings.get("spark.driver.defaultJavaOptions")
    if expected is not None and "log4j" in expected:
        assert options.startswith(expected), options   # and kcm's logging: see the next test
    else:
        assert options == expected
    assert session.LOCAL_JVM_OPTIONS == "-XX:TieredStopAtLevel=1"


def test_a_local_master_logs_as_kcm_s_file_says_unless_spark_s_conf_directory_has_a_log4j2_configuration(
        monkeypatch, tmp_path):
    from kcm_rollups import session

    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    ours = f"-XX:TieredStopAtLevel=1 -Dlog4j.configurationFile={session.LOCAL_LOGGING.as_uri()}"
    assert session.local_jvm_options() == ours
    text = session.LOCAL_LOGGING.read_text()
    for logger in ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager"):
        name = next(line.split(" = ")[0] for line in text.splitlines() if line.endswith(f" = {logger}"))
        assert f"{name.removesuffix('.name')}.filter.failed.onMatch = DENY" in text   # its failure lines only

    home = tmp_path / "spark home"   # a path with a space: the launcher splits options at white space
    (home / "conf").mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(session, "LOCAL_LOGGING", home / "log4j2-local.properties")
    assert session.local_jvm_options() == "-XX:TieredStopAtLevel=1"   # not on disk (kcm in a zip): Spark's own
    (home / "log4j2-local.properties").write_text("")
    assert session.local_jvm_options().split() == ["-XX:TieredStopAtLevel=1", "-Dlog4j.configurationFile="
                                                   + (home / "log4j2-local.properties").as_uri()]
    (home / "conf" / "log4j2.xml").write_text("<Configuration/>")
    assert session.local_jvm_options() == "-XX:TieredStopAtLevel=1"   # SPARK_HOME/conf's own
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))   # SPARK_CONF_DIR first: without a configuration, kcm's
    assert "log4j.configurationFile" in session.local_jvm_options()
    for ignored in ("log4j2.properties.template", "log4j2.xml~"):   # what Spark ships, an editor's backup
        (conf / ignored).write_text("rootLogger.level = info\n")
        assert "log4j.configurationFile" in session.local_jvm_options(), ignored
    (conf / "log4j2.properties").write_text("rootLogger.level = info\n")
    assert session.local_jvm_options() == "-XX:TieredStopAtLevel=1"


class _Conf:
    """spark.conf: a session's runtime settings."""

    def __init__(self, settings):
        self.settings = dict(settings)

    def get(self, key, default=None):
        return self.settings.get(key, default)

    def set(self, key, value):
        self.settings[key] = value

    def unset(self, key):
        self.settings.pop(key, None)


def test_session_conf_holds_settings_for_its_block_only_and_puts_back_what_was_there():
    from kcm_rollups.session import session_conf

    spark = type("Session", (), {"conf": _Conf({"a": "1", "other": "x"})})()
    with session_conf(spark, {"a": "2", "b": "3"}):
        assert spark.conf.settings == {"a": "2", "b": "3", "other": "x"}
    assert spark.conf.settings == {"a": "1", "other": "x"}   # b was unset before: unset again, not left at 3
    with pytest.raises(ValueError), session_conf(spark, {"a": "4"}):
        raise ValueError("a failed action")
    assert spark.conf.settings == {"a": "1", "other": "x"}


# ---------------------------------------------------------------- record times


def test_a_record_time_beyond_64_bit_microseconds_is_a_null_time_not_an_overflow():
    batch = records_to_decode_input([Record(None, b"x", "t", 0, 0, 2**62, 0, []),
                                     Record(None, b"y", "t", 0, 1, 5, 0, [])])
    assert batch.column("record_micros").to_pylist() == [None, 5000]


def test_time_range_bounds_are_microseconds_not_rounded_to_milliseconds():
    reader = KafkaReader(_options(since_micros=3_000_500, until_micros=5_000_000), None)
    records = [Record(None, b"", "t", 0, o, ms, 0, []) for o, ms in enumerate([3000, 3001, 4999, 5000])]
    assert [r.timestamp for batch in reader._in_time(iter([records])) for r in batch] == [3001, 4999]


# ---------------------------------------------------------------- decode


def _decode_helpers():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    from test_rollup_decode import records_batch
    return AnyValue, KeyValue, metrics_pb2, records_batch


def _with_resource(attributes: dict[str, str]):
    from payloads import client_metrics

    AnyValue, KeyValue, _, _ = _decode_helpers()
    data = client_metrics("orders")
    data.resource_metrics[0].resource.attributes.extend(
        KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items())
    return data.SerializeToString()


def test_identity_headers_beat_resource_attributes_which_beat_the_key():
    from kcm_rollups.decode import flatten

    *_, records_batch = _decode_helpers()
    rows = flatten(records_batch([
        ("key-1", _with_resource({"client_id": "from-resource", "client_instance_id": "res-1"}),
         {"client_id": "from-header", "client_instance_id": "hdr-1"}),
        ("key-2", _with_resource({"client_instance_id": "res-2"}), {}),
    ])).to_pylist()
    assert [(r["client_id"], r["client_instance_id"]) for r in rows] == [
        ("from-header", "hdr-1"), ("from-header", "hdr-1"), (None, "res-2"), (None, "res-2")]


def test_a_record_time_of_exactly_the_latest_time_is_invalid():
    from kcm_rollups.decode import INVALID_TIMESTAMP, _LATEST_MICROS, flatten
    from payloads import client_metrics

    good = client_metrics().SerializeToString()
    records = [Record(b"a", good, "t", 0, 0, _LATEST_MICROS // 1000 - 1, 0, []),
               Record(b"b", good, "t", 0, 1, _LATEST_MICROS // 1000, 0, [])]
    rows = flatten(records_to_decode_input(records)).to_pylist()
    assert [(r["client_instance_id"], r["error"]) for r in rows] == [("a", None), ("a", None),
                                                                     ("b", INVALID_TIMESTAMP)]


def test_an_identity_of_exactly_max_identity_chars_is_kept():
    from kcm_rollups.decode import MAX_IDENTITY_CHARS, flatten
    from payloads import client_metrics

    *_, records_batch = _decode_helpers()
    rows = flatten(records_batch([("k", client_metrics().SerializeToString(),
                                   {"client_id": "c" * MAX_IDENTITY_CHARS})])).to_pylist()
    assert [r["error"] for r in rows] == [None, None]


def _histogram_record(**point) -> bytes:
    from payloads import client_metrics

    _, _, metrics_pb2, _ = _decode_helpers()
    data = client_metrics("orders")
    latency = data.resource_metrics[0].scope_metrics[0].metrics.add(name="latency")
    latency.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    latency.histogram.data_points.add(**point)
    return data.SerializeToString()


def test_points_beyond_what_the_columns_hold_are_one_invalid_point_row_never_an_overflow_that_fails_the_batch():
    """A start time or a bucket count past int64 raised OverflowError from pa.array: no error row, a failed job."""
    from kcm_rollups.decode import INVALID_POINT, flatten
    from payloads import client_metrics

    *_, records_batch = _decode_helpers()
    late_start = client_metrics("orders")
    late_start.resource_metrics[0].scope_metrics[0].metrics[1].sum.data_points[0].start_time_unix_nano = 2**63
    rows = flatten(records_batch([
        ("start", late_start.SerializeToString(), {}),
        ("bucket", _histogram_record(count=1, bucket_counts=[2**64 - 1, 0], explicit_bounds=[1.0]), {}),
        ("ok", client_metrics().SerializeToString(), {}),
    ])).to_pylist()
    assert [(r["client_instance_id"], r["error"]) for r in rows] == [
        ("start", INVALID_POINT), ("bucket", INVALID_POINT), ("ok", None), ("ok", None)]


def test_a_histogram_point_without_a_sum_has_a_null_sum_not_zero():
    from kcm_rollups.decode import flatten

    *_, records_batch = _decode_helpers()
    rows = flatten(records_batch([("h", _histogram_record(count=3, bucket_counts=[1, 2], explicit_bounds=[1.0]),
                                   {})])).to_pylist()
    assert [(r["metric"], r["count"], r["sum"]) for r in rows if r["type"] == "histogram"] == [("latency", 3, None)]


def test_a_record_dropped_halfway_leaves_no_column_of_its_points_on_its_error_row():
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    from kcm_rollups.decode import INVALID_POINT, flatten

    *_, records_batch = _decode_helpers()
    data = metrics_pb2.MetricsData()
    scope = data.resource_metrics.add().scope_metrics.add()
    histogram = scope.metrics.add(name="h").histogram
    histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    histogram.data_points.add(count=3, sum=1.0, bucket_counts=[1, 2], explicit_bounds=[1.0])  # the record's 1st row
    scope.metrics.add(name="late").gauge.data_points.add(time_unix_nano=2**63, as_double=1.0)
    rows = flatten(records_batch([("x", data.SerializeToString(), {})])).to_pylist()
    assert [(r["error"], r["count"], r["sum"], r["bucket_counts"], r["bounds"]) for r in rows] == [
        (INVALID_POINT, None, None, None, None)]


def test_scopes_that_differ_only_in_their_version_are_told_apart():
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    from kcm_rollups.decode import flatten

    *_, records_batch = _decode_helpers()
    data = metrics_pb2.MetricsData()
    resource = data.resource_metrics.add()
    for version in ("1", "2"):
        scope = resource.scope_metrics.add()
        scope.scope.version = version
        scope.metrics.add(name="g").gauge.data_points.add(as_double=1.0)
    rows = flatten(records_batch([("x", data.SerializeToString(), {})])).to_pylist()
    assert [r["scope"] for r in rows] == ['["","1"]', '["","2"]']


@pytest.mark.parametrize("bound, error", [(1000, "too-large"), (2220, None)])
def test_a_scope_name_counts_toward_the_record_text_once_per_point(monkeypatch, bound, error):
    """20 points of a 100-character scope: 20 x (107 scope text + 1 metric + 2 attributes + 1 key) = 2220 characters,
    past a bound of 1000 (counted once, the scope would be 107), and exactly at a bound of 2220, which is kept."""
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    from kcm_rollups import decode

    *_, records_batch = _decode_helpers()
    monkeypatch.setattr(decode, "MAX_RECORD_TEXT", bound)
    data = metrics_pb2.MetricsData()
    scope = data.resource_metrics.add().scope_metrics.add()
    scope.scope.name = "s" * 100
    gauge = scope.metrics.add(name="g").gauge
    for _ in range(20):
        gauge.data_points.add(as_double=1.0)
    rows = decode.flatten(records_batch([("x", data.SerializeToString(), {})])).to_pylist()
    assert {r["error"] for r in rows} == {error} and len(rows) == (1 if error else 20)


# ---------------------------------------------------------------- partial


def _points_table(points: list[dict]) -> pa.Table:
    from pyspark.sql.pandas.types import to_arrow_schema

    from kcm_rollups.decode import POINTS_SCHEMA
    return pa.Table.from_pylist(points, to_arrow_schema(POINTS_SCHEMA))


def test_last_of_one_record_is_its_latest_point_time_not_its_last_row():
    """aggregate.partial_state orders `last` by (record time, partition, offset, point time): two points of one
    record (same metric, other attributes) in decreasing time order give the later time's value."""
    from kcm_rollups.partial import partial_state
    from test_rollup_math import point

    one = point("g", 5, "i1", value=1.0, attributes='{"n":"1"}')
    other = {**one, "value": 2.0, "time_ns": one["time_ns"] - 10**9, "attributes": '{"n":"2"}',
             "record_first": False}
    state = partial_state(_points_table([one, other]), 60, ()).to_pylist()
    assert [(r["last"], r["last_time_ns"]) for r in state] == [(1.0, one["time_ns"])]


def test_a_record_before_1970_falls_in_the_window_spark_floors_it_to():
    from kcm_rollups.partial import partial_state
    from test_rollup_math import point

    error = {**point(None, 0, "i5", type=None, time_ns=None, attributes=None), "error": "invalid-timestamp",
             "record_micros": -1000}
    state = partial_state(_points_table([error]), 60, ()).to_pylist()
    assert [r["window_start"].timestamp() for r in state] == [-60.0]


def test_a_record_of_exactly_max_points_is_kept_and_one_more_is_too_large(monkeypatch):
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    from kcm_rollups import decode

    *_, records_batch = _decode_helpers()
    monkeypatch.setattr(decode, "MAX_POINTS", 3)

    def gauges(count: int) -> bytes:
        data = metrics_pb2.MetricsData()
        gauge = data.resource_metrics.add().scope_metrics.add().metrics.add(name="g").gauge
        for _ in range(count):
            gauge.data_points.add(as_double=1.0)
        return data.SerializeToString()

    rows = decode.flatten(records_batch([("three", gauges(3), {}), ("four", gauges(4), {})])).to_pylist()
    assert [(r["client_instance_id"], r["error"]) for r in rows] == [("three", None)] * 3 + [("four", "too-large")]


def test_points_arrow_cannot_hold_become_a_too_large_row_per_record_not_a_failed_batch(monkeypatch):
    from kcm_rollups import decode
    from payloads import client_metrics

    *_, records_batch = _decode_helpers()
    real, calls = decode._Rows.batch, []

    def fails_once(self, records, headers, fields):
        calls.append(1)
        if len(calls) == 1:
            raise pa.ArrowCapacityError("array cannot contain more than 2147483646 bytes")
        return real(self, records, headers, fields)

    monkeypatch.setattr(decode._Rows, "batch", fails_once)
    good = client_metrics().SerializeToString()
    rows = decode.flatten(records_batch([("a", good, {}), ("b", good, {})])).to_pylist()
    assert [(r["client_instance_id"], r["error"], r["record_first"]) for r in rows] == [
        ("a", "too-large", True), ("b", "too-large", True)]
    assert "do not fit in an Arrow batch (ArrowCapacityError" in rows[0]["error_message"]


def test_error_rows_count_their_carried_headers_toward_cutting_batches():
    from kcm_rollups.decode import flatten_batches

    *_, records_batch = _decode_helpers()
    records = records_batch([(f"k{i}", b"", {"principal": "User:" + "p" * 1000}) for i in range(4)])  # 4 `empty` rows
    assert [b.num_rows for b in flatten_batches([records], max_text=1500)] == [2, 2]


def test_a_gauge_point_without_a_value_is_not_counted_as_nan():
    from kcm_rollups.partial import partial_state
    from test_rollup_math import point

    rows = partial_state(_points_table([point("g", 1, value=None), point("g", 2, value=math.nan),
                                        point("g", 3, value=2.0)]), 60, ()).to_pylist()
    assert [(r["count"], r["nan_count"], r["min"], r["last"]) for r in rows] == [(1, 1, 2.0, 2.0)]


def test_a_batch_without_points_yields_no_state():
    from kcm_rollups.partial import partial_batches

    empty = _points_table([]).to_batches() or [pa.RecordBatch.from_pylist([], _points_table([]).schema)]
    assert list(partial_batches(iter(empty), 60, ())) == []


def test_records_out_of_the_time_range_are_dropped_after_their_offsets_count_for_how_far_the_read_went():
    from kcm_rollups.decode import DECODE_INPUT_SCHEMA
    from kcm_rollups.partial import noting_read_ends

    def batch(rows: list[tuple[int, int, int | None]]) -> pa.RecordBatch:   # (partition, offset, record_micros)
        return pa.RecordBatch.from_pylist([{"topic": "t", "partition": p, "offset": o, "record_micros": micros,
                                            "headers": []} for p, o, micros in rows], DECODE_INPUT_SCHEMA)

    batches = [batch([(0, 5, 100), (0, 6, 250), (1, 3, 50), (1, 4, None)]), batch([]),
               batch([(0, 7, 199), (2, 9, 300)])]
    ends: dict[int, int] = {}
    kept = list(noting_read_ends(iter(batches), ends, 100, 200))
    assert [(r["partition"], r["offset"]) for b in kept for r in b.to_pylist()] == [(0, 5), (0, 7)]
    assert ends == {0: 8, 1: 5, 2: 10}
    ends.clear()
    everything = list(noting_read_ends(iter(batches), ends, None, None))
    assert sum(b.num_rows for b in everything) == 6 and ends == {0: 8, 1: 5, 2: 10}
    assert [b.num_rows for b in noting_read_ends(iter(batches), {}, None, 100)] == [1]


def test_py4j_s_tracebacks_of_an_interrupted_call_are_kept_quiet_while_a_rollup_runs(monkeypatch, caplog):
    """Ctrl-C inside a call to the JVM: py4j logs "... while sending command." on the root logger, and while Spark
    starts "Exception occurred while shutting down connection" on its own logger, each with a traceback; the run
    ends with exit 130 and nothing else. Other records, and these once the run is over, go through."""
    import logging

    from kcm_rollups import job

    def interrupted(spark, options):
        for name, message in (("", "An error occurred while sending command."),
                              ("py4j.clientserver", "Exception occurred while shutting down connection"),
                              ("py4j.clientserver", "Connection is closed")):
            try:
                raise BrokenPipeError(32, "Broken pipe")
            except BrokenPipeError:
                logging.getLogger(name).exception(message)
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "check_reachable", lambda settings: None)
    monkeypatch.setattr(job, "check_authenticates", lambda settings: {"t"})
    monkeypatch.setattr(job, "_started", lambda master: object())
    monkeypatch.setattr(job, "run", interrupted)
    caplog.set_level(logging.INFO)
    with pytest.raises(KeyboardInterrupt):
        job.run_rollup("127.0.0.1:9092", "t", "/tmp/unused", last=None, master="local[1]")
    assert [r.getMessage() for r in caplog.records] == ["Connection is closed"]
    caplog.clear()
    logging.getLogger("py4j.clientserver").error("Exception occurred while shutting down connection")
    assert len(caplog.records) == 1   # the filters are gone with the run


def test_a_topic_kafka_does_not_name_is_said_before_spark_starts(monkeypatch):
    """Spark takes 10 s and more to start; planning inside it would say the same much later, without the cluster."""
    from kcm_common.errors import UserError
    from kcm_rollups import job

    monkeypatch.setattr(job, "check_reachable", lambda settings: None)
    monkeypatch.setattr(job, "check_authenticates", lambda settings: {"kafka-client-metrics", "__consumer_offsets"})
    monkeypatch.setattr(job, "_started", lambda master: pytest.fail("Spark started"))
    with pytest.raises(UserError) as refused:
        job.run_rollup("127.0.0.1:9092", "kafka-client-metric", "/tmp/unused", master="local[1]")
    assert str(refused.value) == ("topic 'kafka-client-metric' does not exist on 127.0.0.1:9092 (PLAINTEXT); check "
                                  "--topic and that the brokers' telemetry receiver writes there")
