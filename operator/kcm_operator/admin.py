"""The Kafka edge of reconciliation: list, describe and incrementally alter CLIENT_METRICS resources, many per request.

Errors come back mapped: a spec Kafka refuses → InvalidSpecError, no connection → KafkaUnavailableError,
a broker without KIP-714 (APIs 71/72 not advertised) → UnsupportedError, from `require_telemetry` (applying there
would have no effect) and from listing on a broker too old to hold subscriptions at all (no API 74). Reading and
removing subscriptions never needs the telemetry APIs: a cluster whose receiver plugin was removed keeps them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import kafka.errors as kafka_errors
from kafka import KafkaAdminClient
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest, ListConfigResourcesRequest

from kcm_common.codes import (
    CLIENT_METRICS_CONFIG_SOURCE,
    CLIENT_METRICS_RESOURCE,
    GET_TELEMETRY_SUBSCRIPTIONS,
    INVALID_CONFIG,
    INVALID_REQUEST,
    LIST_CONFIG_RESOURCES,
    POLICY_VIOLATION,
    PUSH_TELEMETRY,
)
from kcm_common.kafka import (
    ADVERTISED_PROBE_S,
    KafkaConfigError,
    KafkaSettings,
    KafkaUnavailableError,
    advertised_brokers,
    check_reachable,
    diagnose_failure,
    is_utf8,
    parse_bootstrap,
    unreachable_advertised,
)
from kcm_operator.errors import InvalidSpecError, KafkaRefusedError, UnsupportedError
from kcm_operator.reconcile import Change, ops_for_kafka

log = logging.getLogger("kcm.operator.admin")

BATCH_SIZE = 100  # resources per request, as Strimzi's topic operator batches
_CONNECTION_ERRORS = (kafka_errors.KafkaConnectionError, kafka_errors.BrokerNotAvailableError,
                      kafka_errors.KafkaTimeoutError, kafka_errors.RequestTimedOutError,
                      kafka_errors.NodeNotReadyError, kafka_errors.NotControllerError, kafka_errors.Cancelled,
                      OSError, RuntimeError)


class SubscriptionAdmin:
    """CLIENT_METRICS calls on one cluster; reconnects by itself after Kafka went away. Thread-safe."""

    def __init__(self, settings: KafkaSettings, timeout_s: float = 10.0,
                 explain: Callable[[str], str] | None = None, reachability: Reachability | None = None) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._explain = explain  # rewrites a connection problem's message in the terms its settings were given in
        # Shared by every admin that reaches these servers the same way (see OperatorConfig), whatever its credentials.
        self._reachability = reachability or Reachability()
        self._client: KafkaAdminClient | None = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one request at a time: the operator calls from many handler threads
        # After a failed connect, callers get the same answer at once for `timeout_s`, and after that too while
        # another caller tries again: a cluster that never answers holds one handler thread, not one per resource.
        self._failed: tuple[float, Exception] | None = None
        self._closed = False
        self._cluster_id: str | None = None  # known from the first connection's metadata; a cluster keeps its id
        self._apis: frozenset[int] = frozenset()  # the API keys the brokers advertised on the last connection
        self._apis_read = 0.0  # when (monotonic)

    def require_telemetry(self) -> None:
        """Refuse (UnsupportedError) a cluster whose brokers do not do KIP-714: a subscription applied there has no
        effect. Connects the first time."""
        client = self._connected()
        if not self._telemetry() and time.monotonic() - self._apis_read >= self.timeout_s:
            # The brokers tell their APIs only on connecting, and a connection outlives their restart (as with the
            # receiver plugin added): connect again, at most once a timeout, to read them anew.
            with self._lock:
                if self._client is client:
                    self._reset()
            self._connected()
        if not self._telemetry():
            raise UnsupportedError(
                f"the brokers at {self.settings.describe()} do not do KIP-714 client telemetry "
                "(no GetTelemetrySubscriptions/PushTelemetry APIs): each broker needs kcm's receiver "
                "plugin (metric.reporters) before subscriptions have any effect")

    def _telemetry(self) -> bool:
        return {GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY} <= self._apis

    def list_names(self) -> list[str]:
        """Every CLIENT_METRICS resource in the cluster, managed or not."""
        self._connected()
        if LIST_CONFIG_RESOURCES not in self._apis:  # before Kafka 3.7: no CLIENT_METRICS resources to list
            self.require_telemetry()
        response = self._send(ListConfigResourcesRequest(resource_types=[CLIENT_METRICS_RESOURCE]))
        if response.error_code:
            raise _error(response.error_code, "listing subscriptions")
        return sorted(entry.resource_name for entry in response.config_resources)

    def describe(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        """The set configs of each named subscription ({} for one that does not exist); raises the first refusal."""
        found = self.describe_each(names)
        for result in found.values():
            if isinstance(result, Exception):
                raise result
        return found  # type: ignore[return-value]

    def describe_each(self, names: Sequence[str]) -> dict[str, dict[str, str] | Exception]:
        """Per named subscription: its set configs ({} when it does not exist), or the error Kafka gave for it."""
        for name in names:
            _check_text(name, "subscription name")
        found: dict[str, dict[str, str] | Exception] = {}
        for start in range(0, len(names), BATCH_SIZE):
            chunk = list(dict.fromkeys(names[start:start + BATCH_SIZE]))
            request = DescribeConfigsRequest(resources=[(CLIENT_METRICS_RESOURCE, name, None) for name in chunk],
                                             include_synonyms=False)
            for result in self._send(request).results:
                found[result.resource_name] = (
                    _error(result.error_code, f"subscription {result.resource_name!r}: {result.error_message}")
                    if result.error_code else
                    {entry.name: entry.value for entry in result.configs
                     if entry.config_source == CLIENT_METRICS_CONFIG_SOURCE})
        return found

    def alter(self, changes: Sequence[Change], validate_only: bool = False) -> dict[str, Exception | None]:
        """Send every change's ops (IncrementalAlterConfigs); per subscription: None, or the error Kafka gave."""
        outcome: dict[str, Exception | None] = {}
        pending = [change for change in changes if change.ops]
        for change in pending:
            _check_text(change.name, "subscription name")
            for op in change.ops:
                if isinstance(op.value, str):
                    _check_text(op.value, f"subscription {change.name!r}: {op.key}")
        for start in range(0, len(pending), BATCH_SIZE):
            chunk = pending[start:start + BATCH_SIZE]
            request = IncrementalAlterConfigsRequest(
                resources=[(CLIENT_METRICS_RESOURCE, change.name, ops_for_kafka(change.ops)) for change in chunk],
                validate_only=validate_only)
            for result in self._send(request).responses:
                outcome[result.resource_name] = (
                    _error(result.error_code, result.error_message or "") if result.error_code else None)
        return outcome

    def cluster_id(self) -> str:
        """Which cluster this is, to tell whether two connections reach the same one: Kafka's cluster id, or (from a
        broker too old to give one) its sorted bootstrap servers. Connects the first time; never waits for a request
        under way."""
        if self._cluster_id is None:
            self._connected()
        return self._cluster_id or ",".join(sorted(self.settings.client_options()["bootstrap_servers"]))

    def close(self) -> None:
        """Close the client for good: a call still under way, or made later, fails (KafkaUnavailableError) rather
        than connecting again with these settings."""
        with self._lock:
            self._closed = True
            self._reset()

    def _send(self, request: Any) -> Any:
        with self._send_lock:
            client = self._connected()
            # A deadline of its own beyond the request's: a request that is neither answered nor failed (kafka-python
            # lost it) must not hold this lock, and with it every resource of the cluster, for ever.
            deadline_ms = client.config["request_timeout_ms"] + int(self.timeout_s * 1000)
            try:
                return client._manager.run(client._manager.wait_for, client._manager.send(request), deadline_ms)
            except _CONNECTION_ERRORS as exc:  # also the client closed under the call ("NetworkSelector closed!")
                # The bootstrap servers answered; requests go to the brokers their metadata names, which may be out
                # of reach from here (advertised.listeners): that, not a lost connection, is what to fix.
                hint = unreachable_advertised(self.settings.bootstrap_servers, advertised_brokers(client),
                                              ADVERTISED_PROBE_S)
                with self._lock:
                    if self._client is client:
                        self._reset()
                problem = (f"Kafka at {self.settings.describe()} answers, but {hint}" if hint else
                           f"lost the connection to Kafka at {self.settings.describe()}: {type(exc).__name__}: {exc}")
                raise KafkaUnavailableError(self._explain(problem) if self._explain else problem) from None
            except kafka_errors.KafkaError as exc:
                raise KafkaRefusedError(f"{type(exc).__name__}: {exc}", getattr(exc, "errno", None)) from None

    def _connected(self) -> KafkaAdminClient:
        if not self._lock.acquire(blocking=self._failed is None):
            failed = self._failed  # the cluster failed, and another caller is connecting again
            if failed is not None:
                raise type(failed[1])(str(failed[1]))
            self._lock.acquire()
        try:
            if self._closed:
                raise KafkaUnavailableError(f"the client for Kafka at {self.settings.describe()} was closed (its "
                                            "settings changed); the next attempt uses the new ones")
            if self._client is None:
                if self._failed is not None and time.monotonic() < self._failed[0]:
                    raise type(self._failed[1])(str(self._failed[1]))
                try:
                    self._client = self._connect()
                except (KafkaUnavailableError, InvalidSpecError) as exc:
                    problem = type(exc)(self._explain(str(exc))) if self._explain else exc
                    if isinstance(problem, KafkaUnavailableError):
                        self._failed = (time.monotonic() + self.timeout_s, problem)
                    raise problem from None
                self._failed = None
                self._cluster_id = self._client._manager.cluster.cluster_id or self._cluster_id
                self._apis = frozenset(self._client._manager.broker_version_data.api_versions)
                self._apis_read = time.monotonic()
            return self._client
        finally:
            self._lock.release()

    def _connect(self) -> KafkaAdminClient:
        try:
            self._reachability.check(self.settings, self.timeout_s)
        except KafkaConfigError as exc:  # TLS material that no longer loads (a file removed since it was checked)
            raise InvalidSpecError(f"Kafka at {self.settings.describe()}: {exc}") from None
        timeout_ms = int(self.timeout_s * 1000)
        try:
            # A request.timeout.ms in the client properties is the user's and wins over the operator's bound.
            client = KafkaAdminClient(bootstrap_timeout_ms=timeout_ms,
                                      **{"request_timeout_ms": timeout_ms, **self.settings.client_options()})
        except kafka_errors.KafkaError as exc:
            problem = diagnose_failure(self.settings, exc)
            if isinstance(problem, KafkaConfigError):
                raise InvalidSpecError(f"Kafka at {self.settings.describe()}: {problem}") from None
            raise problem from None
        return client

    def _reset(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # closing a client whose connection already broke must not hide the first error
                log.debug("closing the admin client failed", exc_info=True)
            self._client = None


class Reachability:
    """Whether some bootstrap servers answer with one transport (plain or TLS, which CA): the probe before a connect,
    shared by every admin of those servers and that transport, whatever credentials each has. One caller probes at a
    time; after a failure every caller gets the same answer at once for the timeout, and after that while another one
    probes again: a cluster that never answers holds one handler thread however many KafkaConnections name it."""

    def __init__(self) -> None:
        self._probing = threading.Lock()
        self._failed: tuple[float, KafkaUnavailableError] | None = None

    def check(self, settings: KafkaSettings, timeout_s: float) -> None:
        if not self._probing.acquire(blocking=self._failed is None):
            self._raise_failure()  # another caller is probing a cluster that failed
            self._probing.acquire()
        try:
            if self._failed is not None and time.monotonic() < self._failed[0]:
                self._raise_failure()
            try:
                check_reachable(settings, timeout_s)
            except KafkaUnavailableError as exc:
                self._failed = (time.monotonic() + timeout_s, exc)
                raise
            self._failed = None
        finally:
            self._probing.release()

    def _raise_failure(self) -> None:
        failed = self._failed
        if failed is not None:
            raise KafkaUnavailableError(str(failed[1]))


def transport_key(settings: KafkaSettings) -> str:
    """What a probe of `settings` depends on: the bootstrap servers and the transport (security protocol, ssl.*), not
    the SASL credentials. Admins whose settings share it share a Reachability. A digest: ssl.key.password is among
    them, and the key may be shown (a repr of the operator's config)."""
    transport = {key: value for key, value in settings.properties.items()
                 if key.startswith("ssl.") or key == "security.protocol"}
    return KafkaSettings(servers_key(settings), transport).fingerprint()


def servers_key(settings: KafkaSettings) -> str:
    """The bootstrap servers, sorted: connections naming the same ones reach the same cluster."""
    return ",".join(sorted({f"{host}:{port}" for host, port in parse_bootstrap(settings.bootstrap_servers)}))


class BatchedAdmin:
    """One-subscription calls from many handler threads sent as shared requests: up to BATCH_SIZE per request,
    collected for at most `linger_s` (Strimzi's topic operator: 100 within 100 ms)."""

    def __init__(self, admin: SubscriptionAdmin, linger_s: float = 0.1) -> None:
        self.admin = admin
        self._describe = _Batcher(admin.describe_each, linger_s)
        self._alter = _Batcher(admin.alter, linger_s)

    @property
    def settings(self) -> KafkaSettings:
        return self.admin.settings

    def require_telemetry(self) -> None:
        self.admin.require_telemetry()

    def describe_one(self, name: str) -> dict[str, str]:
        """The set configs of one subscription ({} when it does not exist); raises what Kafka said about it alone."""
        result = self._describe.submit(name, name)
        if isinstance(result, Exception):
            raise result
        return result or {}

    def cluster_id(self) -> str:
        return self.admin.cluster_id()

    def alter_one(self, change: Change) -> Exception | None:
        """Send one change's ops; None, or the error Kafka gave for it."""
        return self._alter.submit(change.name, change) if change.ops else None

    def close(self) -> None:
        self.admin.close()


class _Batcher:
    """The first caller of a batch waits for company, sends everyone's items in one call and hands out results."""

    def __init__(self, send: Callable[[list[Any]], Mapping[str, Any]], linger_s: float) -> None:
        self._send = send
        self._linger_s = linger_s
        self._changed = threading.Condition()
        self._pending: dict[str, tuple[Any, Future[Any]]] = {}
        self._leading = False

    def submit(self, key: str, item: Any) -> Any:
        future: Future[Any] = Future()
        with self._changed:
            while key in self._pending:  # Kafka refuses a resource named twice in one request
                self._changed.wait()
            self._pending[key] = (item, future)
            lead, self._leading = not self._leading, True
            self._changed.notify_all()
        if lead:
            self._lead()
        return future.result()

    def _lead(self) -> None:
        deadline = time.monotonic() + self._linger_s
        with self._changed:
            while len(self._pending) < BATCH_SIZE and (remaining := deadline - time.monotonic()) > 0:
                self._changed.wait(remaining)
            batch, self._pending, self._leading = self._pending, {}, False
            self._changed.notify_all()
        try:
            results = self._send([item for item, _ in batch.values()])
        except Exception as exc:  # the whole request failed: every caller gets the reason
            for _, future in batch.values():
                future.set_exception(exc)
            return
        for key, (_, future) in batch.items():
            future.set_result(results.get(key))


def _error(code: int, message: str) -> Exception:
    # A cluster's alter.config.policy.class.name judges client-metrics configs too: its refusal is of the spec (only
    # an edit helps), not of kcm's rights.
    if code in (INVALID_CONFIG, INVALID_REQUEST, POLICY_VIOLATION):
        return InvalidSpecError(message)
    name = kafka_errors.for_code(code).__name__
    return KafkaRefusedError(f"{name} (error {code}): {message}", code)


def _check_text(text: str, what: str) -> None:
    """Refuse text that is not UTF-8 (a lone surrogate, from a YAML escape or a command line's stray byte): kafka-python
    cannot encode it, and its request would never be sent nor fail, holding the connection for ever."""
    if not is_utf8(text):
        raise InvalidSpecError(f"{what} {text!r} is not UTF-8 text (a lone surrogate such as \\ud800?)")
