"""Rollup rows as OTLP gauges: one gauge per statistic a row has, stamped with its window, identity as resource."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone

import grpc
import pytest

from kcm_common.errors import UserError
from kcm_common.otlp_export import RetryPolicy
from kcm_common.points import attributes, metric_dicts
from kcm_rollups.otlp import (BOUNDS_ATTRIBUTE, RESOLUTION_ATTRIBUTE, SCOPE_NAME, STATISTICS, OtlpTarget,
                              check_endpoint, export, export_requests, export_rows, parse_header_file,
                              resource_columns)
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from spark_support import spark  # noqa: F401  (the session-scoped fixture)

FAST = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.5)
START = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds


def row(metric: str, **statistics) -> dict:
    base = {"resolution": "1m", "metric": metric, "attributes": '{"node_id":"1"}', "client_id": "orders",
            "client_software_name": "librdkafka", "client_software_version": None,
            "start_micros": START, "end_micros": START + 60_000_000}
    return {**base, **statistics}


def test_each_statistic_of_a_row_becomes_a_gauge_over_its_window_with_the_identity_as_resource():
    rows = [row("lat", instances=2, count=3, min=1.0, max=3.0, avg=2.0, p99=math.nan, increase=None),
            row("sent", instances=1, increase=12.0, rate=0.2, attributes="{}")]
    [request] = list(export_requests(rows))
    [resource_metrics] = request.resource_metrics
    assert attributes(resource_metrics.resource.attributes) == {"client_id": "orders",
                                                                "client_software_name": "librdkafka"}
    assert resource_metrics.scope_metrics[0].scope.name == SCOPE_NAME
    metrics = {m["name"]: m for m in metric_dicts(MetricsData(resource_metrics=request.resource_metrics))}
    assert sorted(metrics) == ["lat.avg", "lat.count", "lat.instances", "lat.max", "lat.min",
                               "sent.increase", "sent.instances", "sent.rate"]  # NaN and null say nothing
    [count] = metrics["lat.count"]["points"]
    assert metrics["lat.count"]["type"] == "gauge" and count["value"] == 3 and isinstance(count["value"], int)
    assert metrics["lat.avg"]["points"][0]["value"] == 2.0
    assert (count["start_time_unix_nano"], count["time_unix_nano"]) == (START * 1000, (START + 60_000_000) * 1000)
    assert count["attributes"] == {RESOLUTION_ATTRIBUTE: "1m", "node_id": "1"}
    assert metrics["sent.rate"]["points"][0]["attributes"] == {RESOLUTION_ATTRIBUTE: "1m"}


def test_requests_are_split_to_bound_their_size():
    rows = [row(f"m{i}", count=i, min=float(i)) for i in range(10)]
    requests = list(export_requests(rows, max_points=4))
    sizes = [sum(len(m.gauge.data_points) for r in q.resource_metrics for s in r.scope_metrics for m in s.metrics)
             for q in requests]
    assert sizes == [4, 4, 4, 4, 4]  # two statistics per row, never a row cut in two


def test_a_receiver_that_refuses_is_one_clear_error_and_partial_rejections_are_counted(collector):
    collector.reject_partially_next(1)
    assert export([row("lat", count=1, min=1.0)], OtlpTarget(collector.endpoint)) == (2, 1)
    collector.fail_next(code=grpc.StatusCode.UNAVAILABLE, times=2)  # restarting: retried
    assert export([row("lat", count=1)], OtlpTarget(collector.endpoint), retry=FAST) == (1, 0)
    assert len(collector.exports) == 2 and collector.rejected_calls == 2
    collector.throttle_next(0.3)  # RESOURCE_EXHAUSTED with RetryInfo: waits what the receiver asks
    started = time.monotonic()
    assert export([row("lat", count=1)], OtlpTarget(collector.endpoint), retry=FAST) == (1, 0)
    assert time.monotonic() - started >= 0.3
    collector.fail_next(code=grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(UserError, match="still UNAVAILABLE injected failure after 1 attempts over 0 s"):
        export([row("lat", count=1)], OtlpTarget(collector.endpoint), retry=FAST, give_up_after_s=0)
    collector.fail_next(code=grpc.StatusCode.PERMISSION_DENIED, message="token expired")
    with pytest.raises(UserError, match=f"OTLP export to {collector.endpoint} failed after 0 data points: "
                                        r"PERMISSION_DENIED token expired; check the endpoint's headers \(a token "
                                        r"without the right to write metrics\?\); the Parquet output is complete"):
        export([row("lat", count=1)], OtlpTarget(collector.endpoint))


def test_each_request_gets_its_own_minute_to_be_delivered(collector):
    # Two requests, each throttled once for 1 s: within a 1.9 s limit per request (the spare goes to the passing side,
    # for a slow machine), past it for both together (at least 2 s, however fast the machine).
    collector.throttle_next(1.0)
    collector.reject_partially_next(0, message="")  # the retry of the first request: accepted
    collector.throttle_next(1.0)
    rows = [row("a", count=1, min=1.0), row("b", count=1, min=1.0)]
    patient = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=2.0)  # honours the receiver's 1 s
    assert export(rows, OtlpTarget(collector.endpoint), retry=patient, give_up_after_s=1.9, max_points=2) == (4, 0)
    assert len(collector.exports) == 2 and collector.rejected_calls == 2


def test_point_attributes_keep_their_types_and_rows_of_one_metric_share_it():
    rows = [row("lat", count=1, attributes='{"flag": true, "nested": {"a": 1}, "n": 2, "x": 1.5, "list": ["a"]}'),
            row("lat", count=2, attributes='{"flag": false}')]
    [request] = list(export_requests(rows))
    [metric] = request.resource_metrics[0].scope_metrics[0].metrics   # one metric, two points
    first, second = metric.gauge.data_points
    values = {kv.key: kv.value for kv in first.attributes}
    assert values["flag"].WhichOneof("value") == "bool_value" and values["flag"].bool_value is True
    assert values["nested"].WhichOneof("value") == "kvlist_value"
    assert [(kv.key, kv.value.int_value) for kv in values["nested"].kvlist_value.values] == [("a", 1)]
    assert (values["n"].int_value, values["x"].double_value, values["list"].array_value.values[0].string_value) == (
        2, 1.5, "a")
    assert {kv.key: kv.value.WhichOneof("value") for kv in second.attributes}["flag"] == "bool_value"


def test_point_attributes_never_become_resource_attributes():
    assert resource_columns(("client_id", "metric", "attributes", "principal")) == (
        "client_id", "client_software_name", "client_software_version", "metric", "principal")


def test_nothing_to_export_sends_nothing_and_a_receiver_claiming_more_rejections_than_points_rejected_them_all(
        collector):
    assert export([], OtlpTarget(collector.endpoint), retry=FAST) == (0, 0) and collector.exports == []
    # With no rows, a receiver that is down is no failure: nothing was to go there.
    assert export([], OtlpTarget("127.0.0.1:1"), retry=FAST, give_up_after_s=0) == (0, 0)
    collector.reject_partially_next(100)
    assert export([row("lat", count=1, min=1.0)], OtlpTarget(collector.endpoint)) == (2, 2)


def test_an_endpoint_is_taken_without_the_spaces_around_it_and_a_header_file_needs_a_file():
    assert OtlpTarget(" 127.0.0.1:4317 ").endpoint == "127.0.0.1:4317"
    with pytest.raises(UserError, match="is not NAME=FILE"):
        parse_header_file("authorization=")


def test_a_tls_file_gone_since_the_start_check_is_one_clear_error(collector, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(_self_signed(tmp_path))
    target = OtlpTarget(collector.endpoint, ca_file=str(ca))
    ca.unlink()   # a Secret rotated away during a long Spark run
    with pytest.raises(UserError, match=f"OTLP export to {collector.endpoint}: cannot read .*ca.pem: No such file"):
        export([row("lat", count=1)], target, retry=FAST, give_up_after_s=0)


def _self_signed(directory) -> bytes:
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test", "-days", "2",
                    "-keyout", str(directory / "k.pem"), "-out", str(directory / "c.pem")], check=True,
                   capture_output=True, timeout=60)
    return (directory / "c.pem").read_bytes()


@pytest.mark.parametrize("endpoint", ["otel", "otel:", "http://otel:4317", "otel:70000", "otel:0"])
def test_an_endpoint_that_is_not_host_and_port_is_refused(endpoint):
    with pytest.raises(UserError, match="is not HOST:PORT"):
        check_endpoint(endpoint)


def test_rows_apart_in_parquet_stay_apart_as_series_whatever_they_are_grouped_by(spark, collector):
    rows = [row("lat", principal="User:alice", count=5), row("lat", principal="User:bob", count=7),
            row("h", bounds=[1.0, 5.0], count=3), row("h", bounds=[2.0], count=4)]
    frame = spark.createDataFrame(
        [{**r, "window_start": datetime.fromtimestamp(r["start_micros"] / 1e6, timezone.utc),
          "window_end": datetime.fromtimestamp(r["end_micros"] / 1e6, timezone.utc)} for r in rows],
        "resolution string, metric string, attributes string, client_id string, client_software_name string, "
        "client_software_version string, principal string, bounds array<double>, window_start timestamp, "
        "window_end timestamp, " + ", ".join(f"{name} {'bigint' if name == 'count' else 'double'}"
                                             for name in STATISTICS))
    assert export_rows(frame, OtlpTarget(collector.endpoint), ("client_id", "principal", "attributes")) == (4, 0)
    series = {}
    for received in collector.exports:
        for resource_metrics in received.request.resource_metrics:
            resource = tuple(sorted(attributes(resource_metrics.resource.attributes).items()))
            for metric in metric_dicts(MetricsData(resource_metrics=[resource_metrics])):
                for data_point in metric["points"]:
                    identity = (resource, metric["name"], json.dumps(data_point["attributes"], sort_keys=True),
                                data_point["start_time_unix_nano"], data_point["time_unix_nano"])
                    series.setdefault(identity, []).append(data_point["value"])
    assert sorted(values for values in series.values()) == [[3], [4], [5], [7]]
    by_principal = {dict(identity[0]).get("principal"): values for identity, values in series.items()
                    if identity[1] == "lat.count"}
    assert by_principal == {"User:alice": [5], "User:bob": [7]}
    assert sorted((json.loads(identity[2])[BOUNDS_ATTRIBUTE], values) for identity, values in series.items()
                  if identity[1] == "h.count") == [([1.0, 5.0], [3]), ([2.0], [4])]
