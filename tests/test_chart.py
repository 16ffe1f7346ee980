"""The Helm chart, rendered by the real helm v4 binary and checked against Kubernetes' own schemas.

`python tests/test_chart.py --write-readme` regenerates the values table in the chart's README.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kcm_bridge.config import load as load_bridge_config
from kcm_cli.main import build_parser
from kcm_common.errors import UserError

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "kafka-client-metrics"
# The oldest and newest Kubernetes the chart supports (Chart.yaml kubeVersion; kubernetes-validate's newest).
KUBE_VERSIONS = ("1.29.0", "1.37.0")
# APIs of the optional CRDs (Prometheus Operator, Spark operator, kopf): present, the chart renders those parts.
OPTIONAL_APIS = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
                 "monitoring.coreos.com/v1/PrometheusRule",
                 "sparkoperator.k8s.io/v1beta2", "sparkoperator.k8s.io/v1beta2/ScheduledSparkApplication",
                 "kopf.dev/v1")
# Groups whose kinds kubernetes-validate has no schema for; a built-in kind without a schema is a failure.
CUSTOM_GROUPS = {"kcm.dev", "monitoring.coreos.com", "sparkoperator.k8s.io", "kopf.dev"}
# Values files: the defaults, and the chart-testing style ci/*-values.yaml (everything on, namespaced, SASL).
VALUES_FILES = (None, "ci/all-values.yaml", "ci/namespaced-values.yaml", "ci/sasl-values.yaml")
README_BEGIN, README_END = "<!-- values:begin -->", "<!-- values:end -->"

Manifest = dict[str, Any]


def _load_fetch_helm() -> Any:
    spec = importlib.util.spec_from_file_location("fetch_helm", REPO / "tools" / "fetch_helm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def helm() -> Path:
    return _load_fetch_helm().fetch_helm()


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)


def render(helm: Path, values_file: str | None = None, *, kube: str = KUBE_VERSIONS[-1],
           apis: tuple[str, ...] = OPTIONAL_APIS, sets: tuple[str, ...] = (), release: str = "kcm") -> list[Manifest]:
    args = ["template", release, str(CHART), "--namespace", "kcm", "--include-crds", "--kube-version", kube]
    for api in apis:
        args += ["--api-versions", api]
    if values_file:
        args += ["--values", str(CHART / values_file)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.lru_cache(maxsize=None)
def _cached_render(helm: Path, values_file: str | None, kube: str) -> tuple[Manifest, ...]:
    return tuple(render(helm, values_file, kube=kube))


def rendered(helm: Path, values_file: str | None = None, kube: str = KUBE_VERSIONS[-1]) -> list[Manifest]:
    """A render shared between tests (deep-copied, so a test may change it)."""
    return copy.deepcopy(list(_cached_render(helm, values_file, kube)))


def find(manifests: list[Manifest], kind: str, name_suffix: str = "") -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)]


def one(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = find(manifests, kind, name_suffix)
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {[m['metadata']['name'] for m in found]}"
    return found[0]


# --- security rules ------------------------------------------------------------------------------------------


def _pod_specs(manifest: Manifest) -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(where, pod-level settings, containers) of every pod a manifest would run."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec = manifest["spec"]["template"]["spec"]
        yield f"{kind}/{name}", spec, spec["containers"] + spec.get("initContainers", [])
    elif kind == "ScheduledSparkApplication":
        template = manifest["spec"]["template"]
        for role in ("driver", "executor"):
            pod = template[role]
            settings = {"securityContext": pod.get("podSecurityContext", {}), "volumes": template.get("volumes", [])}
            container = {"name": role, "image": template["image"], "securityContext": pod.get("securityContext", {}),
                         "resources": {"requests": {"cpu": pod.get("cores"), "memory": pod.get("memory")}}}
            yield f"{kind}/{name} {role}", settings, [container]


def security_findings(manifests: list[Manifest]) -> list[str]:
    """What breaks kcm's pod security rules, one line each; empty when all is well."""
    findings = []
    for manifest in manifests:
        for where, pod, containers in _pod_specs(manifest):
            pod_security = pod.get("securityContext", {})
            if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
                findings.append(f"{where}: shares a host namespace")
            if any("hostPath" in volume for volume in pod.get("volumes", [])):
                findings.append(f"{where}: mounts a hostPath volume")
            if pod_security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                findings.append(f"{where}: pod seccomp profile is not RuntimeDefault")
            for container in containers:
                at = f"{where} container {container['name']}"
                security = container.get("securityContext", {})
                if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
                    findings.append(f"{at}: may run as root")
                if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
                    findings.append(f"{at}: runs as UID 0")
                if security.get("readOnlyRootFilesystem") is not True:
                    findings.append(f"{at}: root filesystem is writable")
                if security.get("allowPrivilegeEscalation") is not False:
                    findings.append(f"{at}: privilege escalation allowed")
                if security.get("privileged"):
                    findings.append(f"{at}: privileged")
                if security.get("capabilities", {}).get("drop") != ["ALL"] or security["capabilities"].get("add"):
                    findings.append(f"{at}: capabilities not dropped to none")
                resources = container.get("resources", {})
                if not resources.get("requests", {}).get("memory") or not resources.get("requests", {}).get("cpu"):
                    findings.append(f"{at}: no cpu/memory requests")
                image = container["image"]
                tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
                if "@sha256:" not in image and tag in ("", "latest"):
                    findings.append(f"{at}: image {image} is not pinned")
        if manifest["kind"] in ("Role", "ClusterRole"):
            for rule in manifest["rules"]:
                if "*" in rule["verbs"] + rule["resources"] + rule["apiGroups"]:
                    findings.append(f"{manifest['kind']}/{manifest['metadata']['name']}: wildcard rule {rule}")
                if "secrets" in rule["resources"] and set(rule["verbs"]) - {"get"}:
                    findings.append(f"{manifest['kind']}/{manifest['metadata']['name']}: Secrets beyond get")
        if manifest["kind"] == "Deployment":
            for container in manifest["spec"]["template"]["spec"]["containers"]:
                if not container.get("resources", {}).get("limits", {}).get("memory"):
                    findings.append(f"Deployment/{manifest['metadata']['name']}: no memory limit")
    return findings


# --- lint, render, validate ----------------------------------------------------------------------------------


def test_helm_lint_passes_for_every_values_file(helm: Path) -> None:
    for values_file in VALUES_FILES:
        args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSIONS[0]]
        if values_file:
            args += ["--values", str(CHART / values_file)]
        result = run_helm(helm, *args)
        assert result.returncode == 0, f"{values_file}: {result.stdout}{result.stderr}"


def test_chart_refuses_kubernetes_older_than_the_oldest_tested(helm: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={KUBE_VERSIONS[0]}-0"
    result = run_helm(helm, "template", "kcm", str(CHART), "--kube-version", "1.28.9")
    assert result.returncode != 0 and "kubeVersion" in result.stderr


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_every_rendered_manifest_validates_strictly(helm: Path, values_file: str | None, kube: str) -> None:
    manifests = rendered(helm, values_file, kube)
    problems = []
    for manifest in manifests:
        group = manifest["apiVersion"].rpartition("/")[0]
        what = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, kube, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            if group not in CUSTOM_GROUPS:
                problems.append(f"{what}: no schema for a built-in kind in Kubernetes {kube}")
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{what}: {exc.message} at {'.'.join(map(str, exc.path))}")
    assert not problems, "\n".join(problems)
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= {m["kind"] for m in manifests}


def test_built_in_objects_in_the_examples_validate_strictly() -> None:
    """The plain-manifest path: examples/ also carries Secrets and such; the kcm.dev ones test_crds.py checks."""
    checked = 0
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for manifest in filter(None, yaml.safe_load_all(path.read_text())):
            if manifest["apiVersion"].rpartition("/")[0] in CUSTOM_GROUPS:
                continue
            # ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from Kubernetes 1.30, as its example
            # says.
            since = ("1.30.0",) if manifest["kind"].startswith("ValidatingAdmissionPolicy") else KUBE_VERSIONS[:1]
            for kube in (*since, *KUBE_VERSIONS[1:]):
                kubernetes_validate.validate(manifest, kube, strict=True)
            checked += 1
    assert checked, "examples/ holds no built-in object (the SASL example's Secret, at least)"


def test_the_librdkafka_example_matches_every_librdkafka_based_client_it_names() -> None:
    """KIP-714 matches the full software name, and Confluent's wrappers replace librdkafka's with their own."""
    from kcm_sandbox.telemetry import matches

    example = yaml.safe_load((REPO / "examples" / "subscription-librdkafka.yaml").read_text())
    match = [("client_software_name", example["spec"]["match"]["clientSoftwareName"])]
    wrappers = ("librdkafka", "confluent-kafka-python", "confluent-kafka-go", "confluent-kafka-dotnet",
                "confluent-kafka-javascript")
    assert [name for name in wrappers if not matches(match, {"client_software_name": name})] == []
    assert not matches(match, {"client_software_name": "apache-kafka-java"})

def test_every_values_file_passes_the_security_rules(helm: Path) -> None:
    for values_file in VALUES_FILES:
        assert security_findings(rendered(helm, values_file)) == [], values_file


def test_security_rules_catch_each_violation(helm: Path) -> None:
    manifests = rendered(helm)
    bridge = one(manifests, "Deployment", "-bridge")
    pod = bridge["spec"]["template"]["spec"]
    container = pod["containers"][0]
    container["securityContext"].update(readOnlyRootFilesystem=False, allowPrivilegeEscalation=True,
                                        runAsNonRoot=False, capabilities={"add": ["NET_ADMIN"]})
    pod["securityContext"].update(runAsNonRoot=False, seccompProfile={"type": "Unconfined"})
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    container["image"] = "ghcr.io/kcm-dev/kcm:latest"
    del container["resources"]
    role = one(manifests, "Role", "-operator-secrets")
    role["rules"][0]["verbs"] = ["get", "list"]
    role["rules"].append({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]})
    found = "\n".join(security_findings([bridge, role]))
    for expected in ("host namespace", "hostPath", "seccomp", "may run as root", "root filesystem is writable",
                     "privilege escalation", "capabilities", "no cpu/memory requests", "not pinned", "memory limit",
                     "wildcard rule", "Secrets beyond get"):
        assert expected in found


