"""The OTLP receiver fixture answers like a real collector, including the failures fault tests need."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from kcm_sandbox.collector import OtlpReceiver, data_point_count
from payloads import client_metrics


def _export(receiver: OtlpReceiver, metadata=()):
    request = ExportMetricsServiceRequest(resource_metrics=client_metrics().resource_metrics)
    with grpc.insecure_channel(receiver.endpoint) as channel:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        return stub.Export(request, timeout=5, metadata=metadata)


def test_records_exports_with_their_metadata(otlp_receiver):
    response = _export(otlp_receiver, metadata=(("authorization", "Bearer t"),))

    assert not response.HasField("partial_success")
    [export] = otlp_receiver.exports
    assert data_point_count(export.request) == 2
    assert export.metadata["authorization"] == "Bearer t"


def test_injected_unavailable_fails_once_then_accepts(otlp_receiver):
    otlp_receiver.fail_next(grpc.StatusCode.UNAVAILABLE)

    with pytest.raises(grpc.RpcError) as failed:
        _export(otlp_receiver)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert otlp_receiver.exports == []

    _export(otlp_receiver)
    assert len(otlp_receiver.exports) == 1
    assert otlp_receiver.rejected_calls == 1


def test_throttling_carries_retry_info(otlp_receiver):
    otlp_receiver.throttle_next(retry_after_s=2.5)

    with pytest.raises(grpc.RpcError) as failed:
        _export(otlp_receiver)

    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(failed.value.trailing_metadata())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert retry.retry_delay.ToMilliseconds() == 2500


def test_partial_success_reports_rejected_points(otlp_receiver):
    otlp_receiver.reject_partially_next(1, "one point dropped")

    response = _export(otlp_receiver)

    assert response.partial_success.rejected_data_points == 1
    assert response.partial_success.error_message == "one point dropped"
    assert len(otlp_receiver.exports) == 1


def test_wait_for_times_out_when_nothing_arrives(otlp_receiver):
    assert otlp_receiver.wait_for(lambda exports: len(exports) > 0, timeout=0.2) is False
