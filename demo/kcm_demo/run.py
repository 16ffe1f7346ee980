"""`kcm demo`: the whole pipeline on one machine, started in order and stopped in reverse.

sandbox (gateway + embedded broker + receiver) → the demo subscriptions → real clients → metrics topic
→ `kcm bridge` → an embedded OTLP/gRPC collector → the live view (or a jsonl summary). Ctrl-C is looked at between
the start-up steps, so what has started stops and nothing more starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from kcm_common.children import own_child
from kcm_common.errors import UserError
from kcm_common.names import DEFAULT_METRICS_TOPIC

if TYPE_CHECKING:
    from rich.console import Console

    from kcm_demo.fleet import Fleet

log = logging.getLogger("kcm.demo")

# The package's own copy of the repository's examples/demo/, so an installed `kcm demo` has them too.
DEFAULT_SUBSCRIPTIONS = Path(__file__).resolve().parent / "subscriptions"
_CHECKOUT = Path(__file__).resolve().parents[2]
# The bridge's consumer group on the embedded broker, which holds each join for half the session timeout.
_BRIDGE_GROUP = "kcm-demo-bridge"
_BRIDGE_SESSION_TIMEOUT_MS = 6000
_STOP_TIMEOUT_S = 20.0
# After the clients close, their final (terminating) pushes still travel gateway → topic → bridge → collector.
_FINAL_PUSH_GRACE_S = 3.0


@dataclass
class DemoOptions:
    duration_s: float = 60.0
    output: str = "live"                        # "live" (rich table) or "jsonl"
    rollup: bool = False
    java: str = "auto"                          # "auto": Java clients and receiver when a JVM and the jar exist
    subscriptions: Path = DEFAULT_SUBSCRIPTIONS
    refresh_s: float = 0.5


@dataclass
class Pipeline:
    """What the demo started, for the view's header and the summary."""

    bootstrap: str = ""
    receiver: str = ""
    collector: str = ""
    client_ids: list[str] = field(default_factory=list)
    subscriptions: list[str] = field(default_factory=list)


def _kcm(*args: str) -> list[str]:
    """A `kcm` command line run with this interpreter, so the demo needs nothing on PATH."""
    return [sys.executable, "-m", "kcm_cli.main", *args]


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM while the pipeline was starting: what started is stopped, nothing more starts."""


def _stop_if(interrupted: threading.Event) -> None:
    if interrupted.is_set():
        log.info("interrupted while starting: stopping what has started")
        raise _Interrupted


class _Process:
    """A child process stopped with SIGTERM, then SIGKILL after a bound; its stderr kept for errors."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                      env=env, **own_child())

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise UserError(f"the demo's {self.name} exited with code {self.popen.returncode}: "
                            + " | ".join(tail))

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", self.name, timeout_s)
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()


def java_available() -> bool:
    return shutil.which("java") is not None


def run_demo(options: DemoOptions, out: IO[str], workdir: Path,
             interrupted: threading.Event | None = None) -> int:
    """Run the pipeline for `options.duration_s` seconds (or until `interrupted`), then stop everything."""
    from kcm_demo.fleet import Fleet

    if not options.subscriptions.exists():
        raise UserError(f"no subscriptions at {options.subscriptions}; pass --subscriptions DIR with "
                        "ClientMetricsSubscription YAML")
    from kcm_operator import manifests

    # Checked before anything starts: a mistake in them is one line, not a half-started pipeline.
    if not manifests.subscriptions(manifests.load([options.subscriptions])):
        raise UserError(f"{options.subscriptions} holds no ClientMetricsSubscription")
    interrupted = interrupted or threading.Event()
    use_java = _want_java(options.java)
    workdir.mkdir(parents=True, exist_ok=True)
    log.info("logs of the bridge and the Java clients in %s", workdir)
    fleet = Fleet()
    pipeline = Pipeline()
    with suppress(_Interrupted):
        _run(options, out, workdir, interrupted, use_java, fleet, pipeline)
    return 130 if interrupted.is_set() else 0


