"""Kafka client settings in the Java client's spelling, for the components that hand them to a JVM
(Spark's Kafka connector reads them as `kafka.`-prefixed options).

A `--command-config` file may use librdkafka names (`sasl.username`, `ssl.ca.location`) that the Java client does
not know; after kcm_common's validation they become what it does: a JAAS line for SASL, PEM stores for TLS. The
PEM contents are passed inline (`ssl.truststore.certificates`, `ssl.keystore.certificate.chain`, `ssl.keystore.key`):
a Spark executor on another host has no file at the driver's path, and the Java client wants key and certificate in
one keystore value while the files may be two. Only certificate blocks go into the certificate values.
"""

from __future__ import annotations

import re
from pathlib import Path

from kcm_common.java import TRIM_CHARACTERS
from kcm_common.kafka import LOGIN_MODULES, KafkaConfigError, KafkaSettings, kafka_python_options


def java_client_properties(settings: KafkaSettings) -> dict[str, str]:
    """The TLS/SASL settings (bootstrap servers excluded) as Java kafka-clients properties."""
    options = kafka_python_options(settings.properties)
    protocol = options["security_protocol"]
    properties = {"security.protocol": protocol}
    if protocol.startswith("SASL"):
        mechanism = options.get("sasl_mechanism", "PLAIN")
        properties["sasl.mechanism"] = mechanism
        # The file's own line as written (it may hold more options), unless it names a login module of another
        # package (a shaded build's, kafkashaded.org.apache.kafka…), which the Spark image's kafka-clients lacks.
        given = settings.properties.get("sasl.jaas.config")
        properties["sasl.jaas.config"] = given if given and given.strip(TRIM_CHARACTERS).startswith(
            tuple(set(LOGIN_MODULES.values()))) else (
            f'{LOGIN_MODULES[mechanism]} required username="{_quoted(options["sasl_plain_username"])}" '
            f'password="{_quoted(options["sasl_plain_password"])}";')
    if "ssl_cafile" in options:
        properties["ssl.truststore.type"] = "PEM"
        properties["ssl.truststore.certificates"] = _certificates(options["ssl_cafile"])
    if "ssl_certfile" in options:
        properties["ssl.keystore.type"] = "PEM"
        properties["ssl.keystore.certificate.chain"] = _certificates(options["ssl_certfile"])
        properties["ssl.keystore.key"] = _private_key(options.get("ssl_keyfile") or options["ssl_certfile"])
        if options.get("ssl_password"):
            properties["ssl.key.password"] = options["ssl_password"]
    elif "ssl_keyfile" in options:
        raise KafkaConfigError("ssl.key.location needs ssl.certificate.location (the client certificate) too")
    if "ssl_check_hostname" in options:
        properties["ssl.endpoint.identification.algorithm"] = "https" if options["ssl_check_hostname"] else ""
    if "client_id" in options:
        properties["client.id"] = options["client_id"]
    if "request_timeout_ms" in options:
        properties["request.timeout.ms"] = str(options["request_timeout_ms"])
    return properties


def _quoted(text: str) -> str:
    """A JAAS option value between double quotes (a line end would end the quoted string: escaped too)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")


def _certificates(path: str) -> str:
    """The certificate blocks of a PEM file, and nothing else (a file may hold the private key too)."""
    blocks = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", _read(path), re.DOTALL)
    if not blocks:
        raise KafkaConfigError(f"the PEM file {path!r} holds no certificate")
    return "\n".join(blocks) + "\n"


def _private_key(path: str) -> str:
    text = _read(path)
    if "PRIVATE KEY-----" not in text:
        raise KafkaConfigError(f"the client key file {path!r} holds no PEM private key")
    if not re.search(r"-----BEGIN (ENCRYPTED )?PRIVATE KEY-----", text):
        raise KafkaConfigError(f"the client key file {path!r} is not PKCS#8, which Java clients need: convert it "
                               "with `openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`")
    return text


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii")
    except OSError:
        raise KafkaConfigError(f"cannot read the PEM file {path!r} as text") from None
    except UnicodeDecodeError as exc:
        raise KafkaConfigError(
            f"cannot read the PEM file {path!r} as text: byte {exc.start} is not ASCII; PEM is base64 between "
            "-----BEGIN and -----END lines: remove the other lines (openssl's bag attributes, a friendlyName with "
            "accents)") from None
