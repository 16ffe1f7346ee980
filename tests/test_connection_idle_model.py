"""Model-based test of what `kcm operator` writes on a KafkaConnection's status while the subscriptions naming it
apply nothing through it, and when Kafka refuses its user the cluster right: seeded random sequences against a
reference written from docs/operator.md ("## KafkaConnection": the paragraph "The operator says on each
KafkaConnection's status what the subscriptions naming it found through it"; "What it does": the "Pause" and
"Conflicts" bullets and the "Errors" list), not from the code.

The real thing runs: kcm's kopf handlers in-process (`test_operator_reconcile.run_operator`, drift checks every
0.5 s) against the emulated Kubernetes API, with the sandbox as the Kafka cluster of connections c1 and c2 (and of
the default cluster) and a second sandbox as c3's. Kafka's ACLs are played at the admin's edge: per connection
(its user), DescribeConfigs or IncrementalAlterConfigs refused with CLUSTER_AUTHORIZATION_FAILED (31); per
subscription, a refusal of its own (TOPIC_AUTHORIZATION_FAILED, 29: a right only that one needs).

The reference, per KafkaConnection, once every handler and drift check had its turn:
- no subscription names it: `Unknown`/`Unused` (the latest report: a refusal said before it is not carried over, a
  reading the docs leave open; the one directed step that meets it accepts either);
- the only subscriptions naming it apply nothing through it (paused with `kcm.dev/paused: "true"`, or in
  `Conflict` with an older resource naming the same subscriptionName through another connection to the same
  cluster): `Unknown`/`Idle` instead of `Unused`; any other earlier report stays, as the latest;
- some apply through it: its user refused describe → `False`/`KafkaRefused` (Kafka's message, as a subscription
  naming it says it); else a subscription with a change and its user refused alter → `False`/`KafkaRefused`; else
  `True`/`Connected` with `clusterId` the cluster reached, also when Kafka refuses one subscription for its own
  reasons; but a `KafkaRefused` stays until a call of the refused kind passes through it (a subscription with
  nothing to change proves no alter, one refused for its own reasons proves nothing of its refused call);
- the condition's `lastTransitionTime` stays while its status stays; a report that changes nothing is not written
  (no status write at all reaches such a connection during the step and a quiet period of two drift checks after).

Subscriptions use deletionPolicy Retain, so deleting one never calls Kafka; the model keeps what Kafka holds (each
subscription's interval) to know which reconcile has something to alter. A conflicting newer resource is only made
while its owner has applied the subscription once (so the owner is counted: docs, "Conflicts"), at most one per
subscription, one second later than the owner (creationTimestamp has 1 s resolution).

Where the code differed from the docs (mended with this test): a KafkaConnection deleted and made again while only
a paused subscription named it got no status at all (docs: `Unknown`/`Idle`); so, depending on timing, did one made
together with a paused subscription naming it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import pytest
from kubernetes.client.rest import ApiException

import test_connection_status_model as status_model
import test_operator_reconcile as behaviour
from kcm_operator import admin as admin_module
from kcm_operator.errors import KafkaRefusedError

kube = behaviour.kube                    # the emulated Kubernetes API (fixture)
run_operator = behaviour.run_operator    # kcm's handlers through KopfRunner, for the sandbox (fixture)
operator_logs = behaviour.operator_logs  # a failing test shows kopf's and kcm's INFO lines
status_writes = status_model.status_writes  # a spy on the operator's KafkaConnection status patches (fixture)

GROUP, VERSION, NS = behaviour.GROUP, behaviour.VERSION, behaviour.NS
PAUSED = "kcm.dev/paused"
SEEDS = (195, 104)   # of 200 dry-run walks, two that reach conflicts, take-overs and refusals that stay
STEPS = 11
DRIFT_S = 0.5
QUIET_S = 2 * DRIFT_S + 0.1      # every subscription checked twice: a flip back and forth would be written
STEP_DEADLINE_S = 10.0
MAIN, OTHER = "main", "other"
CLUSTER_OF = {"c1": MAIN, "c2": MAIN, "c3": OTHER, None: MAIN}   # None: the operator's default cluster
SUBSCRIPTION_NAMES = ("s1", "s2", "s3", "s4", "s5")
INTERVALS = (60000, 120000)
CLUSTER_REFUSAL = "ClusterAuthorizationFailedError (error 31): Cluster authorization failed."
OWN_REFUSAL = "TopicAuthorizationFailedError (error 29): not authorized for this one"


# -- the reference -------------------------------------------------------------------------------------------------

@dataclass
class Sub:
    connection: str | None
    subscription: str          # spec.subscriptionName (default "<namespace>.<name>")
    interval: int
    paused: bool
    created: float             # wall-clock time of creation (the order of creationTimestamps)
    applied: bool = False      # its status names the cluster it applied the subscription to


@dataclass
class Conn:
    shown: str | None = None   # Unused, Idle, Connected, KafkaRefused (None: nothing said yet)
    needs: str | None = None   # the call a shown KafkaRefused was refused
    reached: bool = False      # Connected once since it was created


@dataclass
class Model:
    conns: dict[str, Conn] = field(default_factory=dict)
    subs: dict[str, Sub] = field(default_factory=dict)
    denied: set[tuple[str, str]] = field(default_factory=set)   # (connection, call) Kafka refuses its user
    own: dict[str, str] = field(default_factory=dict)           # subscriptionName → the call refused it alone
    kafka: dict[tuple[str, str], int] = field(default_factory=dict)   # (cluster, subscriptionName) → interval

    def claims(self, cluster: str, subscription: str) -> list[str]:
        """The resources naming `subscription` on `cluster`, oldest first."""
        return sorted((s for s, sub in self.subs.items()
                       if sub.subscription == subscription and CLUSTER_OF[sub.connection] == cluster),
                      key=lambda s: (self.subs[s].created, s))

    def in_conflict(self, name: str) -> bool:
        sub = self.subs[name]
        return self.claims(CLUSTER_OF[sub.connection], sub.subscription)[0] != name

    def applies(self, name: str) -> bool:
        """Whether its reconciles go on to Kafka: not paused, not in Conflict, its connection there."""
        sub = self.subs[name]
        return not sub.paused and not self.in_conflict(name) and (sub.connection is None or
                                                                  sub.connection in self.conns)

    def settle(self) -> None:
        """What every handler and drift check leaves once they all had their turn (repeatedly: a fixpoint)."""
        for route in [*self.conns, None]:
            users = [s for s, sub in self.subs.items() if sub.connection == route]
            conn = self.conns.get(route)
            if conn is not None and not users:
                conn.shown, conn.needs = "Unused", None
                continue
            active = [s for s in users if self.applies(s)]
            if not active:
                if conn is not None and conn.shown in (None, "Unused"):
                    conn.shown = "Idle"
                continue
            refused, proved = self._reconcile(route, active)
            if conn is None:
                continue
            if refused is not None:
                conn.shown, conn.needs = "KafkaRefused", refused
            elif conn.needs is None or conn.needs in proved:
                conn.shown, conn.needs, conn.reached = "Connected", None, True

    def _reconcile(self, route: str | None, active: list[str]) -> tuple[str | None, set[str]]:
        """The reconciles of `active` through `route`: the call Kafka refused its user, else the calls that passed;
        Kafka and the resources' `applied` as they leave them."""
        if (route, "describe") in self.denied:
            return "describe", set()
        described = [s for s in active if self.own.get(self.subs[s].subscription) != "describe"]
        changing = [s for s in described if self.kafka.get(self._key(s)) != self.subs[s].interval]
        for s in described:
            if s not in changing:
                self.subs[s].applied = True
        if changing and (route, "alter") in self.denied:
            return "alter", set()
        altered = [s for s in changing if self.own.get(self.subs[s].subscription) != "alter"]
        for s in altered:
            self.kafka[self._key(s)] = self.subs[s].interval
            self.subs[s].applied = True
        return None, ({"describe"} if described else set()) | ({"alter"} if altered else set())

    def _key(self, name: str) -> tuple[str, str]:
        sub = self.subs[name]
        return CLUSTER_OF[sub.connection], sub.subscription


