"""The bridge's one typed configuration model, fed by a YAML file, `KCM_BRIDGE_*` variables and flags.

Precedence: flags over environment over file over defaults. Every value is checked once, at start-up, and a
bad one raises ConfigError naming the field (`batch.max_points`, `endpoints[1].tls.ca_file`, ...).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kcm_common import strict_yaml
from kcm_common.errors import UserError
from kcm_common.files import read_settings
from kcm_common.kafka import LONE_SURROGATE, load_properties, parse_bootstrap, utf8_text
from kcm_common.names import ATTRIBUTE_HEADERS, DEFAULT_METRICS_TOPIC, listen_address_problem, topic_problem
from kcm_common.otlp_export import Tls, is_endpoint, metadata_problem, pem_problem, read_metadata_value, tls_problem
from kcm_common.retry import LONGEST_WAIT_S, RetryPolicy

ENV_PREFIX = "KCM_BRIDGE_"
log = logging.getLogger("kcm.bridge")


class ConfigError(UserError):
    """A bridge setting that is missing, malformed or contradicts another; the message names the field."""


# A file's path: Python opens it by its bytes, so any name the file system holds will do, UTF-8 or not. Every other
# string setting ends up in a request to Kafka or a collector, or in a record, and must be UTF-8 text.
_PATH = {"path": True}


@dataclass(frozen=True)
class KafkaConfig:
    """Where to read: the metrics topic(s) as one consumer group."""

    bootstrap_servers: str = ""
    command_config: str | None = field(default=None, metadata=_PATH)  # client properties (TLS/SASL, tuning)
    # Inline client properties, over the file's; they may hold sasl.password, so repr leaves them out.
    properties: dict[str, str] = field(default_factory=dict, repr=False)
    topics: list[str] = field(default_factory=lambda: [DEFAULT_METRICS_TOPIC])
    group_id: str = "kcm-bridge"
    client: Literal["confluent-kafka", "kafka-python"] = "confluent-kafka"
    connect_timeout_s: float = 10.0


@dataclass(frozen=True)
class TlsConfig:
    ca_file: str | None = field(default=None, metadata=_PATH)
    cert_file: str | None = field(default=None, metadata=_PATH)
    key_file: str | None = field(default=None, metadata=_PATH)


MAX_CONCURRENCY = 64  # export threads per endpoint: far more than a collector gains from, and each holds a batch


@dataclass(frozen=True)
class EndpointConfig:
    """One OTLP/gRPC collector; header values come inline, from files (tokens) or from the environment."""

    endpoint: str = ""
    insecure: bool = False
    tls: TlsConfig = field(default_factory=TlsConfig)
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # tokens
    headers_from_files: dict[str, str] = field(default_factory=dict, metadata=_PATH)
    headers_from_env: dict[str, str] = field(default_factory=dict)
    compression: Literal["gzip", "none"] = "gzip"
    timeout_s: float = 10.0
    concurrency: int = 2
    # Retry UNAUTHENTICATED/PERMISSION_DENIED (final by the OTLP spec) until a fixed token is accepted: nothing dropped.
    retry_refused_credentials: bool = False
    # round_robin: every address the name resolves to (a headless Service's pods) takes requests in turn.
    balancing: Literal["pick_first", "round_robin"] = "pick_first"


@dataclass(frozen=True)
class BatchConfig:
    max_points: int = 8192
    max_bytes: int = 2 * 1024 * 1024   # below a collector's default 4 MiB gRPC receive limit
    linger_ms: int = 200


@dataclass(frozen=True)
class AttributeRule:
    """drop, rename (to `to`) or hash (salted SHA-256) one resource attribute."""

    action: Literal["drop", "rename", "hash"] = "drop"
    attribute: str = ""
    to: str | None = None
    salt: str | None = field(default=None, repr=False)
    salt_file: str | None = field(default=None, metadata=_PATH)
    salt_env: str | None = None


@dataclass(frozen=True)
class EnrichConfig:
    header_attributes: bool = True
    static_attributes: dict[str, str] = field(default_factory=dict)
    rules: list[AttributeRule] = field(default_factory=list)


@dataclass(frozen=True)
class TemporalityConfig:
    delta_to_cumulative: bool = False
    max_streams: int = 100_000
    idle_expiry_s: float = 600.0


@dataclass(frozen=True)
class DeliveryConfig:
    # Enough for every export thread to have batches queued behind the one it sends; more only holds memory.
    max_inflight_bytes: int = 16 * 1024 * 1024
    commit_interval_s: float = 1.0
    shutdown_timeout_s: float = 20.0
    revoke_timeout_s: float = 5.0
    dead_letter_topic: str | None = None
    # With a dead-letter topic, a request a collector keeps failing retryably while it answers an empty request is
    # split by client instance after this long, and an instance's records failing this long (and 20 attempts) while
    # the collector takes other data are dead-lettered (Bridge._isolate). 0: retried for ever.
    poison_after_s: float = 120.0


@dataclass(frozen=True)
class BridgeConfig:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    endpoints: list[EndpointConfig] = field(default_factory=list)
    routing: Literal["fanout", "hash"] = "fanout"
    batch: BatchConfig = field(default_factory=BatchConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    enrich: EnrichConfig = field(default_factory=EnrichConfig)
    temporality: TemporalityConfig = field(default_factory=TemporalityConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    log_format: Literal["text", "json"] = "text"
    # /healthz answers 503 once the consuming loop has not come round for this long (0: never), so Kubernetes
    # restarts a bridge wedged in a call that never returns; it must exceed what one turn may legitimately take.
    stall_timeout_s: float = 300.0

    def kafka_properties(self) -> dict[str, str]:
        """The client properties: the file's, then the inline ones over them."""
        from_file = load_properties(self.kafka.command_config) if self.kafka.command_config else {}
        return {**from_file, **self.kafka.properties}


