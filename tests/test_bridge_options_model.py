"""Model-based test of the bridge's options: seeded random settings given through the YAML file, `KCM_BRIDGE_*`
variables and flags, run through `kcm bridge` (with a fake Bridge), checked against a reference written from
docs/bridge.md (Quick start and Full example): each option's typed value or default, precedence (flags over
environment over file over defaults), and a bad value refused in one line naming the setting with exit code 2."""

from __future__ import annotations

import os
import random
import re
import subprocess
from pathlib import Path

import pytest
import yaml

SEED = 714
CASES = 120

# The documented options: (field path, flag, environment suffix, default, valid values, invalid values).
# Valid values are written as text, as a variable or flag carries them; (text, typed value) pairs.
OPTIONS = [
    (("kafka", "group_id"), "--group-id", "GROUP_ID", "kcm-bridge",
     [("g1", "g1"), ("0777", "0777"), ("team.a", "team.a")], []),
    (("kafka", "client"), "--kafka-client", "KAFKA_CLIENT", "confluent-kafka",
     [("confluent-kafka", "confluent-kafka"), ("kafka-python", "kafka-python")], ["librdkafka"]),
    (("kafka", "topics"), "--topic", "TOPICS", ["kafka-client-metrics"],
     [("m1", ["m1"]), ("m1,m2", ["m1", "m2"]), ("m1, m2", ["m1", "m2"])], ["m1,m1"]),
    (("kafka", "connect_timeout_s"), None, None, 10.0, [("3", 3.0), ("0.5", 0.5)], ["0", "-1", "nan", "abc"]),
    (("routing",), "--routing", "ROUTING", "fanout", [("fanout", "fanout"), ("hash", "hash")], ["random"]),
    (("batch", "max_points"), None, "BATCH_MAX_POINTS", 8192, [("1", 1), ("500", 500)], ["0", "-3", "x"]),
    (("batch", "max_bytes"), None, "BATCH_MAX_BYTES", 2 * 1024 * 1024, [("1024", 1024)], ["0", "-1"]),
    (("batch", "linger_ms"), None, "BATCH_LINGER_MS", 200, [("0", 0), ("50", 50)], ["-1", "soon"]),
    (("retry", "initial_backoff_s"), None, None, 0.5, [("0.25", 0.25)], ["0", "inf"]),
    (("retry", "multiplier"), None, None, 2.0, [("1", 1.0), ("3", 3.0)], ["0.5", "nan"]),
    (("retry", "jitter"), None, None, 0.2, [("0", 0.0), ("1", 1.0), ("0.5", 0.5)], ["1.5", "-0.1"]),
    (("temporality", "delta_to_cumulative"), None, "DELTA_TO_CUMULATIVE", False,
     [("true", True), ("false", False), ("on", True), ("off", False), ("yes", True), ("no", False), ("1", True),
      ("0", False), ("True", True)], ["maybe", "2"]),
    (("temporality", "max_streams"), None, None, 100_000, [("10", 10)], ["0"]),
    (("temporality", "idle_expiry_s"), None, None, 600.0, [("60", 60.0)], ["0", "-5"]),
    (("delivery", "dead_letter_topic"), "--dead-letter-topic", "DEAD_LETTER_TOPIC", None,
     [("dlq", "dlq"), ("metrics-dlq", "metrics-dlq")], []),
    (("delivery", "max_inflight_bytes"), None, "MAX_INFLIGHT_BYTES", 16 * 1024 * 1024, [("4096", 4096)], ["0"]),
    (("delivery", "commit_interval_s"), None, None, 1.0, [("2", 2.0)], ["0", "nan"]),
    (("delivery", "shutdown_timeout_s"), None, "SHUTDOWN_TIMEOUT_S", 20.0, [("5", 5.0)], ["0", "inf", "-1"]),
    (("delivery", "revoke_timeout_s"), None, None, 5.0, [("0", 0.0), ("7", 7.0)], ["-1"]),
    (("delivery", "poison_after_s"), None, None, 120.0, [("0", 0.0), ("30", 30.0)], ["-1", "nan"]),
    (("metrics_port",), "--metrics-port", "METRICS_PORT", None, [("0", 0), ("9464", 9464), ("65535", 65535)],
     ["65536", "-1"]),
    (("metrics_host",), None, None, "0.0.0.0", [("127.0.0.1", "127.0.0.1"), ("::", "::")], ["not-an-ip"]),
    (("log_format",), "--log-format", "LOG_FORMAT", "text", [("text", "text"), ("json", "json")], ["xml"]),
    (("stall_timeout_s",), None, "STALL_TIMEOUT_S", 300.0, [("0", 0.0), ("60", 60.0)], ["-1", "nan"]),
]
A_YEAR_S = 366 * 24 * 3600   # "at most a year": anything well beyond it must be refused


