"""KafkaConnection specs → client settings: SASL from a Secret, TLS material into private files."""

from __future__ import annotations

import base64
import socket
import stat
import subprocess
import threading
import time
import types
from pathlib import Path

import pytest

from kcm_common.kafka import KafkaConfigError, KafkaSettings, KafkaUnavailableError
from kubernetes import client

from kcm_operator import connections
from kcm_operator.connections import ConnectionResolver, MaterialLedger, settings_from_spec
from kcm_operator.errors import InvalidSpecError, KubernetesApiError
from kcm_operator.handlers import OperatorConfig

NOT_A_CERTIFICATE = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
SECRETS = {("creds", "user"): b"kcm", ("creds", "pass"): b"p4ss", ("latin1", "user"): b"kcm",
           ("latin1", "pass"): b"\xff\xfep4ss", ("garbage", "ca.crt"): NOT_A_CERTIFICATE}


@pytest.fixture(scope="module", autouse=True)
def ca_certificate(tmp_path_factory) -> None:
    """A real self-signed CA in Secret `ca` key `ca.crt`, made by openssl."""
    directory: Path = tmp_path_factory.mktemp("ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test-ca",
                    "-days", "2", "-keyout", "ca.key", "-out", "ca.pem"], cwd=directory, check=True,
                   capture_output=True, timeout=60)
    SECRETS["ca", "ca.crt"] = (directory / "ca.pem").read_bytes()


def _read(secret: str, key: str) -> bytes:
    if (secret, key) not in SECRETS:
        raise InvalidSpecError(f"Secret ns/{secret} has no key {key!r}")
    return SECRETS[secret, key]


def test_sasl_ssl_with_named_keys_a_ca_and_no_hostname_check(tmp_path):
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512",
                     "secretRef": {"name": "creds", "usernameKey": "user", "passwordKey": "pass"}},
            "tls": {"caSecretRef": {"name": "ca", "key": "ca.crt"}, "verifyHostname": False}}

    settings = settings_from_spec(spec, _read, tmp_path)
    options = settings.client_options()

    assert options["security_protocol"] == "SASL_SSL" and options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("kcm", "p4ss")
    assert options["ssl_check_hostname"] is False
    with open(options["ssl_cafile"], "rb") as ca:
        assert ca.read() == SECRETS["ca", "ca.crt"]
    assert stat.S_IMODE((tmp_path / options["ssl_cafile"]).stat().st_mode) == 0o600
    assert "p4ss" not in repr(settings)


def test_a_kubernetes_api_that_never_answers_is_a_kubernetes_error_in_bounded_time(tmp_path, monkeypatch):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setattr(connections, "API_TIMEOUT_S", (1.0, 1.0))
    resolver = ConnectionResolver(client.ApiClient(configuration), tmp_path)
    started = time.monotonic()
    try:
        with pytest.raises(KubernetesApiError, match=r"did not answer in time \(1 s per try\)"):
            resolver.resolve("team", "analytics")
    finally:
        silent.close()

    assert time.monotonic() - started < 15  # four tries (the client retries three times)


def test_a_missing_secret_key_names_the_secret_and_key_not_a_value(tmp_path):
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SASL_PLAINTEXT",
            "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds"}}}

    with pytest.raises(InvalidSpecError, match="Secret ns/creds has no key 'username'"):
        settings_from_spec(spec, _read, tmp_path)


def test_tls_material_that_does_not_load_is_named_by_its_secret_and_key_not_by_a_file(tmp_path):
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL", "tls": {"caSecretRef": {"name": "garbage"}}}

    with pytest.raises(KafkaConfigError,
                       match=r"tls.caSecretRef Secret garbage key 'ca.crt' holds no usable CA") as err:
        settings_from_spec(spec, _read, tmp_path)

    assert str(tmp_path) not in str(err.value) and "ssl.ca.location" not in str(err.value)


def test_an_encrypted_client_key_says_to_store_it_unencrypted_not_to_set_a_property(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-passout", "pass:pw", "-subj", "/CN=client",
                    "-days", "2", "-keyout", "client.key", "-out", "client.pem"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=60)
    secrets = {"tls.crt": (tmp_path / "client.pem").read_bytes(), "tls.key": (tmp_path / "client.key").read_bytes()}
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL",
            "tls": {"clientCertSecretRef": {"name": "client"}}}

    with pytest.raises(KafkaConfigError) as err:
        settings_from_spec(spec, lambda secret, key: secrets[key], tmp_path)

    assert "Secret client key 'tls.key' is encrypted" in str(err.value)
    assert "a KafkaConnection takes no pass phrase" in str(err.value) and "ssl.key.password" not in str(err.value)


