"""Model-based test of what the operator writes on a KafkaConnection's status: seeded random sequences of
KafkaConnection and ClientMetricsSubscription edits against a reference written from docs/operator.md ("##
KafkaConnection": the paragraph "The operator says on each KafkaConnection's status what the subscriptions naming
it found through it", and the "Errors" list it refers to) and the printer columns / status schema of
crds/kafkaconnections.kcm.dev.yaml (`Cluster` = `.status.clusterId`, `Ready` and `Reason` of the Ready condition),
not from the code.

The real thing runs: kcm's kopf handlers in-process (KopfRunner, `test_operator_reconcile.run_operator`) against
the emulated Kubernetes API (tests/kube_emulator.py), with the sandbox (embedded Kafka + KIP-714 gateway) as the
cluster a good connection reaches, and a bound, never-listening loopback port as one nothing answers at.

The reference, per KafkaConnection:
- no subscription names it (from its creation, or once the last one went or moved away, also while the operator
  was down): `Ready` `Unknown`, reason `Unused`;
- some name it and Kafka answered through it: `True`, `Connected`, `clusterId` the sandbox's cluster id; a spec
  Kafka refuses (a match regex java.util.regex rejects) is the subscription's own `InvalidSpec`, not the
  connection's;
- some name it and reading its Secret (missing, or without the key) or reaching Kafka failed: `False` with the
  reason and message of a subscription naming it (`InvalidSpec` naming the Secret or key, `KafkaUnavailable`
  naming the address), `clusterId` still the cluster last reached (absent when never reached);
- `observedGeneration`: the connection's generation last read (absent when never read); read by every reconcile
  of a subscription naming it, and by drift checks once per drift interval (while Unused also the current one: the
  operator watches it);
- the condition's `lastTransitionTime` stays while its status stays (also across an operator restart, which starts
  from what the status says), and a report that changes nothing is not written (the object's resourceVersion
  stays), also across a restart.

After each step the test polls (with a deadline) until every KafkaConnection's status is what the reference says,
then checks the transition times. Each seed is one long sequence ending with a quiet period (no status write at
all: a spy on the client's status patch counts writes that change nothing) and a restart; failures name the seed
and the step and show the trace. Directed cases: a subscription moved by an edit of spec.connection (where the API
server does not check the CRD's CEL rules), GitOps order (subscription before connection, Secret fixed by an edit),
and a restart over an Unused, a False and a Connected connection.

Where the code was found to differ from the docs (both mended with this test): a subscription whose reconcile never
succeeded, moved to another connection by an edit, left the old connection False instead of Unused; and a
restarted operator wrote an unchanged Unused or False status again (an Unused one without its condition's
observedGeneration).
"""

from __future__ import annotations

import base64
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

import test_operator_reconcile as behaviour
from ports import reserved_port

kube = behaviour.kube                    # the emulated Kubernetes API (fixture)
run_operator = behaviour.run_operator    # kcm's handlers through KopfRunner, for the sandbox (fixture)
operator_logs = behaviour.operator_logs  # a failing test shows kopf's and kcm's INFO lines

GROUP, VERSION, NS = "kcm.dev", "v1alpha1", behaviour.NS
CONNECTIONS, SUBSCRIPTIONS = "kafkaconnections", "clientmetricssubscriptions"
SEEDS = (5, 11, 23)
STEPS = 16
DRIFT_S = 1.0        # drift checks read a KafkaConnection at most once per interval: an edit is seen within two
STEP_DEADLINE_S = 20.0
CONNECTION_NAMES = ("c1", "c2", "c3")
SUBSCRIPTION_NAMES = ("s1", "s2", "s3", "s4")
KINDS = ("good", "closed", "no-secret", "no-key")
PARTIAL_SECRET = "partial"   # holds `username` only: "Secret ... has no key 'password'"
BAD_REGEX = "payments-("     # java.util.regex refuses it; the CRD cannot tell (docs: InvalidSpec, Kafka's message)