EXPECTED = {"Unused": ("Unknown", "Unused"), "Idle": ("Unknown", "Idle"), "Connected": ("True", "Connected"),
            "KafkaRefused": ("False", "KafkaRefused")}


# -- Kafka's ACLs, at the admin's edge -----------------------------------------------------------------------------

def refuse_as_the_model_says(monkeypatch, cluster: behaviour.Cluster, model: Model) -> None:
    """DescribeConfigs / IncrementalAlterConfigs answered as `model.denied` (per connection: the admin built for it)
    and `model.own` (per subscription) say, with Kafka's errors as tests/test_operator_reconcile.py plays them;
    decided once per request, as Kafka does (the operator batches the calls of concurrent reconciles into one)."""
    describe_each, alter = admin_module.SubscriptionAdmin.describe_each, admin_module.SubscriptionAdmin.alter

    def connection_of(admin: admin_module.SubscriptionAdmin) -> str | None:
        with cluster.config.lock:
            refs = [ref for ref, (_, built) in cluster.config.admins.items() if built.admin is admin]
        return refs[0][1] if refs and refs[0] is not None else None

    def answer(self, call: str, names: list[str], send) -> dict:
        if (connection_of(self), call) in model.denied:
            return {name: KafkaRefusedError(CLUSTER_REFUSAL, 31) for name in names}
        found = send([name for name in names if model.own.get(name) != call])
        return {**found, **{name: KafkaRefusedError(OWN_REFUSAL, 29) for name in names if model.own.get(name) == call}}

    def refused_describe_each(self, names):
        return answer(self, "describe", list(names), lambda asked: describe_each(self, asked) if asked else {})

    def refused_alter(self, changes, validate_only=False):
        pending = {change.name: change for change in changes if change.ops}
        return answer(self, "alter", list(pending), lambda asked: alter(
            self, [pending[name] for name in asked], validate_only) if asked else {})

    monkeypatch.setattr(admin_module.SubscriptionAdmin, "describe_each", refused_describe_each)
    monkeypatch.setattr(admin_module.SubscriptionAdmin, "alter", refused_alter)


