"""What a platform team installing the chart relies on, beside tests/test_chart.py: Services, monitors,
budgets and autoscalers that reach the pods they are for, probes on ports that exist, every Secret mounted read-only
where the docs say, values that reach the manifests, and the CRDs' defaults and columns.

Rendering only (helm template) and the CRD files: each test takes well under a second or two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kcm_operator import schema
import test_chart
from test_chart import CHART, Manifest, find, one, render, rendered, run_helm

helm = test_chart.helm   # the fixture

ROOT = Path(__file__).resolve().parents[1]
CRDS = schema.load_crds(ROOT / "crds")
ROLLUP = ("rollup.enabled=true", "rollup.output=s3a://b/p")
# Everything on that this file checks: both monitors, the PDB, the rollup, a Kafka client config and a CA, Secret
# mounts for the bridge and the rollup.
EVERYTHING = (*ROLLUP, "operator.serviceMonitor.enabled=true", "bridge.serviceMonitor.enabled=true",
              "kafka.clientConfig.existingSecret=kafka-client", "kafka.tlsSecrets={kafka-ca}",
              "bridge.secretMounts={collector-token}", "rollup.secretMounts={otel-ca}")


def _pod(deployment: Manifest) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# --- the objects that point at pods or Services find exactly theirs ------------------------------------------


def test_each_service_selects_the_pods_of_its_own_deployment_only_and_targets_its_metrics_port(helm: Path) -> None:
    manifests = render(helm, sets=EVERYTHING)
    deployments = find(manifests, "Deployment")
    for component in ("operator", "bridge"):
        service = one(manifests, "Service", f"-{component}-metrics")
        selected = [d["metadata"]["name"] for d in deployments
                    if _selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert selected == [one(manifests, "Deployment", f"-{component}")["metadata"]["name"]], (component, selected)
        container = _pod(one(manifests, "Deployment", f"-{component}"))["containers"][0]
        (port,) = service["spec"]["ports"]
        (target,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
        # The port the component serves /metrics on, as its command line says.
        assert f"--metrics-port={target['containerPort']}" in container["args"], (component, target)


def test_each_service_monitor_selects_its_components_service_and_scrapes_a_port_it_has(helm: Path) -> None:
    manifests = render(helm, sets=EVERYTHING)
    services = find(manifests, "Service")
    for component in ("operator", "bridge"):
        monitor = one(manifests, "ServiceMonitor", f"-{component}")
        selector = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services if _selects(selector, s["metadata"]["labels"])]
        assert [s["metadata"]["name"] for s in selected] == [
            one(manifests, "Service", f"-{component}-metrics")["metadata"]["name"]], component
        names = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= names, component


def test_the_disruption_budget_and_the_autoscaler_act_on_the_bridge_deployment_only(helm: Path) -> None:
    manifests = render(helm, sets=("bridge.autoscaling.enabled=true",))
    bridge = one(manifests, "Deployment", "-bridge")
    budget = one(manifests, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    covered = [d["metadata"]["name"] for d in find(manifests, "Deployment")
               if _selects(budget, d["spec"]["template"]["metadata"]["labels"])]
    assert covered == [bridge["metadata"]["name"]]
    assert _selects(bridge["spec"]["selector"]["matchLabels"], bridge["spec"]["template"]["metadata"]["labels"])
    target = one(manifests, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment",
                                                                      bridge["metadata"]["name"])


def test_selectors_hold_only_the_labels_an_upgrade_keeps(helm: Path) -> None:
    # A Deployment's selector is immutable: a label that changes with the chart version or commonLabels in it makes
    # `helm upgrade` fail; every selector is name, instance and component only.
    manifests = render(helm, sets=(*EVERYTHING, "commonLabels.team=observability"))
    stable = {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
    selectors = [(m["kind"], m["spec"]["selector"]["matchLabels"]) for m in manifests
                 if m["kind"] in ("Deployment", "PodDisruptionBudget", "ServiceMonitor")]
    selectors += [("Service", s["spec"]["selector"]) for s in find(manifests, "Service")]
    assert len(selectors) == 7
    for kind, selector in selectors:
        assert set(selector) == stable, (kind, selector)


# --- probes ---------------------------------------------------------------------------------------------------


def test_every_probe_uses_a_port_its_container_declares_and_carries_the_probe_values(helm: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    sets = ("operator.livenessProbe.timeoutSeconds=7", "bridge.livenessProbe.periodSeconds=31",
            "bridge.readinessProbe.failureThreshold=9")
    manifests = render(helm, sets=sets)
    expected = {("operator", "livenessProbe"): {**values["operator"]["livenessProbe"], "timeoutSeconds": 7},
                ("bridge", "livenessProbe"): {**values["bridge"]["livenessProbe"], "periodSeconds": 31},
                ("bridge", "readinessProbe"): {**values["bridge"]["readinessProbe"], "failureThreshold": 9}}
    for (component, kind), settings in expected.items():
        container = _pod(one(manifests, "Deployment", f"-{component}"))["containers"][0]
        probe = container[kind]
        declared = {p["name"]: p["containerPort"] for p in container["ports"]}
        port = probe["httpGet"]["port"]
        assert port in declared or port in declared.values(), (component, kind, port, declared)
        assert {k: v for k, v in probe.items() if k != "httpGet"} == settings, (component, kind)


# --- Secrets: mounted read-only, where the docs say, by the containers that use them ---------------------------


def _secret_mounts(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Secret name -> its volume mount."""
    by_volume = {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}
    return {by_volume[m["name"]]: m for m in mounts if m["name"] in by_volume}


