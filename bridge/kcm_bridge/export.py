"""The bridge's OTLP/gRPC endpoints: its endpoint settings turned into kcm_common's exporter."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kcm_common.otlp_export import Endpoint, RetryPolicy, Tls

from kcm_bridge.config import EndpointConfig


def open_endpoint(config: EndpointConfig, retry: RetryPolicy, give_up: Callable[[], bool]) -> Endpoint:
    """An exporter to one configured collector; header values from files and the environment are read now."""
    tls = Tls(config.tls.ca_file, config.tls.cert_file, config.tls.key_file)
    return Endpoint(config.endpoint, retry, give_up, insecure=config.insecure, tls=tls, metadata=_metadata(config),
                    compression=config.compression, timeout_s=config.timeout_s)


def _metadata(config: EndpointConfig) -> list[tuple[str, str]]:
    headers = dict(config.headers)
    headers.update({name: Path(path).read_text(encoding="utf-8").strip()
                    for name, path in config.headers_from_files.items()})
    headers.update({name: os.environ[variable] for name, variable in config.headers_from_env.items()})
    return sorted(headers.items())
