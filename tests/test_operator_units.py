"""The operator's connections, admin and schema modules, and the shared java_config and strict_yaml, unit by unit:
behaviour the integration tests do not pin (each test's docstring names the mistake it catches)."""

from __future__ import annotations

import base64
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kcm_common.kafka import KafkaSettings
from kcm_operator import connections
from kcm_operator.connections import ConnectionResolver, MaterialLedger, command_config_reader, settings_from_spec
from kcm_operator.errors import KubernetesApiError, MissingReferenceError
import kafka.errors as kafka_errors
from kcm_common.kafka import KafkaUnavailableError
from kcm_operator import admin as admin_module
from kcm_operator.admin import SubscriptionAdmin, _Batcher, _error, servers_key
from kcm_operator.errors import InvalidSpecError, KafkaRefusedError, UnsupportedError
from kcm_operator.reconcile import Change, Op
import copy
from kcm_operator import schema
import yaml
from kcm_common import strict_yaml

# -- connections.py --------------------------------------------------------------------------------------------------

_SASL_SPEC = {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
              "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds"}}}


def _resolver(tmp_path: Path, *, connection=None, secret=None) -> ConnectionResolver:
    """A resolver whose two Kubernetes reads are `connection()` and `secret(name)` (each returns or raises)."""

    class Custom:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
            return connection() if connection else {"spec": dict(_SASL_SPEC)}

    class Core:
        def read_namespaced_secret(self, name, namespace, **_):
            return secret(name)

    resolver = ConnectionResolver(None, tmp_path)
    resolver._custom, resolver._core = Custom(), Core()
    return resolver


def _raise(status: int, body: str = ""):
    def read(*_):
        raise ApiException(status=status, reason={403: "Forbidden", 404: "Not Found"}.get(status, "Error")) \
            if not body else _with_body(status, body)
    return read


def _with_body(status: int, body: str) -> ApiException:
    error = ApiException(status=status, reason="Internal Server Error")
    error.body = body
    return error


def test_a_missing_connection_secret_or_key_is_a_missing_reference_naming_the_connection(tmp_path):
    """Kills C01/C02 (404 taken as an API failure: retried as a Kubernetes error, status says "failed: 404"),
    C03 (a missing key: a KeyError traceback) and C21 (the status no longer says which KafkaConnection)."""
    with pytest.raises(MissingReferenceError, match=r"^spec.connection: KafkaConnection team/kafka does not exist$"):
        _resolver(tmp_path, connection=_raise(404)).resolve("team", "kafka")
    with pytest.raises(MissingReferenceError,
                       match=r"^KafkaConnection team/kafka: Secret team/creds does not exist$"):
        _resolver(tmp_path, secret=_raise(404)).resolve("team", "kafka")
    with pytest.raises(MissingReferenceError,
                       match=r"^KafkaConnection team/kafka: Secret team/creds has no key 'password'$"):
        _resolver(tmp_path, secret=lambda name: types.SimpleNamespace(
            data={"username": base64.b64encode(b"kcm").decode()})).resolve("team", "kafka")


def test_a_forbidden_secret_read_points_at_rbac_and_an_api_errors_body_is_never_shown(tmp_path):
    """Kills C16 (no RBAC hint on 403) and C17 (the API error's body, which may echo the request, in the message)."""
    with pytest.raises(KubernetesApiError) as forbidden:
        _resolver(tmp_path, secret=_raise(403)).resolve("team", "kafka")
    assert str(forbidden.value) == ("reading Secret team/creds failed: 403 Forbidden: the operator's service account "
                                    "needs get on it (see the chart's RBAC)")
    assert not isinstance(forbidden.value, MissingReferenceError)
    with pytest.raises(KubernetesApiError) as failed:
        _resolver(tmp_path, secret=_raise(500, '{"data": {"password": "cDRzcw=="}}')).resolve("team", "kafka")
    assert "cDRzcw" not in str(failed.value) and str(failed.value).startswith("reading Secret team/creds failed: 500")


