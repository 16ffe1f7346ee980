"""The fake collector answers like a real one, including the failures fault tests need."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from fake_collector import FakeCollector, data_point_count
from payloads import client_metrics


def _export(receiver: FakeCollector, metadata=()):
    request = ExportMetricsServiceRequest(resource_metrics=client_metrics().resource_metrics)
    with grpc.insecure_channel(receiver.endpoint) as channel:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        return stub.Export(request, timeout=5, metadata=metadata)


def test_records_exports_with_their_metadata(collector):
    response = _export(collector, metadata=(("authorization", "Bearer t"),))

    assert not response.HasField("partial_success")
    [export] = collector.exports
    assert data_point_count(export.request) == 2
    assert export.metadata["authorization"] == "Bearer t"


def test_injected_unavailable_fails_once_then_accepts(collector):
    collector.fail_next(grpc.StatusCode.UNAVAILABLE)

    with pytest.raises(grpc.RpcError) as failed:
        _export(collector)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert collector.exports == []

    _export(collector)
    assert len(collector.exports) == 1
    assert collector.rejected_calls == 1


def test_throttling_carries_retry_info(collector):
    collector.throttle_next(retry_after_s=2.5)

    with pytest.raises(grpc.RpcError) as failed:
        _export(collector)

    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(failed.value.trailing_metadata())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert retry.retry_delay.ToMilliseconds() == 2500


def test_partial_success_reports_rejected_points(collector):
    collector.reject_partially_next(1, "one point dropped")

    response = _export(collector)

    assert response.partial_success.rejected_data_points == 1
    assert response.partial_success.error_message == "one point dropped"
    assert len(collector.exports) == 1


def test_wait_for_times_out_when_nothing_arrives(collector):
    assert collector.wait_for(lambda exports: len(exports) > 0, timeout=0.2) is False
