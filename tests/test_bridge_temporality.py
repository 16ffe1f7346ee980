"""Delta → cumulative: running totals per stream with OpenTelemetry's reset semantics, bounded state."""

from __future__ import annotations

import dis
import sys
import tracemalloc

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (AGGREGATION_TEMPORALITY_CUMULATIVE,
                                                        AGGREGATION_TEMPORALITY_DELTA, MetricsData)

import kcm_bridge.pipeline as pipeline_module
from kcm_bridge.temporality import MAX_ITEMS, DeltaToCumulative
from kcm_bridge.wire import field
from kcm_common import contract
from payloads import client_metrics

P0, P1 = ("metrics", 0), ("metrics", 1)
SECOND = 10**9
T0 = 1_700_000_000 * SECOND


def _push(delta: int, t_ns: int, client: str = "payments-producer") -> MetricsData:
    data = client_metrics(client, t_ns)
    total = data.resource_metrics[0].scope_metrics[0].metrics[1]
    total.sum.data_points[0].as_int = delta
    return data


def _sum_point(data: MetricsData):
    metric = data.resource_metrics[0].scope_metrics[0].metrics[1]
    return metric, (metric.sum.data_points[0] if metric.sum.data_points else None)


def test_running_totals_equal_the_sum_of_the_raw_deltas_and_keep_the_first_start_time():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    deltas = [5, 0, 7, 3]
    seen = []
    for i, delta in enumerate(deltas):
        push = _push(delta, T0 + i * SECOND)
        assert converter.convert(push, "instance-a", P0, now_s=i)
        metric, point = _sum_point(push)
        assert metric.sum.aggregation_temporality == AGGREGATION_TEMPORALITY_CUMULATIVE
        seen.append((point.start_time_unix_nano, point.as_int))
    assert [total for _, total in seen] == [5, 5, 12, 15]
    assert {start for start, _ in seen} == {T0 - SECOND}


def test_gauges_pass_unchanged_and_streams_of_other_instances_are_separate():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    first, other = _push(4, T0), _push(9, T0)
    converter.convert(first, "instance-a", P0, now_s=0)
    converter.convert(other, "instance-b", P0, now_s=0)
    assert _sum_point(first)[1].as_int == 4 and _sum_point(other)[1].as_int == 9
    gauge = first.resource_metrics[0].scope_metrics[0].metrics[0]
    assert gauge.gauge.data_points[0].as_double == 12.5


def test_a_redelivered_push_is_dropped_not_counted_twice():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    converter.convert(_push(5, T0), "a", P0, now_s=0)
    again = _push(5, T0)
    converter.convert(again, "a", P0, now_s=1)
    kept = again.resource_metrics[0].scope_metrics[0].metrics
    assert [metric.WhichOneof("data") for metric in kept] == ["gauge"]   # the sum went with its point, not empty
    later = _push(1, T0 + SECOND)
    converter.convert(later, "a", P0, now_s=2)
    assert _sum_point(later)[1].as_int == 6 and converter.dropped_points == 1


def test_a_re_delivered_record_of_delta_sums_only_leaves_no_empty_metric_scope_or_resource():
    """A re-delivered push was exported as sums with no data points."""
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    first, again = _push(5, T0), _push(5, T0)
    for data in (first, again):
        del data.resource_metrics[0].scope_metrics[0].metrics[0]   # the gauge: only the delta sum is left
    extra = again.resource_metrics.add()   # a second resource, with a sum of its own that is new
    extra.CopyFrom(_push(2, T0).resource_metrics[0])
    extra.resource.attributes.add(key="host", value=AnyValue(string_value="b"))
    converter.convert(first, "a", P0, now_s=0)
    converter.convert(again, "a", P0, now_s=1)
    assert len(again.resource_metrics) == 1 and again.resource_metrics[0].resource == extra.resource
    assert [m.name for m in again.resource_metrics[0].scope_metrics[0].metrics] == [
        m.name for m in _push(2, T0).resource_metrics[0].scope_metrics[0].metrics]


def test_lost_state_restarts_the_stream_with_a_new_start_time():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=10)
    converter.convert(_push(5, T0), "a", P0, now_s=0)
    converter.forget([P0])                       # the partition moved away
    moved = _push(2, T0 + SECOND)
    converter.convert(moved, "a", P0, now_s=1)
    assert (_sum_point(moved)[1].start_time_unix_nano, _sum_point(moved)[1].as_int) == (T0, 2)

    idle = _push(3, T0 + 100 * SECOND)
    converter.convert(idle, "a", P1, now_s=50)   # idle longer than the expiry
    assert (_sum_point(idle)[1].start_time_unix_nano, _sum_point(idle)[1].as_int) == (T0 + 99 * SECOND, 3)


