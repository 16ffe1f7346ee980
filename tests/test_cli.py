"""Every kcm command reports a user's mistake as one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kcm_cli.main import build_parser


def _kcm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcm_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.fixture
def silent_server() -> Iterator[tuple[str, int]]:
    """A TCP server that accepts connections and never says a word (not a Kafka broker)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[:2]
    stop.set()
    thread.join(timeout=5)
    for connection in accepted:
        connection.close()
    server.close()


def test_version_prints_the_package_version():
    result = _kcm("--version")

    assert result.returncode == 0
    assert result.stdout.startswith("kcm ")


def test_a_usage_mistake_is_one_line_naming_the_option():
    _one_line_error(_kcm("tail", "--bootstrap-server", "b:9092", "--max-records", "many"),
                    "--max-records", "invalid int value", "kcm tail --help")


def test_log_level_is_accepted_before_and_after_the_subcommand():
    parser = build_parser()

    assert parser.parse_args(["--log-level", "debug", "tail", "--bootstrap-server", "b:1"]).log_level == "DEBUG"
    assert parser.parse_args(["tail", "--bootstrap-server", "b:1", "--log-level", "warning"]).log_level == "WARNING"
    assert parser.parse_args(["tail", "--bootstrap-server", "b:1"]).log_level == "INFO"


@pytest.mark.parametrize("servers", ["localhost:abc", "localhost", "kafka:0", "kafka:70000", " , "])
def test_a_malformed_bootstrap_server_is_refused_before_connecting(servers):
    _one_line_error(_kcm("tail", "--bootstrap-server", servers), "kcm tail:", "bootstrap server")


def test_a_client_config_file_that_is_not_utf8_says_so(tmp_path):
    config = tmp_path / "client.properties"
    config.write_bytes("sasl.password=gr\xfc\xdfe\n".encode("latin-1"))

    _one_line_error(_kcm("tail", "--bootstrap-server", "127.0.0.1:9", "--command-config", str(config)),
                    "is not UTF-8")


