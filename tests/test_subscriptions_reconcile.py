"""The pure reconcile core: spec → desired configs, desired vs actual → SET/DELETE ops, ownership of a subscription."""

from __future__ import annotations

import pytest

from kcm_common import client_metrics as cm
from kcm_operator.reconcile import (
    DELETE,
    SET,
    Claim,
    Op,
    desired_from_spec,
    diff,
    drift,
    owner,
    removal,
    subscription_name,
)

SPEC = {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000, "match": {"clientId": "payments-.*"}}
STORED = {"metrics": "org.apache.kafka.producer.", "interval.ms": "60000", "match": "client_id=payments-.*"}


def test_spec_maps_to_kafka_configs_with_snake_case_match_keys_in_kafka_order():
    spec = {"metrics": ["a.", "b."], "intervalMs": 1000,
            "match": {"clientSoftwareName": "librdkafka", "clientId": "x-.*", "clientSourcePort": "9.*"}}

    desired = desired_from_spec("payments", "producers", spec)

    assert desired.name == "payments.producers"
    assert desired.configs() == {"metrics": "a.,b.", "interval.ms": "1000",
                                 "match": "client_id=x-.*,client_software_name=librdkafka,client_source_port=9.*"}
    cm.validate(desired.name, desired.configs())  # what Kafka accepts


def test_every_match_field_of_the_crd_maps_to_its_kafka_match_key():
    """The CR → CLIENT_METRICS translation, field by field, written out (not read back from MATCH_FIELDS): a field
    mapped to another key is accepted by Kafka and asks the wrong clients, with the resource Ready."""
    from kcm_operator import schema

    spec = {"metrics": ["a."], "match": {"clientInstanceId": "4a2f.*", "clientId": "x-.*", "clientSoftwareName": "lib",
                                         "clientSoftwareVersion": "2\\..*", "clientSourceAddress": "10\\..*",
                                         "clientSourcePort": "9.*"}}
    assert desired_from_spec("ns", "all-fields", spec).configs()["match"] == (
        "client_instance_id=4a2f.*,client_id=x-.*,client_software_name=lib,client_software_version=2\\..*,"
        "client_source_address=10\\..*,client_source_port=9.*")
    crd = schema.load_crds()[schema.SUBSCRIPTION_KIND].schema
    assert set(crd["properties"]["spec"]["properties"]["match"]["properties"]) == set(spec["match"])


def test_no_match_means_every_client_and_no_match_key():
    desired = desired_from_spec("ns", "all", {"metrics": ["*"]})

    assert desired.configs() == {"metrics": "*", "interval.ms": str(cm.DEFAULT_INTERVAL_MS)}


def test_white_space_kafka_trims_is_trimmed_so_what_kafka_holds_is_no_drift():
    # The CRD now refuses such values; resources created before it may still hold them.
    desired = desired_from_spec("ns", "app", {"metrics": [" x.", "y.\t", "x."], "match": {"clientId": "foo "}})

    assert desired.configs() == {"metrics": "x.,y.", "interval.ms": str(cm.DEFAULT_INTERVAL_MS),
                                 "match": "client_id=foo"}
    assert diff(desired, desired.configs()).ops == ()


@pytest.mark.parametrize("pattern", ["payments-[a-z[0-9]]+", "app-[a-z&&[^q]]+", "(?U)payments"])
def test_a_java_pattern_kcm_cannot_translate_is_no_drift_against_itself(pattern):
    # Kafka accepts these (java.util.regex); what it holds must compare equal, or each drift check rewrites it.
    desired = desired_from_spec("ns", "app", {"metrics": ["x."], "match": {"clientId": pattern}})

    assert diff(desired, desired.configs()).ops == ()
    assert diff(desired, {**desired.configs(), "match": "client_id=other"}).ops == (
        Op("match", SET, f"client_id={pattern}"),)


@pytest.mark.parametrize("namespace, spec, expected", [
    ("payments", {}, "payments.producers"),
    ("payments", {"subscriptionName": "shared-name"}, "shared-name"),
    (None, {}, "producers"),
])
def test_subscription_name_defaults_to_namespace_dot_name(namespace, spec, expected):
    assert subscription_name(namespace, "producers", spec) == expected


