"""`kcm tail` against the embedded broker, with records written by the contract codec."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time

import pytest
from google.protobuf import json_format
from kafka import KafkaProducer
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, MetricsData

from kcm_common import contract
from payloads import client_metrics

INSTANCE = "5b1a6e0e-8f51-4c5e-9d7b-2f4f1c0e9a11"
JSONL_KEYS = {"topic", "partition", "offset", "key", "resource", "error", "metrics"}


def _kcm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcm_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def producer(broker):
    kafka_producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    yield kafka_producer
    kafka_producer.close()


def _send(producer: KafkaProducer, topic: str, value: bytes | None, headers=(), key: str | None = INSTANCE) -> None:
    producer.send(topic, key=key.encode() if key else None, value=value, headers=list(headers)).get(timeout=10)


def _contract_record(client_id: str = "payments-producer", encoding: str = "zstd"):
    return contract.encode(
        client_metrics(client_id),
        attributes={"client_instance_id": INSTANCE, "client_id": client_id,
                    "client_software_name": "librdkafka", "client_software_version": "2.16.0"},
        content_encoding=encoding,
    )


def test_jsonl_prints_one_object_per_record_with_the_contract_fields(broker, new_topic, producer):
    topic = new_topic()
    value, headers = _contract_record()
    _send(producer, topic, value, headers)

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "1")

    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    record = json.loads(line)
    assert set(record) == JSONL_KEYS
    assert (record["topic"], record["partition"], record["offset"], record["key"]) == (topic, 0, 0, INSTANCE)
    assert record["error"] is None
    assert record["resource"]["client_id"] == "payments-producer"
    assert record["resource"]["client_software_name"] == "librdkafka"
    gauge, total = record["metrics"]
    assert gauge == {
        "name": "org.apache.kafka.producer.node.request.latency.avg", "type": "gauge", "temporality": None,
        "monotonic": None,
        "points": [{"time_unix_nano": 1_700_000_000_000_000_000, "start_time_unix_nano": 0,
                    "attributes": {"node_id": "1"}, "value": 12.5}],
    }
    assert (total["type"], total["temporality"], total["monotonic"]) == ("sum", "delta", True)
    assert total["points"][0]["value"] == 42
    assert total["points"][0]["attributes"] == {"topic": "payments"}


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_records_in_batches_of_every_kafka_compression_are_read(broker, new_topic, codec):
    # The batch compression is the producer's (or the topic's) choice, not the contract's: kafka-python decodes
    # snappy batches only with the `snappy` module, without which tail stopped at the first such batch.
    from confluent_kafka import Producer

    topic = new_topic()
    value, headers = _contract_record(client_id=f"codec-{codec}")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec})
    producer.produce(topic, value, key=INSTANCE.encode(), headers=headers)
    assert producer.flush(10) == 0

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "1", "--timeout", "20")

    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert json.loads(line)["resource"]["client_id"] == f"codec-{codec}"


def test_contract_headers_win_over_the_resource_attributes_the_client_sent(broker, new_topic, producer):
    topic = new_topic()
    metrics = client_metrics("from-payload")
    resource = metrics.resource_metrics[0].resource
    resource.attributes.add(key="client_id").value.string_value = "spoofed-by-the-client"
    resource.attributes.add(key="service.name").value.string_value = "payments"
    value, headers = contract.encode(metrics, attributes={"client_instance_id": INSTANCE, "client_id": "from-broker"})
    _send(producer, topic, value, headers)

    jsonl = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--output", "jsonl", "--max-records", "1")
    table = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--max-records", "1")

    assert jsonl.returncode == 0 and table.returncode == 0, jsonl.stderr + table.stderr
    resource_seen = json.loads(jsonl.stdout)["resource"]
    assert resource_seen["client_id"] == "from-broker"
    assert resource_seen["service.name"] == "payments"
    rows = table.stdout.splitlines()[1:]
    assert rows and all(row.startswith("from-broker") for row in rows), rows


def test_a_plain_otlp_record_of_several_resources_labels_each_metric_with_its_own_resource(broker, new_topic,
                                                                                             producer):
    # The OpenTelemetry Collector's Kafka exporter writes one request per record, often of several resources.
    data = MetricsData()
    for client, metric in (("payments-producer", "org.apache.kafka.producer.record.queue.time.avg"),
                           ("orders-consumer", "org.apache.kafka.consumer.fetch.latency.avg")):
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.add(key="client.id").value.string_value = client
        resource_metrics.resource.attributes.add(key="k8s.cluster.name").value.string_value = "eu-1"
        resource_metrics.scope_metrics.add().metrics.add(name=metric).gauge.data_points.add(as_double=1.0)
    topic = new_topic()
    _send(producer, topic, data.SerializeToString(), headers=(), key=None)

    jsonl = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--output", "jsonl", "--max-records", "1")
    table = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--max-records", "1")

    assert jsonl.returncode == 0 and table.returncode == 0, jsonl.stderr + table.stderr
    record = json.loads(jsonl.stdout)
    assert set(record) == JSONL_KEYS
    assert record["resource"] == {"k8s.cluster.name": "eu-1"}  # what both resources share
    assert [(m["name"].rsplit(".", 2)[-2], m["resource"]["client.id"]) for m in record["metrics"]] == [
        ("time", "payments-producer"), ("latency", "orders-consumer")]
    assert [row.split()[:3:2] for row in table.stdout.splitlines()[1:]] == [
        ["payments-producer", "org.apache.kafka.producer.record.queue.time.avg"],
        ["orders-consumer", "org.apache.kafka.consumer.fetch.latency.avg"]]


def test_long_names_are_cut_in_the_middle_so_rows_that_differ_at_the_end_stay_apart():
    from kcm_cli.tail import table_lines

    names = [f"org.apache.kafka.consumer.coordinator.rebalance.latency.{stat}" for stat in ("avg", "max", "total")]
    rows = []
    for group in (1, 2):
        item = {"topic": "t", "partition": 0, "offset": 0, "key": INSTANCE, "error": None,
                "resource": {"client_id": f"payments-consumer-group-{group}"},
                "metrics": [{"name": name, "points": [{"attributes": {}, "value": 1}]} for name in names]}
        rows += list(table_lines(item))

    cells = [row.split()[::2][:2] for row in rows]  # client id and metric, both cut
    assert len(set(map(tuple, cells))) == 6, cells
    assert all(len(row.split()[2]) == 52 and row.split()[2].endswith(name.rsplit(".", 3)[-1])
               for row, name in zip(rows, names * 2))


def test_resource_copies_for_the_metrics_of_a_record_of_several_resources_count_against_the_bound(
        broker, new_topic, producer):
    # 400 attributes and 400 metrics in one resource: few items, but 160,000 attributes once copied to each metric.
    data = MetricsData()
    wide = data.resource_metrics.add()
    wide.resource.attributes.extend(KeyValue(key=f"k{i}", value=AnyValue(string_value="v")) for i in range(400))
    wide.scope_metrics.add().metrics.extend(Metric(name=f"m{i}") for i in range(400))
    data.resource_metrics.add().scope_metrics.add().metrics.add(name="other")
    topic = new_topic()
    _send(producer, topic, data.SerializeToString(), headers=(), key=None)

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "1")

    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert (record["error"], record["metrics"]) == ("too-large", [])


def test_undecodable_record_is_printed_with_its_reason_and_tail_goes_on(broker, new_topic, producer):
    topic = new_topic()
    _send(producer, topic, b"\x28\xb5\x2f\xfd garbage",
          [("content-encoding", b"zstd"), ("client_id", b"bad-client"), ("principal", b"User:bad")])
    _send(producer, topic, json_format.MessageToJson(client_metrics("plain-json")).encode(), headers=(), key=None)

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "2")

    assert result.returncode == 0, result.stderr
    broken, plain = (json.loads(line) for line in result.stdout.splitlines())
    assert broken["error"] == "decompress-failed"
    assert broken["metrics"] == []
    # Who sent it, from its headers: the payload cannot say.
    assert broken["resource"] == {"client_id": "bad-client", "principal": "User:bad"}
    table = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--max-records", "1")
    assert table.returncode == 0, table.stderr
    [row] = [line for line in table.stdout.splitlines() if "! decompress-failed" in line]
    assert row.startswith("bad-client ") and f"! decompress-failed at {topic}/0@0" in row, row
    assert plain["error"] is None and plain["key"] is None
    assert [m["name"] for m in plain["metrics"]] == [
        "org.apache.kafka.producer.node.request.latency.avg", "org.apache.kafka.producer.record.send.total"]


def test_a_small_record_of_millions_of_points_is_too_large_and_tail_goes_on(broker, new_topic, producer):
    # 2 MB of empty data points compress to a few KB; as dicts and JSON they took gigabytes and minutes.
    def field(tag: int, body: bytes) -> bytes:
        length, size = bytearray(), len(body)
        while size >= 0x80:
            length.append(size & 0x7F | 0x80)
            size >>= 7
        return bytes([tag]) + bytes(length) + bytes([size]) + body

    bomb = field(0x0A, field(0x12, field(0x12, field(0x0A, b"bomb") + field(0x2A, b"\x0a\x00" * 1_000_000))))
    topic = new_topic()
    _send(producer, topic, contract.compress(bomb, "zstd"), [("content-encoding", b"zstd")])
    value, headers = _contract_record()
    _send(producer, topic, value, headers)

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "2")

    assert result.returncode == 0, result.stderr
    too_large, normal = (json.loads(line) for line in result.stdout.splitlines())
    assert (too_large["error"], too_large["metrics"]) == ("too-large", [])
    assert normal["error"] is None and normal["resource"]["client_id"] == "payments-producer"


def test_table_has_a_row_per_metric_point(broker, new_topic, producer):
    topic = new_topic()
    value, headers = _contract_record(encoding="gzip")
    _send(producer, topic, value, headers)
    _send(producer, topic, b"not protobuf \xff\xff\xff", [("content-type", b"application/json")])

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--max-records", "2")

    assert result.returncode == 0, result.stderr
    header, latency, sent, broken = result.stdout.splitlines()
    assert header.split() == ["CLIENT", "ID", "INSTANCE", "METRIC", "ATTRIBUTES", "VALUE"]
    assert latency.split() == ["payments-producer", INSTANCE[:8],
                               "org.apache.kafka.producer.node.request.latency.avg", "node_id=1", "12.5"]
    assert sent.split() == ["payments-producer", INSTANCE[:8], "org.apache.kafka.producer.record.send.total",
                            "topic=payments", "42"]
    assert "invalid-json" in broken


def test_control_characters_from_a_client_are_shown_escaped_and_nan_is_valid_json(broker, new_topic, producer):
    topic = new_topic()
    hostile = "evil\x1b[31mRED\x1b[0m\nsecond-line"
    data = client_metrics(hostile)
    data.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double = float("nan")
    value, headers = contract.encode(data, attributes={"client_instance_id": INSTANCE, "client_id": hostile},
                                     content_encoding="none")
    _send(producer, topic, value, headers)

    table = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--max-records", "1")
    jsonl = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                 "--max-records", "1", "--output", "jsonl")

    assert table.returncode == 0 and jsonl.returncode == 0, table.stderr + jsonl.stderr
    rows = table.stdout.splitlines()[1:]
    assert len(rows) == 2 and "\x1b" not in table.stdout  # one row per point, no escape reaches the terminal
    assert rows[0].split()[0] == "evil\\x1b[31…nsecond-line"  # escaped, then cut to its column in the middle
    assert rows[0].split()[-1] == "nan"
    item = json.loads(jsonl.stdout, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert item["resource"]["client_id"] == hostile
    assert item["metrics"][0]["points"][0]["value"] == "NaN"


def test_without_from_beginning_only_new_records_are_printed(broker, new_topic, producer):
    topic = new_topic(partitions=2)
    _send(producer, topic, *_contract_record("old-client"))
    tail = subprocess.Popen(
        [sys.executable, "-m", "kcm_cli.main", "tail", "--bootstrap-server", broker.bootstrap, "--topic", topic,
         "--output", "jsonl", "--max-records", "1", "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # tail logs where it starts reading once its offsets are resolved; only then is a record "new".
        while "reading " + topic not in (line := tail.stderr.readline()):
            assert line, "kcm tail exited before it started reading"
        _send(producer, topic, *_contract_record("new-client"))
        out, err = tail.communicate(timeout=40)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    [line] = out.splitlines()
    assert json.loads(line)["resource"]["client_id"] == "new-client"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_ends_tail_with_exit_code_0_and_no_traceback(broker, new_topic, producer, stop):
    topic = new_topic()
    _send(producer, topic, *_contract_record("seen"))
    tail = subprocess.Popen(
        [sys.executable, "-m", "kcm_cli.main", "tail", "--bootstrap-server", broker.bootstrap, "--topic", topic,
         "--output", "jsonl", "--from-beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(tail.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert lines and json.loads(lines[0])["resource"]["client_id"] == "seen", lines
        tail.send_signal(stop)
        _, err = tail.communicate(timeout=30)
    finally:
        tail.kill()
    assert tail.returncode == 0 and "Traceback" not in err, err


def test_timeout_ends_tail_when_no_record_arrives(broker, new_topic):
    topic = new_topic()
    started = time.monotonic()

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--output", "jsonl",
                  "--timeout", "1")

    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert time.monotonic() - started < 30


def test_kafka_going_away_while_tail_reads_is_said(broker, new_topic):
    """kafka-python retries a lost connection without a word: a dead cluster looked exactly like a quiet topic."""
    topic = new_topic()
    tail = subprocess.Popen(
        [sys.executable, "-m", "kcm_cli.main", "tail", "--bootstrap-server", broker.bootstrap, "--topic", topic,
         "--output", "jsonl", "--connect-timeout", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while "reading " + topic not in (line := tail.stderr.readline()):
            assert line, "kcm tail exited before it started reading"
        broker.stop(grace_s=0)   # a crash
        said = _line_within(tail, "still trying", 30)
    finally:
        tail.kill()
        tail.communicate(timeout=30)
    assert "WARNING" in said and broker.bootstrap in said, said


def _line_within(process: subprocess.Popen, fragment: str, timeout_s: float) -> str:
    """The first line of `process`'s stderr holding `fragment`, read on a thread so the wait is bounded."""
    found: list[str] = []

    def read() -> None:
        for line in process.stderr:
            if fragment in line:
                found.append(line)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert found, f"no line with {fragment!r} within {timeout_s} s"
    return found[0]