def test_a_negative_request_timeout_is_a_config_error_not_an_unreachable_kafka(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("request.timeout.ms=-5\n")

    result = _kcm("tail", "--bootstrap-server", "127.0.0.1:9", "--command-config", str(config))

    _one_line_error(result, "request.timeout.ms must be a positive number")
    assert "cannot reach" not in result.stderr


def test_nothing_listening_is_reported_without_waiting_for_the_bootstrap_timeout():
    from ports import reserved_port

    started = time.monotonic()
    with reserved_port() as port:
        result = _kcm("tail", "--bootstrap-server", f"127.0.0.1:{port}", "--connect-timeout", "30")

    _one_line_error(result, "cannot reach Kafka", "refuses connections")
    assert time.monotonic() - started < 25


def test_tls_settings_against_a_plaintext_broker_name_the_handshake(broker, tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SSL\n")

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--command-config", str(config),
                  "--connect-timeout", "2")

    _one_line_error(result, "no TLS handshake completed", "security.protocol is SSL")


def test_sasl_settings_against_a_plaintext_broker_name_sasl(broker, tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=pw\n")

    result = _kcm("tail", "--bootstrap-server", broker.bootstrap, "--command-config", str(config),
                  "--connect-timeout", "2")

    _one_line_error(result, "SASL", "credentials")
    assert "pw" not in result.stderr.replace("password", "")


def test_a_server_that_is_not_kafka_is_called_out(silent_server):
    host, port = silent_server

    _one_line_error(_kcm("tail", "--bootstrap-server", f"{host}:{port}", "--connect-timeout", "1"),
                    "does not answer as a Kafka broker", "is this a Kafka broker?")


def test_sandbox_listen_host_that_cannot_be_resolved():
    _one_line_error(_kcm("sandbox", "--listen", "no-such-host.invalid:0"), "--listen host", "cannot be resolved")


def test_sandbox_upstream_that_is_not_kafka_fails_within_seconds(silent_server):
    host, port = silent_server
    started = time.monotonic()

    result = _kcm("sandbox", "--listen", "127.0.0.1:0", "--upstream", f"{host}:{port}")

    _one_line_error(result, "kcm sandbox: --upstream: cannot reach Kafka", "is this a Kafka broker?")
    assert time.monotonic() - started < 20


def test_an_unknown_option_is_blamed_on_the_subcommand_that_got_it():
    _one_line_error(_kcm("tail", "--bootstrap-server", "b:9092", "--bogus"),
                    "kcm tail: unrecognized arguments: --bogus", "kcm tail --help")
    _one_line_error(_kcm("subscriptions", "list", "--bootstrap-server", "b:9092", "--bogus"),
                    "kcm subscriptions list: unrecognized arguments: --bogus")
    # Before any command: about the option, not a missing command.
    _one_line_error(_kcm("--bogus"), "kcm: unrecognized arguments: --bogus")
    _one_line_error(_kcm(), "kcm: the following arguments are required: COMMAND")


def test_an_option_that_takes_one_value_is_refused_when_given_twice():
    """argparse keeps the last: `kcm tail --topic a --topic b` read b only, without a word."""
    _one_line_error(_kcm("tail", "--bootstrap-server", "b:9092", "--topic", "nosuch", "--topic=kafka-client-metrics"),
                    "kcm tail: argument --topic: given 2 times; give it once")
    _one_line_error(_kcm("subscriptions", "list", "--bootstrap-server", "b:9092", "-o", "json", "--output", "table"),
                    "kcm subscriptions list: argument -o/--output: given 2 times; give it once")
    _one_line_error(_kcm("subscriptions", "list", "--bootstrap-server", "b:9092", "-ojson", "-o", "table"),
                    "kcm subscriptions list: argument -o/--output: given 2 times; give it once")


def test_an_option_is_known_by_its_whole_name_only():
    """argparse took `--timeout-s` style prefixes (`--bootstrap` for --bootstrap-server): a script using one breaks
    the day another option starts the same way."""
    _one_line_error(_kcm("tail", "--bootstrap-server", "b:9092", "--max", "1"),
                    "kcm tail: unrecognized arguments: --max 1")
    # Said before what is missing (argparse said --bootstrap-server was required, not that --bootstrap is unknown).
    _one_line_error(_kcm("tail", "--bootstrap", "b:9092", "--timeout", "1"),
                    "kcm tail: unrecognized arguments: --bootstrap b:9092")
    _one_line_error(_kcm("subscriptions", "--bogus"), "kcm subscriptions: unrecognized arguments: --bogus")
    _one_line_error(_kcm("operator", "--bogus"), "kcm operator: unrecognized arguments: --bogus")
    _one_line_error(_kcm("subscriptions", "apply", "--bootstrap-server", "b:9092"),   # and what is missing still
                    "kcm subscriptions apply: the following arguments are required: -f/--filename")


@pytest.mark.parametrize("command, required", [
    (["tail"], ["--bootstrap-server"]),
    (["operator"], ["(-n NS | -A)", "--bootstrap-server"]),
    (["subscriptions", "apply"], ["-f", "--bootstrap-server"]),
    (["rollup"], ["--output", "--bootstrap-server"]),
])
def test_help_shows_required_options_as_required(command, required):
    """The pass that says unknown options first turns `required` off: --help printed its usage line then."""
    result = _kcm(*command, "--help")
    assert result.returncode == 0, result.stderr
    usage = " ".join(result.stdout.split("\n\n", 1)[0].split())
    for option in required:
        assert option in usage and f"[{option.strip('()').split()[0]} " not in usage, usage


@pytest.mark.parametrize("option", ["--bootstrap-server", "--command-config"])
def test_a_connection_option_before_the_subscriptions_action_says_where_it_goes(option):
    """As kubectl takes its options: argparse took the option's value for the action (`invalid choice: 'b:9092'`)."""
    _one_line_error(_kcm("subscriptions", option, "b:9092", "list"),
                    f"kcm subscriptions: {option} goes after the action: kcm subscriptions list|describe|apply|delete "
                    f"{option} …")


def test_log_level_is_accepted_after_a_nested_action():
    args = build_parser().parse_args(["subscriptions", "list", "--bootstrap-server", "b:1", "--log-level", "error"])

    assert args.log_level == "ERROR"


@pytest.mark.parametrize(("level", "py4j_from", "kafka_from"), [("DEBUG", logging.INFO, logging.INFO),
                                                                 ("INFO", logging.WARNING, logging.CRITICAL)])
def test_spark_bridge_and_kafka_python_logs_are_held_back_at_every_level(level, py4j_from, kafka_from):
    from kcm_cli.main import _configure_logging

    loggers = [logging.getLogger(name) for name in ("", "py4j", "kafka", "celpy")]
    levels = [logger.level for logger in loggers]
    try:
        # Under pytest the root logger already has a handler, so basicConfig leaves its level alone: set it as a
        # terminal run at --log-level would, so only kcm's own settings can hold these loggers back.
        logging.getLogger().setLevel(level)
        _configure_logging(level)

        # py4j logs each command sent to Spark's JVM at DEBUG, Kafka passwords included; kafka-python narrates
        # every connection at INFO and its configuration (the SASL password) at DEBUG.
        assert not logging.getLogger("py4j").isEnabledFor(py4j_from - 1)
        assert logging.getLogger("py4j").isEnabledFor(py4j_from)
        assert not logging.getLogger("kafka").isEnabledFor(kafka_from - 1)
        # cel-python narrates each CRD rule it evaluates (a third of the operator's lines at DEBUG).
        assert not logging.getLogger("celpy.Evaluator").isEnabledFor(logging.INFO)
        assert logging.getLogger("celpy.Evaluator").isEnabledFor(logging.WARNING)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@pytest.mark.parametrize("option", ["--timeout", "--connect-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "1e12"])
def test_tail_durations_must_be_finite_and_positive(option, value):
    _one_line_error(_kcm("tail", "--bootstrap-server", "b:9092", option, value),
                    f"argument {option}", "finite number of seconds")


@pytest.mark.parametrize(("listen", "message"), [
    ("8.8.8.8:0", "--listen 8.8.8.8:0: cannot listen on it (Cannot assign requested address); give an address of "
                  "this host"),
    ("[::1]:0", "IPv4 only"),
])
def test_sandbox_listen_address_it_cannot_use(listen, message):
    _one_line_error(_kcm("sandbox", "--listen", listen), message)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_bridge_metrics_port_in_use_is_one_line_in_the_log_format_chosen(log_format):
    import json
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        # The bridge listens on every address (0.0.0.0): a port taken on loopback is taken for it too.
        result = _kcm("bridge", "--bootstrap-server", "127.0.0.1:1", "--endpoint", "127.0.0.1:4317", "--insecure",
                      "--metrics-port", str(port), "--log-format", log_format)

    _one_line_error(result, f"kcm bridge: metrics_port {port}: cannot listen on", "pick another --metrics-port")
    if log_format == "json":
        assert json.loads(result.stderr)["level"] == "ERROR", result.stderr
    else:
        assert not result.stderr.startswith("{"), result.stderr


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_rollup_error_is_one_line_in_the_log_format_chosen(log_format, tmp_path):
    """A scheduled rollup's driver log goes to a log pipeline as the operator's and the bridge's do: rollup had no
    --log-format."""
    import json

    result = _kcm("rollup", "--bootstrap-server", "127.0.0.1:1", "--output", str(tmp_path / "out"), "--last", "1h",
                  "--to", "2026-01-01T00:00:00Z", "--log-format", log_format)
    _one_line_error(result, "kcm rollup: --last cannot be combined with --from/--to")
    if log_format == "json":
        assert json.loads(result.stderr)["level"] == "ERROR", result.stderr
    else:
        assert result.stderr.startswith("kcm rollup: "), result.stderr


@pytest.mark.parametrize("asked", ["--log-format json", "KCM_BRIDGE_LOG_FORMAT=json"])
def test_bridge_config_error_is_a_json_line_when_json_was_asked_before_the_config(asked):
    """The commonest crash of a Deployment (a bad variable) must reach a log pipeline that parses JSON lines."""
    import json

    env = {**os.environ, "KCM_BRIDGE_BATCH_MAX_POINTS": "0"}
    flags = asked.split() if asked.startswith("--") else []
    if not flags:
        env.update([asked.split("=", 1)])
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "bridge", "--bootstrap-server", "127.0.0.1:1",
                             "--endpoint", "127.0.0.1:4317", "--insecure", *flags], env=env, capture_output=True,
                            text=True, timeout=60)

    _one_line_error(result, "batch.max_points must be positive, not 0 (set by KCM_BRIDGE_BATCH_MAX_POINTS)")
    assert json.loads(result.stderr)["level"] == "ERROR", result.stderr


def test_sandbox_checks_its_options_before_probing_the_upstream(silent_server):
    host, port = silent_server

    _one_line_error(_kcm("sandbox", "--listen", "127.0.0.1:0", "--upstream", f"{host}:{port}", "--partitions", "0"),
                    "--partitions must be from 1 to 10000, not 0")


@pytest.mark.parametrize(("command", "missing", "extra"), [
    (["rollup", "--bootstrap-server", "k:9092", "--output", "/tmp/unused"], "google.rpc", "rollup"),
    (["rollup", "--bootstrap-server", "k:9092", "--output", "/tmp/unused"], "grpc", "rollup"),
    (["bridge"], "grpc", "bridge"),
    (["tail", "--bootstrap-server", "k:9092"], "pyspark", "rollup"),   # not tail's: the module's own extra
    (["operator", "-A", "--bootstrap-server", "k:9092"], "kopf", "operator"),
])
def test_a_missing_package_names_the_extra_of_the_command_that_needs_it(monkeypatch, capsys, command, missing, extra):
    import importlib

    from kcm_cli.main import main

    def lacking(args):
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    monkeypatch.setattr(importlib.import_module(f"kcm_cli.{command[0]}"), "run", lacking)
    assert main(command) == 2
    assert capsys.readouterr().err == (f"kcm {command[0]}: needs the '{extra}' extra (missing module {missing}): "
                                       f"pip install 'kcm[{extra}]'\n")


def test_demo_rollup_without_spark_says_so_before_the_demo_runs(monkeypatch, capsys):
    """The 'demo' extra has no Spark: `--rollup` names the 'rollup' extra at once, not the 'demo' extra after the
    clients ran for a minute."""
    import importlib.util

    import kcm_demo.run
    from kcm_cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a))
    monkeypatch.setattr(kcm_demo.run, "run_demo", lambda *a, **k: pytest.fail("the demo ran"))
    assert main(["demo", "--rollup"]) == 2
    assert capsys.readouterr().err == ("kcm demo: --rollup needs the 'rollup' extra (missing module pyspark): "
                                       "pip install 'kcm[rollup]'\n")


