"""Inputs and conditions the bridge must survive without losing data or its footing: records a Kafka client cannot
read, a dead-letter topic that keeps refusing, records too large for the collector, settings the dead-letter
producer refuses, and collectors added to a hash-routed set."""

from __future__ import annotations

import gc
import logging
import threading
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_bridge.consumer import Record
from kcm_bridge.offsets import Ticket
from kcm_bridge.pipeline import _BatchTicket
from kcm_common import contract, points
from kcm_common.errors import UserError
from kcm_common.kafka import KafkaSettings
from fake_collector import FakeCollector
from payloads import client_metrics
from test_bridge_pipeline import (BACKENDS, _client_ids, _committed, _config, _FlakyDeadLetters, _PausingConsumer,
                                  _produce, _request_client_ids, _push, _unstarted_bridge, _wait, outcome_of_run,
                                  running_bridge)


class _NotUtf8(str):
    """A header name kafka-python's producer writes as bytes that are not UTF-8, as any producer may."""

    def encode(self, *args, **kwargs) -> bytes:
        return b"\xff\xfebad"


def _dead_letters(bootstrap: str, topic: str) -> list:
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=3000)
    try:
        reader.assign([TopicPartition(topic, 0)])
        reader.seek_to_beginning()
        return list(reader)
    finally:
        reader.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_record_with_a_header_name_that_is_not_utf8_costs_only_itself(backend, broker, new_topic, collector,
                                                                         tmp_path, caplog):
    """confluent-kafka raised for the whole fetch (the bridge died, and again on every restart); kafka-python raised
    on every poll, taken for a Kafka outage. The record is counted and, with confluent-kafka, dead-lettered with its
    key and value; the records around it are exported and committed."""
    topic, dlq = new_topic(), new_topic(prefix="dlq")
    # Enough records before it that Python has specialised the consumer's calls (confluent-kafka's error then went
    # unnoticed until a later call).
    pushes = [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}") for i in range(102)]
    _produce(broker.bootstrap, topic, pushes[:100])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    key, value, headers = pushes[100]
    producer.send(topic, key=key, value=value, headers=headers + [(_NotUtf8("x"), b"v")]).get(20)
    producer.close()
    _produce(broker.bootstrap, topic, pushes[101:])

    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, backend,
                     {("delivery", "dead_letter_topic"): dlq})
    with caplog.at_level(logging.INFO), running_bridge(config) as bridge:   # run() returns 0: asserted on exit
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 102, 60, "the commit past all")
        assert bridge.ready
    assert sorted(_client_ids(collector.exports)) == sorted(f"client-{i}" for i in range(102) if i != 100)
    assert bridge.metrics.value(bridge.metrics.decode_failures, reason="unprocessable") == 1
    letters = _dead_letters(broker.bootstrap, dlq)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("kcm")]
    assert not [m for m in messages if "cannot reach Kafka" in m], messages
    if backend == "confluent-kafka":
        (letter,) = letters
        assert (letter.key, letter.value) == (key, value)
        assert dict(letter.headers) == {"kcm.dlq.reason": b"unprocessable", "kcm.dlq.topic": topic.encode(),
                                        "kcm.dlq.partition": b"0", "kcm.dlq.offset": b"100"}
        assert any(f"{topic}/0@100 to {dlq} (unprocessable): a header name is not UTF-8" in m for m in messages)
    else:   # kafka-python reads nothing of the record: it is skipped, and the log says why it is not dead-lettered
        assert letters == []
        (line,) = [m for m in messages if f"skipping undecodable record {topic}/0@100" in m]
        assert "UnicodeDecodeError" in line and "cannot be dead-lettered with this client" in line


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_that_does_not_decompress_costs_only_its_records(backend, broker, new_topic, collector, tmp_path,
                                                                 monkeypatch):
    """A batch with a valid CRC and a gzip body that is not: kafka-python raised gzip's own error from poll, which
    stopped the bridge (and again after each restart). Its record is counted and skipped; the next is exported."""
    import kafka.record.default_records as records

    topic = new_topic()
    pushes = [_push(f"client-{i}", f"00000000-0000-0000-0000-{i:012d}") for i in range(3)]
    _produce(broker.bootstrap, topic, pushes[:1])
    monkeypatch.setattr(records, "gzip_encode", lambda data, *_, **__: b"\x00not gzip" + b"\x00" * 20)
    broken = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="gzip", linger_ms=0)
    key, value, headers = pushes[1]
    broken.send(topic, key=key, value=value, headers=headers).get(20)
    broken.close()
    monkeypatch.undo()
    _produce(broker.bootstrap, topic, pushes[2:])

    config = _config(tmp_path, broker.bootstrap, topic, collector.endpoint, backend)
    with running_bridge(config) as bridge:   # run() returns 0: asserted on exit
        _wait(lambda: _committed(broker.bootstrap, config.kafka.group_id, topic) == 3, 60, "the commit past all")
    assert sorted(_client_ids(collector.exports)) == ["client-0", "client-2"]
    assert sum(bridge.metrics.value(bridge.metrics.decode_failures, reason=reason)
               for reason in ("unprocessable", "decompress-failed")) == 1


