"""Model test of `kcm operator`'s Prometheus metrics and Kubernetes Events, as docs/operator.md documents them
("## Metrics"; the events and conditions of "## What it does"): seeded random sequences of creates, edits
(intervalMs, metrics, match), deletions, pause/unpause, out-of-band changes in Kafka, a second resource naming the
same subscription (Conflict), a spec Kafka refuses (InvalidSpec) and a KafkaConnection to a closed loopback port
(KafkaUnavailable), run against the real handlers (kopf in-process, the kube emulator, the sandbox as Kafka). After
each step the documented state is waited for, then metric deltas and Events are compared with a reference model.

Exact: `applied` reconciliations (one per change sent to Kafka), drift corrections, the managed-subscriptions gauge
(resources whose Ready is True), KafkaRefused errors (none: nothing here is refused for a reason other than the
spec), the histogram's count against all reconciliations (once the operator is stopped), and Events (type, reason,
involved object; one per change of the Ready condition into a failure, one `Applied` per change sent outside a drift
check, one `Drift` per revert). Open in the docs, so only bounded: how many drift checks run while a step is waited
for (each counts `unchanged`, `failed` or `skipped` again, and the unreachable resource retries with backoff), so
those label sets are asserted >= 1 where the step makes one, 0 where no resource was in that state; and whether an
edit that leaves a failure condition's status and reason as they were posts its Warning again (the condition's
observedGeneration changes, its message may not): 0 or 1. Out-of-band changes are made only to Ready, unpaused owners
and at most three times between their own reconciles (Contested has a directed case). Directed cases: Contested,
Kafka unreachable then back, KafkaRefused (the sandbox playing a missing ACL) then granted, a refused edit set back.
"""

from __future__ import annotations

import random
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY

from kcm_common.client_metrics import ConfigError
from kcm_common.kafka import KafkaSettings
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.reconcile import DELETE, SET, Change, Op
from ports import reserved_port
import test_operator_reconcile as behaviour
from test_operator_reconcile import GROUP, NS, VERSION, Cluster

SEEDS = (2, 4, 6, 9, 12, 14)   # together: every step kind, takeovers, unpause after an edit
STEPS = 15
DRIFT_INTERVAL_S = 0.5
WAIT_S = 20.0
# docs/operator.md "The resource": the CR's match keys and the Kafka names of the client attributes (KIP-714).
MATCH_KEYS = {"clientId": "client_id", "clientSoftwareName": "client_software_name"}
METRICS = (["org.apache.kafka.producer."], ["org.apache.kafka.consumer."],
           ["org.apache.kafka.producer.", "org.apache.kafka.consumer.fetch."], ["*"])
INTERVALS = (1000, 5000, 60000, 300000)
MATCHES = (None, {"clientId": "payments-.*"}, {"clientId": "orders-.*", "clientSoftwareName": "apache-kafka-java"})
REFUSED = ({"clientId": "payments-("}, {"clientId": "orders-["})  # regexes java.util.regex rejects
KIND = "ClientMetricsSubscription"
# docs/operator.md "## Metrics": the result vocabulary; reasons are the Ready condition's, or Paused.
RESULTS = {"applied", "unchanged", "failed", "skipped"}


# --- the metrics, read from the process's default registry ------------------------------------------------------

def snapshot() -> dict[tuple[str, tuple], float]:
    """Every kcm_operator_* sample, by (sample name, sorted labels)."""
    values = {}
    for family in REGISTRY.collect():
        if family.name.startswith("kcm_operator_"):
            for sample in family.samples:
                values[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return values


def reconciliations(snap: dict) -> Tally:
    return Tally({(dict(labels)["result"], dict(labels)["reason"]): value
                  for (name, labels), value in snap.items() if name == "kcm_operator_reconciliations_total"})


def kafka_errors(snap: dict, reason: str) -> float:
    return snap.get(("kcm_operator_kafka_errors_total", (("reason", reason),)), 0.0)


def corrections(snap: dict) -> float:
    return snap.get(("kcm_operator_drift_corrections_total", ()), 0.0)


def observations(snap: dict) -> float:
    return snap.get(("kcm_operator_reconcile_duration_seconds_count", ()), 0.0)


def managed(snap: dict) -> float:
    return snap[("kcm_operator_managed_subscriptions", ())]


def delta(after: Tally, before: Tally) -> Tally:
    return Tally({key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)})


