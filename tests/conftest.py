"""Shared fixtures: the embedded broker, topics on it, the sandbox, and a fake OpenTelemetry collector."""

from __future__ import annotations

import itertools
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.broker import EmbeddedBroker
from fake_collector import FakeCollector
from kcm_sandbox.runner import Sandbox, SandboxOptions

_topic_numbers = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    """Tests play a terminal's Ctrl-C to a foreground `kcm`. A suite started as a background job (`make test &`,
    nohup) inherits SIGINT ignored, and so would every command it starts: with a Python handler here instead, the
    commands start with the default, as from a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


SPARK_FILES = "tests/test_rollup_"   # the files whose tests may use the suite's SparkSession (the `spark` fixture)


def xdist_unit(nodeid: str) -> str:
    """What one pytest-xdist worker takes at a time under `make test` (`-n 2 --dist loadfile`): a whole file, so
    module fixtures and the order within a file stay as in a serial run, and all the Spark files together, so the
    suite still starts one SparkSession."""
    path = nodeid.split("::", 1)[0]
    return "spark" if path.startswith(SPARK_FILES) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile` with the Spark files as one unit (pytest-xdist's own `loadgroup` cannot be used: it renames
    test ids through an attribute pytest 9.2 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndSpark(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return FilesAndSpark(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test elsewhere using the SparkSession would start a second one on the other worker: refused at once."""
    strays = [item.nodeid for item in items
              if "spark" in getattr(item, "fixturenames", ()) and xdist_unit(item.nodeid) != "spark"]
    if strays:
        raise pytest.UsageError(f"tests using the `spark` fixture belong in {SPARK_FILES}*.py: {strays[0]}")


@pytest.fixture(autouse=True)
def kafka_python_silenced_as_kcm_silences_it() -> Iterator[None]:
    """`kcm` commands set kafka-python's own logger to CRITICAL (kcm_cli.main: it narrates every connection, and
    its IO thread logs tracebacks for sockets a broker resets or a close takes away); a bridge or an admin client
    running inside a test gets the same policy, so what a test counts in caplog is kcm's own."""
    logger = logging.getLogger("kafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def switch_interval_kept() -> Iterator[None]:
    """`kcm bridge` sets the process's GIL switch interval (kcm_bridge.pipeline.tune_interpreter): run in a test's
    process, it is put back after that test."""
    interval = sys.getswitchinterval()
    yield
    sys.setswitchinterval(interval)


@pytest.fixture
def broker(tmp_path) -> Iterator[EmbeddedBroker]:
    """A fresh embedded Kafka-compatible broker (Tansu) on a free loopback port, stopped after the test."""
    embedded = EmbeddedBroker(log_path=tmp_path / "tansu.log")
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture
def misadvertised_broker(tmp_path) -> Iterator[tuple[EmbeddedBroker, str]]:
    """A broker whose metadata names an address nothing listens on (advertised.listeners set wrong, as for clients
    outside a Kubernetes cluster), with the topics `kafka-client-metrics` and `telemetry` created through its own
    address; yields it and the address it advertises."""
    from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
    from test_sandbox_protocol import KafkaConnection

    from kcm_sandbox.broker import free_port

    unreachable = f"127.0.0.1:{free_port()}"
    embedded = EmbeddedBroker(advertised=unreachable, log_path=tmp_path / "tansu.log")
    embedded.start()
    try:
        with KafkaConnection(embedded.bootstrap) as connection:  # straight to the broker: no metadata needed
            created = connection.call(CreateTopicsRequest[4](topics=[CreateTopicsRequest.CreatableTopic(
                name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])
                for name in ("kafka-client-metrics", "telemetry")], timeout_ms=5000, validate_only=False),
                CreateTopicsResponse)
        assert [topic.error_code for topic in created.topics] == [0, 0]
        yield embedded, unreachable
    finally:
        embedded.stop()


@pytest.fixture
def tls_listener_for_another_name(tmp_path) -> Iterator[tuple[int, Path]]:
    """A loopback TLS listener whose certificate, from a test CA, names only kafka-0.other-name: yields its port and
    the CA file (trusting it, a client that checks host names still refuses the listener)."""
    import contextlib
    import socket
    import ssl
    import subprocess
    import threading

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test-ca", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kafka-0.other-name", "-keyout", "broker.key",
            "-out", "broker.csr")
    (tmp_path / "san").write_text("subjectAltName=DNS:kafka-0.other-name\n")
    openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "san", "-out", "broker.pem")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "broker.pem", tmp_path / "broker.key")
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                with contextlib.suppress(OSError), connection:
                    server_context.wrap_socket(connection, server_side=True).close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], tmp_path / "ca.pem"
    finally:
        listener.close()


@pytest.fixture
def kafka(broker: EmbeddedBroker) -> KafkaSettings:
    return KafkaSettings(broker.bootstrap)


@pytest.fixture
def new_topic(kafka: KafkaSettings):
    """Create a uniquely named topic: `new_topic(partitions=1) -> name`."""

    def create(partitions: int = 1, prefix: str = "test") -> str:
        name = f"{prefix}-{next(_topic_numbers)}"
        ensure_topic(kafka, name, partitions)
        return name

    return create


@pytest.fixture
def collector() -> Iterator[FakeCollector]:
    """A fake OpenTelemetry collector: a real OTLP/gRPC MetricsService on loopback that records exports and can be
    told to fail."""
    fake = FakeCollector()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def sandbox_factory():
    """Start sandboxes with given options (`sandbox_factory(compression=[4])`); all are stopped after the test."""
    started: list[Sandbox] = []

    def start(**options) -> Sandbox:
        options.setdefault("listen", ("127.0.0.1", 0))
        instance = Sandbox(SandboxOptions(**options))
        instance.start()
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop()


@pytest.fixture
def sandbox(sandbox_factory) -> Sandbox:
    """A running sandbox (embedded broker + KIP-714 gateway) on free loopback ports."""
    return sandbox_factory()


@pytest.fixture
def authenticating_broker(tmp_path) -> Iterator[str]:
    """Tansu requiring SASL authentication and knowing no user, so every credential is rejected."""
    embedded = EmbeddedBroker(log_path=tmp_path / "tansu-auth.log", authentication=True)
    embedded.start()
    try:
        yield embedded.bootstrap
    finally:
        embedded.stop()


@pytest.fixture
def kopf_runs(monkeypatch) -> list[dict]:
    """`kcm operator` run in this process up to kopf.run, which records its arguments instead of running; the
    Kubernetes API "found" in-cluster (the client's default configuration then)."""
    import kopf
    from kubernetes import client
    from kubernetes import config as kube_config

    runs: list[dict] = []
    saved = client.Configuration.get_default_copy()

    def in_cluster(*args, **kwargs) -> None:
        found = client.Configuration()
        found.host = "https://kubernetes.default.svc:443"
        client.Configuration.set_default(found)

    monkeypatch.setattr(kopf, "run", lambda **kwargs: runs.append(kwargs))
    monkeypatch.setattr(kube_config, "load_incluster_config", in_cluster)
    levels = {name: logging.getLogger(name).level for name in ("kafka", "py4j")}
    yield runs
    client.Configuration.set_default(saved)
    for name, level in levels.items():   # main() sets them for the process
        logging.getLogger(name).setLevel(level)
