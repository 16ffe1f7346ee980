"""Model-based test of the operator's handlers: seeded random event sequences against a reference written from
docs/operator.md (and the CR section of the design brief), not from the code.

The seam: kcm's own kopf handlers (`build_registry`: the `claims` index, `reconcile` for create/update/resume, the
`drift` timer, `delete`), called as kopf calls them, on the operator's real OperatorConfig, ConnectionResolver,
SubscriptionAdmin and BatchedAdmin; only kafka-python's KafkaAdminClient, the bootstrap probe, the Kubernetes reads
of KafkaConnections and the heir-marking patch are replaced, by in-memory clusters whose CLIENT_METRICS semantics are
kcm_common.client_metrics' (Kafka's) and a dict of resources. kopf itself is emulated by the driver below: the
finalizer, status patches, update handlers on spec or annotation changes, retries of TemporaryError, timers,
resume after a restart.

After every handler call the Kafka state of every cluster, the resource's Ready/Paused conditions, its status, the
events it posted, whether kopf is asked to retry, whether the resource is let go and which heirs were marked are
compared with the reference. Where the docs leave a choice open the reference branches (all outcomes a reader of
the docs could expect), accepts any branch the handlers took, and goes on from that one.

Each seed is one scenario; failures name the seed, the step and the handler call, and show the last steps.
KCM_MODEL_SEEDS / KCM_MODEL_STEPS change how many / how long. A few directed sequences go through rare paths of the
docs with the same driver and reference.

Where the handlers were found to break what the docs say (since mended, each with a directed sequence below): a
resource whose KafkaConnection is gone, on a cluster that refuses the removal's IncrementalAlterConfigs
(KafkaRefused), was held for ever instead of let go with NotRemoved after three tries; a non-owner (Conflict) that
applied the subscription once, deleted together with its owner, removed the owner's subscription ("Deleting a
non-owner never touches Kafka"); a removal refused with KafkaRefused was not counted in
kcm_operator_kafka_errors_total.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import os
import random
import types
from dataclasses import dataclass, field
from typing import Any

import kafka.errors as kafka_errors
import kopf
import pytest
from kubernetes.client.rest import ApiException
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest

from kcm_common import client_metrics as cm
from kcm_common.kafka import KafkaSettings, KafkaUnavailableError
from kcm_operator import admin as admin_module
from kcm_operator import handlers, metrics, schema
from kcm_operator.connections import ConnectionResolver

SEEDS = int(os.environ.get("KCM_MODEL_SEEDS", "200"))
STEPS = int(os.environ.get("KCM_MODEL_STEPS", "150"))

# -- the documented contract, written out --------------------------------------------------------------------------

# DESIGN.md: CR match field → Kafka match key.
MATCH_KEYS = {"clientInstanceId": "client_instance_id", "clientId": "client_id",
              "clientSoftwareName": "client_software_name", "clientSoftwareVersion": "client_software_version",
              "clientSourceAddress": "client_source_address", "clientSourcePort": "client_source_port"}
DEFAULT_INTERVAL = 300000       # operator.md: intervalMs default
PAUSED = "kcm.dev/paused"
OWNER_DELETED = "kcm.dev/owner-deleted"
HELD_PREFIX = "deletionPolicy Delete: subscription {} is not removed from Kafka yet"
DRIFT_WINDOW, CONTEST_AT = 8, 4   # "found changed again after three reverts within eight drift checks"

# -- the world: clusters, KafkaConnections, the Kubernetes store -----------------------------------------------------

CLUSTERS = ("k1", "k2", "k3")
SERVERS = {"k1:9092": "k1", "k1-alt:9092": "k1", "k2:9092": "k2", "k3:9092": "k3"}
DEFAULT_SERVERS = "k1:9092"
NAMESPACES = ("team-a", "team-b")
NAMES = ("p1", "p2", "p3", "p4")
SUB_NAMES = (None, None, "shared", "shared", "shared", "other")
CONNECTIONS = (None, None, "remote", "alt")
METRICS = ([], ["*"], ["org.apache.kafka.producer."], ["org.apache.kafka.consumer."],
           ["org.apache.kafka.producer.", "org.apache.kafka.consumer."],
           ["org.apache.kafka.client.", "org.apache.kafka.producer."])
INTERVALS = (None, 100, 1000, 60000, 300000, 3600000)
GOOD_PATTERNS = ("payments-.*", "librdkafka", "apache-kafka-java|librdkafka", "2\\..*", "10\\..*", "9.*")
BAD_PATTERNS = ("[unclosed", "(open")   # java.util.regex refuses them; the CRD cannot tell


def cid(key: str) -> str:
    return f"id-{key}"


def normalize(raw: dict[str, str]) -> dict[str, Any]:
    """Configs as a reader of the docs compares them: lists as sets ("lists compare as sets")."""
    out: dict[str, Any] = {}
    if "metrics" in raw:
        out["metrics"] = frozenset(item.strip() for item in raw["metrics"].split(",") if item.strip())
    if "interval.ms" in raw:
        out["interval.ms"] = int(raw["interval.ms"])
    if "match" in raw:
        out["match"] = frozenset(tuple(entry.split("=", 1)) for entry in raw["match"].split(",") if entry)
    return out


class Cluster:
    def __init__(self, key: str) -> None:
        self.key, self.cluster_id = key, cid(key)
        self.up, self.telemetry, self.policy = True, True, False
        self.acl = ""   # "all": the operator's user may neither describe nor alter; "alter": it may only describe
        self.epoch = 0   # bumped by a broker restart (the receiver plugin added or taken out)
        self.configs: dict[str, dict[str, str]] = {}

    def by_hand(self, name: str, ops: list[tuple[str, int, str | None]]) -> None:
        """kafka-client-metrics.sh: an alter straight at the brokers, validated as Kafka validates it."""
        updated = cm.apply_incremental(self.configs.get(name, {}), ops)
        cm.validate(name, updated)
        if updated:
            self.configs[name] = updated
        else:
            self.configs.pop(name, None)

    def answer(self, request: Any) -> Any:
        if not self.up:
            raise kafka_errors.KafkaConnectionError("the model's cluster is down")
        if isinstance(request, DescribeConfigsRequest):
            results = []
            for _, name, _ in request.resources:
                if self.acl == "all":
                    results.append(types.SimpleNamespace(resource_name=name, error_code=31, error_message="denied",
                                                         configs=[]))
                    continue
                entries = [types.SimpleNamespace(name=e.name, value=e.value, config_source=e.source)
                           for e in cm.describe_entries(self.configs.get(name, {}))]
                results.append(types.SimpleNamespace(resource_name=name, error_code=0, error_message=None,
                                                     configs=entries))
            return types.SimpleNamespace(results=results)
        assert isinstance(request, IncrementalAlterConfigsRequest), request
        responses = []
        for _, name, ops in request.resources:
            code, message = 0, None
            if self.acl:
                code, message = 31, "denied"
            elif self.policy:
                code, message = 44, "the model's alter.config.policy refuses every change"
            else:
                try:
                    updated = cm.apply_incremental(self.configs.get(name, {}), ops)
                    cm.validate(name, updated)
                except cm.ConfigError as exc:
                    code, message = exc.error_code, exc.message
                else:
                    if not request.validate_only:
                        if updated:
                            self.configs[name] = updated
                        else:
                            self.configs.pop(name, None)
            responses.append(types.SimpleNamespace(resource_name=name, error_code=code, error_message=message))
        return types.SimpleNamespace(responses=responses)


class FakeAdminClient:
    """What SubscriptionAdmin uses of kafka-python's KafkaAdminClient, answered by a model cluster."""

    def __init__(self, world: World, **options: Any) -> None:
        (server,) = options["bootstrap_servers"]
        cluster = world.clusters[SERVERS[server]]
        if not cluster.up:
            raise KafkaUnavailableError(f"model: {server} is down")
        self.config = {"request_timeout_ms": options.get("request_timeout_ms", 1000)}
        apis = {71, 72, 74} if cluster.telemetry else {74}
        self.closed, epoch = False, cluster.epoch
        outer = self

        class Manager:
            broker_version_data = types.SimpleNamespace(api_versions={key: (0, 0) for key in apis})

            def __init__(self) -> None:
                self.cluster = types.SimpleNamespace(cluster_id=cluster.cluster_id)

            def send(self, request: Any) -> Any:
                return request

            def wait_for(self, future: Any, deadline_ms: int) -> Any:
                raise AssertionError("not used: run is given it")

            def run(self, function: Any, request: Any, deadline_ms: int) -> Any:
                if outer.closed or epoch != cluster.epoch:
                    raise kafka_errors.KafkaConnectionError("closed, or reset by a broker restart")
                return cluster.answer(request)

        self._manager = Manager()

    def close(self) -> None:
        self.closed = True


class World:
    def __init__(self) -> None:
        self.clusters = {key: Cluster(key) for key in CLUSTERS}
        self.connections: dict[tuple[str, str], str] = {}
        for ns in NAMESPACES:
            self.connections[(ns, "remote")] = "k2:9092"
            self.connections[(ns, "alt")] = "k1-alt:9092"
        self.kube_failing = False
        self.store: dict[str, dict] = {}

    # what the reference may read: the inputs, never the operator's state
    def target(self, cref: tuple[str, str] | None) -> str | None:
        if cref is None:
            return "k1"
        servers = self.connections.get(cref)
        return SERVERS[servers] if servers else None

    def kafka(self) -> dict[str, dict[str, dict]]:
        return {key: {name: normalize(raw) for name, raw in cluster.configs.items()}
                for key, cluster in self.clusters.items()}