def test_state_is_bounded_by_evicting_the_least_recently_updated_stream():
    converter = DeltaToCumulative(max_streams=3, idle_expiry_s=600)
    for i in range(10):
        converter.convert(_push(1, T0), f"instance-{i}", P0, now_s=i)
    assert len(converter) == 3 and converter.evicted_streams == 7


def test_a_total_past_int64_starts_the_series_again_instead_of_failing_the_record():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    converter.convert(_push(2**63 - 1, T0), "a", P0, now_s=0)
    over = _push(5, T0 + SECOND)
    converter.convert(over, "a", P0, now_s=1)
    assert (_sum_point(over)[1].start_time_unix_nano, _sum_point(over)[1].as_int) == (T0, 5)
    after = _push(1, T0 + 2 * SECOND)
    converter.convert(after, "a", P0, now_s=2)
    assert (_sum_point(after)[1].start_time_unix_nano, _sum_point(after)[1].as_int) == (T0, 6)


def test_a_nan_or_infinite_delta_is_passed_on_and_never_added_to_the_total():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    seen = []
    for i, delta in enumerate([5.0, float("nan"), 5.0, float("inf"), 5.0]):
        push = _push(0, T0 + i * SECOND)
        _sum_point(push)[1].as_double = delta
        converter.convert(push, "a", P0, now_s=i)
        seen.append((_sum_point(push)[1].start_time_unix_nano, _sum_point(push)[1].as_double))
    assert [value for _, value in seen][::2] == [5.0, 10.0, 15.0]
    assert str(seen[1][1]) == "nan" and seen[3][1] == float("inf")
    assert len({start for start, _ in seen}) == 1
    whole = _push(3, T0 + 9 * SECOND)
    converter.convert(whole, "a", P0, now_s=9)
    assert _sum_point(whole)[1].as_int == 18 and _sum_point(whole)[1].start_time_unix_nano == seen[0][0]
    huge = [_push(0, T0 + (10 + i) * SECOND) for i in range(2)]
    own_start = _sum_point(huge[1])[1].start_time_unix_nano
    for i, push in enumerate(huge):
        _sum_point(push)[1].as_double = 1e308
        converter.convert(push, "a", P0, now_s=10 + i)
    assert _sum_point(huge[0])[1].start_time_unix_nano == seen[0][0]
    # Past the largest double: started again from its own start time, never infinite.
    assert (_sum_point(huge[1])[1].as_double, _sum_point(huge[1])[1].start_time_unix_nano) == (1e308, own_start)
    assert own_start != seen[0][0]