def test_chart_crds_are_identical_to_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert top, "no CRDs in crds/"
    assert chart == top, "charts/kafka-client-metrics/crds/ differs from crds/: copy crds/*.yaml into it"


def test_defaults_render_operator_and_bridge_without_the_optional_parts(helm: Path) -> None:
    manifests = render(helm, apis=())
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"ServiceMonitor", "ScheduledSparkApplication", "ClusterKopfPeering", "KopfPeering",
                        "HorizontalPodAutoscaler"}
    operator = one(manifests, "Deployment", "-operator")
    assert operator["spec"]["replicas"] == 1 and operator["spec"]["strategy"] == {"type": "Recreate"}
    pod = operator["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                                  {"name": "healthz", "containerPort": 8080, "protocol": "TCP"}]
    assert container["args"][:1] == ["operator"]
    assert {"--all-namespaces", "--metrics-port=9090", "--liveness-port=8080", "--standalone"} <= set(container["args"])
    assert "--bootstrap-server=my-cluster-kafka-bootstrap.kafka:9092" in container["args"]
    assert pod["automountServiceAccountToken"] is True
    # kopf would otherwise look uid 10001 up in the image's passwd to name the replica.
    assert container["env"][0] == {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    bridge = one(manifests, "Deployment", "-bridge")
    bridge_pod = bridge["spec"]["template"]["spec"]
    assert bridge["spec"]["replicas"] == 2 and bridge_pod["automountServiceAccountToken"] is False
    assert bridge_pod["containers"][0]["args"] == ["bridge", "--log-level=INFO", "--config=/etc/kcm/bridge/bridge.yaml",
                                                   "--metrics-port=9464"]
    for account in find(manifests, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    # A bridge not ready (Kafka unreachable: never restarted, as liveness is its loop's) must not block node drains.
    assert one(manifests, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": one(manifests, "PodDisruptionBudget")["spec"]["selector"]}
    assert one(manifests, "Service", "-bridge-metrics")["spec"]["ports"][0]["port"] == 9464
    probes = bridge_pod["containers"][0]
    assert (probes["livenessProbe"]["httpGet"]["path"], probes["readinessProbe"]["httpGet"]["path"]) == \
        ("/healthz", "/readyz")


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_the_kcm_command_accepts_every_rendered_argument_list(helm: Path, values_file: str | None) -> None:
    parser = build_parser()
    deployments = find(rendered(helm, values_file), "Deployment")
    assert {d["metadata"]["name"].rsplit("-", 1)[1] for d in deployments} == {"operator", "bridge"}
    for deployment in deployments:
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        parsed = parser.parse_args(args)
        assert parsed.command == args[0]
    operator = parser.parse_args(one(rendered(helm, values_file), "Deployment", "-operator")["spec"]["template"]
                                 ["spec"]["containers"][0]["args"])
    assert operator.standalone is (values_file not in ("ci/all-values.yaml", "ci/namespaced-values.yaml"))


def test_the_peering_lifetime_reaches_the_operator_only_with_peering(helm: Path) -> None:
    def operator_args(*sets: str) -> list[str]:
        return one(render(helm, sets=sets), "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0][
            "args"]

    peering = operator_args("operator.peering.enabled=true", "operator.peering.lifetimeSeconds=15")
    assert build_parser().parse_args(peering).peering_lifetime == 15
    assert build_parser().parse_args(operator_args("operator.peering.enabled=true")).peering_lifetime == 60
    assert not [arg for arg in operator_args("operator.peering.lifetimeSeconds=15") if "peering-lifetime" in arg]


def test_optional_parts_appear_only_with_their_api_and_toggle(helm: Path) -> None:
    everything = rendered(helm, "ci/all-values.yaml")
    assert len(find(everything, "ServiceMonitor")) == 2
    # Named after the release, not kopf's shared "default"; the replicas are told the name, so they wait for it.
    (peering,) = find(everything, "ClusterKopfPeering")
    operator_args = one(everything, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert peering["metadata"]["name"] != "default"
    assert build_parser().parse_args(operator_args).peering_name == peering["metadata"]["name"]
    hpa = one(everything, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 12)
    assert "replicas" not in one(everything, "Deployment", "-bridge")["spec"]
    app = one(everything, "ScheduledSparkApplication")
    arguments = app["spec"]["template"]["arguments"]
    assert app["spec"]["template"]["mainApplicationFile"] == "local:///opt/kcm/rollup.py"
    assert "--output=s3a://telemetry/kcm-rollups" in arguments
    # images/spark/rollup.py runs `kcm rollup ARGS`.
    parsed = build_parser().parse_args(["rollup", *arguments])
    assert (parsed.output, parsed.last, parsed.topic) == ("s3a://telemetry/kcm-rollups", "75m", "kafka-client-metrics")
    # The OTLP export's CA and token come from Secrets mounted on the driver, where the export runs.
    assert (parsed.otlp_ca_file, parsed.otlp_header_file) == ("/etc/kcm/secrets/otel-ca/ca.crt",
                                                              ["authorization=/etc/kcm/secrets/otel-token/token"])
    volumes = {v["name"]: v["secret"]["secretName"] for v in app["spec"]["template"]["volumes"] if "secret" in v}
    assert volumes == {"secret-otel-ca": "otel-ca", "secret-otel-token": "otel-token"}
    mounts = {m["name"]: m for m in app["spec"]["template"]["driver"]["volumeMounts"]}
    assert mounts["secret-otel-token"] == {"name": "secret-otel-token", "mountPath": "/etc/kcm/secrets/otel-token",
                                           "readOnly": True}
    assert not [m for m in app["spec"]["template"]["executor"]["volumeMounts"] if m["name"].startswith("secret-")]
    # Credentials for the output reach the driver and the executors (both write it) from a Secret, not sparkConf.
    s3_key = [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "rollup-s3", "key": "access-key"}}}]
    assert app["spec"]["template"]["driver"]["env"] == app["spec"]["template"]["executor"]["env"] == s3_key
    assert one(everything, "Role", "-rollup-driver")
    # The executors run as an account without a token: the driver's may create pods.
    executor_account = app["spec"]["template"]["executor"]["serviceAccount"]
    assert executor_account != app["spec"]["template"]["driver"]["serviceAccount"]
    assert one(everything, "ServiceAccount", "-rollup-executor")["metadata"]["name"] == executor_account
    assert one(everything, "ServiceAccount", "-rollup-executor")["automountServiceAccountToken"] is False
    # Workload identity binds a cloud role per account: every account a Spark pod runs as carries the annotation.
    role = "eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/kcm-rollup"
    identified = render(helm, sets=("rollup.enabled=true", "rollup.output=s3a://b/p",
                                    f"rollup.serviceAccount.annotations.{role}"))
    template = one(identified, "ScheduledSparkApplication")["spec"]["template"]
    accounts = {m["metadata"]["name"]: m for m in find(identified, "ServiceAccount")}
    for pod in ("driver", "executor"):
        annotations = accounts[template[pod]["serviceAccount"]]["metadata"].get("annotations")
        assert annotations == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/kcm-rollup"}, pod
    # The toggles are on, but without the APIs nothing of theirs is rendered.
    without = render(helm, "ci/all-values.yaml", apis=())
    assert not {m["kind"] for m in without} & {"ServiceMonitor", "ScheduledSparkApplication", "ClusterKopfPeering"}
    assert not find(without, "Role", "-rollup-driver")


def test_cluster_wide_rbac_is_least_privilege(helm: Path) -> None:
    manifests = rendered(helm)
    role = one(manifests, "ClusterRole", "-operator")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules[(("kcm.dev",), ("clientmetricssubscriptions",))] == {"get", "list", "watch", "patch"}
    assert rules[(("kcm.dev",), ("kafkaconnections",))] == {"get", "list", "watch"}
    assert rules[(("kcm.dev",), ("kafkaconnections/status",))] == {"patch"}
    assert rules[(("kcm.dev",), ("clientmetricssubscriptions/status",))] == {"patch"}
    assert rules[(("",), ("events",))] == {"create"}
    assert "secrets" not in json.dumps(role["rules"])
    assert "kopf.dev" not in json.dumps(role["rules"]), "peering access only when peering is enabled"
    # kopf never lists namespaces when cluster-wide (kopf/_core/reactor/observation.py): no grant to.
    assert not [rule for rule in role["rules"] if "namespaces" in rule["resources"]], role["rules"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    secrets = one(manifests, "Role", "-operator-secrets")
    assert secrets["metadata"]["namespace"] == "kcm"
    assert secrets["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    assert one(manifests, "RoleBinding", "-operator-secrets")["roleRef"]["name"] == secrets["metadata"]["name"]
    assert one(manifests, "ClusterRoleBinding", "-operator")["subjects"][0]["name"].endswith("-operator")


def test_namespaced_mode_grants_roles_in_each_watched_namespace_only(helm: Path) -> None:
    manifests = rendered(helm, "ci/namespaced-values.yaml")
    args = one(manifests, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=payments" in args and "--namespace=checkout" in args and "--all-namespaces" not in args
    roles = {m["metadata"]["namespace"]: m for m in find(manifests, "Role", "-operator")}
    assert set(roles) == {"payments", "checkout"}
    assert "kopfpeerings" in json.dumps(roles["payments"]["rules"])
    bindings = {m["metadata"]["namespace"] for m in find(manifests, "RoleBinding", "-operator")}
    assert bindings == {"payments", "checkout"}
    secret_roles = find(manifests, "Role", "-operator-secrets")
    assert {m["metadata"]["namespace"] for m in secret_roles} == {"payments", "checkout"}
    assert {m["metadata"]["namespace"] for m in find(manifests, "KopfPeering")} == {"payments", "checkout"}
    for cluster_role in find(manifests, "ClusterRole"):
        assert "kcm.dev" not in json.dumps(cluster_role["rules"]) and "secrets" not in json.dumps(cluster_role["rules"])
    # kopf follows the watched namespaces being created and deleted by listing and watching namespace names.
    discovery = one(manifests, "ClusterRole", "-operator-discovery")
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in discovery["rules"]


def test_namespaces_to_watch_with_all_namespaces_still_true_are_refused(helm: Path) -> None:
    # Rendered, they were ignored: the operator watched every namespace through a ClusterRole.
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "operator.watch.namespaces={team-a}")
    assert result.returncode != 0
    assert ("operator.watch.namespaces (team-a) is set but operator.watch.allNamespaces is true, which watches every "
            "namespace: set operator.watch.allNamespaces=false") in result.stderr
    args = one(render(helm, sets=("operator.watch.namespaces={team-a}", "operator.watch.allNamespaces=false")),
               "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args


@pytest.mark.parametrize(("log_format", "sets"), [("text", ()), ("json", ("operator.logFormat=json",))])
def test_the_operator_log_format_reaches_the_operator(helm: Path, log_format: str, sets: tuple[str, ...]) -> None:
    args = one(render(helm, sets=sets), "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_parser().parse_args(args).log_format == log_format
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "operator.logFormat=yaml")
    assert result.returncode != 0 and "/operator/logFormat" in result.stderr


@pytest.mark.parametrize(("value", "key"), [
    ("commonLabels", "app.kubernetes.io/name"),
    ("commonLabels", "app.kubernetes.io/version"),
    ("operator.podLabels", "app.kubernetes.io/instance"),
    ("bridge.podLabels", "app.kubernetes.io/component"),
])
def test_extra_labels_may_not_replace_the_labels_the_chart_sets(helm: Path, value: str, key: str) -> None:
    # Rendered, the key came twice, and the Deployment's pods no longer matched its selector (nor its Service's).
    escaped = key.replace(".", "\\.")
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", f"{value}.{escaped}=x")
    assert result.returncode != 0
    assert f"{value} sets {key}, a label the chart sets itself" in result.stderr, result.stderr


def test_pod_labels_win_over_common_labels_with_each_key_once(helm: Path) -> None:
    sets = ("commonLabels.team=platform", "bridge.podLabels.team=observability", "bridge.podLabels.tier=telemetry")
    result = run_helm(helm, "template", "kcm", str(CHART), *[arg for item in sets for arg in ("--set", item)])
    assert result.returncode == 0, result.stderr
    bridge = one([doc for doc in yaml.safe_load_all(result.stdout) if doc], "Deployment", "-bridge")
    labels = bridge["spec"]["template"]["metadata"]["labels"]
    assert (labels["team"], labels["tier"]) == ("observability", "telemetry")
    assert bridge["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (bridge_text,) = [doc for doc in result.stdout.split("\n---") if "kind: Deployment" in doc and "-bridge\n" in doc]
    pod_labels = bridge_text.split("  template:", 1)[1].split("annotations:", 1)[0]
    assert pod_labels.count("team:") == 1, pod_labels


@pytest.mark.parametrize(("sets", "refused"), [
    # An unescaped --set nests the dotted name: the password sat in the ConfigMap, past the check of flat keys.
    (("bridge.config.kafka.properties.sasl.password=S3CRET",),
     "bridge.config.kafka.properties.sasl.password would put a credential into a ConfigMap"),
    (("bridge.config.kafka.properties.sasl.jaas.config=S3CRET",),
     "bridge.config.kafka.properties.sasl.jaas would put a credential into a ConfigMap"),
    (("bridge.config.kafka.properties.sasl.mechanism=PLAIN",),
     "bridge.config.kafka.properties.sasl is not a string: client properties are flat, a dotted name is one key; "
     "with --set, escape its dots (--set 'bridge.config.kafka.properties.sasl\\.mechanism=SCRAM-SHA-512')"),
    (("bridge.config.kafka.properties.x={a,b}",), "bridge.config.kafka.properties.x is not a string"),
])
def test_a_kafka_property_nested_by_unescaped_dots_is_refused(helm: Path, sets: tuple[str, ...], refused: str) -> None:
    result = run_helm(helm, "template", "kcm", str(CHART), *[arg for item in sets for arg in ("--set", item)])
    assert result.returncode != 0 and refused in result.stderr, result.stderr
    assert "S3CRET" not in result.stdout + result.stderr
    escaped = render(helm, sets=("bridge.config.kafka.properties.sasl\\.mechanism=PLAIN",))
    config = yaml.safe_load(one(escaped, "ConfigMap", "-bridge")["data"]["bridge.yaml"])
    assert config["kafka"]["properties"] == {"sasl.mechanism": "PLAIN"}


def test_a_static_attribute_nested_by_unescaped_dots_is_refused(helm: Path) -> None:
    """Rendered, the bridge refused its config at start (`must be a string, not dict`), long after the install."""
    result = run_helm(helm, "template", "kcm", str(CHART), "--set",
                      "bridge.config.enrich.static_attributes.kafka.cluster.name=prod-eu-1")
    assert result.returncode != 0, result.stdout
    assert ("bridge.config.enrich.static_attributes.kafka is not a string: attribute names are flat, a dotted name "
            "is one key; with --set, escape its dots") in result.stderr, result.stderr
    escaped = render(helm, sets=("bridge.config.enrich.static_attributes.kafka\\.cluster\\.name=prod-eu-1",))
    config = yaml.safe_load(one(escaped, "ConfigMap", "-bridge")["data"]["bridge.yaml"])
    assert config["enrich"]["static_attributes"] == {"kafka.cluster.name": "prod-eu-1"}


@pytest.mark.parametrize(("sets", "message"), [
    # The schema said only "'not' failed" of each.
    (("operator.listenAddress=127.0.0.1",), "operator.listenAddress (127.0.0.1) is a loopback address: the kubelet "
     "probes /healthz on the pod's IP"),
    (("kafka.tlsSecrets={client}",), "kafka.tlsSecrets names a Secret \"client\": /etc/kcm/kafka/client/ is where "
     "kafka.clientConfig's properties file is mounted"),
    (("prometheusRule.enabled=true", "bridge.serviceMonitor.enabled=true",
      "prometheusRule.additionalAlertLabels.severity=page"),
     "prometheusRule.additionalAlertLabels.severity: each alert has its own severity (critical or warning)"),
])
def test_values_refused_for_a_reason_say_the_reason(helm: Path, sets: tuple[str, ...], message: str) -> None:
    apis = [arg for api in OPTIONAL_APIS for arg in ("--api-versions", api)]
    result = run_helm(helm, "template", "kcm", str(CHART), *[arg for item in sets for arg in ("--set", item)], *apis)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "'not' failed" not in result.stderr


@pytest.mark.parametrize("all_namespaces", ["true", "false"])
def test_releases_of_one_name_in_two_namespaces_share_no_rbac_object(helm: Path, all_namespaces: str) -> None:
    """A ClusterRole, ClusterRoleBinding, or Role in a namespace both reach, named after the release alone belongs to
    the first release that made it: Helm refuses the second install, and `kubectl apply` rebinds it to the second's
    ServiceAccount."""
    names = {}
    for namespace in ("team-a", "team-b"):
        # Both also read Secrets in a shared namespace, and (namespaced) watch one in common besides their own.
        watch = () if all_namespaces == "true" else ("--set", f"operator.watch.namespaces={{{namespace},shared}}")
        result = run_helm(helm, "template", "kcm", str(CHART), "--namespace", namespace,
                          "--set", f"operator.watch.allNamespaces={all_namespaces}", *watch,
                          "--set", f"operator.rbac.secrets.namespaces={{{namespace},kafka-credentials}}")
        assert result.returncode == 0, result.stderr
        manifests = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        granting = [m for m in manifests if m["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
        assert any(m["kind"] == "ClusterRole" for m in granting)
        assert any(m["metadata"].get("namespace") == "kafka-credentials" for m in granting)
        roles = {(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in granting}
        for binding in (m for m in granting if m["kind"].endswith("RoleBinding")):
            role_kind = binding["kind"].removesuffix("Binding")
            assert (role_kind, binding["metadata"].get("namespace") if role_kind == "Role" else None,
                    binding["roleRef"]["name"]) in roles, binding
            assert binding["subjects"][0]["namespace"] == namespace
        # Outside its own namespace, every object is the release's alone; inside it, names stay as they were.
        names[namespace] = {role for role in roles if role[1] != namespace}
    assert not names["team-a"] & names["team-b"], names


def test_external_kafka_with_sasl_mounts_the_existing_secrets(helm: Path) -> None:
    manifests = rendered(helm, "ci/sasl-values.yaml")
    operator = one(manifests, "Deployment", "-operator")["spec"]["template"]["spec"]
    assert "--command-config=/etc/kcm/kafka/client/client.properties" in operator["containers"][0]["args"]
    bridge = one(manifests, "Deployment", "-bridge")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in bridge["containers"][0]["env"]}
    assert env == {"KCM_BRIDGE_BOOTSTRAP_SERVERS": "kafka-0.example.com:9093,kafka-1.example.com:9093",
                   "KCM_BRIDGE_TOPICS": "kafka-client-metrics",
                   "KCM_BRIDGE_COMMAND_CONFIG": "/etc/kcm/kafka/client/client.properties"}
    for pod in (operator, bridge):
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets == {"kcm-kafka-client", "kafka-cluster-ca"}
        assert all(m["readOnly"] for m in pod["containers"][0]["volumeMounts"] if m["name"].startswith("kafka-"))
    secrets = one(manifests, "Role", "-operator-secrets")
    assert secrets["metadata"]["namespace"] == "payments"
    assert secrets["rules"][0]["resourceNames"] == ["analytics-kafka-credentials", "analytics-kafka-cluster-ca-cert"]
    # No secret material is rendered into the manifests: only references.
    assert not find(manifests, "Secret")


@pytest.mark.parametrize(("config", "refused"), [
    ({"kafka": {"properties": {"security.protocol": "SASL_SSL", "sasl.password": "S3CRET"}}},
     "bridge.config.kafka.properties.sasl.password would put a credential into a ConfigMap"),
    ({"kafka": {"properties": {"sasl.jaas.config": "S3CRET"}}}, "bridge.config.kafka.properties.sasl.jaas.config"),
    ({"endpoints": [{"endpoint": "c:4317", "headers": {"x-scope-orgid": "team", "Authorization": "Bearer S3CRET"}}]},
     "bridge.config.endpoints[0].headers.Authorization would put a credential into a ConfigMap: use "
     "headers_from_files"),
    ({"enrich": {"rules": [{"attribute": "a", "action": "drop"},
                           {"attribute": "b", "action": "hash", "salt": "S3CRET"}]}},
     "bridge.config.enrich.rules[1].salt would put the hashing salt into a ConfigMap: use salt_file"),
    ({"endpoints": [{"endpoint": "c:4317", "headers": {"x-scope-orgid": 123}}]},
     "bridge.config.endpoints[0].headers.x-scope-orgid must be a quoted string"),
    # OTLP vendors' credential headers: Honeycomb's team key, Uptrace's DSN, API keys, credentials.
    *[({"endpoints": [{"endpoint": "c:4317", "headers": {"x-scope-orgid": "team", name: "S3CRET"}}]},
       f"bridge.config.endpoints[0].headers.{name} would put a credential into a ConfigMap")
      for name in ("x-honeycomb-team", "uptrace-dsn", "x-api-key", "apikey", "Api-Key", "x-credential")],
])
def test_a_credential_inline_in_the_bridge_config_is_refused_naming_the_secret_backed_way(
        helm: Path, tmp_path: Path, config: dict[str, Any], refused: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"bridge": {"config": config}}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(values))
    assert result.returncode != 0 and refused in result.stderr, result.stderr
    assert "S3CRET" not in result.stdout + result.stderr


def test_bridge_config_without_inline_credentials_renders(helm: Path, tmp_path: Path) -> None:
    config = {"kafka": {"properties": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}},
              "endpoints": [{"endpoint": "c:4317", "headers": {"x-scope-orgid": "team"},
                             "headers_from_files": {"authorization": "/etc/kcm/secrets/token/authorization"}}],
              "enrich": {"rules": [{"attribute": "b", "action": "hash", "salt": None,
                                    "salt_file": "/etc/kcm/secrets/s/salt"}]}}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"bridge": {"config": config}}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(values))
    assert result.returncode == 0, result.stderr
    (configmap,) = [doc for doc in yaml.safe_load_all(result.stdout)
                    if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-bridge")]
    assert yaml.safe_load(configmap["data"]["bridge.yaml"]) == {**config, "kafka": {**config["kafka"],
                                                                                     "group_id": "kcm-bridge"}}


def test_bridge_config_is_rendered_verbatim_and_a_change_rolls_the_pods(helm: Path) -> None:
    defaults = rendered(helm)
    config = yaml.safe_load(one(defaults, "ConfigMap", "-bridge")["data"]["bridge.yaml"])
    assert config == yaml.safe_load((CHART / "values.yaml").read_text())["bridge"]["config"]
    changed = render(helm, sets=("bridge.config.batch.linger_ms=500",))
    assert yaml.safe_load(one(changed, "ConfigMap", "-bridge")["data"]["bridge.yaml"])["batch"] == {"linger_ms": 500}

    def checksum(manifests: list[Manifest]) -> str:
        return one(manifests, "Deployment", "-bridge")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum(defaults) != checksum(changed)


def test_the_bridge_accepts_the_rendered_config_and_environment(helm: Path, tmp_path: Path) -> None:
    manifests = rendered(helm)
    # No service links: a Service named like the bridge's own (kcm-bridge-metrics) would inject KCM_BRIDGE_METRICS_*.
    assert one(manifests, "Deployment", "-bridge")["spec"]["template"]["spec"]["enableServiceLinks"] is False
    config = tmp_path / "bridge.yaml"
    config.write_text(one(manifests, "ConfigMap", "-bridge")["data"]["bridge.yaml"])
    container = one(manifests, "Deployment", "-bridge")["spec"]["template"]["spec"]["containers"][0]
    loaded = load_bridge_config(config, env={e["name"]: e["value"] for e in container["env"]})
    assert loaded.kafka.bootstrap_servers == "my-cluster-kafka-bootstrap.kafka:9092"
    assert [(e.endpoint, e.insecure) for e in loaded.endpoints] == [
        ("opentelemetry-collector.observability:4317", True)]
    assert loaded.kafka.topics == [yaml.safe_load((CHART / "values.yaml").read_text())["kafka"]["metricsTopic"]]


def test_notes_tell_what_to_do_next(helm: Path) -> None:
    result = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client",
                      "--values", str(CHART / "ci/namespaced-values.yaml"),
                      "--set", "rollup.enabled=true", "--set", "rollup.output=s3a://telemetry/rollups")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "in: payments, checkout" in notes
    assert "GetTelemetrySubscriptions (71) and PushTelemetry (72)" in notes
    # A dry run refuses brokers without KIP-714; a listing answers without it, so it checked nothing.
    assert ("kcm subscriptions apply --dry-run -f subscription-producer-app.yaml --bootstrap-server "
            "my-cluster-kafka-bootstrap.kafka:9092") in notes
    assert "kcm subscriptions list" not in notes
    assert "examples/subscription-producer-app.yaml" in notes
    assert "kcm tail --bootstrap-server my-cluster-kafka-bootstrap.kafka:9092\n" in notes   # the default topic
    topic = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client",
                     "--set", "kafka.metricsTopic=prod.client-telemetry")
    assert topic.returncode == 0, topic.stderr
    assert ("kcm tail --bootstrap-server my-cluster-kafka-bootstrap.kafka:9092 --topic prod.client-telemetry\n"
            in topic.stdout.split("NOTES:", 1)[1]), "tail reads kafka-client-metrics unless told another topic"
    assert "no rollup was created" in notes, "the rollup toggle without the Spark operator must be reported"
    peering = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client",
                       "--set", "operator.peering.enabled=true", "--set", "operator.replicas=2")
    assert peering.returncode == 0, peering.stderr
    assert "kopf.dev/v1 is not served here: no peering object was created" in peering.stdout.split("NOTES:", 1)[1]


def test_namespaced_notes_apply_the_example_where_the_operator_watches(helm: Path) -> None:
    result = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client",
                      "--set", "operator.watch.allNamespaces=false")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "in: kcm" in notes and "which this operator does not watch" in notes
    assert "| kubectl apply -n kcm -f -" in notes and "kubectl get clientmetricssubscriptions -n kcm" in notes
    # The printed sed, run on the example, moves it into the watched namespace.
    (pattern, replacement) = re.findall(r"sed 's/\^(.*?)\$/(.*?)/'", notes)[0]
    example = (REPO / "examples" / "subscription-producer-app.yaml").read_text()
    moved = yaml.safe_load(re.sub(f"^{pattern}$", replacement, example, flags=re.M))
    assert yaml.safe_load(example)["metadata"]["namespace"] == "payments"
    assert moved["metadata"]["namespace"] == "kcm"
    cluster_wide = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client")
    assert "kubectl get clientmetricssubscriptions -A" in cluster_wide.stdout
    assert "which this operator does not watch" not in cluster_wide.stdout


@pytest.mark.parametrize("apis", [("monitoring.coreos.com/v1",), ("monitoring.coreos.com/v1/ServiceMonitor",)])
def test_service_monitors_render_when_the_prometheus_operator_api_is_served_either_way(
        helm: Path, apis: tuple[str, ...]) -> None:
    toggles = ("operator.serviceMonitor.enabled=true", "bridge.serviceMonitor.enabled=true")
    monitors = find(render(helm, apis=apis, sets=toggles), "ServiceMonitor")
    assert {m["metadata"]["name"].rsplit("-", 1)[1] for m in monitors} == {"operator", "bridge"}


def test_notes_warn_when_a_service_monitor_was_asked_for_but_not_rendered(helm: Path) -> None:
    assert not find(render(helm, apis=(), sets=("bridge.serviceMonitor.enabled=true",)), "ServiceMonitor")
    result = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client",
                      "--set", "bridge.serviceMonitor.enabled=true")
    assert result.returncode == 0, result.stderr
    assert ("WARNING: bridge.serviceMonitor.enabled is true but monitoring.coreos.com/v1\nis not served here: "
            "no ServiceMonitor was created") in result.stdout.split("NOTES:", 1)[1]
    quiet = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client")
    assert "ServiceMonitor" not in quiet.stdout.split("NOTES:", 1)[1]