def test_batches_exported_behind_a_dead_letter_the_topic_keeps_refusing_are_not_held(tmp_path, collector,
                                                                                      monkeypatch):
    """Each batch exported after a refused dead letter used to stay in memory (and be summed on every loop turn) for
    as long as the topic refused. The partition still is not committed past the letter until it is written."""
    from kcm_bridge import pipeline
    from kcm_common.retry import RetryPolicy

    monkeypatch.setattr(pipeline, "KAFKA_RETRY", RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05,
                                                            multiplier=2.0, jitter=0.0))
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        dead_letters = bridge._dead_letters = _FlakyDeadLetters(failures=10**9)   # no such topic, no ACL...
        bridge._consumer = _PausingConsumer([("metrics", 0)])
        corrupt = Record("metrics", 0, 0, b"k", b"\xff not a payload", [])
        bridge._add([corrupt])
        key, value, headers = _push("app", "00000000-0000-0000-0000-000000000001")
        batches = 300
        for offset in range(1, batches + 1):
            bridge._add([Record("metrics", 0, offset, key, value, headers)])
            bridge._flush()
        held = pipeline._held_size(corrupt)
        _wait(lambda: bridge._inflight_bytes() == held, 30, "every batch exported")
        assert len(collector.exports) == batches
        assert bridge._tracker.to_commit() == {("metrics", 0): 0}   # not past the letter
        gc.collect()
        tickets = [o for o in gc.get_objects() if isinstance(o, Ticket)]
        assert len(tickets) < 10, f"{len(tickets)} tickets held for {batches} exported batches"

        dead_letters.failures = 0   # the topic is fixed
        _wait(lambda: (bridge._serve_dead_letters(0), dead_letters.written)[1], 10, "the dead letter written")
        assert bridge._tracker.to_commit() == {("metrics", 0): batches + 1} and bridge._inflight_bytes() == 0


_START = 1_700_000_000_000_000_000


def _pushes(clients: list[str], push: int, first_offset: int, partition: int = 0) -> list[Record]:
    """A push of each client (its client_instance_id derived from its name), stamped `push` seconds after _START."""
    records = []
    for offset, client in enumerate(clients, first_offset):
        value, headers = contract.encode(
            client_metrics(client, t_ns=_START + push * 10**9), content_encoding="zstd",
            attributes={"client_id": client, "client_instance_id": str(uuid.uuid5(uuid.NAMESPACE_OID, client))})
        records.append(Record("metrics", partition, offset, None, value, headers))
    return records


def _request_pushes(request) -> list[tuple[str, int, int]]:
    """(client, push, value of its sum) of each push in an export request, in order."""
    found = []
    for resource_metrics in request.resource_metrics:
        client = str(points.attributes(resource_metrics.resource.attributes)["client_id"])
        for metric in resource_metrics.scope_metrics[0].metrics:
            if metric.HasField("sum"):
                (point,) = metric.sum.data_points
                found.append((client, (point.time_unix_nano - _START) // 10**9, point.as_int))
    return found


def _arrivals(collector: FakeCollector) -> dict[str, list[tuple[int, int]]]:
    """Per client, (push, value of its sum) in the order they reached the collector."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for export in collector.exports:
        for client, push, value in _request_pushes(export.request):
            seen.setdefault(client, []).append((push, value))
    return seen


@pytest.mark.parametrize("delta_to_cumulative", [False, True])
def test_each_client_instance_reaches_the_collector_in_the_order_read_after_a_failed_export_too(
        tmp_path, collector, delta_to_cumulative):
    """With two export threads per endpoint (the default), a batch retried after UNAVAILABLE arrived after later
    batches of the same clients: back ends refuse a sample older than one they have (Prometheus' out-of-order
    samples), and a cumulative sum arriving older than the last looks like a counter reset."""
    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("retry", "initial_backoff_s"): 0.5, ("retry", "max_backoff_s"): 0.5,
                      ("temporality", "delta_to_cumulative"): delta_to_cumulative})
    assert config.endpoints[0].concurrency == 2
    clients, rounds = [f"client-{i}" for i in range(8)], 20
    with _unstarted_bridge(config) as bridge:
        collector.fail_next(grpc.StatusCode.UNAVAILABLE)   # the first request to arrive: retried after 0.5 s
        for push in range(rounds):   # one batch per round, every client in each
            bridge._add(_pushes(clients, push, push * len(clients)))
            bridge._flush()
        _wait(lambda: bridge._inflight_bytes() == 0, 30, "every batch exported")
    assert collector.pending_faults() == 0   # the failure was answered, and its batch retried

    arrived = _arrivals(collector)
    assert sorted(arrived) == clients
    for client, seen in arrived.items():
        assert [push for push, _ in seen] == list(range(rounds)), client
        if delta_to_cumulative:   # each push's delta of 42 added up, in order: never a drop that looks like a reset
            assert [value for _, value in seen] == [42 * (push + 1) for push in range(rounds)], client


def test_exports_of_different_clients_go_side_by_side_and_of_one_client_one_after_the_other(tmp_path, collector):
    """An endpoint's export threads (`concurrency`, 2 by default) send batches side by side, unless a batch holds
    records of a client instance an earlier export still out holds too: then it waits for that one."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    assert config.endpoints[0].concurrency == 2
    with _unstarted_bridge(config) as bridge:
        collector.stall_next(0.5, times=2)
        for offset, clients in ((0, ["a", "b"]), (2, ["c", "d"])):
            bridge._add(_pushes(clients, 0, offset))
            bridge._flush()
        _wait(lambda: bridge._inflight_bytes() == 0, 30, "both batches exported")
        side_by_side, collector.most_in_progress = collector.most_in_progress, 0

        collector.stall_next(0.5, times=2)
        for offset, push, clients in ((4, 1, ["a", "e"]), (6, 2, ["f", "a"])):   # a in both
            bridge._add(_pushes(clients, push, offset))
            bridge._flush()
        _wait(lambda: bridge._inflight_bytes() == 0, 30, "both batches exported")
    assert (side_by_side, collector.most_in_progress) == (2, 1)
    assert [push for push, _ in _arrivals(collector)["a"]] == [0, 1, 2]


def test_a_request_retried_for_a_long_time_holds_back_only_its_own_clients(tmp_path, collector):
    """The collector fails the first push of client `stuck` (UNAVAILABLE: retried). stuck's next pushes, one batch
    each, wait for it without taking an export thread; the other clients' batches keep going."""
    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("retry", "initial_backoff_s"): 0.05, ("retry", "max_backoff_s"): 0.1})
    collector.refuse_when(lambda request: ("stuck", 0) in [(c, p) for c, p, _ in _request_pushes(request)],
                          code=grpc.StatusCode.UNAVAILABLE)
    others = [f"client-{i}" for i in range(16)]
    with _unstarted_bridge(config) as bridge:
        try:
            for offset in (0, 1, 2, 3):   # more than the endpoint's two threads
                bridge._add(_pushes(["stuck"], offset, offset))
                bridge._flush()
            for push in range(8):
                bridge._add(_pushes(others, push, 4 + push * len(others)))
                bridge._flush()
            _wait(lambda: all(len(_arrivals(collector).get(client, [])) == 8 for client in others), 30,
                  "every push of the other clients")
            assert "stuck" not in _arrivals(collector)   # its later pushes wait for the first, still retried
        finally:
            bridge.stop(at_once=True)   # the retrying export gives up, so the threads can be shut down


