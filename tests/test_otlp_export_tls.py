"""OTLP/gRPC export over TLS to a real gRPC server: a private CA, mutual TLS, and metadata tokens from files.

The exporter is kcm_common's, shared by the bridge (`endpoints[].tls`) and the rollup job (`--otlp-ca-file`, ...).
Certificates are made by openssl for each test module.
"""

from __future__ import annotations

import logging
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from kcm_bridge.config import EndpointConfig, TlsConfig
from kcm_bridge.export import open_endpoint
from kcm_common.errors import UserError
from kcm_common.otlp_export import Endpoint, RetryPolicy, Tls
from kcm_rollups.otlp import OtlpTarget, export
from payloads import client_metrics

FAST = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05)
SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def _openssl(*arguments: str, cwd: Path) -> None:
    subprocess.run(["openssl", *arguments], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(directory: Path, name: str, extensions: str) -> None:
    """`name`.pem and `name`.key, signed by the CA in `directory`."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=directory)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test-ca", "-days", "2",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=directory)
    _signed(directory, "server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _signed(directory, "client", "extendedKeyUsage=clientAuth\n")
    (directory / "token").write_text("Bearer s3cret-token\n")
    # Old but valid for gRPC's BoringSSL: a 1024-bit key, which OpenSSL's default security level refuses.
    _openssl("req", "-x509", "-newkey", "rsa:1024", "-nodes", "-subj", "/CN=small", "-days", "2",
             "-keyout", "small.key", "-out", "small.pem", cwd=directory)
    return directory


class TlsCollector:
    """A gRPC server on TLS that acknowledges every Export and keeps each call's metadata."""

    def __init__(self, certificates: Path, require_client_certificate: bool) -> None:
        self.calls: list[dict[str, str]] = []
        self._lock = threading.Lock()
        credentials = grpc.ssl_server_credentials(
            [((certificates / "server.key").read_bytes(), (certificates / "server.pem").read_bytes())],
            root_certificates=(certificates / "ca.pem").read_bytes(),
            require_client_auth=require_client_certificate)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._export)}),))
        # The certificate names 127.0.0.1 as well: bound there only, no other process can answer on ::1.
        self.endpoint = f"127.0.0.1:{self._server.add_secure_port('127.0.0.1:0', credentials)}"
        self._server.start()

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.calls.append(dict(context.invocation_metadata()))
        return b""  # an empty ExportMetricsServiceResponse: all accepted

    def stop(self) -> None:
        self._server.stop(0)


@pytest.fixture
def tls_collector(certificates):
    collectors: list[TlsCollector] = []

    def start(require_client_certificate: bool = False) -> TlsCollector:
        collectors.append(TlsCollector(certificates, require_client_certificate))
        return collectors[-1]

    yield start
    for collector in collectors:
        collector.stop()


def _within(seconds: float):
    """A give_up callback: retry for `seconds`, so a failing handshake fails the test instead of hanging it."""
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def _send(endpoint: Endpoint) -> object:
    try:
        return endpoint.export(client_metrics().SerializeToString())
    finally:
        endpoint.close()


def test_a_private_ca_is_trusted_and_the_token_from_a_file_goes_with_each_call(certificates, tls_collector):
    collector = tls_collector()
    config = EndpointConfig(endpoint=collector.endpoint, tls=TlsConfig(ca_file=str(certificates / "ca.pem")),
                            headers_from_files={"authorization": str(certificates / "token")})
    outcome = _send(open_endpoint(config, FAST, _within(10)))
    assert outcome.delivered
    assert [call["authorization"] for call in collector.calls] == ["Bearer s3cret-token"]


def test_a_server_certificate_the_client_cannot_verify_is_not_delivered_to(tls_collector, caplog):
    collector = tls_collector()
    # System roots do not know the test CA: the handshake fails, which gRPC reports as UNAVAILABLE (retryable).
    outcome = _send(Endpoint(collector.endpoint, FAST, lambda: True, timeout_s=5))
    assert (outcome.delivered, outcome.error) == (False, "UNAVAILABLE")
    assert collector.calls == []
    plaintext = _send(Endpoint(collector.endpoint, FAST, lambda: True, insecure=True, timeout_s=5))
    assert not plaintext.delivered and collector.calls == []


