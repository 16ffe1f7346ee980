"""Model-based test of the two CRDs (ClientMetricsSubscription, KafkaConnection) and the operator's own spec checks.

The reference is written from docs/operator.md ("The resource", the KafkaConnection field table, "Errors":
InvalidSpec, the printer columns `kubectl get cms` / `kubectl get kconn` show) and the ClientMetricsSubscription
section of the design brief, DESIGN.md (subscription name `<namespace>.<name>`, the CLIENT_METRICS configs and match
keys).
Seeded random documents, valid and broken in each documented way (wrong types, intervalMs out of 100..3600000,
unknown or bad match keys and patterns, metrics forms, names the API server refuses, missing required fields, fields
in the wrong combination, unknown fields, transition rules), are validated as the project validates CRs
(`kcm_operator.schema`: the CRD's openAPIV3Schema, defaults and CEL rules; the kube emulator applies none of them)
and read as `kcm subscriptions apply` reads them (`kcm_operator.manifests`). For each: accepted or refused as the
model says, the defaulted object, a refusal naming the offending field, and the Kafka configs an accepted one stands
for. Accepted KafkaConnections are turned into client settings (`connections.settings_from_spec`): which Secret keys
are read (documented defaults) and whether host names are checked. Patterns the schema accepts but java.util.regex
refuses are sent to Kafka (the sandbox) as the operator sends them and must come back InvalidSpec naming the entry.
"""

from __future__ import annotations

import base64
import copy
import random
import re
import string
import types
from pathlib import Path

import kopf
import pytest
import yaml

from kcm_common.kafka import KafkaConfigError, KafkaSettings, KafkaUnavailableError
from kcm_operator import handlers, manifests, schema
from kcm_operator.admin import SubscriptionAdmin
from kcm_operator.connections import ConnectionResolver, settings_from_spec
from kcm_operator.errors import InvalidSpecError, MissingReferenceError, reason_of
from kcm_operator.reconcile import desired_from_spec, diff
from kcm_sandbox.runner import Sandbox, SandboxOptions

SEEDS = range(8)
DOCS_PER_SEED = 90
CRDS = schema.load_crds()   # the copy installed with the operator: what it validates against

# --- the reference, from the docs -----------------------------------------------------------------------------------

# docs/operator.md "The resource" and DESIGN.md: CR match field -> Kafka match key.
MATCH_KEYS = {"clientInstanceId": "client_instance_id", "clientId": "client_id",
              "clientSoftwareName": "client_software_name", "clientSoftwareVersion": "client_software_version",
              "clientSourceAddress": "client_source_address", "clientSourcePort": "client_source_port"}
INTERVAL_MIN, INTERVAL_MAX, INTERVAL_DEFAULT = 100, 3600000, 300000
POLICIES = ("Delete", "Retain")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# "white space at either end" of a metric or pattern: what Kafka (Java's String.trim) trims.
EDGE_SPACE = (" ", "\t", "\n", "\r", "\x0b", "\f")
# Full-string Java regexes without "=", a comma or white space at either end: the schema and Kafka accept them.
JAVA_VALID = ("payments-.*", "apache-kafka-java|librdkafka", "[0-9]+", r"\d+(\.\d+){3}", "(?i)kafka.*",
              "a{2}", r"\p{Alpha}+", "librdkafka", "confluent-kafka-.+", "3\\.[7-9]\\..*", "a b", "x*+",
              r"\Qa.b\E", "[^ ]+", "(a|b)?c", "1.0.0")
# Patterns the schema accepts but java.util.regex refuses (Pattern.compile throws PatternSyntaxException).
JAVA_INVALID = ("(", "payments-(", "[a-", "a{2", "*a", "a**x", "[z-a]", "(?<name", "\\", "a)", "+x", "{", "x{")


def defaulted_subscription(obj: dict) -> dict:
    """The object as the API server stores it (docs: nulls dropped, intervalMs 300000, deletionPolicy Delete)."""
    obj = copy.deepcopy(obj)
    spec = obj["spec"]
    for key in [key for key, value in spec.items() if value is None]:
        del spec[key]
    spec.setdefault("intervalMs", INTERVAL_DEFAULT)
    spec.setdefault("deletionPolicy", "Delete")
    return obj


def defaulted_connection(obj: dict) -> dict:
    """KafkaConnection defaults from the field table: PLAINTEXT, username/password, ca.crt, tls.crt/tls.key,
    verifyHostname true."""
    obj = copy.deepcopy(obj)
    spec = obj["spec"]
    spec.setdefault("securityProtocol", "PLAINTEXT")
    if "sasl" in spec:
        ref = spec["sasl"]["secretRef"]
        ref.setdefault("usernameKey", "username")
        ref.setdefault("passwordKey", "password")
    if "tls" in spec:
        tls = spec["tls"]
        tls.setdefault("verifyHostname", True)
        if "caSecretRef" in tls:
            tls["caSecretRef"].setdefault("key", "ca.crt")
        if "clientCertSecretRef" in tls:
            tls["clientCertSecretRef"].setdefault("certKey", "tls.crt")
            tls["clientCertSecretRef"].setdefault("keyKey", "tls.key")
    return obj


