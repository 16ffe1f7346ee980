"""Model-based test of how every kcm command takes Kafka connection settings, written from docs/kafka-clients.md
(and docs/operator.md's KafkaConnection, which feeds the same translation).

Seeded random `--command-config` files hold every documented property in each of its spellings, written with Java
properties syntax (`#`/`!` comments, `=`/`:`/blank separators, leading blanks, `\\\\ \\t \\n \\uXXXX` escapes and
surrogate pairs, escaped characters standing for themselves, continuation lines, LF/CRLF/CR line ends, a byte order
mark, repeated keys where the last wins), JAAS lines in every documented form (quoted with either quote, escapes,
plain words, comments, any control flag), blanks after values (trimmed for Java names, kept for librdkafka ones) and
the bridge's consumer tuning (passed over); a JAAS line beside a non-SASL protocol (ignored) is a directed case. The
reference model is the entries each file was written from. `KafkaSettings.from_cli` reads the file; the kafka-python
arguments and the librdkafka configuration derived from it are compared field by field with the model, and each
client must accept what it is given (librdkafka loads the TLS files). Broken files (each documented refusal) must raise
one line naming the property or file, and make `kcm tail` exit with code 2. Every password in a case carries the marker
SECRET, which no message, repr or log line may ever hold.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import stat
import string
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kcm_cli.main import main as kcm_main
from kcm_common.kafka import KafkaConfigError, KafkaSettings
from kcm_common.librdkafka import librdkafka_config

SEEDS = range(80)
MARK = "SECRET"   # in every secret value of every case; never in any message, repr or log line
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")   # docs/kafka-clients.md: security.protocol
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")          # sasl.mechanism (or sasl.mechanisms)
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
CONTROL_FLAGS = ("required", "REQUIRED", "requisite", "sufficient", "Optional")
# "the librdkafka-only names ... are taken as librdkafka takes them, untrimmed"; Java trims every other value.
LIBRDKAFKA_ONLY = frozenset({"sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location",
                             "ssl.certificate.location", "ssl.key.location"})
BLANKS = ("", "", " ", "\t", " \t ")
# docs/bridge.md: the consumer tuning the same file may carry; every other command passes over it.
TUNING = {"session.timeout.ms": "45000", "heartbeat.interval.ms": "3000", "max.poll.interval.ms": "300000",
          "auto.offset.reset": "earliest", "fetch.min.bytes": "1", "fetch.max.wait.ms": "500",
          "fetch.max.bytes": "52428800", "max.partition.fetch.bytes": "1048576",
          "partition.assignment.strategy": "range", "queued.max.messages.kbytes": "16384",
          "fetch.queue.backoff.ms": "20"}
HOSTS = ("kafka", "kafka-0.kafka-brokers.kafka.svc", "127.0.0.1", "[::1]", "[fe80::1]", "b\u00fccher.example",
         "my-cluster-kafka-bootstrap.kafka.svc.cluster.local")
PASS_PHRASE = "k\u00e9y SECRET=pass\\phrase"   # the encrypted client key's, with characters the file escapes
NOT_A_CERTIFICATE = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"

Entry = tuple[str | None, str]   # (key, value as Java reads it); key None: `value` is a raw line


@dataclass(frozen=True)
class Pem:
    ca: str
    cert: str
    key: str
    encrypted_key: str
    other_key: str
    garbage_ca: str
    der: str
    jks: str
    directory: Path


@pytest.fixture(scope="module")
def pem(tmp_path_factory) -> Pem:
    """A CA, a client certificate it signed with its key (plain and encrypted), another key and files that are not
    PEM, in a directory whose name holds a blank and a non-ASCII letter (paths are property values too)."""
    directory = tmp_path_factory.mktemp("pem") / "tls d\u00eer"
    directory.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60,
                       env={**os.environ, "KCM_TEST_PASS": PASS_PHRASE})

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=kcm-test-ca", "-days", "2")
    openssl("req", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=kcm-client")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", "2",
            "-out", "client.pem", "-days", "2")
    openssl("pkcs8", "-topk8", "-in", "client.key", "-out", "client-enc.key", "-passout", "env:KCM_TEST_PASS",
            "-v2", "aes-256-cbc")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "other.key")
    openssl("x509", "-in", "ca.pem", "-outform", "der", "-out", "ca.der")
    (directory / "garbage.pem").write_text(NOT_A_CERTIFICATE)
    (directory / "truststore.jks").write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02")
    path = lambda name: str(directory / name)  # noqa: E731
    return Pem(path("ca.pem"), path("client.pem"), path("client.key"), path("client-enc.key"), path("other.key"),
               path("garbage.pem"), path("ca.der"), path("truststore.jks"), directory)


# --- writing a properties file as java.util.Properties reads it -----------------------------------------------


def encode_char(rng: random.Random, char: str, first: bool, key: bool) -> str:
    """One character of a key or value in properties syntax, escaped in one of the ways Java reads back."""
    if char == "\\":
        return "\\\\"
    if char in "\t\n\r\f":
        if char == "\t" and not first and not key and rng.random() < 0.5:
            return char
        return "\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[char]
    if 0xD800 <= ord(char) <= 0xDFFF:   # half of a pair: only an escape can say it
        return f"\\u{ord(char):04X}"
    if ord(char) > 0xFFFF and rng.random() < 0.5:   # a surrogate pair of escapes is one character
        units = char.encode("utf-16-be")
        return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in (0, 2))
    if char in " =:" and (key or first) or char in "#!" and key:
        return "\\" + char
    roll = rng.random()
    if roll < 0.08:
        return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else char
    if roll < 0.12 and char not in "tnrfu" and ord(char) < 0x80:   # any other escaped character stands for itself
        return "\\" + char
    return char


def eol(rng: random.Random) -> str:
    return rng.choice(("\n", "\n", "\r\n", "\r"))


def encode_value(rng: random.Random, value: str) -> str:
    """A value, sometimes continued over lines: a trailing `\\` joins the next line, whose leading blanks go."""
    tokens = [encode_char(rng, char, index == 0, False) for index, char in enumerate(value)]
    out = []
    for index, token in enumerate(tokens):
        if index and token[0] not in " \t\f" and rng.random() < 0.04:
            out.append("\\" + eol(rng) + rng.choice(("", " ", "\t ", "    ")))
        out.append(token)
    return "".join(out)


def properties_file(rng: random.Random, entries: list[Entry]) -> str:
    """`entries` as the text of a client properties file, with comments, blank lines and random layout."""
    lines = []
    if rng.random() < 0.2:
        lines.append("\ufeff# client settings")   # a Windows editor's byte order mark
    for key, value in entries:
        for _ in range(rng.choice((0, 0, 1, 2))):
            lines.append(rng.choice((
                "", "   ", f"{rng.choice((' ', chr(9)))}# old password: {MARK}-in-a-comment",
                f"! sasl.password=old-{MARK}-{rng.randrange(99)}", "#", "# a comment ending in a backslash \\",
                f"  ! ssl.key.password={MARK}:x")))
        if key is None:
            lines.append(value)
            continue
        escaped_key = "".join(encode_char(rng, char, False, True) for char in key)
        separator = rng.choice(("=", "=", ":", " = ", "\t:\t", " ", "  ", " :"))
        lead = rng.choice(("", "", " ", "\t", "\f "))
        lines.append(f"{lead}{escaped_key}{separator}{encode_value(rng, value)}")
    text = "".join(line + eol(rng) for line in lines)
    if text and rng.random() < 0.2:
        text = text.rstrip("\r\n")   # no line end after the last line
    return text


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


# --- random values ----------------------------------------------------------------------------------------------


def new_secret(rng: random.Random) -> str:
    specials = " =:#!\\\"';@%\u00e9\u20ac\U0001F600\t"
    piece = lambda: "".join(rng.choice(string.ascii_letters + string.digits + specials)  # noqa: E731
                            for _ in range(rng.randrange(0, 6)))
    surely = rng.choice(("\U0001F600", "\\", '"', "'", " ", "=", "\u00e9", "#"))   # one beyond letters and digits
    return rng.choice(string.ascii_letters) + piece() + surely + MARK + piece() + rng.choice(string.ascii_letters)


def new_user(rng: random.Random) -> str:
    return rng.choice(("alice", "kcm_operator", "svc-kcm@corp.example", "J\u00fcrgen \u00d6", "bob:team=a",
                       "u$er", "O'Brien \"ob\""))


def jaas_value(rng: random.Random, value: str) -> str:
    """A JAAS option value: a plain word where it is one, else quoted (either quote) with backslash escapes."""
    if value.isascii() and value.replace("_", "a").replace("$", "a").isalnum() and not value[0].isdigit() \
            and rng.random() < 0.6:
        return value
    quote = rng.choice("\"'")
    return quote + value.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


def jaas_line(rng: random.Random, mechanism: str, user: str, password: str) -> str:
    """A `sasl.jaas.config` value with one login module for `mechanism`, as Kafka's JaasConfig reads it."""
    blank = lambda: rng.choice((" ", " ", "  ", "\t", "\n", " \n   "))  # noqa: E731
    options = [("username", user), ("password", password)]
    if rng.random() < 0.3:
        options.append(("serviceName", "kafka"))
    rng.shuffle(options)
    parts = [LOGIN_MODULES[mechanism], blank(), rng.choice(CONTROL_FLAGS)]
    if rng.random() < 0.15:
        parts += [blank(), "/* kcm */"]
    for name, value in options:
        parts += [blank(), name, rng.choice(("=", " = ", "=")), jaas_value(rng, value)]
    parts += [rng.choice(("", " ", "\n")), ";"]
    return "".join(parts)


