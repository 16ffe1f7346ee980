"""The shared leaf's Java emulation (kcm_common.java), the client settings given to Java and librdkafka clients,
paced log lines, JSON log lines, the protobuf message bound, names, and the command line's argument layer (defaults
the docs name, one-line mistakes, flags over the config file): fast and in-process, with the rollup job and the
bridge replaced by recorders."""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys

import pytest

from kcm_common.java import PatternError, compile_pattern, copy_capacity, hash_order
from kcm_common.kafka import KafkaConfigError, KafkaSettings
from kcm_common.kafka_java import java_client_properties
from kcm_common.java_config import parse_jaas

# --- kcm_common.java: expected values printed by a JDK 17 (java.util.regex.Pattern, java.util.HashSet) -----------


@pytest.mark.parametrize(("pattern", "text", "java_result"), [
    ("(", "(", None),                       # Unclosed group: a PatternError, never the regex package's own error
    ("(?u)a", "a", None),                   # Java knows the flag; kcm refuses it as unsupported, as documented
    ("[a[b]]", "b", None),                  # a nested class (a union in Java): refused as unsupported
    ("[a-z&&b]", "&", None),                # an intersection (only "b" in Java, "&" in Python): refused
    (r"[\1]", "\x01", None),                # no back reference inside a class: Illegal/unsupported escape
    (r"a\z\n", "a\n", False),               # \z is the very end, nothing may follow it
    (r"\P{Alpha}", "a", False),             # a negated POSIX class
    (r"\P{Alpha}", "1", True),
    ("(?s)a(?-s).", "a\n", False),          # `-s` turns dotall off again
    ("(?s)a(?-s).", "ab", True),
    ("x{2,2}", "xx", True),                 # a range whose bounds are equal is a quantifier
    (r"\cA", "\x01", True),                 # \cX is the control character X ^ 64
    (r"\0477", "'7", True),                 # \0 takes three octal digits only when the first is 0-3
    (r"\0377", "\u00ff", True),
])
def test_more_patterns_compile_and_match_as_java_util_regex_does(pattern, text, java_result):
    if java_result is None:
        with pytest.raises(PatternError):
            compile_pattern(pattern)
    else:
        assert (compile_pattern(pattern).fullmatch(text) is not None) is java_result


def test_hash_order_resizes_as_java_s_hash_set_does_after_the_twelfth_item():
    # HashMap resizes once it holds more than 0.75 * 16 entries: twelve still iterate in the 16-bucket order.
    items = [f"metric{i}" for i in range(13)]
    assert hash_order(items[:12]) == ["metric8", "metric10", "metric9"] + [f"metric{i}" for i in range(8)] + [
        "metric11"]
    assert hash_order(items) == ["metric12", "metric11", "metric8", "metric10", "metric9"] + [
        f"metric{i}" for i in range(8)]


def test_a_copied_hash_set_of_24_items_starts_with_64_buckets_as_java_s_does():
    # new HashSet<>(c): tableSizeFor((int) (24 / .75f) + 1) = tableSizeFor(33) = 64.
    items = [f"m{i}" for i in range(24)]
    assert copy_capacity(24) == 64
    assert hash_order(items, copy_capacity(len(items))) == [
        "m11", "m10", "m13", "m12", "m15", "m14", "m17", "m16", "m19", "m18", "m0", "m1", "m2", "m3", "m4", "m5",
        "m6", "m7", "m20", "m8", "m9", "m22", "m21", "m23"]


# --- kcm_common.kafka_java: what a Java client (Spark's Kafka connector) is given -----------------------------------

_CERTIFICATE = "-----BEGIN CERTIFICATE-----\nMIIBkcm\n-----END CERTIFICATE-----\n"


def _java_properties(**properties: str) -> dict[str, str]:
    return java_client_properties(KafkaSettings("127.0.0.1:9092", properties))


def test_a_jaas_line_given_by_the_user_is_kept_as_written_even_when_kcm_would_write_it_otherwise():
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required username=alice password=S3cr3t;"
    properties = _java_properties(**{"security.protocol": "SASL_SSL", "sasl.jaas.config": jaas})
    assert properties["sasl.jaas.config"] == jaas


def test_a_username_with_quotes_and_backslashes_reads_back_from_the_jaas_line_kcm_writes():
    properties = _java_properties(**{"security.protocol": "SASL_SSL", "sasl.username": 'al"i\\ce',
                                     "sasl.password": "p"})
    (entry,) = parse_jaas(properties["sasl.jaas.config"])
    assert entry.options == {"username": 'al"i\\ce', "password": "p"}


