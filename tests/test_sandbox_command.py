"""`kcm sandbox` as a user runs it: prints its bootstrap address, keeps state, stops everything on a signal."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from kcm_sandbox.broker import EmbeddedBroker
from kcm_sandbox.runner import Sandbox, SandboxError, SandboxOptions
from ports import reserved_port

STARTUP_TIMEOUT_S = 60


@contextmanager
def _sandbox(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A running `kcm sandbox` and its bootstrap address; on exit, it and everything it started are killed.
    Its stderr goes to a file (`process.stderr_file`), so a chatty sandbox never blocks on a full pipe."""
    stderr = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen([sys.executable, "-m", "kcm_cli.main", "sandbox", *args], stdout=subprocess.PIPE,
                               stderr=stderr, text=True, start_new_session=True)
    process.stderr_file = stderr  # type: ignore[attr-defined]
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(STARTUP_TIMEOUT_S)  # the sandbox prints its address once it is ready
        line = lines[0] if lines else ""
        assert "bootstrap" in line, (line, _stderr(process) if process.poll() is not None else "")
        yield process, line.split("bootstrap ")[1].split()[0]
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the sandbox and its broker: one process group
        process.wait(10)
        stderr.close()


def _stderr(process: subprocess.Popen[str]) -> str:
    process.stderr_file.seek(0)  # type: ignore[attr-defined]
    return process.stderr_file.read()  # type: ignore[attr-defined]


def _children(pid: int) -> set[int]:
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children |= {int(c) for c in (task / "children").read_text().split()}
    return children


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:   # reaped since the signal check
        return False
    return "State:\tZ" not in status


def _describe(bootstrap: str, name: str) -> dict:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, name)])
    finally:
        admin.close()


def test_sandbox_prints_its_address_keeps_state_and_stops_its_broker_on_sigterm(tmp_path):
    state = tmp_path / "subscriptions.json"
    with (reserved_port() as port,
          _sandbox("--listen", f"127.0.0.1:{port}", "--state", str(state)) as (process, bootstrap)):
        assert bootstrap == f"127.0.0.1:{port}"
        broker_pids = _children(process.pid)
        assert broker_pids, "the sandbox should run the embedded broker as a child process"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "kept",
                                            configs={"metrics": "org.apache.kafka.producer.", "interval.ms": "5000"})],
                            raise_on_unknown=False)
        admin.close()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert not any(_alive(pid) for pid in broker_pids)

    with _sandbox("--listen", "127.0.0.1:0", "--state", str(state)) as (process, bootstrap):
        described = repr(_describe(bootstrap, "kept"))
        assert "org.apache.kafka.producer." in described and "5000" in described
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0


def test_a_sandbox_killed_outright_leaves_no_broker_behind():
    with _sandbox("--listen", "127.0.0.1:0") as (process, _):
        broker_pids = _children(process.pid)
        assert broker_pids
        process.kill()  # SIGKILL: no handler runs, no stop()
        process.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in broker_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in broker_pids), "the broker outlived the sandbox"


def test_bad_options_are_one_line_errors_with_exit_code_2(tmp_path):
    corrupt = tmp_path / "state.json"
    corrupt.write_text("{not json")
    for args, message in [(["--compression", "brotli"], "unknown compression 'brotli'"),
                          (["--compression", "zstd,ZSTD"], "--compression names 'zstd' twice"),
                          (["--receiver-api", "3.8"], "--receiver-api applies to the Java receiver only"),
                          (["--listen", "nowhere"], "--listen must be HOST:PORT"),
                          (["--listen", "0.0.0.0:0"], "--listen 0.0.0.0: clients are told to connect to the listen"),
                          (["--listen", "127.0.0.1:\u00b2"], "--listen must be HOST:PORT"),  # a Unicode digit
                          (["--upstream", "127.0.0.1:\u0663"], "--upstream must be HOST:PORT"),
                          (["--listen", "127.0.0.1:0", "--connections-max-idle-ms", "0"],
                           "--connections-max-idle-ms must be from 1 to 31536000000 (a year), not 0"),
                          (["--listen", "127.0.0.1:0", "--partitions", "99999999999"],
                           "--partitions must be from 1 to 10000, not 99999999999"),
                          (["--listen", "127.0.0.1:0", "--telemetry-max-bytes", "99999999999999999999"],
                           "--telemetry-max-bytes must be from 1 to 2147483647"),
                          (["--listen", "127.0.0.1:0", "--receiver", "java", "--telemetry-max-bytes", "300000000"],
                           "--telemetry-max-bytes with --receiver java must be at most 268435456"),
                          (["--listen", "127.0.0.1:0", "--state", str(corrupt)], "state")]:
        result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "sandbox", *args],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_a_non_positive_idle_timeout_is_refused_before_anything_starts():
    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0), connections_max_idle_ms=0))

    with pytest.raises(SandboxError, match="--connections-max-idle-ms must be from 1 to"):
        sandbox.start()
    assert sandbox.broker is None and sandbox.gateway is None


