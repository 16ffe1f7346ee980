"""A fake OpenTelemetry collector for tests: a real OTLP/gRPC MetricsService that records every export and can be told to fail."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from kcm_demo.collector import OtlpCollector


@dataclass(frozen=True)
class Export:
    """One accepted Export call: the request and the call's metadata (lower-case keys)."""

    request: ExportMetricsServiceRequest
    metadata: dict[str, str]


@dataclass(frozen=True)
class _Fault:
    code: grpc.StatusCode | None  # None: answer OK with a partial-success rejection
    message: str
    retry_after_s: float | None = None
    rejected_data_points: int = 0
    stall_s: float = 0.0  # answer (OK) only after this long, as an overloaded collector does


def data_point_count(request: ExportMetricsServiceRequest) -> int:
    """How many data points an export carries (what partial success counts)."""
    total = 0
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total


class FakeCollector(OtlpCollector):
    """The demo's OTLP/gRPC collector, recording every export (with its call metadata) and able to fail on demand."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 on_export: Callable[[Export], None] | None = None) -> None:
        super().__init__(lambda request: None, host, port, max_workers=4)
        self._on_record = on_export
        self._lock = threading.Condition()
        self._exports: list[Export] = []
        self._faults: deque[_Fault] = deque()
        self._refuse: tuple[Callable[[ExportMetricsServiceRequest], bool], grpc.StatusCode, str] | None = None
        self.rejected_calls = 0
        self._in_progress = 0
        self.most_in_progress = 0   # the most Export calls it was answering at once

    # Fault injection: each queued fault answers one Export call, in order.
    def fail_next(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, times: int = 1,
                  message: str = "injected failure") -> None:
        with self._lock:
            self._faults.extend(_Fault(code, message) for _ in range(times))

    def refuse_when(self, predicate: Callable[[ExportMetricsServiceRequest], bool],
                    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT, message: str = "injected refusal") -> None:
        """Refuse every call whose request `predicate` holds for, as a collector validating what it is sent does."""
        with self._lock:
            self._refuse = (predicate, code, message)

    def pending_faults(self) -> int:
        """How many injected faults are still to answer a call."""
        with self._lock:
            return len(self._faults)

    def clear_faults(self) -> None:
        """Answer every call from now on as a healthy collector does."""
        with self._lock:
            self._faults.clear()
            self._refuse = None

    def throttle_next(self, retry_after_s: float, times: int = 1) -> None:
        """Answer RESOURCE_EXHAUSTED carrying a google.rpc.RetryInfo, as a collector under memory pressure does."""
        with self._lock:
            self._faults.extend(
                _Fault(grpc.StatusCode.RESOURCE_EXHAUSTED, "injected throttling", retry_after_s) for _ in range(times)
            )

    def reject_partially_next(self, rejected_data_points: int, message: str = "injected partial rejection",
                              times: int = 1) -> None:
        with self._lock:
            self._faults.extend(_Fault(None, message, rejected_data_points=rejected_data_points) for _ in range(times))

    def stall_next(self, seconds: float, times: int = 1) -> None:
        """Answer the next calls OK, but only after `seconds` (a client with a shorter timeout sees DEADLINE_EXCEEDED)."""
        with self._lock:
            self._faults.extend(_Fault(None, "", stall_s=seconds) for _ in range(times))

    @property
    def exports(self) -> list[Export]:
        with self._lock:
            return list(self._exports)

    def wait_for(self, predicate: Callable[[list[Export]], bool], timeout: float) -> bool:
        """Block until `predicate(exports)` holds or `timeout` seconds pass; returns whether it held."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(list(self._exports)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext) -> ExportMetricsServiceResponse:  # noqa: N802 (gRPC name)
        with self._lock:
            self._in_progress += 1
            self.most_in_progress = max(self.most_in_progress, self._in_progress)
        try:
            return self._answer(request, context)
        finally:
            with self._lock:
                self._in_progress -= 1

    def _answer(self, request: ExportMetricsServiceRequest,
                context: grpc.ServicerContext) -> ExportMetricsServiceResponse:
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
            if fault is None and self._refuse is not None and self._refuse[0](request):
                fault = _Fault(self._refuse[1], self._refuse[2])
            if fault is not None and fault.code is not None:
                self.rejected_calls += 1
        if fault is not None and fault.code is not None:
            if fault.retry_after_s is not None:
                context.set_trailing_metadata([("grpc-status-details-bin", _retry_status(fault).SerializeToString())])
            context.abort(fault.code, fault.message)
        if fault is not None and fault.stall_s:
            time.sleep(fault.stall_s)
        export = Export(request, {key.lower(): value for key, value in context.invocation_metadata()
                                  if isinstance(value, str)})
        with self._lock:
            self._exports.append(export)
            self._lock.notify_all()
        if self._on_record is not None:
            self._on_record(export)
        response = ExportMetricsServiceResponse()
        if fault is not None and not fault.stall_s:
            response.partial_success.rejected_data_points = fault.rejected_data_points
            response.partial_success.error_message = fault.message
        return response


def _retry_status(fault: _Fault) -> status_pb2.Status:
    delay = Duration()
    delay.FromMilliseconds(int((fault.retry_after_s or 0) * 1000))
    detail = AnyProto()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=fault.message, details=[detail])
