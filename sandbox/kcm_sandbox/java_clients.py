"""Real Java Kafka clients (kafka-clients 4.3.0) for tests and the demo: they push KIP-714 telemetry as
`apache-kafka-java`. Each runs in its own JVM until the context exits, then closes (its terminating push).
"""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from kcm_common.children import own_child
from kcm_common.errors import UserError
from kcm_sandbox.java_receiver import build_dir, ensure_built, java_config_env, runtime_classpath

ROLES = ("producer", "consumer")
_MAIN_CLASS = "dev.kcm.clients.TestClient"
_STOP_TIMEOUT_S = 20.0


class JavaClient:
    """A Java producer (one small record every 20 ms) or consumer (assigned, polling) on `topic`.

    `with JavaClient(bootstrap, client_id="orders-java", role="producer", topic="orders") as client:` returns once
    the client has sent its first record or been assigned its partitions.
    """

    def __init__(self, bootstrap: str, client_id: str, role: str = "producer", topic: str = "inventory",
                 extra_config: Mapping[str, str] | None = None, log_path: Path | None = None,
                 max_seconds: float = 3600.0, start_timeout_s: float = 60.0) -> None:
        if role not in ROLES:
            raise UserError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.role = role
        self.topic = topic
        self.extra_config = dict(extra_config or {})
        self.log_path = log_path
        self.max_seconds = max_seconds
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=20)
        self._started = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        ensure_built()
        command = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   "-cp", runtime_classpath(build_dir() / "kcm-test-clients.jar"), _MAIN_CLASS,
                   self.role, self.bootstrap, self.topic, self.client_id, str(self.max_seconds)]
        self._log = self.log_path.open("ab") if self.log_path is not None else None
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=java_config_env(self.extra_config),
                                         **own_child())
        self._reader = threading.Thread(target=self._read_output, name=f"java-client-{self.client_id}",
                                        daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._started.wait(0.1):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()   # which lets the reader take the JVM's last words first
                raise RuntimeError(f"Java {self.role} {self.client_id!r} did not start: {list(self._tail)[-5:]}")

    def stop(self) -> None:
        """Close stdin so the client closes itself (sending its terminating push); kill it if it hangs."""
        process = self._process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.closed:
            try:
                process.stdin.close()
            except OSError:
                pass  # already gone
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._log is not None:
            self._log.close()
        self._process = None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def _read_output(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for raw in self._process.stdout:
            if self._log is not None:
                self._log.write(raw)
                self._log.flush()
            line = raw.decode("utf-8", errors="replace").rstrip()
            self._tail.append(line)
            if line == "started":
                self._started.set()

    def __enter__(self) -> JavaClient:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
