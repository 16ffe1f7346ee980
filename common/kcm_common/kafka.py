"""Kafka client settings: `--bootstrap-server` plus a client properties file, turned into kafka-python arguments.

Every kcm command that talks to Kafka builds its clients here, so TLS/SASL behave the same everywhere.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaConfigurationError, TopicAlreadyExistsError

from kcm_common.errors import UserError
from kcm_common.java import TRIM_CHARACTERS, parse_int
from kcm_common.files import read_settings
from kcm_common.java_config import JavaConfigError, parse_jaas, read_properties


class KafkaConfigError(UserError):
    """A client property or bootstrap address that is unknown, malformed or points at a missing file."""


class KafkaUnavailableError(UserError):
    """Kafka cannot be reached with these settings; the message says what was found at the address."""


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
# librdkafka's own names, read as librdkafka reads them; every other name is a Java client's, whose value Java trims
# (ConfigDef.parseType: `String.trim()`), so a blank left after a value (copy and paste) is no part of it.
_LIBRDKAFKA_ONLY = frozenset(
    {"sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location",
     "ssl.key.location"})
_FILE_PROPERTIES = frozenset(
    {"ssl.ca.location", "ssl.truststore.location", "ssl.certificate.location", "ssl.keystore.location", "ssl.key.location"}
)
# Consumer tuning a client properties file may carry beside TLS/SASL: Kafka name -> (kafka-python, librdkafka, type).
# The bridge applies it; every other command passes over it, so one file (one Secret) serves them all.
CONSUMER_PROPERTIES: dict[str, tuple[str, str, type]] = {
    "session.timeout.ms": ("session_timeout_ms", "session.timeout.ms", int),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", "heartbeat.interval.ms", int),
    "max.poll.interval.ms": ("max_poll_interval_ms", "max.poll.interval.ms", int),
    "auto.offset.reset": ("auto_offset_reset", "auto.offset.reset", str),
    "fetch.min.bytes": ("fetch_min_bytes", "fetch.min.bytes", int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", "fetch.wait.max.ms", int),
    "fetch.max.bytes": ("fetch_max_bytes", "fetch.max.bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", "max.partition.fetch.bytes", int),
    "partition.assignment.strategy": ("", "partition.assignment.strategy", str),
    "queued.max.messages.kbytes": ("", "queued.max.messages.kbytes", int),
    "fetch.queue.backoff.ms": ("", "fetch.queue.backoff.ms", int),
}
# Java clients name the store format; kcm reads PEM files only, so the type is accepted when it says PEM.
_STORE_TYPES = frozenset({"ssl.truststore.type", "ssl.keystore.type"})
_PEM_CONVERSION = ("kcm reads PEM files only: convert a JKS or PKCS12 store with "
                   "`keytool -exportcert -rfc` or `openssl pkcs12 -nodes` (see docs/kafka-clients.md)")
_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Kafka's own login module for each mechanism kcm takes (the Java path writes JAAS lines with them).
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
_JAVA_INT_MAX = 2**31 - 1
_ADDRESS = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^:\[\]\s]+)):(?P<port>\d{1,5})")
_API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 0x6B636D, 3) + b"kcm"  # ApiVersions v0, correlation id "kcm"
# Neither client can send a lone surrogate (kafka-python raises, librdkafka aborts the process): Python reads a byte
# that is not UTF-8 in argv or the environment as one, and so it reads half of an escaped surrogate pair.
LONE_SURROGATE = "a byte that is not UTF-8 in a variable or on the command line, or a lone \\uD800-\\uDFFF escape"
_UNPAIRED = "a \\uD800-\\uDFFF escape that is not half of a surrogate pair"


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8, i.e. holds no lone surrogate."""
    return _encodes(text, "utf-8")


def _encodes(text: str, codec: str) -> bool:
    try:
        text.encode(codec)
    except UnicodeError:
        return False
    return True


def utf8_text(text: str) -> str | None:
    """`text` with its surrogate pairs joined (Java and JSON read the escapes \\uD83D\\uDE00 as one character), or
    None when a lone surrogate is left."""
    if is_utf8(text):
        return text
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        return None


