"""Model test of the rollup job's decoding (`kcm_rollups.decode.flatten` / `flatten_batches` over the batches
`kcm_rollups.source.records_to_decode_input` builds): seeded random metrics-topic records checked, row by row and
column by column, against a reference written from docs/rollups.md ("Decoding", "What each row holds") and
docs/contract.md (the contract headers, content types and encodings, the decode reasons and their limits).

The model: one row per data point, in the order of the payload; the client identity from the last non-null header
of each name, else the point's own resource, else (the instance id) the record key, an empty or blank one counting as
absent; the resource's attributes as canonical JSON only on points left without an instance id; the scope as a JSON
array of name and version, null when both are empty; one row with its reason per record that cannot be decoded,
holds a point the columns cannot, has a timestamp no window holds, or would expand past the documented limits.

Where the docs leave a column's exact form open, the model takes the code's form for that column only: the record
coordinates' names, `record_first`, the JSON text's spacing and escaping, `bytes` attribute values as base64, a
histogram without buckets having `bounds` [], a valid record without points being one row without an error, and carried
(non-identity) headers copied as they came, empty ones included.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import random
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import lz4.frame
import pyarrow as pa
import pytest
import snappy
import zstandard
from google.protobuf import json_format
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kcm_rollups.decode import POINTS_SCHEMA, flatten, flatten_batches, header_columns
from kcm_rollups.source import Record, records_to_decode_input

SEEDS = (3, 17, 714, 2024, 31337, 99991)
RECORDS_PER_SEED = 40
INT64_MAX = 2**63 - 1
LATEST_MS = int(datetime(9000, 1, 1, tzinfo=timezone.utc).timestamp()) * 1000   # docs/rollups.md: invalid-timestamp
MAX_POINTS = 100_000                     # docs/rollups.md "Decoding": too-large
MAX_IDENTITY_CHARS = 4096                # docs/rollups.md "Decoding": too-large
MAX_RECORD_TEXT = 32 * 1024**2           # docs/rollups.md "Decoding": "32 Mi characters of text over its points"
MAX_DECOMPRESSED = 16 * 1024**2          # docs/contract.md: the cap, default 16 MiB
IDENTITY = ("client_instance_id", "client_id", "client_software_name", "client_software_version")
# docs/contract.md: the broker and push headers, which ride on every point as columns of the same names.
CARRIED = ("client_source_address", "client_source_port", "principal", "listener_name", "security_protocol",
           "broker_id", "cluster_id", "subscription_id", "push_interval_ms", "terminating")
CONTRACT_HEADERS = ("content-type", "content-encoding") + IDENTITY + CARRIED
ENCODINGS = ("none", "gzip", "snappy", "lz4", "zstd")                     # docs/contract.md
REASONS = ("unknown-encoding", "decompress-failed", "too-large", "invalid-protobuf", "invalid-json", "empty",
           "unknown-content-type", "invalid-point", "invalid-timestamp")  # docs/rollups.md "Decoding"
TEMPORALITY = {0: None, 1: "delta", 2: "cumulative"}
POINT_COLUMNS = ("metric", "type", "temporality", "monotonic", "time_ns", "start_ns", "attributes", "value",
                 "count", "sum", "bucket_counts", "bounds")
BLANKS = ("", " ", "\t ")


# --- the generated records: a plain description, from which both the payload and the model are made ---------------

@dataclass
class Point:
    time: int = 0
    start: int = 0
    attributes: list[tuple[str, Any]] = field(default_factory=list)   # (key, any-value description)
    value: tuple[str, Any] | None = None    # ("d", float) or ("i", int): gauges and sums
    count: int = 0
    sum: float | None = None
    buckets: list[int] = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)


@dataclass
class Metric:
    name: str
    kind: str | None      # gauge, sum, histogram, exponential_histogram, summary; None: no data at all
    temporality: int = 0
    monotonic: bool = False
    points: list[Point] = field(default_factory=list)


@dataclass
class Scope:
    name: str = ""
    version: str = ""
    metrics: list[Metric] = field(default_factory=list)


@dataclass
class Resource:
    attributes: list[tuple[str, Any]] = field(default_factory=list)
    scopes: list[Scope] = field(default_factory=list)


@dataclass
class Case:
    """One record and what the model says of it: `expect` is None (decodes) or the documented reason."""
    key: str | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp_ms: int
    resources: list[Resource] = field(default_factory=list)
    expect: str | None = None     # a codec reason the record was made for
    words: tuple[str, ...] = ()   # words the error message must hold
    claim: str | None = None      # a directed case's own expectation of the model's verdict (checked first)


def any_value(description: tuple[str, Any]) -> AnyValue:
    kind, item = description
    value = AnyValue()
    if kind == "s":
        value.string_value = item
    elif kind == "b":
        value.bool_value = item
    elif kind == "i":
        value.int_value = item
    elif kind == "d":
        value.double_value = item
    elif kind == "bytes":
        value.bytes_value = item
    elif kind == "arr":
        value.array_value.SetInParent()
        value.array_value.values.extend(any_value(v) for v in item)
    elif kind == "kv":
        value.kvlist_value.SetInParent()
        value.kvlist_value.values.extend(KeyValue(key=k, value=any_value(v)) for k, v in item)
    return value   # "none": an AnyValue with nothing set


def as_json(description: tuple[str, Any]) -> Any:
    """An attribute value as the JSON columns hold it (bytes as base64: the code's form, the docs say nothing)."""
    kind, item = description
    if kind == "bytes":
        return base64.b64encode(item).decode("ascii")
    if kind == "arr":
        return [as_json(v) for v in item]
    if kind == "kv":
        return {k: as_json(v) for k, v in item}
    return None if kind == "none" else item


def canonical(attributes: list[tuple[str, Any]]) -> str:
    """Canonical JSON of attributes: keys sorted, no spaces (the exact spacing is the code's form)."""
    return json.dumps({k: as_json(v) for k, v in attributes}, sort_keys=True, separators=(",", ":"))


def metrics_data(resources: list[Resource]) -> metrics_pb2.MetricsData:
    data = metrics_pb2.MetricsData()
    for resource in resources:
        resource_metrics = data.resource_metrics.add()
        resource_metrics.resource.attributes.extend(KeyValue(key=k, value=any_value(v))
                                                    for k, v in resource.attributes)
        for scope in resource.scopes:
            scope_metrics = resource_metrics.scope_metrics.add()
            scope_metrics.scope.name, scope_metrics.scope.version = scope.name, scope.version
            for metric in scope.metrics:
                built = scope_metrics.metrics.add(name=metric.name)
                if metric.kind is None:
                    continue
                body = getattr(built, metric.kind)
                body.SetInParent()
                if metric.kind in ("sum", "histogram", "exponential_histogram"):
                    body.aggregation_temporality = metric.temporality
                if metric.kind == "sum":
                    body.is_monotonic = metric.monotonic
                for point in metric.points:
                    added = body.data_points.add(time_unix_nano=point.time, start_time_unix_nano=point.start)
                    added.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in point.attributes)
                    if metric.kind in ("gauge", "sum"):
                        if point.value is not None:
                            setattr(added, "as_double" if point.value[0] == "d" else "as_int", point.value[1])
                        continue
                    added.count = point.count
                    if point.sum is not None:
                        added.sum = point.sum
                    if metric.kind == "histogram":
                        added.bucket_counts.extend(point.buckets)
                        added.explicit_bounds.extend(point.bounds)
                    elif metric.kind == "exponential_histogram":
                        added.scale, added.zero_count = 2, 1
                        added.positive.bucket_counts.extend(point.buckets)
    return data


