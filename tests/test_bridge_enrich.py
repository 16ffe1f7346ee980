"""Enrichment at the byte level: contract headers, static attributes and privacy rules on resource attributes."""

from __future__ import annotations

import hashlib

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_bridge.config import AttributeRule, EnrichConfig
from kcm_bridge.enrich import Enricher
from kcm_bridge.wire import count_points, field
from kcm_common import contract, points
from payloads import client_metrics

HEADERS = {"client_id": "payments-1", "client_instance_id": "4c1d0f0e-0000-4000-8000-000000000001",
           "client_source_address": "10.1.2.3", "principal": "User:alice"}


def _resource(data: bytes, index: int = 0) -> dict:
    return points.attributes(MetricsData.FromString(data).resource_metrics[index].resource.attributes)


def test_headers_and_static_attributes_become_resource_attributes_and_metrics_stay_byte_identical():
    original = client_metrics()
    enriched = Enricher(EnrichConfig(static_attributes={"kafka.cluster.name": "prod"})).enrich(
        original.SerializeToString(), HEADERS)

    decoded = MetricsData.FromString(enriched)
    assert _resource(enriched) == {**HEADERS, "kafka.cluster.name": "prod"}
    assert decoded.resource_metrics[0].scope_metrics == original.resource_metrics[0].scope_metrics
    assert count_points(enriched) == 2


def test_header_values_replace_what_the_client_put_in_its_resource_and_other_attributes_stay():
    original = client_metrics()
    resource = original.resource_metrics[0].resource
    resource.attributes.extend([KeyValue(key="client_id", value=AnyValue(string_value="spoofed")),
                                KeyValue(key="host.name", value=AnyValue(string_value="pod-7"))])
    enriched = Enricher(EnrichConfig()).enrich(original.SerializeToString(), {"client_id": "payments-1"})
    assert _resource(enriched) == {"client_id": "payments-1", "host.name": "pod-7"}


def test_client_resource_attributes_without_a_clash_are_kept_beside_the_added_ones():
    original = client_metrics()
    original.resource_metrics[0].resource.attributes.append(
        KeyValue(key="group_id", value=AnyValue(string_value="payments")))
    enriched = Enricher(EnrichConfig(static_attributes={"kafka.cluster.name": "prod"})).enrich(
        original.SerializeToString(), HEADERS)
    assert _resource(enriched) == {**HEADERS, "kafka.cluster.name": "prod", "group_id": "payments"}
    assert len(MetricsData.FromString(enriched).resource_metrics[0].resource.attributes) == len(HEADERS) + 2


def test_point_count_covers_every_resource_scope_and_kind_of_metric():
    data = MetricsData()
    data.MergeFrom(client_metrics("a"))                 # 1 gauge point + 1 sum point
    data.resource_metrics.extend(client_metrics("b").resource_metrics)
    scope = data.resource_metrics[1].scope_metrics.add()
    scope.metrics.add(name="h").histogram.data_points.add(count=3)
    scope.metrics.add(name="e").exponential_histogram.data_points.add(count=1)
    summary = scope.metrics.add(name="s").summary
    summary.data_points.add(count=2)
    summary.data_points.add(count=4)
    scope.metrics.add(name="empty")                     # no data at all
    assert count_points(data.SerializeToString()) == 2 + 2 + 1 + 1 + 2


def test_point_count_rejects_what_the_otlp_schema_rejects_deep_inside_a_metric():
    # A metric name that is not UTF-8: well-formed protobuf framing, but not a valid OTLP message.
    valid = client_metrics().SerializeToString()
    broken = valid.replace(b"org.apache.kafka.producer.record.send.total",
                           b"\xff" + b"rg.apache.kafka.producer.record.send.total")
    with pytest.raises(Exception):
        MetricsData.FromString(broken)
    with pytest.raises(ValueError):
        count_points(broken)


def test_drop_rename_and_salted_hash_rules_apply_to_header_and_client_attributes():
    original = client_metrics()
    original.resource_metrics[0].resource.attributes.append(
        KeyValue(key="principal", value=AnyValue(string_value="User:from-client")))
    rules = [AttributeRule(action="drop", attribute="client_source_address"),
             AttributeRule(action="hash", attribute="principal", salt="pepper"),
             AttributeRule(action="rename", attribute="client_id", to="kafka.client.id")]
    enriched = Enricher(EnrichConfig(rules=rules)).enrich(original.SerializeToString(), HEADERS)

    assert _resource(enriched) == {
        "kafka.client.id": "payments-1",
        "client_instance_id": HEADERS["client_instance_id"],
        "principal": hashlib.sha256(b"pepper" + b"User:alice").hexdigest(),
    }


