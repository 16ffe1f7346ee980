"""Seeded random records, header sets and enrichment settings through the bridge's byte-level enrichment, each result
parsed back and compared with a reference that decodes the record and edits it with the protobuf API as
docs/bridge.md describes: contract headers, then static attributes, then the rules in order, keys kept unique."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest
from google.protobuf import text_format
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (AGGREGATION_TEMPORALITY_CUMULATIVE,
                                                        AGGREGATION_TEMPORALITY_DELTA, MetricsData, ResourceMetrics,
                                                        ScopeMetrics)

from kcm_bridge import config
from kcm_bridge.config import AttributeRule, ConfigError, EnrichConfig
from kcm_bridge.enrich import Enricher
from kcm_common.names import ATTRIBUTE_HEADERS

CASES = 2000
# Names a client's resource, the static attributes and the rules draw from, so that they collide often.
OTHER_NAMES = ("host.name", "service.name", "kafka.cluster.name", "pod", "pod.hash", "k", "ünïcödé.名前", "emoji🙂")
SALTS = ({"salt": "pepper"}, {"salt": "ß🙂 "}, {"salt_file": "plain"}, {"salt_file": "spaced"})
SALT_FILES = {"plain": b"from-a-file", "spaced": b" \t\xc3\x9f file salt\r\n"}
SCHEMA_URL = "https://opentelemetry.io/schemas/1.26.0"
# Field numbers no OTLP message here uses, and the known LEN fields a hand-written encoder might send as numbers
# (protobuf keeps both as unknown fields).
UNKNOWN_NUMBERS = (4, 9, 15, 16, 100, 2047, 2**29 - 1)
WRONG_TYPE_NUMBERS = {"MetricsData": (1,), "ResourceMetrics": (1, 2, 3), "Resource": (1, 3), "KeyValue": (1, 2)}


class Case(NamedTuple):
    seed: int
    settings: dict          # the `enrich` section as a user would write it
    enrich: EnrichConfig    # as config.load built and validated it
    headers: dict[str, str]
    record: bytes           # the MetricsData as the client's bytes
    scope_fields: list[bytes]   # each ScopeMetrics field of the record, tag and length included, in order
    enriched: bytes

    def where(self) -> str:
        return f"seed {self.seed}: enrich {self.settings}, headers {self.headers}"


# -- random input ---------------------------------------------------------------------------------------------------

def _text(rng: random.Random) -> str:
    length = rng.choice([0, 1, 3, 8, 20]) if rng.random() < 0.9 else rng.randint(100, 300)
    alphabet = rng.choice(["abcxyz-.:0123456789", "äßéøÅ", "名前値", "🙂🚀", "abc名🙂 "])
    return "".join(rng.choice(alphabet) for _ in range(length))


def _any_value(rng: random.Random, names: list[str], depth: int = 0) -> AnyValue:
    kinds = ["string", "string", "bool", "int", "double", "bytes", "unset"] + (["array", "kvlist"] if depth < 2 else [])
    kind, value = rng.choice(kinds), AnyValue()
    if kind == "string":
        value.string_value = _text(rng)
    elif kind == "bool":
        value.bool_value = rng.random() < 0.5
    elif kind == "int":
        value.int_value = rng.choice([0, 7, -1, 2**63 - 1, -2**63, rng.randrange(-10**12, 10**12)])
    elif kind == "double":
        value.double_value = rng.choice([0.0, -0.0, 0.5, 1 / 3, 1e16, 1e-7, float("inf"), float("-inf"), float("nan"),
                                         rng.uniform(-1e6, 1e6)])
    elif kind == "bytes":
        value.bytes_value = rng.randbytes(rng.choice([0, 1, 16]))
    elif kind == "array":
        value.array_value.SetInParent()
        value.array_value.values.extend(_any_value(rng, names, depth + 1) for _ in range(rng.randint(0, 3)))
    elif kind == "kvlist":
        value.kvlist_value.SetInParent()
        value.kvlist_value.values.extend(_attributes(rng, names, 3, depth + 1))
    return value


def _attributes(rng: random.Random, names: list[str], most: int, depth: int = 0) -> list[KeyValue]:
    """Keys drawn from `names`, so repeats happen; some without a value at all."""
    return [KeyValue(key=rng.choice(names)) if rng.random() < 0.1 else
            KeyValue(key=rng.choice(names), value=_any_value(rng, names, depth)) for _ in range(rng.randint(0, most))]


def _scope_metrics(rng: random.Random, names: list[str]) -> ScopeMetrics:
    """Every kind of metric, with scope and point attributes named like the resource's: rules must not touch them."""
    scope = ScopeMetrics(schema_url=rng.choice(["", SCHEMA_URL]))
    if rng.random() < 0.8:
        scope.scope.name, scope.scope.version = _text(rng), rng.choice(["", "2.3.0"])
        scope.scope.attributes.extend(_attributes(rng, names, 2))
    if rng.random() < 0.01:   # a record of more than 66 KB, whose walk enrichment counts
        scope.scope.name = "n" * 70_000
    for _ in range(rng.randint(0, 3)):
        metric = scope.metrics.add(name=rng.choice(["org.apache.kafka.producer.record.send.total", _text(rng)]),
                                   unit=rng.choice(["", "ms", "{record}"]), description=_text(rng))
        kind = rng.choice(["gauge", "sum", "histogram", "exponential_histogram", "summary", "none"])
        for _ in range(rng.randint(0, 3) if kind != "none" else 0):
            time = 1_700_000_000 * 10**9 + rng.randrange(10**12)
            if kind in ("gauge", "sum"):
                point = getattr(metric, kind).data_points.add(time_unix_nano=time, start_time_unix_nano=time - 10**9)
                if rng.random() < 0.5:
                    point.as_int = rng.randrange(-2**63, 2**63)
                else:
                    point.as_double = rng.choice([0.25, float("nan"), -1e300])
                if rng.random() < 0.2:
                    point.exemplars.add(time_unix_nano=time, as_double=1.5, trace_id=rng.randbytes(16))
            elif kind == "histogram":
                point = metric.histogram.data_points.add(time_unix_nano=time, count=3, sum=4.5,
                                                         bucket_counts=[1, 2, 0], explicit_bounds=[1.0, 10.0])
            elif kind == "exponential_histogram":
                point = metric.exponential_histogram.data_points.add(time_unix_nano=time, scale=-2, count=2,
                                                                     zero_count=1)
                point.positive.offset, point.positive.bucket_counts[:] = -3, [1, 0, 1]
            else:
                point = metric.summary.data_points.add(time_unix_nano=time, count=2, sum=3.0)
                point.quantile_values.add(quantile=0.5, value=1.0)
            point.attributes.extend(_attributes(rng, names, 2))
        if kind == "sum":
            metric.sum.aggregation_temporality = rng.choice([AGGREGATION_TEMPORALITY_DELTA,
                                                             AGGREGATION_TEMPORALITY_CUMULATIVE])
            metric.sum.is_monotonic = rng.random() < 0.5
        if rng.random() < 0.1:
            metric.metadata.extend(_attributes(rng, names, 2))
    return scope