# Helm refuses release names over 53 characters; 16 and 28 are where the run and Service names overflowed.
@pytest.mark.parametrize("release", ["a" * 16, "a" * 28, "observability-platform-telemetry-prod", "r" * 53])
def test_long_release_names_keep_every_name_within_the_api_servers_limits(helm: Path, release: str) -> None:
    manifests = render(helm, "ci/all-values.yaml", release=release)
    dns_label = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
    services = find(manifests, "Service")
    assert len({s["metadata"]["name"] for s in services}) == len(services) == 2
    for service in services:
        name = service["metadata"]["name"]
        assert len(name) <= 63 and dns_label.fullmatch(name), name
        assert name.endswith(("-operator-metrics", "-bridge-metrics")), name
    # The Spark operator names each run "<name>-<UnixNano, 19 digits>" and puts that into a label value (63 at most).
    app = one(manifests, "ScheduledSparkApplication")["metadata"]["name"]
    assert len(f"{app}-{10**18}") <= 63 and dns_label.fullmatch(app), app
    for manifest in manifests:
        for value in manifest["metadata"].get("labels", {}).values():
            assert len(value) <= 63, (manifest["kind"], manifest["metadata"]["name"], value)
        if manifest["kind"] in ("Deployment", "ServiceMonitor", "ConfigMap", "HorizontalPodAutoscaler",
                                "PodDisruptionBudget"):
            assert len(manifest["metadata"]["name"]) <= 63, manifest["metadata"]["name"]