def test_a_credential_that_is_not_utf8_is_named_never_echoed(tmp_path):
    spec = {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
            "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "latin1", "usernameKey": "user", "passwordKey": "pass"}}}

    with pytest.raises(KafkaConfigError, match="^Secret latin1 key 'pass' is not UTF-8 text$"):
        settings_from_spec(spec, _read, tmp_path)


def test_tls_files_that_do_not_load_are_an_invalid_spec_once_not_a_failure_per_event(tmp_path):
    """The operator's admin for a connection validates its settings when it is first built: a CA that is PEM in
    form but holds no certificate becomes InvalidSpec (a condition on the resource), not an exception per event."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    broken = KafkaSettings("kafka:9093", {"security.protocol": "SSL", "ssl.ca.location": str(ca)})
    resolved = []

    def resolve(namespace, name):
        resolved.append((namespace, name))
        return broken

    config = OperatorConfig(KafkaSettings("127.0.0.1:9092"), resolve=resolve)
    with pytest.raises(InvalidSpecError, match="KafkaConnection apps/tls: ssl.ca.location .* holds no usable CA"):
        config.admin("apps", "tls")
    assert config.admins == {} and resolved == [("apps", "tls")]


def test_settings_that_loaded_once_are_not_loaded_again_on_every_event(tmp_path, monkeypatch):
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL", "tls": {"caSecretRef": {"name": "ca"}}}
    loads = []
    original = KafkaSettings.validate
    monkeypatch.setattr(KafkaSettings, "validate", lambda self: (loads.append(1), original(self))[1])
    validated: set = set()

    for _ in range(3):
        settings_from_spec(spec, _read, tmp_path, validated)
    assert len(loads) == 1

    with pytest.raises(KafkaConfigError):  # other material is loaded, and refused, as before
        settings_from_spec({**spec, "tls": {"caSecretRef": {"name": "garbage"}}}, _read, tmp_path, validated)
    assert len(loads) == 2


def test_no_operator_state_holds_a_password_in_the_clear(tmp_path):
    """Caches are keyed by a fingerprint: a traceback or debugger showing them shows no password."""
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SASL_PLAINTEXT",
            "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds", "usernameKey": "user", "passwordKey": "pass"}}}
    validated: set = set()
    settings = settings_from_spec(spec, _read, tmp_path, validated)
    config = OperatorConfig(KafkaSettings("127.0.0.1:9092"), resolve=lambda namespace, name: settings)
    admin = config.admin("apps", "sasl")
    try:
        assert "p4ss" not in repr(config) and "p4ss" not in repr(validated)
        # Another password is other settings: a new admin, the fingerprint tells them apart.
        other = KafkaSettings(settings.bootstrap_servers, {**settings.properties, "sasl.password": "other"})
        assert other.fingerprint() != settings.fingerprint()
        assert KafkaSettings(settings.bootstrap_servers, dict(settings.properties)).fingerprint() == \
            settings.fingerprint()
    finally:
        admin.close()


def test_tls_material_written_by_handlers_side_by_side_is_always_whole(tmp_path):
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL", "tls": {"caSecretRef": {"name": "ca"}}}
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            with open(settings_from_spec(spec, _read, tmp_path).client_options()["ssl_cafile"], "rb") as ca:
                assert ca.read() == SECRETS["ca", "ca.crt"]
        except BaseException as exc:  # reported on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=resolve) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no temp file left


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tls_settings(directory: Path, *contents: str) -> KafkaSettings:
    paths = []
    for content in contents:
        path = directory / content
        path.write_text(content)
        paths.append(str(path))
    return KafkaSettings("kafka:9093", dict(zip(("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"),
                                                paths)))


def test_a_rotated_secrets_old_tls_files_are_deleted_after_the_grace(tmp_path):
    clock = _Clock()
    ledger = MaterialLedger(grace_s=600, clock=clock)
    ledger.named(("team", "kafka"), _tls_settings(tmp_path, "ca-1", "cert-1", "key-1"))
    ledger.named(("team", "kafka"), _tls_settings(tmp_path, "ca-1", "cert-2", "key-2"))   # the client cert rotated

    clock.now += 599   # an admin built from the old settings may still open them
    ledger.named(("team", "kafka"), _tls_settings(tmp_path, "ca-1", "cert-2", "key-2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-1", "cert-1", "cert-2", "key-1", "key-2"]

    clock.now += 1
    ledger.named(("team", "kafka"), _tls_settings(tmp_path, "ca-1", "cert-2", "key-2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-1", "cert-2", "key-2"]


def test_tls_files_another_connection_names_or_that_come_back_are_kept(tmp_path):
    clock = _Clock()
    ledger = MaterialLedger(grace_s=600, clock=clock)
    ledger.named(("team", "a"), _tls_settings(tmp_path, "shared-ca"))
    ledger.named(("team", "b"), _tls_settings(tmp_path, "shared-ca"))
    ledger.named(("team", "c"), _tls_settings(tmp_path, "ca-c1"))
    ledger.named(("team", "d"), _tls_settings(tmp_path, "ca-d"))   # then deleted: never resolved again

    ledger.named(("team", "a"), _tls_settings(tmp_path, "ca-a2"))   # b still names the shared CA
    ledger.named(("team", "c"), _tls_settings(tmp_path, "ca-c2"))
    clock.now += 300
    ledger.named(("team", "c"), _tls_settings(tmp_path, "ca-c1"))   # rotated back within the grace
    clock.now += 599
    ledger.named(("team", "a"), _tls_settings(tmp_path, "ca-a2"))

    # ca-c2 was retired only 599 s ago; ca-d's connection (gone) keeps its last settings for deleting with them.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-a2", "ca-c1", "ca-c2", "ca-d", "shared-ca"]
    clock.now += 1
    ledger.named(("team", "b"), _tls_settings(tmp_path, "shared-ca"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-a2", "ca-c1", "ca-d", "shared-ca"]


def test_resolving_a_connection_after_its_secret_rotated_retires_the_old_tls_file(tmp_path):
    """The resolver tells the ledger what each resolution names (here with no grace: the old file goes at once)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-rotated-ca",
                    "-days", "2", "-keyout", str(tmp_path / "new.key"), "-out", str(tmp_path / "new.pem")],
                   check=True, capture_output=True, timeout=60)
    secret = {"ca.crt": SECRETS["ca", "ca.crt"]}

    class Api:   # the two Kubernetes reads the resolver makes
        def get_namespaced_custom_object(self, *_: object, **__: object) -> dict:
            return {"spec": {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL",
                             "tls": {"caSecretRef": {"name": "ca"}}}}

        def read_namespaced_secret(self, *_: object, **__: object) -> types.SimpleNamespace:
            return types.SimpleNamespace(data={key: base64.b64encode(value).decode() for key, value in secret.items()})

    material = tmp_path / "material"
    material.mkdir()
    resolver = ConnectionResolver(None, material)
    resolver._custom = resolver._core = Api()
    resolver.material = MaterialLedger(grace_s=0)

    old = resolver.resolve("team", "kafka").properties["ssl.ca.location"]
    secret["ca.crt"] = (tmp_path / "new.pem").read_bytes()   # the Secret rotated
    new = resolver.resolve("team", "kafka").properties["ssl.ca.location"]

    assert old != new and [path.name for path in material.iterdir()] == [Path(new).name]


