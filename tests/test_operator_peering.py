"""Two `kcm operator` processes peering through kopf: when the working one is killed, the standby takes over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from kubernetes import client, config

from ports import reserved_port
from kube_emulator import KubeServer
from test_operator_reconcile import GROUP, IN_KAFKA, NS, PLURAL, SPEC, VERSION, wait_for

CRDS = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
LIFETIME_S = 3
# Past the dead replica's lifetime: the standby's resume, a fresh listing, its first Kafka connection and one batched
# reconcile, all slower on a loaded machine. The test is that the standby takes over, not how fast.
TAKEOVER_MARGIN_S = 45
APPLIED = 'kcm_operator_reconciliations_total{reason="Applied",result="applied"}'
MANAGED = "kcm_operator_managed_subscriptions"
UNCHANGED = 'kcm_operator_reconciliations_total{reason="Applied",result="unchanged"}'   # drift checks, mostly
PEERING = "kcm-replicas"  # not kopf's "default", which any other kopf operator may use too


class Replica:
    """One `kcm operator --all-namespaces` process, named by kopf's POD_ID, logging to a file."""

    def __init__(self, kube: KubeServer, bootstrap: str, priority: int, log: Path, *extra: str) -> None:
        self.name = f"replica-{priority}"
        self.log = log
        self._ports = ExitStack()   # held until the replica stops: a port only seen free can be taken meanwhile
        self.metrics_port = self._ports.enter_context(reserved_port())
        with log.open("w") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kcm_cli.main", "operator", "--all-namespaces", "--peering-name", PEERING,
                 "--bootstrap-server", bootstrap, "--priority", str(priority),
                 "--peering-lifetime", str(LIFETIME_S), "--metrics-port", str(self.metrics_port),
                 "--liveness-port", "0", "--listen-address", "127.0.0.1", *extra],
                env={**os.environ, "KUBECONFIG": str(kube.kubeconfig), "POD_ID": self.name},
                stdout=output, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text()

    def applied(self) -> float:
        """How many reconciliations this replica applied to Kafka, from its own metrics endpoint."""
        return self.metric(APPLIED)

    def metric(self, series: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as response:
            lines = response.read().decode().splitlines()
        return next((float(line.split()[-1]) for line in lines if line.startswith(series + " ")), 0.0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self._ports.close()


def _peers(kube: KubeServer) -> set[str]:
    return set(kube.objects("clusterkopfpeerings")[PEERING].get("status") or {})


@pytest.fixture
def kube(tmp_path):
    server = KubeServer(tmp_path, CRDS)
    server.start()
    yield server
    server.stop()


@pytest.mark.timeout(180)
def test_the_standby_takes_over_within_the_peering_lifetime_when_the_working_replica_is_killed(
        kube, sandbox, tmp_path):
    custom = client.CustomObjectsApi(config.new_client_from_config(str(kube.kubeconfig)))
    replicas: dict[int, Replica] = {}
    try:
        replicas[20] = Replica(kube, sandbox.bootstrap, 20, tmp_path / "replica-20.log")
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
            "metadata": {"name": "payments"}, "spec": SPEC})
        # Its peering object is named and missing: the replica waits instead of reconciling on its own.
        wait_for(lambda: "reconciles nothing until its peering object exists: ClusterKopfPeering kcm-replicas "
                 "not found" in replicas[20].output(), "replica-20 to say what it waits for", 30)
        # Without a name to wait for, kopf would peer through nothing and have reconciled by now.
        assert sandbox.store.configs("team.payments") == {}
        custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", {
            "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})
        wait_for(lambda: "replica-20" in _peers(kube), "replica-20 announced", 30)
        wait_for(lambda: sandbox.store.configs("team.payments") == IN_KAFKA, "the subscription in Kafka")
        replicas[10] = Replica(kube, sandbox.bootstrap, 10, tmp_path / "replica-10.log")
        # A named peering starts paused: replica-10 stays so, seeing replica-20's higher priority.
        wait_for(lambda: "replica-10" in _peers(kube), "replica-10 announced", 30)
        # Counted once Kafka has answered, so a moment after the subscription shows there.
        wait_for(lambda: replicas[20].applied() == 1.0, "replica-20 to count the apply")
        assert replicas[10].applied() == 0.0

        replicas[20].process.send_signal(signal.SIGKILL)
        replicas[20].process.wait(timeout=10)
        assert "replica-20" in _peers(kube), "a killed replica cannot remove itself from the peering object"
        custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "payments", {"spec": {"intervalMs": 5000}})

        wait_for(lambda: sandbox.store.configs("team.payments").get("interval.ms") == "5000",
                 "the standby to apply the change", LIFETIME_S + TAKEOVER_MARGIN_S)
        wait_for(lambda: replicas[10].applied() == 1.0, "replica-10 to count the apply")
        assert "Resuming operations after the pause" in replicas[10].output()
        wait_for(lambda: _peers(kube) == {"replica-10"}, "the dead replica's entry cleaned up")
    finally:
        for replica in replicas.values():
            replica.stop()


def _ready(custom: client.CustomObjectsApi, name: str) -> tuple[str, str] | None:
    conditions = (custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name).get("status") or {}).get(
        "conditions") or []
    return next(((c["status"], c["reason"]) for c in conditions if c["type"] == "Ready"), None)