def test_the_bridge_reads_the_metrics_topic_the_rollup_reads(helm: Path, tmp_path: Path) -> None:
    def loaded_topics(manifests: list[Manifest]) -> list[str]:
        config = tmp_path / "bridge.yaml"
        config.write_text(one(manifests, "ConfigMap", "-bridge")["data"]["bridge.yaml"])
        container = one(manifests, "Deployment", "-bridge")["spec"]["template"]["spec"]["containers"][0]
        return load_bridge_config(config, env={e["name"]: e["value"] for e in container["env"]}).kafka.topics

    sets = ("kafka.metricsTopic=telemetry.client-metrics", "rollup.enabled=true", "rollup.output=s3a://b/p")
    manifests = render(helm, sets=sets)
    assert loaded_topics(manifests) == ["telemetry.client-metrics"]
    rollup = build_parser().parse_args(["rollup", *one(manifests, "ScheduledSparkApplication")["spec"]["template"]
                                        ["arguments"]])
    assert rollup.topic == "telemetry.client-metrics"
    # The bridge's own topics list, when given, is what it reads.
    assert loaded_topics(render(helm, sets=(*sets, "bridge.config.kafka.topics={a,b}"))) == ["a", "b"]


def test_the_rollup_fetches_the_s3a_filesystem_into_a_writable_ivy_cache(helm: Path) -> None:
    sets = ("rollup.enabled=true", "rollup.output=s3a://telemetry/kcm-rollups")
    template = one(render(helm, sets=sets), "ScheduledSparkApplication")["spec"]["template"]
    default = yaml.safe_load((CHART / "values.yaml").read_text())["rollup"]["deps"]["packages"]
    assert template["deps"] == {"packages": default}
    assert template["sparkConf"] == {"spark.jars.ivy": "/tmp/.ivy2"}
    # The root filesystem is read-only: Ivy's cache, and each pod's working directory (the image's last WORKDIR),
    # where executors copy the jars of deps.packages, must be on writable volumes in the driver and the executors.
    workdir = re.findall(r"^WORKDIR (\S+)", (REPO / "images" / "spark" / "Dockerfile").read_text(), re.M)[-1]
    empty = {v["name"] for v in template["volumes"] if "emptyDir" in v}
    for pod in ("driver", "executor"):
        writable = {m["mountPath"] for m in template[pod]["volumeMounts"] if m["name"] in empty}
        assert {"/tmp", workdir} <= writable, (pod, writable)
    # The same hadoop-aws as the examples and docs/rollups.md, for the Spark version the chart runs.
    (hadoop_aws,) = [p for p in default if p.startswith("org.apache.hadoop:hadoop-aws:")]
    version = hadoop_aws.rsplit(":", 1)[1]
    for path in sorted((REPO / "examples" / "spark").glob("rollup-*.yaml")):
        spec = yaml.safe_load(path.read_text())["spec"]
        spec = spec.get("template", spec)
        assert hadoop_aws in spec["deps"]["packages"], path.name
        assert spec["sparkVersion"] == template["sparkVersion"]
    assert f"({version} for Spark {template['sparkVersion']}" in (REPO / "docs" / "rollups.md").read_text()
    custom = one(render(helm, sets=(*sets, "rollup.deps.packages=null", "rollup.sparkConf.spark\\.jars\\.ivy=/tmp/i",
                                    "rollup.sparkConf.spark\\.sql\\.session\\.timeZone=UTC")),
                 "ScheduledSparkApplication")["spec"]["template"]
    assert "deps" not in custom
    assert custom["sparkConf"] == {"spark.jars.ivy": "/tmp/i", "spark.sql.session.timeZone": "UTC"}


