"""Read ClientMetricsSubscription YAML (files, multi-document, directories) and check it against the CRD first."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kcm_common import strict_yaml
from kcm_common.errors import UserError
from kcm_common.files import read_settings
from kcm_operator import schema
from kcm_operator.errors import InvalidSpecError
from kcm_operator.reconcile import Desired, desired_from_spec

_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Manifest:
    """One YAML document and where it came from (`file.yaml#2` for the second document)."""

    source: str
    obj: dict[str, Any]

    @property
    def ref(self) -> str:
        meta = self.obj.get("metadata") or {}
        meta = meta if isinstance(meta, dict) else {}
        name = str(meta.get("name") or meta.get("generateName") or "(no name)")[:80]
        return f"{str(self.obj.get('kind'))[:80]} {str(meta.get('namespace') or 'default')[:80]}/{name} ({self.source})"


def load(paths: Iterable[str | Path], recursive: bool = False) -> list[Manifest]:
    """Every document in the given files and directories (their *.yaml/*.yml/*.json), in name order. `-` is standard
    input; a pipe or device (`<(...)`, /dev/stdin) is read as a file."""
    manifests = []
    for path in map(Path, paths):
        if str(path) == "-":
            files = [STDIN]
        elif path.is_dir():
            found = path.rglob("*") if recursive else path.iterdir()
            files = sorted(p for p in found if p.is_file() and p.suffix in _SUFFIXES)
            if not files:
                raise UserError(f"{path} holds no .yaml, .yml or .json files")
        elif path.exists():
            files = [path]
        else:
            raise UserError(f"{path}: no such file or directory")
        for file in files:
            manifests.extend(_documents(file))
    return manifests


STDIN = Path("(stdin)")
# Far above any set of subscriptions; a bound, so a wrong path (a log, a device that never ends) cannot fill memory.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def _read(file: Path) -> str:
    if file is not STDIN:
        return read_settings(file, limit=MAX_MANIFEST_BYTES)
    if sys.stdin is None:   # started with standard input closed (`<&-`)
        raise UserError("-f -: standard input is closed; give the YAML on it, or a file")
    return read_settings(sys.stdin.buffer, limit=MAX_MANIFEST_BYTES)


def subscriptions(manifests: Sequence[Manifest]) -> list[tuple[Manifest, Desired]]:
    """The ClientMetricsSubscriptions among `manifests`, validated and defaulted; InvalidSpecError names each problem."""
    problems = []
    found = []
    for manifest in manifests:
        api_version = manifest.obj.get("apiVersion")
        if not isinstance(api_version, str) or api_version.split("/")[0] != schema.GROUP:
            continue  # not kcm's (other kinds in the same files are fine)
        errors = schema.validate(manifest.obj)
        if errors:
            problems.extend(f"{manifest.ref}: {error}" for error in errors)
            continue
        if manifest.obj["kind"] != schema.SUBSCRIPTION_KIND:
            continue
        crd = schema.load_crds()[schema.SUBSCRIPTION_KIND]
        spec = schema.apply_defaults(crd.schema, manifest.obj)["spec"]
        meta = manifest.obj["metadata"]
        found.append((manifest, desired_from_spec(meta.get("namespace") or "default", meta["name"], spec)))
    owners: dict[str, Manifest] = {}
    for manifest, desired in found:
        if desired.name in owners:
            problems.append(f"{manifest.ref}: subscription {desired.name!r} is already defined by "
                            f"{owners[desired.name].ref}")
        owners.setdefault(desired.name, manifest)
    if problems:
        raise InvalidSpecError("invalid resources, nothing applied: " + "; ".join(problems))
    return found


def _documents(file: Path) -> list[Manifest]:
    try:
        documents = strict_yaml.load_all(_read(file))
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{file} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{file}: not valid YAML{strict_yaml.describe(exc)}") from None
    manifests = []
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        source = f"{file}#{index}" if len(documents) > 1 else str(file)
        if not isinstance(document, dict):
            raise UserError(f"{source}: expected a Kubernetes resource (a mapping), found {type(document).__name__}")
        if document.get("kind") == "List" and isinstance(document.get("items"), list):
            for i, item in enumerate(document["items"]):
                if not isinstance(item, dict):
                    raise UserError(f"{source}[{i}]: expected a Kubernetes resource (a mapping), "
                                    f"found {type(item).__name__}")
                manifests.append(Manifest(f"{source}[{i}]", item))
        else:
            manifests.append(Manifest(source, document))
    return manifests
