"""Model test of the sandbox's CLIENT_METRICS config APIs (resource type 16) as an operator drives them through
kafka-python's KafkaAdminClient (and, where the client hides an answer, its protocol classes on a bare socket).

The reference is written from /work/shared/DESIGN.md ("Apache Kafka facts"), docs/sandbox.md ("What it implements")
and, where those leave the detail open, Apache Kafka 4.3.1's source (confluentinc/kafka @ 26b251a451ce):
ClientMetricsConfigs.validate, ConfigDef.parse, ConfigAdminManager.preprocess,
ConfigurationControlManager.incrementalAlterConfigResource / legacyAlterConfigResource / validateAlterConfig and
ConfigHelper / ConfigHelperUtils. Seeded random sequences of IncrementalAlterConfigs (SET, DELETE, APPEND, SUBTRACT),
AlterConfigs (kafka-python's, which re-sends the keys it read back, and the raw replace-everything request),
validate-only changes, DescribeConfigs of set, unset, empty and repeated names, and ListConfigResources v0/v1 are
applied to the sandbox and to the reference; after every step each resource's error code (and its message's key
words), every described value, source, type and order, and the listed names must agree.
"""

from __future__ import annotations

import collections
import random
import re
from dataclasses import dataclass

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListConfigResourcesRequest,
    ListConfigResourcesResponse,
)
from test_sandbox_protocol import KafkaConnection

SEEDS = (714, 4331, 16, 2026)
STEPS = 60
CLIENT_METRICS = 16
INVALID_CONFIG, INVALID_REQUEST = 40, 42
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
SOURCE_DEFAULT, SOURCE_CLIENT_METRICS = 5, 7
SOURCE_NAMES = {SOURCE_DEFAULT: "DEFAULT_CONFIG", SOURCE_CLIENT_METRICS: "DYNAMIC_CLIENT_METRICS_CONFIG"}
ERROR_NAMES = {INVALID_CONFIG: "InvalidConfigurationError", INVALID_REQUEST: "InvalidRequestError"}

# ClientMetricsConfigs.java:104-117: the keys, their types, defaults and documentation.
DEFAULTS = {"metrics": "", "interval.ms": "300000", "match": ""}
TYPES = {"metrics": 7, "interval.ms": 3, "match": 7}   # DescribeConfigsResponse ConfigType: LIST 7, INT 3
TYPE_NAMES = {7: "LIST", 3: "INT"}
DOCUMENTATION = {"metrics": "Telemetry metric name prefix list", "interval.ms": "Metrics push interval in milliseconds",
                 "match": "Client match criteria"}
LIST_KEYS = ("metrics", "match")
DESCRIBE_ORDER = ("interval.ms", "match", "metrics")   # docs/sandbox.md: a Java HashMap's order
MATCH_KEYS = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
              "client_source_address", "client_source_port")
JAVA_TRIM = "".join(chr(code) for code in range(0x21))   # String.trim() strips every char <= U+0020
JAVA_SPACE = "[ \t\n\x0b\f\r]"                          # java.util.regex \s
MAX_VALUE_CHARS = 32767                                 # Short.MAX_VALUE

NAMES = ("payments", "orders", "all.clients", "zürich")
UNKNOWN_KEYS = ("push.interval", "Metrics", "interval")
METRIC_ITEMS = ("org.apache.kafka.producer.", "org.apache.kafka.consumer.", "org.apache.kafka.client.", "*", "m1")
# Patterns whose fate under java.util.regex.Pattern.compile is known (docs/sandbox.md "Match patterns").
VALID_PATTERNS = ("payments-.*", "app[0-9]+", r"\p{Alpha}+", "(?<name>x)y", "a|b", ".*", r"\Qpay.ments\E")
INVALID_PATTERNS = ("[", "(?P<n>x)", "pay{ments", "(open", "*lead")
VALID_INTERVALS = ("100", "3600000", "60000", "0100", "+5000", " 250 ", "1000")
OUT_OF_RANGE_INTERVALS = ("99", "3600001", "0", "-5", "2147483647")
NOT_INT_INTERVALS = ("soon", "1.5", "", "2147483648", "1e3", "1_000")


class Refused(Exception):
    """What the reference expects instead of success: an error code and key words of its message."""

    def __init__(self, code: int, *words: str) -> None:
        super().__init__(code, words)
        self.code = code
        self.words = words


