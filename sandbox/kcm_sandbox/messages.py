"""KIP-714 telemetry messages (api keys 71 and 72) as kafka-python 3.x ApiMessage classes.

kafka-python ships no schemas for these two APIs, so the classes load Apache Kafka's own JSON
schemas, copied into `kcm_sandbox.schemas`. The config APIs the gateway also serves come from
kafka-python itself: `kafka.protocol.admin.configs` (DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, ListConfigResources) and `kafka.protocol.metadata.api_versions` (ApiVersions).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from kcm_sandbox import schemas


class GetTelemetrySubscriptionsRequest(ApiMessage, load_json=schemas): pass
class GetTelemetrySubscriptionsResponse(ApiMessage, load_json=schemas): pass

class PushTelemetryRequest(ApiMessage, load_json=schemas): pass
class PushTelemetryResponse(ApiMessage, load_json=schemas): pass


__all__ = [
    "GetTelemetrySubscriptionsRequest", "GetTelemetrySubscriptionsResponse",
    "PushTelemetryRequest", "PushTelemetryResponse",
]