# Environment variables and flags name scalar fields; these are the spellings (env suffix -> field path).
_ENV_FIELDS: dict[str, tuple[str, ...]] = {
    "BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "COMMAND_CONFIG": ("kafka", "command_config"),
    "TOPICS": ("kafka", "topics"),
    "GROUP_ID": ("kafka", "group_id"),
    "KAFKA_CLIENT": ("kafka", "client"),
    "ROUTING": ("routing",),
    "BATCH_MAX_POINTS": ("batch", "max_points"),
    "BATCH_MAX_BYTES": ("batch", "max_bytes"),
    "BATCH_LINGER_MS": ("batch", "linger_ms"),
    "DELTA_TO_CUMULATIVE": ("temporality", "delta_to_cumulative"),
    "DEAD_LETTER_TOPIC": ("delivery", "dead_letter_topic"),
    "MAX_INFLIGHT_BYTES": ("delivery", "max_inflight_bytes"),
    "SHUTDOWN_TIMEOUT_S": ("delivery", "shutdown_timeout_s"),
    "METRICS_PORT": ("metrics_port",),
    "STALL_TIMEOUT_S": ("stall_timeout_s",),
    "LOG_FORMAT": ("log_format",),
}


def load(path: str | Path | None = None, *, env: Mapping[str, str] | None = None,
         overrides: Mapping[tuple[str, ...], Any] | None = None, endpoints: list[str] | None = None,
         insecure: bool | None = None, flags: Mapping[tuple[str, ...], str] | None = None) -> BridgeConfig:
    """Build and validate the config: file, then `KCM_BRIDGE_*` from `env`, then flag `overrides`.

    `endpoints` (from `--endpoint`/`KCM_BRIDGE_ENDPOINTS`) replace the file's list; `insecure` applies to all. An
    error about a setting a variable gave names the variable, and one an override gave the flag `flags` names for it
    (`--endpoint` and `--insecure` for those two). It logs nothing: the caller calls `warn_of_unknown_variables` once
    the log format the config chose is in place.
    """
    document: dict[str, Any] = _read_yaml(Path(path)) if path else {}
    env = os.environ if env is None else env
    origins: dict[str, str] = {}   # a setting's dotted name -> the variable or flag that gave it
    for suffix, where in _ENV_FIELDS.items():
        if ENV_PREFIX + suffix in env:
            _set(document, where, env[ENV_PREFIX + suffix])
            origins[".".join(where)] = ENV_PREFIX + suffix
    for where, value in (overrides or {}).items():
        if value is not None:
            _set(document, where, value)
            origins.pop(".".join(where), None)
            if flags and where in flags:
                origins[".".join(where)] = flags[where]
    env_endpoints = env.get(ENV_PREFIX + "ENDPOINTS")
    if not endpoints and env_endpoints is not None and not env_endpoints.strip(", \t"):
        # An empty substitution must not quietly fall back to the file's endpoints.
        raise ConfigError(f"{ENV_PREFIX}ENDPOINTS is empty: name HOST:PORT endpoints (comma-separated), or unset it")
    chosen = endpoints or ([e for e in env_endpoints.split(",") if e.strip()] if env_endpoints else None)
    if chosen:
        document["endpoints"] = [{"endpoint": e.strip()} for e in chosen]
        origins.update({f"endpoints[{index}].endpoint": "--endpoint" if endpoints else ENV_PREFIX + "ENDPOINTS"
                        for index in range(len(chosen))})
    insecure_from = "--insecure" if insecure is not None else f"{ENV_PREFIX}INSECURE"
    if insecure is None and ENV_PREFIX + "INSECURE" in env:
        try:
            insecure = _convert(env[ENV_PREFIX + "INSECURE"], bool, "insecure")
        except ConfigError as error:
            raise ConfigError(f"{error} (set by {ENV_PREFIX}INSECURE)") from None
    if insecure is not None:
        for entry in document.get("endpoints") or []:
            if isinstance(entry, dict):
                entry["insecure"] = insecure
    try:
        config = _build(BridgeConfig, document, "")
        for index, endpoint in enumerate(config.endpoints if insecure else ()):
            if any((endpoint.tls.ca_file, endpoint.tls.cert_file, endpoint.tls.key_file)):
                raise ConfigError(f"endpoints[{index}]: insecure (plaintext) contradicts the tls files given; drop "
                                  f"one (insecure set for every endpoint by {insecure_from})")
        validate(config)
    except ConfigError as error:
        raise _naming_origin(error, origins) from None
    return config