def test_every_secret_is_mounted_read_only_at_its_documented_path_in_every_pod_that_needs_it(helm: Path) -> None:
    manifests = render(helm, sets=EVERYTHING)
    kafka = {"kafka-client": "/etc/kcm/kafka/client", "kafka-ca": "/etc/kcm/kafka/kafka-ca"}
    pods = {}
    for component in ("operator", "bridge"):
        pod = _pod(one(manifests, "Deployment", f"-{component}"))
        pods[component] = (pod["volumes"], pod["containers"][0]["volumeMounts"])
    template = one(manifests, "ScheduledSparkApplication")["spec"]["template"]
    for role in ("driver", "executor"):
        pods[f"rollup {role}"] = (template["volumes"], template[role]["volumeMounts"])
    expected = {"operator": kafka, "bridge": {**kafka, "collector-token": "/etc/kcm/secrets/collector-token"},
                # The driver runs the OTLP export; both read Kafka.
                "rollup driver": {**kafka, "otel-ca": "/etc/kcm/secrets/otel-ca"}, "rollup executor": kafka}
    for where, (volumes, mounts) in pods.items():
        mounted = _secret_mounts(volumes, mounts)
        assert {name: m["mountPath"] for name, m in mounted.items()} == expected[where], where
        assert all(m.get("readOnly") is True for m in mounted.values()), where
        assert all("defaultMode" not in v["secret"] for v in volumes if "secret" in v), where


