"""The package layout holds: the shared leaf imports no component, and each component runs on its own extra.

Imports are read from the source (every `import`, wherever it stands) and resolved to the distributions that
provide them; each must be the standard library, kcm's own allowed packages, or a distribution the component's
extra pulls in (directly or through its dependencies). The `kcm` command's modules may import components only
inside functions, so `kcm --help` works whatever extras are installed.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# package -> (folder, extra, kcm packages it may import)
COMPONENTS = {
    "kcm_common": ("common", None, set()),
    "kcm_operator": ("operator", "operator", {"kcm_common"}),
    "kcm_bridge": ("bridge", "bridge", {"kcm_common"}),
    "kcm_rollups": ("rollups", "rollup", {"kcm_common"}),
    "kcm_sandbox": ("sandbox", "sandbox", {"kcm_common"}),
    "kcm_demo": ("demo", "demo", {"kcm_common", "kcm_sandbox", "kcm_operator", "kcm_bridge", "kcm_rollups"}),
}
# Shared modules that need more than the base install -> the extras of the components that use them. Each may import
# what every one of those extras installs; whoever imports one must install what it imports.
SHARED = {"kcm_common.otlp_export": ("bridge", "rollup")}


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from kcm_common import x`
    return found


@cache
def _allowed_distributions(extra: str | None) -> frozenset[str]:
    """kcm's base requirements plus `extra`'s, and everything those depend on."""
    wanted: list[tuple[str, set[str]]] = [("kcm", {extra} if extra else set())]
    seen: set[str] = set()
    while wanted:
        name, extras = wanted.pop()
        key = canonicalize_name(name)
        for requirement_text in metadata.requires(name) or []:
            requirement = Requirement(requirement_text)
            environments = [{"extra": e} for e in extras] or [{"extra": ""}]
            if requirement.marker and not any(requirement.marker.evaluate(env) for env in environments):
                continue
            dependency = canonicalize_name(requirement.name)
            if dependency == "kcm":
                wanted.append(("kcm", set(requirement.extras)))
                continue
            if dependency not in seen:
                seen.add(dependency)
                try:
                    metadata.distribution(dependency)
                except metadata.PackageNotFoundError:
                    continue
                wanted.append((dependency, set(requirement.extras)))
        seen.add(key)
    return frozenset(seen)


@cache
def _distributions_of(module: str) -> frozenset[str]:
    top = module.split(".")[0]
    candidates = metadata.packages_distributions().get(top, [])
    if len(candidates) <= 1:
        return frozenset(canonicalize_name(c) for c in candidates)
    # A namespace package (google.*): find the distribution that ships this very module.
    prefix = module.replace(".", "/")
    owners = set()
    for candidate in candidates:
        files = metadata.distribution(candidate).files or []
        if any(str(f).startswith(prefix + "/") or str(f).startswith(prefix + ".") for f in files):
            owners.add(canonicalize_name(candidate))
    return frozenset(owners or (canonicalize_name(c) for c in candidates))


def _violations(modules: set[str], extra: str | None, kcm_allowed: set[str], own: str) -> list[str]:
    allowed = _allowed_distributions(extra)
    problems = []
    for module in sorted(modules):
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__" or top == own:
            continue
        if top.startswith("kcm_"):
            if top not in kcm_allowed:
                problems.append(f"{module} (a kcm component)")
            continue
        owners = _distributions_of(module)
        if not owners & allowed:
            problems.append(f"{module} (from {', '.join(sorted(owners)) or 'nowhere installed'})")
    return problems


@pytest.mark.parametrize("package", sorted(COMPONENTS))
def test_each_component_imports_only_what_its_extra_installs(package):
    folder, extra, kcm_allowed = COMPONENTS[package]
    sources = sorted((ROOT / folder / package).rglob("*.py"))
    assert sources, f"no sources found for {package}"
    problems = {
        str(path.relative_to(ROOT)): found
        for path in sources
        if (found := _violations(_imports(path, top_level_only=False), extra, kcm_allowed, package)
            if _module_of(path) not in SHARED else _shared_violations(path, package, kcm_allowed))
    }

    assert problems == {}, f"imports outside kcm[{extra or 'base'}]: {problems}"


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[1:])


def _shared_violations(path: Path, package: str, kcm_allowed: set[str]) -> list[str]:
    imports = _imports(path, top_level_only=False)
    found = set()
    for extra in SHARED[_module_of(path)]:
        found.update(_violations(imports, extra, kcm_allowed, package))
    return sorted(found)


@pytest.mark.parametrize("shared", sorted(SHARED))
def test_whoever_imports_a_shared_module_installs_what_it_imports(shared):
    source = ROOT / "common" / (shared.replace(".", "/") + ".py")
    needs = _imports(source, top_level_only=False)
    importers = []
    for package, (folder, extra, kcm_allowed) in COMPONENTS.items():
        for path in sorted((ROOT / folder / package).rglob("*.py")):
            if shared in _imports(path, top_level_only=False):
                importers.append(package)
                assert not _violations(needs, extra, kcm_allowed | {"kcm_common"}, "kcm_common"), \
                    f"{path.relative_to(ROOT)} imports {shared}, whose imports kcm[{extra or 'base'}] lacks"
    assert importers, f"nothing imports {shared}: move it back where it is used"
    cli = [path for path in sorted((ROOT / "cli" / "kcm_cli").rglob("*.py"))
           if shared in _imports(path, top_level_only=True)]
    assert not cli, f"{cli} import {shared} at module level: kcm --help would need its extras"


def test_the_kcm_command_imports_components_only_when_a_subcommand_runs():
    sources = sorted((ROOT / "cli" / "kcm_cli").rglob("*.py"))
    problems = {
        str(path.relative_to(ROOT)): found
        for path in sources
        if (found := _violations(_imports(path, top_level_only=True), None, {"kcm_common"}, "kcm_cli"))
    }

    assert problems == {}, f"module-level imports beyond the base install: {problems}"


def test_the_checker_notices_a_forbidden_import():
    # The shared leaf importing a component, or pyspark in the operator, must be caught.
    assert _violations({"kcm_bridge.export"}, None, set(), "kcm_common") == ["kcm_bridge.export (a kcm component)"]
    assert _violations({"pyspark.sql"}, "operator", {"kcm_common"}, "kcm_operator")
    assert not _violations({"pyspark.sql"}, "rollup", {"kcm_common"}, "kcm_rollups")
    assert _violations({"google.rpc.status_pb2"}, None, set(), "kcm_common")
    assert not _violations({"google.protobuf.json_format"}, None, set(), "kcm_common")
    # The shared exporter needs gRPC: the operator's extra does not install it.
    assert _violations({"grpc"}, "operator", {"kcm_common"}, "kcm_common")
    assert not _violations({"grpc", "google.rpc.status_pb2"}, "rollup", {"kcm_common"}, "kcm_common")


def test_there_is_no_top_level_operator_package_shadowing_the_standard_library():
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_every_extra_named_by_the_cli_exists():
    from kcm_cli.main import _EXTRA_OF_MODULE

    extras = set(metadata.metadata("kcm").get_all("Provides-Extra") or [])
    assert set(_EXTRA_OF_MODULE.values()) <= extras
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", metadata.version("kcm"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The kcm packages as an install lays them out (setuptools' build_py, which pip's wheel build runs), not the
    source tree: what is not declared as package data is missing here, as it is in the image."""
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("installed")
    # From a copy without the editable install's kcm.egg-info, whose file list would supply what is not declared.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
            "where"]:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "-d",
                    str(target)], cwd=source, check=True, capture_output=True, timeout=120)
    return target


def test_an_install_carries_every_file_the_packages_hold(installed):
    tracked = subprocess.run(["git", "ls-files", "*/kcm_*/*"], cwd=ROOT, check=True, capture_output=True,
                             text=True, timeout=30).stdout.split()
    data = [Path(path) for path in tracked if not path.endswith(".py")]
    assert data, "no package data found: the git pattern no longer matches the layout"
    missing = [str(path) for path in data if not (installed / Path(*path.parts[1:])).is_file()]
    assert not missing, f"not installed (add them to [tool.setuptools.package-data] in pyproject.toml): {missing}"


def test_an_installed_operator_finds_its_crds(installed):
    probe = ("import kcm_operator.schema as s; print(s.__file__); "
             "print(','.join(sorted(s.load_crds())))")
    result = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(installed)},
                            cwd=installed, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    where, kinds = result.stdout.split()
    assert Path(where).is_relative_to(installed) and kinds == "ClientMetricsSubscription,KafkaConnection"
