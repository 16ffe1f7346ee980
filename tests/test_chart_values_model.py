"""Model-based test of the Helm chart's values: seeded random values files, rendered by the real helm binary, checked
against a reference written from the chart's README (its values table and "Modes and options"), docs/install.md
("With Helm") and the descriptions in values.schema.json: which objects exist and what they are called, the labels,
the flags, environment and config file the operator, bridge and rollup get, where every Secret is mounted (and that
no credential is ever a chart value), probes and ports, the operator's RBAC per namespace, the NOTES warnings for a
toggle whose API is missing; and every value those documents call invalid refused with a message naming it.

Values are drawn as a user writes them (quoted YAML text) and merged, as Helm merges them, over the defaults the
README's values table lists. Renders run in parallel and are shared by the tests (about ninety helm calls, schema
refusals batched since Helm reports them all at once).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import kubernetes_validate
import pytest
import yaml
from kcm_cli.main import build_parser

import test_chart
from test_chart import CHART, Manifest, run_helm

helm = test_chart.helm   # the fixture



def documented_defaults() -> dict[str, Any]:
    """The defaults of the README's values table (bridge.config's: "see values.yaml", so from there)."""
    readme = (CHART / "README.md").read_text()
    table = readme.split("<!-- values:begin -->", 1)[1].split("<!-- values:end -->", 1)[0]
    defaults: dict[str, Any] = {}
    for row in re.findall(r"^\| `([^`]+)` \| [^|]+ \| `(.*?)` \|", table, flags=re.M):
        path, text = row
        value = yaml.safe_load((CHART / "values.yaml").read_text())["bridge"]["config"] \
            if text == "see values.yaml" else json.loads(text)
        *parents, last = path.split(".")
        node = defaults
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return defaults


DEFAULTS = documented_defaults()
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
CHART_NAME, APP_VERSION = CHART_META["name"], CHART_META["appVersion"]
SEEDS = range(30)
VALIDATED = {f"seed{seed}" for seed in range(8)}   # also checked against Kubernetes' schemas (15 ms a manifest)
# README "ServiceMonitors, peering, rollup": the APIs that gate the optional parts.
MONITORING, KOPF, SPARK = "monitoring.coreos.com/v1", "kopf.dev/v1", "sparkoperator.k8s.io/v1beta2"
CANARY = "S3CRET-do-not-render"   # a credential given where the docs say it is refused; never printed back
PARSER = build_parser()

# README "Environment": names that name a credential (refused as literal values) and ones that name files (pass).
CREDENTIAL_ENV = ("DB_PASSWORD", "OTLP_TOKEN_VALUE", "MY_SECRET", "AWS_SECRET_ACCESS_KEY", "ENCRYPTION_KEY", "APIKEY",
                  "SENTRY_DSN", "AZURE_SAS", "SIGNATURE", "GCP_CREDENTIAL", "KEY")
HARMLESS_ENV = ("GOMAXPROCS", "AWS_ACCESS_KEY_ID", "DB_PASSWORD_FILE", "TOKEN_PATH", "SECRETS_DIR",
                "GOOGLE_APPLICATION_CREDENTIALS", "CREDENTIALS_LOCATION", "MONKEY", "KEYBOARD", "AWS_REGION")
# README "Bridge config": header names that carry credentials, refused inline; these do not.
CREDENTIAL_HEADERS = ("Authorization", "x-api-key", "x-honeycomb-team", "uptrace-dsn", "Cookie", "x-auth-token",
                      "X-Signature", "x-secret", "x-password", "x-credential")
HARMLESS_HEADERS = ("x-scope-orgid", "x-tenant", "x-environment")
# README "Rollup output credentials": sparkConf keys naming a credential, and ones naming a provider, file or switch.
CREDENTIAL_CONF = ("spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
                   "spark.hadoop.fs.s3a.session.token", "spark.hadoop.fs.s3a.encryption.key",
                   "spark.hadoop.fs.azure.sas.logs.acct.blob.core.windows.net", "spark.hadoop.fs.gs.encryption.key",
                   "spark.ssl.keyPassword", "spark.authenticate.secret")
HARMLESS_CONF = {"spark.hadoop.fs.s3a.aws.credentials.provider":
                 "com.amazonaws.auth.WebIdentityTokenCredentialsProvider",
                 "spark.hadoop.google.cloud.auth.service.account.json.keyfile": "/etc/kcm/secrets/gcs/key.json",
                 "spark.sql.shuffle.partitions": "8", "spark.hadoop.fs.s3a.path.style.access": "true"}
# install.md: password-like kafka.properties refused inline in bridge.config.
CREDENTIAL_PROPERTIES = ("sasl.jaas.config", "ssl.keystore.password", "ssl.key.password", "ssl.truststore.password")
LOOPBACKS = ("127.0.0.1", "127.1.2.3", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "0000::1")


# --- Helm's view of values ------------------------------------------------------------------------------------------


def helm_merge(base: Any, override: Any) -> Any:
    """Values as Helm merges a values file over values.yaml: maps key by key, anything else replaced, null removes."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = helm_merge(base.get(key), value)
        return merged
    return copy.deepcopy(override)


def prefix_of(release: str, values: dict[str, Any]) -> str:
    """README: nameOverride replaces the chart name, fullnameOverride the release-chart prefix of resource names."""
    if values["fullnameOverride"]:
        return values["fullnameOverride"]
    return f"{release}-{values['nameOverride'] or CHART_NAME}"[:63].rstrip("-")


def image_ref(image: dict[str, Any]) -> str:
    """README: the digest wins over the tag; an empty tag is the chart's appVersion."""
    if image["digest"]:
        return f"{image['repository']}@{image['digest']}"
    return f"{image['repository']}:{image['tag'] or APP_VERSION}"


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --- drawing values --------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One values file, with the release it is installed as and the optional APIs the cluster serves."""
    name: str
    release: str
    namespace: str
    overrides: dict[str, Any]
    apis: tuple[str, ...]
    values: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.values = helm_merge(DEFAULTS, self.overrides)

    @property
    def prefix(self) -> str:
        return prefix_of(self.release, self.values)


def _word(rng: random.Random, low: int = 3, high: int = 10) -> str:
    first = rng.choice("abcdefghijklmnopqrstuvwxyz")
    return first + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-") for _ in range(rng.randint(low, high)
                                                                                              - 1)).rstrip("-")


def _release(rng: random.Random) -> str:
    """A release name Helm takes (at most 53 characters); long ones too: names must stay within Kubernetes' limits."""
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(("kcm", "telemetry", "prod", "kcm-eu1"))
    if kind < 0.8:
        return _word(rng, 4, 20)
    return _word(rng, 40, 53)


def _resources(rng: random.Random) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if rng.random() < 0.6:
        resources["requests"] = {"cpu": rng.choice(("10m", "1", "0.5", 2)), "memory": rng.choice(("64Mi", "1Gi"))}
    if rng.random() < 0.5:
        resources["limits"] = {"memory": rng.choice(("300Mi", "2Gi")), "ephemeral-storage": "1Gi"}
    return resources


def _probe(rng: random.Random, initial: bool = True) -> dict[str, int]:
    probe = {"periodSeconds": rng.randint(1, 60), "timeoutSeconds": rng.randint(1, 30),
             "failureThreshold": rng.randint(1, 10)}
    if initial:
        probe["initialDelaySeconds"] = rng.randint(0, 120)
    return {key: value for key, value in probe.items() if rng.random() < 0.7}