# --- the operator, as test_operator_reconcile's run_operator starts it -------------------------------------------

kube = behaviour.kube                    # the emulated Kubernetes API (fixture)
run_operator = behaviour.run_operator    # kcm's handlers through KopfRunner, for the sandbox (fixture)


@pytest.fixture
def operator(run_operator):
    """Start the operator in this process (kopf's runner) against a fresh kube emulator and the sandbox."""
    return lambda drift_interval_s: run_operator(drift_interval_s=drift_interval_s)


# --- the reference model ----------------------------------------------------------------------------------------

def in_kafka(spec: dict) -> dict[str, Any]:
    """What the docs say a spec becomes in Kafka, compared as sets (lists compare as sets)."""
    configs: dict[str, Any] = {"metrics": frozenset(spec["metrics"]), "interval.ms": str(spec["intervalMs"])}
    if spec.get("match"):
        configs["match"] = frozenset(f"{MATCH_KEYS[key]}={pattern}" for key, pattern in spec["match"].items())
    return configs


def parsed(raw: dict[str, str]) -> dict[str, Any]:
    """The sandbox's raw configs in `in_kafka`'s form."""
    configs: dict[str, Any] = {}
    for key, value in raw.items():
        configs[key] = value if key == "interval.ms" else frozenset(value.split(",")) if value else frozenset()
    return configs


def refused(spec: dict) -> str | None:
    """The pattern Kafka refuses in this spec, if any."""
    for pattern in (spec.get("match") or {}).values():
        if any(pattern in bad.values() for bad in REFUSED):
            return pattern
    return None


@dataclass
class Resource:
    name: str
    sub: str
    spec: dict
    policy: str
    down: bool = False            # names the KafkaConnection to a closed port
    uid: str = ""
    paused: bool = False
    was_paused: bool = False
    edited_while_paused: bool = False
    ready: tuple[str, str, str] = ("", "", "")   # status, reason, what its message names
    ever_applied: bool = False
    reverts: int = 0              # drift reverts since its last non-drift reconcile (Contested is kept out)


@dataclass
class Expect:
    """What one step must show beyond the cumulative model: label sets it must count at least once."""

    required: set[tuple[str, str]] = field(default_factory=set)
    before: set[tuple[str, str]] = field(default_factory=set)
    wait: list[Callable[[], str | None]] = field(default_factory=list)