def test_records_a_collector_refuses_are_split_out_without_reordering_the_rest(tmp_path, collector):
    """The halves of a refused batch are settled one after the other: a client's records on both sides of the
    refused one still arrive in the order read."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    collector.refuse_when(lambda request: "poison" in _request_client_ids(request), message="invalid metric name")
    with _unstarted_bridge(config) as bridge:
        bridge._add(_pushes(["x"], 0, 0) + _pushes(["poison"], 0, 1) + _pushes(["x"], 1, 2) + _pushes(["x"], 2, 3))
        bridge._flush()
        _wait(lambda: bridge._inflight_bytes() == 0, 30, "the batch settled")
    assert [push for push, _ in _arrivals(collector)["x"]] == [0, 1, 2]
    assert sorted(_arrivals(collector)) == ["x"]
    assert collector.rejected_calls == 3   # the batch, the half holding the poison, then the poison on its own


def test_an_export_waiting_for_a_thread_when_the_shutdown_deadline_passes_is_never_sent(tmp_path, collector):
    """Its records stay uncommitted for the next owner of the partition, which sends them after the exports given up
    at the deadline: sent now, they would arrive before those."""
    import grpc

    seen: set[str] = set()

    def unavailable(request) -> bool:
        seen.update(_request_client_ids(request))
        return True

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("retry", "initial_backoff_s"): 0.05, ("retry", "max_backoff_s"): 0.1})
    collector.refuse_when(unavailable, code=grpc.StatusCode.UNAVAILABLE)
    with _unstarted_bridge(config) as bridge:
        for offset, client in enumerate(["a", "b", "c"]):   # c waits for one of the two export threads
            bridge._add(_pushes([client], 0, offset))
            bridge._flush()
        _wait(lambda: {"a", "b"} <= seen, 30, "both threads retrying")
        bridge.stop(at_once=True)
    assert seen == {"a", "b"}
    assert bridge._tracker.to_commit() == {("metrics", 0): 0}   # nothing past what was exported: nothing


def test_a_refused_batch_being_split_when_the_shutdown_deadline_passes_sends_nothing_more(tmp_path, collector):
    from kcm_common.otlp_export import Outcome

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    with _unstarted_bridge(config) as bridge:
        sent: list[int] = []

        def refuse(endpoint, records, ticket, watch=None) -> Outcome:   # the collector refuses every request as invalid
            sent.append(len(records))
            if len(sent) == 2:
                bridge.stop(at_once=True)   # a second Ctrl-C while the first half is out
            return Outcome(False, 1, error="INVALID_ARGUMENT", detail="nope")

        bridge._send = refuse
        parts = [(b"", 12, f"instance-{i}", None, ("metrics", 0)) for i in range(650)]
        outcome = bridge._export(bridge._endpoints[0], parts, _BatchTicket())
    assert outcome.abandoned and sent == [650, 325]


class _CommittingConsumer(_PausingConsumer):
    def __init__(self, assignment):
        super().__init__(assignment)
        self.commits = []

    def commit(self, positions):
        self.commits.append(dict(positions))

    def close(self):
        pass


def test_a_partition_revoked_before_its_exports_ended_is_not_sent_by_them_any_more(tmp_path, collector, caplog):
    """The revoke waits `revoke_timeout_s`, then leaves the partition to its next owner, which reads and sends its
    records again. The export being retried and the one waiting behind it used to go on, reaching the collector after
    the next owner's newer records (and keeping their bytes counted); now they stop, and the records of partitions
    still owned in the same batch are still sent."""
    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "revoke_timeout_s"): 0.3, ("retry", "initial_backoff_s"): 0.05,
                      ("retry", "max_backoff_s"): 0.1})
    down = threading.Event()
    down.set()
    collector.refuse_when(lambda request: down.is_set() and "a" in _request_client_ids(request),
                          code=grpc.StatusCode.UNAVAILABLE)
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([("metrics", 0), ("metrics", 1)])
        try:
            bridge._add(_pushes(["a"], 0, 0))   # retried while the collector refuses a
            bridge._flush()
            bridge._add(_pushes(["a"], 1, 1) + _pushes(["b"], 1, 0, partition=1))   # waits for the one before
            bridge._flush()
            _wait(lambda: collector.rejected_calls >= 2, 10, "the first export retried")
            with caplog.at_level(logging.WARNING, logger="kcm.bridge"):
                bridge._on_revoke([("metrics", 0)])
            assert "2 batches of the revoked partitions were not exported within revoke_timeout_s" in caplog.text
            _wait(lambda: bridge._inflight_bytes() == 0, 10, "both batches settled")
            down.clear()   # were they still retried or waiting, a's pushes would now arrive, after the next owner's
            time.sleep(0.5)
        finally:
            bridge.stop(at_once=True)
    assert _arrivals(collector) == {"b": [(1, 42)]}
    assert bridge._tracker.to_commit() == {("metrics", 1): 1}


def test_after_a_revoke_the_export_of_the_partitions_still_owned_keeps_its_backoff(tmp_path, collector):
    """A revoke takes partition 0 from a batch that also holds partition 1's records, while the collector is down.
    The export goes on with partition 1's records alone, retried with backoff until they are delivered. Given up on
    for a revoke that no longer concerns it, it would be sent again at once, and again: a request each millisecond
    at a collector that is down."""
    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "revoke_timeout_s"): 0.3, ("retry", "initial_backoff_s"): 0.25,
                      ("retry", "max_backoff_s"): 0.25})
    down = threading.Event()
    down.set()
    collector.refuse_when(lambda request: down.is_set(), code=grpc.StatusCode.UNAVAILABLE)
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([("metrics", 0), ("metrics", 1)])
        try:
            bridge._add(_pushes(["a"], 0, 0) + _pushes(["b"], 0, 0, partition=1))   # one batch of both partitions
            bridge._flush()
            _wait(lambda: collector.rejected_calls >= 1, 10, "the export failing")
            bridge._on_revoke([("metrics", 0)])
            before = collector.rejected_calls
            time.sleep(1.0)
            # Waits of 0.2–0.25 s: at most five retries in a second (and one more for a request already out).
            assert collector.rejected_calls - before <= 6, collector.rejected_calls - before
            down.clear()
            _wait(lambda: bridge._inflight_bytes() == 0, 10, "partition 1's records delivered")
        finally:
            bridge.stop(at_once=True)
    assert _arrivals(collector) == {"b": [(0, 42)]}
    assert bridge._tracker.to_commit() == {("metrics", 1): 1}


def test_records_held_back_for_the_budget_are_dropped_for_a_revoked_partition_and_never_tracked_again(tmp_path,
                                                                                                     collector):
    """Records fetched but waiting for budget belong to the next owner once their partition is revoked: prepared
    later, they were exported out of order with its exports, and their offsets tracked and committed again by a
    member that no longer owns the partition."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "max_inflight_bytes"): 1, ("batch", "linger_ms"): 60_000})
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([("metrics", 0), ("metrics", 1)])
        try:
            bridge._take(_pushes(["a", "b"], 0, 0) + _pushes(["c", "d"], 0, 0, partition=1))
            assert {(r.partition, r.offset) for r in bridge._held} == {(0, 1), (1, 0), (1, 1)}   # one went
            bridge._on_revoke([("metrics", 1)])
            assert {(r.partition, r.offset) for r in bridge._held} == {(0, 1)}
            bridge._batch.size = bridge._batch.kept = 0   # as if the first batch's bytes were freed
            bridge._take([])
            assert not any(partition == 1 for _, partition in bridge._tracker.to_commit())
        finally:
            bridge.stop(at_once=True)


