"""The sandbox's Java glue: the plugin host (`JavaReceiver`) and the Java test clients (`JavaClient`), driven
through a stand-in `java` (a small Python script) instead of a JVM: the frames, arguments and configuration they
are given, how they start, stop and report. Found by a mutation review (27) to guard what the JVM tests let
through; fast, no broker."""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import time
import uuid
from pathlib import Path

import pytest

from kcm_common.errors import UserError
from test_sandbox_edges import _within


# --- helpers --------------------------------------------------------------------------------------------------


def _fake_java(monkeypatch, tmp_path: Path, script: str) -> Path:
    """Put a `java` on PATH that runs `script` (Python) with java's arguments; returns a file the script may write
    (its path is in FAKE_JAVA_OUT)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fake_java.py").write_text(script)
    java = bin_dir / "java"
    java.write_text(f'#!/bin/sh\nexec {sys.executable} {bin_dir / "fake_java.py"} "$@"\n')
    java.chmod(0o755)
    out = tmp_path / "fake-java.out"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_JAVA_OUT", str(out))
    return out


# A stand-in for the plugin host: 'R', then answers one push with 0 after writing down its argv, environment and
# the frame it was sent; exits at the end of its input.
_RECORDING_HOST = r"""
import json, os, struct, sys
out = sys.stdout.buffer
out.write(b"R"); out.flush()
stdin = sys.stdin.buffer
def read(n):
    data = b""
    while len(data) < n:
        chunk = stdin.read(n - len(data))
        if not chunk:
            raise SystemExit(0)
        data += chunk
    return data
frame = read(17)
for _ in range(4):
    (length,) = struct.unpack(">i", read(4))
    frame += struct.pack(">i", length) + (read(length) if length >= 0 else b"")
frame += read(8)
(size,) = struct.unpack(">i", read(4))
frame += struct.pack(">i", size) + read(size)
with open(os.environ["FAKE_JAVA_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "config": os.environ.get("KCM_JAVA_CONFIG"), "path": os.environ.get("PATH"),
               "frame": frame.hex()}, f)
