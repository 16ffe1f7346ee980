"""The chart's PrometheusRule, rendered by the real helm binary: every expression parsed as PromQL, every series it
selects one the bridge or operator really exports (names and labels read from their metrics), scoped to the job and
namespace the chart's own ServiceMonitors scrape; the values (disabled, labels, threshold) and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client import Counter, Gauge, Histogram

import test_chart
from test_chart import CHART, Manifest, find, one, render, run_helm

helm = test_chart.helm   # the fixture

MONITORED = ("bridge.serviceMonitor.enabled=true", "operator.serviceMonitor.enabled=true",
             "prometheusRule.enabled=true")
# Labels the Prometheus Operator puts on every target of a ServiceMonitor, beside `up`'s own.
TARGET_LABELS = {"namespace", "pod", "job", "instance", "service", "container", "endpoint"}
BRIDGE_ALERTS = {"KcmBridgeDown", "KcmBridgeAbsent", "KcmBridgeExportFailing", "KcmBridgeLagHigh",
                 "KcmBridgeRecordsUndecodable", "KcmBridgeDeadLetterWritesFailing"}
OPERATOR_ALERTS = {"KcmOperatorDown", "KcmOperatorAbsent", "KcmOperatorKafkaErrors"}


def _exposed(metrics: list[Any]) -> dict[str, set[str]]:
    """Each series name a set of prometheus_client metrics exposes, with its label names."""
    series: dict[str, set[str]] = {}
    for metric in metrics:
        name, labels = metric._name, set(metric._labelnames)   # noqa: SLF001 (what the exposition uses)
        if isinstance(metric, Counter):
            series[f"{name}_total"] = labels
        elif isinstance(metric, Histogram):
            series.update({f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels})
        else:
            assert isinstance(metric, Gauge), metric
            series[name] = labels
    return series


def _bridge_series() -> dict[str, set[str]]:
    from kcm_bridge.metrics import BridgeMetrics

    metrics = BridgeMetrics()
    return _exposed([value for value in vars(metrics).values() if isinstance(value, (Counter, Gauge, Histogram))])


def _operator_series() -> dict[str, set[str]]:
    from kcm_operator import metrics

    return _exposed([value for value in vars(metrics).values() if isinstance(value, (Counter, Gauge, Histogram))])


def _selectors(node: Any) -> list[Any]:
    """Every VectorSelector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node]
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, promql_parser.BinaryExpr):
        return _selectors(node.lhs) + _selectors(node.rhs)
    if isinstance(node, (promql_parser.ParenExpr, promql_parser.AggregateExpr)):
        return _selectors(node.expr)
    if isinstance(node, promql_parser.Call):
        return [found for arg in node.args for found in _selectors(arg)]
    assert isinstance(node, promql_parser.NumberLiteral), f"an expression kind this test does not read: {node!r}"
    return []


def _grouping(node: Any) -> list[tuple[list[str], Any]]:
    """Every `by (...)` and `on (...)` label list, with the sub-expression whose series must carry those labels."""
    if isinstance(node, promql_parser.AggregateExpr):
        labels = list(node.modifier.labels) if node.modifier is not None else []
        return [(labels, node.expr), *_grouping(node.expr)]
    if isinstance(node, promql_parser.BinaryExpr):
        found = _grouping(node.lhs) + _grouping(node.rhs)
        matching = node.modifier.matching if node.modifier is not None else None
        if matching is not None:
            found += [(list(matching.labels), node.lhs), (list(matching.labels), node.rhs)]
        return found
    if isinstance(node, promql_parser.ParenExpr):
        return _grouping(node.expr)
    if isinstance(node, promql_parser.Call):
        return [found for arg in node.args for found in _grouping(arg)]
    return []


