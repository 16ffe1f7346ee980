"""Enrichment: contract headers and static attributes become resource attributes, then drop/rename/hash rules.

The resource is rewritten at the protobuf wire level: metrics, scopes and points are copied as bytes and never
decoded again, which is what keeps the bridge near the Kafka client's own speed. What one record may cost is bounded
(see `splice`): the added attributes go into every ResourceMetrics, so a record of many tiny ones would multiply them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import NamedTuple

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from kcm_common.contract import DecodeError

from kcm_bridge.config import AttributeRule, EnrichConfig, applied_rules, rule_salt
from kcm_bridge.wire import LEN, RESOURCE_METRICS, field, fields, varint

# ResourceMetrics.resource, Resource.attributes, KeyValue.key, KeyValue.value
_RESOURCE = _ATTRIBUTES = _KEY = 1
_VALUE = 2
_STRING_VALUE = 1
_RESOURCE_METRICS_TAG = varint((RESOURCE_METRICS << 3) | LEN)
# What enriching one record may cost. Protobuf fields walked in Python (some 1 µs and 200 bytes each): a small
# compressed record can hold millions of tiny messages. A KIP-714 push (at most 1 MiB) walks a few dozen, a plain
# OTLP batch of 5000 resources (3 MB) 135 000; past MAX_FIELDS, one field per 16 bytes of payload.
MAX_FIELDS = 200_000
_BYTES_PER_FIELD = 16
# And each ResourceMetrics gets the added attributes: the copies beyond the first may come to 4 times the payload
# and 64 KiB (a plain OTLP record's resources are rarely smaller than the attributes added to them).
_GROWTH = 4
_ALLOWANCE = 64 * 1024
# A field takes two bytes at least, and no byte is walked more than six times (top level, ResourceMetrics, resource
# and attribute twice each): a payload this small cannot reach MAX_FIELDS, so its walks are not counted.
_UNCOUNTED_BYTES = MAX_FIELDS // 3

_Walk = Callable[[bytes], list[tuple[int, int, int, int, int]]]


class Rules:
    """The configured drop/rename/hash rules, applied in order to one attribute at a time."""

    def __init__(self, rules: list[AttributeRule]) -> None:
        self.attributes = frozenset(rule.attribute for rule in rules)
        salts = {index: rule_salt(rule) for index, rule in enumerate(rules) if rule.action == "hash"}
        # What the rules do to each attribute they name: its last name, and the salts of the hashes on the way.
        self._paths: dict[str, tuple[str | None, list[bytes]]] = {}
        for attribute in self.attributes:
            key, applied = applied_rules(rules, attribute)
            self._paths[attribute] = key, [salts[index] for index in applied if index in salts]

    def apply(self, key: str, value: str | None) -> tuple[str | None, str | None]:
        """The attribute after the rules: (None, None) when dropped; else its key and, when a hash rule replaced
        the value, the new (string) value, None when the value stays as it was (of whatever type)."""
        if key not in self._paths:
            return key, None
        new_key, salts = self._paths[key]
        if new_key is None:
            return None, None
        hashed = None
        for salt in salts:
            hashed = hashlib.sha256(salt + ((value or "") if hashed is None else hashed).encode()).hexdigest()
        return new_key, hashed


class Added(NamedTuple):
    """The resource attributes enrichment adds to a record, encoded once per header set."""

    attributes: bytes          # encoded Resource.attributes fields
    keys: frozenset[str]
    resource: bytes            # a ResourceMetrics.resource field holding only them


class Enricher:
    """Turns a record's header attributes into the resource attributes an export carries."""

    def __init__(self, config: EnrichConfig) -> None:
        self._use_headers = config.header_attributes
        self._static = dict(config.static_attributes)
        self._rules = Rules(config.rules)

    def attributes(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The attributes added to every resource of a record: headers, then static ones, then the rules."""
        merged = {**(headers if self._use_headers else {}), **self._static}
        result: dict[str, str] = {}
        for key, value in merged.items():
            new_key, new_value = self._rules.apply(key, value)
            if new_key is not None:
                result[new_key] = new_value if new_value is not None else value
        return result

    def encode(self, headers: Mapping[str, str]) -> Added:
        """The added attributes of a record with these header attributes, encoded once for `apply`."""
        added = self.attributes(headers)
        encoded = b"".join(field(_ATTRIBUTES, string_key_value(k, v)) for k, v in added.items())
        return Added(encoded, frozenset(added), field(_RESOURCE, encoded))

    def apply(self, metrics_data: bytes, added: Added) -> bytes:
        """`metrics_data` (serialised MetricsData) with every resource carrying the `encode`d attributes."""
        if not added.attributes and not self._rules.attributes:
            return metrics_data
        return splice(metrics_data, added, self._rules)

    def enrich(self, metrics_data: bytes, headers: Mapping[str, str]) -> bytes:
        """`apply` with attributes encoded from `headers`."""
        return self.apply(metrics_data, self.encode(headers))


def splice(metrics_data: bytes, added: Added, rules: Rules) -> bytes:
    """Rewrite each ResourceMetrics' resource: its own attributes after the rules (a renamed one replacing one of
    that name), minus keys `added` replaces.

    Raises DecodeError("too-large") when the copies of the added attributes in the ResourceMetrics after the first
    would come to more than 4 × the payload + 64 KiB (known before anything is built), or on reaching more walked
    protobuf fields than MAX_FIELDS or, in a larger payload, one per 16 bytes."""
    size = len(metrics_data)
    walk = fields if size <= _UNCOUNTED_BYTES else _Budget(max(MAX_FIELDS, size // _BYTES_PER_FIELD))
    parts = walk(metrics_data)
    if len(parts) > 1 and (len(parts) - 1) * len(added.resource) > _GROWTH * size + _ALLOWANCE:
        raise DecodeError("too-large", f"its {len(parts)} ResourceMetrics would each get the {len(added.resource)} "
                                       f"bytes of added attributes: more than 4 × its {size}-byte payload + 64 KiB")
    out = []
    for number, wire_type, start, value_start, end in parts:
        if number == RESOURCE_METRICS and wire_type == LEN:
            body = _resource_metrics(metrics_data[value_start:end], added, rules, walk)
            out += (_RESOURCE_METRICS_TAG, varint(len(body)), body)
        else:
            out.append(metrics_data[start:end])
    return b"".join(out)


class _Budget:
    """`wire.fields` for the walks enriching one record: `limit` fields among them all."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.left = self.limit = limit

    def __call__(self, data: bytes) -> list[tuple[int, int, int, int, int]]:
        found = fields(data, self.left + 1)
        self.charge(len(found))
        return found

    def charge(self, walked: int) -> None:
        self.left -= walked
        if self.left < 0:
            raise DecodeError("too-large", f"enriching it would walk more than {self.limit} protobuf fields "
                                           "(ResourceMetrics, their parts and resource attributes)")


