"""Apache Kafka protocol numbers kcm relies on: error codes, API keys, config resource types and sources."""

from __future__ import annotations

# Error codes (org.apache.kafka.common.protocol.Errors).
UNKNOWN_SERVER_ERROR = -1
NONE = 0
UNSUPPORTED_VERSION = 35
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
THROTTLING_QUOTA_EXCEEDED = 89
UNKNOWN_SUBSCRIPTION_ID = 117
TELEMETRY_TOO_LARGE = 118

# API keys of KIP-714 and the config listing API.
GET_TELEMETRY_SUBSCRIPTIONS = 71
PUSH_TELEMETRY = 72
LIST_CONFIG_RESOURCES = 74

# ConfigResource.Type ids.
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8
CLIENT_METRICS_RESOURCE = 16
GROUP_RESOURCE = 32

# DescribeConfigsResponse.ConfigSource ids.
DEFAULT_CONFIG_SOURCE = 5
CLIENT_METRICS_CONFIG_SOURCE = 7