@pytest.mark.parametrize("missing", ["yaml", "kcm_bridge.nonexistent", "google.protobuf.nonexistent"])
def test_a_missing_module_no_extra_installs_is_a_bug_with_its_traceback(monkeypatch, missing):
    import importlib

    from kcm_cli.main import main

    def broken(args):
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    monkeypatch.setattr(importlib.import_module("kcm_cli.rollup"), "run", broken)
    with pytest.raises(ModuleNotFoundError):
        main(["rollup", "--bootstrap-server", "k:9092", "--output", "/tmp/unused"])


@pytest.mark.parametrize("arguments", [
    ["bridge", "--config", ""],
    ["subscriptions", "apply", "-f", "", "--bootstrap-server", "127.0.0.1:1"],
    ["rollup", "--bootstrap-server", "127.0.0.1:1", "--output", "/tmp/unused", "--from", " "],
    ["operator", "-n", "", "--bootstrap-server", "127.0.0.1:1"],
    ["tail", "--bootstrap-server", ""],
    ["demo", "--subscriptions", ""],
    ["sandbox", "--state", " "],
])
@pytest.mark.timeout(60)   # in-process: a regression would run the command (a sandbox, a bridge) here, not fail
def test_an_empty_option_value_is_a_one_line_mistake_not_a_default(arguments, capsys):
    from kcm_cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(arguments)
    error = capsys.readouterr().err
    assert exited.value.code == 2 and len(error.strip().splitlines()) == 1, error
    assert "needs a value, not an empty string" in error