def expected_configs(obj: dict) -> tuple[str, dict[str, str]]:
    """DESIGN.md: resource `<subscriptionName>` (default `<namespace>.<name>`) with `metrics` (comma list),
    `interval.ms` and `match` (comma list of `key=regex`, absent when nothing is matched on)."""
    spec = defaulted_subscription(obj)["spec"]
    meta = obj["metadata"]
    name = spec.get("subscriptionName") or f"{meta.get('namespace') or 'default'}.{meta['name']}"
    configs = {"metrics": ",".join(spec["metrics"]), "interval.ms": str(spec["intervalMs"])}
    match = spec.get("match") or {}
    if match:
        configs["match"] = ",".join(f"{MATCH_KEYS[field]}={match[field]}" for field in MATCH_KEYS if field in match)
    return name, configs


# --- random documents -------------------------------------------------------------------------------------------------

def dns_label(rng: random.Random, length: int) -> str:
    if length == 1:
        return rng.choice(string.ascii_lowercase + string.digits)
    inner = "".join(rng.choice(string.ascii_lowercase + string.digits + "-") for _ in range(length - 2))
    return rng.choice(string.ascii_lowercase) + inner + rng.choice(string.digits + string.ascii_lowercase)


def dns_subdomain(rng: random.Random) -> str:
    if rng.random() < 0.1:   # the longest name the API server takes: 253 characters
        return ".".join([dns_label(rng, 63)] * 3 + [dns_label(rng, 61)])
    return ".".join(dns_label(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 3)))


def metric_prefix(rng: random.Random) -> str:
    prefix = rng.choice(("org.apache.kafka.", "org.apache.kafka.producer.", "org.apache.kafka.consumer.",
                         "org.apache.kafka.plugins.", "x", "a b.", "a=b."))   # inner space and "=" are fine
    return prefix + "".join(rng.choice(string.ascii_lowercase + ".-") for _ in range(rng.randint(0, 8)))


def random_subscription(rng: random.Random) -> dict:
    """A ClientMetricsSubscription the docs say is valid, with optional fields present, absent or null."""
    meta = {"name": dns_subdomain(rng)}
    if rng.random() < 0.9:
        meta["namespace"] = dns_label(rng, 63 if rng.random() < 0.1 else rng.randint(1, 10))
    form = rng.random()
    if form < 0.1:
        metrics: list[str] = []
    elif form < 0.25:
        metrics = ["*"]
    else:
        metrics = list(dict.fromkeys(metric_prefix(rng) for _ in range(rng.randint(1, 5))))
    spec: dict = {"metrics": metrics}
    if rng.random() < 0.7:
        spec["intervalMs"] = rng.choice((INTERVAL_MIN, INTERVAL_MAX, INTERVAL_DEFAULT,
                                         rng.randint(INTERVAL_MIN, INTERVAL_MAX)))
    if rng.random() < 0.7:
        spec["match"] = {field: rng.choice(JAVA_VALID)
                         for field in rng.sample(sorted(MATCH_KEYS), rng.randint(0, len(MATCH_KEYS)))}
    if rng.random() < 0.3:
        spec["subscriptionName"] = rng.choice(("payments-producers", "a", "team.sub-1", "x" * 200))
    if rng.random() < 0.3:
        spec["connection"] = dns_subdomain(rng)
    if rng.random() < 0.5:
        spec["deletionPolicy"] = rng.choice(POLICIES)
    for key in ("intervalMs", "match", "deletionPolicy", "subscriptionName", "connection"):
        if key not in spec and rng.random() < 0.1:
            spec[key] = None   # Helm output: `match: null` is stored as if absent
    return {"apiVersion": schema.API_VERSION, "kind": schema.SUBSCRIPTION_KIND, "metadata": meta, "spec": spec}


def random_connection(rng: random.Random) -> dict:
    """A KafkaConnection the field table says is valid."""
    servers = ",".join(f"{rng.choice(('kafka', 'b-1.example.com', '10.0.0.7', 'analytics-kafka', '[fd00::1]'))}:"
                       f"{rng.choice((1, 9092, 9093, 65535, 19092))}" for _ in range(rng.randint(1, 3)))
    spec: dict = {"bootstrapServers": servers}
    protocol = rng.choice(PROTOCOLS)
    if protocol != "PLAINTEXT" or rng.random() < 0.5:
        spec["securityProtocol"] = protocol
    if protocol.startswith("SASL_"):
        ref = {"name": rng.choice(("creds", "analytics-credentials"))}
        for key in ("usernameKey", "passwordKey"):
            if rng.random() < 0.4:
                ref[key] = rng.choice(("user", "pass", "u-1", "kafka.password"))
        spec["sasl"] = {"mechanism": rng.choice(MECHANISMS), "secretRef": ref}
    if protocol.endswith("SSL") and rng.random() < 0.7:
        tls: dict = {}
        if rng.random() < 0.6:
            tls["caSecretRef"] = {"name": "ca"} | ({"key": "root.pem"} if rng.random() < 0.4 else {})
        if rng.random() < 0.4:
            cert = {"name": "client-tls"}
            if rng.random() < 0.4:
                cert["certKey"] = "cert.pem"
            if rng.random() < 0.4:
                cert["keyKey"] = "key.pem"
            tls["clientCertSecretRef"] = cert
        if rng.random() < 0.5:
            tls["verifyHostname"] = rng.choice((True, False))
        spec["tls"] = tls
    meta = {"name": dns_subdomain(rng), "namespace": dns_label(rng, rng.randint(1, 10))}
    return {"apiVersion": schema.API_VERSION, "kind": schema.CONNECTION_KIND, "metadata": meta, "spec": spec}


