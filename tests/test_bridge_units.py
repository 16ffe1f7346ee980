"""The bridge's pipeline, consumer adapters, Kafka health and metrics endpoint, unit by unit, with fakes (no broker,
no sandbox): behaviour a mutation review (session 24) found no test pinned. A docstring's "kills Xnn" names the
mutant of that review the test was checked against."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
import types
import urllib.error
import urllib.request

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_bridge.consumer import Record
from kcm_bridge.offsets import Ticket
from kcm_common import contract
from kcm_common.retry import RetryPolicy
from test_bridge_pipeline import _CommittingConsumer, _config, _FlakyDeadLetters, _push, _unstarted_bridge


def _offline_config(tmp_path, overrides=None):
    return _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka", overrides)


# -- pipeline.py: preparing and batching ---------------------------------------------------------------------------

def test_a_plain_protobuf_record_over_the_decompressed_size_limit_is_refused_as_too_large(tmp_path):
    """The fast path for uncompressed protobuf keeps the same size limit as decompressing (kills P01)."""
    data = MetricsData()
    attribute = data.resource_metrics.add().resource.attributes.add()
    attribute.key = "padding"
    attribute.value.string_value = "x" * (contract.DEFAULT_MAX_DECOMPRESSED_BYTES + 1)
    value = data.SerializeToString()
    headers = [(contract.CONTENT_TYPE_HEADER, contract.CONTENT_TYPE_PROTOBUF.encode())]
    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        with pytest.raises(contract.DecodeError) as refused:
            bridge._prepare(Record("metrics", 0, 0, None, value, headers))
    assert refused.value.reason == "too-large"


def test_header_facts_are_remembered_for_a_bounded_number_of_header_sets_and_never_for_a_large_one(
        tmp_path, monkeypatch):
    """Hostile headers cannot grow the header cache: it keeps at most _HEADER_CACHE_ENTRIES sets, dropping the
    oldest, and never keeps a set over _HEADER_CACHE_MAX_BYTES (kills P02, P03)."""
    from kcm_bridge import pipeline

    monkeypatch.setattr(pipeline, "_HEADER_CACHE_ENTRIES", 8)
    _, value, headers = _push("app", "00000000-0000-0000-0000-000000000001")
    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        prepare = bridge._prepare
        for index in range(20):
            prepare(Record("metrics", 0, index, None, value, headers + [("client_id", f"app-{index}".encode())]))
        assert len(prepare._facts) == 8
        assert tuple(headers + [("client_id", b"app-19")]) in prepare._facts   # the newest kept, the oldest gone
        assert tuple(headers + [("client_id", b"app-0")]) not in prepare._facts
        prepare._facts.clear()
        large = headers + [("client_id", b"x" * (pipeline._HEADER_CACHE_MAX_BYTES + 1))]
        prepare(Record("metrics", 0, 99, None, value, large))
        assert prepare._facts == {}


def test_a_batch_takes_records_up_to_exactly_its_max_points(tmp_path, collector):
    """batch.max_points is a limit the batch may reach, not one below it (kills P08)."""
    record = Record("metrics", 0, 0, *_push("app", "00000000-0000-0000-0000-000000000001"))
    with _unstarted_bridge(_offline_config(tmp_path)) as probe:
        points = probe._prepare(record)[1]
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("batch", "max_points"): 2 * points, ("batch", "max_bytes"): 10**7})
    with _unstarted_bridge(config) as bridge:
        bridge._add([record, record._replace(offset=1)])
        assert len(bridge._batch.parts) == 2 and bridge._batch.points == 2 * points


def test_while_exports_hold_the_whole_budget_even_the_first_record_of_a_poll_waits_undecoded(tmp_path):
    """Only with nothing in flight does one record go however large; with the budget held by exports the poll's
    records all wait in `_held` (kills P06)."""
    config = _offline_config(tmp_path, {("delivery", "max_inflight_bytes"): 1000})
    with _unstarted_bridge(config) as bridge:
        bridge._hold(Ticket(size=5000))   # an export in flight holding more than the budget
        record = Record("metrics", 0, 0, *_push("app", "00000000-0000-0000-0000-000000000001"))
        bridge._add([record])
        assert bridge._batch.parts == [] and bridge._held == [record]
        assert bridge._tracker.to_commit() == {}


def test_a_skipped_undecodable_record_without_a_dead_letter_topic_is_committed_past(tmp_path):
    """Without a dead-letter topic an undecodable record is counted and skipped, and its offset is committed past
    even when it is the last record read (else it is read and skipped again after every restart) (kills P11)."""
    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        bridge._add([Record("metrics", 0, 7, b"k", b"\xff not a payload", [])])
        assert bridge._tracker.to_commit() == {("metrics", 0): 8}
        assert bridge._tracker.pending() == 0


# -- pipeline.py: dead letters -------------------------------------------------------------------------------------

def test_a_dead_letter_the_topic_keeps_refusing_is_retried_with_a_growing_backoff(tmp_path, monkeypatch):
    """Each failed write waits longer before the next (kills P13: a fixed backoff)."""
    from kcm_bridge import pipeline

    monkeypatch.setattr(pipeline, "KAFKA_RETRY", RetryPolicy(initial_backoff_s=10.0, max_backoff_s=1000.0,
                                                            multiplier=2.0, jitter=0.0))
    config = _offline_config(tmp_path, {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        bridge._dead_letters = _FlakyDeadLetters(failures=10**9)
        bridge._add([Record("metrics", 0, 0, b"k", b"\xff not a payload", [])])   # first write fails
        (letter,) = bridge._letters_due
        assert 5 < letter.due - time.monotonic() <= 10
        letter.due = 0.0   # as if its backoff had passed
        bridge._serve_dead_letters(0)   # the second write fails too
        (letter,) = bridge._letters_due
        assert 15 < letter.due - time.monotonic() <= 20


def test_one_turn_of_dead_letter_writes_is_bounded_in_time_but_always_writes_one(tmp_path):
    """A dead-letter topic that blocks on each write cannot hold the consuming thread: a turn writes what fits in
    _DEAD_LETTER_TURN_S (at least one) and leaves the rest due for the next turn (kills P15)."""

    class Slow(_FlakyDeadLetters):
        def send(self, topic, record, reason, on_done):
            time.sleep(0.03)
            super().send(topic, record, reason, on_done)

    config = _offline_config(tmp_path, {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        bridge._dead_letters = _FlakyDeadLetters(failures=10**9)
        bridge._add([Record("metrics", 0, offset, b"k", b"\xff not a payload", []) for offset in range(10)])
        assert len(bridge._letters_due) == 10
        for letter in bridge._letters_due:
            letter.due = 0.0
        slow = bridge._dead_letters = Slow(failures=0)
        bridge._serve_dead_letters(0)
        assert 1 <= len(slow.written) < 10
        assert len(bridge._letters_due) == 10 - len(slow.written)


def test_handing_a_batch_to_the_exporters_keeps_its_dead_letter_copies_counted_against_the_budget(tmp_path,
                                                                                                  monkeypatch):
    """With a dead-letter topic the batch holds each compressed record's original value besides its enriched bytes;
    flushing the batch moves all of those bytes in flight, none is forgotten (kills P17)."""
    config = _offline_config(tmp_path, {("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        bridge._dead_letters = _FlakyDeadLetters(failures=0)
        monkeypatch.setattr(bridge, "_start", lambda *args: None)   # exports never end: the bytes stay in flight
        bridge._add([Record("metrics", 0, offset, *_push("app", f"00000000-0000-0000-0000-00000000000{offset}"))
                     for offset in range(3)])
        assert bridge._batch.kept > 0
        before = bridge._inflight_bytes()
        bridge._flush()
        assert bridge._inflight == before and bridge._inflight_bytes() == before


def _one_part(index: int = 0):
    payload = _push(f"app-{index}", f"00000000-0000-0000-0000-{index:012d}")[1]
    request = contract.decode(payload, [("content-encoding", b"zstd")]).metrics.SerializeToString()
    return (request, 2, b"", None, ("metrics", 0))


def test_a_single_record_the_collector_refuses_as_invalid_is_not_sent_again(tmp_path, collector):
    """A batch of one record refused as invalid is that record's own refusal: it is dropped (or dead-lettered) at
    once, not split and sent a second time (kills P20)."""
    from kcm_bridge.pipeline import _BatchTicket

    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    with _unstarted_bridge(config) as bridge:
        collector.fail_next(grpc.StatusCode.INVALID_ARGUMENT, message="invalid metric name")
        outcome = bridge._export(bridge._endpoints[0], [_one_part()], _BatchTicket())
    assert not outcome.delivered and outcome.error == "INVALID_ARGUMENT"
    assert collector.exports == [] and collector.rejected_calls == 1


def test_a_collector_refusing_every_record_costs_a_bounded_number_of_requests_per_batch(tmp_path, collector):
    """Splitting a refused batch is bounded (4·bit_length extra requests), not one request per record (kills P21)."""
    from kcm_bridge.pipeline import _BatchTicket

    import grpc

    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka")
    parts = [_one_part(index) for index in range(16)]
    with _unstarted_bridge(config) as bridge:
        collector.refuse_when(lambda request: True, grpc.StatusCode.INVALID_ARGUMENT, "invalid metric name")
        bridge._export(bridge._endpoints[0], parts, _BatchTicket())
    assert collector.exports == []
    assert 1 < collector.rejected_calls <= 1 + 4 * len(parts).bit_length(), collector.rejected_calls   # not 31


def test_a_failed_attempt_that_is_not_retried_counts_as_a_failure_not_a_retry(tmp_path):
    """kcm_bridge_export_retries counts attempts beyond the first only (kills P29)."""
    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        bridge._failed("collector:4317", "INVALID_ARGUMENT", False)
        bridge._failed("collector:4317", "UNAVAILABLE", True)
        metrics = bridge.metrics
        assert metrics.value(metrics.export_failures, endpoint="collector:4317") == 2
        assert metrics.value(metrics.retries, endpoint="collector:4317") == 1


def test_offsets_are_not_committed_while_kafka_is_known_to_be_unreachable(tmp_path):
    """A commit to an unreachable Kafka would hold the consuming thread up to the session timeout: the exported
    positions wait for Kafka to answer again, then go (kills P34)."""
    from test_bridge_pipeline import _CommittingConsumer

    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = _CommittingConsumer([partition], high=10)
        for offset in range(4):
            bridge._tracker.add(partition, offset, None)
        bridge._kafka.failed("cannot reach Kafka")
        bridge._commit()
        assert consumer.commits == [] and bridge._tracker.to_commit() == {partition: 4}
        bridge._kafka.recovered()
        bridge._commit()
        assert consumer.commits == [{partition: 4}]


# -- metrics.py: /metrics, /healthz, /readyz -----------------------------------------------------------------------

def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_healthz_is_always_ok_readyz_follows_readiness_and_metrics_are_the_registry(host):
    """Kills M01-M03, M05, M09, M10: /healthz 200 while the process runs; /readyz 503 until ready() then 200;
    /metrics in Prometheus' text format; anything else 404; `::1` served over IPv6."""
    import socket

    from prometheus_client import CONTENT_TYPE_LATEST

    from kcm_bridge.metrics import BridgeMetrics, serve

    if host == "::1":
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError as error:   # IPv6 configured off here
            pytest.skip(f"cannot listen on ::1: {error}")
    metrics, ready = BridgeMetrics(), [False]
    metrics.records.inc(3)
    server = serve(metrics, host, 0, lambda: ready[0])
    try:
        base = f"http://{'[::1]' if host == '::1' else host}:{server.server_address[1]}"
        assert _get(base + "/healthz")[:2] == (200, b"ok\n")
        assert _get(base + "/readyz")[:2] == (503, b"not ready\n")
        ready[0] = True
        assert _get(base + "/readyz")[:2] == (200, b"ready\n")
        status, body, content_type = _get(base + "/metrics")
        assert status == 200 and content_type == CONTENT_TYPE_LATEST
        assert b"kcm_bridge_records_consumed_total 3.0" in body
        assert _get(base + "/nothing-here")[0] == 404
    finally:
        server.shutdown()


