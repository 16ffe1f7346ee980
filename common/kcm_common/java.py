"""Java standard-library behaviour Kafka's rules depend on: String.hashCode and HashMap iteration order,
String.split and String.trim, and java.util.regex syntax (compiled with the `regex` package).

Match patterns are translated from Java's syntax, not taken as Python syntax: what Java refuses is refused
(`(?P<x>...)`, `(?#...)`, conditionals, a `{` that is not a quantifier), `\\d \\w \\s \\b` and `(?i)` are ASCII only
while Unicode properties (`\\p{L}`, `\\p{IsLatin}`, `\\p{InGreek}`, `\\p{javaLowerCase}`) are Unicode, `.` stops at
Java's line terminators unless `(?s)`, and Java-only forms (`\\Q...\\E`, `\\p{Alpha}`-style POSIX classes,
`\\h \\v \\R \\e \\cX \\x{...} \\0oo \\k<name>`) mean what they mean in Java. A few Java constructs are refused as
unsupported: nested classes and `&&` intersections inside `[...]`, `\\P{POSIX}` inside `[...]`, and the inline flags
`d`, `u`, `U`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

import regex

TRIM_CHARACTERS = "".join(chr(code) for code in range(0x21))  # what String.trim() strips

_POSIX_CLASSES = {  # java.util.regex.Pattern's POSIX character classes (US-ASCII only), as class bodies
    "Lower": "a-z", "Upper": "A-Z", "ASCII": "\\x00-\\x7F", "Alpha": "a-zA-Z", "Digit": "0-9",
    "Alnum": "a-zA-Z0-9", "Punct": "!-/:-@\\[-`{-~", "Graph": "!-~", "Print": " -~", "Blank": " \\t",
    "Cntrl": "\\x00-\\x1F\\x7F", "XDigit": "0-9a-fA-F", "Space": " \\t\\n\\x0B\\f\\r",
}
_HORIZONTAL_SPACE = " \\t\\xA0\\u1680\\u180E\\u2000-\\u200A\\u202F\\u205F\\u3000"
_VERTICAL_SPACE = "\\n\\x0B\\f\\r\\x85\\u2028\\u2029"
_LINE_TERMINATOR = "(?:\\r\\n|[\\n\\r\\x85\\u2028\\u2029])"
# Escapes Java and the `regex` package both read the same way (with the ASCII flag).
_SHARED_ESCAPES = frozenset("dDwWsSbBAGXtnrfaN")
# \d \w \s and their complements as class bodies: ASCII, also inside a class made Unicode for a property.
_ASCII_CLASS_BODIES = {
    "d": "0-9", "D": "\\x00-\\x2F\\x3A-\\U0010FFFF",
    "w": "0-9A-Z_a-z", "W": "\\x00-\\x2F\\x3A-\\x40\\x5B-\\x5E\\x60\\x7B-\\U0010FFFF",
    "s": " \\t\\n\\x0B\\f\\r", "S": "\\x00-\\x08\\x0E-\\x1F\\x21-\\U0010FFFF",
}
# Java's `.`: anything but a line terminator, or anything at all under (?s).
_DOT = "[^\\n\\r\\x85\\u2028\\u2029]"
_DOT_ALL = "[\\x00-\\U0010FFFF]"
# Java's own property names (java.lang.Character's isXxx) as Unicode properties the regex package knows.
_JAVA_PROPERTIES = {
    "javaLowerCase": "Lowercase", "javaUpperCase": "Uppercase", "javaAlphabetic": "Alphabetic", "javaDigit": "Nd",
    "javaLetter": "L", "javaTitleCase": "Lt", "javaIdeographic": "Ideographic",
}
_JAVA_FLAGS = frozenset("imsx")
_UNSUPPORTED_FLAGS = frozenset("duU")


class PatternError(ValueError):
    """A pattern java.util.regex refuses (or one the sandbox cannot reproduce), with the reason."""


def parse_int(text: str) -> int | None:
    """Java's Integer.parseInt: an optional sign, then decimal digits of any script (Character.digit reads each
    UTF-16 unit, so a digit beyond the Basic Multilingual Plane is none), within 32 bits; None where it throws."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits:
        return None
    value = 0
    for char in digits:
        if ord(char) > 0xFFFF or not char.isdecimal():
            return None
        value = value * 10 + unicodedata.decimal(char)
        if value > 2**31:   # beyond any INT: said as parseInt says it, without reading a million digits on
            return None
    value = -value if text[:1] == "-" else value
    return value if -(2**31) <= value < 2**31 else None


