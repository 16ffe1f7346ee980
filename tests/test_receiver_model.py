"""Model-based test of kcm's broker plugin (receiver/, the real jar) against docs/receiver.md ("What it writes",
"How it protects the broker", "Configuration", "Metrics") and docs/contract.md ("Which writer provides which
header").

A reference model written from those docs only predicts, for seeded random inputs and directed edge cases:
- configuration: whether a set of broker properties starts the plugin, and otherwise that start-up fails with
  Kafka's ConfigException naming the property (a near-miss or wrong-case producer name with "did you mean", a
  topic name Kafka would refuse, a misspelt `kcm.` prefix, a `listeners` entry without a port, an unreadable
  sasl.jaas.config without quoting the secret, `acks` against idempotence as `kcm.receiver.producer.*`);
- what it writes: for random pushes fed through the sandbox's plugin host (sandbox/kcm_sandbox/java_receiver.py,
  both plugin classes) the record on the metrics topic: key, value bytes, and every header with its present/absent
  rule (content-encoding by magic number, software name `unknown` left out, no `subscription_id`, `push_interval_ms`
  only from the 4.2+ class, `cluster_id` only from contextChange);
- protection and counters: the queue bounded in bytes with each push weighing size + 256 + 2 per Java char of its
  client id and software name and version (dropped beyond, counted), and the JMX counters
  `kafka.server:type=kcm-receiver`: once `queue-bytes` is 0, received = written + dropped + empty + errors.

Configuration cases run in one JVM (a small probe that configures the plugin class as a broker does, case after
case); a few go through the sandbox's host too. Counters are read over JMX from the host's JVM (attach API).
Not observable through the harness: principals, listener names and security protocols other than the host's fixed
`User:ANONYMOUS`/`PLAINTEXT`, a content type other than Kafka's `OTLP`, the shutdown drop count (the JVM exits).
"""

from __future__ import annotations

import ipaddress
import random
import select
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from kcm_common.contract import compress
from kcm_common.errors import UserError
from kcm_common.java_config import properties_text
from kcm_common.kafka import KafkaSettings, ensure_topic
from kcm_sandbox.java_receiver import JavaReceiver, ensure_built, jar_path, runtime_classpath
from kcm_sandbox.receiver import TopicReceiver
from kcm_sandbox.telemetry import ClientIdentity, PushResult

SEEDS = (714, 1217, 3808)
CLASSES = {"3.8": "dev.kcm.receiver.KcmClientTelemetry", "4.2": "dev.kcm.receiver.KcmTelemetryExporter"}
PREFIX = "kcm.receiver."
PRODUCER = PREFIX + "producer."
MIN_QUEUE = 1024
OVERHEAD = 256
# Producer settings a user might give (Kafka's documented ProducerConfig names), for valid values and typos.
PRODUCER_NAMES = ["linger.ms", "batch.size", "acks", "compression.type", "enable.idempotence", "retries",
                  "delivery.timeout.ms", "request.timeout.ms", "max.block.ms", "buffer.memory", "client.id",
                  "security.protocol", "sasl.mechanism", "sasl.jaas.config", "ssl.truststore.location",
                  "ssl.truststore.password", "ssl.keystore.location", "ssl.endpoint.identification.algorithm",
                  "max.in.flight.requests.per.connection", "metadata.max.age.ms", "send.buffer.bytes",
                  "receive.buffer.bytes", "retry.backoff.ms", "reconnect.backoff.ms", "interceptor.classes",
                  "partitioner.class", "transactional.id", "max.request.size", "connections.max.idle.ms"]
VALID_PRODUCER = [("linger.ms", "5"), ("batch.size", "32768"), ("compression.type", "lz4"), ("retries", "3"),
                  ("request.timeout.ms", "15000"), ("client.id", "kcm-receiver-custom"), ("acks", "all"),
                  ("max.in.flight.requests.per.connection", "5"), ("metadata.max.age.ms", "60000"),
                  ("sasl.jaas.config", 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                       'username="kcm" password="pass word";'),
                  # unknown to the producer and far from every name it knows: passed on, for its plugins
                  ("kcm.audit.tag", "blue"), ("interceptor.zone.label", "eu-1")]
