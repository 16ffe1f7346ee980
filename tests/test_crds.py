"""The CRDs in crds/: examples accepted, bad specs refused for the right reason, schemas structural as Kubernetes requires."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from kcm_operator import schema

ROOT = Path(__file__).resolve().parents[1]
CRDS = schema.load_crds(ROOT / "crds")
SUBSCRIPTION = {"apiVersion": schema.API_VERSION, "kind": schema.SUBSCRIPTION_KIND,
                "metadata": {"name": "x", "namespace": "ns"},
                "spec": {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000,
                         "match": {"clientId": "payments-.*"}}}
CONNECTION = {"apiVersion": schema.API_VERSION, "kind": schema.CONNECTION_KIND,
              "metadata": {"name": "c", "namespace": "ns"},
              "spec": {"bootstrapServers": "kafka:9093", "securityProtocol": "SASL_SSL",
                       "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds"}},
                       "tls": {"caSecretRef": {"name": "ca"}}}}
# Fields whose type Kubernetes lets go unchecked: `metadata` is validated by the API server itself.
_UNTYPED_OK = ("x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")


def _documents():
    for path in sorted(ROOT.joinpath("examples").rglob("*.yaml")):
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document and str(document.get("apiVersion", "")).startswith(schema.GROUP + "/"):
                yield pytest.param(document, id=f"{path.relative_to(ROOT)}#{index}")


def _with(base: dict, path: str, value) -> dict:
    obj = copy.deepcopy(base)
    *parents, last = path.split(".")
    target = obj
    for part in parents:
        target = target.setdefault(part, {})
    if value is _DROP:
        del target[last]
    else:
        target[last] = value
    return obj


_DROP = object()


def test_both_kinds_are_defined_with_short_names_a_category_and_a_status_subresource():
    for path in sorted(ROOT.joinpath("crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        assert path.name == f"{crd['spec']['names']['plural']}.{crd['spec']['group']}.yaml"
        assert crd["metadata"]["name"] == path.stem
        assert crd["spec"]["names"]["shortNames"] and "kcm" in crd["spec"]["names"]["categories"]
        (version,) = crd["spec"]["versions"]
        assert version["subresources"] == {"status": {}}
    assert set(CRDS) == {schema.SUBSCRIPTION_KIND, schema.CONNECTION_KIND}


def test_subscription_printer_columns_show_connection_name_interval_metrics_ready_and_age():
    crd = yaml.safe_load(ROOT.joinpath("crds/clientmetricssubscriptions.kcm.dev.yaml").read_text())
    columns = {column["name"]: column["jsonPath"] for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]}

    assert columns["Connection"] == ".spec.connection"
    assert columns["Subscription"] == ".status.subscriptionName"
    assert columns["Interval"] == ".spec.intervalMs"
    assert columns["Metrics"] == ".spec.metrics"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"] == ".metadata.creationTimestamp"


@pytest.mark.parametrize("document", list(_documents()))
def test_every_example_is_accepted(document):
    assert schema.validate(document, crds=CRDS) == []


def test_defaults_fill_interval_and_deletion_policy():
    obj = _with(_with(SUBSCRIPTION, "spec.intervalMs", _DROP), "spec.match", _DROP)

    spec = schema.apply_defaults(CRDS[schema.SUBSCRIPTION_KIND].schema, obj)["spec"]

    assert spec["intervalMs"] == 300000 and spec["deletionPolicy"] == "Delete"


def test_nulls_are_dropped_before_defaults_as_the_api_server_does():
    """Helm output often carries `match: null`: kubectl apply takes it (the API server prunes the null, then
    defaults), so kcm must too; a required field given as null is still missing."""
    obj = _with(_with(_with(SUBSCRIPTION, "spec.intervalMs", None), "spec.match", None), "spec.deletionPolicy", None)

    assert schema.validate(obj, crds=CRDS) == []
    spec = schema.apply_defaults(CRDS[schema.SUBSCRIPTION_KIND].schema, obj)["spec"]
    assert (spec["intervalMs"], spec["deletionPolicy"], "match" in spec) == (300000, "Delete", False)
    assert schema.validate(_with(SUBSCRIPTION, "spec.metrics", None), crds=CRDS) == [
        "spec: 'metrics' is a required property"]


@pytest.mark.parametrize("base, path, value, reason", [
    (SUBSCRIPTION, "spec.intervalMs", 99, "spec.intervalMs: 99 is less than the minimum of 100"),
    (SUBSCRIPTION, "spec.intervalMs", 3600001, "spec.intervalMs: 3600001 is greater than the maximum of 3600000"),
    (SUBSCRIPTION, "spec.intervalMs", "60000", "spec.intervalMs: '60000' is not of type 'integer'"),
    (SUBSCRIPTION, "spec.metrics", _DROP, "spec: 'metrics' is a required property"),
    (SUBSCRIPTION, "spec.metrics", ["a.", "a."], "spec.metrics[1]: Duplicate value: 'a.'"),
    (SUBSCRIPTION, "spec.metrics", [""], "spec.metrics[0]: '' should be non-empty"),
    (SUBSCRIPTION, "spec.metrics", ["a.,b."], "spec.metrics[0]: 'a.,b.' does not match"),
    (SUBSCRIPTION, "spec.metrics", ["*", "a."], 'spec: metrics: "*" already means every metric; list it alone'),
    (SUBSCRIPTION, "spec.match", {"clientName": "x"}, "spec.match.clientName: unknown field"),
    (SUBSCRIPTION, "spec.match", {"clientId": ""}, "spec.match.clientId: '' should be non-empty"),
    (SUBSCRIPTION, "spec.match", {"clientId": "a,b"}, "spec.match.clientId: 'a,b' does not match"),
    (SUBSCRIPTION, "spec.metrics", [" x."], "spec.metrics[0]: ' x.' does not match"),
    (SUBSCRIPTION, "spec.metrics", [" "], "spec.metrics[0]: ' ' does not match"),
    (SUBSCRIPTION, "spec.metrics", ["\x0bx."], "spec.metrics[0]: '\\x0bx.' does not match"),  # Java trims it too
    (SUBSCRIPTION, "spec.match", {"clientId": "payments "}, "spec.match.clientId: 'payments ' does not match"),
    (SUBSCRIPTION, "spec.match", {"clientId": "(?=p)payments"}, "spec.match.clientId: '(?=p)payments' does not match"),
    (SUBSCRIPTION, "spec.subscriptionName", "", "spec.subscriptionName: '' should be non-empty"),
    (SUBSCRIPTION, "spec.deletionPolicy", "Orphan", "spec.deletionPolicy: 'Orphan' is not one of ['Delete', 'Retain']"),
    (SUBSCRIPTION, "spec.intervalMS", 1000, "spec.intervalMS: unknown field"),
    (SUBSCRIPTION, "metadata.name", "", "metadata.name: Required value"),
    # The API server's Go regexp ends `$` at the end of the text: a final newline (a YAML `|` block) fails it.
    (SUBSCRIPTION, "spec.metrics", ["org.apache.kafka.\n"], "spec.metrics[0]: 'org.apache.kafka.\\n' does not match"),
    (SUBSCRIPTION, "spec.match", {"clientId": "payments-.*\n"},
     "spec.match.clientId: 'payments-.*\\n' does not match"),
    (CONNECTION, "spec.bootstrapServers", "kafka:9092\n", "spec.bootstrapServers: 'kafka:9092\\n' does not match"),
    (CONNECTION, "spec.bootstrapServers", "kafka", "spec.bootstrapServers: 'kafka' does not match"),
    (CONNECTION, "spec.securityProtocol", "SASL", "spec.securityProtocol: 'SASL' is not one of"),
    (CONNECTION, "spec.sasl", _DROP,
     "spec: sasl is needed exactly when securityProtocol is SASL_PLAINTEXT or SASL_SSL"),
    (CONNECTION, "spec.securityProtocol", "SSL",
     "spec: sasl is needed exactly when securityProtocol is SASL_PLAINTEXT or SASL_SSL"),
    (CONNECTION, "spec.sasl.mechanism", "GSSAPI", "spec.sasl.mechanism: 'GSSAPI' is not one of"),
    (CONNECTION, "spec.sasl.secretRef", {}, "spec.sasl.secretRef: 'name' is a required property"),
    (CONNECTION, "spec.sasl.password", "hunter2", "spec.sasl.password: unknown field"),
])
def test_invalid_specs_are_refused_for_the_right_reason(base, path, value, reason):
    problems = schema.validate(_with(base, path, value), crds=CRDS)

    assert any(problem.startswith(reason) for problem in problems), problems


def test_tls_without_an_ssl_protocol_is_refused():
    obj = _with(_with(CONNECTION, "spec.securityProtocol", "SASL_PLAINTEXT"), "spec.tls", {"verifyHostname": False})

    assert schema.validate(obj, crds=CRDS) == ["spec: tls settings need securityProtocol SSL or SASL_SSL"]


@pytest.mark.parametrize("path, message", [
    ("spec.subscriptionName", "spec: subscriptionName cannot change"),
    ("spec.connection", "spec: connection cannot change"),
])
def test_transition_rules_refuse_changing_where_a_subscription_lives(path, message):
    old = _with(SUBSCRIPTION, path, "before")

    assert schema.validate(_with(SUBSCRIPTION, path, "after"), old=old, crds=CRDS)[0].startswith(message)
    assert schema.validate(_with(SUBSCRIPTION, path, "before"), old=old, crds=CRDS) == []
    assert schema.validate(_with(SUBSCRIPTION, path, "after"), crds=CRDS) == []  # creation: no old object


def _walk(node: dict, path: str):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_schemas_are_structural_every_node_typed_and_defaults_valid(kind):
    root = CRDS[kind].schema
    for path, node in _walk(root, ""):
        if path == ".metadata":
            assert set(node) == {"type"}, "metadata may only be typed; the API server validates it"
        assert "type" in node or any(node.get(key) for key in _UNTYPED_OK), f"{kind}{path} has no type"
        assert not {"additionalProperties", "properties"} <= set(node), f"{kind}{path}: both properties kinds"
        if node.get("type") == "array":
            assert "items" in node, f"{kind}{path}: an array needs items"
        if "default" in node:
            jsonschema.Draft7Validator(node).validate(node["default"])
        for rule in node.get("x-kubernetes-validations") or ():
            schema.compile_rule(rule["rule"])  # compiles with cel-python: no Kubernetes-only extension functions
            assert rule.get("message"), f"{kind}{path}: a rule needs a message people understand"


@pytest.mark.parametrize("base", [SUBSCRIPTION, CONNECTION], ids=["subscription", "connection"])
def test_a_resource_without_a_spec_is_refused(base):
    obj = {key: value for key, value in copy.deepcopy(base).items() if key != "spec"}

    assert schema.validate(obj, crds=CRDS) == ["<root>: 'spec' is a required property"]


@pytest.mark.parametrize("name", ["Bad Name!", "a" * 254, "-leading", "trailing.", "UPPER"])
def test_a_name_the_api_server_would_refuse_is_refused(name):
    obj = copy.deepcopy(SUBSCRIPTION)
    obj["metadata"]["name"] = name

    (problem,) = schema.validate(obj, crds=CRDS)
    assert problem.startswith("metadata.name: Invalid value: ")


def test_the_operators_own_crds_are_identical_to_the_top_level_crds() -> None:
    # The operator validates against the copy installed with it (kcm_operator/crds/); crds/ is what users apply.
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    own = {p.name: p.read_bytes() for p in schema.crds_dir().glob("*.yaml")}
    assert top and own == top, "operator/kcm_operator/crds/ differs from crds/: copy crds/*.yaml into it"


def test_a_directory_without_the_crds_is_a_broken_install_said_plainly(tmp_path) -> None:
    (tmp_path / "other.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(RuntimeError, match=f"no CRD for ClientMetricsSubscription, KafkaConnection in {tmp_path}"):
        schema.load_crds(tmp_path)


# What kcm reads a bootstrap list with (kcm_common.kafka.parse_bootstrap): a host holds no ':' (two HOST:PORT run
# together with another separator, `kafka:9092;other:9092`, is one host), an IPv6 address is bracketed.
_SERVERS = ["kafka:9092", "a.b-c_d:1,[::1]:2", "[fe80::1%eth0]:9092", "[2001:db8::7]:19092,b-1.example.com:9093",
            "kafka;other:9092",   # a host name only the resolver refuses, as kcm on the command line does
            "kafka:9092;other:9092", "kafka:9092 other:9092", "::1:9092", "kafka:9092:9092", "[::1]9092",
            "kafka:9092,", ",kafka:9092", "kafka:", ":9092", "[]:9092", "kafka:123456", "ka[fka:9092"]


@pytest.mark.parametrize("servers", _SERVERS)
def test_bootstrap_servers_pass_the_crd_and_the_chart_exactly_when_kcm_can_read_them(servers):
    import json

    from kcm_common.kafka import KafkaConfigError, parse_bootstrap

    try:
        readable = bool(parse_bootstrap(servers)) and not servers.startswith(",") and not servers.endswith(",")
    except KafkaConfigError:
        readable = False
    refused = schema.validate(_with(CONNECTION, "spec.bootstrapServers", servers), crds=CRDS)
    assert (not refused) == readable, refused
    chart = json.loads((ROOT / "charts/kafka-client-metrics/values.schema.json").read_text())
    pattern = chart["properties"]["kafka"]["properties"]["bootstrapServers"]["pattern"]
    assert jsonschema.Draft7Validator({"pattern": pattern}).is_valid(servers) == (readable and ";" not in servers)