def test_a_renamed_attribute_keeps_its_type_and_only_a_hashed_one_becomes_a_string():
    original = client_metrics()
    attributes = original.resource_metrics[0].resource.attributes
    attributes.append(KeyValue(key="pid", value=AnyValue(int_value=1234)))
    attributes.append(KeyValue(key="ratio", value=AnyValue(double_value=0.5)))
    attributes.append(KeyValue(key="pod", value=AnyValue(int_value=7)))
    rules = [AttributeRule(action="rename", attribute="pid", to="process.pid"),
             AttributeRule(action="rename", attribute="ratio", to="sample.ratio"),
             AttributeRule(action="hash", attribute="pod", salt="s"),
             AttributeRule(action="rename", attribute="pod", to="pod.hash")]
    enriched = Enricher(EnrichConfig(rules=rules)).enrich(original.SerializeToString(), {})

    kept = {a.key: a.value for a in MetricsData.FromString(enriched).resource_metrics[0].resource.attributes}
    assert kept["process.pid"] == AnyValue(int_value=1234) and kept["sample.ratio"] == AnyValue(double_value=0.5)
    assert kept["pod.hash"] == AnyValue(string_value=hashlib.sha256(b"s7").hexdigest())
    assert not {"pid", "ratio", "pod"} & set(kept)


@pytest.mark.parametrize("client_order", [("host.name", "service.name"), ("service.name", "host.name")])
def test_a_renamed_attribute_replaces_the_clients_own_of_that_name_and_every_key_stays_unique(client_order):
    """OTLP resource attribute keys are unique: a collector or backend would pick either of two at random."""
    original = client_metrics()
    values = {"host.name": "pod-a", "service.name": "payments"}
    original.resource_metrics[0].resource.attributes.extend(
        KeyValue(key=key, value=AnyValue(string_value=values[key])) for key in client_order)
    rules = [AttributeRule(action="rename", attribute="host.name", to="service.name")]
    enriched = Enricher(EnrichConfig(rules=rules)).enrich(original.SerializeToString(), {"client_id": "c1"})

    keys = [a.key for a in MetricsData.FromString(enriched).resource_metrics[0].resource.attributes]
    assert sorted(keys) == ["client_id", "service.name"]
    assert _resource(enriched) == {"client_id": "c1", "service.name": "pod-a"}


def test_concatenated_records_are_one_export_request_with_every_resource():
    enricher = Enricher(EnrichConfig())
    first = enricher.enrich(client_metrics("a").SerializeToString(), {"client_id": "a"})
    second = enricher.enrich(client_metrics("b").SerializeToString(), {"client_id": "b"})
    request = ExportMetricsServiceRequest.FromString(first + second)
    assert [points.attributes(rm.resource.attributes)["client_id"] for rm in request.resource_metrics] == ["a", "b"]


def test_without_headers_or_rules_the_payload_passes_through_unchanged():
    payload = client_metrics().SerializeToString()
    assert Enricher(EnrichConfig()).enrich(payload, {}) is payload


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\x12\x05"])
def test_broken_protobuf_framing_is_an_error_not_a_silent_pass(garbage):
    with pytest.raises(ValueError):
        count_points(Enricher(EnrichConfig()).enrich(garbage, HEADERS))


def _kv(key: bytes, value: bytes = b"") -> bytes:
    return field(1, field(1, key) + (field(2, field(1, value)) if value else b""))   # Resource.attributes


_TOO_COSTLY = {
    # 20 000 empty ResourceMetrics (40 KB) would each get the headers: 1.7 MB. Such a 1.4 KB zstd record of 8 M
    # became a 688 MiB request after 32 s with 3.3 GB RSS.
    "many tiny resource metrics": b"\x0a\x00" * 20_000,
    # One ResourceMetrics of 300 000 empty ScopeMetrics: nothing multiplied, but a Python walk of every field.
    "a resource metrics of many tiny fields": field(1, b"\x12\x00" * 300_000),
    # A resource of 300 000 empty attributes, walked for the keys the headers replace.
    "a resource of many tiny attributes": field(1, field(1, b"\x0a\x00" * 300_000)),
    # 1500 distinct small resources, each looked up (the look-ups of small resources are cached, and count all the
    # same).
    "many small resources of many tiny attributes": b"".join(
        field(1, field(1, b"\x0a\x00" * 200 + _kv(b"n", str(i).encode()))) for i in range(1500)),
}


@pytest.mark.parametrize("payload", _TOO_COSTLY.values(), ids=_TOO_COSTLY)
def test_a_record_whose_enrichment_would_cost_far_more_than_its_size_is_refused_as_too_large(payload):
    with pytest.raises(contract.DecodeError) as refused:
        Enricher(EnrichConfig()).enrich(payload, HEADERS)
    assert refused.value.reason == "too-large"