def _rules(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    """The PrometheusRule's alerts by name, each with its group's name under `group`."""
    rule = one(manifests, "PrometheusRule")
    alerts: dict[str, dict[str, Any]] = {}
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            assert alert["alert"] not in alerts, alert["alert"]
            alerts[alert["alert"]] = {**alert, "group": group["name"]}
    return alerts


def _job_of(manifests: list[Manifest], component: str) -> str:
    """The job label Prometheus gives a component's targets: the name of the Service its ServiceMonitor selects."""
    monitor = one(manifests, "ServiceMonitor", f"-{component}")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = [s for s in find(manifests, "Service") if wanted.items() <= s["metadata"]["labels"].items()]
    assert len(services) == 1, services
    assert "jobLabel" not in monitor["spec"]
    return services[0]["metadata"]["name"]


def test_every_alert_selects_series_the_components_export_from_the_targets_the_chart_scrapes(helm: Path) -> None:
    manifests = render(helm, sets=MONITORED)
    alerts = _rules(manifests)
    assert set(alerts) == BRIDGE_ALERTS | OPERATOR_ALERTS
    exported = {"bridge": _bridge_series(), "operator": _operator_series()}
    for name, alert in alerts.items():
        component = "bridge" if name in BRIDGE_ALERTS else "operator"
        assert alert["group"] == f"kcm-{component}"
        job = _job_of(manifests, component)
        expression = promql_parser.parse(alert["expr"])
        selectors = _selectors(expression)
        assert selectors, name
        for selector in selectors:
            series = exported[component] | {"up": set()}
            assert selector.name in series, f"{name}: {selector.name} is not a series the {component} exports"
            matchers = {(m.name, str(m.op), m.value) for m in selector.matchers.matchers}
            assert matchers == {("namespace", "MatchOp.Equal", "kcm"), ("job", "MatchOp.Equal", job)}, (name, matchers)
        for labels, scope in _grouping(expression):
            for selector in _selectors(scope):
                carried = exported[component].get(selector.name, set()) | TARGET_LABELS
                assert set(labels) <= carried, f"{name}: {selector.name} has no label {set(labels) - carried}"
        assert alert["labels"]["severity"] in ("critical", "warning")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        # An alert fires per pod (`up` is per target): every grouping keeps `pod`, but the lag's, summed over the
        # replicas that share a topic's partitions (and `absent`, which has no pod to name).
        if name != "KcmBridgeLagHigh":
            assert all("pod" in labels for labels, _ in _grouping(expression)), name


def test_the_bridge_is_scraped_with_its_own_endpoint_label_kept(helm: Path) -> None:
    # The bridge labels its export metrics with the collector (`endpoint`); the Prometheus Operator's target label
    # of the same name would rename it to exported_endpoint, and KcmBridgeExportFailing would lose the collector.
    manifests = render(helm, sets=MONITORED)
    [endpoint] = one(manifests, "ServiceMonitor", "-bridge")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert "endpoint" in _bridge_series()["kcm_bridge_export_failures_total"]


def test_values_leave_alerts_out_add_labels_and_set_the_lag_threshold(helm: Path) -> None:
    manifests = render(helm, sets=(*MONITORED, "prometheusRule.disabled={KcmBridgeLagHigh,KcmOperatorDown}",
                                   "prometheusRule.labels.release=prom", "prometheusRule.additionalAlertLabels.team=a",
                                   "prometheusRule.bridgeLagRecords=2500"))
    rule = one(manifests, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = _rules(manifests)
    assert set(alerts) == (BRIDGE_ALERTS | OPERATOR_ALERTS) - {"KcmBridgeLagHigh", "KcmOperatorDown"}
    assert all(alert["labels"]["team"] == "a" for alert in alerts.values())
    lag = _rules(render(helm, sets=(*MONITORED, "prometheusRule.bridgeLagRecords=2500")))["KcmBridgeLagHigh"]
    assert lag["expr"].endswith(") > 2500") and "2500 records" in lag["annotations"]["description"]
    # Every alert of a group left out: the group goes, not an empty one.
    only_bridge = _rules(render(helm, sets=(*MONITORED, "prometheusRule.disabled={KcmOperatorDown,"
                                                        "KcmOperatorAbsent,KcmOperatorKafkaErrors}")))
    assert set(only_bridge) == BRIDGE_ALERTS


def test_each_components_alerts_follow_its_service_monitor(helm: Path) -> None:
    bridge_only = render(helm, sets=("bridge.serviceMonitor.enabled=true", "prometheusRule.enabled=true"))
    assert set(_rules(bridge_only)) == BRIDGE_ALERTS
    operator_only = render(helm, sets=("operator.serviceMonitor.enabled=true", "prometheusRule.enabled=true"))
    assert set(_rules(operator_only)) == OPERATOR_ALERTS
    no_bridge = render(helm, sets=(*MONITORED, "bridge.enabled=false"))
    assert set(_rules(no_bridge)) == OPERATOR_ALERTS
    assert not find(render(helm, sets=MONITORED[:2]), "PrometheusRule")


def _refusal(helm: Path, *sets: str) -> str:
    args = ["template", "kcm", str(CHART), "--namespace", "kcm", "--api-versions", "monitoring.coreos.com/v1",
            "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode != 0, result.stdout[:400]
    return result.stderr


def test_alerts_without_a_service_monitor_or_with_a_wrong_value_are_refused_naming_it(helm: Path) -> None:
    assert ("prometheusRule.enabled: the alerts read what the ServiceMonitors scrape"
            in _refusal(helm, "prometheusRule.enabled=true"))
    # A ServiceMonitor of a component that is off renders nothing either: the message names both halves.
    assert "enable the bridge or the operator with its serviceMonitor" in _refusal(
        helm, "prometheusRule.enabled=true", "operator.serviceMonitor.enabled=true", "bridge.enabled=false",
        "operator.enabled=false")
    assert "/prometheusRule/disabled/0" in _refusal(helm, *MONITORED, "prometheusRule.disabled={KcmBridgeLagTypo}")
    assert "bridgeLagRecords" in _refusal(helm, *MONITORED, "prometheusRule.bridgeLagRecords=0")
    # An alert's severity is its own: a label of that name would override it on every alert.
    assert "additionalAlertLabels" in _refusal(helm, *MONITORED, "prometheusRule.additionalAlertLabels.severity=x")


def test_no_prometheus_rule_without_its_kind_and_the_notes_say_so(helm: Path) -> None:
    assert not find(render(helm, apis=(), sets=MONITORED), "PrometheusRule")
    # monitoring.coreos.com/v1 with the ServiceMonitor CRD alone (an OpenTelemetry target allocator's): the
    # ServiceMonitors render, the PrometheusRule would not be accepted.
    monitors_only = render(helm, apis=("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor"),
                           sets=MONITORED)
    assert len(find(monitors_only, "ServiceMonitor")) == 2 and not find(monitors_only, "PrometheusRule")
    result = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client",
                      "--set", "prometheusRule.enabled=true", "--set", "bridge.serviceMonitor.enabled=true")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "WARNING: prometheusRule.enabled is true but the PrometheusRule kind" in notes
    assert "no alerts were created" in notes
    quiet = run_helm(helm, "install", "kcm", str(CHART), "--namespace", "kcm", "--dry-run=client")
    assert "PrometheusRule" not in quiet.stdout.split("NOTES:", 1)[1]


def test_the_counters_alerts_take_the_increase_of_start_at_zero_for_every_reason() -> None:
    # increase() cannot count the jump that creates a series: a reason's first burst would never fire an alert.
    from kcm_bridge.metrics import UNPROCESSABLE, BridgeMetrics
    from kcm_common.contract import DECODE_REASONS
    from kcm_operator import metrics as operator_metrics

    exposed = {(sample.name, sample.labels.get("reason"), sample.value)
               for metric in BridgeMetrics().registry.collect() for sample in metric.samples}
    for reason in (*DECODE_REASONS, UNPROCESSABLE):
        assert ("kcm_bridge_decode_failures_total", reason, 0.0) in exposed, reason
    operator = {sample.labels.get("reason") for metric in operator_metrics.KAFKA_ERRORS.collect()
                for sample in metric.samples if sample.name == "kcm_operator_kafka_errors_total"}
    assert operator == {"KafkaUnavailable", "KafkaRefused"}   # docs/operator.md's two; nothing counts another


def test_the_schema_names_exactly_the_alerts_the_chart_renders(helm: Path) -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    names = schema["properties"]["prometheusRule"]["properties"]["disabled"]["items"]["enum"]
    assert set(names) == set(_rules(render(helm, sets=MONITORED))) == BRIDGE_ALERTS | OPERATOR_ALERTS