def _env(rng: random.Random, reads: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Literal values only for harmless names; credentials (and what bridge.config reads) from Secrets."""
    env: list[dict[str, Any]] = []
    for name in rng.sample(HARMLESS_ENV, rng.randint(0, 3)):
        env.append({"name": name, "value": rng.choice(("2", "true", "eu-west-1", "/etc/kcm/secrets/x/y"))})
    for name in (*rng.sample(CREDENTIAL_ENV, rng.randint(0, 2)), *reads):
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": f"{name.lower().replace('_', '-')}-s",
                                                                  "key": "value"}}})
    rng.shuffle(env)
    return env


def _pod_extras(rng: random.Random, component: str) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if rng.random() < 0.5:
        extras["podLabels"] = {"squad": rng.choice(("obs", "platform")), "tier": "telemetry"}
    if rng.random() < 0.5:
        extras["podAnnotations"] = {"example.com/owner": _word(rng), "sidecar.istio.io/inject": "false"}
    if rng.random() < 0.4:
        extras["nodeSelector"] = {"kubernetes.io/os": "linux"}
    if rng.random() < 0.4:
        extras["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "kcm", "effect": "NoSchedule"}]
    if rng.random() < 0.4:
        extras["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]}}}
    if rng.random() < 0.3:
        extras["priorityClassName"] = rng.choice(("system-cluster-critical", "telemetry"))
    if rng.random() < 0.5:
        extras["resources"] = _resources(rng)
    if rng.random() < 0.5:
        extras["livenessProbe"] = _probe(rng)
    if rng.random() < 0.5:
        extras["logLevel"] = rng.choice(("DEBUG", "INFO", "WARNING", "ERROR"))
    if rng.random() < 0.4:
        extras["service"] = {"type": rng.choice(("ClusterIP", "NodePort", "LoadBalancer"))}
    if rng.random() < 0.5:
        extras["serviceMonitor"] = {"enabled": rng.random() < 0.7, "interval": rng.choice(("15s", "1m", "2h")),
                                    "labels": rng.choice(({}, {"release": "prometheus"}))}
    if rng.random() < 0.5:
        account: dict[str, Any] = {"create": rng.random() < 0.6}
        if rng.random() < 0.6:
            account["name"] = f"{component}-{_word(rng, 3, 8)}"
        if rng.random() < 0.5:
            account["annotations"] = {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/kcm"}
        extras["serviceAccount"] = account
    return extras


def _bridge_config(rng: random.Random, secret_mounts: list[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Pieces of docs/bridge.md's example configuration, none of them a credential; and the variables it reads."""
    config: dict[str, Any] = {}
    reads: list[str] = []
    kafka: dict[str, Any] = {}
    if rng.random() < 0.6:
        # README: quoted, these stay text (Helm would read 0777 as 511, 3.10 as 3.1, on as true).
        kafka["group_id"] = rng.choice(("kcm-bridge", "0777", "3.10", "on", "team.a"))
    if rng.random() < 0.3:
        kafka["topics"] = rng.sample(("kafka-client-metrics", "other-metrics", "eu.metrics"), rng.randint(1, 2))
    if rng.random() < 0.3:
        kafka["connect_timeout_s"] = rng.choice((3, 5, 10, 2.5))
    if rng.random() < 0.3:
        kafka["properties"] = {"session.timeout.ms": "10000", "fetch.min.bytes": "1"}
    if kafka:
        config["kafka"] = kafka
    if rng.random() < 0.6:
        endpoints = []
        for index in range(rng.randint(1, 2)):
            endpoint: dict[str, Any] = {"endpoint": f"collector-{index}.observability:4317"}
            if secret_mounts and rng.random() < 0.5:
                endpoint["tls"] = {"ca_file": f"/etc/kcm/secrets/{secret_mounts[0]}/ca.crt"}
            else:
                endpoint["insecure"] = True
            if rng.random() < 0.5:
                endpoint["headers"] = {rng.choice(HARMLESS_HEADERS): rng.choice(("kafka-team", "0777", "42"))}
            if rng.random() < 0.4:
                variable = f"OTLP_TOKEN_{index}"
                endpoint["headers_from_env"] = {"authorization": variable}
                reads.append(variable)
            if secret_mounts and rng.random() < 0.4:
                endpoint["headers_from_files"] = {"x-api-key": f"/etc/kcm/secrets/{secret_mounts[-1]}/token"}
            endpoints.append(endpoint)
        config["endpoints"] = endpoints
    if rng.random() < 0.3:
        rule: dict[str, Any] = {"action": "hash", "attribute": "principal"}
        if rng.random() < 0.5:
            rule["salt_env"] = "PRINCIPAL_SALT"
            reads.append("PRINCIPAL_SALT")
        config["enrich"] = {"rules": [{"action": "drop", "attribute": "client_source_address"}, rule]}
    if rng.random() < 0.3:
        config["delivery"] = {"shutdown_timeout_s": rng.choice((5, 20, 60, 2.5))}
    if rng.random() < 0.3:
        config["metrics_host"] = rng.choice(("0.0.0.0", "::", "10.1.2.3"))
    if rng.random() < 0.2:
        # install.md: a misspelt key in bridge.config installs; the bridge names it when it starts.
        config["batchh"] = {"max_points": 10}
    return config, tuple(reads)


def drain_and_check(values: dict[str, Any]) -> float:
    """README (terminationGracePeriodSeconds): the bridge's drain plus a Kafka check, with the bridge's defaults."""
    config = values["bridge"]["config"] or {}
    drain = float((config.get("delivery") or {}).get("shutdown_timeout_s", 20))
    for entry in values["bridge"]["env"]:
        if entry["name"] == "KCM_BRIDGE_SHUTDOWN_TIMEOUT_S" and "value" in entry:
            drain = float(entry["value"])
    return drain + float((config.get("kafka") or {}).get("connect_timeout_s", 10))


def draw_case(seed: int) -> Case:
    """A values file a user could write, valid by every document."""
    rng = random.Random(seed * 7919 + 714)
    release = _release(rng)
    namespace = rng.choice(("kcm", "observability", "team-a"))
    overrides: dict[str, Any] = {}
    if rng.random() < 0.25:
        # Never contained in the release name (Helm charts then drop the repetition; the docs do not say).
        overrides["nameOverride"] = rng.choice(("telemetry-x", "kcm-chart", "z" * 40))
    if rng.random() < 0.2:
        overrides["fullnameOverride"] = rng.choice(("kcm", "client-metrics", "f" * 40))
    if rng.random() < 0.5:
        overrides["commonLabels"] = {"team": "observability", "cost-center": "42"}
    if rng.random() < 0.6:
        overrides["image"] = {"repository": rng.choice(("ghcr.io/kcm-dev/kcm", "registry.local:5000/kcm")),
                              "tag": rng.choice(("", "1.2.3", "v0.1.0-rc.1")),
                              "digest": rng.choice(("", "", "sha256:" + "ab" * 32)),
                              "pullPolicy": rng.choice(("Always", "IfNotPresent", "Never"))}
    if rng.random() < 0.3:
        overrides["imagePullSecrets"] = [{"name": "regcred"}]
    kafka: dict[str, Any] = {
        "bootstrapServers": rng.choice(("b1:9092", "b1.kafka:9093,b2.kafka:9093", "[fd00::1]:9092", "kafka:19092")),
        "metricsTopic": rng.choice(("kafka-client-metrics", "prod.client-telemetry", "m_1"))}
    if rng.random() < 0.5:
        kafka["clientConfig"] = {"existingSecret": rng.choice(("kafka-client", "sasl.props")),
                                 "key": rng.choice(("client.properties", "sasl.properties"))}
    if rng.random() < 0.5:
        kafka["tlsSecrets"] = rng.sample(("kafka-ca", "kafka-user-cert", "cluster-ca-cert"), rng.randint(1, 2))
    overrides["kafka"] = kafka

    operator: dict[str, Any] = {"enabled": rng.random() < 0.85, **_pod_extras(rng, "operator")}
    peering = rng.random() < 0.4
    operator["peering"] = {"enabled": peering, "lifetimeSeconds": rng.choice((1, 60, 300, 86400))}
    operator["replicas"] = rng.randint(0, 3) if peering else rng.randint(0, 1)
    all_namespaces = rng.random() < 0.5
    namespaces = rng.choice(([], ["payments"], ["payments", "checkout", "payments"], [namespace, "team-b"]))
    # README: namespaces with allNamespaces true fail the install (a refusal below).
    operator["watch"] = {"allNamespaces": all_namespaces, "namespaces": [] if all_namespaces else namespaces}
    operator["driftInterval"] = rng.choice((5, 60, 600))
    ports = rng.sample(range(1024, 65536), 2)
    operator["metricsPort"], operator["livenessPort"] = ports
    operator["listenAddress"] = rng.choice(("0.0.0.0", "::", "10.0.0.7", "::0"))
    operator["rbac"] = {"create": rng.random() < 0.85,
                        "secrets": {"namespaces": rng.choice(([], ["payments"], ["payments", namespace])),
                                    "names": rng.choice(([], ["kafka-sasl"], ["kafka-sasl", "prod.credentials"]))}}
    operator["env"] = _env(rng)
    operator["logFormat"] = rng.choice(("text", "json"))
    overrides["operator"] = operator

    bridge: dict[str, Any] = {"enabled": rng.random() < 0.85, **_pod_extras(rng, "bridge")}
    secret_mounts = rng.sample(("collector-token", "otel-ca", "salt"), rng.randint(0, 2))
    bridge["secretMounts"] = secret_mounts
    bridge["config"], reads = _bridge_config(rng, secret_mounts)
    bridge["env"] = _env(rng, reads)
    if rng.random() < 0.2:
        bridge["env"].append({"name": "KCM_BRIDGE_SHUTDOWN_TIMEOUT_S", "value": rng.choice(("5", "30"))})
    bridge["replicas"] = rng.randint(0, 5)
    bridge["metricsPort"] = rng.choice((9464, 1024, 65535, 8081))
    if rng.random() < 0.5:
        bridge["readinessProbe"] = _probe(rng, initial=False)
    low = rng.randint(1, 4)
    bridge["autoscaling"] = {"enabled": rng.random() < 0.4, "minReplicas": low, "maxReplicas": rng.randint(low, 8),
                             "targetCPUUtilizationPercentage": rng.choice((1, 70, 100))}
    bridge["podDisruptionBudget"] = {"enabled": rng.random() < 0.7,
                                     "maxUnavailable": rng.choice((0, 1, 2, "0%", "25%", "100%")),
                                     "unhealthyPodEvictionPolicy": rng.choice(("AlwaysAllow", "IfHealthyBudget"))}
    if rng.random() < 0.4:
        bridge["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "bridge"}}}]
    overrides["bridge"] = bridge
    # At least the drain plus a Kafka check, sometimes exactly that ("at least").
    needed = drain_and_check(helm_merge(DEFAULTS, overrides))
    bridge["terminationGracePeriodSeconds"] = math.ceil(needed) + rng.choice((0, 0, 1, 100))

    rollup: dict[str, Any] = {"enabled": rng.random() < 0.5}
    if rollup["enabled"] or rng.random() < 0.5:
        rollup["output"] = rng.choice(("s3a://telemetry/kcm-rollups", "gs://bucket/rollups", "hdfs://nn:8020/r"))
    rollup.update({
        "schedule": rng.choice(("15 * * * *", "@hourly", "@every 2h", "CRON_TZ=Europe/Paris 0 3 * * *", "@daily",
                                "*/5 * * * 1-5")),
        "suspend": rng.random() < 0.3, "concurrencyPolicy": rng.choice(("Allow", "Forbid", "Replace")),
        "successfulRunHistoryLimit": rng.randint(0, 5), "failedRunHistoryLimit": rng.randint(0, 5),
        "last": rng.choice(("75m", "2h", "1d", "1h30m", "90s")), "resolution": rng.choice(("1m,1h", "5m", "1m,1h,1d")),
        "logFormat": rng.choice(("text", "json")),
        "deps": {"packages": rng.choice(([], ["org.apache.hadoop:hadoop-aws:3.5.0"],
                                         ["com.google.cloud.bigdataoss:gcs-connector:hadoop3-2.2.22", "a:b:1"])),
                 "repositories": rng.choice(([], ["https://mirror.local/maven2"]))},
        "sparkVersion": rng.choice(("4.3.0", "4.0.1")),
        "mainApplicationFile": rng.choice(("local:///opt/kcm/rollup.py", "local:///app/main.py")),
        "sparkConf": dict(rng.sample(sorted(HARMLESS_CONF.items()), rng.randint(0, 3))),
        "env": _env(rng), "extraArgs": rng.choice(([], ["--group-by=client_software_name"],
                                                   ["--top=5", "--otlp-endpoint=otel:4317"])),
        "secretMounts": rng.sample(("otel-ca", "otel-token"), rng.randint(0, 2)),
        "driver": {"cores": rng.randint(1, 4), "memory": rng.choice(("1g", "512m"))},
        "executor": {"instances": rng.randint(1, 5), "cores": rng.randint(1, 4), "memory": rng.choice(("2g", "4g"))},
    })
    if rng.random() < 0.3:
        rollup["sparkConf"]["spark.jars.ivy"] = "/tmp/ivy-cache"
    if rng.random() < 0.4:
        rollup["image"] = {"repository": "registry.local/kcm-spark", "tag": rng.choice(("", "4.3.0-kcm1")),
                           "digest": rng.choice(("", "sha256:" + "0f" * 32)), "pullPolicy": "Always"}
    if rng.random() < 0.4:
        rollup["serviceAccount"] = {"create": rng.random() < 0.7, "name": rng.choice(("", "spark-rollup")),
                                    "annotations": {"iam.gke.io/gcp-service-account": "kcm@p.iam.gserviceaccount.com"}}
    overrides["rollup"] = rollup
    # Some values left to their documented defaults.
    for path in ("operator.driftInterval", "operator.listenAddress", "operator.peering.lifetimeSeconds",
                 "bridge.metricsPort", "bridge.replicas", "rollup.schedule", "rollup.last", "rollup.resolution",
                 "rollup.deps", "rollup.sparkVersion", "rollup.driver", "kafka.metricsTopic"):
        if rng.random() < 0.25:
            *parents, last = path.split(".")
            node = overrides
            for key in parents:
                node = node[key]
            node.pop(last, None)
    if rng.random() < 0.25:
        del operator["metricsPort"], operator["livenessPort"]
    # No API served: installed with --dry-run, which prints the NOTES too.
    apis = tuple(api for api in (MONITORING, KOPF, SPARK) if rng.random() < 0.6) if rng.random() < 0.75 else ()
    return Case(f"seed{seed}", release, namespace, overrides, apis)


# --- rendering --------------------------------------------------------------------------------------------------------


@dataclass
class Render:
    ok: bool
    manifests: list[Manifest]
    notes: str
    output: str   # stdout and stderr


def render_case(helm_path: Path, case: Case, directory: Path) -> Render:
    values_file = directory / f"{case.name}.yaml"
    values_file.write_text(yaml.safe_dump(case.overrides, sort_keys=False))
    if case.apis:
        args = ["template", case.release, str(CHART), "--namespace", case.namespace, "--values", str(values_file)]
        for api in case.apis:
            args += ["--api-versions", api]
    else:
        args = ["install", case.release, str(CHART), "--namespace", case.namespace, "--values", str(values_file),
                "--dry-run=client"]
    result = run_helm(helm_path, *args)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        return Render(False, [], "", output)
    text, notes = result.stdout, ""
    if not case.apis:
        text = text.split("MANIFEST:", 1)[1]
        text, _, notes = text.partition("\nNOTES:")
    return Render(True, [doc for doc in yaml.safe_load_all(text) if doc], notes, output)


# --- reading rendered objects ---------------------------------------------------------------------------------------


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def workloads(manifests: list[Manifest]) -> dict[str, Manifest]:
    """The Deployments by the kcm command their container runs (`kcm operator`, `kcm bridge`)."""
    found: dict[str, Manifest] = {}
    for deployment in of_kind(manifests, "Deployment"):
        command = PARSER.parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"]).command
        assert command not in found, f"two Deployments run kcm {command}"
        found[command] = deployment
    return found


def pod_of(deployment: Manifest) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def file_source(path: str, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> tuple[str, str, str, bool]:
    """(volume kind, object name, key, mounted read-only) of the file a container sees at `path`."""
    candidates = [m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert candidates, f"nothing is mounted where {path} is"
    mount = max(candidates, key=lambda m: len(m["mountPath"]))
    relative = path[len(mount["mountPath"].rstrip("/")) + 1:]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    for kind, name_key in (("secret", "secretName"), ("configMap", "name")):
        if kind in volume:
            source = volume[kind]
            key = relative
            if source.get("items"):
                (key,) = [item["key"] for item in source["items"] if item["path"] == relative]
            return kind, source[name_key], key, bool(mount.get("readOnly"))
    raise AssertionError(f"{path} is on a {sorted(volume)} volume")


def mounted_secrets(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    """Secret name -> (mount path, read-only) in one container."""
    by_volume = {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}
    return {by_volume[m["name"]]: (m["mountPath"].rstrip("/"), bool(m.get("readOnly")))
            for m in mounts if m["name"] in by_volume}


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def effective_env(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The container's variables as Kubernetes sets them: the last entry of a name wins."""
    return {entry["name"]: entry for entry in entries}


def permissions(manifests: list[Manifest], account: str, namespace: str) -> set[tuple[str, str, str, str, str]]:
    """(scope, API group, resource, verb, resource name) a ServiceAccount is granted; scope "*" is cluster-wide."""
    roles = {(m["kind"], m["metadata"].get("namespace", ""), m["metadata"]["name"]): m["rules"]
             for m in manifests if m["kind"] in ("Role", "ClusterRole")}
    granted = set()
    for binding in manifests:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account and s.get("namespace") == namespace
                   for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else "*"
        role_namespace = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        for rule in roles.get((ref["kind"], role_namespace, ref["name"]), []):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or ["*"]:
                            granted.add((scope, group, resource, verb, name))
    return granted


def account_name(values: dict[str, Any], generated_prefix: str) -> str:
    """README: the name; empty: generated from the release (or `default` when create is false)."""
    account = values["serviceAccount"]
    if account["name"]:
        return account["name"]
    return generated_prefix if account["create"] else "default"


# --- the model ------------------------------------------------------------------------------------------------------


def served(case: Case, api: str) -> bool:
    return api in case.apis


def watched(case: Case) -> list[str]:
    """README: namespaced mode watches `namespaces`, exact names; empty: the release namespace."""
    return unique(case.values["operator"]["watch"]["namespaces"] or [case.namespace])


def secret_namespaces(case: Case) -> list[str]:
    """README: rbac.secrets.namespaces; empty: the watched namespaces (namespaced) or the release namespace."""
    operator = case.values["operator"]
    if operator["rbac"]["secrets"]["namespaces"]:
        return unique(operator["rbac"]["secrets"]["namespaces"])
    return [case.namespace] if operator["watch"]["allNamespaces"] else watched(case)


def rollup_rendered(case: Case) -> bool:
    return case.values["rollup"]["enabled"] and served(case, SPARK)


def expected_counts(case: Case) -> dict[str, int]:
    """How many objects of each kind the documents promise (CRDs aside: Helm installs those from crds/)."""
    values = case.values
    operator, bridge = values["operator"], values["bridge"]
    op, br, ro = operator["enabled"], bridge["enabled"], rollup_rendered(case)
    counts = {"Deployment": op + br, "Service": op + br, "ConfigMap": int(br),
              "ServiceAccount": (op and operator["serviceAccount"]["create"]) + (br and bridge["serviceAccount"]
                                                                                  ["create"])
              + (ro and values["rollup"]["serviceAccount"]["create"]) + ro,   # + the executors' own account
              "PodDisruptionBudget": int(br and bridge["podDisruptionBudget"]["enabled"]),
              "HorizontalPodAutoscaler": int(br and bridge["autoscaling"]["enabled"]),
              "ServiceMonitor": ((op and operator["serviceMonitor"]["enabled"])
                                 + (br and bridge["serviceMonitor"]["enabled"])) * served(case, MONITORING),
              "ScheduledSparkApplication": int(ro)}
    peering = op and operator["peering"]["enabled"] and served(case, KOPF)
    all_namespaces = operator["watch"]["allNamespaces"]
    counts["ClusterKopfPeering"] = int(peering and all_namespaces)
    counts["KopfPeering"] = len(watched(case)) if peering and not all_namespaces else 0
    return counts


def check_inventory(case: Case, manifests: list[Manifest]) -> None:
    counts = expected_counts(case)
    actual = {kind: len(of_kind(manifests, kind)) for kind in counts}
    assert actual == counts
    stray = {m["kind"] for m in manifests} - set(counts) - {"Role", "RoleBinding", "ClusterRole",
                                                           "ClusterRoleBinding"}
    assert not stray, f"objects no document promises: {stray}"
    assert not of_kind(manifests, "Secret"), "credentials are never chart values: the chart renders no Secret"
    prefix = case.prefix
    named = {case.values[component]["serviceAccount"]["name"] for component in ("operator", "bridge", "rollup")}
    seen = set()
    for manifest in manifests:
        metadata = manifest["metadata"]
        where = (manifest["kind"], metadata.get("namespace"), metadata["name"])
        assert where not in seen, f"{where} rendered twice"
        seen.add(where)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", metadata["name"]) and len(metadata["name"]) <= 253
        if manifest["kind"] == "ServiceAccount" and metadata["name"] in named:
            pass   # a name the values give
        elif metadata.get("namespace") == case.namespace and len(prefix) <= 30:
            assert metadata["name"].startswith(prefix), (prefix, metadata["name"])
        else:
            assert prefix[:30] in metadata["name"], (prefix, metadata["name"])
        # README: commonLabels go on every resource.
        labels = metadata.get("labels") or {}
        assert case.values["commonLabels"].items() <= labels.items(), (where, labels)
    for service in of_kind(manifests, "Service"):   # README "Names": Services within 63 characters
        assert len(service["metadata"]["name"]) <= 63 and service["metadata"]["namespace"] == case.namespace
    for app in of_kind(manifests, "ScheduledSparkApplication"):   # ... the ScheduledSparkApplication within 43
        assert len(app["metadata"]["name"]) <= 43
    # operator.md "Two replicas": the peering object carries the release's full name, in each watched namespace.
    for kind in ("ClusterKopfPeering", "KopfPeering"):
        peerings = of_kind(manifests, kind)
        assert {m["metadata"]["name"] for m in peerings} <= {prefix}
        if kind == "KopfPeering":
            assert sorted(m["metadata"]["namespace"] for m in peerings) == sorted(watched(case)) * bool(peerings)


def check_pod_common(case: Case, component: str, deployment: Manifest, manifests: list[Manifest]) -> None:
    """What both Deployments take from their values: pod placement, labels, image, security, Service, monitor."""
    values = case.values[component]
    template = deployment["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert values["podLabels"].items() <= template["metadata"]["labels"].items()
    assert values["podAnnotations"].items() <= (template["metadata"].get("annotations") or {}).items()
    assert case.values["commonLabels"].items() <= template["metadata"]["labels"].items()
    for key in ("nodeSelector", "tolerations", "affinity"):
        assert pod.get(key) == (values[key] or None), key
    assert pod.get("priorityClassName") == (values["priorityClassName"] or None)
    assert pod.get("imagePullSecrets") == (case.values["imagePullSecrets"] or None)
    assert container["image"] == image_ref(case.values["image"])
    assert container["imagePullPolicy"] == case.values["image"]["pullPolicy"]
    assert container["resources"] == values["resources"]
    # README: non-root, read-only root filesystem, no capabilities, no privilege escalation, RuntimeDefault seccomp.
    security, pod_security = container["securityContext"], pod["securityContext"]
    assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True
    assert security.get("runAsUser", pod_security.get("runAsUser")) != 0
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and not security["capabilities"].get("add")
    assert security.get("seccompProfile", pod_security.get("seccompProfile")) == {"type": "RuntimeDefault"}
    # Selector and pods agree; the Service selects these pods only and serves metricsPort.
    labels = template["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    others = [d for d in of_kind(manifests, "Deployment") if d is not deployment]
    services = [s for s in of_kind(manifests, "Service") if selects(s["spec"]["selector"], labels)]
    assert len(services) == 1, f"{component}: {len(services)} Services select its pods"
    service = services[0]
    assert not any(selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]) for d in others)
    assert service["spec"]["type"] == values["service"]["type"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == values["metricsPort"]
    assert port_number(container, port["targetPort"]) == values["metricsPort"]
    # The ServiceAccount the README's rule names, with its annotations when the chart creates it.
    account = account_name(values, "")
    assert pod["serviceAccountName"] == account or (not account and pod["serviceAccountName"].startswith(
        case.prefix[:30])), pod["serviceAccountName"]
    accounts = [a for a in of_kind(manifests, "ServiceAccount") if a["metadata"]["name"] == pod["serviceAccountName"]]
    assert len(accounts) == int(values["serviceAccount"]["create"])
    for created in accounts:
        assert (created["metadata"].get("annotations") or {}) == values["serviceAccount"]["annotations"]
    # The ServiceMonitor, when its API is served: its Service only, a port that Service has, the interval asked.
    monitors = [m for m in of_kind(manifests, "ServiceMonitor")
                if selects(m["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])]
    assert len(monitors) == int(values["serviceMonitor"]["enabled"] and served(case, MONITORING))
    for monitor in monitors:
        assert values["serviceMonitor"]["labels"].items() <= monitor["metadata"]["labels"].items()
        assert case.namespace in monitor["spec"]["namespaceSelector"]["matchNames"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert (endpoint["path"], endpoint["interval"]) == ("/metrics", values["serviceMonitor"]["interval"])
    # User env entries arrive verbatim, in order, after the chart's own; a Secret reference stays a reference.
    env = container.get("env") or []
    assert env[len(env) - len(values["env"]):] == values["env"]


def token_mounted(pod: dict[str, Any], accounts: list[Manifest]) -> bool:
    """Whether a pod gets a service-account token: its own setting, else its account's, else Kubernetes' true."""
    if "automountServiceAccountToken" in pod:
        return pod["automountServiceAccountToken"]
    own = [a for a in accounts if a["metadata"]["name"] == pod.get("serviceAccountName", pod.get("serviceAccount"))]
    return own[0].get("automountServiceAccountToken", True) if own else True


def check_kafka_files(case: Case, where: str, command_config: str | None, volumes: list[dict[str, Any]],
                      mounts: list[dict[str, Any]], extra_mounts: dict[str, str]) -> None:
    """install.md: the client properties come from kafka.clientConfig's Secret; TLS Secrets at /etc/kcm/kafka/<name>/,
    other Secrets where their value says; every one read-only and nothing else mounted from a Secret."""
    client = case.values["kafka"]["clientConfig"]
    if client["existingSecret"]:
        assert command_config, f"{where}: no client properties file"
        assert file_source(command_config, volumes, mounts) == ("secret", client["existingSecret"], client["key"],
                                                                True), where
    else:
        assert command_config is None, where
    expected = {name: f"/etc/kcm/kafka/{name}" for name in case.values["kafka"]["tlsSecrets"]} | extra_mounts
    mounted = mounted_secrets(volumes, mounts)
    assert all(read_only for _, read_only in mounted.values()), f"{where}: a Secret mounted writable"
    if client["existingSecret"]:
        mounted.pop(client["existingSecret"])
    assert {name: path for name, (path, _) in mounted.items()} == expected, where


def check_operator(case: Case, manifests: list[Manifest]) -> None:
    values = case.values["operator"]
    deployment = workloads(manifests).get("operator")
    assert (deployment is not None) == values["enabled"]
    if deployment is None:
        return
    check_pod_common(case, "operator", deployment, manifests)
    pod = pod_of(deployment)
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == values["replicas"]
    args = PARSER.parse_args(container["args"])
    # Flags of docs/operator.md, from the values the README maps onto them.
    assert (args.log_level, args.log_format) == (values["logLevel"], values["logFormat"])
    assert args.all_namespaces is values["watch"]["allNamespaces"]
    if not values["watch"]["allNamespaces"]:
        assert args.namespace == watched(case)
    assert args.bootstrap_server == case.values["kafka"]["bootstrapServers"]
    assert args.drift_interval == values["driftInterval"]
    assert (args.metrics_port, args.liveness_port) == (values["metricsPort"], values["livenessPort"])
    assert args.listen_address == values["listenAddress"]
    if values["peering"]["enabled"]:
        assert (args.peering_name, args.peering_lifetime) == (case.prefix, values["peering"]["lifetimeSeconds"])
    else:
        assert args.peering_name is None
    check_kafka_files(case, "operator", args.command_config, pod.get("volumes", []), container["volumeMounts"], {})
    # Both endpoints on ports of their own; the kubelet probes /healthz on the liveness port, with the values' timing.
    declared = {p["containerPort"] for p in container["ports"]}
    assert {values["metricsPort"], values["livenessPort"]} <= declared
    probe = container["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    assert port_number(container, probe["httpGet"]["port"]) == values["livenessPort"]
    assert values["livenessProbe"].items() <= probe.items()
    # operator.md: each replica is named by POD_ID, the pod's name.
    assert effective_env(container["env"])["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert token_mounted(pod, of_kind(manifests, "ServiceAccount")), "the operator calls the Kubernetes API"


def check_bridge(case: Case, manifests: list[Manifest]) -> None:
    values = case.values["bridge"]
    deployment = workloads(manifests).get("bridge")
    assert (deployment is not None) == values["enabled"]
    if deployment is None:
        return
    check_pod_common(case, "bridge", deployment, manifests)
    pod = pod_of(deployment)
    container = pod["containers"][0]
    # README: replicas when autoscaling is off; the HorizontalPodAutoscaler owns the count otherwise.
    if values["autoscaling"]["enabled"]:
        assert "replicas" not in deployment["spec"]
        (hpa,) = of_kind(manifests, "HorizontalPodAutoscaler")
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (values["autoscaling"]["minReplicas"],
                                                                            values["autoscaling"]["maxReplicas"])
        (metric,) = hpa["spec"]["metrics"]
        assert metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"]["averageUtilization"] == values["autoscaling"][
            "targetCPUUtilizationPercentage"]
    else:
        assert deployment["spec"]["replicas"] == values["replicas"]
    for budget in of_kind(manifests, "PodDisruptionBudget"):
        assert budget["spec"]["maxUnavailable"] == values["podDisruptionBudget"]["maxUnavailable"]
        policy = values["podDisruptionBudget"]["unhealthyPodEvictionPolicy"]
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == policy
        covered = [d["metadata"]["name"] for d in of_kind(manifests, "Deployment")
                   if selects(budget["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])]
        assert covered == [deployment["metadata"]["name"]]
    args = PARSER.parse_args(container["args"])
    assert (args.log_level, args.metrics_port) == (values["logLevel"], values["metricsPort"])
    # The config file is bridge.config, as Helm read it, from the bridge's ConfigMap.
    volumes, mounts = pod["volumes"], container["volumeMounts"]
    kind, name, key, _ = file_source(args.config, volumes, mounts)
    (config_map,) = of_kind(manifests, "ConfigMap")
    assert (kind, name) == ("configMap", config_map["metadata"]["name"])
    assert yaml.safe_load(config_map["data"][key]) == values["config"]
    # README: bootstrap servers, client properties and the metrics topic reach it as KCM_BRIDGE_* variables.
    env = effective_env(container.get("env") or [])
    kafka = case.values["kafka"]
    assert env["KCM_BRIDGE_BOOTSTRAP_SERVERS"].get("value") == kafka["bootstrapServers"]
    topics_in_config = "topics" in ((values["config"] or {}).get("kafka") or {})
    assert ("KCM_BRIDGE_TOPICS" in env) is not topics_in_config
    if not topics_in_config:
        assert env["KCM_BRIDGE_TOPICS"].get("value") == kafka["metricsTopic"]
    command_config = env["KCM_BRIDGE_COMMAND_CONFIG"]["value"] if "KCM_BRIDGE_COMMAND_CONFIG" in env else None
    check_kafka_files(case, "bridge", command_config, volumes, mounts,
                      {name: f"/etc/kcm/secrets/{name}" for name in values["secretMounts"]})
    # /healthz and /readyz on the metrics port, with the values' timing.
    for probe_key, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        probe = container[probe_key]
        assert probe["httpGet"]["path"] == path
        assert port_number(container, probe["httpGet"]["port"]) == values["metricsPort"]
        assert values[probe_key].items() <= probe.items()
    assert pod["terminationGracePeriodSeconds"] == values["terminationGracePeriodSeconds"]
    assert pod.get("topologySpreadConstraints") == (values["topologySpreadConstraints"] or None)
    # README: only the operator and the Spark driver mount a service-account token.
    assert not token_mounted(pod, of_kind(manifests, "ServiceAccount"))


def check_rollup(case: Case, manifests: list[Manifest]) -> None:
    values = case.values["rollup"]
    apps = of_kind(manifests, "ScheduledSparkApplication")
    assert len(apps) == int(rollup_rendered(case))
    if not apps:
        return
    spec = apps[0]["spec"]
    template = spec["template"]
    for key in ("schedule", "suspend", "concurrencyPolicy", "successfulRunHistoryLimit", "failedRunHistoryLimit"):
        assert spec[key] == values[key], key
    assert template["image"] == image_ref(values["image"])
    assert template["imagePullPolicy"] == values["image"]["pullPolicy"]
    assert template.get("imagePullSecrets", []) == [s["name"] for s in case.values["imagePullSecrets"]]
    assert (template["sparkVersion"], template["mainApplicationFile"]) == (values["sparkVersion"],
                                                                           values["mainApplicationFile"])
    # The arguments `kcm rollup` gets (docs/rollups.md), extraArgs last.
    arguments = template["arguments"]
    args = PARSER.parse_args(["rollup", *arguments])
    kafka = case.values["kafka"]
    assert (args.bootstrap_server, args.topic) == (kafka["bootstrapServers"], kafka["metricsTopic"])
    assert (args.last, args.resolution, args.output) == (values["last"], values["resolution"], values["output"])
    assert args.log_format == values["logFormat"]
    assert arguments[len(arguments) - len(values["extraArgs"]):] == values["extraArgs"]
    deps = template.get("deps") or {}
    assert deps.get("packages", []) == values["deps"]["packages"]
    assert deps.get("repositories", []) == values["deps"]["repositories"]
    # README: spark.jars.ivy is /tmp/.ivy2 unless sparkConf sets it.
    assert template["sparkConf"] == {"spark.jars.ivy": "/tmp/.ivy2", **values["sparkConf"]}
    driver, executor = template["driver"], template["executor"]
    assert (driver["cores"], driver["memory"]) == (values["driver"]["cores"], values["driver"]["memory"])
    assert (executor["instances"], executor["cores"], executor["memory"]) == (
        values["executor"]["instances"], values["executor"]["cores"], values["executor"]["memory"])
    # rollup.env on the driver and the executors (both write the output).
    assert driver.get("env", []) == values["env"] and executor.get("env", []) == values["env"]
    volumes = template.get("volumes", [])
    check_kafka_files(case, "rollup driver", args.command_config, volumes, driver["volumeMounts"],
                      {name: f"/etc/kcm/secrets/{name}" for name in values["secretMounts"]})
    check_kafka_files(case, "rollup executor", args.command_config, volumes, executor["volumeMounts"], {})
    for role in (driver, executor):
        security, pod_security = role["securityContext"], role["podSecurityContext"]
        assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    # The driver's account per the README's rule; the executors run as their own, with no token and no permissions.
    accounts = of_kind(manifests, "ServiceAccount")
    named = account_name(values, "")
    assert driver["serviceAccount"] == named or (not named and driver["serviceAccount"].startswith(case.prefix[:30]))
    assert executor["serviceAccount"] != driver["serviceAccount"]
    (executor_account,) = [a for a in accounts if a["metadata"]["name"] == executor["serviceAccount"]]
    assert executor_account["automountServiceAccountToken"] is False
    annotations = values["serviceAccount"]["annotations"]
    assert (executor_account["metadata"].get("annotations") or {}) == annotations
    driver_accounts = [a for a in accounts if a["metadata"]["name"] == driver["serviceAccount"]]
    assert len(driver_accounts) == int(values["serviceAccount"]["create"])
    for account in driver_accounts:
        assert (account["metadata"].get("annotations") or {}) == annotations
        assert token_mounted({"serviceAccountName": driver["serviceAccount"]}, accounts)
    assert not permissions(manifests, executor["serviceAccount"], case.namespace)


def check_rbac(case: Case, manifests: list[Manifest]) -> None:
    """install.md/README: cluster-wide, a ClusterRole (Secrets only where allowed); namespaced, a Role in each watched
    namespace and cluster-wide only listing CRDs and namespace names; Secrets: get, where and which the values say."""
    operator = case.values["operator"]
    pods = workloads(manifests)
    account = pod_of(pods["operator"])["serviceAccountName"] if "operator" in pods else None
    others = {pod_of(d)["serviceAccountName"] for name, d in pods.items() if name != "operator"}
    apps = of_kind(manifests, "ScheduledSparkApplication")
    driver = apps[0]["spec"]["template"]["driver"]["serviceAccount"] if apps else None
    if driver:
        others.add(driver)
    for other in others - {account}:
        granted = permissions(manifests, other, case.namespace)
        if other == driver:   # the Spark driver starts its executors: pods and such, in the release namespace only
            assert ("", "pods", "create") in {g[1:4] for g in granted}
            assert {g[0] for g in granted} == {case.namespace} and not {g[1] for g in granted} - {""}
            assert "secrets" not in {g[2] for g in granted}
        else:
            assert not granted, f"{other}: the bridge never calls the Kubernetes API"
    # Every binding is the operator's (when it is on and rbac.create) or the Spark driver's; every role is bound.
    binds_operator = account is not None and operator["rbac"]["create"]
    bound = set()
    for binding in manifests:
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            subjects = {(s["kind"], s["name"], s.get("namespace")) for s in binding["subjects"]}
            allowed_subjects = {("ServiceAccount", name, case.namespace)
                                for name in ({account} if binds_operator else set()) | ({driver} if driver else set())}
            assert subjects and subjects <= allowed_subjects, (binding["metadata"]["name"], subjects)
            bound.add((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
    assert {(m["kind"], m["metadata"]["name"]) for m in manifests if m["kind"] in ("Role", "ClusterRole")} == bound
    if account is None:
        return
    granted = permissions(manifests, account, case.namespace)
    if driver == account:
        granted = {g for g in granted if g[2] not in ("pods", "services", "configmaps", "persistentvolumeclaims")}
    if not operator["rbac"]["create"]:
        assert not granted
        return
    scopes = ["*"] if operator["watch"]["allNamespaces"] else watched(case)
    needed = {("kcm.dev", "clientmetricssubscriptions", verb) for verb in ("list", "watch", "patch")}
    needed |= {("kcm.dev", "clientmetricssubscriptions/status", "patch"),
               ("kcm.dev", "kafkaconnections/status", "patch")}
    needed |= {("kcm.dev", "kafkaconnections", verb) for verb in ("get", "list", "watch")}
    allowed = needed | {("kcm.dev", "clientmetricssubscriptions", "get"),
                        ("kcm.dev", "clientmetricssubscriptions/finalizers", "update"), ("", "events", "create")}
    if operator["peering"]["enabled"]:
        peerings = "clusterkopfpeerings" if operator["watch"]["allNamespaces"] else "kopfpeerings"
        needed |= {("kopf.dev", peerings, verb) for verb in ("list", "watch", "patch")}
        allowed |= {("kopf.dev", peerings, verb) for verb in ("get", "list", "watch", "patch")}
    discovery = {("apiextensions.k8s.io", "customresourcedefinitions", verb) for verb in ("list", "watch")}
    # kopf lists and watches namespaces only to follow the ones it watches by name (kopf's observation.py).
    if not operator["watch"]["allNamespaces"]:
        discovery |= {("", "namespaces", verb) for verb in ("list", "watch")}
    names = operator["rbac"]["secrets"]["names"] or ["*"]
    secrets = {(scope, "", "secrets", "get", name) for scope in secret_namespaces(case) for name in names}
    assert {g for g in granted if g[2] == "secrets"} == secrets
    rest = {g for g in granted if g[2] != "secrets"}
    assert all(g[4] == "*" for g in rest)
    by_scope: dict[str, set[tuple[str, str, str]]] = {}
    for scope, group, resource, verb, _ in rest:
        by_scope.setdefault(scope, set()).add((group, resource, verb))
    cluster = by_scope.pop("*", set())
    if operator["watch"]["allNamespaces"]:
        assert needed | discovery <= cluster <= allowed | discovery
        assert not by_scope, f"cluster-wide mode grants in namespaces too: {sorted(by_scope)}"
    else:
        assert cluster == discovery, "namespaced mode lists CRDs and namespace names cluster-wide, nothing more"
        assert sorted(by_scope) == sorted(scopes)
        for scope, rules in by_scope.items():
            assert needed <= rules <= allowed, scope


def check_notes(case: Case, notes: str) -> None:
    """install.md: NOTES say so when a toggle is on and its API is missing (every API is, in a dry-run install)."""
    operator, bridge = case.values["operator"], case.values["bridge"]
    if operator["enabled"]:
        assert (KOPF in notes) == operator["peering"]["enabled"], "peering"
    assert (SPARK in notes) == case.values["rollup"]["enabled"], "rollup"
    components = (("operator", operator), ("bridge", bridge))
    toggles = [f"{name}.serviceMonitor.enabled" for name, values in components
               if values["enabled"] and values["serviceMonitor"]["enabled"]]
    # A monitor asked for on a component that is off: the docs do not say whether that is a toggle "on".
    unsaid = any(not values["enabled"] and values["serviceMonitor"]["enabled"] for _, values in components)
    if toggles or not unsaid:
        assert (MONITORING in notes) == bool(toggles), "serviceMonitor"
    for toggle in toggles:
        assert toggle in notes


# --- documented refusals --------------------------------------------------------------------------------------------

Change = Callable[[dict[str, Any]], None]


class Refusal(NamedTuple):
    """A value the documents call invalid: the change to a valid case's values, the APIs it needs to be rendered,
    and the words the message must hold to name it (its path as Helm's schema check prints it, or as the chart's
    own check names it). Schema refusals are reported together, so several share one render."""
    what: str
    change: Change
    apis: tuple[str, ...]
    words: tuple[str, ...]
    schema_path: str | None = None
    without: tuple[str, ...] = ()   # APIs the cluster must not serve
    gap: str | None = None          # where the chart does not do what the documents say (an expected failure)


def put(path: str, value: Any) -> Change:
    def change(overrides: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = overrides
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return change


def both(*changes: Change) -> Change:
    def change(overrides: dict[str, Any]) -> None:
        for each in changes:
            each(overrides)
    return change


def _schema_refusal(path: str, value: Any, gap: str | None = None) -> Refusal:
    return Refusal(f"{path}={value!r}", put(path, value), (), ("at '/" + path.replace(".", "/"),), path, gap=gap)


def _misspelt(path: str) -> Refusal:
    return Refusal(path, put(path, {}), (), (f"'{path.rpartition('.')[2]}'",), path)


# A refusal's case has its component on (and the bridge a grace period that fits any drain the case draws).
ON = {"operator": put("operator.enabled", True),
      "bridge": both(put("bridge.enabled", True), put("bridge.terminationGracePeriodSeconds", 600)),
      "rollup": both(put("rollup.enabled", True), put("rollup.output", "s3a://b/p"))}
_REFUSALS: list[Refusal | tuple[Any, ...]] = [
    _schema_refusal("operator.replicas", 4),
    _schema_refusal("operator.replicas", "one"),
    _schema_refusal("operator.driftInterval", 4),
    _schema_refusal("operator.metricsPort", 1023),
    _schema_refusal("operator.livenessPort", 65536),
    _schema_refusal("operator.listenAddress", "localhost"),
    _schema_refusal("operator.logLevel", "verbose"),
    _schema_refusal("operator.peering.lifetimeSeconds", 0),
    _schema_refusal("operator.peering.lifetimeSeconds", 86401),
    _schema_refusal("operator.watch.namespaces", ["Payments"]),
    _schema_refusal("operator.watch.namespaces", ["team-*"]),   # exact names, not the command line's globs
    _schema_refusal("operator.rbac.secrets.namespaces", ["team_a"]),
    _schema_refusal("operator.rbac.secrets.names", ["-bad"]),
    _schema_refusal("operator.service.type", "ExternalName"),
    _schema_refusal("operator.serviceMonitor.interval", "30"),
    _schema_refusal("operator.env", [{"name": "GOMAXPROCS", "value": 2}]),
    _schema_refusal("kafka.bootstrapServers", "kafka"),
    _schema_refusal("kafka.bootstrapServers", "kafka:port"),
    _schema_refusal("kafka.metricsTopic", "bad topic"),
    _schema_refusal("kafka.clientConfig.existingSecret", "Kafka_Client"),
    _schema_refusal("kafka.tlsSecrets", ["kafka-ca", "kafka-ca"]),
    _schema_refusal("image.digest", "sha256:abc"),
    _schema_refusal("image.pullPolicy", "Sometimes"),
    _schema_refusal("image.repository", ""),
    _schema_refusal("nameOverride", "n" * 41),
    _schema_refusal("fullnameOverride", "f" * 41),
    _schema_refusal("commonLabels", {"team": 5}),
    _schema_refusal("bridge.replicas", -1),
    _schema_refusal("bridge.metricsPort", 80),
    _schema_refusal("bridge.logLevel", "TRACE"),
    _schema_refusal("bridge.autoscaling.targetCPUUtilizationPercentage", 101),
    _schema_refusal("bridge.autoscaling.minReplicas", 0),
    _schema_refusal("bridge.podDisruptionBudget.maxUnavailable", "50"),
    _schema_refusal("bridge.podDisruptionBudget.unhealthyPodEvictionPolicy", "Always"),
    _schema_refusal("bridge.secretMounts", ["Bad"]),
    _schema_refusal("bridge.secretMounts", ["otel-ca", "otel-ca"]),
    _schema_refusal("bridge.terminationGracePeriodSeconds", 0),
    _schema_refusal("bridge.resources", {"requests": {"cpu": "lots"}}),
    _schema_refusal("bridge.env", [{"name": "DEBUG", "value": True}]),
    *[_schema_refusal("rollup.schedule", schedule) for schedule in ("every hour", "@fortnightly", "* * * *")],
    _schema_refusal("rollup.concurrencyPolicy", "Sometimes"),
    _schema_refusal("rollup.successfulRunHistoryLimit", -1),
    *[_schema_refusal("rollup.last", last) for last in ("0m", "75", "0h0m")],
    _schema_refusal("rollup.resolution", "1m, 1h"),
    _schema_refusal("rollup.logFormat", "logfmt"),
    _schema_refusal("rollup.output", "/tmp/out"),
    _schema_refusal("rollup.deps.packages", ["hadoop-aws"]),
    _schema_refusal("rollup.deps.repositories", ["mirror.local"]),
    _schema_refusal("rollup.sparkVersion", "4.3"),
    _schema_refusal("rollup.driver.memory", "1G"),
    _schema_refusal("rollup.executor.instances", 0),
    _schema_refusal("rollup.image.tag", "v 1"),
    _schema_refusal("rollup.sparkConf", {"spark.sql.shuffle.partitions": 8}),
    # install.md: "a misspelt or malformed value stops the install with a message naming it" (names, labels,
    # image references are not among the exceptions it lists).
    _schema_refusal("nameOverride", "Bad_Name"),
    _schema_refusal("fullnameOverride", "Kcm.Prod"),
    _schema_refusal("operator.serviceAccount.name", "Bad_Name"),
    _schema_refusal("commonLabels", {"bad key": "x"}),
    _schema_refusal("bridge.podLabels", {"tier": "has spaces"}),
    _schema_refusal("operator.priorityClassName", "Not Valid!"),
    _schema_refusal("image.repository", "UPPER case"),
    _schema_refusal("rollup.image.repository", "Registry/Spark"),
    _schema_refusal("bridge.serviceAccount.annotations", {"not a key!": "x"}),
    _schema_refusal("bridge.nodeSelector", {"zone": "eu west"}),
    _schema_refusal("prometheusRule.additionalAlertLabels", {"team-name": "x"}),
    _schema_refusal("rollup.sparkConf", {"sql.shuffle.partitions": "8"}),   # docs: spark.* keys
    # A misspelt key is named.
    _misspelt("bridge.replica"),
    _misspelt("operator.wach"),
    _misspelt("bridgee"),
    # The chart's own checks (README "Names" and the values table), on a component that is on.
    ("image.tag=latest", both(ON["operator"], put("image.tag", "latest")), (), ("latest",)),
    ("rollup.image.tag=latest", both(ON["rollup"], put("rollup.image.tag", "latest")), (SPARK,), ("latest",)),
    ("operator.replicas=2 without peering", both(ON["operator"], put("operator.replicas", 2),
                                                 put("operator.peering.enabled", False)), (),
     ("operator.replicas", "operator.peering.enabled")),
    *[(f"operator.listenAddress={address}", both(ON["operator"], put("operator.listenAddress", address)), (),
       ("operator.listenAddress", address, "loopback")) for address in LOOPBACKS],
    ("kafka.tlsSecrets named client", both(ON["operator"], put("kafka.tlsSecrets", ["client"])), (),
     ("kafka.tlsSecrets", '"client"')),
    ("namespaces with allNamespaces true", both(ON["operator"], put("operator.watch", {
        "allNamespaces": True, "namespaces": ["payments"]})), (),
     ("operator.watch.namespaces", "operator.watch.allNamespaces=false")),
    *[(f"{value} {key}", both(ON["operator"], ON["bridge"], put(value, {key: "x"})), (), (value, key))
      for value, key in (("commonLabels", "app.kubernetes.io/name"), ("commonLabels", "helm.sh/chart"),
                         ("operator.podLabels", "app.kubernetes.io/instance"),
                         ("bridge.podLabels", "app.kubernetes.io/component"))],
    ("kafka.properties nested by an unescaped --set", both(ON["bridge"], put("bridge.config", {
        "kafka": {"properties": {"sasl": {"password": CANARY}}}})), (),
     ("bridge.config.kafka.properties.sasl.password",)),
    ("kafka.properties a map", both(ON["bridge"], put("bridge.config", {
        "kafka": {"properties": {"sasl": {"mechanism": "PLAIN"}}}})), (),
     ("bridge.config.kafka.properties.sasl", "escape")),
    ("operator ports equal", both(ON["operator"], put("operator.metricsPort", 9100),
                                  put("operator.livenessPort", 9100)), (),
     ("operator.metricsPort", "operator.livenessPort", "9100")),
    ("autoscaling min above max", both(ON["bridge"], put("bridge.autoscaling", {
        "enabled": True, "minReplicas": 5, "maxReplicas": 4})), (),
     ("bridge.autoscaling.minReplicas", "bridge.autoscaling.maxReplicas")),
    ("rollup without output", both(put("rollup.enabled", True), put("rollup.output", "")), (SPARK,),
     ("rollup.output",)),
    # The values table: "required when enabled"; refused only once the Spark operator's API is there.
    Refusal("rollup without output nor Spark operator", both(put("rollup.enabled", True), put("rollup.output", "")),
            (), ("rollup.output",), without=(SPARK,)),
    ("grace period below drain", both(ON["bridge"], put("bridge.config", {"delivery": {"shutdown_timeout_s": 40},
                                                                          "kafka": {"connect_timeout_s": 5}}),
                                      put("bridge.env", []), put("bridge.terminationGracePeriodSeconds", 44)), (),
     ("bridge.terminationGracePeriodSeconds", "45")),
    *[(f"bridge.config.kafka.properties.{key}", both(ON["bridge"], put("bridge.config", {
        "kafka": {"properties": {key: CANARY}}})), (), (f"bridge.config.kafka.properties.{key}",))
      for key in CREDENTIAL_PROPERTIES],
    *[(f"header {name}", both(ON["bridge"], put("bridge.config", {"endpoints": [
        {"endpoint": "c:4317", "insecure": True},
        {"endpoint": "d:4317", "insecure": True, "headers": {name: CANARY}}]})), (),
       (f"bridge.config.endpoints[1].headers.{name}",)) for name in CREDENTIAL_HEADERS],
    ("rule salt", both(ON["bridge"], put("bridge.config", {"enrich": {"rules": [
        {"action": "hash", "attribute": "principal", "salt": CANARY}]}})), (), ("bridge.config.enrich.rules[0].salt",)),
    *[(f"bridge.config.metrics_host={host}", both(ON["bridge"], put("bridge.config", {"metrics_host": host})), (),
       ("bridge.config.metrics_host", host)) for host in LOOPBACKS],
    *[(f"{component}.env {name}", both(ON[component], put(f"{component}.env", [
        {"name": "HARMLESS", "value": "1"}, {"name": name, "value": CANARY}])), (SPARK,) * (component == "rollup"),
       (f"{component}.env[1]", name))
      for component, name in zip(("operator", "bridge", "rollup") * 4, CREDENTIAL_ENV)],
    ("env a header reads", both(ON["bridge"], put("bridge.config", {"endpoints": [
        {"endpoint": "c:4317", "insecure": True, "headers_from_env": {"x-scope-orgid": "TENANT"}}]}),
        put("bridge.env", [{"name": "TENANT", "value": CANARY}])), (), ("bridge.env[0]", "TENANT")),
    ("env a salt reads", both(ON["bridge"], put("bridge.config", {"enrich": {"rules": [
        {"action": "hash", "attribute": "principal", "salt_env": "PEPPER"}]}}),
        put("bridge.env", [{"name": "PEPPER", "value": CANARY}])), (), ("bridge.env[0]", "PEPPER")),
    *[(f"rollup.sparkConf.{key}", both(ON["rollup"], put("rollup.sparkConf", {key: CANARY})), (SPARK,),
       (f"rollup.sparkConf.{key}",)) for key in CREDENTIAL_CONF],
]
REFUSALS = [Refusal(*refusal) for refusal in _REFUSALS]


def _render_names() -> dict[int, str]:
    """The render each refusal is checked on: its own, or a batch of schema refusals at unrelated paths."""
    names, batches = {}, []
    for index, refusal in enumerate(REFUSALS):
        if refusal.schema_path is None:
            names[index] = f"refusal{index}"
            continue
        path = refusal.schema_path + "."
        for number, batch in enumerate(batches):
            if len(batch) < 8 and not any(path.startswith(other) or other.startswith(path) for other in batch):
                batch.append(path)
                break
        else:
            number = len(batches)
            batches.append([path])
        names[index] = f"schema{number}"
    return names


RENDER_OF_REFUSAL = _render_names()


def refusal_cases() -> list[Case]:
    """One case per render of RENDER_OF_REFUSAL: a valid case's values with the refusals' changes."""
    cases = []
    for name in unique(list(RENDER_OF_REFUSAL.values())):
        members = [REFUSALS[i] for i, render in RENDER_OF_REFUSAL.items() if render == name]
        base = draw_case(1000 + len(cases))
        overrides = copy.deepcopy(base.overrides)
        for refusal in members:
            refusal.change(overrides)
        apis = {*base.apis, *(api for refusal in members for api in refusal.apis)}
        apis -= {api for refusal in members for api in refusal.without}
        cases.append(Case(name, base.release, base.namespace, overrides, tuple(sorted(apis))))
    return cases


def twin_case() -> Case:
    """A case whose bridge.config differs from seed 0's in one value only."""
    base = draw_case(0)
    overrides = copy.deepcopy(base.overrides)
    overrides["bridge"]["enabled"] = True
    overrides["bridge"].setdefault("config", {}).setdefault("kafka", {})["group_id"] = "twin-group"
    return Case("twin", base.release, base.namespace, overrides, base.apis)


def twin_base() -> Case:
    base = draw_case(0)
    overrides = copy.deepcopy(base.overrides)
    overrides["bridge"]["enabled"] = True
    return Case("twin-base", base.release, base.namespace, overrides, base.apis)


# The chart as installed with no values at all: without, and with, every optional API.
DEFAULT_CASES = [Case("defaults", "kcm", "kcm", {}, ()), Case("defaults-apis", "kcm", "kcm", {}, (MONITORING, KOPF,
                                                                                                  SPARK))]
VALID = [f"seed{seed}" for seed in SEEDS] + [case.name for case in DEFAULT_CASES]


@pytest.fixture(scope="module")
def renders(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Case, Render]]:
    """Every case of this file rendered once, in parallel."""
    directory = tmp_path_factory.mktemp("values")
    cases = [draw_case(seed) for seed in SEEDS] + [twin_base(), twin_case(), *DEFAULT_CASES]
    cases += refusal_cases()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda case: render_case(helm, case, directory), cases))
    return {case.name: (case, result) for case, result in zip(cases, results)}


def rendered_case(renders: dict[str, tuple[Case, Render]], name: str) -> tuple[Case, list[Manifest], str]:
    case, result = renders[name]
    assert result.ok, f"{case.overrides}\n{result.output}"
    return case, result.manifests, result.notes


# --- the tests --------------------------------------------------------------------------------------------------------


def test_the_drawn_values_cover_every_documented_mode() -> None:
    cases = [draw_case(seed) for seed in SEEDS]
    seen = {(c.values["operator"]["watch"]["allNamespaces"], c.values["operator"]["peering"]["enabled"]) for c in cases}
    assert len(seen) == 4
    assert {c.values["bridge"]["autoscaling"]["enabled"] for c in cases} == {True, False}
    assert {rollup_rendered(c) for c in cases} == {True, False}
    assert {bool(c.apis) for c in cases} == {True, False}
    assert {bool(c.values["kafka"]["clientConfig"]["existingSecret"]) for c in cases} == {True, False}
    assert {c.values["operator"]["rbac"]["create"] for c in cases} == {True, False}
    assert any(len(c.release) > 40 for c in cases) and any(c.values["fullnameOverride"] for c in cases)
    assert any(c.values["bridge"]["terminationGracePeriodSeconds"] == drain_and_check(c.values) for c in cases)
    # The refusals stop where the docs do: file-naming variables, provider classes and boundary values are drawn
    # (and so rendered by the tests below).
    envs = {e["name"] for c in cases for component in ("operator", "bridge", "rollup")
            for e in c.values[component]["env"] if "value" in e}
    assert {"MONKEY", "DB_PASSWORD_FILE", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_ACCESS_KEY_ID"} <= envs
    confs = {key for c in cases for key in c.values["rollup"]["sparkConf"]}
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" in confs
    assert {0, "0%", "100%"} <= {c.values["bridge"]["podDisruptionBudget"]["maxUnavailable"] for c in cases}


@pytest.mark.parametrize("name", VALID)
def test_random_values_render_the_documented_objects_with_their_names_and_labels(renders, name: str) -> None:
    case, manifests, _ = rendered_case(renders, name)
    check_inventory(case, manifests)
    if name in VALIDATED:
        for manifest in manifests:
            try:
                kubernetes_validate.validate(manifest, test_chart.KUBE_VERSIONS[-1], strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                assert manifest["apiVersion"].rpartition("/")[0] in test_chart.CUSTOM_GROUPS
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{manifest['kind']}/{manifest['metadata']['name']}: {exc.message}") from exc


@pytest.mark.parametrize("name", VALID)
def test_random_values_reach_the_operator_as_documented(renders, name: str) -> None:
    case, manifests, _ = rendered_case(renders, name)
    check_operator(case, manifests)


@pytest.mark.parametrize("name", VALID)
def test_random_values_reach_the_bridge_as_documented(renders, name: str) -> None:
    case, manifests, _ = rendered_case(renders, name)
    check_bridge(case, manifests)


@pytest.mark.parametrize("name", VALID)
def test_random_values_reach_the_rollup_as_documented(renders, name: str) -> None:
    case, manifests, _ = rendered_case(renders, name)
    check_rollup(case, manifests)


@pytest.mark.parametrize("name", VALID)
def test_random_values_grant_the_documented_rbac_and_no_more(renders, name: str) -> None:
    case, manifests, _ = rendered_case(renders, name)
    check_rbac(case, manifests)


def test_notes_warn_of_every_toggle_whose_api_is_missing(renders) -> None:
    checked = 0
    for name in VALID:
        case, _, notes = rendered_case(renders, name)
        if not case.apis:
            check_notes(case, notes)
            checked += 1
    assert checked >= 3


def test_a_bridge_config_change_rolls_the_bridge_pods(renders) -> None:
    _, before, _ = rendered_case(renders, "twin-base")
    _, after, _ = rendered_case(renders, "twin")
    old, new = (workloads(m)["bridge"]["spec"]["template"] for m in (before, after))
    assert old["metadata"]["annotations"] != new["metadata"]["annotations"]
    old_op, new_op = (workloads(m).get("operator") for m in (before, after))
    assert old_op == new_op, "only the bridge reads bridge.config"


@pytest.mark.parametrize("index", [
    pytest.param(index, id=refusal.what,
                 marks=[pytest.mark.xfail(strict=True, reason=refusal.gap)] if refusal.gap else [])
    for index, refusal in enumerate(REFUSALS)])
def test_documented_invalid_values_are_refused_naming_the_value(renders, index: int) -> None:
    case, result = renders[RENDER_OF_REFUSAL[index]]
    words = REFUSALS[index].words
    assert not result.ok, f"{REFUSALS[index].what} rendered:\n{yaml.safe_dump(case.overrides)[:2000]}"
    assert all(word in result.output for word in words), (words, result.output[-1500:])
    assert CANARY not in result.output, "a refusal printed the credential it refused"
    assert "Error:" in result.output and "panic" not in result.output
