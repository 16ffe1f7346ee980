"""KafkaConnection resources → KafkaSettings, with SASL credentials and TLS material read from Secrets; and what
the subscriptions found through each, written on its status (`ConnectionStatuses`).

Credentials live only in the returned settings (whose repr hides them) and in 0600 files for TLS material;
errors name the Secret and key, never a value.
"""

from __future__ import annotations

import base64
import collections
import datetime
import hashlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from kcm_common.files import write_atomically
from kcm_common.kafka import KafkaConfigError, KafkaSettings
from kcm_operator import schema
from kcm_operator.errors import InvalidSpecError, KubernetesApiError, MissingReferenceError, invalid_spec_message

log = logging.getLogger("kcm.operator")

PLURAL = "kafkaconnections"
_VALIDATED_SETTINGS = 1024  # distinct connection settings remembered as loading; beyond, it starts again
# A TLS file no KafkaConnection names any more (its Secret rotated) is deleted this long after: an admin built from
# the old settings, or a handler that resolved them a moment ago, may still open it meanwhile.
RETIRED_MATERIAL_GRACE_S = 600.0
API_TIMEOUT_S = (5.0, 10.0)  # connect, read: a Kubernetes API that hangs must not hold a handler thread for ever
STATUS_RETRY_MAX_S = 60.0  # a failing status write is tried again after 1, 2, 4 … 60 s
OURS_KEPT = 8  # a connection's latest status writes the watch may still bring back, told from another replica's
IDLE_MESSAGE = ("ClientMetricsSubscriptions name this KafkaConnection, but none applies anything through it: they are "
                "paused, or another resource manages their subscription")
UNUSED_MESSAGE = ("no ClientMetricsSubscription this operator watches names this KafkaConnection, so the operator does "
                  "not connect to it")
_REFUSED = (401, 403)  # the operator may not write the status: an Unused one is not retried
Ref = tuple[str, str]  # (namespace, name)
_MATERIAL_PROPERTIES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
# kcm_common.kafka's messages speak of client properties and --command-config; a KafkaConnection has its own fields.
_CONNECTION_TERMS = (
    ("check --bootstrap-server and --command-config",
     "check the KafkaConnection's bootstrapServers, securityProtocol, sasl and tls"),
    ("check --command-config", "check the KafkaConnection's spec"),
    ("security.protocol SASL_PLAINTEXT needs", "spec.securityProtocol SASL_PLAINTEXT needs"),
    ("security.protocol SASL_SSL needs", "spec.securityProtocol SASL_SSL needs"),
    ("needs sasl.username and sasl.password (or sasl.jaas.config)",
     "needs spec.sasl (its mechanism, and secretRef naming the Secret with the username and password)"),
    ("sasl.username and sasl.password in --command-config", "the username and password keys of sasl.secretRef"),
    ("the ssl.* settings in --command-config", "the KafkaConnection's tls"),
    ("set ssl.key.password, or store the key unencrypted",
     "store the key unencrypted (a KafkaConnection takes no pass phrase)"),
    ("belong together, and ssl.key.password", "belong together, and the key is not encrypted"),
    ("client property ssl.ca.location", "tls.caSecretRef"),
    ("client property ssl.certificate.location", "tls.clientCertSecretRef"),
    ("client property ssl.key.location", "tls.clientCertSecretRef"),
    ("ssl.ca.location", "tls.caSecretRef"),
    ("ssl.* settings", "tls"),
    ("security.protocol=SSL", "securityProtocol: SSL"),
    ("security.protocol is", "securityProtocol is"),
    ("connect by a host name the certificate lists, or turn host-name checking off "
     "(ssl.endpoint.identification.algorithm empty)",
     "name a host the certificate lists in bootstrapServers, or set tls.verifyHostname: false"),
)