# A fault: (name, applies(obj) -> bool, break(rng, obj) -> (problem prefix, a word the problem must hold)).
# The prefix is the offending field's path as the API server writes it; a missing field or a CEL rule is reported
# on its parent and then names the field in its message.

def _edge_spaced(rng: random.Random, text: str) -> str:
    space = rng.choice(EDGE_SPACE)
    return space + text if rng.random() < 0.5 else text + space


def _break_metric(value_of):
    def apply(rng, obj):
        metrics = obj["spec"]["metrics"]
        index = rng.randint(0, len(metrics))
        metrics.insert(index, value_of(rng))
        return f"spec.metrics[{index}]:", ""
    return apply


def _break_match(value_of):
    def apply(rng, obj):
        field = rng.choice(sorted(MATCH_KEYS))
        obj["spec"].setdefault("match", None)
        if not isinstance(obj["spec"]["match"], dict):
            obj["spec"]["match"] = {}
        obj["spec"]["match"][field] = value_of(rng)
        return f"spec.match.{field}:", ""
    return apply


def _set(path: str, values, prefix: str | None = None, word: str = ""):
    *parents, last = path.split(".")

    def apply(rng, obj):
        target = obj
        for part in parents:
            target = target[part]
        target[last] = rng.choice(values)
        return prefix or f"{path}:", word
    return apply


def _drop(path: str):
    *parents, last = path.split(".")

    def apply(rng, obj):
        target = obj
        for part in parents:
            target = target[part]
        del target[last]
        return (".".join(parents) or "<root>") + ":", f"'{last}'"
    return apply


def _duplicate_metric(rng, obj):
    metrics = obj["spec"]["metrics"]
    item = rng.choice(metrics)
    metrics.append(item)
    return f"spec.metrics[{len(metrics) - 1}]:", "Duplicate"


def _star_with_others(rng, obj):
    obj["spec"]["metrics"] = ["*", metric_prefix(rng)] if rng.random() < 0.5 else [metric_prefix(rng), "*"]
    return "spec:", '"*"'


def _unknown(path: str, names):
    def apply(rng, obj):
        target = obj
        for part in path.split(".") if path else ():
            target = target[part]
        name = rng.choice(names)
        target[name] = rng.choice(("x", 1000, True))
        return f"{path}.{name}:".lstrip("."), "unknown field"
    return apply


def _bad_name(rng, obj):
    obj["metadata"]["name"] = rng.choice(("Payments", "a_b", "-a", "a-", "a..b", "a" * 254, "a b", "ä", ".a"))
    return "metadata.name:", ""


def _bad_namespace(rng, obj):
    obj["metadata"]["namespace"] = rng.choice(("a.b", "Team", "a" * 64, "-a", "a_b"))
    return "metadata.namespace:", ""


def _no_name(rng, obj):
    if rng.random() < 0.5:
        del obj["metadata"]["name"]
    else:
        obj["metadata"]["name"] = ""
    return "metadata.name:", "Required"


def _unknown_match_key(rng, obj):
    if not isinstance(obj["spec"].get("match"), dict):
        obj["spec"]["match"] = {}
    name = rng.choice(("clientID", "client_id", "clientName", "principal", "clientSoftware"))
    obj["spec"]["match"][name] = "x"
    return f"spec.match.{name}:", "unknown field"


def _has_metrics(obj):
    return bool(obj["spec"].get("metrics")) and obj["spec"]["metrics"] != ["*"]


SUBSCRIPTION_FAULTS = [
    ("interval below 100", None, _set("spec.intervalMs", (99, 0, -1, -100000, 1 - 2**31))),
    ("interval above an hour", None, _set("spec.intervalMs", (3600001, 2**31 - 1, 10**12))),
    ("interval not an integer", None, _set("spec.intervalMs", ("60000", 60000.5, True, [60000], {"ms": 1}))),
    ("metrics missing", None, _drop("spec.metrics")),
    ("metrics null", None, _set("spec.metrics", (None,), "spec:", "'metrics'")),
    ("metrics not a list", None, _set("spec.metrics", ("org.apache.kafka.", {"a": 1}, 5))),
    ("metric empty", None, _break_metric(lambda rng: "")),
    ("metric with a comma", None, _break_metric(lambda rng: rng.choice(("a.,b.", ",", "org.apache,")))),
    ("metric with edge space", None, _break_metric(lambda rng: _edge_spaced(rng, metric_prefix(rng)))),
    ("metric only space", None, _break_metric(lambda rng: rng.choice(EDGE_SPACE))),
    ("metric not a string", None, _break_metric(lambda rng: rng.choice((5, None, ["a"], True)))),
    ("metric repeated", _has_metrics, _duplicate_metric),
    ("star with other prefixes", None, _star_with_others),
    ("unknown match key", None, _unknown_match_key),
    ("match pattern empty", None, _break_match(lambda rng: "")),
    ("match pattern with a comma", None, _break_match(lambda rng: rng.choice(("a,b", "payments-.*,x", ",")))),
    ("match pattern with =", None, _break_match(lambda rng: rng.choice(("a=b", "(?=p)payments", "=")))),
    ("match pattern with edge space", None, _break_match(lambda rng: _edge_spaced(rng, rng.choice(JAVA_VALID)))),
    ("match pattern not a string", None, _break_match(lambda rng: rng.choice((5, ["x"], {"regex": "x"}, False)))),
    ("match not an object", None, _set("spec.match", ("clientId=payments-.*", ["clientId"], 5))),
    ("subscriptionName empty", None, _set("spec.subscriptionName", ("",))),
    ("subscriptionName not a string", None, _set("spec.subscriptionName", (5, ["a"], True))),
    ("connection empty", None, _set("spec.connection", ("",))),
    ("connection not a string", None, _set("spec.connection", (5, {"name": "x"}))),
    ("deletionPolicy unknown", None, _set("spec.deletionPolicy", ("Orphan", "delete", "", "RETAIN", 1))),
    ("unknown spec field", None, _unknown("spec", ("intervalMS", "interval", "selector", "metric", "Match"))),
    ("unknown top-level field", None, _unknown("", ("specs", "data", "extra"))),
    ("spec missing", None, _drop("spec")),
    ("spec not an object", None, _set("spec", ("metrics: ['*']", ["*"]), "spec:")),
    ("name refused by the API server", None, _bad_name),
    ("namespace refused by the API server", None, _bad_namespace),
    ("name missing", None, _no_name),
]



