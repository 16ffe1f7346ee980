"""The bridge's one config model: YAML, then KCM_BRIDGE_* variables, then flags; errors name the field."""

from __future__ import annotations

import pytest

from kcm_bridge.config import ConfigError, load
from kcm_bridge.consumer import split_properties
from kcm_common.errors import UserError

YAML = """
kafka:
  bootstrap_servers: kafka-a:9092
  topics: [kafka-client-metrics, otlp-metrics]
  group_id: from-file
endpoints:
  - endpoint: collector-a:4317
    insecure: true
  - endpoint: collector-b:4317
    insecure: true
routing: hash
batch: {max_points: 1000, linger_ms: 50}
enrich:
  static_attributes: {kafka.cluster.name: prod}
  rules:
    - {action: drop, attribute: client_source_address}
"""


def test_file_then_environment_then_flags(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text(YAML)
    config = load(path, env={"KCM_BRIDGE_GROUP_ID": "from-env", "KCM_BRIDGE_BATCH_MAX_POINTS": "500"},
                  overrides={("kafka", "bootstrap_servers"): "kafka-b:9092"})
    assert config.kafka.bootstrap_servers == "kafka-b:9092"
    assert config.kafka.group_id == "from-env"
    assert config.kafka.topics == ["kafka-client-metrics", "otlp-metrics"]
    assert config.batch.max_points == 500 and config.batch.linger_ms == 50
    assert [e.endpoint for e in config.endpoints] == ["collector-a:4317", "collector-b:4317"]
    assert config.routing == "hash"
    assert config.enrich.static_attributes == {"kafka.cluster.name": "prod"}


def test_flags_alone_run_it_with_defaults():
    config = load(env={}, overrides={("kafka", "bootstrap_servers"): "localhost:9092"},
                  endpoints=["localhost:4317"], insecure=True)
    assert config.kafka.topics == ["kafka-client-metrics"]
    assert config.kafka.client == "confluent-kafka"
    assert config.endpoints[0].insecure and config.endpoints[0].compression == "gzip"
    assert config.temporality.delta_to_cumulative is False


@pytest.mark.parametrize(("yaml_text", "field"), [
    ("batch: {max_points: 0}", "batch.max_points"),
    ("batch: {max_points: lots}", "batch.max_points"),
    ("endpoints: [{endpoint: nocolon}]", "endpoints[0].endpoint"),
    ("routing: random", "routing"),
    ("kafka: {client: franz}", "kafka.client"),
    ("enrich: {rules: [{action: hash, attribute: principal}]}", "enrich.rules[0]"),
    ("enrich: {rules: [{action: rename, attribute: client_id}]}", "enrich.rules[0]"),
    ("batch: {max_pointz: 3}", "batch.max_pointz"),
    ("endpoints: [{endpoint: 'c:4317', tls: {ca_file: /nonexistent/ca.pem}}]", "endpoints[0].tls.ca_file"),
])
def test_a_bad_setting_is_an_error_naming_its_field(tmp_path, yaml_text, field):
    path = tmp_path / "bridge.yaml"
    path.write_text("kafka: {bootstrap_servers: 'k:9092'}\nendpoints: [{endpoint: 'c:4317'}]\n" + yaml_text)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load(path, env={})


def test_missing_endpoint_and_bootstrap_say_which_flag_to_pass():
    with pytest.raises(ConfigError, match="--bootstrap-server"):
        load(env={}, endpoints=["c:4317"])
    with pytest.raises(ConfigError, match="--endpoint"):
        load(env={}, overrides={("kafka", "bootstrap_servers"): "k:9092"})


def test_consumer_tuning_is_split_from_tls_and_sasl_properties():
    security, tuning = split_properties({"security.protocol": "SSL", "session.timeout.ms": "6000",
                                         "auto.offset.reset": "earliest"})
    assert security == {"security.protocol": "SSL"}
    assert tuning == {"session.timeout.ms": 6000, "auto.offset.reset": "earliest"}
    with pytest.raises(UserError, match="session.timeout.ms"):
        split_properties({"session.timeout.ms": "six"})
    with pytest.raises(UserError, match="auto.offset.reset"):
        split_properties({"auto.offset.reset": "beginning"})


def test_the_command_reports_a_bad_setting_in_one_line_with_exit_code_2(tmp_path, capsys):
    from kcm_cli.main import main

    path = tmp_path / "bridge.yaml"
    path.write_text("kafka: {bootstrap_servers: 'k:9092'}\nendpoints: [{endpoint: 'c:4317'}]\nbatch: {linger_ms: -1}\n")
    assert main(["bridge", "--config", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == "kcm bridge: batch.linger_ms must be 0 or more, not -1"