def test_the_bridge_reads_its_config_from_the_rendered_config_map(helm: Path) -> None:
    manifests = rendered(helm)
    pod = _pod(one(manifests, "Deployment", "-bridge"))
    container = pod["containers"][0]
    (config_path,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--config=")]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == one(manifests, "ConfigMap", "-bridge")["metadata"]["name"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert config_path == f"{mount['mountPath']}/bridge.yaml" and mount["readOnly"] is True


# --- values reach the manifests -------------------------------------------------------------------------------


def test_extra_environment_reaches_every_component(helm: Path) -> None:
    entry = {"name": "EXTRA", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    sets = [*ROLLUP]
    for component in ("operator", "bridge", "rollup"):
        sets += [f"{component}.env[0].name=EXTRA", f"{component}.env[0].valueFrom.secretKeyRef.name=s",
                 f"{component}.env[0].valueFrom.secretKeyRef.key=k"]
    manifests = render(helm, sets=tuple(sets))
    for component in ("operator", "bridge"):
        assert entry in _pod(one(manifests, "Deployment", f"-{component}"))["containers"][0]["env"], component
    template = one(manifests, "ScheduledSparkApplication")["spec"]["template"]
    assert template["driver"]["env"] == template["executor"]["env"] == [entry]


def test_the_bridge_grace_period_is_the_one_the_drain_check_was_made_against(helm: Path) -> None:
    pod = _pod(one(render(helm, sets=("bridge.terminationGracePeriodSeconds=120",
                                      "bridge.config.delivery.shutdown_timeout_s=100")), "Deployment", "-bridge"))
    assert pod["terminationGracePeriodSeconds"] == 120


def test_the_rollup_schedule_settings_reach_the_scheduled_spark_application(helm: Path) -> None:
    spec = one(render(helm, sets=(*ROLLUP, "rollup.suspend=true", "rollup.concurrencyPolicy=Replace",
                                  "rollup.successfulRunHistoryLimit=5", "rollup.failedRunHistoryLimit=7")),
               "ScheduledSparkApplication")["spec"]
    assert (spec["suspend"], spec["concurrencyPolicy"], spec["successfulRunHistoryLimit"],
            spec["failedRunHistoryLimit"]) == (True, "Replace", 5, 7)
    # By default a run never overlaps the one before (re-runs replace whole windows).
    assert one(render(helm, sets=ROLLUP), "ScheduledSparkApplication")["spec"]["concurrencyPolicy"] == "Forbid"


def test_an_image_digest_pins_every_pod_to_it(helm: Path) -> None:
    # A digest is what makes a rollback run the very image it ran before.
    digest = "sha256:" + "a" * 64
    manifests = render(helm, sets=(*ROLLUP, f"image.digest={digest}", f"rollup.image.digest={digest}"))
    for component in ("operator", "bridge"):
        image = _pod(one(manifests, "Deployment", f"-{component}"))["containers"][0]["image"]
        assert image == f"ghcr.io/kcm-dev/kcm@{digest}", component
    assert one(manifests, "ScheduledSparkApplication")["spec"]["template"]["image"] == \
        f"ghcr.io/kcm-dev/kcm-spark@{digest}"


def test_default_memory_limits_are_not_below_the_requests(helm: Path) -> None:
    # The API server refuses a container whose limit is below its request: the install would fail.
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for deployment in find(rendered(helm), "Deployment"):
        resources = _pod(deployment)["containers"][0]["resources"]
        request, limit = (resources[k]["memory"] for k in ("requests", "limits"))
        assert int(limit[:-2]) * units[limit[-2:]] >= int(request[:-2]) * units[request[-2:]], deployment["metadata"]


# --- security contexts and RBAC, exactly ----------------------------------------------------------------------

POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "allowPrivilegeEscalation": False,
                      "privileged": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                      "seccompProfile": {"type": "RuntimeDefault"}}


def test_every_pod_runs_as_uid_and_gid_10001_never_the_root_group(helm: Path) -> None:
    manifests = render(helm, sets=ROLLUP)
    for component in ("operator", "bridge"):
        pod = _pod(one(manifests, "Deployment", f"-{component}"))
        assert pod["securityContext"] == POD_SECURITY, component
        assert pod["containers"][0]["securityContext"] == CONTAINER_SECURITY, component
    template = one(manifests, "ScheduledSparkApplication")["spec"]["template"]
    for role in ("driver", "executor"):
        assert template[role]["podSecurityContext"] == POD_SECURITY, role
        assert template[role]["securityContext"] == CONTAINER_SECURITY, role


def _rules(role: Manifest) -> set[tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]]:
    return {(tuple(r["apiGroups"]), tuple(r["resources"]), frozenset(r["verbs"])) for r in role["rules"]}


RECONCILE_RULES = {
    (("kcm.dev",), ("clientmetricssubscriptions",), frozenset({"get", "list", "watch", "patch"})),
    (("kcm.dev",), ("clientmetricssubscriptions/status",), frozenset({"patch"})),
    (("kcm.dev",), ("clientmetricssubscriptions/finalizers",), frozenset({"update"})),
    (("kcm.dev",), ("kafkaconnections",), frozenset({"get", "list", "watch"})),
    (("kcm.dev",), ("kafkaconnections/status",), frozenset({"patch"})),
    (("",), ("events",), frozenset({"create"})),
}
CRD_RULES = {(("apiextensions.k8s.io",), ("customresourcedefinitions",), frozenset({"list", "watch"}))}
# kopf lists and watches namespaces only to follow those it watches by name, never cluster-wide (observation.py).
DISCOVERY_RULES = CRD_RULES | {(("",), ("namespaces",), frozenset({"list", "watch"}))}
PEERING = frozenset({"get", "list", "watch", "patch"})