def test_the_pass_phrase_of_an_encrypted_client_key_reaches_the_java_client(tmp_path):
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text(_CERTIFICATE)
    key.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIEkcm\n-----END ENCRYPTED PRIVATE KEY-----\n")
    properties = _java_properties(**{"security.protocol": "SSL", "ssl.certificate.location": str(cert),
                                     "ssl.key.location": str(key), "ssl.key.password": "the-pass-phrase"})
    assert properties["ssl.key.password"] == "the-pass-phrase"
    assert properties["ssl.keystore.key"] == key.read_text()


def test_the_request_timeout_reaches_the_java_client_in_its_own_spelling():
    properties = _java_properties(**{"security.protocol": "PLAINTEXT", "request.timeout.ms": "5000"})
    assert properties["request.timeout.ms"] == "5000"


def test_a_certificate_file_without_a_key_says_so_rather_than_asking_for_a_conversion(tmp_path):
    cert = tmp_path / "client.pem"
    cert.write_text(_CERTIFICATE)
    with pytest.raises(KafkaConfigError, match="holds no PEM private key"):
        _java_properties(**{"security.protocol": "SSL", "ssl.certificate.location": str(cert)})


def test_a_pem_file_that_is_not_ascii_is_a_config_error_not_a_traceback(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("friendlyName: caf\u00e9\n" + _CERTIFICATE, encoding="utf-8")
    with pytest.raises(KafkaConfigError, match=r"cannot read the PEM file .* as text: byte 17 is not ASCII; .*"
                                               "friendlyName"):
        _java_properties(**{"security.protocol": "SSL", "ssl.ca.location": str(ca)})


# --- kcm_common.librdkafka: what kcm's own confluent-kafka clients are given ------------------------------------


def test_librdkafka_config_spells_every_tls_and_sasl_setting_as_librdkafka_does(tmp_path):
    from kcm_common.librdkafka import librdkafka_config

    ca, cert, key = (tmp_path / name for name in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert):
        path.write_text(_CERTIFICATE)
    key.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIEkcm\n-----END ENCRYPTED PRIVATE KEY-----\n")
    settings = KafkaSettings("k1:9093,k2:9093", {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
        "sasl.password": "S3cr3t", "ssl.ca.location": str(ca), "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key), "ssl.key.password": "the-pass-phrase",
        "ssl.endpoint.identification.algorithm": "none", "client.id": "kcm-bridge", "request.timeout.ms": "5000"})
    assert librdkafka_config(settings) == {
        "bootstrap.servers": "k1:9093,k2:9093", "enable.metrics.push": False, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "S3cr3t",
        "ssl.ca.location": str(ca), "ssl.certificate.location": str(cert), "ssl.key.location": str(key),
        "ssl.key.password": "the-pass-phrase", "ssl.endpoint.identification.algorithm": "none",
        "client.id": "kcm-bridge", "socket.timeout.ms": 5000}


# --- kcm_common.pacing ------------------------------------------------------------------------------------------


def _paced_lines(caplog, steps: list[tuple[float, int]], **options) -> list[str]:
    """Log `count` lines at each clock reading; the lines that came out."""
    from kcm_common.pacing import PacedLog

    now = [0.0]
    paced = PacedLog(logging.getLogger("kcm.test.paced"), logging.ERROR, clock=lambda: now[0], **options)
    caplog.set_level(logging.ERROR, logger="kcm.test.paced")
    for at, count in steps:
        now[0] = at
        for _ in range(count):
            paced("refused")
    return [r.getMessage() for r in caplog.records if r.name == "kcm.test.paced"]


def test_the_held_back_count_starts_again_after_each_line_that_reports_it(caplog):
    assert _paced_lines(caplog, [(0, 6), (10, 3), (20, 1)], period_s=10) == [
        "refused", "refused (5 more like it in the last 10s)", "refused (2 more like it in the last 10s)"]


def test_paced_lines_come_at_most_once_per_ten_seconds_by_default(caplog):
    assert _paced_lines(caplog, [(0, 1), (9.9, 1), (10, 1)]) == ["refused", "refused (1 more like it in the last 10s)"]


# --- kcm_common.names ---------------------------------------------------------------------------------------------


def test_attribute_headers_are_written_in_the_order_the_contract_document_lists_them():
    import re
    from pathlib import Path

    from kcm_common.contract import encode

    document = (Path(__file__).resolve().parents[1] / "docs" / "contract.md").read_text()
    table = document.split("| header | values |", 1)[1].split("\n\n", 1)[0]
    documented = [name for row in table.splitlines() if row.startswith("| `")
                  for name in re.findall(r"`([a-z_-]+)`", row.split("|")[1])]
    _, headers = encode(b"", attributes={name: "1" for name in reversed(documented[2:])})
    assert [name for name, _ in headers] == documented


@pytest.mark.parametrize("name", ["a" * 250, "bad topic", "."])
def test_a_topic_name_kafka_would_refuse_is_a_one_line_usage_error(name, capsys):
    from kcm_cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["tail", "--bootstrap-server", "127.0.0.1:1", "--topic", name])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and len(error.splitlines()) == 1
    assert "is not a Kafka topic name: 1 to 249 characters" in error


