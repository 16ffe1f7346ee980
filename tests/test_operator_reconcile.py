"""`kcm operator` behaviour: kopf handlers against the kube emulator (kmock) and the sandbox's CLIENT_METRICS APIs."""

from __future__ import annotations

import base64
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kopf.testing import KopfRunner
from prometheus_client import REGISTRY
from kubernetes import client, config
from kubernetes.client.rest import ApiException
import kafka.errors as kafka_errors

from kcm_common.kafka import KafkaSettings
from kcm_operator import admin as admin_module
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.connections import ConnectionResolver, now_text
from kcm_operator import handlers
from kcm_operator.handlers import NUDGED_ANNOTATION, SUBSCRIPTIONS, OperatorConfig, build_registry, operator_settings
from kcm_common.logs import JsonFormatter
from kcm_operator.errors import InvalidSpecError, KafkaRefusedError
from kcm_operator.reconcile import SET, Change, Op
from ports import reserved_port
from kube_emulator import KubeServer
from kcm_sandbox.broker import EmbeddedBroker

CRDS = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
GROUP, VERSION, PLURAL, NS = "kcm.dev", "v1alpha1", "clientmetricssubscriptions", "team"
DEADLINE_S = 20.0


def wait_for(condition: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """Poll until `condition()` is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


class Cluster:
    """The test's view: the Kubernetes API (emulated) and the Kafka subscriptions (sandbox)."""

    def __init__(self, kube: KubeServer, sandbox: Any, operator_config: OperatorConfig,
                 stop: Callable[[], None] = lambda: None) -> None:
        self.config = operator_config
        self.stop = stop  # stops this operator (its resources and their status stay)
        self.kube = kube
        self.sandbox = sandbox
        self.api_client = config.new_client_from_config(str(kube.kubeconfig))
        self.custom = client.CustomObjectsApi(self.api_client)

    def apply(self, name: str, spec: dict, annotations: dict | None = None) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
                "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    def patch(self, name: str, changes: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, changes)

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)

    def get(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def condition(self, name: str, kind: str = "Ready") -> dict | None:
        obj = self.get(name) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == kind), None)

    def wait_condition(self, name: str, status: str, reason: str, kind: str = "Ready") -> dict:
        return wait_for(lambda: (c := self.condition(name, kind)) and c["status"] == status
                        and c["reason"] == reason and c, f"{name} {kind}={status}/{reason}")

    def kafka(self, subscription: str) -> dict[str, str]:
        return self.sandbox.store.configs(subscription)

    def events(self, reason: str) -> list[dict]:
        return [event for event in self.kube.objects("events", NS).values() if event.get("reason") == reason]

    def wait_events(self, reason: str, count: int = 1) -> list[dict]:
        """The events of `reason` once at least `count` are there: kopf posts events from a queue of its own, not in
        step with the status patch a test has waited for."""
        wait_for(lambda: len(self.events(reason)) >= count, f"{count} {reason} event(s)")
        return self.events(reason)


@pytest.fixture(autouse=True)
def operator_logs(caplog):
    """A failing test shows what kopf and the operator did (INFO and up), not only their warnings."""
    caplog.set_level(logging.INFO, logger="kopf")
    caplog.set_level(logging.INFO, logger="kcm")


@pytest.fixture
def kube(tmp_path, monkeypatch):
    server = KubeServer(tmp_path, CRDS)
    server.start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig))
    yield server
    server.stop()


@pytest.fixture
def run_operator(kube, sandbox, tmp_path):
    """Start the operator (in this process, through kopf's test runner) for the sandbox; stopped after the test."""
    runners, resolvers = [], []

    def start(drift_interval_s: float = 60.0, settings: KafkaSettings | None = None,
              kafka_timeout_s: float = 2) -> Cluster:
        api_client = config.new_client_from_config(str(kube.kubeconfig))
        resolver = ConnectionResolver(api_client, tmp_path)
        resolvers.append(resolver)
        operator_config = OperatorConfig(settings or KafkaSettings(sandbox.bootstrap), drift_interval_s,
                                         resolve=resolver.resolve, statuses=resolver.statuses,
                                         kafka_timeout_s=kafka_timeout_s, api_client=api_client)
        settings = operator_settings()
        settings.scanning.disabled = True  # kmock cannot parse /api/v1/namespaces; the namespace is named anyway
        runner = KopfRunner(["run", "--standalone", "--namespace", NS], timeout=30,
                            registry=build_registry(operator_config), settings=settings)
        runner.__enter__()
        runners.append(runner)

        def stop() -> None:
            runners.remove(runner)
            runner.__exit__(None, None, None)
            assert runner.exception is None, runner.output
        return Cluster(kube, sandbox, operator_config, stop)

    yield start
    for runner in runners:
        runner.__exit__(None, None, None)
    for resolver in resolvers:
        resolver.close()
    for runner in runners:
        assert runner.exception is None, runner.output


SPEC = {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000, "match": {"clientId": "payments-.*"}}
IN_KAFKA = {"metrics": "org.apache.kafka.producer.", "interval.ms": "60000", "match": "client_id=payments-.*"}


def test_create_puts_the_subscription_in_kafka_exactly_and_reports_ready(run_operator):
    cluster = run_operator()

    cluster.apply("payments", SPEC)

    ready = cluster.wait_condition("payments", "True", "Applied")
    assert cluster.kafka("team.payments") == IN_KAFKA
    status = cluster.get("payments")["status"]
    assert status["subscriptionName"] == "team.payments"
    assert status["observedGeneration"] == 1 and ready["observedGeneration"] == 1
    assert status["lastAppliedTime"]
    assert [event["type"] for event in cluster.wait_events("Applied")] == ["Normal"]
    assert "kcm.dev/subscription" in cluster.get("payments")["metadata"]["finalizers"]


def test_update_applies_only_the_difference_and_a_removed_match_is_deleted(run_operator):
    cluster = run_operator()
    cluster.apply("payments", SPEC)
    wait_for(lambda: cluster.kafka("team.payments") == IN_KAFKA, "the subscription in Kafka")

    cluster.patch("payments", {"spec": {"intervalMs": 5000, "match": None}})

    wait_for(lambda: cluster.kafka("team.payments") == {"metrics": "org.apache.kafka.producer.", "interval.ms": "5000"},
             "the update in Kafka")
    wait_for(lambda: cluster.get("payments")["status"].get("observedGeneration") == 2, "observedGeneration 2")
    assert cluster.wait_condition("payments", "True", "Applied")["observedGeneration"] == 2
    applied = sorted(event["message"] for event in cluster.wait_events("Applied", 2))
    assert applied[-1] == "subscription team.payments: update (interval.ms=5000, -match)"


@pytest.mark.parametrize("policy, remains", [("Delete", False), ("Retain", True)])
def test_delete_follows_the_deletion_policy(run_operator, policy, remains):
    cluster = run_operator()
    cluster.apply("payments", {**SPEC, "deletionPolicy": policy})
    cluster.wait_condition("payments", "True", "Applied")

    cluster.delete("payments")

    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    assert (cluster.kafka("team.payments") == IN_KAFKA) is remains
    assert bool(cluster.sandbox.store.names()) is remains


def test_a_paused_resource_is_let_go_on_deletion_leaving_its_subscription_whatever_its_policy(run_operator):
    """The documented way to hand a subscription over (and what a held deletion says to do): pause, then delete."""
    cluster = run_operator()
    cluster.apply("payments", {**SPEC, "deletionPolicy": "Delete"})
    cluster.wait_condition("payments", "True", "Applied")
    cluster.patch("payments", {"metadata": {"annotations": {"kcm.dev/paused": "true"}}})
    cluster.wait_condition("payments", "True", "Paused", kind="Paused")

    cluster.delete("payments")

    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    assert cluster.kafka("team.payments") == IN_KAFKA


def test_drift_is_reverted_with_a_warning_naming_the_change(run_operator, caplog):
    cluster = run_operator(drift_interval_s=0.5)
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    try:
        admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, "1000"),))])
    finally:
        admin.close()

    drifted = wait_for(lambda: cluster.events("Drift"), "a Drift event")

    wait_for(lambda: cluster.kafka("team.payments") == IN_KAFKA, "the drift reverted")
    assert drifted[0]["type"] == "Warning"
    assert "interval.ms is '1000', want '60000'" in drifted[0]["message"]
    # The log line names the resource in fields too, as kopf's own lines do, for filtering JSON logs by namespace.
    (warning,) = [r for r in caplog.records if r.name == "kcm.operator" and "outside kcm" in r.getMessage()]
    line = json.loads(JsonFormatter().format(warning))
    assert (line["level"], line["namespace"], line["name"]) == ("WARNING", NS, "payments")
    assert line["message"].startswith(f"{NS}/payments: subscription team.payments was changed outside kcm")