def connection_spec(kind: str, sandbox: str, closed: str) -> dict:
    """The spec of a connection of `kind`, as a merge patch (so it also turns one kind into another)."""
    if kind == "good":
        return {"bootstrapServers": sandbox, "securityProtocol": "PLAINTEXT", "sasl": None}
    if kind == "closed":
        return {"bootstrapServers": closed, "securityProtocol": "PLAINTEXT", "sasl": None}
    secret = "absent" if kind == "no-secret" else PARTIAL_SECRET
    return {"bootstrapServers": sandbox, "securityProtocol": "SASL_PLAINTEXT",
            "sasl": {"mechanism": "PLAIN", "secretRef": {"name": secret}}}


# -- the reference -------------------------------------------------------------------------------------------------

@dataclass
class Conn:
    kind: str
    generation: int                  # metadata.generation as the API server answered the last write (an input)
    read: int | None = None          # the generation last read by a subscription's reconcile
    reached: str | None = None       # the cluster last reached through it
    shown: str | None = None         # the Ready status at the end of the previous step
    since: str | None = None         # its lastTransitionTime then
    passed_unused: bool = False      # its only user was deleted and made again within the step: Unused in between


@dataclass
class Sub:
    connection: str | None
    bad_regex: bool


@dataclass
class Model:
    cluster_id: str
    conns: dict[str, Conn] = field(default_factory=dict)
    subs: dict[str, Sub] = field(default_factory=dict)

    def users(self, name: str) -> list[str]:
        return [sub for sub, spec in self.subs.items() if spec.connection == name]

    def expected(self, name: str) -> dict[str, Any]:
        """The documented status of connection `name` once everything reconciled."""
        conn = self.conns[name]
        if not self.users(name):
            # "the connection's generation last read": by a reconcile (the docs' reading of it); its watch sees it too,
            # so the current generation is accepted as well.
            return {"status": "Unknown", "reason": "Unused", "clusterId": conn.reached,
                    "observedGeneration": {conn.read, conn.generation}}
        reached = self.cluster_id if conn.kind == "good" else conn.reached
        if conn.kind == "good":   # Kafka answered: whatever it refuses for one subscription is that one's own
            return {"status": "True", "reason": "Connected", "clusterId": reached,
                    "observedGeneration": conn.generation}
        reason = "KafkaUnavailable" if conn.kind == "closed" else "InvalidSpec"
        return {"status": "False", "reason": reason, "clusterId": reached, "observedGeneration": conn.generation}

    def settled(self) -> None:
        """What the connections hold once a step's state is reached: generations read, clusters reached."""
        for name, conn in self.conns.items():
            if self.users(name):
                conn.read = conn.generation
                if conn.kind == "good":
                    conn.reached = self.cluster_id


# -- the world as the operator wrote it ----------------------------------------------------------------------------

class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def connection(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, CONNECTIONS, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def ready(self, obj: dict | None) -> dict:
        status = (obj or {}).get("status") or {}
        (ready,) = [c for c in status.get("conditions") or () if c.get("type") == "Ready"] or [{}]
        return {"status": ready.get("status"), "reason": ready.get("reason"), "message": ready.get("message"),
                "lastTransitionTime": ready.get("lastTransitionTime"), "clusterId": status.get("clusterId"),
                "observedGeneration": status.get("observedGeneration"),
                "resourceVersion": (obj or {}).get("metadata", {}).get("resourceVersion")}

    def sub_ready(self, name: str) -> dict:
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, SUBSCRIPTIONS, name)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})


def mismatches(model: Model, kube: Kube, closed: str) -> list[str]:
    """Every documented field of every connection's status that differs from the reference."""
    wrong = []
    for name in model.conns:
        obj = kube.connection(name)
        if obj is None:
            wrong.append(f"{name}: missing")
            continue
        seen, want = kube.ready(obj), model.expected(name)
        for key, value in want.items():
            if seen[key] not in (value if isinstance(value, set) else {value}):
                wrong.append(f"{name}: {key} is {seen[key]!r}, want {value!r}")
        if want["status"] == "False":
            # "False with the subscriptions' reason and message": a subscription naming it says the same.
            said = [kube.sub_ready(sub) for sub in model.users(name)]
            if not any(c.get("reason") == want["reason"] and c.get("message") == seen["message"] for c in said):
                wrong.append(f"{name}: message {seen['message']!r} is no subscription's: {said}")
            key_words = {"closed": closed, "no-secret": f"Secret {NS}/absent does not exist",
                         "no-key": f"Secret {NS}/{PARTIAL_SECRET} has no key 'password'"}[model.conns[name].kind]
            if key_words not in (seen["message"] or ""):
                wrong.append(f"{name}: message {seen['message']!r} does not say {key_words!r}")
        if not seen["lastTransitionTime"]:
            wrong.append(f"{name}: no lastTransitionTime")
    return wrong