def test_each_resource_of_a_record_has_its_own_streams():
    """Plain OTLP records (the collector's Kafka exporter writes no key) may carry several resources: none of their
    points is taken for a re-delivery of another's."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    def record(t_ns: int, values: dict[str, int]) -> MetricsData:
        data = MetricsData()
        for service, value in values.items():
            resource = data.resource_metrics.add()
            resource.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
            metric = resource.scope_metrics.add().metrics.add(name="requests")
            metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
            metric.sum.is_monotonic = True
            metric.sum.data_points.add(start_time_unix_nano=t_ns - SECOND, time_unix_nano=t_ns, as_int=value)
        return data

    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    totals = []
    for i in range(3):
        data = record(T0 + i * SECOND, {"checkout": 1, "billing": 100})
        converter.convert(data, "", P0, now_s=i)
        totals.append([[p.as_int for p in r.scope_metrics[0].metrics[0].sum.data_points]
                       for r in data.resource_metrics])
    assert totals == [[[1], [100]], [[2], [200]], [[3], [300]]]
    assert (len(converter), converter.dropped_points) == (2, 0)


def test_a_client_pushing_less_often_than_the_idle_expiry_keeps_its_total():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    seen = []
    for i, delta in enumerate([100, 120, 130]):
        push = _push(delta, T0 + i * 900 * SECOND)
        converter.convert(push, "a", P0, now_s=i * 900, push_interval_s=900)
        seen.append((_sum_point(push)[1].start_time_unix_nano, _sum_point(push)[1].as_int))
    assert [total for _, total in seen] == [100, 220, 350] and len({start for start, _ in seen}) == 1
    late = _push(1, T0 + 5000 * SECOND)
    converter.convert(late, "a", P0, now_s=1800 + 1801, push_interval_s=900)  # past twice its interval: expired
    assert _sum_point(late)[1].as_int == 1


@pytest.mark.parametrize(("interval", "expected"), [(b"900000", [100, 220, 350, 7]), (None, [100, 120, 130, 7])])
def test_the_bridge_keeps_a_stream_for_twice_the_push_interval_its_records_carry(monkeypatch, interval, expected):
    from kcm_bridge import temporality
    from kcm_bridge.config import EnrichConfig
    from kcm_bridge.consumer import Record
    from kcm_bridge.enrich import Enricher
    from kcm_bridge.pipeline import Preparer
    from kcm_common import contract

    moments = [0.0, 900.0, 1800.0, 3601.0]   # pushes 15 minutes apart, then one after more than twice that
    clock = iter(moments)
    monkeypatch.setattr(temporality.time, "monotonic", lambda: next(clock))
    prepare = Preparer(Enricher(EnrichConfig()), DeltaToCumulative(max_streams=100, idle_expiry_s=600))
    totals = []
    for i, delta in enumerate([100, 120, 130, 7]):
        headers = [(contract.CONTENT_TYPE_HEADER, contract.CONTENT_TYPE_PROTOBUF.encode()),
                   ("client_instance_id", b"a")] + ([("push_interval_ms", interval)] if interval else [])
        value = _push(delta, T0 + int(moments[i]) * SECOND).SerializeToString()
        payload, _ = prepare(Record("metrics", 0, i, b"a", value, headers))
        totals.append(_sum_point(MetricsData.FromString(payload))[1].as_int)
    assert totals == expected


def _delta_sum(points: list[tuple[int, int, dict[str, str]]], name: str = "requests", scope: str = "app",
               resource: dict[str, str] | None = None) -> MetricsData:
    """One delta sum with a point per (time, delta, attributes)."""
    data = MetricsData()
    resource_metrics = data.resource_metrics.add()
    for key, value in (resource or {}).items():
        resource_metrics.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    scope_metrics = resource_metrics.scope_metrics.add()
    scope_metrics.scope.name = scope
    metric = scope_metrics.metrics.add(name=name)
    metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_DELTA
    for t_ns, delta, attributes in points:
        point = metric.sum.data_points.add(time_unix_nano=t_ns, as_int=delta)
        for key, value in attributes.items():
            point.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return data


def _totals(data: MetricsData) -> list[int]:
    return [point.as_int for point in data.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points]


def test_a_stream_costs_a_small_constant_however_long_the_names_and_values_that_identify_it():
    """max_streams bounds memory only if each stream does: 200 records of 60 KB attribute values (300 bytes each
    in Kafka, compressed) pinned 186 MiB when the values were kept verbatim in the streams' keys."""
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    long = "x" * 100_000

    def push(t_ns: int) -> MetricsData:
        return _delta_sum([(t_ns, i + 1, {"topic": f"{long}{i}", "partition": long}) for i in range(20)],
                          name=long, scope=long, resource={"host": long})

    tracemalloc.start()
    try:
        first = push(T0)
        converter.convert(first, long, P0, now_s=0)
        assert _totals(first) == list(range(1, 21))       # twenty streams, each its own total
        second = push(T0 + SECOND)
        converter.convert(second, long, P0, now_s=1)
        assert _totals(second) == [2 * total for total in range(1, 21)]
        del first, second
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(converter) == 20
    assert held < 20 * 1024   # with the values kept verbatim, these streams held some 4 MB


def test_points_are_one_stream_whatever_their_attribute_order_and_separate_when_their_attributes_differ():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    both = {"topic": "payments", "partition": "0"}
    converter.convert(_delta_sum([(T0, 1, both)]), "a", P0, now_s=0)
    reordered = _delta_sum([(T0 + SECOND, 2, dict(reversed(list(both.items()))))])
    converter.convert(reordered, "a", P0, now_s=1)
    assert _totals(reordered) == [3]

    # The same bytes split differently into keys and values: {"a": (no value), "": "x"} and {"a": "x"}.
    split = _delta_sum([(T0, 5, {})])
    split.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0].attributes.extend(
        [KeyValue(key="a"), KeyValue(value=AnyValue(string_value="x"))])
    joined = _delta_sum([(T0, 7, {"a": "x"})])
    for data in (split, joined):
        converter.convert(data, "b", P0, now_s=2)
    assert (_totals(split), _totals(joined), converter.dropped_points) == ([5], [7], 0)


