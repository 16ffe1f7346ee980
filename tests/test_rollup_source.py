"""The Python Kafka data source: Spark's Kafka source schema and options, exact offset ranges, whole tails, and
clear errors rather than short reads."""

from __future__ import annotations

import pytest
from kafka import KafkaProducer
from pyspark.sql.pandas.types import to_arrow_schema

from kcm_rollups.source import EARLIEST, LATEST, SOURCE_NAME, SourceOptions, kafka_schema, offset_spec
from spark_support import spark  # noqa: F401  (the session-scoped fixture)


def produce(kafka, topic: str, records: list[tuple[int, bytes]], one_per_batch: bool = True) -> None:
    """(partition, value) records, each with a header; one record per batch unless told otherwise."""
    producer = KafkaProducer(linger_ms=0 if one_per_batch else 500, **kafka.client_options())
    try:
        futures = []
        for i, (partition, value) in enumerate(records):
            future = producer.send(topic, value=value, key=f"k{i}".encode(), partition=partition,
                                   headers=[("n", str(i).encode())])
            if one_per_batch:
                future.get(timeout=10)
            futures.append(future)
        producer.flush(10)
        for future in futures:
            future.get(timeout=10)
    finally:
        producer.close()


def read(spark, kafka, topic: str, **options):
    reader = (spark.read.format(SOURCE_NAME).option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_schema_matches_spark_kafka_source_and_arrow_schema_is_exact(spark):
    assert [f.name for f in kafka_schema(True)] == ["key", "value", "topic", "partition", "offset", "timestamp",
                                                    "timestampType", "headers"]
    assert str(to_arrow_schema(kafka_schema(True), timezone="UTC").field("timestamp").type) == "timestamp[us, tz=UTC]"


def test_reads_exactly_the_requested_offset_ranges_with_headers(spark, kafka, new_topic):
    topic = new_topic(partitions=2)
    produce(kafka, topic, [(i % 2, f"v{i}".encode()) for i in range(10)])
    frame = read(spark, kafka, topic, includeHeaders="true",
                 startingOffsets=f'{{"{topic}":{{"0":1,"1":-2}}}}', endingOffsets=f'{{"{topic}":{{"0":4,"1":-1}}}}')
    rows = frame.orderBy("partition", "offset").collect()
    assert [(r.partition, r.offset, r.value) for r in rows] == (
        [(0, 1, b"v2"), (0, 2, b"v4"), (0, 3, b"v6")] + [(1, o, f"v{2 * o + 1}".encode()) for o in range(5)])
    assert rows[0].key == b"k2" and rows[0].topic == topic and rows[0].timestampType == 0
    assert [(h.key, h.value) for h in rows[0].headers] == [("n", b"2")]
    assert "headers" not in read(spark, kafka, topic).columns


class _NotUtf8(str):
    """A header name kafka-python's producer writes as bytes that are not UTF-8, as any producer may."""

    def encode(self, *args, **kwargs) -> bytes:
        return b"\xff\xfebad"


def test_a_record_whose_header_name_is_not_utf8_is_read_without_headers_not_failing_the_job(spark, kafka, new_topic):
    topic = new_topic()
    # Enough records before it that Python has specialised the reading calls (confluent-kafka's error then went
    # unnoticed until a later call).
    produce(kafka, topic, [(0, f"v{i}".encode()) for i in range(100)], one_per_batch=False)
    producer = KafkaProducer(linger_ms=0, **kafka.client_options())
    producer.send(topic, value=b"bad", key=b"kbad", partition=0, headers=[(_NotUtf8("x"), b"v")]).get(timeout=10)
    producer.send(topic, value=b"after", key=b"kafter", partition=0, headers=[("n", b"1")]).get(timeout=10)
    producer.close()

    rows = read(spark, kafka, topic, includeHeaders="true").orderBy("offset").collect()

    assert [r.value for r in rows] == [f"v{i}".encode() for i in range(100)] + [b"bad", b"after"]
    assert rows[100].headers is None and [(h.key, h.value) for h in rows[101].headers] == [("n", b"1")]


def test_min_partitions_splits_ranges_without_losing_or_repeating_records(spark, kafka, new_topic):
    topic = new_topic()
    produce(kafka, topic, [(0, f"v{i}".encode()) for i in range(12)])
    frame = read(spark, kafka, topic, minPartitions="4")
    assert frame.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in frame.collect()) == list(range(12))


