"""Model-based test of the options of `kcm operator`, `kcm sandbox`, `kcm rollup` and `kcm tail`: seeded random valid
combinations run through `kcm_cli.main.main` up to the heavy part (kopf.run, the sandbox's broker, the Spark session,
the Kafka consumer), each replaced by a recorder, and what it was given checked field by field against a reference
written from docs/operator.md (Options, Two replicas), docs/sandbox.md (options table), docs/rollups.md (options
table, OTLP export) and docs/tail.md (options table), with docs/kafka-clients.md for `--bootstrap-server` and
`--command-config`: each option's typed value or documented default, the documented environment (`POD_ID`,
`KUBECONFIG`, spark-submit's gateway). Every invalid value (bad number, out of range, unknown choice, conflicting or
missing companion option, missing or wrong file) must stop the command before the heavy part with exit code 2 and one
line on stderr naming the option, no traceback; secrets in files are never echoed."""

from __future__ import annotations

import json
import logging
import random
import socket
import subprocess
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from kcm_operator.handlers import HANDLER_THREADS
from ports import reserved_port

SEED = 714
CASES = 60
DEFAULT_TOPIC = "kafka-client-metrics"


# --- shared -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def kcm(monkeypatch, capsys):
    """`kcm ARGV` in this process: (exit code, stdout, stderr, the log level configured). argparse's own refusals
    (SystemExit) count as the exit code they carry."""
    from kcm_cli.main import main

    levels: list[str] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: levels.append(kwargs["level"]))
    for name in ("POD_ID", "PYSPARK_GATEWAY_PORT", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    saved = {name: logging.getLogger(name).level for name in ("kafka", "py4j")}

    def run(argv, env=None):
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        levels.clear()
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        for name, value in (env or {}).items():
            monkeypatch.delenv(name)
        return code, out, err, (levels[0] if levels else None)

    yield run
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def assert_refused(code, err, names, context):
    """Exit code 2, one line on stderr naming each of `names`, no traceback."""
    lines = err.strip().splitlines()
    assert code == 2, f"{context}: exit {code}, stderr {err!r}"
    assert "Traceback" not in err and len(lines) == 1, f"{context}: stderr {err!r}"
    for name in names:
        assert name in lines[0], f"{context}: {name!r} not in {lines[0]!r}"


def with_log_level(rng, command, argv):
    """`--log-level LEVEL` before or after the command, or none (INFO): the level and the argv."""
    if rng.random() < 0.5:
        return "INFO", [command, *argv]
    level = rng.choice(["DEBUG", "INFO", "WARNING", "ERROR"])
    if rng.random() < 0.5:
        return level, ["--log-level", level, command, *argv]
    return level, [command, *argv, "--log-level", level]


def client_config(rng, tmp_path, case):
    """Maybe a `--command-config` file with a client id: (argv, the properties it should give)."""
    if rng.random() < 0.5:
        return [], {}
    path = tmp_path / f"client-{case}.properties"
    path.write_text(f"# case {case}\nclient.id = kcm-{case}\n")
    return ["--command-config", str(path)], {"client.id": f"kcm-{case}"}


BOOTSTRAPS = ["kafka:9092", "127.0.0.1:9092", "kafka-0.kafka:9093,kafka-1.kafka:9093", "[::1]:9092"]
TOPICS = ["m1", "a.b_c-D", "x" * 249, "telemetry"]


# --- kcm operator -----------------------------------------------------------------------------------------------------

@pytest.fixture
def operator(kcm, kopf_runs, monkeypatch):
    """`kcm operator` up to kopf.run (conftest's kopf_runs); the endpoints, the JSON switch and the operator's config
    recorded rather than served: (run(argv, env) -> code, out, err, level, seen) with seen a dict."""
    import prometheus_client

    import kcm_cli.operator
    import kcm_common.logs
    import kcm_operator.handlers

    seen: dict = {}
    real_config = kcm_operator.handlers.OperatorConfig

    def config(*args, **kwargs):
        seen["config"] = real_config(*args, **kwargs)
        return seen["config"]

    monkeypatch.setattr(kcm_operator.handlers, "OperatorConfig", config)
    monkeypatch.setattr(prometheus_client, "start_http_server",
                        lambda port, **kw: seen.setdefault("metrics", []).append((port, kw.get("addr"))))
    monkeypatch.setattr(kcm_cli.operator, "_check_free",
                        lambda option, address, port: seen.setdefault("probed", []).append((option, str(address),
                                                                                            port)))
    monkeypatch.setattr(kcm_common.logs, "use_json", lambda: seen.__setitem__("json", True))

    def run(argv, env=None):
        seen.clear()
        kopf_runs.clear()
        code, out, err, level = kcm(argv, env)
        if kopf_runs:
            seen["kopf"] = kopf_runs[0]
        return code, out, err, level, seen

    return run


def draw_operator(rng, tmp_path, case):
    """A valid-looking operator command line and what the docs say it means (or the errors it may stop with)."""
    argv, expected, errors = [], {}, []
    if rng.random() < 0.3:
        argv.append(rng.choice(["-A", "--all-namespaces"]))
        expected["namespaces"], expected["clusterwide"] = [], True
    else:
        names = rng.sample(["payments", "team-*", "kcm", "default"], rng.randint(1, 3))
        for name in names:
            argv += [rng.choice(["-n", "--namespace"]), name]
        expected["namespaces"], expected["clusterwide"] = names, False
    bootstrap = rng.choice(BOOTSTRAPS)
    argv += ["--bootstrap-server", bootstrap]
    config_argv, properties = client_config(rng, tmp_path, case)
    argv += config_argv
    expected["bootstrap"], expected["properties"] = bootstrap, properties
    expected["drift"] = 60.0
    if rng.random() < 0.5:
        text, expected["drift"] = rng.choice([("1", 1.0), ("2.5", 2.5), ("60", 60.0), ("3600", 3600.0)])
        argv += ["--drift-interval", text]
    ports = {}
    for option, default, pool in (("--metrics-port", 9090, [0, 1, 8080, 9090, 30001, 65535]),
                                  ("--liveness-port", 8080, [0, 8080, 9090, 30002, 65535])):
        ports[option] = default
        if rng.random() < 0.6:
            ports[option] = rng.choice(pool)
            argv += [option, str(ports[option])]
    expected["metrics_port"], expected["liveness_port"] = ports["--metrics-port"], ports["--liveness-port"]
    if ports["--metrics-port"] and ports["--metrics-port"] == ports["--liveness-port"]:
        errors.append(("--metrics-port", "--liveness-port"))
    expected["address"] = "0.0.0.0"
    if rng.random() < 0.5:
        expected["address"] = rng.choice(["127.0.0.1", "::1", "::", "0.0.0.0", "10.1.2.3"])
        argv += ["--listen-address", expected["address"]]
    expected["json"] = False
    if rng.random() < 0.4:
        form = rng.choice(["text", "json"])
        expected["json"] = form == "json"
        argv += ["--log-format", form]
    expected["standalone"] = rng.random() < 0.3
    argv += ["--standalone"] if expected["standalone"] else []
    expected["peering_name"] = None
    if rng.random() < 0.3:
        expected["peering_name"] = rng.choice(["kcm", "kcm-operator.peers", "a" * 253, "r1"])
        argv += ["--peering-name", expected["peering_name"]]
        if expected["standalone"]:
            errors.append(("--peering-name", "--standalone"))
    expected["priority"] = None
    if rng.random() < 0.4:
        expected["priority"] = rng.choice([0, 7, 100, 1_000_000])
        argv += ["--priority", str(expected["priority"])]
    expected["lifetime"] = 60
    if rng.random() < 0.4:
        expected["lifetime"] = rng.choice([1, 3, 600, 86400])
        argv += ["--peering-lifetime", str(expected["lifetime"])]
    expected["pod_id"] = rng.choice([None, f"kcm-operator-{case}"])
    level, argv = with_log_level(rng, "operator", argv)
    expected["level"] = level
    return argv, expected, errors


def url(address, port):
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/healthz"


def test_random_operator_options_reach_kopf_as_documented(operator, tmp_path):
    """Scope, default cluster, drift interval, endpoints, log format and level, peering: each as given, else the
    documented default; `POD_ID` names the replica."""
    rng = random.Random(SEED)
    refused = 0
    for case in range(CASES):
        argv, want, errors = draw_operator(rng, tmp_path, case)
        env = {"POD_ID": want["pod_id"]} if want["pod_id"] else {}
        code, out, err, level, seen = operator(argv, env)
        context = f"seed {SEED} case {case}: kcm {' '.join(argv)} env {env}"
        if errors:
            refused += 1
            assert_refused(code, err, (), context)
            assert any(all(name in err for name in names) for names in errors), f"{context}: {err!r}"
            assert "kopf" not in seen and "metrics" not in seen, context
            continue
        assert code == 0 and "kopf" in seen, f"{context}: exit {code}, stderr {err!r}"
        kopf = seen["kopf"]
        assert level == want["level"], context
        assert (list(kopf["namespaces"]), kopf["clusterwide"]) == (want["namespaces"], want["clusterwide"]), context
        config = seen["config"]
        assert config.settings.bootstrap_servers == want["bootstrap"], context
        assert config.settings.properties == want["properties"], context
        assert config.drift_interval_s == want["drift"] and isinstance(config.drift_interval_s, float), context
        # The Kubernetes client reading KafkaConnections pools a connection for every handler thread.
        pooled = config.resolve.__self__._core.api_client.configuration.connection_pool_maxsize
        assert pooled == HANDLER_THREADS, context
        metrics = [(want["metrics_port"], want["address"])] if want["metrics_port"] else []
        assert seen.get("metrics", []) == metrics, context
        probed = [("--liveness-port", want["address"], want["liveness_port"])] if want["liveness_port"] else []
        assert seen.get("probed", []) == probed, context
        assert kopf["liveness_endpoint"] == (url(want["address"], want["liveness_port"])
                                             if want["liveness_port"] else None), context
        assert seen.get("json", False) == want["json"], context
        assert kopf["standalone"] is (True if want["standalone"] else None), context
        assert kopf["peering_name"] == want["peering_name"], context
        if want["priority"] is None:
            assert type(kopf["priority"]) is int, context   # random
        else:
            assert kopf["priority"] == want["priority"], context
        assert kopf["settings"].peering.lifetime == want["lifetime"], context
        if want["pod_id"]:
            assert kopf["identity"] == want["pod_id"], context
        else:
            assert isinstance(kopf["identity"], str) and kopf["identity"], context
    assert 0 < refused < CASES // 2   # the draw reaches both sides of the model


def test_operator_priority_is_random_when_not_given(operator):
    """Equal priorities make every replica pause, hence a random default: two starts rarely agree."""
    priorities = set()
    for _ in range(5):
        code, _, err, _, seen = operator(["operator", "-A", "--bootstrap-server", "k:9092"])
        assert code == 0, err
        priorities.add(seen["kopf"]["priority"])
    assert len(priorities) > 1


OPERATOR_BASE = ["-n", "team", "--bootstrap-server", "k:9092"]


@pytest.mark.parametrize("argv, names", [
    (["--bootstrap-server", "k:9092"], ["--namespace", "--all-namespaces"]),
    (["-n", "a", "-A", "--bootstrap-server", "k:9092"], ["--all-namespaces", "--namespace"]),
    (["-n", "a"], ["--bootstrap-server"]),
    (["-n", "a", "--bootstrap-server", "kafka"], ["bootstrap server", "'kafka'"]),
    (["-n", "a", "--bootstrap-server", "kafka:0"], ["bootstrap server", "'kafka:0'"]),
    *[([*OPERATOR_BASE, "--drift-interval", v], ["--drift-interval"]) for v in ("0.5", "0", "-1", "nan", "inf",
                                                                              "soon")],
    *[([*OPERATOR_BASE, option, v], [option]) for option in ("--metrics-port", "--liveness-port")
      for v in ("65536", "-1", "http")],
    ([*OPERATOR_BASE, "--metrics-port", "9100", "--liveness-port", "9100"], ["--metrics-port", "--liveness-port"]),
    ([*OPERATOR_BASE, "--metrics-port", "8080"], ["--metrics-port", "--liveness-port"]),
    *[([*OPERATOR_BASE, "--listen-address", v], ["--listen-address"])
      for v in ("localhost", "999.1.1.1", "0.0.0.0:80")],
    ([*OPERATOR_BASE, "--log-format", "xml"], ["--log-format"]),
    ([*OPERATOR_BASE, "--log-level", "LOUD"], ["--log-level"]),
    *[([*OPERATOR_BASE, "--peering-name", v], ["--peering-name"]) for v in ("Kcm", "kcm_peers", "a" * 254, "-kcm",
                                                                            "kcm.")],
    ([*OPERATOR_BASE, "--peering-name", "kcm", "--standalone"], ["--peering-name", "--standalone"]),
    *[([*OPERATOR_BASE, "--priority", v], ["--priority"]) for v in ("1.5", "high")],
    *[([*OPERATOR_BASE, "--peering-lifetime", v], ["--peering-lifetime"]) for v in ("0", "86401", "1.5", "-3")],
], ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_an_operator_option_the_docs_refuse_is_one_line_and_exit_2(operator, argv, names):
    code, _, err, _, seen = operator(["operator", *argv])
    assert_refused(code, err, names, " ".join(argv))
    assert "kopf" not in seen and "metrics" not in seen and "probed" not in seen


def test_operator_log_level_is_taken_before_or_after_the_command(operator):
    for argv in (["--log-level", "WARNING", "operator", *OPERATOR_BASE], ["operator", *OPERATOR_BASE, "--log-level",
                                                                           "WARNING"]):
        code, _, err, level, _ = operator(argv)
        assert code == 0 and level == "WARNING", err
    code, _, err, _, _ = operator(["--log-level", "LOUD", "operator", *OPERATOR_BASE])
    assert_refused(code, err, ["--log-level"], "before")


def test_operator_ports_that_cannot_be_listened_on_are_named(kcm, kopf_runs, monkeypatch):
    """A port in use stops the operator naming `--metrics-port` or `--liveness-port` (real binds, on loopback)."""
    import kcm_common.logs

    monkeypatch.setattr(kcm_common.logs, "use_json", lambda: None)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        for option, other in (("--liveness-port", "--metrics-port"), ("--metrics-port", "--liveness-port")):
            code, _, err, _ = kcm(["operator", *OPERATOR_BASE, "--listen-address", "127.0.0.1", option, port,
                                   other, "0"])
            assert_refused(code, err, [option, port], option)
    assert kopf_runs == []


@pytest.mark.parametrize("content", [None, "clusters: [\n  - {name: a\n", "\xff\xfe not utf-8"],
                         ids=["missing", "not-yaml", "not-utf8"])
def test_operator_without_a_usable_kubeconfig_is_one_line_and_exit_2(kcm, monkeypatch, tmp_path, content):
    """No service account and KUBECONFIG missing or unreadable: one line, exit code 2, kopf never started."""
    import kopf

    runs = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: runs.append(kwargs))
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_bytes(content.encode("latin-1"))
    code, _, err, _ = kcm(["operator", *OPERATOR_BASE, "--metrics-port", "0", "--liveness-port", "0"],
                          {"KUBECONFIG": str(path)})
    assert_refused(code, err, ["kubeconfig" if content else "Kubernetes"], str(content))
    assert runs == []


# --- kcm sandbox ------------------------------------------------------------------------------------------------------

COMPRESSION_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}   # KIP-714's ids (docs/contract.md, DESIGN)


