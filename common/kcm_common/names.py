"""Names more than one component relies on: the metrics topic and the KIP-714 attribute names."""

from __future__ import annotations

DEFAULT_METRICS_TOPIC = "kafka-client-metrics"

# The client attributes KIP-714 defines: what CLIENT_METRICS `match` entries test, and the first contract headers.
CLIENT_ATTRIBUTES: tuple[str, ...] = (
    "client_instance_id",
    "client_id",
    "client_software_name",
    "client_software_version",
    "client_source_address",
    "client_source_port",
)
# What the broker adds about the connection and itself.
BROKER_ATTRIBUTES: tuple[str, ...] = (
    "principal",
    "listener_name",
    "security_protocol",
    "broker_id",
    "cluster_id",
)
# Facts of the push itself.
PUSH_ATTRIBUTES: tuple[str, ...] = ("subscription_id", "push_interval_ms", "terminating")

# Every attribute header of contract v1, in the order writers emit them.
ATTRIBUTE_HEADERS: tuple[str, ...] = CLIENT_ATTRIBUTES + BROKER_ATTRIBUTES + PUSH_ATTRIBUTES
