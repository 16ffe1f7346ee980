"""`kcm demo` end to end: real clients → gateway → receiver → topic → bridge → OTLP collector, and the live view."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import test_packaging

ROOT = Path(__file__).resolve().parent.parent
installed = test_packaging.installed   # the fixture: the kcm packages as an install lays them out
LIBRDKAFKA_CLIENTS = {"payments-producer", "payments-consumer", "orders-producer", "orders-consumer"}
JAVA_CLIENTS = {"inventory-java-producer", "inventory-java-consumer"}


def _demo_env(tmp_path: Path, marker: str) -> dict[str, str]:
    return {**os.environ, "KCM_DEMO_DIR": str(tmp_path), "KCM_TEST_MARKER": marker, "COLUMNS": "220",
            "LINES": "60"}


def _processes_with(marker: str) -> list[int]:
    """Processes still alive that inherited the test's marker: anything the demo started and left behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"KCM_TEST_MARKER={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait(pid: int, timeout_s: float) -> int:
    """The child's wait status once it exits; SIGKILLed (and so failing the test) if it outlives the bound."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reaped, status = os.waitpid(pid, os.WNOHANG)
        if reaped:
            return status
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _read_terminal(fd: int, seconds: float, on_screen: Callable[[bytes], None] = lambda screen: None) -> bytes:
    """What the demo writes to its terminal until it closes it or `seconds` pass; `on_screen` sees it as it grows."""
    screen = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break  # the demo exited and closed the terminal
            if not chunk:
                break
            screen += chunk
        on_screen(screen)
    return screen


def _demo_in_terminal(tmp_path: Path, args: list[str], seconds: float,
                      on_screen: Callable[[bytes, int], None] = lambda screen, fd: None) -> tuple[bytes, int, list[int]]:
    """Run `kcm demo ARGS` in a terminal of its own: what it wrote, its wait status, and the processes it left
    (killed). `on_screen` sees the screen as it grows, with the terminal's fd to type into."""
    marker = uuid.uuid4().hex
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(_demo_env(tmp_path, marker))
        os.execv(sys.executable, [sys.executable, "-m", "kcm_cli.main", "demo", *args])
    try:
        screen = _read_terminal(fd, seconds, lambda screen: on_screen(screen, fd))
        status = _wait(pid, 30)
    finally:
        left = _processes_with(marker)
        _kill(left)
    return screen, status, left


@pytest.mark.timeout(240)
def test_demo_jsonl_shows_every_client_through_the_whole_pipeline(tmp_path):
    marker = uuid.uuid4().hex
    # Settings meant for a real bridge in the user's shell (here a metrics port already taken) are not the demo's.
    taken = socket.create_server(("0.0.0.0", 0))
    env = {**_demo_env(tmp_path, marker), "KCM_BRIDGE_METRICS_PORT": str(taken.getsockname()[1])}
    try:
        # Without --rollup: its step runs in test_rollup_job on the suite's Spark session (a JVM of the demo's own
        # would cost this test some 45 s); the demo calling it after the clients stop is test_demo_units'.
        result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "demo", "--duration", "12", "--output",
                                 "jsonl", "--java", "yes"],
                                capture_output=True, text=True, timeout=200, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.splitlines()
        clients = [json.loads(line) for line in lines if line.startswith("{")]
        by_id = {client["client_id"]: client for client in clients}
        assert LIBRDKAFKA_CLIENTS | JAVA_CLIENTS <= set(by_id), result.stderr[-3000:]
        for client_id in LIBRDKAFKA_CLIENTS:
            assert by_id[client_id]["client_software_name"] == "confluent-kafka-python"
        for client_id in JAVA_CLIENTS:
            assert by_id[client_id]["client_software_name"] == "apache-kafka-java"
        for client_id, client in by_id.items():
            role = "producer" if client_id.endswith("-producer") else "consumer"
            # Only the subscription's prefix arrives: the demo's subscriptions were applied and matched.
            assert client["metrics"], client_id
            assert all(name.startswith(f"org.apache.kafka.{role}.") for name in client["metrics"]), client_id
            # The broker-side attributes exist only if the receiver wrote the push and the bridge carried it.
            assert {"broker_id", "cluster_id", "principal", "listener_name"} <= set(client["broker"]), client_id
            assert client["client_source"].startswith("127.0.0.1:")
            # Pushes, not ResourceMetrics (Java puts each metric in one of its own, dozens a push): 12 s at the 5 s
            # interval, plus the time before the 12 s start (the JVMs starting: longer on a busy machine) and a push
            # at close. librdkafka puts a push in one ResourceMetrics: only its counting of pushes at all is checked.
            assert client["pushes"] >= 1, (client_id, client["pushes"])
            if client_id in JAVA_CLIENTS:
                assert client["pushes"] <= 12 // 5 + 4, (client_id, client["pushes"])
        assert "org.apache.kafka.producer.record.queue.time.avg" in by_id["payments-producer"]["metrics"]
        assert "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg" in by_id["orders-consumer"]["metrics"]
        # The Java consumer is in a group: it joined once.
        assert by_id["inventory-java-consumer"]["metrics"]["org.apache.kafka.consumer.coordinator.rebalance.total"] >= 1
        assert "receiver: the kcm receiver plugin (Java)" in result.stderr
    finally:
        taken.close()
        left = _processes_with(marker)
        _kill(left)
    assert left == [], "the demo left processes running"