def test_a_kubernetes_api_that_never_answers_a_secret_read_is_a_kubernetes_error_in_bounded_time(tmp_path,
                                                                                                   monkeypatch):
    """Kills C22 (no timeout on the Secret read): the KafkaConnection answers, its Secret read hangs for ever and
    holds a handler thread (the existing test only times out the KafkaConnection read)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setattr(connections, "API_TIMEOUT_S", (1.0, 1.0))
    resolver = _resolver(tmp_path)
    resolver._core = client.CoreV1Api(client.ApiClient(configuration))
    outcome: list[BaseException] = []

    def resolve() -> None:
        try:
            resolver.resolve("team", "kafka")
        except BaseException as exc:  # noqa: BLE001 - looked at below
            outcome.append(exc)

    caller = threading.Thread(target=resolve, daemon=True)
    caller.start()
    caller.join(20)
    silent.close()
    assert not caller.is_alive(), "a Secret read the API server never answers held the handler for ever"
    assert len(outcome) == 1 and isinstance(outcome[0], KubernetesApiError)
    assert "reading Secret team/creds failed: the Kubernetes API did not answer in time" in str(outcome[0])


def test_the_remembered_validated_settings_stay_bounded(tmp_path, monkeypatch):
    """Kills C08 (never cleared): every distinct password ever rotated in stayed remembered, without bound."""
    monkeypatch.setattr(connections, "_VALIDATED_SETTINGS", 2)
    validated: set = set()
    for password in ("a", "b", "c", "d", "e"):
        settings_from_spec(_SASL_SPEC, lambda secret, key, password=password: password.encode()
                           if key == "password" else b"kcm", tmp_path, validated)
        assert len(validated) <= 2


def _projected(directory: Path, content: str, generation: int) -> None:
    """Write `content` as kubelet rotates a mounted Secret: a new `..<timestamp>` directory, then `..data` swapped
    to it by a rename; the file the pod reads is a symlink through `..data`."""
    data = directory / f"..2026_11_27_0{generation}"
    data.mkdir()
    (data / "client.properties").write_text(content)
    link = directory / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, directory / "..data")
    if not (directory / "client.properties").is_symlink():
        (directory / "client.properties").symlink_to("..data/client.properties")


def test_the_command_config_is_read_again_when_a_projected_secret_swaps_its_data_link(tmp_path):
    """Kills C19 (lstat, not stat): the file the operator names is a symlink that never changes when kubelet
    rotates the Secret; only what it points at does. The existing test replaces a plain file."""
    sasl = "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=kcm\nsasl.password={}\n"
    _projected(tmp_path, sasl.format("old-s3cret"), 1)
    path = tmp_path / "client.properties"
    reader = command_config_reader("127.0.0.1:9092", path, KafkaSettings.from_cli("127.0.0.1:9092", path))
    assert reader().properties["sasl.password"] == "old-s3cret"
    _projected(tmp_path, sasl.format("new-s3cret-longer"), 2)
    assert reader().properties["sasl.password"] == "new-s3cret-longer"


def test_tls_material_deleted_after_a_rotation_is_written_again_when_the_secret_rotates_back(tmp_path, monkeypatch):
    """Kills C14 (a file written once is assumed to stay): a certificate rotation rolled back after the grace named
    a deleted file; the settings were already validated, so nothing noticed until every connect failed."""
    ca = {"ca.crt": b"-----BEGIN CERTIFICATE-----\nb25l\n-----END CERTIFICATE-----\n"}
    old = ca["ca.crt"]
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL", "tls": {"caSecretRef": {"name": "ca"}}}
    resolver = _resolver(tmp_path, connection=lambda: {"spec": spec}, secret=lambda name: types.SimpleNamespace(
        data={key: base64.b64encode(value).decode() for key, value in ca.items()}))
    resolver.material = MaterialLedger(grace_s=0)
    monkeypatch.setattr(KafkaSettings, "validate", lambda self: None)   # the content here is no real CA
    first = resolver.resolve("team", "kafka").properties["ssl.ca.location"]
    ca["ca.crt"] = b"-----BEGIN CERTIFICATE-----\ndHdv\n-----END CERTIFICATE-----\n"
    resolver.resolve("team", "kafka")
    assert not Path(first).exists()   # retired with no grace
    ca["ca.crt"] = old   # rolled back
    again = resolver.resolve("team", "kafka").properties["ssl.ca.location"]
    assert again == first and Path(again).read_bytes() == old


def test_keys_sharing_one_file_are_all_named_when_it_does_not_load(tmp_path):
    """Kills C05: keys with equal (bad) content share one file; the error about it named only the last Secret key
    read, sending the user to the wrong Secret."""
    bad = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL",
            "tls": {"caSecretRef": {"name": "ca"}, "clientCertSecretRef": {"name": "client"}}}
    values = {("ca", "ca.crt"): bad, ("client", "tls.crt"): bad, ("client", "tls.key"): bad}
    with pytest.raises(Exception) as err:
        settings_from_spec(spec, lambda secret, key: values[secret, key], tmp_path)
    assert "Secret ca key 'ca.crt'" in str(err.value), str(err.value)


# -- admin.py --------------------------------------------------------------------------------------------------------



ALL_APIS = {71, 72, 74}


class _FakeClient:
    """What SubscriptionAdmin uses of a KafkaAdminClient: `answer(request)` returns the response or raises."""

    def __init__(self, apis=ALL_APIS, answer=None, cluster_id="cluster-a") -> None:
        self.config = {"request_timeout_ms": 1000}
        self.sent: list = []
        self.closed = False
        outer = self

        class Manager:
            cluster = types.SimpleNamespace(cluster_id=cluster_id)
            broker_version_data = types.SimpleNamespace(api_versions={key: (0, 9) for key in apis})

            def send(self, request):
                outer.sent.append(request)
                return request

            def wait_for(self, future, deadline_ms):  # never called: run is given it
                raise AssertionError

            def run(self, function, request, deadline_ms):
                if answer is None:
                    raise AssertionError("no request expected")
                return answer(request)

        self._manager = Manager()

    def close(self) -> None:
        self.closed = True


class _FakeAdmin(SubscriptionAdmin):
    def __init__(self, *clients: _FakeClient, timeout_s: float = 1.0, bootstrap: str = "127.0.0.1:9092") -> None:
        super().__init__(KafkaSettings(bootstrap), timeout_s=timeout_s)
        self.clients = list(clients)

    def _connect(self):
        return self.clients.pop(0)


def test_a_broker_that_gained_the_telemetry_apis_is_seen_after_a_timeout_without_a_restart():
    """Kills A01 (never reconnects to read the APIs again) and A29 (reconnects without dropping the old client): once
    the receiver plugin is added to the brokers, subscriptions stayed Unsupported until the operator restarted."""
    old, new = _FakeClient(apis={74}), _FakeClient(apis=ALL_APIS)
    admin = _FakeAdmin(old, new, timeout_s=0.05)
    with pytest.raises(UnsupportedError, match="do not do KIP-714"):
        admin.require_telemetry()
    time.sleep(0.1)
    admin.require_telemetry()
    assert old.closed and admin._client is new


def test_a_broker_without_the_telemetry_apis_is_unsupported_and_an_old_one_is_never_sent_a_listing():
    """Kills A02 (telemetry always assumed) and A03 (a broker before Kafka 3.7 is sent ListConfigResources)."""
    with pytest.raises(UnsupportedError):
        _FakeAdmin(_FakeClient(apis={74})).require_telemetry()
    old = _FakeClient(apis=set())
    with pytest.raises(UnsupportedError):
        _FakeAdmin(old, _FakeClient(apis=set())).list_names()
    assert old.sent == []


def test_a_refused_listing_is_an_error_not_an_empty_cluster():
    """Kills A04: a listing Kafka refused (no DESCRIBE_CONFIGS on the cluster) read as "no subscriptions at all"."""
    fake = _FakeClient(answer=lambda request: types.SimpleNamespace(error_code=31, config_resources=[]))
    with pytest.raises(KafkaRefusedError, match="ClusterAuthorizationFailedError"):
        _FakeAdmin(fake).list_names()


def test_text_that_is_not_utf8_is_refused_before_anything_is_sent():
    """Kills A05 and A08: a lone surrogate in a name or a value went to kafka-python, whose request then never
    fails nor ends, holding the cluster's request lock."""
    fake = _FakeClient()
    admin = _FakeAdmin(fake)
    with pytest.raises(InvalidSpecError, match="subscription name '\\\\ud800' is not UTF-8"):
        admin.describe(["\ud800"])
    with pytest.raises(InvalidSpecError, match="match.clientId .* is not UTF-8"):
        admin.alter([Change("team.app", "create", (Op("match.clientId", "SET", "a\udc80"),))])
    assert fake.sent == []