def parse_properties(text: str) -> dict[str, str]:
    """Parse a Java properties file as `java.util.Properties` does (comments, continuations, escapes; see
    java_config.read_properties), refusing a line without a separator or a key: a mistyped line may be a password."""
    try:
        entries = read_properties(text)
    except JavaConfigError as exc:
        raise KafkaConfigError(f"cannot read the property on {exc}") from None
    properties: dict[str, str] = {}
    for entry in entries:
        if not entry.key or not entry.separated:
            # The line is not quoted: a mistyped one may well be a password.
            raise KafkaConfigError(f"cannot read the property on line {entry.line}: expected key=value")
        key, value = utf8_text(entry.key), utf8_text(entry.value)
        if key is None:
            raise KafkaConfigError(f"the property name on line {entry.line} is not UTF-8 text ({_UNPAIRED})")
        if value is None:
            raise KafkaConfigError(f"the value of property {key} on line {entry.line} is not UTF-8 text ({_UNPAIRED})")
        properties[key] = value
    return properties


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a client properties file (the `--command-config` of every kcm command)."""
    try:
        return parse_properties(read_settings(path, encoding="utf-8-sig"))   # a Windows editor's BOM: not a key
    except OSError as exc:
        raise KafkaConfigError(f"cannot read the client config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise KafkaConfigError(
            f"the client config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """`host:port[,host:port]` (IPv6 as `[addr]:port`) into (host, port) pairs; raises KafkaConfigError."""
    addresses = []
    for entry in (part.strip() for part in servers.split(",")):
        if not entry:
            continue
        match = _ADDRESS.fullmatch(entry)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise KafkaConfigError(
                f"bootstrap server {entry!r} is not HOST:PORT with a port from 1 to 65535 (e.g. kafka:9092)")
        if not is_utf8(entry):
            raise KafkaConfigError(f"bootstrap server {entry!r} is not UTF-8 text ({LONE_SURROGATE})")
        # Python encodes a host name as IDNA before looking it up, and raises for one it cannot.
        if match["host"] and not _encodes(match["host"], "idna"):
            raise KafkaConfigError(f"bootstrap server {entry!r} has no host name the resolver can be asked for "
                                   "(each dot-separated part 1 to 63 characters)")
        addresses.append((match["ipv6"] or match["host"], int(match["port"])))
    if not addresses:
        raise KafkaConfigError("no bootstrap server given: pass --bootstrap-server HOST:PORT")
    return addresses




def shown(value: str, quoted: bool = True) -> str:
    """A property value for an error message; one holding "=", ":" (both separate a key from its value) or
    whitespace, or longer than a path, is not shown: two lines run together (a lost newline) would put the next
    property, a password perhaps, in logs and pod events."""
    if len(value) <= 256 and not any(c in "=:" or c.isspace() for c in value):
        return repr(value) if quoted else value
    return (f"a value of {len(value)} characters (not shown: it holds '=', ':' or a space, or is too long; are two "
            "lines run together?)")


def _check_pem_file(key: str, path: str) -> None:
    try:
        with open(path, "rb") as file:
            start = file.read(64 * 1024)
    except OSError:
        raise KafkaConfigError(f"client property {key} names {shown(path)}, which is not a readable file") from None
    if b"-----BEGIN " not in start:
        raise KafkaConfigError(f"client property {key} names {shown(path)}, which is not a PEM file; "
                               f"{_PEM_CONVERSION}")


_PROPERTY_NAME = re.compile(r"[a-z][a-z0-9-]*(\.[a-z0-9-]+)+")  # how every Kafka client property is spelt
_DOTLESS_PROPERTIES = frozenset({"acks", "retries"})   # the Java clients' properties with no dot in their names


def kafka_python_options(properties: Mapping[str, str]) -> dict[str, Any]:
    """Translate client properties into kafka-python keyword arguments, rejecting what it cannot honour."""
    options: dict[str, Any] = {}
    for key, value in properties.items():
        if not is_utf8(key):
            raise KafkaConfigError(f"the name of a client property is not UTF-8 text ({LONE_SURROGATE})")
        if not is_utf8(value):
            raise KafkaConfigError(f"the value of client property {key} is not UTF-8 text ({LONE_SURROGATE})")
        if key in CONSUMER_PROPERTIES:
            continue
        if key not in _LIBRDKAFKA_ONLY:
            value = value.strip(TRIM_CHARACTERS)
        if key in _STORE_TYPES:
            if value.strip().upper() != "PEM":
                given = f"{key}={value}" if shown(value) == repr(value) else f"{key} with {shown(value)}"
                raise KafkaConfigError(f"{given} is not supported; {_PEM_CONVERSION}")
            continue
        if key not in _PROPERTY_TO_KWARG:
            # A key that is no property name may be a password on a line missing its key: never shown.
            named = f"property {key!r}" if _PROPERTY_NAME.fullmatch(key) or key in _DOTLESS_PROPERTIES else (
                "property whose name is not a property name (not shown: is a line missing its key?)")
            raise KafkaConfigError(f"unsupported client {named}; supported: "
                                   f"{', '.join(sorted([*_PROPERTY_TO_KWARG, *_STORE_TYPES]))}; and for kcm bridge's "
                                   f"consumer: {', '.join(sorted(CONSUMER_PROPERTIES))}")
        if key in _FILE_PROPERTIES:
            _check_pem_file(key, value)
        options[_PROPERTY_TO_KWARG[key]] = value

    protocol = options.get("security_protocol", "PLAINTEXT").upper()
    if protocol not in _SECURITY_PROTOCOLS:
        raise KafkaConfigError(f"security.protocol must be one of {', '.join(_SECURITY_PROTOCOLS)}, not "
                               f"{shown(protocol)}")
    options["security_protocol"] = protocol
    if "sasl_mechanism" in options:
        options["sasl_mechanism"] = options["sasl_mechanism"].upper()
        if options["sasl_mechanism"] not in _SASL_MECHANISMS:
            raise KafkaConfigError(
                f"sasl.mechanism must be one of {', '.join(_SASL_MECHANISMS)}, not {shown(options['sasl_mechanism'])}"
            )
    # Java clients read the JAAS line only for SASL: a leftover one beside PLAINTEXT or SSL is ignored, as there.
    jaas_text = options.pop("sasl_jaas_config", None)
    jaas = _jaas_options(jaas_text if protocol.startswith("SASL") else None)
    if jaas is not None and ("sasl_plain_username" in options or "sasl_plain_password" in options):
        # Java clients would log in with the JAAS line and the others with these: one source of credentials.
        raise KafkaConfigError("give either sasl.jaas.config or sasl.username/sasl.password, not both")
    if jaas is not None:
        if not (jaas["username"] and jaas["password"]):
            raise KafkaConfigError("sasl.jaas.config gives an empty username or password")
        if jaas["module"] == "ScramLoginModule" and "sasl_mechanism" not in options:
            # kcm's default mechanism is PLAIN: a SCRAM user would be refused as if the password were wrong.
            raise KafkaConfigError("sasl.jaas.config names ScramLoginModule but sasl.mechanism is not set (kcm's "
                                   "default is PLAIN): set sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512")
        options["sasl_plain_username"] = jaas["username"]
        options["sasl_plain_password"] = jaas["password"]
    if protocol.startswith("SASL") and not (options.get("sasl_plain_username") and options.get("sasl_plain_password")):
        raise KafkaConfigError(f"security.protocol {protocol} needs sasl.username and sasl.password (or sasl.jaas.config)")
    if "ssl_check_hostname" in options:
        # `https` checks the broker's host name; empty (Java) or `none` (librdkafka) does not. Anything else fails
        # the handshake in Java and the configuration in librdkafka: refused, never read as "no check".
        algorithm = options["ssl_check_hostname"].lower()
        if algorithm not in ("https", "", "none"):
            raise KafkaConfigError(f"ssl.endpoint.identification.algorithm must be https (check the broker's host "
                                   f"name) or empty or none (do not), not {shown(options['ssl_check_hostname'])}")
        options["ssl_check_hostname"] = algorithm == "https"
    if "request_timeout_ms" in options:
        # As Java's Integer.parseInt reads it: digits of any script, perhaps signed (Python's int() would take `1_000`).
        text = options["request_timeout_ms"]
        value = parse_int(text)
        if value is None and not _WHOLE_NUMBER.fullmatch(text):
            raise KafkaConfigError("request.timeout.ms must be a whole number of milliseconds")
        if value is None or value <= 0:   # beyond a Java int, or not positive
            raise KafkaConfigError(f"request.timeout.ms must be a positive number of milliseconds up to {_JAVA_INT_MAX} "
                                   f"(a Java int), not {shown(text, quoted=False) if value is None else value}")
        options["request_timeout_ms"] = value
    return options


def _jaas_options(text: str | None) -> dict[str, str] | None:
    """The login module's class name (`module`), username and password of a `sasl.jaas.config` (PLAIN or SCRAM login
    module), read as Java clients read it; None without one. The message names what is wrong, never a value."""
    if text is None:
        return None
    try:
        entries = parse_jaas(text)
    except JavaConfigError as exc:
        raise KafkaConfigError(f"sasl.jaas.config cannot be read as Kafka reads it: {exc} (e.g. "
                               'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" '
                               'password="...";)') from None
    if len(entries) != 1:
        raise KafkaConfigError(f"sasl.jaas.config names {len(entries)} login modules; a client takes exactly one")
    # By class name, wherever a build shades Kafka's package (Databricks: kafkashaded.org.apache.kafka…).
    module = entries[0].login_module.rpartition(".")[2]
    if module not in ("PlainLoginModule", "ScramLoginModule"):
        raise KafkaConfigError(f"sasl.jaas.config names the login module {shown(entries[0].login_module)}; kcm logs in "
                               f"with username and password: {' or '.join(sorted(set(LOGIN_MODULES.values())))}")
    missing = [name for name in ("username", "password") if name not in entries[0].options]
    if missing:
        raise KafkaConfigError(f"sasl.jaas.config has no {' and no '.join(missing)} option; kcm logs in with "
                               "username and password (PLAIN or SCRAM)")
    return {"module": module, **{name: entries[0].options[name] for name in ("username", "password")}}


@dataclass(frozen=True)
class KafkaSettings:
    """Where a kcm component finds Kafka and how it authenticates; `repr` never shows secrets."""

    bootstrap_servers: str
    properties: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_cli(cls, bootstrap_servers: str, command_config: str | Path | None = None) -> KafkaSettings:
        properties = load_properties(command_config) if command_config else {}
        settings = cls(bootstrap_servers, properties)
        settings.validate()  # once, at start-up
        return settings

    def validate(self) -> None:
        """Raise KafkaConfigError unless the properties translate and the TLS files they name load together."""
        self.client_options()
        if self.security_protocol.endswith("SSL"):
            _ssl_context(self)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for any kafka-python client (consumer, producer, admin)."""
        parse_bootstrap(self.bootstrap_servers)
        options = kafka_python_options(self.properties)
        options["bootstrap_servers"] = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        return options

    @property
    def security_protocol(self) -> str:
        return self.properties.get("security.protocol", "PLAINTEXT").strip(TRIM_CHARACTERS).upper()

    def fingerprint(self) -> str:
        """A digest telling distinct settings apart, to key caches by: it shows nothing of a password."""
        content = json.dumps([self.bootstrap_servers, sorted(self.properties.items())])
        return hashlib.sha256(content.encode()).hexdigest()

    def describe(self) -> str:
        """A log-safe one-line description (no secrets)."""
        return f"{self.bootstrap_servers} ({self.security_protocol})"