def new_servers(rng: random.Random) -> tuple[str, list[str]]:
    """A `--bootstrap-server` value and the entries it lists."""
    entries = [f"{rng.choice(HOSTS)}:{rng.choice((1, 9092, 9093, 65535, rng.randint(1, 65535)))}"
               for _ in range(rng.randint(1, 3))]
    return "".join(rng.choice(("", " ")) + entry + rng.choice(("", " ")) + ("," if index < len(entries) - 1 else "")
                   for index, entry in enumerate(entries)), entries


# --- the reference model: a valid file and what each client must get ----------------------------------------------


@dataclass
class Valid:
    entries: list[Entry]
    python: dict[str, Any]      # kafka-python keyword arguments (bootstrap_servers aside)
    librdkafka: dict[str, Any]  # librdkafka properties (bootstrap.servers aside)


def valid_case(rng: random.Random, pem: Pem) -> Valid:
    protocol = rng.choice((*PROTOCOLS, "SASL_SSL", "SSL", None))
    effective = protocol or "PLAINTEXT"   # PLAINTEXT (default)
    case = Valid([], {"security_protocol": effective},
                 {"security.protocol": effective, "enable.metrics.push": False})   # docs/bridge.md: no telemetry

    def put(key: str, value: str, python: tuple[str, Any] | None = None, librdkafka: tuple[str, Any] | None = None
            ) -> None:
        case.entries.append((key, value if key in LIBRDKAFKA_ONLY else value + rng.choice(BLANKS)))
        if python:
            case.python[python[0]] = python[1]
        if librdkafka:
            case.librdkafka[librdkafka[0]] = librdkafka[1]

    if protocol:
        put("security.protocol", protocol)
    if effective.startswith("SASL"):
        mechanism = rng.choice(MECHANISMS)
        put(rng.choice(("sasl.mechanism", "sasl.mechanisms")), mechanism, ("sasl_mechanism", mechanism),
            ("sasl.mechanism", mechanism))
        user, password = new_user(rng), new_secret(rng) + rng.choice(BLANKS)
        if rng.random() < 0.5:
            put("sasl.username", user, ("sasl_plain_username", user), ("sasl.username", user))
            put("sasl.password", password, ("sasl_plain_password", password), ("sasl.password", password))
        else:
            put("sasl.jaas.config", jaas_line(rng, mechanism, user, password))
            case.python.update(sasl_plain_username=user, sasl_plain_password=password)
            case.librdkafka.update({"sasl.username": user, "sasl.password": password})
    if effective.endswith("SSL"):
        if rng.random() < 0.7:
            put(rng.choice(("ssl.ca.location", "ssl.truststore.location")), pem.ca, ("ssl_cafile", pem.ca),
                ("ssl.ca.location", pem.ca))
            if rng.random() < 0.4:
                put("ssl.truststore.type", "PEM")
        if rng.random() < 0.5:
            put(rng.choice(("ssl.certificate.location", "ssl.keystore.location")), pem.cert,
                ("ssl_certfile", pem.cert), ("ssl.certificate.location", pem.cert))
            key = rng.choice((pem.key, pem.encrypted_key, pem.encrypted_key))
            put("ssl.key.location", key, ("ssl_keyfile", key), ("ssl.key.location", key))
            if key == pem.encrypted_key:
                put("ssl.key.password", PASS_PHRASE, ("ssl_password", PASS_PHRASE),
                    ("ssl.key.password", PASS_PHRASE))
            if rng.random() < 0.4:
                put("ssl.keystore.type", "PEM")
        if rng.random() < 0.6:
            algorithm = rng.choice(("https", "", "none"))
            put("ssl.endpoint.identification.algorithm", algorithm, ("ssl_check_hostname", algorithm == "https"),
                ("ssl.endpoint.identification.algorithm", "https" if algorithm == "https" else "none"))
    if rng.random() < 0.5:
        client_id = rng.choice(("kcm-tail", "app 1", "\u00e9quipe", "a=b:c", "x\\y", "ends-in\\"))
        put("client.id", client_id, ("client_id", client_id), ("client.id", client_id))
    if rng.random() < 0.5:
        timeout = rng.choice((10, 201, 30000, 300000, rng.randint(10, 300000)))
        put("request.timeout.ms", str(timeout), ("request_timeout_ms", timeout), ("socket.timeout.ms", timeout))
    for name in rng.sample(sorted(TUNING), rng.randrange(0, 3)):
        put(name, TUNING[name])
    rng.shuffle(case.entries)
    for _ in range(rng.randrange(0, 3) if case.entries else 0):   # an earlier line for a key: the last one wins
        key, _ = rng.choice(case.entries)
        first = next(index for index, (name, _) in enumerate(case.entries) if name == key)
        case.entries.insert(first, (key, rng.choice((new_secret(rng), "bogus", "/no/such/file.pem"))))
    return case


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, not listening: connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert MARK not in text, text