def test_healthz_answers_503_with_the_problem_while_one_is_named_and_200_again_after():
    from kcm_bridge.metrics import BridgeMetrics, serve

    problem: list[str | None] = ["stalled: the consuming loop has not come round for 301s (stall_timeout_s 300)"]
    server = serve(BridgeMetrics(), "127.0.0.1", 0, lambda: True, lambda: problem[0])
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert _get(base + "/healthz")[:2] == (503, f"{problem[0]}\n".encode())
        assert _get(base + "/readyz")[:2] == (200, b"ready\n")   # readiness is its own question
        problem[0] = None
        assert _get(base + "/healthz")[:2] == (200, b"ok\n")
    finally:
        server.shutdown()
        server.server_close()


def test_metric_values_sum_only_the_samples_matching_every_label_given():
    """BridgeMetrics.value, which the other tests lean on, reads gauges too and filters on every label (kills M06,
    M08)."""
    from kcm_bridge.metrics import BridgeMetrics

    metrics = BridgeMetrics()
    metrics.lag.labels("metrics", "0").set(5)
    metrics.lag.labels("metrics", "1").set(7)
    metrics.lag.labels("other", "0").set(100)
    assert metrics.value(metrics.lag, topic="metrics", partition="0") == 5
    assert metrics.value(metrics.lag, topic="metrics") == 12
    metrics.paused.set(1)
    assert metrics.value(metrics.paused) == 1


# -- health.py -----------------------------------------------------------------------------------------------------

def test_kafka_checks_back_off_to_at_most_thirty_seconds_however_long_the_outage():
    """The default pacing: a broker down for an hour is checked again within about half a minute of coming back, and
    not hammered meanwhile (kills H09)."""
    from kcm_bridge.health import KafkaHealth

    now = [0.0]
    health = KafkaHealth(clock=lambda: now[0], rng=random.Random(7))
    delays = []
    for _ in range(40):
        assert health.check_due()
        delays.append(health.failed("brokers down"))
        now[0] += delays[-1]
    assert delays[0] <= 1.5
    assert 20 <= max(delays) <= 30 * 1.2 + 1e-9, delays


# -- consumer.py -----------------------------------------------------------------------------------------------------

def test_both_consumers_never_commit_on_their_own_and_read_a_new_group_from_the_earliest_record(monkeypatch):
    """At least once rests on the bridge committing only what was exported: neither client auto-commits (nor stores
    offsets on its own), a group without a committed offset starts at the earliest record, a partition lost without
    a clean revoke is reported as revoked, and librdkafka's prefetch stays bounded (kills C02-C05, C28)."""
    import confluent_kafka

    from kcm_bridge import consumer as consumer_module
    from kcm_common.kafka import KafkaSettings

    made = {}

    class FakeLibrdkafka:
        def __init__(self, config):
            made["config"] = config

        def subscribe(self, topics, **callbacks):
            made["topics"], made["callbacks"] = topics, callbacks

    monkeypatch.setattr(confluent_kafka, "Consumer", FakeLibrdkafka)
    settings = KafkaSettings("127.0.0.1:9")
    consumer_module.ConfluentConsumer(settings, {}, "group", ["metrics"], lambda _: None, lambda _: None)
    config = made["config"]
    assert config["enable.auto.commit"] is False and config["enable.auto.offset.store"] is False
    assert config["auto.offset.reset"] == "earliest"
    assert config["queued.max.messages.kbytes"] == consumer_module._PREFETCH_KBYTES
    assert made["callbacks"].get("on_lost") is made["callbacks"]["on_revoke"]

    legacy = consumer_module.KafkaPythonConsumer(settings, {}, "group", ["metrics"], lambda _: None, lambda _: None)
    assert legacy._options["enable_auto_commit"] is False and legacy._options["auto_offset_reset"] == "earliest"


def test_watermarks_a_client_does_not_know_yet_are_left_out_not_reported_negative():
    """librdkafka answers -1001 (and kafka-python None or -1) for a partition nothing was fetched from: the lag
    gauge must not be set from it (kills C15, C24)."""
    import confluent_kafka
    from kafka import TopicPartition

    from kcm_bridge.consumer import ConfluentConsumer, KafkaPythonConsumer

    class Librdkafka:
        def get_watermark_offsets(self, tp, timeout=None, cached=False):
            return (-1001, -1001) if tp.partition == 0 else (0, 42)

    confluent = ConfluentConsumer.__new__(ConfluentConsumer)
    confluent._consumer, confluent._tp, confluent._exception = Librdkafka(), confluent_kafka.TopicPartition, \
        confluent_kafka.KafkaException
    confluent._ask_from = 0
    assert confluent.high_watermarks([("t", 0), ("t", 1)]) == {("t", 1): 42}

    class KafkaPython:
        def highwater(self, tp):
            return {0: None, 1: -1}.get(tp.partition, 7)

    legacy = KafkaPythonConsumer.__new__(KafkaPythonConsumer)
    legacy._consumer, legacy._tp = KafkaPython(), TopicPartition
    assert legacy.high_watermarks([("t", 0), ("t", 1), ("t", 2)]) == {("t", 2): 7}