@pytest.mark.parametrize("command", [["tail", "--bootstrap-server", "127.0.0.1:1"], ["sandbox"],
                                     ["rollup", "--bootstrap-server", "127.0.0.1:1", "--last", "1h", "--output", "o"],
                                     ["bridge", "--bootstrap-server", "127.0.0.1:1", "--endpoint", "c:4317"]])
def test_a_topic_kafka_would_refuse_is_a_one_line_error(command):
    _one_line_error(_kcm(*command, "--topic", "bad topic!"),
                    "argument --topic: 'bad topic!' is not a Kafka topic name: 1 to 249 characters of a-z, A-Z, 0-9")


# What the `kcm` script runs, with a line once `main` is imported (a Ctrl-C before that is Python's own start-up).
_KCM_INTERRUPTED_WHILE_ITS_COMMAND_LOADS = """
import os, signal, sys
from kcm_cli.main import main

def interrupt_once(event, args):
    if event == "import" and args[0] == "kcm_sandbox.runner" and not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C, landing inside the import
sent = []
sys.addaudithook(interrupt_once)
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_a_command_starts_is_quiet():
    # The sandbox's modules take a while to load, and a Ctrl-C landing then (before the command's own handler is
    # installed) is quiet too. The child interrupts itself at that point: a signal sent from here after a "ready"
    # line could land before main() (seen on a loaded machine), where any Python program prints a traceback.
    # (A Ctrl-C once the sandbox runs: test_sandbox_command.)
    process = subprocess.Popen([sys.executable, "-c", _KCM_INTERRUPTED_WHILE_ITS_COMMAND_LOADS, "sandbox", "--listen",
                                "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    assert (process.returncode, out, err) == (130, "", "")


_SIGNAL_WHILE_THE_EVENT_IS_LOCKED = """
import os, signal, threading, time
from kcm_cli.signals import on_stop_signals