INVALID_PRODUCER = [("linger.ms", "-1"), ("linger.ms", "soon"), ("batch.size", "big"),
                    ("compression.type", "brotli"), ("acks", "most"), ("enable.idempotence", "perhaps"),
                    ("max.block.ms", "-5"), ("bootstrap.servers", "nohost")]

# --- the Java side: a configuration probe and a JMX reader, compiled once per module ---------------------------

CONFIG_PROBE = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import org.apache.kafka.common.metrics.MetricsReporter;

/** Configures a fresh plugin instance per input line (CLASS HEX-PROPERTIES), as a broker does at start-up; answers
 *  each with "@@" and the hex of "OK" or "ERR exception-class: message", then closes the instance. */
public final class ConfigProbe {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        for (String line; (line = in.readLine()) != null; ) {
            String[] parts = line.split(" ", 2);
            Properties given = new Properties();
            given.load(new StringReader(new String(HexFormat.of().parseHex(parts[1]), StandardCharsets.UTF_8)));
            Map<String, Object> config = new HashMap<>();
            for (String name : given.stringPropertyNames()) {
                config.put(name, given.getProperty(name));
            }
            MetricsReporter plugin = (MetricsReporter) Class.forName(parts[0]).getDeclaredConstructor().newInstance();
            String result;
            try {
                plugin.configure(config);
                result = "OK";
            } catch (Exception e) {
                result = "ERR " + e.getClass().getName() + ": " + e.getMessage();
            } finally {
                plugin.close();
            }
            out.println("@@" + HexFormat.of().formatHex(result.getBytes(StandardCharsets.UTF_8)));
        }
    }
}
"""

JMX_WATCH = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import javax.management.*;
import javax.management.remote.*;
import com.sun.tools.attach.VirtualMachine;

/** Attaches to JVM PID's JMX; for every input line answers "@@" then the kafka.server MBeans' names and the
 *  attributes of kafka.server:type=kcm-receiver, tab-separated. */
public final class JmxWatch {
    public static void main(String[] args) throws Exception {
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        String address = vm.startLocalManagementAgent();
        vm.detach();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (JMXConnector connector = JMXConnectorFactory.connect(new JMXServiceURL(address))) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            ObjectName ours = new ObjectName("kafka.server:type=kcm-receiver");
            while (in.readLine() != null) {
                StringBuilder line = new StringBuilder("@@");
                for (ObjectName name : server.queryNames(new ObjectName("kafka.server:*"), null)) {
                    line.append("mbean=").append(name.getCanonicalName()).append('\t');
                }
                if (server.isRegistered(ours)) {
                    for (MBeanAttributeInfo attribute : server.getMBeanInfo(ours).getAttributes()) {
                        line.append(attribute.getName()).append('=')
                            .append(server.getAttribute(ours, attribute.getName())).append('\t');
                    }
                }
                System.out.println(line);
                System.out.flush();
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> Path:
    """The probe classes, compiled against the plugin jar the session's build produced (built when out of date)."""
    ensure_built()
    out = tmp_path_factory.mktemp("receiver-model-probes")
    for name, source in (("ConfigProbe", CONFIG_PROBE), ("JmxWatch", JMX_WATCH)):
        (out / f"{name}.java").write_text(source)
    subprocess.run(["javac", "--release", "17", "-d", str(out), "-cp", runtime_classpath(jar_path()),
                    str(out / "ConfigProbe.java"), str(out / "JmxWatch.java")], check=True, capture_output=True,
                   timeout=120)
    return out


