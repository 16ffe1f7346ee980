"""The Spark examples run the job as documented: their arguments parse as `kcm rollup`, the connector and the Ivy
cache are set, and the image copies the entry point they name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kcm_cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "spark").glob("rollup-*.yaml"))
RBAC = ROOT / "examples" / "spark" / "rbac.yaml"


def _spec(document: dict) -> dict:
    return document["spec"]["template"] if document["kind"] == "ScheduledSparkApplication" else document["spec"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_spark_examples_run_the_rollup_entry_point_with_valid_arguments(path):
    document = yaml.safe_load(path.read_text())
    assert document["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    spec = _spec(document)
    args = build_parser().parse_args(["rollup", *spec["arguments"]])
    assert args.output.startswith("s3a://") and args.bootstrap_server
    assert spec["mainApplicationFile"] == "local:///opt/kcm/rollup.py"
    assert any(p.startswith("org.apache.spark:spark-sql-kafka-0-10_2.13:") for p in spec["deps"]["packages"])
    assert spec["sparkConf"]["spark.jars.ivy"] == "/tmp/.ivy2"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_writing_to_s3a_brings_the_s3a_filesystem_of_its_sparks_hadoop(path):
    # The official Spark image, like PySpark's jars, has Hadoop's client but not hadoop-aws: without it an s3a://
    # output fails once everything is computed. Its version must be the Hadoop the Spark release ships.
    import pyspark

    spec = _spec(yaml.safe_load(path.read_text()))
    assert spec["sparkVersion"] == pyspark.__version__
    [client] = (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")
    hadoop = client.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    output = spec["arguments"][spec["arguments"].index("--output") + 1]
    assert output.startswith("s3a://") and f"org.apache.hadoop:hadoop-aws:{hadoop}" in spec["deps"]["packages"]


def test_examples_cover_a_one_off_and_an_hourly_schedule_and_the_image_provides_their_entry_point():
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in EXAMPLES}
    assert kinds == {"SparkApplication", "ScheduledSparkApplication"}
    dockerfile = (ROOT / "images" / "spark" / "Dockerfile").read_text()
    assert "COPY images/spark/rollup.py /opt/kcm/rollup.py" in dockerfile
    assert 'pip install ".[rollup]"' in dockerfile and "/tmp/.ivy2" in dockerfile
    assert {yaml.safe_load(p.read_text())["spec"].get("mainApplicationFile")
            or yaml.safe_load(p.read_text())["spec"]["template"]["mainApplicationFile"]
            for p in EXAMPLES} == {"local:///opt/kcm/rollup.py"}

@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_accounts_an_example_runs_as_are_in_its_rbac_file(path):
    """The driver's account must exist and may start its executors; the executors' has no token."""
    document = yaml.safe_load(path.read_text())
    namespace, spec = document["metadata"]["namespace"], _spec(document)
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(RBAC.read_text())}
    assert all(o["metadata"]["namespace"] == namespace for o in objects.values())
    driver, executor = spec["driver"]["serviceAccount"], spec["executor"]["serviceAccount"]
    assert ("ServiceAccount", driver) in objects
    assert objects[("ServiceAccount", executor)]["automountServiceAccountToken"] is False
    [binding] = [o for o in objects.values() if o["kind"] == "RoleBinding"
                 and {"kind": "ServiceAccount", "name": driver, "namespace": namespace} in o["subjects"]]
    role = objects[("Role", binding["roleRef"]["name"])]
    granted = {(resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert {("pods", "create"), ("pods", "delete"), ("services", "create"), ("configmaps", "create")} <= granted


def test_the_image_entry_point_is_kcm_rollup(tmp_path):
    # Run as spark-submit would: a plain script; --help exits 0 and shows the rollup options.
    result = subprocess.run([sys.executable, str(ROOT / "images" / "spark" / "rollup.py"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--bootstrap-server" in result.stdout and "kcm rollup" in result.stdout
