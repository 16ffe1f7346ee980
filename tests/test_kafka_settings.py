"""Client properties files turn into kafka-python options, and bad ones are refused with the property named."""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time

import pytest
from kafka.errors import KafkaConfigurationError, KafkaTimeoutError

from kcm_common.kafka import (KafkaConfigError, KafkaSettings, KafkaUnavailableError, check_reachable,
                              diagnose_failure, kafka_python_options, load_properties, parse_bootstrap,
                              parse_properties)

_NOT_A_CERTIFICATE = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


def test_sasl_credentials_from_jaas_config():
    options = kafka_python_options({"security.protocol": "sasl_plaintext", "sasl.mechanism": "scram-sha-512",
                                    "sasl.jaas.config": 'x.ScramLoginModule required username="u" password="p";'})

    assert options == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                       "sasl_plain_username": "u", "sasl_plain_password": "p"}


def test_librdkafka_spellings_are_accepted(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")

    options = kafka_python_options({"security.protocol": "SSL", "ssl.ca.location": str(ca),
                                    "ssl.endpoint.identification.algorithm": "", "sasl.mechanisms": "PLAIN",
                                    "sasl.username": "u", "sasl.password": "p"})

    assert options["ssl_cafile"] == str(ca)
    assert options["ssl_check_hostname"] is False
    assert options["sasl_mechanism"] == "PLAIN"


def test_java_property_values_are_trimmed_as_java_trims_them_and_librdkafka_ones_are_not(tmp_path):
    # java.util.Properties keeps a blank after a value; ConfigDef.parseType trims it off every Java client property.
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL \nsasl.mechanism=PLAIN\t\n"
                      'sasl.jaas.config=x.PlainLoginModule required username="u" password="p"; \n'
                      "ssl.key.password=kpass \nclient.id=app \nrequest.timeout.ms=5000 \n"
                      "ssl.endpoint.identification.algorithm=https \n")
    settings = KafkaSettings("b:9093", load_properties(config))

    options = kafka_python_options(settings.properties)

    assert options == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_plain_username": "u",
                       "sasl_plain_password": "p", "ssl_password": "kpass", "client_id": "app",
                       "request_timeout_ms": 5000, "ssl_check_hostname": True}
    assert settings.security_protocol == "SASL_SSL"
    # librdkafka's own names are read as librdkafka reads them: untrimmed.
    assert kafka_python_options({"security.protocol": "SASL_SSL", "sasl.username": "u",
                                 "sasl.password": "p "})["sasl_plain_password"] == "p "


@pytest.mark.parametrize(("value", "checked"), [("https", True), ("HTTPS", True), ("https ", True), ("", False),
                                                ("none", False), ("NONE", False)])
def test_host_name_checking_is_on_for_https_and_off_only_for_empty_or_none(tmp_path, value, checked):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")

    options = kafka_python_options({"security.protocol": "SSL", "ssl.ca.location": str(ca),
                                    "ssl.endpoint.identification.algorithm": value})

    assert options["ssl_check_hostname"] is checked