@pytest.mark.timeout(180)
def test_live_view_renders_each_client_in_a_terminal(tmp_path):
    screen, status, left = _demo_in_terminal(tmp_path, ["--duration", "15", "--java", "no"], 150)
    text = screen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-3000:]
    for client_id in LIBRDKAFKA_CLIENTS:
        assert client_id in text, text[-3000:]
    assert "confluent-kafka-python" in text
    traffic = re.findall(r"the apps' records: ([\d,]+) produced, ([\d,]+) consumed", text)
    assert traffic and all(int(count.replace(",", "")) > 0 for count in traffic[-1]), text[-3000:]
    assert left == []


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _cell(screen: bytes, client_id: str, heading: str) -> str | None:
    """The latest value under `heading` in `client_id`'s row of the live view's (framed, wide) table."""
    lines = _ANSI.sub("", screen[-30000:].decode(errors="replace")).replace("\r", "\n").splitlines()
    headers = [[cell.strip() for cell in line.split("┃")] for line in lines if f" {heading} " in line]
    rows = [[cell.strip() for cell in line.split("│")] for line in lines if f" {client_id} " in line and "│" in line]
    if not headers or not rows or heading not in headers[-1] or len(rows[-1]) != len(headers[-1]):
        return None
    return rows[-1][headers[-1].index(heading)]


@pytest.mark.timeout(180)
def test_the_live_view_shows_the_rebalances_of_the_java_consumer_in_its_group(tmp_path):
    counts: list[str] = []

    def stop_once_counted(screen: bytes, fd: int) -> None:
        # A push before the first join completes counts 0 rebalances: wait for the join.
        count = _cell(screen, "inventory-java-consumer", "rebalances")
        if not counts and count is not None and count.isdigit() and int(count) >= 1:
            counts.append(count)
            os.write(fd, b"\x03")

    screen, status, left = _demo_in_terminal(tmp_path, ["--duration", "60", "--java", "yes"], 120, stop_once_counted)
    assert counts, screen.decode(errors="replace")[-3000:]
    assert os.waitstatus_to_exitcode(status) == 130
    assert left == []


@pytest.mark.parametrize(("content", "message"), [
    (None, "holds no .yaml, .yml or .json files"),
    ("apiVersion: kcm.dev/v1alpha1\nkind: ClientMetricsSubscription\nmetadata: {name: x}\n"
     "spec: {metrics: ['*'], intervalMs: -1}\n", "spec.intervalMs: -1 is less than the minimum of 100"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "holds no ClientMetricsSubscription"),
])
def test_demo_subscriptions_are_checked_before_anything_starts(tmp_path, content, message):
    directory = tmp_path / "subscriptions"
    directory.mkdir()
    if content is not None:
        (directory / "s.yaml").write_text(content)
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "demo", "--subscriptions", str(directory),
                             "--duration", "5"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr   # nothing started, nothing logged


