"""kopf handlers: keep every ClientMetricsSubscription's CLIENT_METRICS resource in Kafka as its spec says.

One-way, like Strimzi's topic operator: create/update/resume/periodic drift checks apply only the difference,
a finalizer removes the subscription (deletionPolicy Delete) or leaves it (Retain), the oldest resource naming
a subscription owns it, and `kcm.dev/paused: "true"` stops reconciling.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import copy
import datetime
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import kafka.errors as kafka_errors
import kopf
import urllib3
from kubernetes import client

from kcm_common import client_metrics as cm
from kcm_common.kafka import KafkaConfigError, KafkaSettings
from kcm_operator import metrics, schema
from kcm_operator.admin import BATCH_SIZE, BatchedAdmin, Reachability, SubscriptionAdmin, servers_key, transport_key
from kcm_operator.connections import (PLURAL as CONNECTIONS, ConnectionStatuses, in_connection_terms,
                                      now_text)
from kcm_operator.errors import (RETRIED, InvalidSpecError, KafkaRefusedError, KafkaUnavailableError,
                                 KubernetesApiError, UnsupportedError, invalid_spec_message, reason_of)
from kcm_operator.reconcile import (
    DELETE_POLICY,
    RETAIN_POLICY,
    Change,
    Claim,
    Desired,
    cluster_ref,
    desired_from_spec,
    diff,
    drift,
    oldest_first,
    removal,
)

GROUP, VERSION = "kcm.dev", "v1alpha1"
SUBSCRIPTIONS = "clientmetricssubscriptions"
FINALIZER = "kcm.dev/subscription"
PAUSED_ANNOTATION = "kcm.dev/paused"
# Set on the resources naming a subscription when its owner is deleted: an annotation change makes them reconcile now,
# so the next one takes it over at once (not at its next drift check).
OWNER_DELETED_ANNOTATION = "kcm.dev/owner-deleted"
# Set by a drift check on a resource whose edit no handler has taken up for a whole drift interval: kopf saw it and
# did nothing (a kopf replica whose finalizer patch lost a race with another's skips the next event, and waits for
# another); an annotation change is an event, which it handles.
NUDGED_ANNOTATION = "kcm.dev/nudged"
KUBERNETES_TIMEOUT_S = (5.0, 10.0)  # connect, read: a Kubernetes API that hangs must not hold a handler thread
PROBE_TIMEOUT_S = (2.0, 2.0)  # start-up's look at whether the Kubernetes API answers
# A drift check's write is tried again, under the resource's lock, only after an answer the API server may not give
# the next time (429, 5xx) or a refused connection, never after a timeout (it already held the thread that long):
# WRITE_ATTEMPTS in all, waiting WRITE_BACKOFF_S, then twice that (or a Retry-After, up to WRITE_RETRY_AFTER_MAX_S).
# No attempt starts once WRITE_BUDGET_S have passed since the first began (an answer may take the whole read timeout).
WRITE_ATTEMPTS = 3
WRITE_BACKOFF_S = 0.5
WRITE_RETRY_AFTER_MAX_S = 2.0
WRITE_BUDGET_S = 5.0
STATE_PREFIX = "operator.kcm.dev"  # kopf's own annotations (handler progress, last handled spec)
PROGRESS = kopf.AnnotationsProgressStorage(prefix=STATE_PREFIX)
RECONCILE = kopf.HandlerId("reconcile")  # the change handlers' id: kopf keeps their retries' progress under it
MAX_BACKOFF_S = 60.0
LET_GO_AFTER_RETRIES = 3  # a deletion with no cluster to remove from waits 1 + 2 + 4 s for it to come back
CONTESTED_AFTER = 3  # reverts of drift, within the last CONTESTED_WINDOW drift checks, before kcm stops reverting
# Not "in a row": two operators checking at the same pace can each find their own value at every other check.
CONTESTED_WINDOW = 8
GONE_KEPT = 10_000  # uids of deleted resources kopf's index still names after a pause, remembered as gone
SWEEP_READS = 100  # of the resources in kopf's index no handler ran for, read at one sweep (`_sweep_soon`) at most
HANDLER_THREADS = 2 * BATCH_SIZE  # threads for the handlers' blocking work, all clusters together
CLUSTER_THREADS = BATCH_SIZE  # of which one cluster's resources may hold: enough to fill a batch

log = logging.getLogger("kcm.operator")


@dataclass
class OperatorConfig:
    """What `kcm operator` was started with; `resolve` maps a KafkaConnection reference to its settings."""

    settings: KafkaSettings
    drift_interval_s: float = 60.0
    resolve: Callable[[str, str], KafkaSettings] | None = None  # (namespace, connection name) → settings
    # The default cluster's settings as they are now (`--command-config` read again once its file changed: a Secret
    # rotated under it); None: `settings` for good. Raises KafkaConfigError.
    reload: Callable[[], KafkaSettings] | None = None
    # Where what reconciles find through a KafkaConnection is said on its status (the resolver's); None: not said.
    statuses: ConnectionStatuses | None = None
    kafka_timeout_s: float = 10.0
    command_config: str | None = None  # the `--command-config` file the default cluster's settings come from, if any
    # (namespace, connection) or None for the default cluster → (settings fingerprint, admin)
    admins: dict[tuple[str, str] | None, tuple[str, BatchedAdmin]] = field(default_factory=dict)
    # (namespace, connection) → (time.monotonic() when resolved, its settings or why not): drift checks reuse a
    # resolution this recent (within one drift interval) rather than read the KafkaConnection and its Secrets for
    # every resource; one at a time per connection (`resolving`), as resources applied together check together.
    resolved: dict[tuple[str, str], tuple[float, KafkaSettings | Exception]] = field(default_factory=dict)
    resolving: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)  # uids of Ready resources, for the managed-subscriptions gauge
    # (namespace, connection) or None → the Kafka cluster id last seen through it: a cluster's id never changes, so
    # ownership checks need not resolve and connect to every other resource's cluster at every event.
    cluster_ids: dict[tuple[str, str] | None, str] = field(default_factory=dict)
    # (namespace, connection) → (uid, generation, deleted) as the watch last brought it (`connection_seen`)
    connection_versions: dict[tuple[str, str], tuple[str, object, bool]] = field(default_factory=dict)
    # uid → the lock one resource's handlers take in turn: kopf runs its drift timer alongside its change handlers.
    resource_locks: dict[str, threading.Lock] = field(default_factory=dict)
    # uid → whether each of its latest drift checks (CONTESTED_WINDOW at most) found the subscription changed outside
    # kcm (under the resource's lock).
    drift_history: dict[str, collections.deque[bool]] = field(default_factory=dict)
    # uids kcm stopped reverting (Contested): remembered here, not read back from the status, which a drift check
    # may see before the watch has brought the last patch (each stale check would post the event again).
    # uid → the generation it was decided at: a spec change ends it, also one another replica applied while this one
    # was paused by peering (which this one's change handlers never see).
    contested: dict[str, int | None] = field(default_factory=dict)
    # uid → [the generation a drift check found no handler had taken up, whether it was nudged]
    unhandled: dict[str, list[Any]] = field(default_factory=dict)
    # uid → the KafkaConnection (None: the default cluster) its latest reconcile was for
    connection_of: dict[str, str | None] = field(default_factory=dict)
    # uids of other resources `read_claim` found gone (kopf's index keeps them after a pause), not read again: the
    # latest GONE_KEPT, in the order found (an older one is read again at worst)
    gone: dict[str, None] = field(default_factory=dict)
    # The sweep of kopf's index (`idle_claims`): uids a handler has run for since the last sweep, those no handler had
    # run for at the last, when that was (time.monotonic()), and the sweep under way.
    handled_since: set[str] = field(default_factory=set)
    idle_before: set[str] = field(default_factory=set)
    swept_at: float | None = None
    sweeping: asyncio.Future | None = None
    # drift checks a stop of their timer left to finish on their own (`_until_stopped`)
    left_running: set[asyncio.Future] = field(default_factory=set)
    # uids whose latest drift check could not write to the Kubernetes API (said once, until a write succeeds)
    unwritten: set[str] = field(default_factory=set)
    # uid → the `lastAppliedTime` of a drift check's revert whose status write failed: a later check writes it
    unwritten_applied: dict[str, str] = field(default_factory=dict)
    threads: ThreadPoolExecutor | None = None  # the handlers' (HANDLER_THREADS), made when first needed
    # A cluster's bootstrap servers (`servers_key`; a KafkaConnection not resolved yet: its reference) → [the
    # cluster's share of the threads, handlers using or awaiting it]; used on the event loop only, and an entry goes
    # when its last handler is done.
    cluster_slots: dict[Any, list[Any]] = field(default_factory=dict)
    # (namespace, connection) or None → the bootstrap servers its settings named last (`servers_key`): which share of
    # the threads its resources take. Many KafkaConnections (one per team namespace) may name one cluster.
    servers: dict[tuple[str, str] | None, str] = field(default_factory=dict)
    # `transport_key` → the probe every admin reaching those servers that way shares, whatever its credentials.
    reachability: dict[str, Reachability] = field(default_factory=dict)
    # The Kubernetes API for the writes kopf does not make: waking an owner's heirs, a drift check's; None: the
    # kubernetes package's default configuration, which `kcm operator` loads. Written through `writer`, a client of
    # the same configuration made when first needed (see `_objects`).
    api_client: client.ApiClient | None = None
    writer: client.ApiClient | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler_threads(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.threads is None:
                self.threads = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="kcm-handler")
            return self.threads

    @contextlib.asynccontextmanager
    async def cluster_slot(self, key: Any) -> AsyncIterator[None]:
        """One of CLUSTER_THREADS places for the handlers of one cluster (by its bootstrap servers, however many
        KafkaConnections name them). Handlers block on Kafka: a cluster that never answers fills its own places, never
        the others' threads."""
        entry = self.cluster_slots.setdefault(key, [asyncio.Semaphore(CLUSTER_THREADS), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self.cluster_slots[key]

    def slot_key(self, ref: tuple[str, str] | None) -> Any:
        """Which share of the threads a resource of the default cluster or of a KafkaConnection takes: its cluster's,
        by the bootstrap servers last resolved; None for a KafkaConnection not resolved yet."""
        if ref is None:
            return servers_key(self.settings)
        with self.lock:
            return self.servers.get(ref)

    def wake(self, claim: Claim, owner: Claim) -> None:
        """Make the resource of `claim` reconcile now (kopf takes an annotation change for an update), after `owner`,
        the resource that managed its subscription, was deleted."""
        self._objects().patch_namespaced_custom_object(
            GROUP, VERSION, claim.namespace, SUBSCRIPTIONS, claim.name,
            {"metadata": {"annotations": {OWNER_DELETED_ANNOTATION: f"{owner.ref} at {_now()}"}}},
            _request_timeout=KUBERNETES_TIMEOUT_S)

    def write(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch a drift check's changes (`metadata`, `status`) into its resource, once; raises what the
        client raises. Not left to kopf: kopf ends a timer for good when the patch it applies after the handler
        fails for good (at once for a 400, 409 or 422; after its retries, some 54 s of answers, for a 403 or 5xx or
        an unreachable API server), and with it every later drift check of that resource."""
        objects = self._objects()
        if patch.get("metadata"):
            objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, SUBSCRIPTIONS, name,
                                                   {"metadata": patch["metadata"]},
                                                   _request_timeout=KUBERNETES_TIMEOUT_S)
        if patch.get("status"):
            objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, SUBSCRIPTIONS, name,
                                                          {"status": patch["status"]},
                                                          _request_timeout=KUBERNETES_TIMEOUT_S)

    def kubernetes_api_problem(self) -> str | None:
        """Why the Kubernetes API does not answer now (`NewConnectionError: [Errno 111] Connection refused`, a
        timeout), None when it answers anything at all."""
        try:
            client.VersionApi(self._api()).get_code(_request_timeout=PROBE_TIMEOUT_S)
        except client.ApiException as exc:
            if exc.status == 0:   # the client's word for no HTTP answer at all: TLS failed (an untrusted CA, most often)
                reason = str(exc.reason or "no answer")
                return reason if len(reason) <= 300 else reason[:299] + "…"
            return None
        except Exception as exc:  # noqa: BLE001 - no answer of any kind
            if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
                exc = exc.reason
            # Only the text after the client's own words (which name its connection pool): "[Errno 111] Connection
            # refused".
            detail = f": {str(exc).rsplit(': ', 1)[-1]}" if isinstance(exc, urllib3.exceptions.NewConnectionError) \
                else ""
            return f"{type(exc).__name__}{detail}"
        return None

    def _objects(self) -> client.CustomObjectsApi:
        """The custom objects API for kcm's own writes, with `api_client`'s configuration but one attempt a request
        (urllib3 would retry a connection three times: a write held a handler thread and the resource's lock 20 s
        and more; one that fails is said, and the next drift check writes afresh), and a pooled connection for each
        handler thread (the default keeps 5 a CPU and warns for every one more)."""
        return client.CustomObjectsApi(self._api())

    def _api(self) -> client.ApiClient:
        with self.lock:
            if self.writer is None:
                given = self.api_client.configuration if self.api_client is not None else None
                configuration = copy.deepcopy(given) if given is not None else client.Configuration.get_default_copy()
                configuration.retries = False
                configuration.connection_pool_maxsize = HANDLER_THREADS
                self.writer = client.ApiClient(configuration)
            return self.writer

    def read_claim(self, claim: Claim) -> Claim | None:
        """`claim` (another resource's, from kopf's index) as the API has it now: None once its resource is gone (or
        another was made under its name since), `deleting` as read. kopf keeps its indexes through a pause by peering
        and lists again on resuming, which brings no deletion: a resource deleted meanwhile stays in its claims. One
        found gone is forgotten here too; one that cannot be read now is taken as indexed (the next reconcile, drift
        check or deletion retry reads it again)."""
        with self.lock:
            if claim.uid in self.gone:
                return None
        try:
            obj = self._objects().get_namespaced_custom_object(GROUP, VERSION, claim.namespace, SUBSCRIPTIONS,
                                                               claim.name, _request_timeout=KUBERNETES_TIMEOUT_S)
        except client.ApiException as exc:
            if exc.status != 404:
                return claim
            obj = {}
        except urllib3.exceptions.HTTPError:
            return claim
        meta = obj.get("metadata") or {}
        if meta.get("uid") == claim.uid:
            return replace(claim, deleting=bool(meta.get("deletionTimestamp")))
        self.forget(claim.uid)
        self.mark_ready(claim.uid, False)
        with self.lock:
            self.gone[claim.uid] = None
            if len(self.gone) > GONE_KEPT:
                del self.gone[next(iter(self.gone))]
        return None

    def still_there(self, claim: Claim) -> bool:
        """Whether the resource of `claim` still exists and is not being deleted (`read_claim`)."""
        read = self.read_claim(claim)
        return read is not None and not read.deleting

    def resource_lock(self, uid: str) -> threading.Lock:
        """The lock one resource's handlers take in turn; taking it notes that a handler ran for it (`idle_claims`)."""
        with self.lock:
            self.handled_since.add(uid)
            return self.resource_locks.setdefault(uid, threading.Lock())

    def sweep_due(self) -> bool:
        """Whether a drift interval has passed since the last sweep of kopf's index (noting this one if so)."""
        now = time.monotonic()
        with self.lock:
            if self.swept_at is not None and now - self.swept_at < self.drift_interval_s:
                return False
            self.swept_at = now
            return True

    def idle_claims(self, indexed: list[Claim]) -> list[Claim]:
        """Of the claims in kopf's index (`indexed`), those of resources no handler has run for since the sweep before
        the last: a resource that exists is drift-checked every interval, one deleted while this replica was paused
        by peering stays in the index for good (see `read_claim`)."""
        with self.lock:
            idle = {claim.uid for claim in indexed
                    if claim.uid not in self.handled_since and claim.uid not in self.gone}
            suspects = [claim for claim in indexed if claim.uid in idle and claim.uid in self.idle_before]
            self.idle_before, self.handled_since = idle, set()
            return suspects

    def present(self, claims: list[Claim]) -> list[Claim]:
        """`claims` but those of resources `read_claim` found gone (under one taking of the lock: every reconcile and
        deletion asks this of the whole index)."""
        with self.lock:
            return [claim for claim in claims if claim.uid not in self.gone]

    def forget(self, uid: str) -> None:
        with self.lock:
            self.resource_locks.pop(uid, None)
            self.handled_since.discard(uid)
            self.idle_before.discard(uid)
            self.drift_history.pop(uid, None)
            self.contested.pop(uid, None)
            self.unhandled.pop(uid, None)
            self.connection_of.pop(uid, None)
            self.unwritten.discard(uid)
            self.unwritten_applied.pop(uid, None)

    def moved(self, uid: str, connection: str | None) -> bool:
        """Whether the resource of `uid` named another KafkaConnection (or the default cluster) at its previous
        reconcile in this operator; notes `connection` for the next."""
        with self.lock:
            before = self.connection_of.get(uid, connection)
            self.connection_of[uid] = connection
            return before != connection

    def overdue(self, uid: str, generation: int | None) -> bool:
        """Whether the edit at `generation`, which no handler has taken up yet, was already waiting at the previous
        drift check (a whole interval ago); true once per generation."""
        with self.lock:
            seen = self.unhandled.get(uid)
            if seen is None or seen[0] != generation:
                self.unhandled[uid] = [generation, False]
                return False
            overdue, seen[1] = not seen[1], True
            return overdue

    def handled(self, uid: str) -> None:
        with self.lock:
            self.unhandled.pop(uid, None)

    def not_nudged(self, uid: str, generation: int | None) -> None:
        """The nudge of `generation` was not written: the next drift check that finds the edit waiting nudges it."""
        with self.lock:
            seen = self.unhandled.get(uid)
            if seen is not None and seen[0] == generation:
                seen[1] = False

    def written(self, uid: str, ok: bool, status: Mapping[str, Any] | None = None) -> bool:
        """Note whether a drift check's write to the Kubernetes API succeeded, with the `status` it held (a kept
        `lastAppliedTime` is written with any status, lost only with a failed one); whether that differs from the
        last one's (a failure to say, or a recovery)."""
        with self.lock:
            changed = (uid in self.unwritten) == ok
            (self.unwritten.discard if ok else self.unwritten.add)(uid)
            if ok and status:
                self.unwritten_applied.pop(uid, None)
            elif not ok and status and status.get("lastAppliedTime"):
                self.unwritten_applied[uid] = status["lastAppliedTime"]
            return changed

    def carry_applied(self, uid: str, current: str | None, status: MutableMapping[str, Any]) -> None:
        """Put into a drift check's `status` patch the `lastAppliedTime` an earlier check's failed write held, unless
        this check applied a change itself or the resource already says a later one (`current`)."""
        with self.lock:
            pending = self.unwritten_applied.get(uid)
        if pending and "lastAppliedTime" not in status and pending > (current or ""):
            status["lastAppliedTime"] = pending

    def mark_ready(self, uid: str, ready: bool) -> None:
        with self.lock:
            (self.ready.add if ready else self.ready.discard)(uid)
            metrics.MANAGED.set(len(self.ready))

    def admin(self, namespace: str, connection: str | None, recent: bool = False) -> BatchedAdmin:
        """The (cached, shared) admin for the default cluster or a KafkaConnection's. A KafkaConnection whose settings
        changed (other servers, a rotated password) gets a new admin; the old one is closed once the calls that may
        have started on it are over (`retired_admin_grace_s`). `recent`: a resolution
        of the KafkaConnection made within the last drift interval will do (for drift checks: every resource naming
        it has one per interval, and reading it and its Secrets for each would load the API server with their
        number; changes still arrive within an interval, and every other handler reads them at once)."""
        if connection and self.resolve is None:
            raise InvalidSpecError(f"spec.connection {connection!r}: this operator has no KafkaConnection support")
        ref = cluster_ref(namespace, connection)
        retired = None
        try:
            if connection:
                settings = self._connection_settings((namespace, connection), recent)
            else:
                settings = self.settings = self.reload() if self.reload is not None else self.settings
            key = settings.fingerprint()
            with self.lock:
                cached = self.admins.get(ref)
                if cached is None or cached[0] != key:
                    settings.validate()  # once per distinct settings, not per event
                    retired = cached[1] if cached is not None else None
                    explain = in_connection_terms if connection else None  # the default cluster's: from the CLI
                    reachability = self.reachability.setdefault(transport_key(settings), Reachability())
                    self.admins[ref] = (key, BatchedAdmin(
                        SubscriptionAdmin(settings, self.kafka_timeout_s, explain, reachability)))
                    self.servers[ref] = servers_key(settings)
                return self.admins[ref][1]
        except KafkaConfigError as exc:
            where = (f"KafkaConnection {namespace}/{connection}" if connection else
                     f"the default cluster (--command-config {self.command_config})" if self.command_config else
                     "the default cluster")
            raise InvalidSpecError(f"{where}: {exc}") from None
        finally:
            if retired is not None:
                # Handlers that took the old admin just before (a rotated password) finish their calls on it first:
                # closed under them, a call would fail and post a Warning. Not under the lock either: closing waits
                # for a connect under way, which must not hold up other clusters.
                closer = threading.Timer(self.retired_admin_grace_s(), retired.close)
                closer.name, closer.daemon = "kcm-admin-close", True
                closer.start()

    def retired_admin_grace_s(self) -> float:
        """How long an admin replaced by new settings stays open: a handler's calls (telemetry check, describe, alter,
        each bounded by the Kafka timeout) started on it end within this."""
        return 3 * self.kafka_timeout_s + 1

    def _connection_settings(self, ref: tuple[str, str], recent: bool) -> KafkaSettings:
        if not recent:
            return self._resolve_now(ref)
        with self.lock:
            gate = self.resolving.setdefault(ref, threading.Lock())
        with gate:
            with self.lock:
                known = self.resolved.get(ref)
            if known is None or time.monotonic() - known[0] >= self.drift_interval_s:
                return self._resolve_now(ref)
        if isinstance(known[1], Exception):  # failed within the interval: the same answer, not another read
            raise type(known[1])(*known[1].args) from None
        return known[1]

    def _resolve_now(self, ref: tuple[str, str]) -> KafkaSettings:
        assert self.resolve is not None
        began = time.monotonic()
        try:
            settings = self.resolve(*ref)
        except Exception as exc:
            with self.lock:
                self.resolved[ref] = (began, exc)
            raise
        with self.lock:
            self.resolved[ref] = (began, settings)
        return settings

    def retire_unused(self, in_use: set[tuple[str, str] | None]) -> None:
        """Close the admins of KafkaConnections no resource names any more (team namespaces come and go: each admin
        holds a thread and sockets) and forget what was learnt through them. A resource naming one again later gets
        a new admin."""
        with self.lock:
            gone = [ref for ref in self.admins if ref is not None and ref not in in_use]
            retired = [self.admins.pop(ref)[1] for ref in gone]
            for ref in [ref for ref, (*_, deleted) in self.connection_versions.items()
                        if deleted and ref not in in_use]:
                del self.connection_versions[ref]
            for ref in gone:
                self.servers.pop(ref, None)
                self.cluster_ids.pop(ref, None)
                self.resolved.pop(ref, None)  # type: ignore[arg-type]
                self.resolving.pop(ref, None)  # type: ignore[arg-type]
        for admin in retired:
            # Not on the event loop: closing waits for a connect under way.
            threading.Thread(target=admin.close, name="kcm-admin-close", daemon=True).start()
        if self.statuses is not None:
            self.statuses.unused(in_use)

    def report(self, namespace: str, connection: str | None, state: str, reason: str, message: str,
               cluster_id: str | None = None, **proof: Any) -> None:
        """Say on a KafkaConnection's status what a reconcile found through it (nothing for the default cluster);
        `proof`: `needs` and `proves` of ConnectionStatuses.report."""
        if connection and self.statuses is not None:
            self.statuses.report(namespace, connection, state, reason, message, cluster_id, **proof)

    def named(self, namespace: str, connection: str | None) -> None:
        """A reconcile of a resource naming `connection` ended without applying anything through it (paused,
        Conflict): a KafkaConnection saying Unused says it is named (nothing for the default cluster)."""
        if connection and self.statuses is not None:
            self.statuses.named(namespace, connection)

    def known_cluster_id(self, claim: Claim) -> str | None:
        """The id of the cluster another resource's claim is on, as this operator last saw it through its connection
        (its own reconciles note it), else as its status says; None when neither knows. Never resolved or connected
        here: that would make one resource's handler wait for another's cluster, which may not answer."""
        with self.lock:
            return self.cluster_ids.get(claim.cluster_ref) or claim.cluster_id

    def connection_seen(self, ref: tuple[str, str], uid: str, generation: object, deleted: bool) -> None:
        """KafkaConnection `ref` as the watch brings it. Another spec than the one seen before (an edit, or one made
        again, perhaps while this replica was paused by peering) drops what was learnt through the old one: the
        cluster id seen through it (a resource's status then says which cluster it is on) and the resolution drift
        checks reuse. A deletion keeps both (deleting its resources needs them) until one made again is seen."""
        with self.lock:
            before = self.connection_versions.get(ref)
            self.connection_versions[ref] = (uid, generation, deleted)
            if before is not None and before[:2] != (uid, generation):
                self.cluster_ids.pop(ref, None)
                self.resolved.pop(ref, None)

    def remember_cluster_id(self, ref: tuple[str, str] | None, cluster_id: str) -> str:
        """Note the cluster id seen through a connection (kept up to date by that connection's own reconciles)."""
        with self.lock:
            self.cluster_ids[ref] = cluster_id
        return cluster_id

    def last_admin(self, namespace: str, connection: str | None) -> BatchedAdmin | None:
        """The admin built from a KafkaConnection's last good settings, if any (for deleting after it went away)."""
        with self.lock:
            cached = self.admins.get(cluster_ref(namespace, connection))
        return cached[1] if cached is not None else None

    def close(self) -> None:
        with self.lock:
            for _, admin in self.admins.values():
                admin.close()
            self.admins.clear()
            if self.threads is not None:
                self.threads.shutdown(wait=False, cancel_futures=True)
                self.threads = None
            if self.writer is not None:
                self.writer.close()
                self.writer = None


def operator_settings(settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    """kopf settings: kcm.dev finalizer and annotations, and only the Events kcm posts itself."""
    settings = settings or kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # Not GROUP itself: kopf ignores every annotation under its storage prefix, kcm.dev/paused included.
    settings.persistence.progress_storage = PROGRESS
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=STATE_PREFIX)
    # The handlers below run on threads of their own (`_on_cluster_threads`); kopf's serve the index.
    settings.posting.loggers = False  # log lines stay logs; Events are the applied/failed/drift ones below
    # A deleted resource keeps its finalizer until its drift timer has stopped; one still running a check when the
    # deletion is handled is looked at again this often (kopf's default, 60 s, held deletions for a minute).
    settings.background.cancellation_polling = 1.0
    return settings


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, bound to `config`."""
    registry = kopf.OperatorRegistry()
    resource = dict(group=GROUP, version=VERSION, plural=SUBSCRIPTIONS, registry=registry)

    @kopf.index(**resource, id="claims")
    def claims(namespace: str, name: str, spec: Mapping[str, Any], meta: Mapping[str, Any],
               status: Mapping[str, Any], **_: Any) -> dict[str, Claim]:
        # By subscription name only: resources naming different KafkaConnections (or one and the default cluster)
        # may still reach one cluster; `_older_owner` compares the clusters themselves.
        try:
            desired = desired_of(namespace, name, spec)
            subscription, connection = _applied_name(status, desired), desired.connection
        except InvalidSpecError:   # it still claims what it applied while its spec was valid, and nothing else
            subscription, connection = _applied_before(status), _connection_of({"spec": spec})
            if subscription is None:
                return {}
        return {subscription: Claim(
            namespace, name, meta.get("creationTimestamp") or "", meta.get("uid") or "", connection,
            status.get("clusterId"), bool(meta.get("deletionTimestamp")))}

    @kopf.on.resume(**resource, id=RECONCILE)
    @kopf.on.create(**resource, id=RECONCILE)
    @kopf.on.update(**resource, id=RECONCILE)
    async def reconcile(body: kopf.Body, patch: kopf.Patch, claims: kopf.Index, retry: int,
                        old: Mapping[str, Any] | None = None, new: Mapping[str, Any] | None = None,
                        **_: Any) -> None:
        try:
            await _on_cluster_threads(config, body, lambda: _locked_reconcile(body, patch, claims, retry))
        finally:
            # It may have been the last user of the one it named before: by kopf's diff, or (an edit while its creation
            # was still retried, which kopf hands over without `old`) by this operator's own note.
            moved = config.moved(body.metadata.uid, _connection_of(body))
            if moved or (old is not None and _connection_of(old) != _connection_of(new)):
                config.retire_unused(_refs_in_use(config, claims))

    def _locked_reconcile(body: kopf.Body, patch: kopf.Patch, claims: kopf.Index, retry: int) -> None:
        with config.resource_lock(body.metadata.uid):
            _reconcile(config, body, patch, claims, retry, drift_check=False)

    @kopf.timer(**resource, id="drift", interval=config.drift_interval_s, initial_delay=config.drift_interval_s)
    async def check_drift(body: kopf.Body, claims: kopf.Index, stopped: kopf.DaemonStopped | None = None,
                          **_: Any) -> None:
        # What the check changes is written by `config.write`, not left in kopf's patch: see there.
        _sweep_soon(config, claims)
        await _until_stopped(config, _on_cluster_threads(config, body, lambda: _locked_drift_check(body, claims)),
                             stopped)

    def _locked_drift_check(body: kopf.Body, claims: kopf.Index) -> None:
        # kopf's body is live: a snapshot taken under the lock is what the change handlers last saw, and stays one
        # spec for the whole check.
        with config.resource_lock(body.metadata.uid):
            body = kopf.Body(copy.deepcopy(dict(body)))
            patch = kopf.Patch()
            _drift_check(body, patch, claims)
            if patch and not _written(config, body, patch):
                config.not_nudged(body.metadata.uid, body.metadata.get("generation"))

    def _drift_check(body: kopf.Body, patch: kopf.Patch, claims: kopf.Index) -> None:
        # An edit not yet reconciled (its generation not yet observed) or a deletion under way is theirs to apply: a
        # drift check from the spec before them would revert the edit, or bring a removed subscription back.
        # An edit no handler took up within a whole interval was seen by kopf and dropped: it is nudged (below).
        if body.metadata.get("deletionTimestamp"):
            return
        generation = body.metadata.get("generation")
        if generation != body.status.get("observedGeneration"):
            if _retry_scheduled(body):   # kopf takes the edit up when the retry is due (up to MAX_BACKOFF_S)
                config.handled(body.metadata.uid)
            elif config.overdue(body.metadata.uid, generation):
                _say(logging.WARNING, body.metadata.namespace, body.metadata.name,
                     "its edit (generation %s) waited a whole drift interval (%g s) with no handler taking it "
                     "up; annotating %s so that it is handled", generation, config.drift_interval_s,
                     NUDGED_ANNOTATION)
                patch.metadata.annotations[NUDGED_ANNOTATION] = f"generation {generation} at {_now()}"
            return
        config.handled(body.metadata.uid)
        try:
            _reconcile(config, body, patch, claims, retry=0, drift_check=True)
        except kopf.TemporaryError:
            pass  # the status says why; the next tick tries again
        config.carry_applied(body.metadata.uid, body.status.get("lastAppliedTime"), patch.status)

    @kopf.on.delete(**resource, id="delete")
    async def delete(body: kopf.Body, patch: kopf.Patch, claims: kopf.Index, retry: int, **_: Any) -> None:
        await _on_cluster_threads(config, body, lambda: _locked_delete(body, patch, claims, retry))
        config.forget(body.metadata.uid)  # not reached while the deletion is retried
        # Its KafkaConnection's admin goes with the last resource naming it (kopf's index still lists this one).
        config.retire_unused(_refs_in_use(config, claims, but=body.metadata.uid))

    def _locked_delete(body: kopf.Body, patch: kopf.Patch, claims: kopf.Index, retry: int) -> None:
        with config.resource_lock(body.metadata.uid):
            try:
                _delete(config, body, patch, claims, retry)
            except (kopf.TemporaryError, kopf.PermanentError):
                raise
            except Exception as exc:   # a bug, or a library's surprise: held, said on the resource, retried
                _say(logging.ERROR, body.metadata.namespace, body.metadata.name, "deleting failed unexpectedly",
                     exc_info=True)
                _held(body, patch, body.status.get("subscriptionName"), retry, "Failed",
                      f"deletion held: it failed unexpectedly ({type(exc).__name__}; the operator's log has the "
                      "details); retried with backoff")

    @kopf.on.event(group=GROUP, version=VERSION, plural=CONNECTIONS, registry=registry, id="connection")
    async def connection_event(event: Mapping[str, Any], body: kopf.Body, claims: kopf.Index, **_: Any) -> None:
        # Each KafkaConnection as the operator starts, and as it changes: one no resource names (yet, or any more,
        # also since before a restart) says Unused; what its status says is where reports of it start from. On the
        # event loop (nothing here waits): kopf changes the index there.
        namespace, name = body.metadata.namespace, body.metadata.name
        deleted = event.get("type") == "DELETED"
        config.connection_seen((namespace, name), body.metadata.uid, body.metadata.get("generation"), deleted)
        if config.statuses is None:
            return
        if deleted:
            config.statuses.forget(namespace, name)
            return
        config.statuses.seen(namespace, name, body.status)
        # Checked here too (cached by content): one no subscription names says a spec its CRD refuses, not Unused.
        problems = schema.spec_problems(schema.CONNECTION_KIND, _plain(body.spec))
        config.statuses.checked(namespace, name, body.metadata.get("generation"), (
            f"KafkaConnection {namespace}/{name}: {invalid_spec_message(schema.CONNECTION_KIND, problems)}"
            if problems else None))
        if (namespace, name) not in _refs_in_use(config, claims):
            config.statuses.report_unused(namespace, name)

    @kopf.on.login(registry=registry, id="login")
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In a pod the service account, elsewhere $KUBECONFIG or ~/.kube/config, as kubectl would.
        return kopf.login_with_service_account(**kwargs) or one_credential(kopf.login_with_kubeconfig(**kwargs))

    @kopf.on.cleanup(registry=registry, id="close")
    def close(**_: Any) -> None:
        config.close()

    return registry


def one_credential(info: kopf.ConnectionInfo | None) -> kopf.ConnectionInfo | None:
    """The kubeconfig's connection with the credentials of its user entry only, when its server URL carries some too
    (https://user:password@host): kopf's HTTP client refuses every request that would send both, and kopf stopped."""
    if info is None or not (info.token or info.username or info.password):
        return info
    server = urllib.parse.urlsplit(info.server)
    if "@" not in server.netloc:
        return info
    # Not the URL: it holds a password.
    log.warning("the kubeconfig's cluster server URL carries a user name and password as well as its user entry's "
                "credentials: the operator uses the user entry's")
    return replace(info, server=server._replace(netloc=server.netloc.rpartition("@")[2]).geturl())


def _written(config: OperatorConfig, body: kopf.Body, patch: kopf.Patch) -> bool:
    """Write a drift check's `patch`, trying again after a failure the next attempt may not meet (WRITE_ATTEMPTS); a
    failure is said once (until a write succeeds again) and left to the next check, which finds what to write afresh
    (and a revert's `lastAppliedTime`, kept). A resource already gone needs nothing written."""
    namespace, name = body.metadata.namespace, body.metadata.name
    began = time.monotonic()
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        wait: float | None = None
        try:
            config.write(namespace, name, patch)
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            why = f"the Kubernetes API answered {exc.status} {exc.reason}"
            if exc.status == 429 or exc.status >= 500:
                wait = _retry_after(exc)
        except Exception as exc:  # noqa: BLE001 - refused, reset, timed out: the next attempt or check writes again
            why = f"writing to the Kubernetes API failed: {type(exc).__name__}"
            # A timeout held the thread (and the resource's lock) long enough.
            if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)) and not _timed_out(exc):
                wait = 0.0
        else:
            if config.written(body.metadata.uid, True, patch.get("status")):
                _say(logging.INFO, namespace, name, "a drift check could write to it again")
            return True
        wait = None if wait is None else max(wait, WRITE_BACKOFF_S * 2 ** (attempt - 1))
        if wait is None or attempt == WRITE_ATTEMPTS or time.monotonic() + wait - began > WRITE_BUDGET_S:
            break
        time.sleep(wait)
    if config.written(body.metadata.uid, False, patch.get("status")):
        what = "nudge annotation" if patch.get("metadata") else "status"   # a check writes one or the other
        _say(logging.WARNING, namespace, name, "a drift check could not write its %s (%s); each next check writes "
             "what it finds then, until one succeeds", what, why)
    return False


def _connections_own(exc: Exception) -> bool:
    """Whether a failure once Kafka answered is the KafkaConnection's, not one subscription's: Kafka went away, or
    refused its user the cluster-wide right every subscription's configs need (DESCRIBE_CONFIGS, ALTER_CONFIGS)."""
    return isinstance(exc, KafkaUnavailableError) or (
        isinstance(exc, KafkaRefusedError) and exc.code == kafka_errors.ClusterAuthorizationFailedError.errno)


def _retry_after(exc: client.ApiException) -> float:
    """The delay an answer's Retry-After header asks for (seconds, as the API server writes it), up to
    WRITE_RETRY_AFTER_MAX_S; 0 without one."""
    try:
        delay = float((exc.headers or {}).get("Retry-After", 0))
    except (TypeError, ValueError):
        return 0.0
    return min(delay, WRITE_RETRY_AFTER_MAX_S) if delay > 0 else 0.0   # NaN is not > 0


def _timed_out(exc: BaseException) -> bool:
    # urllib3 makes a refused connection (NewConnectionError) a kind of connect timeout.
    return (isinstance(exc, (urllib3.exceptions.TimeoutError, TimeoutError))
            and not isinstance(exc, urllib3.exceptions.NewConnectionError))


async def _on_cluster_threads(config: OperatorConfig, body: kopf.Body, work: Callable[[], None]) -> None:
    """Run a handler's blocking work on a handler thread within its cluster's share. A KafkaConnection never resolved
    yet is resolved first (within a share of its own) to learn which cluster's share that is."""
    namespace, connection = body.metadata.namespace, _connection_of(body)
    ref = cluster_ref(namespace, connection)
    key = config.slot_key(ref)
    if key is None:
        async with config.cluster_slot(ref):
            await _on_thread(config, lambda: _learn_servers(config, namespace, connection))
        key = config.slot_key(ref) or ref  # still unknown (the KafkaConnection is missing): its own share
    async with config.cluster_slot(key):
        await _on_thread(config, work)


async def _until_stopped(config: OperatorConfig, work: Coroutine[Any, Any, None],
                         stopped: kopf.DaemonStopped | None) -> None:
    """Await a timer's `work` until kopf stops the timer (a pause by peering, the resource's deletion, the operator
    exiting). kopf leaves a timer that does not end at once orphaned, and on resuming does not start it again while
    that one still runs: the resource's drift checks would end for good. So a stop ends the wait at once; `work` is
    cancelled: not started, dropped; started, it finishes on its handler thread, which holds the resource's lock."""
    if stopped is None:   # kopf always passes it; a test calling the handler may not
        return await work
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:   # the handler itself (the event loop closing): the work too
        _leave_running(config, task)
        raise
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    _leave_running(config, task)
    return None


def _leave_running(config: OperatorConfig, task: asyncio.Future) -> None:
    """Cancel a drift check's `task` (see `_on_thread`) and keep it until it ends, logging a failure."""
    task.cancel()
    config.left_running.add(task)

    def finished(done: asyncio.Future) -> None:
        config.left_running.discard(done)
        if not done.cancelled() and done.exception() is not None:
            log.error("a drift check left to finish after its timer stopped failed", exc_info=done.exception())

    task.add_done_callback(finished)


def _learn_servers(config: OperatorConfig, namespace: str, connection: str | None) -> None:
    try:
        config.admin(namespace, connection)  # notes the servers its settings name
    except Exception as exc:  # the handler's own call says what is wrong, in its status
        log.debug("KafkaConnection %s/%s not resolved: %s", namespace, connection, exc)


async def _on_thread(config: OperatorConfig, work: Callable[[], None]) -> None:
    """Run blocking work on a handler thread, as kopf runs a sync handler: in a copy of the context (kopf.event needs
    it). Cancelled, work not yet started is dropped; started work is waited for, so no thread is left running that
    holds a resource's lock."""
    job = config.handler_threads().submit(contextvars.copy_context().run, work)
    done = asyncio.wrap_future(job)
    cancelled = None
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError as exc:
            if job.cancel():
                raise
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    done.result()


def _reconcile(config: OperatorConfig, body: kopf.Body, patch: kopf.Patch, claims: kopf.Index, retry: int,
               drift_check: bool) -> None:
    started = time.monotonic()
    namespace, name = body.metadata.namespace, body.metadata.name
    try:
        desired = desired_of(namespace, name, body.spec)
    except InvalidSpecError as exc:
        _refuse_spec(config, body, patch, exc, started)
        return
    applied_as = _applied_name(body.status, desired)
    status = _Status(body, patch, applied_as)
    if body.metadata.annotations.get(PAUSED_ANNOTATION) == "true":
        status.set("Paused", "True", "Paused", f"annotation {PAUSED_ANNOTATION} is \"true\": Kafka is not reconciled")
        if status.ready_generation not in (None, status.generation):
            # An edit made while paused is not in Kafka: Ready must not go on saying the spec is.
            status.set("Ready", "Unknown", "Paused",
                       f"generation {status.generation} is not applied: annotation {PAUSED_ANNOTATION} is \"true\"")
            config.mark_ready(body.metadata.uid, False)
        elif status.ready_reason in ("Conflict", "Contested"):
            # Who owns the subscription is not looked at while paused: a Conflict would go on naming an owner
            # deleted since (which handed it over to this one).
            status.set("Ready", "Unknown", "Paused", f"subscription {desired.name} is not reconciled: annotation "
                       f"{PAUSED_ANNOTATION} is \"true\"")
            config.mark_ready(body.metadata.uid, False)
        config.named(namespace, desired.connection)
        metrics.record(started, "skipped", "Paused")
        return
    status.set("Paused", "False", "Reconciling", "")
    me = _claim(body, desired)
    # How far the connection got, for what its KafkaConnection's status says of a failure: every failure while it is
    # resolved or connected is the connection's; once Kafka answered, only Kafka going away or refusing the
    # connection's user the cluster-wide right every subscription needs (`_connections_own`) is; anything else Kafka
    # refuses then is this resource's own (its spec, or a right one subscription lacks), and the connection Connected.
    stage = "spec"
    try:
        if applied_as != desired.name:   # the CRD refuses the edit where the API server checks its rules
            raise InvalidSpecError(f"spec.subscriptionName cannot change: this resource applied subscription "
                                   f"{applied_as}; set it back (deleting the resource then removes {applied_as}), "
                                   f"or create another resource for {desired.name}")
        stage = "connect"
        admin = config.admin(namespace, desired.connection, recent=drift_check)
        # A resource being deleted hands its subscription over (see `_delete`): the next one takes it now.
        live = [claim for claim in _claims_of(claims, desired.name) if not claim.deleting]
        first = _older_owner(config, admin, me, live)
        if first is not None:
            message = f"subscription {desired.name} is managed by the older resource {first.ref}"
            status.set("Ready", "False", "Conflict", message)
            config.mark_ready(body.metadata.uid, False)
            if status.ready_changed:
                kopf.event(body, type="Warning", reason="Conflict", message=message)
            config.named(namespace, desired.connection)
            metrics.record(started, "failed", "Conflict")
            return
        admin.require_telemetry()  # also, outside the batches, the quick answer of a cluster known to be failing
        cluster = admin.cluster_id()  # connected by now
        connected = f"Kafka cluster {cluster} answers, and its brokers advertise the telemetry APIs"
        stage, call = "apply", "describe"
        change = diff(desired, admin.describe_one(desired.name))
        # Its KafkaConnection names another cluster now: the subscription moves there, which is nobody's edit.
        moved_from = body.status.get("clusterId") if body.status.get("clusterId") not in (None, cluster) else None
        contested = _contested(config, body.metadata.uid, status, change, drift_check and moved_from is None)
        if change.ops and not contested:
            call = "alter"
            error = admin.alter_one(change)
            if error is not None:
                raise error  # InvalidSpecError for what the spec asks, KafkaRefusedError for anything else
        # What passed: a refusal of the cluster right for a call that did not pass here stays said (a resource with
        # nothing to change does not show that another's change may pass now).
        config.report(namespace, desired.connection, "True", "Connected", connected, cluster,
                      proves=("describe", "alter") if call == "alter" else ("describe",))
        # Connected now: what newer resources naming this subscription through other connections compare with, in
        # this operator's memory and (for after a restart, when the connection may not work) in the status.
        status.applied_to(config.remember_cluster_id(me.cluster_ref, cluster))
    except (InvalidSpecError, UnsupportedError, *RETRIED) as exc:
        reason = reason_of(exc)
        status.set("Ready", "False", reason, str(exc))
        if stage == "connect" or (stage == "apply" and _connections_own(exc)):
            config.report(namespace, desired.connection, "False", reason, str(exc),
                          needs=call if stage == "apply" and isinstance(exc, KafkaRefusedError) else None)
        elif stage == "apply":   # Kafka refused this resource's own call: what came before it passed
            config.report(namespace, desired.connection, "True", "Connected", connected, cluster,
                          proves=("describe",) if call == "alter" else ())
        else:   # its spec refused before the connection was used
            config.named(namespace, desired.connection)
        config.mark_ready(body.metadata.uid, False)
        if status.ready_changed:
            kopf.event(body, type="Warning", reason=reason, message=str(exc))
        metrics.record(started, "failed", reason)
        if isinstance(exc, RETRIED):
            if not isinstance(exc, (KubernetesApiError, InvalidSpecError)):
                metrics.KAFKA_ERRORS.labels(reason).inc()
            raise kopf.TemporaryError(str(exc), delay=_backoff(retry)) from None
        return
    except Exception as exc:  # a fault no branch above knows (a bug, a library's surprise): said, then retried
        # The exception's text stays in the log: it may quote settings, which status and events never show.
        _say(logging.ERROR, namespace, name, "reconciling failed unexpectedly", exc_info=True)
        message = (f"reconciling failed unexpectedly ({type(exc).__name__}; the operator's log has the details); "
                   "retried with backoff")
        status.set("Ready", "False", "Failed", message)
        config.mark_ready(body.metadata.uid, False)
        if status.ready_changed:
            kopf.event(body, type="Warning", reason="Failed", message=message)
        metrics.record(started, "failed", "Failed")
        raise kopf.TemporaryError(message, delay=_backoff(retry)) from None
    if contested is not None:
        message = (f"subscription {desired.name} was changed outside kcm again after {CONTESTED_AFTER} reverts "
                   f"within {CONTESTED_WINDOW} drift checks: something else manages it too (another kcm operator "
                   "watching other namespaces, a script), so kcm stopped reverting it. Let one operator manage each "
                   "subscription; kcm applies this resource again when its spec changes or the operator restarts")
        status.set("Ready", "False", "Contested", message)
        config.mark_ready(body.metadata.uid, False)
        if contested == "new" and status.ready_changed:
            _say(logging.WARNING, namespace, name, "%s", message)
            kopf.event(body, type="Warning", reason="Contested", message=message)
        metrics.record(started, "failed", "Contested")
        return
    if change.ops:
        status.applied()
        if moved_from is not None:
            now = (f"which KafkaConnection {namespace}/{desired.connection} names now" if desired.connection else
                   "which the operator's --bootstrap-server reaches now")
            kopf.event(body, type="Normal", reason="Applied",
                       message=f"subscription {desired.name} moved to Kafka cluster {cluster}, {now} (cluster "
                               f"{moved_from} keeps its copy): {change.describe()}")
        elif drift_check and status.was_ready:  # otherwise a takeover or a recovery, not someone else's edit
            message = f"subscription {desired.name} was changed outside kcm and is reverted: {drift(change)}"
            _say(logging.WARNING, namespace, name, "%s", message)
            kopf.event(body, type="Warning", reason="Drift", message=message)
            metrics.DRIFT_CORRECTIONS.inc()
        else:
            kopf.event(body, type="Normal", reason="Applied", message=change.describe())
    status.set("Ready", "True", "Applied", f"subscription {desired.name} is in Kafka as specified{_capped(desired)}")
    config.mark_ready(body.metadata.uid, True)
    metrics.record(started, "applied" if change.ops else "unchanged", "Applied")


def desired_of(namespace: str | None, name: str, spec: Mapping[str, Any]) -> Desired:
    """What a resource's spec asks for; InvalidSpecError, naming each field and what to do, for a spec its CRD refuses
    (the API server may not have checked it: an older CRD installed, validation skipped, a field from a newer kcm)."""
    problems = schema.spec_problems(schema.SUBSCRIPTION_KIND, _plain(spec))
    if problems:
        raise InvalidSpecError(invalid_spec_message("ClientMetricsSubscription", problems))
    return desired_from_spec(namespace, name, spec)


def _plain(value: Any) -> Any:
    """kopf's views of a body (Spec, Status) as plain JSON values."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _refuse_spec(config: OperatorConfig, body: kopf.Body, patch: kopf.Patch, error: InvalidSpecError,
                 started: float) -> None:
    """Say on a resource that its spec is invalid: Kafka is not touched (what it applied before stays), and nothing
    is retried until the spec changes (drift checks say it again)."""
    namespace, name = body.metadata.namespace, body.metadata.name
    status = _Status(body, patch, body.status.get("subscriptionName"))
    message = f"{error}. Kafka is not changed"
    status.set("Ready", "False", "InvalidSpec", message)
    config.mark_ready(body.metadata.uid, False)
    config.named(namespace, _connection_of(body))
    if status.ready_changed:
        _say(logging.WARNING, namespace, name, "%s", message)
        kopf.event(body, type="Warning", reason="InvalidSpec", message=message)
    metrics.record(started, "failed", "InvalidSpec")


def _capped(desired: Desired) -> str:
    """What an interval above Kafka's cap means for the Ready message (`kcm subscriptions apply` warns of it too)."""
    if desired.interval_ms <= cm.DEFAULT_INTERVAL_MS:
        return ""
    return (f"; but clients push every {cm.DEFAULT_INTERVAL_MS} ms at most whatever intervalMs says (Kafka's brokers "
            f"cap it), so intervalMs {desired.interval_ms} acts as {cm.DEFAULT_INTERVAL_MS}")


def _claim(body: kopf.Body, desired: Desired) -> Claim:
    meta = body.metadata
    return Claim(meta.namespace, meta.name, meta.get("creationTimestamp") or "", meta.uid or "", desired.connection,
                 body.status.get("clusterId"))


def _older_owner(config: OperatorConfig, admin: BatchedAdmin, me: Claim, claims: list[Claim]) -> Claim | None:
    """The oldest resource naming `me`'s subscription on the same Kafka cluster, if it is older than `me`. Resources
    naming the same KafkaConnection (or both the default cluster) share it; any other is compared by the cluster id
    last seen through its connection, so one whose connection breaks for a while still counts, or else by the
    cluster its status says it was applied to (after a restart). One never applied, whose cluster this operator
    cannot reach now, is not counted: it cannot have applied anything. Nor is one gone (`still_there`)."""
    mine = None
    for claim in oldest_first([*claims, me]):
        if (claim.namespace, claim.name) == (me.namespace, me.name):
            return None
        if claim.cluster_ref != me.cluster_ref:
            if mine is None:
                mine = config.remember_cluster_id(me.cluster_ref, admin.cluster_id())
            if config.known_cluster_id(claim) != mine:
                continue
        if config.still_there(claim):
            return claim
    return None


def _contested(config: OperatorConfig, uid: str, status: _Status, change: Change, drift_check: bool) -> str | None:
    """Whether to leave the subscription as it is: after CONTESTED_AFTER reverts within the last CONTESTED_WINDOW
    drift checks it was found changed outside kcm again, so something else keeps changing it back, and reverting again
    would only go on fighting it. "new" for the check that finds that, "held" for the checks after it, None to apply.
    Kafka as specified, the subscription gone from Kafka (the other side let go of it), a spec change (also one another
    replica applied while this one was paused by peering) or a restart (resume) ends it."""
    held = uid in config.contested
    if not drift_check or (held and (not change.ops or change.action == "create"
                                     or config.contested[uid] != status.generation)):
        config.drift_history.pop(uid, None)
        config.contested.pop(uid, None)
        return None
    if held:
        return "held"
    if change.ops and not status.was_ready:  # a takeover or a recovery, not someone else's edit: counted afresh
        config.drift_history.pop(uid, None)
        return None
    history = config.drift_history.setdefault(uid, collections.deque(maxlen=CONTESTED_WINDOW))
    history.append(bool(change.ops))
    if change.ops and sum(history) > CONTESTED_AFTER:
        config.contested[uid] = status.generation
        return "new"
    return None


def _delete(config: OperatorConfig, body: kopf.Body, patch: kopf.Patch, claims: kopf.Index, retry: int) -> None:
    namespace, name = body.metadata.namespace, body.metadata.name
    config.mark_ready(body.metadata.uid, False)
    try:
        desired = desired_of(namespace, name, body.spec)
        desired = replace(desired, name=_applied_name(body.status, desired))   # what it applied, if renamed since
    except InvalidSpecError:
        deleted_as = _deleted_as(body)
        if deleted_as is None:
            return
        desired = deleted_as
    me = _claim(body, desired)
    # A claim being deleted keeps nothing: it has handed the subscription over (to this one, perhaps) or removes it.
    # The others naming the subscription, each read first (`read_claim`): a resource deleted while this replica was
    # paused by peering is neither an owner, an heir, nor an owner deleted together with this one.
    named_too = [read for claim in _claims_of(claims, desired.name)
                 if claim.ref != me.ref and (read := config.read_claim(claim)) is not None]
    others = [claim for claim in named_too if not claim.deleting]
    same = [claim for claim in others if _same_cluster(config, me, claim)]  # as far as known without connecting
    keeper = oldest_first([*same, me])[0]
    if keeper.ref != me.ref:  # an older resource on the same cluster: no need to ask Kafka
        _say(logging.INFO, namespace, name, "deleted without touching %s, which %s manages", desired.name, keeper.ref)
        return
    heirs = oldest_first(same)
    if heirs:  # the subscription stays for them, whatever the deletion policy: the next one takes it over now
        _say(logging.INFO, namespace, name, "deleted; subscription %s is left in Kafka for %s, which names it too",
             desired.name, heirs[0].ref)
        unmarked = []
        for heir in heirs:
            try:
                config.wake(heir, me)
            except client.ApiException as exc:
                if exc.status != 404:   # an heir gone meanwhile needs no mark
                    unmarked.append((heir, f"the Kubernetes API answered {exc.status} {exc.reason}"))
            except Exception as exc:
                unmarked.append((heir, f"{type(exc).__name__}: {exc}"))
        if unmarked:
            # The mark is what tells an heir deleted before it reconciles that the subscription is its to remove:
            # without it, the subscription would stay in Kafka with nobody owning it. So the deletion is retried.
            heir, why = unmarked[0]
            _held(body, patch, desired.name, retry, "KubernetesError",
                  f"deletion held: could not mark {heir.ref} as the heir of subscription {desired.name} ({why}); "
                  "the deletion is retried with backoff")
        return
    if body.metadata.annotations.get(PAUSED_ANNOTATION) == "true" or desired.deletion_policy != DELETE_POLICY:
        _say(logging.INFO, namespace, name, "deleted; subscription %s left in Kafka (paused or deletionPolicy Retain)",
             desired.name)
        return
    # An older resource on this cluster that applied it and is being deleted handed it to this one (and marked it so,
    # see `wake`), which may have been deleted before it could reconcile (a namespace deleted, `kubectl delete -f
    # dir/`): this one removes it. One deleted with the owner was handed nothing: the owner's own policy decides.
    handed_by = body.metadata.annotations.get(OWNER_DELETED_ANNOTATION) or ""
    inherited = any(claim.deleting and claim.cluster_id and handed_by.startswith(f"{claim.ref} at ")
                    and _same_cluster(config, me, claim) for claim in named_too)
    # Handed over, and nothing else names it any more: the owner is gone, and this one never applied it (Kafka
    # refused its spec, say). What Kafka holds is the deleted owner's, which only this one can remove now.
    inherited = inherited or bool(handed_by and not named_too)
    # Deleted together with the owner (older on this cluster and being deleted too, or already gone while this one's
    # status still says Conflict), this one was handed nothing: the owner's policy decides, whatever this one once
    # applied (before the owner took the subscription over, say).
    with_owner = any(claim.deleting and _same_cluster(config, me, claim) and oldest_first([claim, me])[0] is claim
                     for claim in named_too)
    if not inherited and (with_owner or _in_conflict(body.status)):
        _say(logging.INFO, namespace, name, "deleted as a non-owner of subscription %s: its owner's deletionPolicy "
             "decides, Kafka is not touched", desired.name)
        return
    if not _ever_applied(body.status) and not inherited:
        # Whatever Kafka holds under that name, this resource never put it there (one made by hand, say).
        _say(logging.INFO, namespace, name, "deleted; it was never applied, so subscription %s is not touched",
             desired.name)
        return
    gone = None  # why the KafkaConnection no longer resolves, when it does not
    try:
        admin = config.admin(namespace, desired.connection)
    except InvalidSpecError as exc:
        # The KafkaConnection or a Secret is gone, as when a whole namespace is deleted: remove the subscription with
        # the connection's last good settings if this operator has them; else retry a little (a Secret may be
        # re-created) and then let go rather than hold the resource, and its namespace, forever.
        gone = exc
        admin = config.last_admin(namespace, desired.connection)
        if admin is None:
            _retry_or_let_go(body, desired, retry, exc)
            return
    except RETRIED as exc:
        _hold_deletion(body, patch, desired, retry, exc)
    try:
        keeper = _older_owner(config, admin, me, others)
        if keeper is not None:
            _say(logging.INFO, namespace, name, "deleted without touching %s, which the older %s manages on the same "
                 "cluster", desired.name, keeper.ref)
            return
        change = removal(desired.name, admin.describe_one(desired.name))
        error = admin.alter_one(change)
        if error is not None:
            raise error  # InvalidSpecError for the removal itself, KafkaRefusedError for anything else
    except (InvalidSpecError, *RETRIED) as exc:
        if not isinstance(exc, (InvalidSpecError, KubernetesApiError)):
            metrics.KAFKA_ERRORS.labels(reason_of(exc)).inc()
        if gone is not None:  # the last good settings do not reach it either: no more than a few tries
            _retry_or_let_go(body, desired, retry, f"{gone}, and with its last settings: {exc}")
            return
        if isinstance(exc, InvalidSpecError):  # Kafka refuses the removal itself: asking again will not help
            _retry_or_let_go(body, desired, retry, exc)
            return
        _hold_deletion(body, patch, desired, retry, exc)
    _say(logging.INFO, namespace, name, "%s", change.describe())


def _deleted_as(body: kopf.Body) -> Desired | None:
    """How to delete a resource whose spec the CRD refuses: only a subscription its status says it applied may be
    removed, where its `connection` says and as its `deletionPolicy` says when both are valid; with either invalid it
    is let go as with Retain (a Warning event `NotRemoved` names what stays in Kafka). None: nothing to do."""
    namespace, name = body.metadata.namespace, body.metadata.name
    applied = _applied_before(body.status)
    if applied is None:
        _say(logging.INFO, namespace, name, "deleted; its spec is invalid and it never applied a subscription, so "
             "Kafka is not touched")
        return None
    spec = body.get("spec")
    problems = schema.spec_problems(schema.SUBSCRIPTION_KIND, _plain(spec))
    unusable = problems if not isinstance(spec, Mapping) else [
        problem for problem in problems if problem.split(":")[0] in ("spec.connection", "spec.deletionPolicy")]
    if not unusable:
        return Desired(applied, (), cm.DEFAULT_INTERVAL_MS, (), _connection_of(body),
                       spec.get("deletionPolicy", DELETE_POLICY))
    where = (f" --bootstrap-server … --command-config …, for the cluster KafkaConnection {namespace}/"
             f"{_connection_of(body)} names" if _connection_of(body) else "")
    message = (f"subscription {applied} was not removed from Kafka, which stays as it is (as with deletionPolicy "
               f"{RETAIN_POLICY}): the resource's spec does not say where or whether to remove it "
               f"({'; '.join(unusable)}"
               f"); remove it there if it should go (kcm subscriptions delete {applied}{where})")
    _say(logging.WARNING, namespace, name, "%s", message)
    kopf.event(body, type="Warning", reason="NotRemoved", message=message)
    return None


def _same_cluster(config: OperatorConfig, me: Claim, claim: Claim) -> bool:
    """Whether another resource's claim is on `me`'s cluster, as far as this operator knows without connecting."""
    if claim.cluster_ref == me.cluster_ref:
        return True
    mine = config.known_cluster_id(me)
    return mine is not None and config.known_cluster_id(claim) == mine


def _hold_deletion(body: kopf.Body, patch: kopf.Patch, desired: Desired, retry: int, error: Exception) -> NoReturn:
    """Retry a removal Kafka did not make (unreachable, refused), saying on the resource why it is held: its Ready
    condition, and a Warning event when that changes."""
    _held(body, patch, desired.name, retry, reason_of(error),
          f"deletionPolicy Delete: subscription {desired.name} is not removed from Kafka yet, so the resource is "
          f"held and the removal retried with backoff (set spec.deletionPolicy: Retain, or annotate "
          f"{PAUSED_ANNOTATION}=true, to let it go and leave the subscription in Kafka): {error}")


def _held(body: kopf.Body, patch: kopf.Patch, subscription: str | None, retry: int, reason: str,
          message: str) -> NoReturn:
    """Retry a deletion, saying on the resource why it is held: its Ready condition (a Terminating resource must not
    go on reading Ready=True), and a Warning event when that changes."""
    status = _Status(body, patch, subscription)
    status.set("Ready", "False", reason, message)
    if status.ready_changed:
        _say(logging.WARNING, body.metadata.namespace, body.metadata.name, "%s", message)
        kopf.event(body, type="Warning", reason=reason, message=message)
    raise kopf.TemporaryError(message, delay=_backoff(retry)) from None


def _retry_scheduled(body: kopf.Body) -> bool:
    """Whether kopf holds a retry of the reconcile handler that is not due yet (its progress annotation says when)."""
    try:
        record = PROGRESS.fetch(key=RECONCILE, body=body)
        if not isinstance(record, dict):
            return False
        delayed = record.get("delayed")
        due = datetime.datetime.fromisoformat(delayed) if isinstance(delayed, str) else None
    except ValueError:   # not kopf's JSON or time: no retry kcm can tell of
        return False
    if due is None or record.get("success") or record.get("failure"):
        return False
    if due.tzinfo is None:
        due = due.replace(tzinfo=datetime.UTC)
    return due > datetime.datetime.now(datetime.UTC)


def _connection_of(body: Mapping[str, Any] | None) -> str | None:
    """The KafkaConnection a resource names (None: the default cluster, or a `spec.connection` that is no name)."""
    spec = (body or {}).get("spec")
    connection = spec.get("connection") if isinstance(spec, Mapping) else None
    return connection if isinstance(connection, str) and connection else None


def _refs_in_use(config: OperatorConfig, claims: kopf.Index, but: str | None = None) -> set[tuple[str, str] | None]:
    """The clusters (`cluster_ref`) the resources in kopf's index name, but the one of uid `but` and those found gone
    (`read_claim`). On the event loop only: it changes the index."""
    return {claim.cluster_ref for claim in config.present(_indexed(claims)) if claim.uid != but}


def _indexed(claims: kopf.Index) -> list[Claim]:
    """Every claim in kopf's index, copied at once. On the event loop only: it changes the index."""
    return [claim for named in claims.values() for claim in named]


def _sweep_soon(config: OperatorConfig, claims: kopf.Index) -> None:
    """Once a drift interval, in the background: read the resources kopf's index names but no handler has run for
    over the last two sweeps (`idle_claims`), SWEEP_READS at most and for one interval at most; those found gone
    (deleted while this replica was paused by peering) are forgotten, no longer counted as managed, and no longer
    keep their KafkaConnection in use. On the event loop (drift checks run only on a replica that is not paused)."""
    if (config.sweeping is not None and not config.sweeping.done()) or not config.sweep_due():
        return
    suspects = config.idle_claims(_indexed(claims))[:SWEEP_READS]
    if suspects:
        config.sweeping = asyncio.ensure_future(_sweep(config, claims, suspects))


async def _sweep(config: OperatorConfig, claims: kopf.Index, suspects: list[Claim]) -> None:
    def read() -> bool:
        until = time.monotonic() + config.drift_interval_s
        found = False
        for claim in suspects:
            if time.monotonic() >= until:
                break
            found = config.read_claim(claim) is None or found
        return found

    try:
        if await asyncio.get_running_loop().run_in_executor(config.handler_threads(), read):
            config.retire_unused(_refs_in_use(config, claims))
    except Exception:   # a bug: the next sweep tries again
        log.exception("sweeping kopf's index for resources deleted meanwhile failed")


def _claims_of(claims: kopf.Index, subscription: str) -> list[Claim]:
    """The claims on `subscription`, copied at once: handlers run on threads, and kopf's event loop changes its index
    meanwhile (iterating the live one can fail with "dictionary changed size during iteration")."""
    return list(claims.get(subscription, ()))


def _applied_name(status: Mapping[str, Any], desired: Desired) -> str:
    """The subscription a resource stands for: the one it applied, when its spec has been renamed since (an API
    server that does not check the CRD's rules lets that edit through), else the one its spec names."""
    before = status.get("subscriptionName")
    return before if before and before != desired.name and _ever_applied(status) else desired.name


def _applied_before(status: Mapping[str, Any]) -> str | None:
    """The subscription a resource applied, by its status: None if it never applied one."""
    name = status.get("subscriptionName")
    return name if isinstance(name, str) and name and _ever_applied(status) else None


def _ever_applied(status: Mapping[str, Any]) -> bool:
    """Whether the subscription was ever in Kafka as this resource specified: it was applied (`clusterId`), changed
    (`lastAppliedTime`), or found as specified (Ready, before `clusterId` existed)."""
    return bool(status.get("clusterId") or status.get("lastAppliedTime") or any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or ()))


def _in_conflict(status: Mapping[str, Any]) -> bool:
    """Whether the resource's last reconcile found an older resource owning its subscription."""
    return any(condition.get("type") == "Ready" and condition.get("reason") == "Conflict"
               for condition in status.get("conditions") or ())


def _retry_or_let_go(body: kopf.Body, desired: Desired, retry: int, why: object) -> None:
    """Retry a deletion whose cluster cannot be reached a few times, then let the resource go with an event saying
    what stays in Kafka."""
    if retry < LET_GO_AFTER_RETRIES:
        raise kopf.TemporaryError(f"removing subscription {desired.name}: {why}", delay=_backoff(retry))
    where = (f" --bootstrap-server … --command-config …, for the cluster KafkaConnection "
             f"{body.metadata.namespace}/{desired.connection} named" if desired.connection else "")
    message = (f"subscription {desired.name} was not removed from Kafka, which stays as it is: {why}; "
               f"remove it there if it should go (kcm subscriptions delete {desired.name}{where})")
    _say(logging.WARNING, body.metadata.namespace, body.metadata.name, "%s", message)
    kopf.event(body, type="Warning", reason="NotRemoved", message=message)


def _say(level: int, namespace: str | None, name: str, message: str, *args: object, exc_info: bool = False) -> None:
    """A kcm line about one resource, `namespace/name: message`, which JSON logs also carry as `namespace` and `name`
    (the fields kopf's own per-resource lines have)."""
    log.log(level, "%s/%s: " + message, namespace, name, *args, exc_info=exc_info,
            extra={"k8s_ref": {"namespace": namespace, "name": name}})


def _backoff(retry: int) -> float:
    """1, 2, 4 … 60 s, each ±20 %: resources that failed together (a cluster down) do not all retry at one instant."""
    return min(MAX_BACKOFF_S, 2.0 ** min(retry, 6)) * random.uniform(0.8, 1.2)


class _Status:
    """Status edits for one handler run; conditions and fields are patched only when they change."""

    def __init__(self, body: kopf.Body, patch: kopf.Patch, subscription_name: str | None) -> None:
        self._current = body.status
        self._patch = patch
        self.generation = body.metadata.get("generation")
        self._conditions = {condition["type"]: dict(condition) for condition in self._current.get("conditions") or ()}
        self.ready_changed = False
        self.was_ready = self._conditions.get("Ready", {}).get("status") == "True"
        self.ready_reason = self._conditions.get("Ready", {}).get("reason")
        # The generation the Ready condition describes, None before it was first set.
        self.ready_generation = self._conditions.get("Ready", {}).get("observedGeneration")
        if self._current.get("subscriptionName") != subscription_name:
            patch.status["subscriptionName"] = subscription_name
        if self._current.get("observedGeneration") != self.generation:
            patch.status["observedGeneration"] = self.generation

    def set(self, kind: str, state: str, reason: str, message: str) -> None:
        old = self._conditions.get(kind)
        if old and (old.get("status"), old.get("reason"), old.get("message"), old.get("observedGeneration")) == (
                state, reason, message, self.generation):
            return
        if old is None and kind == "Paused" and state == "False":
            return  # no Paused condition until a resource has been paused once
        self._conditions[kind] = {
            "type": kind, "status": state, "reason": reason, "message": message,
            "observedGeneration": self.generation,
            "lastTransitionTime": (old["lastTransitionTime"] if old and old.get("status") == state
                                   and old.get("lastTransitionTime") else _now()),
        }
        self.ready_changed = self.ready_changed or kind == "Ready"
        self._patch.status["conditions"] = sorted(self._conditions.values(), key=lambda c: c["type"] != "Ready")

    def applied(self) -> None:
        self._patch.status["lastAppliedTime"] = _now()

    def applied_to(self, cluster_id: str) -> None:
        if self._current.get("clusterId") != cluster_id:
            self._patch.status["clusterId"] = cluster_id


_now = now_text