# -- the driver ----------------------------------------------------------------------------------------------------

class World:
    """The test's hands on the real thing, and the model kept in step with them."""

    def __init__(self, cluster: behaviour.Cluster, other_bootstrap: str, other_id: str, writes: list) -> None:
        self.cluster, self.model, self.writes = cluster, Model(), writes
        self.bootstrap = {MAIN: cluster.sandbox.bootstrap, OTHER: other_bootstrap}
        self.cluster_id = {MAIN: cluster.sandbox.broker.cluster_id, OTHER: other_id}
        self.trace: list[str] = []
        self.since: dict[str, tuple[str, str]] = {}   # connection → (Ready status, lastTransitionTime) last seen
        # connection → (what the model said after the previous step, the number of status writes then)
        self._before: dict[str, tuple[tuple[str | None, str | None], int]] = {}

    # actions
    def create_connection(self, name: str) -> None:
        behaviour._connection(self.cluster, name, {"bootstrapServers": self.bootstrap[CLUSTER_OF[name]]})
        self.model.conns[name] = Conn()

    def delete_connection(self, name: str) -> None:
        self.cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", name)
        del self.model.conns[name]
        self.since.pop(name, None)
        self._before.pop(name, None)   # made again, it is a new object: its status is written afresh
        behaviour.wait_for(lambda: self.connection(name) is None, f"KafkaConnection {name} to go")

    def create_subscription(self, name: str, connection: str | None, interval: int, paused: bool,
                            subscription: str | None = None, own: str | None = None) -> None:
        subscription = subscription or f"{NS}.{name}"
        claims = self.model.claims(CLUSTER_OF[connection], subscription)
        if claims:   # visibly newer than the owner: creationTimestamp has one-second resolution
            time.sleep(max(0.0, self.model.subs[claims[0]].created + 1.1 - time.time()))
        elif own is not None:
            self.model.own[subscription] = own
        else:
            self.model.own.pop(subscription, None)
        spec = {**behaviour.SPEC, "intervalMs": interval, "deletionPolicy": "Retain", "subscriptionName": subscription}
        if connection:
            spec["connection"] = connection
        self.cluster.apply(name, spec, annotations={PAUSED: "true"} if paused else None)
        self.model.subs[name] = Sub(connection, subscription, interval, paused, time.time())

    def delete_subscription(self, name: str) -> None:
        self.cluster.delete(name)
        del self.model.subs[name]
        behaviour.wait_for(lambda: self.cluster.get(name) is None, f"subscription {name} (Retain) to be let go")

    def pause(self, name: str, paused: bool) -> None:
        self.cluster.patch(name, {"metadata": {"annotations": {PAUSED: "true" if paused else None}}})
        self.model.subs[name].paused = paused

    def right(self, connection: str, call: str, granted: bool) -> None:
        (self.model.denied.discard if granted else self.model.denied.add)((connection, call))

    # what the operator wrote
    def connection(self, name: str) -> dict | None:
        try:
            return self.cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NS, "kafkaconnections", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def ready(self, name: str) -> dict:
        obj = self.connection(name) or {}
        status = obj.get("status") or {}
        (ready,) = [c for c in status.get("conditions") or () if c.get("type") == "Ready"] or [{}]
        return {**ready, "clusterId": status.get("clusterId"),
                "resourceVersion": obj.get("metadata", {}).get("resourceVersion")}

    def mismatches(self) -> list[str]:
        wrong = []
        for name, conn in self.model.conns.items():
            seen = self.ready(name)
            state, reason = EXPECTED[conn.shown]
            if (seen.get("status"), seen.get("reason")) != (state, reason):
                wrong.append(f"{name}: Ready {seen.get('status')}/{seen.get('reason')} ({seen.get('message')!r}), "
                             f"want {state}/{reason}")
                continue
            target = self.cluster_id[CLUSTER_OF[name]]
            allowed = {target} if conn.reached else {None, target}   # "clusterId keeps the cluster last reached"
            if seen["clusterId"] not in allowed:
                wrong.append(f"{name}: clusterId {seen['clusterId']!r}, want one of {allowed}")
            if not seen.get("lastTransitionTime") or not seen.get("message"):
                wrong.append(f"{name}: no lastTransitionTime or message: {seen}")
            if conn.shown == "KafkaRefused":
                # "False with the subscriptions' reason and message": Kafka's refusal, as the one refused said it.
                if seen["message"] != CLUSTER_REFUSAL:
                    wrong.append(f"{name}: message {seen['message']!r}, want Kafka's {CLUSTER_REFUSAL!r}")
        return wrong

    def step(self, what: str, within_s: float = STEP_DEADLINE_S) -> None:
        """After an action: wait until every connection says what the model says; then, through a quiet period,
        nothing is written; a connection whose report did not change was never written during the step."""
        self.trace.append(what)
        before = dict(self._before)
        self.model.settle()
        deadline = time.monotonic() + within_s
        while wrong := self.mismatches():
            if time.monotonic() > deadline:
                pytest.fail("not as documented after %g s:\n  %s\nmodel: %s\ntrace:\n  %s" % (
                    within_s, "\n  ".join(wrong), self.model.conns, "\n  ".join(self.trace[-14:])))
            time.sleep(0.05)
        settled = {name: self.ready(name) for name in self.model.conns}
        mark = len(self.writes)
        time.sleep(QUIET_S)
        quiet = {name: self.ready(name) for name in self.model.conns}
        # (A report on a connection that does not exist, from a subscription naming it, fails: nothing is written.)
        written = [(name, body) for name, body in self.writes[mark:] if name in self.model.conns]
        assert quiet == settled and written == [], (
            f"written while nothing changed: {written}\n{settled}\n{quiet}\n" + "\n".join(self.trace[-8:]))
        for name, conn in self.model.conns.items():
            said = (conn.shown, conn.needs)
            if name in before and before[name][0] == said:
                written = [body for connection, body in self.writes[before[name][1]:] if connection == name]
                assert written == [], (f"{name}: still {said[0]}, yet written during the step: {written}\n  "
                                       + "\n  ".join(self.trace[-8:]))
            status, since = settled[name]["status"], settled[name]["lastTransitionTime"]
            if name in self.since and self.since[name][0] == status:
                assert since == self.since[name][1], (
                    f"{name}: Ready stayed {status} but lastTransitionTime moved {self.since[name][1]} -> {since}\n  "
                    + "\n  ".join(self.trace[-8:]))
            self.since[name] = (status, since)
        self._before = {name: ((c.shown, c.needs), len(self.writes)) for name, c in self.model.conns.items()}

    # the random walk
    def random_action(self, rng: random.Random) -> str | None:
        model = self.model
        present, absent = sorted(model.conns), [c for c in CLUSTER_OF if c and c not in model.conns]
        free = [s for s in SUBSCRIPTION_NAMES if s not in model.subs]
        in_groups = {sub.connection for s, sub in model.subs.items()
                     if len(model.claims(CLUSTER_OF[sub.connection], sub.subscription)) > 1}
        owners = [s for s, sub in model.subs.items() if sub.applied and CLUSTER_OF[sub.connection] == MAIN
                  and len(model.claims(MAIN, sub.subscription)) == 1 and sub.connection in (None, *present)]
        action = rng.choice(["create-connection"] * len(absent)
                            + ["delete-connection"] * (1 if [c for c in present if c not in in_groups] else 0)
                            + ["create-subscription"] * (3 if free else 0)
                            + ["conflict"] * (4 if free and owners else 0)
                            + ["delete-subscription"] * (2 if model.subs else 0)
                            + ["pause"] * (3 if model.subs else 0)
                            + ["right"] * 4)
        if action == "create-connection":
            name = rng.choice(absent)
            self.create_connection(name)
            return f"create KafkaConnection {name}"
        if action == "delete-connection":
            name = rng.choice([c for c in present if c not in in_groups])
            self.delete_connection(name)
            return f"delete KafkaConnection {name}"
        if action == "create-subscription":
            name, connection = rng.choice(free), rng.choice([*present, *present, None, "c1", "c2", "c3"])
            if model.claims(CLUSTER_OF[connection], f"{NS}.{name}"):
                return None   # its default name is another's now (handed over): made only by "conflict"
            interval, paused = rng.choice(INTERVALS), rng.random() < 0.3
            own = rng.choice([None] * 6 + ["describe", "alter"])
            self.create_subscription(name, connection, interval, paused, own=own)
            return f"create {name} -> {connection} interval={interval} paused={paused} own refusal={own}"
        if action == "conflict":
            owner = rng.choice(sorted(owners))
            name, subscription = rng.choice(free), model.subs[owner].subscription
            routes = [c for c in ("c1", "c2", None)
                      if c != model.subs[owner].connection and (c is None or c in present)]
            if not routes:
                return None
            connection = rng.choice(routes)
            interval = rng.choice(INTERVALS)
            self.create_subscription(name, connection, interval, False, subscription=subscription)
            return f"create {name} -> {connection} interval={interval}, newer than {owner} for {subscription}"
        if action == "delete-subscription":
            name = rng.choice(sorted(model.subs))
            self.delete_subscription(name)
            return f"delete {name}"
        if action == "pause":
            name = rng.choice(sorted(model.subs))
            paused = not model.subs[name].paused
            self.pause(name, paused)
            return f"{'pause' if paused else 'unpause'} {name}"
        named = sorted({sub.connection for sub in model.subs.values() if sub.connection in present})
        connection, call = rng.choice(named or ["c1", "c2", "c3"]), rng.choice(("describe", "alter"))
        granted = (connection, call) in model.denied
        self.right(connection, call, granted)
        return f"{'grant' if granted else 'revoke'} {call} to {connection}'s user"