def test_a_topic_name_of_249_characters_is_one_kafka_accepts():
    from kcm_cli.main import build_parser

    assert build_parser().parse_args(["tail", "--bootstrap-server", "k:1", "--topic", "a" * 249]).topic == "a" * 249


# --- kcm_cli: a user's mistake is one line and exit code 2; what the docs name as a default is the default --------


def _usage_error(arguments: list[str], capsys) -> str:
    """The one stderr line `kcm ARGUMENTS` exits 2 with."""
    from kcm_cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(arguments)
    error = capsys.readouterr().err
    assert exited.value.code == 2 and len(error.splitlines()) == 1, error
    return error


def test_waits_of_up_to_exactly_a_year_are_accepted_and_no_longer():
    from kcm_cli.main import build_parser

    year = str(365 * 86400)
    assert build_parser().parse_args(["tail", "--bootstrap-server", "k:1", "--timeout", year]).timeout == 365 * 86400
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tail", "--bootstrap-server", "k:1", "--timeout", str(365 * 86400 + 1)])


def test_a_demo_of_no_duration_is_a_one_line_usage_error(capsys):
    assert "argument --duration: must be a finite number of seconds above 0" in _usage_error(
        ["demo", "--duration", "0"], capsys)


def test_a_drift_interval_of_exactly_one_second_is_accepted():
    from kcm_cli.main import build_parser

    args = build_parser().parse_args(["operator", "-A", "--bootstrap-server", "k:1", "--drift-interval", "1"])
    assert args.drift_interval == 1.0


def test_a_command_that_talks_to_kafka_without_bootstrap_servers_is_a_one_line_usage_error(capsys):
    assert "the following arguments are required: --bootstrap-server" in _usage_error(["tail"], capsys)


def _rollup_job_given(arguments: list[str], monkeypatch) -> dict:
    """What `kcm rollup ARGUMENTS` hands the rollup job (which is not started: no Spark here)."""
    import types

    import kcm_rollups.job
    from kcm_cli.main import main

    given: dict = {}

    def run_rollup(*positional, **keywords):
        given.update(keywords, positional=positional)
        return types.SimpleNamespace(top_rows=[], summary_lines=lambda: [])

    monkeypatch.setattr(kcm_rollups.job, "run_rollup", run_rollup)
    assert main(["rollup", "--bootstrap-server", "k:9092", "--output", "out", *arguments]) == 0
    return given


def test_rollup_passes_the_documented_defaults_and_the_client_properties_to_the_job(monkeypatch):
    given = _rollup_job_given(["--command-config", "client.properties"], monkeypatch)
    assert given["positional"] == ("k:9092", "kafka-client-metrics", "out")
    assert (given["starting_offsets"], given["ending_offsets"], given["resolutions"]) == ("earliest", "latest", "1m,1h")
    assert (given["lookback_seconds"], given["top"]) == (300, 10)
    assert given["command_config"] == "client.properties"


def test_rollup_top_zero_prints_no_rows_and_the_partition_bounds_are_inclusive(monkeypatch):
    assert _rollup_job_given(["--top", "0"], monkeypatch)["top"] == 0
    assert _rollup_job_given(["--min-partitions", "100000"], monkeypatch)["min_partitions"] == 100_000