# --- the model ------------------------------------------------------------------------------------------------------

def last_non_null(headers: list[tuple[str, bytes | None]] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in headers or []:
        if value is not None:
            found[name] = value.decode()
    return found


def present(text: str | None) -> str | None:
    return None if text is None or not text.strip() else text


def scope_text(scope: Scope) -> str | None:
    if not scope.name and not scope.version:
        return None
    return json.dumps([scope.name, scope.version], separators=(",", ":"))


def point_columns(metric: Metric, point: Point) -> dict[str, Any]:
    number = metric.kind in ("gauge", "sum")
    return {
        "metric": metric.name, "type": metric.kind,
        "temporality": "cumulative" if metric.kind == "summary" else (
            None if metric.kind == "gauge" else TEMPORALITY[metric.temporality]),
        "monotonic": metric.monotonic if metric.kind == "sum" else None,
        "time_ns": point.time, "start_ns": point.start, "attributes": canonical(point.attributes),
        "value": (float(point.value[1]) if point.value is not None else None) if number else None,
        "count": None if number else point.count,
        "sum": None if number else (point.sum if metric.kind != "summary" else point.sum or 0.0),
        "bucket_counts": (point.buckets or None) if metric.kind == "histogram" else None,
        "bounds": point.bounds if metric.kind == "histogram" else None,
    }


def point_fault(metric: Metric, point: Point) -> bool:
    """docs/rollups.md: invalid-point, a time or count beyond a signed 64-bit integer, or histogram bucket counts
    that are neither one more than the bounds nor absent with the bounds."""
    if point.time > INT64_MAX or point.start > INT64_MAX:
        return True
    if metric.kind in ("histogram", "exponential_histogram", "summary") and point.count > INT64_MAX:
        return True
    if metric.kind == "histogram":
        if any(c > INT64_MAX for c in point.buckets):
            return True
        if (point.buckets or point.bounds) and len(point.buckets) != len(point.bounds) + 1:
            return True
    return False


def model_rows(case: Case, topic: str, partition: int, offset: int) -> list[dict[str, Any]]:
    headers = last_non_null(case.headers)
    micros = case.timestamp_ms * 1000
    base: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset,
                            "record_micros": micros if -2**63 <= micros < 2**63 else None}
    base.update({name: headers.get(name) for name in CARRIED})
    given = [present(headers.get(name)) for name in IDENTITY]

    def identity(resource: Resource | None) -> dict[str, Any]:
        attributes = dict(resource.attributes) if resource else {}
        found = [h or present(attributes[n][1] if n in attributes else None) for n, h in zip(IDENTITY, given)]
        found[0] = found[0] or present(case.key)
        return dict(zip(IDENTITY, found))

    def one_row(reason: str | None) -> list[dict[str, Any]]:
        return [{**base, **identity(None), "resource": None, "scope": None, "record_first": True,
                 **dict.fromkeys(POINT_COLUMNS), "error": reason}]

    if not 0 <= case.timestamp_ms < LATEST_MS:
        return one_row("invalid-timestamp")
    if case.expect is not None:     # a codec reason the generator made the record for
        return one_row(case.expect)
    rows: list[dict[str, Any]] = []
    for resource in case.resources:
        who = identity(resource)
        resource_json = canonical(resource.attributes) if who["client_instance_id"] is None else None
        for scope in resource.scopes:
            for metric in scope.metrics:
                for point in metric.points if metric.kind else []:
                    if point_fault(metric, point):
                        return one_row("invalid-point")
                    rows.append({**base, **who, "resource": resource_json, "scope": scope_text(scope),
                                 "record_first": not rows, **point_columns(metric, point), "error": None})
    if len(rows) > MAX_POINTS:
        return one_row("too-large")
    texts = (*IDENTITY, *CARRIED, "resource", "scope", "metric", "attributes")
    used = rows or [identity(None)]
    # "a client identity value ... or carried contract header (one its points copy: not content-type or
    # content-encoding)"
    longest = max([len(v) for n, v in headers.items() if n in IDENTITY + CARRIED]
                  + [len(r[n] or "") for r in used for n in IDENTITY])
    if longest > MAX_IDENTITY_CHARS:
        return one_row("too-large")
    if sum(len(r[n] or "") for r in rows for n in texts) > MAX_RECORD_TEXT:
        return one_row("too-large")
    return rows or one_row(None)   # a valid record without points: one row, no error (the code's form)