_PROBES_AT_ONCE = 8  # bootstrap servers probed side by side
_PROBLEMS_SHOWN = 5  # servers named in the error; the rest are counted


def check_reachable(settings: KafkaSettings, timeout_s: float = 10.0, stop: threading.Event | None = None) -> None:
    """Fail fast, with a diagnosis, unless some bootstrap server speaks Kafka with these settings' transport.

    kafka-python only says "Unable to bootstrap" (and can hang on a TLS handshake with a plaintext listener),
    so probe first: TCP, then TLS where configured, then an ApiVersions round trip where the transport is plain.
    The distinct servers are probed side by side (on daemon threads, which never hold up the process's exit), and
    `timeout_s` bounds the whole check: a list of servers that never answer costs no more than one. `stop` set
    (a process shutting down) ends the wait within a tenth of a second, with a KafkaUnavailableError saying so.
    """
    addresses = list(dict.fromkeys(parse_bootstrap(settings.bootstrap_servers)))
    deadline = time.monotonic() + timeout_s
    todo: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
    for address in addresses:
        todo.put(address)
    answers: queue.SimpleQueue[tuple[tuple[str, int], str | None, Exception | None]] = queue.SimpleQueue()

    def prober() -> None:
        while True:
            try:
                address = todo.get_nowait()
            except queue.Empty:
                return
            try:
                answers.put((address, _probe(settings, *address, deadline), None))
            except Exception as exc:  # a TLS setting that does not load: the caller's error to raise
                answers.put((address, None, exc))

    for _ in range(min(_PROBES_AT_ONCE, len(addresses))):
        threading.Thread(target=prober, name="kcm-kafka-probe", daemon=True).start()
    problems = dict.fromkeys(addresses, f"did not answer within {timeout_s:g}s")
    for _ in addresses:
        try:
            address, problem, error = _next_answer(answers, deadline + 0.5, stop)
        except queue.Empty:
            break
        if error is not None:
            raise error
        if problem is None:
            return
        problems[address] = problem
    listed = [f"{host}:{port} {problem}" for (host, port), problem in problems.items()]
    more = f"; and {len(listed) - _PROBLEMS_SHOWN} more servers" if len(listed) > _PROBLEMS_SHOWN else ""
    raise KafkaUnavailableError(f"cannot reach Kafka: {'; '.join(listed[:_PROBLEMS_SHOWN])}{more}")