def _run(options: DemoOptions, out: IO[str], workdir: Path, interrupted: threading.Event, use_java: bool,
         fleet: Fleet, pipeline: Pipeline) -> None:
    """Start each part in order (checking for Ctrl-C between them), run, and stop them in reverse."""
    from kcm_demo.collector import OtlpCollector
    from kcm_demo.workload import Workload
    from kcm_sandbox.runner import Sandbox, SandboxOptions

    with ExitStack() as sandbox_stack:
        sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0), receiver="java" if use_java else "python"))
        sandbox.start()
        sandbox_stack.callback(sandbox.stop)
        pipeline.bootstrap = sandbox.bootstrap
        pipeline.receiver = ("the kcm receiver plugin (Java) inside the sandbox" if use_java
                             else "the sandbox's Python receiver (Java receiver not used)")
        log.info("sandbox on %s; receiver: %s", sandbox.bootstrap, pipeline.receiver)
        _stop_if(interrupted)
        pipeline.subscriptions = _apply_subscriptions(sandbox.bootstrap, options.subscriptions)
        _stop_if(interrupted)
        # Clients, bridge and collector stop first (reverse order of start); the sandbox outlives them so the
        # rollup can read what was collected.
        with ExitStack() as stack:
            collector = OtlpCollector(lambda request: fleet.ingest(request, time.time()))
            collector.start()
            stack.callback(collector.stop)
            pipeline.collector = collector.endpoint

            bridge = _start_bridge(sandbox.bootstrap, collector.endpoint, workdir)
            stack.callback(bridge.stop)
            _stop_if(interrupted)
            # Runs once the clients have stopped (the stack unwinds in reverse), before the bridge stops; only
            # when the run ended normally (not on Ctrl-C, nor on an error).
            ended = threading.Event()
            stack.callback(lambda: not ended.is_set() or interrupted.is_set() or interrupted.wait(_FINAL_PUSH_GRACE_S))

            workload = Workload(sandbox.bootstrap)
            workload.start()
            stack.callback(workload.stop)
            pipeline.client_ids = workload.client_ids()
            if use_java:
                pipeline.client_ids += _start_java_clients(stack, sandbox.bootstrap, workdir, interrupted)

            deadline = time.monotonic() + options.duration_s
            if options.output == "live":
                _live(fleet, pipeline, deadline, interrupted, options.refresh_s, bridge.check_alive,
                      lambda: (workload.produced, workload.consumed))
            else:
                _run_until(deadline, interrupted, bridge.check_alive)
            ended.set()
            log.info("stopping: clients, bridge, collector")
        if options.output == "jsonl":
            for client in fleet.clients():
                out.write(json.dumps(client.summary(), sort_keys=True) + "\n")
            out.flush()
        if options.rollup and interrupted.is_set():
            log.info("interrupted: the rollup (--rollup) is skipped")
        elif options.rollup:
            # Its rows are text: on stderr when stdout is JSON lines for a program to read.
            _rollup(pipeline.bootstrap, workdir, out if options.output == "live" else sys.stderr)
        log.info("stopping the sandbox")


def _want_java(choice: str) -> bool:
    if choice == "no":
        return False
    available = java_available() and _receiver_jar_exists()
    if choice == "yes" and not available:
        raise UserError("--java yes needs `java` on PATH and the receiver built (make receiver)")
    return available


def _receiver_jar_exists() -> bool:
    from kcm_sandbox import java_receiver

    return java_receiver.jar_path().exists()


def _apply_subscriptions(bootstrap: str, path: Path) -> list[str]:
    """Apply the example subscriptions through `kcm subscriptions apply`, the operator's reconcile core."""
    result = subprocess.run(_kcm("subscriptions", "apply", "-f", str(path), "--bootstrap-server", bootstrap),
                            capture_output=True, text=True, timeout=60, **own_child())
    if result.returncode != 0:
        reason = (result.stderr.strip() or result.stdout.strip()).removeprefix("kcm subscriptions: ")
        raise UserError(f"applying the demo subscriptions failed: {reason}")
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    for line in lines:
        log.info("subscriptions: %s", line)
    return lines


def _start_bridge(bootstrap: str, endpoint: str, workdir: Path) -> _Process:
    properties = workdir / "bridge-client.properties"
    properties.write_text(f"session.timeout.ms={_BRIDGE_SESSION_TIMEOUT_MS}\nheartbeat.interval.ms=1000\n"
                          "auto.offset.reset=earliest\n")
    return _Process("bridge", _kcm("bridge", "--bootstrap-server", bootstrap, "--command-config", str(properties),
                                   "--topic", DEFAULT_METRICS_TOPIC, "--group-id", _BRIDGE_GROUP,
                                   "--endpoint", endpoint, "--insecure"),
                    workdir / "bridge.log",
                    # The demo's bridge is the demo's: settings meant for a real one (a metrics port, a dead-letter
                    # topic, another consumer) must not change what it shows, or stop it.
                    {key: value for key, value in os.environ.items() if not key.startswith("KCM_BRIDGE_")})


def _start_java_clients(stack: ExitStack, bootstrap: str, workdir: Path, interrupted: threading.Event) -> list[str]:
    from kcm_sandbox.java_clients import JavaClient

    client_ids = []
    for role in ("producer", "consumer"):
        _stop_if(interrupted)
        # In a group, so the consumer has a coordinator and pushes its rebalance count (the live view shows it).
        extra_config = {"group.id": "inventory-java-app"} if role == "consumer" else {}
        client = JavaClient(bootstrap, client_id=f"inventory-java-{role}", role=role, topic="inventory",
                            extra_config=extra_config, log_path=workdir / f"java-{role}.log")
        stack.enter_context(client)
        client_ids.append(client.client_id)
    return client_ids


