"""The delete handler's hand-over, driven as kopf drives it against the sandbox: resources deleted one after the other
(a namespace deletion, `kubectl delete -f dir/`) never leave a `deletionPolicy: Delete` subscription in Kafka."""

from __future__ import annotations

import kopf
import pytest
from kubernetes import client

from kcm_common.kafka import KafkaSettings
from kcm_operator import handlers
from kcm_operator.handlers import OperatorConfig
from kcm_operator.reconcile import Claim, desired_from_spec, diff

SPEC = {"subscriptionName": "payments", "metrics": ["org.apache.kafka.producer."], "intervalMs": 60000,
        "deletionPolicy": "Delete"}
OLDER, NEWER = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"


def _body(name: str, created: str, cluster_id: str | None, annotations: dict | None = None,
          spec: dict = SPEC, not_ready: str | None = None) -> kopf.Body:
    """A resource being deleted; Ready=True once applied (`cluster_id`), unless `not_ready` gives the reason it is not
    now."""
    meta = {"namespace": "team", "name": name, "uid": f"uid-{name}", "creationTimestamp": created,
            "annotations": annotations or {}, "generation": 1, "deletionTimestamp": "2026-01-01T00:00:10Z"}
    ready = {"type": "Ready", "status": "True" if cluster_id and not not_ready else "False"}
    return kopf.Body({"metadata": meta, "spec": spec, "status": {"clusterId": cluster_id, "conditions": [
        {**ready, **({"reason": not_ready} if not_ready else {})}]}})


def _claim(name: str, created: str, cluster_id: str | None, deleting: bool) -> Claim:
    return Claim("team", name, created, f"uid-{name}", None, cluster_id, deleting)


@pytest.fixture(autouse=True)
def _indexed_as_read(monkeypatch):
    """The resources kopf's index names exist as indexed (the reads of `read_claim` are test_operator_units' and
    test_operator_peering's)."""
    monkeypatch.setattr(OperatorConfig, "read_claim", lambda self, claim: claim)


def _applied_by_a(config: OperatorConfig, spec: dict = SPEC) -> str:
    """Subscription `payments` applied to the sandbox as resource team/a would; the cluster's id."""
    admin = config.admin("team", None)
    desired = desired_from_spec("team", "a", spec)
    assert admin.alter_one(diff(desired, admin.describe_one(desired.name))) is None
    return admin.cluster_id()


def test_an_heir_deleted_before_the_owner_has_left_the_index_removes_the_subscription(sandbox):
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    woken: list[str] = []
    config.wake = lambda heir, owner: woken.append(heir.ref)   # the Kubernetes patch: not what is tested here
    try:
        cluster = _applied_by_a(config)

        # The owner a is deleted while b names the subscription too: it is left in Kafka for b, which is woken.
        handlers._delete(config, _body("a", OLDER, cluster), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, False)]}, 0)
        assert woken == ["team/b"] and sandbox.store.configs("payments")

        # b is deleted too, while a's claim (being deleted) is still in kopf's index: b, marked by a's hand-over (the
        # annotation `wake` writes), removes it.
        handed = {handlers.OWNER_DELETED_ANNOTATION: "team/a at 2026-01-01T00:00:10Z"}
        handlers._delete(config, _body("b", NEWER, None, handed), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, True)]}, 0)
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()