def _sasl_protocol_without_sasl(rng, obj):
    obj["spec"]["securityProtocol"] = rng.choice(("SASL_PLAINTEXT", "SASL_SSL"))
    obj["spec"].pop("sasl", None)
    obj["spec"].pop("tls", None)
    return "spec:", "sasl"


def _sasl_without_sasl_protocol(rng, obj):
    protocol = rng.choice(("PLAINTEXT", "SSL", None))
    if protocol is None:
        obj["spec"].pop("securityProtocol", None)
    else:
        obj["spec"]["securityProtocol"] = protocol
    obj["spec"]["sasl"] = {"mechanism": rng.choice(MECHANISMS), "secretRef": {"name": "creds"}}
    obj["spec"].pop("tls", None)
    return "spec:", "sasl"


def _tls_without_ssl(rng, obj):
    protocol = rng.choice(("PLAINTEXT", "SASL_PLAINTEXT", None))
    spec = obj["spec"]
    if protocol is None:
        spec.pop("securityProtocol", None)
    else:
        spec["securityProtocol"] = protocol
    if protocol == "SASL_PLAINTEXT":
        spec["sasl"] = {"mechanism": "PLAIN", "secretRef": {"name": "creds"}}
    else:
        spec.pop("sasl", None)
    spec["tls"] = rng.choice(({}, {"verifyHostname": False}, {"caSecretRef": {"name": "ca"}}))
    return "spec:", "tls"


def _with_sasl(obj):
    return "sasl" in obj["spec"]


def _with_tls(obj):
    return "tls" in obj["spec"]


def _tls_ref(field: str, value_of, word: str = ""):
    def apply(rng, obj):
        tls = obj["spec"]["tls"]
        ref = tls.setdefault(field, {"name": "x"})
        prefix, word_ = value_of(rng, ref)
        return f"spec.tls.{field}{prefix}", word_ or word
    return apply


def _unset(key):
    def apply(rng, ref):
        ref.pop(key, None)
        return ":", f"'{key}'"
    return apply


def _empty(key):
    def apply(rng, ref):
        ref[key] = ""
        return f".{key}:", ""
    return apply


CONNECTION_FAULTS = [
    ("bootstrapServers missing", None, _drop("spec.bootstrapServers")),
    ("bootstrapServers not HOST:PORT", None, _set("spec.bootstrapServers", (
        "kafka", "kafka:", "kafka:123456", "kafka:9092,", "kafka 1:9092", "kafka:9092, other:9092", "", ":",
        "kafka:port", "kafka:9092\n", ",kafka:9092", "kafka:9092,,other:9092", "kafka:9092;other:9092",
        "::1:9092", "kafka:9092:9092"))),
    ("bootstrapServers not a string", None, _set("spec.bootstrapServers", (9092, ["kafka:9092"]))),
    ("securityProtocol unknown", None, _set("spec.securityProtocol", ("SASL", "ssl", "TLS", "PLAIN", ""))),
    ("SASL protocol without sasl", None, _sasl_protocol_without_sasl),
    ("sasl without a SASL protocol", None, _sasl_without_sasl_protocol),
    ("tls without SSL", None, _tls_without_ssl),
    ("mechanism unknown", _with_sasl, _set("spec.sasl.mechanism", ("GSSAPI", "OAUTHBEARER", "scram-sha-256", ""))),
    ("mechanism missing", _with_sasl, _drop("spec.sasl.mechanism")),
    ("secretRef missing", _with_sasl, _drop("spec.sasl.secretRef")),
    ("secretRef name missing", _with_sasl, _drop("spec.sasl.secretRef.name")),
    ("secretRef name empty", _with_sasl, _set("spec.sasl.secretRef.name", ("",))),
    ("usernameKey empty", _with_sasl, _set("spec.sasl.secretRef.usernameKey", ("",))),
    ("passwordKey empty", _with_sasl, _set("spec.sasl.secretRef.passwordKey", ("",))),
    ("password in the resource", _with_sasl, _unknown("spec.sasl", ("password", "username"))),
    ("secret value in the reference", _with_sasl, _unknown("spec.sasl.secretRef", ("value", "namespace"))),
    ("verifyHostname not a boolean", _with_tls, _set("spec.tls.verifyHostname", ("false", 0, "no"))),
    ("caSecretRef without a name", _with_tls, _tls_ref("caSecretRef", _unset("name"))),
    ("caSecretRef key empty", _with_tls, _tls_ref("caSecretRef", _empty("key"))),
    ("clientCertSecretRef without a name", _with_tls, _tls_ref("clientCertSecretRef", _unset("name"))),
    ("clientCertSecretRef keyKey empty", _with_tls, _tls_ref("clientCertSecretRef", _empty("keyKey"))),
    ("unknown tls field", _with_tls, _unknown("spec.tls", ("insecure", "caCert", "verifyHostName"))),
    ("unknown spec field", None, _unknown("spec", ("bootstrapServer", "saslMechanism", "password"))),
    ("spec missing", None, _drop("spec")),
]