out.write(b"\x00"); out.flush()
stdin.read()
"""


def _recording_receiver(monkeypatch, tmp_path, **options):
    from kcm_sandbox import java_receiver

    out = _fake_java(monkeypatch, tmp_path, _RECORDING_HOST)
    monkeypatch.setattr(java_receiver, "ensure_built", lambda: tmp_path)
    receiver = _within(30, lambda: java_receiver.JavaReceiver("127.0.0.1:9092", "metrics", 7, "cluster-x", **options))
    return receiver, out


def _push(payload: bytes = b"\n\x00", terminating: bool = False, interval_ms: int = 1500):
    from kcm_sandbox.telemetry import PushResult

    return PushResult(error_code=0, throttle_time_ms=0, payload=payload, subscription_id=1,
                      push_interval_ms=interval_ms, terminating=terminating)


def _properties(text: str) -> dict[str, str]:
    from kcm_common.java_config import read_properties

    return {entry.key: entry.value for entry in read_properties(text)}


# --- kcm_sandbox.java_receiver ---------------------------------------------------------------------------------


def test_a_push_frame_carries_the_terminating_flag_and_minus_one_for_what_is_unknown(monkeypatch, tmp_path):
    """R07 (terminating always 0) and R08 (no source port sent as 0): the plugin writes `terminating` and
    `client_source_port` from these fields, so a wrong value is a wrong header in the metrics topic."""
    from kcm_sandbox.telemetry import ClientIdentity

    receiver, out = _recording_receiver(monkeypatch, tmp_path)
    instance = uuid.UUID("0123456789abcdeffedcba9876543210")
    try:
        _within(20, lambda: receiver(instance, ClientIdentity("c1", None, None, "10.0.0.9", None),
                                     _push(b"\x0a\x00", terminating=True, interval_ms=1500)))
    finally:
        _within(20, receiver.close)
    frame = bytes.fromhex(json.loads(out.read_text())["frame"])
    expected = (instance.bytes + b"\x01" + struct.pack(">i", 2) + b"c1" + struct.pack(">i", -1) * 2
                + struct.pack(">i", 8) + b"10.0.0.9" + struct.pack(">iii", -1, 1500, 2) + b"\x0a\x00")
    assert frame == expected


def test_the_host_is_started_with_the_sized_heap_and_the_sized_plugin_config(monkeypatch, tmp_path):
    """R05 (producer buffer.memory not passed): a push larger than the producer's default 32 MiB buffer would be
    refused by the plugin's producer. Also pins -Xmx and the host's arguments."""
    from kcm_sandbox.java_receiver import memory_sizing

    receiver, out = _recording_receiver(monkeypatch, tmp_path, telemetry_max_bytes=40 << 20, api="3.8")
    from kcm_sandbox.telemetry import ClientIdentity
    try:
        _within(20, lambda: receiver(uuid.uuid4(), ClientIdentity("c", "x", "1", "127.0.0.1", 1), _push()))
    finally:
        _within(20, receiver.close)
    seen = json.loads(out.read_text())
    sizing = memory_sizing(40 << 20)
    assert f"-Xmx{sizing['heap'] // (1 << 20)}m" in seen["argv"]
    assert seen["argv"][-4:] == ["3.8", "dev.kcm.receiver.KcmClientTelemetry", "cluster-x", "7"]
    config = _properties(seen["config"])
    assert config["kcm.receiver.topic"] == "metrics" and config["kcm.receiver.bootstrap.servers"] == "127.0.0.1:9092"
    assert config["kcm.receiver.queue.max.bytes"] == str(sizing["queue"])
    assert config["kcm.receiver.producer.buffer.memory"] == str(sizing["buffer_memory"])


def test_the_heap_keeps_room_beyond_the_pushes_it_must_hold():
    """R02 (the 64 MiB headroom dropped): the JVM's own objects need room beside the queued pushes."""
    from kcm_sandbox.java_receiver import memory_sizing
    from kcm_sandbox.receiver import HEADER_ROOM_BYTES

    for size in (40 << 20, 256 << 20):
        push = size + HEADER_ROOM_BYTES
        sizing = memory_sizing(size)
        assert sizing["heap"] - (sizing["queue"] + sizing["buffer_memory"] + 2 * push) >= 64 << 20


def test_an_unknown_receiver_api_is_one_clear_error_before_any_jvm_starts(monkeypatch):
    """R16: without the check the user gets a KeyError traceback (after a build) instead of the choices."""
    from kcm_sandbox import java_receiver

    monkeypatch.setattr(java_receiver, "ensure_built", lambda: pytest.fail("built before the api was checked"))
    with pytest.raises(UserError, match=r"--receiver-api must be one of 3\.8, 4\.2, not '5\.0'"):
        java_receiver.JavaReceiver("127.0.0.1:9092", "t", 1, "c", api="5.0")


def test_jars_missing_from_the_build_directory_are_named(monkeypatch, tmp_path):
    """R15: kcm installed from a wheel, with KCM_RECEIVER_BUILD pointing at a directory without the jars."""
    from kcm_sandbox import java_receiver

    _fake_java(monkeypatch, tmp_path, "")
    monkeypatch.setattr(java_receiver, "BUILD_SCRIPT", tmp_path / "no-build.py")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "kcm-receiver.jar").write_bytes(b"")
    monkeypatch.setenv("KCM_RECEIVER_BUILD", str(empty))
    with pytest.raises(UserError, match=r"kcm-receiver-host\.jar, kcm-test-clients\.jar missing in .*empty"):
        java_receiver.ensure_built()


