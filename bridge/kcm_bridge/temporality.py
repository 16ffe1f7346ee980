"""Delta sums to cumulative ones, per stream (client instance + resource + scope + metric + point attributes).

Follows the OpenTelemetry reset semantics: a stream the bridge has no state for (first seen, evicted, idle
expired, or its partition moved here) starts again with its own start time; a point that is not newer than the
last one of its stream (a re-delivered push) is dropped rather than counted twice. A stream is kept for
`idle_expiry_s`, or twice its client's push interval when that is longer (up to KIP-714's longest, an hour), so slow
pushers keep their totals. A NaN or infinite delta is passed on as it came and never added: it must not poison the
total for good. A stream is keyed by a 16-byte digest of its identity, so its state costs the same however long the
names and attribute values a writer sends; a record holding more than MAX_ITEMS is refused.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (AGGREGATION_TEMPORALITY_CUMULATIVE,
                                                        AGGREGATION_TEMPORALITY_DELTA, MetricsData,
                                                        NumberDataPoint)

from kcm_common.contract import DecodeError

Partition = tuple[str, int]
StreamKey = bytes   # blake2b-128 of instance, resource, scope, metric name and point attributes
# KIP-714's longest push interval (a subscription's interval.ms is at most an hour). A record may claim any: one
# claiming years would keep its streams, and every stream updated before them, for ever.
MAX_PUSH_INTERVAL_S = 3600.0
# ResourceMetrics, ScopeMetrics, metrics and delta points one record may hold, each some microseconds of Python on the
# consuming thread (a small compressed record can hold millions). A KIP-714 push (at most 1 MiB) holds thousands.
MAX_ITEMS = 100_000
# The MetricsData bytes one record may hold for conversion, which must parse it whole first: parsing costs up to some
# 30 times the bytes (a 2-byte empty message becomes a 60-byte object: 16 MiB of them took 523 MiB and 1.2 s), so
# this bounds that to about 125 MiB. KIP-714 pushes are at most the brokers' telemetry.max.bytes, 1 MiB by default.
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class _Stream:
    partition: Partition
    start_ns: int
    total: float | int
    last_ns: int
    seen_s: float
    keep_s: float


class DeltaToCumulative:
    """Bounded per-stream running totals; call from one thread."""

    def __init__(self, max_streams: int, idle_expiry_s: float) -> None:
        self._max_streams = max_streams
        self._idle_expiry_s = idle_expiry_s
        self._streams: OrderedDict[StreamKey, _Stream] = OrderedDict()
        self.dropped_points = 0
        self.evicted_streams = 0

    def __len__(self) -> int:
        return len(self._streams)

    def convert(self, metrics: MetricsData, instance: str, partition: Partition, now_s: float | None = None,
                push_interval_s: float | None = None) -> bool:
        """Rewrite the delta sums of `metrics` in place; True when anything changed. `push_interval_s`: how often
        the client pushes, when the record says (streams are then kept at least twice that, at most twice an hour).
        Raises DecodeError("too-large") on reaching the part of a record past MAX_ITEMS (the points before it count)."""
        now_s = time.monotonic() if now_s is None else now_s
        self._expire(now_s)
        keep_s = self._idle_expiry_s
        if push_interval_s is not None:
            keep_s = max(keep_s, 2 * min(push_interval_s, MAX_PUSH_INTERVAL_S))
        changed = False
        emptied: list[tuple[int, int, int]] = []   # where a metric lost every point (all re-delivered)
        items = len(metrics.resource_metrics)
        if items > MAX_ITEMS:
            raise _too_many()
        for r, resource_metrics in enumerate(metrics.resource_metrics):
            # Several resources may share a record (plain OTLP topics) or a key: each has its own streams.
            resource = _resource_key(resource_metrics.resource.attributes)
            items += len(resource_metrics.scope_metrics)
            if items > MAX_ITEMS:
                raise _too_many()
            for s, scope_metrics in enumerate(resource_metrics.scope_metrics):
                scope = scope_metrics.scope.name
                items += len(scope_metrics.metrics)
                if items > MAX_ITEMS:
                    raise _too_many()
                for m, metric in enumerate(scope_metrics.metrics):
                    if not metric.HasField("sum"):
                        continue
                    total = metric.sum
                    if total.aggregation_temporality != AGGREGATION_TEMPORALITY_DELTA:
                        continue
                    points = total.data_points
                    items += len(points)
                    if items > MAX_ITEMS:
                        raise _too_many()
                    changed = True
                    total.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
                    metric_key = _metric_key(instance, resource, scope, metric.name)
                    bare_key = metric_key.digest()
                    kept = [point for point in points
                            if self._accumulate(point, _attributes_key(metric_key, point.attributes) if point.attributes
                                                else bare_key, partition, now_s, keep_s)]
                    if len(kept) < len(points):
                        # Rebuilt once: deleting the re-delivered points one by one shifts the rest each time.
                        del points[:]
                        points.extend(kept)
                        if not kept:
                            emptied.append((r, s, m))
        _drop_emptied(metrics, emptied)
        return changed

    def _accumulate(self, point: NumberDataPoint, key: StreamKey, partition: Partition, now_s: float,
                    keep_s: float) -> bool:
        is_int = point.WhichOneof("value") == "as_int"
        delta = point.as_int if is_int else point.as_double
        stream = self._streams.get(key)
        if stream is None:
            start = point.start_time_unix_nano or point.time_unix_nano
            stream = _Stream(partition, start, 0, start, now_s, keep_s)
            self._remember(key, stream)
        elif point.time_unix_nano <= stream.last_ns:
            self.dropped_points += 1
            return False
        else:
            self._streams.move_to_end(key)
            # Where its client is read now: a topic given more partitions moves keys, and `forget` must drop the
            # streams of the partitions revoked, not of those their clients were first read from.
            stream.partition = partition
        stream.keep_s = keep_s
        if not is_int and not math.isfinite(delta):
            # No meaningful running total includes it: passed on as it came, the total left as it was.
            stream.last_ns = point.time_unix_nano
            stream.seen_s = now_s
            point.start_time_unix_nano = stream.start_ns
            return True
        total = stream.total + delta
        if isinstance(total, int):   # only int points so far: exact
            whole = _int64(total)
            overflowed = whole is None
        else:   # doubles mixed in: an int point stays an int while the total is whole, never truncated
            whole = _int64(total) if is_int and total.is_integer() else None
            overflowed = not math.isfinite(total)
        if overflowed:
            # Past int64, or a double total past the largest double: the series starts again, as after a counter
            # reset, rather than failing the record or staying infinite.
            stream.start_ns = point.start_time_unix_nano or point.time_unix_nano
            total = delta
            whole = delta if is_int else None
        stream.total = total
        stream.last_ns = point.time_unix_nano
        stream.seen_s = now_s
        point.start_time_unix_nano = stream.start_ns
        if whole is not None:
            point.as_int = whole
        else:
            point.as_double = float(total)
        return True

    def _remember(self, key: StreamKey, stream: _Stream) -> None:
        while len(self._streams) >= self._max_streams:
            self._streams.popitem(last=False)
            self.evicted_streams += 1
        self._streams[key] = stream

    def _expire(self, now_s: float) -> None:
        # Streams are kept in order of last update, so the idle ones are at the front. One kept longer (a slow
        # pusher's) holds back those behind it until it expires: they are evicted by `max_streams` meanwhile.
        while self._streams:
            key, stream = next(iter(self._streams.items()))
            if now_s - stream.seen_s < stream.keep_s:
                return
            del self._streams[key]

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Drop the streams of partitions this member no longer reads (their next owner starts them again)."""
        gone = set(partitions)
        for key in [k for k, s in self._streams.items() if s.partition in gone]:
            del self._streams[key]