@pytest.fixture
def make_world(run_operator, sandbox_factory, status_writes, monkeypatch):
    def make(drift_interval_s: float = DRIFT_S) -> World:
        cluster = run_operator(drift_interval_s=drift_interval_s)
        other = sandbox_factory()
        made = World(cluster, other.bootstrap, other.broker.cluster_id, status_writes)
        refuse_as_the_model_says(monkeypatch, cluster, made.model)
        return made
    return make


@pytest.fixture
def world(make_world) -> World:
    return make_world()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_connections_status_while_its_subscriptions_apply_nothing_or_kafka_refuses_its_user(world, seed):
    """Connections made and deleted, subscriptions made (paused or not, refused alone or not), deleted, paused and
    unpaused, newer ones in Conflict, rights revoked and granted: after each, the status the reference says."""
    rng = random.Random(seed)
    world.create_connection("c1")
    world.create_connection("c2")
    world.create_subscription("s1", "c1", INTERVALS[0], False)
    world.step("create c1, c2 (the sandbox), s1 -> c1")
    steps = 0
    while steps < STEPS:
        what = world.random_action(rng)
        if what is not None:
            steps += 1
            world.step(f"seed {seed} step {steps}: {what}")


def test_a_connection_named_only_by_a_subscription_in_conflict_says_idle_until_it_takes_over(world):
    """docs "Conflicts": the newer takes over as soon as the owner is deleted; until then its connection is Idle."""
    world.create_connection("c1")
    world.create_connection("c2")
    world.create_subscription("s1", "c1", 60000, False)
    world.step("s1 -> c1")
    world.create_subscription("s2", "c2", 120000, False, subscription=f"{NS}.s1")
    world.step("s2 -> c2, newer, same subscriptionName: Conflict")
    world.right("c2", "alter", False)
    world.step("c2's user may not alter")
    world.delete_subscription("s1")
    world.step("owner s1 deleted: s2 takes over, its alter refused")
    world.right("c2", "alter", True)
    world.step("c2's user may alter: s2 applies")
    assert behaviour.wait_for(lambda: world.cluster.kafka(f"{NS}.s1").get("interval.ms"), "s2's interval") == "120000"