def test_the_operator_listen_address_reaches_the_operator(helm: Path) -> None:
    def parsed(*sets: str) -> Any:
        manifests = render(helm, sets=sets)
        return build_parser().parse_args(one(manifests, "Deployment", "-operator")["spec"]["template"]["spec"]
                                         ["containers"][0]["args"])
    assert parsed().listen_address == "0.0.0.0"
    assert parsed("operator.listenAddress=::").listen_address == "::"


@pytest.mark.parametrize(("sets", "refused"), [
    (("operator.metricsPort=9090", "operator.livenessPort=9090"),
     "operator.metricsPort and operator.livenessPort are both 9090"),
    (("bridge.autoscaling.enabled=true", "bridge.autoscaling.minReplicas=6", "bridge.autoscaling.maxReplicas=2"),
     "bridge.autoscaling.minReplicas (6) is above bridge.autoscaling.maxReplicas (2)"),
    # A drain the grace period cuts short: exported records left uncommitted at every rollout.
    (("bridge.config.delivery.shutdown_timeout_s=120",),
     "bridge.terminationGracePeriodSeconds (45) is below the bridge's drain, "
     "bridge.config.delivery.shutdown_timeout_s (120), plus a Kafka check, bridge.config.kafka.connect_timeout_s "
     "(10): Kubernetes would kill it mid-drain; give a grace period of at least 130"),
    (("bridge.config.kafka.connect_timeout_s=30",), "bridge.config.kafka.connect_timeout_s (30)"),
    (("bridge.config.delivery.shutdown_timeout_s=1500000",), "give a grace period of at least 1500010"),   # not 1.5e+06
    # The bridge reads KCM_BRIDGE_SHUTDOWN_TIMEOUT_S over its config file.
    (("bridge.config.delivery.shutdown_timeout_s=5", "bridge.env[0].name=KCM_BRIDGE_SHUTDOWN_TIMEOUT_S",
      "bridge.env[0].value=:60"),
     "below the bridge's drain, bridge.env KCM_BRIDGE_SHUTDOWN_TIMEOUT_S (60), plus a Kafka check"),
])
def test_values_that_would_render_but_never_run_are_refused(helm: Path, sets: tuple[str, ...], refused: str) -> None:
    # A value after "=:" is set as text (--set-string), as an env value must be.
    args = [arg for item in sets
            for arg in (("--set-string", item.replace("=:", "=")) if "=:" in item else ("--set", item))]
    result = run_helm(helm, "template", "kcm", str(CHART), *args)
    assert result.returncode != 0 and refused in result.stderr, result.stderr
    # The grace period a refusal asks for is enough.
    suggested = re.search(r"grace period of at least (\d+)", result.stderr)
    if suggested:
        assert run_helm(helm, "template", "kcm", str(CHART), *args, "--set",
                        f"bridge.terminationGracePeriodSeconds={suggested[1]}").returncode == 0
    # Autoscaling off: its bounds do not matter.
    assert run_helm(helm, "template", "kcm", str(CHART), "--set", "bridge.autoscaling.minReplicas=6",
                    "--set", "bridge.autoscaling.maxReplicas=2").returncode == 0
    # The chart's check assumes the bridge's own defaults where bridge.config leaves them out: they must stay them.
    from kcm_bridge.config import DeliveryConfig, KafkaConfig

    drain, check = DeliveryConfig.shutdown_timeout_s, KafkaConfig.connect_timeout_s
    short = run_helm(helm, "template", "kcm", str(CHART), "--set", "bridge.terminationGracePeriodSeconds=1")
    assert (f"shutdown_timeout_s ({drain:g}), plus a Kafka check, bridge.config.kafka.connect_timeout_s "
            f"({check:g})") in short.stderr, short.stderr
    # A grace period that holds the drain and a check, whatever the values' types.
    for fits in (("--set", "bridge.config.delivery.shutdown_timeout_s=30",
                  "--set", "bridge.config.kafka.connect_timeout_s=5"),
                 ("--set-string", "bridge.config.delivery.shutdown_timeout_s=100", "--set",
                  "bridge.terminationGracePeriodSeconds=111"),
                 ("--set", "bridge.config.delivery.shutdown_timeout_s=null"),
                 ("--set", "bridge.config.delivery.shutdown_timeout_s=60", "--set",
                  "bridge.env[0].name=KCM_BRIDGE_SHUTDOWN_TIMEOUT_S", "--set-string", "bridge.env[0].value=5"),
                 # From a Secret: not known when rendering.
                 ("--set", "bridge.env[0].name=KCM_BRIDGE_SHUTDOWN_TIMEOUT_S", "--set",
                  "bridge.env[0].valueFrom.secretKeyRef.name=drain", "--set",
                  "bridge.env[0].valueFrom.secretKeyRef.key=seconds")):
        fitted = run_helm(helm, "template", "kcm", str(CHART), *fits)
        assert fitted.returncode == 0, (fits, fitted.stderr)


