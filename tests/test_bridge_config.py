"""The bridge's one config model: YAML, then KCM_BRIDGE_* variables, then flags; errors name the field."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kcm_bridge.config import ConfigError, load, warn_of_unknown_variables
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
    ("endpoints: [{endpoint: 'http://127.0.0.1:4317'}]", "endpoints[0].endpoint"),
    ("endpoints: [{endpoint: 'dns:///otel:4317'}]", "endpoints[0].endpoint"),
    ("endpoints: [{endpoint: 'otel:0'}]", "endpoints[0].endpoint"),
    ("routing: random", "routing"),
    ("kafka: {client: franz}", "kafka.client"),
    ("enrich: {rules: [{action: hash, attribute: principal}]}", "enrich.rules[0]"),
    ("enrich: {rules: [{action: rename, attribute: client_id}]}", "enrich.rules[0]"),
    ("batch: {max_pointz: 3}", "batch.max_pointz"),
    ("endpoints: [{endpoint: 'c:4317', tls: {ca_file: /nonexistent/ca.pem}}]", "endpoints[0].tls.ca_file"),
    ("kafka: {topics: [ok, 'bad topic!']}", "kafka.topics[1]: 'bad topic!' is not a Kafka topic name"),
    ("delivery: {dead_letter_topic: '..'}", "delivery.dead_letter_topic: '..' is not a Kafka topic name"),
    ("metrics_host: 999.1.1.1", "metrics_host '999.1.1.1' is not an IP address"),
    ("endpoints: [{endpoint: 'c:4317', concurrency: 1000000}]", "endpoints[0].concurrency must be at most 64"),
    ("endpoints: [{endpoint: 'c:4317', concurrency: 65}]", "endpoints[0].concurrency must be at most 64"),
    ("retry: {initial_backoff_s: 10, max_backoff_s: 5}",
     "retry.max_backoff_s must be at least retry.initial_backoff_s"),
    ("retry: {jitter: -0.5}", "retry.jitter must be between 0 and 1, not -0.5"),   # waits past the cap
    ("retry: {jitter: 1.5}", "retry.jitter must be between 0 and 1, not 1.5"),
    ("retry: {multiplier: 0.5}", "retry.multiplier must be a finite number, 1 or more, not 0.5"),
    ("batch: {linger_ms: -1}", "batch.linger_ms must be 0 or more"),
    ("batch: {linger_ms: 31536000001}", "batch.linger_ms must be at most 31536000000 .a year., not 31536000001"),
    ("delivery: {revoke_timeout_s: -1}", "delivery.revoke_timeout_s"),
    # The bridge would read its own dead letters back, and a record refused again would loop.
    ("delivery: {dead_letter_topic: kafka-client-metrics}",
     "delivery.dead_letter_topic must not be one of kafka.topics"),
    ("enrich: {rules: [{action: hash, attribute: principal, salt: a, salt_env: KCM_SALT}]}",
     "enrich.rules[0]: a hash rule needs exactly one of salt, salt_file, salt_env"),
    ("enrich: {rules: [{action: drop, attribute: principal, salt: a}]}",
     "enrich.rules[0]: salts only apply to hash rules"),
    ("endpoints: [{endpoint: 'c:4317', headers_from_env: {authorization: KCM_TEST_VARIABLE_NOBODY_SETS}}]",
     "endpoints[0].headers_from_env.authorization: environment variable KCM_TEST_VARIABLE_NOBODY_SETS is not set"),
])
def test_a_bad_setting_is_an_error_naming_its_field(tmp_path, yaml_text, field):
    document = {"kafka": {"bootstrap_servers": "k:9092"}, "endpoints": [{"endpoint": "c:4317"}]}
    for section, value in yaml.safe_load(yaml_text).items():   # a bad section replaces or extends the good one
        document[section] = {**document[section], **value} if isinstance(document.get(section), dict) else value
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load(path, env={})


@pytest.mark.parametrize("yaml_text", [
    "retry: {initial_backoff_s: 2, max_backoff_s: 2}", "retry: {jitter: 0}", "retry: {jitter: 1}",
    "retry: {multiplier: 1}", "batch: {linger_ms: 0}", "batch: {linger_ms: 31536000000}",
    "delivery: {revoke_timeout_s: 0}",   # a revoke then gives up on exports at once
    "endpoints: [{endpoint: 'c:4317', concurrency: 64}]", "kafka: {connect_timeout_s: 31536000}",
])
def test_a_setting_at_the_edge_of_what_is_allowed_is_accepted(tmp_path, yaml_text):
    document = {"kafka": {"bootstrap_servers": "k:9092"}, "endpoints": [{"endpoint": "c:4317"}]}
    for section, value in yaml.safe_load(yaml_text).items():
        document[section] = {**document[section], **value} if isinstance(document.get(section), dict) else value
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(document))
    config = load(path, env={})
    for section, value in yaml.safe_load(yaml_text).items():
        if section != "endpoints":
            assert {key: getattr(getattr(config, section), key) for key in value} == value


def test_flags_beat_the_environment_which_beats_the_file(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text(YAML)
    env = {"KCM_BRIDGE_GROUP_ID": "from-env", "KCM_BRIDGE_ENDPOINTS": "env-collector:4317",
           "KCM_BRIDGE_INSECURE": "false"}
    config = load(path, env=env, overrides={("kafka", "group_id"): "from-flag"}, endpoints=["flag-collector:4317"],
                  insecure=True)
    assert config.kafka.group_id == "from-flag"
    assert [(e.endpoint, e.insecure) for e in config.endpoints] == [("flag-collector:4317", True)]
    # Without the flags, the environment's: its endpoints replace the file's, and its insecure applies to them all.
    config = load(path, env={**env, "KCM_BRIDGE_INSECURE": "true"})
    assert config.kafka.group_id == "from-env"
    assert [(e.endpoint, e.insecure) for e in config.endpoints] == [("env-collector:4317", True)]
    config = load(path, env={"KCM_BRIDGE_INSECURE": "false"})
    assert [(e.endpoint, e.insecure) for e in config.endpoints] == [("collector-a:4317", False),
                                                                    ("collector-b:4317", False)]


def _rename(attribute: str, to: str) -> dict:
    return {"action": "rename", "attribute": attribute, "to": to}


@pytest.mark.parametrize(("enrich", "error"), [
    pytest.param({"rules": [_rename("client_id", "kafka.client"), _rename("principal", "kafka.client")]},
                 "enrich.rules[1]: renaming 'principal' to 'kafka.client' clashes with 'client_id', renamed to it by "
                 "enrich.rules[0]: a resource would keep only one of them; choose another name",
                 id="two-renames-to-one-name"),
    pytest.param({"rules": [_rename("a", "x"), _rename("x", "y")]},
                 "enrich.rules[1]: renaming 'x' to 'y' clashes with 'a', renamed to it by enrich.rules[1]",
                 id="a-rename-chain-meeting-a-renamed-attribute"),
    pytest.param({"static_attributes": {"kafka.cluster.name": "prod"},
                  "rules": [_rename("client_id", "kafka.cluster.name")]},
                 "enrich.rules[0]: renaming 'client_id' to 'kafka.cluster.name' clashes with "
                 "enrich.static_attributes.kafka.cluster.name", id="a-rename-to-a-static-attribute"),
    pytest.param({"rules": [_rename("host.name", "principal")]},
                 "enrich.rules[0]: renaming 'host.name' to 'principal' clashes with the contract header principal "
                 "(enrich.header_attributes is on)", id="a-rename-to-a-header-attribute"),
    pytest.param({"rules": [_rename("a", "b"), _rename("b", "a")]},
                 "enrich.rules[1]: renaming 'b' to 'a' clashes with 'a', which the rules bring back to its own name",
                 id="two-attributes-swapped-by-renames"),
    pytest.param({"static_attributes": {"": "x", "ok": ""}},
                 "enrich.static_attributes has an empty attribute name: OTLP attribute keys must not be empty",
                 id="an-empty-static-attribute-name"),
])
def test_enrichment_that_would_lose_an_attribute_or_add_a_nameless_one_is_refused_naming_the_field(
        tmp_path, enrich, error):
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": "k:9092"}, "endpoints": [{"endpoint": "c:4317"}],
                                    "enrich": enrich}))
    with pytest.raises(ConfigError) as refused:
        load(path, env={})
    assert str(refused.value).startswith(error)


@pytest.mark.parametrize("enrich", [
    pytest.param({"rules": [_rename("host.name", "service.name")]}, id="the-clients-own-attribute-gives-way"),
    pytest.param({"header_attributes": False, "rules": [_rename("host.name", "principal")]}, id="no-header-there"),
    pytest.param({"rules": [_rename("principal", "kafka.principal"), _rename("host.name", "principal")]},
                 id="the-header-renamed-away-first"),
    pytest.param({"static_attributes": {"client_id": "fixed"}, "rules": [_rename("client_id", "kafka.client.id")]},
                 id="a-static-attribute-over-a-header-renamed-as-one"),
])
def test_renames_that_leave_every_attribute_its_own_name_are_accepted(enrich):
    config = load(env={}, endpoints=["c:4317"], overrides={("kafka", "bootstrap_servers"): "k:9092",
                                                          ("enrich",): enrich})
    assert config.enrich.rules[-1].action == "rename"


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


@pytest.mark.timeout(60)   # in-process: a regression would run a real bridge here, not fail
def test_the_command_reports_a_bad_setting_in_one_line_with_exit_code_2(tmp_path, capsys):
    from kcm_cli.main import main

    path = tmp_path / "bridge.yaml"
    path.write_text("kafka: {bootstrap_servers: 'k:9092'}\nendpoints: [{endpoint: 'c:4317'}]\nbatch: {linger_ms: -1}\n")
    assert main(["bridge", "--config", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error == "kcm bridge: batch.linger_ms must be 0 or more, not -1"


def test_the_loaded_config_shows_no_secret_in_repr_or_str(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text("kafka: {bootstrap_servers: 'k:9092', properties: {sasl.password: kafka-secret-1}}\n"
                    "endpoints: [{endpoint: 'c:4317', headers: {authorization: Bearer collector-secret-2}}]\n"
                    "enrich: {rules: [{action: hash, attribute: principal, salt: salt-secret-3}]}\n")
    config = load(path, env={})
    assert config.kafka.properties["sasl.password"] == "kafka-secret-1"
    for shown in (repr(config), str(config), repr(config.kafka), repr(config.endpoints), repr(config.enrich)):
        for secret in ("kafka-secret-1", "collector-secret-2", "salt-secret-3"):
            assert secret not in shown


@pytest.mark.parametrize(("section", "name"), [("kafka", "connect_timeout_s"), ("endpoints[0]", "timeout_s"),
                                              ("retry", "initial_backoff_s"), ("retry", "max_backoff_s"),
                                              ("delivery", "shutdown_timeout_s"), ("temporality", "idle_expiry_s")])
@pytest.mark.parametrize(("value", "problem"), [
    (float("nan"), "must be a number, not '.nan'"), (float("inf"), "must be a number, not '.inf'"),
    ("nan", "must be a finite number > 0, not nan"), (0.0, "must be a finite number > 0, not 0.0"),
    (-1.0, "must be a finite number > 0, not -1.0")])
def test_a_duration_in_the_file_must_be_a_finite_number_above_zero(tmp_path, section, name, value, problem):
    document = {"kafka": {"bootstrap_servers": "k:9092"}, "endpoints": [{"endpoint": "c:4317"}]}
    target = document["endpoints"][0] if section == "endpoints[0]" else document.setdefault(section, {})
    target[name] = value
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert str(error.value) == f"{section}.{name} {problem}"


@pytest.mark.parametrize(("section", "name"), [("kafka", "connect_timeout_s"), ("endpoints[0]", "timeout_s"),
                                              ("delivery", "commit_interval_s"), ("delivery", "revoke_timeout_s"),
                                              ("temporality", "idle_expiry_s")])
def test_a_duration_beyond_a_year_is_refused_before_it_overflows_a_clock(tmp_path, section, name):
    document = {"kafka": {"bootstrap_servers": "k:9092"}, "endpoints": [{"endpoint": "c:4317"}]}
    target = document["endpoints"][0] if section == "endpoints[0]" else document.setdefault(section, {})
    target[name] = 1e12
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert str(error.value) == f"{section}.{name} must be at most 31536000 seconds (a year), not 1000000000000.0"


@pytest.mark.parametrize(("env", "overrides", "field"), [
    ({"KCM_BRIDGE_SHUTDOWN_TIMEOUT_S": "nan"}, {}, "delivery.shutdown_timeout_s"),
    ({"KCM_BRIDGE_SHUTDOWN_TIMEOUT_S": "inf"}, {}, "delivery.shutdown_timeout_s"),
    ({}, {("kafka", "connect_timeout_s"): "nan"}, "kafka.connect_timeout_s"),
    ({}, {("retry", "multiplier"): "inf"}, "retry.multiplier"),
    ({}, {("delivery", "revoke_timeout_s"): "nan"}, "delivery.revoke_timeout_s"),
])
def test_non_finite_numbers_from_the_environment_or_flags_are_rejected(env, overrides, field):
    with pytest.raises(ConfigError, match=rf"^{field} must be a finite number"):
        load(env=env, overrides={("kafka", "bootstrap_servers"): "k:9092", **overrides}, endpoints=["c:4317"])


@pytest.mark.timeout(60)   # in-process: a regression would run a real bridge here, not fail
def test_the_command_reports_a_non_finite_timeout_from_the_environment_in_one_line(monkeypatch, capsys):
    from kcm_cli.main import main

    monkeypatch.setenv("KCM_BRIDGE_SHUTDOWN_TIMEOUT_S", "nan")
    assert main(["bridge", "--bootstrap-server", "k:9092", "--endpoint", "c:4317"]) == 2
    error = capsys.readouterr().err
    assert error == ("kcm bridge: delivery.shutdown_timeout_s must be a finite number > 0, not nan (set by "
                     "KCM_BRIDGE_SHUTDOWN_TIMEOUT_S)\n")


def test_a_key_given_twice_is_refused_naming_where_not_silently_replaced(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text("kafka: {bootstrap_servers: 'k:9092'}\nendpoints: [{endpoint: 'c:4317'}]\n"
                    "kafka: {client: kafka-python}\n")
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert str(error.value) == (f"config file {path}: invalid YAML at line 3, column 1: the key `kafka` is given "
                                "twice in one mapping")


@pytest.mark.parametrize(("line", "problem"), [
    ("  sasl.password: !Xk9$mP2@q", "could not determine a constructor for the tag '…'"),
    ("  sasl.password: !!Xk9mP2q", "could not determine a constructor for the tag '…'"),
    ("  sasl.password: *Kp9xL2qZ", "found undefined alias '…'"),
    ("  sasl.password: !Xk9'mP2", "could not determine a constructor for the tag '…'"),  # repr'd in double quotes
    ("  sasl.password: &Kp9xL2qZ x\n  sasl.username: &Kp9xL2qZ y", "found duplicate anchor '…'"),
])
def test_a_yaml_error_never_quotes_the_value_it_could_not_read(tmp_path, line, problem):
    # Unquoted, a password starting with !, * or & reads as a tag, alias or anchor, and PyYAML quotes it whole.
    path = tmp_path / "bridge.yaml"
    path.write_text(f"kafka:\n  bootstrap_servers: 'k:9092'\n  properties:\n  {line}\n")
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    message = str(error.value)
    assert problem in message and message.endswith("(quote a value that starts with !, * or &)"), message
    assert "Xk9" not in message and "Kp9" not in message


@pytest.mark.parametrize(("text", "problem"), [
    ("batch: {max_points: !!int Xk9secret}\n", "at line 1, column 21: this value cannot be read"),
    ("batch: !!timestamp Xk9secret\n", "at line 1, column 8: this value cannot be read"),
    ("[a]: 1\n", "at line 1, column 1: found unhashable key while constructing a mapping"),
])
def test_a_value_yaml_cannot_construct_is_an_error_at_its_place_not_a_traceback(tmp_path, text, problem):
    path = tmp_path / "bridge.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    message = str(error.value)
    assert message.startswith(f"config file {path}: invalid YAML ") and problem in message, message
    assert "Xk9" not in message


@pytest.mark.parametrize(("env", "message"), [
    ({"KCM_BRIDGE_COMMAND_CONFIG": ""}, "kafka.command_config is empty: name a client properties file"),
    ({"KCM_BRIDGE_DEAD_LETTER_TOPIC": " "}, "delivery.dead_letter_topic is empty: name a topic, or leave it out"),
    ({"KCM_BRIDGE_ENDPOINTS": " , "}, "KCM_BRIDGE_ENDPOINTS is empty: name HOST:PORT endpoints"),
])
def test_an_empty_variable_is_refused_not_read_as_no_file_or_no_topic(env, message):
    # An empty $(VAR) substitution in a Deployment must not drop the TLS/SASL file or the dead-letter topic.
    with pytest.raises(ConfigError, match=message):
        load(env={"KCM_BRIDGE_BOOTSTRAP_SERVERS": "k:9092", "KCM_BRIDGE_ENDPOINTS": "c:4317", **env})


@pytest.mark.parametrize(("text", "env", "message"), [
    ("kafka: kafka-0:9092\n", {"KCM_BRIDGE_BOOTSTRAP_SERVERS": "k:9092"}, "kafka must be a mapping, not str"),
    ("batch: 500\n", {"KCM_BRIDGE_BATCH_LINGER_MS": "100"}, "batch must be a mapping, not str"),
])
def test_a_section_that_is_not_a_mapping_is_refused_though_a_variable_sets_a_field_in_it(tmp_path, text, env,
                                                                                         message):
    path = tmp_path / "bridge.yaml"
    path.write_text(text + "endpoints: [{endpoint: 'c:4317'}]\n")
    with pytest.raises(ConfigError, match=message):
        load(path, env={"KCM_BRIDGE_BOOTSTRAP_SERVERS": "k:9092", **env})


@pytest.mark.timeout(60)   # in-process: a regression would run a real bridge here, not fail
def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column(tmp_path, capsys):
    from kcm_cli.main import main

    path = tmp_path / "bridge.yaml"
    path.write_text("kafka:\n  bootstrap_servers: k:9092\nendpoints: [{endpoint: 'c:4317'}\nbatch {}\n")
    assert main(["bridge", "--config", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "<unicode string>" not in error
    assert error.startswith(f"kcm bridge: config file {path}: invalid YAML at line 4, column 1: expected ',' or ']'")


@pytest.mark.parametrize(("rule", "env", "message"), [
    ("salt_file: EMPTY", {}, "enrich.rules[0].salt_file '{EMPTY}' is empty: an unsalted hash"),
    ("salt_file: DIRECTORY", {}, "enrich.rules[0].salt_file names '{DIRECTORY}', which is not a readable file"),
    ("salt_env: KCM_SALT", {"KCM_SALT": ""}, "enrich.rules[0].salt_env KCM_SALT is empty: an unsalted hash"),
])
def test_a_hash_salt_is_read_at_start_and_must_hold_something(tmp_path, monkeypatch, rule, env, message):
    empty = tmp_path / "empty-salt"
    empty.write_text("  \n")
    paths = {"EMPTY": str(empty), "DIRECTORY": str(tmp_path)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for placeholder, path in paths.items():
        rule = rule.replace(placeholder, path)
    path = tmp_path / "bridge.yaml"
    path.write_text("kafka: {bootstrap_servers: 'k:9092'}\nendpoints: [{endpoint: 'c:4317'}]\n"
                    f"enrich: {{rules: [{{action: hash, attribute: principal, {rule}}}]}}\n")
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert str(error.value).startswith(message.format(**paths))


def test_a_topic_named_twice_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"^kafka.topics names 'a' more than once \(set by KCM_BRIDGE_TOPICS\)$"):
        load(env={"KCM_BRIDGE_TOPICS": "a,b,a"}, overrides={("kafka", "bootstrap_servers"): "k:9092"},
             endpoints=["c:4317"])


KAFKA, ENDPOINTS = "kafka: {bootstrap_servers: 'k:9092'}\n", "endpoints: [{endpoint: 'c:4317'}]\n"


def test_unquoted_values_are_read_as_the_text_written_never_as_yaml_numbers_dates_or_booleans(tmp_path):
    """YAML would read an unquoted 0777 as 511, 3.10 as 3.1, on as true, 12:30 as 750 and 2024-02-30 as an impossible
    date: a group id, attribute or secret changed without a word. Every setting is read as the text written and
    converted to its declared type as environment variables are."""
    path = tmp_path / "bridge.yaml"
    path.write_text("kafka:\n  bootstrap_servers: 'k:9092'\n  group_id: 0777\n  topics: [0777, 2024-02-30]\n"
                    "  properties: {sasl.password: 0777, sasl.username: 2024-02-30}\n"
                    "endpoints: [{endpoint: 'c:4317', insecure: on, headers: {authorization: yes}}]\n"
                    "enrich:\n  static_attributes: {kafka.version: 3.10, kafka.cluster.name: on, rack: 12:30, "
                    "build: 1e3}\n  rules: [{attribute: a, action: hash, salt: 12:30}]\n"
                    "batch: {max_points: 0500, linger_ms: 1_000}\n")
    config = load(path, env={})
    assert (config.kafka.group_id, config.kafka.topics) == ("0777", ["0777", "2024-02-30"])
    assert config.kafka.properties == {"sasl.password": "0777", "sasl.username": "2024-02-30"}
    assert config.endpoints[0].headers == {"authorization": "yes"} and config.enrich.rules[0].salt == "12:30"
    assert config.enrich.static_attributes == {"kafka.version": "3.10", "kafka.cluster.name": "on", "rack": "12:30",
                                               "build": "1e3"}
    assert (config.batch.max_points, config.batch.linger_ms, config.endpoints[0].insecure) == (500, 1000, True)


def test_numbers_where_no_secret_is_expected_still_read_as_before(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text("kafka:\n  bootstrap_servers: 'k:9092'\n  properties: {session.timeout.ms: 6000}\n"
                    "endpoints: [{endpoint: 'c:4317', headers: {x-scope-orgid: '0777'}}]\n"
                    "enrich: {rules: [{attribute: a, action: hash, salt: '0777'}]}\n")
    config = load(path, env={})
    assert config.kafka.properties == {"session.timeout.ms": "6000"}
    assert config.endpoints[0].headers == {"x-scope-orgid": "0777"} and config.enrich.rules[0].salt == "0777"


def test_a_misspelt_environment_variable_is_named_not_silently_ignored(caplog, monkeypatch):
    env = {"KCM_BRIDGE_BATCH_MAXPOINTS": "5", "KCM_BRIDGE_BATCH_MAX_POINTS": "7", "KCM_BRIDGE_TOKEN": "t",
           "HOME": "/root"}
    with caplog.at_level("WARNING", logger="kcm.bridge"):
        config = load(env=env, overrides={("kafka", "bootstrap_servers"): "k:9092"}, endpoints=["c:4317"])
        assert caplog.records == [], "loading logs nothing: the log format it chooses is not in place yet"
        warn_of_unknown_variables(config, env)
    assert config.batch.max_points == 7
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("ignoring KCM_BRIDGE_BATCH_MAXPOINTS, KCM_BRIDGE_TOKEN: not a bridge setting")

    caplog.clear()
    monkeypatch.setenv("KCM_BRIDGE_TOKEN", "t")  # a variable a header reads is the bridge's to use
    with caplog.at_level("WARNING", logger="kcm.bridge"):
        config = load(env={"KCM_BRIDGE_TOKEN": "t"}, overrides={
            ("kafka", "bootstrap_servers"): "k:9092",
            ("endpoints",): [{"endpoint": "c:4317", "headers_from_env": {"authorization": "KCM_BRIDGE_TOKEN"}}]})
        warn_of_unknown_variables(config, {"KCM_BRIDGE_TOKEN": "t"})
    assert caplog.records == []

    monkeypatch.setenv("KCM_BRIDGE_SALT", "pepper")  # so is one a hash rule's salt_env names
    with caplog.at_level("WARNING", logger="kcm.bridge"):
        config = load(env={"KCM_BRIDGE_SALT": "pepper"}, overrides={
            ("kafka", "bootstrap_servers"): "k:9092", ("endpoints",): [{"endpoint": "c:4317"}],
            ("enrich", "rules"): [{"action": "hash", "attribute": "principal", "salt_env": "KCM_BRIDGE_SALT"}]})
        warn_of_unknown_variables(config, {"KCM_BRIDGE_SALT": "pepper"})
    assert caplog.records == []


@pytest.mark.parametrize("second", ["OTEL:4317", "otel.:4317", "otel:04317"])
def test_the_same_collector_given_twice_is_refused(second):
    repeated = rf"^endpoints\[1\] repeats endpoints\[0\] \({second}\); give each collector once$"
    with pytest.raises(ConfigError, match=repeated):
        load(env={}, overrides={("kafka", "bootstrap_servers"): "k:9092"}, endpoints=["otel:4317", second],
             insecure=True)
    with pytest.raises(ConfigError, match=r"repeats endpoints\[0\]"):
        load(env={}, overrides={("kafka", "bootstrap_servers"): "k:9092"},
             endpoints=["[::1]:4317", "[0:0::1]:4317"], insecure=True)


@pytest.mark.parametrize("tls", [{"ca_file": ""}, {"ca_file": " "}, {"cert_file": "", "key_file": ""}])
def test_an_empty_tls_file_setting_is_refused_not_read_as_no_tls_file(tmp_path, tls):
    """A template that rendered empty dropped the private CA or the client certificate without a word."""
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": "k:9092"},
                                    "endpoints": [{"endpoint": "c:4317", "tls": tls}]}))
    with pytest.raises(ConfigError, match=r"endpoints\[0\]\.tls\.(ca|cert)_file is empty: name a PEM file"):
        load(path, env={})


def test_a_static_attribute_named_like_a_contract_header_is_said_to_replace_it(caplog):
    load(env={}, endpoints=["c:4317"], overrides={("kafka", "bootstrap_servers"): "k:9092",
                                                   ("enrich",): {"static_attributes": {"cluster_id": "prod"}}})
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("enrich.static_attributes.cluster_id replaces the contract header cluster_id")


GOOD = {("kafka", "bootstrap_servers"): "k:9092"}


@pytest.mark.parametrize(("env", "overrides", "yaml_text", "field"), [
    ({}, {("kafka", "group_id"): "g-Xk9\udcff"}, "", "kafka.group_id"),          # --group-id $'g\xff'
    ({"KCM_BRIDGE_GROUP_ID": "g-Xk9\udcff"}, {}, "", "kafka.group_id"),
    ({}, {}, 'kafka: {group_id: "g-Xk9\\udcff"}', "kafka.group_id"),            # a YAML escape
    ({"KCM_BRIDGE_BOOTSTRAP_SERVERS": "local\udcffhost:9092"}, {("kafka", "bootstrap_servers"): None}, "",
     "kafka.bootstrap_servers"),
    ({"KCM_BRIDGE_ENDPOINTS": "Xk9\udcff:4317"}, {}, "", "endpoints[0].endpoint"),
    ({"KCM_BRIDGE_TOPICS": "metrics,Xk9\udcff"}, {}, "", "kafka.topics[1]"),
    ({}, {}, 'enrich: {static_attributes: {team: "Xk9\\udcff"}}', "enrich.static_attributes.team"),
    ({}, {}, 'enrich: {static_attributes: {"Xk9\\udcff": a}}', "a name in enrich.static_attributes"),
    ({}, {}, 'kafka: {properties: {sasl.password: "Xk9\\ud800"}}', "kafka.properties.sasl.password"),
    ({}, {}, 'endpoints: [{endpoint: "c:4317", headers: {authorization: "Bearer Xk9\\udcff"}}]',
     "endpoints[0].headers.authorization"),
    ({}, {}, 'enrich: {rules: [{action: hash, attribute: principal, salt: "Xk9\\udcff"}]}', "enrich.rules[0].salt"),
])
def test_a_setting_that_is_not_utf8_text_is_refused_naming_the_field_not_the_value(tmp_path, env, overrides,
                                                                                    yaml_text, field):
    # Python reads a byte that is not UTF-8 in argv or the environment as a lone surrogate, as YAML reads \udcff: a
    # group id made librdkafka abort the process, a static attribute made every record unprocessable (all dropped).
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml_text + ("" if "endpoints:" in yaml_text else "\nendpoints: [{endpoint: 'c:4317'}]\n"))
    with pytest.raises(ConfigError) as error:
        load(path, env=env, overrides={**GOOD, **overrides})
    message = str(error.value)
    assert message.startswith(f"{field} is not UTF-8 text (a byte that is not UTF-8 in a variable or on the command "
                              "line"), message
    assert "Xk9" not in message


def test_an_escaped_surrogate_pair_in_the_file_is_the_one_character_it_stands_for(tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text('enrich: {static_attributes: {team: "\\ud83d\\ude80"}}\n')
    config = load(path, env={}, overrides=GOOD, endpoints=["c:4317"])
    assert config.enrich.static_attributes == {"team": "\U0001F680"}


def test_the_command_reports_a_group_id_that_is_not_utf8_in_one_line_with_exit_code_2():
    # In a process of its own: librdkafka given such a group id aborts the process (SIGABRT, a core dump).
    result = subprocess.run([sys.executable, "-m", "kcm_cli.main", "bridge", "--bootstrap-server", "127.0.0.1:1",
                             "--endpoint", "c:4317", "--insecure", "--group-id", b"g\xff"],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (2, "kcm bridge: kafka.group_id is not UTF-8 text (a byte that is "
                                                     "not UTF-8 in a variable or on the command line, or a lone "
                                                     "\\uD800-\\uDFFF escape) (set by --group-id)\n")


@pytest.mark.timeout(60)   # in-process: a regression would run a real bridge here, not fail
def test_the_command_reports_a_property_escaping_half_a_surrogate_pair_in_one_line_with_exit_code_2(tmp_path,
                                                                                                   capsys):
    from kcm_cli.main import main

    properties = tmp_path / "client.properties"
    properties.write_text("client.id=app\\ud800\n")
    assert main(["bridge", "--bootstrap-server", "127.0.0.1:1", "--endpoint", "c:4317", "--insecure",
                 "--command-config", str(properties)]) == 2
    assert capsys.readouterr().err.startswith("kcm bridge: the value of property client.id on line 1 is not UTF-8 "
                                              "text (a \\uD800-\\uDFFF escape that is not half of a surrogate pair)\n")


def test_a_salt_from_the_environment_is_its_bytes_whatever_they_are_as_from_a_file(tmp_path, monkeypatch):
    from kcm_bridge.config import rule_salt

    monkeypatch.setenv("KCM_TEST_SALT", "\udcff\udcfesalt")   # env MY_SALT=$'\xff\xfesalt'
    salt_file = tmp_path / "salt"
    salt_file.write_bytes(b"\xff\xfesalt")
    path = tmp_path / "bridge.yaml"
    path.write_text(f"enrich: {{rules: [{{action: hash, attribute: principal, salt_env: KCM_TEST_SALT}}, "
                    f"{{action: hash, attribute: client_id, salt_file: '{salt_file}'}}]}}\n")
    from_env, from_file = load(path, env={}, overrides=GOOD, endpoints=["c:4317"]).enrich.rules
    assert rule_salt(from_env) == rule_salt(from_file) == b"\xff\xfesalt"


def test_a_header_value_from_the_environment_that_is_not_utf8_is_refused_naming_the_header(monkeypatch):
    monkeypatch.setenv("KCM_TEST_TOKEN", "Bearer Xk9\udcff")
    with pytest.raises(ConfigError) as error:
        load(env={}, overrides={**GOOD, ("endpoints",): [
            {"endpoint": "c:4317", "headers_from_env": {"authorization": "KCM_TEST_TOKEN"}}]})
    assert str(error.value).startswith("endpoints[0].headers_from_env.authorization: header 'authorization' must "
                                       "have a value of printable ASCII") and "Xk9" not in str(error.value)


def test_a_file_path_is_opened_by_its_bytes_so_any_name_the_file_system_holds_will_do(tmp_path):
    properties = tmp_path / "client-\udcff.properties"   # a name with the byte 0xff
    properties.write_text("client.id=bridge\n")
    config = load(env={"KCM_BRIDGE_COMMAND_CONFIG": str(properties)}, overrides=GOOD, endpoints=["c:4317"])
    assert config.kafka_properties() == {"client.id": "bridge"}


@pytest.mark.parametrize(("env", "message"), [
    ({"KCM_BRIDGE_INSECURE": "maybe"}, "insecure must be true or false, not 'maybe' (set by KCM_BRIDGE_INSECURE)"),
    ({"KCM_BRIDGE_METRICS_PORT": "abc"},
     "metrics_port must be a whole number, not 'abc' (set by KCM_BRIDGE_METRICS_PORT)"),
    ({"KCM_BRIDGE_METRICS_PORT": "70000"},
     "metrics_port must be from 0 to 65535, not 70000 (set by KCM_BRIDGE_METRICS_PORT)"),
    ({"KCM_BRIDGE_BATCH_MAX_POINTS": "0"},
     "batch.max_points must be positive, not 0 (set by KCM_BRIDGE_BATCH_MAX_POINTS)"),
    ({"KCM_BRIDGE_ENDPOINTS": "http://c:4317"}, "endpoints[0].endpoint must be HOST:PORT (e.g. otel-collector:4317), "
                                                "not 'http://c:4317' (set by KCM_BRIDGE_ENDPOINTS)"),
])
def test_an_error_in_a_setting_a_variable_gave_names_the_variable(env, message):
    """`insecure must be true or false` sent the reader to a config file that does not hold it."""
    with pytest.raises(ConfigError) as error:
        load(env={"KCM_BRIDGE_BOOTSTRAP_SERVERS": "k:9092", "KCM_BRIDGE_ENDPOINTS": "c:4317", **env})
    assert str(error.value) == message


@pytest.mark.parametrize(("env", "insecure", "source"), [({"KCM_BRIDGE_INSECURE": "true"}, None, "KCM_BRIDGE_INSECURE"),
                                                         ({}, True, "--insecure")])
def test_plaintext_asked_for_every_endpoint_contradicting_a_files_tls_names_where_it_was_asked(
        tmp_path, env, insecure, source):
    path = tmp_path / "bridge.yaml"
    path.write_text(KAFKA + "endpoints: [{endpoint: 'c:4317', tls: {ca_file: /etc/ca.pem}}]\n")
    with pytest.raises(ConfigError) as error:
        load(path, env=env, insecure=insecure)
    assert str(error.value) == ("endpoints[0]: insecure (plaintext) contradicts the tls files given; drop one "
                                f"(insecure set for every endpoint by {source})")


@pytest.mark.timeout(60)   # in-process: a regression would run a real bridge here, not fail
def test_the_command_names_the_flag_that_gave_a_bad_setting(capsys):
    from kcm_cli.main import main

    assert main(["bridge", "--bootstrap-server", "k:9092", "--endpoint", "c:4317", "--insecure",
                 "--topic", "a", "--topic", "a"]) == 2
    assert capsys.readouterr().err == "kcm bridge: kafka.topics names 'a' more than once (set by --topic)\n"


@pytest.mark.parametrize(("text", "message"), [
    ("temporality: {delta_to_cumulative: null}\n", "temporality.delta_to_cumulative must be true or false, not null"),
    ("batch:\n", "batch must be a mapping, not null"),
    ("kafka: {bootstrap_servers: 'k:9092', group_id: ~}\n", "kafka.group_id must be a string, not null"),
])
def test_a_null_where_a_value_is_needed_is_called_null_not_none_or_nonetype(tmp_path, text, message):
    path = tmp_path / "bridge.yaml"
    path.write_text(("" if text.startswith("kafka") else KAFKA) + text + ENDPOINTS)
    with pytest.raises(ConfigError) as error:
        load(path, env={})
    assert str(error.value) == message
