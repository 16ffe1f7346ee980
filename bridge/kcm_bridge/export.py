"""The bridge's OTLP/gRPC endpoints: its endpoint settings turned into kcm_common's exporter."""

from __future__ import annotations

from collections.abc import Callable

from kcm_common.otlp_export import Endpoint, RetryPolicy, Tls

from kcm_bridge.config import EndpointConfig, endpoint_metadata


def open_endpoint(config: EndpointConfig, retry: RetryPolicy, give_up: Callable[[], bool],
                  on_failure: Callable[[str, bool], None] = lambda code, retrying: None) -> Endpoint:
    """An exporter to one configured collector; header values from files and the environment are read now, and
    again whenever the collector refuses them (so a rotated token file is used from the next export)."""
    tls = Tls(config.tls.ca_file, config.tls.cert_file, config.tls.key_file)
    return Endpoint(config.endpoint, retry, give_up, insecure=config.insecure, tls=tls,
                    metadata=lambda: endpoint_metadata(config), compression=config.compression,
                    timeout_s=config.timeout_s, on_failure=on_failure,
                    retry_auth_refusals=config.retry_refused_credentials, balancing=config.balancing)
