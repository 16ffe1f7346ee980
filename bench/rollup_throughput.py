"""Rollup job throughput: data points per second end to end on local[2], beside single-core decode+flatten.

Real librdkafka pushes are collected through the sandbox, then copied (as other instances and apps, spread over an
hour) into a topic of RECORDS records on the embedded broker (read directly, not through the gateway). The same
records are decoded and flattened in this process on one core, and rolled up by Spark end to end, twice (the first
run in a fresh JVM pays its JIT warm-up). Prints the rates, their ratio and where the time goes.

Usage: .venv/bin/python bench/rollup_throughput.py [RECORDS]   (default 100000)
"""

from __future__ import annotations

import sys
import tempfile
import time

import confluent_kafka
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_rollups.decode import flatten
from kcm_rollups.source import records_to_decode_input
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
    batches = [records_to_decode_input(rows[i:i + 10_000]) for i in range(0, len(rows), 10_000)]
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
        with tempfile.TemporaryDirectory(prefix="kcm-bench-") as output:
            options = RollupOptions(kafka=KafkaSettings(bootstrap), topic="bench-telemetry", output=output,
                                    resolutions=parse_resolutions("1m,1h"), min_partitions=4)
            started = time.perf_counter()
            read_records(spark, options).selectExpr("sum(length(value))").collect()
            warm_up_s = time.perf_counter() - started
            started = time.perf_counter()
            read_records(spark, options).selectExpr("sum(length(value))").collect()
            read_s = time.perf_counter() - started
            print(f"first read (JVM and Python worker start-up) {warm_up_s:.2f} s; reading alone {read_s:.2f} s")
            # The first run pays the JVM's JIT warm-up for everything after reading; a scheduled job pays it too.
            for label in ("first run", "second run"):
                result = run(spark, options)
                rate = result.points / result.seconds
                print(f"end to end on local[2], {label}: {result.points} points in {result.seconds:.2f} s = "
                      f"{rate:,.0f} points/s ({result.rows_written} rows, windows {result.windows}); "
                      f"ratio to single-core decode+flatten {rate / single:.2f}")
                print("  where the time goes: " + ", ".join(f"{stage} {seconds:.2f} s"
                                                            for stage, seconds in result.stage_seconds.items()))
        spark.stop()


if __name__ == "__main__":
    main()