def _classpath(probes: Path) -> str:
    return runtime_classpath(probes, jar_path())


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    """The next "@@" line of `process`'s stdout (other output, such as slf4j's warnings, is skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(left, 0))
        assert ready, f"no answer within {timeout}s"
        line = process.stdout.readline().decode()
        assert line, f"the probe exited: {process.poll()}"
        if line.startswith("@@"):
            return line[2:].rstrip("\n")


def _configure_all(probes: Path, cases: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Each (plugin class, broker properties) configured in one JVM; "OK" or "ERR class: message" for each."""
    process = subprocess.Popen(["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", _classpath(probes),
                                "ConfigProbe"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        results = []
        for plugin_class, properties in cases:
            process.stdin.write(f"{plugin_class} {properties_text(properties).encode().hex()}\n".encode())
            process.stdin.flush()
            results.append(bytes.fromhex(_read_line(process, 30)).decode())
        return results
    finally:
        process.stdin.close()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Jmx:
    """The plugin's JMX counters in the JVM of a JavaReceiver, read through the attach API."""

    def __init__(self, probes: Path, pid: int) -> None:
        self._process = subprocess.Popen(["java", "-XX:TieredStopAtLevel=1", "-cp", _classpath(probes), "JmxWatch",
                                          str(pid)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)

    def read(self) -> tuple[set[str], dict[str, float]]:
        self._process.stdin.write(b"\n")
        self._process.stdin.flush()
        mbeans, counters = set(), {}
        for field in filter(None, _read_line(self._process, 30).split("\t")):
            name, _, value = field.partition("=")
            if name == "mbean":
                mbeans.add(value)
            else:
                counters[name] = float(value)
        return mbeans, counters

    def counters(self) -> dict[str, float]:
        return self.read()[1]

    def wait(self, predicate, timeout: float = 30.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            counters = self.counters()
            if predicate(counters):
                return counters
            assert time.monotonic() < deadline, f"counters never got there: {counters}"
            time.sleep(0.05)

    def close(self) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


# --- the reference model ---------------------------------------------------------------------------------------

MAGIC = [(b"\x28\xb5\x2f\xfd", "zstd"), (b"\x04\x22\x4d\x18", "lz4"), (b"\x1f\x8b", "gzip"),
         (b"\x82SNAPPY\x00", "snappy")]


def model_encoding(payload: bytes) -> str:
    """receiver.md: compressed bytes are recognised by their magic number; anything else (raw snappy too) is none."""
    for magic, name in MAGIC:
        if payload.startswith(magic):
            return name
    return "none"


def model_weight(payload: bytes, identity: ClientIdentity) -> int:
    """receiver.md, kcm.receiver.queue.max.bytes: size + 256, plus two bytes per Java char of the client id and
    software name and version "as the broker holds them": Kafka's `unknown` for a client that sent none."""
    text = [identity.client_id]
    text += ["unknown" if part is None else part for part in (identity.software_name, identity.software_version)]
    return len(payload) + OVERHEAD + 2 * sum(len(part) for part in text if part)


def model_headers(api: str, broker_id: int, cluster_id: str, instance: uuid.UUID, identity: ClientIdentity,
                  push: PushResult) -> dict[str, str]:
    """Every header receiver.md lists, each present only when the plugin can know it, never empty."""
    headers = {"content-type": "application/x-protobuf",   # Kafka's `OTLP`, translated
               "content-encoding": model_encoding(push.payload),
               "client_instance_id": str(instance),
               "principal": "User:ANONYMOUS", "listener_name": "PLAINTEXT", "security_protocol": "PLAINTEXT",
               "broker_id": str(broker_id),
               "terminating": "true" if push.terminating else "false"}
    headers["client_id"] = identity.client_id or ""   # contract.md: always, Kafka's "" for a client that set none
    if identity.software_name is not None:   # sent (ApiVersions v3+); `unknown` is Kafka's "never sent"
        for header, value in (("client_software_name", identity.software_name),
                              ("client_software_version", identity.software_version)):
            if value not in ("", "unknown"):
                headers[header] = value
    if identity.source_address is not None:
        headers["client_source_address"] = identity.source_address
    if identity.source_port is not None:
        headers["client_source_port"] = str(identity.source_port)
    if cluster_id:   # from contextChange only
        headers["cluster_id"] = cluster_id
    if api == "4.2":
        headers["push_interval_ms"] = str(push.push_interval_ms)
    return headers


def assert_record_matches(record, expected_key: str, payload: bytes, expected: dict[str, str]) -> None:
    key, value, header_list = record
    names = [name for name, _ in header_list]
    assert len(names) == len(set(names)), f"a header written twice: {names}"
    headers = {name: raw.decode() for name, raw in header_list}
    # "never written empty": but the client id, which is Kafka's "" for a client that set none
    assert all(value for name, value in headers.items() if name != "client_id"), f"a header written empty: {headers}"
    assert key.decode() == expected_key and value == payload
    assert "subscription_id" not in headers
    # An address is compared as an address: the docs do not say how IPv6 is spelt (see the parity test below).
    if "client_source_address" in expected:
        assert ipaddress.ip_address(headers.pop("client_source_address")) == ipaddress.ip_address(
            expected["client_source_address"])
        expected = {k: v for k, v in expected.items() if k != "client_source_address"}
    assert headers == expected


# --- random inputs ---------------------------------------------------------------------------------------------

CLIENT_IDS = [None, "", "orders-1", "zażółć-клиент-漢字", "with space", "c" * 300]
SOFTWARE = [(None, None), ("apache-kafka-java", "4.3.0"), ("confluent-kafka-python", "2.6.1-rdkafka-2.6.1"),
            ("unknown", "unknown"), ("unknown", "3.9.0"), ("librdkafka", "unknown"), ("", ""), ("kcm-тест", "1.0")]
ADDRESSES = [None, "127.0.0.1", "10.20.30.40", "::1", "2001:db8::7", "fe80::1:2"]


def random_payload(rng: random.Random) -> bytes:
    size = rng.choice([1, 7, 60, 900, 4096, 20_000, 300_000])
    body = b"\x0a" + rng.randbytes(size - 1)   # field 1 of MetricsData: no compression magic
    kind = rng.choice(["plain", "plain", "plain", "zstd", "lz4", "gzip", "xerial", "raw-snappy", "near-magic",
                       "empty"])
    if kind == "empty":
        return b""
    if kind in ("zstd", "lz4", "gzip"):
        return compress(body, kind)
    if kind == "xerial":
        return b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01\x00\x00\x00\x01" + body
    if kind == "raw-snappy":
        return compress(body, "snappy")
    if kind == "near-magic":   # the first bytes of a magic number, not all of it
        return rng.choice([b"\x28\xb5\x2f", b"\x1f", b"\x04\x22\x4d", b"\x82SNAPPY"]) + body
    return body


def random_push(rng: random.Random) -> tuple[uuid.UUID, ClientIdentity, PushResult]:
    name, version = rng.choice(SOFTWARE)
    identity = ClientIdentity(rng.choice(CLIENT_IDS), name, version, rng.choice(ADDRESSES),
                              rng.choice([None, 1, 40000, 65535, rng.randint(1024, 65535)]))
    push = PushResult(error_code=0, throttle_time_ms=0, payload=random_payload(rng), subscription_id=7,
                      push_interval_ms=rng.choice([0, 500, 30_000, 2**31 - 1]), terminating=rng.random() < 0.3)
    return uuid.UUID(bytes=rng.randbytes(16)), identity, push


def read_records(bootstrap: str, topic: str, count: int, timeout: float = 30.0):
    """The first `count` records of partition 0 of `topic`: (key, value, [(header, bytes)])."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=100,
                             max_partition_fetch_bytes=64 << 20, fetch_max_bytes=64 << 20)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        records = []
        deadline = time.monotonic() + timeout
        while len(records) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records += [(r.key, r.value, list(r.headers)) for r in batch]
        return records
    finally:
        consumer.close()


@pytest.fixture
def receivers() -> Iterator[list]:
    """JavaReceivers and JMX readers a test starts: all closed after it."""
    started: list = []
    yield started
    for item in reversed(started):
        item.close()


# --- 1. configuration --------------------------------------------------------------------------------------------

def _edit(rng: random.Random, name: str, edits: int) -> str:
    """`name` one or two letters away: a letter changed, dropped, doubled or two swapped."""
    for _ in range(100):
        typo = name
        for _ in range(edits):
            letters = [i for i, c in enumerate(typo) if c.isalpha()]
            i = rng.choice(letters)
            op = rng.choice(["change", "drop", "double"])
            if op == "change":
                typo = typo[:i] + rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != typo[i]]) + typo[i + 1:]
            elif op == "drop":
                typo = typo[:i] + typo[i + 1:]
            else:
                typo = typo[:i] + typo[i] + typo[i:]
        if typo not in PRODUCER_NAMES and typo != name:
            return typo
    raise AssertionError(name)


def _distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def random_config_case(rng: random.Random, bootstrap: str) -> tuple[dict[str, str], str | None, str | None]:
    """(broker properties, the property start-up must name or None when it must start, a secret it must not show).

    A valid base with some optional settings, then at most one invalid element."""
    properties = {"node.id": str(rng.randint(0, 9)), "listeners": f"PLAINTEXT://{bootstrap}",
                  PREFIX + "close.timeout.ms": "0"}   # closing each probe at once: no wait for a producer
    if rng.random() < 0.6:
        properties[PREFIX + "topic"] = rng.choice(["kafka-client-metrics", "metrics.v1", "m_1", "telemetry"])
    if rng.random() < 0.5:
        properties[PREFIX + "bootstrap.servers"] = rng.choice(
            [bootstrap, f"{bootstrap},localhost:{bootstrap.rsplit(':', 1)[1]}", "kafka-0.not-resolving-yet:9092"])
    if rng.random() < 0.5:
        properties[PREFIX + "queue.max.bytes"] = str(rng.choice([MIN_QUEUE, 4096, 16 << 20, 1 << 40]))
    if rng.random() < 0.4:
        properties[PREFIX + "close.timeout.ms"] = rng.choice(["0", "1", "100"])
    for name, value in rng.sample(VALID_PRODUCER, rng.randint(0, 3)):
        properties[PRODUCER + name] = value
    kind = rng.choice(["valid", "valid", "queue", "close", "bootstrap", "producer", "typo", "unknown", "jaas",
                       "serializer", "acks"])
    if kind == "valid":
        return properties, None, None
    if kind == "queue":
        name, value = PREFIX + "queue.max.bytes", rng.choice(["1023", "0", "-5", "plenty", "1.5", ""])
    elif kind == "close":
        name, value = PREFIX + "close.timeout.ms", rng.choice(["-1", "soon", "2.5"])
    elif kind == "bootstrap":
        value = rng.choice(["localhost", "kafka-0:port", "kafka-0:70000", ":9092", f"{bootstrap},kafka-1"])
        name = rng.choice([PREFIX + "bootstrap.servers", PRODUCER + "bootstrap.servers"])
    elif kind == "producer":
        field, value = rng.choice(INVALID_PRODUCER)
        name = PRODUCER + field
    elif kind == "typo":
        name, value = PRODUCER + _edit(rng, rng.choice([n for n in PRODUCER_NAMES if len(n) >= 6]),
                                       rng.choice([1, 2])), "x"
    elif kind == "unknown":
        name = PREFIX + rng.choice(["topics", "queue.max.byte", "close.timeout", "bootstrap", "frobnicate",
                                    "producers.linger.ms", "Topic"])
        value = "1"
    elif kind == "jaas":
        # (password, the part Kafka's own error would quote: after the blank or the stray quote)
        secret, quoted = rng.choice([("hunter2 andZq9", "andZq9"), ('pa"ssQx7', "ssQx7"), ("s3cr etW8!", "etW8!")])
        name, value = PRODUCER + "sasl.jaas.config", (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required username=kcm password={secret};")
        properties[name] = value
        return properties, name, quoted
    elif kind == "serializer":
        name, value = PRODUCER + rng.choice(["key.serializer", "value.serializer"]), (
            "org.apache.kafka.common.serialization.StringSerializer")
    else:   # acks other than all with idempotence (default true): fails only together
        properties[PRODUCER + "acks"] = rng.choice(["1", "0"])
        properties.pop(PRODUCER + "enable.idempotence", None)
        return properties, PRODUCER + "*", None
    properties[name] = value
    return properties, name, None


def test_random_broker_properties_start_the_plugin_or_fail_naming_the_property(probes, broker):
    cases, expectations = [], []
    for seed in SEEDS:
        rng = random.Random(seed)
        for _ in range(25):
            properties, named, secret = random_config_case(rng, broker.bootstrap)
            cases.append((rng.choice(list(CLASSES.values())), properties))
            expectations.append((named, secret))
    # Directed: the edges the docs name.
    directed = [
        ({PREFIX + "queue.max.bytes": str(MIN_QUEUE)}, None, None),
        ({PREFIX + "queue.max.bytes": str(MIN_QUEUE - 1)}, PREFIX + "queue.max.bytes", None),
        ({PREFIX + "close.timeout.ms": "0"}, None, None),
        ({PRODUCER + "sasl.jass.config": "x"}, PRODUCER + "sasl.jass.config", None),
        ({PRODUCER + "acks": "1", PRODUCER + "enable.idempotence": "false"}, None, None),
        ({PRODUCER + "acks": "1"}, PRODUCER + "*", None),
        ({PRODUCER + "linger.ms": "-1"}, PRODUCER + "linger.ms", None),
        ({PRODUCER + "key.serializer": "x"}, PRODUCER + "key.serializer", None),
        ({PREFIX + "topicz": "t"}, PREFIX + "topicz", None),
        ({PREFIX + "topic": "my metrics topic"}, PREFIX + "topic", None),
        ({PREFIX + "topic": "m" * 250}, PREFIX + "topic", None),
        ({"kcm.reciever.topic": "t"}, "kcm.reciever.topic", None),
        ({PRODUCER + "SASL.MECHANISM": "PLAIN"}, PRODUCER + "SASL.MECHANISM", None),
        ({"listeners": "PLAINTEXT://kafka-0"}, "listeners", None),
        ({PRODUCER + "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                                         "username=u password=open sesame;"}, PRODUCER + "sasl.jaas.config",
         "sesame"),
    ]
    for extra, named, secret in directed:
        cases.append((CLASSES["4.2"], {"node.id": "1", "listeners": f"PLAINTEXT://{broker.bootstrap}",
                                       PREFIX + "close.timeout.ms": "0", **extra}))
        expectations.append((named, secret))

    results = _configure_all(probes, cases)
    mismatches = []
    for (plugin_class, properties), (named, secret), result in zip(cases, expectations, results):
        if named is None:
            ok = result == "OK"
        else:
            ok = (result.startswith("ERR org.apache.kafka.common.config.ConfigException: ") and named in result
                  and (secret is None or secret not in result))
            typo = named[len(PRODUCER):] if named.startswith(PRODUCER) else ""
            if ok and typo and typo not in PRODUCER_NAMES and typo != "*" and "did you mean" in result:
                suggested = result.split("did you mean " + PRODUCER, 1)[1].rstrip("?")
                ok = _distance(typo, suggested) <= 2 or typo.lower() == suggested
            elif ok and typo and any(_distance(typo, known) <= 2 or typo.lower() == known for known in PRODUCER_NAMES
                                     if known != typo) and typo not in PRODUCER_NAMES and typo != "*" \
                    and not typo.endswith("serializer"):
                ok = "did you mean" in result
        if not ok:
            mismatches.append((plugin_class, {k: v for k, v in properties.items() if k.startswith(PREFIX)}, named,
                               result))
    assert not mismatches, "\n".join(map(repr, mismatches[:10]))
    assert len(results) == len(cases) == 90


def test_bad_properties_given_to_the_sandbox_host_fail_its_start_naming_them_and_never_the_secret(broker):
    secret = "correct horse"
    for extra, named in [({PREFIX + "queue.max.bytes": "1023"}, PREFIX + "queue.max.bytes"),
                         ({PRODUCER + "ssl.truststore.locaton": "/x"}, "did you mean " + PRODUCER
                          + "ssl.truststore.location"),
                         ({PRODUCER + "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule"
                                                          f" required username=u password={secret};"},
                          PRODUCER + "sasl.jaas.config")]:
        with pytest.raises(UserError) as failed:
            JavaReceiver(broker.bootstrap, "kafka-client-metrics", 1, "c", extra_config=extra)
        assert named in str(failed.value) and "horse" not in str(failed.value)


# --- 2. what it writes, and 3. its counters -----------------------------------------------------------------

@pytest.mark.parametrize("api", ["4.2", "3.8"])
def test_random_pushes_are_written_as_the_docs_say_and_counted(probes, broker, receivers, api):
    rng = random.Random(SEEDS[0] if api == "4.2" else SEEDS[1])
    topic = f"model-{api.replace('.', '')}"
    ensure_topic(KafkaSettings(broker.bootstrap), topic, 1)
    broker_id = rng.randint(0, 1000)
    cluster_id = "" if api == "3.8" else "kcm-model-cluster"   # no cluster id: no label, no header
    pushes = [random_push(rng) for _ in range(40)]
    # Directed: a push larger than the producer's own 1 MiB max.request.size (it defaults to the queue's bytes),
    # an empty MetricsData, a terminating one, every unknown at once.
    big = b"\x0a" + bytes(2 << 20)
    pushes += [(uuid.uuid4(), ClientIdentity("big", "apache-kafka-java", "4.3.0", "127.0.0.1", 4), PushResult(
                   0, 0, big, 1, 1000, False)),
               (uuid.uuid4(), ClientIdentity("empty", None, None, "::1", 5), PushResult(0, 0, b"", 1, 1000, False)),
               (uuid.uuid4(), ClientIdentity(None, None, None, None, None), PushResult(0, 0, b"\x0a\x00", 1, 0, True))]
    java = JavaReceiver(broker.bootstrap, topic, broker_id, cluster_id, api=api)
    receivers.append(java)
    jmx = Jmx(probes, java._process.pid)
    receivers.append(jmx)
    for instance, identity, push in pushes:
        java(instance, identity, push)   # raises if the plugin threw: nothing is thrown out of exportMetrics

    written = [p for p in pushes if p[2].payload]
    counters = jmx.wait(lambda c: c.get("queue-bytes") == 0 and c.get("pushes-written-total") == len(written))
    assert counters["pushes-received-total"] == len(pushes)
    assert counters["pushes-empty-total"] == len(pushes) - len(written)
    assert counters["pushes-dropped-total"] == counters["producer-errors-total"] == 0
    assert counters["export-errors-total"] == 0
    assert counters["pushes-received-total"] == sum(counters[name] for name in (
        "pushes-written-total", "pushes-dropped-total", "pushes-empty-total", "producer-errors-total",
        "export-errors-total"))
    assert counters["bytes-received-total"] == sum(len(p[2].payload) for p in pushes)
    assert counters["bytes-written-total"] == sum(len(p[2].payload) for p in written)
    mbeans, _ = jmx.read()
    assert "kafka.server:type=kcm-receiver" in mbeans
    assert not any("kafka-metrics-count" in name for name in mbeans)

    records = read_records(broker.bootstrap, topic, len(written) + 1, timeout=5)
    assert len(records) == len(written)
    for record, (instance, identity, push) in zip(records, written):
        expected = model_headers(api, broker_id, cluster_id, instance, identity, push)
        assert_record_matches(record, str(instance), push.payload, expected)


def _dead_address() -> str:
    """A loopback port nobody listens on: a producer there never has a push acknowledged."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{closed.getsockname()[1]}"


def test_the_queue_holds_pushes_by_their_documented_weight_and_drops_beyond_it(probes, broker, receivers):
    """A producer that cannot reach Kafka acknowledges nothing, so every push taken stays held: the plugin must take a
    push exactly when what it holds plus the push's weight fits in kcm.receiver.queue.max.bytes."""
    dead = _dead_address()
    for seed in SEEDS:
        rng = random.Random(seed)
        limit = rng.choice([MIN_QUEUE, 4096, 6000])
        java = JavaReceiver(dead, "never-written", 3, "c", api=rng.choice(list(CLASSES)), extra_config={
            PREFIX + "queue.max.bytes": str(limit), PREFIX + "close.timeout.ms": "0"})
        receivers.append(java)
        jmx = Jmx(probes, java._process.pid)
        receivers.append(jmx)
        held = dropped = empty = 0
        for step in range(30):
            identity = ClientIdentity(rng.choice(CLIENT_IDS[:5] + ["é" * rng.randint(0, 40)]),
                                      *rng.choice(SOFTWARE[1:3] + [("ü" * rng.randint(1, 9), "漢" * 3)]),
                                      "127.0.0.1", 9)
            text = model_weight(b"", identity)
            room = limit - held - text
            # Around the edge (exactly fits, one byte over) or anywhere, now and then an empty push.
            size = max(0, rng.choice([room, room + 1, room - 1, rng.randint(1, max(1, limit // 3))]))
            payload = b"" if step % 9 == 4 else b"\x0a" * size
            java(uuid.uuid4(), identity, PushResult(0, 0, payload, 1, 100, False))
            if not payload:
                empty += 1
            elif held + model_weight(payload, identity) <= limit:
                held += model_weight(payload, identity)
            else:
                dropped += 1
            counters = jmx.counters()
            assert (counters["queue-bytes"], counters["pushes-dropped-total"], counters["pushes-empty-total"]) == (
                held, dropped, empty), (seed, step, size, identity)
        assert counters["pushes-received-total"] == 30 and counters["pushes-written-total"] == 0
        assert dropped > 0 and held > 0


@pytest.mark.parametrize("software", [(None, None), ("unknown", "unknown")])
def test_a_push_without_software_name_weighs_what_the_broker_holds_for_it(probes, receivers, software):
    """receiver.md: a push counts its size + 256 plus two bytes per Java char of the client id and software name and
    version as the broker holds them (`unknown` for none): one of exactly the queue's bytes is held."""
    java = JavaReceiver(_dead_address(), "never-written", 3, "c", extra_config={
        PREFIX + "queue.max.bytes": str(MIN_QUEUE), PREFIX + "close.timeout.ms": "0"})
    receivers.append(java)
    jmx = Jmx(probes, java._process.pid)
    receivers.append(jmx)
    identity = ClientIdentity("ab", *software, "127.0.0.1", 9)
    payload = b"\x0a" * (MIN_QUEUE - model_weight(b"", identity))
    assert model_weight(payload, identity) == MIN_QUEUE
    java(uuid.uuid4(), identity, PushResult(0, 0, payload, 1, 100, False))
    counters = jmx.counters()
    assert (counters["queue-bytes"], counters["pushes-dropped-total"]) == (MIN_QUEUE, 0)


def test_both_receivers_spell_an_ipv6_source_address_the_same(broker):
    """receiver.md, "Running it in the sandbox": the Python and Java receivers write the same records apart from
    subscription_id and push_interval_ms; a client connecting over IPv6 included."""
    settings = KafkaSettings(broker.bootstrap)
    ensure_topic(settings, "addr-python", 1)
    ensure_topic(settings, "addr-java", 1)
    python = TopicReceiver(settings, "addr-python", 1, "c")
    java = JavaReceiver(broker.bootstrap, "addr-java", 1, "c")
    addresses = ["127.0.0.1", "::1", "2001:db8::7"]
    try:
        for address in addresses:
            handed = (uuid.uuid4(), ClientIdentity("v6", None, None, address, 1), PushResult(0, 0, b"\x0a", 1, 9,
                                                                                               False))
            python(*handed)
            java(*handed)
    finally:
        python.close()
        java.close()
    spelt = {writer: [dict(r[2])["client_source_address"].decode() for r in read_records(broker.bootstrap,
                                                                                          f"addr-{writer}", 3)]
             for writer in ("python", "java")}
    assert [ipaddress.ip_address(a) for a in spelt["java"]] == [ipaddress.ip_address(a) for a in addresses]
    assert spelt["python"] == spelt["java"]