def test_missing_topic_is_a_one_line_error_with_exit_code_2(broker):
    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", "no-such-topic", "--timeout", "1")

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "topic 'no-such-topic' does not exist" in result.stderr


def test_unreachable_broker_is_a_one_line_error_with_exit_code_2():
    from ports import reserved_port

    with reserved_port() as port:
        result = _kcm("tail", "--bootstrap-server", f"127.0.0.1:{port}", "--timeout", "1", "--connect-timeout", "1")

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "cannot reach Kafka" in result.stderr


def test_brokers_advertising_an_address_this_machine_cannot_reach_are_named_in_one_line(misadvertised_broker):
    # The classic set-up mistake: the bootstrap address answers, the brokers it names (advertised.listeners) do not.
    broker, unreachable = misadvertised_broker
    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--connect-timeout", "3", "--timeout", "2")

    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"kcm tail: Kafka at {broker.bootstrap} answers, but its brokers advertise {unreachable}, "
                           "which this client could not reach"), line
    assert "advertised.listeners" in line


def test_unknown_client_property_is_rejected_before_connecting(tmp_path, broker):
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nbogus.key=1\n")

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--command-config", str(config))

    assert result.returncode == 2
    assert "unsupported client property 'bogus.key'" in result.stderr


def test_a_bootstrap_host_that_is_not_utf8_is_a_one_line_error_with_exit_code_2():
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "tail", "--bootstrap-server", b"local\xffhost:1"],
                            capture_output=True, text=True, timeout=60)

    assert result.returncode == 2
    assert result.stderr == ("kcm tail: bootstrap server 'local\\udcffhost:1' is not UTF-8 text (a byte that is not "
                             "UTF-8 in a variable or on the command line, or a lone \\uD800-\\uDFFF escape)\n")


