"""The Kafka consumer behind one small interface: confluent-kafka (default) or kafka-python.

Both consume as a classic consumer group, never auto-commit, and report partition moves through callbacks
that run inside `poll`, on the bridge's own thread. Both report Kafka rejecting the credentials or no broker
answering as KafkaUnavailableError, from `poll` and `check`, and keep retrying: the bridge decides what to log. A record
the client cannot read is handed on flagged (`Record.unreadable`), in its place, never raised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from kcm_common.errors import UserError
from kcm_common.kafka import (ADVERTISED_PROBE_S, CONSUMER_PROPERTIES, STOPPED_CHECKING, KafkaSettings, close_producer,
                              KafkaUnavailableError, advertised_brokers, denied_message, diagnose_failure,
                              rejected_message, step_past_unreadable, unreachable_advertised)
from kcm_common.librdkafka import librdkafka_config, message_headers
from kcm_common.pacing import PacedLog

log = logging.getLogger("kcm.bridge.consumer")

Partition = tuple[str, int]
PartitionsCallback = Callable[[list[Partition]], None]

# librdkafka prefetches up to 64 MiB by default, so its memory would grow with the backlog up to that. 16 MiB keeps
# the bridge fed (8 MiB let it wait for fetches on the benchmark) with memory the same for any backlog. A full
# prefetch queue postpones the next fetch by fetch.queue.backoff.ms, 1 s by default, which capped the bridge at one
# queue per second: it looks again soon instead.
_PREFETCH_KBYTES = 16384
_PREFETCH_BACKOFF_MS = 20
# librdkafka reconnects after 100 ms by default, and a broker rejecting the credentials is asked again 20 times a
# second (each attempt logged at ERROR). Once a second is prompt enough after a broker restart.
_RECONNECT_BACKOFF_MS = 1000
# A check that may be stopped (the bridge shutting down) asks Kafka in slices of this many seconds.
_CHECK_SLICE_S = 1.0
BACKENDS = ("confluent-kafka", "kafka-python")


class Record(NamedTuple):
    """One consumed record, the same for every backend."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    # Why the client could not read all of the record (a header name that is not UTF-8), or None. Such a record has
    # no headers; its key and value are as read, or both None when the client could read none of it (kafka-python).
    unreadable: str | None = None
    # Its Kafka timestamp in epoch milliseconds (CreateTime or LogAppendTime); negative or None when it has none. A
    # dead letter keeps it.
    timestamp: int | None = None


