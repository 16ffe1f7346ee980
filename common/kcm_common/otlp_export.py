"""OTLP/gRPC export to one collector, with the retries the OTLP specification prescribes.

One implementation for the bridge and the rollup job: retryable codes, the server's RetryInfo delay, otherwise
exponential backoff with jitter up to a cap, until delivered, refused for good, or the caller gives up. Needs
`grpcio` and `googleapis-common-protos` (the `bridge` and `rollup` extras).
"""

from __future__ import annotations

import logging
import random
import re
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from kcm_common.retry import RetryPolicy, backoff_s, wait_unless

__all__ = ["AUTH_REFUSALS", "RETRYABLE", "Endpoint", "Outcome", "RetryPolicy", "Tls", "TlsProblem", "is_endpoint",
           "metadata_problem", "pem_problem", "read_metadata_value", "retry_delay_s", "tls_problem"]

log = logging.getLogger("kcm.otlp")

_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
# OTLP/gRPC: these codes are transient; RESOURCE_EXHAUSTED only when the server says when to come back.
RETRYABLE = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                       grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})
# The collector refusing the call's credentials: for good by the OTLP spec. The headers are read again after one (a
# rotated token file is used from the next export), and a caller may choose to retry them (`retry_auth_refusals`).
AUTH_REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


@dataclass(frozen=True)
class Outcome:
    """How one export ended: delivered (possibly with rejected points), rejected for good, or abandoned."""

    delivered: bool
    attempts: int
    rejected_points: int = 0
    error: str | None = None   # gRPC code name of the final failure
    detail: str = ""           # the server's message with it
    note: str = ""             # "; what kcm did about it", for the caller's log line (headers read again)
    abandoned: bool = False    # stopped retrying because the caller gave up
    stopped: bool = False      # stopped retrying a retryable failure because the caller's `stop_retrying` said so


def retry_delay_s(error: grpc.RpcError) -> float | None:
    """The google.rpc.RetryInfo delay a server attached to a failure, if any (none when the details are garbled:
    a broken server must not break the retry loop)."""
    for key, value in (error.trailing_metadata() or ()):
        if key != "grpc-status-details-bin":
            continue
        try:
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):  # a negative Duration is no delay
                    return max(0.0, info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
        except Exception:  # protobuf's DecodeError: not a google.rpc.Status
            return None
    return None


_METADATA_KEY = re.compile(r"[a-z0-9_.-]+")
_PEM_MARKERS = {"certificate": b"-----BEGIN CERTIFICATE-----", "key": b"PRIVATE KEY-----"}


_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]\s/]+):(\d{1,5})")


def is_endpoint(text: str) -> bool:
    """Whether `text` is HOST:PORT (IPv6 in brackets) as kcm's exporters take it: no scheme, path or gRPC resolver
    prefix (http://, dns:///, unix:/path). The exporter hands gRPC `dns:///HOST:PORT`, so a host named like a
    scheme (`unix:4317`) is a host."""
    found = _ENDPOINT.fullmatch(text)
    return found is not None and 0 < int(found.group(2)) < 65536


# Names gRPC sets itself (a value given for them is dropped or replaced without a word), and HTTP/2's
# connection-specific headers, which make a request malformed for a strict server (RFC 9113, 8.2.2).
_RESERVED_HEADERS = frozenset({"content-type", "te", "content-length", "user-agent", "connection", "keep-alive",
                               "proxy-connection", "transfer-encoding", "upgrade"})


def metadata_problem(name: str, value: str | None = None) -> str | None:
    """Why gRPC would refuse this call metadata (checked before anything is sent), or None. Never quotes the value."""
    if not _METADATA_KEY.fullmatch(name) or name.startswith("grpc-"):
        return f"header {name!r} must be lower-case letters, digits, '-', '_' or '.', and not start with grpc-"
    if name in _RESERVED_HEADERS:
        return (f"header {name!r} is one gRPC sets itself or HTTP/2 forbids in a request: it would not arrive as "
                "given; name another")
    if name.endswith("-bin"):
        return f"header {name!r}: names ending in -bin carry binary values, which kcm does not send"
    if value is not None and not value:
        return f"header {name!r} has an empty value"
    if value is not None and any(not " " <= c <= "~" for c in value):
        return f"header {name!r} must have a value of printable ASCII on one line"
    return None