@pytest.fixture
def sandbox(kcm, monkeypatch):
    """`kcm sandbox` with a Sandbox that records its options and stops at once (a SIGTERM right after start), the
    upstream probe and the Java build recorded: run(argv) -> code, out, err, level, seen."""
    import kcm_cli.sandbox
    import kcm_sandbox.java_receiver
    import kcm_sandbox.runner

    seen: dict = {}

    class Sandbox:
        bootstrap = "127.0.0.1:1"

        def __init__(self, options):
            self.options = seen["options"] = options

        def start(self):
            seen["started"] = True

        def problem(self):
            return None

        def stop(self):
            seen["stopped"] = True

    monkeypatch.setattr(kcm_sandbox.runner, "Sandbox", Sandbox)
    monkeypatch.setattr(kcm_cli.sandbox, "on_stop_signals", lambda handler: handler(None))
    monkeypatch.setattr(kcm_cli.sandbox, "check_reachable",
                        lambda settings, timeout: seen.setdefault("probed", []).append(settings.bootstrap_servers))
    monkeypatch.setattr(kcm_sandbox.java_receiver, "ensure_built", lambda: seen.__setitem__("built", True))

    def run(argv, env=None):
        seen.clear()
        return (*kcm(argv, env), seen)

    return run


def draw_sandbox(rng, tmp_path, case):
    argv, want, errors = [], {}, []
    want["listen"] = ("127.0.0.1", 9092)
    if rng.random() < 0.5:
        text = rng.choice(["127.0.0.1:0", "127.0.0.2:19092", "localhost:9092", "127.0.0.1:65535"])
        host, port = text.rsplit(":", 1)
        want["listen"] = (host, int(port))
        argv += ["--listen", text]
    want["topic"] = DEFAULT_TOPIC
    if rng.random() < 0.4:
        want["topic"] = rng.choice(TOPICS)
        argv += ["--topic", want["topic"]]
    want["partitions"] = 1
    if rng.random() < 0.4:
        want["partitions"] = rng.choice([1, 3, 10000])
        argv += ["--partitions", str(want["partitions"])]
    want["compression"] = [4, 3, 1, 2]   # zstd,lz4,gzip,snappy
    if rng.random() < 0.5:
        names = rng.sample(list(COMPRESSION_IDS), rng.randint(1, 4))
        want["compression"] = [COMPRESSION_IDS[name] for name in names]
        argv += ["--compression", rng.choice([",", ", "]).join(names)]
    want["max_bytes"] = 1048576
    if rng.random() < 0.4:
        want["max_bytes"] = rng.choice([1, 1048576, 268435456, 268435457, 2147483647])
        argv += ["--telemetry-max-bytes", str(want["max_bytes"])]
    want["idle_ms"] = 600000
    if rng.random() < 0.4:
        want["idle_ms"] = rng.choice([1, 1000, 300 * 86400 * 1000])
        argv += ["--connections-max-idle-ms", str(want["idle_ms"])]
    want["receiver"] = "python"
    if rng.random() < 0.5:
        want["receiver"] = rng.choice(["python", "java"])
        argv += ["--receiver", want["receiver"]]
    want["receiver_api"] = "4.2"
    if rng.random() < 0.3:
        want["receiver_api"] = rng.choice(["3.8", "4.2"])
        argv += ["--receiver-api", want["receiver_api"]]
        if want["receiver"] != "java":
            errors.append(("--receiver-api", "--receiver java"))
    if want["receiver"] == "java" and want["max_bytes"] > 268435456:
        errors.append(("--telemetry-max-bytes", "268435456"))
    want["state"] = None
    if rng.random() < 0.3:
        want["state"] = tmp_path / f"state-{case}.json"
        argv += ["--state", str(want["state"])]
    want["upstream"] = None
    if rng.random() < 0.3:
        want["upstream"] = ("127.0.0.1", rng.choice([9093, 19092]))
        argv += ["--upstream", "%s:%d" % want["upstream"]]
    level, argv = with_log_level(rng, "sandbox", argv)
    want["level"] = level
    return argv, want, errors


