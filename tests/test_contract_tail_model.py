"""Model test of the metrics-topic contract codec and `kcm tail`: seeded random records checked against a reference
written from docs/contract.md and docs/tail.md (what decodes to what, which reason each bad record gets, which
headers become attributes, what tail prints for each record and which flags it refuses)."""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import zlib

import pytest
from kafka import KafkaProducer
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_cli.main import main as kcm_main
from kcm_common import contract
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.broker import EmbeddedBroker

SEED = 714
CASES = 400
ENCODINGS = ("none", "gzip", "snappy", "lz4", "zstd")  # docs/contract.md:16
REASONS = {"empty", "unknown-content-type", "unknown-encoding", "decompress-failed", "too-large",
           "invalid-protobuf", "invalid-json"}  # docs/contract.md:51-58
# docs/contract.md:17-19: every header that becomes a resource attribute.
ATTRIBUTE_HEADERS = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
                     "client_source_address", "client_source_port", "principal", "listener_name",
                     "security_protocol", "broker_id", "cluster_id", "subscription_id", "push_interval_ms",
                     "terminating")
MAGIC = {"gzip": b"\x1f\x8b", "lz4": b"\x04\x22\x4d\x18", "zstd": b"\x28\xb5\x2f\xfd"}
JSONL_KEYS = {"topic", "partition", "offset", "key", "resource", "error", "metrics"}  # docs/tail.md:91-99


def random_metrics(rng: random.Random) -> MetricsData:
    """A client's push: one resource (sometimes with a client.id), gauges and sums with random names and points."""
    data = MetricsData()
    resource_metrics = data.resource_metrics.add()
    if rng.random() < 0.5:
        resource_metrics.resource.attributes.append(
            KeyValue(key="client.id", value=AnyValue(string_value=f"res-{rng.randrange(100)}")))
    if rng.random() < 0.5:   # a client's own claim, which a contract header of the same name overrides
        resource_metrics.resource.attributes.append(
            KeyValue(key=rng.choice(("client_id", "broker_id")), value=AnyValue(string_value="from-resource")))
    scope = resource_metrics.scope_metrics.add()
    for index in range(rng.randrange(1, 4)):
        metric = scope.metrics.add()
        metric.name = f"org.apache.kafka.m{index}.{rng.randrange(1000)}"
        target = metric.gauge if rng.random() < 0.5 else metric.sum
        if target is metric.sum:
            metric.sum.aggregation_temporality = rng.choice((1, 2))
            metric.sum.is_monotonic = True
        for _ in range(rng.randrange(1, 3)):
            point = target.data_points.add()
            point.time_unix_nano = 1_700_000_000_000_000_000 + rng.randrange(10**9)
            point.as_double = rng.choice((0.5, 12.25, -3.0, 1e6))
            point.attributes.append(KeyValue(key="node_id", value=AnyValue(string_value=str(rng.randrange(9)))))
    return data


def random_attributes(rng: random.Random) -> dict[str, str]:
    names = rng.sample(ATTRIBUTE_HEADERS, rng.randrange(0, len(ATTRIBUTE_HEADERS) + 1))
    return {name: rng.choice(("", "x", "5b1a6e0e-8f51-4c5e-9d7b-2f4f1c0e9a11", "true", "9092", "naïve"))
            for name in names}