def _drop_emptied(metrics: MetricsData, emptied: list[tuple[int, int, int]]) -> None:
    """Remove the metrics at `emptied` (every point re-delivered), then the scopes and resources that leaves with no
    metric: a collector would be sent a sum without points."""
    for r, s, m in reversed(emptied):   # from the back, so the indices before each one still hold
        resource_metrics = metrics.resource_metrics[r]
        scope_metrics = resource_metrics.scope_metrics[s]
        del scope_metrics.metrics[m]
        if not scope_metrics.metrics:
            del resource_metrics.scope_metrics[s]
            if not resource_metrics.scope_metrics:
                del metrics.resource_metrics[r]


def _too_many() -> DecodeError:
    return DecodeError("too-large", f"more than {MAX_ITEMS} resources, scopes, metrics and delta points to convert "
                                    "to cumulative: refused rather than holding the bridge")


def _int64(total: float | int) -> int | None:
    try:
        whole = int(total)
    except (OverflowError, ValueError):   # inf, NaN
        return None
    return whole if -2**63 <= whole < 2**63 else None


def _resource_key(attributes: Sequence[KeyValue]) -> bytes:
    """A short digest of a resource's attributes (in any order), computed once per resource of a record."""
    return _attributes_key(hashlib.blake2b(digest_size=16), attributes) if attributes else b""


def _metric_key(instance: str, resource: bytes, scope: str, name: str) -> hashlib.blake2b:
    """The digest of a metric's identity, to be finished with each point's attributes. Every part is length-prefixed,
    so no two identities run together into the same bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (instance.encode("utf-8", errors="surrogatepass"), resource,
                 scope.encode("utf-8", errors="surrogatepass"), name.encode("utf-8", errors="surrogatepass")):
        digest.update(len(part).to_bytes(4, "big") + part)
    return digest


def _attributes_key(prefix: hashlib.blake2b, attributes: Sequence[KeyValue]) -> bytes:
    """`prefix` finished with the attributes, in any order: each KeyValue serialised and length-prefixed."""
    digest = prefix.copy()
    encoded = [kv.SerializeToString() for kv in attributes]
    encoded.sort()
    for one in encoded:
        digest.update(len(one).to_bytes(4, "big"))
        digest.update(one)
    return digest.digest()
