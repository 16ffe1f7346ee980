"""The Dockerfiles: hadolint finds nothing, and everything they copy or install exists here or is built by us.

No container engine runs here, so the images are never built; these checks catch what would break a build.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HADOLINT = Path(sys.executable).parent / "hadolint"
DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))
# Paths no checkout holds, each with the build step (a script and the line that names its output) making it.
BUILT = {"build/receiver/kcm-receiver.jar": (REPO / "receiver" / "build.py", 'PLUGIN_JAR = BUILD / "kcm-receiver.jar"')}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    flags: tuple[str, ...]
    args: tuple[str, ...]


def instructions(dockerfile: Path) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    result = []
    for line in filter(None, map(str.strip, text.splitlines())):
        keyword, _, rest = line.partition(" ")
        words = shlex.split(rest)
        flags = tuple(w for w in words if w.startswith("--"))
        result.append(Instruction(keyword.upper(), flags, tuple(w for w in words if not w.startswith("--"))))
    return result


def _arg_defaults(found: list[Instruction]) -> dict[str, str]:
    return dict(arg.args[0].split("=", 1) for arg in found if arg.keyword == "ARG" and "=" in arg.args[0])


def test_there_are_the_kcm_and_kafka_images() -> None:
    assert {path.parent.name for path in DOCKERFILES} >= {"kcm", "kafka"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    result = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode != 0 and "DL3007" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_copied_path_exists_or_is_built_by_the_documented_step(dockerfile: Path) -> None:
    missing = []
    for step in instructions(dockerfile):
        if step.keyword not in ("COPY", "ADD") or any(f.startswith("--from") for f in step.flags):
            continue
        for source in step.args[:-1]:
            if (REPO / source).exists():
                continue
            script, line = BUILT.get(source.rstrip("/"), (None, ""))
            if script is None or line not in script.read_text():
                missing.append(source)
    assert not missing, f"{dockerfile.relative_to(REPO)} copies what the repository does not have: {missing}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(dockerfile: Path) -> None:
    found = instructions(dockerfile)
    defaults = _arg_defaults(found)
    stages = set()
    for step in found:
        if step.keyword != "FROM":
            continue
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], step.args[0])
        if image not in stages:
            name = image.rsplit("/", 1)[-1]
            assert "@sha256:" in image or (":" in name and not name.endswith(":latest")), image
        if len(step.args) == 3 and step.args[1].upper() == "AS":
            stages.add(step.args[2])


def test_kcm_image_installs_the_operator_and_bridge_from_the_copied_project() -> None:
    found = instructions(REPO / "images" / "kcm" / "Dockerfile")
    copied = {source.rstrip("/") for step in found if step.keyword == "COPY" and not step.flags
              for source in step.args[:-1]}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # A package directory left out of the build context would be missing from the image, silently.
    assert set(project["tool"]["setuptools"]["packages"]["find"]["where"]) <= copied
    assert {"pyproject.toml", "README.md"} <= copied
    installs = [" ".join(step.args) for step in found if step.keyword == "RUN" and "pip install" in " ".join(step.args)]
    assert installs == ['/opt/kcm/bin/pip install .[operator,bridge]']
    extras = project["project"]["optional-dependencies"]
    assert {"operator", "bridge"} <= set(extras)
    assert not any(dep.startswith("pyspark") for name in ("operator", "bridge") for dep in extras[name])
    user = [step.args[0] for step in found if step.keyword == "USER"][-1]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0, "must run as a numeric non-root user"
    # shlex drops the JSON quotes: ["kcm"] reads as [kcm].
    assert [step.args for step in found if step.keyword == "ENTRYPOINT"] == [("[kcm]",)]


def test_kafka_image_adds_the_receiver_jar_to_the_broker_classpath() -> None:
    found = instructions(REPO / "images" / "kafka" / "Dockerfile")
    copies = [step.args for step in found if step.keyword == "COPY"]
    assert copies == [("build/receiver/kcm-receiver.jar", "/opt/kafka/libs/kcm-receiver.jar")]
    assert _arg_defaults(found)["STRIMZI_KAFKA_IMAGE"].startswith("quay.io/strimzi/kafka:")
    assert not any(step.keyword == "USER" for step in found), "keep Strimzi's non-root user"
