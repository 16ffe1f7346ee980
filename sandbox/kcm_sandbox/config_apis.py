"""The config APIs with CLIENT_METRICS resources split off: answered from the subscription store, the rest by upstream.

`split` answers the CLIENT_METRICS resources and builds the request for what remains (None when nothing does);
`merge` puts the two answers back together in the order the client asked.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListConfigResourcesResponse,
)

from kcm_common.client_metrics import ConfigError
from kcm_common.codes import (
    BROKER_LOGGER_RESOURCE,
    BROKER_RESOURCE,
    CLIENT_METRICS_CONFIG_SOURCE,
    CLIENT_METRICS_RESOURCE,
    GROUP_RESOURCE,
    INVALID_REQUEST,
    TOPIC_RESOURCE,
    UNSUPPORTED_VERSION,
)
from kcm_sandbox.store import SubscriptionStore

_DescribeResult = DescribeConfigsResponse.DescribeConfigsResult
_DescribeEntry = _DescribeResult.DescribeConfigsResourceResult
_Synonym = _DescribeEntry.DescribeConfigsSynonym
_AlterResult = AlterConfigsResponse.AlterConfigsResourceResponse
_IncrementalResult = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
_REPEATED_RESOURCE = "Each resource must appear at most once."
# ListConfigResourcesRequest.supportedResourceTypes (v1; v0 sends no types and means CLIENT_METRICS).
_LISTABLE_TYPES = frozenset({TOPIC_RESOURCE, BROKER_RESOURCE, BROKER_LOGGER_RESOURCE, CLIENT_METRICS_RESOURCE,
                             GROUP_RESOURCE})

RESPONSE_CLASSES = {
    DescribeConfigsRequest.API_KEY: DescribeConfigsResponse,
    AlterConfigsRequest.API_KEY: AlterConfigsResponse,
    IncrementalAlterConfigsRequest.API_KEY: IncrementalAlterConfigsResponse,
}
REQUEST_CLASSES = {
    DescribeConfigsRequest.API_KEY: DescribeConfigsRequest,
    AlterConfigsRequest.API_KEY: AlterConfigsRequest,
    IncrementalAlterConfigsRequest.API_KEY: IncrementalAlterConfigsRequest,
}


@dataclass
class Split:
    """A config request cut in two: what the store answered, and what still goes upstream."""

    local: list[Any | None]   # per resource, in the client's order: the store's answer, or None for upstream's
    upstream: Any | None      # request for the other resources, or None


def results(response: Any) -> list[Any]:
    """The per-resource answers of a config response."""
    return response.results if response.API_KEY == DescribeConfigsRequest.API_KEY else response.responses


def split(request: Any, store: SubscriptionStore) -> Split:
    """Answer the CLIENT_METRICS resources of a DescribeConfigs/AlterConfigs/IncrementalAlterConfigs request."""
    local: list[Any | None] = []
    remaining = []
    is_describe = request.API_KEY == DescribeConfigsRequest.API_KEY
    repeated = set() if is_describe else _repeated(request.resources)
    for resource in request.resources:
        if (resource.resource_type, resource.resource_name) in repeated:
            # ConfigAdminManager.preprocess: every copy is refused, whatever its type, and nothing changes.
            result_class = _AlterResult if request.API_KEY == AlterConfigsRequest.API_KEY else _IncrementalResult
            local.append(_refused(result_class, resource, ConfigError(INVALID_REQUEST, _REPEATED_RESOURCE)))
        elif resource.resource_type != CLIENT_METRICS_RESOURCE:
            local.append(None)
            remaining.append(resource)
        elif is_describe:
            local.append(_describe(resource, request, store))
        elif request.API_KEY == AlterConfigsRequest.API_KEY:
            local.append(_altered(_AlterResult, resource, lambda: _legacy_alter(resource, request, store)))
        else:
            ops = [(config.name, config.config_operation, config.value) for config in resource.configs]
            local.append(_altered(_IncrementalResult, resource,
                                  lambda: store.incremental_alter(resource.resource_name, ops, request.validate_only)))
    upstream = None
    if remaining:
        fields = {name: getattr(request, name) for name in request.fields if name != "resources"}
        upstream = type(request)[request.API_VERSION](resources=remaining, **fields)
    return Split(local, upstream)


def merge(request: Any, parts: Split, upstream_results: list[Any], throttle_time_ms: int = 0) -> Any:
    """The response to the whole request: local and upstream answers, in the client's order."""
    # Upstream answers are matched by resource, first come first served, so a resource named twice keeps
    # its own answers even if the broker reorders them.
    by_resource: dict[tuple[int, str], collections.deque[Any]] = collections.defaultdict(collections.deque)
    for result in upstream_results:
        by_resource[(result.resource_type, result.resource_name)].append(result)
    answers = []
    for resource, answer in zip(request.resources, parts.local):
        if answer is None:
            queue = by_resource.get((resource.resource_type, resource.resource_name))
            if not queue:
                continue
            answer = queue.popleft()
        answers.append(answer)
    field = "results" if request.API_KEY == DescribeConfigsRequest.API_KEY else "responses"
    return RESPONSE_CLASSES[request.API_KEY][request.API_VERSION](throttle_time_ms=throttle_time_ms,
                                                                  **{field: answers})


