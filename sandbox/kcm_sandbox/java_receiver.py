"""The sandbox's Java receiver: kcm's broker plugin (receiver/) hosted in a JVM the way a broker hosts it.

The plugin is configured with broker-like properties, told the cluster and broker ids, and handed each accepted
push as a real `RequestContext` plus payload; its own KafkaProducer writes the record through the sandbox.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from kcm_common.children import own_child
from kcm_common.errors import UserError
from kcm_common.java_config import properties_text
from kcm_sandbox.receiver import HEADER_ROOM_BYTES
from kcm_sandbox.telemetry import DEFAULT_TELEMETRY_MAX_BYTES, ClientIdentity, PushResult

log = logging.getLogger("kcm.sandbox.java_receiver")

_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = _ROOT / "receiver" / "build.py"
PLUGIN_CLASSES = {"3.8": "dev.kcm.receiver.KcmClientTelemetry", "4.2": "dev.kcm.receiver.KcmTelemetryExporter"}
# What a broker's libs/ holds that the plugin needs: Kafka's client jar, slf4j and the codecs.
_RUNTIME_LIBS = ("kafka-clients-4.3.0.jar", "slf4j-api-2.0.18.jar", "zstd-jni-1.5.6-10.jar", "lz4-java-1.10.2.jar",
                 "snappy-java-1.1.1.7.jar")
_START_TIMEOUT_S = 30.0
_MIB = 1024 * 1024
# The largest push (telemetry.max.bytes) the hosted plugin is sized for: its JVM holds about six of them.
MAX_TELEMETRY_BYTES = 256 * _MIB
_REPLY_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 15.0
# The host's SLF4J provider (receiver/src/host/.../StderrLogs.java) writes each event the plugin and its producer log
# to stderr as one line, "LEVEL logger: message"; such lines are forwarded to Python logging at their level.
_LOG_PROVIDER = "dev.kcm.receiver.host.StderrLogs"
_LOG_LINE = re.compile(r"(TRACE|DEBUG|INFO|WARN|ERROR) (\S+): (.*)", re.DOTALL)
_LOG_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
               "ERROR": logging.ERROR}


def build_dir() -> Path:
    """Where receiver/build.py puts its output (KCM_RECEIVER_BUILD overrides, as for the script)."""
    return Path(os.environ.get("KCM_RECEIVER_BUILD", _ROOT / "build" / "receiver"))


def jar_path() -> Path:
    """The plugin jar users put in a broker's libs/ (build/receiver/kcm-receiver.jar)."""
    return build_dir() / "kcm-receiver.jar"


def runtime_classpath(*jars: Path) -> str:
    """The given jars plus Kafka's client jar, slf4j and the codecs, as a java -cp value."""
    lib = build_dir() / "lib"
    return os.pathsep.join([*map(str, jars), *(str(lib / name) for name in _RUNTIME_LIBS)])


