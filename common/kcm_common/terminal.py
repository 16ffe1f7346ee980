"""Text from Kafka shown on a terminal or written to a log: client ids, metric names, subscription names and values
are anyone's."""

from __future__ import annotations

import re

# Control characters (and the bidi controls) a client or whoever alters configs may put in names and values: shown
# escaped, never sent to the terminal (escape sequences could recolour, retitle or clear it; newlines split rows, as
# the line and paragraph separators do for whatever splits the output into lines).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character written as its Python escape (`\\x1b`, `\\n`)."""
    return _UNPRINTABLE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)
