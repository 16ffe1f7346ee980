"""The whole sandbox, started and stopped as one: embedded broker, metrics topic, receiver and gateway."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from kafka import KafkaAdminClient

from kcm_common.errors import UserError
from kcm_common import contract
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_common.retry import LONGEST_WAIT_S
from kcm_common.names import DEFAULT_METRICS_TOPIC
from kcm_sandbox.broker import EmbeddedBroker
from kcm_sandbox.store import SubscriptionStore
from kcm_sandbox.gateway import DEFAULT_CONNECTIONS_MAX_IDLE_MS, Gateway
from kcm_sandbox.java_receiver import MAX_TELEMETRY_BYTES as JAVA_MAX_TELEMETRY_BYTES, JavaReceiver
from kcm_sandbox.receiver import TopicReceiver
from kcm_sandbox.telemetry import (
    DEFAULT_ACCEPTED_COMPRESSION,
    DEFAULT_TELEMETRY_MAX_BYTES,
    ClientIdentity,
    PushResult,
    TelemetryManager,
)

_COMPRESSION_BY_NAME = {name: code for code, name in contract.COMPRESSION_IDS.items() if name != "none"}


class SandboxError(UserError):
    """The sandbox could not start; the message says what to change."""


def compression_ids(names: str) -> list[int]:
    """`zstd,lz4` → KIP-714 compression ids, in the order given (the order clients are offered)."""
    ids = []
    for name in (part.strip().lower() for part in names.split(",")):
        if name not in _COMPRESSION_BY_NAME:
            raise SandboxError(f"unknown compression {name!r}; choose from {', '.join(_COMPRESSION_BY_NAME)}")
        if _COMPRESSION_BY_NAME[name] in ids:
            raise SandboxError(f"--compression names {name!r} twice; give each codec once, in the order to offer")
        ids.append(_COMPRESSION_BY_NAME[name])
    return ids


def parse_address(text: str, option: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host.startswith("[") or ":" in host:
        raise SandboxError(f"{option} {text!r}: the sandbox listens on IPv4 only; use an address such as 127.0.0.1")
    # ASCII digits only: str.isdigit() also takes '²' or '٣', which int() refuses.
    if not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise SandboxError(f"{option} must be HOST:PORT, not {text!r}")
    return host, int(port)


def _unspecified(host: str) -> bool:
    """Whether `host` is the IPv4 wildcard in any form inet_aton reads (0.0.0.0, 0)."""
    try:
        return socket.inet_aton(host) == bytes(4)
    except OSError:
        return False


_INT32_MAX = 2**31 - 1
_MAX_PARTITIONS = 10_000
_MAX_IDLE_MS = LONGEST_WAIT_S * 1000


@dataclass
class SandboxOptions:
    listen: tuple[str, int] = ("127.0.0.1", 9092)   # port 0: pick a free one
    topic: str = DEFAULT_METRICS_TOPIC
    partitions: int = 1
    compression: list[int] = field(default_factory=lambda: list(DEFAULT_ACCEPTED_COMPRESSION))
    telemetry_max_bytes: int = DEFAULT_TELEMETRY_MAX_BYTES
    connections_max_idle_ms: int = DEFAULT_CONNECTIONS_MAX_IDLE_MS  # idle (or one frame slower) than this: closed
    state: Path | None = None
    upstream: tuple[str, int] | None = None        # a running broker instead of the embedded one
    receiver: str = "python"                      # or "java": kcm's broker plugin hosted in a JVM
    receiver_api: str = "4.2"                     # the plugin interface the Java receiver is called through

    def validate(self) -> None:
        """Raise SandboxError naming the first option out of range."""
        if _unspecified(self.listen[0]):
            # The broker advertises the listen address, and clients cannot connect to 0.0.0.0 (Kafka refuses it too).
            raise SandboxError(f"--listen {self.listen[0]}: clients are told to connect to the listen address; give "
                               "one they can use (127.0.0.1, or this host's IP), not the wildcard")
        # Partition counts and telemetry.max.bytes are INT32 on the wire; the idle time fits a broker's long.
        if not 1 <= self.partitions <= _MAX_PARTITIONS:
            raise SandboxError(f"--partitions must be from 1 to {_MAX_PARTITIONS}, not {self.partitions}")
        if not 1 <= self.telemetry_max_bytes <= _INT32_MAX:
            raise SandboxError(f"--telemetry-max-bytes must be from 1 to {_INT32_MAX}, not {self.telemetry_max_bytes}")
        if self.receiver == "java" and self.telemetry_max_bytes > JAVA_MAX_TELEMETRY_BYTES:
            raise SandboxError(f"--telemetry-max-bytes with --receiver java must be at most {JAVA_MAX_TELEMETRY_BYTES} "
                               f"(what its JVM is sized for), not {self.telemetry_max_bytes}; use --receiver python "
                               "for larger pushes")
        if not 1 <= self.connections_max_idle_ms <= _MAX_IDLE_MS:
            raise SandboxError(f"--connections-max-idle-ms must be from 1 to {_MAX_IDLE_MS} (a year), not "
                               f"{self.connections_max_idle_ms}")


class Sandbox:
    """Runs the gateway on its own event-loop thread, so callers (the CLI, tests, the demo) stay synchronous."""

    def __init__(self, options: SandboxOptions | None = None) -> None:
        self.options = options or SandboxOptions()
        self.broker: EmbeddedBroker | None = None
        self.store: SubscriptionStore | None = None
        self.gateway: Gateway | None = None
        self._receiver: TopicReceiver | JavaReceiver | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None

    @property
    def bootstrap(self) -> str:
        assert self.gateway is not None, "the sandbox is not running"
        return f"{self.gateway.host}:{self.gateway.port}"

    @property
    def upstream_bootstrap(self) -> str:
        """The broker behind the gateway (clients must not use it: it knows nothing of KIP-714)."""
        if self.options.upstream is not None:
            return "%s:%d" % self.options.upstream
        assert self.broker is not None
        return self.broker.bootstrap

    def start(self, timeout: float = 30.0) -> None:
        options = self.options
        options.validate()
        host, port = options.listen
        try:
            # Listening from the start: the broker advertises this port, and a port merely seen free could be taken
            # (by any connection's local end) while the broker starts.
            try:
                self._listener = socket.create_server((host, port))
            except OSError as exc:
                why = os.strerror(exc.errno) if exc.errno else str(exc)   # create_server's strerror names a tuple
                raise SandboxError(f"--listen {host}:{port}: cannot listen on it ({why}); give an address of this "
                                   "host and a free port (port 0 picks one)") from None
            port = self._listener.getsockname()[1]
            self.store = SubscriptionStore(options.state)  # a state file it cannot use stops it before the broker
            if options.upstream is None:
                self.broker = EmbeddedBroker(host=host, advertised=f"{host}:{port}")
                self.broker.start()
            telemetry = TelemetryManager(self.store, options.compression, options.telemetry_max_bytes)
            self.gateway = Gateway(parse_address(self.upstream_bootstrap, "--upstream"), self.store, telemetry,
                                   self._receive, self._listener, host=host,
                                   connections_max_idle_ms=options.connections_max_idle_ms,
                                   metrics_topic=options.topic)
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="kcm-sandbox-gateway", daemon=True)
            self._thread.start()
            asyncio.run_coroutine_threadsafe(self.gateway.start(), self._loop).result(timeout)
            # The broker advertises the gateway, so every other client, ours included, goes through it.
            settings = KafkaSettings(self.bootstrap)
            ensure_topic(settings, options.topic, options.partitions)
            broker_id, cluster_id = _cluster_identity(settings)
            self._receiver = _receiver(options, settings, broker_id, cluster_id)
        except OSError as exc:
            self.stop()
            raise SandboxError(f"cannot start the broker behind {host}:{port} or reach it: {exc.strerror or exc}") from exc
        except Exception:
            self.stop()
            raise

    def _receive(self, instance_id: uuid.UUID, identity: ClientIdentity, push: PushResult) -> None:
        if self._receiver is None:
            if not push.payload:   # nothing to write (a subscription selecting none of its metrics): accepted
                return
            raise SandboxError("the metrics topic is not ready yet")
        self._receiver(instance_id, identity, push)

    def problem(self) -> str | None:
        """Why the sandbox can no longer serve (its broker or Java receiver died), or None."""
        if self.broker is not None and (problem := self.broker.problem()):
            return problem
        if isinstance(self._receiver, JavaReceiver):
            return self._receiver.problem()
        return None

    def stop(self) -> None:
        # The receiver's producer goes first, while the gateway it writes through is still there; the rest stops
        # whatever its close raises.
        receiver, self._receiver = self._receiver, None
        try:
            if receiver is not None:
                receiver.close()
        finally:
            self._stop_serving()

    def _stop_serving(self) -> None:
        try:
            if self._loop is not None:
                try:
                    if self.gateway is not None and self._loop.is_running():
                        asyncio.run_coroutine_threadsafe(self.gateway.stop(), self._loop).result(10)
                finally:   # the loop's thread ends whatever the gateway's stop raised
                    self._loop.call_soon_threadsafe(self._loop.stop)
                    if self._thread is not None:
                        self._thread.join(timeout=10)
                    self._loop.close()
                    self._loop = None
        finally:
            if self._listener is not None:   # the gateway's server closed it already, unless it never started
                self._listener.close()
                self._listener = None
            if self.broker is not None:
                self.broker.stop()

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _receiver(options: SandboxOptions, settings: KafkaSettings, broker_id: int,
              cluster_id: str) -> TopicReceiver | JavaReceiver:
    if options.receiver == "java":
        return JavaReceiver(settings.bootstrap_servers, options.topic, broker_id, cluster_id, options.receiver_api,
                            telemetry_max_bytes=options.telemetry_max_bytes)
    if options.receiver != "python":
        raise SandboxError(f"--receiver must be python or java, not {options.receiver!r}")
    return TopicReceiver(settings, options.topic, broker_id, cluster_id,
                         telemetry_max_bytes=options.telemetry_max_bytes)


def _cluster_identity(settings: KafkaSettings) -> tuple[int, str]:
    admin = KafkaAdminClient(**settings.client_options())
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return cluster["brokers"][0]["broker_id"], cluster["cluster_id"] or ""