def test_a_refusal_of_the_right_to_alter_stays_said_until_an_alter_passes(world):
    """docs: CLUSTER_AUTHORIZATION_FAILED "stays so until a call of that kind passes through it (a subscription with
    nothing to change shows nothing of ALTER_CONFIGS)"; pausing or deleting the refused one changes nothing."""
    world.create_connection("c1")
    world.create_subscription("s1", "c1", 60000, False)
    world.step("s1 -> c1")
    world.right("c1", "alter", False)
    world.step("c1's user may not alter: nothing to alter yet")
    world.create_subscription("s2", "c1", 60000, False)
    world.step("s2 -> c1: its alter refused")
    world.pause("s2", True)
    world.step("s2 paused: the refusal stays, s1's describes prove no alter")
    world.right("c1", "alter", True)
    world.step("the right granted: still nothing altered through c1")
    world.delete_subscription("s2")
    world.step("s2 deleted")
    world.create_subscription("s3", "c1", 120000, False, own="alter")
    world.step("s3 -> c1: Kafka refuses s3 alone its alter, which proves nothing of the right")
    world.create_subscription("s4", "c1", 120000, False)
    world.step("s4 -> c1: an alter passes")
    world.right("c1", "alter", False)
    world.create_subscription("s5", "c1", 120000, False)
    world.step("c1's user may not alter, s5 -> c1: refused")
    for name in ("s1", "s3", "s4", "s5"):
        world.delete_subscription(name)
    world.step("every subscription naming c1 deleted: Unused")
    # A subscription Kafka already holds as specified (Retain kept it) names it again: it reaches Kafka with a
    # describe. The Unused said in between was the latest report; whether the alter refusal from before it counts
    # again is not said, but Unused is not what a connection a subscription reached Kafka through says.
    world.create_subscription("s1", "c1", 60000, False)
    world.cluster.wait_condition("s1", "True", "Applied")
    behaviour.wait_for(lambda: world.ready("c1").get("reason") in ("Connected", "KafkaRefused"),
                       "c1 to say what s1 found through it, not Unused", timeout=5.0)


def test_a_connection_made_after_a_paused_subscription_naming_it_says_idle(world):
    """GitOps order: the subscription (paused) first, then its connection. docs: `Unknown`, `Idle`, instead of
    `Unused` while the only subscriptions naming it apply nothing through it."""
    world.create_subscription("s1", "c1", 60000, True)
    world.cluster.wait_condition("s1", "True", "Paused", kind="Paused")
    world.create_connection("c1")
    world.step("paused s1 -> c1, then c1 made")


def test_a_connection_made_again_while_only_a_paused_subscription_names_it_says_idle(make_world):
    """As a GitOps sync or `kubectl replace` makes it again: nothing reconciles the paused subscription then but its
    drift checks (every 2 s here), of which the next says so (it never did: the connection's status stayed empty)."""
    world = make_world(drift_interval_s=2.0)
    world.create_connection("c1")
    world.create_subscription("s1", "c1", 60000, True)
    world.step("c1, paused s1 -> c1")
    world.delete_connection("c1")
    world.create_connection("c1")
    world.step("c1 deleted and made again", within_s=3 * 2.0)