class FakeCustomObjects:
    """The Kubernetes API's custom objects, as the operator reads KafkaConnections and older owners, and marks heirs."""

    def __init__(self, world: World, marked: list[str], status_written: list[tuple[str, dict]]) -> None:
        self.world, self.marked, self.status_written = world, marked, status_written

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, **_):
        if self.world.kube_failing:
            raise ApiException(status=503, reason="Service Unavailable")
        obj = self.world.store.get(f"{namespace}/{name}")
        assert (group, version, plural) == ("kcm.dev", "v1alpha1", "clientmetricssubscriptions")
        if obj is None:
            raise ApiException(status=404, reason="Not Found")
        assert set(body) == {"metadata"} and set(body["metadata"]) == {"annotations"}, body
        obj["metadata"]["annotations"].update(body["metadata"]["annotations"])
        self.marked.append((f"{namespace}/{name}", body["metadata"]["annotations"]))
        return obj

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **_):
        """A drift check's own status write: taken as the change handlers' kopf patches are here (never failing; a
        refused write is test_operator_reconcile's)."""
        assert (group, version, plural) == ("kcm.dev", "v1alpha1", "clientmetricssubscriptions")
        assert set(body) == {"status"}, body
        self.status_written.append((f"{namespace}/{name}", copy.deepcopy(body["status"])))
        return self.world.store[f"{namespace}/{name}"]

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        if self.world.kube_failing:
            raise ApiException(status=503, reason="Service Unavailable")
        if plural == "clientmetricssubscriptions":   # an older owner, read before a Conflict names it
            obj = self.world.store.get(f"{namespace}/{name}")
            if obj is None:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(obj)
        servers = self.world.connections.get((namespace, name))
        if servers is None:
            raise ApiException(status=404, reason="Not Found")
        return {"apiVersion": "kcm.dev/v1alpha1", "kind": "KafkaConnection",
                "metadata": {"namespace": namespace, "name": name}, "spec": {"bootstrapServers": servers}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


# -- the reference ---------------------------------------------------------------------------------------------------

@dataclass
class RRes:
    ns: str
    name: str
    uid: str
    created: str
    spec: dict
    generation: int = 1
    observed: int = 0            # the generation a change handler last ran for
    last_change_gen: int = 0     # the generation the change handler last saw (a spec change or not)
    paused: bool = False
    marked_by: str | None = None
    deleting: bool = False
    ready: tuple[str, str] | None = None
    ready_gen: int | None = None
    paused_cond: str | None = None
    ever_ready: bool = False
    applied_name: str | None = None
    cluster_id: str | None = None
    contested: bool = False
    found_ready: bool | str = False     # found Ready by this operator since it started ("maybe": being deleted)
    conflict_owner: str | None = None   # the owner its Conflict names
    with_owner: bool = False            # deleted together with the owner its Conflict names
    strict: list = field(default_factory=list)   # drift outcomes, reset whenever a reader might reset them
    loose: list = field(default_factory=list)    # drift outcomes, reset only where the docs say

    @property
    def ref(self) -> str:
        return f"{self.ns}/{self.name}"

    @property
    def cref(self) -> tuple[str, str] | None:
        return (self.ns, self.spec["connection"]) if self.spec.get("connection") else None

    @property
    def age(self) -> tuple:
        return (self.created, self.ns, self.name, self.uid)

    @property
    def policy(self) -> str:
        return self.spec.get("deletionPolicy", "Delete")

    def spec_name(self) -> str:
        return self.spec.get("subscriptionName") or f"{self.ns}.{self.name}"

    def claim_name(self) -> str:
        """The subscription it stands for: the one it applied (a rename is refused), else its spec's."""
        return self.applied_name if self.ever_ready and self.applied_name else self.spec_name()

    def desired(self) -> dict[str, Any]:
        out: dict[str, Any] = {"metrics": frozenset(self.spec.get("metrics") or ()),
                               "interval.ms": self.spec.get("intervalMs", DEFAULT_INTERVAL)}
        match = frozenset((MATCH_KEYS[key], value) for key, value in (self.spec.get("match") or {}).items())
        if match:
            out["match"] = match
        return out

    def kafka_refuses_spec(self) -> bool:
        return any(value in BAD_PATTERNS for value in (self.spec.get("match") or {}).values())


@dataclass
class RState:
    kafka: dict[str, dict[str, dict]]
    res: dict[str, RRes] = field(default_factory=dict)
    # connection ref → the cluster ids the operator may remember for it (None: nothing remembered)
    memory: dict[Any, frozenset] = field(default_factory=dict)
    last_good: dict[Any, str] = field(default_factory=dict)   # connection ref → cluster of its last good settings
    # (connection ref, cluster) whose client may still be connected to brokers restarted since: its next request may
    # fail (KafkaUnavailable) before it reconnects
    stale: set = field(default_factory=set)

    def clone(self) -> RState:
        """A copy the reference may change (configs and specs are replaced, never changed in place)."""
        res = {}
        for ref, r in self.res.items():
            res[ref] = copy.copy(r)
            res[ref].strict, res[ref].loose = list(r.strict), list(r.loose)
        return RState({key: dict(subscriptions) for key, subscriptions in self.kafka.items()}, res,
                      dict(self.memory), dict(self.last_good), set(self.stale))


@dataclass
class Outcome:
    skipped: bool = False
    retry: bool = False
    released: bool = False
    woken: frozenset = frozenset()
    ready_any: bool = False          # the docs promise nothing about Ready here
    ready_msg: str | None = None     # a substring the Ready message must hold
    ready_prefix: str | None = None
    required: list = field(default_factory=list)      # (type, reason) events that must be posted
    optional: set = field(default_factory=set)        # (type, reason) events that may be posted
    moved_event: bool = False
    changed_kafka: bool = False      # "lastAppliedTime (when Kafka was last changed)"
    said: dict = field(default_factory=dict)   # event reason → words its message must hold
    kafka_error: str | None = None   # the reason a Kafka call failed with
    notes: list = field(default_factory=list)


class Chooser:
    """Replays a script of choices; `choose` returns the same value for a label within one run."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.indices, self.widths, self.made = script, [], [], {}

    def choose(self, label: str, options: list) -> Any:
        if label in self.made:
            return self.made[label]
        pos = len(self.indices)
        index = self.script[pos] if pos < len(self.script) else 0
        self.indices.append(index)
        self.widths.append(len(options))
        self.made[label] = options[index]
        return options[index]


def explore(function, state: RState) -> list[tuple[Outcome, RState, dict]]:
    branches, stack = [], [[]]
    while stack:
        script = stack.pop()
        branch, chooser = state.clone(), Chooser(script)
        outcome = function(branch, chooser)
        branches.append((outcome, branch, chooser.made))
        for pos in range(len(script), len(chooser.indices)):
            for alternative in range(1, chooser.widths[pos]):
                stack.append(chooser.indices[:pos] + [alternative])
        assert len(branches) < 200, "the reference branches too much"
    return branches


class Reference:
    """What docs/operator.md promises, one handler call at a time."""

    def __init__(self, world: World) -> None:
        self.world = world

    # -- helpers
    def set_ready(self, r: RRes, out: Outcome, ready: tuple[str, str], event: str | None = None) -> None:
        before = r.ready
        r.ready, r.ready_gen = ready, r.generation
        r.found_ready = ready == ("True", "Applied")   # kcm_operator_managed_subscriptions: "last found Ready"
        if ready[1] in ("KafkaUnavailable", "KafkaRefused"):   # kcm_operator_kafka_errors_total
            out.kafka_error = ready[1]
        if event:
            if before != ready:
                out.required.append(("Warning", event))
            else:   # same status and reason: a new message (Kafka's) may be said again
                out.optional.add(("Warning", event))

    def fail(self, r: RRes, out: Outcome, reason: str, retry: bool) -> Outcome:
        self.set_ready(r, out, ("False", reason), reason)
        out.retry = retry
        return out

    def remember_maybe(self, state: RState, r: RRes, key: str) -> None:
        state.memory[r.cref] = state.memory.get(r.cref, frozenset({None})) | {cid(key)}

    def known_id(self, state: RState, claim: RRes, ch: Chooser) -> str | None:
        possible = state.memory.get(claim.cref, frozenset({None}))
        if len(possible) > 1:
            value = ch.choose(f"mem:{claim.cref}", sorted(possible, key=str))
            state.memory[claim.cref] = frozenset({value})
        else:
            (value,) = possible
        return value if value is not None else claim.cluster_id

    def restarted(self, state: RState, r: RRes, target: str, ch: Chooser) -> bool:
        """Whether this call meets a connection that a broker restart broke (said as KafkaUnavailable, retried)."""
        if (r.cref, target) not in state.stale:
            return False
        state.stale = {(key, cluster) for key, cluster in state.stale if key != r.cref}
        return ch.choose(f"stale:{r.cref}", [False, True])

    def learn(self, state: RState, r: RRes) -> None:
        """Any handler of a resource naming a KafkaConnection the operator has no settings for reads it first."""
        if r.cref is not None and r.cref not in state.last_good and not self.world.kube_failing:
            target = self.world.target(r.cref)
            if target is not None:
                state.last_good[r.cref] = target

    def resolve(self, state: RState, r: RRes) -> tuple[str | None, str | None]:
        if r.cref is None:
            return "k1", None
        if self.world.kube_failing:
            return None, "KubernetesError"
        target = self.world.target(r.cref)
        if target is None:
            return None, "InvalidSpec"
        state.last_good[r.cref] = target
        return target, None

    def older_owner(self, state: RState, r: RRes, others: list[RRes], target: str, ch: Chooser) -> RRes | None:
        """The oldest resource naming the subscription on r's cluster, if older than r. Comparing with a resource
        of another connection needs r's own cluster id, which the operator may then remember."""
        for claim in sorted([*others, r], key=lambda c: c.age):
            if claim is r:
                return None
            if claim.cref == r.cref:
                return claim
            self.remember_maybe(state, r, target)
            if self.known_id(state, claim, ch) == cid(target):
                return claim
        return None

    def same_cluster(self, state: RState, r: RRes, claim: RRes, ch: Chooser) -> bool:
        """As far as the operator knows without connecting."""
        if claim.cref == r.cref:
            return True
        mine = self.known_id(state, r, ch)
        return mine is not None and self.known_id(state, claim, ch) == mine

    def release(self, state: RState, r: RRes, out: Outcome) -> Outcome:
        out.released = True
        del state.res[r.ref]
        if r.cref is not None and not any(other.cref == r.cref for other in state.res.values()):
            # "Once no subscription names a KafkaConnection any more ..., its client is closed."
            state.memory[r.cref] = state.memory.get(r.cref, frozenset({None})) | {None}
            state.last_good.pop(r.cref, None)
        return out

    # -- handlers
    def reconcile(self, state: RState, ref: str, kind: str, ch: Chooser) -> Outcome:
        out = Outcome()
        r = state.res[ref]
        world = self.world
        self.learn(state, r)
        if kind == "drift" and (r.deleting or r.observed != r.generation):
            out.skipped = True   # "skips a resource whose latest edit is not reconciled yet", and deletions
            return out
        spec_change = kind == "change" and r.generation != r.last_change_gen
        if kind == "change":
            r.last_change_gen = r.generation
        r.observed = r.generation
        if r.paused:
            r.paused_cond = "True"
            if r.ready is not None and r.ready_gen != r.generation:
                self.set_ready(r, out, ("Unknown", "Paused"))
                out.ready_msg = f"generation {r.generation} is not applied"
            elif r.ready is not None and r.ready[1] in ("Conflict", "Contested"):
                self.set_ready(r, out, ("Unknown", "Paused"))
                out.ready_msg = "is not reconciled"
            elif r.ready is None and r.generation > 1 and ch.choose(f"paused-new:{ref}", [False, True]):
                self.set_ready(r, out, ("Unknown", "Paused"))   # created paused, then edited: Unknown, or nothing
            return out
        if r.paused_cond == "True":
            r.paused_cond = "False"
        if kind in ("change", "resume"):
            r.strict.clear()
            if r.contested and (spec_change or kind == "resume"
                                or ch.choose(f"contest-ends:{ref}", [True, False])):
                self.end_contest(r)
        name = r.spec_name()
        if r.ever_ready and r.applied_name and name != r.applied_name:
            return self.fail(r, out, "InvalidSpec", retry=False)
        target, error = self.resolve(state, r)
        if error is not None:
            return self.fail(r, out, error, retry=True)
        cluster = world.clusters[target]
        others = [c for c in state.res.values() if c.ref != ref and not c.deleting and c.claim_name() == name]
        owner = self.older_owner(state, r, others, target, ch)
        if owner is not None and not cluster.up and ch.choose(f"down-first:{ref}", [False, True]):
            owner = None   # the order of the two answers is not documented
        if owner is not None:
            self.set_ready(r, out, ("False", "Conflict"), "Conflict")
            out.ready_msg = r.conflict_owner = owner.ref
            out.said["Conflict"] = [name, owner.ref]   # "a Warning event Conflict" naming the owner
            return out
        if not cluster.up or self.restarted(state, r, target, ch):
            return self.fail(r, out, "KafkaUnavailable", retry=True)
        if not cluster.telemetry:
            self.remember_maybe(state, r, target)
            return self.fail(r, out, "Unsupported", retry=False)
        if cluster.acl == "all":
            self.remember_maybe(state, r, target)
            return self.fail(r, out, "KafkaRefused", retry=True)
        current = state.kafka[target].get(name)
        desired = r.desired()
        changed = current != desired
        moved = r.cluster_id is not None and r.cluster_id != cid(target)
        was_ready = r.ready == ("True", "Applied")
        drift_event = False
        if kind == "drift" and moved and r.contested and ch.choose(f"moved-contest:{ref}", [True, False]):
            self.end_contest(r)
        if kind == "drift" and not moved:
            if r.contested:
                if changed and current is not None:   # still someone else's: not reverted, said once
                    if r.ready != ("False", "Contested"):   # back after an error: "posts one Warning event"
                        out.optional.add(("Warning", "Contested"))
                    self.set_ready(r, out, ("False", "Contested"))
                    r.cluster_id = cid(target)
                    state.memory[r.cref] = frozenset({cid(target)})
                    return out
                self.end_contest(r)   # "Kafka found as specified, the subscription gone from Kafka"
            elif changed and was_ready:
                r.strict.append(True)
                r.loose.append(True)
                must = sum(r.strict[-DRIFT_WINDOW:]) >= CONTEST_AT
                may = sum(r.loose[-DRIFT_WINDOW:]) >= CONTEST_AT
                if must or (may and ch.choose(f"contest:{ref}", [False, True])):
                    self.end_contest(r)
                    r.contested = True
                    self.set_ready(r, out, ("False", "Contested"), "Contested")
                    r.cluster_id = cid(target)
                    state.memory[r.cref] = frozenset({cid(target)})
                    return out
                drift_event = True
            elif changed:
                r.strict.clear()   # a takeover or a recovery: whether it is "drift" is not said
                drift_event = ch.choose(f"drift-event:{ref}", [False, True])
            else:
                r.strict.append(False)
                r.loose.append(False)
        if changed:
            if cluster.acl:   # Kafka authorizes before it validates
                self.remember_maybe(state, r, target)
                return self.fail(r, out, "KafkaRefused", retry=True)
            if r.kafka_refuses_spec() or cluster.policy:
                self.remember_maybe(state, r, target)
                return self.fail(r, out, "InvalidSpec", retry=False)
            state.kafka[target][name] = desired
            out.changed_kafka = True
            # "A Normal event Applied names the keys changed"; Drift "says what it was"
            keys = sorted(key for key in {*desired, *(current or {})} if (current or {}).get(key) != desired.get(key))
            out.said["Applied"] = out.said["Drift"] = [name] + (keys if current else [])
            if current is None:
                out.said["Drift"] = [name, "deleted"]
            if moved:
                out.required.append(("Normal", "Applied"))
                out.moved_event = True
            elif drift_event:
                out.required.append(("Warning", "Drift"))
            else:
                out.required.append(("Normal", "Applied"))
        self.set_ready(r, out, ("True", "Applied"))
        r.ever_ready, r.applied_name, r.cluster_id = True, name, cid(target)
        state.memory[r.cref] = frozenset({cid(target)})
        return out

    def end_contest(self, r: RRes) -> None:
        r.contested = False
        r.strict.clear()
        r.loose.clear()

    def delete(self, state: RState, ref: str, retry: int, ch: Chooser) -> Outcome:
        out = Outcome()
        r = state.res[ref]
        world = self.world
        self.learn(state, r)
        if r.found_ready:
            r.found_ready = "maybe"   # whether a resource being deleted still counts is not said
        name = r.claim_name()
        others = [c for c in state.res.values() if c.ref != ref and not c.deleting and c.claim_name() == name]
        same = [c for c in others if self.same_cluster(state, r, c, ch)]
        if any(c.age < r.age for c in same):   # "Deleting a non-owner never touches Kafka."
            out.notes.append("non-owner")
            return self.release(state, r, out)
        if same:   # left for the newer ones, whatever the policy; they are marked and reconcile at once
            if world.kube_failing:
                self.set_ready(r, out, ("False", "KubernetesError"), "KubernetesError")
                out.ready_prefix, out.retry = "deletion held: could not mark", True
                return out
            for heir in same:
                heir.marked_by = r.ref
            out.woken = frozenset(heir.ref for heir in same)
            out.notes.append("heirs-marked")
            return self.release(state, r, out)
        # "One deleted together with the owner was handed nothing: the owner's policy decides." (a non-owner, even
        # one that applied the subscription before the owner took it over)
        if r.with_owner:
            out.notes.append("deleted-with-owner")
            return self.release(state, r, out)
        if r.paused or r.policy == "Retain":
            out.notes.append("paused-or-retain")
            return self.release(state, r, out)
        named_too = [c for c in state.res.values() if c.ref != ref and c.claim_name() == name]
        inherited = False
        if r.marked_by:
            if not named_too:
                inherited = True
            for c in named_too:
                if c.deleting and c.ref == r.marked_by and self.same_cluster(state, r, c, ch):
                    inherited = inherited or bool(c.cluster_id) or ch.choose(f"unapplied-owner:{ref}",
                                                                             [False, True])
        if inherited and not r.ever_ready:
            out.notes.append("inherited")
        if not r.ever_ready and not inherited:
            out.notes.append("never-applied")
            return self.release(state, r, out)
        gone = False
        if r.cref is None:
            target = "k1"
        elif world.kube_failing:
            return self.held(r, out, name, "KubernetesError")
        elif world.target(r.cref) is None:
            gone = True
            if r.cref not in state.last_good:
                out.notes.append("gone-no-settings")
                return self.retry_or_let_go(state, r, out, retry, ch)
            target = state.last_good[r.cref]
        else:
            target = state.last_good[r.cref] = world.target(r.cref)
        cluster = world.clusters[target]
        keeper = self.older_owner(state, r, others, target, ch)
        if keeper is not None and not cluster.up and ch.choose(f"down-first:{ref}", [False, True]):
            keeper = None
        if keeper is not None:
            out.notes.append("older-after-connect")
            return self.release(state, r, out)
        unreachable = not cluster.up or self.restarted(state, r, target, ch)
        if unreachable or cluster.acl == "all":
            if gone:
                out.notes.append("gone-unreachable")
                out.kafka_error = "KafkaUnavailable" if unreachable else "KafkaRefused"
                return self.retry_or_let_go(state, r, out, retry, ch)
            return self.held(r, out, name, "KafkaUnavailable" if unreachable else "KafkaRefused")
        if name not in state.kafka[target]:   # "an already-missing one is success"
            out.notes.append("already-missing")
            return self.release(state, r, out)
        if cluster.acl:
            # Only "A resource whose KafkaConnection is still there waits for ... one that refuses the removal with
            # KafkaRefused"; one whose KafkaConnection is gone is let go after three tries, "instead of holding the
            # resource (and its namespace) forever". The refused IncrementalAlterConfigs is a "Kafka call that
            # failed" (kcm_operator_kafka_errors_total).
            if gone:
                out.notes.append("gone-refused")
                out.kafka_error = "KafkaRefused"
                return self.retry_or_let_go(state, r, out, retry, ch)
            return self.held(r, out, name, "KafkaRefused")
        if cluster.policy:   # "a removal Kafka refuses outright ... is tried three times and then let go"
            out.notes.append("removal-refused")
            return self.retry_or_let_go(state, r, out, retry, ch)
        del state.kafka[target][name]
        out.notes.append("removed")
        return self.release(state, r, out)

    def held(self, r: RRes, out: Outcome, name: str, reason: str) -> Outcome:
        self.set_ready(r, out, ("False", reason), reason)
        out.ready_prefix, out.retry = HELD_PREFIX.format(name), True
        return out

    def retry_or_let_go(self, state: RState, r: RRes, out: Outcome, retry: int, ch: Chooser) -> Outcome:
        out.ready_any = True
        # "three tries (1, 2 and 4 s apart)": three retries after the first attempt, or three attempts in all
        if retry >= 3 or (retry == 2 and ch.choose(f"let-go-early:{r.ref}", [False, True])):
            out.required.append(("Warning", "NotRemoved"))
            out.said["NotRemoved"] = [r.claim_name()]   # "saying which subscription stays in Kafka"
            out.notes.append("let-go")
            return self.release(state, r, out)
        out.retry = True
        return out


# -- the driver: kopf, emulated ---------------------------------------------------------------------------------------

class Failure(AssertionError):
    pass


class Scenario:
    def __init__(self, seed: int | str, monkeypatch, tmp_path) -> None:
        self.seed, self.rng = seed, random.Random(seed)
        self.world = World()
        self.clock = Clock()
        self.reference = Reference(self.world)
        self.state = RState(kafka={key: {} for key in CLUSTERS})
        self.events: list[tuple[str, str, str, str]] = []
        self.woken: list[str] = []
        self.trace: collections.deque[str] = collections.deque(maxlen=40)
        self.step, self.step_name = 0, "start"
        self.now_queue: dict[str, tuple[str, int]] = {}
        self.later_queue: dict[str, tuple[str, int]] = {}
        self.created_s, self.uids = 0, 0
        self.tmp_path = tmp_path
        world, clock = self.world, self.clock
        fake_time = types.SimpleNamespace(monotonic=clock.monotonic)
        monkeypatch.setattr(handlers, "time", fake_time)
        monkeypatch.setattr(admin_module, "time", fake_time)
        monkeypatch.setattr(handlers, "BatchedAdmin", lambda admin: admin_module.BatchedAdmin(admin, linger_s=0.0))
        monkeypatch.setattr(admin_module, "KafkaAdminClient", lambda **options: FakeAdminClient(world, **options))

        def reachable(settings: KafkaSettings, timeout_s: float = 10.0, stop: Any = None) -> None:
            if not world.clusters[SERVERS[settings.bootstrap_servers]].up:
                raise KafkaUnavailableError(f"Kafka at {settings.bootstrap_servers} does not answer (model)")

        monkeypatch.setattr(admin_module, "check_reachable", reachable)
        monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: self.events.append(
            (f"{body['metadata']['namespace']}/{body['metadata']['name']}", type, reason, message)))
        self.marked: list = []
        self.status_written: list = []
        # kubernetes.client, which connections.py reads KafkaConnections with and handlers.py marks heirs with
        monkeypatch.setattr(handlers.client, "CustomObjectsApi", lambda api_client=None: FakeCustomObjects(
            world, self.marked, self.status_written))
        self.loop = asyncio.new_event_loop()
        self.config: handlers.OperatorConfig | None = None
        self.start_operator()

    # -- the operator
    def start_operator(self) -> None:
        if self.config is not None:
            self.config.close()
        metrics.MANAGED.set(0)   # a new process starts from nothing
        resolver = ConnectionResolver(None, self.tmp_path)
        config = handlers.OperatorConfig(KafkaSettings(DEFAULT_SERVERS), drift_interval_s=60.0,
                                         resolve=resolver.resolve, kafka_timeout_s=10.0)
        # Never sent through: the custom objects API is the model's (the operator makes its writer from it).
        config.api_client = handlers.client.ApiClient(handlers.client.Configuration(host="http://127.0.0.1:9"))
        config.retired_admin_grace_s = lambda: 0.0
        registry = handlers.build_registry(config)
        self.handlers = {handler.id: handler for handler in registry._changing.get_all_handlers()}
        (self.drift_handler,) = registry._spawning.get_all_handlers()
        (self.index_handler,) = registry._indexing.get_all_handlers()
        self.config = config

    def close(self) -> None:
        if self.config is not None:
            self.config.close()
        self.loop.close()

    def index(self) -> dict[str, list]:
        claims: dict[str, list] = {}
        for obj in self.world.store.values():
            meta = obj["metadata"]
            for key, claim in self.index_handler.fn(namespace=meta["namespace"], name=meta["name"],
                                                    spec=obj["spec"], meta=meta, status=obj["status"]).items():
                claims.setdefault(key, []).append(claim)
        return claims

    # -- one handler call, checked
    def invoke(self, kind: str, ref: str, retry: int = 0) -> None:
        world = self.world
        obj = world.store[ref]
        before_status = copy.deepcopy(obj["status"])
        body, patch = kopf.Body(copy.deepcopy(obj)), kopf.Patch()
        self.patch = patch
        first_event = len(self.events)
        del self.marked[:]
        del self.status_written[:]
        self.first_event = first_event
        raised = None
        if kind == "drift":
            coroutine = self.drift_handler.fn(body=body, patch=patch, claims=self.index())
        elif kind == "delete":
            coroutine = self.handlers["delete"].fn(body=body, patch=patch, claims=self.index(), retry=retry)
        else:
            coroutine = self.handlers["reconcile"].fn(body=body, patch=patch, claims=self.index(), retry=retry,
                                                      old=None, new=None)
        counted = _counters()
        try:
            self.loop.run_until_complete(coroutine)
        except kopf.TemporaryError as exc:
            raised = exc
        counted = {key: value - counted.get(key, 0.0) for key, value in _counters().items()
                   if value != counted.get(key, 0.0)}
        self.counted = counted
        for written_ref, status in self.status_written:   # a drift check's, written by the operator itself
            assert kind == "drift" and written_ref == ref, (kind, written_ref)
            patch.status.update(status)
        for key, value in (patch.get("status") or {}).items():
            if value is None:
                obj["status"].pop(key, None)
            else:
                obj["status"][key] = copy.deepcopy(value)
        assert set(patch) <= {"status"}, f"the handler patched {set(patch)}"
        released = kind == "delete" and raised is None
        if released:
            del world.store[ref]
        events = [event for event in self.events[first_event:] if event[0] == ref]
        self.woken = [heir for heir, _ in self.marked]
        for heir, written in self.marked:   # "the annotation kcm.dev/owner-deleted, naming the owner"
            if set(written) != {OWNER_DELETED} or not written[OWNER_DELETED].startswith(ref):
                self.fail(f"{kind} {ref} marked {heir} with {written}")
        label = f"{kind} {ref} retry={retry}"
        self.trace.append(f"  call {label}: raised={raised is not None} events={[e[1:3] for e in events]} "
                          f"ready={'released' if released else (_cond(obj, 'Ready') or (None,))[:2]}")

        reference = self.reference
        if kind == "delete":
            function = lambda state, ch: reference.delete(state, ref, retry, ch)   # noqa: E731
        else:
            function = lambda state, ch: reference.reconcile(state, ref, kind, ch)   # noqa: E731
        branches = explore(function, self.state)
        actual_kafka = world.kafka()
        verdicts = []
        for outcome, branch, made in branches:
            problems = self.compare(kind, ref, outcome, branch, obj, before_status, actual_kafka, raised, released,
                                    events)
            verdicts.append((problems, outcome, branch, made))
        matching = [v for v in verdicts if not v[0]]
        if not matching:
            shown = "\n".join(f"  branch {made} {outcome.notes}: " + "; ".join(problems)
                              for problems, outcome, _, made in verdicts[:4])
            r = self.state.res.get(ref)
            self.fail(f"{label} differs from the docs' reference:\n{shown}\n  reference before the call: {r}")
        _, outcome, adopted, _ = matching[0]
        for key in set().union(*(m[2].memory for m in matching)):
            adopted.memory[key] = frozenset().union(*(m[2].memory.get(key, frozenset({None})) for m in matching))
        if outcome.ready_any and ref in adopted.res:
            ready = _cond(obj, "Ready")
            adopted.res[ref].ready = ready[:2] if ready else None
            if ready:
                adopted.res[ref].ready_gen = ready[3]
        self.state, self.outcome = adopted, outcome
        self.generic_checks(kind, ref, obj, before_status, patch, released)
        if raised is not None and kind != "drift":
            self.later_queue[ref] = (kind, retry + 1)
        for heir in self.woken:
            if heir in world.store and not world.store[heir]["metadata"].get("deletionTimestamp"):
                self.now_queue[heir] = ("change", 0)   # an annotation change: kopf calls the update handler
                self.later_queue.pop(heir, None)

    def compare(self, kind, ref, outcome: Outcome, branch: RState, obj, before_status, actual_kafka, raised,
                released, events) -> list[str]:
        problems = []
        if actual_kafka != branch.kafka:
            for key in CLUSTERS:
                if actual_kafka[key] != branch.kafka[key]:
                    problems.append(f"Kafka {key}: is {_show(actual_kafka[key])}, want {_show(branch.kafka[key])}")
        if kind != "drift" and (raised is not None) != outcome.retry:
            problems.append(f"retried: {raised is not None} ({raised}), want {outcome.retry}")
        if released != outcome.released:
            problems.append(f"let go: {released}, want {outcome.released}")
        if set(self.woken) != set(outcome.woken):
            problems.append(f"heirs marked: {sorted(self.woken)}, want {sorted(outcome.woken)}")
        r = branch.res.get(ref)
        if r is not None and not released:
            ready = _cond(obj, "Ready")
            if not outcome.ready_any:
                if (ready[:2] if ready else None) != r.ready:
                    problems.append(f"Ready {ready[:3] if ready else None}, want {r.ready}")
                elif ready and ready[3] != r.ready_gen:
                    problems.append(f"Ready describes generation {ready[3]}, want {r.ready_gen}")
            if ready and outcome.ready_msg and outcome.ready_msg not in ready[2]:
                problems.append(f"Ready message {ready[2]!r} does not say {outcome.ready_msg!r}")
            if ready and outcome.ready_prefix and not ready[2].startswith(outcome.ready_prefix):
                problems.append(f"Ready message {ready[2]!r} does not start {outcome.ready_prefix!r}")
            paused = _cond(obj, "Paused")
            paused_status = paused[0] if paused else None
            if (r.paused_cond is None and paused_status not in (None, "False")) or (
                    r.paused_cond is not None and paused_status != r.paused_cond):
                problems.append(f"Paused {paused_status}, want {r.paused_cond}")
            status = obj["status"]
            if status.get("clusterId") != r.cluster_id:
                problems.append(f"status.clusterId {status.get('clusterId')}, want {r.cluster_id}")
            if ready and ready[0] == "True":
                if status.get("subscriptionName") != r.spec_name():
                    problems.append(f"status.subscriptionName {status.get('subscriptionName')}, want {r.spec_name()}")
            if kind != "delete" and not outcome.skipped and status.get("observedGeneration") != r.generation:
                problems.append(f"observedGeneration {status.get('observedGeneration')}, want {r.generation}")
        # events: Warnings and Normal Applied, as the reference expects them
        posted = collections.Counter((event[1], event[2]) for event in events
                                     if event[1] == "Warning" or event[2] == "Applied")
        required = collections.Counter(outcome.required)
        missing = required - posted
        extra = posted - required
        if missing:
            problems.append(f"events missing: {dict(missing)} (posted {dict(posted)})")
        for event, count in extra.items():
            if event not in outcome.optional or count > 1:
                problems.append(f"event not expected: {event} x{count} (posted {[e[1:] for e in events]})")
        problems += self.compare_metrics(kind, outcome, branch, r, events)
        for event in events:
            missing_words = [word for word in outcome.said.get(event[2], ()) if word not in event[3]]
            if missing_words:
                problems.append(f"{event[1]} {event[2]} event {event[3]!r} does not say {missing_words}")
        if kind != "delete" and r is not None and not released and \
                ("lastAppliedTime" in (self.patch.get("status") or {})) != outcome.changed_kafka:
            problems.append(f"lastAppliedTime written: {not outcome.changed_kafka}, want {outcome.changed_kafka}")
        if outcome.moved_event and not any("moved to Kafka cluster" in event[3] for event in events):
            problems.append(f"no Applied event says the subscription moved: {[e[1:] for e in events]}")
        if not outcome.moved_event and any("moved to Kafka cluster" in event[3] for event in events):
            problems.append("an Applied event says moved, but the subscription did not move")
        return problems

    def compare_metrics(self, kind, outcome: Outcome, branch: RState, r: RRes | None, events) -> list[str]:
        """The documented metrics: one reconciliation per reconcile (result, and reason as on the Ready condition),
        Kafka calls that failed, drift corrections, and the resources this replica last found Ready."""
        problems = []
        want: dict = {}
        if kind != "delete" and not outcome.skipped and r is not None:
            if r.paused:
                want[("reconciliations", "skipped", "Paused")] = 1
            elif r.ready == ("True", "Applied"):
                want[("reconciliations", "applied" if outcome.changed_kafka else "unchanged", "Applied")] = 1
            elif r.ready is not None:
                want[("reconciliations", "failed", r.ready[1])] = 1
        if outcome.kafka_error:
            want[("kafka_errors", outcome.kafka_error)] = 1
        drifts = sum(1 for event in events if event[2] == "Drift")
        if drifts:
            want[("drift_corrections",)] = drifts
        counted = {key: value for key, value in self.counted.items() if key != ("managed",)}
        if counted != want:
            problems.append(f"metrics counted {counted}, want {want}")
        managed = metrics.MANAGED._value.get()
        must = sum(1 for c in branch.res.values() if c.found_ready is True)
        may = sum(1 for c in branch.res.values() if c.found_ready == "maybe")
        if not must <= managed <= must + may:
            problems.append(f"kcm_operator_managed_subscriptions {managed}, want {must} (+ up to {may} being deleted)")
        return problems

    def generic_checks(self, kind, ref, obj, before_status, patch, released) -> None:
        """"Conditions are written only when status, reason, message or the generation they describe change, so a
        quiet cluster causes no writes"; and a Warning whenever the Ready condition changes, none when it does not."""
        status_patch = patch.get("status") or {}
        for key, value in status_patch.items():
            if key == "conditions":
                old = {c["type"]: _key(c) for c in before_status.get("conditions") or ()}
                if all(old.get(c["type"]) == _key(c) for c in value):
                    self.fail(f"{kind} {ref}: rewrote unchanged conditions {value}")
            elif before_status.get(key) == value and key != "lastAppliedTime":
                self.fail(f"{kind} {ref}: rewrote unchanged status.{key} = {value!r}")
        if released:
            return
        before = {c["type"]: _key(c) for c in before_status.get("conditions") or ()}.get("Ready")
        after = _cond(obj, "Ready")
        if after and before == after and any(event[0] == ref and event[1] == "Warning" and event[2] == after[1]
                                             for event in self.events[self.first_event:]):
            self.fail(f"{kind} {ref}: a Warning {after[1]} although the Ready condition did not change")

    def fail(self, message: str) -> None:
        trace = "\n".join(self.trace)
        if isinstance(self.seed, str):
            where, again = f"scenario {self.seed}", f"-k {self.seed}"
        else:
            where = f"seed={self.seed}"
            again = (f"-k 'seed{self.seed}]' with KCM_MODEL_SEEDS={max(SEEDS, self.seed + 1)} "
                     f"KCM_MODEL_STEPS={STEPS}")
        raise Failure(f"{where} step={self.step} ({self.step_name}): {message}\nlast steps:\n{trace}\n"
                      f"reproduce: pytest tests/test_operator_model.py {again}")

    # -- kopf's queue
    def settle(self, rounds: int = 4) -> None:
        for round_ in range(rounds):
            if round_ > 0:
                if not self.later_queue:
                    return
                self.clock.now += 11.0
                self.now_queue.update(self.later_queue)
                self.later_queue = {}
            while self.now_queue:
                ref, (kind, retry) = next(iter(self.now_queue.items()))
                del self.now_queue[ref]
                if ref not in self.world.store:
                    continue
                deleting = bool(self.world.store[ref]["metadata"].get("deletionTimestamp"))
                if deleting and kind != "delete":
                    kind, retry = "delete", 0
                self.invoke(kind, ref, retry)

    def queue(self, ref: str, kind: str) -> None:
        old = self.later_queue.pop(ref, None) or self.now_queue.get(ref)
        retry = old[1] if old and old[0] == kind == "delete" else 0
        self.now_queue[ref] = (kind, retry)

    def drift_tick(self) -> None:
        self.clock.now += 60.0
        refs = list(self.world.store)
        self.rng.shuffle(refs)
        for ref in refs:
            if ref in self.world.store:
                self.invoke("drift", ref)

    # -- Kubernetes edits
    def create(self, ns: str, name: str, spec: dict, paused: bool = False) -> None:
        ref = f"{ns}/{name}"
        self.created_s += self.rng.choice((0, 1, 1, 2))   # 0: the same second as the previous one (a tie)
        created = f"2026-01-01T{self.created_s // 3600:02d}:{self.created_s // 60 % 60:02d}:" \
                  f"{self.created_s % 60:02d}Z"
        self.uids += 1
        uid = f"uid-{self.uids:04d}"
        annotations = {PAUSED: "true"} if paused else {}
        obj = {"apiVersion": "kcm.dev/v1alpha1", "kind": "ClientMetricsSubscription",
               "metadata": {"namespace": ns, "name": name, "uid": uid, "creationTimestamp": created,
                            "generation": 1, "annotations": annotations, "finalizers": [handlers.FINALIZER]},
               "spec": copy.deepcopy(spec), "status": {}}
        assert not _refused(obj["spec"]), f"the generator made a resource the API server refuses: {obj['spec']}"
        self.world.store[ref] = obj
        self.state.res[ref] = RRes(ns, name, uid, created, copy.deepcopy(spec), paused=paused)
        self.queue(ref, "change")

    def edit_spec(self, ref: str, spec: dict, handle: bool = True) -> None:
        obj = self.world.store[ref]
        if spec == obj["spec"]:
            return
        assert not _refused(spec), f"the generator made a spec the API server refuses: {spec}"
        obj["spec"] = copy.deepcopy(spec)
        obj["metadata"]["generation"] += 1
        r = self.state.res[ref]
        r.spec, r.generation = copy.deepcopy(spec), r.generation + 1
        if handle and not obj["metadata"].get("deletionTimestamp"):
            self.queue(ref, "change")

    def set_paused(self, ref: str, paused: bool) -> None:
        obj = self.world.store[ref]
        annotations = obj["metadata"]["annotations"]
        if paused:
            annotations[PAUSED] = "true"
        else:
            annotations.pop(PAUSED, None)
        self.state.res[ref].paused = paused
        if not obj["metadata"].get("deletionTimestamp"):
            self.queue(ref, "change")

    def mark_deleted(self, ref: str) -> None:
        obj = self.world.store[ref]
        if not obj["metadata"].get("deletionTimestamp"):
            obj["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
            self.state.res[ref].deleting = True
        self.queue(ref, "delete")

    def delete_then_heirs(self, ref: str) -> list[str]:
        """Delete `ref`; the heirs its deletion marks are deleted too before their update handler runs."""
        self.mark_deleted(ref)
        _, retry = self.now_queue.pop(ref)
        self.invoke("delete", ref, retry)
        heirs = list(self.woken)
        for heir in heirs:
            self.now_queue.pop(heir, None)
            self.mark_deleted(heir)
        return heirs

    def delete_together(self, refs: list[str]) -> None:
        for ref in refs:
            self.mark_deleted(ref)
        for ref in refs:   # a non-owner (Conflict) deleted with the owner its Conflict names
            r = self.state.res[ref]
            r.with_owner = r.ready == ("False", "Conflict") and r.conflict_owner in refs

    # -- out-of-band changes
    def by_hand(self, key: str, name: str, ops: list) -> None:
        cluster = self.world.clusters[key]
        cluster.by_hand(name, ops)
        if name in cluster.configs:
            self.state.kafka[key][name] = normalize(cluster.configs[name])
        else:
            self.state.kafka[key].pop(name, None)

    def random_drift(self, key: str, name: str) -> str:
        cluster = self.world.clusters[key]
        current = cluster.configs.get(name)
        if current is None:
            self.by_hand(key, name, [("metrics", cm.OP_SET, "*"), ("interval.ms", cm.OP_SET, "1000")])
            return f"made {name} on {key} by hand"
        choice = self.rng.randrange(6)
        lists = [key for key in ("metrics", "match") if len(current.get(key, "").split(",")) > 1]
        if choice == 5 and lists:   # the same lists in another order: no change at all ("lists compare as sets")
            config = self.rng.choice(lists)
            ops = [(config, cm.OP_SET, ",".join(reversed(current[config].split(","))))]
        elif choice == 0:
            values = [v for v in ("100", "5000", "60000", "1000000") if v != current.get("interval.ms")]
            ops = [("interval.ms", cm.OP_SET, self.rng.choice(values))]
        elif choice == 1:
            ops = [("metrics", cm.OP_SET, "org.apache.kafka.drift.")]
        elif choice == 2:
            ops = [("match", cm.OP_SET, self.rng.choice(("client_id=rogue-.*", "client_software_name=x")))]
        elif choice == 3 and "match" in current:
            ops = [("match", cm.OP_DELETE, None)]
        else:
            ops = [(config, cm.OP_DELETE, None) for config in current]
        self.by_hand(key, name, ops)
        return f"{name} on {key} changed by hand: {ops}"

    # -- the generator
    def random_spec(self, ns: str) -> dict:
        rng = self.rng
        spec: dict[str, Any] = {"metrics": list(rng.choice(METRICS))}
        interval = rng.choice(INTERVALS)
        if interval is not None:
            spec["intervalMs"] = interval
        match = self.random_match()
        if match:
            spec["match"] = match
        sub = rng.choice(SUB_NAMES)
        if sub:
            spec["subscriptionName"] = sub
        connection = rng.choice(CONNECTIONS)
        if connection:
            spec["connection"] = connection
        policy = rng.choice((None, None, "Delete", "Retain"))
        if policy:
            spec["deletionPolicy"] = policy
        return spec

    def random_match(self) -> dict:
        rng = self.rng
        if rng.random() < 0.5:
            return {}
        fields = rng.sample(sorted(MATCH_KEYS), rng.choice((1, 1, 2)))
        match = {key: rng.choice(GOOD_PATTERNS) for key in fields}
        if rng.random() < 0.1:
            match[fields[0]] = rng.choice(BAD_PATTERNS)
        return match

    def live(self) -> list[str]:
        return [ref for ref, obj in self.world.store.items() if not obj["metadata"].get("deletionTimestamp")]

    def managed(self) -> list[tuple[str, str]]:
        """(cluster, subscription) pairs some resource last applied."""
        return sorted({(r.cluster_id[3:], r.applied_name) for r in self.state.res.values()
                       if r.ready in (("True", "Applied"), ("False", "Contested")) and r.cluster_id
                       and r.applied_name})

    def random_event(self) -> str:
        rng, world = self.rng, self.world
        live = self.live()
        free = [(ns, name) for ns in NAMESPACES for name in NAMES if f"{ns}/{name}" not in world.store]
        weights = {
            "create": 6 if free and len(live) < 7 else 0,
            "edit": 6 if live else 0,
            "rename": 1 if live else 0,
            "pause": 2 if live else 0,
            "delete": 3 if live else 0,
            "bulk-delete": 1 if len(live) > 1 else 0,
            "owner-then-heirs": 1 if len(live) > 1 else 0,
            "drift": 4,
            "fight": 1 if self.managed() else 0,
            "tick": 4,
            "race-edit": 1 if live else 0,
            "race-delete": 1 if live else 0,
            "troubled-delete": 2 if live else 0,
            "cluster": 3,
            "connection": 2,
            "kube": 1,
            "restart": 2,
            "wait": 2,
        }
        kind = rng.choices(list(weights), list(weights.values()))[0]
        self.step_name = f"{kind} (under way)"
        if kind == "create":
            ns, name = rng.choice(free)
            spec = self.random_spec(ns)
            paused = rng.random() < 0.1
            self.create(ns, name, spec, paused)
            return f"create {ns}/{name} {spec}{' paused' if paused else ''}"
        if kind in ("edit", "race-edit"):
            ref = rng.choice(live)
            spec = copy.deepcopy(world.store[ref]["spec"])
            what = rng.choice(("metrics", "intervalMs", "match", "deletionPolicy"))
            if what == "metrics":
                spec["metrics"] = list(rng.choice(METRICS))
            elif what == "intervalMs":
                spec["intervalMs"] = rng.choice([i for i in INTERVALS if i])
            elif what == "match":
                match = self.random_match()
                spec.pop("match", None)
                if match:
                    spec["match"] = match
            else:
                spec["deletionPolicy"] = rng.choice(("Delete", "Retain"))
            if kind == "race-edit":   # a drift check sees the edit before the update handler runs
                self.edit_spec(ref, spec, handle=False)
                self.clock.now += 60.0
                self.invoke("drift", ref)
                self.queue(ref, "change")
                return f"edit {ref} {what} during a drift check: {spec}"
            self.edit_spec(ref, spec)
            return f"edit {ref} {what}: {spec}"
        if kind == "rename":
            ref = rng.choice(live)
            spec = copy.deepcopy(world.store[ref]["spec"])
            r = self.state.res[ref]
            if r.applied_name and r.applied_name != r.spec_name() and rng.random() < 0.6:
                new = r.applied_name   # set it back
            else:
                new = rng.choice([n for n in ("shared", "other", "renamed", None) if n != spec.get("subscriptionName")])
            if new is None or new == f"{r.ns}.{r.name}":
                spec.pop("subscriptionName", None)
            else:
                spec["subscriptionName"] = new
            self.edit_spec(ref, spec)
            return f"rename {ref} to {new} (the API server does not check the CEL rule)"
        if kind == "pause":
            ref = rng.choice(list(world.store))
            paused = PAUSED not in world.store[ref]["metadata"]["annotations"]
            self.set_paused(ref, paused)
            return f"{'pause' if paused else 'unpause'} {ref}"
        if kind == "delete":
            ref = rng.choice(live)
            self.mark_deleted(ref)
            return f"delete {ref}"
        if kind == "bulk-delete":
            refs = rng.sample(live, min(len(live), rng.choice((2, 3))))
            pairs = [(ref, r.conflict_owner) for ref, r in self.state.res.items() if ref in live
                     and r.ready == ("False", "Conflict") and r.conflict_owner in live]
            if pairs and rng.random() < 0.6:   # a non-owner with its owner
                refs = list(rng.choice(pairs))
                rng.shuffle(refs)
            self.delete_together(refs)
            return f"delete {refs} together (a namespace, kubectl delete -f dir/)"
        if kind == "owner-then-heirs":
            ref = rng.choice(live)
            heirs = self.delete_then_heirs(ref)
            return f"delete {ref}, then the resources it marked before they reconcile: {heirs}"
        if kind == "drift":
            pairs = self.managed()
            if pairs and rng.random() < 0.8:
                key, name = rng.choice(pairs)
            else:
                key, name = rng.choice(CLUSTERS), rng.choice(("shared", "other", "team-a.p1", "team-b.p2"))
            if not world.clusters[key].up:
                return "drift skipped: cluster down"
            return self.random_drift(key, name)
        if kind == "fight":
            key, name = rng.choice(self.managed())
            said = []
            for _ in range(rng.choice((4, 5, 6))):
                if world.clusters[key].up and name in world.clusters[key].configs:
                    value = rng.choice(("100", "200", "5000", "7000"))
                    self.by_hand(key, name, [("interval.ms", cm.OP_SET, value)])
                    said.append(value)
                self.drift_tick()
                self.settle()
            owners = [r for r in self.state.res.values() if r.applied_name == name and r.cluster_id == cid(key)]
            end = rng.choice(("goes on", "sets it back", "lets go"))
            if owners and world.clusters[key].up and name in world.clusters[key].configs and end != "goes on":
                desired = owners[0].desired()
                if end == "lets go":   # "the subscription gone from Kafka (the other side let go of it)"
                    held = world.clusters[key].configs[name]
                    self.by_hand(key, name, [(config, cm.OP_DELETE, None) for config in held])
                else:   # "Kafka found as specified"
                    self.by_hand(key, name, [
                        ("metrics", cm.OP_SET, ",".join(sorted(desired["metrics"]))),
                        ("interval.ms", cm.OP_SET, str(desired["interval.ms"])),
                        ("match", cm.OP_SET, ",".join(f"{k}={v}" for k, v in sorted(desired["match"])))
                        if "match" in desired else ("match", cm.OP_DELETE, None)])
                self.drift_tick()
                self.settle()
            return f"someone else keeps setting {name} on {key}: interval.ms {said}, then {end}"
        if kind == "tick":
            self.drift_tick()
            return "drift checks"
        if kind == "race-delete":
            ref = rng.choice(live)
            obj = world.store[ref]
            obj["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
            self.state.res[ref].deleting = True
            self.clock.now += 60.0
            self.invoke("drift", ref)
            self.queue(ref, "delete")
            return f"delete {ref} during a drift check"
        if kind == "troubled-delete":   # its KafkaConnection gone and/or its cluster in trouble, then deleted
            ref = rng.choice(live)
            r = self.state.res[ref]
            said = []
            if r.cref is not None and r.cref in world.connections and rng.random() < 0.5:
                del world.connections[r.cref]
                said.append(f"KafkaConnection {r.cref} deleted")
            target = world.target(r.cref) or self.state.last_good.get(r.cref) or rng.choice(CLUSTERS)
            cluster = world.clusters[target]
            trouble = rng.choice(("down", "all", "alter", "policy", "none"))
            if trouble == "down":
                cluster.up = False
            elif trouble in ("all", "alter"):
                cluster.acl = trouble
            elif trouble == "policy":
                cluster.policy = True
            self.mark_deleted(ref)
            return f"delete {ref} ({', '.join(said)}; cluster {target}: {trouble})"
        if kind == "cluster":
            cluster = world.clusters[rng.choice(CLUSTERS)]
            flag = rng.choices(("up", "telemetry", "acl", "policy"), (5, 2, 2, 2))[0]
            if flag == "telemetry":
                self.flip_telemetry(cluster)
            elif flag == "acl":
                cluster.acl = rng.choice([mode for mode in ("", "all", "alter") if mode != cluster.acl])
            else:
                setattr(cluster, flag, not getattr(cluster, flag))
            return f"cluster {cluster.key}: {flag} = {getattr(cluster, flag)}"
        if kind == "connection":
            cref = (rng.choice(NAMESPACES), rng.choice(("remote", "alt")))
            if cref in world.connections and rng.random() < 0.5:
                if cref[1] == "remote":
                    world.connections[cref] = "k3:9092" if world.connections[cref] == "k2:9092" else "k2:9092"
                    return f"KafkaConnection {cref} now names {world.connections[cref]}"
                del world.connections[cref]
                return f"KafkaConnection {cref} deleted"
            if cref in world.connections and rng.random() < 0.3:
                del world.connections[cref]
                return f"KafkaConnection {cref} deleted"
            if cref in world.connections:
                return "KafkaConnection left as it is"
            world.connections[cref] = "k2:9092" if cref[1] == "remote" else "k1-alt:9092"
            return f"KafkaConnection {cref} created: {world.connections[cref]}"
        if kind == "kube":
            world.kube_failing = not world.kube_failing
            return f"Kubernetes API failing = {world.kube_failing}"
        if kind == "restart":
            self.restart()
            return "operator restart"
        return "time passes"

    def heal_some(self) -> None:
        rng, world = self.rng, self.world
        if rng.random() < 0.35:
            sick = [(c, flag) for c in world.clusters.values() for flag in ("up", "telemetry", "acl", "policy")
                    if bool(getattr(c, flag)) != (flag in ("up", "telemetry"))]
            if sick:
                cluster, flag = rng.choice(sick)
                if flag == "telemetry":
                    self.flip_telemetry(cluster)
                else:
                    setattr(cluster, flag, flag in ("up", "telemetry") if flag != "acl" else "")
                self.trace.append(f"  heal: cluster {cluster.key} {flag}")
        missing = [(ns, conn) for ns in NAMESPACES for conn in ("remote", "alt") if (ns, conn) not in world.connections]
        if missing and rng.random() < 0.15:
            cref = rng.choice(missing)
            world.connections[cref] = "k2:9092" if cref[1] == "remote" else "k1-alt:9092"
            self.trace.append(f"  heal: KafkaConnection {cref} created again")
        if world.kube_failing and rng.random() < 0.4:
            world.kube_failing = False
            self.trace.append("  heal: Kubernetes API answers")

    def flip_telemetry(self, cluster: Cluster) -> None:
        """The receiver plugin added or taken out: the brokers restart, so connections made before break."""
        cluster.telemetry = not cluster.telemetry
        cluster.epoch += 1
        keys = [None, *((ns, conn) for ns in NAMESPACES for conn in ("remote", "alt"))]
        self.state.stale |= {(key, cluster.key) for key in keys}

    def restart(self) -> None:
        self.start_operator()
        self.state.memory, self.state.last_good = {}, {}
        for r in self.state.res.values():
            self.reference.end_contest(r)
            r.found_ready = False
        self.now_queue, later = {}, self.later_queue
        self.later_queue = {}
        for ref, obj in self.world.store.items():
            if obj["metadata"].get("deletionTimestamp"):
                old = later.get(ref)
                self.now_queue[ref] = ("delete", old[1] if old and old[0] == "delete" else 0)
            else:
                self.now_queue[ref] = ("resume", 0)

    # -- a whole scenario
    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.begin_step()
            self.heal_some()
            self.step_name = self.random_event()
            self.trace.append(f"step {self.step}: {self.step_name}")
            self.settle()
        self.finish()

    def begin_step(self) -> None:
        """Time passes (more than the 10 s a failed connect is remembered); retries that are due run."""
        self.step += 1
        self.clock.now += 11.0
        self.now_queue.update({ref: item for ref, item in self.later_queue.items() if ref not in self.now_queue})
        self.later_queue = {}

    def do(self, name: str, action=lambda: None) -> None:
        """One step of a directed scenario."""
        self.begin_step()
        self.step_name = name
        self.trace.append(f"step {self.step}: {name}")
        action()
        self.settle()

    def finish(self) -> None:
        self.step_name = "final: everything healed, edits undone, a restart, two drift intervals"
        self.trace.append(f"step {self.step + 1}: {self.step_name}")
        self.step += 1
        world = self.world
        for cluster in world.clusters.values():
            if not cluster.telemetry:
                self.flip_telemetry(cluster)
            cluster.up, cluster.acl, cluster.policy = True, "", False
        world.kube_failing = False
        for ns in NAMESPACES:
            world.connections.setdefault((ns, "remote"), "k2:9092")
            world.connections.setdefault((ns, "alt"), "k1-alt:9092")
        for ref in list(world.store):
            r = self.state.res[ref]
            if PAUSED in world.store[ref]["metadata"]["annotations"]:
                self.set_paused(ref, False)
            spec = copy.deepcopy(world.store[ref]["spec"])
            if r.ever_ready and r.applied_name and r.applied_name != r.spec_name():
                if r.applied_name == f"{r.ns}.{r.name}":
                    spec.pop("subscriptionName", None)
                else:
                    spec["subscriptionName"] = r.applied_name
            for key, value in (spec.get("match") or {}).items():
                if value in BAD_PATTERNS:
                    spec["match"][key] = GOOD_PATTERNS[0]
            self.edit_spec(ref, spec)
        self.later_queue.update(self.now_queue)
        self.now_queue = {}
        for _ in range(6):
            self.clock.now += 11.0
            self.settle()
        self.restart()
        for _ in range(3):
            self.settle()
            self.drift_tick()
        self.settle()
        self.converged()

    def converged(self) -> None:
        """Every cluster settled as the docs say: the oldest resource naming a subscription on a cluster owns it and
        Kafka holds its spec; the others are Conflict naming it."""
        world = self.world
        assert not self.later_queue and not self.now_queue, (self.later_queue, self.now_queue)
        groups: dict[tuple[str, str], list[RRes]] = {}
        for ref, obj in world.store.items():
            if obj["metadata"].get("deletionTimestamp"):
                self.fail(f"{ref} is still held after everything healed")
            r = self.state.res[ref]
            groups.setdefault((world.target(r.cref), r.claim_name()), []).append(r)
        for (key, name), claims in groups.items():
            owner, *rest = sorted(claims, key=lambda c: c.age)
            ready = _cond(world.store[owner.ref], "Ready")
            if not ready or ready[:2] != ("True", "Applied"):
                self.fail(f"converged: the owner {owner.ref} of {name} on {key} is {ready}")
            held = world.clusters[key].configs.get(name)
            if held is None or normalize(held) != owner.desired():
                self.fail(f"converged: {name} on {key} is {held}, want {owner.desired()} of {owner.ref}")
            for other in rest:
                ready = _cond(world.store[other.ref], "Ready")
                if not ready or ready[:2] != ("False", "Conflict") or owner.ref not in ready[2]:
                    self.fail(f"converged: {other.ref} names {name} on {key} after {owner.ref} but is {ready}")


_VALID: dict[str, list] = {}


def _refused(spec: dict) -> list:
    """Why the API server would refuse a resource with this spec (the CRD's schema and rules), cached."""
    key = repr(sorted(spec.items()))
    if key not in _VALID:
        _VALID[key] = schema.validate({"apiVersion": "kcm.dev/v1alpha1", "kind": "ClientMetricsSubscription",
                                       "metadata": {"namespace": "team-a", "name": "p1"}, "spec": spec})
    return _VALID[key]


def _counters() -> dict:
    """The operator's Prometheus counters and gauge now (prometheus_client's children, read directly: fast)."""
    counts: dict = {("managed",): metrics.MANAGED._value.get(),
                    ("drift_corrections",): metrics.DRIFT_CORRECTIONS._value.get()}
    for name, metric in (("reconciliations", metrics.RECONCILIATIONS), ("kafka_errors", metrics.KAFKA_ERRORS)):
        for labels, child in list(metric._metrics.items()):
            counts[(name, *labels)] = child._value.get()
    return counts


def _cond(obj: dict, kind: str) -> tuple | None:
    for condition in obj["status"].get("conditions") or ():
        if condition["type"] == kind:
            return (condition.get("status"), condition.get("reason"), condition.get("message") or "",
                    condition.get("observedGeneration"))
    return None


def _key(condition: dict) -> tuple:
    return (condition.get("status"), condition.get("reason"), condition.get("message"),
            condition.get("observedGeneration"))


def _show(subscriptions: dict) -> str:
    return "{" + ", ".join(f"{name}: {{" + ", ".join(f"{k}={sorted(v) if isinstance(v, frozenset) else v}"
                                                     for k, v in sorted(configs.items())) + "}"
                           for name, configs in sorted(subscriptions.items())) + "}"


# -- directed scenarios: rare paths of the docs, through the same driver and reference ------------------------------

PRODUCER = ["org.apache.kafka.producer."]


def _nonowner_that_applied_deleted_with_its_owner(sc: Scenario) -> None:
    """"Deleting a non-owner never touches Kafka"; "One deleted together with the owner was handed nothing: the
    owner's policy decides" -- also for a non-owner that applied the subscription before the older one took it."""
    sc.do("O, older, names 'other' with a pattern Kafka refuses", lambda: sc.create(
        "team-a", "p1", {"metrics": ["*"], "subscriptionName": "other", "match": {"clientId": "[unclosed"},
                         "deletionPolicy": "Retain"}))
    sc.do("H, newer, applies 'shared'", lambda: sc.create("team-a", "p2", {"metrics": PRODUCER,
                                                                          "subscriptionName": "shared"}))
    sc.do("O (never applied, so it may) renamed to 'shared' and fixed: the older owns it", lambda: sc.edit_spec(
        "team-a/p1", {"metrics": ["*"], "subscriptionName": "shared", "deletionPolicy": "Retain"}))
    sc.do("drift checks: H finds its owner", sc.drift_tick)
    sc.do("H and O deleted together (their namespace)", lambda: sc.delete_together(["team-a/p2", "team-a/p1"]))


def _gone_connection_and_alter_refused(sc: Scenario) -> None:
    """The KafkaConnection is gone (a namespace deleted) and the cluster refuses ALTER_CONFIGS: let go after three
    tries with NotRemoved, not held forever (that wait is for "A resource whose KafkaConnection is still there")."""
    sc.do("a subscription through team-a/remote", lambda: sc.create("team-a", "p1", {
        "metrics": PRODUCER, "intervalMs": 60000, "connection": "remote"}))
    sc.do("KafkaConnection team-a/remote deleted", lambda: sc.world.connections.pop(("team-a", "remote")))
    sc.do("cluster k2 lets the operator describe but not alter", lambda: setattr(sc.world.clusters["k2"], "acl",
                                                                                  "alter"))
    sc.do("the resource is deleted", lambda: sc.mark_deleted("team-a/p1"))
    sc.do("time passes")


def _contested_ends_as_documented(sc: Scenario) -> None:
    """Contested after three reverts within eight drift checks; ended by Kafka found as specified, by the subscription
    gone from Kafka, by a spec change and by a restart."""
    sc.do("a subscription", lambda: sc.create("team-b", "p1", {"metrics": PRODUCER, "intervalMs": 1000}))

    def fight(values):
        for value in values:
            sc.do(f"someone sets interval.ms {value}", lambda value=value: sc.by_hand(
                "k1", "team-b.p1", [("interval.ms", cm.OP_SET, value)]))
            sc.do("drift checks", sc.drift_tick)

    fight(["100", "200", "300", "400", "500"])
    sc.do("set back as specified", lambda: sc.by_hand("k1", "team-b.p1", [("interval.ms", cm.OP_SET, "1000")]))
    sc.do("drift checks", sc.drift_tick)
    fight(["100", "200", "300", "400", "500"])
    sc.do("the other side lets go", lambda: sc.by_hand("k1", "team-b.p1", [
        ("metrics", cm.OP_DELETE, None), ("interval.ms", cm.OP_DELETE, None)]))
    sc.do("drift checks", sc.drift_tick)
    fight(["100", "200", "300", "400"])
    sc.do("spec change", lambda: sc.edit_spec("team-b/p1", {"metrics": PRODUCER, "intervalMs": 2000}))
    fight(["100", "200", "300", "400", "500"])
    sc.do("operator restart", sc.restart)


def _heir_deleted_before_it_reconciles(sc: Scenario) -> None:
    """The owner hands the subscription over; the heir, deleted before it could reconcile, removes it."""
    sc.do("owner", lambda: sc.create("team-a", "p1", {"metrics": ["*"], "subscriptionName": "shared"}))
    sc.do("heir", lambda: sc.create("team-b", "p2", {"metrics": PRODUCER, "subscriptionName": "shared"}))
    sc.do("the owner is deleted, then the heir before it reconciles", lambda: sc.delete_then_heirs("team-a/p1"))


def _connection_pointed_elsewhere(sc: Scenario) -> None:
    """A KafkaConnection pointed at another cluster moves its subscriptions there at their next reconciliation
    ("moved to Kafka cluster", not drift); the first cluster keeps its copy."""
    sc.do("a subscription through team-a/remote", lambda: sc.create("team-a", "p1", {
        "metrics": PRODUCER, "connection": "remote", "subscriptionName": "shared"}))
    sc.do("team-a/remote now names k3", lambda: sc.world.connections.__setitem__(("team-a", "remote"), "k3:9092"))
    sc.do("drift checks", sc.drift_tick)
    sc.do("drift checks", sc.drift_tick)


def _owner_whose_connection_broke_before_a_restart(sc: Scenario) -> None:
    """"after a restart, a resource whose connection no longer works still owns its subscription there against newer
    resources naming it" (status.clusterId)."""
    sc.do("owner through team-b/alt (cluster k1)", lambda: sc.create("team-b", "p1", {
        "metrics": PRODUCER, "connection": "alt", "subscriptionName": "shared"}))
    sc.do("newer, on the default cluster (k1 too)", lambda: sc.create("team-a", "p2", {
        "metrics": ["*"], "subscriptionName": "shared"}))
    sc.do("KafkaConnection team-b/alt deleted", lambda: sc.world.connections.pop(("team-b", "alt")))
    sc.do("operator restart", sc.restart)
    sc.do("drift checks", sc.drift_tick)


def _edits_while_paused_and_renames(sc: Scenario) -> None:
    """Ready Unknown/Paused for an edit made while paused; a refused rename; deleting removes what it applied."""
    sc.do("a subscription", lambda: sc.create("team-a", "p3", {"metrics": PRODUCER, "subscriptionName": "other"}))
    sc.do("paused", lambda: sc.set_paused("team-a/p3", True))
    sc.do("edited while paused", lambda: sc.edit_spec("team-a/p3", {"metrics": ["*"], "subscriptionName": "other"}))
    sc.do("unpaused", lambda: sc.set_paused("team-a/p3", False))
    sc.do("renamed", lambda: sc.edit_spec("team-a/p3", {"metrics": ["*"], "subscriptionName": "renamed"}))
    sc.do("deleted", lambda: sc.mark_deleted("team-a/p3"))


DIRECTED = [_nonowner_that_applied_deleted_with_its_owner, _gone_connection_and_alter_refused,
            _contested_ends_as_documented, _heir_deleted_before_it_reconciles, _connection_pointed_elsewhere,
            _owner_whose_connection_broke_before_a_restart, _edits_while_paused_and_renames]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("directed", DIRECTED, ids=[d.__name__.strip("_") for d in DIRECTED])
def test_directed_sequences_keep_kafka_and_status_as_the_docs_say(directed, monkeypatch, tmp_path):
    scenario = Scenario(directed.__name__.strip("_"), monkeypatch, tmp_path)
    try:
        directed(scenario)
        scenario.finish()
    finally:
        scenario.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [pytest.param(seed, id=f"seed{seed}") for seed in range(SEEDS)])
def test_random_event_sequences_keep_kafka_and_status_as_the_docs_say(seed, monkeypatch, tmp_path):
    scenario = Scenario(seed, monkeypatch, tmp_path)
    try:
        scenario.run(STEPS)
    finally:
        scenario.close()