def _resource_metrics(rng: random.Random, names: list[str]) -> ResourceMetrics:
    resource_metrics = ResourceMetrics(schema_url=rng.choice(["", "", SCHEMA_URL]))
    shape = rng.choice(["none", "empty", "attributes", "attributes", "attributes"])
    if shape != "none":
        resource_metrics.resource.SetInParent()
    if shape == "attributes":
        resource_metrics.resource.attributes.extend(_attributes(rng, names, 7))
    if rng.random() < 0.15:
        resource_metrics.resource.dropped_attributes_count = rng.randint(1, 300)
    if rng.random() < 0.1:
        resource_metrics.resource.entity_refs.add(type="k8s.pod", id_keys=["k8s.pod.uid"], schema_url=SCHEMA_URL)
    resource_metrics.scope_metrics.extend(_scope_metrics(rng, names) for _ in range(rng.choice([0, 1, 1, 2, 3])))
    return resource_metrics


def _enrich_settings(rng: random.Random, salt_dir: Path) -> dict:
    """An `enrich` section: rules aim at headers, static attributes, the client's names and each other's targets."""
    static = {rng.choice([*ATTRIBUTE_HEADERS, *OTHER_NAMES]): _text(rng) for _ in range(rng.choice([0, 0, 1, 2, 3]))}
    named = [*static, *rng.sample(ATTRIBUTE_HEADERS, 3), *OTHER_NAMES]
    rules = []
    for _ in range(rng.choice([0, 1, 2, 3, 3, 5])):
        rule = {"action": rng.choice(["drop", "rename", "rename", "hash", "hash"]), "attribute": rng.choice(named)}
        if rule["action"] == "rename":
            rule["to"] = rng.choice(named + [_text(rng) or "x"])
            named.append(rule["to"])
        elif rule["action"] == "hash":
            salt = rng.choice(SALTS)
            rule.update({"salt_file": str(salt_dir / salt["salt_file"])} if "salt_file" in salt else salt)
        rules.append(rule)
    return {"header_attributes": rng.random() < 0.7, "static_attributes": static, "rules": rules}


