"""The command-line glue of `kcm sandbox`, `operator`, `subscriptions`, `rollup`, `bridge` and the shared `main`,
`signals` and `terminal`: what each flag reaches, exit codes, clean-up, messages. Each test was found by a mutation
review (27) to guard something the end-to-end tests let through. In-process or one short subprocess; no broker, JVM
or Spark."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import subprocess
import sys
import threading
import types
from datetime import timedelta

import pytest

from kcm_common.errors import UserError
from test_operator_edges import _OPERATOR


# --- main.py: --log-level reaches the logging configuration ---------------------------------------------------------

def test_log_level_is_what_the_logging_configuration_gets(monkeypatch):
    """Kills M13 (`_configure_logging("INFO")`) and M14 (`basicConfig(level="INFO")`): `kcm --log-level debug ...`
    parsed the option and then logged at INFO anyway."""
    import kcm_cli.tail
    from kcm_cli.main import main

    configured: list[dict] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: configured.append(kwargs))
    monkeypatch.setattr(kcm_cli.tail, "run", lambda args: 0)
    levels = {name: logging.getLogger(name).level for name in ("kafka", "py4j")}
    try:
        assert main(["--log-level", "debug", "tail", "--bootstrap-server", "k:1"]) == 0
        assert [kwargs["level"] for kwargs in configured] == ["DEBUG"]
        assert logging.getLogger("kafka").level == logging.INFO   # what DEBUG, and only DEBUG, lets through
        assert main(["tail", "--bootstrap-server", "k:1", "--log-level", "error"]) == 0
        assert configured[-1]["level"] == "ERROR"
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


# --- terminal.py ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("character", ["\x7f", "\x85", "\x9b", "\x9d", "\u202e", "\u202a", "\u2066", "\u200f",
                                       "\u061c", "\u2028", "\u2029"])
def test_c1_controls_bidi_controls_and_line_separators_are_escaped(character):
    """Kills T01 (\\x80-\\x9f let through: \\x9b is a one-byte CSI on terminals that honour C1) and T02 (the bidi
    overrides U+202B-U+202E let through: a client id could display reversed); the Arabic letter mark is a bidi
    control too, and the line and paragraph separators split a row for whatever splits the output into lines."""
    from kcm_common.terminal import printable

    shown = printable(f"a{character}b")
    assert character not in shown and shown.startswith("a\\") and shown.endswith("b")
    assert len(shown.splitlines()) == 1


# --- signals.py -------------------------------------------------------------------------------------------------------

_ANOTHER_SIGNAL = """
import os, signal, threading, time
from kcm_cli.signals import on_stop_signals

seen = []
on_stop_signals(seen.append)
signal.signal(signal.SIGUSR1, lambda *_: None)   # another library's handler: its signals reach the wakeup fd too
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.2)
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 5
while "SIGTERM" not in [s.name for s in seen] and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.1)
print(",".join(s.name for s in seen))
"""


def test_only_sigint_and_sigterm_stop_a_command():
    """Kills G04 (every signal number read from the wakeup fd taken for a stop): a SIGUSR1 (or SIGCHLD, SIGWINCH) some
    library handles in Python would stop the bridge or the sandbox."""
    done = subprocess.run([sys.executable, "-c", _ANOTHER_SIGNAL], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, "SIGTERM"), done.stderr


# --- sandbox.py -------------------------------------------------------------------------------------------------------

def _sandbox_args(*flags: str):
    from kcm_cli.main import build_parser

    return build_parser().parse_args(["sandbox", "--listen", "127.0.0.1:0", *flags])


def test_the_java_receiver_is_called_as_kafka_4_2_unless_asked_and_only_it_is_built(monkeypatch):
    """Kills SB02 (default --receiver-api 3.8, not the documented 4.2) and SB09 (the Java receiver built for
    --receiver python, and not for --receiver java: a machine without a JDK could not run the default sandbox)."""
    import kcm_sandbox.java_receiver
    from kcm_cli.sandbox import options_from

    built: list[bool] = []
    monkeypatch.setattr(kcm_sandbox.java_receiver, "ensure_built", lambda: built.append(True))
    assert options_from(_sandbox_args()).receiver == "python" and built == []
    options = options_from(_sandbox_args("--receiver", "java"))
    assert (options.receiver, options.receiver_api, built) == ("java", "4.2", [True])


def test_a_telemetry_max_bytes_of_zero_is_refused_not_taken_as_the_default():
    """Kills SB03 (`if args.telemetry_max_bytes:`): `--telemetry-max-bytes 0` silently ran with Kafka's 1 MiB."""
    from kcm_cli.sandbox import options_from

    with pytest.raises(UserError, match="--telemetry-max-bytes must be from 1 to"):
        options_from(_sandbox_args("--telemetry-max-bytes", "0"))