# A stand-in for the plugin host logging through its SLF4J provider (StderrLogs: "LEVEL logger: message" on stderr)
# beside the JVM's own output, then dying with an exception once its input ends.
_LOGGING_HOST = r"""
import json, os, sys
with open(os.environ["FAKE_JAVA_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:]}, f)
err = sys.stderr
err.write("OpenJDK 64-Bit Server VM warning: Sharing is only supported for boot loader classes\n")
err.write("INFO dev.kcm.receiver.ReceiverCore: kcm receiver: writing client pushes to topic metrics via x:9092\n")
err.write("WARN dev.kcm.receiver.TopicWriter: kcm receiver: 1 push dropped: the queue was full\n")
err.write("ERROR org.apache.kafka.clients.NetworkClient: [Producer clientId=p] cannot authenticate\n")
err.write("DEBUG dev.kcm.receiver.ReceiverCore: kcm receiver: could not take a push (java.lang.Error: x)\n")
err.write("WARNING: a JVM warning, no log line\n")
err.flush()
sys.stdout.buffer.write(b"R"); sys.stdout.buffer.flush()
sys.stdin.buffer.read()
err.write('Exception in thread "main" java.lang.IllegalStateException: the host broke\n')
err.write("WARN dev.kcm.receiver.TopicWriter: kcm receiver: closing: 2 queued push(es) dropped\n")
err.flush()
sys.exit(1)
"""


@pytest.mark.parametrize("python_level, java_level", [("INFO", "INFO"), ("DEBUG", "DEBUG"), ("WARNING", "INFO")])
def test_what_the_plugin_logs_is_logged_at_its_level_and_the_jvms_own_output_stays_debug(
        monkeypatch, tmp_path, caplog, python_level, java_level):
    """The host's log lines are forwarded at their level (WARN as WARNING), never a DEBUG line higher; anything else
    the JVM writes stays at DEBUG and is what `problem()` quotes. The host is told its provider, and its level from
    this logger's (INFO at least: Python's logging filters the rest)."""
    from kcm_sandbox import java_receiver

    caplog.set_level(python_level, logger="kcm.sandbox")
    out = _fake_java(monkeypatch, tmp_path, _LOGGING_HOST)
    monkeypatch.setattr(java_receiver, "ensure_built", lambda: tmp_path)
    receiver = _within(30, lambda: java_receiver.JavaReceiver("127.0.0.1:9092", "metrics", 7, "cluster-x"))
    _within(20, receiver.close)
    argv = json.loads(out.read_text())["argv"]
    assert f"-Dkcm.host.log.level={java_level}" in argv
    provider = argv.index("-Dslf4j.provider=dev.kcm.receiver.host.StderrLogs")
    assert provider < argv.index("dev.kcm.receiver.host.ReceiverHost")   # a JVM option, not an argument
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "kcm.sandbox.java_receiver"]
    expected = [
        ("DEBUG", "java receiver: OpenJDK 64-Bit Server VM warning: Sharing is only supported for boot loader "
                  "classes"),
        ("INFO", "java receiver: dev.kcm.receiver.ReceiverCore: kcm receiver: writing client pushes to topic metrics "
                 "via x:9092"),
        ("WARNING", "java receiver: dev.kcm.receiver.TopicWriter: kcm receiver: 1 push dropped: the queue was full"),
        ("ERROR", "java receiver: org.apache.kafka.clients.NetworkClient: [Producer clientId=p] cannot authenticate"),
        ("DEBUG", "java receiver: dev.kcm.receiver.ReceiverCore: kcm receiver: could not take a push "
                  "(java.lang.Error: x)"),
        ("DEBUG", "java receiver: WARNING: a JVM warning, no log line"),
        ("DEBUG", 'java receiver: Exception in thread "main" java.lang.IllegalStateException: the host broke'),
        ("WARNING", "java receiver: dev.kcm.receiver.TopicWriter: kcm receiver: closing: 2 queued push(es) dropped"),
    ]
    threshold = getattr(logging, python_level)
    assert logged == [(level, message) for level, message in expected if getattr(logging, level) >= threshold]
    # The log lines are not the JVM's last words: the exception is, though a WARN line came after it.
    assert receiver.problem() == "the Java receiver exited with code 1: the host broke"
    assert all(" dev.kcm." not in line and " org.apache." not in line for line in receiver._stderr)