@pytest.fixture
def bridge_command(monkeypatch):
    """`kcm bridge` up to building the Bridge: a fake one records the config it was given and returns 0."""
    import kcm_bridge.pipeline
    import kcm_cli.bridge
    from kcm_cli.main import main

    built = []

    class FakeBridge:
        stopping = False

        def __init__(self, config):
            built.append(config)

        def run(self):
            return 0

    monkeypatch.setattr(kcm_bridge.pipeline, "Bridge", FakeBridge)
    monkeypatch.setattr(kcm_bridge.pipeline, "tune_interpreter", lambda: None)
    monkeypatch.setattr(kcm_cli.bridge, "on_stop_signals", lambda stop: None)
    monkeypatch.setattr("kcm_common.logs.use_json", lambda: None)   # keep pytest's log capture as it is

    def run(argv, env, yaml_text=None, tmp_path=None):
        for name in [n for n in os.environ if n.startswith("KCM_BRIDGE_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if yaml_text is not None:
            path = tmp_path / "bridge.yaml"
            path.write_text(yaml_text)
            argv = ["--config", str(path), *argv]
        built.clear()
        code = main(["bridge", *argv])
        return code, (built[0] if built else None)

    return run


def get(config, where):
    for name in where:
        config = getattr(config, name)
    return config


def as_yaml(where, text):
    """A value as the file would hold it: lists as YAML lists, everything else as the text written, unquoted."""
    if where == ("kafka", "topics"):
        return [part.strip() for part in text.split(",")]
    return text


def nest(document, where, value):
    for name in where[:-1]:
        document = document.setdefault(name, {})
    document[where[-1]] = value


def render(document):
    """YAML with every scalar unquoted, as a person writes it (the docs: read as the text written)."""
    text = yaml.safe_dump(document, default_flow_style=False, sort_keys=False)
    return re.sub(r"'([^':\n]*)'", r"\1", text)   # '::' stays quoted: YAML needs it


def draw_case(rng):
    """Each option unset or given through any of the file, its variable and its flag; the reference value is the
    one given through the highest-precedence way, else the documented default."""
    document, env, argv, expected = {}, {}, ["--endpoint", "c:4317", "--insecure"], {}
    bootstrap = {}
    for way in ("file", "env", "flag"):
        if rng.random() < 0.5:
            bootstrap[way] = f"{way}-kafka:9092"
    bootstrap.setdefault("flag", "flag-kafka:9092")
    for way, value in bootstrap.items():
        if way == "file":
            nest(document, ("kafka", "bootstrap_servers"), value)
        elif way == "env":
            env["KCM_BRIDGE_BOOTSTRAP_SERVERS"] = value
        else:
            argv += ["--bootstrap-server", value]
    expected[("kafka", "bootstrap_servers")] = bootstrap.get("flag") or bootstrap.get("env") or bootstrap["file"]
    for where, flag, variable, default, valid, _ in OPTIONS:
        value = default
        ways = ["file"] + (["env"] if variable else []) + (["flag"] if flag else [])
        for way in ways:   # in increasing precedence
            if rng.random() >= 0.4:
                continue
            text, typed = rng.choice(valid)
            if way == "file":
                nest(document, where, as_yaml(where, text))
            elif way == "env":
                env["KCM_BRIDGE_" + variable] = text
            elif where == ("kafka", "topics"):
                for part in text.split(","):
                    argv += [flag, part.strip()]
            else:
                argv += [flag, text]
            value = typed
        expected[where] = value
    return document, env, argv, expected


def test_random_settings_from_every_source_give_the_documented_values_and_precedence(bridge_command, tmp_path):
    """Flags over variables over the file over the documented defaults, each value converted to its type."""
    rng = random.Random(SEED)
    for case in range(CASES):
        document, env, argv, expected = draw_case(rng)
        code, config = bridge_command(argv, env, render(document) if document else None, tmp_path)
        context = f"seed {SEED} case {case}: file {document} env {env} argv {argv}"
        assert code == 0 and config is not None, context
        for where, value in expected.items():
            got = get(config, where)
            assert got == value and type(got) is type(value), f"{context}: {'.'.join(where)} = {got!r}, not {value!r}"
        assert [e.endpoint for e in config.endpoints] == ["c:4317"] and config.endpoints[0].insecure, context


def invalid_cases():
    rng = random.Random(SEED + 1)
    cases = []
    for where, flag, variable, _, _, invalid in OPTIONS:
        for text in invalid:
            ways = ["file"] + (["env"] if variable else [])
            ways += ["flag"] if flag and where != ("kafka", "topics") else []
            cases.append((where, flag, variable, text, rng.choice(ways)))
    cases += [(("kafka", "connect_timeout_s"), None, None, str(A_YEAR_S * 2), "file"),
              (("delivery", "shutdown_timeout_s"), None, "SHUTDOWN_TIMEOUT_S", str(A_YEAR_S * 2), "env"),
              (("batch", "linger_ms"), None, "BATCH_LINGER_MS", str(A_YEAR_S * 2000), "env")]
    return cases


@pytest.mark.parametrize("where, flag, variable, text, way", invalid_cases(),
                         ids=lambda v: ".".join(v) if isinstance(v, tuple) else None)
def test_a_value_the_docs_refuse_stops_the_command_in_one_line_naming_the_setting(
        bridge_command, tmp_path, capsys, where, flag, variable, text, way):
    """Exit code 2, one line `kcm bridge: <setting> ...` on stderr, no traceback, whichever way it was given."""
    document, env, argv = {}, {}, ["--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"]
    if way == "file":
        nest(document, where, as_yaml(where, text))
    elif way == "env":
        env["KCM_BRIDGE_" + variable] = text
    else:
        argv += [flag, text]
    capsys.readouterr()
    try:
        code, config = bridge_command(argv, env, render(document) if document else None, tmp_path)
    except SystemExit as exc:   # argparse refuses a flag's choices itself, also with exit code 2
        code, config = exc.code, None
    err = capsys.readouterr().err
    context = f"{'.'.join(where)}={text!r} by {way}: exit {code}, stderr {err!r}"
    assert code == 2 and config is None, context
    assert "Traceback" not in err, context
    if way != "flag":
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kcm bridge: "), context
        assert ".".join(where) in lines[0], context


def test_an_unknown_key_in_the_file_is_refused_and_an_unknown_variable_is_named(bridge_command, tmp_path, capsys,
                                                                               caplog):
    """The file refuses a key that is not a setting; a misspelt KCM_BRIDGE_* variable is named in a warning."""
    argv = ["--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"]
    for text, name in [("batch:\n  max_point: 5\n", "batch.max_point"), ("kafak:\n  group_id: g\n", "kafak")]:
        capsys.readouterr()
        code, config = bridge_command(argv, {}, text, tmp_path)
        err = capsys.readouterr().err
        assert code == 2 and name in err and len(err.strip().splitlines()) == 1, err
    code, config = bridge_command(argv, {"KCM_BRIDGE_GROUPID": "x", "KCM_BRIDGE_TOKEN": "s3cr3t"}, None, tmp_path)
    assert code == 0 and config.kafka.group_id == "kcm-bridge"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "KCM_BRIDGE_GROUPID" in warned and "s3cr3t" not in warned
    caplog.clear()
    yaml_text = ("endpoints:\n  - endpoint: c:4317\n    insecure: true\n"
                 "    headers_from_env: {x-api-key: KCM_BRIDGE_TOKEN}\n")
    code, config = bridge_command(["--bootstrap-server", "k:9092"], {"KCM_BRIDGE_TOKEN": "s3cr3t"}, yaml_text, tmp_path)
    assert code == 0
    assert "KCM_BRIDGE_TOKEN" not in " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_a_secret_is_never_in_the_error_nor_the_repr_but_a_file_path_is(bridge_command, tmp_path, capsys):
    """Inline headers, properties and salts are kept out of repr; files are shown by path, never their contents."""
    token = tmp_path / "token"
    token.write_text("Bearer tok-CONTENTS\n")
    salt = tmp_path / "salt"
    salt.write_text("salt-CONTENTS\n")
    text = (f"kafka:\n  properties: {{sasl.password: pw-SECRET}}\n"
            f"endpoints:\n  - endpoint: c:4317\n    insecure: true\n    headers: {{x-key: hdr-SECRET}}\n"
            f"    headers_from_files: {{authorization: {token}}}\n"
            f"enrich:\n  rules:\n    - {{action: hash, attribute: principal, salt: salt-SECRET}}\n"
            f"    - {{action: hash, attribute: client_id, salt_file: {salt}}}\n")
    code, config = bridge_command(["--bootstrap-server", "k:9092"], {}, text, tmp_path)
    assert code == 0
    shown = repr(config) + str(config)
    for secret in ("pw-SECRET", "hdr-SECRET", "salt-SECRET", "tok-CONTENTS", "salt-CONTENTS"):
        assert secret not in shown, secret
    assert str(token) in shown and str(salt) in shown
    capsys.readouterr()
    bad = text.replace("{x-key: hdr-SECRET}", '{x-key: "hdr-SECRET\\u0001"}')
    code, _ = bridge_command(["--bootstrap-server", "k:9092"], {}, bad, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and "x-key" in err and "hdr-SECRET" not in err and "Traceback" not in err, err


def test_the_full_example_loads_and_gives_the_values_its_comments_say(tmp_path, monkeypatch):
    """docs/bridge.md's example, its file paths pointed at real files, loads with exactly the values it shows."""
    from kcm_bridge.config import load

    docs = (Path(__file__).parent.parent / "docs" / "bridge.md").read_text()
    example = docs.split("## Full example configuration", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-subj", "/CN=otel-collector.observability", "-days", "2"],
                   check=True, capture_output=True, timeout=30)
    (tmp_path / "client.properties").write_text("security.protocol=PLAINTEXT\n")
    (tmp_path / "token").write_text("Bearer abc\n")
    (tmp_path / "salt").write_text("pepper\n")
    for original, real in [("/etc/kcm/client.properties", "client.properties"), ("/etc/kcm/tls/ca.crt", "tls.crt"),
                           ("/etc/kcm/tls/tls.crt", "tls.crt"), ("/etc/kcm/tls/tls.key", "tls.key"),
                           ("/var/run/secrets/otlp/token", "token"), ("/etc/kcm/salt", "salt")]:
        assert original in example
        example = example.replace(original, str(tmp_path / real))
    path = tmp_path / "bridge.yaml"
    path.write_text(example)
    monkeypatch.setenv("OTLP_API_KEY", "key")
    config = load(path, env={})
    assert config.kafka.bootstrap_servers == "kafka-0.kafka:9093,kafka-1.kafka:9093"
    assert config.kafka.properties == {"session.timeout.ms": "10000"}
    assert config.kafka_properties() == {"security.protocol": "PLAINTEXT", "session.timeout.ms": "10000"}
    assert (config.kafka.topics, config.kafka.group_id, config.kafka.client) == (
        ["kafka-client-metrics"], "kcm-bridge", "confluent-kafka")
    assert config.kafka.connect_timeout_s == 10.0
    first, backup = config.endpoints
    assert first.endpoint == "otel-collector.observability:4317" and not first.insecure
    assert first.tls.key_file == str(key) and first.tls.cert_file == str(cert)
    assert first.headers == {"x-scope-orgid": "kafka-team"}
    assert first.headers_from_files == {"authorization": str(tmp_path / "token")}
    assert first.headers_from_env == {"x-api-key": "OTLP_API_KEY"}
    assert (first.compression, first.timeout_s, first.concurrency, first.retry_refused_credentials,
            first.balancing) == ("gzip", 10.0, 2, False, "pick_first")
    assert backup.endpoint == "backup-collector:4317" and backup.insecure
    assert config.routing == "fanout"
    assert (config.batch.max_points, config.batch.max_bytes, config.batch.linger_ms) == (8192, 2097152, 200)
    assert (config.retry.initial_backoff_s, config.retry.max_backoff_s, config.retry.multiplier,
            config.retry.jitter) == (0.5, 30, 2, 0.2)
    assert config.enrich.header_attributes is True
    assert config.enrich.static_attributes == {"kafka.cluster.name": "prod-eu-1"}
    assert [(r.action, r.attribute, r.to) for r in config.enrich.rules] == [
        ("drop", "client_source_address", None), ("hash", "principal", None),
        ("rename", "client_id", "kafka.client.id")]
    assert config.enrich.rules[1].salt_file == str(tmp_path / "salt")
    assert (config.temporality.delta_to_cumulative, config.temporality.max_streams,
            config.temporality.idle_expiry_s) == (False, 100000, 600)
    d = config.delivery
    assert (d.max_inflight_bytes, d.commit_interval_s, d.shutdown_timeout_s, d.revoke_timeout_s,
            d.dead_letter_topic, d.poison_after_s) == (16777216, 1, 20, 5, "kafka-client-metrics-dlq", 120)
    assert (config.metrics_port, config.metrics_host, config.log_format, config.stall_timeout_s) == (
        9464, "0.0.0.0", "text", 300)
    # and the example's values are the documented defaults where a default exists
    from kcm_bridge.config import BridgeConfig
    defaults = BridgeConfig()
    assert (defaults.batch, defaults.temporality, defaults.routing, defaults.log_format, defaults.stall_timeout_s) == (
        config.batch, config.temporality, config.routing, config.log_format, config.stall_timeout_s)


@pytest.mark.parametrize("where", [option[0] for option in OPTIONS], ids=lambda w: ".".join(w))
def test_null_in_the_file_is_unset_only_where_the_setting_may_be_unset(bridge_command, tmp_path, capsys, where):
    """`metrics_port` and `delivery.dead_letter_topic` may be null (their default); any other setting given null
    stops the command naming it, as does its section left empty."""
    argv = ["--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"]
    default = next(option[3] for option in OPTIONS if option[0] == where)
    for text in ("null", "~"):
        document = {}
        nest(document, where, None)
        capsys.readouterr()
        code, config = bridge_command(argv, {}, render(document).replace("null", text), tmp_path)
        err = capsys.readouterr().err
        if default is None:
            assert code == 0 and get(config, where) is None, err
        else:
            assert code == 2 and ".".join(where) in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("section, env", [
    ("batch", {}), ("retry", {}), ("temporality", {}), ("delivery", {}), ("enrich", {}),
    ("kafka", {}), ("batch", {"KCM_BRIDGE_BATCH_MAX_POINTS": "5"}),
], ids=["batch", "retry", "temporality", "delivery", "enrich", "kafka-with-bootstrap-flag", "batch-with-variable"])
def test_a_section_left_empty_is_refused_naming_it(bridge_command, tmp_path, capsys, section, env):
    """`batch:` with nothing under it stops the command naming the section, whatever a flag or variable sets in it."""
    capsys.readouterr()
    code, _ = bridge_command(["--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"], env,
                             f"{section}:\n", tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and section in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, env, text, field", [
    (["--dead-letter-topic", "m1", "--topic", "m1"], {}, None, "delivery.dead_letter_topic"),
    ([], {"KCM_BRIDGE_TOPICS": "a,b", "KCM_BRIDGE_DEAD_LETTER_TOPIC": "b"}, None, "delivery.dead_letter_topic"),
    ([], {}, "retry:\n  initial_backoff_s: 5\n  max_backoff_s: 1\n", "retry.max_backoff_s"),
    (["--endpoint", "C:04317"], {}, None, "endpoints[1]"),
    ([], {"KCM_BRIDGE_ENDPOINTS": "http://d:4317"}, None, "endpoints[0]"),
    ([], {"KCM_BRIDGE_ENDPOINTS": "dns:///d:4317"}, None, "endpoints[0]"),
    ([], {"KCM_BRIDGE_TOPICS": "a,a"}, None, "kafka.topics"),
    ([], {"KCM_BRIDGE_INSECURE": "sometimes"}, None, "insecure"),
], ids=["dlq-is-a-topic-by-flags", "dlq-is-a-topic-by-env", "max-below-initial-backoff", "collector-twice",
        "http-endpoint", "resolver-prefix", "topic-twice", "insecure-not-a-boolean"])
def test_settings_that_contradict_each_other_are_refused_naming_the_field(bridge_command, tmp_path, capsys, argv,
                                                                          env, text, field):
    """The cross-field rules of the docs' Quick start, each one line with exit code 2."""
    base = ["--bootstrap-server", "k:9092"] + ([] if "KCM_BRIDGE_INSECURE" in env else ["--insecure"])
    base += [] if "KCM_BRIDGE_ENDPOINTS" in env else ["--endpoint", "c:4317"]
    capsys.readouterr()
    code, config = bridge_command(base + argv, env, text, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and config is None and field in err and len(err.strip().splitlines()) == 1, err


def test_endpoints_from_the_environment_replace_the_file_and_flags_replace_both(bridge_command, tmp_path):
    """`--endpoint` over KCM_BRIDGE_ENDPOINTS over the file's list; --insecure/KCM_BRIDGE_INSECURE apply to all."""
    text = "endpoints:\n  - endpoint: file:4317\n    insecure: true\n"
    code, config = bridge_command(["--bootstrap-server", "k:9092"], {}, text, tmp_path)
    assert code == 0 and [e.endpoint for e in config.endpoints] == ["file:4317"]
    env = {"KCM_BRIDGE_ENDPOINTS": "e1:4317, e2:4317", "KCM_BRIDGE_INSECURE": "yes"}
    code, config = bridge_command(["--bootstrap-server", "k:9092"], env, text, tmp_path)
    assert code == 0 and [(e.endpoint, e.insecure) for e in config.endpoints] == [("e1:4317", True), ("e2:4317", True)]
    code, config = bridge_command(["--bootstrap-server", "k:9092", "--endpoint", "f:4317", "--insecure"], env, text,
                                  tmp_path)
    assert code == 0 and [(e.endpoint, e.insecure) for e in config.endpoints] == [("f:4317", True)]


# An endpoint's own options (file only): name -> (default, valid (text, value) pairs, invalid texts).
ENDPOINT_OPTIONS = {
    "compression": ("gzip", [("gzip", "gzip"), ("none", "none")], ["zstd", "GZIP"]),
    "timeout_s": (10.0, [("1", 1.0), ("2.5", 2.5)], ["0", "nan", "-1"]),
    "concurrency": (2, [("1", 1), ("64", 64), ("7", 7)], ["0", "65", "1.5"]),
    "retry_refused_credentials": (False, [("true", True), ("on", True), ("no", False)], ["maybe"]),
    "balancing": ("pick_first", [("pick_first", "pick_first"), ("round_robin", "round_robin")],
                  ["roundrobin", "ROUND_ROBIN", "least_request"]),
}


def test_random_endpoint_options_in_the_file_give_the_documented_values_or_a_one_line_error(bridge_command,
                                                                                            tmp_path, capsys):
    """Each endpoint option unset (its default), valid, or (one at a time) invalid: refused naming endpoints[i]."""
    rng = random.Random(SEED + 2)
    for case in range(40):
        entries, expected, bad = [], [], None
        for index in range(rng.randint(1, 3)):
            entry, values = {"endpoint": f"c{index}:4317", "insecure": "true"}, {}
            for name, (default, valid, invalid) in ENDPOINT_OPTIONS.items():
                values[name] = default
                if rng.random() < 0.5:
                    entry[name], values[name] = rng.choice(valid)
                elif bad is None and rng.random() < 0.1:
                    entry[name], bad = rng.choice(invalid), f"endpoints[{index}].{name}"
            entries.append(entry)
            expected.append(values)
        capsys.readouterr()
        code, config = bridge_command(["--bootstrap-server", "k:9092"], {}, render({"endpoints": entries}), tmp_path)
        err = capsys.readouterr().err
        context = f"seed {SEED + 2} case {case}: {entries}: exit {code} {err!r}"
        if bad:
            assert code == 2 and bad in err and len(err.strip().splitlines()) == 1, context
            continue
        assert code == 0, context
        for endpoint, values in zip(config.endpoints, expected, strict=True):
            assert endpoint.insecure is True, context
            for name, value in values.items():
                got = getattr(endpoint, name)
                assert got == value and type(got) is type(value), f"{context}: {name} = {got!r}"
