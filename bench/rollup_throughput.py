"""Rollup job throughput: data points per second end to end on local[2], beside single-core decode+flatten.

Real librdkafka pushes are collected through the sandbox, then copied (as other instances and apps, spread over an
hour) into a topic of RECORDS records on the embedded broker (read directly, not through the gateway); the same records are decoded and flattened in this
process on one core, and rolled up by Spark end to end. Prints both rates, their ratio and where the time goes.

Usage: .venv/bin/python bench/rollup_throughput.py [RECORDS]   (default 100000)
"""

from __future__ import annotations

import sys
import tempfile
import time

import confluent_kafka
import pyarrow as pa
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from kcm_common import contract
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_common.names import ATTRIBUTE_HEADERS
from kcm_rollups.decode import decode_points, flatten
from kcm_rollups.job import RollupOptions, read_records, run
from kcm_rollups.session import spark_session
from kcm_rollups.windows import parse_resolutions
from kcm_sandbox.runner import Sandbox, SandboxOptions

HOUR_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PARTITIONS = 2


def real_pushes(sandbox: Sandbox, wanted: int = 20) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """`wanted` telemetry records pushed by a real librdkafka producer through the sandbox."""
    admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
    admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "all",
                                        configs={"metrics": "*", "interval.ms": "100"})], raise_on_unknown=False)
    admin.close()
    consumer = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, fetch_max_wait_ms=100)
    consumer.assign([TopicPartition(sandbox.options.topic, 0)])
    consumer.seek_to_beginning()
    producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "client.id": "bench", "linger.ms": 5})
    pushes: list[tuple[bytes, list[tuple[str, bytes]]]] = []
    deadline = time.monotonic() + 120
    while len(pushes) < wanted and time.monotonic() < deadline:
        producer.produce("traffic", value=b"x")
        producer.poll(0.02)
        for batch in consumer.poll(timeout_ms=50).values():
            pushes += [(r.value, list(r.headers)) for r in batch]
    producer.flush(5)
    consumer.close()
    if len(pushes) < wanted:
        raise SystemExit(f"only {len(pushes)} pushes arrived within 120 s")
    return pushes[:wanted]


def fill_topic(bootstrap: str, topic: str, pushes: list, records: int) -> None:
    """`records` copies of the pushes as 1000 instances of 50 apps, spread evenly over one hour."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20,
                             max_request_size=16 << 20)
    step_ms = 3_600_000 / records
    for i in range(records):
        value, headers = pushes[i % len(pushes)]
        instance = f"00000000-0000-4000-8000-{i % 1000:012d}"
        replaced = {"client_instance_id": instance.encode(), "client_id": f"app-{i % 50}".encode()}
        out = [(k, replaced.get(k, v)) for k, v in headers]
        producer.send(topic, value=value, key=instance.encode(), headers=out, partition=i % PARTITIONS,
                      timestamp_ms=int(HOUR_START_MS + i * step_ms))
    producer.flush(120)
    producer.close()


def single_core_rate(bootstrap: str, topic: str, records: int) -> tuple[int, float]:
    """Points and seconds to decode+flatten every record of `topic` in this process (reading not timed)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100,
                             max_partition_fetch_bytes=16 << 20)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    rows = []
    deadline = time.monotonic() + 600
    while len(rows) < records and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500, max_records=50_000).values():
            rows += batch
    consumer.close()
    names = (contract.CONTENT_TYPE_HEADER, contract.CONTENT_ENCODING_HEADER) + ATTRIBUTE_HEADERS
    columns = {"key": [r.key.decode() for r in rows], "value": [r.value for r in rows],
               "topic": [r.topic for r in rows], "partition": pa.array([r.partition for r in rows], pa.int32()),
               "offset": [r.offset for r in rows], "record_micros": [r.timestamp * 1000 for r in rows]}
    for name in names:
        columns[name.replace("-", "_")] = [dict(r.headers).get(name, b"").decode() or None for r in rows]
    batches = [pa.RecordBatch.from_pydict({k: v[i:i + 10_000] for k, v in columns.items()})
               for i in range(0, len(rows), 10_000)]
    started = time.perf_counter()
    points = sum(flatten(batch).num_rows for batch in batches)
    return points, time.perf_counter() - started


def main() -> None:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with Sandbox(SandboxOptions(listen=("127.0.0.1", 0))) as sandbox:
        pushes = real_pushes(sandbox)
        # The job reads Kafka directly, as in production: the broker behind the sandbox, not its KIP-714 gateway.
        bootstrap = sandbox.upstream_bootstrap
        ensure_topic(KafkaSettings(bootstrap), "bench-telemetry", PARTITIONS)
        started = time.perf_counter()
        fill_topic(bootstrap, "bench-telemetry", pushes, records)
        print(f"topic: {records} records from {len(pushes)} real librdkafka pushes, "
              f"written in {time.perf_counter() - started:.1f} s")
        points, seconds = single_core_rate(bootstrap, "bench-telemetry", records)
        single = points / seconds
        print(f"single core decode+flatten: {points} points in {seconds:.2f} s = {single:,.0f} points/s")

        spark = spark_session("local[2]", "kcm-bench", {"spark.ui.enabled": "false",
                                                         "spark.sql.shuffle.partitions": "4"})
        spark.sparkContext.setLogLevel("ERROR")
        options = RollupOptions(kafka=KafkaSettings(bootstrap), topic="bench-telemetry",
                                output=tempfile.mkdtemp(prefix="kcm-bench-"), resolutions=parse_resolutions("1m,1h"),
                                min_partitions=4)
        started = time.perf_counter()
        read_records(spark, options).selectExpr("sum(length(value))").collect()
        warm_up_s = time.perf_counter() - started
        started = time.perf_counter()
        read_records(spark, options).selectExpr("sum(length(value))").collect()
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        decode_points(read_records(spark, options)).selectExpr("count(metric)").collect()
        decode_s = time.perf_counter() - started
        result = run(spark, options)
        end_to_end = result.points / result.seconds
        print(f"end to end on local[2]: {result.points} points in {result.seconds:.2f} s = {end_to_end:,.0f} points/s "
              f"({result.rows_written} rows, windows {result.windows})")
        print(f"ratio end to end / single-core decode+flatten: {end_to_end / single:.2f}")
        print(f"first read (JVM and Python worker warm-up included) {warm_up_s:.2f} s")
        print(f"where the time goes: read {read_s:.2f} s, read+decode {decode_s:.2f} s "
              f"(decode ~{max(decode_s - read_s, 0):.2f} s), aggregate+write ~{max(result.seconds - decode_s, 0):.2f} s")
        spark.stop()


if __name__ == "__main__":
    main()