def _dead_letter_record(timestamp):
    return Record("metrics", 3, 41, b"key", b"value", [("a", b"1"), ("null", None)], None, timestamp)


def test_a_dead_letter_keeps_its_records_key_value_headers_and_timestamp_and_says_where_it_came_from():
    """Written as it was read, plus where from and why; a record without a timestamp (negative) gets the producer's
    clock; a full local queue is a failed write, retried, not an exception in the consuming thread (kills C17-C19,
    C30)."""
    import confluent_kafka

    from kcm_bridge.consumer import ConfluentDeadLetters

    produced, outcomes = [], []

    class Producer:
        full = False

        def produce(self, topic, **kwargs):
            if self.full:
                raise BufferError("Local: Queue full")
            produced.append((topic, kwargs))

        def poll(self, timeout):
            return 0

    letters = ConfluentDeadLetters.__new__(ConfluentDeadLetters)
    letters._producer, letters._exception = Producer(), confluent_kafka.KafkaException
    letters.send("dlq", _dead_letter_record(1_700_000_000_000), "invalid-protobuf", outcomes.append)
    letters.send("dlq", _dead_letter_record(-1), "invalid-protobuf", outcomes.append)
    (topic, first), (_, second) = produced
    assert topic == "dlq" and (first["key"], first["value"]) == (b"key", b"value")
    assert first["timestamp"] == 1_700_000_000_000 and second["timestamp"] == 0   # 0: librdkafka's "now"
    assert first["headers"] == [("a", b"1"), ("null", None), ("kcm.dlq.reason", b"invalid-protobuf"),
                                ("kcm.dlq.topic", b"metrics"), ("kcm.dlq.partition", b"3"), ("kcm.dlq.offset", b"41")]
    letters._producer.full = True
    letters.send("dlq", _dead_letter_record(5), "invalid-protobuf", outcomes.append)
    assert outcomes == [False]   # the two accepted report later, from the producer's delivery callback


def test_kafka_python_dead_letters_leave_out_null_header_values_and_keep_a_missing_timestamp_unset():
    """kafka-python's producer raises TypeError for a null header value: those headers are left out (kills C17, C22)."""
    from kcm_bridge.consumer import KafkaPythonDeadLetters

    sent = []

    class Future:
        def add_callback(self, callback):
            callback(None)

        def add_errback(self, errback):
            pass

    class Producer:
        def send(self, topic, value, key, timestamp_ms, headers):
            if any(v is None for _, v in headers):
                raise TypeError("header value must be bytes")
            sent.append((topic, key, value, timestamp_ms, headers))
            return Future()

    letters = KafkaPythonDeadLetters.__new__(KafkaPythonDeadLetters)
    letters._producer, outcomes = Producer(), []
    letters.send("dlq", _dead_letter_record(-1), "too-large", outcomes.append)
    assert outcomes == [True]
    ((topic, key, value, timestamp_ms, headers),) = sent
    assert (topic, key, value, timestamp_ms) == ("dlq", b"key", b"value", None)
    assert ("null", None) not in headers and ("kcm.dlq.reason", b"too-large") in headers


def test_a_kafka_that_answers_is_not_checked_again_until_it_fails():
    """Checks (a probe and a metadata request) are for a Kafka not usable yet: once it answers, none is due however
    much time passes, until a failure (kills H02)."""
    from kcm_bridge.health import KafkaHealth

    now = [0.0]
    health = KafkaHealth(clock=lambda: now[0], rng=random.Random(7))
    assert health.check_due()
    health.recovered()
    now[0] += 3600
    assert not health.check_due()
    health.failed("brokers down")
    now[0] += 3600
    assert health.check_due()
    health.recovered()
    now[0] += 3600
    assert not health.check_due()


# -- consumer.py: librdkafka's unreadable batches and outages --------------------------------------------------------

class _Message:
    """A confluent_kafka.Message as consume() gives it: a record, or an error event at an offset."""

    def __init__(self, offset, error=None, value=b"v"):
        self._offset, self._error, self._value = offset, error, value

    def error(self):
        return self._error

    def topic(self):
        return "metrics"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def key(self):
        return None

    def value(self):
        return self._value

    def headers(self):
        return None

    def timestamp(self):
        return (1, 1_700_000_000_000)


def _scripted_consumer(monkeypatch, script):
    """A ConfluentConsumer over a fake librdkafka consumer whose consume() calls run `script` in turn (each a
    function of the error callback returning the messages); returns it and the offsets it was sought to."""
    import confluent_kafka

    from kcm_bridge.consumer import ConfluentConsumer
    from kcm_common.kafka import KafkaSettings

    sought, turns = [], iter(script)

    class Librdkafka:
        def __init__(self, config):
            self._on_error = config["error_cb"]

        def subscribe(self, topics, **callbacks):
            pass

        def consume(self, count, timeout):
            return next(turns)(self._on_error)

        def seek(self, tp):
            sought.append(tp.offset)

    monkeypatch.setattr(confluent_kafka, "Consumer", Librdkafka)
    return ConfluentConsumer(KafkaSettings("127.0.0.1:9"), {}, "group", ["metrics"], lambda _: None,
                             lambda _: None), sought