# --- docs/install.md -----------------------------------------------------------------------------------------


def test_the_install_doc_upgrades_with_the_new_charts_defaults() -> None:
    # --reuse-values keeps the old chart's defaults too: a value the new chart adds renders empty
    # (--peering-lifetime=, which the operator refuses at start-up).
    doc = (REPO / "docs" / "install.md").read_text()
    upgrades = re.findall(r"^helm upgrade .*$", doc, re.M)
    assert upgrades, "docs/install.md shows no helm upgrade"
    for upgrade in upgrades:
        assert "--reuse-values" not in upgrade and re.search(r"--reset-then-reuse-values|-f |--values ", upgrade)
    assert "Helm 3.14 or newer" in doc, "--reset-then-reuse-values came with Helm 3.14"


def test_the_install_doc_says_how_to_build_push_and_use_each_image_the_chart_runs() -> None:
    doc = (REPO / "docs" / "install.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    builds = dict(re.findall(r"^docker build -f (\S+) -t (\S+) \.$", doc, re.M))
    assert "nothing in this repository publishes them" in doc
    for value, image, dockerfile in (("image", values["image"], "images/kcm/Dockerfile"),
                                     ("rollup.image", values["rollup"]["image"], "images/spark/Dockerfile")):
        assert (REPO / dockerfile).is_file() and dockerfile in builds, dockerfile
        assert f"docker push {builds[dockerfile]}" in doc, dockerfile
        repository, _, tag = builds[dockerfile].rpartition(":")
        assert tag == yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"], "the tag the chart runs"
        assert f"--set {value}.repository={repository}" in doc, value
        assert f"`{value}.repository` (default `{image['repository']}`)" in " ".join(doc.split()), value


# --- values schema --------------------------------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def _merged(overrides: dict[str, Any]) -> dict[str, Any]:
    def merge(base: Any, extra: Any) -> Any:
        if isinstance(base, dict) and isinstance(extra, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in extra.items()}}
        return extra
    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"operator": {"replicas": "one"}}, "'one' is not of type 'integer'"),
    ({"operator": {"watch": {"namespaces": ["Payments"]}}}, "'Payments' does not match"),
    ({"bridge": {"replica": 3}}, "'replica' was unexpected"),
    ({"rollup": {"secretMounts": ["otel-ca", "otel-ca"]}}, "has non-unique elements"),
    ({"bridge": {"secretMounts": ["otel-ca", "otel-ca"]}}, "has non-unique elements"),
    ({"kafka": {"bootstrapServers": "kafka"}}, "'kafka' does not match"),
    ({"operator": {"logLevel": "verbose"}}, "'verbose' is not one of"),
    ({"image": {"digest": "sha256:abc"}}, "'sha256:abc' does not match"),
    ({"bridge": {"metricsPort": 80}}, "80 is less than the minimum of 1024"),
    ({"bridge": {"resources": {"requests": {"cpu": "lots"}}}}, "'lots' is not valid under any of"),
    ({"rollup": {"output": "/tmp/out"}}, "'/tmp/out' does not match"),
    ({"operator": {"peering": {"lifetimeSeconds": 0}}}, "0 is less than the minimum of 1"),
    # Kubernetes refuses an EnvVar value that is not text: the install would fail at the API server, per object.
    ({"operator": {"env": [{"name": "GOMAXPROCS", "value": 2}]}}, "2 is not of type 'string'"),
    ({"bridge": {"env": [{"name": "DEBUG", "value": True}]}}, "True is not of type 'string'"),
    ({"rollup": {"env": [{"name": "X", "valueFrom": "secret"}]}}, "'secret' is not of type 'object'"),
])
def test_values_schema_refuses_bad_values(overrides: dict[str, Any], message: str) -> None:
    errors = [e.message for e in jsonschema.Draft7Validator(_schema()).iter_errors(_merged(overrides))]
    assert any(message in error for error in errors), errors


