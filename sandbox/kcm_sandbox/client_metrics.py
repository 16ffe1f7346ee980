"""CLIENT_METRICS config resources (KIP-714 subscriptions): validation, describe and a persistent store.

The rules follow Apache Kafka 4.x: `ClientMetricsConfigs.validate` for what is accepted,
`ConfigurationControlManager` for how (Incremental)AlterConfigs change a resource, and
`ConfigHelper` for how DescribeConfigs answers. Match patterns are compiled with Python's `re`
and applied with `re.fullmatch`, where Kafka uses `java.util.regex` and `Matcher.matches()`: the
common syntax agrees, but Java-only constructs (`\\p{Alpha}`, `\\Q...\\E`, `[a-z&&[^e]]`) are
rejected here and Python-only ones (`(?P<name>...)`) are accepted here.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

RESOURCE_TYPE = 16
CONFIG_SOURCE = 7  # DescribeConfigsResponse.ConfigSource.CLIENT_METRICS_CONFIG
DEFAULT_CONFIG_SOURCE = 5  # DescribeConfigsResponse.ConfigSource.DEFAULT_CONFIG

METRICS = "metrics"
INTERVAL_MS = "interval.ms"
MATCH = "match"
CONFIG_KEYS = (METRICS, INTERVAL_MS, MATCH)
MATCH_KEYS = (
    "client_instance_id",
    "client_id",
    "client_software_name",
    "client_software_version",
    "client_source_address",
    "client_source_port",
)
ALL_METRICS = "*"
DEFAULT_INTERVAL_MS = 300000
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 3600000

INVALID_CONFIG = 40
INVALID_REQUEST = 42

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
_JAVA_WHITESPACE = "".join(chr(code) for code in range(0x21))  # what String.trim() strips
_COMMA_WITH_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]*,[ \t\n\x0b\f\r]*")  # ConfigDef's "\\s*,\\s*"
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_STATE_VERSION = 1


class ConfigError(Exception):
    """A config change or describe Kafka would refuse, with the error code and message it would answer."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


class StateFileError(ValueError):
    """The subscription state file cannot be read back."""


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
    """Split a LIST config value the way Kafka's ConfigDef does (trim, then split on commas with spaces)."""
    trimmed = value.strip(_JAVA_WHITESPACE)
    if not trimmed:
        return []
    return _COMMA_WITH_WHITESPACE.split(trimmed)


def parse_match(entries: Iterable[str]) -> dict[str, str]:
    """Parse `key=regex` entries into {key: regex}; a repeated key keeps its last pattern, as Kafka's map does."""
    patterns: dict[str, str] = {}
    for entry in entries:
        parts = _java_split(entry, "=")
        if len(parts) != 2:
            raise ConfigError(INVALID_CONFIG, f"Illegal client matching pattern: {entry}")
        key = parts[0].strip(_JAVA_WHITESPACE)
        pattern = parts[1].strip(_JAVA_WHITESPACE)
        if key not in MATCH_KEYS:
            raise ConfigError(INVALID_CONFIG, f"Illegal client matching pattern: {entry}")
        try:
            re.compile(pattern)
        except re.error:
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
    if INTERVAL_MS in configs:
        interval = _parse_int(INTERVAL_MS, configs[INTERVAL_MS])
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise ConfigError(
                INVALID_REQUEST,
                f"Invalid value {interval} for {INTERVAL_MS}, interval must be between 100 and 3600000 (1 hour)",
            )
    if MATCH in configs:
        parse_match(parse_list(configs[MATCH]))