def _described(request):
    def result(name):
        configs = [types.SimpleNamespace(name="interval.ms", value="1000", config_source=7),
                   types.SimpleNamespace(name="metrics", value="", config_source=5)]   # a default: not set
        return types.SimpleNamespace(resource_name=name, error_code=0, error_message=None, configs=configs)
    return types.SimpleNamespace(results=[result(name) for _, name, _ in request.resources])


def test_describe_names_each_resource_once_and_returns_only_what_was_set():
    """Kills A06 (a name repeated within one request: Kafka refuses the whole request) and A07 (defaults taken for
    set configs: every subscription looks drifted)."""
    fake = _FakeClient(answer=_described)
    assert _FakeAdmin(fake).describe(["a", "b", "a"]) == {"a": {"interval.ms": "1000"}, "b": {"interval.ms": "1000"}}
    assert [name for _, name, _ in fake.sent[0].resources] == ["a", "b"]


def test_a_validate_only_alter_is_sent_as_validate_only():
    """Kills A09: a dry run (kcm subscriptions apply --dry-run) changed the cluster."""
    fake = _FakeClient(answer=lambda request: types.SimpleNamespace(responses=[]))
    _FakeAdmin(fake).alter([Change("team.app", "create", (Op("interval.ms", "SET", "1000"),))], validate_only=True)
    assert fake.sent[0].validate_only is True


@pytest.mark.parametrize("error", [kafka_errors.NotControllerError, kafka_errors.RequestTimedOutError])
def test_a_moved_controller_or_a_timed_out_request_is_unavailable_and_reconnects(error, monkeypatch):
    """Kills A10/A11: a controller move or a request timeout is transient (Kafka unavailable, retried with a new
    client), not a refusal of kcm (KafkaRefused, which tells the user to look at rights)."""
    def fail(request):
        raise error()
    fake = _FakeClient(answer=fail)
    admin = _FakeAdmin(fake)
    with pytest.raises(KafkaUnavailableError, match=error.__name__):
        admin.describe(["a"])
    assert fake.closed and admin._client is None


def test_another_kafka_error_during_a_request_is_a_refusal():
    """Kills A12."""
    def fail(request):
        raise kafka_errors.ClusterAuthorizationFailedError()
    with pytest.raises(KafkaRefusedError, match="ClusterAuthorizationFailedError"):
        _FakeAdmin(_FakeClient(answer=fail)).describe(["a"])


def test_a_users_request_timeout_wins_over_the_operators(monkeypatch):
    """Kills A15: request.timeout.ms in a --command-config was overridden by the operator's kafka timeout."""
    made = []
    monkeypatch.setattr(admin_module, "check_reachable", lambda settings, timeout_s: None)
    monkeypatch.setattr(admin_module, "KafkaAdminClient", lambda **options: made.append(options) or _FakeClient())
    SubscriptionAdmin(KafkaSettings("127.0.0.1:9092", {"request.timeout.ms": "45000"}), timeout_s=5)._connected()
    SubscriptionAdmin(KafkaSettings("127.0.0.1:9092"), timeout_s=5)._connected()
    assert [options["request_timeout_ms"] for options in made] == [45000, 5000]


def test_settings_the_kafka_client_refuses_late_are_an_invalid_spec(monkeypatch):
    """Kills A16: kafka-python refusing its settings once bootstrapped came out as a bare KafkaConfigError, which the
    handlers do not map to a status (a traceback per event instead of InvalidSpec)."""
    def refuse(**options):
        raise kafka_errors.KafkaConfigurationError("sasl_mechanism must be one of PLAIN")
    monkeypatch.setattr(admin_module, "check_reachable", lambda settings, timeout_s: None)
    monkeypatch.setattr(admin_module, "KafkaAdminClient", refuse)
    with pytest.raises(InvalidSpecError, match="the Kafka client rejected its settings"):
        SubscriptionAdmin(KafkaSettings("127.0.0.1:9092"), timeout_s=1).list_names()


def test_one_cluster_is_one_key_whatever_the_order_of_its_servers():
    """Kills A21 and A26: the same servers listed in another order were two clusters (two shares of the handler
    threads; two owners of one subscription)."""
    assert servers_key(KafkaSettings("b:9092,a:9092")) == servers_key(KafkaSettings("a:9092, b:9092")) == \
        "a:9092,b:9092"
    assert _FakeAdmin(_FakeClient(cluster_id=None), bootstrap="b:9092,a:9092").cluster_id() == "a:9092,b:9092"


def test_a_subscription_kafka_does_not_answer_for_is_read_as_absent():
    """Kills A22: describe_one returned None (not a dict) for a name missing from Kafka's answer."""
    from kcm_operator.admin import BatchedAdmin

    class Silent(SubscriptionAdmin):
        def describe_each(self, names):
            return {}
    assert BatchedAdmin(Silent(KafkaSettings("127.0.0.1:1")), linger_s=0.01).describe_one("a") == {}