def test_random_sandbox_options_give_the_documented_sandbox_options(sandbox, tmp_path):
    """Each option as given, else its documented default; Java's own bound on pushes; --receiver-api needs java."""
    rng = random.Random(SEED + 1)
    refused = 0
    for case in range(CASES):
        argv, want, errors = draw_sandbox(rng, tmp_path, case)
        code, out, err, level, seen = sandbox(argv)
        context = f"seed {SEED + 1} case {case}: kcm {' '.join(argv)}"
        if errors:
            refused += 1
            assert_refused(code, err, (), context)
            assert any(all(name in err for name in names) for names in errors), f"{context}: {err!r}"
            assert "options" not in seen and "built" not in seen and "probed" not in seen, context
            continue
        assert code == 0 and seen.get("started") and seen.get("stopped"), f"{context}: exit {code} {err!r}"
        options = seen["options"]
        assert level == want["level"], context
        assert tuple(options.listen) == want["listen"], context
        assert options.topic == want["topic"], context
        assert options.partitions == want["partitions"], context
        assert list(options.compression) == want["compression"], context
        assert options.telemetry_max_bytes == want["max_bytes"], context
        assert options.connections_max_idle_ms == want["idle_ms"], context
        assert (options.receiver, options.receiver_api) == (want["receiver"], want["receiver_api"]), context
        assert options.state == want["state"], context
        assert (tuple(options.upstream) if options.upstream else None) == want["upstream"], context
        assert seen.get("probed", []) == (["%s:%d" % want["upstream"]] if want["upstream"] else []), context
        assert seen.get("built", False) == (want["receiver"] == "java"), context
        assert "kcm sandbox: bootstrap" in out, context
    assert 0 < refused < CASES // 2