STOPPED_CHECKING = "stopped while checking Kafka: the process is shutting down"


def _next_answer(answers: queue.SimpleQueue[Any], until: float, stop: threading.Event | None) -> Any:
    """The next answer by `until` (queue.Empty after it), watching `stop` meanwhile."""
    while True:
        if stop is not None and stop.is_set():
            raise KafkaUnavailableError(STOPPED_CHECKING)
        left = max(0.0, until - time.monotonic())
        try:
            return answers.get(timeout=left if stop is None else min(left, 0.1))
        except queue.Empty:
            if time.monotonic() >= until:
                raise


def diagnose_failure(settings: KafkaSettings, error: Exception,
                     advertised: Iterable[str] = ()) -> KafkaUnavailableError | KafkaConfigError:
    """A user-facing error for a client that could not bootstrap although the address answered the probe; a
    KafkaConfigError when kafka-python refused its own settings (it checks some only once it has bootstrapped).
    `advertised`: the broker addresses Kafka's metadata named, when the client got that far; when none of them (all
    other than the bootstrap servers) accepts a connection, that is what the message says."""
    if isinstance(error, KafkaConfigurationError):
        reason = error.args[0] if error.args else error
        return KafkaConfigError(f"the Kafka client rejected its settings: {reason}; check --command-config")
    name, detail = type(error).__name__, str(error).strip()
    detail = detail.removeprefix(f"{name}:").strip()   # kafka-python's errors start their text with their name
    what = name if detail in ("", name) else f"{name}: {detail}"
    hint = unreachable_advertised(settings.bootstrap_servers, advertised, ADVERTISED_PROBE_S) if advertised else None
    if hint:
        return KafkaUnavailableError(f"Kafka at {settings.bootstrap_servers} answers, but {hint} ({what})")
    protocol = settings.security_protocol
    hint = "check --bootstrap-server and --command-config"
    if protocol.startswith("SASL"):
        hint = (f"the address answers, but {protocol} did not get through: check that this listener uses SASL, "
                "sasl.mechanism and the credentials")
    elif protocol == "SSL":
        hint = "the TLS handshake worked, but Kafka did not answer over it: check the listener and ssl.* settings"
    return KafkaUnavailableError(f"cannot reach Kafka at {settings.bootstrap_servers} ({what}); {hint}")