@pytest.mark.parametrize("change", ["edit", "delete"])
def test_a_change_made_while_a_drift_check_runs_is_neither_undone_nor_called_drift(run_operator, change):
    cluster = run_operator(drift_interval_s=0.3)
    cluster.apply("payments", {**SPEC, "deletionPolicy": "Delete"})
    cluster.wait_condition("payments", "True", "Applied")
    # The next drift check reads the spec, then takes its time (as a slow Kafka would) before comparing.
    admin, entered, armed = cluster.config.admin, threading.Event(), [True]

    def slow_admin(namespace: str, connection: str | None, recent: bool = False) -> Any:
        if armed and armed.pop():
            entered.set()
            time.sleep(1.0)
        return admin(namespace, connection, recent)
    cluster.config.admin = slow_admin
    assert entered.wait(DEADLINE_S)

    if change == "edit":
        cluster.patch("payments", {"spec": {"intervalMs": 5000}})
        wait_for(lambda: cluster.kafka("team.payments").get("interval.ms") == "5000", "the edit in Kafka")
    else:
        cluster.delete("payments")
        wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    time.sleep(1.5)  # several drift checks later

    assert cluster.kafka("team.payments") == ({**IN_KAFKA, "interval.ms": "5000"} if change == "edit" else {})
    assert cluster.events("Drift") == []


def test_a_drift_check_whose_turn_comes_after_the_deletion_began_leaves_kafka_to_the_delete_handler(run_operator):
    """A drift check queued behind the resource's lock may get it once the resource is being deleted: a deletion
    under way is the delete handler's to apply (comparing the old spec, it could bring a removed subscription back).
    The check is called here as kopf calls it, with the resource as it is then."""
    import asyncio

    import kopf

    cluster = run_operator()
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    try:   # changed outside kcm: a drift check would revert it
        admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, "1000"),))])
    finally:
        admin.close()
    (check,) = [handler for handler in build_registry(cluster.config)._spawning.get_all_handlers()
                if handler.id == "drift"]

    async def drift_check(resource: dict) -> None:
        from kopf._core.engines import posting

        quiet = operator_settings()
        quiet.posting.enabled = False   # no operator here to post its Drift event
        posting.settings_var.set(quiet)
        await check.fn(body=kopf.Body(resource), patch=kopf.Patch(), claims={})

    resource = cluster.get("payments")
    resource["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    asyncio.run(drift_check(resource))
    assert cluster.kafka("team.payments") == {**IN_KAFKA, "interval.ms": "1000"}

    del resource["metadata"]["deletionTimestamp"]   # the same check of a resource not being deleted reverts it
    asyncio.run(drift_check(resource))
    assert cluster.kafka("team.payments") == IN_KAFKA


def test_a_regex_kafka_refuses_is_invalid_spec_and_kafka_is_untouched(run_operator):
    cluster = run_operator()

    cluster.apply("bad", {**SPEC, "match": {"clientId": "payments-("}})

    ready = cluster.wait_condition("bad", "False", "InvalidSpec")
    assert "payments-(" in ready["message"]
    assert cluster.sandbox.store.names() == []
    assert [event["type"] for event in cluster.wait_events("InvalidSpec")] == ["Warning"]


def test_a_condition_keeps_its_transition_time_while_its_status_stays_and_moves_when_it_flips(run_operator):
    """Kubernetes' condition semantics: lastTransitionTime is when `status` last changed, not the message or reason
    (alerts on 'Ready False for 15 minutes' and kubectl's ages rely on it)."""
    cluster = run_operator()
    cluster.apply("bad", {**SPEC, "match": {"clientId": "payments-("}})
    first = cluster.wait_condition("bad", "False", "InvalidSpec")
    time.sleep(1.1)   # the times are in whole seconds
    cluster.patch("bad", {"spec": {"match": {"clientId": "orders-["}}})
    second = wait_for(lambda: (c := cluster.condition("bad")) and "orders-[" in c["message"] and c, "the new message")
    assert (second["status"], second["lastTransitionTime"]) == ("False", first["lastTransitionTime"])
    time.sleep(1.1)
    cluster.patch("bad", {"spec": {"match": {"clientId": "orders-.*"}}})
    ready = cluster.wait_condition("bad", "True", "Applied")
    assert ready["lastTransitionTime"] > first["lastTransitionTime"]


def test_pause_stops_reconciling_and_says_so(run_operator):
    cluster = run_operator()
    cluster.apply("payments", SPEC, annotations={"kcm.dev/paused": "true"})

    cluster.wait_condition("payments", "True", "Paused", kind="Paused")
    assert cluster.sandbox.store.names() == []

    cluster.patch("payments", {"metadata": {"annotations": {"kcm.dev/paused": None}}})

    cluster.wait_condition("payments", "True", "Applied")
    assert cluster.kafka("team.payments") == IN_KAFKA
    assert cluster.condition("payments", "Paused")["status"] == "False"


def test_an_edit_made_while_paused_is_not_reported_ready_until_it_is_applied(run_operator):
    cluster = run_operator()
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    cluster.patch("payments", {"metadata": {"annotations": {"kcm.dev/paused": "true"}}})
    cluster.wait_condition("payments", "True", "Paused", kind="Paused")
    assert cluster.condition("payments", "Ready")["status"] == "True"   # nothing changed: Kafka is as specified

    cluster.patch("payments", {"spec": {"intervalMs": 1000}})

    ready = cluster.wait_condition("payments", "Unknown", "Paused")
    assert ready["message"] == 'generation 2 is not applied: annotation kcm.dev/paused is "true"'
    assert ready["observedGeneration"] == 2
    assert cluster.kafka("team.payments") == IN_KAFKA
    cluster.patch("payments", {"metadata": {"annotations": {"kcm.dev/paused": None}}})
    cluster.wait_condition("payments", "True", "Applied")
    assert cluster.kafka("team.payments") == {**IN_KAFKA, "interval.ms": "1000"}


def test_the_older_resource_owns_a_subscription_and_the_newer_takes_over_when_it_goes(run_operator):
    cluster = run_operator(drift_interval_s=0.5)
    cluster.apply("first", {**SPEC, "subscriptionName": "shared"})
    cluster.wait_condition("first", "True", "Applied")
    time.sleep(1.0)  # creationTimestamp has one-second resolution: the second resource must be visibly newer

    cluster.apply("second", {**SPEC, "subscriptionName": "shared", "intervalMs": 1000})

    conflict = cluster.wait_condition("second", "False", "Conflict")
    assert "team/first" in conflict["message"]
    assert cluster.kafka("shared")["interval.ms"] == "60000"
    events = wait_for(lambda: cluster.events("Conflict"), "a Conflict event")
    assert [(e["type"], e["involvedObject"]["name"]) for e in events] == [("Warning", "second")]
    assert "team/first" in events[0]["message"]

    cluster.patch("first", {"spec": {"deletionPolicy": "Retain"}})
    cluster.delete("first")

    cluster.wait_condition("second", "True", "Applied")
    assert cluster.kafka("shared")["interval.ms"] == "1000"
    assert cluster.events("Drift") == []  # a takeover is not someone else's edit


def test_a_paused_resource_in_conflict_does_not_go_on_naming_an_owner_deleted_since(run_operator):
    cluster = run_operator()
    cluster.apply("first", {**SPEC, "subscriptionName": "shared", "deletionPolicy": "Retain"})
    cluster.wait_condition("first", "True", "Applied")
    time.sleep(1.0)  # creationTimestamp has one-second resolution: the second resource must be visibly newer
    cluster.apply("second", {**SPEC, "subscriptionName": "shared", "intervalMs": 1000})
    cluster.wait_condition("second", "False", "Conflict")
    cluster.patch("second", {"metadata": {"annotations": {"kcm.dev/paused": "true"}}})
    cluster.wait_condition("second", "True", "Paused", kind="Paused")

    cluster.delete("first")   # hands the subscription over to second, which is paused

    wait_for(lambda: cluster.get("first") is None, "the owner to go")
    ready = cluster.wait_condition("second", "Unknown", "Paused")
    assert ready["message"] == 'subscription shared is not reconciled: annotation kcm.dev/paused is "true"'
    assert cluster.kafka("shared")["interval.ms"] == "60000"   # paused: Kafka keeps the owner's values
    cluster.patch("second", {"metadata": {"annotations": {"kcm.dev/paused": None}}})
    cluster.wait_condition("second", "True", "Applied")
    assert cluster.kafka("shared")["interval.ms"] == "1000"


def test_kafka_down_is_kafka_unavailable_then_recovers_by_itself(run_operator, sandbox_factory):
    with reserved_port() as port:   # refusing connections until the sandbox listens there
        cluster = run_operator(settings=KafkaSettings(f"127.0.0.1:{port}"))
        cluster.apply("payments", SPEC)

        down = cluster.wait_condition("payments", "False", "KafkaUnavailable")
        later = sandbox_factory(listen=("127.0.0.1", port))

    cluster.wait_condition("payments", "True", "Applied")
    assert f"127.0.0.1:{port}" in down["message"]
    assert later.store.configs("team.payments") == IN_KAFKA


def test_a_broker_without_kip714_is_unsupported_and_names_the_receiver(run_operator, broker):
    cluster = run_operator(settings=KafkaSettings(broker.bootstrap))

    cluster.apply("payments", SPEC)

    assert "needs kcm's receiver" in cluster.wait_condition("payments", "False", "Unsupported")["message"]


def test_a_removal_kafka_refuses_is_tried_three_times_then_let_go_saying_so(run_operator, monkeypatch):
    cluster = run_operator()
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    monkeypatch.setattr(admin_module.BatchedAdmin, "alter_one",
                        lambda self, change: InvalidSpecError("INVALID_REQUEST: not now"))

    cluster.delete("payments")

    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    [event] = cluster.wait_events("NotRemoved")
    assert "subscription team.payments was not removed" in event["message"] and "not now" in event["message"]
    assert event["message"].endswith("(kcm subscriptions delete team.payments)")   # the default cluster's
    assert cluster.kafka("team.payments") == IN_KAFKA


def test_handler_threads_are_bounded_however_many_connections(run_operator, monkeypatch):
    monkeypatch.setattr(handlers, "HANDLER_THREADS", 6)
    monkeypatch.setattr(handlers, "CLUSTER_THREADS", 3)
    cluster = run_operator()
    for team in range(6):
        _connection(cluster, f"team-{team}", {"bootstrapServers": cluster.sandbox.bootstrap})
        for number in range(4):
            cluster.apply(f"team-{team}-{number}", {**SPEC, "connection": f"team-{team}"})

    for team in range(6):
        for number in range(4):
            cluster.wait_condition(f"team-{team}-{number}", "True", "Applied")
    threads = [thread.name for thread in threading.enumerate() if thread.name.startswith("kcm-handler")]
    assert 0 < len(threads) <= 6, threads
    assert not cluster.config.cluster_slots  # every cluster's share is given back


def test_a_cluster_given_the_receiver_plugin_later_is_applied_at_a_drift_check(run_operator, sandbox_factory, tmp_path):
    with reserved_port() as port:
        plain = EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log")  # a broker without kcm's receiver
        plain.start()
        cluster = run_operator(drift_interval_s=1.0, settings=KafkaSettings(f"127.0.0.1:{port}"))
        cluster.apply("payments", SPEC)
        cluster.wait_condition("payments", "False", "Unsupported")
        plain.stop()
        later = sandbox_factory(listen=("127.0.0.1", port))  # restarted with it, at the same address

    cluster.wait_condition("payments", "True", "Applied")
    assert later.store.configs("team.payments") == IN_KAFKA


def test_a_subscription_is_removed_from_a_cluster_whose_receiver_plugin_was_removed(run_operator, monkeypatch):
    cluster = run_operator()
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    cluster.stop()
    # The brokers restart without kcm's receiver: no telemetry APIs, while their CLIENT_METRICS configs stay.
    monkeypatch.setattr(admin_module, "PUSH_TELEMETRY", 9999)
    cluster = run_operator()
    cluster.wait_condition("payments", "False", "Unsupported")

    cluster.delete("payments")

    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    assert cluster.sandbox.store.names() == []
    assert not cluster.events("NotRemoved")


def test_an_unexpected_fault_is_ready_false_failed_and_retried_until_it_passes(run_operator, monkeypatch):
    def broken(self) -> None:
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(admin_module.SubscriptionAdmin, "require_telemetry", broken)
    cluster = run_operator()
    cluster.apply("payments", SPEC)

    failed = cluster.wait_condition("payments", "False", "Failed")
    monkeypatch.undo()

    cluster.wait_condition("payments", "True", "Applied")
    assert "ZeroDivisionError" in failed["message"] and "a bug" not in failed["message"]
    assert [event["message"] for event in cluster.wait_events("Failed")] == [failed["message"]]
    assert cluster.kafka("team.payments") == IN_KAFKA


def test_two_operators_fighting_over_a_subscription_stop_and_say_contested(kube, sandbox):
    # Namespaced operators (one release per team) cannot see each other's resources: two naming one subscription
    # would revert each other at every drift check for ever.
    custom = client.CustomObjectsApi(config.new_client_from_config(str(kube.kubeconfig)))
    runners = []
    for namespace in (NS, "other"):
        settings = operator_settings()
        settings.scanning.disabled = True
        runner = KopfRunner(["run", "--standalone", "--namespace", namespace], timeout=30, settings=settings,
                            registry=build_registry(OperatorConfig(KafkaSettings(sandbox.bootstrap), 0.3,
                                                                   api_client=config.new_client_from_config(
                                                                       str(kube.kubeconfig)))))
        runner.__enter__()
        runners.append(runner)
    try:
        for namespace, interval in ((NS, 60000), ("other", 1000)):
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
                "metadata": {"name": "payments", "namespace": namespace},
                "spec": {**SPEC, "subscriptionName": "shared", "intervalMs": interval}})

        def ready(namespace: str) -> dict:
            status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "payments").get("status")
            return next((c for c in (status or {}).get("conditions") or () if c["type"] == "Ready"), {})
        wait_for(lambda: ready(NS).get("reason") == "Contested" or ready("other").get("reason") == "Contested",
                 "one of them to see the subscription contested")
        time.sleep(1.0)  # the other's revert of the last change, under way, lands
        seen = set()
        for _ in range(15):  # five drift intervals
            seen.add(sandbox.store.configs("shared")["interval.ms"])
            time.sleep(0.1)

        assert len(seen) == 1, f"the fight went on: {seen}"
        contested = [event for namespace in (NS, "other") for event in kube.objects("events", namespace).values()
                     if event.get("reason") == "Contested"]
        assert contested and all("something else manages it too" in event["message"] for event in contested)
        assert len(contested) <= 2  # one each at most, not one per drift check
    finally:
        for runner in runners:
            runner.__exit__(None, None, None)
    for runner in runners:
        assert runner.exception is None, runner.output


