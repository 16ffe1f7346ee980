"""CLIENT_METRICS config resources (KIP-714 subscriptions): Kafka's rules for what is accepted and described.

The rules follow Apache Kafka 4.3.1: `ClientMetricsConfigs.validate` (through `ConfigDef.parse`) for what is
accepted, `ConfigAdminManager.preprocess` and `ConfigurationControlManager` for how (Incremental)AlterConfigs
change a resource, and `ConfigHelper` for how DescribeConfigs answers. Match patterns are java.util.regex
patterns, compiled by `kcm_common.java` and applied as `Matcher.matches()` would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kcm_common.codes import (
    CLIENT_METRICS_CONFIG_SOURCE,
    DEFAULT_CONFIG_SOURCE,
    INVALID_CONFIG,
    INVALID_REQUEST,
)
from kcm_common.java import TRIM_CHARACTERS, PatternError, compile_pattern, hash_order, parse_int, split
from kcm_common.names import CLIENT_ATTRIBUTES

METRICS = "metrics"
INTERVAL_MS = "interval.ms"
MATCH = "match"
CONFIG_KEYS = (METRICS, INTERVAL_MS, MATCH)  # ConfigDef's definition order, which `ConfigDef.parse` follows
# DescribeConfigs lists entries in the iteration order of the parsed values' java.util.HashMap.
DESCRIBE_ORDER = tuple(hash_order(CONFIG_KEYS))
MATCH_KEYS = CLIENT_ATTRIBUTES
ALL_METRICS = "*"
DEFAULT_INTERVAL_MS = 300000
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 3600000

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

CONFIG_TYPE_INT = 3  # DescribeConfigsResponse.ConfigType ids
CONFIG_TYPE_LIST = 7
_CONFIG_TYPES = {METRICS: CONFIG_TYPE_LIST, INTERVAL_MS: CONFIG_TYPE_INT, MATCH: CONFIG_TYPE_LIST}
_DEFAULT_VALUES = {METRICS: "", INTERVAL_MS: str(DEFAULT_INTERVAL_MS), MATCH: ""}
# The ConfigDef documentation strings of ClientMetricsConfigs.
_DOCUMENTATION = {
    METRICS: "Telemetry metric name prefix list",
    INTERVAL_MS: "Metrics push interval in milliseconds",
    MATCH: "Client match criteria",
}
_LIST_KEYS = frozenset({METRICS, MATCH})
_COMMA_WITH_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]*,[ \t\n\x0b\f\r]*")  # ConfigDef's "\\s*,\\s*"


class ConfigError(Exception):
    """A config change or describe Kafka would refuse, with the error code and message it would answer."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@dataclass(frozen=True)
class Subscription:
    """One subscription as the telemetry manager applies it (parsed values, patterns not yet compiled)."""

    name: str
    metrics: tuple[str, ...]
    interval_ms: int
    match: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ConfigEntry:
    """One DescribeConfigs result entry."""

    name: str
    value: str | None
    read_only: bool
    is_default: bool
    source: int
    sensitive: bool
    config_type: int
    documentation: str | None


def parse_list(value: str) -> list[str]:
    """Split a LIST config value the way Kafka's ConfigDef does (trim, split on commas with spaces, keep empties)."""
    trimmed = value.strip(TRIM_CHARACTERS)
    if not trimmed:
        return []
    return _COMMA_WITH_WHITESPACE.split(trimmed)


def parsed_list(key: str, value: str) -> list[str]:
    """A LIST value as ConfigDef.parseValue reads it: repeated items dropped (the first of each kept; Kafka 4.2+ logs
    a warning, KAFKA-19875), then checked as ValidList.anyNonDuplicateValues does: an empty item is INVALID_CONFIG."""
    items = list(dict.fromkeys(parse_list(value)))
    if "" in items:
        raise ConfigError(INVALID_CONFIG, f"Configuration '{key}' values must not be empty.")
    return items


def parse_match(entries: Iterable[str], check_patterns: bool = True) -> dict[str, str]:
    """Parse `key=regex` entries into {key: regex}; a repeated key keeps its last pattern, as Kafka's map does.
    `check_patterns=False` leaves the patterns to whoever stored them (what Kafka holds, it accepted: its Java regex
    dialect is wider than the translation kcm checks patterns with)."""
    patterns: dict[str, str] = {}
    for entry in entries:
        parts = split(entry, "=")
        if len(parts) != 2:
            raise ConfigError(INVALID_CONFIG, f"Illegal client matching pattern: {entry}")
        key = parts[0].strip(TRIM_CHARACTERS)
        pattern = parts[1].strip(TRIM_CHARACTERS)
        if key not in MATCH_KEYS:
            raise ConfigError(INVALID_CONFIG, f"Illegal client matching pattern: {entry}")
        try:
            if check_patterns:
                compile_pattern(pattern)
        except PatternError:
            raise ConfigError(INVALID_CONFIG, f"Illegal client matching pattern: {entry}") from None
        patterns[key] = pattern
    return patterns