def random_record(rng: random.Random):
    """(value, headers, expected) where expected is ("ok", MetricsData, attributes) or ("error", reason)."""
    metrics = random_metrics(rng)
    attributes = random_attributes(rng)
    as_json = rng.random() < 0.3
    payload = contract._to_otlp_json(metrics) if as_json else metrics.SerializeToString()
    encoding = rng.choice(ENCODINGS)
    value = contract.compress(payload, encoding)
    headers: list[tuple[str, bytes]] = []
    type_header = rng.choice(("absent", "plain", "param", "upper", "unknown", "repeated"))
    media = contract.CONTENT_TYPE_JSON if as_json else contract.CONTENT_TYPE_PROTOBUF
    spelled = {"plain": media, "param": media + "; charset=utf-8", "upper": media.upper(),
               "unknown": "text/plain", "repeated": media}.get(type_header)
    if spelled is not None:
        headers.append(("content-type", spelled.encode()))
        if type_header == "repeated":
            headers.append(("content-type", spelled.encode()))
    encoding_header = rng.choice(("present", "present", "absent-if-none", "unknown"))
    if encoding_header == "unknown":
        headers.append(("content-encoding", b"brotli"))
    elif encoding != "none" or encoding_header == "present":
        headers.append(("content-encoding", encoding.encode()))
    headers += [(name, text.encode()) for name, text in attributes.items()]
    rng.shuffle(headers)
    expected: tuple = ("ok", metrics, attributes)
    corruption = rng.choice(("none",) * 6 + ("empty-value", "truncate", "trailing", "garbage", "empty-payload"))
    if corruption == "empty-value":
        value, expected = rng.choice((b"", None)), ("error", "empty")
    elif corruption == "empty-payload":
        value, expected = contract.compress(b"", encoding), ("error", "empty")
    elif corruption == "truncate" and encoding != "none":
        value, expected = value[:rng.randrange(1, len(value))], ("error", "decompress-failed")
    elif corruption == "trailing" and encoding != "none":
        value, expected = value + b"trailing garbage", ("error", "decompress-failed")
    elif corruption == "garbage":
        value, expected = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))), ("error", None)
    if spelled == "text/plain" and value:
        expected = ("error", "unknown-content-type")
    elif encoding_header == "unknown" and value:
        expected = ("error", "unknown-encoding")
    return value, headers, expected


def test_random_records_decode_as_the_contract_says():
    """Each record decodes to its metrics and header attributes, or fails with the reason the docs give; any
    other bytes fail with a documented reason and nothing but DecodeError."""
    rng = random.Random(SEED)
    for case in range(CASES):
        value, headers, expected = random_record(rng)
        where = f"seed {SEED} case {case}: headers {headers} value {value[:40] if value else value!r}"
        try:
            decoded = contract.decode(value, headers)
        except contract.DecodeError as error:
            assert error.reason in REASONS, where
            assert expected[0] == "error", f"{where}: unexpected {error.reason}: {error}"
            if expected[1] is not None:
                assert error.reason == expected[1], where
            continue
        assert expected[0] == "ok" or expected[1] is None, f"{where}: decoded, expected {expected}"
        if expected[0] == "ok":
            assert decoded.metrics == expected[1], where
            assert decoded.attributes == expected[2], where
            assert contract.header_attributes(headers) == expected[2], where


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_cap_on_decompressed_bytes_is_exact(encoding):
    """A payload of exactly the cap decodes; one byte more is too-large (docs/contract.md:57)."""
    rng = random.Random(SEED)
    for _ in range(8):
        payload = random_metrics(rng).SerializeToString()
        value = contract.compress(payload, encoding)
        headers = [("content-encoding", encoding.encode())]
        assert contract.decode(value, headers, max_decompressed_bytes=len(payload)).metrics.SerializeToString() \
            == payload
        with pytest.raises(contract.DecodeError) as error:
            contract.decode(value, headers, max_decompressed_bytes=len(payload) - 1)
        assert error.value.reason == "too-large"