def test_the_tls_material_directory_is_made_when_needed_and_removed_when_the_operator_stops(tmp_path, monkeypatch):
    """Private keys of KafkaConnections are written to a private temporary directory: it outlived every operator run
    (made at start-up, whether or not any connection needed it)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    class Api:
        def get_namespaced_custom_object(self, *_: object, **__: object) -> dict:
            return {"spec": {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL",
                             "tls": {"caSecretRef": {"name": "ca"}}}}

        def read_namespaced_secret(self, *_: object, **__: object) -> types.SimpleNamespace:
            return types.SimpleNamespace(data={"ca.crt": base64.b64encode(SECRETS["ca", "ca.crt"]).decode()})

    resolver = ConnectionResolver(None)
    resolver._custom = resolver._core = Api()
    assert list(tmp_path.iterdir()) == [], "nothing to write yet"
    ca = Path(resolver.resolve("team", "kafka").properties["ssl.ca.location"])
    assert ca.exists() and ca.parent.parent == tmp_path and ca.parent.name.startswith("kcm-operator-tls-")
    resolver.close()
    assert list(tmp_path.iterdir()) == []
    given = tmp_path / "given"
    given.mkdir()
    resolver = ConnectionResolver(None, given)
    resolver._custom = resolver._core = Api()
    resolver.resolve("team", "kafka")
    resolver.close()
    assert len(list(given.iterdir())) == 1, "a directory it was given is not its to remove"


@pytest.mark.parametrize("empty", ["user", "pass"])
def test_an_empty_credential_names_the_secret_and_key(tmp_path, empty):
    # A templating slip (`stringData: {username: ""}`): the message names where to look, not client properties.
    values = {("creds", "user"): b"kcm", ("creds", "pass"): b"p4ss", ("creds", empty): b""}
    secret_ref = {"name": "creds", "usernameKey": "user", "passwordKey": "pass"}
    spec = {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
            "sasl": {"mechanism": "PLAIN", "secretRef": secret_ref}}

    with pytest.raises(KafkaConfigError) as err:
        settings_from_spec(spec, lambda secret, key: values[secret, key], tmp_path)

    assert str(err.value) == f"Secret creds key '{empty}' is empty: SASL needs a username and a password"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_certificate_for_another_host_name_points_at_the_host_not_the_ca(tmp_path, tls_listener_for_another_name,
                                                                          host):
    # The CA is right; the broker's certificate names kafka-0.other-name and the connection names another host.
    port, ca = tls_listener_for_another_name
    secrets = {("ca", "ca.crt"): ca.read_bytes()}
    spec = {"bootstrapServers": f"{host}:{port}", "securityProtocol": "SSL",
            "tls": {"caSecretRef": {"name": "ca", "key": "ca.crt"}}}
    material = tmp_path / "material"
    material.mkdir()
    operator_config = OperatorConfig(KafkaSettings("127.0.0.1:1"), kafka_timeout_s=3, resolve=lambda namespace, name:
                                     settings_from_spec(spec, lambda secret, key: secrets[secret, key], material))
    try:
        with pytest.raises(KafkaUnavailableError) as err:
            operator_config.admin("team", "analytics").require_telemetry()
    finally:
        operator_config.close()

    assert "mismatch" in str(err.value)
    assert "tls.verifyHostname: false" in str(err.value) and "bootstrapServers" in str(err.value)
    assert "caSecretRef" not in str(err.value)


def test_a_resolve_reads_each_secret_once_however_many_of_its_keys_it_uses(tmp_path):
    """Username and password lived in one Secret read twice per resolve, and every reconcile and drift check of every
    resource resolves its KafkaConnection: the API server's load grew with the keys as well as the resources."""
    reads = []

    class Custom:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
            return {"apiVersion": "kcm.dev/v1alpha1", "kind": "KafkaConnection", "metadata": {"name": name},
                    "spec": {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
                             "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds"}}}}

    class Core:
        def read_namespaced_secret(self, name, namespace, **_):
            reads.append(name)
            return types.SimpleNamespace(data={"username": base64.b64encode(b"kcm").decode(),
                                         "password": base64.b64encode(b"p4ss").decode()})

    resolver = ConnectionResolver(None, tmp_path)
    resolver._custom, resolver._core = Custom(), Core()
    options = resolver.resolve("team", "analytics").client_options()
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("kcm", "p4ss")
    assert reads == ["creds"]
    resolver.resolve("team", "analytics")   # a Secret rotated meanwhile is read again at the next resolve
    assert reads == ["creds", "creds"]


