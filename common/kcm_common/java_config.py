"""The two text formats of a Java client's configuration, read as Kafka reads them.

A `--command-config` file is a `java.util.Properties` file, and `sasl.jaas.config` is a JAAS entry that Kafka's
`JaasConfig` reads with a `java.io.StreamTokenizer`. The same file goes to Kafka's own tools and Java clients, so
kcm reads backslash escapes, continuations and unquoted JAAS values the way they do (tests compare with Java).
Errors never quote a value: these are where passwords live.
"""

from __future__ import annotations

from dataclasses import dataclass

_PROPERTIES_WHITESPACE = " \t\f"
_PROPERTIES_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class JavaConfigError(ValueError):
    """Text Java would refuse, or read as something other than what was meant; the message quotes no value."""


@dataclass(frozen=True)
class PropertyLine:
    key: str
    value: str
    line: int            # where the entry starts (1-based), for messages
    separated: bool      # a `=`, `:` or whitespace followed the key


def read_properties(text: str) -> list[PropertyLine]:
    """The entries of a Properties file in order, as `Properties.load(Reader)` reads them: `#`/`!` comment lines,
    continuations (an odd number of backslashes ends the line; the next one's leading whitespace is dropped), keys
    ending at an unescaped `=`, `:` or whitespace, and the escapes `\\t \\n \\r \\f \\uXXXX` (any other escaped
    character stands for itself). The value keeps its trailing whitespace, as in Java."""
    entries: list[PropertyLine] = []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    logical: list[str] = []
    first = 0
    for number, natural in enumerate(lines, 1):
        stripped = natural.lstrip(_PROPERTIES_WHITESPACE)
        if not logical:
            if not stripped or stripped[0] in "#!":
                continue
            first = number
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2:
            logical.append(stripped[:-1])
            if number < len(lines):
                continue
        else:
            logical.append(stripped)
        entries.append(_entry("".join(logical), first))
        logical = []
    return entries


def properties_text(entries: dict[str, str]) -> str:
    """`entries` as `java.util.Properties` text that `Properties.load` (and `read_properties`) read back exactly: how
    kcm hands settings, passwords among them, to a JVM without putting them on its command line."""
    def escaped(text: str, key: bool) -> str:
        out = []
        for index, char in enumerate(text):
            if char == "\\" or (key and char in "=: #!") or (not key and index == 0 and char in " #!"):
                out.append("\\" + char)
            elif char in "\t\n\r\f":
                out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[char])
            else:
                out.append(char)
        return "".join(out)

    return "".join(f"{escaped(key, True)}={escaped(value, False)}\n" for key, value in entries.items())


def _entry(line: str, number: int) -> PropertyLine:
    index, escaped = 0, False
    while index < len(line):
        char = line[index]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "=:" or char in _PROPERTIES_WHITESPACE:
            break
        index += 1
    key, rest = line[:index], line[index:]
    value = rest.lstrip(_PROPERTIES_WHITESPACE)
    separated = bool(rest)
    if value[:1] in ("=", ":"):
        value = value[1:].lstrip(_PROPERTIES_WHITESPACE)
    return PropertyLine(_unescape(key, number), _unescape(value, number), number, separated)


def _unescape(text: str, number: int) -> str:
    if "\\" not in text:
        return text
    out, index = [], 0
    while index < len(text):
        char = text[index]
        index += 1
        if char != "\\":
            out.append(char)
            continue
        if index == len(text):   # a lone backslash at the very end of the file: Java drops it
            break
        char = text[index]
        index += 1
        if char == "u":
            digits = text[index:index + 4]
            if len(digits) < 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise JavaConfigError(f"line {number}: malformed \\uXXXX escape (four hex digits expected)")
            out.append(chr(int(digits, 16)))
            index += 4
        else:
            out.append(_PROPERTIES_ESCAPES.get(char, char))
    return "".join(out)


# -- JAAS ----------------------------------------------------------------------------------------------------------
_CONTROL_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")
_JAAS_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
# Options whose names may be shown in a message; any other name could be half of an unquoted password.
_NAMEABLE_OPTIONS = frozenset({"username", "password"})
_WORD, _QUOTED, _NUMBER, _EOF = "word", "quoted", "number", "eof"


@dataclass(frozen=True)
class JaasEntry:
    login_module: str
    control_flag: str
    options: dict[str, str]