def tail(path: Path | str, servers: str, capsys) -> tuple[int, str, str]:
    """`kcm tail` with these settings (at DEBUG): exit code, stdout, stderr."""
    capsys.readouterr()
    code = kcm_main(["tail", "--bootstrap-server", servers, "--command-config", str(path), "--connect-timeout", "2",
                     "--log-level", "DEBUG"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("seed", SEEDS)
def test_a_valid_file_gives_both_clients_what_the_docs_promise(seed, pem, tmp_path, closed_port, caplog, capsys):
    import confluent_kafka
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    rng = random.Random(seed)
    case = valid_case(rng, pem)
    servers, listed = new_servers(rng)
    path = write(tmp_path / "client.properties", properties_file(rng, case.entries))
    caplog.set_level(logging.DEBUG)

    settings = KafkaSettings.from_cli(servers, path)

    python = settings.client_options()
    assert python.pop("bootstrap_servers") == listed
    assert python == case.python, path.read_text()
    librdkafka = librdkafka_config(settings)
    assert [s.strip() for s in librdkafka.pop("bootstrap.servers").split(",")] == listed
    assert librdkafka == case.librdkafka, path.read_text()
    assert settings.security_protocol == case.python["security_protocol"]
    # Each client takes what it is given: kafka-python knows every argument, librdkafka loads the TLS files.
    for client in (KafkaConsumer, KafkaProducer, KafkaAdminClient):
        assert set(python) <= set(client.DEFAULT_CONFIG), client
    librdkafka_log = logging.getLogger("kcm.test.librdkafka")
    producer = confluent_kafka.Producer({**librdkafka, "bootstrap.servers": f"127.0.0.1:{closed_port}",
                                         "logger": librdkafka_log})
    producer.purge()
    producer.flush(0)
    del producer
    # Reaching Kafka fails (nothing listens): one line, exit code 2, and nowhere a secret.
    code, out, err = tail(path, f"127.0.0.1:{closed_port}", capsys)
    assert code == 2 and err.count("\n") == 1 and "refuses connections" in err, err
    assert_no_secret(repr(settings), settings.describe(), out, err, caplog.text,
                     *(str(record.args) for record in caplog.records))


# --- broken files: one line naming the property (or file), never a secret ------------------------------------------


def broken_case(kind: str, round_: int, rng: random.Random, pem: Pem, tmp_path: Path
                ) -> tuple[list[Entry], str, list[tuple]]:
    """Entries of a file the docs say is refused, with the --bootstrap-server value and the words the one-line error
    must hold (each tuple: one of its alternatives). Round n takes the n-th of each kind's variants."""
    pick = lambda options: options[round_ % len(options)]  # noqa: E731
    secret, user, mechanism = new_secret(rng), new_user(rng), rng.choice(MECHANISMS)
    sasl = rng.choice(("SASL_PLAINTEXT", "SASL_SSL"))
    mechanism_key = rng.choice(("sasl.mechanism", "sasl.mechanisms"))
    module = LOGIN_MODULES[mechanism]
    servers = new_servers(rng)[0]
    file_key = rng.choice(("ssl.ca.location", "ssl.truststore.location", "ssl.certificate.location",
                           "ssl.keystore.location", "ssl.key.location"))
    cert_key = rng.choice(("ssl.certificate.location", "ssl.keystore.location"))
    pair_needles = [("ssl.certificate.location", "ssl.keystore.location", "ssl.key.location", "ssl.key.password",
                     pem.cert)]
    if kind == "unknown property":
        name = pick(("bogus.setting", "sasl.pasword", "ssl.trustore.location", "enable.metrics.push",
                           "ssl.keystore.password", "sasl.login.class"))
        return [("security.protocol", "PLAINTEXT"), (name, secret)], servers, [(name,)]
    if kind == "protocol":
        value = pick(("TLS", "SASL", "PLAIN", "SSL_SASL", f"SASL_SSL sasl.password={secret}"))
        return [("security.protocol", value)], servers, [("security.protocol",)]
    if kind == "mechanism":
        value = pick(("GSSAPI", "OAUTHBEARER", "SCRAM-SHA-1", "AWS_MSK_IAM", f"PLAIN sasl.password={secret}"))
        return ([("security.protocol", sasl), (mechanism_key, value), ("sasl.username", user),
                 ("sasl.password", secret)], servers, [("sasl.mechanism",)])
    if kind == "no credentials":
        return [("security.protocol", sasl), (mechanism_key, mechanism)], servers, [("sasl.username",
                                                                                      "sasl.jaas.config")]
    if kind == "jaas and username":
        return ([("security.protocol", sasl), (mechanism_key, mechanism), ("sasl.username", user),
                 ("sasl.password", secret), ("sasl.jaas.config", jaas_line(rng, mechanism, user, secret))],
                servers, [("sasl.jaas.config",), ("sasl.username",)])
    if kind == "unreadable jaas":
        quoted = f'"{secret.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        line = pick((
            f'{module} required username="{user}" password={quoted}',                       # no semicolon
            f'{module} username="u" password={quoted};',                                    # no control flag
            f'{module} requird username="u" password={quoted};',                           # unknown flag
            f'{module} required username="u" password={quoted}; {module} required username="v" password="w";',
            f'{module} required username="u";',                                            # no password
            f'{module} required password={quoted};',                                       # no username
            f"{module} required username=u password=p{MARK}@word;",   # a value with other characters, unquoted
            f"{module} required username=u password=12345{MARK};",    # a number is no value
            f'{module} required username="u" password=;',
            "",
        ))
        return ([("security.protocol", sasl), (mechanism_key, mechanism), ("sasl.jaas.config", line)], servers,
                [("sasl.jaas.config",)])
    if kind == "host name check":
        value = pick(("http", "HTTPS2", "false", "no", "off", f"https ssl.key.password={secret}"))
        return ([("security.protocol", "SSL"), ("ssl.endpoint.identification.algorithm", value)], servers,
                [("ssl.endpoint.identification.algorithm",)])
    if kind == "request timeout":
        value = pick(("0", "-1", "soon", "1.5", "", "30s", "1e3", f"30000 sasl.password={secret}"))
        return [("request.timeout.ms", value)], servers, [("request.timeout.ms",)]
    if kind == "store type":
        name = pick(("ssl.truststore.type", "ssl.keystore.type"))
        value = pick(("JKS", "PKCS12", "BCFKS", "", f"JKS ssl.key.password={secret}"))
        return [("security.protocol", "SSL"), (name, value)], servers, [(name,)]
    if kind == "missing file":
        return ([("security.protocol", "SSL"), (file_key, str(tmp_path / "absent \u00fc.pem"))], servers,
                [(file_key,)])
    if kind == "not PEM":
        return [("security.protocol", "SSL"), (file_key, pick((pem.der, pem.jks)))], servers, [(file_key,)]
    if kind == "untrimmed librdkafka path":   # a blank after ssl.ca.location is part of the path, as in librdkafka
        return [("security.protocol", "SSL"), ("ssl.ca.location", pem.ca + " ")], servers, [("ssl.ca.location",)]
    if kind == "unusable CA":
        name = pick(("ssl.ca.location", "ssl.truststore.location"))
        return ([("security.protocol", rng.choice(("SSL", "SASL_SSL"))), (name, pem.garbage_ca),
                 ("sasl.username", user), ("sasl.password", secret)], servers,
                [("ssl.ca.location", "ssl.truststore.location")])
    if kind == "key of another certificate":
        return ([("security.protocol", "SSL"), (cert_key, pem.cert), ("ssl.key.location", pem.other_key),
                 ("ssl.key.password", secret)], servers, pair_needles)
    if kind == "wrong pass phrase":
        return ([("security.protocol", "SSL"), (cert_key, pem.cert), ("ssl.key.location", pem.encrypted_key),
                 ("ssl.key.password", secret)], servers, pair_needles)
    if kind == "encrypted key without pass phrase":
        return ([("security.protocol", "SSL"), (cert_key, pem.cert), ("ssl.key.location", pem.encrypted_key)],
                servers, [("ssl.key.password",)])
    if kind == "lone surrogate":
        name = pick(("sasl.password", "client.id", "ssl.key.password"))
        value = pick((secret + "\ud800", "\udfff" + secret, secret[:2] + "\ude00\ud83d" + secret[2:]))
        return ([("security.protocol", sasl), ("sasl.username", user), (name, value)], servers, [(name,)])
    if kind == "malformed escape":
        return ([("security.protocol", "SASL_SSL"), (None, f"sasl.password={secret}\\u12G4")], servers,
                [("sasl.password", "line")])
    if kind == "line without a key":
        return [("security.protocol", "SASL_SSL"), (None, f"={secret}")], servers, [("line",)]
    assert kind == "bootstrap server", kind
    bad = pick(("kafka", "kafka:0", "kafka:65536", "kafka..svc:9092", f"{'k' * 64}.svc:9092", "::1:9092",
                      "kafka:9092;kafka2:9092", "kafka:port"))
    return [("security.protocol", "PLAINTEXT")], f"{servers},{bad}", [("bootstrap",)]