class ConnectionResolver:
    """Reads KafkaConnections and their Secrets through the Kubernetes API; `resolve(namespace, name)`."""

    def __init__(self, api_client: client.ApiClient, material_dir: Path | None = None) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        # Where TLS material is written: given, or a private temporary directory made when the first KafkaConnection
        # is resolved (none for an operator that never resolves one) and removed by `close`.
        self._material_dir = material_dir
        self._own_dir: Path | None = None
        self._dir_lock = threading.Lock()
        self._validated: set[str] = set()   # fingerprints of settings whose TLS material loaded: not per event
        self.material = MaterialLedger()
        self.statuses = ConnectionStatuses(self._custom)  # what the subscriptions found through each, on its status

    def close(self) -> None:
        """Remove the TLS material written for KafkaConnections (private keys among it): the operator stops."""
        self.statuses.close()
        with self._dir_lock:
            if self._own_dir is not None:
                shutil.rmtree(self._own_dir, ignore_errors=True)
                self._own_dir = self._material_dir = None

    def _directory(self) -> Path:
        with self._dir_lock:
            if self._material_dir is None:
                self._material_dir = self._own_dir = Path(tempfile.mkdtemp(prefix="kcm-operator-tls-"))
            return self._material_dir

    def resolve(self, namespace: str, name: str) -> KafkaSettings:
        """The settings of KafkaConnection `namespace/name`; MissingReferenceError when it or a Secret is missing,
        KubernetesApiError when the API fails or does not answer in time."""
        try:
            obj = self._custom.get_namespaced_custom_object(schema.GROUP, schema.VERSION, namespace, PLURAL, name,
                                                            _request_timeout=API_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                raise MissingReferenceError(f"spec.connection: KafkaConnection {namespace}/{name} does not exist") \
                    from None
            raise _api_error(f"reading KafkaConnection {namespace}/{name}", exc) from None
        except urllib3.exceptions.HTTPError as exc:  # no answer in time, or no connection
            raise KubernetesApiError(f"reading KafkaConnection {namespace}/{name} failed: {_transport(exc)}") from None
        self.statuses.resolved(namespace, name, (obj.get("metadata") or {}).get("generation"))
        problems = schema.spec_problems(schema.CONNECTION_KIND, obj.get("spec"))
        if problems:   # the API server may not have checked it (an older CRD installed, validation skipped)
            raise InvalidSpecError(f"KafkaConnection {namespace}/{name}: "
                                   f"{invalid_spec_message(schema.CONNECTION_KIND, problems)}")
        crd = schema.load_crds()[schema.CONNECTION_KIND]
        spec = schema.apply_defaults(crd.schema, obj)["spec"]
        read: dict[str, Mapping[str, str]] = {}   # each Secret once per resolve, however many of its keys are used
        try:
            settings = settings_from_spec(spec, lambda secret, key: self._secret_value(namespace, secret, key, read),
                                          self._directory(), self._validated)
        except MissingReferenceError as exc:   # on the subscription's status: say which KafkaConnection names it
            raise MissingReferenceError(f"KafkaConnection {namespace}/{name}: {exc}") from None
        self.material.named((namespace, name), settings)
        return settings

    def _secret_value(self, namespace: str, secret: str, key: str, read: dict[str, Mapping[str, str]]) -> bytes:
        try:
            data = read.get(secret)
            if data is None:
                data = read[secret] = self._core.read_namespaced_secret(
                    secret, namespace, _request_timeout=API_TIMEOUT_S).data or {}
        except ApiException as exc:
            if exc.status == 404:
                raise MissingReferenceError(f"Secret {namespace}/{secret} does not exist") from None
            raise _api_error(f"reading Secret {namespace}/{secret}", exc) from None
        except urllib3.exceptions.HTTPError as exc:
            raise KubernetesApiError(f"reading Secret {namespace}/{secret} failed: {_transport(exc)}") from None
        if key not in data:
            raise MissingReferenceError(f"Secret {namespace}/{secret} has no key {key!r}")
        return base64.b64decode(data[key])


def settings_from_spec(spec: Mapping[str, Any], secret_value: Any, material_dir: Path,
                       validated: set[str] | None = None) -> KafkaSettings:
    """KafkaSettings for a (defaulted) KafkaConnection spec; `secret_value(secret, key) -> bytes` reads Secrets.
    Raises KafkaConfigError, naming Secrets and keys (never a value or the file a value was written to), unless the
    settings translate and their TLS material loads. Settings already in `validated` are not loaded again (material
    files are named by their content, so equal settings mean equal material)."""
    properties = {"security.protocol": spec["securityProtocol"]}
    sources: dict[str, str] = {}  # TLS material file → the Secret and key it came from

    def credential(secret: str, key: str) -> str:
        try:
            value = secret_value(secret, key).decode("utf-8")
        except UnicodeDecodeError:
            raise KafkaConfigError(f"Secret {secret} key {key!r} is not UTF-8 text") from None
        if not value:  # a templating slip (`username: ""`): say where, before the client's generic complaint
            raise KafkaConfigError(f"Secret {secret} key {key!r} is empty: SASL needs a username and a password")
        return value

    def material(secret: str, key: str) -> str:
        path = _material(material_dir, secret_value(secret, key))
        source = f"Secret {secret} key {key!r}"  # keys with equal content share one file: name each
        sources[path] = source if sources.get(path, source) == source else f"{sources[path]} (= {source})"
        return path

    sasl = spec.get("sasl")
    if sasl:
        ref = sasl["secretRef"]
        properties["sasl.mechanism"] = sasl["mechanism"]
        properties["sasl.username"] = credential(ref["name"], ref.get("usernameKey", "username"))
        properties["sasl.password"] = credential(ref["name"], ref.get("passwordKey", "password"))
    tls = spec.get("tls") or {}
    if "caSecretRef" in tls:
        ref = tls["caSecretRef"]
        properties["ssl.ca.location"] = material(ref["name"], ref.get("key", "ca.crt"))
    if "clientCertSecretRef" in tls:
        ref = tls["clientCertSecretRef"]
        properties["ssl.certificate.location"] = material(ref["name"], ref.get("certKey", "tls.crt"))
        properties["ssl.key.location"] = material(ref["name"], ref.get("keyKey", "tls.key"))
    if tls.get("verifyHostname") is False:
        properties["ssl.endpoint.identification.algorithm"] = ""
    settings = KafkaSettings(spec["bootstrapServers"], properties)
    key = settings.fingerprint()
    if validated is not None and key in validated:
        return settings
    try:
        settings.validate()  # refuse what kafka-python cannot honour, or TLS that does not load, now
    except KafkaConfigError as exc:
        message = str(exc)
        for path, source in sources.items():
            message = message.replace(repr(path), source).replace(path, source)
        raise KafkaConfigError(in_connection_terms(message)) from None
    if validated is not None:
        if len(validated) >= _VALIDATED_SETTINGS:
            validated.clear()
        validated.add(key)
    return settings


def in_connection_terms(message: str) -> str:
    """A message about Kafka client settings as a KafkaConnection's author knows them: its fields, not the client
    properties and `--command-config` of kcm's commands."""
    for said, meant in _CONNECTION_TERMS:
        message = message.replace(said, meant)
    return message


class MaterialLedger:
    """Which TLS material files each KafkaConnection's latest settings name; a file none names any more (a rotated
    Secret's old certificate or key) is deleted RETIRED_MATERIAL_GRACE_S later, so rotations do not pile up files.
    A deleted KafkaConnection keeps its files: deleting its subscriptions uses its last settings."""

    def __init__(self, grace_s: float = RETIRED_MATERIAL_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._latest: dict[tuple[str, str], frozenset[str]] = {}
        self._retired: dict[str, float] = {}   # path → when the last settings naming it were replaced
        self._lock = threading.Lock()

    def named(self, connection: tuple[str, str], settings: KafkaSettings) -> None:
        paths = frozenset(settings.properties[key] for key in _MATERIAL_PROPERTIES if key in settings.properties)
        now = self._clock()
        with self._lock:
            previous = self._latest.get(connection, frozenset())
            self._latest[connection] = paths
            if previous != paths:
                in_use = frozenset().union(*self._latest.values())
                for path in previous - in_use:
                    self._retired.setdefault(path, now)
                for path in paths:
                    self._retired.pop(path, None)
            due = [path for path, since in self._retired.items() if now - since >= self._grace_s]
            for path in due:
                del self._retired[path]
        for path in due:
            Path(path).unlink(missing_ok=True)


def _material(directory: Path, content: bytes) -> str:
    # kafka-python reads TLS material from files; one private file per distinct content.
    path = directory / hashlib.sha256(content).hexdigest()[:16]
    if not path.exists():   # (again, if the ledger deleted it: the settings naming it came back)
        # Handlers run side by side: none may read a half-written key, nor collide with another writing it.
        write_atomically(path, content)
    return str(path)


def _transport(error: urllib3.exceptions.HTTPError) -> str:
    # The exception's class only: its text names the pool and the URL, nothing a user acts on.
    if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
        error = error.reason  # the client's own retries (3) gave up: why the last one failed
    if isinstance(error, urllib3.exceptions.TimeoutError):
        return f"the Kubernetes API did not answer in time ({API_TIMEOUT_S[1]:g} s per try)"
    return f"the Kubernetes API could not be reached ({type(error).__name__})"


def _api_error(what: str, error: ApiException) -> KubernetesApiError:
    # The status and reason only: an API error's body may echo what was asked for.
    hint = ": the operator's service account needs get on it (see the chart's RBAC)" if error.status == 403 else ""
    return KubernetesApiError(f"{what} failed: {error.status} {error.reason}{hint}")


def command_config_reader(bootstrap_servers: str, path: str | Path | None,
                          settings: KafkaSettings) -> Callable[[], KafkaSettings] | None:
    """The default cluster's settings, read again from the `--command-config` file at `path` once it changed (a
    mounted Secret rotated: a new password, new TLS paths); `settings` as read at start until then. None without a
    file. Raises KafkaConfigError, naming the file, while the new content is unreadable or invalid (asked again at
    every call)."""
    if not path:
        return None
    seen = {"stat": _stat(path), "settings": settings}

    def current() -> KafkaSettings:
        now = _stat(path)
        if now != seen["stat"]:
            seen["settings"] = KafkaSettings.from_cli(bootstrap_servers, path)
            seen["stat"] = now
        return seen["settings"]

    return current


def _stat(path: str | Path) -> tuple[int, int, int] | None:
    try:
        info = Path(path).stat()   # through the symlinks a projected Secret swaps when it rotates
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


@dataclass(frozen=True)
class Shown:
    """One connection's status as written: the Ready condition, the cluster reached, the generation resolved."""

    state: str            # "True", "False", "Unknown"
    reason: str
    message: str
    cluster_id: str | None
    generation: int | None
    since: str            # the condition's lastTransitionTime

    def body(self) -> dict:
        status: dict = {"conditions": [{"type": "Ready", "status": self.state, "reason": self.reason,
                                        "message": self.message, "lastTransitionTime": self.since}]}
        if self.cluster_id is not None:
            status["clusterId"] = self.cluster_id
        if self.generation is not None:
            status["observedGeneration"] = self.generation
            status["conditions"][0]["observedGeneration"] = self.generation
        return {"status": status}


class ConnectionStatuses:
    """`report` what a subscription's reconcile found through its KafkaConnection; `unused` once none names it."""

    def __init__(self, custom: client.CustomObjectsApi, retry_max_s: float = STATUS_RETRY_MAX_S) -> None:
        self._custom = custom
        self._retry_max_s = retry_max_s
        self._lock = threading.Condition()
        self._generations: dict[Ref, int] = {}  # the generation of each connection as last resolved
        self._shown: dict[Ref, Shown] = {}      # what each connection's status says, or is about to
        self._due: dict[Ref, float] = {}        # connections to write, and when (time.monotonic())
        self._attempts: dict[Ref, int] = {}     # failed writes in a row
        self._refused: set[tuple[Ref, int]] = set()  # (connection, HTTP status) already logged as a warning
        self._needs: dict[Ref, str] = {}        # the call a shown refusal of the cluster right was for (`report`)
        self._named: set[Ref] = set()           # named while nothing was known of them: `seen` says Idle (`named`)
        self._missing: set[Ref] = set()         # known to be gone: no report is written until seen or resolved
        self._invalid: dict[Ref, str] = {}      # connections whose spec the CRD refuses, and why (`checked`)
        # Connections whose status the watch has brought (`seen`), with the number of `seen` calls by then: a write
        # that finds one gone tells from it whether the watch brought it (made again) meanwhile.
        self._seen_at: dict[Ref, int] = {}
        self._ours: dict[Ref, collections.deque[Shown]] = {}   # each connection's statuses this replica wrote last
        self._seen_count = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def report(self, namespace: str, name: str, state: str, reason: str, message: str,
               cluster_id: str | None = None, *, needs: str | None = None,
               proves: tuple[str, ...] = ("describe", "alter")) -> None:
        """Say `Ready` `state` (`reason`, `message`) on KafkaConnection `namespace/name`; `cluster_id`: the cluster
        reached through it (None: the one its status shows stays, as does an observedGeneration when it was not
        read). `needs`: the call ("describe", "alter") Kafka refused the connection's user the cluster right for; that
        refusal stays until a `True` report `proves` that call passes (a reconcile that changed nothing in Kafka
        cannot tell that the right another's change lacked was granted). Returns at once."""
        ref = (namespace, name)
        with self._lock:
            if ref in self._missing or (state == "True" and self._needs.get(ref) not in (None, *proves)):
                return
            self._named.discard(ref)
            self._report(ref, state, reason, message, cluster_id)
            if needs is None:
                self._needs.pop(ref, None)
            else:
                self._needs[ref] = needs

    def named(self, namespace: str, name: str) -> None:
        """A subscription naming KafkaConnection `namespace/name` reconciled without applying anything through it
        (paused, in Conflict): one that says `Unused` says `Unknown`, `Idle`; any other report stays. One nothing is
        known of (as the operator starts, or an Unused it could not write and dropped) waits for its status, which
        the watch brings (`seen`)."""
        ref = (namespace, name)
        with self._lock:
            before = self._shown.get(ref)
            if before is None and ref not in self._seen_at:
                self._named.add(ref)
            elif before is None or before.reason == "Unused":   # read, and saying nothing (new) or Unused
                self._report(ref, "Unknown", "Idle", IDLE_MESSAGE, None)

    def _report(self, ref: Ref, state: str, reason: str, message: str, cluster_id: str | None) -> None:
        """`report`, under the lock."""
        if self._closed:
            return
        before = self._shown.get(ref)
        since = before.since if before is not None and before.state == state else now_text()
        # What a report leaves out stays as shown: the merge patch would keep a cluster id, but the condition is
        # written whole (its observedGeneration too), and an unchanged status (as a restart reads it back) is not
        # written again.
        if before is not None and cluster_id is None:
            cluster_id = before.cluster_id
        generation = self._generations.get(ref, before.generation if before is not None else None)
        shown = Shown(state, reason, message, cluster_id, generation, since)
        if shown == before:
            return
        self._shown[ref] = shown
        self._due.setdefault(ref, 0.0)   # a write waiting out a backoff keeps its time
        self._start()
        self._lock.notify_all()

    def seen(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """What KafkaConnection `namespace/name`'s status says (as the operator starts, or it changed: by this
        replica, or another while this one was paused by peering): what the next report is compared with, unless a
        report of this one is still to write. An unchanged report then keeps its condition's transition time."""
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        ready = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), None) \
            if isinstance(conditions, list) else None
        ref = (namespace, name)
        with self._lock:
            if self._closed:
                return
            self._missing.discard(ref)
            self._seen_count += 1
            self._seen_at[ref] = self._seen_count
            if ready is not None:
                cluster_id, generation = status.get("clusterId"), status.get("observedGeneration")
                read = Shown(
                    str(ready.get("status")), str(ready.get("reason") or ""), str(ready.get("message") or ""),
                    cluster_id if isinstance(cluster_id, str) else None,
                    generation if isinstance(generation, int) else None, str(ready.get("lastTransitionTime") or ""))
                # What another replica wrote while this one was paused by peering is what a report is compared
                # with (else the first report equal to this replica's own last one, now untrue, is never written);
                # a report of this one's still to write stays, and the watch bringing this one's own earlier writes
                # (after a later one) changes nothing.
                if ref not in self._due and read not in self._ours.get(ref, ()):
                    self._shown[ref] = read
            if ref in self._named:   # named while nothing was known of it: Idle, unless it says more than Unused
                self._named.discard(ref)
                if (shown := self._shown.get(ref)) is None or shown.reason == "Unused":
                    self._report(ref, "Unknown", "Idle", IDLE_MESSAGE, None)

    def forget(self, namespace: str, name: str) -> None:
        """KafkaConnection `namespace/name` was deleted."""
        with self._lock:
            self._named.discard((namespace, name))
            self._invalid.pop((namespace, name), None)
            self._seen_at.pop((namespace, name), None)
            self._forget((namespace, name))
            # Nothing to write while it stays gone (a subscription naming it fails at each retry and drift check):
            # until the watch brings it back (`seen`) or a resolve reads it.
            self._missing.add((namespace, name))

    def resolved(self, namespace: str, name: str, generation: object) -> None:
        """Note the generation of KafkaConnection `namespace/name` just read: its status's `observedGeneration`."""
        with self._lock:
            self._missing.discard((namespace, name))
            if isinstance(generation, int):
                self._generations[(namespace, name)] = generation

    def unused(self, in_use: Iterable[object]) -> None:
        """Connections no subscription names any more (`in_use`: the (namespace, name) references still named) say
        `Ready` `Unknown`, `Unused` (kept, until the connection is deleted: what `named` changes), or `False`,
        `InvalidSpec` when their spec is (`checked`)."""
        in_use = set(in_use)
        with self._lock:
            self._named &= in_use
            self._missing &= in_use
            for ref in [ref for ref in self._generations if ref not in in_use and ref not in self._shown]:
                del self._generations[ref]
            gone = [ref for ref, shown in self._shown.items() if ref not in in_use and shown.reason != "Unused"]
        for namespace, name in gone:
            self.report_unused(namespace, name)

    def checked(self, namespace: str, name: str, generation: object, problem: str | None) -> None:
        """What checking KafkaConnection `namespace/name`'s spec (of `generation`) against its CRD found: `problem`,
        or None when the CRD accepts it. Said when no subscription names the connection (`report_unused`); one that
        a subscription names says it through that subscription's reconcile."""
        ref = (namespace, name)
        with self._lock:
            if problem is None:
                self._invalid.pop(ref, None)
                return
            self._invalid[ref] = problem
            if isinstance(generation, int):
                self._generations[ref] = generation

    def report_unused(self, namespace: str, name: str) -> None:
        """Say that no subscription names KafkaConnection `namespace/name`: `Unknown`, `Unused`; or, when its spec
        is invalid (`checked`), `False`, `InvalidSpec` with the problem (the operator does not connect to an unused
        one, but its spec can be checked without)."""
        with self._lock:
            problem = self._invalid.get((namespace, name))
        if problem is None:
            self.report(namespace, name, "Unknown", "Unused", UNUSED_MESSAGE)
        else:
            self.report(namespace, name, "False", "InvalidSpec", problem)

    def shown(self, namespace: str, name: str) -> Shown | None:
        with self._lock:
            return self._shown.get((namespace, name))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kcm-connection-status", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed:
                    now = time.monotonic()
                    ready = [ref for ref, due in self._due.items() if due <= now]
                    if ready:
                        break
                    self._lock.wait(min(self._due.values(), default=now + 3600) - now)
                if self._closed:
                    return
                ref = ready[0]
                shown, seen_at = self._shown[ref], self._seen_at.get(ref)
            outcome = self._write(ref, shown)
            with self._lock:
                current = self._shown.get(ref) is shown   # no newer report since: that one is still to write
                if outcome == "gone" and current:    # the KafkaConnection was deleted: nothing to say or keep
                    self._forget(ref)
                    # Known gone, unless the watch brought it (made again) during the write. Its deletion may never
                    # come: one deleted while this replica was paused by peering is not listed on resuming.
                    if self._seen_at.get(ref) == seen_at:
                        self._seen_at.pop(ref, None)
                        self._missing.add(ref)
                elif outcome == "written" or (outcome == "refused" and shown.reason == "Unused"):
                    self._attempts.pop(ref, None)
                    if outcome == "written":
                        self._refused = {(done, status) for done, status in self._refused if done != ref}
                        self._ours.setdefault(ref, collections.deque(maxlen=OURS_KEPT)).append(shown)
                    if current:
                        del self._due[ref]
                        if outcome == "refused":   # an Unused it may not write is dropped
                            self._forget(ref)
                elif outcome == "gone":
                    self._due[ref] = 0.0   # a report made meanwhile: it may have been created again
                else:
                    attempts = self._attempts[ref] = self._attempts.get(ref, 0) + 1
                    self._due[ref] = time.monotonic() + min(self._retry_max_s, 2.0 ** (attempts - 1))

    def _forget(self, ref: Ref) -> None:
        self._refused = {(done, status) for done, status in self._refused if done != ref}
        self._ours.pop(ref, None)
        self._needs.pop(ref, None)
        self._shown.pop(ref, None)
        self._generations.pop(ref, None)
        self._due.pop(ref, None)
        self._attempts.pop(ref, None)

    def _write(self, ref: Ref, shown: Shown) -> str:
        namespace, name = ref
        try:
            self._custom.patch_namespaced_custom_object_status(
                schema.GROUP, schema.VERSION, namespace, PLURAL, name, shown.body(), _request_timeout=API_TIMEOUT_S)
            return "written"
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            with self._lock:
                first = (ref, exc.status) not in self._refused
                self._refused.add((ref, exc.status))
            if first:
                hint = (": its role needs patch on kafkaconnections/status (the chart's RBAC has it)"
                        if exc.status == 403 else "")
                then = "dropped" if exc.status in _REFUSED and shown.reason == "Unused" else "retried with backoff"
                log.warning("writing the status of KafkaConnection %s/%s failed (HTTP %s %s)%s; %s",
                            namespace, name, exc.status, exc.reason, hint, then)
            if exc.status in _REFUSED:
                return "refused"
        except urllib3.exceptions.HTTPError as exc:
            log.info("writing the status of KafkaConnection %s/%s failed (%s); retried with backoff",
                     namespace, name, type(exc).__name__)
        except Exception:   # a fault of kcm or the library: logged whole, the subscriptions are not affected
            log.exception("writing the status of KafkaConnection %s/%s failed unexpectedly; retried with backoff",
                          namespace, name)
        return "failed"


def now_text() -> str:
    """Now, as Kubernetes writes times (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