def string_hash(text: str) -> int:
    """String.hashCode over UTF-16 code units, as an unsigned 32-bit value."""
    units = text.encode("utf-16-be", errors="surrogatepass")
    value = 0
    for index in range(0, len(units), 2):
        value = (31 * value + (units[index] << 8 | units[index + 1])) & 0xFFFFFFFF
    return value


def hash_order(items: Iterable[str], capacity: int = 16) -> list[str]:
    """The iteration order of a java.util.HashSet/HashMap of strings filled with `items` in order.

    Buckets come out in index order and, within a bucket, in insertion order (tree bins aside).
    """
    unique = list(dict.fromkeys(items))
    while len(unique) > capacity * 0.75:
        capacity *= 2

    def bucket(item: str) -> int:
        code = string_hash(item)
        return (code ^ (code >> 16)) & (capacity - 1)

    return sorted(unique, key=bucket)


def copy_capacity(size: int) -> int:
    """The table size `new HashSet<>(collection)` starts with: tableSizeFor(max(size / .75 + 1, 16))."""
    wanted = max(int(size / 0.75) + 1, 16)
    return 1 << (wanted - 1).bit_length()


def split(text: str, separator: str) -> list[str]:
    """String.split with a one-character literal separator: trailing empty strings dropped, "" gives [""]."""
    if not text:
        return [text]
    parts = text.split(separator)
    while parts and not parts[-1]:
        parts.pop()
    return parts


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """Compile a java.util.regex pattern so `fullmatch` behaves as Java's `Matcher.matches()`; raises PatternError."""
    try:
        # ASCII: \\d \\w \\s \\b and (?i) as Java has them; Unicode properties are scoped back to Unicode.
        return regex.compile(_translate(pattern), flags=regex.ASCII | regex.V0)
    except regex.error as err:
        raise PatternError(str(err)) from None


def _translate(pattern: str) -> str:
    out: list[str] = []
    index, length, in_class = 0, len(pattern), False
    dotall, outer_dotall = False, []  # whether `.` takes line terminators here, and in each enclosing group
    class_start, unicode_class = 0, False
    while index < length:
        char = pattern[index]
        if char == "\\":
            text, index = _escape(pattern, index + 1, in_class)
            unicode_class = unicode_class or (in_class and text.startswith(("\\p", "\\P")))
            out.append(text)
            continue
        if in_class:
            if char == "[":
                raise PatternError(f"nested character classes (index {index}) are not supported")
            if pattern.startswith("&&", index):
                raise PatternError(f"character class intersection (index {index}) is not supported")
            out.append(char)
            if char == "]":
                in_class = False
                if unicode_class:  # its \\d \\w \\s are explicit ASCII bodies, so only the properties change
                    out.insert(class_start, "(?u:")
                    out.append(")")
            index += 1
            continue
        if char == "[":
            in_class, class_start, unicode_class = True, len(out), False
            out.append(char)
            index += 1
            # A leading "]" (or "^]") is a literal in both dialects.
            for literal in ("^", "]"):
                if index < length and pattern[index] == literal:
                    out.append("\\]" if literal == "]" else literal)
                    index += 1
            continue
        if char == "(" and pattern.startswith("(?", index):
            text, index = _group_opening(pattern, index)
            if not text.endswith(")"):  # a group opens; `(?s)` alone changes the rest of the enclosing group
                outer_dotall.append(dotall)
            dotall = _dotall_after(text, dotall)
            out.append(text)
            continue
        if char == "(":
            outer_dotall.append(dotall)
        elif char == ")" and outer_dotall:
            dotall = outer_dotall.pop()
        elif char == ".":
            out.append(_DOT_ALL if dotall else _DOT)
            index += 1
            continue
        if char == "{":
            text, index = _repetition(pattern, index)
            out.append(text)
            continue
        out.append(char)
        index += 1
    if in_class:
        raise PatternError("unclosed character class")
    return "".join(out)


