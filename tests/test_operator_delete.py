"""The delete handler's hand-over, driven as kopf drives it against the sandbox: resources deleted one after the other
(a namespace deletion, `kubectl delete -f dir/`) never leave a `deletionPolicy: Delete` subscription in Kafka."""

from __future__ import annotations

import kopf

from kcm_common.kafka import KafkaSettings
from kcm_operator import handlers
from kcm_operator.handlers import OperatorConfig
from kcm_operator.reconcile import Claim, desired_from_spec, diff

SPEC = {"subscriptionName": "payments", "metrics": ["org.apache.kafka.producer."], "intervalMs": 60000,
        "deletionPolicy": "Delete"}
OLDER, NEWER = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"


def _body(name: str, created: str, cluster_id: str | None) -> kopf.Body:
    meta = {"namespace": "team", "name": name, "uid": f"uid-{name}", "creationTimestamp": created,
            "annotations": {}, "generation": 1, "deletionTimestamp": "2026-01-01T00:00:10Z"}
    return kopf.Body({"metadata": meta, "spec": SPEC, "status": {"clusterId": cluster_id, "conditions": [
        {"type": "Ready", "status": "True" if cluster_id else "False"}]}})


def _claim(name: str, created: str, cluster_id: str | None, deleting: bool) -> Claim:
    return Claim("team", name, created, f"uid-{name}", None, cluster_id, deleting)


def test_an_heir_deleted_before_the_owner_has_left_the_index_removes_the_subscription(sandbox):
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    woken: list[str] = []
    config.wake = lambda heir, owner: woken.append(heir.ref)   # the Kubernetes patch: not what is tested here
    try:
        admin = config.admin("team", None)
        desired = desired_from_spec("team", "a", SPEC)
        assert admin.alter_one(diff(desired, admin.describe_one(desired.name))) is None
        cluster = admin.cluster_id()

        # The owner a is deleted while b names the subscription too: it is left in Kafka for b, which is woken.
        handlers._delete(config, _body("a", OLDER, cluster), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, False)]}, 0)
        assert woken == ["team/b"] and sandbox.store.configs("payments")

        # b is deleted too, while a's claim (being deleted) is still in kopf's index: b removes it.
        handlers._delete(config, _body("b", NEWER, None), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, True)]}, 0)
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()