def test_checks_that_find_drift_every_other_time_are_a_fight_and_a_rare_edit_is_not():
    # Two operators at the same pace can each find their own value at every other check (each one's check lands
    # between the other's check and its revert): a count within a window sees that fight, a count in a row never did.
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), 1)
    # The status as a drift check may see it: the watch has not brought the Contested patch yet (a stale body).
    ready = SimpleNamespace(ready_reason="Applied", was_ready=True, generation=1)
    drifted = Change("shared", "update", (Op("interval.ms", SET, "1000"),))
    unchanged = Change("shared", "unchanged")
    fought = [handlers._contested(config, "fought", ready, drifted if check % 2 else unchanged, True)
              for check in range(8)]
    # The fourth drift within eight checks: three reverts, then it stops, and says so once (stale status or not):
    # the other side's value stays, found at every check now.
    fought += [handlers._contested(config, "fought", ready, drifted, True) for _ in range(5)]
    assert fought == [None] * 7 + ["new"] + ["held"] * 5
    edited = [handlers._contested(config, "edited", ready, drifted if check % 3 == 0 else unchanged, True)
              for check in range(40)]
    assert not any(edited)
    # Kafka found as specified ends it; so does a spec change (not a drift check), which starts the count afresh.
    assert handlers._contested(config, "fought", ready, unchanged, True) is None
    assert handlers._contested(config, "fought", ready, drifted, True) is None
    handlers._contested(config, "fought", ready, drifted, False)
    assert not any(handlers._contested(config, "fought", ready, drifted, True) for _ in range(3))


def test_a_contested_subscription_the_other_side_let_go_of_is_applied_again():
    """Deleting the other side's resource (the documented way out of a fight) removed the subscription from Kafka, and
    the remaining resource, Contested, never put it back."""
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), 1)
    ready = SimpleNamespace(ready_reason="Applied", was_ready=True, generation=1)
    drifted = Change("shared", "update", (Op("interval.ms", SET, "1000"),))
    decisions = [handlers._contested(config, "fought", ready, drifted, True) for _ in range(5)]
    assert decisions == [None, None, None, "new", "held"]
    gone = Change("shared", "create", (Op("interval.ms", SET, "60000"),))
    assert handlers._contested(config, "fought", ready, gone, True) is None
    assert handlers._contested(config, "fought", ready, drifted, True) is None   # counted afresh


def _connection(cluster: Cluster, name: str, spec: dict) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaConnection",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", body)