def test_a_resource_deleted_with_an_owner_that_retains_the_subscription_leaves_it(sandbox):
    """The owner says Retain; a newer resource naming the subscription (Conflict, Delete) deleted at the same time
    (`kubectl delete -f dir/`, a namespace) took the owner being deleted for a hand-over and removed it."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    config.wake = lambda heir, owner: None
    retain = {**SPEC, "deletionPolicy": "Retain"}
    try:
        cluster = _applied_by_a(config, retain)
        both = {"payments": [_claim("a", OLDER, cluster, True), _claim("b", NEWER, None, True)]}
        handlers._delete(config, _body("a", OLDER, cluster, spec=retain), kopf.Patch(), both, 0)
        # b was marked heir by an earlier owner once: that hand-over is not this one.
        earlier = {handlers.OWNER_DELETED_ANNOTATION: "team/a0 at 2025-12-01T00:00:00Z"}
        handlers._delete(config, _body("b", NEWER, None, earlier), kopf.Patch(), both, 0)
        assert sandbox.store.configs("payments")
    finally:
        config.close()


def test_a_non_owner_that_applied_the_subscription_once_deleted_with_its_owner_leaves_it_to_the_owner(sandbox):
    """b applied `payments` before the older a took it over (a's connection did not work then, say). Deleted together
    (a namespace), a's policy (Retain) decides, whether a is still in kopf's index when b's deletion runs (b's status
    need not say Conflict then: here its cluster was unreachable at its last reconcile) or gone already (then b's
    status says Conflict, as its last reconcile found a the owner)."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    config.wake = lambda heir, owner: None
    try:
        cluster = _applied_by_a(config, {**SPEC, "deletionPolicy": "Retain"})
        both = {"payments": [_claim("a", OLDER, cluster, True), _claim("b", NEWER, cluster, True)]}
        handlers._delete(config, _body("b", NEWER, cluster, not_ready="KafkaUnavailable"), kopf.Patch(), both, 0)
        assert sandbox.store.configs("payments")

        only_b = {"payments": [_claim("b", NEWER, cluster, True)]}
        handlers._delete(config, _body("b", NEWER, cluster, not_ready="Conflict"), kopf.Patch(), only_b, 0)
        assert sandbox.store.configs("payments")

        handlers._delete(config, _body("b", NEWER, cluster), kopf.Patch(), only_b, 0)   # the owner: it removes it
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()


def test_the_claims_a_handler_thread_reads_are_a_copy_kopfs_loop_may_change_meanwhile():
    live = {"team/a": _claim("a", OLDER, None, False)}

    class Index:   # as kopf's: the live values of a dict the event loop updates
        def get(self, key, default=None):
            return live.values() if key == "payments" else default

    claims = handlers._claims_of(Index(), "payments")
    live["team/b"] = _claim("b", NEWER, None, False)
    assert [claim.ref for claim in claims] == ["team/a"]
    assert handlers._claims_of(Index(), "other") == []


@pytest.fixture
def events(monkeypatch) -> list[dict]:
    """The Events handlers post (kopf.event needs a running operator to post them)."""
    posted: list[dict] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: posted.append(event))
    return posted


def _ready(patch: kopf.Patch) -> dict:
    (ready,) = [condition for condition in patch["status"]["conditions"] if condition["type"] == "Ready"]
    return ready