def test_a_retried_handshake_failure_says_what_failed_and_where_to_look(tls_collector, caplog):
    """Every UNAVAILABLE read the same (a refused port, a name, a restarting collector, a CA that cannot verify it):
    gRPC's words were left out, and its own handshake lines went to stderr outside kcm's log format."""
    collector = tls_collector()
    asked = iter([False, False, True])
    with caplog.at_level(logging.WARNING, logger="kcm.otlp"):
        outcome = _send(Endpoint(collector.endpoint, FAST, lambda: next(asked, True), timeout_s=5))
    assert not outcome.delivered
    warnings = [r.getMessage() for r in caplog.records if r.name == "kcm.otlp"]
    assert warnings and all("handshake" in w.lower() and "check the endpoint's tls.ca_file" in w for w in warnings)
    assert all("\n" not in w and len(w) < 600 for w in warnings)


def test_kcm_commands_keep_grpcs_own_handshake_lines_off_stderr(certificates, tls_collector):
    """gRPC's C core wrote a line per failed handshake straight to stderr: not JSON under --log-format json."""
    import os
    import sys

    collector = tls_collector()
    script = ("from kcm_cli.main import main\n"
              "main(['tail', '--bootstrap-server', '127.0.0.1:9'])\n"   # any command; it ends with a one-line error
              "from kcm_common.otlp_export import Endpoint, RetryPolicy, Tls\n"
              "asked = iter([False, False, True])\n"
              f"Endpoint({collector.endpoint!r}, RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05), "
              f"lambda: next(asked, True), timeout_s=5, tls=Tls({str(certificates / 'client.pem')!r})).export(b'')\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("GRPC_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "ssl_transport_security" not in done.stderr, done.stderr   # gRPC's own line, not kcm's warning


def test_mutual_tls_sends_the_client_certificate_and_fails_without_it(certificates, tls_collector):
    collector = tls_collector(require_client_certificate=True)
    ca = str(certificates / "ca.pem")
    without = _send(Endpoint(collector.endpoint, FAST, lambda: True, tls=Tls(ca_file=ca), timeout_s=5))
    assert not without.delivered and collector.calls == []
    mutual = Tls(ca, str(certificates / "client.pem"), str(certificates / "client.key"))
    assert _send(Endpoint(collector.endpoint, FAST, _within(10), tls=mutual, timeout_s=5)).delivered
    assert len(collector.calls) == 1


@pytest.mark.parametrize("form", ["pkcs1-rsa", "sec1-ec"])
def test_mutual_tls_takes_the_traditional_key_forms_cert_manager_and_openssl_write(certificates, tls_collector, form):
    # cert-manager writes PKCS#1 keys by default (privateKey.encoding: PKCS1), `openssl ecparam -genkey` SEC1 ones:
    # "BEGIN RSA PRIVATE KEY" and "BEGIN EC PRIVATE KEY", not PKCS#8's "BEGIN PRIVATE KEY".
    if form == "pkcs1-rsa":
        _openssl("rsa", "-in", "client.key", "-traditional", "-out", "client-pkcs1.key", cwd=certificates)
        key, cert, marker = certificates / "client-pkcs1.key", certificates / "client.pem", b"BEGIN RSA PRIVATE KEY"
    else:
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "client-ec.key", cwd=certificates)
        _openssl("req", "-new", "-key", "client-ec.key", "-subj", "/CN=client-ec", "-out", "client-ec.csr",
                 cwd=certificates)
        _openssl("x509", "-req", "-in", "client-ec.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", "client-ec.pem", "-extfile", "client.ext", cwd=certificates)
        key, cert, marker = certificates / "client-ec.key", certificates / "client-ec.pem", b"BEGIN EC PRIVATE KEY"
    assert marker in key.read_bytes()
    collector = tls_collector(require_client_certificate=True)
    OtlpTarget(collector.endpoint, ca_file=str(certificates / "ca.pem"), cert_file=str(cert), key_file=str(key))
    config = EndpointConfig(endpoint=collector.endpoint, tls=TlsConfig(
        ca_file=str(certificates / "ca.pem"), cert_file=str(cert), key_file=str(key)))
    assert _send(open_endpoint(config, FAST, _within(10))).delivered
    assert len(collector.calls) == 1


