"""Kafka client settings in librdkafka's spelling, for the components that read Kafka with confluent-kafka."""

from __future__ import annotations

import operator
from typing import Any

from kcm_common.kafka import KafkaSettings, kafka_python_options

# A confluent-kafka message's headers, asked for from C. For a header name that is not UTF-8 (any producer may write
# one) confluent-kafka returns a list with an error set: a call from C raises SystemError at once, while a plain
# `message.headers()` does only until CPython specialises the call site, after which the error surfaces in some later,
# unrelated call. Never ask a message that raised again: the second call returns the broken list without an error.
message_headers = operator.methodcaller("headers")

# kafka-python keyword -> librdkafka property, for the TLS/SASL settings kcm_common validates.
_LIBRDKAFKA_NAMES = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "client_id": "client.id",
}
_SOCKET_TIMEOUT_MS = (10, 300_000)


def librdkafka_config(settings: KafkaSettings) -> dict[str, Any]:
    """TLS/SASL settings in librdkafka spelling (after kcm_common's validation), for kcm's own clients: they read or
    write the metrics topic and its cluster, so none pushes KIP-714 telemetry (it would land in the topic they read,
    and a rollup's input would change with each run)."""
    config: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, "enable.metrics.push": False}
    for key, value in kafka_python_options(settings.properties).items():
        if key == "ssl_check_hostname":
            config["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        elif key == "request_timeout_ms":
            # librdkafka's socket.timeout.ms takes 10 to 300000 (Java's request.timeout.ms any positive number).
            config["socket.timeout.ms"] = min(max(value, _SOCKET_TIMEOUT_MS[0]), _SOCKET_TIMEOUT_MS[1])
        elif key in _LIBRDKAFKA_NAMES:
            config[_LIBRDKAFKA_NAMES[key]] = value
    if settings.security_protocol.startswith("SASL") and "sasl.mechanism" not in config:
        config["sasl.mechanism"] = "PLAIN"   # kcm's default for every client (librdkafka's own is GSSAPI)
    return config
