"""The operator's handlers, the subscriptions CLI and `kcm operator` at their edges: behaviour a mutation review
(session 24) found no test pinned; a docstring's "kills Xnn" names the mutant of that review the test was checked
against. Handlers are called as kopf calls them, without a Kubernetes API: kopf.event is captured, the Kafka side
is the sandbox where one is needed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import kopf
import pytest
from kubernetes import client

from kcm_common.kafka import KafkaSettings
from kcm_operator import handlers
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.handlers import OperatorConfig
from kcm_operator.reconcile import SET, Change, Claim, Op, desired_from_spec, diff
from test_operator_delete import NEWER, OLDER, SPEC as DELETE_SPEC, _body, _claim
from test_operator_reconcile import IN_KAFKA, SPEC, wait_for


@pytest.fixture
def events(monkeypatch) -> list[dict]:
    """The Events handlers post (kopf.event needs a running operator to post them)."""
    posted: list[dict] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: posted.append(event))
    return posted


# An API client the tests' fake CustomObjectsApi never sends through (the operator makes its writer from it).
_UNUSED_API = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))


def _resource(name: str = "payments", spec: dict = SPEC, annotations: dict | None = None, status: dict | None = None,
              generation: int = 1, created: str = NEWER) -> dict:
    return {"metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}", "creationTimestamp": created,
                         "generation": generation, "annotations": annotations or {}},
            "spec": spec, "status": status or {}}


def _reconcile(config: OperatorConfig, resource: dict, claims: dict | None = None,
               drift_check: bool = False) -> kopf.Patch:
    """One reconcile of `resource` as kopf's change handlers run it; returns the status patch it made."""
    patch = kopf.Patch()
    handlers._reconcile(config, kopf.Body(resource), patch, claims or {}, 0, drift_check=drift_check)
    return patch


def _conditions(patch: kopf.Patch) -> dict[str, dict]:
    return {condition["type"]: condition for condition in (patch.get("status") or {}).get("conditions") or ()}


def _admin(sandbox) -> SubscriptionAdmin:
    return SubscriptionAdmin(KafkaSettings(sandbox.bootstrap))


# -- handlers: the hand-over mark ------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_the_heir_mark_is_written_with_a_bounded_request_and_read_back_as_the_hand_over_by_the_heirs_deletion(
        sandbox, monkeypatch):
    """Kills H02 (wake() without `_request_timeout`: a Kubernetes API that hangs holds the owner's deletion, and a
    handler thread, for ever) and H03 (the mark written in a form `_delete` does not read as a hand-over: an heir
    deleted before it reconciled left a `deletionPolicy: Delete` subscription in Kafka with nobody owning it). The
    existing test writes the annotation by hand, so the two sides of that contract were never checked together."""
    patches = []

    class Api:
        def __init__(self, api_client=None) -> None:
            pass

        def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, **options):
            patches.append((namespace, name, body, options))

        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **options):
            # Both resources exist, a being deleted: the deletion reads the others its index names.
            deleting = {"deletionTimestamp": "2026-01-01T00:00:10Z"} if name == "a" else {}
            return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}", **deleting}}

    monkeypatch.setattr(client, "CustomObjectsApi", Api)
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5, api_client=_UNUSED_API)
    try:
        admin = config.admin("team", None)
        desired = desired_from_spec("team", "a", DELETE_SPEC)
        assert admin.alter_one(diff(desired, admin.describe_one(desired.name))) is None
        cluster = admin.cluster_id()
        handlers._delete(config, _body("a", OLDER, cluster), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, False)]}, 0)
        [(namespace, name, mark, options)] = patches
        assert (namespace, name) == ("team", "b")
        timeout = options.get("_request_timeout")
        assert timeout is not None and all(0 < part <= 60 for part in (timeout if isinstance(timeout, tuple)
                                                                        else (timeout,))), options
        assert sandbox.store.configs("payments")   # left for b

        # b is deleted before it reconciled, with the mark exactly as wake() wrote it.
        annotations = mark["metadata"]["annotations"]
        handlers._delete(config, _body("b", NEWER, None, annotations), kopf.Patch(), {"payments": [
            _claim("a", OLDER, cluster, True), _claim("b", NEWER, None, True)]}, 0)
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()