@dataclass(frozen=True)
class Entry:
    """One described config: key, value as DescribeConfigs shows it, config source."""

    name: str
    value: str
    source: int


def java_split(text: str, separator: str) -> list[str]:
    """String.split(one literal char): trailing empty strings dropped; a text without the separator is kept whole."""
    if separator not in text:
        return [text]
    parts = text.split(separator)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def config_list(key: str, raw: str) -> list[str]:
    """ConfigDef.parseType(LIST) then parseValue: trim, split on \\s*,\\s* keeping empties, drop repeats, refuse ''."""
    trimmed = raw.strip(JAVA_TRIM)
    items = re.split(f"{JAVA_SPACE}*,{JAVA_SPACE}*", trimmed) if trimmed else []
    items = list(dict.fromkeys(items))   # ConfigDef.java:542-544 (distinct, first kept)
    if "" in items:                      # ValidList.anyNonDuplicateValues: ConfigDef.java:1084-1085
        raise Refused(INVALID_CONFIG, key, "must not be empty")
    return items


def config_int(key: str, raw: str) -> int:
    """ConfigDef.parseType(INT): Integer.parseInt of the trimmed text: a sign, then digits of any script that are one
    UTF-16 unit each (Character.digit)."""
    trimmed = raw.strip(JAVA_TRIM)
    body = trimmed[1:] if trimmed[:1] in "+-" and trimmed else trimmed
    if body and all(c.isdecimal() and ord(c) <= 0xFFFF for c in body) and len(body) <= 4000:
        value = int(body) * (-1 if trimmed[:1] == "-" else 1)
        if -2**31 <= value < 2**31:
            return value
    raise Refused(INVALID_CONFIG, key, "Not a number of type INT")


def check_match_entry(entry: str) -> None:
    """ClientMetricsConfigs.parseMatchingPatterns (ClientMetricsConfigs.java:191-217)."""
    parts = java_split(entry, "=")
    if len(parts) != 2 or parts[0].strip(JAVA_TRIM) not in MATCH_KEYS:
        raise Refused(INVALID_CONFIG, "Illegal client matching pattern")
    pattern = parts[1].strip(JAVA_TRIM)
    assert pattern in VALID_PATTERNS + INVALID_PATTERNS, f"the reference does not know pattern {pattern!r}"
    if pattern in INVALID_PATTERNS:
        raise Refused(INVALID_CONFIG, "Illegal client matching pattern")


def validate(name: str, configs: dict[str, str]) -> None:
    """ClientMetricsConfigs.validate (ClientMetricsConfigs.java:143-178), checks in Kafka's order."""
    if not name:
        raise Refused(INVALID_REQUEST, "name", "empty")
    for key in configs:
        if key not in DEFAULTS:
            raise Refused(INVALID_REQUEST, "Unknown client metrics configuration", key)
    # CONFIG.parse: every key in definition order (metrics, interval.ms, match) before the range and pattern checks.
    config_list("metrics", configs.get("metrics", ""))
    interval = config_int("interval.ms", configs["interval.ms"]) if "interval.ms" in configs else 300000
    patterns = config_list("match", configs.get("match", ""))
    if not 100 <= interval <= 3600000:
        raise Refused(INVALID_REQUEST, "interval must be between 100 and 3600000")
    for entry in patterns:
        check_match_entry(entry)


def described_value(key: str, raw: str) -> str:
    """ConfigHelper describes the parsed value converted back to text."""
    if key == "interval.ms":
        return str(config_int(key, raw))
    return ",".join(config_list(key, raw))


