"""Model test of how the operator turns a KafkaConnection and the Secrets it names into Kafka client settings
(`ConnectionResolver.resolve`): seeded random KafkaConnections and Secrets checked against a reference written from
docs/operator.md ("## KafkaConnection": the fields table and its defaults, "Secret values that are not UTF-8 text
(SASL) or TLS material that does not load are `InvalidSpec`, naming the Secret and key; so is an empty SASL username
or password", the TLS files "written 0600 to a private temporary directory" and deleted "10 minutes later", "never
logged", the `InvalidSpec`/`KubernetesError` entries of "Errors") and crds/kafkaconnections.kcm.dev.yaml (the
defaults the API server would fill in, which the emulated API server does not: the resolver must), not from the code.

The real thing runs: the resolver reads KafkaConnections and Secrets (written with `data`, as docs/operator.md's
emulator notes ask) over HTTP from the emulated Kubernetes API (tests/kube_emulator.py). TLS material is real PEM
made by openssl. The reference, per KafkaConnection:
- no fault: kafka-python's options are the bootstrap servers as listed, the protocol (default PLAINTEXT), the SASL
  mechanism with the username and password read from the keys named (default `username`, `password`), the CA,
  certificate and key files holding exactly the bytes of the keys named (default `ca.crt`, `tls.crt`, `tls.key`),
  each file 0600 in a directory only the operator may read, and host-name checking as `verifyHostname` (default on);
- one fault: a Secret missing (also when one of that name is in another namespace), a key missing, a SASL value
  empty or not UTF-8, a CA that is no (usable) PEM, a client certificate with another certificate's key: the error's
  reason is `InvalidSpec`, its message names the Secret (and the key, for all but a missing Secret); a missing
  KafkaConnection, Secret or key is retried;
- always: no secret value (username, password, private key) in the error's text, in any log record at any level,
  nor in the settings' repr.
Directed cases: a rotated password used by the next resolve (and by drift checks within two drift intervals), a
Secret rotated while a resolve reads it, the old TLS files of a rotated Secret deleted 10 minutes after (not before,
and not once named again), the private directory removed at close, a KafkaConnection that does not exist, and a
Secret the operator may not read (403: `KubernetesError`).
"""

from __future__ import annotations

import base64
import logging
import random
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kcm_common.kafka import KafkaSettings
from kcm_operator.connections import ConnectionResolver, MaterialLedger
from kcm_operator.errors import RETRIED, reason_of
from kcm_operator.handlers import OperatorConfig
from kube_emulator import KubeServer

CRDS = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
GROUP, VERSION, PLURAL = "kcm.dev", "v1alpha1", "kafkaconnections"
NAMESPACES = ("team-a", "team-b")
SEEDS = (7, 19, 83)
CASES = 36
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")           # docs/operator.md fields table
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SERVERS = ("kafka:9092", "kafka-0.kafka:9093,kafka-1.kafka:9093", "[::1]:9093", "10.0.0.7:19092,[fd00::2]:9094")
GRACE_S = 600.0   # "is deleted 10 minutes later"
FAULT_KINDS = {"empty": "sasl", "not-utf8": "sasl", "ca-not-pem": "ca", "ca-no-cert": "ca", "ca-empty": "ca",
               "foreign-key": "key", "key-not-pem": "key"}