def test_an_encrypted_key_is_refused_at_start_not_prompted_for_on_a_terminal(certificates):
    # gRPC takes no key password; OpenSSL without a password callback would ask for one on the terminal and wait.
    _openssl("genrsa", "-aes256", "-passout", "pass:x", "-out", "encrypted.key", "2048", cwd=certificates)
    _openssl("req", "-new", "-key", "encrypted.key", "-passin", "pass:x", "-subj", "/CN=encrypted",
             "-out", "encrypted.csr", cwd=certificates)
    _openssl("x509", "-req", "-in", "encrypted.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", "encrypted.pem", "-extfile", "client.ext", cwd=certificates)
    script = ("from kcm_common.otlp_export import Tls, tls_problem\n"
              f"print('problem:', tls_problem(Tls(cert_file={str(certificates / 'encrypted.pem')!r}, "
              f"key_file={str(certificates / 'encrypted.key')!r})))\n")
    pid, terminal = pty.fork()
    if pid == 0:   # the child, on a terminal of its own, as a user running `kcm bridge` or `kcm rollup` is
        os.execv(sys.executable, [sys.executable, "-c", script])
    output, deadline = b"", time.monotonic() + 30
    try:
        while time.monotonic() < deadline and b"phrase" not in output:   # to the child's end, or its prompt
            ready, _, _ = select.select([terminal], [], [], 0.5)
            if ready:
                try:
                    output += os.read(terminal, 4096)
                except OSError:   # the child ended and closed the terminal
                    break
    finally:
        os.kill(pid, signal.SIGKILL) if os.waitpid(pid, os.WNOHANG) == (0, 0) else None
        os.close(terminal)
    text = output.decode(errors="replace")
    assert "pass phrase" not in text and "problem:" in text and "the key is not encrypted" in text, text


def test_the_rollup_export_speaks_tls_with_a_token_and_never_logs_it(certificates, tls_collector, caplog):
    caplog.set_level(logging.DEBUG)
    collector = tls_collector(require_client_certificate=True)
    target = OtlpTarget(collector.endpoint, ca_file=str(certificates / "ca.pem"),
                        cert_file=str(certificates / "client.pem"), key_file=str(certificates / "client.key"),
                        header_files=(("authorization", str(certificates / "token")),))
    row = {"resolution": "1m", "metric": "lat", "attributes": "{}", "client_id": "orders", "count": 3,
           "start_micros": 1_767_225_600_000_000, "end_micros": 1_767_225_660_000_000}
    assert export([row], target, retry=FAST, give_up_after_s=10) == (1, 0)
    assert collector.calls[0]["authorization"] == "Bearer s3cret-token"
    assert "s3cret" not in repr(target) and "s3cret" not in caplog.text
    assert "plaintext" not in caplog.text   # the token went over TLS: nothing to warn about
    caplog.clear()
    # --otlp-tls alone trusts the system's roots, which do not hold the test CA: a TLS handshake, never plaintext.
    with pytest.raises(UserError, match="still UNAVAILABLE .*handshake"):
        export([row], OtlpTarget(collector.endpoint, tls=True, header_files=target.header_files), retry=FAST,
               give_up_after_s=0)
    assert "plaintext" not in caplog.text
    # Plaintext against the TLS port fails, given up at once here (no "retrying" line for a retry that will not
    # come), and says so in one line naming the receiver; the token that would have gone in plaintext is warned
    # about, and appears in no log line and no error.
    plaintext = OtlpTarget(collector.endpoint, header_files=target.header_files)
    with pytest.raises(UserError, match=f"OTLP export to {collector.endpoint} failed after 0 data points: "
                                        "still UNAVAILABLE .* after 1 attempts") as failed:
        export([row], plaintext, retry=FAST, give_up_after_s=0)
    assert "--otlp-header-file values" in caplog.text and "retrying" not in caplog.text
    assert "s3cret" not in caplog.text and "s3cret" not in str(failed.value)


