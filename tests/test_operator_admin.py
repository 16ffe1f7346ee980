"""The operator's Kafka edge: calls from many handler threads share requests, per cluster, against the sandbox."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kafka.future import Future as KafkaFuture

from kcm_common.kafka import KafkaSettings, KafkaUnavailableError
from kcm_operator import admin as admin_module
from kcm_operator.admin import BatchedAdmin, SubscriptionAdmin
from kcm_operator.connections import in_connection_terms
from kcm_operator.errors import InvalidSpecError, KafkaRefusedError
from kcm_operator.handlers import OperatorConfig
from kcm_operator.reconcile import desired_from_spec, diff


class CountingAdmin(SubscriptionAdmin):
    """The real admin, counting the requests it sends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[int] = []
        self._count_lock = threading.Lock()

    def describe(self, names):
        with self._count_lock:
            self.requests.append(len(names))
        return super().describe(names)

    def alter(self, changes, validate_only=False):
        with self._count_lock:
            self.requests.append(len(changes))
        return super().alter(changes, validate_only)


def test_concurrent_single_calls_are_batched_and_each_caller_gets_its_own_result(sandbox):
    counting = CountingAdmin(KafkaSettings(sandbox.bootstrap))
    admin = BatchedAdmin(counting, linger_s=0.2)
    wanted = [desired_from_spec("ns", f"app-{index}", {"metrics": [f"m{index}."], "intervalMs": 1000 + index})
              for index in range(60)]
    try:
        with ThreadPoolExecutor(60) as pool:
            errors = list(pool.map(lambda desired: admin.alter_one(diff(desired, admin.describe_one(desired.name))),
                                   wanted))
            described = list(pool.map(lambda desired: admin.describe_one(desired.name), wanted))
    finally:
        admin.close()

    assert errors == [None] * 60
    assert described == [desired.configs() for desired in wanted]
    # 180 calls, one request each would be 180; here about 3-9, more when threads start slowly on a loaded machine.
    assert len(counting.requests) < 60, counting.requests
    assert max(counting.requests) > 1


def test_a_failed_request_fails_every_caller_in_the_batch():
    admin = BatchedAdmin(SubscriptionAdmin(KafkaSettings("127.0.0.1:1"), timeout_s=1), linger_s=0.2)
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(admin.describe_one, f"s{index}") for index in range(5)]

    for future in futures:
        with pytest.raises(KafkaUnavailableError):
            future.result()


def test_one_subscription_kafka_refuses_fails_only_its_own_caller():
    class Refusing(SubscriptionAdmin):
        def describe_each(self, names):
            return {name: KafkaRefusedError("CLUSTER_AUTHORIZATION_FAILED") if name == "s0" else {"interval.ms": "1"}
                    for name in names}

    admin = BatchedAdmin(Refusing(KafkaSettings("127.0.0.1:1")), linger_s=0.2)
    with ThreadPoolExecutor(3) as pool:
        futures = {name: pool.submit(admin.describe_one, name) for name in ("s0", "s1", "s2")}

    with pytest.raises(KafkaRefusedError, match="AUTHORIZATION"):
        futures["s0"].result()
    assert [futures[name].result() for name in ("s1", "s2")] == [{"interval.ms": "1"}] * 2


def test_after_a_failed_connect_callers_get_the_answer_at_once_for_one_timeout(monkeypatch):
    probes = []

    def unreachable(settings, timeout_s):
        probes.append(timeout_s)
        raise KafkaUnavailableError("cannot reach Kafka: 127.0.0.1:1 refuses connections")

    monkeypatch.setattr(admin_module, "check_reachable", unreachable)
    admin = SubscriptionAdmin(KafkaSettings("127.0.0.1:1"), timeout_s=0.5)
    for _ in range(3):
        with pytest.raises(KafkaUnavailableError, match="refuses connections"):
            admin.list_names()
    assert len(probes) == 1

    time.sleep(0.6)
    with pytest.raises(KafkaUnavailableError):
        admin.list_names()
    assert len(probes) == 2


def test_connections_to_one_cluster_share_its_probe_whatever_their_credentials(monkeypatch):
    # One KafkaConnection per team namespace, each with its own user, all to one cluster that does not answer: it is
    # probed once, not once per connection; a different transport (TLS or not) is probed on its own.
    probes = []

    def unreachable(settings, timeout_s):
        probes.append(settings.security_protocol)
        raise KafkaUnavailableError("cannot reach Kafka: 127.0.0.1:1 did not answer within 5s")

    monkeypatch.setattr(admin_module, "check_reachable", unreachable)
    operator_config = OperatorConfig(
        KafkaSettings("127.0.0.1:1"), kafka_timeout_s=5,
        resolve=lambda namespace, name: KafkaSettings("127.0.0.1:1", {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": namespace,
            "sasl.password": "p4ss"}))
    try:
        for team in ("team-a", "team-b", "team-c"):
            with pytest.raises(KafkaUnavailableError, match="did not answer"):
                operator_config.admin(team, "shared").require_telemetry()
        with pytest.raises(KafkaUnavailableError, match="did not answer"):
            operator_config.admin("team-a", None).require_telemetry()  # the default cluster: PLAINTEXT
        assert {operator_config.slot_key(("team-a", "shared")), operator_config.slot_key(("team-b", "shared")),
                operator_config.slot_key(None)} == {"127.0.0.1:1"}  # one share of the handler threads
    finally:
        operator_config.close()

    assert probes == ["SASL_PLAINTEXT", "PLAINTEXT"]


