"""OTLP/gRPC export with the retries the OTLP specification prescribes, to one endpoint."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from kcm_bridge.config import EndpointConfig, RetryConfig

log = logging.getLogger("kcm.bridge.export")

_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
# OTLP/gRPC: these codes are transient; RESOURCE_EXHAUSTED only when the server says when to come back.
RETRYABLE = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                       grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})


@dataclass(frozen=True)
class Outcome:
    """How one export ended: delivered (possibly with rejected points), rejected for good, or abandoned."""

    delivered: bool
    attempts: int
    rejected_points: int = 0
    error: str | None = None   # gRPC code name of the final failure
    abandoned: bool = False    # stopped retrying because the bridge is shutting down; not committed


def backoff_s(attempt: int, retry: RetryConfig, rng: random.Random) -> float:
    """Exponential backoff with jitter, capped; `attempt` counts from 1."""
    base = min(retry.max_backoff_s, retry.initial_backoff_s * retry.multiplier ** (attempt - 1))
    return base * (1 - retry.jitter * rng.random())


def retry_delay_s(error: grpc.RpcError) -> float | None:
    """The google.rpc.RetryInfo delay a server attached to a failure, if any."""
    for key, value in (error.trailing_metadata() or ()):
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


class Endpoint:
    """One OTLP/gRPC collector: a channel, its call metadata, and the retry loop."""

    def __init__(self, config: EndpointConfig, retry: RetryConfig, give_up: Callable[[], bool]) -> None:
        self.name = config.endpoint
        self._config = config
        self._retry = retry
        self._give_up = give_up
        self._rng = random.Random()
        if config.insecure:
            self._channel = grpc.insecure_channel(config.endpoint)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(config.tls.ca_file), private_key=_read(config.tls.key_file),
                certificate_chain=_read(config.tls.cert_file))
            self._channel = grpc.secure_channel(config.endpoint, credentials)
        # Raw bytes go out as they are: concatenated MetricsData are already a serialised request.
        self._call = self._channel.unary_unary(_METHOD, request_serializer=None,
                                               response_deserializer=ExportMetricsServiceResponse.FromString)
        self._metadata = _metadata(config)
        self._compression = grpc.Compression.Gzip if config.compression == "gzip" else grpc.Compression.NoCompression

    def export(self, request: bytes) -> Outcome:
        """Send until delivered, rejected for good, or `give_up()` says the bridge stops waiting."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._call(request, timeout=self._config.timeout_s, metadata=self._metadata,
                                      compression=self._compression)
            except grpc.RpcError as error:
                code = error.code()
                delay = retry_delay_s(error)
                retryable = code in RETRYABLE or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
                if not retryable:
                    log.error("export to %s rejected with %s: %s; dropping the batch (not retryable)",
                              self.name, code.name, error.details())
                    return Outcome(False, attempt, error=code.name)
                wait = delay if delay is not None else backoff_s(attempt, self._retry, self._rng)
                wait = min(wait, self._retry.max_backoff_s)
                log.warning("export to %s failed with %s (attempt %d); retrying in %.2fs",
                            self.name, code.name, attempt, wait)
                if self._wait(wait):
                    return Outcome(False, attempt, error=code.name, abandoned=True)
                continue
            rejected = response.partial_success.rejected_data_points
            if rejected or response.partial_success.error_message:
                log.warning("export to %s partially rejected: %d points (%s)", self.name, rejected,
                            response.partial_success.error_message)
            return Outcome(True, attempt, rejected_points=rejected)

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds` in short steps; True when the bridge gave up on pending work meanwhile."""
        end = time.monotonic() + seconds
        while (remaining := end - time.monotonic()) > 0:
            if self._give_up():
                return True
            time.sleep(min(remaining, 0.1))
        return self._give_up()

    def close(self) -> None:
        self._channel.close()


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _metadata(config: EndpointConfig) -> list[tuple[str, str]]:
    headers = dict(config.headers)
    headers.update({name: Path(path).read_text(encoding="utf-8").strip()
                    for name, path in config.headers_from_files.items()})
    headers.update({name: os.environ[variable] for name, variable in config.headers_from_env.items()})
    return sorted(headers.items())