@pytest.mark.timeout(240)
def test_a_replica_paused_meanwhile_takes_no_resource_deleted_during_its_pause_for_an_owner(kube, sandbox, tmp_path):
    """kopf keeps its indexes through a pause and lists again on resuming, which brings no deletion: a resource
    deleted while a replica was paused stays in its claims. Resumed, that replica must neither call the resource that
    took over the subscription a Conflict with the deleted one, nor leave the subscription in Kafka for it when that
    resource is deleted with `deletionPolicy: Delete`; nor count a resource deleted during the pause as managed."""
    custom = client.CustomObjectsApi(config.new_client_from_config(str(kube.kubeconfig)))
    custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", {
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})
    replicas: dict[int, Replica] = {}
    try:
        replicas[10] = Replica(kube, sandbox.bootstrap, 10, tmp_path / "replica-10.log", "--drift-interval", "2")
        wait_for(lambda: "replica-10" in _peers(kube), "replica-10 announced", 30)
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
            "metadata": {"name": "payments"}, "spec": {**SPEC, "deletionPolicy": "Retain"}})
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
            "metadata": {"name": "orders"}, "spec": {**SPEC, "subscriptionName": "team.orders"}})
        wait_for(lambda: replicas[10].applied() == 2.0, "replica-10 to apply the first owner and orders")
        assert replicas[10].metric(MANAGED) == 2.0
        replicas[20] = Replica(kube, sandbox.bootstrap, 20, tmp_path / "replica-20.log", "--drift-interval", "2")
        wait_for(lambda: "Pausing operations in favour of" in replicas[10].output(), "replica-10 to pause", 60)

        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "payments")
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "orders")
        wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"],
                 "replica-20 to let the first owner and orders go")
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
            "metadata": {"name": "payments-v2"},
            "spec": {**SPEC, "subscriptionName": "team.payments", "intervalMs": 5000, "deletionPolicy": "Delete"}})
        wait_for(lambda: _ready(custom, "payments-v2") == ("True", "Applied"), "replica-20 to apply the heir")
        assert sandbox.store.configs("team.payments").get("interval.ms") == "5000"

        replicas[20].process.send_signal(signal.SIGKILL)
        replicas[20].process.wait(timeout=10)
        wait_for(lambda: "Resuming operations after the pause" in replicas[10].output(), "replica-10 to resume",
                 LIFETIME_S + TAKEOVER_MARGIN_S)
        # Its resume handler and two drift checks (every 2 s) of the new owner have had their turn (kopf's line for each
        # drift check is a DEBUG one: counted by the reconciliations that found Kafka as specified).
        resumed = replicas[10].metric(UNCHANGED)
        wait_for(lambda: replicas[10].metric(UNCHANGED) >= resumed + 3, "replica-10's drift checks after resuming")
        assert _ready(custom, "payments-v2") == ("True", "Applied"), replicas[10].output()[-3000:]
        # orders, which nothing reads for a Conflict, is found gone by the sweep of its index (two drift intervals).
        # Steadily: the first owner found gone is uncounted a moment before payments-v2 is counted.
        managed = []
        wait_for(lambda: managed.append(replicas[10].metric(MANAGED)) or managed[-6:] == [1.0] * 6,
                 "replica-10 to count only payments-v2 as managed", 30)

        # Nor is the deleted one an owner to leave the subscription to: deleting the heir (Delete) removes it.
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "payments-v2")
        wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"],
                 "replica-10 to delete the heir")
        assert sandbox.store.configs("team.payments") == {}, replicas[10].output()[-3000:]
    finally:
        for replica in replicas.values():
            replica.stop()


@pytest.mark.parametrize("cluster_wide", [True, False])
@pytest.mark.parametrize("zalando", [404, 403])
def test_a_missing_peering_object_is_reported_when_the_older_group_is_not_granted(monkeypatch, caplog, cluster_wide,
                                                                                   zalando):
    """The chart grants kopf.dev peerings only: the API server answers 403 for zalando.org's before it looks for the
    object, which says nothing about it being there; kopf.dev's 404 is what counts. A 403 on kopf.dev, the group the
    operator was granted, is not taken for missing."""
    import logging
    import threading

    from kubernetes.client.rest import ApiException

    from kcm_cli import operator as operator_cli

    answers = {"kopf.dev": 404, "zalando.org": zalando}

    class Api:
        def get_cluster_custom_object(self, group, *args, **kwargs):
            raise ApiException(status=answers[group], reason="refused")

        get_namespaced_custom_object = get_cluster_custom_object

    def warnings() -> list[str]:
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        caplog.clear()
        operator_cli._warn_while_peering_is_missing("kcm-replicas", ["team-a"], cluster_wide, stop, 0.05, 0.1)
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    monkeypatch.setattr(client, "CustomObjectsApi", lambda *args, **kwargs: Api())
    caplog.set_level(logging.DEBUG, logger="kcm.operator")
    said = warnings()
    kind = "ClusterKopfPeering kcm-replicas" if cluster_wide else "KopfPeering team-a/kcm-replicas"
    assert said and all(f"reconciles nothing until its peering object exists: {kind} not found" in line
                        for line in said), said
    answers["kopf.dev"] = 403
    assert warnings() == []