def _loaded(settings: dict) -> EnrichConfig:
    return config.load(env={}, overrides={("kafka", "bootstrap_servers"): "localhost:9092", ("enrich",): settings},
                       endpoints=["localhost:4317"], insecure=True).enrich


# -- the record's bytes, written here so that the check shares no code with enrich.py and wire.py -----------------

def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _len_field(number: int, payload: bytes, overlong: bool = False) -> bytes:
    """A LEN field; `overlong`: its length in one byte more than it needs (protobuf reads it the same)."""
    length = _varint(len(payload))
    return _varint(number << 3 | 2) + (bytes(b | 0x80 for b in length) + b"\0" if overlong else length) + payload


def _unknown_field(rng: random.Random, message: str) -> bytes:
    """A field protobuf keeps as unknown: a number the message does not use, or a known one of another wire type.
    Not a group (wire types 3 and 4): protobuf reads one, but enrichment refuses the record."""
    if rng.random() < 0.3:
        number, wire_type = rng.choice(WRONG_TYPE_NUMBERS[message]), rng.choice([0, 1, 5])
    else:
        number, wire_type = rng.choice(UNKNOWN_NUMBERS), rng.choice([0, 1, 2, 5])
    tag = _varint(number << 3 | wire_type)
    if wire_type == 0:
        return tag + _varint(rng.choice([0, 1, 300, 2**64 - 1]))
    if wire_type == 2:
        return _len_field(number, rng.randbytes(rng.choice([0, 3, 130])))
    return tag + rng.randbytes(8 if wire_type == 1 else 4)


def _key_value_bytes(rng: random.Random, attribute: KeyValue, names: list[str], odd: bool) -> bytes:
    parts = [_len_field(1, attribute.key.encode())]
    if attribute.HasField("value"):
        parts.append(_len_field(2, attribute.value.SerializeToString()))
    if odd:
        form = rng.choice(["value first", "unknown field", "key twice", "overlong"])
        if form == "overlong":
            parts[0] = _len_field(1, attribute.key.encode(), overlong=True)
        elif form == "value first":
            parts.reverse()
        elif form == "unknown field":
            parts.insert(rng.randint(0, len(parts)), _unknown_field(rng, "KeyValue"))
        else:   # the last occurrence of a scalar field is its value
            parts.insert(0, _len_field(1, rng.choice(names).encode()))
    # Not a value given twice: protobuf merges the two, while a rule renaming or hashing it sees only the last.
    return b"".join(parts)


def _record_bytes(rng: random.Random, data: MetricsData, names: list[str]) -> tuple[bytes, list[bytes]]:
    """`data` encoded, with some ResourceMetrics written oddly yet validly: fields out of order, the resource split
    into several fields (protobuf merges them), unknown fields, overlong lengths; and the ScopeMetrics fields, in
    order."""
    fields, scope_fields = [], []
    for resource_metrics in data.resource_metrics:
        odd = rng.random() < 0.4
        resource = resource_metrics.resource
        inner = [_len_field(1, _key_value_bytes(rng, a, names, odd and rng.random() < 0.3))
                 for a in resource.attributes]
        if resource.dropped_attributes_count:
            inner.append(_varint(2 << 3) + _varint(resource.dropped_attributes_count))
        inner += [_len_field(3, ref.SerializeToString()) for ref in resource.entity_refs]
        items = [("scope", _len_field(2, scope.SerializeToString())) for scope in resource_metrics.scope_metrics]
        if resource_metrics.schema_url:
            items.append(("schema_url", _len_field(3, resource_metrics.schema_url.encode())))
        if not odd:
            if resource_metrics.HasField("resource"):
                items.insert(0, ("resource", _len_field(1, b"".join(inner))))
        else:
            for _ in range(rng.choice([0, 0, 1, 2])):
                inner.insert(rng.randint(0, len(inner)), _unknown_field(rng, "Resource"))
            cuts = sorted(rng.sample(range(len(inner) + 1), min(len(inner) + 1, rng.choice([0, 1, 2]))))
            bounds = [0, *cuts, len(inner)]
            items += [("resource", _len_field(1, b"".join(inner[a:b]), overlong=rng.random() < 0.2))
                      for a, b in zip(bounds, bounds[1:])]
            items += [("unknown", _unknown_field(rng, "ResourceMetrics")) for _ in range(rng.choice([0, 1, 2]))]
            rng.shuffle(items)
        body = b"".join(encoded for _, encoded in items)
        scope_fields += [encoded for kind, encoded in items if kind == "scope"]
        fields.append(_len_field(1, body, overlong=odd and rng.random() < 0.2))
    if rng.random() < 0.1:
        fields.insert(rng.randint(0, len(fields)), _unknown_field(rng, "MetricsData"))
    return b"".join(fields), scope_fields


