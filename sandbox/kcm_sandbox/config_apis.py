"""The config APIs with CLIENT_METRICS resources split off: answered from the subscription store, the rest by upstream.

Each `split_*` returns the local answers and the request for what remains (None when nothing does);
`merge` puts the two answers back together in the order the client asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListConfigResourcesRequest,
    ListConfigResourcesResponse,
)

from kcm_sandbox.client_metrics import RESOURCE_TYPE, ConfigError, SubscriptionStore

INVALID_REQUEST = 42

_DescribeResult = DescribeConfigsResponse.DescribeConfigsResult
_DescribeEntry = _DescribeResult.DescribeConfigsResourceResult
_AlterResult = AlterConfigsResponse.AlterConfigsResourceResponse
_IncrementalResult = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse

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

    order: list[tuple[int, str]]          # (resource_type, name) in the client's order
    local: dict[tuple[int, str], Any]     # answers for CLIENT_METRICS resources
    upstream: Any | None                  # request for the other resources, or None


def _results_field(api_key: int) -> str:
    return "results" if api_key == DescribeConfigsRequest.API_KEY else "responses"


def split(request: Any, store: SubscriptionStore) -> Split:
    """Answer the CLIENT_METRICS resources of a DescribeConfigs/AlterConfigs/IncrementalAlterConfigs request."""
    api_key = request.API_KEY
    order = [(resource.resource_type, resource.resource_name) for resource in request.resources]
    local: dict[tuple[int, str], Any] = {}
    remaining = []
    for resource in request.resources:
        if resource.resource_type != RESOURCE_TYPE:
            remaining.append(resource)
            continue
        key = (resource.resource_type, resource.resource_name)
        if api_key == DescribeConfigsRequest.API_KEY:
            local[key] = _describe(resource, request, store)
        elif api_key == AlterConfigsRequest.API_KEY:
            configs = {config.name: config.value for config in resource.configs}
            local[key] = _altered(_AlterResult, resource, lambda: store.alter(
                resource.resource_name, configs, request.validate_only))
        else:
            ops = [(config.name, config.config_operation, config.value) for config in resource.configs]
            local[key] = _altered(_IncrementalResult, resource, lambda: store.incremental_alter(
                resource.resource_name, ops, request.validate_only))
    upstream = None
    if remaining:
        fields = {name: getattr(request, name) for name in request.fields if name != "resources"}
        upstream = type(request)[request.API_VERSION](resources=remaining, **fields)
    return Split(order, local, upstream)


def merge(request: Any, parts: Split, upstream_response: Any | None) -> Any:
    """The response to the whole request: local answers and upstream answers, in the client's order."""
    api_key = request.API_KEY
    field = _results_field(api_key)
    answers = dict(parts.local)
    throttle = 0
    if upstream_response is not None:
        throttle = upstream_response.throttle_time_ms
        for result in getattr(upstream_response, field):
            answers[(result.resource_type, result.resource_name)] = result
    response_class = RESPONSE_CLASSES[api_key][request.API_VERSION]
    return response_class(throttle_time_ms=throttle, **{field: [answers[key] for key in parts.order if key in answers]})


def unsupported(request: Any, message: str) -> dict[tuple[int, str], Any]:
    """Error answers for every resource of `request`, for an API the upstream broker lacks."""
    answers = {}
    for resource in request.resources:
        key = (resource.resource_type, resource.resource_name)
        if request.API_KEY == DescribeConfigsRequest.API_KEY:
            answers[key] = _DescribeResult(error_code=INVALID_REQUEST, error_message=message, configs=[],
                                           resource_type=resource.resource_type, resource_name=resource.resource_name)
        else:
            result_class = _AlterResult if request.API_KEY == AlterConfigsRequest.API_KEY else _IncrementalResult
            answers[key] = result_class(error_code=INVALID_REQUEST, error_message=message,
                                        resource_type=resource.resource_type, resource_name=resource.resource_name)
    return answers


def _describe(resource: Any, request: Any, store: SubscriptionStore) -> Any:
    try:
        entries = store.describe(resource.resource_name, resource.configuration_keys)
    except ConfigError as error:
        return _DescribeResult(error_code=error.error_code, error_message=error.message,
                               resource_type=resource.resource_type, resource_name=resource.resource_name, configs=[])
    include_docs = getattr(request, "include_documentation", False)
    configs = [
        _DescribeEntry(name=entry.name, value=entry.value, read_only=entry.read_only, config_source=entry.source,
                       is_default=entry.is_default, is_sensitive=entry.sensitive, synonyms=[],
                       config_type=entry.config_type, documentation=entry.documentation if include_docs else None)
        for entry in entries
    ]
    return _DescribeResult(error_code=0, error_message=None, resource_type=resource.resource_type,
                           resource_name=resource.resource_name, configs=configs)


def _altered(result_class: Any, resource: Any, change: Any) -> Any:
    try:
        change()
    except ConfigError as error:
        return result_class(error_code=error.error_code, error_message=error.message,
                            resource_type=resource.resource_type, resource_name=resource.resource_name)
    return result_class(error_code=0, error_message=None, resource_type=resource.resource_type,
                        resource_name=resource.resource_name)


def list_resources(request: Any, store: SubscriptionStore) -> Any:
    """ListConfigResources (v0 = ListClientMetricsResources): the sandbox holds only CLIENT_METRICS resources."""
    response_class = ListConfigResourcesResponse[request.API_VERSION]
    wanted = set(getattr(request, "resource_types", None) or [])
    if wanted - {RESOURCE_TYPE}:
        return response_class(throttle_time_ms=0, error_code=INVALID_REQUEST, config_resources=[])
    entry = ListConfigResourcesResponse.ConfigResource
    return response_class(throttle_time_ms=0, error_code=0, config_resources=[
        entry(resource_name=name, resource_type=RESOURCE_TYPE) for name in store.names()])