def _naming_origin(error: ConfigError, origins: Mapping[str, str]) -> ConfigError:
    """`error` with the variable or flag that gave the setting it is about, when one did: the setting's own name
    alone sends a reader to a file that does not hold it."""
    message = str(error)
    for name in sorted(origins, key=len, reverse=True):   # `endpoints[1].endpoint` before `endpoints[1]`
        if message.startswith(name) and message[len(name):len(name) + 1] in (" ", ":", "[", "."):
            return ConfigError(f"{message} (set by {origins[name]})")
    return error


def warn_of_unknown_variables(config: BridgeConfig, env: Mapping[str, str]) -> None:
    """A misspelt `KCM_BRIDGE_*` variable would be ignored without a word (the YAML file refuses unknown keys; the
    environment also holds variables that are not the bridge's, such as a token a header reads)."""
    known = {ENV_PREFIX + suffix for suffix in (*_ENV_FIELDS, "ENDPOINTS", "INSECURE")}
    read = {variable for endpoint in config.endpoints for variable in endpoint.headers_from_env.values()}
    read |= {rule.salt_env for rule in config.enrich.rules if rule.salt_env}
    unknown = sorted(name for name in env if name.startswith(ENV_PREFIX) and name not in known | read)
    if unknown:
        log.warning("ignoring %s: not a bridge setting (the variables are %s)", ", ".join(unknown),
                    ", ".join(sorted(known)))