def test_the_operator_gets_exactly_the_rules_it_needs_in_each_mode(helm: Path) -> None:
    cluster_wide = render(helm, sets=("operator.peering.enabled=true", "operator.replicas=2"))
    assert _rules(one(cluster_wide, "ClusterRole", "-operator")) == RECONCILE_RULES | CRD_RULES | {
        (("kopf.dev",), ("clusterkopfpeerings",), PEERING)}
    namespaced = rendered(helm, "ci/namespaced-values.yaml")
    assert _rules(one(namespaced, "ClusterRole", "-discovery")) == DISCOVERY_RULES
    roles = find(namespaced, "Role", "-operator")
    assert len(roles) == 2
    for role in roles:
        assert _rules(role) == RECONCILE_RULES | {(("kopf.dev",), ("kopfpeerings",), PEERING)}, role["metadata"]


def test_the_spark_driver_manages_its_executors_and_reads_no_secrets(helm: Path) -> None:
    role = one(render(helm, sets=ROLLUP), "Role", "-rollup-driver")
    assert _rules(role) == {(("",), ("pods", "services", "configmaps", "persistentvolumeclaims"),
                             frozenset({"create", "get", "list", "watch", "delete", "deletecollection"}))}


# --- the bridge's config guard --------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Cookie", "x-amz-signature"])
def test_a_cookie_or_signature_header_inline_in_the_bridge_config_is_refused(helm: Path, tmp_path: Path,
                                                                            header: str) -> None:
    
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"bridge": {"config": {"endpoints": [{"endpoint": "c:4317",
                                                                          "headers": {header: "S3CRET"}}]}}}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(values))
    assert result.returncode != 0 and f"headers.{header} would put a credential into a ConfigMap" in result.stderr
    assert "S3CRET" not in result.stdout + result.stderr


# --- the CRDs -------------------------------------------------------------------------------------------------


def test_both_kinds_are_namespaced_as_the_operators_roles_and_secret_references_assume() -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert yaml.safe_load(path.read_text())["spec"]["scope"] == "Namespaced", path.name


def test_kafka_connection_defaults_are_the_operators_fallbacks_and_verify_hostnames() -> None:
    # The API server fills these in before the operator reads the spec: they must be what connections.py falls back
    # to and what docs name, and never turn hostname verification off.
    spec = {"bootstrapServers": "k:9093", "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds"}},
            "tls": {"caSecretRef": {"name": "ca"}, "clientCertSecretRef": {"name": "client"}}}
    filled = schema.apply_defaults(CRDS[schema.CONNECTION_KIND].schema, {"spec": spec})["spec"]
    assert filled["sasl"]["secretRef"] == {"name": "creds", "usernameKey": "username", "passwordKey": "password"}
    assert filled["tls"] == {"caSecretRef": {"name": "ca", "key": "ca.crt"},
                             "clientCertSecretRef": {"name": "client", "certKey": "tls.crt", "keyKey": "tls.key"},
                             "verifyHostname": True}
    bare = schema.apply_defaults(CRDS[schema.CONNECTION_KIND].schema, {"spec": {"bootstrapServers": "k:9092"}})
    assert bare["spec"]["securityProtocol"] == "PLAINTEXT"


def test_a_client_certificate_without_a_secret_name_is_refused() -> None:
    connection = {"apiVersion": schema.API_VERSION, "kind": schema.CONNECTION_KIND,
                  "metadata": {"name": "c", "namespace": "ns"},
                  "spec": {"bootstrapServers": "k:9093", "securityProtocol": "SSL",
                           "tls": {"clientCertSecretRef": {"certKey": "tls.crt"}}}}
    problems = schema.validate(connection, crds=CRDS)
    assert any(p.startswith("spec.tls.clientCertSecretRef: 'name' is a required property") for p in problems), problems