@pytest.mark.parametrize("argv, names", [
    *[(["--listen", v], ["--listen"]) for v in ("0.0.0.0:9092", "0:9092", "127.0.0.1", "127.0.0.1:99999", ":9092",
                                                "[::1]:9092", "127.0.0.1:abc", "127.0.0.1:٣")],
    *[(["--topic", v], ["--topic"]) for v in ("bad topic", ".", "..", "x" * 250, "t/1")],
    *[(["--partitions", v], ["--partitions"]) for v in ("0", "10001", "-1", "two")],
    *[(["--compression", v], ["compression"]) for v in ("brotli", "zstd,foo", "zstd,,lz4")],
    *[(["--telemetry-max-bytes", v], ["--telemetry-max-bytes"]) for v in ("0", "2147483648", "1MB")],
    (["--telemetry-max-bytes", "268435457", "--receiver", "java"], ["--telemetry-max-bytes", "--receiver java"]),
    *[(["--connections-max-idle-ms", v], ["--connections-max-idle-ms"]) for v in ("0", str(400 * 86400 * 1000),
                                                                                 "-5", "10s")],
    (["--receiver", "kotlin"], ["--receiver"]),
    (["--receiver-api", "4.0", "--receiver", "java"], ["--receiver-api"]),
    (["--receiver-api", "3.8"], ["--receiver-api", "--receiver java"]),
    *[(["--upstream", v], ["--upstream"]) for v in ("nohost", "127.0.0.1:70000", "[::1]:9092")],
    (["--log-level", "LOUD"], ["--log-level"]),
], ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_a_sandbox_option_the_docs_refuse_is_one_line_and_exit_2(sandbox, argv, names):
    code, _, err, _, seen = sandbox(["sandbox", *argv])
    assert_refused(code, err, names, " ".join(argv))
    assert "options" not in seen and "built" not in seen and "probed" not in seen


@pytest.fixture
def real_sandbox_start(kcm, monkeypatch):
    """`kcm sandbox` with the real Sandbox up to its broker, which must never start here."""
    import kcm_cli.sandbox
    import kcm_sandbox.runner

    def no_broker(*args, **kwargs):
        raise AssertionError("the embedded broker was started")

    monkeypatch.setattr(kcm_sandbox.runner, "EmbeddedBroker", no_broker)
    monkeypatch.setattr(kcm_cli.sandbox, "on_stop_signals", lambda handler: None)
    return kcm


def test_a_sandbox_state_file_it_cannot_use_or_a_port_in_use_is_one_line_and_exit_2(real_sandbox_start, tmp_path):
    """A corrupt state file, a --state path that cannot be written and a port in use: named, before any broker."""
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for state in (corrupt, blocker / "state.json"):
        code, _, err, _ = real_sandbox_start(["sandbox", "--listen", "127.0.0.1:0", "--state", str(state)])
        assert_refused(code, err, [str(state)], str(state))
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        code, _, err, _ = real_sandbox_start(["sandbox", "--listen", f"127.0.0.1:{port}"])
        assert_refused(code, err, ["--listen", str(port)], "port in use")


# --- kcm tail ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def tail(kcm, monkeypatch):
    """`kcm tail` with the consumer replaced by a recorder that yields no record: run(argv) -> code, out, err,
    level, seen."""
    import kcm_cli.tail

    seen: dict = {}

    class Consumer:
        def close(self):
            seen["closed"] = True

    def open_consumer(args, settings):
        seen["args"], seen["settings"] = args, settings
        return Consumer()

    monkeypatch.setattr(kcm_cli.tail, "_open_consumer", open_consumer)
    monkeypatch.setattr(kcm_cli.tail, "_consume", lambda consumer, args, settings, stopping: iter(()))

    def run(argv, env=None):
        seen.clear()
        return (*kcm(argv, env), seen)

    return run


def draw_tail(rng, tmp_path, case):
    bootstrap = rng.choice(BOOTSTRAPS)
    argv = ["--bootstrap-server", bootstrap]
    config_argv, properties = client_config(rng, tmp_path, case)
    argv += config_argv
    want = {"bootstrap": bootstrap, "properties": properties, "topic": DEFAULT_TOPIC, "from_beginning": False,
            "max_records": None, "timeout": None, "output": "table", "connect_timeout": 10.0}
    if rng.random() < 0.4:
        want["topic"] = rng.choice(TOPICS)
        argv += ["--topic", want["topic"]]
    if rng.random() < 0.4:
        want["from_beginning"] = True
        argv.append("--from-beginning")
    if rng.random() < 0.4:
        want["max_records"] = rng.choice([1, 5, 1000])
        argv += ["--max-records", str(want["max_records"])]
    if rng.random() < 0.4:
        text, want["timeout"] = rng.choice([("0.5", 0.5), ("3", 3.0), ("86400", 86400.0), ("1e-3", 0.001)])
        argv += ["--timeout", text]
    if rng.random() < 0.5:
        want["output"] = rng.choice(["table", "jsonl"])
        argv += ["--output", want["output"]]
    if rng.random() < 0.4:
        text, want["connect_timeout"] = rng.choice([("0.1", 0.1), ("5", 5.0), ("30", 30.0)])
        argv += ["--connect-timeout", text]
    rng.shuffle(pairs := [argv[i:i + 2] if not argv[i] == "--from-beginning" else [argv[i]]
                          for i in _option_starts(argv)])
    argv = [word for pair in pairs for word in pair]
    level, argv = with_log_level(rng, "tail", argv)
    want["level"] = level
    return argv, want


def _option_starts(argv):
    starts, i = [], 0
    while i < len(argv):
        starts.append(i)
        i += 1 if argv[i] == "--from-beginning" else 2
    return starts


def test_random_tail_options_give_the_documented_values(tail, tmp_path):
    """Each option as given (in any order), else its documented default; `table` prints a header first, `jsonl`
    nothing but records."""
    rng = random.Random(SEED + 2)
    for case in range(CASES):
        argv, want = draw_tail(rng, tmp_path, case)
        code, out, err, level, seen = tail(argv)
        context = f"seed {SEED + 2} case {case}: kcm {' '.join(argv)}"
        assert code == 0 and "args" in seen and seen.get("closed"), f"{context}: exit {code} {err!r}"
        args, settings = seen["args"], seen["settings"]
        assert level == want["level"], context
        assert (settings.bootstrap_servers, settings.properties) == (want["bootstrap"], want["properties"]), context
        assert args.topic == want["topic"] and args.from_beginning is want["from_beginning"], context
        assert args.max_records == want["max_records"], context
        assert args.timeout == want["timeout"] and args.connect_timeout == want["connect_timeout"], context
        assert type(args.connect_timeout) is float, context
        assert args.output == want["output"], context
        if want["output"] == "table":
            assert out.splitlines()[0].split()[:2] == ["CLIENT", "ID"], context
        else:
            assert out == "", context


@pytest.mark.parametrize("argv, names", [
    (["--topic", "m"], ["--bootstrap-server"]),
    (["--bootstrap-server", "k"], ["bootstrap server", "'k'"]),
    (["--bootstrap-server", "k:65536"], ["bootstrap server", "'k:65536'"]),
    (["--bootstrap-server", "k:9092", "--bootstrap-server", ""], ["--bootstrap-server"]),
    *[(["--bootstrap-server", "k:9092", option, v], [option]) for option in ("--timeout", "--connect-timeout")
      for v in ("0", "-1", "nan", "inf", "soon")],
    *[(["--bootstrap-server", "k:9092", "--max-records", v], ["--max-records"]) for v in ("0", "-1", "1.5", "all")],
    (["--bootstrap-server", "k:9092", "--output", "csv"], ["--output"]),
    *[(["--bootstrap-server", "k:9092", "--topic", v], ["--topic"]) for v in ("bad topic", ".", "..", "x" * 250)],
    (["--bootstrap-server", "k:9092", "--log-level", "LOUD"], ["--log-level"]),
], ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_a_tail_option_the_docs_refuse_is_one_line_and_exit_2(tail, argv, names):
    code, _, err, _, seen = tail(["tail", *argv])
    assert_refused(code, err, names, " ".join(argv))
    assert "args" not in seen


def test_tail_takes_request_timeout_from_201_to_539999_ms(kcm, monkeypatch, tmp_path):
    """docs/kafka-clients.md: tail's consumer takes `request.timeout.ms` 201..539999; outside, one line naming it
    (inside, the start goes on to reach Kafka: here nothing listens, so the line is about reaching it)."""
    import kcm_cli.tail

    monkeypatch.setattr(kcm_cli.tail, "check_reachable", lambda settings, timeout_s: None)
    path = tmp_path / "client.properties"
    with reserved_port() as port:
        for value, named in ((100, True), (200, True), (540000, True), (201, False), (539999, False)):
            path.write_text(f"request.timeout.ms={value}\n")
            code, _, err, _ = kcm(["tail", "--bootstrap-server", f"127.0.0.1:{port}", "--command-config", str(path),
                                   "--connect-timeout", "0.3"])
            assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (value, err)
            # In the docs' words: the property's Kafka name and the range, not kafka-python's option names.
            assert (f"request.timeout.ms {value} is outside what kcm tail takes, 201 to 539999" in err) is named, err
            assert "request_timeout_ms" not in err and "fetch_max_wait_ms" not in err, err


# --- kcm rollup -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    """A self-signed certificate and its unencrypted PKCS#8 key (the certificate serves as its own CA)."""
    folder = tmp_path_factory.mktemp("pem")
    key, cert = folder / "tls.key", folder / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=collector", "-days", "2"],
                   check=True, capture_output=True, timeout=30)
    return SimpleNamespace(key=str(key), cert=str(cert))


@pytest.fixture
def rollup(kcm, monkeypatch):
    """`kcm rollup` up to the Spark session: Kafka's probes, the session and the job recorded; run(argv, env) ->
    code, out, err, level, seen."""
    import kcm_rollups.job as job

    seen: dict = {}
    result = SimpleNamespace(window_range=(datetime(2026, 1, 31, 9, tzinfo=timezone.utc),
                                           datetime(2026, 1, 31, 11, tzinfo=timezone.utc)),
                             input_records=3, decode_errors={}, points=30, rows_written=4, windows={"1m": 2},
                             seconds=1.25, stage_seconds={"write": 0.5}, exported=None, top_rows=[],
                             summary_lines=lambda: ["summary: 3 records"])

    def run(spark, options):
        seen["options"], seen["now"] = options, datetime.now(timezone.utc)
        return result

    monkeypatch.setattr(job, "check_reachable", lambda settings: seen.setdefault("probed", []).append(settings))
    monkeypatch.setattr(job, "check_authenticates",   # every topic exists (whichever --topic the model gives)
                        lambda settings: seen.setdefault("authenticated", settings) and _EveryTopic())
    monkeypatch.setattr(job, "_started", lambda master: seen.setdefault("master", [master]) and "spark")
    monkeypatch.setattr(job, "run", run)

    def run_command(argv, env=None):
        seen.clear()
        return (*kcm(argv, env), seen)

    return run_command


class _EveryTopic:
    def __contains__(self, topic: object) -> bool:
        return True


DIMENSIONS = ("client_id", "client_software_name", "client_software_version", "attributes", "client_instance_id",
              "client_source_address", "client_source_port", "principal", "listener_name", "security_protocol",
              "broker_id", "cluster_id", "subscription_id")
TIMES = [("2026-01-31T10:00:00Z", datetime(2026, 1, 31, 10, tzinfo=timezone.utc)),
         ("2026-01-31T10:00:00", datetime(2026, 1, 31, 10, tzinfo=timezone.utc)),   # zone-less: UTC
         ("2026-01-31T13:30:00+02:00", datetime(2026, 1, 31, 11, 30, tzinfo=timezone.utc)),
         ("1769853600", datetime(2026, 1, 31, 10, tzinfo=timezone.utc)),
         ("19700101", datetime(1970, 1, 1, tzinfo=timezone.utc)),   # ISO 8601's basic format
         ("20260131T1000Z", datetime(2026, 1, 31, 10, tzinfo=timezone.utc)),
         ("100000000", datetime(1973, 3, 3, 9, 46, 40, tzinfo=timezone.utc)),   # the earliest epoch seconds taken
         ("1700000000.5", datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=timezone.utc))]
