"""The operator's pure steps: a subscription's spec against what Kafka holds (reconcile.py: Java's trim, an empty
`match`, drift wording, deletion order, claims of one name) and manifests read from files (manifests.py: JSON in a
directory, document numbers, list indexes, someone else's group, duplicates, the default namespace). Found by a
mutation review (27) to guard what the slower operator tests let through."""

from __future__ import annotations

from pathlib import Path

import pytest


# --- operator/kcm_operator/reconcile.py ---------------------------------------------------------------------------


def test_metrics_are_trimmed_of_exactly_what_javas_trim_strips():
    from kcm_operator.reconcile import desired_from_spec, diff

    # String.trim() strips every char <= U+0020 (control characters too) and nothing above (not U+00A0).
    desired = desired_from_spec("ns", "app", {"metrics": ["x.\x01", "y.\u00a0"], "intervalMs": 1000})

    assert desired.metrics == ("x.", "y.\u00a0")
    assert diff(desired, {"metrics": "x.,y.\u00a0", "interval.ms": "1000"}).action == "unchanged"


def test_an_empty_match_kafka_holds_is_deleted_when_the_spec_has_none():
    from kcm_operator.reconcile import DELETE, Op, desired_from_spec, diff

    desired = desired_from_spec("ns", "app", {"metrics": ["x."], "intervalMs": 1000})

    assert diff(desired, {"metrics": "x.", "interval.ms": "1000", "match": ""}).ops == (Op("match", DELETE),)


def test_drift_says_a_key_emptied_outside_kcm_is_empty_not_removed():
    from kcm_operator.reconcile import desired_from_spec, diff, drift

    desired = desired_from_spec("ns", "app", {"metrics": ["x."], "intervalMs": 1000})

    assert drift(diff(desired, {"metrics": "", "interval.ms": "1000"})) == "metrics is '', want 'x.'"


def test_removal_deletes_keys_in_name_order_whatever_order_kafka_lists_them():
    from kcm_operator.reconcile import removal

    change = removal("x", {"metrics": "a.", "match": "client_id=a", "interval.ms": "1000"})

    assert change.describe() == "subscription x: delete (-interval.ms, -match, -metrics)"


def test_claims_of_one_name_created_in_the_same_second_are_ordered_by_uid_whatever_the_input_order():
    from kcm_operator.reconcile import Claim, owner

    first = Claim("a", "same", "2026-01-01T00:00:00Z", uid="1111")
    second = Claim("a", "same", "2026-01-01T00:00:00Z", uid="2222", deleting=True)

    assert owner([first, second]).uid == owner([second, first]).uid == "1111"


# --- operator/kcm_operator/manifests.py ---------------------------------------------------------------------------


def _subscription_yaml(name: str, spec: str = "metrics: [x.]\n", api: str = "kcm.dev/v1alpha1",
                       kind: str = "ClientMetricsSubscription") -> str:
    return (f"apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: team\nspec:\n"
            + "".join(f"  {line}\n" for line in spec.splitlines()))


def test_a_directory_holding_json_manifests_is_read():
    import json
    import tempfile

    from kcm_operator import manifests

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "payments.json").write_text(json.dumps({
            "apiVersion": "kcm.dev/v1alpha1", "kind": "ClientMetricsSubscription",
            "metadata": {"name": "payments", "namespace": "team"}, "spec": {"metrics": ["x."]}}))
        found = manifests.subscriptions(manifests.load([tmp]))

    assert [desired.name for _, desired in found] == ["team.payments"]


def test_documents_are_numbered_from_one_in_their_source(tmp_path):
    from kcm_operator import manifests

    path = tmp_path / "two.yaml"
    path.write_text(_subscription_yaml("a") + "---\n" + _subscription_yaml("b"))

    assert [manifest.source for manifest in manifests.load([path])] == [f"{path}#1", f"{path}#2"]


def test_a_group_that_only_starts_with_kcms_is_someone_elses_and_left_alone(tmp_path):
    from kcm_operator import manifests

    path = tmp_path / "mixed.yaml"
    path.write_text(_subscription_yaml("mine") + "---\n"
                    + _subscription_yaml("theirs", "anything: [1]\n", api="kcm.devops.example.com/v1", kind="Pipeline"))

    assert [desired.name for _, desired in manifests.subscriptions(manifests.load([path]))] == ["team.mine"]


def test_every_duplicate_of_a_subscription_names_its_first_definition(tmp_path):
    from kcm_operator import manifests
    from kcm_operator.errors import InvalidSpecError

    path = tmp_path / "dup.yaml"
    path.write_text("---\n".join(_subscription_yaml(name, "subscriptionName: shared\nmetrics: [x.]\n")
                                 for name in ("one", "two", "three")))

    with pytest.raises(InvalidSpecError) as error:
        manifests.subscriptions(manifests.load([path]))
    assert str(error.value).count("is already defined by ClientMetricsSubscription team/one") == 2


def test_each_item_of_a_list_is_named_by_its_index(tmp_path):
    import json

    from kcm_operator import manifests

    items = [{"apiVersion": "kcm.dev/v1alpha1", "kind": "ClientMetricsSubscription",
              "metadata": {"name": name, "namespace": "team"}, "spec": {"metrics": ["x."]}} for name in ("a", "b")]
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    assert [manifest.source for manifest in manifests.load([path])] == [f"{path}[0]", f"{path}[1]"]


def test_a_manifest_without_a_namespace_is_referred_to_in_default():
    from kcm_operator.manifests import Manifest

    manifest = Manifest("subs.yaml", {"kind": "ClientMetricsSubscription", "metadata": {"name": "payments"}})

    assert manifest.ref == "ClientMetricsSubscription default/payments (subs.yaml)"
