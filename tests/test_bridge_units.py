"""The bridge's pipeline, consumer adapters, Kafka health and metrics endpoint, unit by unit, with fakes (no broker,
no sandbox): behaviour a mutation review (session 24) found no test pinned. A docstring's "kills Xnn" names the
mutant of that review the test was checked against."""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.request

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_bridge.consumer import Record
from kcm_bridge.offsets import Ticket
from kcm_common import contract
from kcm_common.retry import RetryPolicy
from test_bridge_pipeline import _config, _FlakyDeadLetters, _push, _unstarted_bridge


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