def test_two_callers_with_the_same_subscription_at_once_both_get_an_answer():
    """Kills A23: a drift check and a reconcile of one subscription in one batch: the second replaced the first,
    whose handler then waited for ever (Kafka refuses a resource named twice, hence the wait)."""
    sent = []

    def send(items):
        sent.append(list(items))
        time.sleep(0.05)
        return {item: f"answer to {item}" for item in items}

    batcher = _Batcher(send, 0.1)
    results = []
    threads = [threading.Thread(target=lambda: results.append(batcher.submit("a", "a")), daemon=True)
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == ["answer to a"] * 2 and sent == [["a"], ["a"]]


@pytest.mark.parametrize("code", [40, 42, 44])   # INVALID_CONFIG, INVALID_REQUEST, POLICY_VIOLATION
def test_kafka_refusing_the_spec_is_an_invalid_spec(code):
    """Kills A24/A25: an interval Kafka refuses (INVALID_CONFIG) or a malformed request was retried for ever as
    KafkaRefused, sending the user to the ACLs."""
    assert type(_error(code, "interval.ms must be at least 100")) is InvalidSpecError


# -- schema.py -------------------------------------------------------------------------------------------------------



_CRDS = schema.load_crds()
_SUBSCRIPTION = {"apiVersion": schema.API_VERSION, "kind": schema.SUBSCRIPTION_KIND,
                 "metadata": {"name": "x", "namespace": "ns"}, "spec": {"metrics": ["org.apache.kafka.producer."]}}


def _subscription(**metadata) -> dict:
    obj = copy.deepcopy(_SUBSCRIPTION)
    obj["metadata"].update(metadata)
    return obj


def test_another_api_version_of_the_group_is_refused():
    """Kills S01: kcm.dev/v1beta1 (a version the CRDs do not serve) was validated as v1alpha1 and applied."""
    (problem,) = schema.validate({**_SUBSCRIPTION, "apiVersion": "kcm.dev/v1beta1"}, crds=_CRDS)
    assert problem.startswith("apiVersion/kind must be kcm.dev/v1alpha1")


@pytest.mark.parametrize("namespace", ["a" * 64, "team.a", "Team"])
def test_a_namespace_the_api_server_would_refuse_is_refused(namespace):
    """Kills S04 (64 characters) and S05 (a dot: `team.a`/`x` and `team`/`a.x` both become subscription
    team.a.x, one cluster subscription owned by two resources)."""
    (problem,) = schema.validate(_subscription(namespace=namespace), crds=_CRDS)
    assert problem.startswith("metadata.namespace: Invalid value: ")
    assert schema.validate(_subscription(namespace="a" * 63), crds=_CRDS) == []


def test_a_problem_quoting_a_long_value_is_shortened():
    """Kills S16: a 1,000-character metric that does not match was quoted whole (twice) into the status/CLI."""
    obj = copy.deepcopy(_SUBSCRIPTION)
    obj["spec"]["metrics"] = [" " + "x" * 1000]
    (problem,) = schema.validate(obj, crds=_CRDS)
    assert len(problem) == 300 and problem.endswith("…")


# -- strict_yaml.py --------------------------------------------------------------------------------------------------




@pytest.mark.parametrize("text", [
    "1: a\n1: b\n", "true: a\ntrue: b\n", "1.5: a\n1.5: b\n", "~: a\nnull: b\n", "2024-01-02: a\n2024-01-02: b\n",
    "2024-01-02T03:04:05Z: a\n2024-01-02 03:04:05Z: b\n"])
def test_a_key_given_twice_is_refused_whatever_its_type(text):
    """Kills Y01: repeated non-text keys kept the last silently (null and date keys too, as kubectl refuses them)."""
    with pytest.raises(yaml.constructor.ConstructorError, match="given twice"):
        strict_yaml.load(text)


def test_a_null_key_given_twice_is_named_null_and_a_sequence_key_is_pyyamls_refusal():
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml.load("a: 1\n~: x\n~: y\n")
    assert strict_yaml.describe(err.value) == " at line 3, column 1: the key `null` is given twice in one mapping"
    with pytest.raises(yaml.YAMLError, match="unhashable"):
        strict_yaml.load("? [a, b]\n: 1\n")


def test_an_impossible_value_is_a_yaml_error_at_its_place_not_pythons():
    """Kills Y02: `2024-13-45` or `!!int abc` raised ValueError (a traceback, the value quoted)."""
    for text in ("a: 2024-13-45\n", "a: !!int s3cret\n"):
        with pytest.raises(yaml.YAMLError) as err:
            strict_yaml.load(text)
        assert "s3cret" not in strict_yaml.describe(err.value) and "line 1, column 4" in strict_yaml.describe(err.value)


def test_plain_text_keeps_every_unquoted_scalar_but_null_as_written():
    """Kills Y03."""
    assert strict_yaml.load("a: on\nb: 0777\nc: 3.10\nd: ~\ne: yes\n", plain_text=True) == {
        "a": "on", "b": "0777", "c": "3.10", "d": None, "e": "yes"}


_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + level)}: &{chr(98 + level)} [{', '.join(['*' + chr(97 + level)] * 10)}]\n" for level in range(6))


def test_an_alias_bomb_is_refused_by_load_and_by_load_all():
    """Kills Y04/Y05 (one of the two readers left unbounded)."""
    for read in (strict_yaml.load, strict_yaml.load_all):
        with pytest.raises(yaml.YAMLError, match="more than 1,000,000 values"):
            read(_BOMB)


def test_an_alias_bomb_of_sets_or_pairs_is_refused():
    """Kills Y06: !!set and !!pairs values were not walked."""
    text = "a: &a !!set {x, y, z, w, v, u, t, s, r, q}\n" + "".join(
        f"{chr(98 + level)}: &{chr(98 + level)} !!pairs "
        f"[{', '.join(f'k{i}: *' + chr(97 + level) for i in range(10))}]\n"
        for level in range(6))
    with pytest.raises(yaml.YAMLError, match="more than 1,000,000 values"):
        strict_yaml.load(text)


def test_keys_count_towards_the_bound():
    """Kills Y11: keys were not counted, so a mapping-heavy bomb passed at up to twice the bound."""
    text = "a: &a {" + ", ".join(f"k{i}: 1" for i in range(10)) + "}\n" + "".join(
        f"{chr(98 + level)}: &{chr(98 + level)} [{', '.join(['*' + chr(97 + level)] * 10)}]\n" for level in range(4)) \
        + "z: [" + ", ".join(["*e"] * 5) + "]\n"
    # 50,000 copies of a mapping of 10 keys: about 1,290,000 values with the keys, 679,000 without.
    with pytest.raises(yaml.YAMLError, match="more than 1,000,000 values"):
        strict_yaml.load(text)