def test_the_default_clusters_command_config_is_read_again_once_its_file_changes(tmp_path):
    """A KafkaConnection's Secrets are read at each reconcile, but the default cluster's --command-config (mounted from
    a Secret by the chart) was read once: after a rotation the operator went on with the old password."""
    from kcm_operator.connections import command_config_reader

    path = tmp_path / "client.properties"
    sasl = "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=kcm\nsasl.password={}\n"
    path.write_text(sasl.format("old-s3cret"))
    settings = KafkaSettings.from_cli("127.0.0.1:9092", path)
    config = OperatorConfig(settings, reload=command_config_reader("127.0.0.1:9092", path, settings))
    try:
        first = config.admin("team", None)
        assert config.admin("team", None) is first   # the file as it was: the same client
        rotated = tmp_path / "rotated"   # as a projected Secret rotates: a new file swapped in
        rotated.write_text(sasl.format("new-s3cret"))
        rotated.replace(path)
        second = config.admin("team", None)
        assert second is not first and config.settings.properties["sasl.password"] == "new-s3cret"
        path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=NOPE\n")
        with pytest.raises(InvalidSpecError, match="^the default cluster: ") as refused:
            config.admin("team", None)
        assert "s3cret" not in str(refused.value)
    finally:
        config.close()
    assert command_config_reader("127.0.0.1:9092", None, settings) is None


def test_a_rotated_connection_closes_its_old_admin_only_after_calls_on_it_could_end(monkeypatch):
    """A rotated password gives a KafkaConnection a new admin; a handler that took the old one just before still
    finishes its call on it (closed under it, the call failed and the resource got a Warning), and the old admin's
    client (a thread, sockets) still goes."""
    import threading
    import time

    from kcm_common.kafka import KafkaUnavailableError
    from kcm_operator.admin import SubscriptionAdmin

    def describe_each(self, names):
        time.sleep(0.5)   # a call under way...
        if self._closed:   # ...fails as kafka-python's does when its client is closed under it
            raise KafkaUnavailableError("the admin client was closed")
        return {name: {} for name in names}

    monkeypatch.setattr(SubscriptionAdmin, "describe_each", describe_each)
    current = [KafkaSettings("127.0.0.1:9092", {"sasl.mechanism": "PLAIN", "security.protocol": "SASL_PLAINTEXT",
                                                "sasl.username": "u", "sasl.password": "old"})]
    config = OperatorConfig(KafkaSettings("127.0.0.1:9092"), kafka_timeout_s=0.5, resolve=lambda ns, name: current[0])
    old = config.admin("team", "kafka")
    outcome = []
    call = threading.Thread(target=lambda: outcome.append(old.describe_one("team.payments")))
    call.start()
    time.sleep(0.1)
    current[0] = KafkaSettings("127.0.0.1:9092", {**current[0].properties, "sasl.password": "rotated"})
    new = config.admin("team", "kafka")
    assert new is not old
    call.join(10)
    assert outcome == [{}], "a call under way on the replaced admin failed"
    deadline = time.monotonic() + config.retired_admin_grace_s() + 5
    while not old.admin._closed:
        assert time.monotonic() < deadline, "the replaced admin was never closed"
        time.sleep(0.05)
    assert not new.admin._closed
    new.close()