def settle(model: Model, kube: Kube, closed: str, trace: list[str],
           within_s: float = STEP_DEADLINE_S) -> dict[str, dict]:
    deadline = time.monotonic() + within_s
    while True:
        wrong = mismatches(model, kube, closed)
        if not wrong:
            break
        if time.monotonic() > deadline:
            pytest.fail("not as documented after %g s:\n  %s\ntrace:\n  %s" % (
                within_s, "\n  ".join(wrong), "\n  ".join(trace[-12:])))
        time.sleep(0.1)
    model.settled()
    return {name: kube.ready(kube.connection(name)) for name in model.conns}


def check_transitions(model: Model, seen: dict[str, dict], trace: list[str]) -> None:
    """The condition's lastTransitionTime stays while its status stays, and moves (never back) when it changes."""
    for name, conn in model.conns.items():
        now = seen[name]
        if conn.shown is not None and conn.shown == now["status"] and not conn.passed_unused:
            assert now["lastTransitionTime"] == conn.since, (
                f"{name}: Ready stayed {conn.shown} but lastTransitionTime moved {conn.since} -> "
                f"{now['lastTransitionTime']}\n  " + "\n  ".join(trace[-6:]))
        elif conn.shown is not None:
            assert now["lastTransitionTime"] >= conn.since, (name, conn.since, now)
        conn.shown, conn.since, conn.passed_unused = now["status"], now["lastTransitionTime"], False


@pytest.fixture
def status_writes(monkeypatch) -> list[tuple[str, dict]]:
    """The KafkaConnections whose status the operator patches, and the patches, in order (a spy on the kubernetes
    client's status patch; a write that changes nothing leaves no trace on the object, so it is counted here)."""
    writes: list[tuple[str, dict]] = []
    patch = client.CustomObjectsApi.patch_namespaced_custom_object_status

    def spy(self, group, version, namespace, plural, name, body, **kwargs):
        if plural == CONNECTIONS:
            writes.append((name, body))
        return patch(self, group, version, namespace, plural, name, body, **kwargs)

    monkeypatch.setattr(client.CustomObjectsApi, "patch_namespaced_custom_object_status", spy)
    return writes


# -- the driver ----------------------------------------------------------------------------------------------------