def test_while_a_failed_cluster_is_tried_again_other_callers_get_its_last_answer_at_once(monkeypatch):
    trying = threading.Event()

    def slow_and_unreachable(settings, timeout_s):
        trying.set()
        time.sleep(timeout_s)  # a cluster that accepts connections and never answers
        raise KafkaUnavailableError("cannot reach Kafka: 127.0.0.1:1 does not answer")

    monkeypatch.setattr(admin_module, "check_reachable", slow_and_unreachable)
    admin = SubscriptionAdmin(KafkaSettings("127.0.0.1:1"), timeout_s=1.0)
    with pytest.raises(KafkaUnavailableError):
        admin.list_names()
    time.sleep(1.1)  # the failure is no longer answered by itself: the next caller tries again
    trying.clear()
    retrying = threading.Thread(target=lambda: _record_error([], admin.list_names), daemon=True)
    retrying.start()
    assert trying.wait(5)

    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="does not answer"):
        admin.list_names()
    waited = time.monotonic() - started
    retrying.join(5)

    assert waited < 0.5, f"waited {waited:.1f} s for the other caller's connect"


def test_a_client_closed_under_a_call_is_unavailable_and_a_closed_admin_never_reconnects(sandbox):
    admin = SubscriptionAdmin(KafkaSettings(sandbox.bootstrap))
    admin.list_names()
    admin._client.close()  # as another thread closing it between connect and send

    with pytest.raises(KafkaUnavailableError, match="lost the connection"):
        admin.list_names()
    assert admin.list_names() == []  # reconnected

    admin.close()
    with pytest.raises(KafkaUnavailableError, match="was closed"):
        admin.list_names()
    assert admin._client is None


def test_a_request_never_answered_is_unavailable_after_a_deadline_and_the_next_call_reconnects(sandbox):
    admin = SubscriptionAdmin(KafkaSettings(sandbox.bootstrap), timeout_s=1)
    assert admin.list_names() == []
    stuck = admin._client
    stuck._manager.send = lambda request, **_: KafkaFuture()  # lost by the client: never answered, never failed
    outcome: list[BaseException] = []
    caller = threading.Thread(target=lambda: _record_error(outcome, lambda: admin.describe(["x"])), daemon=True)

    caller.start()
    caller.join(timeout=20)

    assert not caller.is_alive(), "a request nobody answers held the call for ever"
    assert len(outcome) == 1 and isinstance(outcome[0], KafkaUnavailableError)
    assert admin.describe(["x"]) == {"x": {}} and admin._client is not stuck
    admin.close()


def _record_error(errors: list[BaseException], call) -> None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the test looks at it
        errors.append(exc)


def test_a_kafka_connections_problem_is_told_in_its_fields_not_in_client_properties():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    settings = KafkaSettings(f"127.0.0.1:{silent.getsockname()[1]}")
    try:
        with pytest.raises(KafkaUnavailableError) as told:
            SubscriptionAdmin(settings, timeout_s=0.5, explain=in_connection_terms).list_names()
        with pytest.raises(KafkaUnavailableError) as cli:
            SubscriptionAdmin(settings, timeout_s=0.5).list_names()
    finally:
        silent.close()

    assert "securityProtocol: SSL" in str(told.value) and "security.protocol" not in str(told.value)
    assert "security.protocol=SSL" in str(cli.value)  # kcm subscriptions' user has a --command-config


def test_tls_material_that_no_longer_loads_is_invalid_spec_naming_the_setting(tmp_path):
    # As when a file the settings name was removed after they were checked: a status reason, not a traceback.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        settings = KafkaSettings(f"127.0.0.1:{listener.getsockname()[1]}",
                                 {"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "gone.pem")})
        admin = SubscriptionAdmin(settings, timeout_s=2)
        try:
            with pytest.raises(InvalidSpecError, match="ssl.ca.location"):
                admin.list_names()
        finally:
            admin.close()


def test_the_key_connections_share_a_probe_by_shows_no_tls_key_password():
    from kcm_operator.admin import transport_key

    settings = KafkaSettings("kafka:9093", {"security.protocol": "SSL", "ssl.key.password": "KEY-PASSW0RD",
                                            "sasl.password": "other"})
    key = transport_key(settings)
    assert "KEY-PASSW0RD" not in key
    assert key == transport_key(KafkaSettings("kafka:9093", {"security.protocol": "SSL",
                                                             "ssl.key.password": "KEY-PASSW0RD"}))
    assert key != transport_key(KafkaSettings("kafka:9093", {"security.protocol": "SSL"}))


def test_a_refusal_of_the_spec_by_kafkas_alter_config_policy_is_invalid_spec_not_kcms_rights():
    """Only an edit of the spec helps: KafkaRefused would retry it for ever and send the user to the ACLs."""
    from kcm_operator.admin import _error

    refused = _error(44, "interval.ms must be at least 30000")
    assert isinstance(refused, InvalidSpecError) and str(refused) == "interval.ms must be at least 30000"
    assert isinstance(_error(31, "not allowed"), KafkaRefusedError)   # CLUSTER_AUTHORIZATION_FAILED: kcm's rights