class _StatusApi:
    """The custom objects API's status patch, answering each write with the next of `answers` (None: written); the
    first write waits for `hold_first`, when given, to be set (a write under way)."""

    def __init__(self, answers: list[Exception | None] | None = None,
                 hold_first: threading.Event | None = None) -> None:
        self.answers = list(answers or [])
        self.hold_first = hold_first
        self.writes: list[tuple[str, str, dict]] = []
        self.changed = threading.Condition()

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body, **_):
        assert (group, version, plural) == ("kcm.dev", "v1alpha1", "kafkaconnections")
        if self.hold_first is not None and not self.writes:
            self.hold_first.wait(10)
        answer = self.answers.pop(0) if self.answers else None
        with self.changed:
            self.writes.append((namespace, name, body["status"]))
            self.changed.notify_all()
        if answer is not None:
            raise answer

    def wait(self, count: int, timeout: float = 10.0) -> list[tuple[str, str, dict]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.writes) >= count, timeout), self.writes
            return list(self.writes)


def test_a_connections_status_is_written_once_per_change_latest_report_winning():
    api = _StatusApi()
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.resolved("ns", "a", 3)
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        (first,) = api.wait(1)
        assert first[:2] == ("ns", "a")
        assert first[2]["clusterId"] == "c1" and first[2]["observedGeneration"] == 3
        (condition,) = first[2]["conditions"]
        assert condition["type"] == "Ready" and condition["status"] == "True" and condition["reason"] == "Connected"
        assert condition["observedGeneration"] == 3 and condition["lastTransitionTime"].endswith("Z")
        for _ in range(5):   # every subscription naming it reports the same: nothing more to write
            statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        time.sleep(0.3)
        assert len(api.writes) == 1

        time.sleep(1.1)   # a second later: the condition's transition time moves only when its status does
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers, again", "c1")
        (*_, same) = api.wait(2)
        assert same[2]["conditions"][0]["lastTransitionTime"] == condition["lastTransitionTime"]
        statuses.report("ns", "a", "False", "KafkaUnavailable", "no answer")
        (*_, second) = api.wait(3)
        assert second[2]["clusterId"] == "c1"   # the cluster last reached stays on the status
        assert second[2]["conditions"][0]["observedGeneration"] == 3
        assert second[2]["conditions"][0]["status"] == "False"
        assert second[2]["conditions"][0]["lastTransitionTime"] > condition["lastTransitionTime"]

        statuses.unused({("ns", "other"), None})
        (*_, unused) = api.wait(4)
        assert unused[2]["conditions"][0]["reason"] == "Unused"
        assert statuses.shown("ns", "a").reason == "Unused"   # kept until the connection is deleted
        statuses.unused(set())
        time.sleep(0.3)
        assert len(api.writes) == 4
    finally:
        statuses.close()