def validate(config: BridgeConfig) -> None:
    """Cross-field checks the types cannot express; raises ConfigError naming the field."""
    if not config.kafka.bootstrap_servers:
        raise ConfigError("kafka.bootstrap_servers is required: pass --bootstrap-server HOST:PORT")
    try:
        parse_bootstrap(config.kafka.bootstrap_servers)
    except UserError as exc:
        raise ConfigError(f"kafka.bootstrap_servers: {exc}") from None
    if config.kafka.command_config is not None and not config.kafka.command_config.strip():
        raise ConfigError("kafka.command_config is empty: name a client properties file, or leave it out")
    if config.delivery.dead_letter_topic is not None and not config.delivery.dead_letter_topic.strip():
        raise ConfigError("delivery.dead_letter_topic is empty: name a topic, or leave it out (undecodable records "
                          "are then counted and logged)")
    if config.kafka.command_config and not Path(config.kafka.command_config).is_file():
        raise ConfigError(f"kafka.command_config names {config.kafka.command_config!r}, which is not a readable file")
    if not config.kafka.topics or any(not t for t in config.kafka.topics):
        raise ConfigError("kafka.topics must name at least one topic")
    twice = sorted({t for t in config.kafka.topics if config.kafka.topics.count(t) > 1})
    if twice:
        raise ConfigError(f"kafka.topics names {twice[0]!r} more than once")
    for index, name in enumerate(config.kafka.topics):
        if problem := topic_problem(name):
            raise ConfigError(f"kafka.topics[{index}]: {problem}")
    if config.delivery.dead_letter_topic and (problem := topic_problem(config.delivery.dead_letter_topic)):
        raise ConfigError(f"delivery.dead_letter_topic: {problem}")
    if problem := listen_address_problem(config.metrics_host):
        raise ConfigError(f"metrics_host {problem}")
    if not config.kafka.group_id:
        raise ConfigError("kafka.group_id must not be empty")
    if not config.endpoints:
        raise ConfigError("endpoints: no OTLP endpoint configured; pass --endpoint HOST:PORT (repeatable)")
    first_at: dict[tuple[str, int], int] = {}
    for index, endpoint in enumerate(config.endpoints):
        _validate_endpoint(endpoint, f"endpoints[{index}]")
        same = first_at.setdefault(_endpoint_key(endpoint.endpoint), index)
        if same != index:   # with fanout every record would reach that collector twice
            raise ConfigError(f"endpoints[{index}] repeats endpoints[{same}] ({endpoint.endpoint}); give each "
                              "collector once")
    _positive(config.batch.max_points, "batch.max_points")
    _positive(config.batch.max_bytes, "batch.max_bytes")
    if config.batch.linger_ms < 0:
        raise ConfigError(f"batch.linger_ms must be 0 or more, not {config.batch.linger_ms}")
    if config.batch.linger_ms > LONGEST_WAIT_S * 1000:
        raise ConfigError(f"batch.linger_ms must be at most {LONGEST_WAIT_S * 1000} (a year), not "
                          f"{config.batch.linger_ms}")
    _seconds(config.kafka.connect_timeout_s, "kafka.connect_timeout_s")
    _seconds(config.retry.initial_backoff_s, "retry.initial_backoff_s")
    _seconds(config.retry.max_backoff_s, "retry.max_backoff_s")
    if config.retry.max_backoff_s < config.retry.initial_backoff_s:
        raise ConfigError("retry.max_backoff_s must be at least retry.initial_backoff_s")
    if not (math.isfinite(config.retry.multiplier) and config.retry.multiplier >= 1):
        raise ConfigError(f"retry.multiplier must be a finite number, 1 or more, not {config.retry.multiplier}")
    if not 0 <= config.retry.jitter <= 1:
        raise ConfigError(f"retry.jitter must be between 0 and 1, not {config.retry.jitter}")
    if "" in config.enrich.static_attributes:
        raise ConfigError("enrich.static_attributes has an empty attribute name: OTLP attribute keys must not be empty")
    if config.enrich.header_attributes:
        for name in sorted(set(config.enrich.static_attributes) & set(ATTRIBUTE_HEADERS)):
            log.warning("enrich.static_attributes.%s replaces the contract header %s of every record (the broker's "
                        "own value); name it otherwise to keep both", name, name)
    for index, rule in enumerate(config.enrich.rules):
        _validate_rule(rule, f"enrich.rules[{index}]")
    _validate_renames(config.enrich)
    _positive(config.temporality.max_streams, "temporality.max_streams")
    _seconds(config.temporality.idle_expiry_s, "temporality.idle_expiry_s")
    _positive(config.delivery.max_inflight_bytes, "delivery.max_inflight_bytes")
    _seconds(config.delivery.commit_interval_s, "delivery.commit_interval_s")
    _seconds(config.delivery.shutdown_timeout_s, "delivery.shutdown_timeout_s")
    _seconds(config.delivery.revoke_timeout_s, "delivery.revoke_timeout_s", allow_zero=True)
    _seconds(config.delivery.poison_after_s, "delivery.poison_after_s", allow_zero=True)
    _seconds(config.stall_timeout_s, "stall_timeout_s", allow_zero=True)
    if config.delivery.dead_letter_topic is not None and config.delivery.dead_letter_topic in config.kafka.topics:
        raise ConfigError("delivery.dead_letter_topic must not be one of kafka.topics (the bridge would read it back)")
    if config.metrics_port is not None and not 0 <= config.metrics_port <= 65535:
        raise ConfigError(f"metrics_port must be from 0 to 65535, not {config.metrics_port}")


