"""YAML as kcm reads users' files: PyYAML's safe loader, refusing a key given twice in one mapping.

PyYAML keeps the last of two equal keys silently, so a repeated section (`kafka:` twice in a bridge config, `spec:`
twice in a manifest) would quietly drop the first; kubectl refuses such manifests too. Aliases are shared, not
copied, when loading, but everything after walks them as copies: a document that would expand to more than
MAX_VALUES values (an alias bomb: a kilobyte of nested aliases can stand for billions) is refused, as kubectl does.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 1_000_000  # values of one document with every alias expanded; real manifests and configs are far below


class StrictLoader(yaml.SafeLoader):
    """`yaml.load(text, Loader=StrictLoader)`: safe_load, with a ConstructorError naming a duplicated key's place."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """One YAML document, strictly."""
    return _bounded(yaml.load(text, Loader=StrictLoader))  # noqa: S506 (a SafeLoader)


def load_all(text: str) -> list[Any]:
    """Every YAML document of `text`, strictly."""
    return [_bounded(document) for document in yaml.load_all(text, Loader=StrictLoader)]  # noqa: S506 (a SafeLoader)


def _bounded(document: Any) -> Any:
    # Count as the readers will walk it: a shared (aliased) value once per place it appears.
    pending, seen = [document], 0
    while pending:
        value = pending.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise yaml.YAMLError(f"the document stands for more than {MAX_VALUES:,} values once its aliases are "
                                 "expanded (nested aliases?); write the values out or split the document")
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):  # !!pairs and !!omap are lists of tuples, !!set a set
            pending.extend(value)
    return document
