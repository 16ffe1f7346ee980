"""The KIP-714 telemetry messages encode and decode the way Apache Kafka frames them on the wire."""

from __future__ import annotations

import uuid

from kcm_sandbox.messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)

CLIENT = uuid.UUID("0123456789abcdeffedcba9876543210")


def test_api_keys_and_versions_are_kafkas():
    assert (GetTelemetrySubscriptionsRequest.API_KEY, GetTelemetrySubscriptionsResponse.API_KEY) == (71, 71)
    assert (PushTelemetryRequest.API_KEY, PushTelemetryResponse.API_KEY) == (72, 72)
    assert PushTelemetryRequest.max_version == 0 and GetTelemetrySubscriptionsResponse.max_version == 0


def test_push_request_with_flexible_header_has_kafkas_exact_bytes():
    request = PushTelemetryRequest(
        client_instance_id=CLIENT, subscription_id=-5, terminating=True, compression_type=4, metrics=b"abc", version=0
    )
    request.with_header(correlation_id=7, client_id="me")

    encoded = request.encode(header=True, framed=True)

    header = "0048" "0000" "00000007" "0002" + b"me".hex() + "00"  # request header v2: non-compact client id, tags
    body = CLIENT.hex + "fffffffb" "01" "04" "04" + b"abc".hex() + "00"  # compact bytes: length + 1
    assert encoded.hex() == f"{len(bytes.fromhex(header + body)):08x}" + header + body
    decoded = PushTelemetryRequest.decode(encoded, version=0, header=True, framed=True)
    assert decoded.header.correlation_id == 7 and decoded.header.client_id == "me"
    assert (decoded.client_instance_id, decoded.subscription_id, decoded.terminating) == (CLIENT, -5, True)
    assert (decoded.compression_type, decoded.metrics) == (4, b"abc")


def test_get_request_with_zero_instance_id_decodes_as_none():
    encoded = GetTelemetrySubscriptionsRequest(client_instance_id=uuid.UUID(int=0), version=0).encode()

    assert encoded == bytes(17)  # a zero uuid and an empty tag buffer
    assert GetTelemetrySubscriptionsRequest.decode(encoded, version=0).client_instance_id is None


def test_get_response_round_trips_every_field():
    response = GetTelemetrySubscriptionsResponse(
        throttle_time_ms=0, error_code=0, client_instance_id=CLIENT, subscription_id=-725132321,
        accepted_compression_types=[4, 3, 1, 2], push_interval_ms=60000, telemetry_max_bytes=1048576,
        delta_temporality=True, requested_metrics=["org.apache.kafka.producer.", "*"], version=0,
    )
    response.with_header(correlation_id=9)

    decoded = GetTelemetrySubscriptionsResponse.decode(response.encode(header=True), version=0, header=True)

    assert decoded.header.correlation_id == 9
    assert decoded.client_instance_id == CLIENT and decoded.subscription_id == -725132321
    assert decoded.accepted_compression_types == [4, 3, 1, 2]
    assert (decoded.push_interval_ms, decoded.telemetry_max_bytes, decoded.delta_temporality) == (60000, 1048576, True)
    assert decoded.requested_metrics == ["org.apache.kafka.producer.", "*"]


def test_push_response_is_throttle_and_error_code():
    encoded = PushTelemetryResponse(throttle_time_ms=0, error_code=117, version=0).encode()

    assert encoded.hex() == "00000000" "0075" "00"
    assert PushTelemetryResponse.decode(encoded, version=0).error_code == 117
