"""The sandbox's telemetry receiver: writes every accepted push to the metrics topic in contract v1."""

from __future__ import annotations

import logging
import uuid

from kafka import KafkaProducer
from kafka.errors import KafkaError

from kcm_common import contract
from kcm_common.kafka import KafkaSettings, close_producer
from kcm_sandbox.telemetry import (DEFAULT_TELEMETRY_MAX_BYTES, UNKNOWN_SOFTWARE, ClientIdentity, PushResult,
                                   java_host_address)

log = logging.getLogger("kcm.sandbox.receiver")

PRINCIPAL = "User:ANONYMOUS"
LISTENER = "PLAINTEXT"
_PRODUCER_DEFAULT_MAX_REQUEST_SIZE = 1048576
# Room for a record's headers beside a push of telemetry.max.bytes (client id, software name and version: up to 32 KiB
# each) and the client's overhead; the Java plugin's host leaves the same.
HEADER_ROOM_BYTES = 1048576


class TopicReceiver:
    """Writes pushes with a kafka-python producer; `write` returns once the broker has the record."""

    def __init__(self, settings: KafkaSettings, topic: str, broker_id: int, cluster_id: str,
                 write_timeout_s: float = 10.0, telemetry_max_bytes: int = DEFAULT_TELEMETRY_MAX_BYTES) -> None:
        self.topic = topic
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.write_timeout_s = write_timeout_s
        # The producer checks a record's uncompressed size (key, value, headers) against max_request_size, and
        # every push the gateway accepts must fit: up to telemetry.max.bytes decompressed, plus the headers, whose
        # client id alone may take 32 KiB. zstd keeps what the broker gets far smaller, as in the Java plugin.
        max_request_size = max(telemetry_max_bytes, _PRODUCER_DEFAULT_MAX_REQUEST_SIZE) + HEADER_ROOM_BYTES
        # One record per request keeps the embedded broker's watermarks exact (DESIGN.md, Tansu quirks).
        self._producer = KafkaProducer(acks="all", linger_ms=0, max_in_flight_requests_per_connection=1,
                                       max_request_size=max_request_size, compression_type="zstd",
                                       **settings.client_options())

    def record(self, instance_id: uuid.UUID, identity: ClientIdentity,
               push: PushResult) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        """The contract v1 record (key, value, headers) for one accepted push."""
        instance = str(instance_id)
        attributes = {
            "client_instance_id": instance,
            "client_id": identity.client_id or "",  # never null on a broker (RequestHeader.parse makes it "")
            "client_software_name": _known(identity.software_name),
            "client_software_version": _known(identity.software_version),
            # As the Java plugin writes it, and Kafka matches it (InetAddress.getHostAddress: IPv6 uncompressed).
            "client_source_address": None if identity.source_address is None else java_host_address(
                identity.source_address),
            "client_source_port": None if identity.source_port is None else str(identity.source_port),
            "principal": PRINCIPAL,
            "listener_name": LISTENER,
            "security_protocol": LISTENER,
            "broker_id": str(self.broker_id),
            "cluster_id": self.cluster_id or None,
            "subscription_id": str(push.subscription_id),
            "push_interval_ms": str(push.push_interval_ms),
            "terminating": "true" if push.terminating else "false",
        }
        # What the broker does not know is left out, never written as an empty header (contract v1).
        known = {name: value for name, value in attributes.items() if value is not None}
        assert push.payload is not None
        value, headers = contract.encode(push.payload, attributes=known)
        return instance.encode(), value, headers

    def __call__(self, instance_id: uuid.UUID, identity: ClientIdentity, push: PushResult) -> None:
        if not push.payload:   # no metrics (a subscription selecting none of the client's): kcm's plugin writes none
            return
        key, value, headers = self.record(instance_id, identity, push)
        try:
            self._producer.send(self.topic, key=key, value=value, headers=headers).get(timeout=self.write_timeout_s)
        except KafkaError as exc:
            # As kcm's plugin on a broker: a push the topic does not take is dropped and said so, never refused. A
            # refusal (INVALID_RECORD, what Kafka answers for a plugin that throws) would stop a Java client's
            # telemetry until it restarts, over one slow write.
            log.error("could not write the push of client instance %s to %s, dropped: %s", instance_id, self.topic,
                      exc)

    def close(self) -> None:
        # What is still queued (a broker gone) is dropped, as a write that fails is.
        if (dropped := close_producer(self._producer, 5.0)) is not None:
            log.error("pushes not yet written to %s are dropped as the receiver closes: %s", self.topic, dropped)


def _known(software: str | None) -> str | None:
    """Kafka's "unknown" placeholder (the client never sent ApiVersions v3+) is matched on, never written."""
    return None if software == UNKNOWN_SOFTWARE else software