class Driver:
    def __init__(self, kube: Kube, model: Model, sandbox: str, closed: str) -> None:
        self.kube, self.model, self.sandbox, self.closed = kube, model, sandbox, closed
        self.trace: list[str] = []
        self.stop = lambda: None   # stops the operator (set by the test)

    def create_connection(self, name: str, kind: str) -> None:
        spec = {k: v for k, v in connection_spec(kind, self.sandbox, self.closed).items() if v is not None}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaConnection",
                "metadata": {"name": name, "namespace": NS}, "spec": spec}
        made = self.kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, CONNECTIONS, body)
        self.model.conns[name] = Conn(kind, made["metadata"]["generation"])

    def edit_connection(self, name: str, kind: str) -> None:
        made = self.kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, CONNECTIONS, name, {"spec": connection_spec(kind, self.sandbox, self.closed)})
        conn = self.model.conns[name]
        conn.kind, conn.generation = kind, made["metadata"]["generation"]

    def delete_connection(self, name: str) -> None:
        self.kube.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, CONNECTIONS, name)
        del self.model.conns[name]

    def create_subscription(self, name: str, connection: str | None, bad_regex: bool) -> None:
        spec = {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000, "deletionPolicy": "Retain",
                "match": {"clientId": BAD_REGEX if bad_regex else "payments-.*"}}
        if connection:
            spec["connection"] = connection
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
                "metadata": {"name": name, "namespace": NS}, "spec": spec}
        self.kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, SUBSCRIPTIONS, body)
        self.model.subs[name] = Sub(connection, bad_regex)

    def edit_subscription(self, name: str, connection: str | None, bad_regex: bool) -> None:
        # Re-pointing is refused by the CRD's CEL rule on a real API server (there: delete and create); the emulator
        # lets it through, and the docs say what "moved to another one" does to the connection left.
        self.kube.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, SUBSCRIPTIONS, name, {"spec": {
            "connection": connection, "match": {"clientId": BAD_REGEX if bad_regex else "payments-.*"}}})
        self.model.subs[name] = Sub(connection, bad_regex)

    def delete_subscription(self, name: str, finalizer_by_hand: bool = False) -> None:
        if finalizer_by_hand:   # no operator runs: as an admin would let it go
            self.kube.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, SUBSCRIPTIONS, name,
                                                            {"metadata": {"finalizers": None}})
        self.kube.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, SUBSCRIPTIONS, name)
        del self.model.subs[name]
        deadline = time.monotonic() + STEP_DEADLINE_S
        while self.kube.sub_ready(name) or self._exists(name):
            assert time.monotonic() < deadline, f"subscription {name} (deletionPolicy Retain) was not let go"
            time.sleep(0.05)

    def _exists(self, name: str) -> bool:
        try:
            self.kube.custom.get_namespaced_custom_object(GROUP, VERSION, NS, SUBSCRIPTIONS, name)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def random_step(self, rng: random.Random) -> str:
        model = self.model
        choices = []
        absent = [n for n in CONNECTION_NAMES if n not in model.conns]
        present = sorted(model.conns)
        if absent:
            choices += ["create-connection"] * 3
        if present:
            choices += ["edit-connection"] * 3 + ["delete-connection"]
        if len(model.subs) < len(SUBSCRIPTION_NAMES):
            choices += ["create-subscription"] * 3
        if model.subs:
            choices += ["edit-subscription"] * 2 + ["move-subscription"] * 3 + ["delete-subscription"] * 2
        action = rng.choice(choices)
        # Any name, None (the default cluster) included: GitOps may create a subscription before its connection.
        target_connection = (lambda: rng.choice(present + present + list(CONNECTION_NAMES) + [None]))
        if action == "create-connection":
            name, kind = rng.choice(absent), rng.choice(KINDS)
            self.create_connection(name, kind)
            return f"create KafkaConnection {name} ({kind})"
        if action == "edit-connection":
            name, kind = rng.choice(present), rng.choice(KINDS)
            self.edit_connection(name, kind)
            return f"edit KafkaConnection {name} -> {kind}"
        if action == "delete-connection":
            name = rng.choice(present)
            self.delete_connection(name)
            return f"delete KafkaConnection {name}"
        if action == "create-subscription":
            name = rng.choice([n for n in SUBSCRIPTION_NAMES if n not in model.subs])
            connection, bad = target_connection(), rng.random() < 0.25
            self.create_subscription(name, connection, bad)
            return f"create subscription {name} -> {connection} bad_regex={bad}"
        if action == "edit-subscription":   # its regex, on the same connection
            name = rng.choice(sorted(model.subs))
            connection, bad = model.subs[name].connection, not model.subs[name].bad_regex
            self.edit_subscription(name, connection, bad)
            return f"edit subscription {name} bad_regex={bad}"
        if action == "move-subscription":   # as where the CRD's CEL rules hold: delete, then create elsewhere
            name = rng.choice(sorted(model.subs))
            connection, bad = target_connection(), model.subs[name].bad_regex
            left = model.subs[name].connection
            if left in model.conns and model.users(left) == [name]:
                model.conns[left].passed_unused = True
            self.delete_subscription(name)
            self.create_subscription(name, connection, bad)
            return f"move subscription {name} -> {connection} (delete, create) bad_regex={bad}"
        name = rng.choice(sorted(model.subs))
        self.delete_subscription(name)
        return f"delete subscription {name}"