def unsupported(request: Any, message: str, error_code: int = INVALID_REQUEST) -> list[Any]:
    """Error answers (`error_code`) for every resource of `request`, for an API the upstream broker lacks, or an
    answer of the broker's the gateway cannot read."""
    if request.API_KEY == DescribeConfigsRequest.API_KEY:
        return [_DescribeResult(error_code=error_code, error_message=message, configs=[],
                                resource_type=resource.resource_type, resource_name=resource.resource_name)
                for resource in request.resources]
    result_class = _AlterResult if request.API_KEY == AlterConfigsRequest.API_KEY else _IncrementalResult
    return [result_class(error_code=error_code, error_message=message, resource_type=resource.resource_type,
                         resource_name=resource.resource_name)
            for resource in request.resources]


def _describe(resource: Any, request: Any, store: SubscriptionStore) -> Any:
    try:
        entries = store.describe(resource.resource_name, resource.configuration_keys)
    except ConfigError as error:
        return _DescribeResult(error_code=error.error_code, error_message=error.message,
                               resource_type=resource.resource_type, resource_name=resource.resource_name, configs=[])
    include_docs = getattr(request, "include_documentation", False)
    include_synonyms = getattr(request, "include_synonyms", False)
    configs = [
        _DescribeEntry(name=entry.name, value=entry.value, read_only=entry.read_only, config_source=entry.source,
                       is_default=entry.is_default, is_sensitive=entry.sensitive,
                       # ConfigHelper lists a set key as its own CLIENT_METRICS synonym; defaults have none.
                       synonyms=[_Synonym(name=entry.name, value=entry.value, source=entry.source)]
                       if include_synonyms and entry.source == CLIENT_METRICS_CONFIG_SOURCE else [],
                       config_type=entry.config_type, documentation=entry.documentation if include_docs else None)
        for entry in entries
    ]
    return _DescribeResult(error_code=0, error_message=None, resource_type=resource.resource_type,
                           resource_name=resource.resource_name, configs=configs)


def _altered(result_class: Any, resource: Any, change: Any) -> Any:
    try:
        change()
    except ConfigError as error:
        return _refused(result_class, resource, error)
    return result_class(error_code=0, error_message=None, resource_type=resource.resource_type,
                        resource_name=resource.resource_name)


def _refused(result_class: Any, resource: Any, error: ConfigError) -> Any:
    return result_class(error_code=error.error_code, error_message=error.message,
                        resource_type=resource.resource_type, resource_name=resource.resource_name)


def _repeated(resources: list[Any]) -> set[tuple[int, str]]:
    """The (type, name) pairs named more than once in one request."""
    counts = collections.Counter((resource.resource_type, resource.resource_name) for resource in resources)
    return {key for key, count in counts.items() if count > 1}


def _legacy_alter(resource: Any, request: Any, store: SubscriptionStore) -> None:
    names = [config.name for config in resource.configs]
    if len(set(names)) != len(names):
        raise ConfigError(INVALID_REQUEST, "Error due to duplicate config keys")
    store.alter(resource.resource_name, {config.name: config.value for config in resource.configs},
                request.validate_only)


def list_resources(request: Any, store: SubscriptionStore) -> Any:
    """ListConfigResources (v0 = ListClientMetricsResources): the sandbox holds only CLIENT_METRICS resources.

    A type Kafka does not list (ListConfigResourcesRequest.supportedResourceTypes) is UNSUPPORTED_VERSION, as in
    KafkaApis; a type Kafka lists but the sandbox cannot (topics, brokers, loggers, groups) is INVALID_REQUEST.
    """
    response_class = ListConfigResourcesResponse[request.API_VERSION]
    wanted = set(getattr(request, "resource_types", None) or [])
    if wanted - _LISTABLE_TYPES:
        return response_class(throttle_time_ms=0, error_code=UNSUPPORTED_VERSION, config_resources=[])
    if wanted - {CLIENT_METRICS_RESOURCE}:
        return response_class(throttle_time_ms=0, error_code=INVALID_REQUEST, config_resources=[])
    entry = ListConfigResourcesResponse.ConfigResource
    return response_class(throttle_time_ms=0, error_code=0, config_resources=[
        entry(resource_name=name, resource_type=CLIENT_METRICS_RESOURCE) for name in store.names()])