def test_a_cluster_that_never_answers_holds_up_only_its_own_resources(run_operator, monkeypatch):
    # Resources on a cluster that accepts connections and never answers: their handlers wait for Kafka (15 s each
    # attempt), more of them than a batch, while a resource on the default cluster is created. The batch and the
    # thread pools keep their default proportions at a tenth of their size (150 resources would cost the emulated
    # Kubernetes API 15 s).
    monkeypatch.setattr(admin_module, "BATCH_SIZE", 10)
    monkeypatch.setattr(handlers, "HANDLER_THREADS", 2 * 10)
    monkeypatch.setattr(handlers, "CLUSTER_THREADS", 10)
    silent = socket.create_server(("127.0.0.1", 0), backlog=1024)  # accepts, never answers
    try:
        cluster = run_operator(kafka_timeout_s=15)
        _connection(cluster, "silent", {"bootstrapServers": f"127.0.0.1:{silent.getsockname()[1]}"})
        for number in range(15):
            cluster.apply(f"stuck-{number}", {**SPEC, "connection": "silent"})
        time.sleep(2)  # their handlers are waiting for the silent cluster now

        started = time.monotonic()
        cluster.apply("payments", SPEC)
        cluster.wait_condition("payments", "True", "Applied")

        assert time.monotonic() - started < 7, "the default cluster's resource waited for the silent cluster's"
        assert cluster.kafka("team.payments") == IN_KAFKA
    finally:
        silent.close()  # the waiting connections are reset, so the operator stops without waiting out 15 s


def _connection_condition(cluster: Cluster, name: str) -> dict:
    obj = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", name)
    status = obj.get("status") or {}
    (ready,) = [c for c in status.get("conditions") or () if c["type"] == "Ready"] or [{}]
    return {**ready, "clusterId": status.get("clusterId"), "generation": status.get("observedGeneration")}


def _wait_connection(cluster: Cluster, name: str, state: str, reason: str) -> dict:
    return wait_for(lambda: (c := _connection_condition(cluster, name)) and c.get("status") == state
                    and c.get("reason") == reason and c, f"KafkaConnection {name} Ready={state}/{reason}")


def test_a_kafka_connection_says_what_the_operator_found_through_it(run_operator, sandbox_factory, monkeypatch):
    # Its status: what the subscriptions naming it found (Kafka not answering, then its cluster id), never their
    # own problems (a regex Kafka refuses), a Secret it names missing after an edit, and Unused while none names it:
    # from its creation, and once the last one went, also while the operator was down.
    with reserved_port() as port:   # refusing connections until a sandbox listens there
        cluster = run_operator()
        _connection(cluster, "idle", {"bootstrapServers": "127.0.0.1:1"})
        never = _wait_connection(cluster, "idle", "Unknown", "Unused")
        assert never["clusterId"] is None and never["generation"] is None
        _connection(cluster, "analytics", {"bootstrapServers": f"127.0.0.1:{port}"})
        cluster.apply("payments", {**SPEC, "connection": "analytics"})

        down = cluster.wait_condition("payments", "False", "KafkaUnavailable")
        unavailable = _wait_connection(cluster, "analytics", "False", "KafkaUnavailable")
        assert f"127.0.0.1:{port}" in unavailable["message"] and down["message"] == unavailable["message"]
        assert unavailable["clusterId"] is None and unavailable["generation"] == 1
        later = sandbox_factory(listen=("127.0.0.1", port))

    cluster.wait_condition("payments", "True", "Applied")
    connected = _wait_connection(cluster, "analytics", "True", "Connected")
    assert connected["clusterId"] == later.broker.cluster_id and later.broker.cluster_id in connected["message"]
    assert connected["lastTransitionTime"] and connected["observedGeneration"] == 1

    cluster.apply("bad", {**SPEC, "match": {"clientId": "payments-("}, "connection": "analytics"})
    cluster.wait_condition("bad", "False", "InvalidSpec")
    alter = admin_module.BatchedAdmin.alter_one   # and one Kafka refuses for a right only it needs
    monkeypatch.setattr(admin_module.BatchedAdmin, "alter_one", lambda self, change: KafkaRefusedError(
        "TOPIC_AUTHORIZATION_FAILED (error 29): denied") if change.name == "team.denied" else alter(self, change))
    cluster.apply("denied", {**SPEC, "connection": "analytics"})
    cluster.wait_condition("denied", "False", "KafkaRefused")
    time.sleep(0.5)  # a status write would have landed
    assert _connection_condition(cluster, "analytics") == {**connected, "generation": 1}
    monkeypatch.setattr(admin_module.BatchedAdmin, "alter_one", alter)
    cluster.delete("denied")
    wait_for(lambda: cluster.get("denied") is None, "the resource to go")

    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", "analytics", {"spec": {
        "securityProtocol": "SASL_PLAINTEXT", "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "absent"}}}})
    cluster.patch("payments", {"metadata": {"annotations": {"example.com/touched": "1"}}})  # reconciled again
    missing = _wait_connection(cluster, "analytics", "False", "InvalidSpec")
    assert f"Secret {NS}/absent does not exist" in missing["message"] and missing["generation"] == 2
    assert missing["clusterId"] == later.broker.cluster_id   # the cluster last reached stays said

    cluster.delete("bad")
    cluster.stop()   # the last resource naming it goes while no operator runs (its finalizer removed by hand)
    cluster.patch("payments", {"metadata": {"finalizers": None}})
    cluster.delete("payments")
    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    assert _connection_condition(cluster, "analytics")["reason"] == "InvalidSpec"
    run_operator()
    unused = _wait_connection(cluster, "analytics", "Unknown", "Unused")
    assert "names this KafkaConnection" in unused["message"] and unused["clusterId"] == later.broker.cluster_id
    assert _connection_condition(cluster, "idle") == never   # unchanged: not written again


def test_a_kafka_connection_no_subscription_names_says_a_spec_its_crd_refuses_not_unused(run_operator):
    """An older CRD installed, validation skipped: such a connection said Unused until a subscription named it, and
    only then InvalidSpec. Its spec is checked without connecting; fixed, it says Unused; named, the subscription
    says the same problem."""
    cluster = run_operator()
    _connection(cluster, "typo", {"bootstrapServer": "kafka:9092"})
    invalid = _wait_connection(cluster, "typo", "False", "InvalidSpec")
    assert invalid["message"].startswith(f"KafkaConnection {NS}/typo: the spec is not valid"), invalid
    assert "'bootstrapServers' is a required property" in invalid["message"] and invalid["generation"] == 1
    cluster.apply("payments", {**SPEC, "connection": "typo"})
    named = cluster.wait_condition("payments", "False", "InvalidSpec")
    assert "'bootstrapServers' is a required property" in named["message"], named
    cluster.delete("payments")
    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    time.sleep(0.5)   # the last one naming it gone: still InvalidSpec, not Unused
    assert _connection_condition(cluster, "typo")["reason"] == "InvalidSpec"
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", "typo", {
        "spec": {"bootstrapServer": None, "bootstrapServers": "kafka:9092"}})
    _wait_connection(cluster, "typo", "Unknown", "Unused")


def test_kafka_refusing_a_connections_user_the_cluster_right_is_the_connections_and_other_refusals_are_not(
        run_operator, monkeypatch):
    """CLUSTER_AUTHORIZATION_FAILED (the user lacks DESCRIBE_CONFIGS or ALTER_CONFIGS on the cluster, which every
    subscription needs) is said on the KafkaConnection, from whichever call Kafka refuses; any other refusal once
    Kafka answered is the subscription's own, and its connection Connected (not left saying Unused)."""
    cluster = run_operator()
    describe, alter = admin_module.BatchedAdmin.describe_one, admin_module.BatchedAdmin.alter_one
    refused = {"describe": {}, "alter": {}}   # subscription → the error code Kafka refuses it with

    def refusal(call, name):
        code = refused[call].get(name)
        return None if code is None else KafkaRefusedError(f"{kafka_errors.for_code(code).__name__} (error {code}): "
                                                           "denied", code)

    def describe_one(self, name):
        if (error := refusal("describe", name)) is not None:
            raise error
        return describe(self, name)

    monkeypatch.setattr(admin_module.BatchedAdmin, "describe_one", describe_one)
    monkeypatch.setattr(admin_module.BatchedAdmin, "alter_one",
                        lambda self, change: refusal("alter", change.name) or alter(self, change))
    for connection, call, code in (("own", "describe", 29), ("cluster", "describe", 31), ("altering", "alter", 31)):
        _connection(cluster, connection, {"bootstrapServers": cluster.sandbox.bootstrap})
        _wait_connection(cluster, connection, "Unknown", "Unused")
        refused[call][f"team.{connection}"] = code
        cluster.apply(connection, {**SPEC, "connection": connection})
        held = cluster.wait_condition(connection, "False", "KafkaRefused")
        if code == 31:
            said = _wait_connection(cluster, connection, "False", "KafkaRefused")
            assert said["message"] == held["message"] and "ClusterAuthorizationFailed" in said["message"]
        else:
            said = _wait_connection(cluster, connection, "True", "Connected")
            assert said["clusterId"] == cluster.sandbox.broker.cluster_id
        refused[call].clear()   # the right granted: the retry (1 s) applies it

    for connection in ("cluster", "altering"):
        cluster.wait_condition(connection, "True", "Applied")
        assert _wait_connection(cluster, connection, "True", "Connected")["clusterId"] == \
            cluster.sandbox.broker.cluster_id