def documents(seed: int, make, faults) -> list[tuple[str, dict, tuple[str, str] | None]]:
    """(label, document, expected refusal (prefix, word) or None), about a third of them valid."""
    rng = random.Random(seed)
    out = []
    for index in range(DOCS_PER_SEED):
        obj = make(rng)
        if rng.random() < 0.35:
            out.append((f"{seed}/{index} valid", obj, None))
            continue
        candidates = [fault for fault in faults if fault[1] is None or fault[1](obj)]
        name, _, fault = rng.choice(candidates)
        out.append((f"{seed}/{index} {name}", obj, fault(rng, obj)))
    return out


def assert_judged(label: str, obj: dict, expected: tuple[str, str] | None, problems: list[str]) -> None:
    if expected is None:
        assert problems == [], f"{label}: a valid document refused: {problems}"
        return
    prefix, word = expected
    assert problems, f"{label}: refused by the docs, accepted: {obj.get('spec')}"
    assert all(problem.startswith(prefix) for problem in problems), (label, prefix, problems)
    assert any(word in problem for problem in problems), (label, word, problems)


# --- ClientMetricsSubscription ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_subscriptions_accepted_refused_and_defaulted_as_documented(seed):
    crd = CRDS[schema.SUBSCRIPTION_KIND]
    counts = {"valid": 0, "refused": 0}
    for label, obj, expected in documents(seed, random_subscription, SUBSCRIPTION_FAULTS):
        problems = schema.validate(obj, crds=CRDS)
        assert_judged(label, obj, expected, problems)
        if expected is None:
            counts["valid"] += 1
            assert schema.apply_defaults(crd.schema, obj) == defaulted_subscription(obj), label
        else:
            counts["refused"] += 1
    assert counts["valid"] >= 20 and counts["refused"] >= 40, counts


@pytest.mark.parametrize("seed", SEEDS)
def test_kcm_subscriptions_apply_reads_each_document_as_the_configs_the_docs_name(seed):
    """`kcm subscriptions apply` (and the operator's reconcile core): a refused document is InvalidSpec naming the
    resource and the field, nothing of it taken; an accepted one stands for the documented CLIENT_METRICS configs."""
    for label, obj, expected in documents(seed, random_subscription, SUBSCRIPTION_FAULTS):
        manifest = manifests.Manifest(f"s{seed}.yaml", obj)
        if expected is not None:
            with pytest.raises(InvalidSpecError) as refused:
                manifests.subscriptions([manifest])
            message = str(refused.value)
            assert "nothing applied" in message and f"(s{seed}.yaml)" in message, (label, message)
            assert f": {expected[0]}" in message, (label, expected, message)
            assert reason_of(refused.value) == "InvalidSpec"
            continue
        ((_, desired),) = manifests.subscriptions([manifest])
        name, configs = expected_configs(obj)
        assert (desired.name, desired.configs()) == (name, configs), label
        spec = defaulted_subscription(obj)["spec"]
        assert desired.connection == spec.get("connection"), label
        assert desired.deletion_policy == spec["deletionPolicy"], label
        assert diff(desired, {}).action == "create" and diff(desired, configs).ops == (), label


@pytest.mark.parametrize("field", ["subscriptionName", "connection"])
@pytest.mark.parametrize("seed", SEEDS[:4])
def test_transition_rules_keep_where_a_subscription_lives(seed, field):
    """docs: changing `subscriptionName` or `connection` is refused (CEL transition rules); other edits are not,
    and creation has no old object to compare with."""
    rng = random.Random(1000 + seed)
    for _ in range(20):
        old = random_subscription(rng)
        old["spec"].pop("subscriptionName", None), old["spec"].pop("connection", None)
        before, after = rng.sample(("a", "payments", "team.sub", "analytics"), 2)
        old["spec"][field] = before
        new = copy.deepcopy(old)
        new["spec"]["intervalMs"] = rng.randint(INTERVAL_MIN, INTERVAL_MAX)   # an allowed edit beside it
        new["spec"]["deletionPolicy"] = rng.choice(POLICIES)
        assert schema.validate(new, old=old, crds=CRDS) == []
        moved = copy.deepcopy(new)
        how = rng.choice(("changed", "removed"))
        if how == "changed":
            moved["spec"][field] = after
        else:
            del moved["spec"][field]
        (problem,) = schema.validate(moved, old=old, crds=CRDS)
        assert problem.startswith("spec:") and f"{field} cannot change" in problem, (how, problem)
        assert schema.validate(moved, crds=CRDS) == []   # a new resource may name anything
    if field == "connection":   # adding a connection moves the subscription to another cluster
        old = random_subscription(rng)
        old["spec"].pop("connection", None)
        new = copy.deepcopy(old)
        new["spec"]["connection"] = "analytics"
        (problem,) = schema.validate(new, old=old, crds=CRDS)
        assert problem.startswith("spec:") and "connection cannot change" in problem