@pytest.mark.parametrize("seed", SEEDS)
def test_connection_status_follows_the_documented_model(run_operator, status_writes, seed):
    rng = random.Random(seed)
    with reserved_port() as port:   # bound, never listening: connecting is refused
        closed = f"127.0.0.1:{port}"
        cluster = run_operator(drift_interval_s=DRIFT_S)
        kube = Kube(cluster.api_client)
        kube.core.create_namespaced_secret(NS, {"metadata": {"name": PARTIAL_SECRET},
                                                "data": {"username": base64.b64encode(b"kcm").decode()}})
        model = Model(cluster.sandbox.broker.cluster_id)
        driver = Driver(kube, model, cluster.sandbox.bootstrap, closed)
        trace = driver.trace

        # Directed start: one never named, one reached by a subscription whose regex Kafka refuses (its own problem).
        driver.create_connection("c1", "closed")
        driver.create_connection("c2", "good")
        trace.append("create c1 (closed, never named), c2 (good)")
        check_transitions(model, settle(model, kube, closed, trace), trace)
        driver.create_subscription("s1", "c2", bad_regex=True)
        trace.append("create s1 -> c2 with a regex Kafka refuses")
        check_transitions(model, settle(model, kube, closed, trace), trace)

        for step in range(STEPS):
            trace.append(f"seed {seed} step {step}: {driver.random_step(rng)}")
            check_transitions(model, settle(model, kube, closed, trace), trace)

        # Quiet: every drift check reports again what the status says; nothing is written.
        before = settle(model, kube, closed, trace)
        time.sleep(0.5)   # a write under way as the state was reached
        del status_writes[:]
        time.sleep(3 * DRIFT_S)
        after = {name: kube.ready(kube.connection(name)) for name in model.conns}
        assert after == before and status_writes == [], (
            f"unchanged reports were written ({status_writes}):\n{before}\n{after}\n" + "\n".join(trace[-6:]))

        # Restart: while no operator runs, the last subscription naming a used connection goes (its finalizer
        # removed by hand) and a connection is made; the new operator says Unused for both and leaves every other
        # status as it was (same transition time, not written again).
        cluster.stop()
        used = sorted({sub.connection for sub in model.subs.values() if sub.connection in model.conns})
        gone_user = None
        for name in used:
            (only, *others) = model.users(name)
            if not others:
                driver.delete_subscription(only, finalizer_by_hand=True)
                gone_user = name
                break
        for name in CONNECTION_NAMES:
            if name not in model.conns:
                driver.create_connection(name, rng.choice(KINDS))
                break
        trace.append(f"restart; while down: last user of {gone_user} deleted, connections now {sorted(model.conns)}")
        del status_writes[:]
        run_operator(drift_interval_s=DRIFT_S)
        settle(model, kube, closed, trace)
        time.sleep(2 * DRIFT_S)   # every resource resumed and checked once more
        seen = settle(model, kube, closed, trace)
        # What the restart found unchanged is not written at all, whatever it says.
        rewritten = [(name, body) for name, body in status_writes if name in before and name != gone_user]
        assert not rewritten, f"unchanged status written again after the restart: {rewritten}, was {before}"
        check_transitions(model, seen, trace)
        for name, status in before.items():
            if name in seen and name != gone_user:
                assert seen[name] == status, f"{name}: written again after the restart, unchanged: {status} -> " \
                                             f"{seen[name]}"


def _directed(run_operator, closed: str) -> tuple[Driver, Model, Kube, list[str]]:
    cluster = run_operator(drift_interval_s=DRIFT_S)
    kube = Kube(cluster.api_client)
    model = Model(cluster.sandbox.broker.cluster_id)
    driver = Driver(kube, model, cluster.sandbox.bootstrap, closed)
    driver.stop = cluster.stop
    return driver, model, kube, driver.trace


@pytest.mark.parametrize("old_kind, to", [
    ("good", "c2"), ("good", None), ("closed", "c2"),
    ("no-secret", None)])