def test_the_tail_of_a_multi_record_batch_is_read_even_when_the_broker_under_reports_its_end(spark, kafka, new_topic):
    topic = new_topic()
    produce(kafka, topic, [(0, f"v{i}".encode()) for i in range(30)], one_per_batch=False)
    assert sorted(r.offset for r in read(spark, kafka, topic).collect()) == list(range(30))


def test_a_range_beyond_the_end_raises_rather_than_returning_short(spark, kafka, new_topic):
    topic = new_topic()
    produce(kafka, topic, [(0, b"a"), (0, b"b")])
    frame = read(spark, kafka, topic, endingOffsets=f'{{"{topic}":{{"0":5}}}}', **{"kafkaConsumer.pollTimeoutMs": "1500"})
    with pytest.raises(Exception, match="returned records up to offset 2 only"):
        frame.collect()


@pytest.mark.parametrize("options, message", [
    ({"startingOffsets": "soon"}, "startingOffsets must be"),
    ({"endingOffsets": "earliest"}, "endingOffsets cannot be 'earliest'"),
    ({"subscribe": "no-such-topic"}, "does not exist"),
    ({"kcm.decode": "rows"}, "kcm.decode must be records, points, state"),
    ({"kcm.decode": "points", "kcm.columns": "metric,colour"}, "kcm.columns names 'colour', not a point column"),
    ({"kcm.decode": "state", "kcm.window": "0"}, "kcm.window must be a number of seconds above 0"),
    ({"kcm.decode": "state", "kcm.dimensions": "client_id,hostname"}, "kcm.dimensions names 'hostname'"),
])
def test_bad_options_name_what_to_fix(spark, kafka, new_topic, options, message):
    topic = new_topic()
    with pytest.raises(Exception, match=message):
        read(spark, kafka, topic, **options).collect()


def test_parsed_options_never_show_credentials():
    options = SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t",
                                   "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.username": "alice",
                                   "kafka.sasl.password": "hunter2-not-in-any-log"})
    assert options.client_options["sasl_plain_password"] == "hunter2-not-in-any-log"
    assert options.librdkafka_config["sasl.password"] == "hunter2-not-in-any-log"
    assert "hunter2" not in repr(options) and "hunter2" not in str(options)


def test_brokers_advertising_an_address_this_machine_cannot_reach_are_named_when_planning(misadvertised_broker):
    # The classic set-up mistake: the bootstrap address answers, the brokers it names (advertised.listeners) do not.
    from kcm_rollups.source import KafkaSourceError, plan_ranges

    broker, unreachable = misadvertised_broker
    with pytest.raises(KafkaSourceError) as error:
        plan_ranges(SourceOptions.parse({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": "telemetry",
                                         "kafka.request.timeout.ms": "2000"}))

    assert f"its brokers advertise {unreachable}, which this client could not reach" in str(error.value)
    assert "advertised.listeners" in str(error.value)


def test_offsets_json_partitions_are_read_as_numbers_as_spark_reads_them():
    assert offset_spec("startingOffsets", '{"t": {"007": 5, "1": -2}}', EARLIEST) == {"t": {"7": 5, "1": EARLIEST}}
    assert offset_spec("endingOffsets", '{"t": {"0": -1}}', LATEST) == {"t": {"0": LATEST}}
    assert offset_spec("startingOffsets", " Earliest ", EARLIEST) == EARLIEST


@pytest.mark.parametrize("mode", ["state", "points"])
def test_decoding_modes_read_only_records_in_their_time_range_and_decode_nothing_else(spark, kafka, new_topic, mode):
    """Records outside [kcm.sinceMicros, kcm.untilMicros) are dropped before decoding: not counted at all."""
    topic = new_topic()
    base_ms = 1_767_225_600_000
    producer = KafkaProducer(**kafka.client_options())
    for i in range(10):   # undecodable values: each becomes one error row, counted as a record
        producer.send(topic, value=b"not a payload", timestamp_ms=base_ms + i * 1000).get(timeout=10)
    producer.close()
    rows = read(spark, kafka, topic, includeHeaders="true", **{
        "kcm.decode": mode, "kcm.sinceMicros": str((base_ms + 3000) * 1000),
        "kcm.untilMicros": str((base_ms + 7000) * 1000)})
    if mode == "state":
        assert rows.groupBy().sum("records").first()[0] == 4   # timestamps +3 s .. +6 s
    else:
        assert sorted(r.record_micros // 1000 - base_ms for r in rows.collect()) == [3000, 4000, 5000, 6000]