NOT_PEM = b"this is not a certificate\n"
EMPTY_PEM = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def pems(tmp_path_factory) -> dict[str, bytes]:
    """Two CAs and two client certificates with their (unencrypted) keys, made by openssl."""
    directory: Path = tmp_path_factory.mktemp("pems")
    made: dict[str, bytes] = {}
    for name in ("ca1", "ca2", "client1", "client2"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-subj", f"/CN=kcm-{name}", "-days", "2", "-keyout", f"{name}.key",
                        "-out", f"{name}.pem"], cwd=directory, check=True, capture_output=True, timeout=60)
        made[f"{name}.pem"] = (directory / f"{name}.pem").read_bytes()
        made[f"{name}.key"] = (directory / f"{name}.key").read_bytes()
    return made


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    server = KubeServer(tmp_path_factory.mktemp("kube"), CRDS)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def api(kube):
    api_client = config.new_client_from_config(str(kube.kubeconfig))
    yield api_client
    api_client.close()


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """Where the resolver's own temporary directory is made (so a test sees it, and nothing is left behind)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


class _Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


# --- the reference ------------------------------------------------------------------------------------------------

@dataclass
class Case:
    """A KafkaConnection `namespace/name` with `spec`, the Secrets made for it ((namespace, name): key: bytes),
    and the values no log or message may show."""

    namespace: str
    name: str
    spec: dict[str, Any]
    secrets: dict[tuple[str, str], dict[str, bytes]]
    secret_values: list[bytes] = field(default_factory=list)
    fault: str | None = None


@dataclass
class Fault:
    """The documented error: its reason, the Secret and key it names, whether it is retried, its key words."""

    secret: str
    key: str | None
    retried: bool
    words: tuple[str, ...]


def expected(case: Case, pems: dict[str, bytes]) -> dict[str, Any] | Fault:
    """What docs/operator.md says resolving `case` gives: kafka-python options (files as their bytes), or a Fault."""
    spec = case.spec
    protocol = spec.get("securityProtocol", "PLAINTEXT")
    secrets = {name: data for (namespace, name), data in case.secrets.items() if namespace == case.namespace}

    def read(secret: str, key: str) -> bytes | Fault:
        if secret not in secrets:  # a Secret of that name elsewhere is not this namespace's
            return Fault(secret, None, True, ("does not exist",))
        if key not in secrets[secret]:
            return Fault(secret, key, True, ())
        return secrets[secret][key]

    options: dict[str, Any] = {"bootstrap_servers": spec["bootstrapServers"].split(","), "security_protocol": protocol}
    sasl = spec.get("sasl")
    if sasl:
        ref = sasl["secretRef"]
        options["sasl_mechanism"] = sasl["mechanism"]
        for option, key in (("sasl_plain_username", ref.get("usernameKey", "username")),
                            ("sasl_plain_password", ref.get("passwordKey", "password"))):
            value = read(ref["name"], key)
            if isinstance(value, Fault):
                return value
            try:
                options[option] = value.decode("utf-8")
            except UnicodeDecodeError:
                return Fault(ref["name"], key, False, ("UTF-8",))
            if not options[option]:
                return Fault(ref["name"], key, False, ("empty",))
    tls = spec.get("tls") or {}
    if "caSecretRef" in tls:
        ref = tls["caSecretRef"]
        key = ref.get("key", "ca.crt")
        ca = read(ref["name"], key)
        if isinstance(ca, Fault):
            return ca
        if ca not in (pems["ca1.pem"], pems["ca2.pem"]):
            return Fault(ref["name"], key, False, ())
        options["ssl_cafile"] = ca
    if "clientCertSecretRef" in tls:
        ref = tls["clientCertSecretRef"]
        cert_key, key_key = ref.get("certKey", "tls.crt"), ref.get("keyKey", "tls.key")
        cert, key = read(ref["name"], cert_key), read(ref["name"], key_key)
        for value in (cert, key):
            if isinstance(value, Fault):
                return value
        if key == NOT_PEM:
            return Fault(ref["name"], key_key, False, ())
        if (cert, key) not in ((pems["client1.pem"], pems["client1.key"]), (pems["client2.pem"], pems["client2.key"])):
            return Fault(ref["name"], None, False, ())   # which key is to blame cannot be told: the Secret is named
        options["ssl_certfile"], options["ssl_keyfile"] = cert, key
    options["ssl_check_hostname"] = tls.get("verifyHostname", True)
    return options


def random_case(rng: random.Random, seed: int, number: int, pems: dict[str, bytes]) -> Case:
    """A CRD-valid KafkaConnection with its Secrets, every optional field given or left to its default, and at most
    one fault."""
    namespace = rng.choice(NAMESPACES)
    prefix = f"s{seed}-{number}"
    protocol = rng.choice(PROTOCOLS)
    spec: dict[str, Any] = {"bootstrapServers": rng.choice(SERVERS)}
    if protocol != "PLAINTEXT" or rng.random() < 0.5:
        spec["securityProtocol"] = protocol
    case = Case(namespace, f"conn-{prefix}", spec, {})
    shared = rng.random() < 0.3   # one Secret holding everything, as some operators make
    holder = f"{prefix}-all"

    def secret(kind: str) -> str:
        name = holder if shared else f"{prefix}-{kind}"
        case.secrets.setdefault((namespace, name), {"unrelated": b"not used"})
        return name

    def key(ref: dict[str, str], field_name: str, default: str, custom: str) -> str:
        if rng.random() < 0.5:
            return default
        ref[field_name] = custom
        return custom

    refs: list[tuple[str, str, str]] = []   # (kind, secret, key) of every value read
    if protocol.startswith("SASL_"):
        ref = {"name": secret("sasl")}
        spec["sasl"] = {"mechanism": rng.choice(MECHANISMS), "secretRef": ref}
        user_key = key(ref, "usernameKey", "username", rng.choice(("user", "USERNAME", "sasl.user")))
        password_key = key(ref, "passwordKey", "password", rng.choice(("pass", "PASSWORD", "sasl.pw")))
        user = rng.choice(("kcm", "app-ü-7", "CN=client,O=kcm", "user with spaces"))
        user += f"-{rng.randrange(10**6)}"
        length = rng.choice((8, 40, 200_000))   # a huge one still fits a Secret (1 MiB)
        password = "".join(rng.choice("abcXYZ019!#%&*=:;\"' ü€😀") for _ in range(length)) + f"#{number}"
        case.secrets[namespace, ref["name"]].update({user_key: user.encode(), password_key: password.encode()})
        case.secret_values += [user.encode(), password.encode()]
        refs += [("sasl", ref["name"], user_key), ("sasl", ref["name"], password_key)]
    if protocol.endswith("SSL") and rng.random() < 0.85:
        tls: dict[str, Any] = {}
        if rng.random() < 0.7:
            ref = {"name": secret("ca")}
            tls["caSecretRef"] = ref
            ca_key = key(ref, "key", "ca.crt", rng.choice(("ca.pem", "trust")))
            case.secrets[namespace, ref["name"]][ca_key] = pems[rng.choice(("ca1.pem", "ca2.pem"))]
            refs.append(("ca", ref["name"], ca_key))
        if rng.random() < 0.6:
            ref = {"name": secret("client")}
            tls["clientCertSecretRef"] = ref
            cert_key = key(ref, "certKey", "tls.crt", rng.choice(("cert.pem", "user.crt")))
            key_key = key(ref, "keyKey", "tls.key", rng.choice(("key.pem", "user.key")))
            pair = rng.choice(("client1", "client2"))
            case.secrets[namespace, ref["name"]].update({cert_key: pems[f"{pair}.pem"], key_key: pems[f"{pair}.key"]})
            case.secret_values.append(_key_body(pems[f"{pair}.key"]))
            refs += [("cert", ref["name"], cert_key), ("key", ref["name"], key_key)]
        if rng.random() < 0.6:
            tls["verifyHostname"] = rng.random() < 0.5
        spec["tls"] = tls
    if refs and rng.random() < 0.55:
        inject_fault(rng, case, refs, pems)
    return case


def inject_fault(rng: random.Random, case: Case, refs: list[tuple[str, str, str]], pems: dict[str, bytes]) -> None:
    kinds = {kind for kind, _, _ in refs}
    possible = ["missing-secret", "missing-key"]
    possible += ["empty", "not-utf8"] if "sasl" in kinds else []
    possible += ["ca-not-pem", "ca-no-cert", "ca-empty"] if "ca" in kinds else []
    possible += ["foreign-key", "key-not-pem"] if "key" in kinds else []
    case.fault = rng.choice(possible)
    kind = FAULT_KINDS.get(case.fault)   # the value a fault is put in; any for a missing Secret or key
    _, secret, key = rng.choice([ref for ref in refs if kind in (None, ref[0])])
    data = case.secrets[case.namespace, secret]
    if case.fault == "missing-secret":
        del case.secrets[case.namespace, secret]
        if rng.random() < 0.5:   # one of that name in the other namespace is not read
            other = next(namespace for namespace in NAMESPACES if namespace != case.namespace)
            case.secrets[other, secret] = data
    elif case.fault == "missing-key":
        del data[key]
    elif case.fault == "empty":
        data[key] = b""
    elif case.fault == "not-utf8":
        data[key] = b"\xff\xfe" + data[key]
    elif case.fault == "ca-not-pem":
        data[key] = NOT_PEM
    elif case.fault == "ca-no-cert":
        data[key] = EMPTY_PEM
    elif case.fault == "ca-empty":
        data[key] = b""
    elif case.fault == "key-not-pem":
        data[key] = NOT_PEM
    else:   # the key of the other client certificate
        data[key] = pems["client2.key"] if data[key] == pems["client1.key"] else pems["client1.key"]
        case.secret_values.append(_key_body(data[key]))


def _key_body(pem: bytes) -> bytes:
    """The first line of a private key's base64: what a key shown anywhere would show."""
    return next(line for line in pem.splitlines() if line and not line.startswith(b"-----"))


