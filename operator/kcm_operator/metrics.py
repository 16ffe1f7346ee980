"""The operator's Prometheus metrics: reconciliations by result and reason, duration, drift corrections, Kafka errors."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

RECONCILIATIONS = Counter("kcm_operator_reconciliations", "Reconciliations of ClientMetricsSubscriptions",
                          ["result", "reason"])
DURATION = Histogram("kcm_operator_reconcile_duration_seconds", "Time to reconcile one ClientMetricsSubscription",
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
MANAGED = Gauge("kcm_operator_managed_subscriptions", "ClientMetricsSubscriptions whose subscription is Ready")
DRIFT_CORRECTIONS = Counter("kcm_operator_drift_corrections", "Out-of-band subscription changes reverted")
KAFKA_ERRORS = Counter("kcm_operator_kafka_errors", "Kafka calls that failed", ["reason"])
# Every reason from 0, so that a rate or increase() in an alert counts a reason's first errors too.
for _reason in ("KafkaUnavailable", "KafkaRefused"):
    KAFKA_ERRORS.labels(_reason)


def record(started: float, result: str, reason: str) -> None:
    """Count one reconciliation that began at `started` (time.monotonic())."""
    RECONCILIATIONS.labels(result, reason).inc()
    DURATION.observe(time.monotonic() - started)