# --- kcm_sandbox.java_clients ----------------------------------------------------------------------------------

# A stand-in for dev.kcm.clients.TestClient: writes down its argv and config, says "started" after a first line
# (as the JVM's own start-up chatter comes first), then runs until its stdin ends.
_CLIENT = r"""
import json, os, sys, time
print("SLF4J: warming up", flush=True)
time.sleep(float(os.environ.get("FAKE_JAVA_DELAY", "0")))
with open(os.environ["FAKE_JAVA_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "config": os.environ.get("KCM_JAVA_CONFIG")}, f)
print(os.environ.get("FAKE_JAVA_SAY", "started"), flush=True)
if os.environ.get("FAKE_JAVA_EXIT"):
    sys.exit(int(os.environ["FAKE_JAVA_EXIT"]))
if os.environ.get("FAKE_JAVA_HANG"):
    time.sleep(120)
sys.stdin.buffer.read()
with open(os.environ["FAKE_JAVA_OUT"] + ".closed", "w") as f:
    f.write("closed by end of input")
"""


def _client(monkeypatch, tmp_path, **options):
    from kcm_sandbox import java_clients

    out = _fake_java(monkeypatch, tmp_path, _CLIENT)
    monkeypatch.setattr(java_clients, "ensure_built", lambda: tmp_path)
    return java_clients.JavaClient("127.0.0.1:9092", **options), out


def test_a_java_client_role_other_than_producer_or_consumer_is_refused():
    """C01: a typo'd role otherwise reaches the JVM and surfaces as 'did not start' after a JVM start."""
    from kcm_sandbox.java_clients import JavaClient

    with pytest.raises(UserError, match="role must be one of producer, consumer, not 'admin'"):
        JavaClient("127.0.0.1:9092", client_id="x", role="admin")


def test_a_java_client_gets_its_extra_config_and_arguments(monkeypatch, tmp_path):
    """C02 (extra_config dropped: the demo's consumer would join no group) and C03 (max_seconds dropped)."""
    client, out = _client(monkeypatch, tmp_path, client_id="inv-consumer", role="consumer", topic="inventory",
                          extra_config={"group.id": "inventory-java-app"}, max_seconds=12.5)
    with client:
        seen = json.loads(out.read_text())
    assert seen["argv"][-5:] == ["consumer", "127.0.0.1:9092", "inventory", "inv-consumer", "12.5"]
    assert _properties(seen["config"]) == {"group.id": "inventory-java-app"}


def test_a_java_client_starts_only_once_it_says_started(monkeypatch, tmp_path):
    """C05: returning on the JVM's first line of output hands the caller a client that has not sent or joined."""
    monkeypatch.setenv("FAKE_JAVA_DELAY", "0.6")
    client, out = _client(monkeypatch, tmp_path, client_id="c", role="producer")
    with client:
        assert out.exists(), "start() returned before the client said it started"


def test_a_java_client_that_dies_at_start_is_reported_at_once(monkeypatch, tmp_path):
    """C04: a JVM that exited is not waited for until start_timeout_s (60 s by default)."""
    monkeypatch.setenv("FAKE_JAVA_SAY", "Exception in thread main: bootstrap refused")
    monkeypatch.setenv("FAKE_JAVA_EXIT", "1")
    client, _ = _client(monkeypatch, tmp_path, client_id="c", role="producer", start_timeout_s=30)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start"):   # its last words: see the report (a race)
        _within(10, client.start)
    assert time.monotonic() - started < 5


def test_stopping_a_java_client_ends_its_input_so_it_closes_itself(monkeypatch, tmp_path):
    """C06: without stdin closed the client never sends its terminating push and is killed after 20 s."""
    from kcm_sandbox import java_clients

    monkeypatch.setattr(java_clients, "_STOP_TIMEOUT_S", 3.0)
    client, out = _client(monkeypatch, tmp_path, client_id="c", role="producer")
    with client:
        process = client._process
    assert Path(str(out) + ".closed").exists() and process.returncode == 0
    assert client.returncode is None