# -- handlers: drift checks ------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_drift_check_of_an_edit_not_yet_reconciled_leaves_kafka_to_the_change_handler(sandbox, monkeypatch, events):
    """Kills H14 (the drift check ignores `generation != status.observedGeneration`): kopf's body is live, so a drift
    check whose turn comes between an edit and its reconcile must not apply anything (nor call it drift); the change
    handler does. Called as kopf calls the timer, with the resource as it is then."""
    admin = _admin(sandbox)
    try:
        admin.alter([Change("team.payments", "create", (Op("metrics", SET, "org.apache.kafka.producer."),
                                                        Op("interval.ms", SET, "1000"),
                                                        Op("match", SET, "client_id=payments-.*")))])
    finally:
        admin.close()
    written = []

    class Api:   # a drift check writes its status itself (kopf's patch stays empty)
        def __init__(self, api_client=None) -> None:
            pass

        def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **options):
            written.append((namespace, name, body, options))

    monkeypatch.setattr(client, "CustomObjectsApi", Api)
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5, api_client=_UNUSED_API)
    (check,) = [handler for handler in handlers.build_registry(config)._spawning.get_all_handlers()
                if handler.id == "drift"]
    applied = {"observedGeneration": 1, "subscriptionName": "team.payments", "lastAppliedTime": "2026-01-01T00:00:00Z",
               "conditions": [
        {"type": "Ready", "status": "True", "reason": "Applied", "message": "", "observedGeneration": 1,
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    try:
        patch = kopf.Patch()
        asyncio.run(check.fn(body=kopf.Body(_resource(status=applied, generation=2)), patch=patch, claims={}))
        assert sandbox.store.configs("team.payments")["interval.ms"] == "1000"
        assert not patch and events == [] and written == []

        patch = kopf.Patch()   # the same check once the edit is observed does apply
        asyncio.run(check.fn(body=kopf.Body(_resource(status=applied, generation=1)), patch=patch, claims={}))
        assert sandbox.store.configs("team.payments") == IN_KAFKA
        assert not patch
        [(namespace, name, body, options)] = written
        assert (namespace, name) == ("team", "payments") and body["status"]["lastAppliedTime"] != "2026-01-01T00:00:00Z"
        assert options.get("_request_timeout")   # a hanging API server holds no handler thread for ever
    finally:
        config.close()


# -- handlers: deletion forgets the resource -------------------------------------------------------------------------

def test_a_deleted_resource_is_forgotten_its_lock_and_drift_history_go_with_it(events):
    """Kills H15 (the delete handler never calls `config.forget`): an operator running for months keeps a lock, a
    drift history and a Contested mark for every resource ever deleted."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), kafka_timeout_s=1)
    (delete,) = [handler for handler in handlers.build_registry(config)._changing.get_all_handlers()
                 if handler.id == "delete"]
    config.resource_lock("uid-a")
    config.drift_history["uid-a"] = handlers.collections.deque([True, True], maxlen=handlers.CONTESTED_WINDOW)
    config.contested["uid-a"] = 1
    retained = {**DELETE_SPEC, "deletionPolicy": "Retain"}   # nothing to ask Kafka
    try:
        asyncio.run(delete.fn(body=_body("a", OLDER, "cluster", spec=retained), patch=kopf.Patch(), claims={},
                              retry=0))
    finally:
        config.close()
    assert "uid-a" not in config.resource_locks
    assert "uid-a" not in config.drift_history and "uid-a" not in config.contested


# -- handlers: paused ------------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_only_paused_true_pauses_a_resource_annotated_false_is_reconciled(sandbox, events):
    """Kills H19 (any value of kcm.dev/paused pauses): `kcm.dev/paused: "false"`, the way a GitOps repository
    un-pauses, left the subscription out of Kafka and the resource saying Paused."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        patch = _reconcile(config, _resource(annotations={handlers.PAUSED_ANNOTATION: "false"}))
    finally:
        config.close()
    assert sandbox.store.configs("team.payments") == IN_KAFKA
    conditions = _conditions(patch)
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("True", "Applied")
    assert "Paused" not in conditions


def test_pausing_a_contested_resource_stops_it_saying_contested(events):
    """Kills H20 (only Conflict is replaced while paused): a paused resource went on reading Ready=False Contested,
    describing a fight that is not looked at while paused, as it does for Conflict."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), kafka_timeout_s=1)
    contested = {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "False", "reason": "Contested", "message": "something else manages it too",
         "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    patch = _reconcile(config, _resource(annotations={handlers.PAUSED_ANNOTATION: "true"}, status=contested))
    ready = _conditions(patch)["Ready"]
    assert (ready["status"], ready["reason"]) == ("Unknown", "Paused")
    assert "not reconciled" in ready["message"]


# -- handlers: events only when the condition changes ----------------------------------------------------------------

def test_a_conflict_is_one_warning_not_one_per_reconcile(events):
    """Kills H23 (the Conflict event posted whatever `ready_changed` says): every drift check (each minute) and every
    resume of a resource in Conflict posted another Warning. No Kafka needed: the older resource names the same
    (default) cluster, which is all `_older_owner` looks at."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), kafka_timeout_s=1)
    config.read_claim = lambda claim: claim   # the older resource exists (no Kubernetes API here)
    older = Claim("team", "first", OLDER, "uid-first", None, "cluster")
    resource = _resource(spec={**SPEC, "subscriptionName": "shared"})
    claims = {"shared": [older]}
    try:
        first = _reconcile(config, resource, claims)
        assert _conditions(first)["Ready"]["reason"] == "Conflict"
        resource["status"] = dict(first["status"])   # as the watch brings it back
        second = _reconcile(config, resource, claims, drift_check=True)
    finally:
        config.close()
    assert "conditions" not in (second.get("status") or {})
    assert [(event["type"], event["reason"]) for event in events] == [("Warning", "Conflict")]
    assert "team/first" in events[0]["message"]


# -- handlers: what is known of other resources' clusters ------------------------------------------------------------

def test_the_cluster_seen_through_a_connection_wins_over_an_older_status():
    """Kills H12 (`known_cluster_id` reads only the status): once this operator has reached a KafkaConnection's
    (re-pointed) cluster, a resource whose status still names the old cluster is compared by the new one."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"))
    claim = Claim("team", "older", OLDER, "uid-older", "analytics", "cluster-1")
    assert config.known_cluster_id(claim) == "cluster-1"   # nothing seen yet: its status
    config.remember_cluster_id(("team", "analytics"), "cluster-2")
    assert config.known_cluster_id(claim) == "cluster-2"


# -- handlers: admins replaced by new settings ----------------------------------------------------------------------

def test_an_admin_replaced_by_new_settings_is_closed_only_after_the_calls_started_on_it_can_end(monkeypatch):
    """Kills H08 (the replaced admin closed at once): a handler that took it just before a password rotation had
    its describe/alter fail under it, posting a Warning for nothing."""
    closed: list[object] = []
    monkeypatch.setattr(handlers.BatchedAdmin, "close", lambda self: closed.append(self))
    current = [KafkaSettings("127.0.0.1:9")]
    config = OperatorConfig(current[0], reload=lambda: current[0], kafka_timeout_s=0.5)
    old = config.admin("team", None)
    current[0] = KafkaSettings("127.0.0.1:10")   # the --command-config file changed

    new = config.admin("team", None)

    assert new is not old
    assert config.retired_admin_grace_s() >= 3 * config.kafka_timeout_s
    time.sleep(0.3)   # a timer never fires early: well within the 2.5 s grace
    assert closed == []
    wait_for(lambda: closed == [old], "the replaced admin to be closed after its grace")


# -- handlers: metrics -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("error", ["missing", "forbidden"])
def test_a_kafka_connection_that_cannot_be_read_is_retried_and_never_counted_as_a_kafka_error(events, error):
    """Kills H30 (every retried error counted in kcm_operator_kafka_errors_total): a KafkaConnection or Secret not
    there yet (GitOps order), or RBAC refusing the read, is a Kubernetes matter; counting it as a Kafka error sends
    whoever watches that alert to the wrong system."""
    from prometheus_client import REGISTRY

    from kcm_operator.errors import KubernetesApiError, MissingReferenceError

    def resolve(namespace: str, name: str) -> KafkaSettings:
        if error == "missing":
            raise MissingReferenceError(f"spec.connection: KafkaConnection {namespace}/{name} does not exist")
        raise KubernetesApiError(f"KafkaConnection {namespace}/{name}: the Kubernetes API answered 403 Forbidden")

    reason = "InvalidSpec" if error == "missing" else "KubernetesError"

    def counted() -> float:
        return REGISTRY.get_sample_value("kcm_operator_kafka_errors_total", {"reason": reason}) or 0.0

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), resolve=resolve, kafka_timeout_s=1)
    before = counted()
    try:
        with pytest.raises(kopf.TemporaryError):
            _reconcile(config, _resource(spec={**SPEC, "connection": "later"}))
    finally:
        config.close()
    assert counted() == before
    assert [(event["type"], event["reason"]) for event in events] == [("Warning", reason)]


@pytest.mark.timeout(60)
def test_a_revert_at_a_drift_check_is_drift_and_counted_a_recovery_at_one_is_neither(sandbox, events):
    """Kills H34 (a drift check applying to a resource that was not Ready, e.g. its cluster was down, reported as
    someone's out-of-band edit: a Warning Drift and a correction counted) and H35 (kcm_operator_drift_corrections_total
    never counted: the only existing check of it is that a move does not count)."""
    from prometheus_client import REGISTRY

    def corrections() -> float:
        return REGISTRY.get_sample_value("kcm_operator_drift_corrections_total") or 0.0

    def ready(status: str, reason: str) -> dict:
        return {"observedGeneration": 1, "subscriptionName": "team.payments", "conditions": [
            {"type": "Ready", "status": status, "reason": reason, "message": "", "observedGeneration": 1,
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}

    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        before = corrections()   # the cluster was down, and now answers: the subscription is not there yet
        _reconcile(config, _resource(status=ready("False", "KafkaUnavailable")), drift_check=True)
        assert sandbox.store.configs("team.payments") == IN_KAFKA
        assert [(event["type"], event["reason"]) for event in events] == [("Normal", "Applied")]
        assert corrections() == before

        admin = _admin(sandbox)
        try:   # someone else's edit, found by the next drift check
            admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, "1000"),))])
        finally:
            admin.close()
        _reconcile(config, _resource(status=ready("True", "Applied")), drift_check=True)
        assert sandbox.store.configs("team.payments") == IN_KAFKA
        assert [(event["type"], event["reason"]) for event in events[1:]] == [("Warning", "Drift")]
        assert corrections() == before + 1
    finally:
        config.close()


# -- apply.py: what `kcm subscriptions apply/delete` report ------------------------------------------------------------

class _Admin:
    """A SubscriptionAdmin whose Kafka validates every change and then refuses the ones named in `refuse`."""

    def __init__(self, refuse: dict[str, Exception], held: dict[str, dict[str, str]] | None = None) -> None:
        self.refuse, self.held, self.altered = refuse, held or {}, []

    def require_telemetry(self) -> None:
        pass

    def describe(self, names):
        return {name: self.held[name] for name in names if name in self.held}

    def alter(self, changes, validate_only: bool = False):
        if not validate_only:
            self.altered.extend(change.name for change in changes)
        return {change.name: None if validate_only else self.refuse.get(change.name) for change in changes}


def test_a_change_kafka_validated_but_then_refused_is_an_error_not_reported_applied():
    """Kills A05 (the real alter's errors dropped): validation passes, then the alter is refused (authorization
    changed, a controller moved): `apply` printed "create (…)" and exited 0 with nothing in Kafka."""
    from kcm_operator.apply import apply_desired
    from kcm_operator.errors import InvalidSpecError, KafkaRefusedError

    admin = _Admin({"team.payments": KafkaRefusedError("CLUSTER_AUTHORIZATION_FAILED")})
    with pytest.raises(InvalidSpecError, match=r"^Kafka refused: subscription team\.payments: CLUSTER_AUTH"):
        apply_desired(admin, [desired_from_spec("team", "payments", SPEC)])


def test_a_removal_kafka_refuses_is_an_error_not_reported_deleted():
    """Kills A06 (delete_subscription ignores the alter's error): `kcm subscriptions delete` said "delete (…)" and
    exited 0 while the subscription stayed in Kafka."""
    from kcm_operator.apply import delete_subscription
    from kcm_operator.errors import KafkaRefusedError

    admin = _Admin({"payments": KafkaRefusedError("CLUSTER_AUTHORIZATION_FAILED")},
                   held={"payments": {"metrics": "x.", "interval.ms": "1000"}})
    with pytest.raises(KafkaRefusedError, match="CLUSTER_AUTHORIZATION_FAILED"):
        delete_subscription(admin, "payments")
    assert admin.altered == ["payments"]


# -- cli/kcm_cli/operator.py: what `kcm operator` hands kopf ---------------------------------------------------------

_OPERATOR = ["operator", "-n", "team", "--bootstrap-server", "127.0.0.1:9092", "--metrics-port", "0",
             "--liveness-port", "0"]


def test_the_operator_hands_kopf_the_peering_lifetime_auto_peering_its_pod_name_and_a_random_priority(
        kopf_runs, monkeypatch):
    """Kills O01 (--peering-lifetime 86400, the documented maximum, refused), O02/O04 (port 0, documented as "off",
    refused alone or for both endpoints), O08 (--peering-lifetime not given to kopf: a standby waited kopf's 60 s
    whatever was asked), O09 (standalone=False instead of kopf's auto-detection when --standalone is not given),
    O13 (POD_ID, set by the chart, not the identity: peers named by host/pid) and O14 (every replica priority 0
    when --priority is not given)."""
    from kcm_cli.main import main

    monkeypatch.setenv("POD_ID", "kcm-operator-7d9f-0")
    assert main([*_OPERATOR, "--peering-lifetime", "86400"]) == 0
    assert main([*_OPERATOR, "--standalone", "--priority", "7"]) == 0

    peered, standalone = kopf_runs
    assert peered["settings"].peering.lifetime == 86400
    assert peered["standalone"] is None and peered["liveness_endpoint"] is None
    assert peered["identity"] == "kcm-operator-7d9f-0"
    assert 1 <= peered["priority"] <= 1_000_000
    assert (standalone["standalone"], standalone["priority"]) == (True, 7)


def test_kafka_python_stays_at_warning_in_the_operator_even_at_debug(kopf_runs):
    """Kills O05 (max → min): `kcm --log-level debug operator` let kafka-python narrate every connection."""
    from kcm_cli.main import main

    assert main(["--log-level", "debug", *_OPERATOR]) == 0
    assert logging.getLogger("kafka").getEffectiveLevel() >= logging.WARNING


def test_a_kubeconfig_server_without_a_host_is_a_one_line_error(tmp_path):
    """Kills O06 (only the scheme checked): `server: https://` reached kopf, which failed with a traceback."""
    from test_operator_cli import _KUBECONFIG, _one_line, _operator

    _one_line(_operator(tmp_path, kubeconfig=_KUBECONFIG.replace('"https://127.0.0.1:1"', '"https://:443"')),
              "the kubeconfig's cluster server is not an https:// URL of the Kubernetes API")


def test_drift_checks_of_a_resource_that_is_not_ready_never_make_it_contested():
    """Kills H39 (changes found while not Ready counted towards Contested): a subscription Kafka keeps refusing to
    change (authorization, say) is found different at every drift check; after four it read Contested ("something
    else manages it too") and kcm stopped trying, instead of saying KafkaRefused and retrying."""
    from types import SimpleNamespace

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), 1)
    refused = SimpleNamespace(ready_reason="KafkaRefused", was_ready=False)
    different = Change("payments", "update", (Op("interval.ms", SET, "60000"),))
    assert [handlers._contested(config, "uid-a", refused, different, True) for _ in range(10)] == [None] * 10
    assert "uid-a" not in config.contested


# -- handlers: retries -----------------------------------------------------------------------------------------------

def test_a_deletion_with_no_cluster_to_remove_from_is_retried_three_times_then_let_go(events):
    """Kills H49 (`<=`: a fourth retry, 8 s more of a namespace deletion held): LET_GO_AFTER_RETRIES says
    1 + 2 + 4 s."""
    desired = desired_from_spec("team", "payments", DELETE_SPEC)
    body = _body("payments", OLDER, "cluster")
    for retry in range(handlers.LET_GO_AFTER_RETRIES):
        with pytest.raises(kopf.TemporaryError):
            handlers._retry_or_let_go(body, desired, retry, "the cluster is gone")
    assert events == []
    handlers._retry_or_let_go(body, desired, handlers.LET_GO_AFTER_RETRIES, "the cluster is gone")
    assert [(event["type"], event["reason"]) for event in events] == [("Warning", "NotRemoved")]


def test_backoff_grows_to_a_minute_spreads_retries_and_survives_any_number_of_them():
    """Kills H50 (the exponent unbounded: 2.0 ** 1024 raises OverflowError, so a cluster down for ~17 hours turned
    every retry into an unexpected failure) and H51 (no jitter: resources that failed together, a cluster down,
    all retried at one instant)."""
    assert 0.8 <= handlers._backoff(0) <= 1.2
    assert all(0.8 * handlers.MAX_BACKOFF_S <= handlers._backoff(retry) <= 1.2 * handlers.MAX_BACKOFF_S
               for retry in (6, 7, 100, 5000))
    spread = {handlers._backoff(3) for _ in range(50)}
    assert len(spread) > 1 and all(6.4 <= delay <= 9.6 for delay in spread)


# -- handlers: what a resource applied ------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_resource_never_applied_may_rename_its_subscription(sandbox, events):
    """Kills H55 (`_applied_name` ignores whether anything was applied): a resource refused at once (a bad regex)
    records its subscription name in the status; renaming it in the same fix left it InvalidSpec for ever ("cannot
    change: this resource applied subscription first"), although nothing was ever applied."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    refused = {"observedGeneration": 1, "subscriptionName": "first", "conditions": [
        {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "bad regex", "observedGeneration": 1,
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    try:
        patch = _reconcile(config, _resource(spec={**SPEC, "subscriptionName": "second"}, status=refused,
                                             generation=2))
    finally:
        config.close()
    ready = _conditions(patch)["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Applied"), ready
    assert patch["status"]["subscriptionName"] == "second"
    assert (sandbox.store.configs("second"), sandbox.store.configs("first")) == (IN_KAFKA, {})


@pytest.mark.timeout(60)
def test_a_resource_whose_status_only_says_ready_is_removed_on_deletion(sandbox):
    """Kills H56 (`_ever_applied` ignores Ready=True): a resource applied by a kcm that wrote no clusterId or
    lastAppliedTime (an upgrade) counted as never applied, so deleting it left a `deletionPolicy: Delete`
    subscription in Kafka."""
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        admin = config.admin("team", None)
        desired = desired_from_spec("team", "a", DELETE_SPEC)
        assert admin.alter_one(diff(desired, admin.describe_one(desired.name))) is None
        raw = dict(_body("a", OLDER, None))
        raw["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}   # all that older statuses said
        handlers._delete(config, kopf.Body(raw), kopf.Patch(), {"payments": [_claim("a", OLDER, None, True)]}, 0)
        assert sandbox.store.configs("payments") == {}
    finally:
        config.close()


@pytest.mark.timeout(60)
def test_a_change_kafka_refuses_for_another_reason_than_the_spec_is_kafka_refused_and_retried(sandbox, events,
                                                                                               monkeypatch):
    """Kills E02 (KafkaRefusedError not retried as such: it fell to "reconciling failed unexpectedly", reason
    Failed) and E04 (KafkaRefused reported as KafkaUnavailable, pointing at the network instead of, say, the ACLs)."""
    from kcm_operator.admin import BatchedAdmin
    from kcm_operator.errors import KafkaRefusedError

    monkeypatch.setattr(BatchedAdmin, "alter_one",
                        lambda self, change: KafkaRefusedError("CLUSTER_AUTHORIZATION_FAILED: not allowed"))
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    patch = kopf.Patch()
    try:
        with pytest.raises(kopf.TemporaryError, match="CLUSTER_AUTHORIZATION_FAILED"):
            handlers._reconcile(config, kopf.Body(_resource()), patch, {}, 0, drift_check=False)
    finally:
        config.close()
    ready = _conditions(patch)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "KafkaRefused")
    assert "CLUSTER_AUTHORIZATION_FAILED" in ready["message"]
    assert [(event["type"], event["reason"]) for event in events] == [("Warning", "KafkaRefused")]


def test_each_reconciliation_is_counted_and_timed():
    """Kills M01 (the duration histogram never observed: kcm_operator_reconcile_duration_seconds stayed empty)."""
    from prometheus_client import REGISTRY

    from kcm_operator import metrics

    def sample(name: str, labels: dict | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    count, total = (sample("kcm_operator_reconcile_duration_seconds_count"),
                    sample("kcm_operator_reconcile_duration_seconds_sum"))
    counted = sample("kcm_operator_reconciliations_total", {"result": "failed", "reason": "KafkaRefused"})
    metrics.record(time.monotonic() - 0.25, "failed", "KafkaRefused")
    assert sample("kcm_operator_reconcile_duration_seconds_count") == count + 1
    assert sample("kcm_operator_reconcile_duration_seconds_sum") >= total + 0.25
    assert sample("kcm_operator_reconciliations_total", {"result": "failed", "reason": "KafkaRefused"}) == counted + 1


# -- manifests.py: what `kcm subscriptions apply -f` reads ------------------------------------------------------------

def _manifest(name: str, spec: str = "metrics: [x.]\n", namespace: str | None = "team",
              kind: str = "ClientMetricsSubscription") -> str:
    where = f"\n  namespace: {namespace}" if namespace else ""
    return (f"apiVersion: kcm.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}{where}\nspec:\n"
            + "".join(f"  {line}\n" for line in spec.splitlines()))


def test_a_directory_is_read_for_its_manifests_only_and_one_without_any_is_an_error(tmp_path):
    """Kills F01 (every file of a directory read: its README or a Helm values file is an error, or worse, a
    document) and F03 (a directory holding no manifests silently applies nothing: a wrong -f path in CI passes)."""
    from kcm_common.errors import UserError
    from kcm_operator import manifests

    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "payments.yaml").write_text(_manifest("payments"))
    (tmp_path / "subs" / "README.md").write_text("# notes: [not, yaml\n")
    (tmp_path / "subs" / "kustomization.txt").write_text("resources: [payments.yaml]\n")
    assert [manifest.source for manifest in manifests.load([tmp_path / "subs"])] == [
        str(tmp_path / "subs" / "payments.yaml")]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("nothing here\n")
    with pytest.raises(UserError, match=r"empty holds no \.yaml, \.yml or \.json files"):
        manifests.load([tmp_path / "empty"])


def test_only_subscriptions_are_applied_defaulted_as_the_api_server_would_and_each_subscription_once(tmp_path):
    """Kills F05 (a KafkaConnection beside the subscriptions taken for one), F06 (no metadata.namespace: not the
    API server's `default`, so the subscription name differs from what the operator would apply), F07 (two
    resources naming one subscription both applied, the second silently winning) and F08 (an empty document, as
    a leading or trailing `---` makes, refused)."""
    from kcm_operator import manifests
    from kcm_operator.errors import InvalidSpecError

    path = tmp_path / "all.yaml"
    path.write_text("---\n" + _manifest("payments", namespace=None) + "---\n"
                    + _manifest("kafka", "bootstrapServers: kafka:9092\n", kind="KafkaConnection") + "---\n")
    found = manifests.subscriptions(manifests.load([path]))
    assert [desired.name for _, desired in found] == ["default.payments"]

    path.write_text(_manifest("one", "subscriptionName: shared\nmetrics: [x.]\n") + "---\n"
                    + _manifest("two", "subscriptionName: shared\nmetrics: [y.]\n"))
    with pytest.raises(InvalidSpecError, match=r"ClientMetricsSubscription team/two .*: subscription 'shared' is "
                                               r"already defined by ClientMetricsSubscription team/one"):
        manifests.subscriptions(manifests.load([path]))


def test_null_fields_in_a_manifest_take_the_crds_defaults_as_the_api_server_gives_them(tmp_path):
    """Kills F11 (the CRD's defaults not applied to the spec read from a file): Helm output such as
    `intervalMs: null` then reached the reconcile core as None (a TypeError traceback) instead of 300000."""
    from kcm_operator import manifests

    path = tmp_path / "helm.yaml"
    path.write_text(_manifest("payments", "metrics: [x.]\nintervalMs: null\nmatch: null\ndeletionPolicy: null\n"))
    [(_, desired)] = manifests.subscriptions(manifests.load([path]))
    assert (desired.interval_ms, desired.match, desired.deletion_policy) == (300000, (), "Delete")


@pytest.mark.parametrize("option", ["--metrics-port", "--liveness-port"])
def test_a_port_above_65535_is_a_one_line_error(kopf_runs, capsys, option):
    """Kills O03 (65536 let through: the metrics server's bind then fails with an OverflowError traceback)."""
    from kcm_cli.main import main

    args = list(_OPERATOR)
    args[args.index(option) + 1] = "65536"   # each option once: one given twice is refused for that
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(f"{option} must be a port from 0 to 65535") and len(err.strip().splitlines()) == 1
    assert kopf_runs == []


def test_namespace_patterns_are_not_looked_up_as_namespaces_of_a_peering_object(monkeypatch, caplog):
    """Kills O10 (every -n value looked up): `-n 'team-*' --peering-name kcm` warned every minute that a KopfPeering
    "team-*/kcm" is missing, an object no namespace can hold; only the plain namespace is looked for."""
    from kubernetes.client.rest import ApiException

    from kcm_cli import operator as operator_cli

    asked: list[str | None] = []

    class Api:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
            asked.append(namespace)
            raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(client, "CustomObjectsApi", lambda *args, **kwargs: Api())
    caplog.set_level(logging.WARNING, logger="kcm.operator")
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    try:
        operator_cli._warn_while_peering_is_missing("kcm", ["team-*", "!kube-system", "payments"], False, stop,
                                                    0.05, 0.1)
    finally:
        timer.cancel()
        stop.set()
    assert asked and set(asked) == {"payments"}
    said = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert said and all("KopfPeering payments/kcm not found" in line and "team-*" not in line for line in said)


def test_a_kubernetes_api_out_of_reach_is_not_reported_as_a_missing_peering_object(monkeypatch, caplog):
    """Kills O12 (any failure taken for "not found"): while the API server is unreachable (kopf says so itself), the
    replica warned that its peering object is missing, sending the user to create one that exists."""
    from kcm_cli import operator as operator_cli

    class Api:
        def get_cluster_custom_object(self, *args, **kwargs):
            raise ConnectionRefusedError("the API server is down")

    monkeypatch.setattr(client, "CustomObjectsApi", lambda *args, **kwargs: Api())
    caplog.set_level(logging.WARNING, logger="kcm.operator")
    stop = threading.Event()
    timer = threading.Timer(0.4, stop.set)
    timer.start()
    try:
        operator_cli._warn_while_peering_is_missing("kcm", [], True, stop, 0.05, 0.1)
    finally:
        timer.cancel()
        stop.set()
    assert [record for record in caplog.records if record.levelno == logging.WARNING] == []


# -- cli/kcm_cli/subscriptions.py ------------------------------------------------------------------------------------

def _subscriptions(capsys, *args: str) -> tuple[int, str, str]:
    from kcm_cli.main import main

    code = main(["subscriptions", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.timeout(60)
def test_delete_dry_run_and_describe_of_a_missing_subscription_change_nothing_and_say_so(sandbox, capsys):
    """Kills S05 (`delete --dry-run` deleted: the flag was not passed on) and S01 (describing a subscription that does
    not exist printed an empty description and exited 0, so a CI check of it passed)."""
    admin = _admin(sandbox)
    try:
        admin.alter([Change("payments", "create", (Op("metrics", SET, "x."), Op("interval.ms", SET, "1000")))])
    finally:
        admin.close()

    code, out, _ = _subscriptions(capsys, "delete", "payments", "--dry-run", "--bootstrap-server", sandbox.bootstrap)
    assert (code, out.strip()) == (0, "subscription payments: delete (-interval.ms, -metrics) (dry run)")
    assert sandbox.store.configs("payments") == {"metrics": "x.", "interval.ms": "1000"}

    code, out, err = _subscriptions(capsys, "describe", "nope", "--bootstrap-server", sandbox.bootstrap)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and "subscription 'nope' does not exist" in err


@pytest.mark.timeout(60)
def test_list_aligns_its_columns_and_describe_names_the_default_interval_and_the_subscription(sandbox, capsys):
    """Kills S06 (columns as wide as their header only: a long name pushes its row's values out of line), S08 (no
    interval.ms set: describe showed nothing, not Kafka's default 300000) and S07 (`describe -o json` without the
    name, so a script describing several cannot tell them apart)."""
    import json

    admin = _admin(sandbox)
    try:
        admin.alter([Change("a-rather-long-subscription-name", "create", (Op("metrics", SET, "x."),)),
                     Change("b", "create", (Op("metrics", SET, "y."), Op("interval.ms", SET, "1000")))])
    finally:
        admin.close()

    code, listing, _ = _subscriptions(capsys, "list", "--bootstrap-server", sandbox.bootstrap)
    assert code == 0
    header, long_row, short_row = listing.splitlines()
    assert {row.index(value) for row, value in ((header, "INTERVAL_MS"), (long_row, "300000 (default)"),
                                                (short_row, "1000"))} == {header.index("INTERVAL_MS")}

    _, described, _ = _subscriptions(capsys, "describe", "a-rather-long-subscription-name",
                                     "--bootstrap-server", sandbox.bootstrap)
    assert "Interval ms:  300000 (default)" in described.splitlines()
    _, as_json, _ = _subscriptions(capsys, "describe", "b", "-o", "json", "--bootstrap-server", sandbox.bootstrap)
    assert json.loads(as_json) == {"name": "b", "configs": {"metrics": "y.", "interval.ms": "1000"}}


@pytest.mark.timeout(60)
def test_apply_shows_a_subscription_name_with_control_characters_escaped(sandbox, tmp_path, capsys):
    """Kills S03 (apply's lines printed raw): the CRD lets spec.subscriptionName hold any text, so a manifest from
    anyone could send terminal escapes through `kcm subscriptions apply`, as list/describe/delete already prevent."""
    path = tmp_path / "evil.yaml"
    path.write_text(_manifest("evil", 'subscriptionName: "evil\\e]0;pwned\\a"\nmetrics: [x.]\n'))

    code, out, err = _subscriptions(capsys, "apply", "-f", str(path), "--dry-run", "--bootstrap-server",
                                    sandbox.bootstrap)

    assert code == 0, err
    assert not any(character in out for character in "\x1b\x07"), out
    assert "evil\\x1b]0;pwned\\x07" in out


@pytest.mark.timeout(60)
def test_a_drift_check_under_way_when_peering_pauses_the_operator_does_not_end_that_resources_drift_checks():
    """kopf stops a resource's timers when peering pauses the operator, leaves one that does not end at once
    orphaned, and on resuming does not start it again while that one still runs; once it ends, nothing starts it
    (found by a review: a check waiting for its resource's lock, or for Kafka, when the pause came). Driven through
    kopf's own daemon machinery with the operator's real timer handler."""
    from kopf._cogs.aiokits import aiotoggles
    from kopf._cogs.configs import configuration
    from kopf._cogs.structs import bodies, ephemera, patches, references
    from kopf._core.engines import daemons
    from kopf._core.intents import causes, stoppers
    from kopf._core.reactor import inventory

    class CountingLock:
        """The resource's lock: each drift check takes it; held by the test, the first check waits."""

        def __init__(self) -> None:
            self.lock, self.taken = threading.Lock(), 0

        def __enter__(self):
            self.lock.acquire()
            self.taken += 1
            return self

        def __exit__(self, *exc) -> None:
            self.lock.release()

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), drift_interval_s=0.5)
    registry = handlers.build_registry(config)
    (timer,) = registry._spawning.get_all_handlers()
    # Being deleted: the check itself returns at once once it has the lock (no Kafka, no API).
    raw = _resource()
    raw["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    lock = config.resource_locks[raw["metadata"]["uid"]] = CountingLock()

    async def scenario() -> int:
        settings = configuration.OperatorSettings()
        memories = inventory.ResourceMemories()
        memory = await memories.recall(raw)
        body = bodies.Body(raw)
        memory.daemons_memory.live_fresh_body = body
        resource = references.Resource(group="kcm.dev", version="v1alpha1", plural="clientmetricssubscriptions",
                                       namespaced=True)
        paused = aiotoggles.ToggleSet(any)
        peering = await paused.make_toggle(False, name="peering")
        killer = asyncio.create_task(daemons.daemon_killer(settings=settings, memories=memories,
                                                           operator_paused=paused))

        async def listed() -> None:   # an event of the (re-)listing: kopf spawns the timers not running
            cause = causes.SpawningCause(resource=resource, indices={"claims": {}}, logger=logging.getLogger("t"),
                                         patch=patches.Patch(), body=body, memo=ephemera.Memo(), reset=False)
            await daemons.spawn_daemons(settings=settings, handlers=[timer], cause=cause,
                                        daemons=memory.daemons_memory.running_daemons, memory=memory.daemons_memory)

        lock.lock.acquire()
        await listed()
        await asyncio.sleep(1.0)          # its first check waits for the resource's lock
        await peering.turn_to(True)       # paused by peering
        await asyncio.sleep(0.5)
        await peering.turn_to(False)      # resumed while that check still waits
        await listed()
        lock.lock.release()
        await asyncio.sleep(3.0)          # six intervals
        taken = lock.taken
        killer.cancel()
        for daemon in list(memory.daemons_memory.running_daemons.values()):
            await daemons.stop_daemon(settings=settings, daemon=daemon,
                                      reason=stoppers.DaemonStoppingReason.OPERATOR_EXITING)
        return taken

    try:
        taken = asyncio.run(scenario())
    finally:
        config.close()
    assert taken >= 3, f"drift checks after resuming: {taken - 1}"


def test_a_spec_change_another_replica_applied_during_a_pause_ends_contested():
    """A replica paused by peering never sees the change handler run for an edit the working one applied (kopf finds
    nothing new on resuming): its drift check must not go on holding the resource Contested from before."""
    import types

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"))
    drifted = Change("team.payments", "update", (Op("interval.ms", SET, "60000"),))
    config.contested["uid-a"] = 1
    config.drift_history["uid-a"] = handlers.collections.deque([True] * 4, maxlen=handlers.CONTESTED_WINDOW)
    same = types.SimpleNamespace(generation=1, was_ready=False)
    assert handlers._contested(config, "uid-a", same, drifted, True) == "held"
    edited = types.SimpleNamespace(generation=2, was_ready=True)
    assert handlers._contested(config, "uid-a", edited, drifted, True) is None
    assert "uid-a" not in config.contested and "uid-a" not in config.drift_history


def test_an_edited_kafka_connection_drops_the_cluster_id_and_resolution_learnt_through_its_old_spec():
    """Re-pointed to another cluster, or deleted and made again (perhaps while this replica was paused by peering, the
    working one applying its resources there), a connection's remembered cluster id would make ownership checks
    compare with the old cluster, where its resources' status says the new one; the resolution drift checks reuse
    would keep the old servers."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), resolve=lambda namespace, name: None)
    (event,) = handlers.build_registry(config)._watching.get_all_handlers()
    ref = ("team", "analytics")
    owner = Claim("team", "z", OLDER, "uid-z", "analytics", "cluster-new")

    def seen(generation: int, kind: str = "MODIFIED", uid: str = "uid-1") -> None:
        body = kopf.Body({"metadata": {"namespace": "team", "name": "analytics", "uid": uid,
                                       "generation": generation}, "spec": {}, "status": {}})
        asyncio.run(event.fn(event={"type": kind}, body=body, claims={}))

    def learnt(cluster: str) -> None:
        config.remember_cluster_id(ref, cluster)
        config.resolved[ref] = (time.monotonic(), KafkaSettings("old:9092"))

    try:
        seen(1, "ADDED")
        learnt("cluster-old")
        seen(1)   # its status written, say: the same generation keeps both
        assert config.known_cluster_id(owner) == "cluster-old" and ref in config.resolved
        seen(2)
        assert config.known_cluster_id(owner) == "cluster-new" and ref not in config.resolved

        learnt("cluster-old")
        seen(2, "DELETED")   # what was learnt stays known while it is gone (deleting its resources needs it)
        assert config.known_cluster_id(owner) == "cluster-old" and ref in config.resolved
        seen(1, "ADDED", uid="uid-2")   # made again, at generation 1 as well
        assert config.known_cluster_id(owner) == "cluster-new" and ref not in config.resolved

        seen(1, "DELETED", uid="uid-2")
        config.retire_unused({ref})
        assert ref in config.connection_versions, "still named: kept, to tell one made again"
        config.retire_unused(set())
        assert ref not in config.connection_versions
    finally:
        config.close()


def test_a_drift_check_whose_handler_is_cancelled_leaves_its_work_tracked_not_running_loose():
    """The event loop closing cancels the timer's handler itself: its work is cancelled too (started work finishes
    on its thread) and kept until it ends, not left an untracked task."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"))
    release = threading.Event()

    class NeverStopped:
        def wait(self):
            return asyncio.Event().wait()

    async def scenario() -> None:
        work = handlers._on_thread(config, lambda: release.wait(10))
        handler = asyncio.ensure_future(handlers._until_stopped(config, work, NeverStopped()))
        await asyncio.sleep(0.2)   # the work has started on its thread
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        (left,) = config.left_running
        assert not left.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await left
        await asyncio.sleep(0)
        assert config.left_running == set()

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        config.close()