def test_printer_columns_show_why_a_subscription_is_not_ready_and_where_a_connection_points() -> None:
    def columns(name: str) -> dict[str, str]:
        crd = yaml.safe_load((ROOT / "crds" / name).read_text())
        return {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}

    assert columns("clientmetricssubscriptions.kcm.dev.yaml")["Reason"] == \
        '.status.conditions[?(@.type=="Ready")].reason'
    assert columns("kafkaconnections.kcm.dev.yaml") == {"Bootstrap": ".spec.bootstrapServers",
                                                        "Protocol": ".spec.securityProtocol",
                                                        "Cluster": ".status.clusterId",
                                                        "Ready": '.status.conditions[?(@.type=="Ready")].status',
                                                        "Reason": '.status.conditions[?(@.type=="Ready")].reason',
                                                        "Age": ".metadata.creationTimestamp"}


# --- endpoints the kubelet can probe --------------------------------------------------------------------------


# Every spelling of a loopback address Python's ipaddress (and so kcm's --listen-address) accepts.
_LOOPBACKS = ("127.0.0.1", "127.1.2.3", "::1", "0:0:0:0:0:0:0:1", "::0:1", "0000::0001", "::ffff:127.0.0.1",
              "::FFFF:7F00:1", "0:0:0:0:0:ffff:7f12:3456", "::0.0.0.1", "0:0:0:0:0:0:0.0.0.1", "::1%1")


@pytest.mark.parametrize("setting", ["operator.listenAddress", "bridge.config.metrics_host"])
@pytest.mark.parametrize("address", _LOOPBACKS)
def test_a_loopback_listen_address_is_refused_since_the_kubelet_probes_the_pods_ip(helm: Path, setting: str,
                                                                                  address: str) -> None:
    # An operator or bridge listening on loopback only would be restarted after every failed liveness probe (and
    # the bridge never ready), and Prometheus could not scrape it.
    import ipaddress

    parsed = ipaddress.ip_address(address.partition("%")[0])
    assert (getattr(parsed, "ipv4_mapped", None) or parsed).is_loopback
    result = run_helm(helm, "template", "kcm", str(CHART), "--set-string", f"{setting}={address}")
    assert result.returncode != 0 and setting.split(".")[-1] in result.stderr, result.stdout[-300:]


@pytest.mark.parametrize("address", ["::", "::10", "::1:1", "1::1", "fe80::1", "::ffff:10.0.0.1", "::ffff:a00:1",
                                     "10.127.0.1", "::0.0.0.2", "::ffff:7f00:1:0:0"])
def test_an_address_that_only_looks_like_loopback_renders(helm: Path, address: str) -> None:
    result = run_helm(helm, "template", "kcm", str(CHART), "--set-string", f"operator.listenAddress={address}",
                      "--set-string", f"bridge.config.metrics_host={address}")
    assert result.returncode == 0, result.stderr


def test_a_listen_address_on_every_interface_renders(helm: Path) -> None:
    manifests = render(helm, sets=("operator.listenAddress=::", "bridge.config.metrics_host=::"))
    assert "--listen-address=::" in _pod(one(manifests, "Deployment", "-operator"))["containers"][0]["args"]


def test_real_world_names_labels_and_references_pass_the_schemas_checks(helm: Path) -> None:
    # The schema refuses malformed names, labels and image references: these well-formed ones must still install.
    manifests = render(helm, sets=(
        "rollup.enabled=true", "rollup.output=s3a://b/kcm",
        r"rollup.sparkConf.spark\.kubernetes\.driver\.annotation\.example\.com/owner=obs",
        "image.repository=[2001:db8::1]:5000/kcm/kcm", "rollup.image.repository=My-Registry.example:443/spark_x/kcm",
        r"commonLabels.app\.kubernetes\.io/team=obs.core", r"bridge.podLabels.example\.com/tier=",
        r"bridge.serviceAccount.annotations.eks\.amazonaws\.com/role-arn=arn:aws:iam::1:role/kcm bridge",
        "operator.priorityClassName=system-cluster-critical", "nameOverride=kcm2", "fullnameOverride=",
        "bridge.serviceAccount.name=kcm.bridge"))
    deployment = one(manifests, "Deployment", "-bridge")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].startswith("[2001:db8::1]:5000/kcm/kcm:")
    app = one(manifests, "ScheduledSparkApplication")
    assert app["spec"]["template"]["sparkConf"]["spark.kubernetes.driver.annotation.example.com/owner"] == "obs"