class _NotUtf8(str):
    """A header name kafka-python's producer writes as bytes that are not UTF-8: brokers do not check them."""

    def encode(self, *args, **kwargs) -> bytes:
        return b"\xff\xfebad"


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_record_kafka_python_cannot_read_is_an_error_row_and_tail_reads_past_it(broker, new_topic, producer,
                                                                                    partitions):
    # kafka-python raises CorruptRecordError for such a header name, which tail took for Kafka gone and stopped.
    topic = new_topic(partitions=partitions)
    last = partitions - 1
    value, headers = _contract_record("before")
    producer.send(topic, partition=last, value=value, headers=headers).get(timeout=10)
    producer.send(topic, partition=last, value=value, headers=[*headers, (_NotUtf8("x"), b"v")]).get(timeout=10)
    value, headers = _contract_record("after")
    producer.send(topic, partition=last, value=value, headers=headers).get(timeout=10)
    if partitions > 1:   # kafka-python does not say which partition failed: tail must find it among several
        value, headers = _contract_record("elsewhere")
        producer.send(topic, partition=0, value=value, headers=headers).get(timeout=10)

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", str(2 + partitions))

    assert result.returncode == 0, result.stderr
    rows = sorted((item["partition"], item["offset"], item["error"], item["resource"].get("client_id"))
                  for item in map(json.loads, result.stdout.splitlines()))
    expected = [(last, 0, None, "before"), (last, 1, "unreadable-record", None), (last, 2, None, "after")]
    assert rows == sorted(expected + ([(0, 0, None, "elsewhere")] if partitions > 1 else []))


