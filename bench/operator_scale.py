"""Operator scale: time for N new ClientMetricsSubscriptions to reach Ready, and for one change to reach Kafka.

Runs the operator in this process (kopf's test runner) against the kube emulator (tests/kube_emulator.py, kmock)
and the sandbox. Goals: 1,000 converge in under 60 s; one change reaches Kafka within 2 s at p95.
Usage: .venv/bin/python bench/operator_scale.py [RESOURCES] [CHANGES]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kopf.testing import KopfRunner
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kube_emulator import KubeServer  # noqa: E402  (a test helper, found through the path set above)

from kcm_common.kafka import KafkaSettings  # noqa: E402
from kcm_operator.handlers import OperatorConfig, build_registry, operator_settings  # noqa: E402
from kcm_sandbox.runner import Sandbox, SandboxOptions  # noqa: E402

GROUP, VERSION, PLURAL, NS = "kcm.dev", "v1alpha1", "clientmetricssubscriptions", "bench"
TIMEOUT_S = 300.0


def _ready(kube: KubeServer) -> int:
    return sum(1 for obj in kube.objects(PLURAL, NS).values()
               if any(condition["type"] == "Ready" and condition["status"] == "True"
                      for condition in obj.get("status", {}).get("conditions", ())))


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def main() -> None:
    resources = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    changes = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with tempfile.TemporaryDirectory() as directory, Sandbox(SandboxOptions(listen=("127.0.0.1", 0))) as sandbox:
        kube = KubeServer(Path(directory), sorted((ROOT / "crds").glob("*.yaml")))
        kube.start()
        try:
            custom = client.CustomObjectsApi(config.new_client_from_config(str(kube.kubeconfig)))
            settings = operator_settings()
            settings.scanning.disabled = True
            settings.posting.enabled = False  # Events would double the API writes and measure the emulator
            registry = build_registry(OperatorConfig(KafkaSettings(sandbox.bootstrap), drift_interval_s=3600,
                                                     api_client=config.new_client_from_config(str(kube.kubeconfig))))
            runner = KopfRunner(["run", "--standalone", "--namespace", NS], timeout=TIMEOUT_S, registry=registry,
                                settings=settings)
            os.environ["KUBECONFIG"] = str(kube.kubeconfig)  # where kopf's login looks
            with runner:
                started = time.perf_counter()
                with ThreadPoolExecutor(8) as pool:  # like a GitOps sync: many creates in flight at once
                    list(pool.map(lambda index: custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
                        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClientMetricsSubscription",
                        "metadata": {"name": f"app-{index:04d}"},
                        "spec": {"metrics": ["org.apache.kafka.producer."], "intervalMs": 60000,
                                 "match": {"clientId": f"app-{index:04d}-.*"}}}), range(resources)))
                created = time.perf_counter() - started
                _wait(lambda: _ready(kube) == resources, f"{resources} resources to be Ready")
                converged = time.perf_counter() - started
                assert len(sandbox.store.names()) == resources
                latencies = []
                for change in range(changes):
                    interval = 1000 + change
                    name = f"app-{change % resources:04d}"
                    began = time.perf_counter()
                    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name,
                                                          {"spec": {"intervalMs": interval}})
                    _wait(lambda: sandbox.store.configs(f"{NS}.{name}").get("interval.ms") == str(interval),
                          f"change {change} in Kafka")
                    latencies.append(time.perf_counter() - began)
        finally:
            kube.stop()
    quantiles = statistics.quantiles(latencies, n=20)
    print(f"{resources} resources created in {created:.1f} s, all Ready after {converged:.1f} s "
          f"({resources / converged:.0f}/s; goal < 60 s)")
    print(f"one change → Kafka over {changes} changes: p50 {statistics.median(latencies) * 1000:.0f} ms, "
          f"p95 {quantiles[18] * 1000:.0f} ms (goal p95 < 2000 ms)")


if __name__ == "__main__":
    main()