def test_a_small_compressed_record_of_millions_of_messages_is_refused_when_prepared():
    """The pipeline dead-letters (or counts and skips) what preparing a record raises as a DecodeError."""
    import zstandard
    from kcm_bridge.consumer import Record
    from kcm_bridge.pipeline import Preparer

    value = zstandard.ZstdCompressor(level=19).compress(b"\x0a\x00" * 2_000_000)
    headers = [(contract.CONTENT_ENCODING_HEADER, b"zstd")] + [(k, v.encode()) for k, v in HEADERS.items()]
    assert len(value) < 1024
    with pytest.raises(contract.DecodeError, match="protobuf") as refused:
        Preparer(Enricher(EnrichConfig()))(Record("metrics", 0, 0, b"k", value, headers))
    assert refused.value.reason == "too-large"


def test_a_small_compressed_record_of_millions_of_data_points_is_refused_before_they_are_parsed():
    """Enrichment walks resources only: 16 MiB of empty data points (a 1.5 KB zstd record) reached the point count,
    whose parse built 8 million messages, some 670 MiB, in a pod limited to 512 MiB."""
    import zstandard
    from kcm_bridge.consumer import Record
    from kcm_bridge.pipeline import Preparer

    points = field(1, field(2, field(2, field(5, b"\x0a\x00" * 8_000_000))))  # gauge data points, 16 MB
    value = zstandard.ZstdCompressor(level=19).compress(points)
    headers = [(contract.CONTENT_ENCODING_HEADER, b"zstd")] + [(k, v.encode()) for k, v in HEADERS.items()]
    assert len(value) < 4096
    with pytest.raises(contract.DecodeError, match="protobuf messages") as refused:
        Preparer(Enricher(EnrichConfig()))(Record("metrics", 0, 0, b"k", value, headers))
    assert refused.value.reason == "too-large"


@pytest.mark.parametrize("prefix", [b"", b"\n", b"\xef\xbb\xbf\r\n"], ids=["bare", "newline", "bom"])
def test_headerless_otlp_json_is_prepared_as_its_protobuf_after_a_newline_or_a_byte_order_mark_too(prefix):
    """A pretty-printed OTLP/JSON file produced without headers (kcat -P) is JSON, not a corrupt protobuf."""
    from google.protobuf import json_format

    from kcm_bridge.consumer import Record
    from kcm_bridge.pipeline import Preparer

    value = prefix + json_format.MessageToJson(client_metrics("payments-1"), indent=2).encode()
    prepared, points_counted = Preparer(Enricher(EnrichConfig()))(Record("metrics", 0, 0, None, value, []))
    assert MetricsData.FromString(prepared) == client_metrics("payments-1")
    assert points_counted == 2


def test_records_of_many_real_resources_and_one_resource_with_large_added_attributes_are_enriched():
    many = MetricsData()
    for i in range(3000):   # some 390 KB: a plain OTLP batch, walked within the budget
        resource_metrics = many.resource_metrics.add()
        resource_metrics.resource.attributes.extend([
            KeyValue(key="service.name", value=AnyValue(string_value=f"checkout-{i}")),
            KeyValue(key="k8s.pod.name", value=AnyValue(string_value=f"checkout-7d9f8b6c5-{i:05d}")),
            KeyValue(key="client_id", value=AnyValue(string_value="spoofed"))])   # replaced: the slow path
        resource_metrics.scope_metrics.extend(client_metrics(f"app-{i}").resource_metrics[0].scope_metrics)
    enriched = Enricher(EnrichConfig()).enrich(many.SerializeToString(), HEADERS)
    assert [_resource(enriched, i)["client_id"] for i in (0, 2999)] == ["payments-1"] * 2
    assert count_points(enriched) == 6000

    large = Enricher(EnrichConfig(static_attributes={"note": "x" * 200_000})).enrich(
        client_metrics().SerializeToString(), HEADERS)
    assert _resource(large)["note"] == "x" * 200_000


def _keys(data: bytes, index: int = 0) -> list[str]:
    """Every resource attribute key, repeats included (a dict would hide a duplicate)."""
    return [a.key for a in MetricsData.FromString(data).resource_metrics[index].resource.attributes]


def test_varints_round_trip_at_every_length_boundary():
    """Every length the enricher writes is a varint: 128 written as one byte would never end."""
    from kcm_bridge.wire import _read_varint, varint

    assert varint(127) == b"\x7f" and varint(128) == b"\x80\x01"
    for value in (0, 1, 127, 128, 129, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**63 - 1):
        assert _read_varint(varint(value), 0) == (value, len(varint(value))), value


