"""The rollup job end to end over real librdkafka and Java telemetry pushed through the sandbox: both Kafka inputs
agree, decode errors are counted, re-runs replace exactly their windows, and the CLI checks its arguments."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import confluent_kafka
import pytest
from pyspark.sql import functions as F
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from kcm_cli.main import main
from opentelemetry.proto.metrics.v1 import metrics_pb2
from payloads import client_metrics
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings
from kcm_rollups.aggregate import rollup
from kcm_rollups.decode import decode_points
from kcm_rollups.job import (RollupOptions, default_master, read_points, read_records, read_state, run,
                             state_of_records, top_rows, write_rollups)
from kcm_rollups.partial import merge_batches
from kcm_rollups.otlp import STATISTICS, OtlpTarget
from kcm_rollups.source import kafka_schema
from kcm_rollups.windows import parse_resolutions
from kcm_sandbox.java_clients import JavaClient
from kcm_sandbox.runner import Sandbox, SandboxOptions
from spark_support import spark  # noqa: F401  (the session-scoped fixture)
from test_rollup_partial import close_values, comparable, ordering_key, reference_state

PRODUCER = "rollup-producer"
JAVA_PRODUCER = "rollup-java"
CORRUPT = [(b"\x00not-gzip", [("content-encoding", b"gzip")]), (b"", [])]


def _records(bootstrap: str, topic: str) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records, idle_since = [], time.monotonic()
        while time.monotonic() - idle_since < 2:
            polled = consumer.poll(timeout_ms=200).get(tp, [])
            records += polled
            if polled:
                idle_since = time.monotonic()
        return records
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory) -> Iterator[Sandbox]:
    """A sandbox whose metrics topic holds a few seconds of pushes from a real librdkafka and a real Java producer,
    then 2 corrupt records."""
    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0)))
    sandbox.start()
    try:
        admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
        admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "all",
                                            configs={"metrics": "*", "interval.ms": "500"})], raise_on_unknown=False)
        admin.close()
        producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "client.id": PRODUCER,
                                             "linger.ms": 5})
        pushes = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, fetch_max_wait_ms=100)
        pushes.assign([TopicPartition(sandbox.options.topic, 0)])
        pushes.seek_to_beginning()
        software: list[str] = []
        with JavaClient(sandbox.bootstrap, client_id=JAVA_PRODUCER, role="producer", topic="inventory"):
            deadline = time.monotonic() + 60
            while min(software.count("apache-kafka-java"), len(software) - software.count("apache-kafka-java")) < 4:
                assert time.monotonic() < deadline, f"too few pushes within 60 s: {software}"
                producer.produce("traffic", value=b"payload")
                producer.poll(0.05)
                for batch in pushes.poll(timeout_ms=50).values():
                    software += [dict(r.headers).get("client_software_name", b"").decode() for r in batch]
        pushes.close()
        producer.flush(5)
        del producer  # pushes a last, terminating record; then the topic is quiet
        writer = KafkaProducer(bootstrap_servers=sandbox.bootstrap)
        for value, headers in CORRUPT:
            writer.send(sandbox.options.topic, value=value, headers=headers).get(timeout=10)
        writer.close()
        yield sandbox
    finally:
        sandbox.stop()


def _last_record_time(sandbox: Sandbox) -> datetime:
    reader = KafkaConsumer(bootstrap_servers=sandbox.bootstrap, group_id=None, consumer_timeout_ms=3000)
    reader.assign([TopicPartition(sandbox.options.topic, 0)])
    reader.seek_to_beginning()
    try:
        return datetime.fromtimestamp(max(record.timestamp for record in reader) / 1000, timezone.utc)
    finally:
        reader.close()


def options_for(sandbox: Sandbox, output, **overrides) -> RollupOptions:
    return RollupOptions(kafka=KafkaSettings(sandbox.bootstrap), topic=sandbox.options.topic, output=str(output),
                         resolutions=parse_resolutions("1m,1h"), **overrides)


def _sorted_rows(frame) -> list[dict]:
    # Spark sums doubles in whatever order partitions arrive: floats compare within a relative 1e-9.
    rows = [{k: close_values(v) for k, v in r.asDict().items()}
            for r in frame.drop("kll_sketch", "instances_sketch").collect()]
    # By column name, not position: the output read back puts its partition column (`resolution`) last, and sorting
    # by position then ordered it apart from the expected rows whenever a minute window started on the hour.
    return sorted(rows, key=lambda r: tuple(str(ordering_key(r[k])) for k in sorted(r)))


def _run_agreeing_with_points(spark, options: RollupOptions) -> tuple[Any, list[dict]]:
    """Run the job (kcm's source, state next to the decoder), and check its rows equal those rolled up from points
    decoded after a frame shaped like Spark's connector gives (mapInArrow): the result and the rows written."""
    result = run(spark, options)
    written = _sorted_rows(spark.read.parquet(options.output).drop("partial", "date", "window_end"))
    expected = rollup(decode_points(read_records(spark, options)), options.resolutions).drop("window_end")
    assert written == _sorted_rows(expected)
    return result, written


def test_real_librdkafka_telemetry_rolls_up_and_corrupt_records_are_counted(spark, telemetry, tmp_path):
    records = _records(telemetry.bootstrap, telemetry.options.topic)
    result = run(spark, options_for(telemetry, tmp_path / "out"))
    assert result.input_records == len(records) >= 8
    assert result.decode_errors == {"decompress-failed": 1, "empty": 1}
    written = spark.read.parquet(str(tmp_path / "out"))
    assert written.count() == result.rows_written > 0
    assert {p.name for p in (tmp_path / "out").iterdir() if p.is_dir()} == {"resolution=1m", "resolution=1h"}
    assert all(d.name.startswith("date=") for d in (tmp_path / "out" / "resolution=1h").iterdir() if d.is_dir())
    rows = [r.asDict() for r in written.filter("client_id = 'rollup-producer'").collect()]
    hour = {r["metric"]: r for r in rows if r["resolution"] == "1h"}
    assert any(name.startswith("org.apache.kafka.producer.") for name in hour)
    assert {r["client_software_name"] for r in hour.values()} == {"confluent-kafka-python"}
    assert {r["instances"] for r in hour.values()} == {1}
    gauges = [r for r in hour.values() if r["type"] == "gauge"]
    assert gauges and all(r["count"] >= 1 and r["min"] <= r["p50"] <= r["max"] for r in gauges)
    sums = [r for r in hour.values() if r["type"] == "sum"]
    assert sums and all(r["increase"] >= 0 and r["rate"] == r["increase"] / 3600 for r in sums)
    java = [r.asDict() for r in written.filter(f"client_id = '{JAVA_PRODUCER}' AND resolution = '1h'").collect()]
    assert {r["client_software_name"] for r in java} == {"apache-kafka-java"} and len(java) > 50
    # Java sends NaN for averages over nothing: counted apart, never in min/max/avg.
    with_nan = [r for r in java if r["nan_count"] > 0]
    assert with_nan and all(r["avg"] is None or r["avg"] == r["avg"] for r in with_nan)
    assert all(r["max"] is None or r["max"] == r["max"] for r in with_nan)
    # Every decoded point is in exactly one 1m row: gauges count samples and NaNs apart, sums count points.
    minutes = [r.asDict() for r in written.filter("resolution = '1m'").collect()]
    assert result.points == sum(r["count"] + r["nan_count"] for r in minutes)


def test_python_source_decoding_in_place_and_a_spark_kafka_source_shaped_frame_give_the_same_rollups(spark, telemetry):
    options = options_for(telemetry, "unused")
    from_source = read_records(spark, options)
    rows = [(r.key, r.value, r.topic, r.partition, r.offset,
             datetime.fromtimestamp(r.timestamp / 1000, timezone.utc), r.timestamp_type, list(r.headers))
            for r in _records(telemetry.bootstrap, telemetry.options.topic)]
    shaped = spark.createDataFrame(rows, kafka_schema(True))
    resolutions = parse_resolutions("1m,1h")
    expected = _sorted_rows(rollup(decode_points(shaped), resolutions))
    assert expected and _sorted_rows(rollup(decode_points(from_source), resolutions)) == expected
    # What the job reads: the same points, decoded inside the Python source's workers.
    assert _sorted_rows(rollup(read_points(spark, options), resolutions)) == expected
    # And what its first pass reads: the finest windows' state, made next to the decoder by kcm's source or after
    # a frame like Spark's connector gives, equal to Spark's state from the points (sketches by their answers).
    reference = comparable(reference_state(decode_points(shaped), options.dimensions))
    assert len(reference) > 50
    # Both also say how far they read in each partition: past the last record read, whether in the range or not.
    furthest = {}
    for row in rows:
        furthest[row[3]] = max(furthest.get(row[3], 0), row[4] + 1)
    for state in (read_state(spark, options), state_of_records(shaped, options)):
        merged = merge_batches(state, options.dimensions)
        assert comparable(merged.filter("read_partition IS NULL").drop("read_partition", "read_end")) == reference
        assert {r["read_partition"]: r["read_end"] for r in merged.filter("read_partition IS NOT NULL").collect()} == (
            furthest)


def test_a_spark_kafka_source_shaped_frame_with_a_time_range_gives_the_state_of_its_records_in_it(spark, telemetry):
    options = options_for(telemetry, "unused")
    records = _records(telemetry.bootstrap, telemetry.options.topic)
    rows = [(r.key, r.value, r.topic, r.partition, r.offset,
             datetime.fromtimestamp(r.timestamp / 1000, timezone.utc), r.timestamp_type, list(r.headers))
            for r in records]
    shaped = spark.createDataFrame(rows, kafka_schema(True))
    times = sorted({r.timestamp * 1000 for r in records})   # records pushed in one millisecond share a time
    since, until = times[len(times) // 3], times[2 * len(times) // 3]
    assert times[0] < since < until <= times[-1]
    inside = decode_points(shaped).filter((F.col("record_micros") >= since) & (F.col("record_micros") < until))
    reference = comparable(reference_state(inside, options.dimensions))
    assert reference
    merged = merge_batches(state_of_records(shaped, options, since, until), options.dimensions)
    assert comparable(merged.filter("read_partition IS NULL").drop("read_partition", "read_end")) == reference
    # Records outside the range still count for how far the read went.
    assert {r["read_partition"]: r["read_end"] for r in merged.filter("read_partition IS NOT NULL").collect()} == {
        partition: max(r.offset for r in records if r.partition == partition) + 1
        for partition in {r.partition for r in records}}


def test_rerunning_a_range_replaces_exactly_its_windows(spark, telemetry, tmp_path):
    output = tmp_path / "out"
    now = datetime.now(timezone.utc)
    ranged = options_for(telemetry, output, start=now - timedelta(minutes=10), end=now + timedelta(minutes=1))
    first = run(spark, ranged, now=now)
    before = _sorted_rows(spark.read.parquet(str(output)))
    second = run(spark, ranged, now=now)
    assert _sorted_rows(spark.read.parquet(str(output))) == before
    assert first.rows_written == second.rows_written == len(before)
    assert all(r["partial"] for r in before if r["resolution"] == "1h")  # the current hour is still open
    # An older window written by another run survives a re-run of a later range.
    old = (spark.read.parquet(str(output)).filter("resolution = '1m'").limit(1)
           .withColumn("window_start", F.lit(datetime(2020, 1, 1, tzinfo=timezone.utc)))
           .withColumn("date", F.lit("2020-01-01")))
    old.write.mode("append").partitionBy("resolution", "date").parquet(str(output))
    # So do the windows from the range's end on, written by the next run (a backfill of one hour must not delete
    # the next hour's rows, which no later run writes again).
    end = datetime.fromtimestamp(ranged.window_range()[1], timezone.utc)
    for resolution, start in (("1h", end), ("1m", end), ("1m", end + timedelta(minutes=1))):
        (spark.read.parquet(str(output)).filter(F.col("resolution") == resolution).limit(1)
         .withColumn("window_start", F.lit(start)).withColumn("date", F.lit(f"{start:%Y-%m-%d}"))
         .write.mode("append").partitionBy("resolution", "date").parquet(str(output)))
    run(spark, ranged, now=now)
    after = spark.read.parquet(str(output))
    assert after.filter("window_start < TIMESTAMP '2021-01-01 00:00:00Z'").count() == 1
    assert after.filter(F.col("window_start") >= F.lit(end)).count() == 3
    assert after.count() == len(before) + 1 + 3


def test_the_demos_rollup_step_prints_the_top_rows_of_the_clients_that_pushed(spark, telemetry, tmp_path):
    """`kcm demo --rollup`'s step after the clients stop, over real telemetry on the metrics topic: where the Parquet
    is, the top rows of the latest minute naming the clients that pushed, and the job's summary."""
    from kcm_demo.run import _rollup

    out = io.StringIO()
    _rollup(telemetry.bootstrap, tmp_path, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"rollup: Parquet in {tmp_path / 'rollups'}", lines
    assert list((tmp_path / "rollups").glob("resolution=1m/date=*/*.parquet")), lines
    summary = [line for line in lines if line.startswith("rollup: input records ")]
    assert summary and "input records 0," not in summary[0], lines
    top = [line for line in lines if line.startswith("resolution=1m ")]
    assert 0 < len(top) <= 10 and all(" metric=org.apache.kafka." in line for line in top), lines
    assert {line.split("client_id=")[1].split()[0] for line in top} <= {PRODUCER, JAVA_PRODUCER}, lines


def test_cli_prints_a_summary_and_turns_source_errors_into_one_line(spark, telemetry, tmp_path, capsys):
    common = ["rollup", "--bootstrap-server", telemetry.bootstrap, "--topic", telemetry.options.topic,
              "--output", str(tmp_path / "out")]
    assert main([*common, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_errors"] == {"decompress-failed": 1, "empty": 1} and summary["rows_written"] > 0
    assert list(summary["stage_seconds"]) == ["read, decode and aggregate", "finish", "write", "summary"]
    # Said before Spark starts, naming the cluster.
    assert main([*common[:3], "--topic", "no-such-topic", *common[5:]]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"kcm rollup: topic 'no-such-topic' does not exist on {telemetry.bootstrap} (PLAINTEXT); check "
                   "--topic and that the brokers' telemetry receiver writes there"), err
    # Planned inside Spark: the source's error comes back wrapped in Spark's, and is still one line.
    offsets = json.dumps({telemetry.options.topic: {"99": 0}})
    assert main([*common, "--starting-offsets", offsets]) == 2
    err = capsys.readouterr().err.strip()
    # In the flag's words, not Spark's option's (startingOffsets).
    assert err.startswith(f"kcm rollup: --starting-offsets names partition 99 of {telemetry.options.topic!r}"), err
    assert len(err.splitlines()) == 1


def test_a_rerun_empties_windows_of_its_range_that_no_longer_have_data(spark, telemetry, tmp_path):
    output = tmp_path / "out"
    now = datetime.now(timezone.utc)
    ranged = options_for(telemetry, output, start=now - timedelta(days=2), end=now + timedelta(minutes=1))
    run(spark, ranged, now=now)
    # A row of a day inside the range that the topic holds nothing for any more (say, an earlier run's).
    day = (now - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    stale = (spark.read.parquet(str(output)).filter("resolution = '1h'").limit(1)
             .withColumn("window_start", F.lit(day)).withColumn("date", F.lit(day.strftime("%Y-%m-%d"))))
    stale.write.mode("append").partitionBy("resolution", "date").parquet(str(output))
    stale_dir = output / "resolution=1h" / f"date={day:%Y-%m-%d}"
    assert stale_dir.is_dir()
    result = run(spark, ranged, now=now)
    assert not stale_dir.exists()
    assert spark.read.parquet(str(output)).count() == result.rows_written


def test_an_empty_range_rolls_up_nothing_and_a_partition_that_does_not_exist_is_named(spark, telemetry, tmp_path,
                                                                                      capsys):
    common = ["rollup", "--bootstrap-server", telemetry.bootstrap, "--topic", telemetry.options.topic, "--json"]
    past_the_end = json.dumps({telemetry.options.topic: {"0": 10**9}})

    # Nothing planned (as when a quiet hour has no records): PySpark still reads one made-up partition.
    assert main([*common, "--output", str(tmp_path / "out"), "--starting-offsets", past_the_end]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["input_records"], summary["rows_written"]) == (0, 0)

    assert main([*common, "--output", str(tmp_path / "out"),
                 "--starting-offsets", json.dumps({telemetry.options.topic: {"7": 0}})]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--starting-offsets names partition 7 of '{telemetry.options.topic}', which has partitions 0" in err, err
    assert len(err.splitlines()) == 1

    (tmp_path / "a-file").write_text("x")
    unrelated = tmp_path / "unrelated"
    (unrelated / "sub").mkdir(parents=True)
    (unrelated / "notes.txt").write_text("not parquet")
    (unrelated / "sub" / "data.csv").write_text("a,b\n1,2\n")
    for output, problem in ((tmp_path / "a-file", "is a file; give a directory"),
                            (unrelated, "holds files that are not kcm rollups")):
        assert main([*common, "--output", str(output), "--starting-offsets", past_the_end]) == 2
        err = capsys.readouterr().err.strip()
        assert problem in err and len(err.splitlines()) == 1, err
    assert (unrelated / "notes.txt").read_text() == "not parquet"


def test_an_unwritable_output_is_one_line(spark, telemetry, capsys):
    assert main(["rollup", "--bootstrap-server", telemetry.bootstrap, "--topic", telemetry.options.topic,
                 "--output", "/proc/kcm-rollups"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write the rollups to --output /proc/kcm-rollups" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("output, problem", [("foo://bucket/rollups", 'No FileSystem for scheme "foo"'),
                                             ("s3a://telemetry/rollups", "S3AFileSystem not found")])
def test_an_output_spark_cannot_open_is_one_line_before_anything_is_read(spark, output, problem):
    # Kafka is unreachable: the run must stop at the output, before it would try to read.
    options = RollupOptions(kafka=KafkaSettings("127.0.0.1:1"), topic="t", output=output,
                            resolutions=parse_resolutions("1m,1h"))
    with pytest.raises(UserError, match=f"^cannot write the rollups to --output {output}: .*{problem}") as refused:
        run(spark, options)
    assert len(str(refused.value).splitlines()) == 1


def test_an_output_holding_other_files_is_refused_before_anything_is_read(spark, tmp_path):
    # Kafka is unreachable: a run that got as far as reading would fail there, not at the output.
    output = tmp_path / "reports"
    (output / "2026").mkdir(parents=True)
    (output / "2026" / "q1.csv").write_text("a,b\n")
    (output / "resolution=1m").mkdir()
    options = RollupOptions(kafka=KafkaSettings("127.0.0.1:1"), topic="t", output=str(output),
                            resolutions=parse_resolutions("1m,1h"))
    with pytest.raises(UserError, match=rf"^--output {output} holds files that are not kcm rollups \(2026\); give"):
        run(spark, options)
    assert (output / "2026" / "q1.csv").read_text() == "a,b\n"


def test_runs_of_other_resolutions_over_one_range_keep_each_others_rows_and_a_day_stays_a_label(spark, telemetry,
                                                                                                  tmp_path):
    output = tmp_path / "out"
    now = datetime.now(timezone.utc)
    ranged = {"start": now - timedelta(minutes=10), "end": now + timedelta(minutes=1)}

    def counts() -> dict[str, int]:
        frame = spark.read.option("basePath", str(output)).parquet(str(output))
        return {r["resolution"]: r["count"] for r in frame.groupBy(F.col("resolution").cast("string").alias(
            "resolution")).count().collect()}

    run(spark, options_for(telemetry, output, **ranged), now=now)
    minutes_and_hours = counts()
    daily = RollupOptions(kafka=KafkaSettings(telemetry.bootstrap), topic=telemetry.options.topic, output=str(output),
                          resolutions=parse_resolutions("1d"), **ranged)
    days = run(spark, daily, now=now).rows_written
    assert counts() == {**minutes_and_hours, "1d": days}  # the day's run keeps the minutes and hours of its range
    run(spark, daily, now=now)  # read back, `resolution=1d` must not turn into the number 1.0
    run(spark, options_for(telemetry, output, **ranged), now=now)

    assert sorted(path.name for path in output.iterdir() if path.is_dir()) == [
        "resolution=1d", "resolution=1h", "resolution=1m"]
    assert counts() == {**minutes_and_hours, "1d": days} and days > 0


@pytest.mark.parametrize("delay", [0.2, 1.0])   # while the SparkContext starts (py4j calls under way), and later
def test_ctrl_c_stops_a_run_with_exit_130_and_no_tracebacks(telemetry, tmp_path, delay):
    # A log4j2 configuration of the user's own (kcm's would keep Spark quiet), showing every warning and error, and
    # when the SparkContext starts.
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "log4j2.properties").write_text(
        "rootLogger.level = warn\nrootLogger.appenderRef.stderr.ref = console\nappender.console.type = Console\n"
        "appender.console.name = console\nappender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\nappender.console.layout.pattern = %p %c{1}: %m%n%ex\n"
        "logger.context.name = org.apache.spark.SparkContext\nlogger.context.level = info\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "kcm_cli.main", "rollup", "--bootstrap-server", telemetry.bootstrap,
         "--topic", telemetry.options.topic, "--output", str(tmp_path / "out")],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_CONF_DIR": str(conf)})
    try:
        lines = []
        while not any("Running Spark version" in line for line in lines):  # the JVM is up: py4j calls follow
            line = process.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait(10)
    err = "".join(lines) + rest
    assert process.returncode == 130, err
    assert "Traceback" not in err, err


def _cumulative_push(instance: str, value: int, start_s: int) -> bytes:
    data = client_metrics(instance)  # a gauge and a delta sum, as librdkafka pushes
    total = data.resource_metrics[0].scope_metrics[0].metrics.add(name="written.total")
    total.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    total.sum.is_monotonic = True
    total.sum.data_points.add(start_time_unix_nano=start_s * 10**9, time_unix_nano=(start_s + 60) * 10**9,
                              as_int=value)
    return data.SerializeToString()


def test_cumulative_counters_get_their_own_pass_and_roll_up_as_rollup_computes_them(spark, kafka, new_topic, tmp_path):
    topic = new_topic()
    producer = KafkaProducer(**kafka.client_options())
    # Per instance: 10, 25, then a reset (a new start) to 4, and 9; one record per batch, so end offsets are exact.
    for i, (value, start) in enumerate([(10, 0), (25, 0), (4, 100), (9, 100)] * 2):
        instance = f"i{i // 4}"
        headers = [("client_instance_id", instance.encode()), ("client_id", b"app")]
        producer.send(topic, value=_cumulative_push(instance, value, start), key=instance.encode(),
                      headers=headers).get(timeout=10)
    producer.close()
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"))
    result, written = _run_agreeing_with_points(spark, options)
    assert "cumulative points" in result.stage_seconds and result.points == 8 * 3
    hour = [r for r in written if r["metric"] == "written.total" and r["resolution"] == "1h"]
    # Each instance: +15, then a reset counts its new value 4, then +5 (its first point has no predecessor).
    assert [r["increase"] for r in hour] == [2 * (15 + 4 + 5)]


@pytest.mark.parametrize("ranged", [False, True], ids=["offsets", "time-range"])
def test_records_appended_while_a_run_reads_enter_no_pass_of_it(spark, kafka, new_topic, tmp_path, monkeypatch,
                                                                 ranged):
    """The cumulative pass reads the topic again: records appended since the first pass read it are not rolled up
    through it alone, where the first pass's rows and summary never saw them."""
    import kcm_rollups.job as job

    topic = new_topic(partitions=2)
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())

    def send(instance: str, value: int, partition: int, at_s: int) -> None:
        producer.send(topic, value=_cumulative_push(instance, value, 0), key=instance.encode(), partition=partition,
                      headers=[("client_instance_id", instance.encode()), ("client_id", b"app")],
                      timestamp_ms=int(minute.timestamp() + at_s) * 1000).get(timeout=10)  # one record per batch

    send("i0", 10, 0, 0)
    send("i0", 25, 0, 10)
    read_first = job.first_pass

    def first_pass_then_appended(*args):
        passed = read_first(*args)
        send("i0", 1000, 0, 20)   # the stream the first pass read, later: +975 if it entered
        send("i1", 5, 1, 20)      # a partition of which the first pass read nothing: +45 if they entered
        send("i1", 50, 1, 30)
        return passed

    monkeypatch.setattr(job, "first_pass", first_pass_then_appended)
    hour = minute.replace(minute=0)
    # The time range also splits the partition read into several tasks (each notes how far it read).
    span = {"start": hour, "end": hour + timedelta(hours=1), "min_partitions": 3} if ranged else {}
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"), **span)
    try:
        result = run(spark, options)
    finally:
        producer.close()
    assert "cumulative points" in result.stage_seconds and (result.input_records, result.points) == (2, 2 * 3)
    written = spark.read.parquet(options.output).filter("resolution = '1h' AND metric = 'written.total'").collect()
    assert [(r["increase"], r["instances"]) for r in written] == [(15.0, 1)]


def _histogram_push(instance: str, bucket_counts: list[int], temporality: int, start_s: int = 0) -> bytes:
    data = client_metrics(instance)  # a gauge and a delta sum, as librdkafka pushes
    latency = data.resource_metrics[0].scope_metrics[0].metrics.add(name="request.latency")
    latency.histogram.aggregation_temporality = temporality
    latency.histogram.data_points.add(start_time_unix_nano=start_s * 10**9, time_unix_nano=(start_s + 60) * 10**9,
                                      count=sum(bucket_counts), sum=float(sum(bucket_counts)),
                                      explicit_bounds=[1.0, 5.0], bucket_counts=bucket_counts)
    return data.SerializeToString()


@pytest.mark.parametrize("temporality", [metrics_pb2.AGGREGATION_TEMPORALITY_DELTA,
                                         metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE])
def test_histograms_get_their_quantiles_through_the_job(spark, kafka, new_topic, tmp_path, temporality):
    topic = new_topic()
    producer = KafkaProducer(**kafka.client_options())
    for buckets in ([1, 2, 1], [2, 5, 1]):   # cumulative: the second adds [1, 3, 0]
        producer.send(topic, value=_histogram_push("i1", buckets, temporality), key=b"i1",
                      headers=[("client_instance_id", b"i1"), ("client_id", b"app")]).get(timeout=10)
    producer.close()
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"))
    _, written = _run_agreeing_with_points(spark, options)
    latency = [r for r in written if r["metric"] == "request.latency"]
    assert {r["resolution"] for r in latency} == {"1m", "1h"}
    assert all(r["p50"] is not None and 1.0 <= r["p50"] <= 5.0 for r in latency), latency


def test_finishing_rows_without_histograms_plans_no_python_udf(spark):
    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS, rollup_state
    from kcm_rollups.partial import state_schema

    state = merge_batches(spark.createDataFrame([], state_schema(DEFAULT_DIMENSIONS)), DEFAULT_DIMENSIONS).drop(
        "error", "needs_previous", "records", "points")
    plans = {flag: rollup_state(state, parse_resolutions("1m,1h"), DEFAULT_DIMENSIONS, flag)._jdf.queryExecution()
             .executedPlan().toString() for flag in (True, False)}
    assert "BatchEvalPython" in plans[True] and "BatchEvalPython" not in plans[False]


def _plain_otlp(*counters: tuple[str, int]) -> bytes:
    """What the OpenTelemetry Collector's Kafka exporter writes: plain OTLP with one ResourceMetrics per service
    (several in one record) and, here, one cumulative counter each."""
    data = metrics_pb2.MetricsData()
    for service, value in counters:
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.add(key="service.name").value.string_value = service
        total = resource_metrics.scope_metrics.add().metrics.add(name="requests.total")
        total.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        total.sum.is_monotonic = True
        total.sum.data_points.add(start_time_unix_nano=10**9, time_unix_nano=2 * 10**9, as_int=value)
    return data.SerializeToString()


def test_other_writers_counters_are_a_stream_per_resource_through_either_kafka_input(spark, kafka, new_topic, tmp_path,
                                                                                   caplog):
    topic = new_topic()
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for i, counters in enumerate(([("a", 100)], [("b", 5)], [("a", 110), ("b", 6)], [("a", 120)], [("b", 7)])):
        producer.send(topic, value=_plain_otlp(*counters),  # no headers, no key
                      timestamp_ms=int(minute.timestamp() + i) * 1000).get(timeout=10)
    producer.close()
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"))
    _, written = _run_agreeing_with_points(spark, options)
    # a: +10 +10, b: +1 +1 (each first point has no predecessor); each service is an instance.
    assert [(r["increase"], r["instances"]) for r in written if r["resolution"] == "1h"] == [(22.0, 2)]
    assert not [r for r in caplog.records if r.name == "kcm.rollup" and r.levelno >= logging.WARNING]


def test_windows_an_offset_range_cuts_are_marked_partial_and_the_whole_topics_are_not(spark, kafka, new_topic,
                                                                                     tmp_path):
    topic = new_topic()
    # Ten past an hour that ended: the three minutes below lie in one hour whatever the time the test runs.
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for i, at_s in enumerate([0, 10, 20, 70, 80, 130]):   # three minutes of one hour, two records each
        producer.send(topic, value=client_metrics(f"i{i}").SerializeToString(), key=f"i{i}".encode(),
                      timestamp_ms=int(minute.timestamp() + at_s) * 1000).get(timeout=10)  # one record per batch
    producer.close()

    def partial(**offsets) -> dict:
        output = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        run(spark, RollupOptions(kafka=kafka, topic=topic, output=str(output), resolutions=parse_resolutions("1m,1h"),
                                 **offsets))
        return {(r["resolution"], int((r["window_start"] - minute.replace(tzinfo=None)).total_seconds() // 60)):
                r["partial"] for r in spark.read.parquet(str(output)).select("resolution", "window_start",
                                                                               "partial").distinct().collect()}

    hour = int(minute.minute)   # the 1h window's start, in minutes before the first minute
    assert partial() == {("1m", 0): False, ("1m", 1): False, ("1m", 2): False, ("1h", -hour): False}
    cut_start = partial(starting_offsets=json.dumps({topic: {"0": 1}}))      # the first minute loses a record
    assert cut_start == {("1m", 0): True, ("1m", 1): False, ("1m", 2): False, ("1h", -hour): True}
    cut_end = partial(ending_offsets=json.dumps({topic: {"0": 4}}))          # ends inside the second minute
    assert cut_end == {("1m", 0): False, ("1m", 1): True, ("1h", -hour): True}


def test_a_time_range_takes_predecessors_from_its_lookback_rolls_up_only_its_own_windows_and_warns_of_streams_without(
        spark, kafka, new_topic, tmp_path, caplog):
    topic = new_topic()
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    t0 = int(hour.timestamp())
    # (instance, seconds from the range's start, counter value, its start time from t0); the range is [t0, t0 + 1h),
    # the lookback 5 minutes. Counters started at 0 (long ago) unless said otherwise.
    points = [("i0", -400, 1, None),     # before the lookback: never read (else i0's first increase would differ)
              ("i0", -120, 10, None),    # in the lookback: the predecessor of the first point in range
              ("i0", 30, 25, None), ("i0", 90, 30, None),
              ("i0", 3630, 100, None),   # after the range: not rolled up
              ("i1", -400, 50, None),    # i1's only earlier point is outside the lookback: the run warns of it
              ("i1", 30, 70, None), ("i1", 100, 75, None),
              ("i2", 30, 7, 10), ("i2", 90, 9, 10),  # started inside the range: its first value counts
              ("i3", -100, 3, -120),     # started inside the lookback: its first value serves only as predecessor
              ("i3", 40, 8, -120)]
    producer = KafkaProducer(**kafka.client_options())
    for instance, offset_s, value, started in points:
        headers = [("client_instance_id", instance.encode()), ("client_id", b"app")]
        pushed = _cumulative_push(instance, value, 0 if started is None else t0 + started)
        producer.send(topic, value=pushed, key=instance.encode(), headers=headers,
                      timestamp_ms=(t0 + offset_s) * 1000).get(timeout=10)  # one record per batch: exact end offsets
    producer.close()
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"), start=hour, end=hour + timedelta(hours=1))
    with caplog.at_level(logging.WARNING, logger="kcm.rollup"):
        result = run(spark, options)
    assert "cumulative points" in result.stage_seconds
    rows = _sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    start = hour.replace(tzinfo=None)  # Spark reads timestamps back as naive UTC datetimes
    assert {r["window_start"] for r in rows} <= {start + timedelta(minutes=m) for m in range(60)}
    written = [r for r in rows if r["metric"] == "written.total"]
    increases = {(r["resolution"], (r["window_start"] - start).total_seconds()): r["increase"] for r in written}
    # i0: 25 - 10 and 30 - 25; i1: its first point in range has no predecessor within the lookback, then 75 - 70;
    # i2: 7 from its start, then 9 - 7; i3: 8 - 3.
    assert increases == {("1m", 0): 15 + 7 + 5, ("1m", 60): 5 + 5 + 2, ("1h", 0): 39}
    warned = [r.getMessage() for r in caplog.records if r.name == "kcm.rollup" and r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert warned[0].startswith("1 cumulative stream(s) found no point in the --lookback of 5m before their first in "
                                "the range"), warned


def test_the_rows_written_are_also_exported_as_otlp_gauges_once_their_windows_ended(spark, telemetry, tmp_path,
                                                                                    collector):
    # Run as if an hour later: every window has ended. The run at real time leaves the open windows out.
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    result = run(spark, options_for(telemetry, tmp_path / "out", otlp=OtlpTarget(collector.endpoint)), now=later)
    written = [r.asDict() for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert not any(r["partial"] for r in written)
    statistics = sum(1 for r in written for name in STATISTICS if r[name] is not None and r[name] == r[name])
    assert result.exported == (collector.endpoint, statistics, 0) and statistics > len(written)
    received = [m for e in collector.exports for rm in e.request.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics]
    assert sum(len(m.gauge.data_points) for m in received) == statistics
    assert f"exported {statistics} OTLP data points to {collector.endpoint}" in result.summary_lines()
    # Just after the last record, not the real time: an hour starting since the telemetry was pushed would have
    # ended every window. A run over offsets (no time range) exports every window that has ended, the minutes of an
    # hour still open too (the test below has time ranges).
    moment = _last_record_time(telemetry) + timedelta(milliseconds=1)
    now = run(spark, options_for(telemetry, tmp_path / "now", otlp=OtlpTarget(collector.endpoint)), now=moment)
    rows = [r.asDict() for r in spark.read.parquet(str(tmp_path / "now")).collect()]
    ended = sum(1 for r in rows if not r["partial"]
                for name in STATISTICS if r[name] is not None and r[name] == r[name])
    assert any(r["partial"] for r in rows) and now.exported == (collector.endpoint, ended, 0)


def test_the_minutes_of_an_hour_still_open_are_exported_by_the_run_that_finds_it_ended_only(spark, kafka, new_topic,
                                                                                           tmp_path, collector):
    """A scheduled run (hourly, over the last 70 minutes) exported the minutes of the hour it ran in that had ended,
    and the next run the same minutes again, with the records that came late: a backend keeps the first sample of a
    timestamp and refuses the second. Only the run that finds their hour ended exports them now."""
    from kcm_rollups.otlp import RESOLUTION_ATTRIBUTE

    topic = new_topic()
    hour = (datetime.now(timezone.utc) - timedelta(hours=5)).replace(minute=0, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for at in (hour + timedelta(minutes=10), hour + timedelta(hours=1, minutes=10)):   # a minute in each of two hours
        producer.send(topic, value=client_metrics("app").SerializeToString(), key=b"i",
                      timestamp_ms=int(at.timestamp() * 1000)).get(timeout=10)
    producer.close()

    def exported(now: datetime, by_offsets: bool = False) -> set[tuple[str, datetime]]:
        before = len(collector.exports)
        span = {} if by_offsets else {"start": hour, "end": now}
        run(spark, RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                                 resolutions=parse_resolutions("1m,1h"), otlp=OtlpTarget(collector.endpoint), **span),
            now=now)
        sent = set()
        for export in collector.exports[before:]:
            for rm in export.request.resource_metrics:
                for metric in (m for sm in rm.scope_metrics for m in sm.metrics):
                    for point in metric.gauge.data_points:
                        label = next(a.value.string_value for a in point.attributes if a.key == RESOLUTION_ATTRIBUTE)
                        sent.add((label, datetime.fromtimestamp(point.start_time_unix_nano / 1e9, timezone.utc)))
        return sent

    # Half past the second hour: its minute ten has ended, but its hour has not.
    assert exported(hour + timedelta(hours=1, minutes=30)) == {("1m", hour + timedelta(minutes=10)), ("1h", hour)}
    assert exported(hour + timedelta(hours=2, minutes=10)) == {
        ("1m", hour + timedelta(minutes=10)), ("1h", hour),
        ("1m", hour + timedelta(hours=1, minutes=10)), ("1h", hour + timedelta(hours=1))}
    # Runs chained by offsets never read those records again: they export every window that has ended.
    assert exported(hour + timedelta(hours=1, minutes=30), by_offsets=True) == {
        ("1m", hour + timedelta(minutes=10)), ("1h", hour), ("1m", hour + timedelta(hours=1, minutes=10))}


def _rollup_rows(spark, points: list[dict], dimensions: tuple[str, ...]) -> Any:
    """Rows as `run` writes them, of decoded points (tests/test_rollup_math.py's `point`)."""
    from kcm_rollups.decode import POINTS_SCHEMA

    rows = rollup(spark.createDataFrame(points, POINTS_SCHEMA), parse_resolutions("1m,1h"), dimensions)
    return rows.withColumn("partial", F.lit(False)).withColumn(
        "date", F.date_format("window_start", "yyyy-MM-dd")).localCheckpoint()


def test_a_run_rewrites_the_rows_it_keeps_with_the_dimension_columns_earlier_runs_gave_them(spark, tmp_path):
    """Spark reads Parquet with one file's columns: rows an earlier run wrote with another --group-by (principal
    here) lost that column when a later run rewrote their partition, alice's and bob's rows becoming alike."""
    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS
    from test_rollup_math import T0, point

    output, day, both = str(tmp_path / "out"), 86400, ("1m", "1h")
    write_rollups(spark, _rollup_rows(spark, [point("g", 10 - day, value=1.0)], DEFAULT_DIMENSIONS), output,
                  (T0 - day, T0 - day + 3600), both)
    write_rollups(spark, _rollup_rows(spark, [point("g", 10, value=1.0, principal="User:alice"),
                                              point("g", 20, value=5.0, principal="User:bob")],
                                      DEFAULT_DIMENSIONS + ("principal",)), output, (T0, T0 + 3600), both)
    write_rollups(spark, _rollup_rows(spark, [point("g", 3610, value=2.0)], DEFAULT_DIMENSIONS), output,
                  (T0 + 3600, T0 + 7200), both)
    rows = spark.read.option("mergeSchema", "true").parquet(output).filter(
        F.col("window_start") == datetime.fromtimestamp(T0, timezone.utc))
    assert sorted((r["resolution"], r["principal"], r["max"]) for r in rows.collect()) == [
        ("1h", "User:alice", 1.0), ("1h", "User:bob", 5.0), ("1m", "User:alice", 1.0), ("1m", "User:bob", 5.0)]


def test_a_run_reads_only_the_partitions_it_writes_or_whose_windows_it_replaces(spark, tmp_path):
    """Every file footer under the output was read on every run (to merge their columns), so a scheduled run cost
    more with every day the output held. Only the partitions a run writes, or whose windows its range replaces, are
    read now: another day's file that is not even Parquet is neither read nor touched, for a time range as for
    offsets, while the run's own partitions are still replaced."""
    import pyarrow.parquet

    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS
    from test_rollup_math import T0, point

    output, both = str(tmp_path / "out"), ("1m", "1h")
    other_day = tmp_path / "out" / "resolution=1m" / "date=2020-01-01"
    other_day.mkdir(parents=True)
    (other_day / "part-0.parquet").write_bytes(b"not parquet")
    date = datetime.fromtimestamp(T0, timezone.utc).date().isoformat()
    for value, span in ((1.0, (T0, T0 + 3600)), (5.0, (T0, T0 + 3600)), (7.0, None)):
        write_rollups(spark, _rollup_rows(spark, [point("g", 10, value=value)], DEFAULT_DIMENSIONS), output, span,
                      both)
        for resolution in both:
            written = pyarrow.parquet.read_table(f"{output}/resolution={resolution}/date={date}")
            assert written.column("max").to_pylist() == [value], (resolution, span)
    assert (other_day / "part-0.parquet").read_bytes() == b"not parquet"
    # A range's own partitions: in a UTC session (kcm's) the UTC dates of its ends and between; in any other time
    # zone (a caller's session), a day either side too.
    from kcm_rollups.job import _dates_around

    assert _dates_around((T0, T0 + 3600), True) == ["2023-11-14"]
    assert _dates_around((T0, T0 + 7200), True) == ["2023-11-14"]   # ends at midnight
    assert _dates_around((T0, T0 + 7201), True) == ["2023-11-14", "2023-11-15"]
    assert _dates_around((T0, T0 + 3600), False) == ["2023-11-13", "2023-11-14", "2023-11-15"]
    assert _dates_around((T0, T0 + 7201), False)[-1] == "2023-11-16" and _dates_around((T0, T0), False)[0] == "2023-11-13"
    assert len(_dates_around((T0, T0 + 30 * 86400), False)) == 33


def test_a_range_in_a_session_of_another_time_zone_replaces_the_windows_written_under_its_local_dates(spark,
                                                                                                       tmp_path):
    """A caller's session in another time zone (the Python API) writes a window under its local date, which may be
    the day after the range's UTC date: such a run reads the days either side too, so a re-run of the range with no
    records still removes the window (kcm's UTC session reads the range's own days only)."""
    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS
    from test_rollup_math import T0, point

    output, span, both = tmp_path / "out", (T0, T0 + 3600), ("1m", "1h")   # 22:00-23:00 UTC: 07:00 the next day
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        write_rollups(spark, _rollup_rows(spark, [point("g", 10, value=1.0)], DEFAULT_DIMENSIONS), str(output), span,
                      both)
        assert sorted(path.name for path in (output / "resolution=1m").iterdir()) == ["date=2023-11-15"]
        write_rollups(spark, _rollup_rows(spark, [], DEFAULT_DIMENSIONS), str(output), span, both)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert not (output / "resolution=1m" / "date=2023-11-15").exists()


def test_an_empty_directory_beside_the_rollups_is_left_alone_and_an_output_it_cannot_list_is_one_line(
        spark, tmp_path, monkeypatch):
    """An output at the root of a volume of its own has `lost+found` beside the rollups: empty, it holds nothing and
    the runs go on (Spark ignored it too); holding a file, it is refused. A listing Hadoop refuses (another account's
    directory) is one line, not a traceback."""
    import pyarrow.parquet

    from kcm_rollups import job
    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS
    from test_rollup_math import T0, point

    volume, span = tmp_path / "volume", (T0, T0 + 3600)
    (volume / "lost+found").mkdir(parents=True)
    date = datetime.fromtimestamp(T0, timezone.utc).date().isoformat()
    for value in (1.0, 5.0):
        write_rollups(spark, _rollup_rows(spark, [point("g", 10, value=value)], DEFAULT_DIMENSIONS), str(volume),
                      span, ("1m", "1h"))
        assert pyarrow.parquet.read_table(f"{volume}/resolution=1m/date={date}").column("max").to_pylist() == [value]
    (volume / "lost+found" / "#1234").write_text("x")
    with pytest.raises(UserError, match=r"holds files that are not kcm rollups \(lost\+found\)"):
        write_rollups(spark, _rollup_rows(spark, [point("g", 10, value=7.0)], DEFAULT_DIMENSIONS), str(volume),
                      span, ("1m", "1h"))
    (volume / "lost+found" / "#1234").unlink()

    def refused(self):
        return spark.sparkContext._jvm.java.lang.Class.forName("a.listing.Refused")   # a real Py4JJavaError

    monkeypatch.setattr(job._HadoopPath, "children", refused)
    with pytest.raises(UserError) as failed:
        write_rollups(spark, _rollup_rows(spark, [point("g", 10, value=7.0)], DEFAULT_DIMENSIONS), str(volume),
                      span, ("1m", "1h"))
    message = str(failed.value)
    assert message.startswith(f"cannot read --output {volume}: ") and "a.listing.Refused" in message, message
    assert "\n" not in message


def test_an_output_named_with_glob_characters_is_found_again_by_the_next_run(spark, tmp_path):
    """The existing rows were read back through Spark, which takes `[a]`, `{a}` and `?` as a pattern: the second run
    found nothing there (or a neighbour) and refused the output an earlier run wrote as "not kcm rollups". One name
    holds all three: a bracket or brace left unescaped keeps it from matching itself, a `?` matches the neighbour."""
    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS
    from test_rollup_math import T0, point

    import pyarrow.parquet

    # Another output beside it, which the name as a pattern with `?` left unescaped matches too (with a bracket or
    # brace left unescaped, the pattern no longer matches the name itself).
    write_rollups(spark, _rollup_rows(spark, [point("foreign", 20, value=9.0)], DEFAULT_DIMENSIONS),
                  str(tmp_path / "out-[a]{a}b"), (T0, T0 + 3600), ("1m", "1h"))
    output = str(tmp_path / "out-[a]{a}?")
    for hour in (0, 1):
        write_rollups(spark, _rollup_rows(spark, [point("g", 3600 * hour + 10, value=1.0)], DEFAULT_DIMENSIONS),
                      output, (T0 + 3600 * hour, T0 + 3600 * (hour + 1)), ("1m", "1h"))
    assert pyarrow.parquet.read_table(output).column("metric").to_pylist() == ["g"] * 4   # two windows of each
    from kcm_rollups.job import _literal

    assert _literal("hdfs://[::1]:8020/out-[a]") == "hdfs://[::1]:8020/out-\\[a\\]"   # never the authority


def test_the_top_rows_say_whether_their_window_is_still_open(spark):
    from kcm_rollups.aggregate import DEFAULT_DIMENSIONS
    from test_rollup_math import point

    rows = _rollup_rows(spark, [point("g", 10, value=1.0)], DEFAULT_DIMENSIONS)
    assert [row["partial"] for row in top_rows(rows.withColumn("partial", F.lit(True)), "1h", 5)] == [True]


@pytest.mark.parametrize("arguments, message", [
    (["--last", "1h", "--from", "2026-01-01T00:00:00Z"], "--last cannot be combined"),
    (["--to", "2026-01-01T00:00:00Z"], "--to needs --from"),
    (["--from", "yesterday"], "neither ISO 8601"),
    (["--last", "10 minutes"], "not a duration"),
    (["--resolution", "1m,90s"], "not a whole multiple"),
    (["--group-by", "hostname"], "cannot group by 'hostname'"),
    (["--from", "2026-01-02", "--to", "2026-01-01"], "is not before"),
    (["--otlp-endpoint", "http://otel:4317"], "is not HOST:PORT"),
    (["--otlp-ca-file", "/etc/hostname"], "need --otlp-endpoint"),
    (["--otlp-endpoint", "otel:4317", "--otlp-header-file", "authorization"], "is not NAME=FILE"),
    (["--otlp-endpoint", "otel:4317", "--otlp-key-file", "/etc/hostname"], "go together"),
    (["--otlp-endpoint", "otel:4317", "--otlp-ca-file", "/nonexistent/ca.pem"], "ca.pem: No such file or directory"),
    (["--otlp-endpoint", "otel:4317", "--otlp-ca-file", "/etc/hostname"], "not a PEM file holding a certificate"),
    (["--starting-offsets", "soon"], '--starting-offsets must be "earliest" or JSON'),
    (["--starting-offsets", "latest"], "--starting-offsets cannot be 'latest' in a batch read"),
    (["--starting-offsets", '{"kafka-client-metrics":{"0":-1}}'], "--starting-offsets cannot hold -1 (latest)"),
    (["--ending-offsets", '{"kafka-client-metrics":{"0":-2}}'], "--ending-offsets cannot hold -2 (earliest)"),
    (["--starting-offsets", '{"kafka-client-metrics":{"\u00b2":5}}'], "--starting-offsets must be"),
    (["--ending-offsets", '{"kafka-client-metrics":{"0":99999999999999999999}}'], "--ending-offsets must be"),
    (["--ending-offsets", "earliest"], "--ending-offsets cannot be 'earliest' in a batch read"),
    (["--ending-offsets", '{"kafka-client-metrics":{"zero":5}}'], '--ending-offsets must be "latest" or JSON'),
    (["--starting-offsets", '{"kafka-client-metrics":{"0":-3}}'], "--starting-offsets must be"),
    (["--starting-offsets", '{"other":{"0":1}}'], "--starting-offsets names the topics other, but the job reads"),
    (["--starting-offsets", '{"kafka-client-metrics":{"0":10}}', "--ending-offsets",
      '{"kafka-client-metrics":{"0":5}}'], "starts partition 0 at 10, after where --ending-offsets ends it (5)"),
    (["--last", "999999d"], "is longer than a century (36500d)"),
    (["--last", "21000d"], "--last 21000d reaches back before 1970-01-01"),
    (["--master", "bogus"], "--master 'bogus' is not a Spark master URL"),
    (["--master", "local[0]"], "--master 'local[0]' is not a Spark master URL"),
    # A range replaces whole windows: offsets would cut some out (and the rewrite would drop their records).
    (["--from", "2026-01-01", "--to", "2026-01-02", "--starting-offsets", '{"kafka-client-metrics":{"0":2}}'],
     "--starting-offsets/--ending-offsets cannot be combined with a time range"),
    (["--last", "1h", "--ending-offsets", '{"kafka-client-metrics":{"0":9}}'], "cannot be combined with a time range"),
    (["--resolution", "1m,99999999999999d"], "is longer than a century"),
    (["--lookback", "99999999999999d"], "is longer than a century"),
    (["--from", "8999-12-31T00:00:00Z"], "is in the future: nothing to roll up yet"),
    (["--from", "0001-01-01T00:00:00+14:00", "--to", "2026-01-01"], "is outside 1970-01-01 to 9000-01-01"),
    (["--from", "1969-12-31T23:59:59Z"], "is outside 1970-01-01 to 9000-01-01"),
    (["--from", "2026-01-01", "--to", "9999-12-31T23:59:59Z", "--resolution", "1d"], "is outside"),
    # Epoch seconds are held to the same range (they crashed after the Spark job, or inside kafka-python).
    (["--from", "253402300000", "--to", "253402300799", "--resolution", "1d"], "is outside 1970-01-01 to 9000-01-01"),
    (["--from", "-100", "--to", "0"], "--from '-100' is outside 1970-01-01 to 9000-01-01"),
    (["--from", "2.5e11"], "is outside 1970-01-01 to 9000-01-01"),
    (["--from", "nan"], "is outside 1970-01-01 to 9000-01-01"),
    (["--from", "2026-01-01", "--to", "inf"], "--to 'inf' is outside 1970-01-01 to 9000-01-01"),
    (["--top", "99999999999"], "--top must be from 0 to 100,000"),
    (["--min-partitions", "99999999999999999999"], "--min-partitions must be from 1 to 100,000"),
])
def test_cli_mistakes_are_one_line_and_exit_2(capsys, arguments, message):
    code = main(["rollup", "--bootstrap-server", "127.0.0.1:1", "--output", "/tmp/unused", *arguments])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_master_spark_cannot_start_on_is_one_line_and_exit_2(broker, tmp_path):
    """yarn without its configuration fails as Spark starts: one line naming the master, not Spark's traceback."""
    environment = {k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)   # the topic exists (said before Spark starts)
    producer.send("kafka-client-metrics", value=b"").get(timeout=10)
    producer.close()
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "rollup", "--bootstrap-server", broker.bootstrap,
                             "--last", "5m", "--output", str(tmp_path / "out"), "--master", "yarn"],
                            capture_output=True, text=True, timeout=180, env=environment)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("kcm rollup:")]
    assert len(lines) == 1 and "cannot start Spark with --master yarn: " in lines[0], result.stderr
    assert "HADOOP_CONF_DIR" in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("master", ["local", "local[3]", "local[*]", "local[4, 2]", "local-cluster[2,1,1024]",
                                    "spark://spark-master:7077", "k8s://https://kubernetes.default:443", "yarn"])
def test_every_master_url_spark_starts_with_is_taken_as_given(master):
    assert default_master(master) == master


def test_credentials_kafka_refuses_are_one_line_naming_the_user_before_spark_starts(authenticating_broker, tmp_path,
                                                                                   capsys):
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\n"
                          "sasl.password=hunter2-not-in-any-log\n")
    started = time.monotonic()
    code = main(["rollup", "--bootstrap-server", authenticating_broker, "--command-config", str(properties),
                 "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Kafka rejected the SASL credentials for user alice" in err and "hunter2" not in err
    assert time.monotonic() - started < 30, "the refusal is found by a metadata request, not a Spark task timing out"


def test_a_local_master_listens_on_loopback_only(spark):
    """Not on whatever address the host name resolves to: a local run serves nobody else."""
    assert spark.sparkContext.getConf().get("spark.driver.host") in ("127.0.0.1", "localhost")


def test_every_secret_option_given_to_either_kafka_reader_is_redacted_by_the_session(spark, tmp_path):
    import re

    from kcm_rollups.job import kafka_options
    from kcm_rollups.session import REDACTED_OPTIONS, REDACTED_SETTINGS
    from kcm_rollups.source import SOURCE_NAME

    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test", "-days", "2",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    settings = KafkaSettings("127.0.0.1:9092", {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
        "sasl.password": "S3CRET", "ssl.certificate.location": str(cert), "ssl.key.location": str(key)})
    secret = {option for source in ("kafka", SOURCE_NAME) for option, value in kafka_options(source, settings).items()
              if "S3CRET" in value or "PRIVATE KEY" in value}
    assert secret == {"kafka.sasl.jaas.config", "kafka.ssl.keystore.key", "kafka.sasl.password"}
    conf = spark.sparkContext.getConf()
    # Plans and the UI redact data source options; Spark's own logs (the connector's at DEBUG) and environment
    # page redact settings: both must hide every secret option.
    assert conf.get("spark.redaction.regex") == REDACTED_SETTINGS
    assert spark.conf.get("spark.sql.redaction.options.regex") == REDACTED_OPTIONS
    for option in secret:
        assert re.search(REDACTED_SETTINGS, option) and re.search(REDACTED_OPTIONS, option), option


def test_a_small_record_that_would_expand_past_arrows_capacity_is_one_counted_error_through_either_kafka_input(
        spark, kafka, new_topic, tmp_path):
    """1 KB of gzip (a 1 MB client_id resource attribute on 2,500 empty points) was 2.5 GB of client_id column and
    failed the job through either Kafka input: it is one `too-large` decode error, and the other records roll up."""
    data = metrics_pb2.MetricsData()
    resource_metrics = data.resource_metrics.add()
    resource_metrics.resource.attributes.add(key="client_id").value.string_value = "x" * 1_000_000
    gauge = resource_metrics.scope_metrics.add().metrics.add(name="g").gauge
    for _ in range(2500):
        gauge.data_points.add()
    amplified = gzip.compress(data.SerializeToString())
    assert len(amplified) < 2000
    topic = new_topic()
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for value, headers in ((client_metrics("good").SerializeToString(), [("client_instance_id", b"good")]),
                           (amplified, [("content-encoding", b"gzip")])):
        producer.send(topic, value=value, headers=headers, timestamp_ms=int(minute.timestamp()) * 1000).get(timeout=10)
    producer.close()
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"))
    result = run(spark, options)
    assert (result.input_records, result.decode_errors, result.points) == (2, {"too-large": 1}, 2)
    written = spark.read.parquet(str(tmp_path / "out")).filter("resolution = '1m'").collect()
    assert sorted(r["metric"].rsplit(".", 1)[-1] for r in written) == ["avg", "total"]
    # The same through a frame shaped like Spark's connector gives (mapInArrow).
    state = merge_batches(state_of_records(read_records(spark, options), options), options.dimensions)
    counts = {r["error"]: r["records"] for r in state.groupBy("error").agg(F.sum("records").alias("records")).collect()}
    assert counts == {None: 1, "too-large": 1}


def test_one_clients_counters_in_two_scopes_are_two_streams_through_either_kafka_input(spark, kafka, new_topic,
                                                                                     tmp_path):
    topic = new_topic()
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for i, (a, b) in enumerate([(100, 5), (110, 6), (120, 7)]):
        data = metrics_pb2.MetricsData()
        resource_metrics = data.resource_metrics.add()
        for library, value in (("lib-a", a), ("lib-b", b)):
            scope_metrics = resource_metrics.scope_metrics.add()
            scope_metrics.scope.name = library
            total = scope_metrics.metrics.add(name="requests.total").sum
            total.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
            total.is_monotonic = True
            total.data_points.add(start_time_unix_nano=10**9, time_unix_nano=(2 + i) * 10**9, as_int=value)
        producer.send(topic, value=data.SerializeToString(), headers=[("client_instance_id", b"sdk-app")],
                      timestamp_ms=int(minute.timestamp() + i) * 1000).get(timeout=10)
    producer.close()
    options = RollupOptions(kafka=kafka, topic=topic, output=str(tmp_path / "out"),
                            resolutions=parse_resolutions("1m,1h"))
    _, written = _run_agreeing_with_points(spark, options)
    assert [r["increase"] for r in written if r["resolution"] == "1h"] == [(120 - 100) + (7 - 5)]


def test_an_output_that_is_not_utf8_is_one_line_and_exit_2(capsys):
    code = main(["rollup", "--bootstrap-server", "127.0.0.1:1", "--output", "/tmp/rollups-\udcff"])
    err = capsys.readouterr().err
    assert code == 2 and "--output '/tmp/rollups-\\udcff' is not UTF-8 text" in err
    assert len(err.strip().splitlines()) == 1


def test_windows_an_offset_cuts_in_one_partition_of_several_are_marked_partial_up_to_its_first_record_read(
        spark, kafka, new_topic, tmp_path):
    """A partition started at an offset lacks its records before it: every window up to the one of its first record
    read is cut, not only the first window of the whole range (which the other partitions fill)."""
    topic = new_topic(partitions=2)
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for m in range(4):   # each partition: one record in each of four minutes (one per batch: exact end offsets)
        for partition in (0, 1):
            producer.send(topic, value=client_metrics("app").SerializeToString(), key=f"i{partition}".encode(),
                          partition=partition, timestamp_ms=int(minute.timestamp() + 60 * m) * 1000).get(timeout=10)
    producer.close()

    def partial(**offsets) -> dict:
        output = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        run(spark, RollupOptions(kafka=kafka, topic=topic, output=str(output), resolutions=parse_resolutions("1m"),
                                 **offsets))
        return {int((r["window_start"] - minute.replace(tzinfo=None)).total_seconds() // 60): r["partial"]
                for r in spark.read.parquet(str(output)).select("window_start", "partial").distinct().collect()}

    # Partition 0 from its third record (the third minute): the first three minutes lack some of its records.
    assert partial(starting_offsets=json.dumps({topic: {"0": 2}})) == {0: True, 1: True, 2: True, 3: False}
    # Partition 1 up to its second record: the minutes from its second on lack some of its records.
    assert partial(ending_offsets=json.dumps({topic: {"1": 2}})) == {0: False, 1: True, 2: True, 3: True}
    # Both partitions cut, at different minutes (runs chained by offsets cut them all): the later first record read
    # and the earlier last record read decide, or windows lacking the other partition's records pass as whole.
    assert partial(starting_offsets=json.dumps({topic: {"0": 2, "1": 1}})) == {1: True, 2: True, 3: False}
    assert partial(ending_offsets=json.dumps({topic: {"0": 3, "1": 2}})) == {0: False, 1: True, 2: True}
    # Offsets at a partition's first record and its end cut nothing.
    assert partial(starting_offsets=json.dumps({topic: {"0": 0}}), ending_offsets=json.dumps({topic: {"1": 4}})) == {
        0: False, 1: False, 2: False, 3: False}
    # Nothing read of a partition, ending at its first record or starting at its end (a traceback after both passes,
    # and no window cut): every window lacks its records.
    assert partial(ending_offsets=json.dumps({topic: {"0": 0}})) == {0: True, 1: True, 2: True, 3: True}
    assert partial(starting_offsets=json.dumps({topic: {"1": 4}})) == {0: True, 1: True, 2: True, 3: True}


def test_a_partition_of_which_nothing_is_read_cuts_only_the_windows_its_records_fall_in(spark, kafka, new_topic,
                                                                                       tmp_path):
    """A quiet partition started at its end (runs chained by offsets) marked every window of the run partial, so the
    run exported nothing: only the windows up to its last record lack anything."""
    topic = new_topic(partitions=2)
    minute = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=10, second=0, microsecond=0)
    producer = KafkaProducer(**kafka.client_options())
    for partition, minutes in ((0, range(4)), (1, [0])):   # partition 1 is quiet after the first minute
        for m in minutes:
            producer.send(topic, value=client_metrics("app").SerializeToString(), key=f"i{partition}".encode(),
                          partition=partition, timestamp_ms=int(minute.timestamp() + 60 * m) * 1000).get(timeout=10)
    producer.close()
    output = tmp_path / "out"
    run(spark, RollupOptions(kafka=kafka, topic=topic, output=str(output), resolutions=parse_resolutions("1m"),
                             starting_offsets=json.dumps({topic: {"1": 1}})))
    assert {int((r["window_start"] - minute.replace(tzinfo=None)).total_seconds() // 60): r["partial"]
            for r in spark.read.parquet(str(output)).select("window_start", "partial").distinct().collect()} == {
        0: True, 1: False, 2: False, 3: False}