BAD_FILES = {"two-lines": "Bearer a\nb\n", "empty": "\n", "latin-1": b"Bearer caf\xe9", "not-pem": "hello\n",
             "garbled-cert.pem": "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
             "garbled-key.pem": "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"}


@pytest.fixture(scope="module")
def bad_files(certificates) -> Path:
    for name, content in BAD_FILES.items():
        path = certificates / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (certificates / "a-directory").mkdir(exist_ok=True)
    return certificates


@pytest.mark.parametrize(("arguments", "message"), [
    ({"cert_file": "client.pem"}, "go together"),
    ({"ca_file": "missing.pem"}, "--otlp-ca-file .*missing.pem: No such file or directory"),
    ({"ca_file": "a-directory"}, "--otlp-ca-file .*a-directory: Is a directory"),
    ({"ca_file": "not-pem"}, "not a PEM file holding a certificate"),
    ({"cert_file": "client.pem", "key_file": "client.pem"}, "--otlp-key-file .*not a PEM file holding a private key"),
    ({"ca_file": "garbled-cert.pem"}, "--otlp-ca-file .*garbled-cert.pem holds no usable certificate"),
    ({"cert_file": "client.pem", "key_file": "garbled-key.pem"}, "--otlp-cert-file .*client.pem does not load with"),
    ({"cert_file": "client.pem", "key_file": "server.key"}, "--otlp-cert-file .*client.pem does not load with"),
    ({"cert_file": "garbled-cert.pem", "key_file": "client.key"}, "--otlp-cert-file .*garbled-cert.pem does not load"),
    ({"ca_file": "client.pem", "cert_file": "client.pem", "key_file": "server.key"},
     "--otlp-cert-file .*client.pem does not load with"),
    ({"header_files": (("Authorization", "token"),)}, "must be lower-case"),
    ({"header_files": (("grpc-timeout", "token"),)}, "not start with grpc-"),
    ({"header_files": (("x-token-bin", "token"),)}, "names ending in -bin"),
    ({"header_files": (("authorization", "token"), ("authorization", "ca.pem"))}, "names a header twice"),
    ({"header_files": (("authorization", "two-lines"),)}, "printable ASCII on one line"),
    ({"header_files": (("authorization", "empty"),)}, "empty value"),
    ({"header_files": (("authorization", "latin-1"),)}, "latin-1: not UTF-8 text"),
    ({"header_files": (("authorization", "a-directory"),)}, "a-directory: Is a directory"),
])
def test_rollup_tls_options_that_cannot_work_are_refused_up_front(bad_files, arguments, message):
    arguments = {key: (str(bad_files / value) if isinstance(value, str) else
                       tuple((name, str(bad_files / path)) for name, path in value))
                 for key, value in arguments.items()}
    with pytest.raises(UserError, match=message) as refused:
        OtlpTarget("otel:4317", **arguments)
    assert "Bearer" not in str(refused.value)  # a token file's content is never quoted