@pytest.mark.parametrize("case, spec, actual, action, ops", [
    ("absent → every key SET", SPEC, {}, "create",
     [Op("metrics", SET, "org.apache.kafka.producer."), Op("interval.ms", SET, "60000"),
      Op("match", SET, "client_id=payments-.*")]),
    ("identical → nothing", SPEC, STORED, "unchanged", []),
    ("metrics in another order → nothing (a set)", {**SPEC, "metrics": ["b.", "a."]},
     {**STORED, "metrics": "a.,b."}, "unchanged", []),
    ("stored with spaces after commas → nothing", {**SPEC, "metrics": ["a.", "b."]},
     {**STORED, "metrics": "a., b."}, "unchanged", []),
    ("interval changed → only interval", {**SPEC, "intervalMs": 5000}, STORED, "update",
     [Op("interval.ms", SET, "5000")]),
    ("a metric added → only metrics", {**SPEC, "metrics": ["org.apache.kafka.producer.", "x."]}, STORED, "update",
     [Op("metrics", SET, "org.apache.kafka.producer.,x.")]),
    ("match removed → DELETE match", {"metrics": SPEC["metrics"], "intervalMs": 60000}, STORED, "update",
     [Op("match", DELETE)]),
    ("match changed → SET match", {**SPEC, "match": {"clientId": "orders-.*"}}, STORED, "update",
     [Op("match", SET, "client_id=orders-.*")]),
    ("interval left at Kafka's default → still SET explicitly", {**SPEC, "intervalMs": 300000},
     {k: v for k, v in STORED.items() if k != "interval.ms"}, "update", [Op("interval.ms", SET, "300000")]),
    ("empty metrics vs missing key → SET empty", {**SPEC, "metrics": []},
     {k: v for k, v in STORED.items() if k != "metrics"}, "update", [Op("metrics", SET, "")]),
    ("unreadable stored match → SET match", SPEC, {**STORED, "match": "garbage"}, "update",
     [Op("match", SET, "client_id=payments-.*")]),
])
def test_diff_applies_only_the_difference(case, spec, actual, action, ops):
    change = diff(desired_from_spec("ns", "x", spec), actual)

    assert (change.action, list(change.ops)) == (action, ops), case


def test_applying_the_diff_with_kafkas_rules_yields_the_desired_configs():
    desired = desired_from_spec("ns", "x", {"metrics": ["b."], "intervalMs": 100})
    change = diff(desired, STORED)

    after = cm.apply_incremental(STORED, [(op.key, cm.OP_SET if op.action == SET else cm.OP_DELETE, op.value)
                                          for op in change.ops])

    assert after == desired.configs()
    assert diff(desired, after).action == "unchanged"


def test_removal_deletes_every_key_and_an_absent_subscription_needs_nothing():
    change = removal("x", STORED)

    assert change.action == "delete"
    assert sorted(op.key for op in change.ops) == ["interval.ms", "match", "metrics"]
    assert all(op.action == DELETE for op in change.ops)
    assert cm.apply_incremental(STORED, [(op.key, cm.OP_DELETE, None) for op in change.ops]) == {}
    assert removal("x", {}).action == "unchanged"


def test_drift_message_names_what_changed():
    desired = desired_from_spec("ns", "x", {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000})

    message = drift(diff(desired, {"metrics": "org.apache.kafka.producer.", "interval.ms": "1000",
                                   "match": "client_id=evil"}))

    assert message == "interval.ms is '1000', want '60000'; match was added ('client_id=evil')"
    assert drift(diff(desired, {"metrics": "org.apache.kafka.producer."})) == "interval.ms was removed (want '60000')"
    assert drift(diff(desired, {})) == "the subscription was deleted"


def test_the_oldest_claim_owns_a_subscription_and_ties_break_by_name():
    older = Claim("a", "first", "2026-01-01T00:00:00Z")
    newer = Claim("a", "second", "2026-01-02T00:00:00Z")
    same_time = Claim("0-ns", "zzz", "2026-01-02T00:00:00Z")

    assert owner([newer, older]) == older
    assert owner([newer, same_time]) == same_time
    assert owner([]) is None