RESOLUTIONS = [("1m,1h", (60, 3600)), ("1h,1m", (60, 3600)), ("30s,1m", (30, 60)), ("1m,5m,1h", (60, 300, 3600)),
               ("1d,1h", (3600, 86400)), ("2d,1d", (86400, 172800)), ("15m", (900,)), ("1m,1h,1d", (60, 3600, 86400)),
               ("1s", (1,))]
DURATIONS = [("1h", 3600), ("90m", 5400), ("1h30m", 5400), ("2d", 172800), ("45s", 45)]
MASTERS = ["local", "local[2]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]", "spark://h:7077",
           "k8s://https://h:6443", "yarn"]


def draw_rollup(rng, tmp_path, case, pem):
    bootstrap = rng.choice(BOOTSTRAPS)
    argv = ["--bootstrap-server", bootstrap]
    config_argv, properties = client_config(rng, tmp_path, case)
    argv += config_argv
    want = {"bootstrap": bootstrap, "properties": properties, "topic": DEFAULT_TOPIC, "start": None, "end": None,
            "last": None, "starting": "earliest", "ending": "latest", "resolutions": (60, 3600),
            "dimensions": DIMENSIONS[:4], "lookback": 300, "min_partitions": None, "top": 10, "json": False,
            "otlp": None, "env": {}}
    if rng.random() < 0.3:
        want["topic"] = rng.choice(TOPICS[:2])
        argv += ["--topic", want["topic"]]
    topic = want["topic"]
    kind = rng.choice(["none", "from", "from-to", "last", "offsets"])
    if kind in ("from", "from-to"):
        (from_text, start), (to_text, end) = sorted(rng.sample(TIMES, 2), key=lambda pair: pair[1])
        if start == end:
            kind = "from"
        argv += ["--from", from_text]
        want["start"] = start
        if kind == "from-to":
            argv += ["--to", to_text]
            want["end"] = end
    elif kind == "last":
        text, want["last"] = rng.choice(DURATIONS)
        argv += ["--last", text]
    elif kind == "offsets":
        if rng.random() < 0.7:
            want["starting"] = rng.choice(["earliest", f'{{"{topic}":{{"0":5}}}}', f'{{"{topic}":{{"0":-2,"1":3}}}}'])
            argv += ["--starting-offsets", want["starting"]]
        if rng.random() < 0.7:
            want["ending"] = rng.choice(["latest", f'{{"{topic}":{{"0":10}}}}', f'{{"{topic}":{{"1":-1}}}}'])
            argv += ["--ending-offsets", want["ending"]]
    if rng.random() < 0.4:
        text, want["resolutions"] = rng.choice(RESOLUTIONS)
        argv += ["--resolution", text]
    if rng.random() < 0.4:
        chosen = rng.sample(DIMENSIONS, rng.randint(1, 5))
        want["dimensions"] = tuple(chosen)
        argv += ["--group-by", ",".join(chosen)]
    if rng.random() < 0.3:
        text, want["lookback"] = rng.choice(DURATIONS)
        argv += ["--lookback", text]
    want["output"] = rng.choice([str(tmp_path / f"out-{case}"), "s3a://bucket/kcm-rollups", "relative/out"])
    argv += ["--output", want["output"]]
    if rng.random() < 0.4:
        want["master"] = rng.choice(MASTERS)
        argv += ["--master", want["master"]]
    elif rng.random() < 0.3:
        want["env"] = {"PYSPARK_GATEWAY_PORT": "40123"}   # under spark-submit: its master
        want["master"] = None
    else:
        want["master"] = "local[*]"
    if rng.random() < 0.3:
        want["min_partitions"] = rng.choice([1, 8, 100000])
        argv += ["--min-partitions", str(want["min_partitions"])]
    if rng.random() < 0.3:
        want["top"] = rng.choice([0, 3, 100000])
        argv += ["--top", str(want["top"])]
    if rng.random() < 0.3:
        want["json"] = True
        argv.append("--json")
    if rng.random() < 0.4:
        otlp = {"endpoint": rng.choice(["collector:4317", "10.0.0.1:4317", "[::1]:4317"]), "tls": False,
                "ca_file": None, "cert_file": None, "key_file": None, "header_files": ()}
        argv += ["--otlp-endpoint", otlp["endpoint"]]
        if rng.random() < 0.3:
            otlp["tls"] = True
            argv.append("--otlp-tls")
        if rng.random() < 0.3:
            otlp["ca_file"] = pem.cert
            argv += ["--otlp-ca-file", pem.cert]
        if rng.random() < 0.3:
            otlp["cert_file"], otlp["key_file"] = pem.cert, pem.key
            argv += ["--otlp-cert-file", pem.cert, "--otlp-key-file", pem.key]
        headers = []
        for name in rng.sample(["authorization", "x-scope-orgid", "api.key_1"], rng.randint(0, 2)):
            path = tmp_path / f"{name}-{case}"
            path.write_text(f"Bearer tok-{case}-SECRET\n")
            headers.append((name, str(path)))
            argv += ["--otlp-header-file", f"{name}={path}"]
        otlp["header_files"] = tuple(headers)
        want["otlp"] = otlp
    level, argv = with_log_level(rng, "rollup", argv)
    want["level"] = level
    return argv, want