def test_headerless_values_are_sniffed_as_json_or_protobuf():
    """No headers: JSON when `{` follows whitespace and a BOM, else protobuf (docs/contract.md:23-26)."""
    rng = random.Random(SEED + 1)
    for _ in range(60):
        metrics = random_metrics(rng)
        prefix = rng.choice((b"", b" ", b"\n\t", b"\xef\xbb\xbf", b"\xef\xbb\xbf \r\n"))
        text = contract._to_otlp_json(metrics)
        if rng.random() < 0.5:
            text = json.dumps(json.loads(text), indent=2).encode()
        assert contract.decode(prefix + text).metrics == metrics
        assert contract.decode(metrics.SerializeToString()).metrics == metrics
    with pytest.raises(contract.DecodeError) as error:
        contract.decode(b'{"resourceMetrics": [', [])
    assert error.value.reason == "invalid-json"
    document = json.loads(contract._to_otlp_json(random_metrics(rng)))
    document["somethingNew"] = {"x": 1}
    assert contract.decode(json.dumps(document).encode(), [("content-type", b"application/json")])


def test_too_many_json_objects_is_too_large():
    """More than 200,000 objects in an OTLP/JSON value is too-large, 200,000 is not (docs/contract.md:57)."""
    body = b'{"resourceMetrics":[' + b",".join([b"{}"] * 199_999) + b"]}"
    assert contract.decode(body, [("content-type", b"application/json")]).metrics
    over = b'{"resourceMetrics":[' + b",".join([b"{}"] * 200_000) + b"]}"
    with pytest.raises(contract.DecodeError) as error:
        contract.decode(over, [("content-type", b"application/json")])
    assert error.value.reason == "too-large"


def test_encoded_records_follow_the_contract_byte_for_byte():
    """encode writes UTF-8 headers named as the contract names them, the payload compressed by the named codec,
    and reads back to the same metrics and attributes."""
    rng = random.Random(SEED + 2)
    for case in range(120):
        metrics = random_metrics(rng)
        attributes = random_attributes(rng)
        content_type = rng.choice((contract.CONTENT_TYPE_PROTOBUF, contract.CONTENT_TYPE_JSON))
        encoding = rng.choice(ENCODINGS)
        value, headers = contract.encode(metrics, attributes=attributes, content_type=content_type,
                                         content_encoding=encoding)
        where = f"seed {SEED + 2} case {case}"
        fields = dict(headers)
        assert len(fields) == len(headers), where
        assert fields["content-type"] == content_type.encode(), where
        assert fields.get("content-encoding", b"none") == encoding.encode(), where
        assert {name: raw.decode("utf-8") for name, raw in headers if name in ATTRIBUTE_HEADERS} == attributes, where
        assert set(fields) <= {"content-type", "content-encoding", *ATTRIBUTE_HEADERS}, where
        payload = {"none": lambda v: v, "gzip": lambda v: zlib.decompress(v, 16 + zlib.MAX_WBITS)}.get(
            encoding, lambda v: contract.decompress(v, encoding))(value)
        if encoding in MAGIC:
            assert value.startswith(MAGIC[encoding]), where
        if content_type == contract.CONTENT_TYPE_PROTOBUF:
            assert payload == metrics.SerializeToString(), where
        else:
            assert isinstance(json.loads(payload), dict), where
        decoded = contract.decode(value, headers)
        assert (decoded.metrics, decoded.attributes) == (metrics, attributes), where
    with pytest.raises(ValueError):
        contract.encode(MetricsData(), attributes={"not_a_header": "x"})


# --- kcm tail over a real broker -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tail_topic(tmp_path_factory):
    """One broker for the module, one topic of random good and bad records, and what each record should be."""
    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log")
    broker.start()
    try:
        ensure_topic(KafkaSettings(broker.bootstrap), "model-tail", 1)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        rng = random.Random(SEED + 3)
        expected = []
        for offset in range(24):
            value, headers, model = random_record(rng)
            if model[0] == "error" and model[1] is None:   # random garbage: reason not fixed by the docs
                value, model = b"\x00\x01garbage", ("error", None)
            key = rng.choice((None, "5b1a6e0e-8f51-4c5e-9d7b-2f4f1c0e9a11", "ünïcode"))
            producer.send("model-tail", key=key.encode() if key else None, value=value,
                          headers=headers).get(timeout=10)
            expected.append((offset, key, headers, model))
        producer.close()
        yield broker.bootstrap, expected
    finally:
        broker.stop()