def test_an_owner_whose_heir_cannot_be_marked_is_deleted_again_later_not_let_go(sandbox, events):
    """Only the mark tells an heir deleted before it reconciles that the subscription is its to remove: an owner
    that let go without marking it (the Kubernetes API failing) left the subscription in Kafka with nobody owning it.
    While held, the resource says so: a Terminating resource still reading Ready=True would explain nothing."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    answers = [client.ApiException(status=503, reason="Service Unavailable"), None]

    def wake(heir, owner):
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    config.wake = wake
    claims = {"payments": [_claim("a", OLDER, "cluster", True), _claim("b", NEWER, None, False)]}
    try:
        held = kopf.Patch()
        with pytest.raises(kopf.TemporaryError, match=r"could not mark team/b as the heir .* 503 Service Unavailable"):
            handlers._delete(config, _body("a", OLDER, "cluster"), held, claims, 0)
        ready = _ready(held)
        assert (ready["status"], ready["reason"]) == ("False", "KubernetesError")
        assert ready["message"].startswith("deletion held: could not mark team/b as the heir of subscription payments")
        assert [(event["type"], event["reason"]) for event in events] == [("Warning", "KubernetesError")]
        handlers._delete(config, _body("a", OLDER, "cluster"), kopf.Patch(), claims, 1)   # marked this time
        assert answers == []
        config.wake = lambda heir, owner: (_ for _ in ()).throw(client.ApiException(status=404, reason="Not Found"))
        handlers._delete(config, _body("a", OLDER, "cluster"), kopf.Patch(), claims, 2)   # an heir gone needs none
    finally:
        config.close()


def test_a_deletion_that_fails_unexpectedly_is_held_and_says_so_without_the_exceptions_text(sandbox, events, caplog):
    """The delete handler as kopf calls it: a failure nobody foresaw (a bug, a library's surprise) holds the deletion
    with its own backoff, says so on the resource and in a Warning, and leaves the details to the log."""
    import asyncio

    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)

    def surprise(namespace, connection, recent=False):
        raise ZeroDivisionError("secret-looking detail")

    config.admin = surprise
    (delete,) = [handler for handler in handlers.build_registry(config)._changing.get_all_handlers()
                 if handler.id == "delete"]
    held = kopf.Patch()
    try:
        with pytest.raises(kopf.TemporaryError, match="deletion held: it failed unexpectedly"):
            asyncio.run(delete.fn(body=_body("a", OLDER, "cluster"), patch=held, claims={}, retry=0))
    finally:
        config.close()
    ready = _ready(held)
    assert (ready["status"], ready["reason"]) == ("False", "Failed")
    assert "ZeroDivisionError" in ready["message"] and "secret-looking" not in ready["message"]
    assert [(event["type"], event["reason"]) for event in events] == [("Warning", "Failed")]
    assert "secret-looking detail" in caplog.text   # the traceback is in the log
    assert "subscriptionName" not in held["status"]


def test_an_heir_that_never_applied_the_subscription_removes_it_once_nothing_else_names_it(sandbox):
    """The owner a is deleted and hands the subscription to b, whose spec Kafka refuses (so b never applies it);
    a leaves kopf's index. b deleted then must remove what a left: nobody else could, and it would push for ever."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    config.wake = lambda heir, owner: None
    try:
        cluster = _applied_by_a(config)
        handlers._delete(config, _body("a", OLDER, cluster), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, False)]}, 0)
        assert sandbox.store.configs("payments")   # left for b

        handed = {handlers.OWNER_DELETED_ANNOTATION: "team/a at 2026-01-01T00:00:10Z"}
        handlers._delete(config, _body("b", NEWER, None, handed), kopf.Patch(), {"payments": [
            _claim("b", NEWER, None, True)]}, 0)
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()


def test_a_resource_never_handed_the_subscription_leaves_it_when_nothing_else_names_it(sandbox):
    """Without the hand-over mark, a resource that never applied the subscription leaves what Kafka holds (made by
    hand, say), even when nothing else names it."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        _applied_by_a(config)
        handlers._delete(config, _body("b", NEWER, None), kopf.Patch(), {"payments": [
            _claim("b", NEWER, None, True)]}, 0)
        assert sandbox.store.configs("payments")
    finally:
        config.close()


def test_an_owner_gone_while_its_claim_still_says_deleting_is_no_owner_to_defer_to(sandbox, monkeypatch):
    """kopf's index keeps a resource deleted while this replica was paused by peering, as it was then (being deleted,
    say). b, applied after a was gone, must not take that claim for an owner deleted together with it (whose policy
    would decide): each claim is read first, and a is gone."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    config.wake = lambda heir, owner: None
    monkeypatch.setattr(OperatorConfig, "read_claim", lambda self, claim: None if claim.name == "a" else claim)
    try:
        cluster = _applied_by_a(config)   # as b applied it: the same subscription, the same settings
        handlers._delete(config, _body("b", NEWER, cluster), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, cluster, True)]}, 0)
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()