def test_a_connection_named_only_by_subscriptions_that_apply_nothing_says_idle_not_unused():
    """Paused subscriptions, or ones in Conflict, name it: Unused ("none names it") would be false; a report it
    already has stays, and one not read yet is left alone (its status may say more); once none names it, Unused."""
    api = _StatusApi()
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.named("ns", "fresh")   # nothing read or said of it yet
        # As the operator starts, what a status says is read from what the watch brings.
        statuses.seen("ns", "idle", {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "Unused",
                                                     "message": connections.UNUSED_MESSAGE,
                                                     "lastTransitionTime": "2026-11-29T10:00:00Z"}]})
        statuses.named("ns", "idle")
        statuses.report("ns", "up", "True", "Connected", "cluster c1 answers", "c1")
        statuses.named("ns", "up")
        statuses.report("ns", "down", "False", "KafkaUnavailable", "no answer")
        statuses.named("ns", "down")
        writes = api.wait(3)
        time.sleep(0.3)
        assert len(api.writes) == 3, api.writes
        said = {(namespace, name): body["conditions"][0] for namespace, name, body in writes}
        assert {ref: (c["status"], c["reason"]) for ref, c in said.items()} == {
            ("ns", "idle"): ("Unknown", "Idle"), ("ns", "up"): ("True", "Connected"),
            ("ns", "down"): ("False", "KafkaUnavailable")}
        assert said[("ns", "idle")]["message"] == connections.IDLE_MESSAGE

        # What the watch brings of one named while nothing was known: a status saying more stays (a restarted
        # operator's), none at all (a new connection) or Unused says Idle.
        statuses.named("ns", "was-up")
        statuses.seen("ns", "was-up", {"clusterId": "c1", "conditions": [{
            "type": "Ready", "status": "True", "reason": "Connected", "message": "cluster c1 answers",
            "lastTransitionTime": "2026-11-29T10:00:00Z"}]})
        statuses.seen("ns", "fresh", {})
        (*_, fresh) = api.wait(4)
        time.sleep(0.3)
        assert len(api.writes) == 4 and fresh[1] == "fresh" and fresh[2]["conditions"][0]["reason"] == "Idle"
        statuses.seen("ns", "made", {})   # the other order: read (a new one, saying nothing), then named
        statuses.named("ns", "made")
        (*_, made) = api.wait(5)
        assert made[1] == "made" and made[2]["conditions"][0]["reason"] == "Idle"

        statuses.unused({("ns", "up"), ("ns", "down"), ("ns", "was-up")})
        api.wait(8)
        assert sorted((w[1], w[2]["conditions"][0]["reason"]) for w in api.writes[5:]) == [
            ("fresh", "Unused"), ("idle", "Unused"), ("made", "Unused")]
    finally:
        statuses.close()


def test_a_refusal_of_the_cluster_right_stays_until_a_report_proves_that_call_passes():
    """One subscription's change refused CLUSTER_AUTHORIZATION_FAILED (no ALTER_CONFIGS) while another, with nothing
    to change, describes fine: the connection says the refusal, not Connected and KafkaRefused in turn."""
    api = _StatusApi()
    statuses = connections.ConnectionStatuses(api)
    connected = ("True", "Connected", "cluster c1 answers", "c1")
    try:
        statuses.report("ns", "a", "False", "KafkaRefused", "no ALTER_CONFIGS", needs="alter")
        api.wait(1)
        for _ in range(3):
            statuses.report("ns", "a", *connected, proves=("describe",))   # in sync: nothing altered
            statuses.report("ns", "a", *connected, proves=())   # its own refusal at describe
            statuses.report("ns", "a", "False", "KafkaRefused", "no ALTER_CONFIGS", needs="alter")
        time.sleep(0.3)
        assert len(api.writes) == 1, api.writes
        statuses.report("ns", "a", *connected)   # a change passed: the right was granted
        (*_, granted) = api.wait(2)
        assert granted[2]["conditions"][0]["reason"] == "Connected"

        statuses.report("ns", "b", "False", "KafkaRefused", "no DESCRIBE_CONFIGS", needs="describe")
        statuses.report("ns", "b", *connected, proves=())
        time.sleep(0.3)
        assert statuses.shown("ns", "b").reason == "KafkaRefused"
        statuses.report("ns", "b", *connected, proves=("describe",))   # any describe passing shows it granted
        wait_until = time.monotonic() + 5
        while statuses.shown("ns", "b").reason != "Connected" and time.monotonic() < wait_until:
            time.sleep(0.05)
        assert statuses.shown("ns", "b").reason == "Connected"

        statuses.report("ns", "c", "False", "KafkaRefused", "no ALTER_CONFIGS", needs="alter")
        statuses.report("ns", "c", "False", "KafkaUnavailable", "no answer")   # anything else said ends it
        statuses.report("ns", "c", *connected, proves=("describe",))
        assert statuses.shown("ns", "c").reason == "Connected"
    finally:
        statuses.close()


def test_a_failed_status_write_is_retried_with_backoff_a_refusal_logged_once_and_a_deleted_connection_forgotten(
        caplog):
    forbidden = client.ApiException(status=403, reason="Forbidden")
    api = _StatusApi([forbidden, forbidden, None, client.ApiException(status=404, reason="Not Found")])
    statuses = connections.ConnectionStatuses(api, retry_max_s=0.6)
    try:
        with caplog.at_level("WARNING", logger="kcm.operator"):
            statuses.report("ns", "a", "False", "KafkaRefused", "CLUSTER_AUTHORIZATION_FAILED")
            api.wait(1)
            time.sleep(0.1)   # its backoff has begun
            statuses.report("ns", "a", "False", "KafkaRefused", "CLUSTER_AUTHORIZATION_FAILED, still")
            time.sleep(0.2)
            assert len(api.writes) == 1, "a report made during a backoff waits for it"
            writes = api.wait(3)
        assert [w[2]["conditions"][0]["message"] for w in writes] == [
            "CLUSTER_AUTHORIZATION_FAILED"] + ["CLUSTER_AUTHORIZATION_FAILED, still"] * 2
        refusals = [r.getMessage() for r in caplog.records if "kafkaconnections/status" in r.getMessage()]
        assert len(refusals) == 1 and "ns/a" in refusals[0] and "403" in refusals[0]

        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        api.wait(4)   # 404: the KafkaConnection is gone
        wait_until = time.monotonic() + 5
        while statuses.shown("ns", "a") is not None and time.monotonic() < wait_until:
            time.sleep(0.05)
        assert statuses.shown("ns", "a") is None
        time.sleep(0.5)
        assert len(api.writes) == 4, "nothing is retried for a deleted KafkaConnection"
    finally:
        statuses.close()


