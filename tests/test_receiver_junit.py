"""The receiver plugin's JUnit tests (receiver/src/test/java), run under pytest so `make test` runs them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from kcm_sandbox.java_receiver import build_dir, ensure_built, jar_path, runtime_classpath

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    ensure_built()


def test_every_junit_test_of_the_plugin_passes():
    junit = sorted(str(path) for path in (build_dir() / "lib").glob("*.jar") if "junit" in path.name
                   or path.name.startswith(("opentest4j", "apiguardian", "jspecify")))
    classpath = os.pathsep.join([runtime_classpath(build_dir() / "test-classes", jar_path()), *junit])
    done = subprocess.run(["java", "-cp", classpath, "dev.kcm.receiver.RunTests"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    succeeded = int(re.search(r"(\d+) tests successful", done.stdout).group(1))
    # Every @Test in the sources ran and passed: one the launcher did not find would otherwise pass unseen.
    written = sum(len(re.findall(r"^\s*@Test\b", path.read_text(), re.MULTILINE))
                  for path in (REPO / "receiver" / "src" / "test" / "java").rglob("*.java"))
    assert succeeded == written > 0, done.stdout


def test_the_plugin_jar_bundles_no_kafka_classes():
    done = subprocess.run(["jar", "--list", "--file", str(jar_path())], capture_output=True, text=True, timeout=60,
                          check=True)
    classes = [line for line in done.stdout.splitlines() if line.endswith(".class")]
    assert "dev/kcm/receiver/KcmClientTelemetry.class" in classes
    assert "dev/kcm/receiver/KcmTelemetryExporter.class" in classes
    assert all(line.startswith("dev/kcm/receiver/") for line in classes), classes