def test_describe_keeps_where_an_unclosed_thing_started_and_redacts_double_quoted_names():
    """Kills Y08 (the 'started at line' context dropped) and Y09 (a name PyYAML quotes in double quotes, because it
    holds a single quote, shown in full)."""
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml.load('a: "x\nb: 1')
    assert strict_yaml.describe(err.value).endswith("while scanning a quoted scalar started at line 1")
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml.load("a: !Xk9'mP2q\n")
    assert "Xk9" not in strict_yaml.describe(err.value)


def test_a_single_character_pyyaml_quotes_is_kept():
    """Kills Y07: a quoted single character (a token, a bracket) is what to fix, and holds no secret."""
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml.load("a: [1, 2\nb: 3")
    assert "expected ',' or ']', but got ':'" in strict_yaml.describe(err.value)


def test_a_document_nested_too_deeply_is_a_yaml_error():
    """Kills Y10: `load` let RecursionError out. At Python's default recursion limit: celpy, which other tests
    import, raises it to 2500, where the document must be longer and takes seconds to scan."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(yaml.YAMLError, match="nests values too deeply"):
            strict_yaml.load("[" * 1000)
        with pytest.raises(yaml.YAMLError, match="nests values too deeply"):
            strict_yaml.load_all("[" * 1000)
    finally:
        sys.setrecursionlimit(limit)


def test_merge_keys_are_read_as_kubectl_reads_them_and_keys_written_beside_them_win():
    text = "defaults: &defaults {intervalMs: 60000, metrics: [a.]}\nspec:\n  <<: *defaults\n  intervalMs: 1000\n"
    assert strict_yaml.load(text)["spec"] == {"intervalMs": 1000, "metrics": ["a."]}
    assert strict_yaml.load(text, plain_text=True)["spec"] == {"intervalMs": "1000", "metrics": ["a."]}
    with pytest.raises(yaml.YAMLError, match="the key `d` is given twice"):
        strict_yaml.load("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n  d: 3\n")


# -- admin.py: failure caching -----------------------------------------------------------------------------------------

class _Flaky(SubscriptionAdmin):
    """Connects by `outcomes`: an exception is raised, anything else is the client."""

    def __init__(self, *outcomes, timeout_s: float = 0.1) -> None:
        super().__init__(KafkaSettings("127.0.0.1:9092"), timeout_s=timeout_s)
        self.outcomes = list(outcomes)
        self.connects = 0

    def _connect(self):
        self.connects += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_a_failed_connect_is_answered_at_once_for_a_timeout_even_when_the_probe_passed():
    """Kills A13: the address answers the probe but the client cannot bootstrap; every caller built a new client
    (each up to the timeout) instead of getting the last answer."""
    admin = _Flaky(KafkaUnavailableError("cannot reach Kafka at 127.0.0.1:9092 (NoBrokersAvailable)"), _FakeClient(),
                   timeout_s=0.3)
    for _ in range(3):
        with pytest.raises(KafkaUnavailableError, match="NoBrokersAvailable"):
            admin._connected()
    assert admin.connects == 1
    time.sleep(0.35)
    assert admin._connected() is not None and admin.connects == 2


def _hold(lock: threading.Lock, seconds: float) -> threading.Thread:
    held = threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            time.sleep(seconds)
    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    held.wait(5)
    return thread


def test_a_recovered_cluster_is_not_answered_with_its_old_failure_while_another_caller_is_busy():
    """Kills A14: after a failure and a successful reconnect, a caller that met another one inside `_connected`
    (every call passes there) got the failure of minutes ago instead of waiting a moment."""
    client_ = _FakeClient()
    admin = _Flaky(KafkaUnavailableError("cannot reach Kafka: old failure"), client_, timeout_s=0.05)
    with pytest.raises(KafkaUnavailableError):
        admin._connected()
    time.sleep(0.1)
    assert admin._connected() is client_
    holder = _hold(admin._lock, 0.2)
    assert admin._connected() is client_
    holder.join()


def test_a_reachable_cluster_is_not_answered_with_its_old_probe_failure(monkeypatch):
    """Kills A19: the same for the probe shared by a cluster's connections."""
    outcomes = [KafkaUnavailableError("cannot reach Kafka: old failure"), None, None]

    def probe(settings, timeout_s):
        outcome = outcomes.pop(0)
        if outcome:
            raise outcome
    monkeypatch.setattr(admin_module, "check_reachable", probe)
    reach = admin_module.Reachability()
    settings = KafkaSettings("127.0.0.1:9092")
    with pytest.raises(KafkaUnavailableError):
        reach.check(settings, 0.05)
    time.sleep(0.1)
    reach.check(settings, 0.05)
    holder = _hold(reach._probing, 0.2)
    reach.check(settings, 0.05)   # waits for the other probe, then probes: no stale failure
    holder.join()


def test_while_one_connection_probes_a_failed_cluster_another_connection_gets_the_answer_at_once(monkeypatch):
    """Kills A20: connections with their own credentials share one probe; while one tries a failed cluster again,
    another waited for the whole probe (one handler thread per connection held), not the last answer at once."""
    trying = threading.Event()

    def slow(settings, timeout_s):
        trying.set()
        time.sleep(timeout_s)
        raise KafkaUnavailableError("cannot reach Kafka: does not answer")
    monkeypatch.setattr(admin_module, "check_reachable", slow)
    reach = admin_module.Reachability()
    settings = KafkaSettings("127.0.0.1:9092")
    with pytest.raises(KafkaUnavailableError):
        reach.check(settings, 2.0)
    time.sleep(2.1)
    trying.clear()
    threading.Thread(target=lambda: _record([], lambda: reach.check(settings, 2.0)), daemon=True).start()
    assert trying.wait(5)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="does not answer"):
        reach.check(settings, 2.0)
    assert time.monotonic() - started < 1.0   # not the 2 s the other probe takes


def _record(errors, call):
    try:
        call()
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