def test_hash_routes_are_remembered_for_a_bounded_number_of_instances(tmp_path, collector):
    """Every client restart brings a new client_instance_id (and anyone may write random ones to the topic): the
    route of each instance ever seen, kept, grew without end."""
    from kcm_bridge import pipeline

    with FakeCollector() as second:
        config = _config(tmp_path, "127.0.0.1:9", "metrics", [collector.endpoint, second.endpoint], "confluent-kafka",
                         {("routing",): "hash"})
        with _unstarted_bridge(config) as bridge:
            bridge._consumer = _CommittingConsumer([("metrics", 0)])
            try:
                for flush in range(10):
                    bridge._batch.parts = [(b"", 0, f"instance-{flush}-{i}".encode(), None, ("metrics", 0))
                                           for i in range(500)]
                    bridge._flush()
                assert 0 < len(bridge._routes) <= pipeline._HEADER_CACHE_ENTRIES
            finally:
                bridge.stop(at_once=True)


def test_a_revoke_cut_short_by_the_shutdown_says_so_not_revoke_timeout_s(tmp_path, collector, caplog):
    """Closing the consumer at shutdown revokes within the shutdown's deadline; blaming revoke_timeout_s (5 s) for a
    wait that lasted no time sent readers to the wrong setting."""
    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "revoke_timeout_s"): 5, ("retry", "initial_backoff_s"): 0.05,
                      ("retry", "max_backoff_s"): 0.1})
    collector.refuse_when(lambda request: True, code=grpc.StatusCode.UNAVAILABLE)
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([("metrics", 0)])
        try:
            bridge._add(_pushes(["a"], 0, 0))
            bridge._flush()
            _wait(lambda: collector.rejected_calls >= 1, 10, "the export retried")
            bridge.stop(at_once=True)   # a second Ctrl-C: the drain's deadline is now
            began = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="kcm.bridge"):
                bridge._on_revoke([("metrics", 0)])
            assert time.monotonic() - began < 2
            assert "1 batches of the revoked partitions were not exported by the shutdown's deadline" in caplog.text
            assert "revoke_timeout_s" not in caplog.text
        finally:
            bridge.stop(at_once=True)


