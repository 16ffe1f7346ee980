"""The demo's embedded OpenTelemetry collector: a real OTLP/gRPC MetricsService on loopback."""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from types import TracebackType

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


class OtlpCollector(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Accepts every Export and hands the request to `on_export`; what the bridge sends in the demo lands here."""

    def __init__(self, on_export: Callable[[ExportMetricsServiceRequest], None], host: str = "127.0.0.1",
                 port: int = 0, max_workers: int = 2) -> None:
        self.host = host
        self.port = 0
        self._requested_port = port  # 0: a free port on each start
        self._on_export = on_export
        self._max_workers = max_workers
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{self.host}:{self._requested_port}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait(timeout=5)
            self._server = None

    def __enter__(self) -> OtlpCollector:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def Export(self, request: ExportMetricsServiceRequest,  # noqa: N802 (the gRPC method's name)
               context: grpc.ServicerContext) -> ExportMetricsServiceResponse:
        self._on_export(request)
        return ExportMetricsServiceResponse()