stop = threading.Event()
on_stop_signals(lambda signum: stop.set())
with stop._cond:  # what Event.wait() holds on its way in and out, when a signal may come
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs here, in this thread, while the lock is held
print("set" if stop.wait(5) else "not set")
"""


def test_a_stop_signal_arriving_while_the_main_thread_holds_the_stop_events_lock_cannot_deadlock():
    # `signal.signal(SIGTERM, lambda *_: stop.set())`, as the demo and the sandbox had, hangs here for good (seen:
    # a demo Ctrl-C'd from a terminal never stopped).
    done = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_THE_EVENT_IS_LOCKED], capture_output=True, text=True,
                          timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, "set"), done.stderr


def _kcm_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run kcm with stdout a pipe whose reader has already gone (`kcm ... | true` once `true` has exited)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "kcm_cli.main", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)


@pytest.mark.parametrize("command", [["tail", "--timeout", "1"], ["subscriptions", "list"]])
def test_output_into_a_pipe_whose_reader_went_away_ends_quietly(command, sandbox):
    result = _kcm_into_a_closed_pipe(*command, "--bootstrap-server", sandbox.bootstrap)
    assert result.returncode == 0 and "Error" not in result.stderr, result.stderr


@pytest.mark.parametrize("document", ["kafka: " + "[" * 1000 + "]" * 1000,
                                      "".join(f"{' ' * depth}k{depth}:\n" for depth in range(1000)) + " " * 1000 + "v"],
                         ids=["flow", "block"])
def test_a_file_nesting_deeper_than_python_can_read_is_one_line_not_a_traceback(tmp_path, document):
    """PyYAML builds nested values by recursion: a 2 KB file of `[` was a RecursionError traceback."""
    path = tmp_path / "deep.yaml"
    path.write_text(document)
    _one_line_error(_kcm("bridge", "--config", str(path)), "nests values too deeply")
    _one_line_error(_kcm("subscriptions", "apply", "--bootstrap-server", "127.0.0.1:9", "-f", str(path),
                         "--dry-run"), "nests values too deeply")


@pytest.mark.parametrize("arguments", [["tail", "--bootstrap-server", "127.0.0.1:9", "--command-config"],
                                       ["bridge", "--config"]], ids=["command-config", "bridge-config"])
def test_a_settings_file_too_large_to_be_one_is_refused_without_reading_it_all(arguments):
    """/dev/zero (or any wrong, endless file) was read until the memory ran out."""
    _one_line_error(_kcm(*arguments, "/dev/zero", timeout=30), "larger than 1 MiB")


def test_an_error_naming_a_file_with_a_newline_or_escape_stays_one_line_and_inert(tmp_path):
    result = _kcm("tail", "--bootstrap-server", "127.0.0.1:9", "--command-config", str(tmp_path / "no\nsuch\x1b[2J"))
    _one_line_error(result, "no\\nsuch\\x1b[2J")


def test_a_command_started_with_stdout_closed_reports_its_error_without_a_traceback():
    """Supervisors and cron may start a command with fd 1 closed: Python then has no sys.stdout at all."""
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "tail", "--bootstrap-server", "127.0.0.1:9"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                            preexec_fn=lambda: os.close(1))
    _one_line_error(result, "cannot reach Kafka")


def test_a_sandbox_state_file_too_large_to_be_one_is_refused_without_reading_it_all():
    _one_line_error(_kcm("sandbox", "--listen", "127.0.0.1:0", "--state", "/dev/zero", timeout=30), "larger than 64 MiB")


def test_offsets_or_a_kubeconfig_nesting_deeper_than_python_can_read_are_one_line(tmp_path):
    deep = _kcm("rollup", "--bootstrap-server", "127.0.0.1:9", "--topic", "t", "--output", str(tmp_path),
                "--starting-offsets", "[" * 5000 + "]" * 5000)
    _one_line_error(deep, "--starting-offsets must be")
    assert deep.stderr.rstrip().endswith("… (10000 characters)") and len(deep.stderr) < 400   # not all it was given
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: " + "[" * 1000 + "]" * 1000 + "\n")
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "operator", "--bootstrap-server", "127.0.0.1:9",
                             "--all-namespaces"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    _one_line_error(result, "nests values too deeply")


def test_the_bridge_s_stop_watchdog_exits_1_naming_the_blocked_call_and_stays_quiet_once_stopped(caplog):
    from kcm_cli.bridge import _exit_unless_stopped

    release, stopped, exits = threading.Event(), threading.Event(), []

    def blocked_in_the_kafka_client() -> None:
        release.wait(10)

    loop = threading.Thread(target=blocked_in_the_kafka_client)
    loop.start()
    try:
        _exit_unless_stopped(stopped, 0.2, loop, exits.append).join(5)
    finally:
        release.set()
        loop.join(5)
    assert exits == [1]
    message = next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert message.startswith("the bridge did not stop within 0.2s of being asked"), message
    assert "in blocked_in_the_kafka_client" in message and "release.wait(10)" in message, message

    exits.clear()
    caplog.clear()
    stopped.set()
    _exit_unless_stopped(stopped, 0.2, threading.main_thread(), exits.append).join(5)
    assert exits == [] and not caplog.records


_FAILING_SPARK_TASK = """
from kcm_rollups.session import spark_session
from kcm_rollups.source import KafkaSourceError