def test_a_stop_during_a_revoke_wait_ends_it_within_shutdown_timeout_s(tmp_path, collector, caplog):
    """`shutdown_timeout_s` counts from the signal: a revoke waiting for exports when it comes (a rebalance, inside
    a poll) must not go on for its own `revoke_timeout_s` first, which could pass the stop watchdog's bound
    (shutdown_timeout_s + connect_timeout_s + 5 s) and end a working bridge with exit 1."""
    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "revoke_timeout_s"): 30, ("delivery", "shutdown_timeout_s"): 1,
                      ("retry", "initial_backoff_s"): 0.05, ("retry", "max_backoff_s"): 0.1})
    collector.refuse_when(lambda request: True, code=grpc.StatusCode.UNAVAILABLE)
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([("metrics", 0)])
        try:
            bridge._add(_pushes(["a"], 0, 0))
            bridge._flush()
            _wait(lambda: collector.rejected_calls >= 1, 10, "the export retried")
            with caplog.at_level(logging.WARNING, logger="kcm.bridge"):
                revoke = threading.Thread(target=bridge._on_revoke, args=([("metrics", 0)],), daemon=True)
                revoke.start()
                time.sleep(0.3)
                stopped = time.monotonic()
                bridge.stop()   # SIGTERM
                revoke.join(10)
                took = time.monotonic() - stopped
            assert not revoke.is_alive() and took < 2.5, f"the revoke went on {took:.1f}s after the stop"
            assert "1 batches of the revoked partitions were not exported by the shutdown's deadline" in caplog.text
        finally:
            bridge.stop(at_once=True)


def test_an_export_that_cannot_be_handed_to_the_threads_holds_back_no_other_and_stops_the_bridge(
        tmp_path, monkeypatch):
    """`submit` failing (can't start new thread) for an export that waited left it registered as its clients' last:
    every later batch of them, and of the clients batched with those, waited for ever. It ends there now, the ones
    waiting for it go, and the consuming loop stops the bridge, as when that happens on its own thread."""
    from kcm_bridge import pipeline

    order, started = pipeline._InOrder(), []

    def start(turn):
        started.append(turn.parts[0][0])

    def refuse(turn):
        raise RuntimeError("can't start new thread")

    order.take([(b"x", 1, "a", None, ("metrics", 0))], start)
    x = started and order._latest["a"]
    order.take([(b"t", 1, "a", None, ("metrics", 0)), (b"t", 1, "b", None, ("metrics", 0))], refuse)
    order.take([(b"u", 1, "b", None, ("metrics", 0)), (b"u", 1, "c", None, ("metrics", 0))], start)
    assert started == [b"x"]
    order.end(x)   # t's hand-over fails: u, which waited for it alone, goes
    assert started == [b"x", b"u"] and isinstance(order.failure, RuntimeError)
    order.end(order._latest["b"])
    assert order._latest == {}
    with pytest.raises(RuntimeError):   # on the consuming thread: raised, and not left as the clients' last
        order.take([(b"v", 1, "d", None, ("metrics", 0))], refuse)
    order.take([(b"w", 1, "d", None, ("metrics", 0))], start)
    assert started[-1] == b"w"

    class IdleConsumer(_CommittingConsumer):
        def poll(self, timeout_s, max_records):
            time.sleep(min(timeout_s, 0.05))
            return []

        def check(self, timeout_s, stop=None):
            pass

        def high_watermarks(self, partitions, ask_s=0.0):
            return {}

    monkeypatch.setattr(pipeline, "open_consumer", lambda *args: IdleConsumer([]))
    monkeypatch.setattr(pipeline, "check_reachable", lambda *args: None)
    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka",
                     {("delivery", "shutdown_timeout_s"): 1})
    bridge = pipeline.Bridge(config)
    (bridge_order,) = bridge._order.values()
    bridge_order.failure = RuntimeError("can't start new thread")
    raised = outcome_of_run(bridge, 10)
    assert isinstance(raised, RuntimeError) and "could not be handed to the export threads" in str(raised)