def test_of_the_status_reports_made_during_a_write_the_latest_is_written_next():
    release = threading.Event()
    api = _StatusApi(hold_first=release)
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.report("ns", "a", "False", "KafkaUnavailable", "first")
        time.sleep(0.2)   # the first write is under way
        for number in range(10):
            statuses.report("ns", "a", "False", "KafkaUnavailable", f"report {number}")
        release.set()
        api.wait(2)
        time.sleep(0.3)
        assert [w[2]["conditions"][0]["message"] for w in api.writes] == ["first", "report 9"]
    finally:
        statuses.close()


def test_an_unused_status_the_operator_may_not_write_is_not_retried_and_the_connection_is_forgotten():
    # Without the RBAC rule every write is refused: connections nobody names must not be kept and patched for ever.
    forbidden = client.ApiException(status=403, reason="Forbidden")
    api = _StatusApi([forbidden] * 10)
    statuses = connections.ConnectionStatuses(api)   # a refused report is tried again a second later: after Unused
    try:
        for number in range(5):
            statuses.report("ns", f"c{number}", "False", "KafkaUnavailable", "no answer")
        api.wait(5)
        statuses.unused(set())
        api.wait(10)
        time.sleep(0.5)
        assert len(api.writes) == 10, "refused Unused writes are not tried again"
        assert all(statuses.shown("ns", f"c{number}") is None for number in range(5))
    finally:
        statuses.close()


def test_a_status_read_back_keeps_its_transition_time_and_is_not_written_again_unchanged():
    api = _StatusApi()
    statuses = connections.ConnectionStatuses(api)
    try:
        written = {"observedGeneration": 2, "clusterId": "c1", "conditions": [
            {"type": "Ready", "status": "True", "reason": "Connected", "message": "cluster c1 answers",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}]}
        statuses.seen("ns", "a", written)
        statuses.resolved("ns", "a", 2)
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        time.sleep(0.3)
        assert api.writes == [], "what the status says already is not written again"
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers, through a new client", "c1")
        (write,) = api.wait(1)
        assert write[2]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
        statuses.seen("ns", "b", {"conditions": "not a list"})   # a status edited by hand: nothing to start from
        statuses.seen("ns", "b", {"conditions": [{"type": "Other", "status": "True"}]})
        assert statuses.shown("ns", "b") is None
    finally:
        statuses.close()


def test_a_report_made_while_a_write_finds_the_connection_gone_is_still_written():
    release = threading.Event()
    api = _StatusApi([client.ApiException(status=404, reason="Not Found")], hold_first=release)
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.report("ns", "a", "False", "KafkaUnavailable", "before it was created again")
        time.sleep(0.2)
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        release.set()
        writes = api.wait(2)
        assert writes[1][2]["conditions"][0]["reason"] == "Connected"
        statuses.forget("ns", "a")
        assert statuses.shown("ns", "a") is None
    finally:
        statuses.close()


def test_a_connection_known_to_be_gone_gets_no_writes_until_it_is_seen_or_read_again():
    # A subscription naming a KafkaConnection that does not exist fails at every retry and drift check: each failure
    # is a report, and each report was a status write answered 404.
    api = _StatusApi([client.ApiException(status=404, reason="Not Found")])
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.report("ns", "typo", "False", "InvalidSpec", "KafkaConnection ns/typo does not exist")
        api.wait(1)
        time.sleep(0.2)
        for number in range(5):
            statuses.report("ns", "typo", "False", "InvalidSpec", f"still missing, retry {number}")
        statuses.named("ns", "typo")
        time.sleep(0.3)
        assert len(api.writes) == 1, "a connection a write found gone is not written to again"

        statuses.seen("ns", "typo", {})   # the watch brings it: created
        statuses.report("ns", "typo", "True", "Connected", "cluster c1 answers", "c1")
        assert api.wait(2)[1][2]["conditions"][0]["reason"] == "Connected"

        statuses.forget("ns", "typo")   # the watch's deletion
        statuses.report("ns", "typo", "False", "InvalidSpec", "KafkaConnection ns/typo does not exist")
        time.sleep(0.3)
        assert len(api.writes) == 2, "a deleted connection is not written to"
        statuses.resolved("ns", "typo", 3)   # a resolve read it (made again) before the watch said so
        statuses.report("ns", "typo", "True", "Connected", "cluster c1 answers", "c1")
        assert api.wait(3)[2][2]["observedGeneration"] == 3

        statuses.forget("ns", "typo")
        statuses.unused(set())   # named by nothing: not kept
        assert statuses._missing == set()
    finally:
        statuses.close()