def test_up_to_a_hundred_callers_share_one_request():
    """Kills A27 (a smaller batch): 150 callers within the linger are two requests, the first sent once 100 wait (a
    caller or two more may join before it goes)."""
    sizes = []
    batcher = _Batcher(lambda items: sizes.append(len(items)) or {item: None for item in items}, 1.0)
    threads = [threading.Thread(target=batcher.submit, args=(f"s{index}", f"s{index}"), daemon=True)
               for index in range(150)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(sizes) == 2 and sum(sizes) == 150 and 100 <= sizes[0] <= 110, sizes


def test_changes_without_ops_are_not_sent():
    """Kills A28: an unchanged subscription was sent as an empty alter (a request per unchanged resource)."""
    fake = _FakeClient()   # answers nothing: a request fails the test
    assert _FakeAdmin(fake).alter([Change("team.app", "unchanged")]) == {} and fake.sent == []


def test_an_unhandled_edit_is_overdue_only_at_the_second_drift_check_that_finds_it_and_once_per_generation():
    from kcm_operator.handlers import OperatorConfig

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"))

    # A handler may be queued or running at the first check that finds the edit: only a second one nudges.
    assert [config.overdue("uid-a", 2), config.overdue("uid-a", 2), config.overdue("uid-a", 2)] == [False, True, False]
    assert [config.overdue("uid-a", 3), config.overdue("uid-a", 3)] == [False, True]  # a newer edit is its own
    assert [config.overdue("uid-b", 3), config.overdue("uid-b", 3)] == [False, True]  # and so is another resource
    config.overdue("uid-c", 1)
    config.handled("uid-c")  # taken up in between: the next edit starts afresh
    assert config.overdue("uid-c", 1) is False
    config.forget("uid-c")
    assert config.overdue("uid-c", 1) is False and "uid-a" in config.unhandled


def test_a_nudge_that_was_not_written_is_made_again_at_the_next_check_that_finds_the_edit_waiting():
    from kcm_operator.handlers import OperatorConfig

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"))
    assert [config.overdue("uid-a", 2), config.overdue("uid-a", 2)] == [False, True]
    config.not_nudged("uid-a", 1)   # an older generation's: nothing to do with this one
    assert config.overdue("uid-a", 2) is False
    config.not_nudged("uid-a", 2)
    assert [config.overdue("uid-a", 2), config.overdue("uid-a", 2)] == [True, False]
    config.not_nudged("uid-b", 2)   # never found waiting: nothing noted
    assert "uid-b" not in config.unhandled


def test_a_failed_drift_check_write_is_said_once_and_its_recovery_once():
    from kcm_operator.handlers import OperatorConfig

    config = OperatorConfig(KafkaSettings("127.0.0.1:9"))
    assert [config.written("uid-a", ok) for ok in (True, False, False, True, True, False)] == [
        False, True, False, True, False, True]
    config.forget("uid-a")
    assert config.written("uid-a", True) is False


def _drift_write(monkeypatch, *failures: BaseException | None):
    """`_written` of a drift check's status patch through a config whose writes fail as `failures` say (None: the
    write succeeds; past the list: succeeds), no time waited: (result, attempts, waits, config)."""
    import kopf

    from kcm_operator import handlers

    config = handlers.OperatorConfig(KafkaSettings("127.0.0.1:9"))
    attempts, waits = [], []

    def write(namespace, name, patch):
        attempts.append((namespace, name, dict(patch)))
        failure = failures[len(attempts) - 1] if len(attempts) <= len(failures) else None
        if failure is not None:
            raise failure

    monkeypatch.setattr(config, "write", write)
    sleep, caller = handlers.time.sleep, threading.current_thread()
    # time.sleep is the process's: other threads of this worker (a status writer left by another test) sleep too.
    monkeypatch.setattr(handlers.time, "sleep",
                        lambda s: waits.append(s) if threading.current_thread() is caller else sleep(s))
    body = kopf.Body({"metadata": {"namespace": "team", "name": "payments", "uid": "uid-a"}})
    patch = kopf.Patch()
    patch.status["lastAppliedTime"] = "2026-11-29T10:00:00Z"
    return handlers._written(config, body, patch), attempts, waits, config


def _answer(status: int, headers: dict | None = None) -> ApiException:
    exc = ApiException(status=status, reason="Failing")
    exc.headers = headers
    return exc


def test_a_drift_check_write_the_api_failed_for_the_moment_is_tried_again_with_backoff(monkeypatch, caplog):
    import urllib3

    refused = urllib3.exceptions.NewConnectionError(None, "refused")  # urllib3 makes it a kind of connect timeout
    ok, attempts, waits, _ = _drift_write(monkeypatch, _answer(503), refused)
    assert ok and len(attempts) == 3 and waits == [0.5, 1.0]
    assert all(patch == {"status": {"lastAppliedTime": "2026-11-29T10:00:00Z"}} for *_, patch in attempts)
    assert [r for r in caplog.records if "drift check could" in r.getMessage()] == []


def test_no_attempt_starts_once_the_write_budget_is_spent(monkeypatch):
    """An answer may take the whole read timeout: three of them would hold the resource's lock half a minute."""
    from kcm_operator import handlers

    clock = iter([100.0, 104.8])   # the first attempt began at 100; the 500 came at 104.8: 0.5 s more passes 105
    monkeypatch.setattr(handlers.time, "monotonic", lambda: next(clock))
    ok, attempts, waits, _ = _drift_write(monkeypatch, _answer(500), None)
    assert not ok and len(attempts) == 1 and waits == []


@pytest.mark.parametrize("headers, first_wait", [
    ({"Retry-After": "1.5"}, 1.5), ({"Retry-After": "30"}, 2.0),   # at most WRITE_RETRY_AFTER_MAX_S
    ({"Retry-After": "0.1"}, 0.5), ({"Retry-After": "nan"}, 0.5), ({"Retry-After": "-3"}, 0.5),
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.5), (None, 0.5)])
def test_a_retry_after_of_a_429_is_waited_within_bounds(monkeypatch, headers, first_wait):
    ok, attempts, waits, _ = _drift_write(monkeypatch, _answer(429, headers))
    assert ok and len(attempts) == 2 and waits == [first_wait]