def run_tail(capsys, *args: str) -> tuple[int, list[str], str]:
    capsys.readouterr()
    try:
        code = kcm_main(["tail", *args])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def expected_object(bootstrap_expected, offset, key, headers, model) -> dict:
    attributes = contract.header_attributes(headers)
    if model[0] == "error":
        return {"topic": "model-tail", "partition": 0, "offset": offset, "key": key,
                "error": model[1] or "any reason", "resource": attributes}
    metrics = model[1]
    own = {kv.key: kv.value.string_value for kv in metrics.resource_metrics[0].resource.attributes}
    return {"topic": "model-tail", "partition": 0, "offset": offset, "key": key, "error": None,
            "resource": {**own, **model[2]},
            "names": [m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]}


def test_tail_jsonl_prints_each_record_as_the_model_says(tail_topic, capsys):
    """--from-beginning with a random --max-records (or --timeout) prints the first records in order, each with
    exactly the documented keys, its decode reason or its metrics, and exits 0."""
    bootstrap, expected = tail_topic
    rng = random.Random(SEED + 4)
    for round_ in range(3):
        limit = rng.choice((None, rng.randrange(1, len(expected) + 1)))
        args = ["--bootstrap-server", bootstrap, "--topic", "model-tail", "--from-beginning", "--output", "jsonl"]
        args += ["--max-records", str(limit)] if limit else ["--timeout", "1.5"]
        code, lines, err = run_tail(capsys, *args)
        where = f"seed {SEED + 4} round {round_} args {args}"
        assert code == 0, f"{where}: {err}"
        wanted = expected[:limit] if limit else expected
        assert len(lines) == len(wanted), where
        for line, record in zip(lines, wanted):
            item = json.loads(line)
            model = expected_object(bootstrap, *record)
            assert set(item) == JSONL_KEYS, where
            assert (item["topic"], item["partition"], item["offset"]) == ("model-tail", 0, model["offset"]), where
            assert item["key"] == model["key"], where
            if model["error"] is None:
                assert item["error"] is None, f"{where}: offset {model['offset']} {item['error']}"
                assert [m["name"] for m in item["metrics"]] == model["names"], where
            else:
                assert item["error"] in REASONS and item["metrics"] == [], where
                if model["error"] != "any reason":
                    assert item["error"] == model["error"], where
            assert item["resource"] == model["resource"], f"{where}: offset {model['offset']}"


def test_tail_table_has_a_row_per_point_and_one_row_per_bad_record(tail_topic, capsys):
    """The table: a header, then per good record one row per point, per bad record one `! reason at
    topic/partition@offset` row (docs/tail.md:76-85)."""
    bootstrap, expected = tail_topic
    code, lines, err = run_tail(capsys, "--bootstrap-server", bootstrap, "--topic", "model-tail",
                                "--from-beginning", "--max-records", str(len(expected)))
    assert code == 0, err
    header, *rows = lines
    assert header.split() == ["CLIENT", "ID", "INSTANCE", "METRIC", "ATTRIBUTES", "VALUE"]
    wanted = []   # (client id, instance, what the metric column starts with) per row, in record order
    for offset, key, headers, model in expected:
        attributes = contract.header_attributes(headers)
        if model[0] == "error":
            # Who sent it, from its headers alone (docs/tail.md:81-83).
            mark = f"! {model[1]} at model-tail/0@{offset}" if model[1] else "! "
            wanted.append((attributes.get("client_id") or "-", attributes.get("client_instance_id") or key, mark))
            continue
        resource = {kv.key: kv.value.string_value for kv in model[1].resource_metrics[0].resource.attributes}
        resource.update(model[2])
        client_id = resource.get("client_id") or resource.get("client.id") or "-"
        instance = resource.get("client_instance_id") or key
        for metric in model[1].resource_metrics[0].scope_metrics[0].metrics:
            for _ in range(len(metric.gauge.data_points) + len(metric.sum.data_points)):
                wanted.append((client_id, instance, metric.name))
    assert len(rows) == len(wanted), f"seed {SEED + 3}"
    for row, (client_id, instance, metric) in zip(rows, wanted):
        where = f"seed {SEED + 3}: {row!r} expected {client_id!r} {instance!r} {metric!r}"
        assert row.startswith(client_id[:11]), where
        assert row[26:].startswith((instance or "-")[:8]), where
        assert row[36:].startswith(metric), where
        if metric.startswith("! "):
            assert re.search(r"at model-tail/0@\d+(\s|$)", row), where