def test_a_connection_a_write_finds_gone_is_known_gone_unless_the_watch_brought_it_during_the_write():
    """One deleted while this replica was paused by peering never gets its deletion from the watch (kopf lists again on
    resuming): the write's 404 says it. One made again while the write was under way is seen, and written to."""
    api = _StatusApi([client.ApiException(status=404, reason="Not Found")])
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.seen("ns", "a", {})
        statuses.report("ns", "a", "False", "KafkaUnavailable", "no answer")
        api.wait(1)
        time.sleep(0.2)
        statuses.report("ns", "a", "False", "InvalidSpec", "KafkaConnection ns/a does not exist")
        time.sleep(0.3)
        assert len(api.writes) == 1, "gone, and no deletion will come: not written to"
    finally:
        statuses.close()

    release = threading.Event()
    api = _StatusApi([client.ApiException(status=404, reason="Not Found")], hold_first=release)
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.seen("ns", "b", {})
        statuses.report("ns", "b", "False", "KafkaUnavailable", "no answer")
        time.sleep(0.2)   # the write is under way
        statuses.seen("ns", "b", {})   # made again: the watch brings it
        release.set()
        api.wait(1)
        time.sleep(0.2)
        statuses.report("ns", "b", "True", "Connected", "cluster c1 answers", "c1")
        assert api.wait(2)[1][2]["conditions"][0]["reason"] == "Connected"
    finally:
        statuses.close()


def test_a_status_another_replica_wrote_meanwhile_is_what_the_next_report_is_compared_with():
    """A replica paused by peering keeps what it last wrote; the working one may have written another status since
    (Kafka down), and this one, resumed when Kafka is back, must not take its own old `Connected` for what is shown."""
    api = _StatusApi()
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.seen("ns", "a", {})
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        (mine,) = api.wait(1)
        statuses.seen("ns", "a", mine[2])   # the watch brings this replica's own write back: nothing to do
        time.sleep(0.2)
        assert len(api.writes) == 1
        other = {"clusterId": "c1", "conditions": [
            {"type": "Ready", "status": "False", "reason": "KafkaUnavailable", "message": "no answer",
             "lastTransitionTime": "2026-11-29T12:00:00Z"}]}
        statuses.seen("ns", "a", other)   # the other replica's, once this one resumed (a fresh listing)

        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        writes = api.wait(2)
        assert writes[1][2]["conditions"][0]["reason"] == "Connected"
        assert writes[1][2]["conditions"][0]["lastTransitionTime"] != "2026-11-29T12:00:00Z"   # a transition
    finally:
        statuses.close()


def test_a_status_read_while_a_report_waits_to_be_written_leaves_that_report_to_write():
    release = threading.Event()
    api = _StatusApi(hold_first=release)
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.report("ns", "a", "False", "KafkaUnavailable", "no answer")
        time.sleep(0.2)   # its write is under way
        statuses.seen("ns", "a", {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "Unused",
                                                  "message": "older", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        assert statuses.shown("ns", "a").reason == "KafkaUnavailable"
        release.set()
        assert api.wait(1)[0][2]["conditions"][0]["reason"] == "KafkaUnavailable"
    finally:
        statuses.close()


def test_the_watch_bringing_this_replicas_earlier_write_after_a_later_one_changes_nothing():
    """Two writes in a row, then the watch brings the first one's event: taken for what the object says, the next
    report equal to it would not be written, and the second event would then leave the object saying the second."""
    api = _StatusApi()
    statuses = connections.ConnectionStatuses(api)
    try:
        statuses.seen("ns", "a", {})
        statuses.report("ns", "a", "False", "KafkaUnavailable", "no answer")
        first = api.wait(1)[0][2]
        time.sleep(0.2)
        statuses.report("ns", "a", "True", "Connected", "cluster c1 answers", "c1")
        second = api.wait(2)[1][2]
        time.sleep(0.2)
        statuses.seen("ns", "a", first)    # the watch, a moment late
        statuses.report("ns", "a", "False", "KafkaUnavailable", "no answer")
        statuses.seen("ns", "a", second)
        writes = api.wait(3)
        assert writes[2][2]["conditions"][0]["reason"] == "KafkaUnavailable"
    finally:
        statuses.close()