def test_a_java_client_that_hangs_on_stop_is_killed(monkeypatch, tmp_path):
    """C07: stop() must return (the demo and tests wait on it) even when the JVM ignores the end of its input."""
    from kcm_sandbox import java_clients

    monkeypatch.setenv("FAKE_JAVA_HANG", "1")
    monkeypatch.setattr(java_clients, "_STOP_TIMEOUT_S", 0.3)
    client, _ = _client(monkeypatch, tmp_path, client_id="c", role="producer")
    client.start()
    process = client._process
    try:
        _within(8, client.stop)
        assert process.returncode is not None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_a_java_client_s_output_goes_to_its_log_file(monkeypatch, tmp_path):
    """C08: the demo points users at java-producer.log when a Java client misbehaves."""
    log_path = tmp_path / "java-producer.log"
    client, _ = _client(monkeypatch, tmp_path, client_id="c", role="producer", log_path=log_path)
    with client:
        pass
    assert log_path.read_text().splitlines() == ["SLF4J: warming up", "started"]


def test_a_java_client_that_dies_at_start_is_reported_with_its_last_words(monkeypatch, tmp_path):
    """The reader thread may get the JVM's last lines a moment after it exited (a busy machine, slowed here): the
    error is written once it has them, not from what was read so far ("did not start: []")."""
    from kcm_sandbox import java_clients

    monkeypatch.setenv("FAKE_JAVA_SAY", "Exception in thread main: bootstrap refused")
    monkeypatch.setenv("FAKE_JAVA_EXIT", "1")
    client, _ = _client(monkeypatch, tmp_path, client_id="c", role="producer", start_timeout_s=30)
    read = java_clients.JavaClient._read_output

    def late_reader(self) -> None:
        time.sleep(0.5)
        read(self)

    monkeypatch.setattr(java_clients.JavaClient, "_read_output", late_reader)
    with pytest.raises(RuntimeError, match=r"did not start: \['SLF4J: warming up', 'Exception in thread main: "
                                           r"bootstrap refused'\]"):
        _within(10, client.start)


def test_a_push_frame_is_written_whole_when_the_pipe_takes_it_in_parts():
    """A raw write blocked on a full pipe and interrupted by a signal returns having written part of the frame; the
    host would wait for the rest and the pushes fall out of step."""
    from kcm_sandbox.java_receiver import _write_all

    class Pipe:
        def __init__(self) -> None:
            self.taken = bytearray()

        def write(self, data) -> int:
            part = bytes(data[:3])
            self.taken += part
            return len(part)

    pipe, frame = Pipe(), bytes(range(256)) * 3
    _write_all(pipe, frame)
    assert bytes(pipe.taken) == frame


def test_the_receiver_sends_the_rest_of_a_frame_its_pipe_took_in_part(monkeypatch, tmp_path):
    from kcm_sandbox import java_receiver
    from kcm_sandbox.telemetry import ClientIdentity

    monkeypatch.setattr(java_receiver, "_REPLY_TIMEOUT_S", 3.0)
    receiver, out = _recording_receiver(monkeypatch, tmp_path)
    real = receiver._process.stdin

    class InParts:   # as a signal would cut a write short: each write takes at most 1000 bytes
        closed = property(lambda self: real.closed)

        def write(self, data) -> int:
            return real.write(bytes(data[:1000]))

        def close(self) -> None:
            real.close()

    receiver._process.stdin = InParts()
    payload = bytes(5000)
    try:
        _within(20, lambda: receiver(uuid.uuid4(), ClientIdentity("c", "x", "1", "127.0.0.1", 1), _push(payload)))
    finally:
        _within(20, receiver.close)
    assert bytes.fromhex(json.loads(out.read_text())["frame"]).endswith(struct.pack(">i", 5000) + payload)