# How long a failed client may spend connecting to the brokers Kafka's metadata names, to tell whether they are out of
# reach from here (advertised.listeners set for another network) before saying so.
ADVERTISED_PROBE_S = 2.0


def unreachable_advertised(bootstrap_servers: str, advertised: Iterable[str], timeout_s: float) -> str | None:
    """What to say when a client that bootstrapped failed and Kafka's metadata names only brokers other than the
    bootstrap servers (`advertised`, as host:port), none of which (the first _PROBES_AT_ONCE, tried side by side)
    accepts a TCP connection within `timeout_s`: the classic set-up mistake, brokers advertising in-cluster names or
    pod addresses that cannot be reached from where kcm runs. None when one does, or when they include the bootstrap
    servers. A broker that stays silent the whole time counts as out of reach."""
    bootstrap = {f"{host}:{port}" for host, port in parse_bootstrap(bootstrap_servers)}
    elsewhere = sorted(set(advertised) - bootstrap)
    if not elsewhere or bootstrap & set(advertised):
        return None
    hint = (f"its brokers advertise {', '.join(elsewhere)}, which this client could not reach: run kcm where those "
            "addresses resolve and connect, or bootstrap from a listener whose advertised.listeners are reachable")
    addresses = elsewhere[:_PROBES_AT_ONCE]

    def connects(address: str) -> bool:
        try:
            [(host, port)] = parse_bootstrap(address)
            socket.create_connection((host, port), timeout=max(0.001, timeout_s)).close()
            return True
        except (OSError, KafkaConfigError, ValueError):   # unresolvable, refused, silent or not an address at all
            return False

    with ThreadPoolExecutor(max_workers=len(addresses), thread_name_prefix="kcm-advertised-probe") as pool:
        return None if any(pool.map(connects, addresses)) else hint