def test_a_refusal_of_the_cluster_right_to_alter_is_said_steadily_beside_a_subscription_with_nothing_to_change(
        run_operator, monkeypatch):
    """The user may describe but not alter: a subscription already in Kafka checks fine at every drift check, the
    one with a change is refused; the connection says KafkaRefused throughout, not Connected and KafkaRefused in
    turn, until a change passes."""
    cluster = run_operator(drift_interval_s=0.5)
    _connection(cluster, "analytics", {"bootstrapServers": cluster.sandbox.bootstrap})
    cluster.apply("steady", {**SPEC, "connection": "analytics"})
    cluster.wait_condition("steady", "True", "Applied")
    alter, granted = admin_module.BatchedAdmin.alter_one, threading.Event()
    monkeypatch.setattr(admin_module.BatchedAdmin, "alter_one", lambda self, change: alter(self, change)
                        if granted.is_set() else KafkaRefusedError(
                            "ClusterAuthorizationFailedError (error 31): denied", 31))
    cluster.apply("changing", {**SPEC, "connection": "analytics"})
    cluster.wait_condition("changing", "False", "KafkaRefused")
    refused = _wait_connection(cluster, "analytics", "False", "KafkaRefused")

    checks = REGISTRY.get_sample_value("kcm_operator_reconciliations_total",
                                       {"result": "unchanged", "reason": "Applied"}) or 0.0
    wait_for(lambda: (REGISTRY.get_sample_value("kcm_operator_reconciliations_total", {
        "result": "unchanged", "reason": "Applied"}) or 0.0) >= checks + 4, "four drift checks of the steady one")
    assert _connection_condition(cluster, "analytics") == refused   # never written in between
    granted.set()
    cluster.wait_condition("changing", "True", "Applied")
    _wait_connection(cluster, "analytics", "True", "Connected")


def test_a_kafka_connection_named_only_by_a_paused_subscription_says_idle_until_it_is_unpaused(run_operator):
    cluster = run_operator()
    _connection(cluster, "analytics", {"bootstrapServers": cluster.sandbox.bootstrap})
    _wait_connection(cluster, "analytics", "Unknown", "Unused")
    cluster.apply("payments", {**SPEC, "connection": "analytics"}, annotations={"kcm.dev/paused": "true"})
    cluster.wait_condition("payments", "True", "Paused", kind="Paused")

    _wait_connection(cluster, "analytics", "Unknown", "Idle")
    cluster.patch("payments", {"metadata": {"annotations": {"kcm.dev/paused": None}}})
    cluster.wait_condition("payments", "True", "Applied")
    assert _wait_connection(cluster, "analytics", "True", "Connected")["clusterId"] == \
        cluster.sandbox.broker.cluster_id
    cluster.delete("payments")
    _wait_connection(cluster, "analytics", "Unknown", "Unused")


def test_a_kafka_connection_sends_the_subscription_to_its_cluster_only(run_operator, sandbox_factory):
    cluster = run_operator()
    other = sandbox_factory()
    _connection(cluster, "analytics", {"bootstrapServers": other.bootstrap})

    cluster.apply("payments", {**SPEC, "connection": "analytics"})

    cluster.wait_condition("payments", "True", "Applied")
    assert other.store.configs("team.payments") == IN_KAFKA
    assert cluster.sandbox.store.names() == []


def test_resources_reaching_one_cluster_through_different_connections_conflict(run_operator, sandbox_factory):
    # As when every team namespace has its own KafkaConnection to a shared cluster.
    cluster = run_operator()
    for connection in ("team-a", "team-b"):
        _connection(cluster, connection, {"bootstrapServers": cluster.sandbox.bootstrap})
    other = sandbox_factory()
    _connection(cluster, "elsewhere", {"bootstrapServers": other.bootstrap})
    cluster.apply("one", {**SPEC, "subscriptionName": "shared"})
    cluster.wait_condition("one", "True", "Applied")
    time.sleep(1.0)  # creationTimestamp has one-second resolution: the others must be visibly newer

    cluster.apply("two", {**SPEC, "subscriptionName": "shared", "intervalMs": 1000, "connection": "team-a"})
    cluster.apply("three", {**SPEC, "subscriptionName": "shared", "intervalMs": 2000, "connection": "team-b"})
    cluster.apply("four", {**SPEC, "subscriptionName": "shared", "intervalMs": 3000, "connection": "elsewhere"})

    for newer in ("two", "three"):
        assert "team/one" in cluster.wait_condition(newer, "False", "Conflict")["message"]
    cluster.wait_condition("four", "True", "Applied")  # another cluster: no conflict
    for connection in ("team-a", "team-b"):   # named, but nothing applied through them: not Unused
        assert "none applies anything" in _wait_connection(cluster, connection, "Unknown", "Idle")["message"]
    assert cluster.kafka("shared")["interval.ms"] == "60000"
    assert other.store.configs("shared")["interval.ms"] == "3000"

    cluster.delete("three")  # deletionPolicy Delete, but not its subscription to delete

    wait_for(lambda: cluster.get("three") is None, "the resource to go")
    assert cluster.kafka("shared")["interval.ms"] == "60000"
    assert cluster.events("Drift") == []


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
def test_an_older_owner_whose_connection_breaks_still_owns_the_subscription(run_operator, restart):
    # Its cluster id was seen while it worked (and is in its status, for an operator started since): the newer
    # resource must not take over meanwhile (and flip the subscription between the two specs), nor remove it when
    # deleted.
    cluster = run_operator()
    _connection(cluster, "team-a", {"bootstrapServers": cluster.sandbox.bootstrap})
    cluster.apply("older", {**SPEC, "subscriptionName": "shared", "connection": "team-a"})
    cluster.wait_condition("older", "True", "Applied")
    time.sleep(1.0)  # creationTimestamp has one-second resolution
    cluster.apply("newer", {**SPEC, "subscriptionName": "shared", "intervalMs": 1000})
    cluster.wait_condition("newer", "False", "Conflict")

    assert cluster.get("older")["status"]["clusterId"] == cluster.sandbox.broker.cluster_id

    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", "team-a")
    if restart:  # a new operator, which never saw the older resource's connection work
        cluster.stop()
        cluster = run_operator()
    generation = cluster.patch("newer", {"spec": {"intervalMs": 2000}})["metadata"]["generation"]

    seen = wait_for(lambda: (c := cluster.condition("newer")) and c["observedGeneration"] == generation and c,
                    "the newer resource's edit to be reconciled")
    assert seen["reason"] == "Conflict" and "team/older" in seen["message"]
    assert cluster.kafka("shared")["interval.ms"] == "60000"
    cluster.delete("newer")
    wait_for(lambda: cluster.get("newer") is None, "the resource to go")
    assert cluster.kafka("shared")["interval.ms"] == "60000"


def test_a_resource_never_waits_for_the_cluster_of_another_resource_naming_its_subscription(run_operator):
    # An older resource naming the same subscription through a KafkaConnection to a cluster that never answers: what
    # this operator knows of that cluster (nothing: never reached, never applied) is all the healthy one may use.
    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # accepts, never answers
    try:
        cluster = run_operator(kafka_timeout_s=5)
        _connection(cluster, "dead", {"bootstrapServers": f"127.0.0.1:{silent.getsockname()[1]}"})
        cluster.apply("older", {**SPEC, "subscriptionName": "shared", "connection": "dead"})
        cluster.wait_condition("older", "False", "KafkaUnavailable")
        time.sleep(5.5)  # its failure is no longer answered at once: asking that cluster again would wait 5 s
        started = time.monotonic()

        cluster.apply("healthy", {**SPEC, "subscriptionName": "shared"})

        cluster.wait_condition("healthy", "True", "Applied")
        took = time.monotonic() - started
        assert took < 3, f"the healthy resource waited {took:.1f} s for another resource's cluster"
        assert cluster.kafka("shared") == IN_KAFKA
    finally:
        silent.close()


def test_one_cluster_named_by_many_connections_holds_one_share_of_the_threads(run_operator, monkeypatch):
    # As when every team namespace has its own KafkaConnection to a shared cluster, and that cluster stops answering:
    # its resources hold one cluster's share (here 3 of 6 threads), not one share per KafkaConnection.
    monkeypatch.setattr(handlers, "HANDLER_THREADS", 6)
    monkeypatch.setattr(handlers, "CLUSTER_THREADS", 3)
    silent = socket.create_server(("127.0.0.1", 0), backlog=256)  # accepts, never answers
    try:
        cluster = run_operator(kafka_timeout_s=8)
        for team in range(8):
            _connection(cluster, f"team-{team}", {"bootstrapServers": f"127.0.0.1:{silent.getsockname()[1]}"})
            cluster.apply(f"dead-{team}", {**SPEC, "connection": f"team-{team}"})
        time.sleep(1.5)  # their handlers are waiting for the silent cluster now
        started = time.monotonic()

        cluster.apply("payments", SPEC)

        cluster.wait_condition("payments", "True", "Applied")
        took = time.monotonic() - started
        assert took < 4, f"the default cluster's resource waited {took:.1f} s for threads the silent cluster held"
    finally:
        silent.close()