class Reference:
    """The subscriptions as Kafka 4.3.1 would hold them: name -> the raw config strings set on it."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, dict[str, str]] = {}
        self.outcomes: collections.Counter[str] = collections.Counter()   # how many resources were applied/refused

    def names(self) -> list[str]:
        return sorted(self.subscriptions)

    def describe(self, name: str, keys: list[str] | None = None) -> list[Entry]:
        if not name:   # ConfigHelper.scala:122-123
            raise Refused(INVALID_REQUEST, "name must not be empty")
        configs = self.subscriptions.get(name, {})
        wanted = keys or DESCRIBE_ORDER   # ConfigHelperUtils.java:79-81: null or empty asks for every key
        return [Entry(key, described_value(key, configs[key]), SOURCE_CLIENT_METRICS) if key in configs
                else Entry(key, DEFAULTS[key], SOURCE_DEFAULT)
                for key in DESCRIBE_ORDER if key in wanted]

    def incremental(self, name: str, ops: list[tuple[str, int, str | None]], validate_only: bool) -> None:
        """ConfigurationControlManager.incrementalAlterConfigResource (ConfigurationControlManager.java:275-338)."""
        current = self.subscriptions.get(name, {})
        updated = dict(current)
        for key, op, value in ops:
            if op == SET:
                updated[key] = value
            elif op == DELETE:
                updated.pop(key, None)
            else:
                if key not in LIST_KEYS:
                    raise Refused(INVALID_CONFIG, "Can't", key, "not LIST")
                parts = [part for part in java_split(current.get(key, DEFAULTS[key]), ",") if part]
                for item in java_split(value, ","):
                    if op == APPEND and item not in parts:
                        parts.append(item)
                    elif op == SUBTRACT and item in parts:
                        parts.remove(item)
                updated[key] = ",".join(parts)
        self._commit(name, updated, validate_only)

    def legacy(self, name: str, pairs: list[tuple[str, str | None]], validate_only: bool) -> None:
        """ConfigAdminManager.preprocess (AlterConfigs) then legacyAlterConfigResource: the pairs replace everything."""
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise Refused(INVALID_REQUEST, "duplicate config keys")
        nulls = [key for key, value in pairs if value is None]
        if nulls:
            raise Refused(INVALID_REQUEST, "Null value not supported", *nulls)
        self._commit(name, dict(pairs), validate_only)

    def _commit(self, name: str, updated: dict[str, str], validate_only: bool) -> None:
        validate(name, updated)
        if validate_only:
            return
        if updated:
            self.subscriptions[name] = updated
        else:   # a subscription with no keys left is gone
            self.subscriptions.pop(name, None)

    def request(self, resources: list[tuple[str, object]], change) -> list[Refused | None]:
        """One alter request: a name repeated is refused for every copy (ConfigAdminManager.scala:106-112)."""
        counts = collections.Counter(name for name, _ in resources)
        outcomes: list[Refused | None] = []
        for name, payload in resources:
            if counts[name] > 1:
                outcomes.append(Refused(INVALID_REQUEST, "Each resource must appear at most once"))
                self.outcomes["refused"] += 1
                continue
            try:
                change(name, payload)
                outcomes.append(None)
                self.outcomes["applied"] += 1
            except Refused as refused:
                outcomes.append(refused)
                self.outcomes["refused"] += 1
        return outcomes


# --- random inputs ----------------------------------------------------------------------------------------------


def list_value(rng: random.Random, make_item) -> str:
    """A comma list with repeats, odd spacing and, now and then, an empty item."""
    items = [make_item(rng) for _ in range(rng.randint(1, 3))]
    text = rng.choices((",", ", ", " ,\t"), weights=(6, 3, 1))[0].join(items)   # APPEND/SUBTRACT split on bare ","
    roll = rng.random()
    if roll < 0.06:
        text += ","
    elif roll < 0.12:
        text = f"{text},,{items[0]}"
    elif roll < 0.2:
        text = f" {text}\t"
    return text


def match_entry(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.72:
        return f"{rng.choice(MATCH_KEYS)}={rng.choice(VALID_PATTERNS)}"
    if roll < 0.8:
        return f"{rng.choice(MATCH_KEYS)} = {rng.choice(VALID_PATTERNS)}"
    if roll < 0.88:
        return f"{rng.choice(MATCH_KEYS)}={rng.choice(INVALID_PATTERNS)}"
    if roll < 0.94:
        return f"client_colour={rng.choice(VALID_PATTERNS)}"
    return rng.choice(("client_id", "client_id=", "=x", "client_id=a=b"))


def metric_item(rng: random.Random) -> str:
    """Often the same item, so lists hold repeats that APPEND skips and SUBTRACT removes one at a time."""
    return "m1" if rng.random() < 0.4 else rng.choice(METRIC_ITEMS)


def interval_value(rng: random.Random) -> str:
    roll = rng.random()
    pool = VALID_INTERVALS if roll < 0.7 else OUT_OF_RANGE_INTERVALS if roll < 0.85 else NOT_INT_INTERVALS
    return rng.choice(pool)


def value_for(rng: random.Random, key: str) -> str:
    if key == "metrics":
        return list_value(rng, metric_item)
    if key == "match":
        return list_value(rng, match_entry)
    if key == "interval.ms":
        return interval_value(rng)
    return rng.choice(("1000", "x"))


def random_keys(rng: random.Random) -> list[str]:
    keys = rng.sample(tuple(DEFAULTS), rng.randint(1, 3))
    if rng.random() < 0.1:
        keys[rng.randrange(len(keys))] = rng.choice(UNKNOWN_KEYS)
    return keys


def random_ops(rng: random.Random) -> list[tuple[str, int, str | None]]:
    ops = []
    for key in random_keys(rng):
        weights = (45, 20, 20, 15) if key in LIST_KEYS else (70, 24, 3, 3)   # APPEND to an INT key is refused
        op = rng.choices((SET, DELETE, APPEND, SUBTRACT), weights=weights)[0]
        value = None if op == DELETE else "" if rng.random() < 0.04 else value_for(rng, key)
        ops.append((key, op, value))
    return ops


def random_names(rng: random.Random) -> list[str]:
    names = rng.sample(NAMES, rng.randint(1, 2))
    if rng.random() < 0.06:
        names.append("")
    if rng.random() < 0.08:
        names.append(rng.choice(names))
    rng.shuffle(names)
    return names


# --- the sandbox, through its clients -----------------------------------------------------------------------------


@pytest.fixture
def admin(sandbox) -> KafkaAdminClient:
    client = KafkaAdminClient(bootstrap_servers=sandbox.bootstrap, request_timeout_ms=5000)
    yield client
    client.close()


def resource(name: str, configs=None) -> ConfigResource:
    return ConfigResource(ConfigResourceType.CLIENT_METRICS, name, configs=configs)


def assert_admin_outcomes(answer: dict, names: list[str], expected: list[Refused | None], context: str) -> None:
    """kafka-python's {type: {name: 'OK' | '[Error N] Name: message'}} against the reference's outcomes."""
    by_name: dict[str, Refused | None] = {}
    for name, outcome in zip(names, expected):
        by_name.setdefault(name, outcome)
        assert type(by_name[name]) is type(outcome), context   # every copy of a name gets the same answer
    assert set(answer) == {"client_metrics"} and set(answer["client_metrics"]) == set(by_name), context
    for name, outcome in by_name.items():
        text = answer["client_metrics"][name]
        if outcome is None:
            assert text == "OK", f"{context}: {name!r} -> {text}"
        else:
            assert text.startswith(f"[Error {outcome.code}] {ERROR_NAMES[outcome.code]}: "), \
                f"{context}: {name!r} -> {text}, expected {outcome.code} {outcome.words}"
            assert all(word in text for word in outcome.words), f"{context}: {name!r} -> {text}, {outcome.words}"


def assert_raw_outcomes(results: list, names: list[str], expected: list[Refused | None], context: str) -> None:
    """Per-resource answers of a raw alter request, in request order."""
    assert [(r.resource_type, r.resource_name) for r in results] == [(CLIENT_METRICS, n) for n in names], context
    for result, outcome in zip(results, expected):
        if outcome is None:
            assert (result.error_code, result.error_message) == (0, None), f"{context}: {result}"
        else:
            assert result.error_code == outcome.code, f"{context}: {result}, expected {outcome.code} {outcome.words}"
            assert all(word in result.error_message for word in outcome.words), f"{context}: {result}"


def admin_view(entries: list[Entry]) -> dict:
    return {entry.name: {"value": entry.value, "read_only": False, "config_source": SOURCE_NAMES[entry.source],
                         "is_sensitive": False, "synonyms": [], "config_type": TYPE_NAMES[TYPES[entry.name]],
                         "documentation": None}
            for entry in entries}


def assert_state(admin: KafkaAdminClient, reference: Reference, context: str) -> None:
    """Every name described (all keys, in Kafka's order) and the listed names, as the reference holds them."""
    described = admin.describe_configs([resource(name) for name in NAMES], config_filter="all")
    expected = {name: admin_view(reference.describe(name)) for name in NAMES}
    assert described == {"client_metrics": expected}, context
    for name in NAMES:
        assert list(described["client_metrics"][name]) == list(DESCRIBE_ORDER), context
    listed = admin.list_config_resources()
    assert {kind: sorted(names) for kind, names in listed.items()} == (
        {"client_metrics": reference.names()} if reference.names() else {}), context
    assert all(len(names) == len(set(names)) for names in listed.values()), context


class Driver:
    """One random step at a time, on the sandbox and on the reference."""

    def __init__(self, admin: KafkaAdminClient, connection: KafkaConnection, rng: random.Random) -> None:
        self.admin = admin
        self.connection = connection
        self.rng = rng
        self.reference = Reference()

    def step(self, context: str) -> str:
        kind = self.rng.choices(("incremental", "legacy-admin", "legacy-raw", "describe", "list-raw"),
                                weights=(50, 15, 15, 14, 6))[0]
        getattr(self, kind.replace("-", "_"))(f"{context} {kind}")
        return kind

    def incremental(self, context: str) -> None:
        names = random_names(self.rng)
        resources = [(name, random_ops(self.rng)) for name in names]
        validate_only = self.rng.random() < 0.2
        context = f"{context} validate_only={validate_only} {resources}"
        expected = self.reference.request(
            resources, lambda name, ops: self.reference.incremental(name, ops, validate_only))
        answer = self.admin.alter_configs(
            [resource(name, {key: (op, value) for key, op, value in ops}) for name, ops in resources],
            validate_only=validate_only, raise_on_unknown=False, incremental=True)
        assert_admin_outcomes(answer, names, expected, context)

    def legacy_admin(self, context: str) -> None:
        """kafka-python's AlterConfigs: it first reads the modified keys back and re-sends those not given."""
        names = random_names(self.rng)
        given = [(name, {key: value_for(self.rng, key) for key in random_keys(self.rng)}) for name in names]
        validate_only = self.rng.random() < 0.2
        context = f"{context} validate_only={validate_only} {given}"

        def sent(name: str, configs: dict[str, str]) -> list[tuple[str, str]]:
            kept = {} if not name else {entry.name: entry.value for entry in self.reference.describe(name)
                                        if entry.source == SOURCE_CLIENT_METRICS and entry.name not in configs}
            return list(configs.items()) + list(kept.items())

        expected = self.reference.request(
            [(name, sent(name, configs)) for name, configs in given],
            lambda name, pairs: self.reference.legacy(name, pairs, validate_only))
        answer = self.admin.alter_configs([resource(name, dict(configs)) for name, configs in given],
                                          validate_only=validate_only, raise_on_unknown=False, incremental=False)
        assert_admin_outcomes(answer, names, expected, context)

    def legacy_raw(self, context: str) -> None:
        """AlterConfigs v2 as Kafka's own tools send it: the pairs given replace every config of the resource."""
        names = random_names(self.rng)
        resources = []
        for name in names:
            pairs: list[tuple[str, str | None]] = [(key, value_for(self.rng, key)) for key in random_keys(self.rng)]
            if self.rng.random() < 0.1:
                pairs = []
            elif self.rng.random() < 0.06:
                pairs.append((pairs[0][0], value_for(self.rng, pairs[0][0])))
            elif self.rng.random() < 0.05:
                pairs[0] = (pairs[0][0], None)
            resources.append((name, pairs))
        validate_only = self.rng.random() < 0.2
        context = f"{context} validate_only={validate_only} {resources}"
        expected = self.reference.request(
            resources, lambda name, pairs: self.reference.legacy(name, pairs, validate_only))
        request = AlterConfigsRequest[2](resources=[(CLIENT_METRICS, name, pairs) for name, pairs in resources],
                                         validate_only=validate_only)
        results = self.connection.call(request, AlterConfigsResponse).responses
        assert_raw_outcomes(results, names, expected, context)

    def describe(self, context: str) -> None:
        """DescribeConfigs v4 on the wire: error codes the admin client drops, key filters, repeats, docs, synonyms."""
        names = random_names(self.rng)
        resources = [(name, self.rng.choice((None, [], ["metrics"], ["interval.ms", "nope"], ["match", "metrics"])))
                     for name in names]
        synonyms, documentation = self.rng.random() < 0.5, self.rng.random() < 0.5
        context = f"{context} {resources} synonyms={synonyms} documentation={documentation}"
        request = DescribeConfigsRequest[4](resources=[(CLIENT_METRICS, name, keys) for name, keys in resources],
                                            include_synonyms=synonyms, include_documentation=documentation)
        results = self.connection.call(request, DescribeConfigsResponse).results
        assert [(r.resource_type, r.resource_name) for r in results] == [(CLIENT_METRICS, n) for n in names], context
        for (name, keys), result in zip(resources, results):
            try:
                entries = self.reference.describe(name, keys)
            except Refused as refused:
                assert (result.error_code, result.configs) == (refused.code, []), f"{context}: {result}"
                assert all(word in result.error_message for word in refused.words), f"{context}: {result}"
                continue
            assert (result.error_code, result.error_message) == (0, None), f"{context}: {result}"
            # ConfigHelper lists a set key as its own synonym; documentation only when asked.
            expected = [(e.name, e.value, e.source, False, False, TYPES[e.name],
                         DOCUMENTATION[e.name] if documentation else None,
                         [(e.name, e.value, e.source)] if synonyms and e.source == SOURCE_CLIENT_METRICS else [])
                        for e in entries]
            assert [(c.name, c.value, c.config_source, c.read_only, c.is_sensitive, c.config_type, c.documentation,
                     [(s.name, s.value, s.source) for s in c.synonyms]) for c in result.configs] == expected, \
                f"{context}: {result}"

    def list_raw(self, context: str) -> None:
        """ListConfigResources v0 (ListClientMetricsResources) and v1 asking for CLIENT_METRICS or for no type."""
        version = self.rng.choice((0, 1))
        fields = {"resource_types": self.rng.choice(([], [CLIENT_METRICS]))} if version else {}
        response = self.connection.call(ListConfigResourcesRequest[version](**fields), ListConfigResourcesResponse)
        assert response.error_code == 0, context
        assert sorted((r.resource_name, r.resource_type) for r in response.config_resources) == [
            (name, CLIENT_METRICS) for name in self.reference.names()], context


@pytest.mark.parametrize("seed", SEEDS)
def test_random_config_sequences_answer_as_kafka_4_3_1_does(sandbox, admin, seed):
    rng = random.Random(seed)
    with KafkaConnection(sandbox.bootstrap) as connection:
        driver = Driver(admin, connection, rng)
        kinds = collections.Counter()
        for index in range(STEPS):
            context = f"seed {seed} step {index}"
            kinds[driver.step(context)] += 1
            assert_state(admin, driver.reference, context)
    # The sequence exercised what it is for: every kind of step, and changes both applied and refused.
    assert set(kinds) >= {"incremental", "legacy-admin", "legacy-raw", "describe"}
    assert driver.reference.outcomes["applied"] >= 5 and driver.reference.outcomes["refused"] >= 5


# --- directed edges the random walk reaches rarely ---------------------------------------------------------------


def test_a_resource_named_three_times_is_refused_for_every_copy_beside_one_that_is_applied(sandbox):
    resources = [("trio", [("metrics", SET, "a")]), ("solo", [("interval.ms", SET, "1000")]),
                 ("trio", [("metrics", SET, "b")]), ("trio", [("interval.ms", SET, "2000")])]
    reference = Reference()
    expected = reference.request(resources, lambda name, ops: reference.incremental(name, ops, False))
    request = IncrementalAlterConfigsRequest[1](
        resources=[(CLIENT_METRICS, name, ops) for name, ops in resources], validate_only=False)
    with KafkaConnection(sandbox.bootstrap) as connection:
        results = connection.call(request, IncrementalAlterConfigsResponse).responses
        listed = connection.call(ListConfigResourcesRequest[0](), ListConfigResourcesResponse).config_resources

    assert_raw_outcomes(results, [name for name, _ in resources], expected, "three copies")
    assert [r.resource_name for r in listed] == reference.names() == ["solo"]


def test_describe_with_an_empty_key_list_answers_every_key(admin):
    """ConfigHelperUtils.java:79-81: an empty configurationKeys list asks for everything (kafka-python's own
    docstring says it gets nothing)."""
    assert admin.alter_configs([resource("payments", {"metrics": "m1"})], raise_on_unknown=False,
                               incremental=True) == {"client_metrics": {"payments": "OK"}}
    reference = Reference()
    reference.incremental("payments", [("metrics", SET, "m1")], False)

    answer = admin.describe_configs([resource("payments", {})], config_filter="all")

    assert answer == {"client_metrics": {"payments": admin_view(reference.describe("payments", []))}}
    assert list(answer["client_metrics"]["payments"]) == list(DESCRIBE_ORDER)


def test_append_to_a_key_that_is_no_list_is_invalid_config_even_when_the_key_is_unknown(admin):
    """ConfigurationControlManager.java:301-306: isSplittable is false for INT keys and for keys with no schema,
    so the APPEND is INVALID_CONFIG before validation could call the key unknown (INVALID_REQUEST)."""
    for key in ("interval.ms", "push.interval"):
        for op in ("APPEND", "SUBTRACT"):
            answer = admin.alter_configs([resource("payments", {key: (op, "1000")})], raise_on_unknown=False,
                                         incremental=True)
            assert_admin_outcomes(answer, ["payments"], [Refused(INVALID_CONFIG, f"Can't {op}", key, "not LIST")],
                                  f"{op} {key}")
    assert admin.list_config_resources() == {}


def test_append_and_subtract_work_on_the_stored_text_one_item_at_a_time(admin):
    """ConfigurationControlManager.java:308-320: the stored text is split on commas (repeats kept), APPEND skips an
    item already there, SUBTRACT removes its first copy; DescribeConfigs then shows the parsed list, repeats dropped."""
    reference = Reference()
    steps = [("metrics", SET, "m1,x,m1"), ("metrics", SUBTRACT, "m1"), ("metrics", APPEND, "y,y,m1"),
             ("metrics", SUBTRACT, "m1"), ("metrics", SUBTRACT, "m1"), ("metrics", APPEND, "x"),
             ("match", APPEND, "client_id=a|b,client_id=a|b"), ("match", SUBTRACT, "client_id=a|b")]
    for key, op, value in steps:
        reference.incremental("lists", [(key, op, value)], False)
        answer = admin.alter_configs([resource("lists", {key: (op, value)})], raise_on_unknown=False,
                                     incremental=True)
        assert answer == {"client_metrics": {"lists": "OK"}}, (key, op, value)
        described = admin.describe_configs([resource("lists")], config_filter="all")
        assert described == {"client_metrics": {"lists": admin_view(reference.describe("lists"))}}, (key, op, value)


@pytest.mark.parametrize("length, code", [
    (MAX_VALUE_CHARS, 0),
    # Kafka 4.3.1 refuses a changed value longer than Short.MAX_VALUE (ConfigurationControlManager.java:367-370,
    # KAFKA-18907).
    (MAX_VALUE_CHARS + 1, INVALID_CONFIG),
])
def test_a_config_value_longer_than_short_max_value_is_refused_as_kafkas_controller_does(admin, length, code):
    for name, ops in (("set", {"metrics": "m" * length}),
                      ("appended", {"metrics": ("APPEND", "m" * (length - 3))})):
        if name == "appended":   # "m1" is there already: "m1," and the item make the value `length` chars long
            assert admin.alter_configs([resource(name, {"metrics": "m1"})], raise_on_unknown=False,
                                       incremental=True) == {"client_metrics": {name: "OK"}}
        answer = admin.alter_configs([resource(name, ops)], raise_on_unknown=False, incremental=True)
        expected = None if code == 0 else Refused(code, "exceeds the maximum value size")
        assert_admin_outcomes(answer, [name], [expected], f"{name} {length}")


# Kafka reads interval.ms with Integer.parseInt (ConfigDef.java:738), which takes any Unicode decimal digit.
def test_an_interval_written_in_non_ascii_digits_is_read_as_java_reads_it(admin):
    answer = admin.alter_configs([resource("payments", {"interval.ms": "\u0661\u0660\u0660\u0660"})],
                                 raise_on_unknown=False, incremental=True)

    assert answer == {"client_metrics": {"payments": "OK"}}
    described = admin.describe_configs([resource("payments", ["interval.ms"])])
    assert described["client_metrics"]["payments"]["interval.ms"]["value"] == "1000"