def test_every_length_of_an_added_attribute_keeps_the_record_whole():
    original = client_metrics().SerializeToString()
    for length in range(90, 300):
        enriched = Enricher(EnrichConfig(static_attributes={"note": "n" * length})).enrich(original, HEADERS)
        assert count_points(enriched) == 2 and _resource(enriched)["note"] == "n" * length, length


def test_header_attributes_false_adds_only_the_static_ones():
    """Turned off so that `principal` or the client's address do not reach the backend: they must not."""
    enriched = Enricher(EnrichConfig(header_attributes=False, static_attributes={"env": "prod"})).enrich(
        client_metrics().SerializeToString(), HEADERS)
    assert _keys(enriched) == ["env"]


def test_a_static_attribute_named_like_a_header_replaces_the_brokers_value():
    enriched = Enricher(EnrichConfig(static_attributes={"cluster_id": "prod-eu"})).enrich(
        client_metrics().SerializeToString(), {**HEADERS, "cluster_id": "abc"})
    assert _resource(enriched)["cluster_id"] == "prod-eu" and _keys(enriched).count("cluster_id") == 1


def test_a_hash_rule_on_a_header_the_client_also_sent_leaves_one_key():
    original = client_metrics()
    original.resource_metrics[0].resource.attributes.append(
        KeyValue(key="principal", value=AnyValue(string_value="User:from-client")))
    rules = [AttributeRule(action="hash", attribute="principal", salt="pepper")]
    enriched = Enricher(EnrichConfig(rules=rules)).enrich(original.SerializeToString(), HEADERS)
    assert sorted(_keys(enriched)) == sorted(HEADERS)
    assert _resource(enriched)["principal"] == hashlib.sha256(b"pepper" + b"User:alice").hexdigest()


def test_a_hashed_and_renamed_attribute_replaces_the_clients_own_of_the_new_name():
    original = client_metrics()
    original.resource_metrics[0].resource.attributes.extend([
        KeyValue(key="pod", value=AnyValue(string_value="7")),
        KeyValue(key="pod.hash", value=AnyValue(string_value="spoof"))])
    rules = [AttributeRule(action="hash", attribute="pod", salt="s"),
             AttributeRule(action="rename", attribute="pod", to="pod.hash")]
    enriched = Enricher(EnrichConfig(rules=rules)).enrich(original.SerializeToString(), {})
    assert _keys(enriched) == ["pod.hash"]
    assert _resource(enriched)["pod.hash"] == hashlib.sha256(b"s7").hexdigest()


def test_hash_rules_hash_booleans_as_text_and_arrays_by_their_encoding_and_chain_in_order():
    original = client_metrics()
    array = AnyValue()
    array.array_value.values.add().int_value = 1
    original.resource_metrics[0].resource.attributes.extend([
        KeyValue(key="flag", value=AnyValue(bool_value=True)), KeyValue(key="arr", value=array)])
    rules = [AttributeRule(action="hash", attribute="flag", salt="s"),
             AttributeRule(action="hash", attribute="arr", salt="s"),
             AttributeRule(action="hash", attribute="client_id", salt="a"),
             AttributeRule(action="hash", attribute="client_id", salt="b")]
    enriched = Enricher(EnrichConfig(rules=rules)).enrich(original.SerializeToString(), {"client_id": "payments-1"})
    found = _resource(enriched)
    assert found["flag"] == hashlib.sha256(b"strue").hexdigest()
    assert found["arr"] == hashlib.sha256(b"s" + array.SerializeToString().hex().encode()).hexdigest()
    assert found["client_id"] == hashlib.sha256(
        b"b" + hashlib.sha256(b"apayments-1").hexdigest().encode()).hexdigest()


def test_the_growth_bound_holds_at_its_threshold():
    """Records of many tiny resources each get the added attributes: refused as soon as that would grow the record
    more than the bound, not 2 or 8 times past it."""
    from kcm_bridge import enrich

    enricher = Enricher(EnrichConfig())
    added = len(enricher.encode(HEADERS).resource)
    # (n - 1) * added > GROWTH * 2n + ALLOWANCE first holds at this n (each empty ResourceMetrics is 2 bytes)
    refused = next(n for n in range(2, 10**6)
                   if (n - 1) * added > enrich._GROWTH * 2 * n + enrich._ALLOWANCE)
    assert count_points(enricher.enrich(b"\x0a\x00" * (refused - 1), HEADERS)) == 0
    with pytest.raises(contract.DecodeError) as too_large:
        enricher.enrich(b"\x0a\x00" * refused, HEADERS)
    assert too_large.value.reason == "too-large"


def test_a_half_megabyte_resource_of_empty_attributes_is_counted_and_refused():
    with pytest.raises(contract.DecodeError) as refused:
        Enricher(EnrichConfig()).enrich(field(1, field(1, b"\x0a\x00" * 250_000)), HEADERS)
    assert refused.value.reason == "too-large"