@pytest.mark.parametrize("value", ["htps", "http", "yes", "false"])
def test_an_unknown_host_name_check_is_refused_not_read_as_no_check(value):
    # Java fails the handshake on an algorithm it does not know, librdkafka the configuration: never "no check".
    with pytest.raises(KafkaConfigError, match=f"ssl.endpoint.identification.algorithm must be https .* not '{value}'"):
        kafka_python_options({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": value})


def test_advertised_brokers_are_blamed_only_when_none_of_them_accepts_a_connection():
    # Behind a Kubernetes bootstrap Service the brokers always advertise other names: that alone is no diagnosis.
    from kafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

    from kcm_sandbox.broker import free_port

    settings = KafkaSettings("kafka-bootstrap.invalid:9092")
    with socket.create_server(("127.0.0.1", 0)) as listening:
        reachable = f"127.0.0.1:{listening.getsockname()[1]}"
        refused = diagnose_failure(settings, TopicAuthorizationFailedError("kafka-client-metrics"), [reachable])
    assert "advertise" not in str(refused) and "TopicAuthorizationFailedError" in str(refused)
    closed = f"127.0.0.1:{free_port()}"
    unreachable = diagnose_failure(settings, KafkaConnectionError("111 ECONNREFUSED"), [closed])
    assert f"its brokers advertise {closed}, which this client could not reach" in str(unreachable)
    # kafka-python's errors start their text with their name: said once.
    assert str(unreachable).count("KafkaConnectionError") == 1, unreachable


def test_advertised_brokers_that_stay_silent_count_as_out_of_reach_however_many():
    # Pod addresses seen from outside the cluster drop SYNs: probed one after another, six of them used up the time
    # and the bridge's check passed.
    from kcm_common.kafka import unreachable_advertised

    held, silent = [], []
    for _ in range(6):   # loopback listeners whose accept queue is full: a connect to them times out
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        held.append(server)
        while True:
            filler = socket.socket()
            filler.settimeout(0.3)
            try:
                filler.connect(server.getsockname())
            except OSError:
                filler.close()
                break
            held.append(filler)
        silent.append(f"127.0.0.1:{server.getsockname()[1]}")
    try:
        hint = unreachable_advertised("kafka-bootstrap.invalid:9092", silent, 1.0)
    finally:
        for sock in held:
            sock.close()
    assert hint is not None and "its brokers advertise" in hint   # silence is no answer, however many are silent


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_certificate_issued_for_other_host_names_points_at_the_host_not_the_ca(tls_listener_for_another_name,
                                                                                host):
    port, ca = tls_listener_for_another_name
    settings = KafkaSettings(f"{host}:{port}", {"security.protocol": "SSL", "ssl.ca.location": str(ca)})
    with pytest.raises(KafkaUnavailableError) as error:
        check_reachable(settings, 5)
    assert "presented a certificate issued for other host names" in str(error.value)
    assert "ssl.endpoint.identification.algorithm empty" in str(error.value)
    assert "check ssl.ca.location" not in str(error.value)


def test_the_bridges_consumer_tuning_is_passed_over_by_the_client_options():
    from kcm_common.kafka import CONSUMER_PROPERTIES

    tuning = {name: "1" for name in CONSUMER_PROPERTIES}
    assert kafka_python_options({"security.protocol": "SSL", **tuning}) == {"security_protocol": "SSL"}


@pytest.mark.parametrize(("properties", "message"), [
    ({"bogus.key": "1"}, "unsupported client property 'bogus.key'"),
    # A misspelt consumer setting is told the bridge's tuning exists.
    ({"sesion.timeout.ms": "3000"}, "unsupported client property 'sesion.timeout.ms'; supported: .*; and for kcm "
                                    "bridge's consumer: .*session.timeout.ms"),
    ({"security.protocol": "TLS"}, "security.protocol must be one of"),
    ({"security.protocol": "SASL_SSL"}, "needs sasl.username and sasl.password"),
    ({"sasl.mechanism": "GSSAPI", "sasl.username": "u"}, "sasl.mechanism must be one of"),
    ({"ssl.ca.location": "/no/such/ca.pem"}, "not a readable file"),
    ({"request.timeout.ms": "soon"}, "request.timeout.ms must be a whole number"),
])
def test_bad_properties_name_what_is_wrong(properties, message):
    with pytest.raises(KafkaConfigError, match=message):
        kafka_python_options(properties)


@pytest.mark.parametrize("line", ["S3CRETpass word", "S3CRET:x", "S3CRETwith=sign", "s3cretpass x"])
def test_a_line_missing_its_key_is_refused_without_showing_what_may_be_a_password(tmp_path, line):
    config = tmp_path / "client.properties"
    config.write_text(f"security.protocol=SASL_SSL\n{line}\n")
    with pytest.raises(KafkaConfigError) as error:
        kafka_python_options(load_properties(config))
    assert "unsupported client property whose name is not a property name (not shown" in str(error.value)
    assert "3cret" not in str(error.value).lower()


@pytest.mark.parametrize("lines", [
    "security.protocol=SASL_PLAINTEXT sasl.password=S3cretPW\nsasl.mechanism=PLAIN\nsasl.username=alice",
    "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN sasl.password=S3cretPW\nsasl.username=alice",
    "security.protocol=SSL\nssl.truststore.type=PEM ssl.key.password=S3cretPW",
    "security.protocol=SSL\nssl.ca.location=/etc/ca.pem ssl.key.password=S3cretPW",
    "security.protocol=SSL\nssl.endpoint.identification.algorithm=https ssl.key.password=S3cretPW",
    "security.protocol=SASL_SSLsasl.password:S3cretPW\nsasl.mechanism=PLAIN\nsasl.username=alice",
], ids=["protocol", "mechanism", "store-type", "pem-file", "algorithm", "colon-separated"])
def test_two_lines_run_together_never_put_the_second_ones_secret_in_the_error(tmp_path, lines):
    """A lost newline makes the next property, a password perhaps, part of a value the error quoted whole."""
    config = tmp_path / "client.properties"
    config.write_text(lines + "\n")

    with pytest.raises(KafkaConfigError) as error:
        kafka_python_options(load_properties(config))

    assert "S3cret" not in str(error.value) and "are two lines run together?" in str(error.value)


def test_a_sasl_user_name_run_together_with_the_password_is_not_shown_when_kafka_rejects_it():
    from kcm_common.kafka import denied_message, rejected_message

    settings = KafkaSettings("b1:9092", {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                         "sasl.username": "alice sasl.password=S3cretPW", "sasl.password": "x"})
    for message in (rejected_message(settings, "refused"), denied_message(settings, "READ on group g", "denied")):
        assert "S3cret" not in message and "are two lines run together?" in message


def test_settings_never_show_secrets(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=hunter2\n")

    settings = KafkaSettings.from_cli("b1:9093, b2:9093", config)

    assert settings.client_options()["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in settings.describe()


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(KafkaConfigError, match="cannot read the client config file"):
        KafkaSettings.from_cli("b:9092", tmp_path / "absent.properties")


def test_a_java_keystore_is_refused_with_how_to_convert_it(tmp_path):
    store = tmp_path / "truststore.jks"
    store.write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02")

    with pytest.raises(KafkaConfigError, match="not a PEM file.*keytool"):
        kafka_python_options({"security.protocol": "SSL", "ssl.truststore.location": str(store)})
    with pytest.raises(KafkaConfigError, match="ssl.truststore.type=JKS is not supported"):
        kafka_python_options({"ssl.truststore.type": "JKS"})


def test_a_store_type_of_pem_is_accepted(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text(_NOT_A_CERTIFICATE)

    options = kafka_python_options({"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                    "ssl.truststore.location": str(ca)})

    assert options == {"security_protocol": "SSL", "ssl_cafile": str(ca)}


def test_a_ca_file_that_does_not_load_is_a_config_error_not_an_unreachable_broker(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text(_NOT_A_CERTIFICATE)
    listener = socket.create_server(("127.0.0.1", 0))
    host, port = listener.getsockname()[:2]
    try:
        with pytest.raises(KafkaConfigError, match="ssl.ca.location .* holds no usable CA certificate"):
            check_reachable(KafkaSettings(f"{host}:{port}", {"security.protocol": "SSL", "ssl.ca.location": str(ca)}),
                            timeout_s=2)
    finally:
        listener.close()


def test_an_error_without_a_message_is_named_once():
    message = str(diagnose_failure(KafkaSettings("b:9092"), KafkaTimeoutError()))

    assert message.count("KafkaTimeoutError") == 1, message


def test_the_client_refusing_its_own_settings_is_a_config_error_not_an_unreachable_kafka():
    problem = diagnose_failure(KafkaSettings("b:9092"), KafkaConfigurationError("request_timeout_ms too large"))

    assert isinstance(problem, KafkaConfigError)
    assert str(problem) == "the Kafka client rejected its settings: request_timeout_ms too large; check --command-config"


@pytest.mark.parametrize("line", ["sasl.passwordS3cr3tPW", "= S3cr3tPW", "=S3cr3tPW"])
def test_an_unreadable_property_line_is_named_by_number_never_quoted(line):
    text = f"# client settings\nsecurity.protocol=SASL_SSL\n\\\n{line}\n"
    with pytest.raises(KafkaConfigError) as raised:
        parse_properties(text)
    assert str(raised.value) == "cannot read the property on line 3: expected key=value"
    assert "S3cr3t" not in str(raised.value)


@pytest.mark.parametrize(("line", "message"), [
    ("sasl.password=S3cr3t\\ud800", "the value of property sasl.password on line 2 is not UTF-8 text"),
    ("client.id=S3cr3t\\uDE00\\uD83D", "the value of property client.id on line 2 is not UTF-8 text"),
    ("client\\udcff.id=S3cr3t", "the property name on line 2 is not UTF-8 text"),
])
def test_a_property_escaping_half_a_surrogate_pair_is_named_never_quoted(tmp_path, line, message):
    # Java reads \\uD800 alone into a String, but neither Kafka client can send it: librdkafka fails its config.
    config = tmp_path / "client.properties"
    config.write_text(f"security.protocol=PLAINTEXT\n{line}\n")
    with pytest.raises(KafkaConfigError) as raised:
        load_properties(config)
    assert str(raised.value).startswith(message) and "S3cr3t" not in str(raised.value)


def test_an_escaped_surrogate_pair_is_one_character_as_java_reads_it():
    assert parse_properties("client.id=app-\\uD83D\\uDE00\n") == {"client.id": "app-\U0001F600"}


@pytest.mark.parametrize("properties", [{"sasl.password": "S3cr3t\udcff"}, {"client.id\udcff": "S3cr3t"}])
def test_settings_holding_a_lone_surrogate_are_refused_at_validation_never_quoted(properties):
    # What the properties file reader refuses can still come from elsewhere (a Secret, the bridge's YAML).
    with pytest.raises(KafkaConfigError) as raised:
        KafkaSettings("k:9092", {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", **properties}).validate()
    message = str(raised.value)
    assert "is not UTF-8 text" in message and "S3cr3t" not in message and "\udcff" not in message


@pytest.mark.parametrize(("servers", "message"), [
    ("local\udcffhost:9092", r"bootstrap server 'local\\udcffhost:9092' is not UTF-8 text \(a byte that is not UTF-8"),
    ("k:9092,kafka..svc:9092", "bootstrap server 'kafka..svc:9092' has no host name the resolver can be asked for"),
    (f"{'k' * 64}.svc:9092", "has no host name the resolver can be asked for"),
])
def test_a_bootstrap_host_the_resolver_cannot_be_asked_for_is_a_config_error(servers, message):
    # Python encodes a host name as IDNA before resolving it: these were a UnicodeError traceback from kcm tail.
    with pytest.raises(KafkaConfigError, match=message):
        parse_bootstrap(servers)
    with pytest.raises(KafkaConfigError, match=message):
        check_reachable(KafkaSettings(servers), timeout_s=5)


def test_an_international_host_name_is_still_a_bootstrap_server():
    assert parse_bootstrap("b\u00fccher.example:9092,[::1]:9093") == [("b\u00fccher.example", 9092), ("::1", 9093)]


def test_servers_that_never_answer_cost_one_timeout_in_all_and_are_named_once(tmp_path):
    """Listed twenty times, or beside servers that refuse: the probe takes the timeout once, not once per entry."""
    tarpit = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
    port = tarpit.getsockname()[1]
    try:
        for servers in (",".join([f"127.0.0.1:{port}"] * 20),
                        ",".join([f"127.0.0.1:{port}"] + [f"127.0.0.{i}:{port}" for i in range(2, 30)])):
            began = time.monotonic()
            with pytest.raises(KafkaUnavailableError) as err:
                check_reachable(KafkaSettings(servers), timeout_s=1.0)
            assert time.monotonic() - began < 2.5
            assert str(err.value).count(f"127.0.0.1:{port} ") == 1
            assert len(str(err.value)) < 1000
    finally:
        tarpit.close()


def _encrypted_pem_pair(directory) -> tuple[str, str]:
    cert, key = directory / "client.pem", directory / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-passout", "pass:the-pass-phrase", "-subj",
                    "/CN=kcm-test", "-days", "2", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def _run_on_a_terminal(code: str, timeout_s: float = 30.0) -> tuple[int | None, str]:
    """Run Python `code` with a terminal of its own (OpenSSL asks for pass phrases there); (exit status or None if
    it was still running at the timeout, or stopped to ask; what it wrote)."""
    pid, fd = pty.fork()
    if pid == 0:   # the child: its controlling terminal is the pty
        os.execv(sys.executable, [sys.executable, "-c", code])
    output, status = b"", None
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and b"Enter PEM pass phrase" not in output:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    output += os.read(fd, 4096)
                except OSError:   # EIO: the child closed the terminal, exiting
                    pass
            done, code_or_signal = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(code_or_signal)
                break
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    return status, output.decode(errors="replace")


def test_an_encrypted_key_without_its_pass_phrase_is_refused_at_once_never_asked_for(tmp_path):
    cert, key = _encrypted_pem_pair(tmp_path)
    properties = {"security.protocol": "SSL", "ssl.certificate.location": cert, "ssl.key.location": key}
    probe = f"from kcm_common.kafka import KafkaSettings; KafkaSettings('kafka:9093', {properties!r}).validate()"
    status, output = _run_on_a_terminal(probe)
    assert status == 1 and "Enter PEM pass phrase" not in output, output
    assert f"KafkaConfigError: the key {key!r} is encrypted and no pass phrase was given: set ssl.key.password, " \
           "or store the key unencrypted" in output.replace("\r\n", "").replace("\n", "")

    KafkaSettings("kafka:9093", {**properties, "ssl.key.password": "the-pass-phrase"}).validate()
    with pytest.raises(KafkaConfigError, match="do not load") as refused:
        KafkaSettings("kafka:9093", {**properties, "ssl.key.password": "wrong"}).validate()
    assert "wrong" not in str(refused.value)


def test_kcm_s_own_librdkafka_clients_push_no_telemetry():
    """Every kcm client of confluent-kafka (the bridge's consumer and dead-letter producer, the rollup's source and
    its check) reads or writes the metrics topic's cluster: one pushing KIP-714 telemetry would add to what it
    reads. librdkafka pushes by default."""
    from kcm_common.librdkafka import librdkafka_config

    assert librdkafka_config(KafkaSettings("127.0.0.1:9092"))["enable.metrics.push"] is False
