"""Kafka client settings: `--bootstrap-server` plus a client properties file, turned into kafka-python arguments.

Every kcm command that talks to Kafka builds its clients here, so TLS/SASL behave the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
import re
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from kcm_common.errors import UserError


class KafkaConfigError(UserError):
    """A client property that is unknown, malformed or points at a missing file."""

# Property names follow Apache Kafka's client configs (as in a `--command-config` file); librdkafka spellings
# that mean the same thing are accepted too, because users paste both.
_PROPERTY_TO_KWARG = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.jaas.config": "sasl_jaas_config",
    "ssl.ca.location": "ssl_cafile",
    "ssl.truststore.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.keystore.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
    "client.id": "client_id",
    "request.timeout.ms": "request_timeout_ms",
}
_FILE_PROPERTIES = frozenset(
    {"ssl.ca.location", "ssl.truststore.location", "ssl.certificate.location", "ssl.keystore.location", "ssl.key.location"}
)
_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java-style `key=value` lines (`#`/`!` comments, `:` separators, trailing-backslash continuations)."""
    properties: dict[str, str] = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical.append(line[:-1])
            continue
        logical.append(line)
        joined, logical = "".join(logical), []
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", joined)
        if match is None:
            raise KafkaConfigError(f"cannot read the property line {joined!r}: expected key=value")
        properties[match.group(1)] = match.group(2)
    return properties


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a client properties file (the `--command-config` of every kcm command)."""
    try:
        return parse_properties(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KafkaConfigError(f"cannot read the client config file {path}: {exc.strerror}") from exc


def kafka_python_options(properties: Mapping[str, str]) -> dict[str, Any]:
    """Translate client properties into kafka-python keyword arguments, rejecting what it cannot honour."""
    options: dict[str, Any] = {}
    for key, value in properties.items():
        if key not in _PROPERTY_TO_KWARG:
            raise KafkaConfigError(
                f"unsupported client property {key!r}; supported: {', '.join(sorted(_PROPERTY_TO_KWARG))}"
            )
        if key in _FILE_PROPERTIES and not Path(value).is_file():
            raise KafkaConfigError(f"client property {key} names {value!r}, which is not a readable file")
        options[_PROPERTY_TO_KWARG[key]] = value

    protocol = options.get("security_protocol", "PLAINTEXT").upper()
    if protocol not in _SECURITY_PROTOCOLS:
        raise KafkaConfigError(f"security.protocol must be one of {', '.join(_SECURITY_PROTOCOLS)}, not {protocol!r}")
    options["security_protocol"] = protocol
    if "sasl_mechanism" in options:
        options["sasl_mechanism"] = options["sasl_mechanism"].upper()
        if options["sasl_mechanism"] not in _SASL_MECHANISMS:
            raise KafkaConfigError(
                f"sasl.mechanism must be one of {', '.join(_SASL_MECHANISMS)}, not {options['sasl_mechanism']!r}"
            )
    jaas = dict(_JAAS_OPTION.findall(options.pop("sasl_jaas_config", "")))
    if jaas:
        options.setdefault("sasl_plain_username", jaas.get("username"))
        options.setdefault("sasl_plain_password", jaas.get("password"))
    if protocol.startswith("SASL") and not options.get("sasl_plain_username"):
        raise KafkaConfigError(f"security.protocol {protocol} needs sasl.username and sasl.password (or sasl.jaas.config)")
    if "ssl_check_hostname" in options:
        options["ssl_check_hostname"] = options["ssl_check_hostname"].lower() == "https"
    if "request_timeout_ms" in options:
        try:
            options["request_timeout_ms"] = int(options["request_timeout_ms"])
        except ValueError:
            raise KafkaConfigError("request.timeout.ms must be a whole number of milliseconds") from None
    return options


@dataclass(frozen=True)
class KafkaSettings:
    """Where a kcm component finds Kafka and how it authenticates; `repr` never shows secrets."""

    bootstrap_servers: str
    properties: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_cli(cls, bootstrap_servers: str, command_config: str | Path | None = None) -> KafkaSettings:
        properties = load_properties(command_config) if command_config else {}
        settings = cls(bootstrap_servers, properties)
        settings.client_options()  # validate once, at start-up
        return settings

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for any kafka-python client (consumer, producer, admin)."""
        if not self.bootstrap_servers.strip():
            raise KafkaConfigError("no bootstrap server given: pass --bootstrap-server HOST:PORT")
        options = kafka_python_options(self.properties)
        options["bootstrap_servers"] = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        return options

    def describe(self) -> str:
        """A log-safe one-line description (no secrets)."""
        protocol = self.properties.get("security.protocol", "PLAINTEXT").upper()
        return f"{self.bootstrap_servers} ({protocol})"


def ensure_topic(settings: KafkaSettings, name: str, partitions: int = 1, replication_factor: int = 1) -> bool:
    """Create `name` unless it exists; True when this call created it."""
    admin = KafkaAdminClient(**settings.client_options())
    try:
        if name in admin.list_topics():
            return False
        admin.create_topics([NewTopic(name, partitions, replication_factor)])
        return True
    except TopicAlreadyExistsError:
        return False
    finally:
        admin.close()