def test_values_schema_accepts_the_defaults_and_every_ci_file() -> None:
    validator = jsonschema.Draft7Validator(_schema())
    for values_file in VALUES_FILES[1:]:
        assert not list(validator.iter_errors(_merged(yaml.safe_load((CHART / values_file).read_text()))))
    assert not list(validator.iter_errors(_merged({})))


def test_helm_refuses_bad_values_with_a_message_naming_the_value(helm: Path) -> None:
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "operator.replicas=one",
                      "--set", "bridge.replica=3")
    assert result.returncode != 0
    assert "/operator/replicas" in result.stderr and "want integer" in result.stderr
    assert "additional properties 'replica' not allowed" in result.stderr
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "operator.replicas=2")
    assert result.returncode != 0 and "operator.replicas above 1 needs operator.peering.enabled" in result.stderr
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "image.tag=latest")
    assert result.returncode != 0 and 'is "latest": set a release tag or a digest' in result.stderr
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "rollup.enabled=true",
                      "--api-versions", "sparkoperator.k8s.io/v1beta2")
    assert result.returncode != 0 and "rollup.output is required when rollup.enabled is true" in result.stderr


@pytest.mark.parametrize(("key", "refused"), [
    ("spark.hadoop.fs.s3a.secret.key", True),
    ("spark.hadoop.fs.s3a.access.key", True),
    ("spark.hadoop.fs.s3a.session.token", True),
    ("spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", True),
    ("spark.kubernetes.authenticate.oauthToken", True),
    ("spark.ssl.keyPassword", True),
    # Encryption keys and SAS tokens: a "key" or "sas" part.
    ("spark.hadoop.fs.s3a.encryption.key", True),
    ("spark.hadoop.fs.s3a.bucket.rollups.server-side-encryption.key", True),
    ("spark.hadoop.fs.gs.encryption.key", True),
    ("spark.hadoop.fs.azure.sas.rollups.account.blob.core.windows.net", True),
    # Keys that only name a provider class, a file or a switch, and others: rendered.
    ("spark.hadoop.fs.s3a.aws.credentials.provider", False),
    ("spark.kubernetes.authenticate.oauthTokenFile", False),
    ("spark.sql.shuffle.partitions", False),
    ("spark.hadoop.fs.s3a.encryption.algorithm", False),
    ("spark.io.encryption.keySizeBits", False),
    # Spark's references to a Secret by name: an environment variable from one of its keys, or the Secret mounted.
    ("spark.kubernetes.executor.secretKeyRef.AWS_SECRET_ACCESS_KEY", False),
    ("spark.kubernetes.driver.secretKeyRef.AWS_SESSION_TOKEN", False),
    ("spark.kubernetes.driver.secrets.rollup-s3-credentials", False),
    ("spark.kubernetes.executor.secretKeyRefs.AWS_SECRET_ACCESS_KEY", True),   # not Spark's: a credential by name
])
def test_a_credential_in_rollup_spark_conf_is_refused_naming_the_key_never_the_value(
        helm: Path, tmp_path: Path, key: str, refused: bool) -> None:
    # sparkConf sits in plain text in the ScheduledSparkApplication; only a comment said so.
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"rollup": {"enabled": True, "output": "s3a://b/x",
                                                 "sparkConf": {key: "S3CRET"}}}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(values),
                      "--api-versions", "sparkoperator.k8s.io/v1beta2")
    if refused:
        assert result.returncode != 0, result.stdout
        assert (f"rollup.sparkConf.{key} would put a credential into the ScheduledSparkApplication: give it through "
                "rollup.env with valueFrom.secretKeyRef") in result.stderr
        assert "S3CRET" not in result.stdout + result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert f"{key}: S3CRET" in result.stdout


@pytest.mark.parametrize(("values", "message"), [
    ({"operator": {"env": [{"name": "POD_ID", "value": "me"}]}}, "operator.env[0] gives POD_ID, which the chart sets"),
    ({"bridge": {"env": [{"name": "TZ", "value": "UTC"}, {"name": "LANG", "value": "C"}, {"name": "TZ", "value": "x"}]}},
     "bridge.env[2] gives TZ again (so does bridge.env[0]): give each name once"),
    ({"rollup": {"enabled": True, "output": "s3a://b/x", "env": [{"name": "TZ", "value": "UTC"},
                                                                {"name": "TZ", "value": "x"}]}},
     "rollup.env[1] gives TZ again (so does rollup.env[0]): give each name once"),
    ({"bridge": {"podAnnotations": {"checksum/config": "pinned"}}},
     "bridge.podAnnotations gives checksum/config, which the chart sets"),
])
def test_an_env_name_or_annotation_given_twice_fails_the_install_naming_it(helm: Path, tmp_path: Path, values: dict,
                                                                           message: str) -> None:
    """Rendered twice, Kubernetes kept the last (a user's checksum/config stopped config changes rolling the bridge)
    and Helm 4's server-side apply refused the manifest with an API error about `duplicate entries`."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(path),
                      "--api-versions", "sparkoperator.k8s.io/v1beta2")
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


def test_a_bridge_variable_the_chart_sets_given_in_bridge_env_replaces_the_charts(helm: Path, tmp_path: Path) -> None:
    """Rendered twice: Kubernetes kept the last, Helm 4's server-side apply refused the manifest."""
    given = [{"name": "KCM_BRIDGE_BOOTSTRAP_SERVERS",
              "valueFrom": {"configMapKeyRef": {"name": "kafka", "key": "bootstrap"}}},
             {"name": "KCM_BRIDGE_COMMAND_CONFIG", "value": "/etc/kcm/secrets/kafka/client.properties"},
             {"name": "KCM_BRIDGE_TOPICS", "value": "telemetry"}]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"clientConfig": {"existingSecret": "kafka-client"}},
                                    "bridge": {"env": given}}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(path))
    assert result.returncode == 0, result.stderr
    for variable in given:
        assert result.stdout.count(f"- name: {variable['name']}\n") == 1, result.stdout
    container = one(render(helm, str(path)), "Deployment", "-bridge")["spec"]["template"]["spec"]["containers"][0]
    assert [entry for entry in container["env"] if entry["name"].startswith("KCM_BRIDGE_")] == given


def test_a_default_container_annotation_given_replaces_the_charts(helm: Path, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({component: {"podAnnotations": {"kubectl.kubernetes.io/default-container": "x",
                                                                   "team": "obs"}}
                                    for component in ("bridge", "operator")}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(path))
    assert result.returncode == 0, result.stderr
    # Not twice in a pod's annotations (a YAML parser keeps the last, the API server's may refuse).
    assert result.stdout.count("kubectl.kubernetes.io/default-container:") == 2, result.stdout
    manifests = render(helm, str(path))
    for suffix in ("-bridge", "-operator"):
        annotations = one(manifests, "Deployment", suffix)["spec"]["template"]["metadata"]["annotations"]
        assert (annotations["kubectl.kubernetes.io/default-container"], annotations["team"]) == ("x", "obs")


@pytest.mark.parametrize(("arg", "refused_as"), [
    ("--resolution=1m", "rollup.resolution"),
    ("--log-format=json", "rollup.logFormat"),
    ("--topic", "kafka.metricsTopic"),
    ("--output=s3a://other/x", "rollup.output"),
    ("--bootstrap-server=k:9092", "kafka.bootstrapServers"),
    ("--group-by=client_software_name", None),
    ("--otlp-endpoint=otel:4317", None),
])
def test_rollup_extra_args_may_not_repeat_a_flag_the_chart_passes(helm: Path, tmp_path: Path, arg: str,
                                                                  refused_as: str | None) -> None:
    # kcm rollup refuses an option given twice: every scheduled run would fail in the driver, long after the install.
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"rollup": {"enabled": True, "output": "s3a://b/x",
                                                 "extraArgs": ["--top=5", arg]}}))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(values),
                      "--api-versions", "sparkoperator.k8s.io/v1beta2")
    if refused_as:
        assert result.returncode != 0, result.stdout
        flag = arg.split("=")[0]
        assert (f"rollup.extraArgs[1] gives {flag}, which the chart already passes (kcm rollup refuses an option "
                f"given twice): set {refused_as} instead") in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert f"- {arg}" in result.stdout or f'- "{arg}"' in result.stdout, result.stdout


