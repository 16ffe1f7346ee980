"""Names more than one component relies on: the metrics topic and the KIP-714 attribute names."""

from __future__ import annotations

import ipaddress
import re

DEFAULT_METRICS_TOPIC = "kafka-client-metrics"
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def listen_address_problem(text: str) -> str | None:
    """Why `text` cannot be an address to listen on (an IP address, v4 or v6), or None."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return f"{text[:80]!r} is not an IP address (e.g. 0.0.0.0, 127.0.0.1 or ::)"
    return None


def topic_problem(name: str) -> str | None:
    """Why `name` is not a topic name Kafka accepts (Topic.validate), or None."""
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        return (f"{name[:80]!r} is not a Kafka topic name: 1 to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-', "
                "and not '.' or '..'")
    return None

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