def test_records_fetched_in_the_poll_that_learns_kafka_is_down_are_returned_and_the_outage_raised_next(
        monkeypatch):
    """Raising from a poll that fetched records would lose them: librdkafka's position is past them already and
    later commits would skip them."""
    import confluent_kafka

    from kcm_bridge.consumer import KafkaUnavailableError

    down = confluent_kafka.KafkaError(confluent_kafka.KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")

    def fetched_while_down(on_error):
        on_error(down)
        return [_Message(7), _Message(8)]

    consumer, _ = _scripted_consumer(monkeypatch, [fetched_while_down, lambda on_error: []])
    assert [record.offset for record in consumer.poll(0.1, 10)] == [7, 8]
    with pytest.raises(KafkaUnavailableError, match="cannot reach Kafka at 127.0.0.1:9"):
        consumer.poll(0.1, 10)


def test_an_unreadable_batch_reported_at_its_first_offset_each_time_is_stepped_past_one_record_at_a_time(
        monkeypatch):
    """librdkafka reports a batch it cannot decompress at the batch's first offset however far the partition was
    sought into it: each report moves one record further, so a batch of several ends."""
    import confluent_kafka

    broken = confluent_kafka.KafkaError(confluent_kafka.KafkaError._BAD_COMPRESSION, "bad compression")
    consumer, sought = _scripted_consumer(monkeypatch, [lambda on_error: [_Message(5, broken)]] * 3)
    records = [record for _ in range(3) for record in consumer.poll(0.1, 10)]
    assert [(record.offset, record.value) for record in records] == [(5, None), (6, None), (7, None)]
    assert all("librdkafka cannot read it" in record.unreadable for record in records)
    assert sought == [6, 7, 8]


def test_an_unreadable_error_without_an_offset_is_not_stepped_past(monkeypatch):
    """An error event of no record (offset -1001) must not seek: stepping past "offset -1001" would seek to 0 and
    read the partition again from its start."""
    import confluent_kafka

    broken = confluent_kafka.KafkaError(confluent_kafka.KafkaError._BAD_MSG, "bad message")
    consumer, sought = _scripted_consumer(monkeypatch, [lambda on_error: [_Message(-1001, broken), _Message(3)]])
    assert [record.offset for record in consumer.poll(0.1, 10)] == [3]
    assert sought == []


# -- pipeline.py: revokes ------------------------------------------------------------------------------------------

def test_a_revoke_forgets_the_delta_streams_of_the_revoked_partitions(tmp_path):
    """Delta-to-cumulative state of a revoked partition goes: its next owner starts those streams again, and a
    member getting it back must not add new deltas to sums it stopped keeping (kills P43)."""
    config = _offline_config(tmp_path, {("temporality", "delta_to_cumulative"): True,
                                        ("delivery", "revoke_timeout_s"): 0.0})
    with _unstarted_bridge(config) as bridge:
        bridge._consumer = _CommittingConsumer([("metrics", 0)], high=0)
        forgotten = []
        bridge._converter.forget = lambda partitions: forgotten.append(list(partitions))
        bridge._on_revoke([("metrics", 0)])
        assert forgotten == [[("metrics", 0)]]


# -- pipeline.py: lag ----------------------------------------------------------------------------------------------

class _AskingConsumer(_CommittingConsumer):
    def __init__(self, assignment, high):
        super().__init__(assignment, high)
        self.asked = []

    def high_watermarks(self, partitions, ask_s):
        self.asked.append(ask_s)
        return super().high_watermarks(partitions, ask_s)


def test_lag_asks_kafka_for_watermarks_only_while_fetching_is_paused_and_is_never_negative(tmp_path):
    """A paused partition fetches nothing, so its last fetched watermark goes stale: the lag then asks Kafka (kills
    P37). A watermark behind the commit position (a stale one) is no lag, not a negative one (kills P38)."""
    from kcm_bridge import pipeline

    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = _AskingConsumer([partition], high=2)
        bridge._kafka.recovered()
        for offset in range(5):
            bridge._tracker.add(partition, offset, None)
        bridge._report_lag()
        bridge._paused = True
        bridge._report_lag()
        assert consumer.asked == [0.0, pipeline._WATERMARK_ASK_S]
        assert bridge.metrics.value(bridge.metrics.lag, topic="metrics", partition="0") == 0


# -- pipeline.py: shutdown -----------------------------------------------------------------------------------------

class _ClosingDeadLetters:
    def __init__(self):
        self.closed = []

    def send(self, topic, record, reason, on_done):
        on_done(True)

    def flush(self, timeout_s):
        pass

    def close(self, timeout_s):
        self.closed.append(timeout_s)


class _ClosableConsumer(_CommittingConsumer):
    def close(self):
        self.assigned = []


def test_the_drain_exports_the_open_batch_commits_it_and_closes_dead_letters_within_its_deadline(tmp_path, collector):
    """At shutdown the open batch is exported, not left to be read again (kills P44); the dead-letter producer gets
    what is left of the shutdown timeout, never more (kills P47)."""
    config = _config(tmp_path, "127.0.0.1:9", "metrics", collector.endpoint, "confluent-kafka",
                     {("delivery", "shutdown_timeout_s"): 5.0, ("delivery", "dead_letter_topic"): "metrics-dlq"})
    with _unstarted_bridge(config) as bridge:
        partition = ("metrics", 0)
        consumer = bridge._consumer = _ClosableConsumer([partition], high=1)
        letters = bridge._dead_letters = _ClosingDeadLetters()
        bridge._kafka.recovered()
        bridge._add([Record("metrics", 0, 0, *_push("app", "00000000-0000-0000-0000-000000000001"))])
        bridge._drain()
    assert consumer.commits == [{partition: 1}]
    assert len(collector.exports) == 1
    assert len(letters.closed) == 1 and 0 <= letters.closed[0] <= 5.0


def test_a_second_stop_gives_up_on_exports_at_once_and_a_stopping_bridge_is_not_ready(tmp_path):
    """stop(at_once=True) ends the wait for exports now (kills P54); from the first stop /readyz says not ready, so
    no traffic is routed to a bridge shutting down (kills P53)."""
    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        bridge._ready = True
        bridge._kafka.recovered()
        assert bridge.ready
        bridge._drain_deadline = time.monotonic() + 60   # a drain in progress
        bridge.stop()
        assert not bridge.ready and not bridge._give_up()
        bridge.stop(at_once=True)
        assert bridge._give_up()


def test_handing_an_export_to_stopped_threads_is_an_error_unless_the_bridge_is_stopping(tmp_path):
    """Only the drain shuts the export threads down: anywhere else a refused hand-over must surface, not leave a batch
    that never ends holding its partition's commits (kills P58)."""
    from kcm_bridge.pipeline import _BatchTicket

    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        endpoint = bridge._endpoints[0]
        bridge._pools[id(endpoint)].shutdown()
        with pytest.raises(RuntimeError):
            bridge._start(endpoint, [], _BatchTicket(), None, None)
        bridge._stopping.set()
        bridge._start(endpoint, [], _BatchTicket(), None, None)   # the drain's deadline: read again later


# -- pipeline.py: polling ------------------------------------------------------------------------------------------

class _RecordingEvent(threading.Event):
    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return self.is_set()


class _DownConsumer(_CommittingConsumer):
    def check(self, timeout_s, stop):
        from kcm_bridge.consumer import KafkaUnavailableError

        raise KafkaUnavailableError("cannot reach Kafka at 127.0.0.1:9")


def test_a_failed_kafka_check_waits_out_the_poll_timeout_and_one_cut_short_by_a_stop_is_no_failure(
        tmp_path, monkeypatch, caplog):
    """While Kafka is down the loop waits the poll's timeout instead of spinning (kills P50); a check cut short by a
    shutdown says nothing about Kafka: not reported, not counted (kills P49)."""
    from kcm_bridge import pipeline

    monkeypatch.setattr(pipeline, "check_reachable", lambda *args: None)
    with _unstarted_bridge(_offline_config(tmp_path)) as bridge:
        bridge._consumer = _DownConsumer([("metrics", 0)], high=0)
        stopping = bridge._stopping = _RecordingEvent()
        with caplog.at_level(logging.INFO, logger="kcm.bridge"):
            assert bridge._poll(0.25) == []
            assert stopping.waits == [0.25]
            assert "cannot reach Kafka at 127.0.0.1:9; retrying in" in caplog.text
            caplog.clear()
            bridge._kafka = type(bridge._kafka)()   # a fresh health: a check is due at once
            stopping.set()
            assert bridge._poll(0.25) == []
        assert "retrying in" not in caplog.text
        assert bridge._kafka.check_due()   # not counted as a failure: no backoff started


def test_each_poll_fetches_what_fits_in_the_in_flight_budget_at_the_average_record_size(tmp_path):
    """Memory stays bounded by the budget however large the backlog (kills P51), at the size records really have
    once some were read (kills P52)."""
    from kcm_bridge import pipeline

    config = _offline_config(tmp_path, {("delivery", "max_inflight_bytes"): 1_000_000})
    record = Record("metrics", 0, 0, *_push("app", "00000000-0000-0000-0000-000000000001"))
    with _unstarted_bridge(config) as bridge:
        bridge._average_size = 10_000.0
        assert bridge._poll_size() == 100
        bridge._hold(Ticket(size=600_000))
        assert bridge._poll_size() == 40
        bridge._hold(Ticket(size=600_000))
        assert bridge._poll_size() == 1
    with _unstarted_bridge(config) as bridge:
        size = len(bridge._prepare(record)[0])
        for offset in range(40):
            bridge._add([record._replace(offset=offset)])
            bridge._batch = type(bridge._batch)()   # exported, as far as the budget goes
        assert abs(bridge._average_size - size) < 0.05 * size
        assert bridge._poll_size() == min(pipeline._POLL_RECORDS, int(1_000_000 // bridge._average_size))


# -- consumer.py -----------------------------------------------------------------------------------------------------

def test_an_unreadable_batch_read_again_after_good_records_is_stepped_from_its_own_offset(monkeypatch):
    """A good record ends the stepping through a broken batch: if the partition is read again from before it (a
    rebalance, a seek back), the broken batch is stepped from its own offset, not past the good record read since,
    which would be skipped unread (kills C08)."""
    import confluent_kafka

    broken = confluent_kafka.KafkaError(confluent_kafka.KafkaError._BAD_COMPRESSION, "bad compression")
    script = [lambda on_error: [_Message(5, broken)], lambda on_error: [_Message(6)],
              lambda on_error: [_Message(5, broken)]]
    consumer, sought = _scripted_consumer(monkeypatch, script)
    records = [record for _ in range(3) for record in consumer.poll(0.1, 10)]
    assert [(record.offset, record.unreadable is None) for record in records] == [(5, False), (6, True), (5, False)]
    assert sought == [6, 6]


class _Metadata:
    brokers: dict = {}
    topics: dict = {"metrics": types.SimpleNamespace(error=None)}   # the subscribed topic exists


def _answering_consumer(monkeypatch):
    """A ConfluentConsumer over a fake librdkafka consumer that answers metadata; returns it and its callbacks."""
    import confluent_kafka

    from kcm_bridge.consumer import ConfluentConsumer
    from kcm_common.kafka import KafkaSettings

    made = {}

    class Librdkafka:
        def __init__(self, config):
            made["on_error"] = config["error_cb"]

        def subscribe(self, topics, **callbacks):
            made.update(callbacks)

        def list_topics(self, topic=None, timeout=None):
            if made.get("silent"):
                raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT))
            return _Metadata()

        def consume(self, count, timeout):
            return made.pop("events", lambda on_error: [])(made["on_error"])

    monkeypatch.setattr(confluent_kafka, "Consumer", Librdkafka)
    return ConfluentConsumer(KafkaSettings("127.0.0.1:9"), {}, "group", ["metrics"], lambda _: None,
                             lambda _: None), made


def test_a_check_that_kafka_answers_makes_one_unreachable_broker_a_warning(monkeypatch, caplog):
    """Before Kafka answered, a failed broker connection is part of the outage; after a successful check it is one
    broker down, said as a warning (kills C12)."""
    import confluent_kafka

    consumer, made = _answering_consumer(monkeypatch)
    consumer.check(1.0)
    made["events"] = lambda on_error: (on_error(confluent_kafka.KafkaError(
        confluent_kafka.KafkaError._TRANSPORT, "127.0.0.1:9093/2: Connect to ipv4#127.0.0.1:9093 failed")), [])[1]
    with caplog.at_level(logging.WARNING, logger="kcm.bridge"):
        consumer.poll(0, 1)
    assert "a broker cannot be reached (127.0.0.1:9093/2" in caplog.text


def test_joining_the_group_clears_a_group_authorization_refusal(monkeypatch):
    """Once an ACL is granted and the group joined, checks stop reporting the old refusal (kills C06)."""
    import confluent_kafka

    from kcm_bridge.consumer import KafkaUnavailableError

    consumer, made = _answering_consumer(monkeypatch)
    made["on_error"](confluent_kafka.KafkaError(confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED, "denied"))
    with pytest.raises(KafkaUnavailableError, match="READ on group group"):
        consumer.check(1.0)
    made["on_assign"](None, [])
    consumer.check(1.0)


def test_the_confluent_consumer_commits_synchronously(monkeypatch):
    """A commit returns once Kafka stored it: the tracker then forgets those offsets (kills C16)."""
    import confluent_kafka

    from kcm_bridge.consumer import ConfluentConsumer

    commits = []

    class Librdkafka:
        def commit(self, offsets=None, asynchronous=True):
            commits.append(([(tp.partition, tp.offset) for tp in offsets], asynchronous))

    consumer = ConfluentConsumer.__new__(ConfluentConsumer)
    consumer._consumer, consumer._tp = Librdkafka(), confluent_kafka.TopicPartition
    consumer.commit({("t", 0): 4})
    assert commits == [([(0, 4)], False)]


def test_confluent_dead_letters_flush_waits_only_when_given_time(monkeypatch):
    """(kills C20)"""
    from kcm_bridge.consumer import ConfluentDeadLetters

    calls = []

    class Producer:
        def poll(self, timeout):
            calls.append(("poll", timeout))

        def flush(self, timeout):
            calls.append(("flush", timeout))

    letters = ConfluentDeadLetters.__new__(ConfluentDeadLetters)
    letters._producer = Producer()
    letters.flush(0)
    letters.flush(0.5)
    assert calls == [("poll", 0), ("poll", 0), ("flush", 0.5)]


def test_the_kafka_python_dead_letter_producer_blocks_the_consuming_thread_briefly_at_most(monkeypatch):
    """A missing dead-letter topic must not hold the consuming thread kafka-python's default minute (kills C21)."""
    import kafka

    from kcm_bridge.consumer import KafkaPythonDeadLetters
    from kcm_common.kafka import KafkaSettings

    built = {}

    class Producer:
        def __init__(self, **options):
            built.update(options)

        def send(self, *args, **kwargs):
            raise kafka.errors.KafkaTimeoutError("no metadata")

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    letters, outcomes = KafkaPythonDeadLetters(KafkaSettings("127.0.0.1:9")), []
    letters.send("dlq", Record("metrics", 0, 1, b"k", b"v", []), "too-large", outcomes.append)
    assert outcomes == [False] and 0 < built["max_block_ms"] <= 1000


class _KafkaPython:
    """kafka-python's KafkaConsumer, as far as KafkaPythonConsumer uses it when losing its client and polling."""

    def __init__(self, coordinator_unknown=False):
        self.closed, self.unknown = [], coordinator_unknown
        self._coordinator = types.SimpleNamespace(coordinator_unknown=lambda: self.unknown)
        self._cluster = types.SimpleNamespace(unauthorized_topics=set())

    def assignment(self):
        from kafka import TopicPartition

        return {TopicPartition("metrics", 0)}

    def close(self, autocommit=True):
        self.closed.append(autocommit)

    def poll(self, timeout_ms, max_records):
        return {}


def test_kafka_python_losing_its_client_revokes_its_partitions_first_and_never_autocommits(monkeypatch):
    """What was exported may still be committed by the revoke; closing must not commit kafka-python's own idea of the
    position (kills C25, C26)."""
    from kcm_bridge.consumer import KafkaPythonConsumer
    from kcm_common.kafka import KafkaSettings

    revoked = []
    consumer = KafkaPythonConsumer(KafkaSettings("127.0.0.1:9"), {}, "group", ["metrics"], lambda _: None,
                                   revoked.append)
    client = consumer._consumer = _KafkaPython()
    consumer._lose_client()
    assert revoked == [[("metrics", 0)]] and client.closed == [False] and consumer._consumer is None


def test_kafka_python_polls_raise_once_the_coordinator_is_unknown_for_the_check_timeout(monkeypatch):
    """kafka-python reconnects in silence while the brokers are down: empty polls with the coordinator unknown for
    connect_timeout_s are the outage (kills C23, C31)."""
    from kcm_bridge import consumer as consumer_module
    from kcm_bridge.consumer import KafkaPythonConsumer, KafkaUnavailableError
    from kcm_common.kafka import KafkaSettings

    now = [100.0]
    monkeypatch.setattr(consumer_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    consumer = KafkaPythonConsumer(KafkaSettings("127.0.0.1:9"), {}, "group", ["metrics"], lambda _: None,
                                   lambda _: None)
    consumer._consumer, consumer._timeout_s = _KafkaPython(coordinator_unknown=True), 10.0
    assert consumer.poll(0.1, 10) == []
    now[0] += 9.0
    assert consumer.poll(0.1, 10) == []
    now[0] += 1.0
    with pytest.raises(KafkaUnavailableError, match="cannot reach Kafka's group coordinator"):
        consumer.poll(0.1, 10)


def test_librdkafkas_log_of_each_failed_connection_is_dropped_and_its_other_lines_kept(caplog):
    """Every failed connection attempt also arrives as an error event, reported once per backoff period (kills C27)."""
    from kcm_bridge.consumer import _LIBRDKAFKA_LOG

    with caplog.at_level(logging.INFO, logger=_LIBRDKAFKA_LOG.name):
        _LIBRDKAFKA_LOG.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connect to 127.0.0.1:9 failed")
        _LIBRDKAFKA_LOG.warning("%s [%s] %s", "SESSTMOUT", "rdkafka#consumer-1", "session timed out")
    assert "Connect to" not in caplog.text and "session timed out" in caplog.text


def test_consumer_tuning_values_are_read_without_surrounding_spaces():
    """A properties file's `auto.offset.reset = latest` (kills C29)."""
    from kcm_bridge.consumer import split_properties

    _, tuning = split_properties({"auto.offset.reset": " latest "})
    assert tuning == {"auto.offset.reset": "latest"}


# -- metrics.py ----------------------------------------------------------------------------------------------------

def test_a_scraper_that_connects_and_says_nothing_does_not_hold_up_the_metrics_server_closing():
    """The handler threads are daemons: an idle connection must not keep the process from exiting (kills M04)."""
    from kcm_bridge.metrics import BridgeMetrics, serve

    server = serve(BridgeMetrics(), "127.0.0.1", 0, lambda: True)
    idle = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
    try:
        time.sleep(0.2)   # lets the server hand the connection to a handler thread (a shorter wait only weakens it)
        closing = threading.Thread(target=lambda: (server.shutdown(), server.server_close()), daemon=True)
        closing.start()
        closing.join(10)
        closed = not closing.is_alive()
    finally:
        idle.close()
    closing.join(10)
    assert closed, "closing the metrics server waited for an idle connection"


def test_closing_kafka_python_dead_letters_with_a_write_still_out_stops_the_producers_sender():
    """kafka-python's close() raises when its flush times out, before it stops its sender thread: the bridge's
    dead-letter producer (and the sandbox's receiver, through the same close_producer) force-closes the sender and
    closes the producer for good, within the time it was given."""
    from kafka.errors import KafkaTimeoutError

    from kcm_bridge.consumer import KafkaPythonDeadLetters
    from kcm_common.kafka import KafkaSettings

    calls = []

    class Sender:
        def force_close(self):
            calls.append("force_close")

        def join(self, timeout):
            calls.append(("join", timeout))

    class Producer:
        _sender = Sender()

        def close(self, timeout):
            calls.append(("close", timeout))
            if len(calls) == 1:
                raise KafkaTimeoutError("Timeout waiting for future")

    letters = KafkaPythonDeadLetters(KafkaSettings("127.0.0.1:9"))
    letters._producer = Producer()
    letters.close(0.5)
    assert calls == [("close", 0.5), "force_close", ("join", 0.5), ("close", 0)]


def test_a_request_found_failing_is_split_by_client_instance_each_kept_whole_and_in_order():
    """_isolate sends the parts in any order: they must share no client instance, and each instance's records keep
    the order read; records with neither instance nor key are not ordered, so each counts as one of its own."""
    from kcm_bridge.pipeline import _by_instance

    def part(instance, offset):
        return (b"", 1, instance, None, ("metrics", offset))

    parts = [part("a", 0), part("b", 1), part("a", 2), part(b"", 3), part("c", 4), part("b", 5), part(b"", 6)]
    first, second = _by_instance(parts)
    assert sorted(first + second, key=lambda p: p[4]) == parts
    assert {p[2] for p in first if p[2]}.isdisjoint(p[2] for p in second if p[2])
    for half in (first, second):
        assert [p[4][1] for p in half] == sorted(p[4][1] for p in half)   # in the order read
    assert [p[4][1] for p in first] == [0, 1, 2, 5]   # a and b: the first two of five keys (a, b, 3, c, 6)
    assert _by_instance([part("a", 0), part("a", 1)]) == [[part("a", 0), part("a", 1)]]   # one instance: whole
    assert [len(p) for p in _by_instance([part(b"", 0), part(b"", 1)])] == [1, 1]


# -- pipeline.py: isolating the records a collector keeps failing (_isolate), with a fake endpoint -------------------

class _VerdictEndpoint:
    """An endpoint whose `verdict(client names, call number)` is None (delivered) or a gRPC code name; UNAVAILABLE is
    retried as Endpoint.export retries it (quickly), asking `stop_retrying` after each failure. It answers empty
    requests."""

    name = "fake:4317"

    def __init__(self, verdict, bridge):
        self.verdict, self.bridge, self.calls, self.delivered = verdict, bridge, 0, []

    def export(self, request, give_up=None, stop_retrying=None):
        from kcm_common.otlp_export import Outcome

        names, attempt = request.decode().split(",")[:-1], 0
        while True:
            attempt += 1
            self.calls += 1
            code = self.verdict(names, self.calls)
            if code is None:
                self.delivered.append(names)
                return Outcome(True, attempt)
            if code != "UNAVAILABLE":
                return Outcome(False, attempt, error=code, detail="refused")
            if self.bridge._give_up() or (give_up is not None and give_up()):
                return Outcome(False, attempt, error=code, abandoned=True)
            if stop_retrying is not None and stop_retrying(attempt):
                return Outcome(False, attempt, error=code, detail="failing", stopped=True)
            time.sleep(0.01)

    def answers(self):
        return True


def _isolating(tmp_path, names, verdict, stop_after=5.0, poison_after_s=0.05, backoff_s=(0.01, 0.02),
               endpoint_class=_VerdictEndpoint, on_bridge=lambda bridge: None, traffic=True):
    """`_export` of one record per name (offsets in that order; a name, its own client instance, or (name, instance))
    through an `endpoint_class`, with a dead-letter topic; the shutdown deadline after `stop_after` s ends a stuck
    one. With `traffic`, another export thread's requests (of other clients) go every 10 ms meanwhile, delivered as
    `verdict` says. Returns the outcome, the endpoint and the dead letters as (name, reason)."""
    from kcm_bridge.pipeline import _BatchTicket

    config = _config(tmp_path, "127.0.0.1:9", "metrics", "127.0.0.1:9", "confluent-kafka", {
        ("delivery", "poison_after_s"): poison_after_s, ("delivery", "dead_letter_topic"): "dlq",
        ("retry", "initial_backoff_s"): backoff_s[0], ("retry", "max_backoff_s"): backoff_s[1]})
    named = [(name, name) if isinstance(name, str) else name for name in names]
    parts = [(f"{name},".encode(), 1, instance, Record("metrics", 0, index, None, name.encode(), []), ("metrics", 0))
             for index, (name, instance) in enumerate(named)]
    with _unstarted_bridge(config) as bridge:
        on_bridge(bridge)
        endpoint = endpoint_class(verdict, bridge)
        ticket = _BatchTicket()
        ticket.set_parts(1)
        timer = threading.Timer(stop_after, lambda: bridge.stop(at_once=True))
        timer.start()
        done = threading.Event()

        def other_thread():
            while not done.wait(0.01):
                if verdict(["~other"], 0) is None:
                    bridge._delivered_at[id(endpoint)] = time.monotonic()

        if traffic:
            threading.Thread(target=other_thread, daemon=True).start()
        try:
            outcome = bridge._export(endpoint, parts, ticket)
        finally:
            done.set()
            timer.cancel()
        letters = [(letter.record.value.decode(), letter.reason) for letter in bridge._letters_due]
    return outcome, endpoint, letters


@pytest.mark.parametrize("names", [["P", "A"], ["P", "A", "B"]])
def test_the_clients_after_a_failing_one_go_first_and_it_is_dead_lettered_after_failing_alone(tmp_path, names):
    """A part of one client instance that keeps failing goes behind the others, whatever its place in the batch
    (review 25, F1), and is set aside while other data keeps being taken (here by another export thread)."""
    outcome, endpoint, letters = _isolating(tmp_path, names, lambda sent, n: "UNAVAILABLE" if "P" in sent else None)
    assert outcome.delivered and not outcome.abandoned
    assert sorted(name for sent in endpoint.delivered for name in sent) == sorted(names[1:])
    assert letters == [("P", "failing-at-collector")]


def test_after_a_collector_failing_all_data_recovers_the_others_go_and_only_the_failing_one_is_set_aside(tmp_path):
    """The collector fails all data for a second (its memory limiter), so the batch is split down to single clients,
    the failing one first; once it recovers, the seven others are delivered (review 25, F1)."""
    start = time.monotonic()
    names = ["P"] + [f"c{i}" for i in range(1, 8)]
    outcome, endpoint, letters = _isolating(
        tmp_path, names, lambda sent, n: "UNAVAILABLE" if "P" in sent or time.monotonic() - start < 1.0 else None)
    assert sorted(name for sent in endpoint.delivered for name in sent) == sorted(names[1:])
    assert letters == [("P", "failing-at-collector")]


@pytest.mark.parametrize("seed", [25, 0, 7])
def test_a_collector_that_fails_some_requests_of_every_client_never_has_one_set_aside(tmp_path, seed):
    """No poison: requests of more than two records always fail, smaller ones pass one call in three (a rate limiter,
    a memory limiter near its limit). Every client fails now and then, none alone for `poison_after_s` (review 25,
    F2; 0.3 s here, some 20 attempts)."""
    names, luck, others = [f"c{i}" for i in range(8)], random.Random(seed), random.Random(seed + 1)

    def verdict(sent, n):   # the other thread's luck apart: this thread's failures are the same at every run
        if sent == ["~other"]:
            return "UNAVAILABLE" if others.random() < 2 / 3 else None
        return "UNAVAILABLE" if len(sent) > 2 or luck.random() < 2 / 3 else None

    outcome, endpoint, letters = _isolating(tmp_path, names, verdict, stop_after=10, poison_after_s=0.3)
    assert letters == []
    assert sorted(name for sent in endpoint.delivered for name in sent) == names


def test_a_collector_failing_all_data_has_nothing_set_aside_and_is_asked_at_a_retrys_pace(tmp_path):
    """Nothing delivered, nothing dead-lettered, whatever the time; rounds of parts that deliver nothing wait as a
    retry does, so the collector is not asked without pause."""
    outcome, endpoint, letters = _isolating(tmp_path, [f"c{i}" for i in range(8)], lambda sent, n: "UNAVAILABLE",
                                            stop_after=1.5, backoff_s=(0.2, 0.4))
    assert outcome.abandoned and letters == [] and endpoint.delivered == []
    assert endpoint.calls < 100   # some 60 with the rounds' waits; without them, 200 and more


def test_a_record_refused_as_invalid_inside_an_isolated_part_costs_only_itself(tmp_path):
    """A refusal for good of a part of several clients is split, as _export splits one (review 25, F3)."""
    def verdict(sent, n):
        if "P" in sent:
            return "UNAVAILABLE"
        return "INVALID_ARGUMENT" if "BAD" in sent else None

    names = ["P", "A", "B", "BAD", "C", "D", "E", "F"]
    outcome, endpoint, letters = _isolating(tmp_path, names, verdict)
    assert sorted(letters) == [("BAD", "refused-by-collector"), ("P", "failing-at-collector")]
    assert sorted(name for sent in endpoint.delivered for name in sent) == sorted(set(names) - {"P", "BAD"})


def test_a_halved_batch_with_a_failing_part_is_isolated_from_there_and_not_said_delivered(tmp_path, caplog):
    """Refused as too large (here: INVALID_ARGUMENT above four records), halved, and a half holding a failing client:
    it and every record after it are isolated by client instance; no line says the batch was delivered (review 25,
    F4)."""
    caplog.set_level(logging.WARNING, logger="kcm.bridge")

    def verdict(sent, n):
        if len(sent) > 4:
            return "INVALID_ARGUMENT"
        return "UNAVAILABLE" if "P" in sent else None

    names = ["A", "P", "B", "C", "D", "E", "F", "G"]
    outcome, endpoint, letters = _isolating(tmp_path, names, verdict)
    assert letters == [("P", "failing-at-collector")]
    assert sorted(name for sent in endpoint.delivered for name in sent) == sorted(set(names) - {"P"})
    said = [r.getMessage() for r in caplog.records if r.name == "kcm.bridge"]
    assert not any("was delivered in" in line for line in said), said
    assert any(line.endswith("the batch of 8 records was split by client instance: 7 delivered in 6 requests, "
                             "1 dead-lettered") for line in said), said


def test_a_healthy_client_failing_twice_after_the_collector_failed_all_data_is_not_set_aside(tmp_path):
    """The collector fails all data for a second (its memory limiter), so the batch is split to one client per part;
    then it takes data again but hovers: right after the first delivery the next client's request fails twice. Only
    failing for `poison_after_s` from a delivery of other data counts, not the time everything failed (review 25b,
    R1)."""
    start, state = time.monotonic(), {"delivered": False, "victim": None, "fails": 0}

    def verdict(sent, n):
        if time.monotonic() - start < 1.0:
            return "UNAVAILABLE"
        if state["delivered"] and state["victim"] is None and len(sent) == 1:
            state["victim"] = sent[0]
        if sent == [state["victim"]] and state["fails"] < 2:
            state["fails"] += 1
            return "UNAVAILABLE"
        state["delivered"] = True
        return None

    names = [f"c{i}" for i in range(8)]
    outcome, endpoint, letters = _isolating(tmp_path, names, verdict, traffic=False)
    assert state["fails"] == 2 and letters == []
    assert sorted(name for sent in endpoint.delivered for name in sent) == names


def test_an_outage_does_not_count_as_time_a_client_failed_while_the_collector_took_other_data(tmp_path):
    """c1's request meets an outage (the empty request fails too) just after another export thread delivered; it
    stays retrying through it, and its first request after fails once (the collector warming up): not set aside
    (review 25b, R1)."""
    state = {"outage_until": None, "warm": False}
    bridges = []

    class Answering(_VerdictEndpoint):
        def answers(self):
            return state["outage_until"] is None or time.monotonic() > state["outage_until"]

    def verdict(sent, n):
        if "P" in sent:
            return "UNAVAILABLE"
        if state["outage_until"] is None:
            bridges[0]._delivered_at[id(Answering.made)] = time.monotonic()   # the other export thread's batch
            state["outage_until"] = time.monotonic() + 0.3
        if time.monotonic() < state["outage_until"]:
            return "UNAVAILABLE"
        if not state["warm"]:
            state["warm"] = True
            return "UNAVAILABLE"
        return None

    def made(verdict, bridge):
        Answering.made = Answering(verdict, bridge)
        return Answering.made

    outcome, endpoint, letters = _isolating(tmp_path, ["P", "c1"], verdict, endpoint_class=made,
                                            on_bridge=bridges.append)
    assert state["warm"] and ("c1", "failing-at-collector") not in letters
    assert ["c1"] in endpoint.delivered


def test_splits_while_the_collector_fails_all_data_do_not_leave_a_failing_clients_neighbours_stuck(tmp_path):
    """32 clients, the failing one first; the collector fails all data for a second, then only its records. The
    splits of that second use up the budget, leaving parts of several clients; once other data is taken, the part
    holding the failing client is split again, down to it (review 25b, R2)."""
    start = time.monotonic()
    names = ["P"] + [f"c{i:02}" for i in range(1, 32)]
    outcome, endpoint, letters = _isolating(
        tmp_path, names, lambda sent, n: "UNAVAILABLE" if "P" in sent or time.monotonic() - start < 1.0 else None)
    assert sorted(name for sent in endpoint.delivered for name in sent) == sorted(names[1:])
    assert letters == [("P", "failing-at-collector")] and not outcome.abandoned


def test_records_refused_before_a_hand_over_are_not_said_to_leave_the_others_delivered(tmp_path, caplog):
    """Halved as too large, the first half refused down to BAD, the second holding a failing client: the line for
    BAD is written before _isolate has sent the others, so it must not say they were delivered (review 25b, R4)."""
    caplog.set_level(logging.WARNING, logger="kcm.bridge")

    def verdict(sent, n):
        if len(sent) > 4 or "BAD" in sent:
            return "INVALID_ARGUMENT"
        return "UNAVAILABLE" if "P" in sent else None

    outcome, endpoint, letters = _isolating(tmp_path, ["A", "BAD", "B", "C", "P", "D", "E", "F"], verdict)
    assert sorted(letters) == [("BAD", "refused-by-collector"), ("P", "failing-at-collector")]
    said = [r.getMessage() for r in caplog.records if r.name == "kcm.bridge"]
    assert not any("the others were delivered" in line for line in said), said
    assert any(line.endswith("the batch of 8 records was split by client instance: 6 delivered in 5 requests, "
                             "1 dead-lettered") for line in said), said


def _names(endpoint):
    return sorted(name for sent in endpoint.delivered for name in sent)


def test_a_failing_client_with_no_other_data_taken_meanwhile_is_retried_not_set_aside(tmp_path):
    """Once the others of its batch are delivered, nothing else reaches the collector (one export thread, or every
    later batch waiting for this one): that cannot be told from a collector failing all data, so it is retried."""
    outcome, endpoint, letters = _isolating(tmp_path, ["P", "A", "B"], lambda sent, n: "UNAVAILABLE" if "P" in sent
                                            else None, stop_after=1.5, traffic=False)
    assert outcome.abandoned and letters == [] and _names(endpoint) == ["A", "B"]


def test_one_delivery_then_a_collector_failing_all_data_sets_no_healthy_client_aside(tmp_path):
    """The collector takes one part, then fails all data for a second, then takes data again: the one delivery
    before the failure is not evidence for the failures during it (review 25c, A1)."""
    state = {"overload_from": None}

    def verdict(sent, n):
        if "P" in sent:
            return "UNAVAILABLE"
        if state["overload_from"] is not None:
            return "UNAVAILABLE" if time.monotonic() - state["overload_from"] < 1.0 else None
        if sent != ["~other"]:
            state["overload_from"] = time.monotonic()   # this one is taken; everything after fails for a second
        return None

    names = ["P"] + [f"c{i}" for i in range(1, 8)]
    outcome, endpoint, letters = _isolating(tmp_path, names, verdict, poison_after_s=0.3)
    assert letters == [("P", "failing-at-collector")]
    assert _names(endpoint) == names[1:]


def test_an_outage_while_a_client_waits_its_turn_starts_its_count_over(tmp_path):
    """c1 fails twice after others were delivered; then the collector is down for 0.6 s (the empty request fails
    too) while P is retried; once up, c1's first two requests fail (warming up): not set aside (review 25c, A2)."""
    state = {"c1_fails": 0, "down_until": None, "warm_fails": 0}

    class Answering(_VerdictEndpoint):
        def answers(self):
            return state["down_until"] is None or time.monotonic() > state["down_until"]

    def verdict(sent, n):
        if state["c1_fails"] == 2 and state["down_until"] is None:   # the next request after: the collector is down
            state["down_until"] = time.monotonic() + 0.6
        up = state["down_until"] is not None and time.monotonic() > state["down_until"]
        if "P" in sent:
            return "UNAVAILABLE"
        if sent == ["c1"] and state["down_until"] is None:
            state["c1_fails"] += 1
            return "UNAVAILABLE"
        if state["down_until"] is not None:
            if not up:
                return "UNAVAILABLE"
            if sent == ["c1"] and state["warm_fails"] < 2:
                state["warm_fails"] += 1
                return "UNAVAILABLE"
        return None

    outcome, endpoint, letters = _isolating(tmp_path, ["P", "c1", "c2", "c3"], verdict, poison_after_s=0.3,
                                            endpoint_class=Answering)
    assert state["warm_fails"] == 2
    assert letters == [("P", "failing-at-collector")]
    assert _names(endpoint) == ["c1", "c2", "c3"]


@pytest.mark.parametrize("seed", [25, 0])
def test_a_rate_limiter_with_rounds_longer_than_poison_after_s_sets_no_healthy_client_aside(tmp_path, seed):
    """16 clients and 20 ms per call, so that a round of parts lasts longer than `poison_after_s`: waiting its turn is
    not failing (review 25c, B)."""
    names, luck, others = [f"c{i:02}" for i in range(16)], random.Random(seed), random.Random(seed + 1)

    def verdict(sent, n):   # the other thread's luck apart: this thread's failures are the same at every run
        if sent == ["~other"]:
            return "UNAVAILABLE" if others.random() < 2 / 3 else None
        time.sleep(0.02)
        return "UNAVAILABLE" if len(sent) > 2 or luck.random() < 2 / 3 else None

    outcome, endpoint, letters = _isolating(tmp_path, names, verdict, stop_after=20, poison_after_s=0.3)
    assert letters == []
    assert _names(endpoint) == names


def test_a_client_failing_twice_after_waiting_its_turn_is_not_set_aside(tmp_path):
    """The collector takes requests of one record only and fails c00's first four; the others' turns take longer
    than `poison_after_s` (review 25c, B1)."""
    state = {"fails": 0}

    def verdict(sent, n):
        if sent == ["~other"]:
            return None
        time.sleep(0.03)
        if len(sent) > 1:
            return "UNAVAILABLE"
        if sent == ["c00"] and state["fails"] < 4:
            state["fails"] += 1
            return "UNAVAILABLE"
        return None

    names = [f"c{i:02}" for i in range(16)]
    outcome, endpoint, letters = _isolating(tmp_path, names, verdict, stop_after=20, poison_after_s=0.3)
    assert state["fails"] == 4 and letters == []
    assert _names(endpoint) == names


def test_after_a_collector_failing_all_data_an_invalid_record_costs_only_itself(tmp_path):
    """32 clients; the collector fails all data for a second (its splits spend the budget), then fails P's records
    retryably and refuses BAD's as invalid: BAD's part is split too, once other data is taken (review 25c, C)."""
    start = time.monotonic()

    def verdict(sent, n):
        if "P" in sent or time.monotonic() - start < 1.0:
            return "UNAVAILABLE"
        return "INVALID_ARGUMENT" if "BAD" in sent else None

    names = ["P"] + [f"c{i:02}" for i in range(1, 16)] + ["BAD"] + [f"c{i:02}" for i in range(17, 32)]
    outcome, endpoint, letters = _isolating(tmp_path, names, verdict)
    assert sorted(letters) == [("BAD", "refused-by-collector"), ("P", "failing-at-collector")]
    assert _names(endpoint) == sorted(set(names) - {"P", "BAD"})


def test_an_outage_starts_over_the_time_a_client_must_fail_while_other_data_is_taken(tmp_path):
    """Isolated, X fails its twenty attempts while other data is taken, within `poison_after_s`; then the collector
    is down for longer than that (the empty request fails too); once up, X fails twice more: the outage does not count
    towards the time, so X is not set aside, and goes once the collector takes it."""
    state = {"first": None, "down_from": None, "fails": 0}

    def down():
        return state["down_from"] is not None and time.monotonic() - state["down_from"] < 0.6

    class Answering(_VerdictEndpoint):
        def answers(self):
            return not down()

    def verdict(sent, n):
        if down():
            return "UNAVAILABLE"
        if sent != ["X"]:
            return None
        now = time.monotonic()
        state["first"] = state["first"] or now
        if now - state["first"] < 0.6:   # the whole request, until it is isolated after poison_after_s
            return "UNAVAILABLE"
        state["fails"] += 1
        if state["fails"] == 21:   # isolated, twenty failures in: the collector goes down
            state["down_from"] = now
        return "UNAVAILABLE" if state["fails"] <= 23 else None

    outcome, endpoint, letters = _isolating(tmp_path, ["X"], verdict, poison_after_s=0.5, endpoint_class=Answering)
    assert state["fails"] > 23 and letters == [] and _names(endpoint) == ["X"]


def test_a_client_split_off_beside_a_failing_one_does_not_inherit_its_count(tmp_path):
    """c001 shares every part with P down to the last split; alone, it then fails 8 requests of its own (a rate
    limiter's bad luck) while other data is taken: P's failures are not its own (review 25d, A)."""
    names = ["P"] + [f"c{i:03}" for i in range(1, 256)]
    state = {"c001": 0}

    def verdict(sent, n):
        if sent == ["~other"]:
            return None
        time.sleep(0.02)   # a slow collector: the descent to c001 alone takes longer than poison_after_s
        if "P" in sent:
            return "UNAVAILABLE"
        if sent == ["c001"] and state["c001"] < 8:
            state["c001"] += 1
            return "UNAVAILABLE"
        return None

    outcome, endpoint, letters = _isolating(tmp_path, names, verdict, stop_after=20, poison_after_s=0.3)
    assert state["c001"] == 8
    assert letters == [("P", "failing-at-collector")]
    assert _names(endpoint) == names[1:]


def test_failures_while_the_collector_fails_all_data_do_not_count_against_a_client(tmp_path):
    """c1 fails twice after others were taken (its count starts); then the collector fails all data for a second
    (its memory limiter; it answers empty requests) while c1 is retried; once it takes data again, c1's first two
    requests fail: not set aside (review 25d, B)."""
    state = {"c1_fails": 0, "overload_from": None, "warm_fails": 0}

    def verdict(sent, n):
        now = time.monotonic()
        if state["c1_fails"] == 2 and state["overload_from"] is None:
            state["overload_from"] = now
        if state["overload_from"] is not None and now - state["overload_from"] < 1.0:
            return "UNAVAILABLE"   # everything, the other thread's data too
        if "P" in sent:
            return "UNAVAILABLE"
        if sent == ["c1"] and state["overload_from"] is None:
            state["c1_fails"] += 1
            return "UNAVAILABLE"
        if state["overload_from"] is not None and sent == ["c1"] and state["warm_fails"] < 2:
            state["warm_fails"] += 1
            return "UNAVAILABLE"
        return None

    outcome, endpoint, letters = _isolating(tmp_path, ["P", "c1", "c2", "c3"], verdict, poison_after_s=0.3)
    assert state["warm_fails"] == 2
    assert letters == [("P", "failing-at-collector")]
    assert _names(endpoint) == ["c1", "c2", "c3"]


def test_failures_through_an_outage_do_not_count_against_a_client(tmp_path):
    """c1 is retried through an outage of 0.6 s; once up, its first three requests fail (warming up), with rounds
    longer than `poison_after_s` (P's requests take 0.2 s): the retries during the outage do not count (review 25d,
    C)."""
    state = {"down_until": None, "warm_fails": 0}

    class Answering(_VerdictEndpoint):
        def answers(self):
            return state["down_until"] is None or time.monotonic() > state["down_until"]

    def verdict(sent, n):
        now = time.monotonic()
        if sent == ["c1"] and state["down_until"] is None:
            state["down_until"] = now + 0.6
        down = state["down_until"] is not None and now <= state["down_until"]
        if down:
            return "UNAVAILABLE"
        if "P" in sent:
            time.sleep(0.2)
            return "UNAVAILABLE"
        if sent == ["c1"] and state["warm_fails"] < 3:
            state["warm_fails"] += 1
            return "UNAVAILABLE"
        return None

    outcome, endpoint, letters = _isolating(tmp_path, ["P", "c1", "c2", "c3"], verdict, stop_after=10,
                                            poison_after_s=0.3, endpoint_class=Answering)
    assert state["warm_fails"] == 3
    assert letters == [("P", "failing-at-collector")]
    assert _names(endpoint) == ["c1", "c2", "c3"]
