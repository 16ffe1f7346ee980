"""examples/admission/guardrails.yaml: its ValidatingAdmissionPolicies evaluated with CEL (cel-python, as kcm's CRD
rules are) the way the API server evaluates them, on objects defaulted by the CRDs: what each refuses and lets
through, that only spec changes are judged (so the operator can still patch, and delete, a resource made before the
policy), and that every policy matches the CRDs' group, version and resource and is bound."""

from __future__ import annotations

import copy
from pathlib import Path

import celpy
import pytest
import yaml

from kcm_operator import schema

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = list(yaml.safe_load_all((ROOT / "examples" / "admission" / "guardrails.yaml").read_text()))
POLICIES = {d["metadata"]["name"]: d for d in DOCUMENTS if d["kind"] == "ValidatingAdmissionPolicy"}
CRDS = schema.load_crds()
KINDS = {"clientmetricssubscriptions": schema.SUBSCRIPTION_KIND, "kafkaconnections": schema.CONNECTION_KIND}


def _admit(policy: str, obj: dict, old: dict | None = None) -> list[str]:
    """The messages of the validations `obj` fails (none: admitted), for a CREATE, or an UPDATE from `old`."""
    plural = POLICIES[policy]["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]
    crd = CRDS[KINDS[plural]]
    activation = {"object": celpy.json_to_cel(schema.apply_defaults(crd.schema, obj)),
                  "oldObject": celpy.json_to_cel(schema.apply_defaults(crd.schema, old) if old else None),
                  "request": celpy.json_to_cel({"operation": "UPDATE" if old else "CREATE"})}
    environment = celpy.Environment()
    failed = []
    for validation in POLICIES[policy]["spec"]["validations"]:
        result = environment.program(environment.compile(validation["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            failed.append(validation["message"])
    return failed


def _subscription(**spec) -> dict:
    return {"apiVersion": schema.API_VERSION, "kind": schema.SUBSCRIPTION_KIND,
            "metadata": {"name": "s", "namespace": "team"}, "spec": {"metrics": ["org.apache.kafka.producer."], **spec}}


def _connection(servers: str) -> dict:
    return {"apiVersion": schema.API_VERSION, "kind": schema.CONNECTION_KIND,
            "metadata": {"name": "c", "namespace": "team"}, "spec": {"bootstrapServers": servers}}


MATCH = {"clientId": "payments-.*"}


@pytest.mark.parametrize("spec, refused", [
    ({"match": MATCH}, []),                                     # the default interval, 5 min
    ({"match": MATCH, "intervalMs": 10000}, []),
    ({"match": MATCH, "intervalMs": 9999}, ["spec.intervalMs"]),
    ({"match": MATCH, "intervalMs": 100}, ["spec.intervalMs"]),
    ({}, ["spec.match"]),
    ({"match": {}}, ["spec.match"]),
    ({"intervalMs": 100}, ["spec.intervalMs", "spec.match"]),
], ids=["default-interval", "at-the-floor", "below-it", "kafka-minimum", "no-match", "empty-match", "both"])
def test_a_subscription_is_refused_for_each_guardrail_it_breaks_naming_the_field(spec, refused):
    failed = _admit("kcm-subscription-guardrails", _subscription(**spec))
    assert [message.split()[0] for message in failed] == refused


def test_only_spec_changes_are_judged_so_a_resource_older_than_the_policy_can_still_be_handled_and_deleted():
    older = _subscription(intervalMs=100)
    handled = copy.deepcopy(older)   # what kopf patches: the finalizer, its annotations, a deletion under way
    handled["metadata"].update(finalizers=["kcm.dev/subscription"], annotations={"operator.kcm.dev/last": "{}"},
                               deletionTimestamp="2026-11-29T00:00:00Z")
    assert _admit("kcm-subscription-guardrails", handled, old=older) == []

    edited = copy.deepcopy(older)
    edited["spec"]["intervalMs"] = 200
    assert [m.split()[0] for m in _admit("kcm-subscription-guardrails", edited, old=older)] == [
        "spec.intervalMs", "spec.match"]
    fixed = _subscription(intervalMs=30000, match=MATCH)
    assert _admit("kcm-subscription-guardrails", fixed, old=older) == []


@pytest.mark.parametrize("servers, admitted", [
    ("kafka-a.kafka.svc:9093", True),
    ("kafka-a.kafka.svc:9093,kafka-b.kafka.svc.cluster.local:9093", True),
    ("kafka-a.kafka.svc:9092", False),
    ("kafka-a.kafka.svc:9093,169.254.169.254:80", False),
    ("kafka-a.kafka.svc:9093,", False),
    ("kafka-a.kafka.svc.evil.example:9093", False),
    ("xkafka-a.kafka.svc:9093", False),
    ("10.0.0.1:9093", False),
])
def test_a_connection_may_name_only_the_allowed_listeners(servers, admitted):
    failed = _admit("kcm-connection-allowlist", _connection(servers))
    assert (failed == []) is admitted
    assert all(message.startswith("spec.bootstrapServers ") for message in failed)


def test_a_connection_older_than_the_policy_can_still_be_deleted():
    older = _connection("10.0.0.1:9093")
    deleting = copy.deepcopy(older)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    assert _admit("kcm-connection-allowlist", deleting, old=older) == []
    assert _admit("kcm-connection-allowlist", _connection("10.0.0.2:9093"), old=older) != []


def test_every_policy_matches_a_crds_group_version_and_resource_and_is_bound_to_deny():
    bindings = {d["spec"]["policyName"]: d for d in DOCUMENTS if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == set(POLICIES)
    for name, policy in POLICIES.items():
        assert policy["apiVersion"] == bindings[name]["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert policy["spec"]["failurePolicy"] == "Fail"
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule["apiGroups"] == [schema.GROUP] and rule["apiVersions"] == [schema.VERSION]
        assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
        (plural,) = rule["resources"]
        assert plural in KINDS and KINDS[plural] in CRDS   # a resource, not a subresource: status writes pass
        assert bindings[name]["spec"]["validationActions"] == ["Deny"]