class _PollingConsumer(_CommittingConsumer):
    """For a bridge's whole loop: each poll returns nothing and is handed to `on_poll(timeout_s)`; Kafka is up."""

    def __init__(self, assignment, on_poll):
        super().__init__(assignment)
        self.on_poll = on_poll

    def poll(self, timeout_s, max_records):
        self.on_poll(timeout_s)
        return []

    def check(self, timeout_s, stop=None):
        pass

    def high_watermarks(self, partitions, ask_s=0.0):
        return {}


def test_a_paused_bridge_polls_briefly_so_it_resumes_soon_after_its_exports_end(tmp_path, monkeypatch):
    """Paused, a poll returns nothing and only exports ending can resume it: the loop waited a whole half-second poll
    per pause (under a slow collector, half the time spent paused after the budget was free again)."""
    from kcm_bridge import pipeline

    timeouts = []

    def polled(timeout_s: float) -> None:
        timeouts.append(timeout_s)
        if len(timeouts) == 3:
            bridge.stop()

    monkeypatch.setattr(pipeline, "open_consumer", lambda *args: _PollingConsumer([("metrics", 0)], polled))
    monkeypatch.setattr(pipeline, "check_reachable", lambda *args: None)
    bridge = pipeline.Bridge(_config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka"))
    # As if the budget had filled long enough ago to pause the client's partitions: nothing is in flight, so the
    # first turn resumes it.
    bridge._paused = bridge._client_paused = True
    assert outcome_of_run(bridge, 10) == 0
    assert timeouts == [pipeline._PAUSED_POLL_S, 0.5, 0.5] and pipeline._PAUSED_POLL_S <= 0.05


def test_a_short_pause_polls_nothing_and_takes_records_again_as_soon_as_exports_free_the_budget(tmp_path, monkeypatch):
    """Paused for less than _CLIENT_PAUSE_AFTER_S, the loop does not poll (the client keeps its prefetch) and waits
    for an export to end, not for a poll's timeout."""
    from kcm_bridge import pipeline

    polls: list[float] = []
    freed_at: list[float] = []

    def polled(timeout_s: float) -> None:
        polls.append(time.monotonic())
        bridge.stop()

    consumer = _PollingConsumer([("metrics", 0)], polled)
    monkeypatch.setattr(pipeline, "open_consumer", lambda *args: consumer)
    monkeypatch.setattr(pipeline, "check_reachable", lambda *args: None)
    monkeypatch.setattr(pipeline, "_PAUSED_POLL_S", 5.0)   # so only the exports' end can wake it in time
    bridge = pipeline.Bridge(_config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka"))
    bridge._paused, bridge._paused_since = True, time.monotonic()
    export = Ticket(size=10 * bridge.config.delivery.max_inflight_bytes)
    bridge._hold(export)   # an export holds the budget

    def exports_end() -> None:
        time.sleep(0.3)
        freed_at.append(time.monotonic())
        bridge._finish(export)   # from the export's thread, as when it ends

    threading.Thread(target=exports_end, daemon=True).start()
    assert outcome_of_run(bridge, 10) == 0
    assert polls and freed_at and polls[0] >= freed_at[0], "polled while the exports held the budget"
    assert polls[0] - freed_at[0] < 1, f"took records again {polls[0] - freed_at[0]:.3f} s after the exports ended"
    assert consumer.paused == set()   # never paused in the client: its prefetch was kept


def test_a_paused_loop_is_woken_when_a_batch_s_last_export_frees_its_bytes_not_by_each_export(tmp_path):
    """A fanout batch holds its bytes until its last export ends (and then its letters' own until written)."""
    from concurrent.futures import Future

    from kcm_common.otlp_export import Outcome

    from kcm_bridge import pipeline

    with _unstarted_bridge(_config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka")) as bridge:
        ticket = pipeline._BatchTicket()
        ticket.size, ticket.exports, ticket.letters = 1000, 2, 100
        ticket.set_parts(3)   # two exports and a dead letter
        bridge._hold(ticket)
        ended: Future = Future()
        ended.set_result(Outcome(delivered=True, attempts=1))
        bridge._exported(ended, ticket)
        assert not bridge._freed.is_set() and bridge._inflight == 1000
        bridge._exported(ended, ticket)
        assert bridge._freed.is_set() and bridge._inflight == 100
        bridge._freed.clear()
        bridge._finish(ticket)   # the dead letter written
        assert bridge._freed.is_set() and bridge._inflight == 0


def test_the_drain_ends_exports_it_no_longer_tracks_at_once(tmp_path, collector, caplog):
    """An export still retried when nothing tracked is pending (its partition left to another member) was closed
    under by the drain, and retried as "failed unexpectedly" on the closed channel until the shutdown deadline."""
    import grpc

    from kcm_bridge import pipeline

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "shutdown_timeout_s"): 10, ("retry", "initial_backoff_s"): 0.05,
                      ("retry", "max_backoff_s"): 0.1})
    collector.refuse_when(lambda request: True, code=grpc.StatusCode.UNAVAILABLE)
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([])
        (endpoint,) = bridge._endpoints
        ticket = pipeline._BatchTicket()
        ticket.exports = 1
        payload, points_ = bridge._prepare(_pushes(["a"], 0, 0)[0])
        bridge._start(endpoint, [(payload, points_, "a", None, ("metrics", 0))], ticket, None, None)
        _wait(lambda: collector.rejected_calls >= 2, 10, "the export retried")
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="kcm"):
            bridge._drain()
        took = time.monotonic() - started
    assert took < 5, f"the drain waited {took:.1f} s for an export nobody waits for"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_refused_record_waiting_for_the_dead_letter_topic_holds_its_own_bytes_not_its_batchs(
        tmp_path, collector, monkeypatch):
    """Letters of records a collector refused shared their batch's ticket, so with a dead-letter topic that keeps
    refusing each kept its whole batch counted in flight: one bad client paused every partition within a few batches.
    Once a batch's exports have ended it counts only its letters, as a letter of an undecodable record does."""
    from kcm_bridge import pipeline
    from kcm_common.retry import RetryPolicy

    monkeypatch.setattr(pipeline, "KAFKA_RETRY", RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05,
                                                            multiplier=2.0, jitter=0.0))
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq"})
    collector.refuse_when(lambda request: "bad" in _request_client_ids(request), message="invalid metric name")
    good = [f"good-{i}" for i in range(20)]
    with _unstarted_bridge(config) as bridge:
        dead_letters = bridge._dead_letters = _FlakyDeadLetters(failures=10**9)
        bridge._consumer = _CommittingConsumer([("metrics", 0)])
        for push in range(5):
            bridge._add(_pushes(good + ["bad"], push, push * 21))
            bridge._flush()
        _wait(lambda: sum(map(len, _arrivals(collector).values())) == 5 * 20, 30, "every good push delivered")

        def letters_only() -> bool:
            bridge._serve_dead_letters(0)
            letters = list(bridge._letters_due)
            return len(letters) == 5 and bridge._inflight_bytes() == sum(
                pipeline._held_size(letter.record) for letter in letters)
        _wait(letters_only, 10, "only the letters counted in flight")
        assert bridge._tracker.to_commit() == {("metrics", 0): 0}   # not past the first letter's batch

        dead_letters.failures = 0
        _wait(lambda: (bridge._serve_dead_letters(0), len(dead_letters.written))[1] == 5, 10, "the letters written")
        assert bridge._inflight_bytes() == 0 and bridge._tracker.to_commit() == {("metrics", 0): 105}


