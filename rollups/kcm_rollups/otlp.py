"""Export rollup rows to an OpenTelemetry collector as OTLP/gRPC gauges: one gauge per statistic of each row.

A row of metric `m` becomes gauges `m.count`, `m.min`, ... `m.rate` (only the statistics it has), stamped with its
window (start and end time), carrying the point attributes, `kcm.rollup.resolution` and a histogram row's
`kcm.rollup.bounds`; the client identity columns and any other grouped dimension become resource attributes, so every
row is a series of its own. Parquet stays the record: the export runs after the write, and a re-run re-exports.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from kcm_common.errors import UserError
from kcm_common.otlp_export import (Endpoint, RetryPolicy, Tls, is_endpoint, metadata_problem, pem_problem,
                                     read_metadata_value, refusal_hint, tls_problem)

log = logging.getLogger("kcm.rollup.otlp")

STATISTICS: tuple[str, ...] = ("instances", "count", "nan_count", "min", "max", "sum", "avg", "last", "p50", "p95",
                               "p99", "increase", "rate")
RESOURCE_COLUMNS: tuple[str, ...] = ("client_id", "client_software_name", "client_software_version")
SCOPE_NAME = "kcm.rollup"
RESOLUTION_ATTRIBUTE = "kcm.rollup.resolution"
BOUNDS_ATTRIBUTE = "kcm.rollup.bounds"
# A receiver that is restarting gets a minute per request; a RetryInfo delay is honoured up to 15 s.
EXPORT_RETRY = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=15.0)


def check_endpoint(endpoint: str) -> str:
    """`HOST:PORT` of an OTLP/gRPC receiver, else UserError."""
    if not is_endpoint(endpoint.strip()):
        raise UserError(f"--otlp-endpoint {endpoint!r} is not HOST:PORT of an OTLP/gRPC receiver (e.g. otel:4317)")
    return endpoint.strip()


@dataclass(frozen=True)
class OtlpTarget:
    """Where the rows go: plaintext unless `tls` (system roots) or a CA file; a client certificate with its key for
    mutual TLS; call metadata (an authorization token, say) read from files when the export runs, never logged."""

    endpoint: str
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    header_files: tuple[tuple[str, str], ...] = ()   # (gRPC metadata key, file holding its value)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoint", check_endpoint(self.endpoint))
        if bool(self.cert_file) != bool(self.key_file):
            raise UserError("--otlp-cert-file and --otlp-key-file go together (a client certificate and its key)")
        for flag, path, kind in (("--otlp-ca-file", self.ca_file, "certificate"),
                                 ("--otlp-cert-file", self.cert_file, "certificate"),
                                 ("--otlp-key-file", self.key_file, "key")):
            problem = pem_problem(path, kind) if path is not None else None
            if problem:
                raise UserError(f"{flag} {problem}")
        unusable = tls_problem(Tls(self.ca_file, self.cert_file, self.key_file))
        if unusable:
            flag = "--otlp-ca-file" if unusable.setting == "ca_file" else "--otlp-cert-file"
            raise UserError(f"{flag} {unusable.file} {unusable.why}")
        names = [name for name, _ in self.header_files]
        if len(set(names)) < len(names):
            raise UserError("--otlp-header-file names a header twice")
        self.metadata()  # every file readable and every value sendable, before the job runs

    @property
    def secure(self) -> bool:
        return self.tls or any((self.ca_file, self.cert_file, self.key_file))

    def metadata(self) -> list[tuple[str, str]]:
        """The header values, read now (a rotated Secret is picked up); UserError naming the file, never the value."""
        found = []
        for name, path in self.header_files:
            try:
                value = read_metadata_value(path)
            except ValueError as exc:
                raise UserError(f"--otlp-header-file {name}={exc}") from None
            problem = metadata_problem(name, value)
            if problem:
                raise UserError(f"--otlp-header-file {name}={path}: {problem}")
            found.append((name, value))
        return found


def parse_header_file(text: str) -> tuple[str, str]:
    """`NAME=FILE` of --otlp-header-file."""
    name, equals, path = text.partition("=")
    if not equals or not name.strip() or not path.strip():
        raise UserError(f"--otlp-header-file {text!r} is not NAME=FILE (e.g. authorization=/var/run/secrets/token)")
    return name.strip(), path.strip()


def resource_columns(dimensions: Sequence[str]) -> tuple[str, ...]:
    """The columns that become resource attributes: the client identity, and every other grouped dimension but the
    point attributes (two rows differing only in, say, `principal` must stay two series)."""
    return tuple(dict.fromkeys(RESOURCE_COLUMNS + tuple(name for name in dimensions if name != "attributes")))


def export_requests(rows: Iterable[Mapping[str, Any]], max_points: int = 5000,
                    resource_names: Sequence[str] = RESOURCE_COLUMNS) -> Iterator[ExportMetricsServiceRequest]:
    """Rollup rows (window bounds as `start_micros`/`end_micros`, see `export_rows`) as OTLP export requests of at
    most about `max_points` data points each; `resource_names` are the row's columns that identify its resource."""
    request = ExportMetricsServiceRequest()
    scopes: dict[tuple[tuple[str, str], ...], Any] = {}
    metrics: dict[tuple[int, str], Any] = {}
    points = 0
    for row in rows:
        if points >= max_points:
            yield request
            request, scopes, metrics, points = ExportMetricsServiceRequest(), {}, {}, 0
        resource = tuple((name, str(row[name])) for name in resource_names if row.get(name) is not None)
        scope = scopes.get(resource)
        if scope is None:
            resource_metrics = request.resource_metrics.add()
            resource_metrics.resource.attributes.extend(_key_value(k, v) for k, v in resource)
            scope = resource_metrics.scope_metrics.add()
            scope.scope.name = SCOPE_NAME
            scopes[resource] = scope
        attributes = [_key_value(RESOLUTION_ATTRIBUTE, row["resolution"])]
        attributes += [_key_value(k, v) for k, v in sorted(json.loads(row.get("attributes") or "{}").items())]
        if row.get("bounds") is not None:  # a key column: histogram rows with other bounds are other series
            attributes.append(_key_value(BOUNDS_ATTRIBUTE, [float(bound) for bound in row["bounds"]]))
        for statistic in STATISTICS:
            value = row.get(statistic)
            if value is None or value != value:  # a NaN statistic says nothing
                continue
            name = f"{row['metric']}.{statistic}"
            metric = metrics.get((id(scope), name))
            if metric is None:
                metric = scope.metrics.add(name=name)
                metrics[(id(scope), name)] = metric
            point = metric.gauge.data_points.add(start_time_unix_nano=row["start_micros"] * 1000,
                                                 time_unix_nano=row["end_micros"] * 1000)
            point.attributes.extend(attributes)
            if isinstance(value, int) and not isinstance(value, bool):
                point.as_int = value
            else:
                point.as_double = float(value)
            points += 1
    if points:
        yield request