@pytest.mark.parametrize(("arguments", "message"), [
    (["--min-partitions", "0"], "--min-partitions must be from 1 to 100,000, not 0"),
    (["--otlp-header-file", "authorization=/etc/hostname"], "need --otlp-endpoint"),
    (["--otlp-tls"], "need --otlp-endpoint"),
])
def test_rollup_option_mistakes_are_one_line_before_spark_starts(arguments, message, monkeypatch, capsys):
    import kcm_rollups.job
    from kcm_cli.main import main

    monkeypatch.setattr(kcm_rollups.job, "run_rollup", lambda *a, **k: pytest.fail("the job ran"))
    assert main(["rollup", "--bootstrap-server", "k:9092", "--output", "out", *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.splitlines()) == 1


def _bridge_config_given(arguments: list[str], monkeypatch):
    """The configuration `kcm bridge ARGUMENTS` starts its bridge with (not started: no Kafka or collector here)."""
    import kcm_bridge.pipeline
    import kcm_cli.bridge
    import kcm_common.logs
    from kcm_cli.main import main

    given = []

    class Bridge:
        def __init__(self, config):
            given.append(config)

        def run(self) -> int:
            return 0

    for name in [n for n in os.environ if n.startswith("KCM_BRIDGE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(kcm_bridge.pipeline, "Bridge", Bridge)
    monkeypatch.setattr(kcm_cli.bridge, "on_stop_signals", lambda on_signal: None)
    monkeypatch.setattr(kcm_common.logs, "use_json", lambda: None)   # this process's logging is pytest's
    assert main(["bridge", *arguments]) == 0
    return given[0]


def test_bridge_flags_override_the_configuration_file(tmp_path, monkeypatch):
    path, properties = tmp_path / "bridge.yaml", tmp_path / "client.properties"
    properties.write_text("client.id=kcm-bridge-test\n")
    path.write_text("kafka: {bootstrap_servers: 'k:9092', group_id: from-file}\n"
                    "endpoints: [{endpoint: 'file:4317', insecure: true}]\n")
    config = _bridge_config_given(["--config", str(path), "--group-id", "from-flag", "--metrics-port", "9464",
                                   "--command-config", str(properties), "--log-format", "json"], monkeypatch)
    assert (config.kafka.group_id, config.metrics_port, config.kafka.command_config, config.log_format) == (
        "from-flag", 9464, str(properties), "json")
    assert [(e.endpoint, e.insecure) for e in config.endpoints] == [("file:4317", True)]   # no --insecure: kept
    replaced = _bridge_config_given(["--config", str(path), "--endpoint", "flag:4317"], monkeypatch)
    assert [e.endpoint for e in replaced.endpoints] == ["flag:4317"]


def test_a_misspelt_bridge_variable_is_named_in_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("KCM_BRIDGE_GROUPID", "typo")
    caplog.set_level(logging.WARNING)
    import kcm_bridge.pipeline
    import kcm_cli.bridge
    from kcm_cli.main import main

    monkeypatch.setattr(kcm_bridge.pipeline, "Bridge", type("Bridge", (), {"__init__": lambda s, c: None,
                                                                           "run": lambda s: 0}))
    monkeypatch.setattr(kcm_cli.bridge, "on_stop_signals", lambda on_signal: None)
    assert main(["bridge", "--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"]) == 0
    assert any("KCM_BRIDGE_GROUPID" in r.getMessage() for r in caplog.records)


def test_an_empty_value_is_blamed_on_the_subcommand_that_got_it(capsys):
    assert _usage_error(["bridge", "--config", ""], capsys) == (
        "kcm bridge: argument --config: needs a value, not an empty string (see kcm bridge --help)\n")


def test_grpc_s_own_stderr_lines_are_turned_down_unless_the_user_asked_for_them(monkeypatch):
    from kcm_cli.main import main

    monkeypatch.setenv("GRPC_VERBOSITY", "")   # so that what main sets is undone after the test
    monkeypatch.delenv("GRPC_VERBOSITY")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


def test_a_command_s_output_is_flushed_before_main_returns(monkeypatch):
    """So that a reader gone (`kcm ... | head`) is handled by main, not reported by Python as it exits."""
    import kcm_cli.tail
    from kcm_cli.main import main

    read, write = os.pipe()
    with open(write, "w") as stdout, open(read, "rb", buffering=0) as reader:   # block-buffered, as a pipe is
        monkeypatch.setattr("sys.stdout", stdout)
        monkeypatch.setattr(kcm_cli.tail, "run", lambda args: print("a row") or 0)
        assert main(["tail", "--bootstrap-server", "k:1"]) == 0
        os.set_blocking(read, False)
        assert reader.read(100) == b"a row\n"


def test_a_second_stop_signal_stops_the_bridge_without_waiting_for_exports(monkeypatch):
    import signal

    import kcm_bridge.pipeline
    import kcm_cli.bridge
    import kcm_cli.signals
    from kcm_cli.main import main

    stops, handlers = [], []

    class Bridge:
        stopping = False

        def __init__(self, config):
            pass

        def stop(self, at_once: bool = False) -> None:
            stops.append(at_once)
            self.stopping = True

        def run(self) -> int:
            handlers[0](signal.SIGTERM)
            handlers[0](signal.SIGTERM)
            return 0

    monkeypatch.setattr(kcm_bridge.pipeline, "Bridge", Bridge)
    monkeypatch.setattr(kcm_cli.bridge, "on_stop_signals", handlers.append)
    monkeypatch.setattr(kcm_cli.signals, "SAME_SIGNAL_S", 0.0)   # the repeat of one process-group kill: see there
    assert main(["bridge", "--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"]) == 0
    assert stops == [False, True]


def test_a_stop_signal_is_a_copy_only_when_it_is_the_last_requests_signal_again_within_a_second():
    """`timeout` and any process-group kill deliver one signal twice within a millisecond or so; bridge and tail
    each had their own version of this rule (tail took any stop signal for the copy)."""
    import signal

    from kcm_cli.signals import StopRequests

    clock = [100.0]
    requests = StopRequests(clock=lambda: clock[0])
    assert not requests.is_copy(signal.SIGTERM)
    clock[0] += 0.001
    assert requests.is_copy(signal.SIGTERM)            # the group's copy
    assert not requests.is_copy(signal.SIGINT)         # another signal: a new request, from now on the last
    clock[0] += 0.9
    assert requests.is_copy(signal.SIGINT)
    clock[0] += 0.2                                    # 1.1 s after the last request, though 0.2 s after its copy
    assert not requests.is_copy(signal.SIGINT)
    clock[0] += 1.0
    assert not requests.is_copy(signal.SIGINT)         # exactly the window later: a new request


# --- kcm_common.java -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["\u00aa", "\u02b0", "\u2170"])
def test_java_lower_case_includes_other_lowercase_as_character_is_lower_case_does(text):
    """J18: printed by JDK 17: Pattern.compile("\\p{javaLowerCase}").matcher("ª").matches() is true (so are ʰ and
    ⅰ: Other_Lowercase), which the Ll category alone misses."""
    from kcm_common.java import compile_pattern

    assert compile_pattern("\\p{javaLowerCase}").fullmatch(text) is not None


# --- kcm_common.logs -------------------------------------------------------------------------------------------


def _record(message: str = "boom", level: int = logging.ERROR, exc_info=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord("kcm.test", level, __file__, 1, message, (), exc_info)
    record.__dict__.update(extra)
    return record


def test_a_json_log_line_carries_the_exception_level_and_utc_time():
    """G01 (exception dropped), G02 (local time without offset), G04 (level as a number)."""
    from kcm_common.logs import JsonFormatter

    try:
        raise ValueError("the cause")
    except ValueError:
        record = _record(exc_info=sys.exc_info())
    record.created = 0.25
    line = json.loads(JsonFormatter().format(record))
    assert line["time"] == "1970-01-01T00:00:00.250+00:00"
    assert datetime.datetime.fromisoformat(line["time"]).utcoffset() == datetime.timedelta(0)
    assert (line["level"], line["logger"], line["message"]) == ("ERROR", "kcm.test", "boom")
    assert "Traceback" in line["error"] and "ValueError: the cause" in line["error"]


def test_a_cluster_scoped_object_s_line_has_no_namespace_field():
    """G03: kopf's k8s_ref for a cluster-scoped object has namespace None: no `"namespace": null` field."""
    from kcm_common.logs import JsonFormatter

    line = json.loads(JsonFormatter().format(_record(k8s_ref={"namespace": None, "name": "cluster-wide"})))
    assert "namespace" not in line and line["name"] == "cluster-wide"


def test_use_json_switches_every_handler_of_the_logger_given():
    from kcm_common.logs import JsonFormatter, use_json

    logger = logging.Logger("kcm.test.root")
    handlers = [logging.StreamHandler(), logging.StreamHandler()]
    for handler in handlers:
        logger.addHandler(handler)
    use_json(logger)
    assert all(isinstance(handler.formatter, JsonFormatter) for handler in handlers)


# --- kcm_common.message_bound ----------------------------------------------------------------------------------


def _hostile(prefix: bytes, limit: int) -> bytes:
    return prefix + b"\x0a\x00" * (limit + 1)   # limit+1 empty ResourceMetrics behind `prefix`


def test_a_ten_byte_varint_does_not_end_the_count():
    """B05: a negative int attribute is a 10-byte varint (valid protobuf); refusing it as malformed let every
    message behind it through uncounted."""
    from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

    from kcm_common.message_bound import builds_more_than

    data = MetricsData()
    attribute = data.resource_metrics.add().resource.attributes.add(key="offset")
    attribute.value.int_value = -1
    prefix = data.SerializeToString()
    assert b"\xff" * 9 + b"\x01" in prefix
    payload = _hostile(prefix, 1000)
    assert len(MetricsData.FromString(payload).resource_metrics) == 1002   # the parser builds them all
    assert builds_more_than(payload, 1000)


def test_a_two_byte_tag_starting_with_0x80_is_read_whole():
    """B06: field 16 as a varint has the tag bytes 80 01; read as a one-byte tag the walk loses its place and
    the messages behind it went uncounted."""
    from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

    from kcm_common.message_bound import builds_more_than

    payload = _hostile(b"\x80\x01\x00", 1000)
    assert len(MetricsData.FromString(payload).resource_metrics) == 1001
    assert builds_more_than(payload, 1000)


def test_a_text_log_line_escapes_what_anyone_may_put_in_a_name_and_indents_a_message_s_own_lines():
    """A client id or subscription name quoted in a log line is anyone's text: an escape sequence must not reach
    the terminal, nor a newline forge a log line; a stack kcm shows keeps its lines, indented."""
    from kcm_common.logs import TextFormatter

    forged = "bad\x1b[31mred\n2026-01-01 00:00:00,000 INFO forged: \u202ex\r"
    record = logging.LogRecord("kcm.sandbox", logging.INFO, __file__, 1, "%s: push accepted", (forged,), None)
    record.created = 0.0
    line = TextFormatter().format(record)
    assert line.endswith(" INFO kcm.sandbox: bad\\x1b[31mred\n    2026-01-01 00:00:00,000 INFO forged: \\u202ex\\r: "
                         "push accepted"), line
    try:
        raise ValueError("the cause")
    except ValueError:
        failed = logging.LogRecord("kcm.bridge", logging.ERROR, __file__, 1, "blocked at:\n%s", ("  File a",),
                                   sys.exc_info())
    text = TextFormatter().format(failed)
    assert "ERROR kcm.bridge: blocked at:\n      File a\nTraceback (most recent call last):\n" in text, text
    assert text.endswith("ValueError: the cause")


def test_a_text_log_line_about_a_resource_names_it_as_kopf_does():
    """kopf's per-object lines (a handler failing, a retry) said nothing of which resource they were about."""
    from kcm_common.logs import TextFormatter

    line = TextFormatter().format(_record("Handler 'reconcile' failed temporarily", level=logging.ERROR,
                                          k8s_ref={"namespace": "team", "name": "orders\x1b[2J"}))
    assert line.endswith(" ERROR kcm.test: [team/orders\\x1b[2J] Handler 'reconcile' failed temporarily"), line
    cluster_wide = TextFormatter().format(_record("x", k8s_ref={"namespace": None, "name": "c"}))
    assert cluster_wide.endswith(": [c] x"), cluster_wide
    assert TextFormatter().format(_record("plain")).endswith("kcm.test: plain")
    # The operator's own lines name the resource already (`handlers._say`): not twice.
    said = TextFormatter().format(_record("team/orders: subscription team.orders was changed outside kcm",
                                          k8s_ref={"namespace": "team", "name": "orders"}))
    assert said.endswith("kcm.test: team/orders: subscription team.orders was changed outside kcm"), said


def test_every_kcm_command_logs_through_the_escaping_formatter():
    code = ("import logging; from kcm_cli.main import _configure_logging; _configure_logging('INFO'); "
            "logging.getLogger('kcm.sandbox').info('%s: push accepted', 'id\\x1b[2J\\nforged')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith(" INFO kcm.sandbox: id\\x1b[2J\n    forged: push accepted\n"), result.stderr