def ensure_built() -> Path:
    """Bring the jars up to date with receiver/build.py (fast when they are); returns the build directory.

    Without the script (kcm installed from a wheel) the jars must already be in the build directory. Raises UserError.
    """
    if shutil.which("java") is None:
        raise UserError("the Java receiver and clients need `java` (JDK 17+) on PATH; use --receiver python")
    if BUILD_SCRIPT.exists():
        done = subprocess.run([sys.executable, str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=600,
                              check=False)
        if done.returncode != 0:
            raise UserError(f"building the Java receiver failed: {done.stderr.strip()}")
    needed = (jar_path(), build_dir() / "kcm-receiver-host.jar", build_dir() / "kcm-test-clients.jar")
    missing = [path.name for path in needed if not path.exists()]
    if missing:
        raise UserError(f"{', '.join(missing)} missing in {build_dir()}; run receiver/build.py from a kcm checkout "
                        "and point KCM_RECEIVER_BUILD at its build/receiver")
    return build_dir()


# The environment variable the Java processes kcm starts read their Kafka properties from (java.util.Properties text).
JAVA_CONFIG_VARIABLE = "KCM_JAVA_CONFIG"


def java_config_env(properties: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus `properties` for a JVM kcm starts: not its command line, where `ps` shows every
    user a password."""
    return {**os.environ, JAVA_CONFIG_VARIABLE: properties_text(dict(properties))}


def memory_sizing(telemetry_max_bytes: int) -> dict[str, int]:
    """Plugin queue, producer buffer and JVM heap (bytes) for pushes of up to `telemetry_max_bytes`: the queue holds
    two of the largest, the producer's buffer one more, and the host reads one; the defaults suit 1 MiB pushes."""
    # A push's headers (its client id, software name and version may each take 32 KiB) and the plugin's overhead: the
    # room the Python receiver leaves.
    push = telemetry_max_bytes + HEADER_ROOM_BYTES
    queue = max(16 * _MIB, 2 * push)  # the plugin's own default, kcm.receiver.queue.max.bytes
    buffer_memory = max(32 * _MIB, push)  # the producer refuses a record larger than buffer.memory
    return {"queue": queue, "buffer_memory": buffer_memory,
            "heap": max(128 * _MIB, queue + buffer_memory + 2 * push + 64 * _MIB)}


class JavaReceiver:
    """Feeds pushes to the plugin in a JVM over its stdin; a call returns once the plugin has taken the push."""

    def __init__(self, bootstrap: str, topic: str, broker_id: int, cluster_id: str, api: str = "4.2",
                 extra_config: dict[str, str] | None = None,
                 telemetry_max_bytes: int = DEFAULT_TELEMETRY_MAX_BYTES) -> None:
        if api not in PLUGIN_CLASSES:
            raise UserError(f"--receiver-api must be one of {', '.join(PLUGIN_CLASSES)}, not {api!r}")
        ensure_built()
        # Every push the gateway accepts must fit whole: a push larger than the plugin's queue would be dropped.
        sizing = memory_sizing(telemetry_max_bytes)
        config = {
            "kcm.receiver.topic": topic,
            "kcm.receiver.bootstrap.servers": bootstrap,
            "kcm.receiver.queue.max.bytes": str(sizing["queue"]),
            "kcm.receiver.producer.buffer.memory": str(sizing["buffer_memory"]),
            "listeners": f"PLAINTEXT://{bootstrap}",
            **(extra_config or {}),
        }
        # The plugin logs at INFO and above (DEBUG when this logger does); Kafka's own loggers at WARN and above.
        java_level = "DEBUG" if log.isEnabledFor(logging.DEBUG) else "INFO"
        command = ["java", f"-Xmx{sizing['heap'] // _MIB}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   f"-Dslf4j.provider={_LOG_PROVIDER}", "-Dslf4j.internal.verbosity=WARN",
                   f"-Dkcm.host.log.level={java_level}",
                   "-cp", runtime_classpath(build_dir() / "kcm-receiver-host.jar", jar_path()),
                   "dev.kcm.receiver.host.ReceiverHost", api, PLUGIN_CLASSES[api], cluster_id, str(broker_id)]
        self._lock = threading.Lock()
        # Set when an exchange went out of step (a reply not read in time stays in the pipe, and would be taken
        # for the next push's): every later push would get another push's answer, so none is sent any more.
        self._broken: str | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        # Stopped by closing its stdin (the plugin's close runs then).
        # The broker properties (producer credentials among them) go in the environment, which only this user can
        # read, never on the command line, which `ps` shows every user.
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0, env=java_config_env(config),
                                         **own_child())
        self._drain = threading.Thread(target=self._read_stderr, name="kcm-java-receiver-log", daemon=True)
        self._drain.start()
        try:
            ready = self._read(1, _START_TIMEOUT_S)
        except RuntimeError as exc:
            self.close()
            raise UserError(f"the Java receiver did not start: {self._last_error() or exc}") from None
        if ready != b"R":
            self.close()
            raise UserError(f"the Java receiver did not start: {self._last_error() or ready!r}")

    def __call__(self, instance_id: uuid.UUID, identity: ClientIdentity, push: PushResult) -> None:
        assert push.payload is not None
        frame = b"".join((
            instance_id.bytes,
            b"\x01" if push.terminating else b"\x00",
            _text(identity.client_id), _text(identity.software_name), _text(identity.software_version),
            _text(identity.source_address),
            struct.pack(">ii", -1 if identity.source_port is None else identity.source_port, push.push_interval_ms),
            struct.pack(">i", len(push.payload)), push.payload,
        ))
        # One exchange at a time: the gateway calls receivers from a thread pool.
        with self._lock:
            if self._broken is not None:
                raise RuntimeError(self._broken)
            assert self._process.stdin is not None
            try:
                _write_all(self._process.stdin, frame)
            except OSError as exc:
                raise RuntimeError(f"the Java receiver is gone: {self._last_error() or exc}") from None
            try:
                reply = self._read(1, _REPLY_TIMEOUT_S)
                if reply == b"\x01":
                    (length,) = struct.unpack(">i", self._read(4, _REPLY_TIMEOUT_S))
                    thrown = self._read(length, _REPLY_TIMEOUT_S).decode(errors="replace")
                elif reply != b"\x00":
                    raise RuntimeError(f"the Java receiver answered {reply!r}, which is no reply")
            except RuntimeError as exc:
                self._broken = f"the Java receiver is out of step with the pushes: {exc}"
                raise RuntimeError(self._broken) from None
            if reply == b"\x01":
                raise RuntimeError(f"the plugin threw: {thrown}")

    def problem(self) -> str | None:
        """Why the JVM can no longer take pushes (it exited, or stopped answering in step), or None while it does."""
        code = self._process.poll()
        if code is None:
            return self._broken
        return f"the Java receiver exited with code {code}: {self._last_error() or 'no message'}"

    def close(self) -> None:
        """Close stdin: the host closes the plugin, which flushes what it holds, and exits."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("the Java receiver did not stop within %.0f s; killing it", _STOP_TIMEOUT_S)
            self._process.kill()
            self._process.wait()
        self._drain.join(timeout=5)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def _read(self, size: int, timeout_s: float) -> bytes:
        stdout = self._process.stdout
        assert stdout is not None
        data = b""
        while len(data) < size:
            ready, _, _ = select.select([stdout], [], [], timeout_s)
            if not ready:
                raise RuntimeError(f"no answer from the Java receiver within {timeout_s:.0f} s")
            chunk = stdout.read(size - len(data))
            if not chunk:
                raise RuntimeError(f"the Java receiver exited (code {self._process.poll()})")
            data += chunk
        return data

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for raw in self._process.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip()
            logged = _LOG_LINE.fullmatch(line)
            if logged:
                # A line the plugin or its producer logged, at its own level; kept out of `_stderr`, which holds the
                # JVM's own output (an exception at start-up) for _last_error.
                log.log(_LOG_LEVELS[logged[1]], "java receiver: %s: %s", logged[2], logged[3])
                continue
            self._stderr.append(line)
            log.debug("java receiver: %s", line)

    def _last_error(self) -> str:
        # The host prints Java's exception last; its first line names the bad property.
        for line in list(self._stderr):
            if "Exception: " in line:
                return line.split("Exception: ", 1)[1]
        lines = list(self._stderr)
        return lines[-1] if lines else ""


def _write_all(stdin: IO[bytes], frame: bytes) -> None:
    """The whole frame: the pipe is unbuffered (a raw write), and a write blocked on a full pipe that a signal
    interrupts returns having written part of it; the host would wait for the rest, and the pushes fall out of step."""
    view = memoryview(frame)
    while view:
        view = view[stdin.write(view):]


def _text(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">i", -1)
    encoded = value.encode()
    return struct.pack(">i", len(encoded)) + encoded