@pytest.mark.parametrize("dies", [False, True])
def test_the_sandbox_is_stopped_whether_a_signal_or_its_broker_ends_it(monkeypatch, capsys, dies):
    """Kills SB12 (`sandbox.stop()` skipped): the broker's log directory, the Java receiver and the subscription
    state were left to process exit."""
    import kcm_cli.sandbox
    import kcm_sandbox.runner

    calls: list[str] = []

    class Sandbox:
        bootstrap = "127.0.0.1:1"

        def __init__(self, options):
            self.options = options

        def start(self):
            calls.append("start")

        def problem(self):
            return "the embedded broker exited with code -9" if dies else None

        def stop(self):
            calls.append("stop")

    handlers = []
    monkeypatch.setattr(kcm_sandbox.runner, "Sandbox", Sandbox)
    monkeypatch.setattr(kcm_cli.sandbox, "on_stop_signals", handlers.append)
    monkeypatch.setattr(kcm_cli.sandbox, "_HEALTH_CHECK_S", 0.01)
    if not dies:
        threading.Timer(0.1, lambda: handlers[0](None)).start()   # a SIGTERM, as the watcher thread delivers it
    assert kcm_cli.sandbox.run(_sandbox_args()) == (1 if dies else 0)
    assert calls == ["start", "stop"]
    assert "kcm sandbox: bootstrap 127.0.0.1:1" in capsys.readouterr().out


# --- operator.py ------------------------------------------------------------------------------------------------------

def test_a_peering_name_with_a_valid_prefix_is_still_refused(tmp_path, monkeypatch, capsys):
    """Kills O02 (`match` for `fullmatch`): `--peering-name kcm_peers` passed, and kopf waited forever for a
    KopfPeering no API server accepts."""
    from kcm_cli.main import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["operator", "-n", "team", "--bootstrap-server", "127.0.0.1:9092", "--peering-name", "kcm_peers"]) == 2
    assert "--peering-name 'kcm_peers' is not a Kubernetes object name" in capsys.readouterr().err


def test_a_peering_name_may_be_253_characters_and_no_more():
    """Kills O03 (254 let through: the API server refuses such a name)."""
    from kcm_cli.operator import _PEERING_NAME

    assert _PEERING_NAME.fullmatch("a" * 253) and _PEERING_NAME.fullmatch("a." * 126 + "a")
    assert not _PEERING_NAME.fullmatch("a" * 254)


def test_kopf_watches_the_namespaces_asked_for_or_the_whole_cluster(kopf_runs):
    """Kills O08 (`-n` not handed to kopf) and O09 (`-A` not handed to kopf)."""
    from kcm_cli.main import main

    assert main([*_OPERATOR, "-n", "payments"]) == 0
    assert main(["operator", "-A", *_OPERATOR[3:]]) == 0
    namespaced, cluster_wide = kopf_runs
    assert (list(namespaced["namespaces"]), namespaced["clusterwide"]) == (["team", "payments"], False)
    assert (list(cluster_wide["namespaces"]), cluster_wide["clusterwide"]) == ([], True)


def test_the_metrics_endpoint_listens_on_the_listen_address_only(kopf_runs, monkeypatch):
    """Kills O07 (`addr` not given: /metrics served on every interface although --listen-address 127.0.0.1 asked
    to keep it local)."""
    import prometheus_client

    from kcm_cli.main import main

    served: list[tuple] = []
    monkeypatch.setattr(prometheus_client, "start_http_server", lambda port, **kw: served.append((port, kw)))
    assert main([*_OPERATOR[:5], "--metrics-port", "19999", "--liveness-port", "0", "--listen-address",
                 "127.0.0.1"]) == 0
    assert served == [(19999, {"addr": "127.0.0.1"})]


