"""OTLP/gRPC export to a real collector: the OTLP retry rules, partial success, call metadata."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from kcm_bridge.config import EndpointConfig
from kcm_bridge.export import open_endpoint
from kcm_common.otlp_export import Endpoint, RetryPolicy
from payloads import client_metrics

RETRY = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=1.0)


def _endpoint(collector, **options) -> Endpoint:
    return open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True, **options), RETRY, lambda: False)


def test_retryable_codes_are_retried_until_delivered(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=2)
    outcome = _endpoint(collector).export(client_metrics().SerializeToString())
    assert outcome.delivered and outcome.attempts == 3
    assert len(collector.exports) == 1


def test_resource_exhausted_waits_the_servers_retry_delay(collector):
    collector.throttle_next(0.4)
    started = time.monotonic()
    outcome = _endpoint(collector).export(client_metrics().SerializeToString())
    assert outcome.delivered and outcome.attempts == 2
    assert time.monotonic() - started >= 0.4


def test_resource_exhausted_without_retry_info_and_bad_requests_are_not_retried(collector):
    collector.fail_next(grpc.StatusCode.RESOURCE_EXHAUSTED)
    collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT)
    endpoint = _endpoint(collector)
    for code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"):
        outcome = endpoint.export(client_metrics().SerializeToString())
        assert (outcome.delivered, outcome.attempts, outcome.error) == (False, 1, code)
    assert collector.exports == []


def test_partial_success_is_delivered_with_the_rejected_count_and_not_retried(collector):
    collector.reject_partially_next(1)
    outcome = _endpoint(collector).export(client_metrics().SerializeToString())
    assert (outcome.delivered, outcome.attempts, outcome.rejected_points) == (True, 1, 1)


def test_a_shutdown_deadline_abandons_retries_without_claiming_delivery(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE, times=100)
    endpoint = open_endpoint(EndpointConfig(endpoint=collector.endpoint, insecure=True), RETRY, lambda: True)
    outcome = endpoint.export(client_metrics().SerializeToString())
    assert outcome.abandoned and not outcome.delivered


def test_headers_from_files_and_environment_arrive_as_call_metadata(collector, tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("Bearer s3cret\n")
    monkeypatch.setenv("OTLP_TENANT", "kafka-team")
    endpoint = _endpoint(collector, headers={"x-static": "1"}, headers_from_files={"authorization": str(token)},
                         headers_from_env={"x-scope-orgid": "OTLP_TENANT"})
    assert endpoint.export(client_metrics().SerializeToString()).delivered
    metadata = collector.exports[0].metadata
    assert metadata["authorization"] == "Bearer s3cret"
    assert metadata["x-scope-orgid"] == "kafka-team" and metadata["x-static"] == "1"


class _CountingProxy:
    """A loopback TCP proxy that counts the bytes the client sends (gRPC servers hide grpc-encoding)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.sent = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            threading.Thread(target=self._pipe, args=(downstream, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, downstream, False), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, count: bool) -> None:
        try:
            while data := source.recv(65536):
                if count:
                    with self._lock:
                        self.sent += len(data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


@pytest.mark.parametrize("compression, compressed", [("gzip", True), ("none", False)])
def test_compression_setting_decides_what_goes_over_the_wire(collector, compression, compressed):
    request = client_metrics().SerializeToString() * 200  # concatenated MetricsData: one larger, repetitive request
    proxy = _CountingProxy(collector.endpoint)
    try:
        endpoint = open_endpoint(EndpointConfig(endpoint=proxy.endpoint, insecure=True, compression=compression),
                            RETRY, lambda: False)
        assert endpoint.export(request).delivered
        assert collector.exports[0].request.SerializeToString() == request
        assert (proxy.sent < len(request) / 4) == compressed, (proxy.sent, len(request))
    finally:
        proxy.close()


def test_garbled_status_details_from_a_server_mean_no_retry_delay_not_a_crash():
    from google.protobuf.duration_pb2 import Duration
    from google.rpc import error_details_pb2, status_pb2

    from kcm_common.otlp_export import retry_delay_s

    class Failure(grpc.RpcError):
        def __init__(self, details: bytes) -> None:
            self._details = details

        def trailing_metadata(self):
            return (("grpc-status-details-bin", self._details),)

    status = status_pb2.Status(code=8)
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=Duration(seconds=2, nanos=500_000_000)))
    assert retry_delay_s(Failure(status.SerializeToString())) == 2.5
    assert retry_delay_s(Failure(b"\xff\xff not a status")) is None