# --- the real thing -----------------------------------------------------------------------------------------------

def create(api_client: client.ApiClient, case: Case) -> None:
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    for (namespace, name), data in case.secrets.items():
        core.create_namespaced_secret(namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                                  "data": _encoded(data)})
    custom.create_namespaced_custom_object(GROUP, VERSION, case.namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaConnection", "metadata": {"name": case.name},
        "spec": case.spec})


def _encoded(data: dict[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode() for key, value in data.items()}


def observed(settings: KafkaSettings) -> dict[str, Any]:
    """kafka-python's options for `settings`, each TLS file as its bytes; no host-name option is kafka-python's
    default (checked)."""
    options = settings.client_options()
    for option in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if option in options:
            options[option] = Path(options[option]).read_bytes()
    options.setdefault("ssl_check_hostname", True)
    return options


def shown_anywhere(values: list[bytes], texts: list[str]) -> list[str]:
    """The secret values (shortened) that appear in any of `texts`."""
    found = []
    for value in values:
        text = value.decode("utf-8", "replace").lstrip("\ufffd")
        if len(text) >= 6 and any(text in said for said in texts):
            found.append(text[:20])
    return found


def check_case(case: Case, resolver: ConnectionResolver, pems: dict[str, bytes], caplog, private: Path) -> str:
    want = expected(case, pems)
    error: Exception | None = None
    settings = None
    try:
        settings = resolver.resolve(case.namespace, case.name)
    except Exception as exc:
        error = exc
    where = f"{case.namespace}/{case.name} ({case.fault or 'no fault'})"
    texts = [record.getMessage() for record in caplog.records] + [record.exc_text or "" for record in caplog.records]
    if isinstance(want, Fault):
        assert error is not None, f"{where}: resolved, but the docs say {want}"
        # As on the subscription's (and so the connection's) status: what the operator's admin lookup raises.
        operator_config = OperatorConfig(KafkaSettings("127.0.0.1:1"), resolve=resolver.resolve)
        try:
            with pytest.raises(Exception) as on_status:
                operator_config.admin(case.namespace, case.name)
        finally:
            operator_config.close()
        status_error = on_status.value
        message = str(status_error)
        assert reason_of(status_error) == "InvalidSpec", (where, type(status_error), message)
        assert isinstance(status_error, RETRIED) == want.retried, (where, type(status_error), message)
        assert want.secret in message and "Secret" in message, (where, message)
        if want.key is not None:
            assert want.key in message, (where, message)
        for word in want.words:
            assert word in message, (where, word, message)
        assert str(private) not in message, f"{where}: a file path instead of the Secret: {message}"
        texts += [str(error), message]
    else:
        assert error is None, f"{where}: {type(error).__name__}: {error}"
        assert observed(settings) == want, where
        for option in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
            if option in settings.properties:
                path = Path(settings.properties[option])
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, (where, option)
                assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0, (where, "directory not private")
        texts.append(repr(settings))
    assert shown_anywhere(case.secret_values, texts) == [], where
    return "error" if isinstance(want, Fault) else "settings"


@pytest.mark.parametrize("seed", SEEDS)
def test_resolved_settings_follow_the_documented_model(seed, api, pems, private_tmp, caplog):
    rng = random.Random(seed)
    resolver = ConnectionResolver(api)
    caplog.set_level(logging.DEBUG)
    outcomes: dict[str, int] = {}
    faults: set[str] = set()
    try:
        for number in range(CASES):
            case = random_case(rng, seed, number, pems)
            create(api, case)
            caplog.clear()
            outcome = check_case(case, resolver, pems, caplog, private_tmp)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            faults.add(case.fault or "")
    finally:
        resolver.close()
    assert min(outcomes.values()) >= 5 and len(outcomes) == 2, outcomes   # both sides of the model were exercised
    assert len(faults) >= 6, faults
    assert list(private_tmp.iterdir()) == [], "the private directory outlived close"


# --- directed cases -----------------------------------------------------------------------------------------------

def _sasl_connection(api_client: client.ApiClient, name: str, user: bytes, password: bytes) -> None:
    create(api_client, Case("team-a", name, {"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
                                             "sasl": {"mechanism": "SCRAM-SHA-256", "secretRef": {"name": name}}},
                            {("team-a", name): {"username": user, "password": password}}))


def _rotate(api_client: client.ApiClient, namespace: str, name: str, data: dict[str, bytes]) -> None:
    core = client.CoreV1Api(api_client)   # (the emulated API server takes no PUT of a Secret: deleted, made again)
    core.delete_namespaced_secret(name, namespace)
    core.create_namespaced_secret(namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                              "data": _encoded(data)})