def make_case(seed: int, salt_dir: Path) -> Case:
    rng = random.Random(seed)
    for _ in range(20):
        settings = _enrich_settings(rng, salt_dir)
        try:
            enrich = _loaded(settings)
            break
        except ConfigError:   # the start refuses it (two renames to one name, ...): a bridge never runs with it
            continue
    else:
        pytest.fail(f"seed {seed}: the start refused 20 random enrich sections in a row; the cases need new rules")
    count = rng.choice([0, 1, 4, len(ATTRIBUTE_HEADERS)])
    headers = {name: _text(rng) for name in rng.sample(ATTRIBUTE_HEADERS, count)}
    names = [*headers, *enrich.static_attributes, *(r.attribute for r in enrich.rules),
             *(r.to for r in enrich.rules if r.to), *OTHER_NAMES, ""]
    data = MetricsData()
    data.resource_metrics.extend(_resource_metrics(rng, names) for _ in range(rng.choice([0, 1, 1, 1, 2, 4])))
    record, scope_fields = _record_bytes(rng, data, names)
    try:
        enriched = Enricher(enrich).enrich(record, headers)
    except Exception as err:   # a valid record, small enough: nothing may refuse it
        raise AssertionError(f"seed {seed}: enriching the record raised {err!r}") from err
    return Case(seed, settings, enrich, headers, record, scope_fields, enriched)


# -- the reference: docs/bridge.md, "Enrichment", on decoded messages ----------------------------------------------

def _salt(rule: AttributeRule) -> bytes:
    return Path(rule.salt_file).read_bytes().strip() if rule.salt_file else rule.salt.encode()