def test_deleting_the_owner_hands_the_subscription_to_the_next_resource_at_once(run_operator):
    # A GitOps rename: the new resource is created, then the old one pruned. Kafka keeps the subscription throughout
    # (clients never stop pushing), and the new resource takes it over now, not at its next drift check (60 s).
    cluster = run_operator(drift_interval_s=60)
    cluster.apply("old-name", {**SPEC, "subscriptionName": "payments"})
    cluster.wait_condition("old-name", "True", "Applied")
    time.sleep(1.0)  # creationTimestamp has one-second resolution: the second resource must be visibly newer
    cluster.apply("new-name", {**SPEC, "subscriptionName": "payments", "intervalMs": 1000})
    cluster.wait_condition("new-name", "False", "Conflict")

    cluster.delete("old-name")

    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (cluster.kafka("payments").get("interval.ms") == "1000"
                                                 and cluster.get("old-name") is None):
        seen.append(cluster.kafka("payments"))
        time.sleep(0.05)
    assert {} not in seen, "the subscription was removed from Kafka although new-name names it"
    assert cluster.kafka("payments") == {**IN_KAFKA, "interval.ms": "1000"}
    assert cluster.get("old-name") is None
    ready = cluster.wait_condition("new-name", "True", "Applied")
    assert "team/old-name" not in ready["message"]
    assert cluster.events("Drift") == []


def test_a_subscription_name_edited_past_the_crds_rule_is_refused_and_the_applied_one_is_what_deletion_removes(
        run_operator):
    """The CRD's rule refuses an edit of spec.subscriptionName where the API server checks it; elsewhere the edit
    applied the new subscription and left the old one in Kafka, which deleting the resource never removed."""
    cluster = run_operator()
    cluster.apply("payments", {**SPEC, "subscriptionName": "first"})
    cluster.wait_condition("payments", "True", "Applied")
    cluster.patch("payments", {"spec": {"subscriptionName": "second"}})
    refused = cluster.wait_condition("payments", "False", "InvalidSpec")
    assert "spec.subscriptionName cannot change: this resource applied subscription first" in refused["message"]
    assert cluster.get("payments")["status"]["subscriptionName"] == "first"
    assert (cluster.kafka("first"), cluster.kafka("second")) == (IN_KAFKA, {})
    # It still owns the subscription it applied: a newer resource naming that one (created within the same second,
    # perhaps: ties go by name) is in conflict with it.
    cluster.apply("rival", {**SPEC, "subscriptionName": "first", "intervalMs": 1000})
    assert "older resource team/payments" in cluster.wait_condition("rival", "False", "Conflict")["message"]
    cluster.delete("rival")
    wait_for(lambda: cluster.get("rival") is None, "the newer one's deletion")
    assert cluster.kafka("first") == IN_KAFKA
    cluster.delete("payments")
    wait_for(lambda: cluster.get("payments") is None, "the deletion")
    assert (cluster.kafka("first"), cluster.kafka("second")) == ({}, {})


def test_a_deletion_kafka_holds_says_so_on_the_resource(run_operator, sandbox_factory):
    other = sandbox_factory()
    cluster = run_operator()
    _connection(cluster, "analytics", {"bootstrapServers": other.bootstrap})
    cluster.apply("payments", {**SPEC, "connection": "analytics"})
    cluster.wait_condition("payments", "True", "Applied")
    other.stop()

    cluster.delete("payments")

    held = cluster.wait_condition("payments", "False", "KafkaUnavailable")
    assert held["message"].startswith("deletionPolicy Delete: subscription team.payments is not removed from Kafka "
                                      "yet, so the resource is held")
    assert cluster.get("payments")["metadata"].get("deletionTimestamp")
    time.sleep(4)  # retried (1, 2 s) meanwhile: an event when the condition changes, not one per retry
    warnings = [(event["type"], event["message"]) for event in cluster.events("KafkaUnavailable")]
    assert warnings and all(kind == "Warning" for kind, _ in warnings)
    assert cluster.condition("payments")["message"] in [message for _, message in warnings]
    assert len(warnings) == len({message for _, message in warnings}), warnings
    # The way out the message names: Retain lets it go at its next retry, leaving Kafka alone.
    assert "(set spec.deletionPolicy: Retain, or annotate kcm.dev/paused=true, to let it go" in held["message"]
    cluster.patch("payments", {"spec": {"deletionPolicy": "Retain"}})
    wait_for(lambda: cluster.get("payments") is None, "the resource let go once its policy is Retain", timeout=30)


def test_a_connection_pointed_at_another_cluster_moves_its_subscriptions_without_calling_it_drift(run_operator,
                                                                                                 sandbox_factory):
    other = sandbox_factory()
    cluster = run_operator(drift_interval_s=1.0)
    _connection(cluster, "analytics", {"bootstrapServers": cluster.sandbox.bootstrap})
    cluster.apply("payments", {**SPEC, "connection": "analytics"})
    cluster.wait_condition("payments", "True", "Applied")
    corrections = REGISTRY.get_sample_value("kcm_operator_drift_corrections_total") or 0

    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", "analytics",
                                                  {"spec": {"bootstrapServers": other.bootstrap}})

    wait_for(lambda: cluster.get("payments")["status"].get("clusterId") == other.broker.cluster_id,
             "the subscription to move to the other cluster")
    assert other.store.configs("team.payments") == IN_KAFKA
    assert cluster.events("Drift") == []
    assert (REGISTRY.get_sample_value("kcm_operator_drift_corrections_total") or 0) == corrections
    moved = wait_for(lambda: [e for e in cluster.events("Applied") if "moved to Kafka cluster" in e["message"]],
                     "the Applied event saying it moved")
    assert [event["type"] for event in moved] == ["Normal"]
    assert other.broker.cluster_id in moved[0]["message"]


@pytest.mark.parametrize("cluster_down", [False, True])
def test_deleting_a_subscription_whose_connection_is_gone_uses_its_last_good_settings(run_operator, sandbox_factory,
                                                                                       cluster_down):
    """As when a namespace is deleted: its KafkaConnection may go before the subscriptions that use it. Its last
    settings remove the subscription; when they no longer reach Kafka (a decommissioned cluster), the resource is let
    go after a few tries, saying what stays."""
    cluster = run_operator()
    other = sandbox_factory()
    _connection(cluster, "analytics", {"bootstrapServers": other.bootstrap})
    cluster.apply("payments", {**SPEC, "connection": "analytics", "deletionPolicy": "Delete"})
    cluster.wait_condition("payments", "True", "Applied")
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", "analytics")
    if cluster_down:
        other.stop()

    cluster.delete("payments")

    # With the cluster down: three tries with the operator's own backoff (1 + 2 + 4 s) and kopf's rounds between.
    wait_for(lambda: cluster.get("payments") is None, "the resource to go", 60)
    if not cluster_down:
        assert other.store.names() == [] and cluster.events("NotRemoved") == []
        return
    (event,) = cluster.wait_events("NotRemoved")
    assert event["type"] == "Warning"
    assert event["message"].startswith("subscription team.payments was not removed from Kafka")
    assert "KafkaConnection team/analytics does not exist" in event["message"]
    assert "with its last settings" in event["message"]
    assert event["message"].endswith("(kcm subscriptions delete team.payments --bootstrap-server … --command-config …, "
                                     "for the cluster KafkaConnection team/analytics named)")