@pytest.mark.parametrize("failure", [
    _answer(403), _answer(422), _answer(409), TimeoutError("read"), ValueError("a bug")],
    ids=["403", "422", "409", "timeout", "other"])
def test_a_drift_check_write_refused_for_good_or_timed_out_is_tried_once(monkeypatch, failure):
    """A timeout already held the handler thread and the resource's lock for KUBERNETES_TIMEOUT_S."""
    import urllib3

    for error in ((failure,) if not isinstance(failure, TimeoutError)
                  else (failure, urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"),
                        urllib3.exceptions.ConnectTimeoutError(None, "connect timed out"))):
        ok, attempts, waits, _ = _drift_write(monkeypatch, error, None)
        assert not ok and len(attempts) == 1 and waits == [], error


def test_a_revert_time_whose_write_failed_is_written_by_a_later_check_unless_a_later_one_is_known(monkeypatch, caplog):
    ok, attempts, waits, config = _drift_write(monkeypatch, *[_answer(500)] * 3)
    assert not ok and len(attempts) == 3 and waits == [0.5, 1.0]
    said = [r.getMessage() for r in caplog.records if "drift check could" in r.getMessage()]
    assert said == ["team/payments: a drift check could not write its status (the Kubernetes API answered 500 "
                    "Failing); each next check writes what it finds then, until one succeeds"]

    status: dict = {}
    config.carry_applied("uid-b", None, status)   # another resource's
    assert status == {}
    config.carry_applied("uid-a", "2026-11-29T11:00:00Z", status)   # a reconcile applied later since
    assert status == {}
    config.carry_applied("uid-a", "2026-11-29T09:00:00Z", status)
    assert status == {"lastAppliedTime": "2026-11-29T10:00:00Z"}
    status = {"lastAppliedTime": "2026-11-29T10:05:00Z"}   # this check reverted again itself
    config.carry_applied("uid-a", None, status)
    assert status == {"lastAppliedTime": "2026-11-29T10:05:00Z"}

    config.written("uid-a", False, None)   # a nudge's failure keeps it
    config.carry_applied("uid-a", None, status := {})
    assert status == {"lastAppliedTime": "2026-11-29T10:00:00Z"}
    config.written("uid-a", True, None)    # and so does a nudge written: it holds no status
    config.carry_applied("uid-a", None, status := {})
    assert status == {"lastAppliedTime": "2026-11-29T10:00:00Z"}
    config.written("uid-a", True, {"conditions": []})   # a status written carried it
    config.carry_applied("uid-a", None, status := {})
    assert status == {}
    config.written("uid-a", False, {"lastAppliedTime": "2026-11-29T10:00:00Z"})
    config.forget("uid-a")
    config.carry_applied("uid-a", None, status)
    assert status == {}


@pytest.mark.parametrize("progress, scheduled", [
    (None, False), ('{"delayed":"2999-01-01T00:00:00.000000+00:00"}', True),
    ('{"delayed":"2999-01-01T00:00:00","retries":1}', True),   # a time without a zone is UTC, as kopf's are
    ('{"delayed":"2000-01-01T00:00:00.000000+00:00"}', False),  # due: kopf should have run it
    ('{"delayed":"2999-01-01T00:00:00.000000+00:00","success":true}', False),
    ('{"delayed":"2999-01-01T00:00:00.000000+00:00","failure":true}', False),
    ('{"delayed":"soon"}', False), ("[1]", False), ("not json", False)])
def test_a_retry_kopf_scheduled_is_read_from_its_progress_annotation_and_anything_else_is_none(progress, scheduled):
    import kopf

    from kcm_operator.handlers import _retry_scheduled

    annotations = {} if progress is None else {"operator.kcm.dev/reconcile": progress}
    assert _retry_scheduled(kopf.Body({"metadata": {"name": "x", "annotations": annotations}})) is scheduled


@pytest.mark.parametrize("answer, there", [
    ({"metadata": {"uid": "uid-old"}}, True),
    ({"metadata": {"uid": "uid-old", "deletionTimestamp": "2026-11-29T10:00:00Z"}}, False),   # handing over
    ({"metadata": {"uid": "uid-other"}}, False),   # deleted and made again under its name: a newer resource
    (_answer(404), False),
    (_answer(500), True), (_answer(403), True),    # cannot tell now: counted, as before
    ("no answer", True)])
def test_an_older_owner_is_read_before_it_is_taken_for_one_and_forgotten_if_gone(answer, there):
    """kopf keeps a resource deleted while a replica was paused by peering in its index (tested end to end in
    test_operator_peering): the owner a Conflict would name is read first."""
    import urllib3

    from kcm_operator import handlers
    from kcm_operator.reconcile import Claim

    reads = []

    class Objects:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
            assert (group, plural, namespace, name) == ("kcm.dev", "clientmetricssubscriptions", "team", "old")
            reads.append(name)
            if answer == "no answer":
                raise urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")
            if isinstance(answer, Exception):
                raise answer
            return answer

    config = handlers.OperatorConfig(KafkaSettings("127.0.0.1:9"))
    config._objects = Objects   # type: ignore[method-assign]
    config.resource_lock("uid-old")
    config.unhandled["uid-old"] = [3, False]
    config.mark_ready("uid-old", True)
    claim = Claim("team", "old", "2026-01-01T00:00:00Z", "uid-old")

    assert config.still_there(claim) is there
    gone = answer == {"metadata": {"uid": "uid-other"}} or (isinstance(answer, ApiException) and answer.status == 404)
    assert ("uid-old" not in config.resource_locks and "uid-old" not in config.unhandled
            and "uid-old" not in config.ready) is gone
    # kopf's index keeps a claim found gone: it is not read again at every reconcile and drift check.
    assert config.still_there(claim) is there and len(reads) == (1 if gone else 2)


