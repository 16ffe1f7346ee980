"""The kube emulator shim: what kopf and the kubernetes client rely on from a real API server."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kube_emulator import KubeServer

CRDS = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
GROUP, VERSION, PLURAL = "kcm.dev", "v1alpha1", "clientmetricssubscriptions"


@pytest.fixture
def kube(tmp_path):
    server = KubeServer(tmp_path, CRDS)
    server.start()
    try:
        api_client = config.new_client_from_config(str(server.kubeconfig))
        yield server, client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        api_client.close()
    finally:
        server.stop()


def _subscription(name: str = "x") -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
            "metadata": {"name": name}, "spec": {"metrics": ["a."]}, "status": {"injected": True}}


def test_create_sets_server_metadata_answers_201_and_ignores_status(kube):
    _, custom, _ = kube

    _, code, _ = custom.create_namespaced_custom_object_with_http_info(GROUP, VERSION, "ns", PLURAL, _subscription())
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")

    assert code == 201
    meta = obj["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z") and meta["namespace"] == "ns"
    assert "status" not in obj


def test_spec_changes_bump_generation_and_status_goes_only_through_its_subresource(kube):
    _, custom, _ = kube
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, _subscription())

    custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ns", PLURAL, "x",
                                                 {"status": {"phase": "ok"}, "spec": {"metrics": ["evil."]}})
    status_only = custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")
    custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x",
                                          {"spec": {"metrics": ["b."]}, "status": {"phase": "forged"}})
    updated = custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")

    assert status_only["status"] == {"phase": "ok"} and status_only["spec"]["metrics"] == ["a."]
    assert status_only["metadata"]["generation"] == 1
    assert status_only["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert updated["spec"]["metrics"] == ["b."] and updated["status"] == {"phase": "ok"}
    assert updated["metadata"]["generation"] == 2
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]


def test_json_patch_with_a_stale_resource_version_test_is_refused_with_422(kube):
    _, custom, _ = kube
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, _subscription())
    custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x", {"metadata": {"labels": {"a": "b"}}})
    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
             {"op": "add", "path": "/metadata/finalizers", "value": ["kcm.dev/subscription"]}]

    with pytest.raises(ApiException) as refused:  # a list body is sent as application/json-patch+json
        custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x", stale)

    assert refused.value.status == 422
    assert "finalizers" not in custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")["metadata"]


def test_a_racing_json_patch_is_made_by_the_other_client_first_and_refused_with_422_once(kube):
    server, custom, _ = kube
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, _subscription())
    server.emulator.racing_json_patches.add((PLURAL, "ns", "x"))
    add = [{"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
           {"op": "add", "path": "/metadata/finalizers", "value": ["kcm.dev/subscription"]}]

    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x", add)
    raced = custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")
    relabelled = [{"op": "test", "path": "/metadata/resourceVersion", "value": raced["metadata"]["resourceVersion"]},
                  {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x", relabelled)

    assert refused.value.status == 422 and "resourceVersion" in refused.value.body
    assert raced["metadata"]["finalizers"] == ["kcm.dev/subscription"]
    assert int(raced["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")["metadata"]["labels"] == {"a": "b"}
    assert not server.emulator.racing_json_patches


def test_finalizers_hold_deletion_until_removed(kube):
    server, custom, _ = kube
    custom.create_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL,
                                           {**_subscription(), "metadata": {"name": "x", "finalizers": ["f"]}})

    custom.delete_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")
    marked = custom.get_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x")
    custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x", {"metadata": {"finalizers": None}})

    assert marked["metadata"]["deletionTimestamp"]
    assert server.objects(PLURAL) == {}


def test_generate_name_works_every_time(kube):
    server, _, core = kube
    event = {"metadata": {"generateName": "x."}, "reason": "Applied", "message": "m",
             "involvedObject": {"name": "x", "namespace": "ns"}}

    first = core.create_namespaced_event("ns", event)
    second = core.create_namespaced_event("ns", event)

    assert first.metadata.name != second.metadata.name
    assert set(server.objects("events", "ns")) == {first.metadata.name, second.metadata.name}


def test_request_history_stays_bounded(kube):
    server, custom, _ = kube
    custom.create_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, _subscription())
    for interval in range(100, 160):
        custom.patch_namespaced_custom_object(GROUP, VERSION, "ns", PLURAL, "x", {"spec": {"intervalMs": interval}})

    assert len(server.emulator._requests) <= 20
    assert len(server.emulator.objects[f"{GROUP}/{VERSION}/{PLURAL}", "ns", "x"].history) <= 2