@pytest.mark.parametrize("codec", ["gzip", "zstd", "lz4"])
def test_a_batch_that_does_not_decompress_is_an_error_row_and_tail_reads_past_it(broker, new_topic, monkeypatch, codec):
    """A batch with a valid CRC and a compressed body that is not (a buggy or hostile producer): kafka-python raised
    the codec's own error from poll, and tail ended in a traceback at that offset every time."""
    import kafka.record.default_records as records

    topic = new_topic()
    encoder = f"{codec}_encode"
    monkeypatch.setattr(records, encoder, lambda data, *_, **__: b"\x00not-" + codec.encode() + b"\x00" * 20)
    broken = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=0)
    _send(broken, topic, *_contract_record("lost"))
    broken.close()
    monkeypatch.undo()
    good = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    _send(good, topic, *_contract_record("after"))
    good.close()

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "2", "--timeout", "20")

    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = [(item["offset"], item["error"], item["resource"].get("client_id"))
            for item in map(json.loads, result.stdout.splitlines())]
    assert rows == [(0, "unreadable-record", None), (1, None, "after")]


def test_tail_prints_what_a_real_librdkafka_client_pushed_through_the_sandbox(sandbox):
    import confluent_kafka
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap)
    admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "all",
                                        configs={"metrics": "*", "interval.ms": "300"})], raise_on_unknown=False)
    admin.close()
    producer = confluent_kafka.Producer({"bootstrap.servers": sandbox.bootstrap, "client.id": "tailed-producer"})
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            producer.produce("traffic", b"x")
            producer.poll(0.05)
        producer.flush(5)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        # tail waits for the pushes: no fixed sleep, only its own --timeout as an upper bound.
        result = _kcm("tail", "--bootstrap-server", sandbox.bootstrap, "--topic", sandbox.options.topic,
                      "--from-beginning", "--output", "jsonl", "--max-records", "2", "--timeout", "30")
    finally:
        stop.set()
        worker.join(timeout=10)

    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["error"] is None
        assert record["resource"]["client_id"] == "tailed-producer"
        assert record["key"] == record["resource"]["client_instance_id"]
        names = {metric["name"] for metric in record["metrics"]}
        assert "org.apache.kafka.producer.node.request.latency.avg" in names, names
        assert all(metric["type"] in ("gauge", "sum") for metric in record["metrics"])