def test_a_sandbox_whose_broker_dies_says_so_and_exits_non_zero():
    with _sandbox("--listen", "127.0.0.1:0") as (process, _):
        (broker_pid,) = _children(process.pid)
        os.kill(broker_pid, signal.SIGKILL)
        assert process.wait(timeout=20) == 1
        error = _stderr(process)
    assert "ERROR kcm.sandbox: the embedded broker exited with code -9; see its log at" in error
    assert "Traceback" not in error
    # Its own producer reconnecting through the gateway meanwhile is not a flood: paced, counted.
    assert error.count("cannot reach the upstream broker") <= 2, error


def test_a_sandbox_whose_java_receiver_dies_says_so_and_exits_non_zero():
    with _sandbox("--listen", "127.0.0.1:0", "--receiver", "java") as (process, _):
        (jvm,) = [pid for pid in _children(process.pid) if b"java" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(jvm, signal.SIGKILL)
        assert process.wait(timeout=20) == 1
        error = _stderr(process)
    assert "ERROR kcm.sandbox: the Java receiver exited with code -9" in error and "Traceback" not in error


def test_a_clean_stop_removes_the_brokers_log_and_a_death_keeps_it():
    from kcm_sandbox.broker import EmbeddedBroker

    stopped = EmbeddedBroker()
    stopped.start()
    assert stopped.log_path.exists()
    # In a directory of its own, never a predictable name in the shared temporary directory (a link there could
    # point the log at another file).
    assert stopped.log_path.parent != Path(tempfile.gettempdir())
    assert stat.S_IMODE(stopped.log_path.parent.stat().st_mode) == 0o700
    stopped.stop()
    assert not stopped.log_path.exists() and not stopped.log_path.parent.exists()
    stopped.start()   # again, after a clean stop removed the directory
    try:
        assert stopped.log_path.exists()
    finally:
        stopped.stop()
    assert not stopped.log_path.parent.exists()

    died = EmbeddedBroker()
    died.start()
    try:
        died._process.kill()
        died._process.wait(10)
        assert died.problem() and died.log_path.exists()  # the error names it: it stays
    finally:
        died.stop()
        died.log_path.unlink(missing_ok=True)
        died.log_path.parent.rmdir()


def test_a_port_in_use_is_refused_before_the_broker_starts():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", port)))
        with pytest.raises(SandboxError) as refused:
            sandbox.start()
    # The port, not the broker (which the message also blamed): one cause, and what to do.
    assert str(refused.value) == (f"--listen 127.0.0.1:{port}: cannot listen on it (Address already in use); "
                                  "give an address of this host and a free port (port 0 picks one)")
    assert sandbox.broker is None   # the gateway's port is taken first: the broker advertises it


def test_a_broker_whose_port_was_taken_while_it_started_starts_on_another(tmp_path):
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log")
    first = broker.port
    # What a connection's local end does to a port seen free a moment before: bound, not listening.
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", first))
    try:
        broker.start()
        assert broker.port != first
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5):
            pass
    finally:
        broker.stop()
        taken.close()