def _run_until(deadline: float, interrupted: threading.Event, check: Callable[[], None]) -> None:
    """Until `deadline` or an interruption, `check` (the bridge alive) every second at most."""
    while not interrupted.is_set() and time.monotonic() < deadline:
        check()
        interrupted.wait(min(1.0, max(0.0, deadline - time.monotonic())))


# Where stdout is not a terminal (`| tee`, a file, CI), the one view printed at the end is this wide: at 80 columns
# the table cut every identity (`softw…`) and wrapped the header.
_FILE_WIDTH = 160


def _live(fleet: Fleet, pipeline: Pipeline, deadline: float, interrupted: threading.Event, refresh_s: float,
          check: Callable[[], None], traffic: Callable[[], tuple[int, int]], console: Console | None = None) -> None:
    """The live view until `deadline`: the pipeline, the apps' records (`traffic`: produced and delivered, consumed)
    and the table of client instances; in a terminal redrawn in place with log lines above it, elsewhere printed
    once at the end."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    from kcm_demo.view import fleet_table

    console = console or Console()
    if not console.is_terminal:
        _run_until(deadline, interrupted, check)
        console.width = max(console.width, _FILE_WIDTH)

    def render() -> Group:
        remaining = max(0.0, deadline - time.monotonic())
        produced, consumed = traffic()
        header = Text.assemble(
            ("kcm demo", "bold"), f"  sandbox {pipeline.bootstrap} · receiver: {pipeline.receiver}\n",
            f"clients: {', '.join(pipeline.client_ids)}\n",
            f"the apps' records: {produced:,} produced, {consumed:,} consumed\n",
            f"bridge → OTLP collector {pipeline.collector} · Ctrl-C stops everything")
        return Group(header, fleet_table(fleet, time.time(),
                                          f"client instances · {fleet.exports} OTLP exports received · "
                                          f"{remaining:.0f} s left", width=console.width))

    if not console.is_terminal:
        console.print(render())
        return
    stderr = sys.stderr
    with Live(render(), console=console, refresh_per_second=max(1, int(1 / refresh_s)), transient=False) as live:
        # Log lines (the sandbox says each push) go above the view through the stderr Live put in place: written
        # to the terminal's stderr they landed inside the table, and each left a stale copy of the header behind.
        # Not when stderr goes elsewhere (`2> demo.log`): they stay there.
        on_screen = getattr(stderr, "isatty", lambda: False)()
        moved = [handler for handler in logging.getLogger().handlers
                 if on_screen and isinstance(handler, logging.StreamHandler) and handler.stream is stderr]
        for handler in moved:
            handler.setStream(sys.stderr)
        try:
            while not interrupted.is_set() and time.monotonic() < deadline:
                check()
                interrupted.wait(refresh_s)
                live.update(render())
        finally:
            for handler in moved:
                handler.setStream(stderr)


def _rollup(bootstrap: str, workdir: Path, out: IO[str]) -> None:
    """The Spark rollup over everything the demo collected (1-minute windows), and its top rows."""
    from kcm_rollups.job import run_rollup

    log.info("running the Spark rollup over %s (local Spark; the first run takes a while)", DEFAULT_METRICS_TOPIC)
    # PySpark installs its own SIGINT handler (it cancels jobs and raises KeyboardInterrupt): put the demo's back
    # afterwards, so a Ctrl-C while the sandbox stops does not break that off half-way.
    handler = signal.getsignal(signal.SIGINT)
    try:
        result = run_rollup(bootstrap, DEFAULT_METRICS_TOPIC, str(workdir / "rollups"), resolutions="1m", top=10)
    finally:
        signal.signal(signal.SIGINT, handler)
    out.write(f"rollup: Parquet in {workdir / 'rollups'}\n")
    for row in result.top_rows:
        out.write("  ".join(f"{name}={_cell(value)}" for name, value in row.items() if value is not None) + "\n")
    for line in result.summary_lines():
        out.write(f"rollup: {line}\n")
    out.flush()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def default_workdir() -> Path:
    """Where the demo keeps its child processes' logs: $KCM_DEMO_DIR (set and not empty), build/demo in a checkout,
    else a new temporary directory."""
    if os.environ.get("KCM_DEMO_DIR"):   # empty is unset, not the current directory
        return Path(os.environ["KCM_DEMO_DIR"])
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "examples" / "demo").is_dir():
        return _CHECKOUT / "build" / "demo"
    return Path(tempfile.mkdtemp(prefix="kcm-demo-"))