@pytest.mark.parametrize("trouble", ["refused spec", "connection never worked"])
def test_deleting_a_resource_never_applied_leaves_a_same_named_subscription_alone(run_operator, trouble):
    cluster = run_operator()
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    try:  # made by hand
        admin.alter([Change("team.payments", "create", (Op("metrics", SET, "org.apache.kafka."),
                                                        Op("interval.ms", SET, "30000")))])
    finally:
        admin.close()
    before = cluster.kafka("team.payments")
    assert before == {"metrics": "org.apache.kafka.", "interval.ms": "30000"}
    if trouble == "refused spec":  # the operator reaches Kafka, which refuses what the spec asks
        spec = {**SPEC, "match": {"clientId": "payments-("}}
    else:
        _connection(cluster, "analytics", {"bootstrapServers": cluster.sandbox.bootstrap,
                                           "securityProtocol": "SASL_PLAINTEXT",
                                           "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "never-created"}}})
        spec = {**SPEC, "connection": "analytics"}
    cluster.apply("payments", {**spec, "deletionPolicy": "Delete"})
    cluster.wait_condition("payments", "False", "InvalidSpec")

    cluster.delete("payments")

    wait_for(lambda: cluster.get("payments") is None, "the resource to go")
    assert cluster.kafka("team.payments") == before
    assert cluster.events("NotRemoved") == []  # let go at once, not after the retries of a cluster out of reach


def test_sasl_credentials_come_from_the_secret_and_never_reach_status_or_events(run_operator, sandbox_factory,
                                                                                caplog):
    cluster = run_operator()
    other = sandbox_factory()
    password = "s3cr3t-Pa55word"
    # `data`, not `stringData`: the emulator does not convert one into the other.
    client.CoreV1Api(cluster.api_client).create_namespaced_secret(NS, {
        "metadata": {"name": "analytics-credentials"},
        "data": {key: base64.b64encode(value.encode()).decode()
                 for key, value in (("username", "kcm-operator"), ("password", password))}})
    _connection(cluster, "analytics", {"bootstrapServers": other.bootstrap, "securityProtocol": "SASL_PLAINTEXT",
                                       "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "analytics-credentials"}}})

    cluster.apply("payments", {**SPEC, "connection": "analytics"})

    # The sandbox speaks no SASL, so the handshake fails; what matters is whom the client was set up to reach.
    failed = cluster.wait_condition("payments", "False", "KafkaUnavailable")
    ((_, admin),) = cluster.config.admins.values()
    options = admin.settings.client_options()
    assert options["bootstrap_servers"] == [other.bootstrap]
    assert (options["security_protocol"], options["sasl_mechanism"]) == ("SASL_PLAINTEXT", "PLAIN")
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("kcm-operator", password)
    assert password not in repr(admin.settings) and password not in failed["message"]
    assert password not in repr(cluster.get("payments"))
    # kcm's and kopf's own logs; kafka-python logs its whole config at DEBUG, which `kcm operator` never enables.
    assert not [record for record in caplog.records
                if record.name.startswith(("kcm", "kopf")) and password in record.getMessage()]
    assert all(password not in event.get("message", "") for event in cluster.kube.objects("events", NS).values())


def test_a_missing_kafka_connection_is_invalid_spec_until_it_is_created(run_operator):
    cluster = run_operator()  # drift checks every 60 s: not what brings it back

    cluster.apply("payments", {**SPEC, "connection": "later"})
    missing = cluster.wait_condition("payments", "False", "InvalidSpec")
    assert "KafkaConnection team/later does not exist" in missing["message"]
    _connection(cluster, "later", {"bootstrapServers": cluster.sandbox.bootstrap, "securityProtocol": "SSL",
                                   "tls": {"caSecretRef": {"name": "later-ca"}}})   # GitOps applied it second
    # Its Secret is not there yet: the subscription's status says which KafkaConnection names it.
    wait_for(lambda: "later-ca" in cluster.condition("payments")["message"], "the missing Secret named")
    assert cluster.condition("payments")["message"] == (
        "KafkaConnection team/later: Secret team/later-ca does not exist")
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", "later", [
        {"op": "remove", "path": "/spec/tls"}, {"op": "replace", "path": "/spec/securityProtocol",
                                                "value": "PLAINTEXT"}])

    cluster.wait_condition("payments", "True", "Applied")
    assert cluster.kafka("team.payments") == IN_KAFKA


def test_two_replicas_peer_the_higher_priority_works_and_the_other_takes_over_when_it_stops(kube, sandbox, tmp_path):
    cluster_view = Cluster(kube, sandbox, OperatorConfig(KafkaSettings(sandbox.bootstrap)))
    cluster_view.custom.create_namespaced_custom_object("kopf.dev", "v1", NS, "kopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "default"}})
    replicas = {}
    try:
        for priority in (20, 10):
            replica_config = OperatorConfig(KafkaSettings(sandbox.bootstrap),
                                            api_client=config.new_client_from_config(str(kube.kubeconfig)))
            settings = operator_settings()
            settings.scanning.disabled = True
            # A named peering, as the chart runs it: a replica starts paused until it has read the peering object, so
            # the standby never works alongside (kopf's `default` starts working at once, and two replicas adding
            # one finalizer leave the loser skipping the next event: see the nudge test below).
            runner = KopfRunner(["run", "--namespace", NS, "--priority", str(priority), "--peering", "default"],
                                timeout=30, registry=build_registry(replica_config), settings=settings)
            runner.__enter__()
            replicas[priority] = (runner, replica_config)
            # Start the next replica only once this one is announced, as in a rolling Deployment.
            wait_for(lambda: len((kube.objects("kopfpeerings", NS)["default"].get("status") or {})) == len(replicas),
                     f"{len(replicas)} peers announced")
        uid = cluster_view.apply("payments", SPEC)["metadata"]["uid"]
        cluster_view.wait_condition("payments", "True", "Applied")
        assert (uid in replicas[20][1].ready, uid in replicas[10][1].ready) == (True, False)

        replicas[20][0].__exit__(None, None, None)
        cluster_view.patch("payments", {"spec": {"intervalMs": 5000}})

        wait_for(lambda: cluster_view.kafka("team.payments").get("interval.ms") == "5000", "the standby to apply")
        assert uid in replicas[10][1].ready
    finally:
        for runner, _ in replicas.values():
            if runner._thread.is_alive():
                runner.__exit__(None, None, None)


def test_an_edit_kopf_saw_but_never_handled_is_nudged_by_the_drift_check_a_drift_interval_later(kube, run_operator,
                                                                                                 caplog):
    """Two kopf replicas working at once (a rollout, an unnamed peering) both add the finalizer to a new resource; the
    one whose JSON patch loses skips the next event (kopf 1.45 keeps the lost patch and drops the event it then finds
    consistent) and waits for another that may never come. The emulator makes that race here, every time."""
    kube.emulator.racing_json_patches.add((SUBSCRIPTIONS, NS, "payments"))
    cluster = run_operator(drift_interval_s=1.0)

    cluster.apply("payments", SPEC)

    cluster.wait_condition("payments", "True", "Applied")
    assert cluster.kafka("team.payments") == IN_KAFKA
    assert cluster.get("payments")["metadata"]["annotations"][NUDGED_ANNOTATION].startswith("generation 1 at ")
    assert not kube.emulator.racing_json_patches, "the finalizer's patch lost its race"
    nudges = [r.getMessage() for r in caplog.records if "waited a whole drift interval" in r.getMessage()]
    assert nudges == [f"{NS}/payments: its edit (generation 1) waited a whole drift interval (1 s) with no handler "
                      f"taking it up; annotating {NUDGED_ANNOTATION} so that it is handled"]


def test_a_nudge_the_api_refused_is_made_again_at_the_next_drift_check(kube, run_operator, caplog):
    kube.emulator.racing_json_patches.add((SUBSCRIPTIONS, NS, "payments"))
    refused = (SUBSCRIPTIONS, NS, "payments", None)
    kube.emulator.forbidden_patches.add(refused)
    cluster = run_operator(drift_interval_s=1.0)
    try:
        cluster.apply("payments", SPEC)
        wait_for(lambda: [r for r in caplog.records if "could not write its nudge annotation" in r.getMessage()],
                 "the nudge refused")
    finally:
        kube.emulator.forbidden_patches.discard(refused)

    cluster.wait_condition("payments", "True", "Applied")
    assert cluster.get("payments")["metadata"]["annotations"][NUDGED_ANNOTATION].startswith("generation 1 at ")
    nudges = [r for r in caplog.records if "waited a whole drift interval" in r.getMessage()]
    assert len(nudges) == 2, nudges


def test_an_edit_waiting_for_kopfs_retry_of_the_reconcile_is_not_nudged(run_operator, monkeypatch, caplog):
    """An edit made while the reconcile waits out its backoff (Kafka down, up to a minute) is kopf's to take up when
    the retry is due: not dropped, so not nudged, however many drift checks come meanwhile."""
    import kopf

    reconcile, calls = handlers._reconcile, []

    def failing_once(config, body, patch, claims, retry, drift_check):
        if not drift_check:
            calls.append(body.metadata.get("generation"))
            if len(calls) == 1:
                reconcile(config, body, patch, claims, retry, drift_check=drift_check)
                raise kopf.TemporaryError("Kafka is down, say", delay=5)
        return reconcile(config, body, patch, claims, retry, drift_check=drift_check)

    monkeypatch.setattr(handlers, "_reconcile", failing_once)
    cluster = run_operator(drift_interval_s=1.0)
    cluster.apply("payments", SPEC)
    wait_for(lambda: calls, "the first attempt")
    cluster.patch("payments", {"spec": {"intervalMs": 30000}})

    wait_for(lambda: cluster.kafka("team.payments").get("interval.ms") == "30000", "the retry to apply the edit")
    assert calls[-1] == 2
    assert [r for r in caplog.records if "waited a whole drift interval" in r.getMessage()] == []
    assert NUDGED_ANNOTATION not in cluster.get("payments")["metadata"].get("annotations", {})


def test_a_drift_check_whose_status_write_is_refused_keeps_checking(kube, run_operator, monkeypatch, caplog):
    """kopf ends a timer for good when the patch it applies after the handler still fails after its retries (an
    API server down or refusing for about a minute): drift checks write their status themselves, so a refused write
    leaves the next check to run, and to write again. kopf's retries are cut short here, as a longer refusal would
    outlast them."""
    def short_retries(settings_of=operator_settings):
        settings = settings_of()
        settings.networking.error_backoffs = [0.1]
        return settings

    monkeypatch.setattr(sys.modules[__name__], "operator_settings", short_retries)
    cluster = run_operator(drift_interval_s=0.5)
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    applied = cluster.get("payments")["status"]["lastAppliedTime"]
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    refused = (SUBSCRIPTIONS, NS, "payments", "status")
    kube.emulator.forbidden_patches.add(refused)
    try:
        for count, interval in ((1, "1000"), (2, "2000")):   # two reverts whose status writes are refused
            admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, interval),))])
            wait_for(lambda: kube.emulator.refused_patches >= count, f"refused write {count}")
            assert cluster.kafka("team.payments") == IN_KAFKA
        kube.emulator.forbidden_patches.discard(refused)
        admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, "3000"),))])
        wait_for(lambda: len(cluster.events("Drift")) >= 3, "the third drift found")
    finally:
        kube.emulator.forbidden_patches.discard(refused)
        admin.close()

    wait_for(lambda: cluster.kafka("team.payments") == IN_KAFKA, "the third drift reverted")
    wait_for(lambda: cluster.get("payments")["status"]["lastAppliedTime"] != applied, "the status written again")
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "a drift check could" in r.getMessage()]
    assert said == [("WARNING", f"{NS}/payments: a drift check could not write its status (the Kubernetes API "
                                "answered 403 Forbidden); each next check writes what it finds then, until one "
                                "succeeds"),
                    ("INFO", f"{NS}/payments: a drift check could write to it again")], said   # once each