def test_a_push_interval_past_kip_714s_hour_keeps_streams_two_hours_not_for_ever():
    """A record's push_interval_ms may say anything up to twelve digits: trusted as it was, its streams never
    expired, and neither did any stream behind them in the expiry order."""
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    claims_years = _push(5, T0)
    converter.convert(claims_years, "slow", P0, now_s=0, push_interval_s=999_999_999.999)
    converter.convert(_push(1, T0), "behind", P0, now_s=1)
    again = _push(3, T0 + 7201 * SECOND)
    converter.convert(again, "slow", P0, now_s=7202, push_interval_s=999_999_999.999)
    assert _sum_point(again)[1].as_int == 3            # started again, not 8
    assert len(converter) == 1                         # "behind" expired too


def _deletions(function, *args) -> int:
    """How many `del x[...]` statements `function`'s own code ran in this call."""
    code, deleted = function.__code__, 0

    def trace(frame, event, arg):
        nonlocal deleted
        if event == "opcode" and frame.f_code.co_code[frame.f_lasti] == dis.opmap["DELETE_SUBSCR"]:
            deleted += 1
        if event == "call":
            frame.f_trace_opcodes = frame.f_code is code
            return trace if frame.f_code is code else None
        return trace

    sys.settrace(trace)
    try:
        function(*args)
    finally:
        sys.settrace(None)
    return deleted