def _endpoint_key(endpoint: str) -> tuple[str, int]:
    """One spelling per collector address: case, a trailing dot, IPv6 forms and leading zeros of the port aside."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]").lower().rstrip(".")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return host, int(port)


def _validate_endpoint(endpoint: EndpointConfig, where: str) -> None:
    if not is_endpoint(endpoint.endpoint):
        raise ConfigError(f"{where}.endpoint must be HOST:PORT (e.g. otel-collector:4317), not {endpoint.endpoint!r}")
    for name, path, kind in (("ca_file", endpoint.tls.ca_file, "certificate"),
                             ("cert_file", endpoint.tls.cert_file, "certificate"),
                             ("key_file", endpoint.tls.key_file, "key")):
        if path is not None and not path.strip():   # a template that rendered empty must not drop the TLS setting
            raise ConfigError(f"{where}.tls.{name} is empty: name a PEM file, or leave it out")
        problem = pem_problem(path, kind) if path else None
        if problem:
            raise ConfigError(f"{where}.tls.{name}: {problem}")
    if endpoint.insecure and any((endpoint.tls.ca_file, endpoint.tls.cert_file, endpoint.tls.key_file)):
        raise ConfigError(f"{where}: insecure (plaintext) contradicts the tls files given; drop one")
    if bool(endpoint.tls.cert_file) != bool(endpoint.tls.key_file):
        raise ConfigError(f"{where}.tls: cert_file and key_file go together (client certificate and its key)")
    unusable = tls_problem(Tls(endpoint.tls.ca_file, endpoint.tls.cert_file, endpoint.tls.key_file))
    if unusable:
        raise ConfigError(f"{where}.tls.{unusable.setting}: {unusable.file} {unusable.why}")
    endpoint_metadata(endpoint, where)
    _seconds(endpoint.timeout_s, f"{where}.timeout_s")
    _positive(endpoint.concurrency, f"{where}.concurrency")
    if endpoint.concurrency > MAX_CONCURRENCY:
        raise ConfigError(f"{where}.concurrency must be at most {MAX_CONCURRENCY} (export threads), not "
                          f"{endpoint.concurrency}")


def endpoint_metadata(endpoint: EndpointConfig, where: str = "endpoints") -> list[tuple[str, str]]:
    """The call metadata of an endpoint: inline headers, values read from files now, from the environment; raises
    ConfigError naming the setting (never a value) for one gRPC would refuse or that is given twice."""
    values: dict[str, tuple[str, str]] = {}   # header name -> (where it comes from, its value)
    for name, value in endpoint.headers.items():
        values[name] = (f"{where}.headers.{name}", value)
    for name, path in endpoint.headers_from_files.items():
        try:
            values[name] = (f"{where}.headers_from_files.{name}", read_metadata_value(path))
        except ValueError as exc:
            raise ConfigError(f"{where}.headers_from_files.{name}: {exc}") from None
    for name, variable in endpoint.headers_from_env.items():
        if variable not in os.environ:
            raise ConfigError(f"{where}.headers_from_env.{name}: environment variable {variable} is not set")
        values[name] = (f"{where}.headers_from_env.{name}", os.environ[variable])
    if len(values) < len(endpoint.headers) + len(endpoint.headers_from_files) + len(endpoint.headers_from_env):
        raise ConfigError(f"{where}: a header is given more than once across headers, headers_from_files and "
                          "headers_from_env")
    for name, (source, value) in values.items():
        problem = metadata_problem(name, value)
        if problem:
            raise ConfigError(f"{source}: {problem}")
    return sorted((name, value) for name, (_, value) in values.items())


def _validate_rule(rule: AttributeRule, where: str) -> None:
    if not rule.attribute:
        raise ConfigError(f"{where}.attribute is required: the resource attribute the rule applies to")
    if rule.action == "rename" and not rule.to:
        raise ConfigError(f"{where}: a rename rule needs `to`, the new attribute name")
    if rule.action != "rename" and rule.to:
        raise ConfigError(f"{where}: `to` only applies to rename rules")
    salts = [s for s in (rule.salt, rule.salt_file, rule.salt_env) if s]
    if rule.action == "hash" and len(salts) != 1:
        raise ConfigError(f"{where}: a hash rule needs exactly one of salt, salt_file, salt_env "
                          "(an unsalted hash of an address or principal is easy to reverse)")
    if rule.action != "hash" and salts:
        raise ConfigError(f"{where}: salts only apply to hash rules")
    if rule.action == "hash":
        rule_salt(rule, where)


def applied_rules(rules: list[AttributeRule], key: str) -> tuple[str | None, list[int]]:
    """What the rules make of an attribute named `key`: its name after them (None when dropped), and the indices of
    the rules that apply to it in order (each sees the name the ones before left)."""
    applied = []
    for index, rule in enumerate(rules):
        if rule.attribute != key:
            continue
        applied.append(index)
        if rule.action == "drop":
            return None, applied
        if rule.action == "rename":
            key = rule.to or key
    return key, applied


def _validate_renames(enrich: EnrichConfig) -> None:
    """Refuse rename rules that give an attribute a name another one also ends up with: a resource would keep only
    one of the two. The header and static attributes are there by design; a client's own attribute that a rename
    reaches is replaced by the renamed one."""
    designed = {name: f"the contract header {name} (enrich.header_attributes is on)"
                for name in (ATTRIBUTE_HEADERS if enrich.header_attributes else ())}
    designed.update({name: f"enrich.static_attributes.{name}" for name in enrich.static_attributes})
    holders: dict[str, str] = {}   # a name the rules leave -> who has it
    renamed = []
    for source in dict.fromkeys([*designed, *(rule.attribute for rule in enrich.rules)]):
        name, applied = applied_rules(enrich.rules, source)
        if name is not None and name != source:
            rename = [index for index in applied if enrich.rules[index].action == "rename"][-1]
            renamed.append((source, name, f"enrich.rules[{rename}]"))
        elif name is not None and source in designed:
            holders[name] = designed[source]
        elif name is not None and any(enrich.rules[index].action == "rename" for index in applied):
            # Renamed away and back (a→b, b→a): it keeps its name, and another rename reaching it would collide.
            holders[name] = f"{source!r}, which the rules bring back to its own name"
    for source, name, where in renamed:
        if name in holders:
            raise ConfigError(f"{where}: renaming {source!r} to {name!r} clashes with {holders[name]}: a resource "
                              "would keep only one of them; choose another name")
        holders[name] = f"{source!r}, renamed to it by {where}"


def rule_salt(rule: AttributeRule, where: str = "enrich.rules") -> bytes:
    """The salt of a hash rule, read now from where it is kept; raises ConfigError (never quoting it) when that
    cannot be read or holds nothing: an empty salt is an unsalted hash."""
    if rule.salt_file:
        try:
            salt = Path(rule.salt_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"{where}.salt_file names {rule.salt_file!r}, which is not a readable file "
                              f"({exc.strerror or exc})") from None
        source = f"{where}.salt_file {rule.salt_file!r}"
    elif rule.salt_env:
        if rule.salt_env not in os.environ:
            raise ConfigError(f"{where}.salt_env: environment variable {rule.salt_env} is not set")
        # The variable's bytes as the process got them, as a salt_file's are read: any bytes make a salt.
        salt, source = os.fsencode(os.environ[rule.salt_env]), f"{where}.salt_env {rule.salt_env}"
    else:
        salt, source = (rule.salt or "").encode(), f"{where}.salt"
    if not salt:
        raise ConfigError(f"{source} is empty: an unsalted hash of an address or principal is easy to reverse")
    return salt


def _positive(value: float, where: str) -> None:
    # NaN compares false with everything and an infinite timeout never fires: neither is a usable setting.
    if isinstance(value, float) and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{where} must be a finite number > 0, not {value}")
    if value <= 0:
        raise ConfigError(f"{where} must be positive, not {value}")


def _seconds(value: float, where: str, allow_zero: bool = False) -> None:
    """A duration: finite, above 0 (or 0 when allowed), at most a year (beyond it only overflows clocks)."""
    if not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ConfigError(f"{where} must be a finite number{', 0 or more' if allow_zero else ' > 0'}, not {value}")
    if value > LONGEST_WAIT_S:
        raise ConfigError(f"{where} must be at most {LONGEST_WAIT_S} seconds (a year), not {value}")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        document = strict_yaml.load(read_settings(path), plain_text=True)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML{strict_yaml.describe(exc)}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"the config file {path} must hold a mapping of settings at the top level")
    return document


def _set(document: dict[str, Any], where: tuple[str, ...], value: Any) -> None:
    node = document
    for depth, key in enumerate(where[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):   # the file's mistake (`batch:` left empty too), whatever a flag sets in it
            raise ConfigError(f"{'.'.join(where[:depth + 1])} must be a mapping, not {_kind(child)}")
        node = child
    node[where[-1]] = value


def _build(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping, not {_kind(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"unknown setting {_join(where, str(unknown[0]))}; known: {', '.join(sorted(fields))}")
    values = {name: _convert(raw[name], hints[name], _join(where, name), path=f.metadata.get("path", False))
              for name, f in fields.items() if name in raw}
    return cls(**values)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _convert(value: Any, kind: Any, where: str, path: bool = False) -> Any:
    """Coerce a YAML value, or an environment/flag string, to the field's declared type; `path`: the strings (a
    mapping's values) name files."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, where, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where} must be one of {', '.join(map(str, args))}, not {_shown(value)}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, not {_kind(value)}")
        return [_convert(item, args[0], f"{where}[{i}]", path) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of names to values, not {_kind(value)}")
        converted = {}
        for key, item in value.items():
            name = _text(str(key), f"a name in {where}")
            converted[name] = _convert(item, args[1], f"{where}.{name}", path)
        return converted
    if dataclasses.is_dataclass(kind):
        return _build(kind, value, where)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.strip().lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where} must be true or false, not {_shown(value)}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, not {_shown(value)}")
        try:
            number = kind(value) if not isinstance(value, float) or kind is float else None
        except (TypeError, ValueError):
            number = None
        if number is None:
            article = "a whole number" if kind is int else "a number"
            raise ConfigError(f"{where} must be {article}, not {_shown(value)}")
        return number
    if kind is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{where} must be a string, not {_kind(value)}")
        return str(value) if path else _text(str(value), where)
    raise TypeError(f"no conversion for {kind!r}")  # a field type this loader does not know: a bug, not a user error


def _kind(value: Any) -> str:
    """What a value the wrong type is, in YAML's words for nothing (`batch:` left empty is null, not NoneType)."""
    return "null" if value is None else type(value).__name__


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value)


def _text(text: str, where: str) -> str:
    """`text` as UTF-8 text; raises ConfigError naming `where`, never the text (it may be a secret)."""
    joined = utf8_text(text)
    if joined is None:
        raise ConfigError(f"{where} is not UTF-8 text ({LONE_SURROGATE})")
    return joined
