"""Apply ClientMetricsSubscription files to one cluster without Kubernetes: what `kcm subscriptions apply` and the demo run."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from kcm_common import client_metrics as cm
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings
from kcm_operator import manifests
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.errors import InvalidSpecError
from kcm_operator.reconcile import Change, Desired, diff, removal

log = logging.getLogger("kcm.subscriptions")


def apply_files(settings: KafkaSettings, paths: Iterable[str | Path], dry_run: bool = False,
                recursive: bool = False) -> list[Change]:
    """Make Kafka hold every subscription the files define, all or nothing; returns what changed (or would)."""
    paths = list(paths)
    found = manifests.subscriptions(manifests.load(paths, recursive))
    if not found:
        raise UserError(f"no ClientMetricsSubscription resources in {', '.join(map(str, paths))}")
    for manifest, desired in found:
        if desired.connection:
            log.warning("%s: spec.connection %r is ignored here; applying to %s", manifest.ref, desired.connection,
                        settings.describe())
        if desired.interval_ms > cm.DEFAULT_INTERVAL_MS:   # Kafka takes it, and gives clients its default at most
            log.warning("%s: spec.intervalMs %d is above %d ms, Kafka's default interval: clients are told to push "
                        "every %d ms at most", manifest.ref, desired.interval_ms, cm.DEFAULT_INTERVAL_MS,
                        cm.DEFAULT_INTERVAL_MS)
    admin = SubscriptionAdmin(settings)
    try:
        return apply_desired(admin, [desired for _, desired in found], dry_run)
    finally:
        admin.close()


def apply_desired(admin: SubscriptionAdmin, wanted: list[Desired], dry_run: bool = False) -> list[Change]:
    """Describe, diff, let Kafka validate every change, then alter (unless `dry_run`); one request per step."""
    admin.require_telemetry()
    actual = admin.describe([desired.name for desired in wanted])
    changes = [diff(desired, actual.get(desired.name, {})) for desired in wanted]
    refused = {name: error for name, error in admin.alter(changes, validate_only=True).items() if error is not None}
    if refused:
        raise InvalidSpecError("Kafka refuses, nothing applied: " + "; ".join(
            f"subscription {name}: {error}" for name, error in sorted(refused.items())))
    if not dry_run:
        failed = {name: error for name, error in admin.alter(changes).items() if error is not None}
        if failed:
            raise InvalidSpecError("Kafka refused: " + "; ".join(
                f"subscription {name}: {error}" for name, error in sorted(failed.items())))
    return changes


def delete_subscription(admin: SubscriptionAdmin, name: str, dry_run: bool = False) -> Change:
    """Remove one subscription from Kafka (every key deleted); an absent one is reported unchanged."""
    change = removal(name, admin.describe([name]).get(name, {}))
    if not dry_run:
        error = admin.alter([change]).get(name)
        if error is not None:
            raise error
    return change