class Run:
    """One seeded sequence: the cluster, the reference model, and the comparison after each step."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster, self.rng = cluster, rng
        self.resources: dict[str, Resource] = {}   # live, in creation order
        self.uids: dict[str, str] = {}              # every resource ever made
        self.kafka: dict[str, dict[str, Any]] = {}
        self.applied = 0
        self.corrections = 0
        self.events: dict[tuple[str, str, str], list[float]] = {}   # (object, type, reason) → [at least, at most]
        self.created = 0
        self.down_made = False   # one resource per sequence names the unreachable cluster
        self.admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
        self.start = snapshot()
        self.log: list[str] = []

    # model helpers

    def owner(self, sub: str) -> Resource:
        return next(r for r in self.resources.values() if r.sub == sub and not r.down)

    def label(self, r: Resource) -> tuple[str, str]:
        if r.paused:
            return ("skipped", "Paused")
        return ("unchanged", "Applied") if r.ready[0] == "True" else ("failed", r.ready[1])

    def labels(self) -> set[tuple[str, str]]:
        return {self.label(r) for r in self.resources.values()}

    def expect_event(self, name: str, kind: str, reason: str, low: int, high: float) -> None:
        bounds = self.events.setdefault((name, kind, reason), [0, 0])
        bounds[0] += low
        bounds[1] += high

    def settle(self, touched: dict[str, str], expect: Expect) -> None:
        """Every unpaused resource reconciled (by its own event, `touched`: create/edit/unpause/wake, else by a drift
        check), in creation order; `expect.required` gets the label each touched reconcile counts."""
        for r in list(self.resources.values()):
            how = touched.get(r.name)
            old = r.ready
            if r.paused:
                if r.edited_while_paused or old[1] in ("Conflict", "Contested"):
                    r.ready = ("Unknown", "Paused", "")
                if how:
                    expect.required.add(("skipped", "Paused"))
                continue
            ops = False
            if r.down:
                r.ready = ("False", "KafkaUnavailable", "")
            elif self.owner(r.sub) is not r:
                r.ready = ("False", "Conflict", f"{NS}/{self.owner(r.sub).name}")
            elif refused(r.spec):
                r.ready = ("False", "InvalidSpec", refused(r.spec))
            else:
                r.ready = ("True", "Applied", "")
                r.ever_applied = True
                want = in_kafka(r.spec)
                ops = self.kafka.get(r.sub) != want
                self.kafka[r.sub] = want
            if how:
                r.reverts = 0
            if how == "wake" and r.ready[0] == "True":
                self.log.append(f"  {r.name} takes over{' and applies' if ops else ''}")
            if ops:
                self.applied += 1
                if how is None and old[0] == "True":
                    self.corrections += 1
                    r.reverts += 1
                    self.expect_event(r.name, "Warning", "Drift", 1, 1)
                else:
                    self.expect_event(r.name, "Normal", "Applied", 1, 1)
            elif how:
                expect.required.add(self.label(r))
            if r.ready[0] == "False":
                if r.ready != old:
                    self.expect_event(r.name, "Warning", r.ready[1], 1, 1)
                elif how == "edit":   # same condition but for its observedGeneration: open in the docs
                    self.expect_event(r.name, "Warning", r.ready[1], 0, 1)

    # steps

    def new_spec(self) -> dict:
        spec = {"metrics": list(self.rng.choice(METRICS)), "intervalMs": self.rng.choice(INTERVALS)}
        match = self.rng.choice(MATCHES)
        if match:
            spec["match"] = dict(match)
        return spec

    def create(self, expect: Expect, sub: str | None = None, bad: bool = False, down: bool = False) -> None:
        name = f"r{self.created:02d}"
        self.created += 1
        spec = self.new_spec()
        if bad:
            spec["match"] = dict(self.rng.choice(REFUSED))
        policy = self.rng.choice(("Delete", "Retain"))
        r = Resource(name, sub or f"sub-{name}", spec, policy, down=down)
        body = {**spec, "subscriptionName": r.sub, "deletionPolicy": policy}
        if down:
            body["connection"] = "down"
            self.down_made = True
        r.uid = self.uids[name] = self.cluster.apply(name, body)["metadata"]["uid"]
        self.resources[name] = r
        self.log.append(f"create {name} {body}")
        self.settle({name: "create"}, expect)
        if down:
            expect.required.add(("failed", "KafkaUnavailable"))

    def edit(self, r: Resource, expect: Expect) -> None:
        owner = not r.down and self.owner(r.sub) is r
        field_name = self.rng.choice(("intervalMs", "metrics", "match"))
        if field_name == "intervalMs":
            value: Any = self.rng.choice([i for i in INTERVALS if i != r.spec["intervalMs"]])
        elif field_name == "metrics":
            value = list(self.rng.choice([m for m in METRICS if set(m) != set(r.spec["metrics"])]))
        else:
            choices = [m for m in MATCHES if m != r.spec.get("match")]
            if owner and not r.paused:
                choices += [m for m in REFUSED if m != r.spec.get("match")]
            value = self.rng.choice(choices)
        if field_name == "match":
            old = r.spec.get("match") or {}
            patch = None if value is None else {**{key: None for key in old if key not in value}, **value}
            r.spec.pop("match", None)
            if value is not None:
                r.spec["match"] = dict(value)
        else:
            patch = value
            r.spec[field_name] = value
        generation = self.cluster.patch(r.name, {"spec": {field_name: patch}})["metadata"]["generation"]
        self.log.append(f"edit {r.name} {field_name}={value} ({'paused' if r.paused else r.ready[1]})")
        expect.wait.append(lambda: None if (self.cluster.get(r.name) or {}).get("status", {}).get(
            "observedGeneration") == generation else f"{r.name} observedGeneration {generation}")
        if r.paused:
            r.edited_while_paused = True
        self.settle({r.name: "edit"}, expect)

    def delete(self, r: Resource, expect: Expect) -> None:
        heirs = [] if r.down else [h for h in self.resources.values() if h.sub == r.sub and h is not r]
        owner = not r.down and self.owner(r.sub) is r
        del self.resources[r.name]
        self.cluster.delete(r.name)
        self.log.append(f"delete {r.name} ({'owner' if owner else 'non-owner'}, {len(heirs)} heirs, {r.policy}, "
                        f"{'paused' if r.paused else r.ready[1]})")
        expect.wait.append(lambda: None if self.cluster.get(r.name) is None else f"{r.name} gone")
        if owner and heirs:   # left for the heirs, who are woken
            for heir in heirs:
                expect.wait.append(lambda heir=heir: None if "kcm.dev/owner-deleted" in (
                    (self.cluster.get(heir.name) or {}).get("metadata", {}).get("annotations") or {})
                    else f"{heir.name} marked as heir")
            self.settle({heir.name: "wake" for heir in heirs}, expect)
            return
        if owner and not r.paused and r.policy == "Delete" and r.ever_applied:
            self.kafka.pop(r.sub, None)
        self.settle({}, expect)

    def pause(self, r: Resource, expect: Expect) -> None:
        r.paused = r.was_paused = True
        self.cluster.patch(r.name, {"metadata": {"annotations": {"kcm.dev/paused": "true"}}})
        self.log.append(f"pause {r.name}")
        self.settle({r.name: "pause"}, expect)

    def unpause(self, r: Resource, expect: Expect) -> None:
        self.log.append(f"unpause {r.name} ({'edited' if r.edited_while_paused else 'unedited'})")
        r.paused = r.edited_while_paused = False
        self.cluster.patch(r.name, {"metadata": {"annotations": {"kcm.dev/paused": None}}})
        self.settle({r.name: "unpause"}, expect)

    def out_of_band(self, r: Resource, expect: Expect) -> None:
        current = self.kafka[r.sub]
        kind = self.rng.choice(("interval", "metrics", "removed"))
        if kind == "interval":
            value = str(self.rng.choice([i for i in INTERVALS if str(i) != current["interval.ms"]]))
            ops: tuple[Op, ...] = (Op("interval.ms", SET, value),)
            self.kafka[r.sub] = {**current, "interval.ms": value}
        elif kind == "metrics":
            ops = (Op("metrics", SET, "org.apache.kafka.oob."),)
            self.kafka[r.sub] = {**current, "metrics": frozenset({"org.apache.kafka.oob."})}
        else:
            ops = tuple(Op(key, DELETE) for key in sorted(current))
            del self.kafka[r.sub]
        assert self.admin.alter([Change(r.sub, "update", ops)]) == {r.sub: None}
        self.log.append(f"out-of-band {r.sub} {kind}")
        self.settle({}, expect)

    def step(self) -> None:
        live = list(self.resources.values())
        default = [r for r in live if not r.down]
        choices: list[Callable[[Expect], None]] = []
        if len(live) < 6:
            choices += [self.create] * 3 + [lambda e: self.create(e, bad=True)]
            if not self.down_made:
                choices.append(lambda e: self.create(e, down=True))
        if default and len(live) < 7:
            choices += [lambda e: self.create(e, sub=self.rng.choice(default).sub)] * 2
        for r in live:
            choices += [lambda e, r=r: self.edit(r, e)] * 2
            choices.append(lambda e, r=r: self.delete(r, e))
            choices += [lambda e, r=r: self.unpause(r, e)] * 3 if r.paused else [lambda e, r=r: self.pause(r, e)]
            if not r.paused and r.ready[0] == "True" and r.reverts < 3:
                choices += [lambda e, r=r: self.out_of_band(r, e)] * 2
        expect = Expect(before=self.labels())
        before = snapshot()
        self.rng.choice(choices)(expect)
        self.check(before, expect)

    # comparison

    def observed_events(self) -> Tally:
        seen = Tally()
        for event in self.cluster.kube.objects("events", NS).values():
            involved = event.get("involvedObject") or {}
            if involved.get("kind") != KIND:
                continue
            assert involved.get("uid") == self.uids.get(involved.get("name")), (event, self.log)
            seen[involved["name"], event["type"], event["reason"]] += 1
        return seen

    def mismatch(self, before: dict, expect: Expect) -> str | None:
        """What still differs from the documented state the step leads to (None: all there)."""
        for r in self.resources.values():
            obj = self.cluster.get(r.name) or {}
            conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}
            ready = conditions.get("Ready", {})
            if (ready.get("status"), ready.get("reason")) != r.ready[:2] or r.ready[2] not in ready.get("message", ""):
                return f"{r.name} Ready {ready.get('status')}/{ready.get('reason')} {ready.get('message')!r}, " \
                       f"want {r.ready}"
            paused = conditions.get("Paused", {})
            if r.was_paused and (paused.get("status"), paused.get("reason")) != (
                    ("True", "Paused") if r.paused else ("False", "Reconciling")):
                return f"{r.name} Paused {paused.get('status')}/{paused.get('reason')}, paused={r.paused}"
        store = self.cluster.sandbox.store
        actual = {name: parsed(store.configs(name)) for name in store.names()}
        if actual != self.kafka:
            return f"Kafka {actual}, want {self.kafka}"
        for why in (check() for check in expect.wait):
            if why:
                return why
        seen = self.observed_events()
        for key, (low, _) in self.events.items():
            if seen[key] < low:
                return f"event {key}: {seen[key]} < {low}"
        now = snapshot()
        counted = delta(reconciliations(now), reconciliations(before))
        for label in expect.required:
            if counted[label] < 1:
                return f"no reconciliation counted as {label}"
        if reconciliations(now)[("applied", "Applied")] - reconciliations(self.start)[("applied", "Applied")] \
                < self.applied:
            return "applied count"
        if corrections(now) - corrections(self.start) < self.corrections:
            return "drift corrections"
        if any(r.down for r in self.resources.values()) and (
                kafka_errors(now, "KafkaUnavailable") <= kafka_errors(self.start, "KafkaUnavailable")):
            return "no KafkaUnavailable error counted"
        return None

    def check(self, before: dict, expect: Expect) -> None:
        deadline = time.monotonic() + WAIT_S
        while (why := self.mismatch(before, expect)) is not None:
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for: {why}\nsteps: {self.log}")
            time.sleep(0.05)
        now = snapshot()
        where = f"after {self.log[-1]!r} (steps: {self.log})"
        counted = delta(reconciliations(now), reconciliations(before))
        allowed = expect.before | self.labels() | expect.required | {("applied", "Applied")}
        assert {label for label, value in counted.items() if value} <= allowed, (counted, allowed, where)
        assert all(result in RESULTS for result, _ in counted), where
        assert all(result != "skipped" or reason == "Paused" for result, reason in counted), where
        assert reconciliations(now)[("applied", "Applied")] - reconciliations(self.start)[("applied", "Applied")] \
            == self.applied, where
        assert corrections(now) - corrections(self.start) == self.corrections, where
        assert managed(now) == sum(r.ready[0] == "True" for r in self.resources.values()), where
        assert kafka_errors(now, "KafkaRefused") == kafka_errors(before, "KafkaRefused"), where
        moved = {dict(labels)["reason"] for (name, labels), value in now.items()
                 if name == "kcm_operator_kafka_errors_total" and value != before.get((name, labels), 0.0)}
        assert moved <= {"KafkaUnavailable"}, (moved, where)   # Kafka errors only: nothing here is KafkaRefused
        if not any(label == ("failed", "KafkaUnavailable") for label in expect.before | self.labels()):
            assert kafka_errors(now, "KafkaUnavailable") == kafka_errors(before, "KafkaUnavailable"), where
        self.check_events(where)

    def check_events(self, where: str) -> None:
        seen = self.observed_events()
        for key, count in seen.items():
            low, high = self.events.get(key, (0, 0))
            assert low <= count <= high, (key, count, (low, high), where)

    def finish(self) -> None:
        """The operator stopped: every reconciliation observed once in the histogram; no late Event."""
        time.sleep(0.3)   # kopf posts events from a queue of its own
        self.cluster.stop()
        self.admin.close()
        end = snapshot()
        self.check_events("at the end")
        total = sum(delta(reconciliations(end), reconciliations(self.start)).values())
        assert total > 0
        assert observations(end) - observations(self.start) == total


def _connection(cluster: Cluster, name: str, spec: dict) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaConnection",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", body)


@pytest.mark.parametrize("seed", SEEDS)
def test_metrics_and_events_follow_the_model_over_random_sequences(operator, seed):
    with reserved_port() as port:   # refusing connections: Kafka unreachable for resources naming "down"
        cluster = operator(DRIFT_INTERVAL_S)
        _connection(cluster, "down", {"bootstrapServers": f"127.0.0.1:{port}"})
        run = Run(cluster, random.Random(seed))
        for _ in range(STEPS):
            run.step()
        run.finish()


def test_a_fourth_change_within_eight_drift_checks_is_contested_with_one_warning_and_no_revert(operator):
    """Three reverts (three Drift warnings, three corrections, three `applied`), then the fourth change found is
    left alone: Ready=False Contested, one Warning `Contested`, `failed`/`Contested` counted; a spec change ends it."""
    cluster = operator(1.0)
    start = snapshot()
    cluster.apply("fought", {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000,
                             "subscriptionName": "fought"})
    cluster.wait_condition("fought", "True", "Applied")
    admin = SubscriptionAdmin(KafkaSettings(cluster.sandbox.bootstrap))
    try:
        for number in range(1, 4):
            admin.alter([Change("fought", "update", (Op("interval.ms", SET, str(1000 * number)),))])
            wait_until(lambda: len(cluster.events("Drift")) == number
                       and cluster.kafka("fought").get("interval.ms") == "60000", f"revert {number}")
        admin.alter([Change("fought", "update", (Op("interval.ms", SET, "4000"),))])
        cluster.wait_condition("fought", "False", "Contested")
        held = snapshot()
        wait_until(lambda: reconciliations(snapshot())[("failed", "Contested")]
                   > reconciliations(held)[("failed", "Contested")], "a later drift check, held")
    finally:
        admin.close()
    time.sleep(0.3)
    now = snapshot()
    counted = delta(reconciliations(now), reconciliations(start))
    assert cluster.kafka("fought")["interval.ms"] == "4000"
    assert counted[("applied", "Applied")] == 4    # the creation and three reverts
    assert corrections(now) - corrections(start) == 3
    assert managed(now) == 0
    assert [e["type"] for e in cluster.events("Drift")] == ["Warning"] * 3
    assert [(e["type"], e["involvedObject"]["name"]) for e in cluster.events("Contested")] == [("Warning", "fought")]

    cluster.patch("fought", {"spec": {"intervalMs": 5000}})
    cluster.wait_condition("fought", "True", "Applied")
    wait_until(lambda: cluster.kafka("fought").get("interval.ms") == "5000", "the edit in Kafka")
    end = snapshot()
    assert reconciliations(end)[("applied", "Applied")] - reconciliations(now)[("applied", "Applied")] == 1
    assert corrections(end) == corrections(now) and managed(end) == 1
    wait_until(lambda: len(cluster.events("Applied")) == 2, "the edit's Applied event")
    assert len(cluster.events("Contested")) == 1


def test_a_refused_edit_set_back_is_ready_again_with_nothing_sent(operator):
    """InvalidSpec leaves Kafka untouched, so setting the spec back finds it as specified: Ready (the gauge counts it
    again), `unchanged`, no `applied` and no second Applied event; one Warning for the refusal."""
    cluster = operator(DRIFT_INTERVAL_S)
    start = snapshot()
    cluster.apply("back", {"metrics": ["*"], "intervalMs": 60000, "match": {"clientId": "payments-.*"}})
    cluster.wait_condition("back", "True", "Applied")
    applied = snapshot()
    cluster.patch("back", {"spec": {"match": {"clientId": "payments-("}}})
    cluster.wait_condition("back", "False", "InvalidSpec")
    refused_now = snapshot()
    cluster.patch("back", {"spec": {"match": {"clientId": "payments-.*"}}})
    cluster.wait_condition("back", "True", "Applied")
    end = snapshot()
    counted = delta(reconciliations(end), reconciliations(applied))
    assert cluster.kafka("team.back") == {"metrics": "*", "interval.ms": "60000", "match": "client_id=payments-.*"}
    assert delta(reconciliations(applied), reconciliations(start))[("applied", "Applied")] == 1
    assert counted[("applied", "Applied")] == 0 and counted[("failed", "InvalidSpec")] >= 1
    assert counted[("unchanged", "Applied")] >= 1
    assert (managed(applied), managed(refused_now), managed(end)) == (1, 0, 1)
    time.sleep(0.3)   # kopf posts events from a queue of its own
    assert [e["type"] for e in cluster.events("InvalidSpec")] == ["Warning"]
    assert len(cluster.events("Applied")) == 1


def test_kafka_unreachable_then_back_counts_its_errors_and_posts_one_warning_then_applied(operator, sandbox_factory):
    """KafkaUnavailable: `failed`/KafkaUnavailable and kafka_errors{KafkaUnavailable} counted (retries: at least
    once), one Warning while the condition stays; recovering by itself is one `applied` and a Normal `Applied`."""
    start = snapshot()
    with reserved_port() as port:   # refusing connections until a sandbox listens there
        cluster = operator(DRIFT_INTERVAL_S)
        _connection(cluster, "later", {"bootstrapServers": f"127.0.0.1:{port}"})
        cluster.apply("away", {"metrics": ["*"], "intervalMs": 60000, "connection": "later"})
        cluster.wait_condition("away", "False", "KafkaUnavailable")
        down = snapshot()
        wait_until(lambda: reconciliations(snapshot())[("failed", "KafkaUnavailable")]
                   > reconciliations(down)[("failed", "KafkaUnavailable")], "a retry")
        during = snapshot()
        later = sandbox_factory(listen=("127.0.0.1", port))
    cluster.wait_condition("away", "True", "Applied")
    wait_until(lambda: cluster.events("Applied"), "the Applied event")
    end = snapshot()
    counted = delta(reconciliations(end), reconciliations(start))
    assert later.store.configs("team.away") == {"metrics": "*", "interval.ms": "60000"}
    assert kafka_errors(during, "KafkaUnavailable") - kafka_errors(start, "KafkaUnavailable") >= 2
    assert kafka_errors(end, "KafkaRefused") == kafka_errors(start, "KafkaRefused")
    assert counted[("failed", "KafkaUnavailable")] >= 2 and counted[("applied", "Applied")] == 1
    assert set(counted) <= {("failed", "KafkaUnavailable"), ("applied", "Applied"), ("unchanged", "Applied")}
    assert managed(during) == 0 and managed(end) == 1
    assert [e["type"] for e in cluster.events("KafkaUnavailable")] == ["Warning"]
    assert [(e["type"], e["involvedObject"]["name"]) for e in cluster.events("Applied")] == [("Normal", "away")]


def test_kafka_refusing_for_a_reason_other_than_the_spec_is_kafka_refused_then_granted(operator, monkeypatch):
    """KafkaRefused (the operator's user lacks the ACL: CLUSTER_AUTHORIZATION_FAILED, played by the sandbox's
    store): counted as `failed`/KafkaRefused and in kafka_errors{KafkaRefused}, one Warning; granting it is enough."""
    cluster = operator(DRIFT_INTERVAL_S)
    store = cluster.sandbox.store

    def unauthorized(*args: Any, **kwargs: Any) -> None:
        raise ConfigError(31, "Cluster authorization failed.")   # CLUSTER_AUTHORIZATION_FAILED
    monkeypatch.setattr(store, "incremental_alter", unauthorized)
    start = snapshot()
    cluster.apply("denied", {"metrics": ["*"], "intervalMs": 60000})
    cluster.wait_condition("denied", "False", "KafkaRefused")
    refusing = snapshot()
    wait_until(lambda: reconciliations(snapshot())[("failed", "KafkaRefused")]
               > reconciliations(refusing)[("failed", "KafkaRefused")], "a retry")
    during = snapshot()
    monkeypatch.undo()   # the ACL granted
    cluster.wait_condition("denied", "True", "Applied")
    wait_until(lambda: cluster.events("Applied"), "the Applied event")
    end = snapshot()
    counted = delta(reconciliations(end), reconciliations(start))
    assert kafka_errors(during, "KafkaRefused") - kafka_errors(start, "KafkaRefused") >= 2
    assert kafka_errors(end, "KafkaUnavailable") == kafka_errors(start, "KafkaUnavailable")
    assert counted[("failed", "KafkaRefused")] >= 2 and counted[("applied", "Applied")] == 1
    assert set(counted) <= {("failed", "KafkaRefused"), ("applied", "Applied"), ("unchanged", "Applied")}
    assert managed(during) == 0 and managed(end) == 1
    assert [e["type"] for e in cluster.events("KafkaRefused")] == ["Warning"]
    assert [(e["type"], e["involvedObject"]["name"]) for e in cluster.events("Applied")] == [("Normal", "denied")]


def test_kafka_errors_are_exposed_with_the_documented_reasons_only():
    reasons = {dict(labels)["reason"] for name, labels in snapshot() if name == "kcm_operator_kafka_errors_total"}
    assert reasons <= {"KafkaUnavailable", "KafkaRefused"}


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