def test_a_subscription_moved_by_an_edit_leaves_its_old_connection_unused(run_operator, old_kind, to):
    """docs/operator.md: "Once no subscription names a KafkaConnection any more (deleted, or moved to another one)";
    its status says Unused "once the last one went". Where the API server does not check the CRD's CEL rules the
    move is an edit of spec.connection; the old connection may have worked (applied) or not."""
    with reserved_port() as port:
        closed = f"127.0.0.1:{port}"
        driver, model, kube, trace = _directed(run_operator, closed)
        driver.create_connection("c1", old_kind)
        driver.create_connection("c2", "good")
        driver.create_subscription("s1", "c1", bad_regex=False)
        trace.append(f"c1 ({old_kind}), c2 (good), s1 -> c1")
        check_transitions(model, settle(model, kube, closed, trace), trace)
        driver.edit_subscription("s1", to, bad_regex=False)
        trace.append(f"s1 edited: connection -> {to}")
        # Unused is said at once (the handler of the edit retires it); 10 s leave a loaded machine room.
        check_transitions(model, settle(model, kube, closed, trace, within_s=10.0), trace)


def test_a_connection_named_before_it_exists_then_fixed_and_broken(run_operator):
    """GitOps order: the subscription first (its connection missing), then the connection naming a Secret that is
    not there (InvalidSpec), then a Secret without the key, then fixed (Connected, clusterId), then nothing answers
    at its address (False, clusterId kept), then fixed again; a second subscription refused by Kafka's regex changes
    nothing on it; every False→False keeps the transition time."""
    with reserved_port() as port:
        closed = f"127.0.0.1:{port}"
        driver, model, kube, trace = _directed(run_operator, closed)
        kube.core.create_namespaced_secret(NS, {"metadata": {"name": PARTIAL_SECRET},
                                                "data": {"username": base64.b64encode(b"kcm").decode()}})
        driver.create_subscription("s1", "c1", bad_regex=False)
        time.sleep(2 * DRIFT_S)
        driver.create_connection("c1", "no-secret")
        trace.append("s1 -> c1, then c1 created naming a missing Secret")
        for step in ("no-key", "good", "bad-regex", "closed", "good"):
            if step == "bad-regex":
                driver.create_subscription("s2", "c1", bad_regex=True)
            else:
                driver.edit_connection("c1", step)
            trace.append(f"then {step}")
            check_transitions(model, settle(model, kube, closed, trace), trace)
        deadline = time.monotonic() + STEP_DEADLINE_S   # its own problem, once its backoff from "closed" is over
        while kube.sub_ready("s2").get("reason") != "InvalidSpec":
            assert time.monotonic() < deadline, kube.sub_ready("s2")
            time.sleep(0.1)
        assert mismatches(model, kube, closed) == []


@pytest.mark.parametrize("then", ["unused", "closed", "connected"])
def test_a_restarted_operator_does_not_write_an_unchanged_status_again(run_operator, status_writes, then):
    """docs/operator.md: the status "is written only when it changes (a restarted operator starts from what the
    status says)". A connection reached once, then left by its last subscription (Unused), or then pointed where
    nothing answers (False, clusterId kept), or left as it is (Connected): an operator started over it has nothing
    new to say on it."""
    with reserved_port() as port:
        closed = f"127.0.0.1:{port}"
        driver, model, kube, trace = _directed(run_operator, closed)
        driver.create_connection("c1", "good")
        driver.create_subscription("s1", "c1", bad_regex=False)
        trace.append("c1 (good), s1 -> c1")
        check_transitions(model, settle(model, kube, closed, trace), trace)
        if then == "unused":
            driver.delete_subscription("s1")
        elif then == "closed":
            driver.edit_connection("c1", "closed")
        trace.append(then)
        before = settle(model, kube, closed, trace)["c1"]
        assert before["clusterId"] == model.cluster_id
        driver.stop()
        del status_writes[:]
        run_operator(drift_interval_s=DRIFT_S)   # a second operator over the same objects
        time.sleep(2 * DRIFT_S)   # the connection listed, the subscription resumed and checked for drift
        assert kube.ready(kube.connection("c1")) == before
        assert status_writes == [], "an unchanged status was written again"