def _large_push(client_id: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """A push of 5 MiB decompressed (the contract allows 16), over the collector's 4 MiB gRPC limit; a few KiB in
    Kafka."""
    data = MetricsData()
    metric = data.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "large"
    point = metric.gauge.data_points.add()
    point.as_int, point.time_unix_nano = 1, 1
    attribute = point.attributes.add()
    attribute.key, attribute.value.string_value = "blob", "x" * (5 * 2**20)
    value, headers = contract.encode(data, content_encoding="zstd", attributes={"client_id": client_id})
    return b"large", value, headers


def test_a_record_over_the_collectors_size_limit_is_dead_lettered_and_the_rest_of_its_batch_delivered(
        tmp_path, collector, caplog):
    """The collector refuses the request as RESOURCE_EXHAUSTED without a retry delay (its message limit): the batch
    was dropped and committed whole, dead-letter topic or not."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq", ("batch", "max_bytes"): 64 * 2**20})
    pushes = [_push("before", "00000000-0000-0000-0000-000000000001"), _large_push("large"),
              _push("after", "00000000-0000-0000-0000-000000000002")]
    with _unstarted_bridge(config) as bridge, caplog.at_level(logging.ERROR, logger="kcm.bridge"):
        dead_letters = bridge._dead_letters = _FlakyDeadLetters(failures=0)
        bridge._add([Record("metrics", 0, offset, *push) for offset, push in enumerate(pushes)])
        assert len(bridge._batch.parts) == 3
        bridge._flush()
        _wait(lambda: (bridge._serve_dead_letters(0), dead_letters.written)[1], 30, "the dead letter written")
        _wait(lambda: bridge._inflight_bytes() == 0, 30, "the batch finished")
        assert dead_letters.written == [("metrics-dlq", 1, "refused-by-collector")]
        assert bridge._tracker.to_commit() == {("metrics", 0): 3}
    assert sorted(_client_ids(collector.exports)) == ["after", "before"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "rejected with RESOURCE_EXHAUSTED" in line
    assert "dead-lettering 1 of the batch's 3 records (1 points; the others were delivered) to metrics-dlq" in line


def test_the_dead_letter_producer_refusing_a_setting_is_a_user_error_naming_it(monkeypatch):
    # Every setting a user can give now reaches librdkafka within its ranges (request.timeout.ms is clamped), so
    # the refusal is provoked by a translation that oversteps one: the UserError is the command's one line, exit 2.
    from kcm_bridge import consumer as consumers

    translated = consumers.librdkafka_config
    monkeypatch.setattr(consumers, "librdkafka_config",
                        lambda settings: {**translated(settings), "socket.timeout.ms": 400000})
    with pytest.raises(UserError, match="the Kafka dead-letter producer rejected its settings: Configuration "
                                        "property \"socket.timeout.ms\" value 400000 is outside allowed range"):
        consumers.ConfluentDeadLetters(KafkaSettings("127.0.0.1:9"))


def _routes(tmp_path, collectors: list[FakeCollector], records: list[Record]) -> dict[str, str]:
    """Which collector each client instance's records reached, hash-routed by a bridge to `collectors`."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", [c.endpoint for c in collectors], "confluent-kafka",
                     {("routing",): "hash", ("batch", "max_points"): 10**6})
    earlier = [len(collector.exports) for collector in collectors]
    with _unstarted_bridge(config) as bridge:
        bridge._add(records)
        bridge._flush()
        _wait(lambda: bridge._inflight_bytes() == 0, 30, "every export")
    routes: dict[str, str] = {}
    for collector, start in zip(collectors, earlier):
        for instance in _client_ids(collector.exports[start:]):
            assert routes.setdefault(instance, collector.endpoint) == collector.endpoint, "an instance split"
    return routes