class Consumer(Protocol):
    """What the bridge needs from a Kafka consumer."""

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        """Records, or KafkaUnavailableError when the client reported that Kafka cannot be used and fetched none."""
    def check(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Return when Kafka answered a request with these settings; raise KafkaUnavailableError otherwise, and
        within about a second of `stop` being set (the bridge shutting down)."""
    def commit(self, offsets: Mapping[Partition, int]) -> None: ...
    def pause(self, partitions: list[Partition]) -> None: ...
    def resume(self, partitions: list[Partition]) -> None: ...
    def assignment(self) -> list[Partition]: ...
    def high_watermarks(self, partitions: list[Partition], ask_s: float = 0.0) -> dict[Partition, int]:
        """Each partition's high watermark: the last one its fetches reported, or with `ask_s` > 0 the brokers'
        answer within that many seconds in all (fetches stop while paused); partitions not known are left out."""
    def close(self) -> None: ...


class DeadLetterProducer(Protocol):
    def send(self, topic: str, record: Record, reason: str, on_done: Callable[[bool], None]) -> None: ...
    def flush(self, timeout_s: float) -> None: ...
    def close(self, timeout_s: float) -> None: ...


def split_properties(properties: Mapping[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """(TLS/SASL properties for KafkaSettings, consumer tuning by Kafka name with typed values)."""
    security, tuning = {}, {}
    for key, value in properties.items():
        if key not in CONSUMER_PROPERTIES:
            security[key] = value
            continue
        kind = CONSUMER_PROPERTIES[key][2]
        try:
            tuning[key] = kind(value.strip())
        except ValueError:
            raise UserError(f"client property {key} must be a whole number, not {value!r}") from None
    reset = tuning.get("auto.offset.reset")
    if reset is not None and reset not in ("earliest", "latest"):
        raise UserError(f"client property auto.offset.reset must be earliest or latest, not {reset!r}")
    return security, tuning


def open_consumer(backend: str, settings: KafkaSettings, tuning: Mapping[str, Any], group_id: str,
                  topics: list[str], on_assign: PartitionsCallback, on_revoke: PartitionsCallback) -> Consumer:
    """A subscribed consumer of `backend`; `on_revoke` also hears of partitions lost without a clean revoke."""
    if backend == "kafka-python":
        return KafkaPythonConsumer(settings, tuning, group_id, topics, on_assign, on_revoke)
    return ConfluentConsumer(settings, tuning, group_id, topics, on_assign, on_revoke)


def open_dead_letter_producer(backend: str, settings: KafkaSettings) -> DeadLetterProducer:
    if backend == "kafka-python":
        return KafkaPythonDeadLetters(settings)
    return ConfluentDeadLetters(settings)


def missing_topics_message(settings: KafkaSettings, topics: list[str]) -> str:
    """What to say when subscribed topics do not exist: a consumer then waits for them, consuming nothing."""
    return (f"the topic(s) {', '.join(topics)} do not exist on Kafka at {settings.bootstrap_servers}: check --topic "
            "(kafka.topics) for a misspelling, or create them; consuming starts once they exist")


def dead_letter_headers(record: Record, reason: str) -> list[tuple[str, bytes | None]]:
    """The original headers (null values too) plus where the record came from and why it could not be bridged."""
    return record.headers + [("kcm.dlq.reason", reason.encode()), ("kcm.dlq.topic", record.topic.encode()),
                             ("kcm.dlq.partition", str(record.partition).encode()),
                             ("kcm.dlq.offset", str(record.offset).encode())]


class ConfluentConsumer:
    """confluent-kafka (librdkafka): the fast default."""

    def __init__(self, settings: KafkaSettings, tuning: Mapping[str, Any], group_id: str, topics: list[str],
                 on_assign: PartitionsCallback, on_revoke: PartitionsCallback) -> None:
        import confluent_kafka

        self._tp = confluent_kafka.TopicPartition
        self._error = confluent_kafka.KafkaError
        self._exception = confluent_kafka.KafkaException
        self._settings, self._topics = settings, topics
        self._unreadable_codes = (confluent_kafka.KafkaError._BAD_COMPRESSION,  # noqa: SLF001
                                  confluent_kafka.KafkaError._BAD_MSG)  # noqa: SLF001
        self._stepped: dict[Partition, int] = {}   # where stepping past an unreadable batch got to
        self._problem: str | None = None   # the last report that Kafka cannot be used, until a check succeeds
        self._misadvertised: str | None = None   # what the last check found of unreachable advertised brokers
        self._new_problem = False
        self._broker_failures = PacedLog(log, logging.WARNING, period_s=60.0)
        # Other error events may come once per connection attempt too (an address that answers, but not as Kafka).
        self._other_errors = PacedLog(log, logging.WARNING, period_s=60.0)
        self._broker_failure: str | None = None   # a broker connection failed during the last serve of events
        # The group refused by an ACL: said at every check until a join succeeds (librdkafka keeps trying), since no
        # request of the check itself would tell.
        self._group_denied: str | None = None
        self._group_id = group_id
        self._answered = False   # Kafka answered a check since the start
        self._ask_from = 0   # where the next round of watermark requests starts
        config = librdkafka_config(settings)
        config.update({"group.id": group_id, "enable.auto.commit": False, "enable.auto.offset.store": False,
                       "auto.offset.reset": "earliest", "enable.partition.eof": False,
                       "queued.max.messages.kbytes": _PREFETCH_KBYTES, "fetch.queue.backoff.ms": _PREFETCH_BACKOFF_MS,
                       "reconnect.backoff.ms": _RECONNECT_BACKOFF_MS, "error_cb": self._on_error,
                       "logger": _LIBRDKAFKA_LOG})
        config.update({CONSUMER_PROPERTIES[key][1]: value for key, value in tuning.items()})
        try:
            self._consumer = confluent_kafka.Consumer(config)
        except confluent_kafka.KafkaException as exc:
            raise UserError(f"the Kafka consumer rejected its settings: {exc.args[0].str().strip()}") from None

        def assigned(_: Any, partitions: list[Any]) -> None:
            self._group_denied = None   # joined: the group is granted
            on_assign([(p.topic, p.partition) for p in partitions])

        def revoked(_: Any, partitions: list[Any]) -> None:
            on_revoke([(p.topic, p.partition) for p in partitions])

        self._consumer.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def _on_error(self, error: Any) -> None:
        """librdkafka's error events, served inside `consume`; the ones meaning Kafka cannot be used are kept."""
        if error.code() == self._error._AUTHENTICATION:  # noqa: SLF001 (librdkafka's local error codes)
            self._problem = rejected_message(self._settings, error.str())
        elif error.code() == self._error.GROUP_AUTHORIZATION_FAILED:
            self._problem = self._group_denied = denied_message(
                self._settings, f"READ on group {self._group_id}", error.str())
        elif error.code() == self._error.TOPIC_AUTHORIZATION_FAILED:
            self._problem = denied_message(self._settings, f"READ on topic(s) {', '.join(self._topics)}", error.str())
        elif error.code() == self._error.UNKNOWN_TOPIC_OR_PART:   # "Subscribed topic not available: …"
            missing = [name for name in self._topics if name in error.str()] or self._topics
            self._problem = missing_topics_message(self._settings, missing)
        elif error.code() == self._error._ALL_BROKERS_DOWN:  # noqa: SLF001
            self._problem = self._misadvertised or (
                f"cannot reach Kafka at {self._settings.bootstrap_servers} ({error.str()}): "
                "check that the brokers are up and reachable from here")
        elif error.fatal():
            raise RuntimeError(f"Kafka consumer failed: {error.str()}")
        elif error.code() in (self._error._TRANSPORT, self._error._RESOLVE):  # noqa: SLF001
            # One per failed connection attempt. A whole outage is reported once per backoff period, from
            # _ALL_BROKERS_DOWN and `check`; one broker that cannot be reached while Kafka answers (the partitions
            # it leads wait) is said after the poll that served it, at most once a minute. Not a connection that
            # was up and closed (librdkafka reconnects at once), nor a bootstrap connection, which leads nothing.
            text = error.str()
            if "/bootstrap" not in text and "Disconnected" not in text:
                self._broker_failure = text
            return
        else:
            self._other_errors("Kafka consumer: %s", error.str())
            return
        self._new_problem = True

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        messages = self._consumer.consume(max_records, timeout_s)
        records = []
        for m in messages:
            if m.error() is not None:
                if m.error().code() in self._unreadable_codes and m.offset() >= 0:
                    records.append(self._step_past(m))
                continue
            self._stepped.pop((m.topic(), m.partition()), None)
            try:
                headers = message_headers(m) or []
            except Exception as err:  # noqa: BLE001 (a record that cannot be read costs that record, not the fetch)
                records.append(_unreadable(m, err))
                continue
            records.append(Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(), headers, None,
                                  m.timestamp()[1]))
        if len(records) < len(messages):
            for error in (m.error() for m in messages if m.error() is not None):
                if error.code() not in self._unreadable_codes:
                    self._on_error(error)
        if self._broker_failure is not None:
            if self._answered and self._problem is None:  # not part of an outage, which is reported as one
                self._broker_failures("Kafka consumer: a broker cannot be reached (%s): the partitions it leads, if "
                                      "any, wait until it is back", self._broker_failure)
            self._broker_failure = None
        if self._new_problem and not records:
            self._new_problem = False
            raise KafkaUnavailableError(self._problem)
        return records

    def _step_past(self, message: Any) -> Record:
        """A record of a batch librdkafka cannot decompress or parse, flagged, and the partition sought past it:
        librdkafka fetches the batch again and again otherwise. Each record costs itself (counted, skipped), never
        its partition. Stepped one offset at a time: a batch of several is reported at its first offset each time."""
        partition = (message.topic(), message.partition())
        offset = max(message.offset(), self._stepped.get(partition, -1))
        self._stepped[partition] = offset + 1
        try:
            self._consumer.seek(self._tp(*partition, offset + 1))
        except self._exception:   # revoked meanwhile: its next owner reads the batch again
            pass
        return Record(*partition, offset, None, None, [], f"librdkafka cannot read it ({message.error().str()})",
                      None)

    def check(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        # A metadata request needs a connection that passed authentication: it proves the credentials work.
        deadline = time.monotonic() + timeout_s
        while True:
            # Asked in slices, so a shutdown waits for one slice, not for a Kafka that never answers.
            asked, left = time.monotonic(), max(0.0, deadline - time.monotonic())
            wait = left if stop is None else min(left, _CHECK_SLICE_S)
            try:
                metadata = self._consumer.list_topics(None if len(self._topics) > 1 else self._topics[0],
                                                      timeout=wait)
                break
            except self._exception as exc:
                if stop is not None and stop.is_set():
                    raise KafkaUnavailableError(STOPPED_CHECKING) from None
                # A slice waited out (librdkafka then names the connection's state, _TRANSPORT for a silent
                # broker, not _TIMED_OUT) is asked again; an answer given sooner is the check's outcome.
                if stop is not None and time.monotonic() < deadline and time.monotonic() - asked >= wait * 0.9:
                    continue
                # Error events are served by `consume` only: before the first poll the cause may not be known yet.
                raise KafkaUnavailableError(self._problem or str(diagnose_failure(self._settings, exc))) from None
        # The bootstrap connection answers metadata; consuming needs the brokers it names (advertised.listeners).
        advertised = [f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()]
        hint = unreachable_advertised(self._settings.bootstrap_servers, advertised,
                                      max(ADVERTISED_PROBE_S, deadline - time.monotonic()))
        self._misadvertised = hint and f"Kafka at {self._settings.bootstrap_servers} answers, but {hint}"
        if self._misadvertised:
            raise KafkaUnavailableError(self._misadvertised)
        # Answering metadata proves the credentials, not the ACLs: a topic or group refused consumes nothing.
        refused = [name for name in self._topics if name in metadata.topics and metadata.topics[name].error is not None
                   and metadata.topics[name].error.code() == self._error.TOPIC_AUTHORIZATION_FAILED]
        if refused:
            raise KafkaUnavailableError(denied_message(self._settings, f"READ on topic(s) {', '.join(refused)}",
                                                       "topic authorization failed"))
        # A subscribed topic that does not exist (a misspelt --topic) is not an error librdkafka repeats: it says so
        # once and waits, so the check asks every period until it exists.
        missing = [name for name in self._topics if name not in metadata.topics or (
            metadata.topics[name].error is not None
            and metadata.topics[name].error.code() == self._error.UNKNOWN_TOPIC_OR_PART)]
        if missing:
            raise KafkaUnavailableError(missing_topics_message(self._settings, missing))
        if self._group_denied is not None:
            raise KafkaUnavailableError(self._group_denied)
        self._problem, self._new_problem, self._answered = None, False, True

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        self._consumer.commit(offsets=[self._tp(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)

    def pause(self, partitions: list[Partition]) -> None:
        self._consumer.pause([self._tp(t, p) for t, p in partitions])

    def resume(self, partitions: list[Partition]) -> None:
        self._consumer.resume([self._tp(t, p) for t, p in partitions])

    def assignment(self) -> list[Partition]:
        return [(p.topic, p.partition) for p in self._consumer.assignment()]

    def high_watermarks(self, partitions: list[Partition], ask_s: float = 0.0) -> dict[Partition, int]:
        deadline = time.monotonic() + ask_s
        # Asked one by one: start where the last interval's budget ran out, so every partition gets its turn.
        self._ask_from = self._ask_from % len(partitions) if partitions else 0
        order = partitions[self._ask_from:] + partitions[:self._ask_from]
        marks = {}
        for index, (topic, partition) in enumerate(order):
            tp, known = self._tp(topic, partition), None
            remaining = deadline - time.monotonic()
            if remaining > 0:
                try:
                    known = self._consumer.get_watermark_offsets(tp, timeout=remaining)
                except self._exception:  # no answer in time, or no leader: the last fetched value below
                    known = None
                if deadline - time.monotonic() <= 0:
                    self._ask_from += index + 1
            try:
                known = known or self._consumer.get_watermark_offsets(tp, cached=True)
            except self._exception:
                continue
            if known is not None and known[1] >= 0:
                marks[topic, partition] = known[1]
        return marks

    def close(self) -> None:
        self._consumer.close()


def _unreadable(message: Any, err: Exception) -> Record:
    """A message whose headers confluent-kafka cannot read (SystemError for a header name that is not UTF-8, which
    any producer may write), flagged. Never ask for its headers again: the message keeps the broken list, and
    returns it without an error the second time (reading it crashes the process)."""
    cause = err.__cause__ or err
    why = ("a header name is not UTF-8" if isinstance(cause, UnicodeDecodeError)
           else f"its headers cannot be read ({type(cause).__name__}: {cause})")
    return Record(message.topic(), message.partition(), message.offset(), message.key(), message.value(), [], why,
                  message.timestamp()[1])


def _timestamp(record: Record) -> int | None:
    """The record's own timestamp for its dead letter; None (the producer's clock) when it has none."""
    return record.timestamp if record.timestamp is not None and record.timestamp >= 0 else None


class KafkaPythonConsumer:
    """kafka-python: pure Python (fast CRCs with the crc32c package), selectable with --kafka-client.

    Its client connects while it is built, so it is built by `check`, and built again after it failed.
    """

    def __init__(self, settings: KafkaSettings, tuning: Mapping[str, Any], group_id: str, topics: list[str],
                 on_assign: PartitionsCallback, on_revoke: PartitionsCallback) -> None:
        from kafka import ConsumerRebalanceListener
        from kafka.structs import OffsetAndMetadata, TopicPartition

        self._tp, self._offset = TopicPartition, OffsetAndMetadata
        self._settings, self._topics, self._on_revoke = settings, topics, on_revoke
        self._options = {"group_id": group_id, "enable_auto_commit": False, "auto_offset_reset": "earliest",
                         "fetch_max_wait_ms": 100, **settings.client_options()}
        unsupported = [key for key in tuning if not CONSUMER_PROPERTIES[key][0]]
        if unsupported:
            raise UserError(f"client property {unsupported[0]} is only supported with --kafka-client confluent-kafka")
        self._options.update({CONSUMER_PROPERTIES[key][0]: value for key, value in tuning.items()})
        self._consumer: Any = None

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                on_revoke([(p.topic, p.partition) for p in revoked])

            def on_partitions_assigned(self, assigned: Any) -> None:
                on_assign([(p.topic, p.partition) for p in assigned])

        self._listener = Listener()
        self._timeout_s = 10.0
        self._coordinator_lost_since: float | None = None

    def check(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Build the client if there is none, then find the group coordinator, all within `timeout_s`: the client
        existing proves nothing, and what poll and commit wait for is the coordinator (its loss is what fails).
        `stop` set ends the search for the coordinator within about a second (building the client is not cut)."""
        from kafka.errors import GroupAuthorizationFailedError, KafkaError

        self._timeout_s = timeout_s
        deadline = time.monotonic() + timeout_s
        if self._consumer is None:
            self._connect(timeout_s)
        bootstrap = self._settings.bootstrap_servers
        try:
            while True:
                left = max(0.0, deadline - time.monotonic())
                found = self._consumer._coordinator.ensure_coordinator_ready(   # noqa: SLF001 (no public handle)
                    timeout_ms=int((left if stop is None else min(left, _CHECK_SLICE_S)) * 1000))
                if found or stop is None or time.monotonic() >= deadline:
                    break
                if stop.is_set():
                    raise KafkaUnavailableError(STOPPED_CHECKING)
            problem = "" if found else (f"cannot reach Kafka's group coordinator via {bootstrap} within "
                                        f"{timeout_s:g}s: check that the brokers are up and reachable from here")
        except GroupAuthorizationFailedError as exc:   # retried like silence, saying which ACL is missing
            raise KafkaUnavailableError(denied_message(self._settings, f"READ on group {self._options['group_id']}",
                                                       str(exc))) from None
        except KafkaError as exc:   # another refusal: retried like silence
            problem = f"Kafka at {bootstrap} did not name the group's coordinator ({type(exc).__name__}: {exc})"
        if not problem:
            fresh = self._refresh_metadata(deadline)   # what the ACLs say now (granted since?), and the topics
            self._check_topics_granted()
            if fresh:
                self._check_topics_exist()
        if problem:
            # The bootstrap connection answers; the brokers it names (advertised.listeners) may be out of reach.
            hint = unreachable_advertised(bootstrap, advertised_brokers(self._consumer), ADVERTISED_PROBE_S)
            raise KafkaUnavailableError(f"Kafka at {bootstrap} answers, but {hint}" if hint else problem)
        self._coordinator_lost_since = None

    def _refresh_metadata(self, deadline: float) -> bool:
        """Ask for the subscribed topics' metadata; whether a fresh answer came in time."""
        from kafka.errors import KafkaError, TopicAuthorizationFailedError, UnknownTopicOrPartitionError

        consumer = self._consumer   # kafka-python's own blocking refresh (`topics()`) has no timeout
        future = consumer._cluster.request_update()   # noqa: SLF001
        try:
            consumer._net.run(consumer._manager.wait_for, future,   # noqa: SLF001
                              max(0, int((deadline - time.monotonic()) * 1000)))
        except TopicAuthorizationFailedError:
            self._check_topics_granted(refused_all=True)
        except UnknownTopicOrPartitionError:   # an answer: the one topic asked for does not exist
            return True
        except KafkaError:   # no fresh answer in time: the last one is judged, for the ACLs only
            return False
        return True

    def _check_topics_granted(self, refused_all: bool = False) -> None:
        """Raise unless the last metadata answered every subscribed topic: kafka-python assigns a topic its ACLs
        refuse nothing, and says nothing. Its client goes too: once granted, only a new one is assigned the topic."""
        cluster = self._consumer._cluster   # noqa: SLF001 (kafka-python keeps what its metadata refused here)
        refused = sorted(set(self._topics) & set(getattr(cluster, "unauthorized_topics", ())))
        if refused or refused_all:
            refused = refused or sorted(self._topics)
            self._lose_client()
            raise KafkaUnavailableError(denied_message(self._settings, f"READ on topic(s) {', '.join(refused)}",
                                                       "topic authorization failed"))

    def _check_topics_exist(self) -> None:
        """Raise when the metadata just asked for lacks a subscribed topic: kafka-python waits for it, consuming
        nothing, and says so only in its own log. Its client goes too: the group it joined assigned nothing of the
        topic, and a new client joins again once the topic exists."""
        cluster = self._consumer._cluster   # noqa: SLF001
        missing = sorted(set(self._topics) - cluster.topics() - set(getattr(cluster, "unauthorized_topics", ())))
        if missing:
            self._lose_client()
            raise KafkaUnavailableError(missing_topics_message(self._settings, missing))

    def _connect(self, timeout_s: float) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError, SaslAuthenticationFailedError

        try:
            self._consumer = KafkaConsumer(**self._options, bootstrap_timeout_ms=int(timeout_s * 1000))
        except SaslAuthenticationFailedError as exc:
            raise KafkaUnavailableError(rejected_message(self._settings, str(exc))) from None
        except KafkaError as exc:
            # Unreachable: retried; kafka-python refusing its settings: a UserError, which stops the bridge.
            raise diagnose_failure(self._settings, exc) from None
        # No auto-creation (librdkafka's consumer does none either): a misspelt topic must be reported, not made.
        # kafka-python 3.0 does not hand its own allow_auto_create_topics to the metadata it asks for.
        self._consumer._cluster.config["allow_auto_create_topics"] = False   # noqa: SLF001
        self._consumer.subscribe(self._topics, listener=self._listener)

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        from kafka.errors import CorruptRecordError, KafkaError, SaslAuthenticationFailedError

        if self._consumer is None:
            raise KafkaUnavailableError(f"not connected to Kafka at {self._settings.bootstrap_servers}")
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            # A record it cannot parse is not an outage: stepped past, it is handed on flagged.
            if isinstance(exc, CorruptRecordError) and (skipped := self._skip_corrupt(exc)) is not None:
                return [skipped]
            self._lose_client()
            if isinstance(exc, SaslAuthenticationFailedError):
                raise KafkaUnavailableError(rejected_message(self._settings, str(exc))) from None
            raise diagnose_failure(self._settings, exc) from None
        except Exception as exc:  # noqa: BLE001 (a batch that does not decompress: gzip, zstd, lz4 raise their own)
            if (skipped := self._skip_corrupt(exc)) is not None:
                return [skipped]
            raise
        if not batches:
            self._check_coordinator()
            self._check_topics_granted()
        return [Record(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or ()), None, r.timestamp)
                for records in batches.values() for r in records]

    def _lose_client(self) -> None:
        # Its partitions are as good as lost (the next owner re-reads what was not committed); `check` builds a new
        # client, which joins the group again.
        self._on_revoke(self.assignment())   # before closing: what was exported may still be committed
        self.close()
        self._consumer = None

    def _skip_corrupt(self, exc: Exception) -> Record | None:
        """Step past the record kafka-python cannot parse (a header name that is not UTF-8, a failed CRC), which it
        would raise for on every poll, and hand it on flagged; None when the partition cannot be told."""
        if (skipped := step_past_unreadable(self._consumer, self._timeout_s)) is None:
            return None
        tp, offset = skipped
        return Record(tp.topic, tp.partition, offset, None, None, [],
                      f"kafka-python cannot read it ({exc}); it cannot be dead-lettered with this client, which "
                      "reads nothing of such a record (confluent-kafka can)")

    def _check_coordinator(self) -> None:
        # kafka-python's poll keeps reconnecting in silence while the brokers are down: the group coordinator staying
        # unknown is what tells (and a commit could not succeed without it).
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None or not coordinator.coordinator_unknown():
            self._coordinator_lost_since = None
            return
        now = time.monotonic()
        if self._coordinator_lost_since is None:
            self._coordinator_lost_since = now
        elif now - self._coordinator_lost_since >= self._timeout_s:
            raise KafkaUnavailableError(
                f"cannot reach Kafka's group coordinator via {self._settings.bootstrap_servers} for "
                f"{now - self._coordinator_lost_since:.0f}s: check that the brokers are up and reachable from here")

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        if self._consumer is None:
            raise KafkaUnavailableError("not connected to Kafka")
        # Bounded by connect_timeout_s, not kafka-python's request_timeout_ms (30 s): it waits on this thread.
        self._consumer.commit({self._tp(t, p): self._offset(o, "", -1) for (t, p), o in offsets.items()},
                              timeout_ms=int(self._timeout_s * 1000))

    def pause(self, partitions: list[Partition]) -> None:
        if self._consumer is not None:
            self._consumer.pause(*(self._tp(t, p) for t, p in partitions))

    def resume(self, partitions: list[Partition]) -> None:
        if self._consumer is not None:
            self._consumer.resume(*(self._tp(t, p) for t, p in partitions))

    def assignment(self) -> list[Partition]:
        if self._consumer is None:
            return []
        return [(p.topic, p.partition) for p in self._consumer.assignment()]

    def high_watermarks(self, partitions: list[Partition], ask_s: float = 0.0) -> dict[Partition, int]:
        if self._consumer is None:
            return {}
        asked: dict[Any, int] = {}
        if ask_s > 0 and partitions:
            try:
                asked = self._consumer.end_offsets([self._tp(*p) for p in partitions], timeout_ms=int(ask_s * 1000))
            except Exception:  # noqa: BLE001 (a partition without a leader raises KeyError in 3.0.12; only a metric)
                asked = {}
        marks = {}
        for partition in partitions:
            high = asked.get(self._tp(*partition))
            if high is None:
                try:
                    high = self._consumer.highwater(self._tp(*partition))
                except Exception:  # noqa: BLE001 (IllegalStateError once it is no longer assigned)
                    high = None
            if high is not None and high >= 0:
                marks[partition] = high
        return marks

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)


def _drop_connection_failures(record: logging.LogRecord) -> bool:
    # librdkafka logs every failed connection attempt at ERROR ("FAIL"); each also arrives as an error event,
    # which the bridge reports once per backoff period.
    return not (record.args and record.args[0] == "FAIL")


_LIBRDKAFKA_LOG = logging.getLogger("kcm.bridge.librdkafka")
_LIBRDKAFKA_LOG.addFilter(_drop_connection_failures)


_DEAD_LETTER_MAX_BYTES = 64 * 1024 * 1024
# The receiver writes the metrics topic zstd-compressed, and the records most likely to be dead-lettered are large
# ones a collector refused: written uncompressed, one that fit the metrics topic could exceed a dead-letter topic of
# the same max.message.bytes, and its partition would never be committed past it again.
DEAD_LETTER_COMPRESSION = "zstd"


# A refusing dead-letter topic fails every letter on every retry: one line per period, the metric counts each.
_dead_letter_failure = PacedLog(log, logging.ERROR)


def _dead_letter_failed(record: Record, topic: str, why: str) -> None:
    _dead_letter_failure("dead-lettering %s/%d@%d to %s failed: %s; retrying with backoff, the partition is not "
                         "committed past it (a record too large for the topic needs a larger max.message.bytes there)",
                         record.topic, record.partition, record.offset, topic, why)


class ConfluentDeadLetters:
    def __init__(self, settings: KafkaSettings) -> None:
        import confluent_kafka

        self._exception = confluent_kafka.KafkaException
        # A dead letter carries a record as large as the metrics topic holds, plus headers: the topic decides.
        try:
            self._producer = confluent_kafka.Producer({**librdkafka_config(settings), "enable.idempotence": False,
                                                       "linger.ms": 20, "reconnect.backoff.ms": _RECONNECT_BACKOFF_MS,
                                                       "message.max.bytes": _DEAD_LETTER_MAX_BYTES,
                                                       "compression.type": DEAD_LETTER_COMPRESSION,
                                                       "logger": _LIBRDKAFKA_LOG})
        except confluent_kafka.KafkaException as exc:
            raise UserError("the Kafka dead-letter producer rejected its settings: "
                            f"{exc.args[0].str().strip()}") from None

    def send(self, topic: str, record: Record, reason: str, on_done: Callable[[bool], None]) -> None:
        def delivered(error: Any, _: Any) -> None:
            if error is not None:
                _dead_letter_failed(record, topic, error.str())
            on_done(error is None)

        try:
            self._producer.produce(topic, value=record.value, key=record.key, timestamp=_timestamp(record) or 0,
                                   headers=dead_letter_headers(record, reason), on_delivery=delivered)
        except (BufferError, self._exception) as exc:   # a full local queue, or a record the client refuses
            _dead_letter_failed(record, topic, exc.args[0].str() if isinstance(exc, self._exception) else str(exc))
            on_done(False)
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> None:
        self._producer.poll(0)
        if timeout_s > 0:
            self._producer.flush(timeout_s)

    def close(self, timeout_s: float) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        producer.flush(timeout_s)
        # Writes still out stay unwritten, and their records uncommitted. librdkafka keeps its connections until the
        # client is destroyed: purge what is left so destroying it does not wait for a broker that is gone.
        producer.purge()
        producer.flush(0)
        del producer


class KafkaPythonDeadLetters:
    """Built on the first dead letter: kafka-python connects while it builds, and by then the consumer has."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._options = settings.client_options()
        self._producer: Any = None

    def send(self, topic: str, record: Record, reason: str, on_done: Callable[[bool], None]) -> None:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        try:
            if self._producer is None:
                # A short block: a missing topic must not hold the consuming thread; the write is retried later.
                self._producer = KafkaProducer(linger_ms=20, max_request_size=_DEAD_LETTER_MAX_BYTES,
                                               compression_type=DEAD_LETTER_COMPRESSION, max_block_ms=200,
                                               **self._options)
            # kafka-python's producer takes no null header value (TypeError): those headers are left out.
            headers = [(name, value) for name, value in dead_letter_headers(record, reason) if value is not None]
            future = self._producer.send(topic, value=record.value, key=record.key, timestamp_ms=_timestamp(record),
                                         headers=headers)
        except KafkaError as exc:   # cannot connect, a record too large, no metadata within max_block_ms
            _dead_letter_failed(record, topic, str(exc))
            on_done(False)
            return
        future.add_callback(lambda _: on_done(True))
        future.add_errback(lambda error: (_dead_letter_failed(record, topic, str(error)), on_done(False)))

    def flush(self, timeout_s: float) -> None:
        from kafka.errors import KafkaError

        if timeout_s > 0 and self._producer is not None:
            try:
                self._producer.flush(timeout_s)
            except KafkaError:   # kafka-python raises when a write is still out: that write reports on its own
                pass

    def close(self, timeout_s: float) -> None:
        if self._producer is not None:   # writes still out stay unwritten, and their records uncommitted
            close_producer(self._producer, timeout_s)
