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
from packaging.specifiers import SpecifierSet
from packaging.version import Version

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


def test_there_are_the_kcm_kafka_and_spark_images() -> None:
    assert {path.parent.name for path in DOCKERFILES} >= {"kcm", "kafka", "spark"}


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


def _stages(found: list[Instruction]) -> list[tuple[str, str, list[Instruction]]]:
    """(name, base image, instructions) of each build stage; a stage's base may be an earlier stage's name."""
    defaults = _arg_defaults(found)
    stages: list[tuple[str, str, list[Instruction]]] = []
    for step in found:
        if step.keyword == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], step.args[0])
            name = step.args[2] if len(step.args) == 3 and step.args[1].upper() == "AS" else str(len(stages))
            stages.append((name, image, []))
        elif stages:
            stages[-1][2].append(step)
    return stages


def _python_version(image: str) -> Version | None:
    """The Python version of an official `python:` image reference (`python:3.12.12-slim-bookworm` -> 3.12.12)."""
    match = re.fullmatch(r"(?:docker\.io/)?(?:library/)?python:(\d+\.\d+(?:\.\d+)?)\b.*", image)
    return Version(match.group(1)) if match else None


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_no_copy_takes_the_whole_build_context(dockerfile: Path) -> None:
    """A `COPY . ...` layer keeps the checkout (.venv, build/, .git, stray credentials) in the image for good."""
    whole = []
    for step in instructions(dockerfile):
        if step.keyword not in ("COPY", "ADD") or any(f.startswith("--from") for f in step.flags):
            continue
        whole += [source for source in step.args[:-1]
                  if "*" in source or (REPO / source).resolve() in (REPO, *REPO.parents)]
    assert not whole, f"{dockerfile.relative_to(REPO)} copies the whole build context: {whole}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_kcm_is_installed_on_a_python_it_supports(dockerfile: Path) -> None:
    """Every stage that pip-installs kcm runs on an official python image within requires-python, and a stage
    taking such a virtual environment runs on the same image (the venv links to that interpreter)."""
    requires = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    stages = _stages(instructions(dockerfile))
    bases = {name: image for name, image, _ in stages}
    for name, image, steps in stages:
        if any("pip install" in " ".join(step.args) for step in steps if step.keyword == "RUN"):
            version = _python_version(image)
            assert version is not None, f"stage {name} installs kcm on {image}, not an official python image"
            assert version in requires, f"stage {name}: Python {version} of {image} is not {requires}"
        for step in steps:
            source = next((f.split("=", 1)[1] for f in step.flags if f.startswith("--from=")), None)
            if step.keyword == "COPY" and source in bases and _python_version(bases[source]):
                assert image == bases[source], f"stage {name} takes {step.args} from {source} on another image"


def test_kcm_is_installed_on_a_python_it_supports_catches_the_spark_python_image(tmp_path: Path) -> None:
    """The official Spark python3 images have Ubuntu 22.04's Python 3.10, which kcm's requires-python refuses."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM apache/spark:4.1.0-scala2.13-java17-python3-ubuntu\nRUN pip install /src[rollup]\n")
    with pytest.raises(AssertionError, match="not an official python image"):
        test_kcm_is_installed_on_a_python_it_supports(dockerfile)
    dockerfile.write_text("FROM python:3.10.13-slim-bookworm\nRUN pip install /src[rollup]\n")
    with pytest.raises(AssertionError, match="Python 3.10.13"):
        test_kcm_is_installed_on_a_python_it_supports(dockerfile)


@pytest.mark.parametrize("dockerfile", [p for p in DOCKERFILES if p.with_name("Dockerfile.dockerignore").exists()],
                         ids=lambda p: p.parent.name)
def test_the_dockerignore_admits_exactly_what_is_copied(dockerfile: Path) -> None:
    lines = [line.strip() for line in dockerfile.with_name("Dockerfile.dockerignore").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "*", "the context starts empty; what is copied is let back in by name"
    admitted = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {source.rstrip("/") for step in instructions(dockerfile)
              if step.keyword in ("COPY", "ADD") and not any(f.startswith("--from") for f in step.flags)
              for source in step.args[:-1]}
    assert admitted == copied


def test_spark_image_runs_the_official_spark_on_a_supported_python_with_the_rollup_extra() -> None:
    found = instructions(REPO / "images" / "spark" / "Dockerfile")
    stages = _stages(found)
    spark = [name for name, image, _ in stages if image.startswith("apache/spark:")]
    assert spark, "Spark comes from the official apache/spark image"
    final_name, final_image, final = stages[-1]
    assert _python_version(final_image), "the job runs on an official python image"
    # What the official image's entry point and Spark's scripts need, from the Spark image or Debian.
    taken = {(next(f.split("=", 1)[1] for f in step.flags if f.startswith("--from=")), source)
             for step in final if step.keyword == "COPY" and any(f.startswith("--from=") for f in step.flags)
             for source in step.args[:-1]}
    assert {(spark[0], "/opt/spark"), (spark[0], "/opt/entrypoint.sh"), (spark[0], "/opt/decom.sh")} <= taken
    apt = " ".join(" ".join(step.args) for step in final if step.keyword == "RUN" and "apt-get install" in
                   " ".join(step.args))
    java = re.search(r"-java(\d+)-", _arg_defaults(found)["SPARK_IMAGE"])
    assert java and f"openjdk-{java.group(1)}-jre-headless" in apt, "the Java the Spark image was built for"
    assert "tini" in apt and "libnss-wrapper" in apt, "the entry point runs tini, and fakes a passwd entry"
    env = dict(arg.split("=", 1) for step in final if step.keyword == "ENV" for arg in step.args)
    assert env["SPARK_HOME"] == "/opt/spark"
    venv = env["PYSPARK_PYTHON"].rsplit("/bin/", 1)[0]
    assert (venv, venv) in {(step.args[0], step.args[-1]) for step in final if step.keyword == "COPY"}
    # The kcm package with the rollup extra, from the copied project, without PyPI's pyspark.
    build = next(steps for name, _, steps in stages if any(
        "pip install" in " ".join(s.args) for s in steps if s.keyword == "RUN"))
    installs = [" ".join(step.args) for step in build if step.keyword == "RUN" and "pip install" in " ".join(step.args)]
    assert installs == [f"{venv}/bin/pip install .[rollup] && {venv}/bin/pip uninstall -y pyspark"]
    copied = {source.rstrip("/") for step in build if step.keyword == "COPY" and not step.flags
              for source in step.args[:-1]}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert {*project["tool"]["setuptools"]["packages"]["find"]["where"], "pyproject.toml", "README.md"} <= copied
    assert ("images/spark/rollup.py", "/opt/kcm/rollup.py") in {s.args for s in final if s.keyword == "COPY"}
    # The official image's layout and user: the spark user 185, its work directory, a writable Ivy cache.
    runs = " ".join(" ".join(step.flags + step.args) for step in final if step.keyword == "RUN")
    assert "--uid=185" in runs and "mkdir -p /tmp/.ivy2" in runs
    assert [step.args for step in final if step.keyword == "WORKDIR"] == [("/opt/spark/work-dir",)]
    assert [step.args[0] for step in final if step.keyword == "USER"][-1] == "185"
    assert [step.args for step in final if step.keyword == "ENTRYPOINT"] == [("[/opt/entrypoint.sh]",)]