def test_an_ipv6_listen_address_is_probed_and_given_to_kopf_as_ipv6():
    """Kills O16 (the liveness port probed with an IPv4 socket: `--listen-address ::1` refused as 'cannot listen')
    and O17 (the liveness URL without brackets: http://:::8080/healthz)."""
    import socket

    from kcm_cli.operator import _check_free, _url

    assert _url(ipaddress.ip_address("::"), 8080, "/healthz") == "http://[::]:8080/healthz"
    assert _url(ipaddress.ip_address("127.0.0.1"), 8080, "/healthz") == "http://127.0.0.1:8080/healthz"
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this host")
    _check_free("--liveness-port", ipaddress.ip_address("::1"), 0)


class _NotFound:
    def __init__(self, asked: list):
        self.asked = asked

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        from kubernetes.client.rest import ApiException

        self.asked.append(namespace)
        raise ApiException(status=404, reason="Not Found")


def _peering_warnings(monkeypatch, caplog, namespaces, seconds, first_s, every_s) -> tuple[list, list[str]]:
    from kubernetes import client

    from kcm_cli import operator as operator_cli

    asked: list = []
    monkeypatch.setattr(client, "CustomObjectsApi", lambda *a, **k: _NotFound(asked))
    caplog.set_level(logging.WARNING, logger="kcm.operator")
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        operator_cli._warn_while_peering_is_missing("kcm", namespaces, False, stop, first_s, every_s)
    finally:
        timer.cancel()
        stop.set()
    return asked, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_missing_peering_object_is_warned_about_at_the_slower_pace_after_the_first(monkeypatch, caplog):
    """Kills O13 (`wait = every_s` dropped): the warning came every 5 s, not every minute."""
    _, said = _peering_warnings(monkeypatch, caplog, ["team"], 0.6, 0.05, 30)
    assert len(said) == 1, said


def test_a_comma_separated_namespace_list_is_not_looked_up_as_one_namespace(monkeypatch, caplog):
    """Kills O14 (',' and ' ' not taken for pattern syntax): `-n 'a,b'` looked for a KopfPeering in a namespace
    named 'a,b' and warned it missing every minute."""
    asked, said = _peering_warnings(monkeypatch, caplog, ["team-a,team-b", "payments"], 0.3, 0.05, 10)
    assert set(asked) == {"payments"} and said and "team-a,team-b" not in said[0]


# --- subscriptions.py -------------------------------------------------------------------------------------------------

def _fake_admin(monkeypatch, subscriptions: dict) -> list[str]:
    import kcm_operator.admin
    import kcm_operator.apply  # noqa: F401 (first imported here, it would bind the fake for good)

    closed: list[str] = []

    class Admin:
        def __init__(self, settings):
            pass

        def list_names(self):
            return list(subscriptions)

        def describe(self, names):
            return {name: subscriptions[name] for name in names if name in subscriptions}

        def close(self):
            closed.append("closed")

    monkeypatch.setattr(kcm_operator.admin, "SubscriptionAdmin", Admin)
    return closed


def test_describe_says_none_for_no_metrics_and_the_admin_is_closed_even_on_an_error(monkeypatch, capsys):
    """Kills U04 ('(none)' dropped: `Metrics:` printed empty) and U03 (the admin client never closed, its
    connection left to the process's exit, also when describe fails)."""
    from kcm_cli.main import main

    closed = _fake_admin(monkeypatch, {"quiet": {"interval.ms": "1000"}})
    assert main(["subscriptions", "describe", "quiet", "--bootstrap-server", "k:9092"]) == 0
    assert "Metrics:      (none)" in capsys.readouterr().out.splitlines()
    assert main(["subscriptions", "describe", "nope", "--bootstrap-server", "k:9092"]) == 2
    assert closed == ["closed", "closed"]


# --- rollup.py --------------------------------------------------------------------------------------------------------

def _rollup(monkeypatch, arguments: list[str], result=None) -> tuple[int, dict]:
    import kcm_rollups.job
    from kcm_cli.main import main

    given: dict = {}

    def run_rollup(*positional, **keywords):
        given.update(keywords, positional=positional)
        return result or types.SimpleNamespace(top_rows=[], summary_lines=lambda: [])

    monkeypatch.setattr(kcm_rollups.job, "run_rollup", run_rollup)
    return main(["rollup", "--bootstrap-server", "k:9092", "--output", "out", *arguments]), given