def test_random_rollup_options_give_the_documented_run(rollup, tmp_path, pem, caplog):
    """Range, offsets, resolutions, dimensions, lookback, output, master (spark-submit's when run under it), split,
    top rows, JSON summary and OTLP target: each as given, else its documented default; Kafka checked first."""
    rng = random.Random(SEED + 3)
    for case in range(CASES):
        argv, want = draw_rollup(rng, tmp_path, case, pem)
        caplog.clear()
        before = datetime.now(timezone.utc)
        code, out, err, level, seen = rollup(argv, want["env"])
        context = f"seed {SEED + 3} case {case}: kcm {' '.join(argv)} env {want['env']}"
        assert code == 0 and "options" in seen, f"{context}: exit {code} {err!r}"
        options = seen["options"]
        assert level == want["level"], context
        assert (options.kafka.bootstrap_servers, options.kafka.properties) == (want["bootstrap"],
                                                                               want["properties"]), context
        assert [s.bootstrap_servers for s in seen["probed"]] == [want["bootstrap"]], context
        assert seen["authenticated"].bootstrap_servers == want["bootstrap"], context
        assert options.topic == want["topic"] and options.output == want["output"], context
        if want["last"] is not None:   # [now - DURATION, now)
            assert before <= options.end <= seen["now"], context
            assert options.end - options.start == timedelta(seconds=want["last"]), context
        else:
            assert (options.start, options.end) == (want["start"], want["end"]), context
        assert (options.starting_offsets, options.ending_offsets) == (want["starting"], want["ending"]), context
        assert tuple(r.seconds for r in options.resolutions) == want["resolutions"], context
        assert tuple(options.dimensions) == want["dimensions"], context
        assert options.lookback_seconds == want["lookback"], context
        assert seen["master"] == [want["master"]], context
        assert options.min_partitions == want["min_partitions"] and options.top == want["top"], context
        if want["json"]:
            summary = json.loads(out)
            assert set(summary) == {"window_range", "input_records", "decode_errors", "points", "rows_written",
                                    "windows", "seconds", "stage_seconds", "otlp", "top"}, context
            assert summary["window_range"] == ["2026-01-31T09:00:00+00:00", "2026-01-31T11:00:00+00:00"], context
        else:
            assert "summary: 3 records" in out, context
        otlp = options.otlp
        if want["otlp"] is None:
            assert otlp is None, context
        else:
            for name, value in want["otlp"].items():
                assert getattr(otlp, name) == value, f"{context}: otlp.{name} = {getattr(otlp, name)!r}"
        assert "SECRET" not in out + err + caplog.text, context