def validate(name: str, configs: Mapping[str, str]) -> None:
    """Check a subscription's complete configs as ClientMetricsConfigs.validate does; raises ConfigError."""
    if not name:
        raise ConfigError(INVALID_REQUEST, "Subscription name can't be empty")
    for key in configs:
        if key not in CONFIG_KEYS:
            raise ConfigError(INVALID_REQUEST, f"Unknown client metrics configuration: {key}")
    # ConfigDef.parse: every key, in definition order, before the range and pattern checks.
    parsed_list(METRICS, configs.get(METRICS, ""))
    interval = _parse_int(INTERVAL_MS, configs[INTERVAL_MS]) if INTERVAL_MS in configs else DEFAULT_INTERVAL_MS
    match = parsed_list(MATCH, configs.get(MATCH, ""))
    if INTERVAL_MS in configs and not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
        raise ConfigError(
            INVALID_REQUEST,
            f"Invalid value {interval} for {INTERVAL_MS}, interval must be between 100 and 3600000 (1 hour)",
        )
    parse_match(match)


def to_subscription(name: str, configs: Mapping[str, str]) -> Subscription:
    """Turn valid stored configs into a Subscription, filling ConfigDef defaults for unset keys."""
    interval = configs.get(INTERVAL_MS)
    return Subscription(
        name=name,
        metrics=tuple(parsed_list(METRICS, configs.get(METRICS, ""))),
        interval_ms=DEFAULT_INTERVAL_MS if interval is None else _parse_int(INTERVAL_MS, interval),
        match=tuple(parse_match(parsed_list(MATCH, configs.get(MATCH, ""))).items()),
    )


def apply_incremental(current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]]) -> dict[str, str]:
    """The configs after IncrementalAlterConfigs `ops` (name, op, value); raises ConfigError, never validates values."""
    ops = list(ops)
    names = [name for name, _, _ in ops]
    # ConfigAdminManager.preprocess, on the broker, before the controller sees the request.
    if len(set(names)) != len(names):
        raise ConfigError(INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [name for name, op, value in ops if op != OP_DELETE and value is None]
    if nulls:
        raise ConfigError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
    updated = dict(current)
    # ConfigurationControlManager.incrementalAlterConfigResource.
    for name, op, value in ops:
        if op == OP_SET:
            updated[name] = value
        elif op == OP_DELETE:
            updated.pop(name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if name not in _LIST_KEYS:
                raise ConfigError(
                    INVALID_CONFIG, f"Can't {_OP_NAMES[op]} to key {name} because its type is not LIST."
                )
            parts = [part for part in split(current.get(name, _DEFAULT_VALUES[name]), ",") if part]
            for item in split(value, ","):
                if op == OP_APPEND and item not in parts:
                    parts.append(item)
                elif op == OP_SUBTRACT and item in parts:
                    parts.remove(item)
            updated[name] = ",".join(parts)
        else:
            raise ConfigError(INVALID_REQUEST, f"Unknown alter config operation {op} for {name}")
    return updated


def describe_entries(configs: Mapping[str, str], keys: Iterable[str] | None = None) -> list[ConfigEntry]:
    """DescribeConfigs entries for one resource: every known key, set or default, in Kafka's order, filtered by `keys`."""
    wanted = set(keys or CONFIG_KEYS)
    entries = []
    for key in DESCRIBE_ORDER:
        if key not in wanted:
            continue
        is_set = key in configs
        entries.append(
            ConfigEntry(
                name=key,
                value=_normalised(key, configs[key]) if is_set else _DEFAULT_VALUES[key],
                read_only=False,
                is_default=not is_set,
                source=CLIENT_METRICS_CONFIG_SOURCE if is_set else DEFAULT_CONFIG_SOURCE,
                sensitive=False,
                config_type=_CONFIG_TYPES[key],
                documentation=_DOCUMENTATION[key],
            )
        )
    return entries


def _parse_int(key: str, raw: str) -> int:
    # ConfigDef.parseType(INT) -> Integer.parseInt(trimmed); a ConfigException is INVALID_CONFIG.
    value = parse_int(raw.strip(TRIM_CHARACTERS))
    if value is None:
        raise ConfigError(INVALID_CONFIG, f"Invalid value {raw} for configuration {key}: Not a number of type INT")
    return value


# ConfigurationControlManager refuses a changed value longer than this (Java characters: UTF-16 units).
MAX_VALUE_CHARS = 32767


def check_value_sizes(current: Mapping[str, str], updated: Mapping[str, str]) -> None:
    """What Kafka's controller checks before it validates a change (KAFKA-18907): no value set or changed is longer
    than MAX_VALUE_CHARS; raises ConfigError."""
    for key, value in updated.items():
        if current.get(key) != value and len(value.encode("utf-16-le", "surrogatepass")) // 2 > MAX_VALUE_CHARS:
            raise ConfigError(INVALID_CONFIG, "The configuration value cannot be added because it exceeds the "
                                              f"maximum value size of {MAX_VALUE_CHARS} bytes.")


def _normalised(key: str, raw: str) -> str:
    # ConfigHelper describes the parsed value through ConfigDef.convertToString, not the raw text.
    if key == INTERVAL_MS:
        return str(_parse_int(key, raw))
    return ",".join(parsed_list(key, raw))