def to_subscription(name: str, configs: Mapping[str, str]) -> Subscription:
    """Turn valid stored configs into a Subscription, filling ConfigDef defaults for unset keys."""
    interval = configs.get(INTERVAL_MS)
    return Subscription(
        name=name,
        metrics=tuple(parse_list(configs.get(METRICS, ""))),
        interval_ms=DEFAULT_INTERVAL_MS if interval is None else _parse_int(INTERVAL_MS, interval),
        match=tuple(parse_match(parse_list(configs.get(MATCH, ""))).items()),
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
            parts = [part for part in _java_split(current.get(name, _DEFAULT_VALUES[name]), ",") if part]
            for item in _java_split(value, ","):
                if op == OP_APPEND and item not in parts:
                    parts.append(item)
                elif op == OP_SUBTRACT and item in parts:
                    parts.remove(item)
            updated[name] = ",".join(parts)
        else:
            raise ConfigError(INVALID_REQUEST, f"Unknown alter config operation {op} for {name}")
    return updated


def describe_entries(configs: Mapping[str, str], keys: Iterable[str] | None = None) -> list[ConfigEntry]:
    """DescribeConfigs entries for one resource: every known key, set or default, filtered by `keys` when given."""
    wanted = set(keys or CONFIG_KEYS)
    entries = []
    for key in CONFIG_KEYS:
        if key not in wanted:
            continue
        is_set = key in configs
        entries.append(
            ConfigEntry(
                name=key,
                value=_normalised(key, configs[key]) if is_set else _DEFAULT_VALUES[key],
                read_only=False,
                is_default=not is_set,
                source=CONFIG_SOURCE if is_set else DEFAULT_CONFIG_SOURCE,
                sensitive=False,
                config_type=_CONFIG_TYPES[key],
                documentation=_DOCUMENTATION[key],
            )
        )
    return entries


class SubscriptionStore:
    """The CLIENT_METRICS resources of the sandbox, optionally persisted to a JSON state file."""

    def __init__(self, state_file: pathlib.Path | None = None) -> None:
        self._state_file = pathlib.Path(state_file) if state_file is not None else None
        self._configs: dict[str, dict[str, str]] = {}
        self._generation = 0
        if self._state_file is not None and self._state_file.exists():
            self._configs = _load_state(self._state_file)

    @property
    def generation(self) -> int:
        """Bumped on every effective change, so readers know when to recompute."""
        return self._generation

    def names(self) -> list[str]:
        """Names of the existing subscriptions (what ListConfigResources lists), sorted."""
        return sorted(self._configs)

    def configs(self, name: str) -> dict[str, str]:
        """The raw configs set on a subscription, as they were written; empty when it does not exist."""
        return dict(self._configs.get(name, {}))

    def describe(self, name: str, keys: list[str] | None = None) -> list[ConfigEntry]:
        """DescribeConfigs for one resource; a name never set describes as all defaults, as Kafka 4.x does."""
        if not name:
            raise ConfigError(INVALID_REQUEST, "Client metrics subscription name must not be empty")
        return describe_entries(self._configs.get(name, {}), keys)

    def alter(self, name: str, configs: dict[str, str | None], validate_only: bool = False) -> None:
        """AlterConfigs (legacy): replace every config of the resource; an empty map removes it."""
        nulls = [key for key, value in configs.items() if value is None]
        if nulls:
            raise ConfigError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
        self._commit(name, {key: value for key, value in configs.items() if value is not None}, validate_only)

    def incremental_alter(
        self, name: str, ops: list[tuple[str, int, str | None]], validate_only: bool = False
    ) -> None:
        """IncrementalAlterConfigs: op 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT (the last two on list keys only)."""
        self._commit(name, apply_incremental(self._configs.get(name, {}), ops), validate_only)

    def subscriptions(self) -> list[Subscription]:
        """Every subscription, parsed, in name order."""
        return [to_subscription(name, self._configs[name]) for name in self.names()]

    def _commit(self, name: str, updated: dict[str, str], validate_only: bool) -> None:
        validate(name, updated)
        if validate_only or updated == self._configs.get(name, {}):
            return
        configs = dict(self._configs)
        if updated:
            configs[name] = updated
        else:
            configs.pop(name, None)
        if self._state_file is not None:
            _save_state(self._state_file, configs)
        self._configs = configs
        self._generation += 1


def _parse_int(key: str, raw: str) -> int:
    # ConfigDef.parseType(INT) -> Integer.parseInt(trimmed); a ConfigException is INVALID_CONFIG.
    trimmed = raw.strip(_JAVA_WHITESPACE)
    if _JAVA_INT.fullmatch(trimmed) and -(2**31) <= int(trimmed) < 2**31:
        return int(trimmed)
    raise ConfigError(INVALID_CONFIG, f"Invalid value {raw} for configuration {key}: Not a number of type INT")


def _normalised(key: str, raw: str) -> str:
    # ConfigHelper describes the parsed value through ConfigDef.convertToString, not the raw text.
    if key == INTERVAL_MS:
        return str(_parse_int(key, raw))
    return ",".join(parse_list(raw))


def _java_split(text: str, separator: str) -> list[str]:
    # String.split drops trailing empty strings, but "" splits into [""].
    if not text:
        return [text]
    parts = text.split(separator)
    while parts and not parts[-1]:
        parts.pop()
    return parts


def _load_state(path: pathlib.Path) -> dict[str, dict[str, str]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StateFileError(
            f"cannot read the sandbox subscription state {path}: {err}; fix or delete the file"
        ) from err
    subscriptions = document.get("subscriptions") if isinstance(document, dict) else None
    if not isinstance(subscriptions, dict):
        raise StateFileError(f"{path} has no 'subscriptions' object; fix or delete the file")
    configs: dict[str, dict[str, str]] = {}
    for name, entry in subscriptions.items():
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()) or not entry:
            raise StateFileError(f"{path}: subscription {name!r} must map config names to strings")
        try:
            validate(name, entry)
        except ConfigError as err:
            raise StateFileError(f"{path}: subscription {name!r} is invalid: {err.message}") from None
        configs[name] = dict(entry)
    return configs


def _save_state(path: pathlib.Path, configs: dict[str, dict[str, str]]) -> None:
    # Write a sibling temp file and rename it over the old one, so a crash never leaves half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"version": _STATE_VERSION, "subscriptions": configs}, indent=2, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
