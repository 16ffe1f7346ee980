"""The reconcile core: a ClientMetricsSubscription spec → desired CLIENT_METRICS configs → the SET/DELETE ops to get there.

Pure functions only; the operator and `kcm subscriptions` wrap them with Kafka and Kubernetes calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcm_common import client_metrics as cm
from kcm_common.java import TRIM_CHARACTERS

# CR field → Kafka match key, in the order Kafka lists the client attributes.
MATCH_FIELDS: dict[str, str] = {
    "clientInstanceId": "client_instance_id",
    "clientId": "client_id",
    "clientSoftwareName": "client_software_name",
    "clientSoftwareVersion": "client_software_version",
    "clientSourceAddress": "client_source_address",
    "clientSourcePort": "client_source_port",
}
DELETE_POLICY, RETAIN_POLICY = "Delete", "Retain"
SET, DELETE = "SET", "DELETE"


@dataclass(frozen=True)
class Desired:
    """What one subscription should look like in Kafka, parsed from a CR spec."""

    name: str
    metrics: tuple[str, ...]
    interval_ms: int
    match: tuple[tuple[str, str], ...]  # (Kafka match key, regex), in MATCH_FIELDS order
    connection: str | None = None
    deletion_policy: str = DELETE_POLICY

    def configs(self) -> dict[str, str]:
        """The CLIENT_METRICS configs this subscription stands for (no `match` key when it matches every client)."""
        configs = {cm.METRICS: ",".join(self.metrics), cm.INTERVAL_MS: str(self.interval_ms)}
        if self.match:
            configs[cm.MATCH] = ",".join(f"{key}={pattern}" for key, pattern in self.match)
        return configs


@dataclass(frozen=True)
class Op:
    """One IncrementalAlterConfigs entry."""

    key: str
    action: str  # SET or DELETE
    value: str | None = None

    def __str__(self) -> str:
        return f"{self.key}={self.value}" if self.action == SET else f"-{self.key}"


@dataclass(frozen=True)
class Change:
    """What applying (or deleting) one subscription does to Kafka: `action` is create, update, delete or unchanged."""

    name: str
    action: str
    ops: tuple[Op, ...] = ()
    before: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for people: `subscription payments: update (interval.ms=60000, -match)`."""
        detail = f" ({', '.join(str(op) for op in self.ops)})" if self.ops else ""
        return f"subscription {self.name}: {self.action}{detail}"


def subscription_name(namespace: str | None, name: str, spec: Mapping[str, Any]) -> str:
    """The Kafka subscription name of a CR: `spec.subscriptionName`, else `<namespace>.<name>`."""
    explicit = spec.get("subscriptionName")
    if explicit:
        return str(explicit)
    return f"{namespace}.{name}" if namespace else name


def desired_from_spec(namespace: str | None, name: str, spec: Mapping[str, Any]) -> Desired:
    """Parse a (schema-valid, defaulted) ClientMetricsSubscription spec."""
    match = spec.get("match") or {}
    return Desired(
        name=subscription_name(namespace, name, spec),
        # Trimmed as Kafka trims them, so what it holds compares equal (the CRD refuses such values; older resources
        # may still have them).
        metrics=tuple(dict.fromkeys(str(metric).strip(TRIM_CHARACTERS) for metric in spec.get("metrics") or ())),
        interval_ms=int(spec.get("intervalMs", cm.DEFAULT_INTERVAL_MS)),
        match=tuple((key, str(match[field_]).strip(TRIM_CHARACTERS)) for field_, key in MATCH_FIELDS.items()
                    if field_ in match),
        connection=spec.get("connection") or None,
        deletion_policy=spec.get("deletionPolicy", DELETE_POLICY),
    )