@pytest.fixture
def otlp_files(tmp_path, pem):
    token = tmp_path / "token"
    token.write_text("Bearer tok-SECRET\n")
    files = {"token": str(token), "cert": pem.cert, "key": pem.key}
    for name, content in {"notpem": "just text\n", "multiline": "tok-SECRET\nsecond-SECRET\n", "empty": "",
                          "nonascii": "tök-SECRET\n"}.items():
        (tmp_path / name).write_text(content)
        files[name] = str(tmp_path / name)
    files["missing"] = str(tmp_path / "missing")
    files["dir"] = str(tmp_path)
    return files


ROLLUP_BASE = ["--bootstrap-server", "k:9092", "--output", "out"]
T = DEFAULT_TOPIC
ROLLUP_REFUSED = [
    (["--output", "out"], ["--bootstrap-server"]),
    (["--bootstrap-server", "k:9092"], ["--output"]),
    (["--bootstrap-server", "k:9092", "--output", "out\udcff"], ["--output"]),
    (["--bootstrap-server", "kafka", "--output", "out"], ["bootstrap server", "'kafka'"]),
    (["--from", "yesterday"], ["--from"]),
    (["--from", "2026-01-31T10:00:00Z", "--to", "soon"], ["--to", "'soon'"]),
    *[(["--from", v], ["--from", repr(v)]) for v in ("yesterday", "1969-12-31T23:59:59Z", "-1", "9000-01-01T00:00:00Z",
                                                    "nan", "2026-13-01")],
    # Too short for epoch seconds: a year or a date without dashes, not a range back to 1970.
    *[(["--from", v], ["--from", repr(v), "epoch seconds in full"]) for v in ("0", "2026", "99999999", "202601")],
    (["--from", "2026-01-31T10:00:00Z", "--to", "1969-01-01"], ["--to", "'1969-01-01'"]),
    (["--to", "2026-01-31T10:00:00Z"], ["--to", "--from"]),
    (["--last", "1h", "--from", "2026-01-31T10:00:00Z"], ["--last", "--from"]),
    (["--last", "1h", "--to", "2026-01-31T10:00:00Z"], ["--last", "--to"]),
    *[(["--last", v], ["--last"]) for v in ("1x", "0m", "-1h", "1", "30000d")],
    (["--starting-offsets", "latest"], ["--starting-offsets"]),
    (["--ending-offsets", "earliest"], ["--ending-offsets"]),
    (["--starting-offsets", f'{{"{T}":{{"0":-1}}}}'], ["--starting-offsets"]),
    (["--ending-offsets", f'{{"{T}":{{"0":-2}}}}'], ["--ending-offsets"]),
    (["--starting-offsets", '{"other":{"0":1}}'], ["--starting-offsets"]),
    (["--ending-offsets", "[1]"], ["--ending-offsets"]),
    (["--starting-offsets", f'{{"{T}":{{"x":1}}}}'], ["--starting-offsets"]),
    (["--starting-offsets", f'{{"{T}":{{"0":5}}}}', "--from", "2026-01-31T10:00:00Z"],
     ["--starting-offsets", "--from"]),
    (["--ending-offsets", f'{{"{T}":{{"0":5}}}}', "--last", "1h"], ["--ending-offsets", "--last"]),
    *[(["--resolution", v], ["resolution"]) for v in ("7m", "1m,90s", ",", "5x", "1h,36h", "1m,7h")],
    *[(["--group-by", v], ["group by", v.split(",")[-1]]) for v in ("foo", "client_id,nope")],
    *[(["--lookback", v], ["--lookback"]) for v in ("5", "abc", "0s")],
    *[(["--master", v], ["--master"]) for v in ("mesos://x", "local[0]", "local[x]", "spark:/h")],
    *[(["--min-partitions", v], ["--min-partitions"]) for v in ("0", "100001", "-1", "many")],
    *[(["--top", v], ["--top"]) for v in ("-1", "100001", "ten")],
    (["--topic", "bad topic"], ["--topic"]),
    (["--log-level", "LOUD"], ["--log-level"]),
]
OTLP_REFUSED = [
    (["--otlp-tls"], ["--otlp-tls", "--otlp-endpoint"]),
    (["--otlp-ca-file", "{cert}"], ["--otlp-ca-file", "--otlp-endpoint"]),
    (["--otlp-header-file", "authorization={token}"], ["--otlp-header-file", "--otlp-endpoint"]),
    (["--otlp-endpoint", "collector"], ["--otlp-endpoint"]),
    (["--otlp-endpoint", "http://collector:4317"], ["--otlp-endpoint"]),
    (["--otlp-endpoint", "c:4317", "--otlp-cert-file", "{cert}"], ["--otlp-cert-file", "--otlp-key-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-key-file", "{key}"], ["--otlp-cert-file", "--otlp-key-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-ca-file", "{missing}"], ["--otlp-ca-file", "{missing}"]),
    (["--otlp-endpoint", "c:4317", "--otlp-ca-file", "{notpem}"], ["--otlp-ca-file", "{notpem}"]),
    (["--otlp-endpoint", "c:4317", "--otlp-ca-file", "{key}"], ["--otlp-ca-file", "{key}"]),
    (["--otlp-endpoint", "c:4317", "--otlp-cert-file", "{key}", "--otlp-key-file", "{key}"], ["--otlp-cert-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-cert-file", "{cert}", "--otlp-key-file", "{cert}"], ["--otlp-key-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-header-file", "authorization"], ["--otlp-header-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-header-file", "=x"], ["--otlp-header-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-header-file", "Authorization={token}"], ["--otlp-header-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-header-file", "authorization={token}", "--otlp-header-file",
      "authorization={token}"], ["--otlp-header-file"]),
    (["--otlp-endpoint", "c:4317", "--otlp-header-file", "authorization={missing}"], ["--otlp-header-file",
                                                                                     "{missing}"]),
    (["--otlp-endpoint", "c:4317", "--otlp-header-file", "authorization={dir}"], ["--otlp-header-file", "{dir}"]),
    *[(["--otlp-endpoint", "c:4317", "--otlp-header-file", f"authorization={{{name}}}"],
       ["--otlp-header-file", f"{{{name}}}"]) for name in ("multiline", "empty", "nonascii")],
]