def _resource_metrics(data: bytes, added: Added, rules: Rules, walk: _Walk) -> bytes:
    parts = walk(data)
    resource_parts = [data[value_start:end] for number, wire_type, _, value_start, end in parts
                      if number == _RESOURCE and wire_type == LEN]
    # Repeated occurrences of a message field merge, so their concatenation is the resource.
    resource = b"".join(resource_parts)
    if not rules.attributes and (not resource or added.keys.isdisjoint(_resource_keys(resource, walk))):
        # The common case (an empty resource, or none of the added keys in it): a leading resource field holding
        # only the added attributes merges with the client's, so the rest is copied as it is.
        return added.resource + data
    kept, other = [], []
    for number, wire_type, start, value_start, end in walk(resource):
        if number == _ATTRIBUTES and wire_type == LEN:
            attribute = _kept_attribute(resource[value_start:end], added.keys, rules, walk)
            if attribute is not None:
                kept.append(attribute)
        else:
            other.append(resource[start:end])
    # Keys must be unique in a resource: a renamed attribute replaces the client's own of that name.
    renamed = {key for key, was_renamed, _ in kept if was_renamed}
    attributes = b"".join(field(_ATTRIBUTES, key_value) for key, was_renamed, key_value in kept
                          if was_renamed or key not in renamed)
    rest = [data[start:end] for number, wire_type, start, _, end in parts if number != _RESOURCE or wire_type != LEN]
    return field(_RESOURCE, attributes + added.attributes + b"".join(other)) + b"".join(rest)


def _resource_keys(resource: bytes, walk: _Walk) -> frozenset[str]:
    # A client sends the same resource with every push: small ones are looked up, not walked again (but counted).
    if len(resource) > _CACHED_RESOURCE_BYTES:
        return _attribute_keys(resource, walk)
    keys, walked = _cached_attribute_keys(resource)
    if isinstance(walk, _Budget):
        walk.charge(walked)
    return keys


def _attribute_keys(resource: bytes, walk: _Walk) -> frozenset[str]:
    return frozenset(_key(resource[value_start:end], walk) for number, wire_type, _, value_start, end in walk(resource)
                     if number == _ATTRIBUTES and wire_type == LEN)


_CACHED_RESOURCE_BYTES = 512


@lru_cache(maxsize=1024)
def _cached_attribute_keys(resource: bytes) -> tuple[frozenset[str], int]:
    """A small resource's attribute keys, and the fields walked to find them (no more than its bytes)."""
    counted = _Budget(_CACHED_RESOURCE_BYTES)
    return _attribute_keys(resource, counted), counted.limit - counted.left


def _key(key_value: bytes, walk: _Walk) -> str:
    key = ""
    for number, wire_type, _, value_start, end in walk(key_value):
        if number == _KEY and wire_type == LEN:
            key = key_value[value_start:end].decode("utf-8", errors="replace")
    return key


def _kept_attribute(key_value: bytes, added_keys: frozenset[str], rules: Rules,
                    walk: _Walk) -> tuple[str, bool, bytes] | None:
    """A client's attribute after the rules, as (key, whether a rule renamed it, encoded KeyValue); None when a rule
    drops it or an added attribute replaces it."""
    key, value = "", b""
    for number, wire_type, _, value_start, end in walk(key_value):
        if number == _KEY and wire_type == LEN:
            key = key_value[value_start:end].decode("utf-8", errors="replace")
        elif number == _VALUE and wire_type == LEN:
            value = key_value[value_start:end]
    if key in rules.attributes:
        new_key, new_value = rules.apply(key, _any_value_text(value))
        if new_key is None or new_key in added_keys:
            return None
        if new_value is not None:
            return new_key, new_key != key, string_key_value(new_key, new_value)
        # Renamed (or not): the value keeps its type, an int stays an int, an array an array.
        if new_key == key:
            return key, False, key_value
        return new_key, True, field(_KEY, new_key.encode()) + field(_VALUE, value)
    return None if key in added_keys else (key, False, key_value)


def _any_value_text(raw: bytes) -> str:
    value = AnyValue.FromString(raw)
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind in ("bool_value",):
        return "true" if value.bool_value else "false"
    if kind in ("int_value", "double_value"):
        return str(getattr(value, kind))
    return raw.hex()


def string_key_value(key: str, value: str) -> bytes:
    """An encoded OTLP KeyValue with a string value."""
    return field(_KEY, key.encode()) + field(_VALUE, field(_STRING_VALUE, value.encode()))