def test_rollup_hands_the_job_the_otlp_tls_headers_last_and_group_by(monkeypatch, tmp_path):
    """Kills R04 (--otlp-tls dropped: the export went plaintext), R05 (--otlp-header-file dropped: no token
    sent), R06 (--last read as minutes) and R08 (--group-by dropped)."""
    token = tmp_path / "token"
    token.write_text("Bearer t\n")
    code, given = _rollup(monkeypatch, ["--last", "2h", "--group-by", "client_id", "--otlp-endpoint", "otel:4317",
                                        "--otlp-tls", "--otlp-header-file", f"authorization={token}"])
    assert code == 0
    target = given["otlp"]
    assert (target.endpoint, target.tls, target.header_files) == ("otel:4317", True,
                                                                  (("authorization", str(token)),))
    assert given["last"] == timedelta(hours=2)
    assert "client_id" in given["dimensions"]


def test_rollup_top_may_be_the_documented_maximum(monkeypatch):
    """Kills R03 (`< MAX_TOP`: --top 100000, the maximum the error message names, refused)."""
    code, given = _rollup(monkeypatch, ["--top", "100000"])
    assert (code, given["top"]) == (0, 100_000)


def test_last_with_to_is_refused_for_what_it_is(monkeypatch, capsys):
    """Kills R01 (`--last` with `--to` only checked against --from): the user was told `--to needs --from`, and
    adding --from then earned `--last cannot be combined`."""
    code, _ = _rollup(monkeypatch, ["--last", "1h", "--to", "2026-01-01T00:00:00Z"])
    assert code == 2 and "--last cannot be combined with --from/--to" in capsys.readouterr().err


def test_rollup_prints_rows_without_empty_cells_and_its_json_summary(monkeypatch, capsys):
    """Kills R09 (None cells printed as `name=None`), R10 (rows_written reported the points) and R11 (the OTLP
    export never in the JSON summary)."""
    result = types.SimpleNamespace(
        window_range=None, input_records=5, decode_errors={"empty": 1}, points=40, rows_written=12, windows={"1m": 3},
        seconds=1.23456, stage_seconds={"write": 0.5}, exported=("otel:4317", 12, 0),
        top_rows=[{"metric": "m", "p99": None, "avg": 2.0}], summary_lines=lambda: ["summary"])
    assert _rollup(monkeypatch, [], result)[0] == 0
    assert capsys.readouterr().out.splitlines() == ["metric=m  avg=2", "summary"]
    assert _rollup(monkeypatch, ["--json"], result)[0] == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows_written"], summary["points"], summary["seconds"]) == (12, 40, 1.235)
    assert summary["otlp"] == {"endpoint": "otel:4317", "sent": 12, "rejected": 0}
    assert summary["window_range"] is None   # a run over offsets only
    assert summary["top"] == [{"metric": "m", "p99": None, "avg": 2.0}]


@pytest.mark.parametrize("word", ["json", "JSON", "table"])
def test_rollup_output_given_a_format_word_is_refused_unless_that_directory_exists(monkeypatch, capsys, tmp_path,
                                                                                   word):
    """Every other command's --output is a format: `kcm rollup --output json` wrote Parquet into ./json, exit 0."""
    import kcm_rollups.job
    from kcm_cli.main import main

    ran: list[str] = []
    monkeypatch.setattr(kcm_rollups.job, "run_rollup", lambda bootstrap, topic, output, **_: ran.append(output) or
                        types.SimpleNamespace(top_rows=[], summary_lines=lambda: []))
    monkeypatch.chdir(tmp_path)
    assert main(["rollup", "--bootstrap-server", "k:9092", "--output", word]) == 2 and not ran
    assert "--output is the Parquet directory, not a format" in capsys.readouterr().err
    assert not (tmp_path / word).exists()
    (tmp_path / word).mkdir()   # an earlier run's output, or a directory made on purpose
    assert main(["rollup", "--bootstrap-server", "k:9092", "--output", word]) == 0
    assert main(["rollup", "--bootstrap-server", "k:9092", "--output", "./json"]) == 0
    assert ran == [word, "./json"]


