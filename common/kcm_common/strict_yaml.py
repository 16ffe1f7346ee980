"""YAML as kcm reads users' files: PyYAML's safe loader, refusing a key given twice in one mapping.

PyYAML keeps the last of two equal keys silently, so a repeated section (`kafka:` twice in a bridge config, `spec:`
twice in a manifest) would quietly drop the first; kubectl refuses such manifests too.
"""

from __future__ import annotations

from typing import Any

import yaml


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
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)


def load_all(text: str) -> list[Any]:
    """Every YAML document of `text`, strictly."""
    return list(yaml.load_all(text, Loader=StrictLoader))  # noqa: S506 (a SafeLoader)
