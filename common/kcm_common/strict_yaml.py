"""YAML as kcm reads users' files: PyYAML's safe loader, refusing a key given twice in one mapping.

PyYAML keeps the last of two equal keys silently, so a repeated section (`kafka:` twice in a bridge config, `spec:`
twice in a manifest) would quietly drop the first; kubectl refuses such manifests too. Aliases are shared, not
copied, when loading, but everything after walks them as copies: a document that would expand to more than
MAX_VALUES values (an alias bomb: a kilobyte of nested aliases can stand for billions) is refused, as kubectl does.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_VALUES = 1_000_000  # values of one document with every alias expanded; real manifests and configs are far below
MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """`yaml.load(text, Loader=StrictLoader)`: safe_load, with a ConstructorError naming a duplicated key's place."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue   # `<<: *defaults`, as kubectl reads it: merged below, the keys written beside it win
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:
                continue   # unhashable (a sequence or mapping as key): PyYAML refuses it itself, naming its place
            if repeated:
                # In backquotes, which `describe` keeps: a key is a name, not a value.
                name = "null" if key is None else key
                raise yaml.constructor.ConstructorError(None, None, f"the key `{name}` is given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML's constructors let Python's own errors out (an impossible date, `!!int` on a word), some quoting
        # the value: a ConstructorError at the value's place instead, which says what to do and quotes nothing.
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, AttributeError, OverflowError):
            raise yaml.constructor.ConstructorError(
                None, None, "this value cannot be read as the type it looks like or is tagged with (an impossible "
                "date such as 2024-13-45?); quote it to keep it text", node.start_mark) from None


class PlainTextLoader(StrictLoader):
    """StrictLoader reading every unquoted scalar but null (and a merge key, `<<`) as the text written: `0777` stays
    "0777" (not 511), `3.10` "3.10", `on` "on", `12:30` "12:30". For files whose fields have declared types, which
    the reader converts from text as it converts environment variables."""


PlainTextLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag in ("tag:yaml.org,2002:null", MERGE_TAG)]
    for first, resolvers in StrictLoader.yaml_implicit_resolvers.items()}


def load(text: str, *, plain_text: bool = False) -> Any:
    """One YAML document, strictly; with `plain_text`, unquoted scalars other than null stay text."""
    try:
        return _bounded(yaml.load(text, Loader=PlainTextLoader if plain_text else StrictLoader))  # noqa: S506 (safe)
    except RecursionError:
        raise _too_deep() from None


def load_all(text: str) -> list[Any]:
    """Every YAML document of `text`, strictly."""
    try:
        return [_bounded(document) for document in yaml.load_all(text, Loader=StrictLoader)]  # noqa: S506 (safe)
    except RecursionError:
        raise _too_deep() from None


def _too_deep() -> yaml.YAMLError:
    # PyYAML builds nested values by recursion: a few hundred levels (a 2 KB file of `[`) exhaust Python's stack.
    return yaml.YAMLError("the document nests values too deeply to be read (hundreds of levels); no kcm file needs "
                          "more than a few")


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


def describe(error: yaml.YAMLError) -> str:
    """` at line L, column C: problem`, on one line, quoting nothing of the file but single characters.

    PyYAML's own text spans lines, names `<unicode string>` and quotes what it could not read: a tag, alias or
    anchor name, which is the value itself when an unquoted password starts with `!`, `*` or `&`.
    """
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or (str(error) if type(error) is yaml.YAMLError else
                                                  type(error).__name__)
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    if context and context_mark is not None:
        problem += f" {context} started at line {context_mark.line + 1}"
    problem = _QUOTED.sub(_redacted, " ".join(problem.split()))
    if _VALUE_AS_NAME.search(problem):
        problem += " (quote a value that starts with !, * or &)"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{where}: {problem}"


# What PyYAML quotes with repr: single quotes, or double quotes (with backslash escapes) when the text has a '.
_QUOTED = re.compile(r"'([^']*)'" + r'|"((?:[^"\\]|\\.)*)"')
_VALUE_AS_NAME = re.compile(r"\b(tag|alias|anchor)\b")


def _redacted(match: re.Match[str]) -> str:
    text = match.group(1) if match.group(1) is not None else match.group(2)
    if len(text) <= 1 or re.fullmatch(r"<[\w ]+>|\\[a-z0-9]+", text):  # a character, a token kind, an escape
        return match.group(0)
    return "'…'"