@pytest.mark.parametrize("flags", [
    ["--max-records", "0"], ["--max-records", "-3"], ["--max-records", "many"], ["--timeout", "0"],
    ["--timeout", "-1"], ["--timeout", "nan"], ["--timeout", "inf"], ["--connect-timeout", "0"],
    ["--connect-timeout", "nan"], ["--output", "xml"], ["--topic", ""], ["--no-such-flag"],
])
def test_bad_flags_are_one_line_and_exit_code_2(flags, capsys):
    """Invalid options exit 2 with one line on stderr saying which (docs/tail.md:66-73, 108-110)."""
    code, lines, err = run_tail(capsys, "--bootstrap-server", "127.0.0.1:9", "--connect-timeout", "1", *flags)
    assert code == 2, f"{flags}: {err}"
    assert lines == []
    errors = [line for line in err.splitlines() if "error" in line or line.startswith("kcm tail:")]
    assert len(errors) == 1, f"{flags}: {err!r}"
    assert flags[0] in errors[0], f"{flags}: the line does not say which option: {errors[0]!r}"


def test_tail_without_from_beginning_follows_only_new_records_until_its_timeout(tail_topic, capsys):
    """Started at the end, tail prints the records produced after start-up, then exits 0 after --timeout without
    one (docs/tail.md:69-71); the older records are not printed (the sandbox caveat is for multi-record batches)."""
    bootstrap, expected = tail_topic
    rng = random.Random(SEED + 5)
    result: list = []
    reader = threading.Thread(target=lambda: result.append(run_tail(
        capsys, "--bootstrap-server", bootstrap, "--topic", "model-tail", "--output", "jsonl", "--timeout", "2.5")))
    started = threading.Event()
    signal = logging.Handler()
    signal.emit = lambda record: started.set() if record.getMessage().startswith("reading") else None
    tail_log = logging.getLogger("kcm.tail")
    level = tail_log.level
    tail_log.addHandler(signal)
    tail_log.setLevel(logging.INFO)   # basicConfig does nothing under pytest, whose root logger has handlers
    try:
        reader.start()
        assert started.wait(timeout=15), "tail did not say where it starts"
    finally:
        tail_log.removeHandler(signal)
        tail_log.setLevel(level)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    new = []
    for _ in range(3):
        metrics = random_metrics(rng)
        value, headers = contract.encode(metrics, attributes={"client_id": "late"},
                                         content_encoding=rng.choice(ENCODINGS))
        producer.send("model-tail", value=value, headers=headers).get(timeout=10)
        new.append([m.name for m in metrics.resource_metrics[0].scope_metrics[0].metrics])
    producer.close()
    reader.join(timeout=15)
    assert not reader.is_alive(), "tail did not end after --timeout"
    code, lines, err = result[0]
    assert code == 0, err
    items = [json.loads(line) for line in lines]
    assert [[m["name"] for m in item["metrics"]] for item in items] == new
    assert [item["offset"] for item in items] == list(range(len(expected), len(expected) + 3))
    assert all(item["resource"]["client_id"] == "late" and item["key"] is None for item in items)
