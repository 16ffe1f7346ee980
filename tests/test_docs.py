"""What the docs tell people to paste must work as pasted."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECEIVER_SOURCES = ROOT / "receiver" / "src" / "main" / "java"


def _properties_blocks() -> list[tuple[str, list[str]]]:
    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^```properties\n(.*?)^```", doc.read_text(), re.S | re.M):
            blocks.append((doc.name, block.splitlines()))
    return blocks


def test_the_docs_have_properties_examples_to_check():
    assert _properties_blocks(), "no ```properties block found: the checks below would check nothing"


def test_properties_examples_keep_comments_on_lines_of_their_own():
    # Java's .properties format reads `#` as a comment only at the start of a line: `key=value   # note` makes
    # `value   # note` the value, and a broker given that as `metric.reporters` does not start.
    for doc, lines in _properties_blocks():
        for line in lines:
            if line.strip() and not line.lstrip().startswith(("#", "!")):
                assert "#" not in line, f"{doc}: {line!r}: a trailing comment would be part of the value"


def test_the_plugin_classes_the_docs_name_exist():
    for doc, lines in _properties_blocks():
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "metric.reporters":
                for name in value.split(","):
                    source = RECEIVER_SOURCES / (name.strip().replace(".", "/") + ".java")
                    assert source.is_file(), f"{doc}: metric.reporters names {name.strip()!r}, which has no source"