def test_a_histogram_point_without_a_sum_shows_its_count_only():
    from kcm_cli.tail import _point_value

    assert _point_value({"count": 4, "sum": 10.5}) == "count=4 sum=10.5"
    assert _point_value({"count": 4, "sum": None}) == "count=4"
    assert _point_value({"value": float("nan")}) == "nan"


def _record(value: bytes, headers=(), key: bytes | None = INSTANCE.encode()):
    """What kafka-python hands tail for one record (the fields tail reads)."""
    from types import SimpleNamespace

    return SimpleNamespace(topic="t", partition=0, offset=7, key=key, value=value, headers=list(headers))


def test_a_record_of_no_resources_is_printed_with_the_broker_s_identity_and_no_metrics():
    from kcm_cli.tail import record_json

    _, headers = contract.encode(client_metrics(), attributes={"client_instance_id": INSTANCE, "client_id": "idle"},
                                 content_encoding="none")
    item, error = record_json(_record(b"\x10\x01", headers))   # MetricsData of one unknown field: no resources
    assert error is None and item["metrics"] == []
    assert item["resource"] == {"client_instance_id": INSTANCE, "client_id": "idle"}


def test_a_record_too_large_once_its_resources_are_copied_to_its_metrics_shows_who_sent_it():
    """docs/tail.md: a record with an `error` shows the contract headers' attributes alone."""
    from kcm_cli.tail import record_json

    data = MetricsData()
    wide = data.resource_metrics.add()
    wide.resource.attributes.extend(KeyValue(key=f"k{i}", value=AnyValue(string_value="v")) for i in range(400))
    wide.scope_metrics.add().metrics.extend(Metric(name=f"m{i}") for i in range(400))
    data.resource_metrics.add().scope_metrics.add().metrics.add(name="other")
    _, headers = contract.encode(data, attributes={"client_instance_id": INSTANCE, "client_id": "wide"},
                                 content_encoding="none")
    item, error = record_json(_record(data.SerializeToString(), headers))
    assert (item["error"], item["metrics"]) == ("too-large", []) and "copied" in error
    assert item["resource"] == {"client_instance_id": INSTANCE, "client_id": "wide"}


