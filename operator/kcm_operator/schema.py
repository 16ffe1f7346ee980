"""Validate custom resources against kcm's CRDs the way the API server would: defaults, schema, unknown fields, CEL.

jsonschema checks `openAPIV3Schema`, cel-python evaluates `x-kubernetes-validations` (transition rules, which read
`oldSelf`, only when an old object is given), and unknown fields are refused as `kubectl apply` does by default.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

GROUP = "kcm.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
SUBSCRIPTION_KIND = "ClientMetricsSubscription"
CONNECTION_KIND = "KafkaConnection"


def crds_dir() -> Path:
    """Where the CRD files are: the package's own copy of the repository's `crds/`, installed with it."""
    return Path(__file__).resolve().parent / "crds"


@dataclass(frozen=True)
class Crd:
    """One CRD's served schema, by kind."""

    kind: str
    plural: str
    schema: Mapping[str, Any]


@lru_cache(maxsize=4)
def load_crds(directory: Path | None = None) -> dict[str, Crd]:
    """Every kcm.dev CRD in `directory` (default: crds_dir()), by kind."""
    crds = {}
    for path in sorted((directory or crds_dir()).glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not document or document.get("kind") != "CustomResourceDefinition":
                continue
            spec = document["spec"]
            version = next(v for v in spec["versions"] if v["name"] == VERSION)
            crds[spec["names"]["kind"]] = Crd(spec["names"]["kind"], spec["names"]["plural"],
                                              version["schema"]["openAPIV3Schema"])
    missing = {SUBSCRIPTION_KIND, CONNECTION_KIND} - set(crds)
    if missing:
        raise RuntimeError(f"no CRD for {', '.join(sorted(missing))} in {directory or crds_dir()}: "
                           "kcm is installed without its CRDs; reinstall it")
    return crds


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of `value` as the API server stores it: nulls of fields that are not `nullable` dropped (Helm output
    often has `match: null`), then the schema's defaults filled in where fields are missing."""
    value = copy.deepcopy(value)
    _default(schema, value)
    return value


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PROBLEM_CHARS = 300  # one problem's text at most: a message may quote the whole offending value


def validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None,
             crds: Mapping[str, Crd] | None = None) -> list[str]:
    """Why the API server would refuse `obj` (after defaulting); [] when it would accept it."""
    crds = crds if crds is not None else load_crds()
    kind = obj.get("kind")
    if obj.get("apiVersion") != API_VERSION or not isinstance(kind, str) or kind not in crds:
        return [f"apiVersion/kind must be {API_VERSION} with kind one of {', '.join(sorted(crds))}, "
                f"not {str(obj.get('apiVersion'))[:80]}/{str(kind)[:80]}"]
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        return [f"metadata: Invalid value: must be an object, not {type(metadata).__name__}"]
    schema = crds[kind].schema
    problems = []
    name = metadata.get("name")
    if not name:
        problems.append("metadata.name: Required value")
    elif not (isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name)):
        # The API server's rule for object names (RFC 1123 subdomain).
        problems.append(f"metadata.name: Invalid value: {str(name)[:80]!r}: a lowercase RFC 1123 subdomain must "
                        "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
                        "alphanumeric character")
    namespace = metadata.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and len(namespace) <= 63
                                      and _DNS_LABEL.fullmatch(namespace)):
        # Namespaces are RFC 1123 labels: no dots, so `<namespace>.<name>` subscription names cannot collide.
        problems.append(f"metadata.namespace: Invalid value: {str(namespace)[:80]!r}: a lowercase RFC 1123 label "
                        "must consist of lower case alphanumeric characters or '-', and must start and end with an "
                        "alphanumeric character (at most 63)")
    problems += [f"{path}: unknown field" for path in _unknown_fields(schema, obj, "")]
    defaulted = apply_defaults(schema, obj)
    problems += [f"{path}: Duplicate value: {item!r}" for path, item in _duplicates(schema, defaulted, "")]
    for error in sorted(_Validator(schema).iter_errors(defaulted), key=lambda e: list(e.path)):
        problems.append(f"{_dotted(error.absolute_path) or '<root>'}: {error.message}")
    if not problems:
        old_defaulted = apply_defaults(schema, old) if old is not None else None
        problems += list(_cel_failures(schema, defaulted, old_defaulted, ""))
    return [problem if len(problem) <= _PROBLEM_CHARS else problem[:_PROBLEM_CHARS - 1] + "…" for problem in problems]


def spec_problems(kind: str, spec: Any) -> list[str]:
    """Why the CRD of `kind` refuses an object with this `spec` (schema, unknown fields, CEL rules but the transition
    ones); [] when it accepts it. For what the operator reads from the API server, which may not have checked it (an
    older CRD installed, validation skipped)."""
    return list(_spec_problems(kind, json.dumps(spec, sort_keys=True, default=repr)))


@lru_cache(maxsize=4096)
def _spec_problems(kind: str, spec_json: str) -> tuple[str, ...]:
    # Cached by content: every drift check of every resource asks again of a spec that rarely changes.
    obj = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": "x"}, "spec": json.loads(spec_json)}
    return tuple(problem for problem in validate(obj) if not problem.startswith("metadata"))


@lru_cache(maxsize=64)
def _go_regex(pattern: str) -> re.Pattern[str]:
    """The API server reads `pattern` as Go's regexp does, where a final `$` is the end of the text; in Python it
    also matches before a final newline (what a YAML `|` block leaves), which the API server refuses."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.compile(pattern)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _go_regex(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": _pattern})


def _default(schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value and value[name] is None and not sub.get("nullable"):
                del value[name]
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default(schema["items"], item)


def _unknown_fields(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[str]:
    if isinstance(value, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        for name, item in value.items():
            sub = schema["properties"].get(name)
            if sub is None:
                yield f"{path}.{name}".lstrip(".")
            elif name != "metadata" or path:
                yield from _unknown_fields(sub, item, f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _unknown_fields(schema["items"], item, f"{path}[{index}]")


def _duplicates(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[tuple[str, Any]]:
    # jsonschema knows uniqueItems, not Kubernetes' list types: a `set` refuses repeated items, a `map` repeated keys.
    if isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or ()
        seen: list[Any] = []
        for index, item in enumerate(value):
            identity = item if list_type == "set" else (
                tuple(item.get(key) for key in keys) if list_type == "map" and isinstance(item, dict) else None)
            if identity is not None and identity in seen:
                yield f"{path}[{index}]".lstrip("."), item
            seen.append(identity)
            yield from _duplicates(schema.get("items") or {}, item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                yield from _duplicates(sub, value[name], f"{path}.{name}")


def _cel_failures(schema: Mapping[str, Any], value: Any, old: Any, path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations") or ():
        uses_old = "oldSelf" in rule["rule"]
        if uses_old and old is None:
            continue  # a transition rule: Kubernetes runs it on updates only
        activation = {"self": celpy.json_to_cel(value)}
        if uses_old:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = compile_rule(rule["rule"]).evaluate(activation)
        if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            yield f"{path.lstrip('.') or '<root>'}: {rule.get('message') or 'failed rule: ' + rule['rule']}"
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                old_item = old.get(name) if isinstance(old, dict) else None
                yield from _cel_failures(sub, value[name], old_item, f"{path}.{name}")


@lru_cache(maxsize=64)
def compile_rule(rule: str) -> Any:
    """A CEL rule compiled with cel-python (which lacks Kubernetes' CEL extension functions)."""
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def _dotted(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")