def diff(desired: Desired, actual: Mapping[str, str]) -> Change:
    """The ops turning `actual` (the resource's set configs, {} when absent) into `desired`; lists compare as sets."""
    wanted = desired.configs()
    ops = []
    if _as_set(actual.get(cm.METRICS)) != set(desired.metrics) or cm.METRICS not in actual:
        ops.append(Op(cm.METRICS, SET, wanted[cm.METRICS]))
    if _as_int(actual.get(cm.INTERVAL_MS)) != desired.interval_ms:
        ops.append(Op(cm.INTERVAL_MS, SET, wanted[cm.INTERVAL_MS]))
    if desired.match:
        if _as_match(actual.get(cm.MATCH)) != dict(desired.match):
            ops.append(Op(cm.MATCH, SET, wanted[cm.MATCH]))
    elif cm.MATCH in actual:
        ops.append(Op(cm.MATCH, DELETE))
    action = "unchanged" if not ops else ("create" if not actual else "update")
    return Change(desired.name, action, tuple(ops), dict(actual))


def removal(name: str, actual: Mapping[str, str]) -> Change:
    """The ops deleting every key, which removes the subscription; an absent one needs nothing."""
    if not actual:
        return Change(name, "unchanged")
    return Change(name, "delete", tuple(Op(key, DELETE) for key in sorted(actual)), dict(actual))


def drift(change: Change) -> str:
    """What an out-of-band edit changed, for the drift event: `interval.ms is 1000, want 60000; match was removed`."""
    if not change.before:
        return "the subscription was deleted"
    parts = []
    for op in change.ops:
        was = change.before.get(op.key)
        if op.action == DELETE:
            parts.append(f"{op.key} was added ({was!r})")
        elif was is None:
            parts.append(f"{op.key} was removed (want {op.value!r})")
        else:
            parts.append(f"{op.key} is {was!r}, want {op.value!r}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Claim:
    """A resource naming a subscription on a cluster; the oldest claim on a cluster owns it there."""

    namespace: str
    name: str
    created: str  # RFC 3339 creationTimestamp; sorts chronologically as text
    uid: str = ""
    connection: str | None = None  # its spec.connection: a KafkaConnection in its namespace, or the default cluster
    # Its status.clusterId: the Kafka cluster it was last applied to, for when the connection cannot say now (gone,
    # or broken since this operator started).
    cluster_id: str | None = None
    # Being deleted: it no longer claims the subscription for itself, and hands it over to the next claim.
    deleting: bool = False
    # Every field takes part in equality: kopf's index keeps an entry that compares equal to its new value, so a field
    # left out would stay as first indexed. Tell claims apart by `ref`.

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def cluster_ref(self) -> tuple[str, str] | None:
        return cluster_ref(self.namespace, self.connection)


def cluster_ref(namespace: str, connection: str | None) -> tuple[str, str] | None:
    """Which cluster a resource names: (namespace, KafkaConnection), or None for the default cluster."""
    return (namespace, connection) if connection else None


def oldest_first(claims: Iterable[Claim]) -> list[Claim]:
    """Claims by age; ties broken by namespace/name so every replica agrees."""
    return sorted(claims, key=lambda claim: (claim.created, claim.namespace, claim.name, claim.uid))


def owner(claims: Iterable[Claim]) -> Claim | None:
    """The claim that owns a subscription: the oldest."""
    ordered = oldest_first(claims)
    return ordered[0] if ordered else None


def _as_set(value: str | None) -> set[str]:
    return set(cm.parse_list(value)) if value is not None else set()


def _as_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _as_match(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    try:
        # Compared as text: a Java pattern kcm's translation cannot read (`[a-z[0-9]]`, `&&`, `(?U)`) must still
        # compare equal to itself, or every drift check would rewrite it.
        return cm.parse_match(cm.parse_list(value), check_patterns=False)
    except cm.ConfigError:
        return None


def ops_for_kafka(ops: Sequence[Op]) -> list[tuple[str, int, str | None]]:
    """Ops as IncrementalAlterConfigs entries (name, operation id, value)."""
    return [(op.key, cm.OP_SET if op.action == SET else cm.OP_DELETE, op.value) for op in ops]