@pytest.mark.parametrize("argv, names", ROLLUP_REFUSED, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_a_rollup_option_the_docs_refuse_is_one_line_and_exit_2_before_spark(rollup, argv, names):
    full = ["rollup", *argv] if "--output" in argv or "--bootstrap-server" in argv else ["rollup", *ROLLUP_BASE, *argv]
    code, _, err, _, seen = rollup(full)
    assert_refused(code, err, names, " ".join(argv))
    assert "master" not in seen and "options" not in seen


@pytest.mark.parametrize("argv, names", OTLP_REFUSED, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_a_rollup_otlp_file_the_docs_refuse_is_named_never_its_content(rollup, otlp_files, caplog, argv, names):
    """TLS files must be PEM of the right kind, header names lower-case and given once, header values printable
    ASCII on one line; the error names the option and file and never shows what the file holds."""
    argv = [word.format(**otlp_files) for word in argv]
    names = [name.format(**otlp_files) for name in names]
    code, _, err, _, seen = rollup(["rollup", *ROLLUP_BASE, *argv])
    assert_refused(code, err, names, " ".join(argv))
    assert "SECRET" not in err + caplog.text and "master" not in seen



# --- every command: the client config file ----------------------------------------------------------------------------

COMMAND_LINES = {
    "operator": ["operator", "-n", "team", "--bootstrap-server", "k:9092", "--metrics-port", "0", "--liveness-port",
                 "0"],
    "tail": ["tail", "--bootstrap-server", "k:9092"],
    "rollup": ["rollup", *ROLLUP_BASE],
}


@pytest.fixture
def any_command(operator, tail, rollup):
    return {"operator": operator, "tail": tail, "rollup": rollup}


@pytest.mark.parametrize("command", list(COMMAND_LINES))
@pytest.mark.parametrize("content, names", [
    (None, ["{path}"]),
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=NOPE\nsasl.username=u\nsasl.password=pw-SECRET\n",
     ["sasl.mechanism"]),
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n", ["sasl"]),
    ("sasl.password=pw-SECRET\nno.such.property=1\n", ["no.such.property"]),
    ("request.timeout.ms=-5\nsasl.password=pw-SECRET\n", ["request.timeout.ms"]),
    ("security.protocol=SSL\nssl.ca.location={path}.missing\n", ["ssl.ca.location"]),
], ids=["missing", "bad-mechanism", "sasl-without-credentials", "unknown-property", "bad-timeout", "missing-ca"])
def test_a_client_config_file_kcm_cannot_use_is_named_in_one_line_without_its_secrets(any_command, tmp_path, caplog,
                                                                                      command, content, names):
    """docs/kafka-clients.md: refused at start-up with one line naming the property (or the file), exit code 2,
    never echoing a password, before the command's heavy part."""
    path = tmp_path / "client.properties"
    if content is not None:
        path.write_text(content.format(path=path))
    code, out, err, _, seen = any_command[command]([*COMMAND_LINES[command], "--command-config", str(path)])
    assert_refused(code, err, [name.format(path=path) for name in names], f"{command} {content!r}")
    assert "SECRET" not in out + err + caplog.text
    assert not ({"kopf", "args", "options", "master"} & set(seen))


@pytest.mark.parametrize("blank", ["", "   "], ids=["empty", "blank"])
@pytest.mark.parametrize("command, option", [(command, "--command-config") for command in COMMAND_LINES]
                         + [("rollup", "--output"), ("rollup", "--master"), ("tail", "--bootstrap-server")])
def test_an_empty_option_value_is_refused_naming_the_option(any_command, command, option, blank):
    """`--command-config ''` must not quietly read no file, nor `--output ' '` write to a directory named blank."""
    code, _, err, _, seen = any_command[command]([*COMMAND_LINES[command], option, blank])
    assert_refused(code, err, [option], command)
    assert not ({"kopf", "args", "options", "master"} & set(seen))