def _text_of(value: AnyValue) -> str:
    """What a hash rule hashes: a string as it is, other scalars as text, bytes/arrays/maps as their encoding's hex."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind in ("int_value", "double_value"):
        return str(getattr(value, kind))
    return value.SerializeToString().hex()


def _after_rules(attribute: KeyValue, rules: list[AttributeRule], seen: Counter) -> KeyValue | None:
    """Each rule in order on the name the ones before left; None when dropped."""
    key, value, hashed = attribute.key, attribute.value, False
    for rule in rules:
        if rule.attribute != key:
            continue
        seen[rule.action] += 1
        if rule.action == "drop":
            return None
        if rule.action == "rename":
            key = rule.to
        else:
            seen[f"hash {value.WhichOneof('value') or 'unset'}"] += 1
            value = AnyValue(string_value=hashlib.sha256(_salt(rule) + _text_of(value).encode()).hexdigest())
            hashed = True
    if key == attribute.key and not hashed:
        return attribute
    return KeyValue(key=key, value=value)


def documented(case: Case, seen: Counter) -> MetricsData:
    """The record as docs/bridge.md says enrichment leaves it."""
    enrich = case.enrich
    added = {**(case.headers if enrich.header_attributes else {}), **enrich.static_attributes}
    seen["static over header"] += bool(enrich.header_attributes and set(case.headers) & set(enrich.static_attributes))
    added_after = {}
    for key, text in added.items():
        attribute = _after_rules(KeyValue(key=key, value=AnyValue(string_value=text)), enrich.rules, seen)
        if attribute is not None:
            added_after[attribute.key] = attribute
    expected = MetricsData.FromString(case.record)
    for resource_metrics in expected.resource_metrics:
        own = []
        for attribute in resource_metrics.resource.attributes:
            if attribute.key in added:
                seen["added replaces the client's"] += 1
                continue
            after = _after_rules(attribute, enrich.rules, seen)
            if after is not None:
                own.append((after, after.key != attribute.key))
        # Keys stay unique: a renamed attribute (or an added one) replaces the client's own of its new name.
        renamed = {attribute.key for attribute, was_renamed in own if was_renamed}
        kept = [attribute for attribute, was_renamed in own
                if attribute.key not in added_after and (was_renamed or attribute.key not in renamed)]
        seen["renamed replaces the client's"] += len(own) - len(kept)
        del resource_metrics.resource.attributes[:]
        resource_metrics.resource.attributes.extend(kept + list(added_after.values()))
    return expected


def _comparable(data: MetricsData) -> MetricsData:
    """Attribute order is not promised, nor whether an empty resource or value is written at all."""
    copy = MetricsData()
    copy.CopyFrom(data)
    for resource_metrics in copy.resource_metrics:
        attributes = resource_metrics.resource.attributes
        for attribute in attributes:
            attribute.value.SetInParent()
        ordered = [KeyValue.FromString(a.SerializeToString())
                   for a in sorted(attributes, key=lambda a: (a.key, a.SerializeToString()))]
        del attributes[:]
        attributes.extend(ordered)
    return copy


def _resources(data: MetricsData) -> str:
    return "\n".join(text_format.MessageToString(rm.resource, as_utf8=True, as_one_line=True)
                     for rm in data.resource_metrics)


def _record(case: Case) -> str:
    return f"\nrecord   {case.record.hex()}" if len(case.record) <= 512 else ""


def _parsed(case: Case) -> MetricsData:
    try:
        return MetricsData.FromString(case.enriched)
    except Exception as err:
        pytest.fail(f"{case.where()}: the enriched record does not parse ({err}){_record(case)}")


def check_attributes(case: Case, seen: Counter) -> None:
    expected, actual = _comparable(documented(case, seen)), _comparable(_parsed(case))
    assert actual == expected, (f"{case.where()}: resource attributes differ from the documented ones{_record(case)}"
                                f"\nexpected {_resources(expected)}\ngot      {_resources(actual)}")


def check_rest_untouched(case: Case) -> None:
    original, actual = MetricsData.FromString(case.record), _parsed(case)
    for data in (original, actual):
        for resource_metrics in data.resource_metrics:
            resource_metrics.resource.SetInParent()
            del resource_metrics.resource.attributes[:]
    assert actual == original, f"{case.where()}: more than resource attributes changed{_record(case)}"


def check_scopes_copied_as_bytes(case: Case) -> None:
    position = 0
    for index, scope_field in enumerate(case.scope_fields):
        found = case.enriched.find(scope_field, position)
        assert found >= 0, f"{case.where()}: ScopeMetrics field {index} not copied as its bytes, in order"
        position = found + len(scope_field)


# -- the tests ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    salt_dir = tmp_path_factory.mktemp("salts")
    for name, content in SALT_FILES.items():
        (salt_dir / name).write_bytes(content)
    return [make_case(seed, salt_dir) for seed in range(CASES)]


def test_every_resource_carries_headers_static_attributes_and_the_rules_outcome_as_documented(cases):
    seen: Counter = Counter()
    for case in cases:
        check_attributes(case, seen)
    # The random cases reach each documented situation, or the comparison above proves little.
    situations = ["drop", "rename", "hash", "hash string_value", "hash int_value", "hash double_value",
                  "hash bool_value", "hash bytes_value", "hash array_value", "hash kvlist_value", "hash unset",
                  "static over header", "added replaces the client's", "renamed replaces the client's"]
    assert not [s for s in situations if seen[s] < 5], seen


def test_everything_but_resource_attributes_is_left_as_it_came(cases):
    for case in cases:
        check_rest_untouched(case)


def test_scopes_metrics_and_points_are_copied_as_their_bytes(cases):
    assert sum(len(case.scope_fields) for case in cases) > CASES
    for case in cases:
        check_scopes_copied_as_bytes(case)