def test_re_delivered_points_are_removed_in_one_go_not_one_deletion_each():
    """Each deletion from a repeated field shifts every point after it: one per re-delivered point made a record
    alternating fresh and re-delivered points quadratic (a 194 KB zstd record held the consuming thread 16.5 s)."""
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    converter.convert(_delta_sum([(T0, 1, {})]), "a", P0, now_s=0)
    mixed = _delta_sum([(T0 + (i // 2 + 1) * SECOND if i % 2 else T0, 1, {}) for i in range(2000)])
    deletions = _deletions(DeltaToCumulative.convert, converter, mixed, "a", P0, 1.0)
    assert _totals(mixed) == list(range(2, 1002))      # the fresh points, in order, counted once each
    assert converter.dropped_points == 1000
    assert deletions <= 1


_HUGE = {
    # A small compressed record can decompress to millions of these: 8 M empty ResourceMetrics held the consuming
    # thread 20 s.
    "empty resource metrics": b"\x0a\x00" * (MAX_ITEMS + 1),
    "empty scope metrics": field(1, b"\x12\x00" * MAX_ITEMS),
    "empty metrics": field(1, field(2, b"\x12\x00" * MAX_ITEMS)),
    # MetricsData > ResourceMetrics > ScopeMetrics > Metric { sum (7) { empty points (1), DELTA (2 = 1) } }
    "delta points": field(1, field(2, field(2, field(7, b"\x0a\x00" * MAX_ITEMS + b"\x10\x01")))),
}


@pytest.mark.parametrize("payload", _HUGE.values(), ids=_HUGE)
def test_a_record_holding_more_than_max_items_is_refused_as_too_large(payload):
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    with pytest.raises(contract.DecodeError) as refused:
        converter.convert(MetricsData.FromString(payload), "a", P0, now_s=0)
    assert refused.value.reason == "too-large" and len(converter) == 0


def test_the_bridge_dead_letters_a_record_too_large_to_convert_under_its_own_reason():
    """Preparing raises the DecodeError the pipeline dead-letters (or counts and skips) under its reason."""
    from kcm_bridge.config import EnrichConfig
    from kcm_bridge.consumer import Record
    from kcm_bridge.enrich import Enricher
    from kcm_bridge.pipeline import Preparer

    prepare = Preparer(Enricher(EnrichConfig()), DeltaToCumulative(max_streams=100, idle_expiry_s=600))
    headers = [(contract.CONTENT_TYPE_HEADER, contract.CONTENT_TYPE_PROTOBUF.encode())]
    with pytest.raises(contract.DecodeError) as refused:
        prepare(Record("metrics", 0, 0, b"k", _HUGE["delta points"], headers))
    assert refused.value.reason == "too-large"


def test_a_record_too_large_to_parse_for_conversion_is_refused_before_it_is_parsed(monkeypatch):
    """A 16 MiB payload of empty ResourceMetrics (a few KB compressed) took 523 MiB and 1.2 s to parse before
    `convert` counted its items: over the bridge's 512 MiB limit, it was killed on that record on every restart."""
    from kcm_bridge.config import EnrichConfig
    from kcm_bridge.consumer import Record
    from kcm_bridge.enrich import Enricher
    from kcm_bridge.pipeline import Preparer
    from kcm_bridge.temporality import MAX_PAYLOAD_BYTES

    parsed = []
    monkeypatch.setattr(pipeline_module, "MetricsData", type("Spy", (), {"FromString": staticmethod(
        lambda data: parsed.append(len(data)) or MetricsData.FromString(data))}))
    prepare = Preparer(Enricher(EnrichConfig()), DeltaToCumulative(max_streams=100, idle_expiry_s=600))
    headers = [(contract.CONTENT_TYPE_HEADER, contract.CONTENT_TYPE_PROTOBUF.encode())]
    # Refused by the message bound that every reader applies first (2 million empty messages)...
    bomb = b"\x0a\x00" * (MAX_PAYLOAD_BYTES // 2 + 1)
    with pytest.raises(contract.DecodeError) as refused:
        prepare(Record("metrics", 0, 0, b"k", bomb, headers))
    assert refused.value.reason == "too-large"
    # ... and one of few messages but too many bytes by the conversion's own limit.
    long = field(1, field(3, b"x" * (MAX_PAYLOAD_BYTES + 1)))   # one ResourceMetrics with a long schema_url
    with pytest.raises(contract.DecodeError) as refused:
        prepare(Record("metrics", 0, 0, b"k", long, headers))
    assert refused.value.reason == "too-large" and f"at most {MAX_PAYLOAD_BYTES}" in str(refused.value)
    assert parsed == []
    # Smaller records are parsed and converted as before.
    payload = _delta_sum([(T0 + SECOND, 3, {})]).SerializeToString()
    prepared, points = prepare(Record("metrics", 0, 1, b"k", payload, headers))
    assert points == 1 and parsed == [len(payload)]


def _sums(*points: tuple[str, str, dict, float | int], t_ns: int = T0) -> MetricsData:
    """One record with a delta sum point for each (scope, metric name, attributes, value)."""
    data = MetricsData()
    resource = data.resource_metrics.add()
    scopes: dict = {}
    for scope, name, attributes, value in points:
        if scope not in scopes:
            scopes[scope] = resource.scope_metrics.add()
            scopes[scope].scope.name = scope
        metric = scopes[scope].metrics.add()
        metric.name = name
        metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_DELTA
        metric.sum.is_monotonic = True
        point = metric.sum.data_points.add()
        point.time_unix_nano, point.start_time_unix_nano = t_ns, t_ns - SECOND
        if isinstance(value, int):
            point.as_int = value
        else:
            point.as_double = value
        point.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items())
    return data


def _values(data: MetricsData) -> list:
    return [point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
            for resource in data.resource_metrics for scope in resource.scope_metrics for metric in scope.metrics
            for point in metric.sum.data_points]


@pytest.mark.parametrize(("first", "second"), [
    (("lib-a", "kafka.x", {}), ("lib-b", "kafka.x", {})),          # the same metric in two scopes
    (("ab", "c", {}), ("a", "bc", {})),                            # scope and name that run together
    (("s", "m", {"a": "1", "b": "x"}), ("s", "m", {"a": "1", "b": "y"})),   # points differing in a later attribute
])
def test_streams_that_differ_in_scope_name_or_any_attribute_keep_their_own_totals(first, second):
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    one, other = _sums((*first, 5)), _sums((*second, 7), t_ns=T0 + SECOND)
    converter.convert(one, "a", P0, now_s=0)
    converter.convert(other, "a", P0, now_s=1)
    assert (_values(one), _values(other), len(converter)) == ([5], [7], 2)


def test_a_sum_of_unspecified_temporality_passes_unchanged():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    for i in range(2):
        push = _sums(("s", "m", {}, 5), t_ns=T0 + i * SECOND)
        push.resource_metrics[0].scope_metrics[0].metrics[0].sum.aggregation_temporality = 0
        assert not converter.convert(push, "a", P0, now_s=i)
        assert push.resource_metrics[0].scope_metrics[0].metrics[0].sum.aggregation_temporality == 0
        assert _values(push) == [5]


def test_eviction_takes_the_least_recently_updated_stream_not_the_oldest():
    converter = DeltaToCumulative(max_streams=2, idle_expiry_s=600)
    steps = [("a", 1, 0), ("b", 1, 0), ("a", 2, 1), ("c", 1, 1), ("a", 4, 2)]   # a is updated before c comes
    totals = []
    for name, delta, second in steps:
        push = _sums(("s", name, {}, delta), t_ns=T0 + second * SECOND)
        converter.convert(push, "i", P0, now_s=second)
        totals.append(_values(push)[0])
    assert totals[-1] == 7 and converter.evicted_streams == 1   # b went; a kept its total


def test_a_stream_is_kept_as_long_as_its_latest_records_push_interval_asks():
    """A subscription changed from 10 s to 10 min: the streams must outlive the new interval, not the old one."""
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=60)
    seen = []
    for now_s, interval_s, delta in [(0, 10, 5), (10, 600, 1), (1000, 600, 1)]:
        push = _sums(("s", "m", {}, delta), t_ns=T0 + now_s * SECOND)
        converter.convert(push, "i", P0, now_s=now_s, push_interval_s=interval_s)
        seen.append(_values(push)[0])
    assert seen == [5, 6, 7]


def test_a_re_delivered_nan_point_is_dropped_and_so_is_an_older_point_after_it():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    pushes = [_sums(("s", "m", {}, 5.0), t_ns=T0), _sums(("s", "m", {}, float("nan")), t_ns=T0 + SECOND),
              _sums(("s", "m", {}, float("nan")), t_ns=T0 + SECOND), _sums(("s", "m", {}, 1.0), t_ns=T0 + SECOND // 2)]
    for i, push in enumerate(pushes):
        converter.convert(push, "i", P0, now_s=i)
    assert _values(pushes[0]) == [5.0] and len(_values(pushes[1])) == 1
    assert (_values(pushes[2]), _values(pushes[3]), converter.dropped_points) == ([], [], 2)


@pytest.mark.parametrize(("first", "then"), [(2**63 - 1, 1), (-2**63, -1)])
def test_a_total_just_past_int64_starts_the_series_again(first, then):
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    one, two = _sums(("s", "m", {}, first)), _sums(("s", "m", {}, then), t_ns=T0 + SECOND)
    converter.convert(one, "i", P0, now_s=0)
    converter.convert(two, "i", P0, now_s=1)
    point = two.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0]
    assert (point.as_int, point.start_time_unix_nano) == (then, T0)   # its own start: a new series


def test_a_stream_idle_exactly_the_expiry_starts_again():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=10)
    one, two = _sums(("s", "m", {}, 5)), _sums(("s", "m", {}, 2), t_ns=T0 + 10 * SECOND)
    converter.convert(one, "i", P0, now_s=0)
    converter.convert(two, "i", P0, now_s=10)
    assert _values(two) == [2]


def test_a_stream_whose_client_moved_partition_is_forgotten_with_the_partition_it_is_read_from_now():
    """A topic given more partitions moves keys: the revoke of the client's new partition restarts its stream, the
    revoke of the one it was first read from does not."""
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    converter.convert(_push(5, T0), "a", P0, now_s=0)
    converter.convert(_push(5, T0 + SECOND), "a", P1, now_s=1)    # its key hashes to P1 now
    converter.forget([P0])
    kept = _push(5, T0 + 2 * SECOND)
    converter.convert(kept, "a", P1, now_s=2)
    assert (_sum_point(kept)[1].start_time_unix_nano, _sum_point(kept)[1].as_int) == (T0 - SECOND, 15)
    converter.forget([P1])
    restarted = _push(5, T0 + 3 * SECOND)
    converter.convert(restarted, "a", P1, now_s=3)
    assert (_sum_point(restarted)[1].start_time_unix_nano, _sum_point(restarted)[1].as_int) == (T0 + 2 * SECOND, 5)


def test_an_int_point_after_double_deltas_is_never_truncated():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    seen = []
    for i, delta in enumerate([2.5, 1, -4.0, -1, 0.5, 1]):
        push = _push(0, T0 + i * SECOND)
        point = _sum_point(push)[1]
        if isinstance(delta, float):
            point.as_double = delta
        else:
            point.as_int = delta
        converter.convert(push, "a", P0, now_s=i)
        point = _sum_point(push)[1]
        seen.append((point.WhichOneof("value"), getattr(point, point.WhichOneof("value"))))
    # A fraction stays a double; a whole total is an int again for an int point.
    assert seen == [("as_double", 2.5), ("as_double", 3.5), ("as_double", -0.5), ("as_double", -1.5),
                    ("as_double", -1.0), ("as_int", 0)]