def export_rows(frame: Any, target: OtlpTarget, dimensions: Sequence[str]) -> tuple[int, int]:
    """Send a DataFrame of rollup rows grouped by `dimensions` to `target`, streamed to the driver partition by
    partition; see `export`."""
    from pyspark.sql import functions as F

    resource = resource_columns(dimensions)
    columns = ["resolution", "metric", "attributes", "bounds", *resource, *STATISTICS]
    rows = frame.select(*columns, F.unix_micros("window_start").alias("start_micros"),
                        F.unix_micros("window_end").alias("end_micros")).toLocalIterator()
    return export((row.asDict() for row in rows), target, resource_names=resource)


def export(rows: Iterable[Mapping[str, Any]], target: OtlpTarget, timeout_s: float = 30.0,
           retry: RetryPolicy = EXPORT_RETRY, give_up_after_s: float = 60.0, max_points: int = 5000,
           resource_names: Sequence[str] = RESOURCE_COLUMNS) -> tuple[int, int]:
    """Send rollup rows to the OTLP/gRPC receiver `target`; returns (points sent, points the receiver rejected).
    Each request is retried as OTLP prescribes (kcm_common.otlp_export) for up to `give_up_after_s`; a request refused
    for good, or still failing then, raises UserError naming the endpoint."""
    endpoint, deadline = target.endpoint, 0.0
    metadata = target.metadata()
    if metadata and not target.secure:
        log.warning("sending the --otlp-header-file values to %s in plaintext: add --otlp-tls or --otlp-ca-file "
                    "unless the network between them is trusted", endpoint)
    try:
        exporter = Endpoint(endpoint, retry, lambda: time.monotonic() >= deadline, insecure=not target.secure,
                            tls=Tls(target.ca_file, target.cert_file, target.key_file), metadata=metadata,
                            timeout_s=timeout_s)
    except OSError as exc:  # a TLS file gone since the job started (a Secret rotated away)
        raise UserError(f"OTLP export to {endpoint}: cannot read {exc.filename}: {exc.strerror}") from None
    sent = rejected = 0
    try:
        for request in export_requests(rows, max_points, resource_names):
            deadline = time.monotonic() + give_up_after_s
            outcome = exporter.export(request.SerializeToString())
            if not outcome.delivered:
                why = f"{outcome.error} {outcome.detail}".strip() + refusal_hint(outcome.error)
                if outcome.abandoned:
                    why = f"still {why} after {outcome.attempts} attempts over {give_up_after_s:g} s"
                raise UserError(f"OTLP export to {endpoint} failed after {sent} data points: {why}"
                                "; the Parquet output is complete, re-run the range to export again")
            points = sum(len(m.gauge.data_points) for r in request.resource_metrics for s in r.scope_metrics
                         for m in s.metrics)
            sent += points
            rejected += min(outcome.rejected_points, points)   # a server claiming more counts as rejecting all
    finally:
        exporter.close()
    return sent, rejected


def _key_value(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=_any_value(value))


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[_any_value(v) for v in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[_key_value(k, v) for k, v in value.items()]))
    return AnyValue(string_value=str(value))