@pytest.mark.parametrize("metrics", [[], ["*"], ["org.apache.kafka.producer."], ["a=b", "a b"]])
def test_documented_metrics_forms_are_accepted(metrics):
    obj = {"apiVersion": schema.API_VERSION, "kind": schema.SUBSCRIPTION_KIND,
           "metadata": {"name": "m", "namespace": "ns"}, "spec": {"metrics": metrics}}
    assert schema.validate(obj, crds=CRDS) == []
    ((_, desired),) = manifests.subscriptions([manifests.Manifest("m.yaml", obj)])
    assert desired.configs() == {"metrics": ",".join(metrics), "interval.ms": "300000"}
    assert desired.name == "ns.m"


# --- KafkaConnection --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_connections_accepted_refused_and_defaulted_as_documented(seed):
    crd = CRDS[schema.CONNECTION_KIND]
    counts = {"valid": 0, "refused": 0}
    for label, obj, expected in documents(seed, random_connection, CONNECTION_FAULTS):
        problems = schema.validate(obj, crds=CRDS)
        assert_judged(label, obj, expected, problems)
        if expected is None:
            counts["valid"] += 1
            assert schema.apply_defaults(crd.schema, obj) == defaulted_connection(obj), label
        else:
            counts["refused"] += 1
    assert counts["valid"] >= 20 and counts["refused"] >= 40, counts


class FakeKubernetes:
    """The two reads the operator's ConnectionResolver makes: the KafkaConnection as stored, and Secrets."""

    def __init__(self, connection: dict, secrets: dict[str, dict[str, bytes]]) -> None:
        self.connection = connection
        self.secrets = secrets

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        assert (group, version, plural, namespace, name) == (schema.GROUP, schema.VERSION, "kafkaconnections",
                                                              self.connection["metadata"]["namespace"],
                                                              self.connection["metadata"]["name"])
        return copy.deepcopy(self.connection)

    def read_namespaced_secret(self, name, namespace, **_):
        data = {key: base64.b64encode(value).decode() for key, value in self.secrets[name].items()}
        return types.SimpleNamespace(data=data)


@pytest.mark.parametrize("seed", SEEDS)
def test_accepted_connections_read_the_documented_secret_keys(seed, tmp_path, monkeypatch):
    """The operator reads a connection as its field table says: the Secret keys (given, else username/password,
    ca.crt, tls.crt/tls.key), the mechanism, and host names checked unless verifyHostname is false. A key missing
    from its Secret is InvalidSpec naming the KafkaConnection, the Secret and the key."""
    monkeypatch.setattr(KafkaSettings, "validate", lambda self: None)   # material here is not real PEM
    rng = random.Random(2000 + seed)
    for index in range(40):
        obj = random_connection(rng)
        assert schema.validate(obj, crds=CRDS) == []
        given = obj["spec"]
        read: dict[str, tuple[str, str]] = {}   # client property -> the (Secret, key) the docs say it comes from
        if "sasl" in given:
            ref = given["sasl"]["secretRef"]
            read["sasl.username"] = (ref["name"], ref.get("usernameKey", "username"))
            read["sasl.password"] = (ref["name"], ref.get("passwordKey", "password"))
        tls = given.get("tls", {})
        if "caSecretRef" in tls:
            read["ssl.ca.location"] = (tls["caSecretRef"]["name"], tls["caSecretRef"].get("key", "ca.crt"))
        if "clientCertSecretRef" in tls:
            ref = tls["clientCertSecretRef"]
            read["ssl.certificate.location"] = (ref["name"], ref.get("certKey", "tls.crt"))
            read["ssl.key.location"] = (ref["name"], ref.get("keyKey", "tls.key"))
        want = list(read.values())
        secrets: dict[str, dict[str, bytes]] = {}
        for secret, key in want:
            secrets.setdefault(secret, {"unrelated": b"x"})[key] = f"{secret}/{key}".encode()
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        resolver = ConnectionResolver(None, material_dir=tmp_path)
        resolver._custom = resolver._core = FakeKubernetes(obj, secrets)
        if want and rng.random() < 0.3:
            secret, key = rng.choice(want)
            del secrets[secret][key]
            with pytest.raises(MissingReferenceError) as missing:
                resolver.resolve(namespace, name)
            assert reason_of(missing.value) == "InvalidSpec"
            assert f"KafkaConnection {namespace}/{name}" in str(missing.value)
            assert f"Secret {namespace}/{secret} has no key {key!r}" in str(missing.value), str(missing.value)
            resolver.close()
            continue
        settings = resolver.resolve(namespace, name)
        resolver.close()
        properties = dict(settings.properties)
        assert settings.bootstrap_servers == given["bootstrapServers"]
        assert properties.pop("security.protocol") == given.get("securityProtocol", "PLAINTEXT"), index
        if "sasl" in given:
            assert properties.pop("sasl.mechanism") == given["sasl"]["mechanism"]
        shown = {}   # each Secret-fed property: the credential itself, or the content of the file it names
        for prop in ("sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location",
                     "ssl.key.location"):
            if prop in properties:
                value = properties.pop(prop)
                shown[prop] = value if prop.startswith("sasl.") else Path(value).read_bytes().decode()
        assert shown == {prop: "/".join(ref) for prop, ref in read.items()}, (index, given)
        if tls.get("verifyHostname", True) is False:
            assert properties.pop("ssl.endpoint.identification.algorithm") == ""
        assert properties == {}, (index, given, properties)   # host names checked unless told otherwise


