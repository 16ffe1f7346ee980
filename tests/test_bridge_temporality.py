"""Delta → cumulative: running totals per stream with OpenTelemetry's reset semantics, bounded state."""

from __future__ import annotations

from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, MetricsData

from kcm_bridge.temporality import DeltaToCumulative
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
    assert _sum_point(again)[1] is None
    later = _push(1, T0 + SECOND)
    converter.convert(later, "a", P0, now_s=2)
    assert _sum_point(later)[1].as_int == 6 and converter.dropped_points == 1


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


def test_an_infinite_double_delta_then_an_int_one_starts_the_series_again():
    converter = DeltaToCumulative(max_streams=100, idle_expiry_s=600)
    infinite = _push(0, T0)
    _sum_point(infinite)[1].as_double = float("inf")
    converter.convert(infinite, "a", P0, now_s=0)
    assert _sum_point(infinite)[1].as_double == float("inf")
    whole = _push(3, T0 + SECOND)
    converter.convert(whole, "a", P0, now_s=1)
    assert (_sum_point(whole)[1].start_time_unix_nano, _sum_point(whole)[1].as_int) == (T0, 3)