@pytest.mark.parametrize(("endpoint", "message"), [
    ({"headers_from_files": {"authorization": "two-lines"}}, "headers_from_files.authorization: header"),
    ({"headers_from_files": {"authorization": "a-directory"}}, "a-directory: Is a directory"),
    ({"headers": {"x-bin": "1"}}, "endpoints.0..headers.x-bin: header 'x-bin': names ending in -bin"),
    ({"headers": {"authorization": "a"}, "headers_from_files": {"authorization": "token"}}, "more than once"),
    ({"tls": {"ca_file": "not-pem"}}, "tls.ca_file: .*not a PEM file holding a certificate"),
    ({"tls": {"ca_file": "a-directory"}}, "tls.ca_file: .*Is a directory"),
    ({"tls": {"ca_file": "garbled-cert.pem"}}, "tls.ca_file: .*garbled-cert.pem holds no usable certificate"),
    ({"tls": {"cert_file": "client.pem", "key_file": "server.key"}}, "tls.cert_file: .*client.pem does not load with"),
    ({"tls": {"cert_file": "client.pem", "key_file": "garbled-key.pem"}}, "tls.cert_file: .*does not load with"),
    # The client's own certificate as the CA too: the key that does not match is the client certificate's problem.
    ({"tls": {"ca_file": "client.pem", "cert_file": "client.pem", "key_file": "server.key"}},
     "tls.cert_file: .*client.pem does not load with"),
])
def test_the_bridge_refuses_the_same_endpoint_files_and_headers_at_start(bad_files, endpoint, message):
    from kcm_bridge import config as bridge_config

    def located(value):
        if isinstance(value, dict):
            return {k: located(v) for k, v in value.items()}
        return str(bad_files / value) if (bad_files / value).exists() or value == "missing" else value

    entry = {"endpoint": "otel:4317", **{k: (located(v) if k != "headers" else v) for k, v in endpoint.items()}}
    with pytest.raises(bridge_config.ConfigError, match=message) as refused:
        bridge_config.load(env={}, overrides={("kafka", "bootstrap_servers"): "k:9092", ("endpoints",): [entry]})
    assert "Bearer" not in str(refused.value)


def test_files_grpc_would_load_pass_the_start_check_even_below_openssls_security_level(certificates):
    from kcm_common.otlp_export import Tls, tls_problem

    small = Tls(ca_file=str(certificates / "ca.pem"), cert_file=str(certificates / "small.pem"),
                key_file=str(certificates / "small.key"))
    assert tls_problem(small) is None


class _Http1Server:
    """An HTTP/1.1 server answering 404 to everything: what OTLP/HTTP's port (4318) looks like to a gRPC client."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class NotFound(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.send_response(404)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
        self.endpoint = f"127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize(("collector_kind", "insecure", "hint"), [
    ("plaintext", False, "the collector may not use TLS: for a plaintext one set the endpoint's insecure: true"),
    ("tls", True, "the endpoint may expect TLS: drop insecure"),
    ("http1", True, "kcm exports OTLP/gRPC (usually port 4317), not OTLP/HTTP (usually 4318)"),
])
def test_a_collector_speaking_another_protocol_is_retried_with_a_hint_naming_the_setting_to_change(
        collector_kind, insecure, hint, tls_collector, collector, caplog):
    """A plaintext collector without insecure said to check tls.ca_file; insecure against TLS and an OTLP/HTTP port
    gave gRPC's words (`Socket closed`, `Failed parsing HTTP/2`) with nothing to act on."""
    http1 = _Http1Server() if collector_kind == "http1" else None
    try:
        endpoint = {"plaintext": lambda: collector.endpoint, "tls": lambda: tls_collector().endpoint,
                    "http1": lambda: http1.endpoint}[collector_kind]()
        asked = iter([False, False, True])
        with caplog.at_level(logging.WARNING, logger="kcm.otlp"):
            outcome = _send(Endpoint(endpoint, FAST, lambda: next(asked, True), insecure=insecure, timeout_s=5))
    finally:
        if http1 is not None:
            http1.stop()
    assert not outcome.delivered and outcome.error == "UNAVAILABLE"
    warnings = [r.getMessage() for r in caplog.records if r.name == "kcm.otlp"]
    assert warnings and all(hint in w for w in warnings), warnings
    assert not [w for w in warnings if "tls.ca_file, and that" in w], warnings   # not the certificate hint
