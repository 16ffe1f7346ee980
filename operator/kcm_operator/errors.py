"""The errors reconciliation reports: each becomes a Ready=False reason on the CR and one line in the CLI."""

from __future__ import annotations

from kcm_common.errors import UserError
from kcm_common.kafka import KafkaUnavailableError

__all__ = ["InvalidSpecError", "invalid_spec_message", "KafkaRefusedError", "KafkaUnavailableError",
           "KubernetesApiError", "MissingReferenceError", "UnsupportedError", "RETRIED", "reason_of"]


class InvalidSpecError(UserError):
    """Kafka (or the CRD schema) refuses the spec; the message is theirs. Retrying will not help until it is edited."""


class MissingReferenceError(InvalidSpecError):
    """The spec names a KafkaConnection, Secret or Secret key that does not exist (yet: GitOps applies resources in
    any order), so it is retried with backoff, unlike other invalid specs."""


class UnsupportedError(UserError):
    """The cluster does not do KIP-714: its brokers advertise no telemetry APIs (71/72)."""


class KafkaRefusedError(UserError):
    """Kafka refused a call for a reason other than the spec (authorization, say): retried, it may pass once fixed.
    `code`: Kafka's error code, when it gave one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class KubernetesApiError(UserError):
    """The Kubernetes API failed a read other than with 404 (RBAC forbids it, the server is busy): retried."""


# Reported on the resource and retried with backoff; the other errors wait for the spec to change.
RETRIED = (KafkaUnavailableError, KafkaRefusedError, KubernetesApiError, MissingReferenceError)


def invalid_spec_message(kind: str, problems: list[str]) -> str:
    """What to say of a spec the CRD of `kind` refuses (`schema.spec_problems`): each field's problem and what to do."""
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    return (f"the spec is not valid for the {kind} CRD: {shown}. Fix the resource (kcm subscriptions apply --dry-run "
            "-f FILE checks a file); the API server let it through, so its CRD may be older than this operator's: "
            "kubectl apply -f crds/")


def reason_of(error: Exception) -> str:
    """The condition reason for an error: InvalidSpec, KafkaUnavailable, KafkaRefused, KubernetesError, Unsupported
    or Failed."""
    if isinstance(error, InvalidSpecError):
        return "InvalidSpec"
    if isinstance(error, KafkaUnavailableError):
        return "KafkaUnavailable"
    if isinstance(error, KafkaRefusedError):
        return "KafkaRefused"
    if isinstance(error, KubernetesApiError):
        return "KubernetesError"
    if isinstance(error, UnsupportedError):
        return "Unsupported"
    return "Failed"
