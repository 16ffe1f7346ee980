"""Client properties in the Java client's spelling (what Spark's Kafka connector is given), checked by the
property mapping and by a real Java kafka-clients producer reading them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kcm_common.kafka import KafkaConfigError, KafkaSettings
from kcm_common.kafka_java import java_client_properties
from kcm_rollups.job import kafka_options
from kcm_rollups.source import SOURCE_NAME
from kcm_sandbox.java_receiver import build_dir, ensure_built, java_config_env, runtime_classpath

PASSWORD = 'pa"ss\\word-not-in-any-log'


def _settings(**properties: str) -> KafkaSettings:
    return KafkaSettings("127.0.0.1:9092", properties)


def _pem_pair(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its PKCS#8 key, made by openssl."""
    cert, key = directory / "client.pem", directory / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kcm-test",
                    "-days", "2", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def test_librdkafka_sasl_settings_become_a_jaas_line_with_quotes_escaped():
    properties = java_client_properties(_settings(**{
        "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice",
        "sasl.password": PASSWORD}))
    assert properties == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
                            'password="pa\\"ss\\\\word-not-in-any-log";'}
    plain = java_client_properties(_settings(**{"security.protocol": "SASL_PLAINTEXT", "sasl.username": "bob",
                                                "sasl.password": "x"}))
    assert plain["sasl.mechanism"] == "PLAIN" and plain["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required")


def test_a_jaas_line_given_by_the_user_is_kept_as_written():
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
    properties = java_client_properties(_settings(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                                     "sasl.jaas.config": jaas}))
    assert properties["sasl.jaas.config"] == jaas


def test_pem_files_become_pem_stores_with_the_client_key_inline(tmp_path):
    cert, key = _pem_pair(tmp_path)
    properties = java_client_properties(_settings(**{
        "security.protocol": "SSL", "ssl.ca.location": str(cert), "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key), "ssl.endpoint.identification.algorithm": "none", "client.id": "kcm-rollup"}))
    assert properties == {
        "security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.certificates": cert.read_text(),
        "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": cert.read_text(),
        "ssl.keystore.key": key.read_text(), "ssl.endpoint.identification.algorithm": "", "client.id": "kcm-rollup"}


def test_a_file_holding_key_and_certificate_puts_only_the_certificate_in_the_chain(tmp_path):
    """The chain is not a secret option, so the key must not ride in it (Spark does not redact it)."""
    cert, key = _pem_pair(tmp_path)
    combined = tmp_path / "combined.pem"
    combined.write_text(key.read_text() + cert.read_text())
    properties = java_client_properties(_settings(**{"security.protocol": "SSL",
                                                     "ssl.keystore.location": str(combined)}))
    assert properties["ssl.keystore.certificate.chain"] == cert.read_text()
    assert "PRIVATE KEY" not in properties["ssl.keystore.certificate.chain"]
    assert properties["ssl.keystore.key"] == combined.read_text()
    with pytest.raises(KafkaConfigError, match="holds no certificate"):
        java_client_properties(_settings(**{"security.protocol": "SSL", "ssl.ca.location": str(key)}))


def test_credentials_given_twice_are_refused_so_every_client_logs_in_as_the_same_user():
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
    with pytest.raises(KafkaConfigError, match="either sasl.jaas.config or sasl.username/sasl.password"):
        java_client_properties(_settings(**{"security.protocol": "SASL_SSL", "sasl.jaas.config": jaas,
                                            "sasl.username": "other", "sasl.password": "x"}))


def test_keys_java_cannot_read_and_a_key_without_its_certificate_say_what_to_do(tmp_path):
    cert, key = _pem_pair(tmp_path)
    pkcs1 = tmp_path / "rsa.key"
    pkcs1.write_text(key.read_text().replace("BEGIN PRIVATE KEY", "BEGIN RSA PRIVATE KEY")
                     .replace("END PRIVATE KEY", "END RSA PRIVATE KEY"))
    with pytest.raises(KafkaConfigError, match="not PKCS#8.*openssl pkcs8 -topk8"):
        java_client_properties(_settings(**{"security.protocol": "SSL", "ssl.certificate.location": str(cert),
                                            "ssl.key.location": str(pkcs1)}))
    with pytest.raises(KafkaConfigError, match="needs ssl.certificate.location"):
        java_client_properties(_settings(**{"security.protocol": "SSL", "ssl.key.location": str(key)}))


def test_spark_connector_gets_java_spellings_and_kcm_source_the_properties_as_given():
    settings = _settings(**{"security.protocol": "SASL_PLAINTEXT", "sasl.username": "alice",
                            "sasl.password": PASSWORD})
    assert kafka_options(SOURCE_NAME, settings) == {"kafka.security.protocol": "SASL_PLAINTEXT",
                                                    "kafka.sasl.username": "alice", "kafka.sasl.password": PASSWORD}
    java = kafka_options("kafka", settings)
    assert set(java) == {"kafka.security.protocol", "kafka.sasl.mechanism", "kafka.sasl.jaas.config"}


def _java_producer(bootstrap: str, properties: dict[str, str]) -> str:
    """Run the Java test producer once with `properties`; its output (it fails: nothing here lets it send)."""
    ensure_built()
    extra = {"max.block.ms": "4000", **properties}
    done = subprocess.run(["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                           "-cp", runtime_classpath(build_dir() / "kcm-test-clients.jar"), "dev.kcm.clients.TestClient",
                           "producer", bootstrap, "inventory", "kcm-java-check", "10"],
                          env=java_config_env(extra), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0, done.stdout
    return done.stdout + done.stderr


def test_a_real_java_client_authenticates_with_the_translated_sasl_settings(authenticating_broker):
    """The broker knows no user: with the translation the Java client gets as far as the SCRAM exchange and is
    refused; with the librdkafka spellings as given it cannot even build its login."""
    settings = _settings(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                            "sasl.username": "alice", "sasl.password": PASSWORD})
    translated = _java_producer(authenticating_broker, java_client_properties(settings))
    assert "SaslAuthenticationException" in translated, translated[-2000:]
    untranslated = _java_producer(authenticating_broker, dict(settings.properties))
    assert "SaslAuthenticationException" not in untranslated and "JAAS" in untranslated, untranslated[-2000:]


def test_a_real_java_client_loads_the_translated_pem_stores(tmp_path, broker):
    """Building the producer loads the trust and key stores; it then times out (the broker does not speak TLS)
    instead of failing to construct, as it does when the key is not one it can read."""
    cert, key = _pem_pair(tmp_path)
    settings = _settings(**{"security.protocol": "SSL", "ssl.ca.location": str(cert),
                            "ssl.certificate.location": str(cert), "ssl.key.location": str(key)})
    loaded = _java_producer(broker.bootstrap, java_client_properties(settings))
    assert "Failed to construct kafka producer" not in loaded and "TimeoutException" in loaded, loaded[-2000:]
    broken = {**java_client_properties(settings), "ssl.keystore.key": key.read_text()[:200]}
    assert "Failed to construct kafka producer" in _java_producer(broker.bootstrap, broken)