@pytest.mark.parametrize("value, says", [(b"", "is empty"), (b"\xff\xfe", "not UTF-8")])
@pytest.mark.parametrize("key", ["usernameKey", "passwordKey"])
def test_an_empty_or_non_utf8_credential_names_the_secret_and_key(key, value, says, tmp_path):
    """docs: Secret values that are not UTF-8 text (SASL) or an empty username or password are InvalidSpec,
    naming the Secret and key (the operator turns this KafkaConfigError into InvalidSpec)."""
    spec = schema.apply_defaults(CRDS[schema.CONNECTION_KIND].schema, {"spec": {
        "bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT",
        "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds", key: "chosen"}}}})["spec"]

    def secret_value(secret: str, name: str) -> bytes:
        return value if name == "chosen" else b"fine"

    with pytest.raises(KafkaConfigError) as refused:
        settings_from_spec(spec, secret_value, tmp_path)
    assert "Secret creds key 'chosen'" in str(refused.value) and says in str(refused.value)
    assert "fine" not in str(refused.value)


# --- what the schema accepts and Kafka refuses: InvalidSpec -----------------------------------------------------------

@pytest.fixture(scope="module")
def kafka_admin():
    sandbox = Sandbox(SandboxOptions(listen=("127.0.0.1", 0)))
    sandbox.start()
    admin = SubscriptionAdmin(KafkaSettings(sandbox.bootstrap), timeout_s=10)
    try:
        yield admin
    finally:
        admin.close()
        sandbox.stop()


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_a_pattern_java_refuses_passes_the_schema_and_is_invalid_spec_naming_the_entry(seed, kafka_admin):
    """docs/operator.md Errors: InvalidSpec when Kafka refuses the spec (a regex java.util.regex rejects), with
    Kafka's message; Kafka is untouched. Sent as the operator sends it (validate only here)."""
    rng = random.Random(3000 + seed)
    changes, expected = [], {}
    for index in range(30):
        obj = random_subscription(rng)
        obj["spec"]["subscriptionName"] = f"model-{seed}-{index}"
        match = {field: rng.choice(JAVA_VALID) for field in rng.sample(sorted(MATCH_KEYS), rng.randint(1, 3))}
        bad = None
        if rng.random() < 0.6:
            bad = rng.choice(sorted(match))
            match[bad] = rng.choice(JAVA_INVALID)
        obj["spec"]["match"] = match
        assert schema.validate(obj, crds=CRDS) == [], (index, match)   # nothing the API server could refuse
        spec = schema.apply_defaults(CRDS[schema.SUBSCRIPTION_KIND].schema, obj)["spec"]
        desired = desired_from_spec(obj["metadata"].get("namespace"), obj["metadata"]["name"], spec)
        changes.append(diff(desired, {}))
        expected[desired.name] = None if bad is None else f"{MATCH_KEYS[bad]}={match[bad]}"
    outcome = kafka_admin.alter(changes, validate_only=True)
    assert set(outcome) == set(expected)
    for name, entry in expected.items():
        error = outcome[name]
        if entry is None:
            assert error is None, (name, error)
        else:
            assert isinstance(error, InvalidSpecError) and reason_of(error) == "InvalidSpec", (name, error)
            assert entry in str(error), (name, entry, str(error))
    assert kafka_admin.describe(sorted(expected)) == {name: {} for name in expected}   # nothing stored


# --- printer columns --------------------------------------------------------------------------------------------------

def json_path(obj, path: str):
    """The little JSONPath kubectl's columns use here: `.a.b` and `[?(@.type=="Ready")].field`."""
    values = [obj]
    for step in re.findall(r'\.[A-Za-z]+|\[\?\(@\.\w+=="\w+"\)\]', path):
        if step.startswith("."):
            values = [value[step[1:]] for value in values if isinstance(value, dict) and step[1:] in value]
        else:
            key, want = re.fullmatch(r'\[\?\(@\.(\w+)=="(\w+)"\)\]', step).groups()
            values = [item for value in values if isinstance(value, list)
                      for item in value if isinstance(item, dict) and item.get(key) == want]
    return values[0] if values else None


def columns(kind: str, wide: bool) -> dict[str, str]:
    path = schema.crds_dir() / f"{CRDS[kind].plural}.{schema.GROUP}.yaml"
    version = yaml.safe_load(path.read_text())["spec"]["versions"][0]
    return {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]
            if wide or column.get("priority", 0) == 0}


CONDITIONS = [{"type": "Paused", "status": "False", "reason": "Reconciling"},
              {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "Illegal client matching"}]