spark = spark_session("local[1]", "kcm-test-logging", {"spark.ui.enabled": "false"})


def fails(batches):
    for _ in batches:
        raise KafkaSourceError("t-0 returned records up to offset 0 only")
    yield from ()


# A task of very large size: a warning Spark's TaskSetManager gives that has nothing to do with a failure.
spark.sparkContext.parallelize([b"x" * 3_000_000], 1).map(len).sum()
try:
    spark.range(1).mapInArrow(fails, "id long").collect()
except Exception as err:
    print("KafkaSourceError: t-0 returned records" in str(err))
finally:
    spark.stop()
"""


def test_a_local_spark_says_nothing_of_a_failed_task_that_kcm_then_reports_in_one_line():
    """Spark's default logging printed a failed task's exception and Python traceback twice, and its own start-up
    notes, before `kcm rollup`'s one line: a local master kcm starts logs as kcm's log4j2 file says."""
    result = subprocess.run([sys.executable, "-c", _FAILING_SPARK_TASK], capture_output=True, text=True, timeout=180,
                            env={key: value for key, value in os.environ.items()
                                 if key not in ("SPARK_CONF_DIR", "SPARK_HOME")})
    assert result.returncode == 0 and result.stdout == "True\n", (result.stdout, result.stderr)
    # The JVM's own note on the incubator module Spark loads (log4j cannot silence the JVM), and the large task's
    # warning: what the task failure's loggers say besides the failure still shows.
    said = [line for line in result.stderr.splitlines() if line.strip()]
    large = [line for line in said if "WARN TaskSetManager: Stage" in line and "task of very large size" in line]
    assert len(large) == 1, result.stderr
    assert all(line.startswith("WARNING: Using incubator modules") for line in said if line not in large), \
        result.stderr
