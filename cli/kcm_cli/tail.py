"""`kcm tail`: consume the metrics topic and print decoded client metrics as a table or JSON lines."""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CorruptRecordError, KafkaError, KafkaTimeoutError

from kcm_cli.arguments import kafka_connection, seconds, topic
from kcm_cli.signals import StopRequests
from kcm_common import contract, points
from kcm_common.errors import UserError
from kcm_common.kafka import (KafkaSettings, KafkaUnavailableError, advertised_brokers, check_reachable,
                              diagnose_failure, step_past_unreadable)
from kcm_common.names import DEFAULT_METRICS_TOPIC
from kcm_common.terminal import printable

log = logging.getLogger("kcm.tail")

HELP = "print decoded client metrics from the metrics topic"
DESCRIPTION = "Consume the metrics topic (contract v1) and print decoded client metrics."
# What one record may hold (resources, scopes, metrics, points, attributes, buckets) before it is shown as too-large:
# a few KB of compressed protobuf can hold millions of empty points, and each becomes Python objects here.
MAX_ITEMS = 100_000
_COLUMNS = (("CLIENT ID", 24), ("INSTANCE", 8), ("METRIC", 52), ("ATTRIBUTES", 32), ("VALUE", 0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kafka_connection(parser)
    parser.add_argument("--topic", default=DEFAULT_METRICS_TOPIC, type=topic, help="metrics topic (default: %(default)s)")
    parser.add_argument("--from-beginning", action="store_true",
                        help="start at the oldest record instead of only new ones")
    parser.add_argument("--max-records", type=int, metavar="N", help="exit after printing N records")
    parser.add_argument("--timeout", type=seconds, metavar="SECONDS",
                        help="exit after this many seconds without a record (default: run until interrupted)")
    parser.add_argument("--output", choices=("table", "jsonl"), default="table",
                        help="table: one row per metric point; jsonl: one JSON object per record (default: %(default)s)")
    parser.add_argument("--connect-timeout", type=seconds, default=10.0, metavar="SECONDS",
                        help="how long to try reaching Kafka at start-up (default: %(default)s)")


def record_json(record: ConsumerRecord) -> tuple[dict[str, Any], str | None]:
    """One metrics-topic record as the jsonl object, and the decode error message when it has one."""
    item: dict[str, Any] = {"topic": record.topic, "partition": record.partition, "offset": record.offset,
                            "key": record.key.decode("utf-8", errors="replace") if record.key is not None else None,
                            "resource": {}, "error": None, "metrics": []}
    try:
        decoded = contract.decode(record.value, record.headers)
    except contract.DecodeError as exc:
        # Who sent it, as far as its headers say: the payload cannot.
        item["error"], item["resource"] = exc.reason, contract.header_attributes(record.headers)
        return item, str(exc)
    if points.holds_more_than(decoded.metrics, MAX_ITEMS):
        item["error"], item["resource"] = "too-large", decoded.attributes  # as a payload over the byte limit
        return item, f"more than {MAX_ITEMS:,} resources, scopes, metrics, points and attributes in one record"
    # Header attributes come from the broker, so they win over what the client put in its own resource.
    resources = [points.attributes(r.resource.attributes) for r in decoded.metrics.resource_metrics]
    if len(resources) <= 1:  # what a client pushes: one resource, the record's
        item["resource"] = {**(resources[0] if resources else {}), **decoded.attributes}
        item["metrics"] = points.metric_dicts(decoded.metrics)
        return item, None
    # Plain OTLP (the Collector's Kafka exporter) may hold several resources: each metric carries its own, and the
    # record's holds what they all share, so that no metric is told another resource's client.
    # Each metric carries a copy of its resource: those copies count against the same bound.
    copies = sum((len(own) + len(decoded.attributes)) * sum(len(scope.metrics) for scope in rm.scope_metrics)
                 for rm, own in zip(decoded.metrics.resource_metrics, resources))
    if copies > MAX_ITEMS:
        item["error"], item["resource"] = "too-large", decoded.attributes
        return item, (f"more than {MAX_ITEMS:,} resource attributes copied to the metrics of one record of "
                      f"{len(resources)} resources")
    first, *others = resources
    item["resource"] = {**{key: value for key, value in first.items()
                           if all(key in other and other[key] == value for other in others)}, **decoded.attributes}
    item["metrics"] = [{**points.metric_dict(metric), "resource": {**own, **decoded.attributes}}
                       for resource_metrics, own in zip(decoded.metrics.resource_metrics, resources)
                       for scope_metrics in resource_metrics.scope_metrics for metric in scope_metrics.metrics]
    return item, None


def _point_value(point: dict[str, Any]) -> str:
    if "value" in point:
        return str(point["value"])
    total = point.get("sum")  # optional in OTLP histograms (absent when a bucket could hold negative values)
    return f"count={point['count']}" + (f" sum={total}" if total is not None else "")


def _json_safe(value: Any) -> Any:
    """NaN and infinities as the strings protobuf's JSON mapping uses: bare NaN/Infinity are not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def _format_row(cells: tuple[str, ...]) -> str:
    parts = []
    for cell, (_, width) in zip(map(printable, cells), _COLUMNS):
        parts.append(cell if not width else (_elided(cell, width) if len(cell) > width else cell.ljust(width)))
    return "  ".join(parts).rstrip()


def _elided(cell: str, width: int) -> str:
    """`cell` cut to `width` in the middle: metric names share their start (`org.apache.kafka.consumer.`) and differ
    at the end (`….latency.avg`, `….latency.max`), client ids often too (`…-group-1`, `…-group-2`)."""
    head = (width - 1) // 2
    return cell[:head] + "…" + cell[len(cell) - (width - 1 - head):]


def table_lines(item: dict[str, Any], error_message: str | None = None) -> Iterator[str]:
    """The table rows of one record: a row per metric point, or one row saying why it could not be decoded."""
    if item["error"] is not None:
        where = f"{item['topic']}/{item['partition']}@{item['offset']}"
        yield _format_row((*_who(item, item["resource"]), f"! {item['error']} at {where}", "", error_message or ""))
        return
    for metric in item["metrics"]:
        who = _who(item, metric.get("resource", item["resource"]))
        for point in metric["points"]:
            attrs = ",".join(f"{k}={v}" for k, v in sorted(point["attributes"].items()))
            yield _format_row((*who, metric["name"], attrs, _point_value(point)))


def _who(item: dict[str, Any], resource: dict[str, Any]) -> tuple[str, str]:
    """The client id and the start of the instance id a row shows."""
    client_id = str(resource.get("client_id") or resource.get("client.id") or "-")
    return client_id, str(resource.get("client_instance_id") or item["key"] or "-")[:8]


def _consume(consumer: KafkaConsumer, args: argparse.Namespace, settings: KafkaSettings,
             stopping: threading.Event) -> Iterator[tuple[dict[str, Any], str | None]]:
    """Each record as its jsonl object and decode error message; one kafka-python cannot read is an error row.
    kafka-python retries a lost connection without a word: a quiet --connect-timeout has Kafka probed, and losing
    it (and getting it back) said. Ends once `stopping` is set (a stop signal), after the poll under way."""
    last_record = last_check = time.monotonic()
    lost = False
    while not stopping.is_set():
        try:
            batches = consumer.poll(timeout_ms=200)
        except KafkaError as exc:
            if not isinstance(exc, CorruptRecordError):
                raise
            # One record's fault, not Kafka's: skipped, so reading goes on.
            yield _skip_unreadable(consumer, exc, args.connect_timeout)
            last_record, batches = time.monotonic(), {}
        except Exception as exc:  # noqa: BLE001 (a batch that does not decompress: gzip, zstd, lz4 raise their own)
            yield _skip_unreadable(consumer, exc, args.connect_timeout)
            last_record, batches = time.monotonic(), {}
        records = sorted((r for rs in batches.values() for r in rs), key=lambda r: (r.timestamp, r.partition, r.offset))
        if records:
            last_record = time.monotonic()
        yield from map(record_json, records)
        if args.timeout is not None and time.monotonic() - last_record >= args.timeout:
            return
        if time.monotonic() - max(last_record, last_check) >= args.connect_timeout and not stopping.is_set():
            lost = _still_there(settings, args.connect_timeout, lost, stopping)
            last_check = time.monotonic()


def _still_there(settings: KafkaSettings, timeout_s: float, lost: bool, stopping: threading.Event) -> bool:
    """Probe Kafka while no record comes; say once when it is lost and once when it answers again. Whether lost."""
    try:
        check_reachable(settings, timeout_s, stopping)
    except UserError as exc:
        if stopping.is_set():   # a stop signal ended the probe: nothing to say of Kafka
            return lost
        if not lost:
            log.warning("%s; still trying", exc)
        return True
    if lost:
        log.info("Kafka at %s answers again", settings.bootstrap_servers)
    return False


def _skip_unreadable(consumer: KafkaConsumer, error: Exception, timeout_s: float) -> tuple[dict[str, Any], str]:
    """The error row of the record kafka-python could not read (e.g. a header name that is not UTF-8), after seeking
    past it; the records after it in its producer's batch cannot be read either, and get a row each."""
    skipped = step_past_unreadable(consumer, timeout_s)
    if skipped is None:
        raise UserError(f"a record cannot be read ({error}) and kafka-python does not say on which partition; "
                        "kcm tail cannot skip it")
    partition, offset = skipped
    item = {"topic": partition.topic, "partition": partition.partition, "offset": offset, "key": None,
            "resource": {}, "error": "unreadable-record", "metrics": []}
    return item, str(error)


# tail's consumer waits up to this long for a fetch; kafka-python closes connections idle for its default 540 s, and
# refuses a request timeout not strictly between the two (in its own words and option names).
_FETCH_MAX_WAIT_MS = 200
_CONNECTIONS_MAX_IDLE_MS = 540_000


def _open_consumer(args: argparse.Namespace, settings: KafkaSettings) -> KafkaConsumer:
    check_reachable(settings, args.connect_timeout)
    # Where kafka-python would refuse it (once it has bootstrapped), in the docs' words rather than its option names.
    timeout_ms = settings.client_options().get("request_timeout_ms")
    if timeout_ms is not None and not _FETCH_MAX_WAIT_MS < timeout_ms < _CONNECTIONS_MAX_IDLE_MS:
        raise UserError(f"request.timeout.ms {timeout_ms} is outside what kcm tail takes, {_FETCH_MAX_WAIT_MS + 1} to "
                        f"{_CONNECTIONS_MAX_IDLE_MS - 1} (it waits up to {_FETCH_MAX_WAIT_MS} ms for a fetch and "
                        f"closes connections idle for {_CONNECTIONS_MAX_IDLE_MS // 1000} s); check --command-config")
    try:
        consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=_FETCH_MAX_WAIT_MS,
                                 bootstrap_timeout_ms=int(args.connect_timeout * 1000), **settings.client_options())
    except KafkaError as exc:
        raise diagnose_failure(settings, exc) from None
    try:
        if args.topic not in consumer.topics():
            raise UserError(f"topic {args.topic!r} does not exist on {settings.describe()}; "
                            "check --topic and that the brokers' telemetry receiver writes there")
        partitions = [TopicPartition(args.topic, p) for p in sorted(consumer.partitions_for_topic(args.topic))]
        consumer.assign(partitions)
        if args.from_beginning:
            consumer.seek_to_beginning(*partitions)
        else:
            consumer.seek_to_end(*partitions)
        # Resolve the start now, so nothing produced after start-up is skipped; then say where reading starts.
        starts = {partition.partition: consumer.position(partition, timeout_ms=int(args.connect_timeout * 1000))
                  for partition in partitions}
        if None in starts.values():   # not resolved in time: the partition leaders do not answer
            raise KafkaTimeoutError(f"the start offsets were not resolved within {args.connect_timeout:g} s")
    except KafkaError as exc:  # the brokers the metadata names, past the bootstrap address, did not answer
        advertised = advertised_brokers(consumer)
        consumer.close()
        raise diagnose_failure(settings, exc, advertised) from None
    except BaseException:
        consumer.close()
        raise
    log.info("reading %s from offsets %s", args.topic, ", ".join(f"{p}@{o}" for p, o in sorted(starts.items())))
    return consumer


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run `kcm tail`; 0 on a normal end. Raises UserError when Kafka or the topic cannot be reached."""
    stopping, reading = threading.Event(), threading.Event()
    if threading.current_thread() is not threading.main_thread():   # only the main thread may take signals
        return _run(args, out, stopping, reading)
    # SIGTERM (`kubectl delete pod`, `timeout`) ends it as Ctrl-C does: exit 0 while reading, the consumer closed.
    # While reading, a signal only asks the loop to end after the poll under way: an exception raised inside
    # kafka-python's calls could leave its lock taken, and the close wait for ever. A kill of the process group
    # (`timeout`, a CI runner) delivers the signal twice within a millisecond or so: one request. A signal a second
    # or more later, or one while starting or closing, raises KeyboardInterrupt (130 while starting).
    requests = StopRequests()

    def stop(signum: int, frame: object) -> None:
        if requests.is_copy(signum):
            return
        if reading.is_set() and not stopping.is_set():
            stopping.set()
            return
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(args, out, stopping, reading)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(args: argparse.Namespace, out: TextIO | None, stopping: threading.Event, reading: threading.Event) -> int:
    out = out or sys.stdout   # now: None when started with stdout closed, and a test may have replaced it
    if args.max_records is not None and args.max_records < 1:
        raise UserError("--max-records must be at least 1")
    settings = KafkaSettings.from_cli(args.bootstrap_server, args.command_config)
    consumer = _open_consumer(args, settings)
    printed = 0
    reading.set()
    try:
        if args.output == "table":
            print(_format_row(tuple(name for name, _ in _COLUMNS)), file=out, flush=True)
        for item, error_message in _consume(consumer, args, settings, stopping):
            if args.output == "jsonl":
                print(json.dumps(_json_safe(item), separators=(",", ":"), allow_nan=False), file=out, flush=True)
            else:
                for line in table_lines(item, error_message):
                    print(line, file=out, flush=True)
            printed += 1
            if stopping.is_set() or (args.max_records is not None and printed >= args.max_records):
                break
    except KeyboardInterrupt:
        pass
    except KafkaError as exc:
        raise KafkaUnavailableError(f"lost the connection to Kafka: {exc}") from None
    finally:
        reading.clear()   # a later signal (a second Ctrl-C) breaks off a close that hangs
        consumer.close()
    return 0