def test_kubectl_get_cms_shows_connection_subscription_interval_metrics_ready_and_age_and_wide_the_reason():
    obj = {"metadata": {"name": "p", "creationTimestamp": "2026-01-02T03:04:05Z"},
           "spec": {"connection": "analytics", "metrics": ["org.apache.kafka.producer."], "intervalMs": 60000},
           "status": {"subscriptionName": "payments.p", "conditions": CONDITIONS}}
    shown = {name: json_path(obj, path) for name, path in columns(schema.SUBSCRIPTION_KIND, wide=False).items()}
    assert shown == {"Connection": "analytics", "Subscription": "payments.p", "Interval": 60000,
                     "Metrics": ["org.apache.kafka.producer."], "Ready": "False", "Age": "2026-01-02T03:04:05Z"}
    wide = {name: json_path(obj, path) for name, path in columns(schema.SUBSCRIPTION_KIND, wide=True).items()}
    assert wide == shown | {"Reason": "InvalidSpec"}
    assert list(wide)[-1] == "Age"


def test_kubectl_get_kconn_shows_cluster_and_ready_and_wide_the_reason():
    obj = {"metadata": {"name": "analytics", "creationTimestamp": "2026-01-02T03:04:05Z"},
           "spec": {"bootstrapServers": "analytics-kafka:9093", "securityProtocol": "SASL_SSL"},
           "status": {"clusterId": "abc123", "conditions": [
               {"type": "Ready", "status": "True", "reason": "Connected", "message": "Kafka cluster abc123 answers"}]}}
    shown = {name: json_path(obj, path) for name, path in columns(schema.CONNECTION_KIND, wide=False).items()}
    assert shown["Cluster"] == "abc123" and shown["Ready"] == "True" and "Reason" not in shown
    assert shown["Age"] == "2026-01-02T03:04:05Z"
    wide = {name: json_path(obj, path) for name, path in columns(schema.CONNECTION_KIND, wide=True).items()}
    assert wide["Reason"] == "Connected"


def test_names_short_names_and_categories_are_the_documented_ones():
    names = {}
    for path in schema.crds_dir().glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        names[crd["spec"]["names"]["kind"]] = (crd["spec"]["group"], crd["spec"]["versions"][0]["name"],
                                              sorted(crd["spec"]["names"]["shortNames"]),
                                              sorted(crd["spec"]["names"]["categories"]), crd["spec"]["scope"])
    assert names == {"ClientMetricsSubscription": ("kcm.dev", "v1alpha1", ["cms", "cmsub"], ["kafka", "kcm"],
                                                   "Namespaced"),
                     "KafkaConnection": ("kcm.dev", "v1alpha1", ["kconn"], ["kafka", "kcm"], "Namespaced")}


# --- the operator's own check where the API server did not run the transition rule -----------------------------------

@pytest.mark.parametrize("seed", SEEDS[:3])
def test_the_operator_refuses_a_renamed_subscription_it_applied_as_invalid_spec(seed, monkeypatch):
    """docs: where the API server does not check the rules, the operator refuses a changed `subscriptionName` of a
    resource that applied one (Ready=False, InvalidSpec), without touching Kafka; one that never applied may rename."""
    events: list[dict] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: events.append(event))
    asked: list[tuple] = []

    def admin(namespace, connection, recent=False):
        asked.append((namespace, connection))
        raise KafkaUnavailableError("Kafka is not reached in this test")

    rng = random.Random(4000 + seed)
    for index in range(12):
        obj = defaulted_subscription(random_subscription(rng))
        obj["metadata"] |= {"namespace": "ns", "uid": f"u{index}", "generation": 3, "annotations": {}}
        applied_by = rng.choice(("clusterId", "lastAppliedTime", "Ready", None))
        status = {"subscriptionName": "first", "observedGeneration": 2}
        if applied_by == "Ready":
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "Applied", "observedGeneration": 2}]
        elif applied_by is not None:
            status[applied_by] = "2026-01-02T03:04:05Z" if applied_by == "lastAppliedTime" else "cluster-a"
        obj["status"] = status
        renamed = rng.choice(("second", None))
        if renamed is None:
            obj["spec"].pop("subscriptionName", None)   # back to the default `<namespace>.<name>`
        else:
            obj["spec"]["subscriptionName"] = renamed
        new_name = renamed or f"ns.{obj['metadata']['name']}"
        config = handlers.OperatorConfig(settings=KafkaSettings("127.0.0.1:1"))
        monkeypatch.setattr(config, "admin", admin)
        patch = kopf.Patch()
        asked.clear(), events.clear()
        if applied_by is None:   # never applied: the new name is simply its subscription
            with pytest.raises(kopf.TemporaryError):
                handlers._reconcile(config, kopf.Body(obj), patch, {}, 0, False)
            assert asked == [("ns", obj["spec"].get("connection"))]
            continue
        handlers._reconcile(config, kopf.Body(obj), patch, {}, 0, False)
        (ready,) = [c for c in patch["status"]["conditions"] if c["type"] == "Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), (applied_by, ready)
        assert "spec.subscriptionName cannot change" in ready["message"]
        assert "first" in ready["message"] and new_name in ready["message"], ready["message"]
        assert asked == [], "Kafka must be untouched"
        assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InvalidSpec")]