# --- random records ----------------------------------------------------------------------------------------------

def random_any(rng: random.Random, depth: int = 0) -> tuple[str, Any]:
    kinds = ["s", "b", "i", "d", "bytes", "none"] + (["arr", "kv"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "s":
        return kind, rng.choice(("", "x", "naïve", "a b", "9092", "quote\"d"))
    if kind == "b":
        return kind, rng.random() < 0.5
    if kind == "i":
        return kind, rng.choice((0, -5, 42, 2**62, -(2**63)))
    if kind == "d":
        return kind, rng.choice((0.5, -2.25, 1e300, 3.0))
    if kind == "bytes":
        return kind, bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
    if kind == "arr":
        return kind, [random_any(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == "kv":
        return kind, [(f"k{i}", random_any(rng, depth + 1)) for i in range(rng.randrange(3))]
    return kind, None


def random_attributes(rng: random.Random, keys: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(key, random_any(rng)) for key in rng.sample(keys, rng.randrange(len(keys) + 1))]


def random_point(rng: random.Random, kind: str) -> Point:
    time = rng.choice((0, 1_700_000_000_000_000_000 + rng.randrange(10**9), INT64_MAX))
    point = Point(time=time, start=rng.choice((0, max(time - 10**9, 0))),
                  attributes=random_attributes(rng, ("node_id", "topic", "partition", "b", "nested")))
    if rng.random() < 0.02:   # beyond a signed 64-bit time: an invalid-point record
        setattr(point, rng.choice(("time", "start")), rng.choice((2**63, 2**64 - 1)))
    if kind in ("gauge", "sum"):
        point.value = rng.choice((None, ("d", 12.5), ("d", math.nan), ("d", -math.inf), ("d", 0.0), ("i", 42),
                                  ("i", -7), ("i", 2**60)))
        return point
    point.count = rng.choice((0, 3, 1000, INT64_MAX) * 20 + (2**63,))
    point.sum = rng.choice((None, 7.5, 0.0, math.nan)) if kind != "summary" else rng.choice((7.5, 0.0))
    if kind == "histogram" and rng.random() < 0.7:
        point.bounds = sorted(rng.sample((0.5, 1.0, 5.0, 10.0, 100.0), rng.randrange(4)))
        point.buckets = [rng.randrange(5) for _ in range(len(point.bounds) + rng.choice((1,) * 30 + (0, 2)))]
    if kind == "exponential_histogram":
        point.buckets = [rng.randrange(5) for _ in range(rng.randrange(3))]
    return point


def random_metric(rng: random.Random, index: int) -> Metric:
    kind = rng.choice(("gauge", "gauge", "sum", "sum", "histogram", "exponential_histogram", "summary", None))
    metric = Metric(f"org.apache.kafka.m{index}.{rng.randrange(100)}", kind, temporality=rng.choice((0, 1, 2, 2)),
                    monotonic=rng.random() < 0.6)
    metric.points = [random_point(rng, kind) for _ in range(rng.randrange(4))] if kind else []
    return metric


def random_resources(rng: random.Random) -> list[Resource]:
    resources = []
    for _ in range(rng.choice((0, 1, 1, 1, 2, 3))):
        attributes = [(name, ("s", rng.choice(BLANKS + (f"{name}-{rng.randrange(3)}", "naïve"))))
                      for name in IDENTITY if rng.random() < 0.3]
        attributes += random_attributes(rng, ("service.name", "host", "process.pid", "tags"))
        scopes = [Scope(rng.choice(("", "librdkafka", "org.apache.kafka")), rng.choice(("", "2.3.0")),
                        [random_metric(rng, i) for i in range(rng.randrange(4))])
                  for _ in range(rng.randrange(3))]
        resources.append(Resource(attributes, scopes))
    return resources


def random_headers(rng: random.Random) -> list[tuple[str, bytes | None]] | None:
    if rng.random() < 0.1:
        return None     # Spark's Kafka source without includeHeaders
    headers: list[tuple[str, bytes | None]] = []
    for name in rng.sample(IDENTITY + CARRIED, rng.randrange(6)):
        for _ in range(rng.choice((1, 1, 2, 3))):    # repeated: the last non-null value wins
            value = rng.choice((None,) + BLANKS + (f"{name}-{rng.randrange(4)}", "naïve") * 20
                               + ("z" * (MAX_IDENTITY_CHARS + 1),))
            headers.append((name, None if value is None else value.encode()))
    rng.shuffle(headers)
    return headers


def snappy_xerial(data: bytes) -> bytes:
    """The xerial framing Java clients write: magic, version and compatible version, then length-prefixed blocks."""
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for start in range(0, max(len(data), 1), 1000):
        block = snappy.compress(data[start:start + 1000])
        framed += struct.pack(">i", len(block)) + block
    return framed


def compressed(rng: random.Random, data: bytes, encoding: str) -> bytes:
    """`data` compressed with `encoding` by each codec's own library, not kcm's."""
    if encoding == "gzip":
        return gzip.compress(data)
    if encoding == "snappy":
        return snappy.compress(data) if rng.random() < 0.5 else snappy_xerial(data)
    if encoding == "lz4":
        return lz4.frame.compress(data)
    if encoding == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def otlp_json(data: metrics_pb2.MetricsData) -> bytes:
    return json_format.MessageToJson(data, use_integers_for_enums=True).encode()


def corrupt(rng: random.Random, case: Case, payload: bytes) -> None:
    """Make `case` a record the codec refuses, with the documented reason."""
    reason = rng.choice(("unknown-encoding", "decompress-failed", "invalid-protobuf", "invalid-json", "empty",
                         "unknown-content-type"))
    headers = case.headers = [(n, v) for n, v in case.headers or [] if n not in ("content-type", "content-encoding")]
    case.expect = reason
    if reason == "unknown-encoding":
        headers.append(("content-encoding", rng.choice((b"brotli", b"deflate", b"x"))))
        case.value = payload
    elif reason == "decompress-failed":
        encoding = rng.choice(ENCODINGS[1:])
        good = compressed(rng, payload, encoding)
        case.value = rng.choice((good[:-3], good + b"trailing garbage", good[:4] + b"\x00" * 16))
        headers.append(("content-encoding", encoding.encode()))
    elif reason == "invalid-protobuf":
        case.value = rng.choice((b"\x0a\xff", b"\xff\xff\xff\xff", payload[:-1] if len(payload) > 2 else b"\x0a\x05"))
        if rng.random() < 0.5:
            headers.append(("content-type", b"application/x-protobuf"))
    elif reason == "invalid-json":
        case.value = rng.choice((b"{not json", b'{"resourceMetrics": 5}', b" \n{"))
        if rng.random() < 0.5:
            headers.append(("content-type", b"application/json; charset=utf-8"))
    elif reason == "empty":
        encoding = rng.choice(ENCODINGS)
        case.value = rng.choice((None, b"", compressed(rng, b"", encoding)))
        headers.append(("content-encoding", encoding.encode()))
    else:
        headers.append(("content-type", rng.choice((b"text/plain", b"application/protobuf", b"json"))))
        case.value = payload


def random_case(rng: random.Random) -> Case:
    case = Case(key=rng.choice((None, "", " ", "5b1a6e0e-8f51-4c5e-9d7b-2f4f1c0e9a11", f"k-{rng.randrange(9)}")),
                value=None, headers=random_headers(rng), timestamp_ms=1_767_225_600_000 + rng.randrange(10**8),
                resources=random_resources(rng))
    if rng.random() < 0.08:
        case.timestamp_ms = rng.choice((-1, -1000, LATEST_MS, LATEST_MS + 1, 2**62))
    data = metrics_data(case.resources)
    if rng.random() < 0.2:
        corrupt(rng, case, data.SerializeToString() or b"\x0a\x00")
        return case
    headers = case.headers = list(case.headers or []) if case.headers is not None or rng.random() < 0.5 else None
    if rng.random() < 0.2:   # OTLP/JSON, named by its content type or, without one, found by its leading `{`
        payload = otlp_json(data)
        if headers is not None and rng.random() < 0.6:
            headers.append(("content-type", rng.choice((b"application/json", b"application/json; charset=utf-8"))))
        elif headers is not None:
            payload = rng.choice((b"", b"\xef\xbb\xbf", b" \r\n\t")) + payload
        else:
            payload = b"\xef\xbb\xbf\n " + payload
    else:
        payload = data.SerializeToString()
        if headers is not None and rng.random() < 0.5:
            headers.append(("content-type", rng.choice((b"application/x-protobuf",
                                                        b"application/x-protobuf; charset=utf-8"))))
    encoding = rng.choice(ENCODINGS) if headers is not None else "none"
    if headers is not None and (encoding != "none" or rng.random() < 0.5):
        headers.append(("content-encoding", encoding.encode()))
    case.value = compressed(rng, payload, encoding)
    if not payload:
        case.expect = "empty"   # docs/contract.md: an empty MetricsData serialises to zero bytes
    return case


# --- running the code and comparing -------------------------------------------------------------------------------

def run(cases: list[Case]) -> tuple[pa.RecordBatch, list[dict[str, Any]]]:
    records = [Record(None if c.key is None else c.key.encode(), c.value, "metrics", 3, 100 + i, c.timestamp_ms,
                      0, c.headers) for i, c in enumerate(cases)]
    batch = records_to_decode_input(records)
    expected = [row for i, c in enumerate(cases) for row in model_rows(c, "metrics", 3, 100 + i)]
    return batch, expected


def same(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected):
        return math.isnan(actual)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(same(a, e) for a, e in zip(actual, expected))
    return type(actual) is type(expected) and actual == expected if expected is not None else actual is None


def compare(actual: list[dict[str, Any]], expected: list[dict[str, Any]], cases: list[Case]) -> None:
    assert len(actual) == len(expected), (
        f"{len(actual)} rows, the model {len(expected)}: " + str([(r["offset"], r["error"]) for r in actual]))
    for number, (row, model) in enumerate(zip(actual, expected)):
        assert set(row) == set(POINTS_SCHEMA.names)
        for column in POINTS_SCHEMA.names:
            if column == "error_message":
                continue
            assert same(row[column], model[column]), (
                f"row {number} (offset {row['offset']}) column {column}: {row[column]!r}, the model {model[column]!r}")
        if model["error"] is None:
            assert row["error_message"] is None
        else:
            assert isinstance(row["error_message"], str) and row["error_message"].strip()
            case = cases[model["offset"] - 100]
            for word in case.words:
                assert word in row["error_message"].replace(",", ""), (word, row["error_message"])


@pytest.mark.parametrize("seed", SEEDS)
def test_random_records_flatten_into_one_row_per_point_or_one_row_per_undecodable_record(seed):
    rng = random.Random(seed)
    cases = [random_case(rng) for _ in range(RECORDS_PER_SEED)]
    batch, expected = run(cases)
    out = flatten(batch)
    assert out.schema.names == POINTS_SCHEMA.names
    compare(out.to_pylist(), expected, cases)
    # The same rows however the batches are cut, and with only some columns, only those.
    cut = list(flatten_batches([batch], max_text=rng.randrange(50, 2000)))
    assert len(cut) > 1
    compare(pa.Table.from_batches(cut).to_pylist(), expected, cases)
    columns = sorted(rng.sample(POINTS_SCHEMA.names, 8), key=POINTS_SCHEMA.names.index)
    some = pa.Table.from_batches(list(flatten_batches([batch], columns=columns))).to_pylist()
    assert len(some) == len(expected)
    for row, model in zip(some, expected):
        assert list(row) == columns
        assert all(same(row[c], model[c]) for c in columns if c != "error_message")


@pytest.mark.parametrize("seed", SEEDS)
def test_the_last_non_null_value_of_each_repeated_contract_header_is_picked(seed):
    rng = random.Random(seed)
    names = ("content-type", "content-encoding") + IDENTITY + CARRIED
    headers = [random_headers(rng) for _ in range(30)]
    records = [Record(b"k", b"x", "t", 0, i, 0, 0, h) for i, h in enumerate(headers)]
    found = header_columns(records_to_decode_input(records).column("headers"), names)
    for name in names:
        assert found[name].to_pylist() == [last_non_null(h).get(name) for h in headers]


# --- directed cases: every documented edge ----------------------------------------------------------------------

def gauges(count: int, attributes: list[tuple[str, Any]] | None = None, name: str = "g",
           scope: Scope | None = None) -> list[Resource]:
    points = [Point(time=1_700_000_000_000_000_000, value=("d", 1.0)) for _ in range(count)]
    chosen = scope or Scope()
    chosen.metrics = [Metric(name, "gauge", points=points)]
    return [Resource(list(attributes or []), [chosen])]


def proto_case(resources: list[Resource], key: str | None = "k", headers=(), timestamp_ms: int = 1_767_225_600_000,
               claim: str | None = None, words: tuple[str, ...] = ()) -> Case:
    """A protobuf record of `resources`; `claim` is the reason the directed case means the model to give."""
    value = metrics_data(resources).SerializeToString()
    return Case(key, value, list(headers), timestamp_ms, resources, None if value else "empty", words, claim)


def histogram(**point: Any) -> list[Resource]:
    return [Resource([], [Scope("s", "", [Metric("latency", "histogram", 1, points=[Point(**point)])])])]


def check(cases: list[Case]) -> None:
    batch, expected = run(cases)
    verdicts = {row["offset"] - 100: row["error"] for row in expected}
    assert [verdicts[i] for i, case in enumerate(cases) if case.claim or case.expect is None] == [
        case.claim for case in cases if case.claim or case.expect is None], "the model disagrees with a case's claim"
    compare(flatten(batch).to_pylist(), expected, cases)


def test_identity_comes_from_headers_else_the_points_resource_else_the_key_blanks_counting_as_absent():
    two = [Resource([("client_id", ("s", "from-a")), ("service.name", ("s", "a"))],
                    [Scope("", "", [Metric("m.a", "gauge", points=[Point(value=("i", 1))])])]),
           Resource([("client_instance_id", ("s", "res-b")), ("client_software_name", ("s", "  "))],
                    [Scope("x", "", [Metric("m.b", "sum", 2, True, [Point(value=("d", 2.0))])])]),
           Resource([("client_id", ("s", "")), ("service.name", ("s", "c"))],
                    [Scope("", "1.0", [Metric("m.c", "gauge", points=[Point()])])])]
    check([
        proto_case(two, key=None),
        proto_case(two, key=" "),
        proto_case(two, key="from-key"),
        proto_case(two, key="from-key", headers=[("client_instance_id", b"hdr"), ("client_id", b" "),
                                                   ("client_software_version", b"1.2")]),
        proto_case(two, key="", headers=[("client_instance_id", b"hdr"), ("client_instance_id", b"")]),
        proto_case(two, key="", headers=[("client_id", b"old"), ("client_id", b"new"), ("client_id", None)]),
        proto_case([], key="lonely", headers=[("principal", b"User:a"), ("principal", b"")]),
    ])


def test_every_content_encoding_and_type_decodes_the_same_points():
    resources = gauges(2, [("service.name", ("s", "enc"))], scope=Scope("lib", "1"))
    data = metrics_data(resources)
    rng = random.Random(0)
    cases = []
    for encoding in ENCODINGS:
        for payload, content_type in ((data.SerializeToString(), b"application/x-protobuf"),
                                      (otlp_json(data), b"application/json")):
            for value in {compressed(rng, payload, encoding), compressed(random.Random(1), payload, encoding)}:
                cases.append(Case("k", value, [("content-encoding", encoding.encode()),
                                               ("content-type", content_type)], 1_767_225_600_000, resources))
    # Without headers: protobuf, or OTLP/JSON after a byte order mark and JSON whitespace.
    cases.append(Case(None, data.SerializeToString(), None, 0, resources))
    cases.append(Case(None, b"\xef\xbb\xbf \r\n\t" + otlp_json(data), [], 0, resources))
    check(cases)


def test_a_headerless_protobuf_value_starting_with_a_newline_and_a_brace_is_read_as_protobuf():
    """docs/contract.md: a value starting with a newline that is no JSON is read as protobuf. A first
    ResourceMetrics of 123 bytes serialises as b'\\n{...'."""
    for pad in range(200):
        resources = gauges(1, [("service.name", ("s", "p" * pad))])
        value = metrics_data(resources).SerializeToString()
        if value.startswith(b"\n{"):
            break
    assert value.startswith(b"\n{")
    check([Case(None, value, None, 5, resources), Case(None, value, [], 5, resources)])


def test_every_point_kind_and_value_fills_its_own_columns():
    scope = Scope("org.apache.kafka", "3.9.0", [
        Metric("g", "gauge", points=[Point(time=5, start=1, value=("d", math.nan)), Point(value=None),
                                     Point(value=("i", -(2**63))), Point(value=("d", math.inf))]),
        Metric("s.delta", "sum", 1, True, [Point(value=("i", 42))]),
        Metric("s.cumulative", "sum", 2, False, [Point(value=("d", -1.5))]),
        Metric("s.unspecified", "sum", 0, True, [Point(value=("d", 1.0))]),
        Metric("h.buckets", "histogram", 2, points=[Point(count=3, sum=7.5, buckets=[1, 2, 0], bounds=[1.0, 5.0])]),
        Metric("h.bare", "histogram", 1, points=[Point(count=4)]),
        Metric("h.one", "histogram", 1, points=[Point(count=4, sum=1.0, buckets=[4])]),
        Metric("e", "exponential_histogram", 1, points=[Point(count=5, sum=2.0, buckets=[1, 4]), Point(count=0)]),
        Metric("q", "summary", points=[Point(count=2, sum=10.0), Point(count=0)]),
        Metric("nothing", None),
        Metric("empty", "gauge"),
    ])
    check([proto_case([Resource([], [scope, Scope("", "", [Metric("u", "gauge", points=[Point()])])])]),
           proto_case([Resource([], [Scope("naïve", "", [Metric("n", "gauge", points=[Point()])])])], key=None)])


def test_attribute_values_of_every_kind_are_canonical_json():
    kinds = [("s", "x"), ("s", ""), ("b", True), ("i", -3), ("d", 0.25), ("bytes", b"\x00\xff"), ("none", None),
             ("arr", [("i", 1), ("s", "a"), ("arr", [])]), ("kv", [("z", ("b", False)), ("a", ("d", 1e-300))]),
             ("kv", []), ("arr", [("kv", [("k", ("bytes", b"hi"))])])]
    attributes = [(f"key{i:02d}", v) for i, v in enumerate(kinds)][::-1]   # sent in reverse, held sorted
    resources = [Resource(attributes, [Scope("", "", [Metric("m", "gauge", points=[
        Point(attributes=attributes), Point(attributes=[("only", ("s", "one"))]), Point()])])])]
    check([proto_case(resources, key=None), proto_case(resources, key="id")])


def test_points_the_columns_cannot_hold_make_their_record_one_invalid_point_row():
    check([
        proto_case(histogram(time=2**63), claim="invalid-point"),
        proto_case(histogram(start=2**64 - 1), claim="invalid-point"),
        proto_case(histogram(time=INT64_MAX, start=INT64_MAX, count=INT64_MAX, buckets=[INT64_MAX])),
        proto_case(histogram(count=2**63), claim="invalid-point"),
        proto_case(histogram(count=1, buckets=[0, 2**63], bounds=[1.0]), claim="invalid-point"),
        proto_case(histogram(count=3, buckets=[1, 2], bounds=[1.0, 5.0]), claim="invalid-point"),
        proto_case(histogram(count=3, bounds=[1.0, 5.0]), claim="invalid-point"),
        proto_case(histogram(count=3, buckets=[1, 2]), claim="invalid-point"),
        proto_case(histogram(count=3, buckets=[1, 1, 1, 0], bounds=[1.0, 5.0]), claim="invalid-point"),
        proto_case([Resource([], [Scope("", "", [Metric("e", "exponential_histogram", 1,
                                                         points=[Point(count=2**64 - 1)])])])],
                   claim="invalid-point"),
        proto_case([Resource([], [Scope("", "", [Metric("q", "summary", points=[Point(count=2**63)])])])],
                   claim="invalid-point"),
        proto_case(gauges(2) + [Resource([], [Scope("", "", [Metric("g", "gauge", points=[Point(time=2**63)])])])],
                   claim="invalid-point"),
        proto_case(gauges(1)),
    ])


def test_kafka_timestamps_no_window_can_hold_make_one_invalid_timestamp_row():
    words = ("1970-01-01", "9000-01-01")
    check([proto_case(gauges(2), timestamp_ms=ts, claim=None if 0 <= ts < LATEST_MS else "invalid-timestamp",
                      words=() if 0 <= ts < LATEST_MS else words)
           for ts in (-1, -(2**62), 0, LATEST_MS - 1, LATEST_MS, LATEST_MS + 1, 2**61, 9_300_000_000_000_000)])


def test_the_codecs_reasons_become_one_row_each():
    good = metrics_data(gauges(1)).SerializeToString()
    bomb = b"\x00" * (MAX_DECOMPRESSED + 1)
    many_objects = b'{"resourceMetrics":[' + b",".join([b"{}"] * 200_001) + b"]}"
    cases = [
        Case("a", good, [("content-encoding", b"brotli")], 0, expect="unknown-encoding"),
        Case("b", good, [("content-type", b"text/plain")], 0, expect="unknown-content-type"),
        Case("c", gzip.compress(good)[:-4], [("content-encoding", b"gzip")], 0, expect="decompress-failed"),
        Case("d", zstandard.ZstdCompressor().compress(good) + b"x", [("content-encoding", b"zstd")], 0,
             expect="decompress-failed"),
        Case("e", lz4.frame.compress(good)[:-2], [("content-encoding", b"lz4")], 0, expect="decompress-failed"),
        Case("f", b"\x00\x01\x02", [("content-encoding", b"snappy")], 0, expect="decompress-failed"),
        Case("g", b"\x0a\xff", [], 0, expect="invalid-protobuf"),
        Case("h", b"{nope", [("content-type", b"application/json")], 0, expect="invalid-json"),
        Case("i", b"  {nope", None, 0, expect="invalid-json"),
        Case("j", None, [], 0, expect="empty"),
        Case("k", b"", [("client_id", b"app")], 0, expect="empty"),
        Case("l", gzip.compress(b""), [("content-encoding", b"gzip")], 0, expect="empty"),
        Case("m", gzip.compress(bomb), [("content-encoding", b"gzip")], 0, expect="too-large"),
        Case("n", zstandard.ZstdCompressor().compress(bomb), [("content-encoding", b"zstd")], 0, expect="too-large"),
        Case("o", many_objects, [("content-type", b"application/json")], 0, expect="too-large"),
        proto_case(gauges(1), key="p"),
    ]
    check(cases)


def test_a_decompressed_payload_of_exactly_the_cap_decodes():
    resources = gauges(1)
    data = metrics_data(resources)
    metric = data.resource_metrics[0].scope_metrics[0].metrics[0]
    pad = MAX_DECOMPRESSED - 100
    for _ in range(3):   # varint lengths may grow by a byte as the description does
        metric.description = "d" * pad
        pad += MAX_DECOMPRESSED - data.ByteSize()
    assert data.ByteSize() == MAX_DECOMPRESSED
    check([Case("cap", gzip.compress(data.SerializeToString()), [("content-encoding", b"gzip")], 0, resources)])


def test_records_past_the_documented_size_limits_are_one_too_large_row_and_spare_the_batch():
    long_text = "x" * (MAX_IDENTITY_CHARS + 1)
    at_limit = "y" * MAX_IDENTITY_CHARS
    wide = [("process.command_line", ("s", "c" * 4000))]   # a resource kept as text: no instance id
    per_point = 4000 + len('{"process.command_line":""}') + len("g") + len("{}")
    check([
        proto_case(gauges(MAX_POINTS), key="all"),
        proto_case(gauges(MAX_POINTS + 1), key="many", claim="too-large", words=("100000",)),
        proto_case(gauges(1, [("client_id", ("s", long_text))]), claim="too-large", words=("4096",)),
        proto_case(gauges(1, [("client_id", ("s", at_limit))])),
        proto_case(gauges(1), headers=[("principal", long_text.encode())], claim="too-large", words=("4096",)),
        proto_case(gauges(1), headers=[("principal", at_limit.encode())]),
        proto_case(gauges(1), headers=[("client_software_name", long_text.encode())], claim="too-large"),
        proto_case(gauges(1), key=long_text, claim="too-large"),
        proto_case(gauges(1), key=at_limit),
        proto_case(gauges(MAX_RECORD_TEXT // per_point + 1, wide), key=None, claim="too-large"),
        proto_case(gauges(MAX_RECORD_TEXT // per_point, wide), key=None),
        proto_case(gauges(1), key="after"),
    ])


def test_a_content_type_header_longer_than_the_limit_is_no_carried_header_and_is_decoded():
    """docs/rollups.md bounds the contract headers its points copy; content-type (and content-encoding) is not one."""
    long_type = b"application/x-protobuf; charset=" + b"u" * MAX_IDENTITY_CHARS
    check([proto_case(gauges(1), headers=[("content-type", long_type)])])


def test_a_long_carried_header_makes_a_record_without_points_too_large():
    no_points = [Resource([], [Scope("lib", "", [Metric("m", "gauge")])])]
    check([proto_case(no_points, headers=[("principal", b"p" * (MAX_IDENTITY_CHARS + 1))], claim="too-large"),
           proto_case(no_points, headers=[("client_id", b"short")])])


def test_a_long_identity_header_or_key_makes_a_record_without_points_too_large():
    no_points = [Resource([], [Scope("lib", "", [Metric("m", "gauge")])])]
    check([proto_case(no_points, headers=[("client_id", b"c" * (MAX_IDENTITY_CHARS + 1))], claim="too-large"),
           proto_case(no_points, key="k" * (MAX_IDENTITY_CHARS + 1), claim="too-large"),
           proto_case(no_points, headers=[("client_id", b"c" * MAX_IDENTITY_CHARS)])])