def test_a_key_that_is_not_utf8_is_shown_with_replacement_characters():
    from kcm_cli.tail import record_json

    value, headers = _contract_record()
    item, error = record_json(_record(value, headers, key=b"\xff\xfeab"))
    assert error is None and item["key"] == "\ufffd\ufffdab"


def test_the_record_resource_of_several_resources_holds_only_what_all_of_them_share():
    from kcm_cli.tail import record_json

    data = MetricsData()
    for client, zone in (("a", "z1"), ("b", "z1"), ("c", "z2")):
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.add(key="client.id").value.string_value = client
        resource_metrics.resource.attributes.add(key="zone").value.string_value = zone
        resource_metrics.resource.attributes.add(key="k8s.cluster.name").value.string_value = "eu-1"
        resource_metrics.scope_metrics.add().metrics.add(name="m").gauge.data_points.add(as_double=1.0)
    item, _ = record_json(_record(data.SerializeToString(), key=None))
    assert item["resource"] == {"k8s.cluster.name": "eu-1"}   # zone is shared by two of the three only


def test_infinities_are_the_json_strings_protobuf_uses_and_the_key_names_a_plain_record_s_instance():
    from kcm_cli.tail import _json_safe, table_lines

    assert _json_safe({"v": [math.inf, -math.inf, math.nan, 1.5]}) == {"v": ["Infinity", "-Infinity", "NaN", 1.5]}
    item = {"topic": "t", "partition": 0, "offset": 0, "key": "abcdef0123", "error": None,
            "resource": {"client.id": "plain"}, "metrics": [{"name": "m", "points": [{"attributes": {}, "value": 1}]}]}
    [row] = list(table_lines(item))
    assert row.split()[:2] == ["plain", "abcdef01"]


def test_kafka_lost_and_back_is_said_once_each(monkeypatch, caplog):
    from kcm_cli import tail
    from kcm_common.errors import UserError
    from kcm_common.kafka import KafkaSettings

    answers = iter([UserError("cannot reach Kafka at k:9092"), UserError("cannot reach Kafka at k:9092"), None])

    def probe(settings, timeout_s, stop=None):
        answer = next(answers)
        if answer is not None:
            raise answer

    monkeypatch.setattr(tail, "check_reachable", probe)
    lost, seen = False, []
    with caplog.at_level("INFO", logger="kcm"):
        for _ in range(3):
            lost = tail._still_there(KafkaSettings("k:9092"), 1.0, lost, threading.Event())
            seen.append(lost)
    assert seen == [True, True, False]
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("kcm")] == [
        ("WARNING", "cannot reach Kafka at k:9092; still trying"), ("INFO", "Kafka at k:9092 answers again")]


def test_max_records_of_zero_is_a_one_line_error_with_exit_code_2():
    result = _kcm("tail", "--bootstrap-server", "127.0.0.1:9", "--max-records", "0")
    assert result.returncode == 2 and result.stderr.strip() == "kcm tail: --max-records must be at least 1"


def test_records_of_several_partitions_are_printed_in_timestamp_order(broker, new_topic, producer):
    topic = new_topic(partitions=2)
    value, headers = _contract_record()
    for index, (partition, stamp) in enumerate(((0, 1000), (1, 2000), (0, 3000), (1, 4000))):
        producer.send(topic, key=str(index).encode(), value=value, headers=list(headers), partition=partition,
                      timestamp_ms=1_700_000_000_000 + stamp).get(timeout=10)
    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                  "--output", "jsonl", "--max-records", "4")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["key"] for line in result.stdout.splitlines()] == ["0", "1", "2", "3"]