def _instances(count: int, keyed: bool) -> list[Record]:
    records = []
    for i in range(count):
        key, value, headers = _push(f"instance-{i}", f"00000000-0000-0000-0000-{i:012d}")
        records.append(Record("metrics", 0, i, key if keyed else None, value, headers))
    return records


def test_adding_an_endpoint_to_hash_routing_moves_only_the_instances_the_new_one_takes(tmp_path):
    """`crc32(key) % endpoints` moved two thirds of the instances from two endpoints to three, most of them between
    the old ones (their collector-side state lost)."""
    records = _instances(200, keyed=True)
    with FakeCollector() as first, FakeCollector() as second, FakeCollector() as third:
        before = _routes(tmp_path, [first, second], records)
        after = _routes(tmp_path, [first, second, third], records)
    assert len(before) == len(after) == 200
    moved = {instance for instance in before if after[instance] != before[instance]}
    assert all(after[instance] == third.endpoint for instance in moved), "instances moved between old endpoints"
    assert 0 < len(moved) <= 100, len(moved)   # a third expected


def test_hash_routing_spreads_records_without_a_key_by_their_client_instance_id(tmp_path):
    """Records without a key (what the OpenTelemetry Collector's Kafka exporter writes) all went to one endpoint."""
    with FakeCollector() as first, FakeCollector() as second:
        routes = _routes(tmp_path, [first, second], _instances(200, keyed=False))
    assert len(routes) == 200 and set(routes.values()) == {first.endpoint, second.endpoint}


def test_a_revoke_waiting_only_for_dead_letter_writes_says_no_batch_was_left_unexported(tmp_path, collector, caplog,
                                                                                         monkeypatch):
    from kcm_bridge import pipeline
    from kcm_common.retry import RetryPolicy

    monkeypatch.setattr(pipeline, "KAFKA_RETRY", RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05,
                                                            multiplier=2.0, jitter=0.0))
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "dead_letter_topic"): "metrics-dlq", ("delivery", "revoke_timeout_s"): 0.2})
    collector.refuse_when(lambda request: "bad" in _request_client_ids(request), message="invalid metric name")
    with _unstarted_bridge(config) as bridge:
        bridge._dead_letters = _FlakyDeadLetters(failures=10**9)
        bridge._consumer = _CommittingConsumer([("metrics", 0)])
        bridge._add(_pushes(["good", "bad"], 0, 0))
        ticket = bridge._batch.ticket
        bridge._flush()
        # The export has ended (not merely handed its refused record over): only the dead letter holds the batch.
        _wait(lambda: ticket.exports == 0 and len(bridge._letters_due) == 1, 10, "the export ended, its letter waiting")
        with caplog.at_level(logging.INFO, logger="kcm.bridge"):
            bridge._on_revoke([("metrics", 0)])
        assert "revoking metrics/0" in caplog.text and "not exported" not in caplog.text
        # The letter's partition is gone: left to the next owner once its backoff has passed (on a loaded machine
        # that may be after the revoke's own serving of the letters), never written.
        _wait(lambda: (bridge._serve_dead_letters(0), bridge._inflight_bytes())[1] == 0, 10, "the letter let go")
        assert bridge._dead_letters.written == []
