"""Specs the CRD would refuse, as the operator may still read them (an older CRD installed, validation skipped, a field
from a newer kcm): refused as InvalidSpec naming the field, Kafka untouched, and a deletion never held by them; and the
operator's smaller messages a review (session 45) found wanting. Handlers are called as kopf calls them; the Kafka side
is the sandbox."""

from __future__ import annotations

import logging
import types

import kopf
import pytest
from kubernetes import client

from kcm_common.kafka import KafkaSettings
from kcm_operator import handlers
from kcm_operator.connections import ConnectionResolver, settings_from_spec
from kcm_operator.errors import InvalidSpecError
from kcm_operator.handlers import OperatorConfig
from kcm_operator.reconcile import desired_from_spec, diff
from test_operator_delete import NEWER, _body
from test_operator_edges import _conditions, _reconcile, _resource
from test_operator_reconcile import IN_KAFKA, SPEC

# spec → the field and the problem the Ready message must name
REFUSED = [
    ({**SPEC, "metrics": "org.apache."}, "spec.metrics: 'org.apache.' is not of type 'array'"),
    ({**SPEC, "match": ["x"]}, "spec.match: ['x'] is not of type 'object'"),
    ({**SPEC, "metrics": [None]}, "spec.metrics[0]: None is not of type 'string'"),
    ({**SPEC, "intervalMs": 1500.5}, "spec.intervalMs: 1500.5 is not of type 'integer'"),
    ({**SPEC, "intervalMs": "60s"}, "spec.intervalMs: '60s' is not of type 'integer'"),
    ({**SPEC, "deletionPolicy": "Keep"}, "spec.deletionPolicy: 'Keep' is not one of ['Delete', 'Retain']"),
    ({**SPEC, "connection": 123}, "spec.connection: 123 is not of type 'string'"),
    ({**SPEC, "matchh": {"clientId": "x"}}, "spec.matchh: unknown field"),
]


@pytest.fixture
def events(monkeypatch) -> list[dict]:
    posted: list[dict] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: posted.append(event))
    return posted


def test_a_spec_the_crd_refuses_is_invalid_spec_naming_the_field_and_kafka_is_not_touched(sandbox, events):
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        for spec, problem in REFUSED:
            events.clear()
            ready = _conditions(_reconcile(config, _resource(spec=spec)))["Ready"]
            assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), (spec, ready)
            assert problem in ready["message"] and "kubectl apply -f crds/" in ready["message"], ready["message"]
            assert [(event["type"], event["reason"]) for event in events] == [("Warning", "InvalidSpec")]
            assert sandbox.store.configs("team.payments") == {}, spec
            # A drift check says it again, without another event.
            resource = _resource(spec=spec, status={"conditions": [ready], "observedGeneration": 1})
            assert not _conditions(_reconcile(config, resource, drift_check=True))
            assert len(events) == 1
    finally:
        config.close()


def test_an_invalid_spec_claims_only_the_subscription_it_applied_before():
    registry = handlers.build_registry(OperatorConfig(KafkaSettings("127.0.0.1:9")))
    index = next(handler.fn for handler in registry._indexing.get_all_handlers() if handler.id == "claims")
    meta = {"creationTimestamp": NEWER, "uid": "uid-a"}
    bad = {**SPEC, "intervalMs": "60s"}
    assert index(namespace="team", name="a", spec=bad, meta=meta, status={}) == {}
    applied = {"subscriptionName": "team.a", "clusterId": "c1"}
    claimed = index(namespace="team", name="a", spec={**bad, "connection": 123}, meta=meta, status=applied)
    assert list(claimed) == ["team.a"]
    assert (claimed["team.a"].connection, claimed["team.a"].cluster_id) == (None, "c1")


def _applied(config: OperatorConfig) -> str:
    admin = config.admin("team", None)
    desired = desired_from_spec("team", "a", SPEC)
    assert admin.alter_one(diff(desired, admin.describe_one("team.a"))) is None
    return admin.cluster_id()


def test_deleting_an_invalid_spec_removes_only_what_it_applied_and_is_never_held(sandbox, events):
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        cluster = _applied(config)

        def delete(spec: dict, annotations: dict | None = None, applied: bool = True) -> None:
            body = _body("a", NEWER, cluster if applied else None, annotations, spec=spec)
            if applied:
                body["status"]["subscriptionName"] = "team.a"
            handlers._delete(config, kopf.Body(body), kopf.Patch(), {}, 0)

        # Never applied: Kafka is not touched (what is there is not this resource's).
        delete({**SPEC, "intervalMs": "60s"}, applied=False)
        # Paused: let go as any paused resource is.
        delete({**SPEC, "intervalMs": "60s"}, {handlers.PAUSED_ANNOTATION: "true"})
        # A deletionPolicy that is none: let go as with Retain, and said.
        delete({**SPEC, "deletionPolicy": "Keep"})
        assert sandbox.store.configs("team.a") == IN_KAFKA
        assert [(event["type"], event["reason"]) for event in events] == [("Warning", "NotRemoved")]
        assert "spec.deletionPolicy: 'Keep'" in events[0]["message"]
        assert "kcm subscriptions delete team.a" in events[0]["message"]
        # Where and whether to remove it valid: the subscription it applied goes.
        delete({**SPEC, "intervalMs": "60s", "metrics": "x"})
        assert sandbox.store.configs("team.a") == {}
    finally:
        config.close()