def test_the_uids_found_gone_are_bounded(monkeypatch):
    from kcm_operator import handlers
    from kcm_operator.reconcile import Claim

    class Gone:
        def get_namespaced_custom_object(self, *args, **_):
            raise _answer(404)

    monkeypatch.setattr(handlers, "GONE_KEPT", 2)
    config = handlers.OperatorConfig(KafkaSettings("127.0.0.1:9"))
    config._objects = Gone   # type: ignore[method-assign]
    for number in range(3):
        assert config.read_claim(Claim("team", f"r{number}", "2026-01-01T00:00:00Z", f"uid-{number}")) is None
    assert list(config.gone) == ["uid-1", "uid-2"]


def _claim(name: str, connection: str | None = None):
    from kcm_operator.reconcile import Claim

    return Claim("team", name, "2026-01-01T00:00:00Z", f"uid-{name}", connection)


def test_the_sweep_suspects_only_resources_no_handler_ran_for_over_two_sweeps_once_an_interval(monkeypatch):
    """A resource that exists is drift-checked every interval: only one no handler took its lock for since the sweep
    before the last is read (a resource deleted while this replica was paused by peering stays in kopf's index)."""
    from kcm_operator import handlers

    now = [1000.0]
    monkeypatch.setattr(handlers.time, "monotonic", lambda: now[0])
    config = handlers.OperatorConfig(KafkaSettings("127.0.0.1:9"), drift_interval_s=60)
    a, b, c = _claim("a"), _claim("b"), _claim("c")

    assert config.sweep_due() and config.idle_claims([a, b, c]) == []   # nothing known idle before
    now[0] += 59.9
    assert not config.sweep_due()
    config.resource_lock(a.uid)
    now[0] += 0.1
    assert config.sweep_due() and config.idle_claims([a, b, c]) == [b, c]
    config.resource_lock(b.uid)
    now[0] += 60
    assert config.sweep_due() and config.idle_claims([a, b, c]) == [c]   # a: idle once only
    config.forget(c.uid)   # found gone meanwhile (`read_claim` forgets it), yet read again only as idle twice more
    config.gone[c.uid] = None
    now[0] += 60
    assert config.sweep_due() and config.idle_claims([a, b, c]) == [a]


def _sweep(config, claims: dict) -> None:
    import asyncio

    from kcm_operator import handlers

    async def sweep() -> None:
        handlers._sweep_soon(config, claims)
        if config.sweeping is not None:
            await config.sweeping

    config.swept_at = None
    asyncio.run(sweep())


def test_a_sweep_forgets_resources_found_gone_and_frees_their_connection(monkeypatch):
    from kcm_operator import handlers

    class Objects:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
            reads.append(name)
            if name.startswith("gone"):
                raise _answer(404)
            return {"metadata": {"uid": f"uid-{name}"}}

    class Statuses:
        def unused(self, in_use):
            still_named.append(set(in_use))

    reads, still_named = [], []
    config = handlers.OperatorConfig(KafkaSettings("127.0.0.1:9"), statuses=Statuses())
    config._objects = Objects   # type: ignore[method-assign]
    claims = {"s1": [_claim("kept", "shared"), _claim("gone-1", "shared")], "s2": [_claim("gone-2", "own")]}
    for claim in [*claims["s1"], *claims["s2"]]:
        config.mark_ready(claim.uid, True)
    config.resource_lock("uid-kept")   # a handler ran for it before the first sweep
    config.unhandled["uid-gone-1"] = [3, False]
    assert handlers._refs_in_use(config, claims) == {("team", "shared"), ("team", "own")}

    _sweep(config, claims)
    assert reads == [] and still_named == []   # the first sweep knows nothing idle before it
    _sweep(config, claims)
    assert sorted(reads) == ["gone-1", "gone-2"] and config.ready == {"uid-kept"}
    assert handlers.metrics.MANAGED._value.get() == 1 and "uid-gone-1" not in config.unhandled
    # Their connections are used by what is left only: `own` is Unused now, its admin closed.
    assert still_named == [{("team", "shared")}]
    assert handlers._refs_in_use(config, claims) == {("team", "shared")}
    reads.clear()
    _sweep(config, claims)
    assert reads == ["kept"] and still_named == [{("team", "shared")}]   # found there; the gone ones not read again


def test_a_sweep_reads_a_bounded_number_for_one_interval_at_most(monkeypatch):
    """Thousands of resources deleted during a pause, or an API server that answers slowly, cost one sweep a bounded
    amount; those not read are read at the next."""
    from kcm_operator import handlers

    class Objects:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
            reads.append(name)
            now[0] += slow
            raise _answer(404)

    reads, now, slow = [], [0.0], 0.0
    monkeypatch.setattr(handlers, "SWEEP_READS", 3)
    monkeypatch.setattr(handlers.time, "monotonic", lambda: now[0])
    config = handlers.OperatorConfig(KafkaSettings("127.0.0.1:9"), drift_interval_s=10)
    config._objects = Objects   # type: ignore[method-assign]
    claims = {f"s{n}": [_claim(f"r{n}")] for n in range(5)}
    _sweep(config, claims)
    _sweep(config, claims)
    assert reads == ["r0", "r1", "r2"]
    _sweep(config, claims)
    assert reads == ["r0", "r1", "r2", "r3", "r4"]

    reads.clear()
    monkeypatch.setattr(handlers, "SWEEP_READS", 5)
    slow = 4.0   # past the interval after the third read
    config.gone.clear()
    for sweep in range(2):
        _sweep(config, claims)
    assert reads == ["r0", "r1", "r2"]


def test_an_operator_line_about_a_resource_names_it_once_in_text_logs():
    """kcm's lines say `namespace/name:` themselves and carry kopf's k8s_ref for JSON logs; the text formatter's
    `[namespace/name]` for kopf's lines came on top: `[team/orders] team/orders: …`."""
    import io
    import logging

    from kcm_common.logs import TextFormatter
    from kcm_operator import handlers

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("kcm.operator")
    logger.addHandler(handler)
    try:
        handlers._say(logging.WARNING, "team", "orders", "subscription %s was changed outside kcm", "team.orders")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().endswith(
        "WARNING kcm.operator: team/orders: subscription team.orders was changed outside kcm\n"), stream.getvalue()