def test_rollup_json_holds_the_top_rows_in_standard_json(monkeypatch, capsys):
    """--json with --top printed the summary only: the rows asked for were dropped without a word."""
    import datetime
    import math

    start = datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.timezone.utc)
    result = types.SimpleNamespace(
        window_range=None, input_records=1, decode_errors={}, points=2, rows_written=2, windows={"1h": 1},
        seconds=1.0, stage_seconds={}, exported=None, summary_lines=lambda: [],
        top_rows=[{"window_start": start, "metric": "m", "client_id": "a", "avg": math.nan, "max": math.inf,
                   "instances": 3, "partial": True}])
    assert _rollup(monkeypatch, ["--json", "--top", "1"], result)[0] == 0
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out, out
    assert json.loads(out)["top"] == [{"window_start": "2026-11-29T12:00:00+00:00", "metric": "m", "client_id": "a",
                                        "avg": None, "max": None, "instances": 3, "partial": True}]


# --- bridge.py --------------------------------------------------------------------------------------------------------

def test_bridge_flags_reach_its_configuration(monkeypatch):
    """Kills B01 (--topic), B03 (--routing), B04 (--dead-letter-topic) and B05 (--insecure) not passed on."""
    from test_leaf_units import _bridge_config_given

    config = _bridge_config_given(["--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure",
                                   "--topic", "metrics-a", "--topic", "metrics-b", "--routing", "hash",
                                   "--dead-letter-topic", "metrics-dlq"], monkeypatch)
    assert config.kafka.topics == ["metrics-a", "metrics-b"]
    assert (config.routing, config.delivery.dead_letter_topic) == ("hash", "metrics-dlq")
    assert [(e.endpoint, e.insecure) for e in config.endpoints] == [("c:4317", True)]


def test_kcm_bridge_runs_its_bridge_with_the_shorter_gil_switch_interval(monkeypatch):
    """Export threads wait for the GIL at most SWITCH_INTERVAL_S, not CPython's 5 ms (the benchmark's exports lagged
    and the consuming thread waited for them); a shorter interval someone set is kept."""
    import kcm_bridge.pipeline
    import kcm_cli.bridge
    from kcm_cli.main import main

    for name in [n for n in os.environ if n.startswith("KCM_BRIDGE_")]:
        monkeypatch.delenv(name)
    seen: list[float] = []
    monkeypatch.setattr(kcm_cli.bridge, "on_stop_signals", lambda on_signal: None)
    monkeypatch.setattr(kcm_bridge.pipeline, "Bridge", type("Bridge", (), {
        "__init__": lambda s, c: None, "run": lambda s: seen.append(sys.getswitchinterval()) or 0}))
    arguments = ["bridge", "--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure"]
    sys.setswitchinterval(0.005)   # CPython's default (the conftest puts the test process's own back)
    assert main(arguments) == 0
    sys.setswitchinterval(0.0001)
    assert main(arguments) == 0
    assert seen == pytest.approx([kcm_bridge.pipeline.SWITCH_INTERVAL_S, 0.0001], abs=2e-6)   # kept in µs
    assert kcm_bridge.pipeline.SWITCH_INTERVAL_S < 0.005


def test_bridge_json_logs_are_switched_on_and_its_exit_code_is_kept(monkeypatch):
    """Kills B06 (`--log-format json` never switched the logs to JSON) and B07 (the bridge's exit code dropped:
    a bridge that failed exited 0, and Kubernetes did not restart it)."""
    import kcm_bridge.pipeline
    import kcm_cli.bridge
    import kcm_common.logs
    from kcm_cli.main import main

    for name in [n for n in os.environ if n.startswith("KCM_BRIDGE_")]:
        monkeypatch.delenv(name)
    switched: list[bool] = []
    monkeypatch.setattr(kcm_common.logs, "use_json", lambda: switched.append(True))
    monkeypatch.setattr(kcm_cli.bridge, "on_stop_signals", lambda on_signal: None)
    monkeypatch.setattr(kcm_bridge.pipeline, "Bridge", type("Bridge", (), {"__init__": lambda s, c: None,
                                                                          "run": lambda s: 1}))
    assert main(["bridge", "--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure",
                 "--log-format", "json"]) == 1
    assert switched == [True]