@pytest.mark.parametrize(("component", "entry", "config", "refused"), [
    ("rollup", {"name": "AWS_SECRET_ACCESS_KEY", "value": "S3CRET"}, None, True),
    ("rollup", {"name": "AWS_SESSION_TOKEN", "value": "S3CRET"}, None, True),
    ("bridge", {"name": "OTLP_API_KEY", "value": "S3CRET"}, None, True),
    ("operator", {"name": "KAFKA_PASSWORD", "value": "S3CRET"}, None, True),
    # Whatever its name, a variable the bridge config reads as a header or a salt.
    ("bridge", {"name": "VENDOR_HEADER", "value": "S3CRET"},
     {"endpoints": [{"endpoint": "otel:4317", "headers_from_env": {"x-vendor": "VENDOR_HEADER"}}]}, True),
    ("bridge", {"name": "SALT_VAR", "value": "S3CRET"},
     {"enrich": {"rules": [{"action": "hash", "attribute": "principal", "salt_env": "SALT_VAR"}]}}, True),
    # Names, files and switches render; so does a credential from a Secret.
    ("rollup", {"name": "AWS_ACCESS_KEY_ID", "value": "AKIAEXAMPLE"}, None, False),
    ("bridge", {"name": "TOKEN_FILE", "value": "/etc/kcm/secrets/t/token"}, None, False),
    ("rollup", {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/etc/kcm/secrets/gcs/key.json"}, None, False),
    ("bridge", {"name": "HADOOP_TOKEN_FILE_LOCATION", "value": "/etc/kcm/secrets/h/tokens"}, None, False),
    ("bridge", {"name": "OTLP_API_KEY", "valueFrom": {"secretKeyRef": {"name": "otlp", "key": "api-key"}}}, None,
     False),
    ("operator", {"name": "LOG_LEVEL", "value": "DEBUG"}, None, False),
])
def test_a_credential_as_a_literal_env_value_is_refused_naming_the_variable_never_the_value(
        helm: Path, tmp_path: Path, component: str, entry: dict[str, Any], config: dict[str, Any] | None,
        refused: bool) -> None:
    values: dict[str, Any] = {component: {"env": [entry]}}
    if component == "rollup":
        values["rollup"].update(enabled=True, output="s3a://b/x")
    if config is not None:
        values["bridge"]["config"] = {"endpoints": [{"endpoint": "otel:4317"}], **config}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", "kcm", str(CHART), "--values", str(path),
                      "--api-versions", "sparkoperator.k8s.io/v1beta2")
    if refused:
        assert result.returncode != 0, result.stdout
        assert (f"{component}.env[0] ({entry['name']}) would put a credential into the {component}'s manifest in "
                "plain text: use valueFrom.secretKeyRef") in result.stderr
        assert "S3CRET" not in result.stdout + result.stderr
    else:
        assert result.returncode == 0, result.stderr


def test_a_tls_secret_named_twice_is_refused_by_the_schema(helm: Path) -> None:
    # Rendered twice, the pod had two volumes of one name, which the API server refuses after the install began.
    result = run_helm(helm, "template", "kcm", str(CHART), "--set", "kafka.clientConfig.existingSecret=c",
                      "--set", "kafka.tlsSecrets={kafka-ca,kafka-ca}")
    assert result.returncode != 0 and "/kafka/tlsSecrets': items at 0 and 1 are equal" in result.stderr


# What `kcm rollup --last` accepts (kcm_rollups.windows.parse_duration), checked against the schema's pattern.
LAST_CASES = ["75m", "1d", "2h", "1h30m", "90s", "2H", "1h0m", "0h1m", "007m", "0m", "0h0m", "00s", "", "10", "m",
              "1x", "1.5h", "-1h", "1h 30m", " 1h"]


@pytest.mark.parametrize("last", LAST_CASES)
def test_values_schema_accepts_the_rollup_durations_kcm_rollup_accepts(last: str) -> None:
    from kcm_rollups.windows import parse_duration

    try:
        parse_duration(last, "--last")
        accepted_by_kcm = " " not in last
    except UserError:
        accepted_by_kcm = False
    errors = list(jsonschema.Draft7Validator(_schema()).iter_errors(_merged({"rollup": {"last": last}})))
    assert (not errors) == accepted_by_kcm, errors


@pytest.mark.parametrize(("overrides", "accepted"), [
    ({"rollup": {"schedule": "@hourly"}}, True),
    ({"rollup": {"schedule": "@daily"}}, True),
    ({"rollup": {"schedule": "@every 2h"}}, True),
    ({"rollup": {"schedule": "CRON_TZ=Europe/Berlin 15 * * * *"}}, True),
    ({"rollup": {"schedule": "*/15 * * * *"}}, True),
    ({"rollup": {"schedule": "hourly"}}, False),
    ({"rollup": {"schedule": "@often"}}, False),
    ({"rollup": {"schedule": "15 * * *"}}, False),
    ({"rollup": {"schedule": ""}}, False),
    ({"operator": {"watch": {"namespaces": ["n" * 63]}}}, True),
    ({"operator": {"watch": {"namespaces": ["n" * 64]}}}, False),
    ({"operator": {"rbac": {"secrets": {"namespaces": ["n" * 63]}}}}, True),
    ({"operator": {"rbac": {"secrets": {"namespaces": ["n" * 64]}}}}, False),
    ({"operator": {"listenAddress": "::"}}, True),
    ({"operator": {"listenAddress": "10.0.0.7"}}, True),
    ({"operator": {"listenAddress": "localhost"}}, False),
    ({"rollup": {"deps": {"packages": ["org.apache.hadoop:hadoop-aws:3.5.0"],
                          "repositories": ["https://maven.example.com/releases"]}}}, True),
    ({"rollup": {"deps": {"packages": ["hadoop-aws"]}}}, False),
])
def test_values_schema_accepts_what_kubernetes_and_the_spark_operator_accept(overrides: dict[str, Any],
                                                                            accepted: bool) -> None:
    errors = list(jsonschema.Draft7Validator(_schema()).iter_errors(_merged(overrides)))
    assert (not errors) == accepted, errors


def test_helm_applies_the_schema_patterns_as_python_does(helm: Path) -> None:
    """Helm's schema validator uses Go regular expressions: the patterns above must mean the same there."""
    for value, accepted in (("rollup.schedule=@hourly", True), ("rollup.schedule=hourly", False),
                            ("rollup.last=1h30m", True), ("rollup.last=0m", False), ("rollup.last=1d", True),
                            ("operator.listenAddress=::", True), ("operator.listenAddress=localhost", False),
                            ("operator.watch.allNamespaces=false,operator.watch.namespaces={" + "n" * 63 + "}",
                             True)):
        result = run_helm(helm, "template", "kcm", str(CHART), "--set", value)
        assert (result.returncode == 0) == accepted, (value, result.stderr)


# --- every value documented ---------------------------------------------------------------------------------


def _leaves(schema: dict[str, Any], values: Any, prefix: str = "") -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(dotted path, schema, default) of each documented value: objects with fixed properties are descended."""
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        default = values.get(name) if isinstance(values, dict) else None
        if sub.get("type") == "object" and "properties" in sub:
            yield from _leaves(sub, default, path + ".")
        else:
            yield path, sub, default


def values_table() -> str:
    """The chart README's values table, from values.schema.json (descriptions) and values.yaml (defaults)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = ["| Value | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for path, sub, default in _leaves(_schema(), values):
        if path == "global":
            continue
        kind = sub.get("type") or " or ".join(choice["type"] for choice in sub.get("anyOf", []))
        shown = json.dumps(default, separators=(", ", ": ")).replace("|", "\\|")
        if len(shown) > 60:
            shown = "see values.yaml"
        rows.append(f"| `{path}` | {kind} | `{shown}` | {sub['description']} |")
    return "\n".join(rows)


def test_every_value_has_a_schema_and_the_readme_table_is_current() -> None:
    schema = _schema()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def undocumented(node: dict[str, Any], sub: dict[str, Any], prefix: str) -> Iterator[str]:
        for name, value in node.items():
            child = sub.get("properties", {}).get(name)
            if child is None or "description" not in child:
                yield prefix + name
            elif isinstance(value, dict) and "properties" in child:
                yield from undocumented(value, child, f"{prefix}{name}.")
    assert list(undocumented(values, schema, "")) == []
    readme = (CHART / "README.md").read_text()
    current = readme.split(README_BEGIN)[1].split(README_END)[0].strip()
    assert current == values_table(), "values table is stale: run python tests/test_chart.py --write-readme"


def _write_readme() -> None:
    path = CHART / "README.md"
    head, rest = path.read_text().split(README_BEGIN)
    path.write_text(f"{head}{README_BEGIN}\n{values_table()}\n{README_END}{rest.split(README_END)[1]}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-readme"]:
        sys.exit("usage: python tests/test_chart.py --write-readme")
    _write_readme()