def read_metadata_value(path: str) -> str:
    """A metadata value kept in a file (a token from a mounted Secret), without its surrounding whitespace; raises
    ValueError saying why it cannot be read, never what it holds."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None


def pem_problem(path: str, kind: Literal["certificate", "key"]) -> str | None:
    """Why `path` is not a readable PEM file holding a `kind` (a CA or client certificate, a private key), or None."""
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if _PEM_MARKERS[kind] not in content:
        return f"{path}: not a PEM file holding a {'private key' if kind == 'key' else kind}"
    return None


@dataclass(frozen=True)
class Tls:
    """PEM files: the CA to trust (system roots when absent), and a client certificate with its key."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class TlsProblem(NamedTuple):
    file: str
    why: str
    setting: str   # which of the Tls fields to blame: "ca_file" or "cert_file" (the same file may be both)


def tls_problem(tls: Tls) -> TlsProblem | None:
    """What is wrong when files that each look like PEM still would not work: a garbled body, or a key that is not
    the certificate's. Loaded with OpenSSL before gRPC sees them, since gRPC only fails at the first export."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # gRPC's BoringSSL has no security levels: a small key or a SHA-1 signature loads there, so it must here too.
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    if tls.ca_file:
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            return TlsProblem(tls.ca_file, f"holds no usable certificate ({getattr(exc, 'reason', None) or exc})",
                              "ca_file")
    if tls.cert_file and tls.key_file:
        try:
            # gRPC takes no key password: an encrypted key fails here rather than prompting for one.
            context.load_cert_chain(tls.cert_file, tls.key_file, password=lambda: b"")
        except (ssl.SSLError, OSError, ValueError) as exc:
            return TlsProblem(tls.cert_file, f"does not load with {tls.key_file} "
                              f"({getattr(exc, 'reason', None) or exc}): check both are PEM, belong together, and the "
                              "key is not encrypted", "cert_file")
    return None


# What to check when a collector refuses for good (the OTLP spec says not to retry these): said with the refusal.
_REFUSAL_HINTS = {
    "UNIMPLEMENTED": "is the endpoint an OTLP/gRPC metrics receiver (port 4317 of a collector)?",
    "UNAUTHENTICATED": "check the endpoint's headers (an expired or missing token?)",
    "PERMISSION_DENIED": "check the endpoint's headers (a token without the right to write metrics?)",
    "RESOURCE_EXHAUSTED": ("a request, or one record alone, over the collector's message size limit "
                           "(max_recv_msg_size_mib, 4 MiB by default)? send smaller batches (bridge: batch.max_bytes)"),
}


def refusal_hint(code: str | None) -> str:
    """`; what to check` for a refusal for good with gRPC status `code`, or "" when there is nothing to add."""
    hint = _REFUSAL_HINTS.get(code or "")
    return f"; {hint}" if hint else ""


def channel_options(retry: RetryPolicy) -> list[tuple[str, int]]:
    """gRPC's own reconnection backoff within the retry policy's: by default gRPC waits up to 120 s between attempts
    to reconnect, and calls made meanwhile fail at once, so after a long outage exports would keep failing up to two
    minutes after the collector came back, whatever `max_backoff_s` says."""
    most_ms = max(100, int(retry.max_backoff_s * 1000))
    return [("grpc.max_reconnect_backoff_ms", most_ms),
            ("grpc.initial_reconnect_backoff_ms", min(most_ms, max(100, int(retry.initial_backoff_s * 1000))))]


def _target(endpoint: str) -> str:
    """gRPC's target for HOST:PORT: with the scheme spelt out, no host name is read as one (a host "unix" or "ipv4"
    would be, before a colon). Resolved by DNS, to every address of the name; `pick_first` uses the first that
    answers, `round_robin` all of them in turn."""
    return f"dns:///{endpoint}"


class Endpoint:
    """One OTLP/gRPC collector: a channel, its call metadata, and the retry loop.

    `give_up()` is asked before each wait: True abandons the export (the caller is shutting down or past its
    deadline). A server's RetryInfo delay is honoured up to `retry.max_backoff_s`. Each retry is logged as a warning;
    a refusal for good is returned, not logged. `on_failure(code, retrying)` is called at every failed attempt,
    so a caller's counters move during an outage, not only once it ends. A failure that is not gRPC's answer (a bug)
    is logged and retried with backoff like UNAVAILABLE: the batch is never left behind. `metadata` goes with every
    call and may hold tokens: never logged. It may be a function returning it, called again after each
    UNAUTHENTICATED or PERMISSION_DENIED answer (a token file a Kubernetes Secret rotates), so the next call carries
    what it returns now. With `retry_auth_refusals` those answers are retried with backoff instead of being final,
    which the OTLP specification does not do. `balancing` is gRPC's load-balancing policy over the addresses the
    endpoint's name resolves to.
    """

    def __init__(self, endpoint: str, retry: RetryPolicy, give_up: Callable[[], bool], *, insecure: bool = False,
                 tls: Tls = Tls(),
                 metadata: Sequence[tuple[str, str]] | Callable[[], Sequence[tuple[str, str]]] = (),
                 compression: Literal["gzip", "none"] = "gzip", timeout_s: float = 10.0,
                 on_failure: Callable[[str, bool], None] = lambda code, retrying: None,
                 retry_auth_refusals: bool = False,
                 balancing: Literal["pick_first", "round_robin"] = "pick_first") -> None:
        self.name = endpoint
        self._insecure = insecure
        self._read_metadata = metadata if callable(metadata) else None
        self._retried = RETRYABLE | AUTH_REFUSALS if retry_auth_refusals else RETRYABLE
        self._on_failure = on_failure
        self._retry = retry
        self._give_up = give_up
        self._timeout_s = timeout_s
        self._rng = random.Random()
        options = [*channel_options(retry), ("grpc.lb_policy_name", balancing)]
        target = _target(endpoint)
        if insecure:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca_file), private_key=_read(tls.key_file),
                certificate_chain=_read(tls.cert_file))
            self._channel = grpc.secure_channel(target, credentials, options=options)
        # Raw bytes go out as they are: a serialised request, or concatenated MetricsData, which are one.
        self._call = self._channel.unary_unary(_METHOD, request_serializer=None,
                                               response_deserializer=ExportMetricsServiceResponse.FromString)
        self._metadata = list(metadata() if callable(metadata) else metadata)
        self._compression = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression

    def export(self, request: bytes, give_up: Callable[[], bool] | None = None,
               stop_retrying: Callable[[int], bool] | None = None) -> Outcome:
        """Send a serialised ExportMetricsServiceRequest until delivered, refused for good, or given up on: when the
        endpoint's `give_up()` or this call's own `give_up()` says so (the request's records are no longer wanted).
        `stop_retrying(attempt)`, asked after each retryable failure, ends the retries with that failure (`stopped`):
        the caller's way to treat a request that keeps failing differently (splitting it, say)."""
        attempt, traced, refused = 0, False, False

        def gave_up() -> bool:
            return self._give_up() or (give_up is not None and give_up())

        while True:
            attempt += 1
            if refused:   # read again after the wait too: a token fixed during it goes with this very retry
                self._reread_metadata()
                refused = False
            try:
                response = self._call(request, timeout=self._timeout_s, metadata=self._metadata,
                                      compression=self._compression)
            except grpc.RpcError as error:
                code = error.code()
                delay = retry_delay_s(error)
                retryable = code in self._retried or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
                self._on_failure(code.name, retryable)
                if not retryable:
                    # What a refusal means is the caller's to say: the bridge drops the batch, the rollup stops.
                    note = self._reread_metadata() if code in AUTH_REFUSALS else ""
                    return Outcome(False, attempt, error=code.name, detail=error.details() or "", note=note)
                if gave_up():  # the caller has stopped waiting (a shutdown closed the channel): no retry to log
                    return Outcome(False, attempt, error=code.name, detail=error.details() or "", abandoned=True)
                if stop_retrying is not None and stop_retrying(attempt):
                    return Outcome(False, attempt, error=code.name, detail=error.details() or "", stopped=True)
                # RetryInfo says how long to wait at least: a delay of 0 must not make a throttling collector a
                # target of back-to-back retries, so the backoff stays the floor.
                wait = max(delay or 0.0, backoff_s(attempt, self._retry, self._rng))
                wait = min(wait, self._retry.max_backoff_s)
                why = (f" (no answer within the {self._timeout_s:g} s timeout: if the collector is only slow, "
                       "give it a longer one)" if code == grpc.StatusCode.DEADLINE_EXCEEDED else "")
                if code in AUTH_REFUSALS:
                    why, refused = f"{refusal_hint(code.name)}{self._reread_metadata()}", True
                elif code == grpc.StatusCode.UNAVAILABLE:   # which of a refused port, a name, a handshake: gRPC says
                    why = _unavailable_detail(error.details() or "", self._insecure)
                log.warning("export to %s failed with %s%s (attempt %d); retrying in %.2fs",
                            self.name, code.name, why, attempt, wait)
                if wait_unless(wait, gave_up):
                    return Outcome(False, attempt, error=code.name, detail=error.details() or "", abandoned=True)
                continue
            except Exception as error:  # not the server's answer: a closed channel at shutdown, or a bug
                if gave_up():
                    return Outcome(False, attempt, error="UNEXPECTED", detail=str(error), abandoned=True)
                self._on_failure("UNEXPECTED", True)
                wait = backoff_s(attempt, self._retry, self._rng)
                log.error("export to %s failed unexpectedly (attempt %d); retrying in %.2fs", self.name, attempt,
                          wait, exc_info=not traced)  # the traceback once, not at every retry
                traced = True
                if wait_unless(wait, gave_up):
                    return Outcome(False, attempt, error="UNEXPECTED", detail=str(error), abandoned=True)
                continue
            # A count below zero is the server's error; it must not turn into points delivered twice.
            rejected = max(0, response.partial_success.rejected_data_points)
            if rejected or response.partial_success.error_message:
                log.warning("export to %s partially rejected: %d points (%s)", self.name, rejected,
                            response.partial_success.error_message)
            return Outcome(True, attempt, rejected_points=rejected)

    def answers(self) -> bool:
        """Whether the collector accepts an empty export request now (one call, no retry): it is up, and takes these
        credentials, whatever it makes of the data of a request that keeps failing."""
        try:
            self._call(b"", timeout=self._timeout_s, metadata=self._metadata, compression=self._compression)
        except Exception:   # grpc.RpcError, or a closed channel at shutdown
            return False
        return True

    def _reread_metadata(self) -> str:
        """Read the call metadata again, for the next retry; what happened, for the retry's log line."""
        if self._read_metadata is None:
            return ""
        try:
            metadata = list(self._read_metadata())
        except Exception as exc:  # a file half-way through a rotation, say: the next refusal reads it again
            return f"; the headers could not be read again ({exc}), so the same are sent"
        changed = metadata != self._metadata
        self._metadata = metadata
        return "; the headers were read again and have changed" if changed else "; the headers were read again"

    def close(self) -> None:
        self._channel.close()


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


_DETAIL_CHARS = 300
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _unavailable_detail(details: str, insecure: bool = False) -> str:
    """gRPC's words on an UNAVAILABLE (the address refused, a name not resolved, a TLS handshake failing), on one
    line and cut short; with a hint where the handshake or the protocol is what failed. gRPC puts no call metadata
    in them."""
    if not details:
        return ""
    text = _CONTROL.sub(" ", details)
    text = text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "…"
    return f" ({text}{_protocol_hint(details.lower(), insecure)})"


def _protocol_hint(details: str, insecure: bool) -> str:
    """What to check when the collector does not speak what the endpoint is set to (`details` in lower case)."""
    if "wrong_version_number" in details:   # a TLS handshake answered by something that is not TLS
        return "; the collector may not use TLS: for a plaintext one set the endpoint's insecure: true (--insecure)"
    if "handshake" in details:
        return "; check the endpoint's tls.ca_file, and that the collector's certificate names the host"
    if "failed parsing http/2" in details:   # an HTTP/1 server: OTLP/HTTP's port, say
        return "; kcm exports OTLP/gRPC (usually port 4317), not OTLP/HTTP (usually 4318): check the port"
    if insecure and "socket closed" in details:
        return "; the endpoint may expect TLS: drop insecure (--insecure) and set tls.ca_file if its CA is private"
    return ""