def _is_word_start(char: str) -> bool:
    # StreamTokenizer's defaults (a-z, A-Z, 160-255, and everything from 256), plus JaasConfig's '_' and '$'
    # ('-' starts a number there, not a word).
    return char.isascii() and (char.isalpha() or char in "_$") or 160 <= ord(char)


def _is_word_part(char: str) -> bool:
    return _is_word_start(char) or char.isdigit() and char.isascii() or char in ".-"


def _jaas_tokens(text: str) -> list[tuple[str, str | None]]:
    """(kind, text) tokens as StreamTokenizer gives them to JaasConfig: words and quoted strings carry their
    text; numbers and other characters carry none (kind is the character itself for the latter)."""
    tokens: list[tuple[str, str | None]] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if ord(char) <= 32:
            index += 1
        elif char == "/":   # `/* */` comments; `//` and a lone '/' (StreamTokenizer's comment character) end the line
            if text.startswith("/*", index):
                end = text.find("*/", index + 2)
                index = length if end < 0 else end + 2
            else:
                ends = [end for end in (text.find("\n", index), text.find("\r", index)) if end >= 0]
                index = min(ends) + 1 if ends else length
        elif char.isascii() and char.isdigit() or char == "." or char == "-":
            if char == "-" and not (index + 1 < length and text[index + 1] in "0123456789."):
                tokens.append(("-", None))
                index += 1
                continue
            index += 1
            seen_point = char == "."
            while index < length and (text[index].isascii() and text[index].isdigit()
                                      or text[index] == "." and not seen_point):
                seen_point = seen_point or text[index] == "."
                index += 1
            tokens.append((_NUMBER, None))
        elif _is_word_start(char):
            start = index
            while index < length and _is_word_part(text[index]):
                index += 1
            tokens.append((_WORD, text[start:index]))
        elif char in "\"'":
            index, value = _quoted(text, index + 1, char)
            tokens.append((_QUOTED, value))
        else:
            tokens.append((char, None))
            index += 1
    tokens.append((_EOF, None))
    return tokens


def _quoted(text: str, index: int, quote: str) -> tuple[int, str]:
    """A quoted string from `index` (after the quote): it ends at the same quote, a line end or the end."""
    out = []
    while index < len(text) and text[index] not in (quote, "\n", "\r"):
        char = text[index]
        index += 1
        if char == "\\" and index < len(text):
            char = text[index]
            index += 1
            if char in "01234567":
                digits, limit = char, 3 if char <= "3" else 2
                while len(digits) < limit and index < len(text) and text[index] in "01234567":
                    digits += text[index]
                    index += 1
                char = chr(int(digits, 8))
            else:
                char = _JAAS_ESCAPES.get(char, char)
        out.append(char)
    if index < len(text) and text[index] == quote:
        index += 1
    return index, "".join(out)


def parse_jaas(text: str) -> list[JaasEntry]:
    """The login modules of a JAAS configuration, as Kafka's JaasConfig reads `sasl.jaas.config`: `Module flag
    key=value ...;` where values are words or quoted strings. Raises JavaConfigError with Kafka's reason."""
    tokens = _jaas_tokens(text)
    entries, position = [], 0
    while tokens[position][0] != _EOF:
        module = tokens[position][1]
        position += 1
        if tokens[position][0] == _EOF:
            raise JavaConfigError("login module control flag not specified")
        flag = tokens[position][1]
        if flag is None or flag.upper() not in _CONTROL_FLAGS:   # not shown: it may be a misplaced password
            raise JavaConfigError("invalid login module control flag (required, requisite, sufficient or optional)")
        options: dict[str, str] = {}
        position += 1
        while tokens[position][0] not in (_EOF, ";"):
            key = tokens[position][1]
            kind = tokens[position + 1]
            value = tokens[position + 2] if kind[0] == "=" else (_EOF, None)
            if value[1] is None:
                named = f"option {key!r}" if key in _NAMEABLE_OPTIONS else "an option"
                raise JavaConfigError(f"no value for {named}: write values as quoted strings, e.g. "
                                      'password="..."')
            if key is not None:
                options[key] = value[1]
            position += 3
        if tokens[position][0] != ";":
            raise JavaConfigError("the login module's entry does not end with a semicolon")
        position += 1
        if not module:
            raise JavaConfigError("no login module named")
        entries.append(JaasEntry(module, str(flag).upper(), options))
    if not entries:
        raise JavaConfigError("no login module given")
    return entries