def test_a_kafka_connection_the_crd_refuses_is_invalid_spec_on_it_and_on_its_subscriptions(tmp_path, events):
    reports: list[tuple] = []

    class Statuses:
        def report(self, namespace, name, state, reason, message, cluster_id=None, **_):
            reports.append((f"{namespace}/{name}", state, reason, message))

        def named(self, namespace, name):
            pass

        def resolved(self, namespace, name, generation):
            pass

    resolver = ConnectionResolver(None, tmp_path)
    resolver.statuses = Statuses()
    config = OperatorConfig(KafkaSettings("127.0.0.1:9"), resolve=resolver.resolve, statuses=resolver.statuses)
    try:
        for spec, problem in [({}, "spec: 'bootstrapServers' is a required property"),
                              ({"bootstrapServers": 9092}, "spec.bootstrapServers: 9092 is not of type 'string'"),
                              ({"bootstrapServers": ["a:1"]}, "spec.bootstrapServers: ['a:1'] is not of type")]:
            resolver._custom = types.SimpleNamespace(get_namespaced_custom_object=lambda *_, spec=spec, **__: {
                "metadata": {"generation": 1}, "spec": spec})
            reports.clear()
            with pytest.raises(InvalidSpecError, match=r"^KafkaConnection team/kafka: the spec is not valid"):
                resolver.resolve("team", "kafka")
            config.resolved.clear()
            ready = _conditions(_reconcile(config, _resource(spec={**SPEC, "connection": "kafka"})))["Ready"]
            assert (ready["reason"], problem in ready["message"]) == ("InvalidSpec", True), ready
            assert [report[:3] for report in reports] == [("team/kafka", "False", "InvalidSpec")]
            assert problem in reports[0][3]
    finally:
        config.close()


def test_an_interval_above_kafkas_cap_says_so_in_the_ready_message(sandbox, events):
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        ready = _conditions(_reconcile(config, _resource(spec={**SPEC, "intervalMs": 600000})))["Ready"]
        assert ready["status"] == "True"
        assert "clients push every 300000 ms at most" in ready["message"], ready["message"]
        ready = _conditions(_reconcile(config, _resource(spec=SPEC)))["Ready"]
        assert ready["message"] == "subscription team.payments is in Kafka as specified"
    finally:
        config.close()


def test_a_move_of_the_default_clusters_resource_names_bootstrap_server_not_a_connection(sandbox, events):
    config = OperatorConfig(KafkaSettings(sandbox.bootstrap), kafka_timeout_s=5)
    try:
        _reconcile(config, _resource(status={"clusterId": "elsewhere", "subscriptionName": "team.payments"}))
    finally:
        config.close()
    [event] = events
    assert "which the operator's --bootstrap-server reaches now" in event["message"], event
    assert "connection" not in event["message"]


def test_sasl_missing_from_a_kafka_connection_names_its_fields(tmp_path):
    with pytest.raises(Exception) as refused:
        settings_from_spec({"bootstrapServers": "kafka:9092", "securityProtocol": "SASL_PLAINTEXT"}, None, tmp_path)
    assert str(refused.value).startswith("spec.securityProtocol SASL_PLAINTEXT needs spec.sasl"), refused.value


def test_a_bad_command_config_is_named_on_the_default_clusters_resources(tmp_path):
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=BOGUS\n")
    config = OperatorConfig(KafkaSettings("127.0.0.1:9", {"security.protocol": "BOGUS"}),
                            command_config=str(properties))
    with pytest.raises(InvalidSpecError, match=rf"^the default cluster \(--command-config {properties}\): "
                                               r"security.protocol must be"):
        config.admin("team", None)


def test_the_kubernetes_api_not_answering_is_told_apart_from_one_refusing(tls_listener_for_another_name):
    def problem(host: str) -> str | None:
        return OperatorConfig(KafkaSettings("127.0.0.1:9"),
                              api_client=client.ApiClient(client.Configuration(host=host))).kubernetes_api_problem()

    assert problem("http://127.0.0.1:9").startswith("NewConnectionError: ")
    # A certificate the kubeconfig's CA does not vouch for: no HTTP answer either (the client calls it status 0).
    port, _ = tls_listener_for_another_name
    assert "CERTIFICATE_VERIFY_FAILED" in (problem(f"https://127.0.0.1:{port}") or ""), problem(
        f"https://127.0.0.1:{port}")

    import http.server
    import threading

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(403)

        def log_message(self, *args) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            assert problem(f"http://127.0.0.1:{server.server_address[1]}") is None   # it answers: a refusal is one
        finally:
            server.shutdown()


def test_kopfs_routine_successes_are_debug_lines_and_access_logs_are_quiet(caplog):
    from kcm_operator.kopf_logs import quiet_kopf

    quiet_kopf()
    objects = logging.getLogger("kopf.objects")
    with caplog.at_level(logging.INFO, logger="kopf.objects"):
        objects.info("Timer 'drift' succeeded.")
        objects.info("Handler 'reconcile' succeeded.")
    assert [record.getMessage() for record in caplog.records] == ["Handler 'reconcile' succeeded."]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kopf.objects"):
        objects.info("Timer 'drift' succeeded.")
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("DEBUG", "Timer 'drift' succeeded.")]
    assert not logging.getLogger("aiohttp.access").isEnabledFor(logging.INFO)


def test_an_untrusted_api_server_certificate_is_said_with_what_to_check(caplog):
    import threading

    from kcm_cli.operator import _say_if_the_api_is_silent

    why = "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] self-signed certificate'))"
    with caplog.at_level(logging.ERROR, logger="kcm.operator"):
        _say_if_the_api_is_silent(lambda: why, "https://10.0.0.1:6443", threading.Event())
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith(f"the Kubernetes API at https://10.0.0.1:6443 does not answer ({why}): check that the "
                           "kubeconfig's certificate-authority(-data) is the CA"), line