def test_a_drift_check_write_failing_for_a_moment_lands_within_that_check(kube, run_operator, caplog):
    """A 503 (an API server restarting, say) is tried again within the check: the revert's lastAppliedTime is
    written, nothing is said."""
    cluster = run_operator(drift_interval_s=0.5)
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    applied = cluster.get("payments")["status"]["lastAppliedTime"]
    time.sleep(1.1)   # times are written to the second
    kube.emulator.failing_patches[(SUBSCRIPTIONS, NS, "payments", "status")] = 2
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    try:
        admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, "1000"),))])
    finally:
        admin.close()

    wait_for(lambda: cluster.get("payments")["status"]["lastAppliedTime"] > applied, "the revert's time written")
    assert kube.emulator.refused_patches == 2 and cluster.kafka("team.payments") == IN_KAFKA
    assert [r.getMessage() for r in caplog.records if "a drift check could" in r.getMessage()] == []


def test_a_revert_whose_status_write_was_refused_has_its_time_written_by_a_later_check(kube, run_operator, caplog):
    """A refusal is not tried again within the check; the next check, with Kafka as specified by then and nothing
    else to write, still writes when Kafka was last changed."""
    cluster = run_operator(drift_interval_s=0.5)
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    applied = cluster.get("payments")["status"]["lastAppliedTime"]
    time.sleep(1.1)   # times are written to the second
    refused = (SUBSCRIPTIONS, NS, "payments", "status")
    kube.emulator.forbidden_patches.add(refused)
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    try:
        admin.alter([Change("team.payments", "update", (Op("interval.ms", SET, "1000"),))])
        wait_for(lambda: kube.emulator.refused_patches >= 1, "the revert's write refused")
        reverted_by = now_text()
        assert cluster.kafka("team.payments") == IN_KAFKA
    finally:
        kube.emulator.forbidden_patches.discard(refused)
        admin.close()

    wait_for(lambda: cluster.get("payments")["status"]["lastAppliedTime"] != applied, "the revert's time written")
    assert applied < cluster.get("payments")["status"]["lastAppliedTime"] <= reverted_by
    assert len(cluster.events("Drift")) == 1
    said = [r.levelname for r in caplog.records if "a drift check could" in r.getMessage()]
    assert said == ["WARNING", "INFO"], said


def test_resources_created_while_the_operator_was_down_are_reconciled_when_it_starts(kube, sandbox, run_operator):
    Cluster(kube, sandbox, OperatorConfig(KafkaSettings(sandbox.bootstrap))).apply("payments", SPEC)

    cluster = run_operator()

    cluster.wait_condition("payments", "True", "Applied")
    assert cluster.kafka("team.payments") == IN_KAFKA


def test_quiet_drift_checks_write_nothing(run_operator):
    cluster = run_operator(drift_interval_s=0.3)
    cluster.apply("payments", SPEC)
    cluster.wait_condition("payments", "True", "Applied")
    def quiet_checks() -> float:
        return REGISTRY.get_sample_value("kcm_operator_reconciliations_total",
                                         {"result": "unchanged", "reason": "Applied"}) or 0.0

    first = quiet_checks()
    wait_for(lambda: quiet_checks() > first, "a first quiet drift check")  # creation's writes are all done by then
    settled = cluster.get("payments")

    wait_for(lambda: quiet_checks() >= first + 4, "three more quiet drift checks")

    assert cluster.get("payments")["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"]
    assert len(cluster.events("Applied")) == 1


def test_drift_checks_read_a_kafka_connection_once_per_interval_not_once_per_resource(run_operator, monkeypatch):
    """Every drift check of every resource read its KafkaConnection and Secrets: 1,000 subscriptions at the default
    interval were about 17 reads a second for the API server. Drift checks now share one reading per interval."""
    reads, checks = [], []
    resolve = ConnectionResolver.resolve
    monkeypatch.setattr(ConnectionResolver, "resolve", lambda self, *ref: reads.append(ref) or resolve(self, *ref))
    reconcile = handlers._reconcile

    def counted(*args, drift_check, **kwargs):
        if drift_check:
            checks.append(time.monotonic())
        return reconcile(*args, drift_check=drift_check, **kwargs)

    monkeypatch.setattr(handlers, "_reconcile", counted)
    cluster = run_operator(drift_interval_s=1.0)
    _connection(cluster, "analytics", {"bootstrapServers": cluster.sandbox.bootstrap})
    for number in range(6):
        cluster.apply(f"payments-{number}", {**SPEC, "subscriptionName": f"payments-{number}",
                                             "connection": "analytics"})
    for number in range(6):
        cluster.wait_condition(f"payments-{number}", "True", "Applied")
    read_before, checked_before = len(reads), len(checks)

    wait_for(lambda: len(checks) >= checked_before + 24, "24 drift checks", 30)

    read, checked = len(reads) - read_before, len(checks) - checked_before
    seconds = checks[-1] - checks[checked_before]
    assert read <= seconds + 2, f"{read} reads of the KafkaConnection for {checked} drift checks in {seconds:.1f} s"
    assert read >= 1, "drift checks must still read the KafkaConnection once an interval has passed"


def test_the_admin_of_a_kafka_connection_goes_with_the_last_resource_naming_it(run_operator, monkeypatch):
    """Team namespaces come and go: the admin client (a thread, sockets) of every KafkaConnection ever used stayed."""
    closed = []
    close = handlers.BatchedAdmin.close
    monkeypatch.setattr(handlers.BatchedAdmin, "close", lambda self: closed.append(self) or close(self))
    cluster = run_operator()
    for name in ("analytics", "billing"):
        _connection(cluster, name, {"bootstrapServers": cluster.sandbox.bootstrap})
    cluster.apply("payments", {**SPEC, "connection": "analytics", "deletionPolicy": "Delete"})
    cluster.apply("orders", {**SPEC, "subscriptionName": "orders", "connection": "analytics"})
    for name in ("payments", "orders"):
        cluster.wait_condition(name, "True", "Applied")
    analytics = cluster.config.admins[(NS, "analytics")][1]

    cluster.delete("payments")
    wait_for(lambda: cluster.get("payments") is None, "payments to go")
    assert cluster.kafka("team.payments") == {}
    assert (NS, "analytics") in cluster.config.admins and closed == [], "orders still names analytics"

    cluster.patch("orders", {"spec": {"connection": "billing"}})   # the last resource naming it leaves it
    wait_for(lambda: (NS, "analytics") not in cluster.config.admins, "the unused admin to be retired")
    wait_for(lambda: closed == [analytics], "the unused admin to be closed")
    assert (NS, "analytics") not in cluster.config.servers and (NS, "analytics") not in cluster.config.cluster_ids
    cluster.wait_condition("orders", "True", "Applied")
    billing = cluster.config.admins[(NS, "billing")][1]

    cluster.delete("orders")
    wait_for(lambda: cluster.get("orders") is None, "orders to go")
    wait_for(lambda: closed == [analytics, billing], "the last admin to be closed")
    assert cluster.config.admins == {} or list(cluster.config.admins) == [None]