def test_timeout_counts_from_the_last_record_not_from_the_start(broker, new_topic, producer):
    topic = new_topic()
    value, headers = _contract_record()
    tail = subprocess.Popen([sys.executable, "-m", "kcm_cli.main", "tail", "--bootstrap-server", broker.bootstrap,
                             "--topic", topic, "--output", "jsonl", "--timeout", "1.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while "reading " + topic not in (line := tail.stderr.readline()):
            assert line, "kcm tail exited before it started reading"
        for _ in range(10):   # a record every 0.4 s for 4 s: never 1.5 s without one
            _send(producer, topic, value, headers)
            time.sleep(0.4)
        out, _ = tail.communicate(timeout=30)
    finally:
        tail.kill()
    assert len(out.splitlines()) == 10


def test_a_kafka_error_while_reading_is_one_line_not_a_traceback(broker, new_topic, monkeypatch):
    from kafka import KafkaConsumer
    from kafka.errors import KafkaConnectionError

    from kcm_cli.main import build_parser
    from kcm_cli.tail import run
    from kcm_common.kafka import KafkaUnavailableError

    def lost(self, *args, **kwargs):
        raise KafkaConnectionError("socket disconnected")

    monkeypatch.setattr(KafkaConsumer, "poll", lost)
    args = build_parser().parse_args(["tail", "--bootstrap-server", broker.bootstrap, "--topic", new_topic()])
    with pytest.raises(KafkaUnavailableError, match="lost the connection to Kafka: .*socket disconnected"):
        run(args)


def test_a_stop_signal_delivered_twice_at_once_ends_tail_once_and_a_later_one_interrupts_again(monkeypatch):
    """A process-group kill (`timeout`, a CI runner) sends SIGTERM twice within a millisecond: the second landed in
    the consumer's close and made the exit 130 instead of 0, one run in three."""
    import os

    import kcm_cli.tail
    from kcm_cli.main import build_parser

    seen: list[str] = []

    def reading(args, out, stopping, reading):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)   # the handler runs here
        except KeyboardInterrupt:
            seen.append("interrupted")
        os.kill(os.getpid(), signal.SIGTERM)   # the group's copy, while closing
        time.sleep(0.05)
        seen.append("closed")
        return 0

    monkeypatch.setattr(kcm_cli.tail, "_run", reading)
    args = build_parser().parse_args(["tail", "--bootstrap-server", "k:9092"])
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert kcm_cli.tail.run(args) == 0
    except KeyboardInterrupt:
        pytest.fail("the second copy of the signal broke off the close")
    assert seen == ["interrupted", "closed"]
    assert signal.getsignal(signal.SIGTERM) is before   # put back

    def twice_a_second_apart(args, out, stopping, reading):
        for _ in range(2):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)   # the handler runs here
            except KeyboardInterrupt:
                seen.append("interrupted")
            time.sleep(1.1)
        return 0

    monkeypatch.setattr(kcm_cli.tail, "_run", twice_a_second_apart)
    seen.clear()
    assert kcm_cli.tail.run(args) == 0
    assert seen == ["interrupted", "interrupted"]   # Ctrl-C pressed again later is a new request


def test_a_stop_signal_while_reading_ends_the_loop_without_an_exception_inside_the_client(monkeypatch):
    """A KeyboardInterrupt raised inside kafka-python's calls can leave its lock taken: tail then hung in the close
    (once in a fresh-clone run). While reading, a signal only sets the flag the loop checks after each poll."""
    import os

    import kcm_cli.tail
    from kcm_cli.main import build_parser

    seen: list[object] = []

    def reading_loop(args, out, stopping, reading):
        reading.set()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)   # the handler runs here
        except KeyboardInterrupt:
            seen.append("interrupted")
        seen.append(stopping.is_set())
        return 0

    monkeypatch.setattr(kcm_cli.tail, "_run", reading_loop)
    args = build_parser().parse_args(["tail", "--bootstrap-server", "k:9092"])
    try:
        assert kcm_cli.tail.run(args) == 0
    except KeyboardInterrupt:
        pytest.fail("the signal raised inside the read loop")
    assert seen == [True]