@pytest.mark.timeout(180)
def test_ctrl_c_twice_in_a_terminal_stops_everything_with_exit_code_130(tmp_path):
    """Ctrl-C in a terminal signals the whole foreground process group, and impatient users press it twice. Before,
    the broker and JVMs died with the demo's SIGINT (out of order), and a second signal arriving inside the first
    handler's Event.set() deadlocked the demo for good."""
    pressed: list[float] = []

    def press_ctrl_c_once_clients_push(screen: bytes, fd: int) -> None:
        if not pressed and b"confluent-kafka-python" in screen and b"apache-kafka-java" in screen:
            os.write(fd, b"\x03\x03")  # the terminal sends SIGINT to the foreground process group, twice
            pressed.append(time.monotonic())

    screen, status, left = _demo_in_terminal(tmp_path, ["--duration", "120"], 120, press_ctrl_c_once_clients_push)
    text = screen.decode(errors="replace")
    assert pressed, text[-3000:]
    assert os.waitstatus_to_exitcode(status) == 130, text[-3000:]
    assert "Traceback" not in text
    assert left == [], "the demo left processes running"


@pytest.mark.timeout(120)
def test_ctrl_c_while_starting_stops_what_started_and_starts_nothing_more(tmp_path):
    marker = uuid.uuid4().hex
    # --java no: the Java receiver's start (a JVM, perhaps a build first) cannot be cut short, and would set the pace.
    demo = subprocess.Popen([sys.executable, "-m", "kcm_cli.main", "demo", "--duration", "120", "--output", "jsonl",
                             "--java", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=_demo_env(tmp_path, marker))
    try:
        first_line = demo.stderr.readline()   # the demo has begun to start
        demo.send_signal(signal.SIGINT)
        sent = time.monotonic()
        rest = demo.communicate(timeout=60)[1]
        stopped_after_s = time.monotonic() - sent
    finally:
        demo.kill()
        left = _processes_with(marker)
        _kill(left)
    log = first_line + rest
    assert demo.returncode == 130, log[-3000:]
    assert "subscriptions: " not in log and not (tmp_path / "bridge.log").exists(), log[-3000:]
    assert stopped_after_s < 8, (stopped_after_s, log[-3000:])
    assert "Traceback" not in log
    assert left == [], "the demo left processes running"


def test_the_package_ships_the_subscriptions_in_examples_demo_unchanged():
    examples = {path.name: path.read_bytes() for path in (ROOT / "examples" / "demo").glob("*.yaml")}
    packaged = {path.name: path.read_bytes() for path in (ROOT / "demo" / "kcm_demo" / "subscriptions").glob("*.yaml")}

    assert examples and packaged == examples


def test_an_installed_demo_loads_its_own_subscriptions_and_logs_to_a_temporary_directory(installed):
    probe = ("import sys, tempfile; from pathlib import Path; import kcm_demo.run as run; "
             "from kcm_operator import manifests; "
             "found = manifests.subscriptions(manifests.load([run.DEFAULT_SUBSCRIPTIONS])); "
             "print(run.DEFAULT_SUBSCRIPTIONS); print(run.default_workdir()); "
             "print(','.join(sorted(manifest.obj['metadata']['name'] for manifest, _ in found)))")
    env = {key: value for key, value in os.environ.items() if key != "KCM_DEMO_DIR"}
    result = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(installed)},
                            cwd=installed, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    subscriptions, workdir, names = result.stdout.split()
    assert Path(subscriptions).is_relative_to(installed) and names == "demo-consumers,demo-producers"
    assert Path(workdir).name.startswith("kcm-demo-") and not Path(workdir).is_relative_to(ROOT)
    Path(workdir).rmdir()