def _credentials(settings: KafkaSettings) -> tuple[str, str]:
    options = settings.client_options()
    return options["sasl_plain_username"], options["sasl_plain_password"]


def test_a_rotated_password_is_used_by_the_next_resolve(api, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    _sasl_connection(api, "rotated", b"kcm-user", b"old-s3cret-value")
    resolver = ConnectionResolver(api, tmp_path)
    assert _credentials(resolver.resolve("team-a", "rotated")) == ("kcm-user", "old-s3cret-value")
    _rotate(api, "team-a", "rotated", {"username": b"kcm-user", "password": b"new-s3cret-value"})
    assert _credentials(resolver.resolve("team-a", "rotated")) == ("kcm-user", "new-s3cret-value")
    said = [record.getMessage() for record in caplog.records]
    assert shown_anywhere([b"old-s3cret-value", b"new-s3cret-value"], said) == []


def test_a_secret_rotated_while_a_resolve_reads_it_gives_one_whole_credential(api, tmp_path):
    """Username and password rotate together: a resolve under way gives the old pair or the new one, never a mix;
    the next resolve gives the new pair."""
    _sasl_connection(api, "racing", b"user-1", b"password-1")
    resolver = ConnectionResolver(api, tmp_path)
    real = resolver._core.read_namespaced_secret
    rotated = threading.Event()

    def read_then_rotate(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        if not rotated.is_set():
            rotated.set()
            _rotate(api, "team-a", "racing", {"username": b"user-2", "password": b"password-2"})
        return answer

    resolver._core.read_namespaced_secret = read_then_rotate
    during = _credentials(resolver.resolve("team-a", "racing"))
    assert rotated.is_set()
    assert during in (("user-1", "password-1"), ("user-2", "password-2"))
    assert _credentials(resolver.resolve("team-a", "racing")) == ("user-2", "password-2")


def test_the_old_tls_files_of_a_rotated_secret_go_ten_minutes_later_and_not_before(api, pems, private_tmp):
    tls = {"caSecretRef": {"name": "ledger-ca"}, "clientCertSecretRef": {"name": "ledger-client"}}
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SSL", "tls": tls}
    create(api, Case("team-b", "ledger", spec, {("team-b", "ledger-ca"): {"ca.crt": pems["ca1.pem"]},
                                                ("team-b", "ledger-client"): {"tls.crt": pems["client1.pem"],
                                                                              "tls.key": pems["client1.key"]}}))
    # Another connection keeps naming the first CA: its file is not retired with the rotated one.
    create(api, Case("team-b", "ledger-other", {**spec, "tls": {"caSecretRef": {"name": "ledger-ca-other"}}},
                     {("team-b", "ledger-ca-other"): {"ca.crt": pems["ca1.pem"]}}))
    clock = _Clock()
    resolver = ConnectionResolver(api)
    resolver.material = MaterialLedger(clock=clock)   # the documented grace, on a clock the test moves

    def files(settings: KafkaSettings) -> dict[str, Path]:
        return {key: Path(settings.properties[key]) for key in
                ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location") if key in settings.properties}

    try:
        old = files(resolver.resolve("team-b", "ledger"))
        other = files(resolver.resolve("team-b", "ledger-other"))
        directory = old["ssl.ca.location"].parent
        _rotate(api, "team-b", "ledger-ca", {"ca.crt": pems["ca2.pem"]})
        _rotate(api, "team-b", "ledger-client", {"tls.crt": pems["client2.pem"], "tls.key": pems["client2.key"]})
        new = files(resolver.resolve("team-b", "ledger"))
        assert new["ssl.ca.location"].read_bytes() == pems["ca2.pem"]
        assert new["ssl.key.location"].read_bytes() == pems["client2.key"]
        clock.now += GRACE_S - 1
        resolver.resolve("team-b", "ledger")
        assert all(path.exists() for path in [*old.values(), *new.values()]), "deleted within the 10 minutes"
        clock.now += 1
        resolver.resolve("team-b", "ledger")
        assert not old["ssl.certificate.location"].exists() and not old["ssl.key.location"].exists()
        assert other["ssl.ca.location"].exists(), "a file another KafkaConnection names was deleted"
        assert sorted(directory.iterdir()) == sorted({*new.values(), *other.values()})

        # Rotated back, then forth again within the grace: a file named again is no longer due for deletion.
        _rotate(api, "team-b", "ledger-client", {"tls.crt": pems["client1.pem"], "tls.key": pems["client1.key"]})
        back = files(resolver.resolve("team-b", "ledger"))
        assert back["ssl.key.location"].read_bytes() == pems["client1.key"]
        clock.now += 100
        _rotate(api, "team-b", "ledger-client", {"tls.crt": pems["client2.pem"], "tls.key": pems["client2.key"]})
        again = files(resolver.resolve("team-b", "ledger"))
        clock.now += GRACE_S - 100   # 10 minutes since client2's files were last left, 500 s since named again
        resolver.resolve("team-b", "ledger")
        assert again["ssl.key.location"].exists(), "a file named again was deleted"
        assert back["ssl.key.location"].exists(), "deleted within the 10 minutes"
    finally:
        resolver.close()
    assert not directory.exists(), "the private directory (private keys in it) outlived the operator"


def test_a_rotated_password_reaches_drift_checks_within_two_drift_intervals(api, tmp_path):
    """Drift checks share one reading per KafkaConnection per drift interval: a rotated password reaches them within
    two intervals (docs/operator.md), with an admin built from the new settings."""
    _sasl_connection(api, "drifting", b"kcm-user", b"drift-old-s3cret")
    resolver = ConnectionResolver(api, tmp_path)
    given: list[KafkaSettings] = []

    def resolve(namespace: str, name: str) -> KafkaSettings:
        given.append(resolver.resolve(namespace, name))
        return given[-1]

    interval = 0.5
    operator_config = OperatorConfig(KafkaSettings("127.0.0.1:1"), drift_interval_s=interval, resolve=resolve,
                                     kafka_timeout_s=0.1)
    try:
        before = operator_config.admin("team-a", "drifting", recent=True)
        _rotate(api, "team-a", "drifting", {"username": b"kcm-user", "password": b"drift-new-s3cret"})
        time.sleep(2 * interval)
        after = operator_config.admin("team-a", "drifting", recent=True)
        assert after is not before
        assert _credentials(given[-1]) == ("kcm-user", "drift-new-s3cret")
    finally:
        operator_config.close()


def test_a_kafkaconnection_that_does_not_exist_is_an_invalid_spec_retried(api, tmp_path):
    resolver = ConnectionResolver(api, tmp_path)
    with pytest.raises(Exception) as err:
        resolver.resolve("team-a", "nowhere")
    assert reason_of(err.value) == "InvalidSpec" and isinstance(err.value, RETRIED)
    assert "nowhere" in str(err.value) and "does not exist" in str(err.value)


def test_a_secret_the_operator_may_not_read_is_a_kubernetes_error_without_its_value(api, tmp_path):
    _sasl_connection(api, "forbidden", b"kcm-user", b"forbidden-s3cret")

    def refuse(name: str, namespace: str, **_: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    resolver = ConnectionResolver(api, tmp_path)
    resolver._core.read_namespaced_secret = refuse
    with pytest.raises(Exception) as err:
        resolver.resolve("team-a", "forbidden")
    assert reason_of(err.value) == "KubernetesError" and isinstance(err.value, RETRIED)
    assert "team-a/forbidden" in str(err.value) and "403" in str(err.value)
    assert "forbidden-s3cret" not in str(err.value)