def close_producer(producer: Any, timeout_s: float) -> str | None:
    """Close a kafka-python KafkaProducer within about `timeout_s`; returns why records still queued were dropped, or
    None when everything was written.

    kafka-python's close() flushes first and raises when that times out (a broker gone with records queued) before it
    stops its sender thread, which would go on trying the brokers for as long as the process lives (and its __del__
    raises again): the sender is then force-closed, failing what is queued, and the producer closed for good."""
    from kafka.errors import KafkaError

    try:
        producer.close(timeout=timeout_s)
        return None
    except KafkaError as exc:
        dropped = str(exc)
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
        sender.join(timeout_s)
    try:
        producer.close(timeout=0)   # nothing queued once the sender has failed it: closed for good
    except KafkaError:
        pass
    return dropped


def advertised_brokers(consumer: Any) -> list[str]:
    """The broker addresses a kafka-python client's metadata names (none before it bootstrapped)."""
    try:
        return [f"{broker.host}:{broker.port}" for broker in consumer._client.cluster.brokers()]
    except Exception:  # kafka-python internals: a hint is not worth a crash
        return []


def rejected_message(settings: KafkaSettings, reason: str) -> str:
    """What to say when Kafka refuses this client's authentication: who was refused and where to look."""
    if settings.security_protocol.startswith("SASL"):
        user = kafka_python_options(settings.properties).get("sasl_plain_username")
        return (f"Kafka rejected the SASL credentials for user {shown(user or '', quoted=False)} ({reason}): check "
                "sasl.mechanism, sasl.username and sasl.password in --command-config, and that the user exists on "
                "the cluster")
    return f"Kafka rejected this client's authentication ({reason}): check the ssl.* settings in --command-config"


def denied_message(settings: KafkaSettings, grant: str, reason: str) -> str:
    """What to say when Kafka's ACLs refuse this client: who was refused, and the ACL to `grant` ("READ on topic t")."""
    who = (f"user {shown(kafka_python_options(settings.properties).get('sasl_plain_username') or '', quoted=False)}"
           if settings.security_protocol.startswith("SASL") else "this client's principal")
    return (f"Kafka at {settings.bootstrap_servers} refuses {who} ({reason}): grant it {grant} (on Strimzi, in the "
            "KafkaUser's authorization.acls)")


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: a trusted certificate for other names.
_X509_HOST_MISMATCH, _X509_IP_MISMATCH = 62, 64