def _escape(pattern: str, index: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape whose letter is at `index`; returns the text and the index after it."""
    if index >= len(pattern):
        raise PatternError("unexpected end of pattern after a backslash")
    char = pattern[index]
    if char == "Q":
        end = pattern.find("\\E", index + 1)
        literal = pattern[index + 1:] if end < 0 else pattern[index + 1:end]
        after = len(pattern) if end < 0 else end + 2
        return "".join(_literal(c) for c in literal), after
    if char in "pP":
        return _property(pattern, index, in_class)
    if char in _ASCII_CLASS_BODIES and in_class:
        return _ASCII_CLASS_BODIES[char], index + 1
    if char == "k" and not in_class:
        end = pattern.find(">", index)
        name = pattern[index + 2:end] if pattern.startswith("<", index + 1) and end > 0 else ""
        if not (name.isascii() and name.isalnum()):
            raise PatternError("\\k needs a group name in angle brackets")
        return f"(?P={name})", end + 1
    if char == "N" and pattern.startswith("{", index + 1):
        end = pattern.find("}", index)
        if end < 0:
            raise PatternError("unclosed character name")
        return pattern[index - 1:end + 1], end + 1
    if char == "h":
        return ("" if in_class else "[") + _HORIZONTAL_SPACE + ("" if in_class else "]"), index + 1
    if char == "H":
        if in_class:
            raise PatternError("\\H inside a character class is not supported")
        return f"[^{_HORIZONTAL_SPACE}]", index + 1
    if char == "v":
        return ("" if in_class else "[") + _VERTICAL_SPACE + ("" if in_class else "]"), index + 1
    if char == "V":
        if in_class:
            raise PatternError("\\V inside a character class is not supported")
        return f"[^{_VERTICAL_SPACE}]", index + 1
    if char == "R" and not in_class:
        return _LINE_TERMINATOR, index + 1
    if char == "z" and not in_class:
        return "\\Z", index + 1  # Python's \Z is Java's \z: the very end
    if char == "Z" and not in_class:
        return f"(?={_LINE_TERMINATOR}?\\Z)", index + 1
    if char == "e":
        return "\\x1B", index + 1
    if char == "c":
        if index + 1 >= len(pattern):
            raise PatternError("\\c needs a control character letter")
        return f"\\x{ord(pattern[index + 1]) ^ 64:02X}", index + 2
    if char == "x":
        return _hex_escape(pattern, index)
    if char == "u":
        digits = pattern[index + 1:index + 5]
        if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise PatternError("\\u needs four hexadecimal digits")
        return f"\\u{digits}", index + 5
    if char == "0":
        end = index + 1
        while end < len(pattern) and end < index + 4 and pattern[end] in "01234567":
            end += 1
        digits = pattern[index + 1:end]
        if not digits or (len(digits) == 3 and digits[0] > "3"):
            digits = digits[:2]
        if not digits:
            raise PatternError("\\0 needs an octal value")
        return f"\\x{int(digits, 8):02X}", index + 1 + len(digits)
    if char.isdigit() and not in_class:
        return "\\" + char, index + 1  # a back reference
    if char in _SHARED_ESCAPES and (not in_class or char in "dDwWsStnrfa"):
        return "\\" + char, index + 1
    if char.isascii() and char.isalnum():
        raise PatternError(f"illegal/unsupported escape sequence \\{char}")
    return _literal(char), index + 1


def _property(pattern: str, index: int, in_class: bool) -> tuple[str, int]:
    negated = pattern[index] == "P"
    if pattern.startswith("{", index + 1):
        end = pattern.find("}", index + 2)
        if end < 0:
            raise PatternError("unclosed character family")
        name, after = pattern[index + 2:end], end + 1
    elif index + 1 < len(pattern):
        name, after = pattern[index + 1], index + 2
    else:
        raise PatternError("illegal character family")
    body = _POSIX_CLASSES.get(name)
    if body is None:  # Unicode properties, scripts and blocks: the regex package knows most by the same names
        text = pattern[index - 1:index + 1] + "{" + _unicode_property(name) + "}"
        return (text, after) if in_class else (f"(?u:{text})", after)
    if in_class:
        if negated:
            raise PatternError(f"\\P{{{name}}} inside a character class is not supported")
        return body, after
    return ("[^" if negated else "[") + body + "]", after


def _unicode_property(name: str) -> str:
    """The regex package's name for a java.util.regex property: `javaLowerCase` and `IsL` (Is + a category) too."""
    name = _JAVA_PROPERTIES.get(name, name)
    if name.startswith("Is") and not _known_property(name) and _known_property(name[2:]):
        return name[2:]
    return name


def _known_property(name: str) -> bool:
    try:
        regex.compile("\\p{" + name + "}")
    except regex.error:
        return False
    return True


def _dotall_after(opening: str, dotall: bool) -> bool:
    """Whether `.` takes line terminators after a `(?flags)` or `(?flags:` opening (other openings keep it)."""
    flags = opening[2:-1]
    if not all(c in _JAVA_FLAGS | _UNSUPPORTED_FLAGS | {"-"} for c in flags):
        return dotall
    on = True
    for flag in flags:
        if flag == "-":
            on = False
        elif flag == "s":
            dotall = on
    return dotall


def _hex_escape(pattern: str, index: int) -> tuple[str, int]:
    if pattern.startswith("{", index + 1):
        end = pattern.find("}", index + 2)
        digits = pattern[index + 2:end] if end > 0 else ""
        try:
            code = int(digits, 16)
        except ValueError:
            raise PatternError("\\x{...} needs hexadecimal digits") from None
        if code > 0x10FFFF:
            raise PatternError("\\x{...} is beyond the largest code point")
        return f"\\U{code:08X}", end + 1
    digits = pattern[index + 1:index + 3]
    if len(digits) != 2 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        raise PatternError("\\x needs two hexadecimal digits")
    return f"\\x{digits}", index + 3


def _group_opening(pattern: str, index: int) -> tuple[str, int]:
    """Check a `(?` construct Java knows; returns its text and the index after the opening."""
    rest = pattern[index + 2:]
    for prefix in (":", "=", "!", ">", "<=", "<!"):
        if rest.startswith(prefix):
            return "(?" + prefix, index + 2 + len(prefix)
    if rest.startswith("<"):
        end = rest.find(">")
        name = rest[1:end] if end > 0 else ""
        if not (name[:1].isascii() and name[:1].isalpha() and name.isascii() and name.isalnum()):
            raise PatternError(f"named group {name!r} must be an ASCII letter followed by letters or digits")
        return f"(?<{name}>", index + 2 + end + 1
    flags = ""
    position = 0
    while position < len(rest) and (rest[position] in _JAVA_FLAGS | _UNSUPPORTED_FLAGS or rest[position] == "-"):
        flags += rest[position]
        position += 1
    if flags and position < len(rest) and rest[position] in ":)":
        unsupported = sorted(set(flags) & _UNSUPPORTED_FLAGS)
        if unsupported:
            raise PatternError(f"inline flag {unsupported[0]!r} is not supported")
        return "(?" + flags + rest[position], index + 2 + position + 1
    raise PatternError(f"unknown inline modifier or group type near index {index}")


def _repetition(pattern: str, index: int) -> tuple[str, int]:
    """A `{n}`, `{n,}` or `{n,m}` quantifier; Java refuses any other `{` outside a class."""
    end = pattern.find("}", index)
    body = pattern[index + 1:end] if end > 0 else ""
    low, comma, high = body.partition(",")
    if low.isdigit() and (not comma or not high or high.isdigit()):
        if high and int(high) < int(low):
            raise PatternError(f"illegal repetition range near index {index}")
        return pattern[index:end + 1], end + 1
    raise PatternError(f"illegal repetition near index {index}")


def _literal(char: str) -> str:
    return regex.escape(char)
