"""The errors reconciliation reports: each becomes a Ready=False reason on the CR and one line in the CLI."""

from __future__ import annotations

from kcm_common.errors import UserError
from kcm_common.kafka import KafkaUnavailableError

__all__ = ["InvalidSpecError", "KafkaUnavailableError", "UnsupportedError", "reason_of"]


class InvalidSpecError(UserError):
    """Kafka (or the CRD schema) refuses the spec; the message is theirs. Retrying will not help until it is edited."""


class UnsupportedError(UserError):
    """The cluster does not do KIP-714: its brokers advertise no telemetry APIs (71/72)."""


def reason_of(error: Exception) -> str:
    """The condition reason for an error: InvalidSpec, KafkaUnavailable, Unsupported or Failed."""
    if isinstance(error, InvalidSpecError):
        return "InvalidSpec"
    if isinstance(error, KafkaUnavailableError):
        return "KafkaUnavailable"
    if isinstance(error, UnsupportedError):
        return "Unsupported"
    return "Failed"