BROKEN_KINDS = ("unknown property", "protocol", "mechanism", "no credentials", "jaas and username",
                "unreadable jaas", "host name check", "request timeout", "store type", "missing file", "not PEM",
                "untrimmed librdkafka path", "unusable CA", "key of another certificate", "wrong pass phrase",
                "encrypted key without pass phrase", "lone surrogate", "malformed escape", "line without a key",
                "bootstrap server")


@pytest.mark.parametrize("seed", range(10 * len(BROKEN_KINDS)))
def test_a_broken_file_is_refused_in_one_line_naming_what_is_wrong_and_no_secret(seed, pem, tmp_path, caplog,
                                                                                  capsys):
    kind = BROKEN_KINDS[seed % len(BROKEN_KINDS)]
    rng = random.Random(1000 + seed)
    entries, servers, needles = broken_case(kind, seed // len(BROKEN_KINDS), rng, pem, tmp_path)
    if rng.random() < 0.5:
        entries.append(("client.id", "kcm-test"))
    rng.shuffle(entries)
    path = write(tmp_path / "client.properties", properties_file(rng, entries))
    caplog.set_level(logging.DEBUG)

    with pytest.raises(KafkaConfigError) as refused:
        KafkaSettings.from_cli(servers, path)
    message = str(refused.value)
    assert "\n" not in message
    for alternatives in needles:
        assert any(word in message for word in alternatives), (kind, needles, message)
    code, out, err = tail(path, servers, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("kcm tail: "), err
    for alternatives in needles:
        assert any(word in err for word in alternatives), (kind, needles, err)
    assert_no_secret(message, repr(refused.value), out, err, caplog.text)


@pytest.mark.parametrize("problem", ["missing", "directory", "not UTF-8", "larger than 1 MiB"])
def test_a_config_file_that_cannot_be_read_is_named_in_one_line(problem, tmp_path, capsys):
    path = tmp_path / "cl\u00efent.properties"
    if problem == "directory":
        path.mkdir()
    elif problem == "not UTF-8":
        path.write_bytes(b"security.protocol=SASL_SSL\nsasl.password=p\xe4ss" + MARK.encode() + b"\n")
    elif problem == "larger than 1 MiB":
        path.write_bytes(b"# padding\n" * (1024 * 1024 // 10 + 1))

    with pytest.raises(KafkaConfigError) as refused:
        KafkaSettings.from_cli("kafka:9092", path)
    message = str(refused.value)
    assert str(path) in message and "\n" not in message and MARK not in message
    if problem == "not UTF-8":
        assert "UTF-8" in message
    code, out, err = tail(path, "kafka:9092", capsys)
    assert code == 2 and err.count("\n") == 1 and str(path) in err and MARK not in err


# --- documented behaviour the code does not follow ---------------------------------------------------------------


def test_a_key_alone_on_a_line_is_refused_where_java_would_read_an_empty_value(pem, tmp_path):
    # docs: the one exception to Java's reading: a line alone may be a password, and an empty host-name check
    # must be written out.
    path = write(tmp_path / "client.properties",
                 f"security.protocol=SSL\nssl.ca.location={pem.ca}\nssl.endpoint.identification.algorithm\n")
    with pytest.raises(KafkaConfigError, match="line 3: expected key=value"):
        KafkaSettings.from_cli("kafka:9093", path)


def test_an_unknown_property_without_a_dot_is_named():
    with pytest.raises(KafkaConfigError, match="acks"):
        KafkaSettings("kafka:9092", {"acks": "all"}).validate()


def test_a_request_timeout_that_is_no_number_to_java_is_refused():
    with pytest.raises(KafkaConfigError, match="request.timeout.ms"):
        KafkaSettings("kafka:9092", {"request.timeout.ms": "1_000"}).validate()


@pytest.mark.parametrize("text", ["\u0661\u0660\u0660\u0660", "+01000", "\uff11\uff10\uff10\uff10"])
def test_a_request_timeout_is_read_as_javas_integer_parse_int_reads_it(text):
    """Arabic-Indic or full-width digits are digits to Java (Character.digit): 1000 ms for every client."""
    from kcm_common.kafka import kafka_python_options
    from kcm_common.kafka_java import java_client_properties

    assert kafka_python_options({"request.timeout.ms": text})["request_timeout_ms"] == 1000
    properties = java_client_properties(KafkaSettings("kafka:9092", {"request.timeout.ms": text}))
    assert properties["request.timeout.ms"] == "1000"


@pytest.mark.parametrize("timeout", [5, 400000])
def test_any_positive_request_timeout_is_taken_by_librdkafka_too(timeout, closed_port):
    import confluent_kafka

    settings = KafkaSettings("kafka:9092", {"request.timeout.ms": str(timeout)})
    settings.validate()
    config = librdkafka_config(settings)
    # docs: librdkafka's clients take the nearest of its 10 to 300000.
    assert config["socket.timeout.ms"] == min(max(timeout, 10), 300000)
    confluent_kafka.Producer({**config, "bootstrap.servers": f"127.0.0.1:{closed_port}"})


def test_sasl_without_a_mechanism_is_plain_for_every_client():
    from kcm_common.kafka_java import java_client_properties

    settings = KafkaSettings("kafka:9092", {"security.protocol": "SASL_SSL", "sasl.username": "u",
                                            "sasl.password": f"p-{MARK}"})
    settings.validate()
    assert librdkafka_config(settings)["sasl.mechanism"] == "PLAIN"
    assert settings.client_options().get("sasl_mechanism", "PLAIN") == "PLAIN"   # kafka-python's default
    assert java_client_properties(settings)["sasl.mechanism"] == "PLAIN"


def test_a_jaas_line_with_another_login_module_is_refused():
    with pytest.raises(KafkaConfigError, match="sasl.jaas.config"):
        KafkaSettings("kafka:9092", {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": 'com.sun.security.auth.module.Krb5LoginModule required username="u" password="p";',
        }).validate()


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
@pytest.mark.parametrize("jaas", [f'{LOGIN_MODULES["PLAIN"]} required username="u" password="p-{MARK}";',
                                  f"not a JAAS line password={MARK}"])
def test_a_jaas_line_beside_a_protocol_without_sasl_is_ignored(protocol, jaas, kafka_lookalike, tmp_path, capsys):
    from kafka import KafkaConsumer

    path = write(tmp_path / "client.properties", f"security.protocol={protocol}\nsasl.jaas.config={jaas}\n")
    settings = KafkaSettings.from_cli("kafka:9092", path)
    assert settings.client_options() == {"security_protocol": protocol, "bootstrap_servers": ["kafka:9092"]}
    assert set(settings.client_options()) <= set(KafkaConsumer.DEFAULT_CONFIG)
    code, _, err = tail(path, kafka_lookalike, capsys)   # reaches the consumer; nothing real answers after
    assert code == 2 and "rejected its settings" not in err and MARK not in err, err


# --- kcm tail's request.timeout.ms range (201 to 539999) -----------------------------------------------------------


@pytest.fixture
def kafka_lookalike():
    """A loopback listener answering kcm's ApiVersions probe (the 8 bytes it reads: length, correlation id) and
    nothing else: `kcm tail` gets past its reachability check to create its consumer."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(2)
                try:
                    request = connection.recv(4096)
                    if request.endswith(b"kcm"):
                        connection.sendall((4).to_bytes(4, "big") + (0x6B636D).to_bytes(4, "big"))
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    server.close()


@pytest.mark.parametrize(("timeout", "taken"), [(1, False), (200, False), (201, True), (539999, True),
                                                  (540000, False), (10**7, False)])
def test_kcm_tail_takes_a_request_timeout_from_201_to_539999(timeout, taken, kafka_lookalike, tmp_path, capsys):
    path = write(tmp_path / "client.properties", f"request.timeout.ms={timeout}\n")

    code, _, err = tail(path, kafka_lookalike, capsys)

    assert code == 2 and err.count("\n") == 1, err   # nothing real answers: it ends either way, in one line
    refused_settings = f"request.timeout.ms {timeout} is outside what kcm tail takes, 201 to 539999" in err
    assert refused_settings is not taken, err


# --- the operator's KafkaConnection: the same translation from a spec and its Secrets --------------------------------


def connection_case(rng: random.Random, pem: Pem) -> tuple[dict, dict, dict, dict]:
    """A KafkaConnection spec, its Secrets' data, and the (kafka-python, librdkafka) fields the model expects, with
    TLS material given as its content (the operator writes it to files of its own)."""
    protocol = rng.choice(PROTOCOLS)
    servers, listed = new_servers(rng)
    spec: dict[str, Any] = {"bootstrapServers": servers, "securityProtocol": protocol}
    secrets: dict[tuple[str, str], bytes] = {}
    python: dict[str, Any] = {"security_protocol": protocol, "bootstrap_servers": listed}
    librdkafka: dict[str, Any] = {"security.protocol": protocol, "enable.metrics.push": False}
    if protocol.startswith("SASL"):
        mechanism, user, password = rng.choice(MECHANISMS), new_user(rng), new_secret(rng)
        ref: dict[str, str] = {"name": "creds"}
        keys = {"username": "username", "password": "password"}
        if rng.random() < 0.5:
            keys = {"username": "user", "password": "pass.word"}
            ref.update(usernameKey="user", passwordKey="pass.word")
        spec["sasl"] = {"mechanism": mechanism, "secretRef": ref}
        secrets["creds", keys["username"]] = user.encode()
        secrets["creds", keys["password"]] = password.encode()
        python.update(sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password)
        librdkafka.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
    if protocol.endswith("SSL") and rng.random() < 0.8:
        tls: dict[str, Any] = {}
        if rng.random() < 0.7:
            key = rng.choice((None, "ca.pem"))
            tls["caSecretRef"] = {"name": "ca", **({"key": key} if key else {})}
            secrets["ca", key or "ca.crt"] = Path(pem.ca).read_bytes()
            python["ssl_cafile"] = librdkafka["ssl.ca.location"] = Path(pem.ca).read_bytes()
        if rng.random() < 0.5:
            tls["clientCertSecretRef"] = {"name": "client-tls"}
            secrets["client-tls", "tls.crt"] = Path(pem.cert).read_bytes()
            secrets["client-tls", "tls.key"] = Path(pem.key).read_bytes()
            python["ssl_certfile"] = librdkafka["ssl.certificate.location"] = Path(pem.cert).read_bytes()
            python["ssl_keyfile"] = librdkafka["ssl.key.location"] = Path(pem.key).read_bytes()
        if rng.random() < 0.6:
            tls["verifyHostname"] = rng.random() < 0.5
        spec["tls"] = tls
    if protocol.endswith("SSL"):
        checked = spec.get("tls", {}).get("verifyHostname", True)
        python["ssl_check_hostname"] = checked
        librdkafka["ssl.endpoint.identification.algorithm"] = "https" if checked else "none"
    return spec, secrets, python, librdkafka


TLS_FILE_FIELDS = {"ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl.ca.location", "ssl.certificate.location",
                   "ssl.key.location"}


@pytest.mark.parametrize("seed", range(24))
def test_a_kafka_connection_gives_both_clients_what_its_spec_and_secrets_say(seed, pem, tmp_path, caplog):
    from kcm_operator.connections import settings_from_spec

    spec, secrets, python, librdkafka = connection_case(random.Random(5000 + seed), pem)
    caplog.set_level(logging.DEBUG)

    settings = settings_from_spec(spec, lambda name, key: secrets[name, key], tmp_path)

    def effective(options: dict[str, Any], check: str, default: Any) -> dict[str, Any]:
        # verifyHostname true is each client's default (kafka-python checks; librdkafka 2 says https): either way.
        options.setdefault(check, default)
        for name in TLS_FILE_FIELDS & set(options):
            path = Path(options[name])
            assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.parent == tmp_path
            options[name] = path.read_bytes()   # material is given as files holding the Secret's bytes
        return options

    ssl = spec["securityProtocol"].endswith("SSL")
    got_python = effective(settings.client_options(), "ssl_check_hostname", True) if ssl else settings.client_options()
    got_librdkafka = librdkafka_config(settings)
    assert [s.strip() for s in got_librdkafka.pop("bootstrap.servers").split(",")] == python["bootstrap_servers"]
    if ssl:
        got_librdkafka = effective(got_librdkafka, "ssl.endpoint.identification.algorithm", "https")
    assert got_python == python
    assert got_librdkafka == librdkafka
    assert_no_secret(repr(settings), settings.describe(), caplog.text)


@pytest.mark.parametrize("problem", ["encrypted key", "key of another certificate", "CA without a certificate",
                                     "password not UTF-8", "empty username"])
def test_a_kafka_connection_that_cannot_load_names_the_secret_and_key_never_a_value(problem, pem, tmp_path):
    from kcm_operator.connections import settings_from_spec

    secrets = {("creds", "username"): b"alice", ("creds", "password"): f"p-{MARK}".encode(),
               ("ca", "ca.crt"): Path(pem.ca).read_bytes(), ("client-tls", "tls.crt"): Path(pem.cert).read_bytes(),
               ("client-tls", "tls.key"): Path(pem.key).read_bytes()}
    spec = {"bootstrapServers": "kafka:9093", "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "PLAIN", "secretRef": {"name": "creds"}},
            "tls": {"caSecretRef": {"name": "ca"}, "clientCertSecretRef": {"name": "client-tls"}}}
    named = {"encrypted key": ("client-tls", "tls.key"), "key of another certificate": ("client-tls", "tls.key"),
             "CA without a certificate": ("ca", "ca.crt"), "password not UTF-8": ("creds", "password"),
             "empty username": ("creds", "username")}[problem]
    secrets[named] = {"encrypted key": Path(pem.encrypted_key).read_bytes(),
                      "key of another certificate": Path(pem.other_key).read_bytes(),
                      "CA without a certificate": NOT_A_CERTIFICATE.encode(),
                      "password not UTF-8": b"p\xff" + MARK.encode(), "empty username": b""}[problem]

    with pytest.raises(KafkaConfigError) as refused:
        settings_from_spec(spec, lambda name, key: secrets[name, key], tmp_path)
    message = str(refused.value)
    assert named[0] in message and repr(named[1]) in message and "\n" not in message, message
    assert MARK not in message and str(tmp_path) not in message, message


@pytest.mark.parametrize("given", [{"sasl.username": "u"}, {"sasl.password": f"p-{MARK}"},
                                   {"sasl.username": "u", "sasl.password": ""}])
def test_sasl_with_half_of_its_credentials_is_refused_naming_both(given):
    # docs: "a SASL protocol without credentials is rejected at start-up"; a user without a password is one.
    with pytest.raises(KafkaConfigError, match="needs sasl.username and sasl.password") as refused:
        KafkaSettings("kafka:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", **given}).validate()
    assert MARK not in str(refused.value)


@pytest.mark.parametrize("line", [f'{LOGIN_MODULES["PLAIN"]} required username="u" password="";',
                                  f'{LOGIN_MODULES["PLAIN"]} required username="" password="p-{MARK}";'])
def test_a_jaas_line_with_an_empty_username_or_password_is_refused(line):
    with pytest.raises(KafkaConfigError, match="sasl.jaas.config gives an empty username or password") as refused:
        KafkaSettings("kafka:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                     "sasl.jaas.config": line}).validate()
    assert MARK not in str(refused.value)


def test_a_scram_login_module_without_a_mechanism_is_refused_rather_than_tried_as_plain():
    line = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p-{MARK}";'
    with pytest.raises(KafkaConfigError, match="set sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512"):
        KafkaSettings("kafka:9092", {"security.protocol": "SASL_SSL", "sasl.jaas.config": line}).validate()
    KafkaSettings("kafka:9092", {"security.protocol": "SASL_SSL", "sasl.jaas.config": line,
                                 "sasl.mechanism": "SCRAM-SHA-512"}).validate()


def test_a_request_timeout_beyond_a_java_int_is_refused():
    with pytest.raises(KafkaConfigError, match="up to 2147483647"):
        KafkaSettings("kafka:9092", {"request.timeout.ms": "3000000000"}).validate()
    KafkaSettings("kafka:9092", {"request.timeout.ms": "2147483647"}).validate()


def test_the_java_path_logs_in_with_kafkas_own_login_module_whatever_package_the_file_names():
    from kcm_common.kafka_java import java_client_properties

    shaded = "kafkashaded.org.apache.kafka.common.security.scram.ScramLoginModule"
    line = f'{shaded} required username="u" password="p-{MARK}";'
    settings = KafkaSettings("kafka:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                                            "sasl.jaas.config": line})
    settings.validate()
    assert java_client_properties(settings)["sasl.jaas.config"] == (
        f'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p-{MARK}";')