def _probe(settings: KafkaSettings, host: str, port: int, deadline: float) -> str | None:
    """Why `host:port` is not a Kafka listener for these settings, or None; every step ends by `deadline`."""
    timeout_s = deadline - time.monotonic()
    if timeout_s <= 0:
        return "was not probed: the time for reaching Kafka was spent on the other servers"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror:
        return "is not a host name this machine can resolve"
    except TimeoutError:
        return f"did not accept a TCP connection within {timeout_s:.3g}s"
    except OSError as exc:
        return f"refuses connections ({exc.strerror or exc}): is Kafka listening there?"
    with sock:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        protocol = settings.security_protocol
        if protocol in ("SSL", "SASL_SSL"):
            context = _ssl_context(settings)
            try:
                with context.wrap_socket(sock, server_hostname=host):
                    return None
            except ssl.SSLCertVerificationError as exc:
                if exc.verify_code in (_X509_HOST_MISMATCH, _X509_IP_MISMATCH):   # a trusted certificate, other names
                    return (f"presented a certificate issued for other host names ({exc.verify_message}): connect "
                            "by a host name the certificate lists, or turn host-name checking off "
                            "(ssl.endpoint.identification.algorithm empty)")
                return f"presented a certificate this client does not trust ({exc.verify_message}): check ssl.ca.location"
            except (ssl.SSLError, OSError) as exc:
                return (f"accepts TCP connections but no TLS handshake completed ({exc}): "
                        f"is this a TLS listener? security.protocol is {protocol}")
        try:
            sock.sendall(struct.pack(">i", len(_API_VERSIONS_V0)) + _API_VERSIONS_V0)
            header = _read_exactly(sock, 8)
        except OSError as exc:
            header = None
            failure = str(exc)
        else:
            failure = "it closed the connection"
        if header is None or struct.unpack(">ii", header)[1] != 0x6B636D:
            return (f"accepts TCP connections but does not answer as a Kafka broker ({failure}): "
                    "is this a Kafka broker? (a TLS listener needs security.protocol=SSL)")
    return None


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    """The TLS context the settings describe; a CA, certificate or key that does not load is a config error."""
    options = kafka_python_options(settings.properties)
    try:
        context = ssl.create_default_context(cafile=options.get("ssl_cafile"))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise KafkaConfigError(f"ssl.ca.location {options.get('ssl_cafile')!r} holds no usable CA certificate "
                               f"({getattr(exc, 'reason', None) or exc}): it must be PEM certificates") from None
    context.check_hostname = options.get("ssl_check_hostname", True)
    if "ssl_certfile" in options:
        password = options.get("ssl_password")
        try:
            # Given no pass phrase for an encrypted key, OpenSSL would ask for one on the terminal and wait: an empty
            # one fails instead.
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"),
                                    password if password is not None else b"")
        except (ssl.SSLError, OSError, ValueError) as exc:
            key = options.get("ssl_keyfile") or options["ssl_certfile"]
            if password is None and _encrypted_key(key):
                raise KafkaConfigError(f"the key {key!r} is encrypted and no pass phrase was given: set "
                                       "ssl.key.password, or store the key unencrypted") from None
            # The message is OpenSSL's (e.g. "bad decrypt"), never the password.
            raise KafkaConfigError(
                f"the client certificate {options['ssl_certfile']!r} and key {options.get('ssl_keyfile')!r} do not "
                f"load ({getattr(exc, 'reason', None) or exc}): check they are PEM, belong together, and "
                "ssl.key.password") from None
    return context


def _encrypted_key(path: str) -> bool:
    """Whether the PEM file holds an encrypted private key (PKCS#8 or OpenSSL's traditional form)."""
    try:
        with open(path, "rb") as file:
            text = file.read(1 << 20)
    except OSError:
        return False
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in text or b"Proc-Type: 4,ENCRYPTED" in text


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


def step_past_unreadable(consumer: Any, timeout_s: float) -> tuple[Any, int] | None:
    """After a kafka-python consumer's poll raised CorruptRecordError (a header name that is not UTF-8, a failed CRC),
    which it would raise again on every poll: seek past that record and return its (TopicPartition, offset).

    The error does not name the partition: kafka-python's fetcher still holds that partition's records, stopped at
    the record (a private attribute, the only place that knows), unless one partition is assigned. None when the
    partition cannot be told or is no longer assigned: the caller cannot step past the record."""
    from kafka.errors import KafkaError

    assigned = consumer.assignment()
    if len(assigned) == 1:
        partition = next(iter(assigned))
    else:
        pending = getattr(getattr(consumer, "_fetcher", None), "_next_partition_records", None)
        partition = getattr(pending, "topic_partition", None)
        if partition not in assigned:
            return None
    try:
        offset = consumer.position(partition, timeout_ms=int(timeout_s * 1000))
        consumer.seek(partition, offset + 1)
    except (KafkaError, ValueError, TypeError, AssertionError):   # revoked meanwhile, or no position: read again
        return None
    return partition, offset
