"""GetTelemetrySubscriptions and PushTelemetry answer as Apache Kafka 4.x's ClientMetricsManager does."""

from __future__ import annotations

import tracemalloc
import uuid

import pytest
from payloads import client_metrics

from kcm_common.contract import compress
from kcm_sandbox import telemetry
from kcm_common.client_metrics import OP_SET
from kcm_common.codes import (
    INVALID_RECORD,
    INVALID_REQUEST,
    TELEMETRY_TOO_LARGE,
    THROTTLING_QUOTA_EXCEEDED,
    UNKNOWN_SUBSCRIPTION_ID,
    UNSUPPORTED_COMPRESSION_TYPE,
)
from kcm_sandbox.store import SubscriptionStore
from kcm_sandbox.telemetry import (
    ClientIdentity,
    TelemetryManager,
    java_host_address,
    kafka_uuid_text,
    subscription_id,
)

PAYMENTS = ClientIdentity("payments-producer", "librdkafka", "2.6.1", "10.0.0.7", 40001)
JAVA = ClientIdentity("orders-consumer", "apache-kafka-java", "4.0.0", "10.0.0.8", 40002)
METRICS = client_metrics().SerializeToString()


class FakeClock:
    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds

    def advance_ms(self, ms: float) -> None:
        self.seconds += ms / 1000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> SubscriptionStore:
    return SubscriptionStore()


@pytest.fixture
def manager(store: SubscriptionStore, clock: FakeClock) -> TelemetryManager:
    return TelemetryManager(store, clock=clock)


def subscribe(store: SubscriptionStore, name: str, **configs: str) -> None:
    store.incremental_alter(name, [(key.replace("_", "."), OP_SET, value) for key, value in configs.items()])


# --- GetTelemetrySubscriptions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [None, uuid.UUID(int=0)])
def test_get_with_a_zero_instance_id_assigns_a_new_one(manager, requested):
    result = manager.get_subscriptions(requested, PAYMENTS)

    assert result.error_code == 0
    assert result.client_instance_id not in (uuid.UUID(int=0), uuid.UUID(int=1))
    assert not kafka_uuid_text(result.client_instance_id).startswith("-")


def test_new_instance_ids_skip_reserved_ids_and_ids_whose_kafka_text_starts_with_a_dash(manager, monkeypatch):
    dash = uuid.UUID(bytes=b"\xf8" + bytes(15))
    usable = uuid.UUID(bytes=b"\x01" * 16)
    candidates = iter([uuid.UUID(int=0), uuid.UUID(int=1), dash, usable])
    monkeypatch.setattr(telemetry.uuid, "uuid4", lambda: next(candidates))

    assert kafka_uuid_text(dash).startswith("-")
    assert manager.get_subscriptions(None, PAYMENTS).client_instance_id == usable


def test_get_answers_the_brokers_fixed_facts(store, manager):
    subscribe(store, "all", metrics="org.apache.kafka.producer.", interval_ms="60000")

    result = manager.get_subscriptions(None, PAYMENTS)

    assert result.accepted_compression_types == [4, 3, 1, 2]
    assert (result.telemetry_max_bytes, result.delta_temporality, result.throttle_time_ms) == (1048576, True, 0)
    assert (result.push_interval_ms, result.requested_metrics) == (60000, ["org.apache.kafka.producer."])


def test_get_keeps_a_known_instance_id(manager):
    client = uuid.uuid4()

    assert manager.get_subscriptions(client, PAYMENTS).client_instance_id == client


def test_configured_compression_and_max_bytes_are_advertised(store, clock):
    manager = TelemetryManager(store, accepted_compression=[1], telemetry_max_bytes=4096, clock=clock)

    result = manager.get_subscriptions(None, PAYMENTS)

    assert (result.accepted_compression_types, result.telemetry_max_bytes) == ([1], 4096)


# --- matching, union and interval ---------------------------------------------------------------------------------


def test_a_client_no_subscription_matches_gets_the_default_interval_and_no_metrics(store, manager):
    subscribe(store, "java-only", metrics="*", interval_ms="1000", match="client_software_name=apache-kafka-java")

    result = manager.get_subscriptions(None, PAYMENTS)

    assert (result.push_interval_ms, result.requested_metrics) == (300000, [])


def test_an_empty_match_list_matches_every_client(store, manager):
    subscribe(store, "everyone", metrics="a.")

    assert manager.get_subscriptions(None, PAYMENTS).requested_metrics == ["a."]
    assert manager.get_subscriptions(None, JAVA).requested_metrics == ["a."]


def test_every_match_entry_must_match(store, manager):
    subscribe(store, "both", metrics="a.", match="client_id=payments-.*,client_software_name=apache-kafka-java")

    assert manager.get_subscriptions(None, PAYMENTS).requested_metrics == []
    assert manager.get_subscriptions(None, JAVA).requested_metrics == []


@pytest.mark.parametrize(
    ("match", "matched"),
    [
        ("client_id=payments-.*", True),
        ("client_id=payments", False),  # full-string match, not search
        ("client_software_name=librdkafka|apache-kafka-java", True),
        ("client_software_version=2\\.6\\..*", True),
        ("client_source_address=10\\.0\\.0\\.7", True),
        ("client_source_port=4000[0-9]", True),
        ("client_source_port=4000", False),
    ],
)
def test_match_patterns_full_match_the_client_attributes(store, manager, match, matched):
    subscribe(store, "s", metrics="a.", match=match)

    assert manager.get_subscriptions(None, PAYMENTS).requested_metrics == (["a."] if matched else [])


def test_a_missing_attribute_never_matches_even_a_match_anything_pattern(store, manager):
    subscribe(store, "s", metrics="a.", match="client_software_name=.*")
    anonymous = ClientIdentity("payments-producer", None, None, "10.0.0.7", 40001)

    assert manager.get_subscriptions(None, anonymous).requested_metrics == []


def test_client_instance_id_matches_kafkas_base64_text(store, manager):
    client = uuid.UUID("0123456789abcdeffedcba9876543210")
    subscribe(store, "one-client", metrics="a.", match=f"client_instance_id={kafka_uuid_text(client)}")

    assert kafka_uuid_text(client) == "ASNFZ4mrze_-3LqYdlQyEA"
    assert manager.get_subscriptions(client, PAYMENTS).requested_metrics == ["a."]
    assert manager.get_subscriptions(uuid.uuid4(), PAYMENTS).requested_metrics == []


def test_ipv6_source_addresses_match_in_javas_uncompressed_form(store, manager):
    subscribe(store, "local", metrics="a.", match="client_source_address=0:0:0:0:0:0:0:1")
    local = ClientIdentity("c", "librdkafka", "2.6.1", "::1", 40001)

    assert manager.get_subscriptions(None, local).requested_metrics == ["a."]


def test_metrics_of_matching_subscriptions_are_unioned_in_javas_hash_set_order(store, manager):
    subscribe(store, "producer", metrics="org.apache.kafka.producer.,shared.")
    subscribe(store, "consumer", metrics="shared.,org.apache.kafka.consumer.")
    subscribe(store, "java", metrics="java.only.", match="client_software_name=apache-kafka-java")

    result = manager.get_subscriptions(None, PAYMENTS)

    # The order a JVM's HashSet<String> gives for these names, as a real broker answers.
    assert result.requested_metrics == ["org.apache.kafka.producer.", "org.apache.kafka.consumer.", "shared."]


def test_a_star_in_any_matching_subscription_requests_all_metrics(store, manager):
    subscribe(store, "some", metrics="org.apache.kafka.producer.")
    subscribe(store, "all", metrics="*,ignored.")

    assert manager.get_subscriptions(None, PAYMENTS).requested_metrics == ["*"]


def test_the_push_interval_is_the_smallest_of_the_matching_subscriptions(store, manager):
    subscribe(store, "slow", metrics="a.", interval_ms="60000")
    subscribe(store, "fast", metrics="b.", interval_ms="5000")
    subscribe(store, "faster-but-not-mine", metrics="c.", interval_ms="100", match="client_id=nobody")

    assert manager.get_subscriptions(None, PAYMENTS).push_interval_ms == 5000


def test_the_push_interval_never_exceeds_the_default(store, manager):
    subscribe(store, "hourly", metrics="a.", interval_ms="3600000")

    assert manager.get_subscriptions(None, PAYMENTS).push_interval_ms == 300000


# --- subscription id -------------------------------------------------------------------------------------------


def test_subscription_id_is_computed_exactly_as_kafka_computes_it():
    client = uuid.UUID("0123456789abcdeffedcba9876543210")

    # Values printed by the same computation run on a JVM (HashSet.toString, CRC32C, Uuid.hashCode).
    assert subscription_id([], 1000, client) == 1788331976
    assert subscription_id(["org.apache.kafka.producer.", "org.apache.kafka.consumer."], 1000, client) == 626919101
    assert subscription_id(["*"], 300000, client) == 1012207395
    assert subscription_id([], 300000, uuid.UUID(int=1)) == -725132321


def test_the_subscription_id_changes_when_the_matching_set_changes_and_only_then(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    first = manager.get_subscriptions(None, PAYMENTS)
    client = first.client_instance_id

    subscribe(store, "not-mine", metrics="x.", match="client_id=nobody")
    clock.advance_ms(1000)
    unchanged = manager.get_subscriptions(client, PAYMENTS)
    subscribe(store, "s", metrics="a.,b.")
    changed = manager.get_subscriptions(client, PAYMENTS)

    assert unchanged.subscription_id == first.subscription_id
    assert changed.subscription_id != first.subscription_id
    assert changed.requested_metrics == ["b.", "a."]
    assert changed.subscription_id == subscription_id(["b.", "a."], 1000, client)


# --- Get throttling ---------------------------------------------------------------------------------------------


def test_a_get_sooner_than_one_interval_after_the_last_get_is_throttled_with_an_empty_answer(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    client = manager.get_subscriptions(None, PAYMENTS).client_instance_id

    clock.advance_ms(999)
    throttled = manager.get_subscriptions(client, PAYMENTS)
    clock.advance_ms(1)
    allowed = manager.get_subscriptions(client, PAYMENTS)

    assert throttled.error_code == THROTTLING_QUOTA_EXCEEDED
    assert (throttled.client_instance_id, throttled.subscription_id) == (uuid.UUID(int=0), 0)
    assert (throttled.push_interval_ms, throttled.telemetry_max_bytes, throttled.delta_temporality) == (0, 0, False)
    assert (throttled.requested_metrics, throttled.accepted_compression_types) == ([], [])
    assert allowed.error_code == 0 and allowed.client_instance_id == client


def test_a_get_sooner_than_one_interval_after_the_last_push_is_throttled(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    got = manager.get_subscriptions(None, PAYMENTS)
    clock.advance_ms(900)
    manager.push(got.client_instance_id, got.subscription_id, False, 0, METRICS, PAYMENTS)

    clock.advance_ms(200)  # 1100 ms after the Get, 200 ms after the push

    assert manager.get_subscriptions(got.client_instance_id, PAYMENTS).error_code == THROTTLING_QUOTA_EXCEEDED


def test_a_subscription_change_lets_a_client_get_again_at_once(store, manager):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    client = manager.get_subscriptions(None, PAYMENTS).client_instance_id

    subscribe(store, "s", metrics="b.")

    assert manager.get_subscriptions(client, PAYMENTS).requested_metrics == ["b."]


@pytest.mark.parametrize(
    ("subscription_offset", "compression", "error"),
    [(1, 0, UNKNOWN_SUBSCRIPTION_ID), (0, 9, UNSUPPORTED_COMPRESSION_TYPE)],
)
def test_a_get_right_after_a_push_failed_on_subscription_or_codec_is_not_throttled(
    store, manager, clock, subscription_offset, compression, error
):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    got = manager.get_subscriptions(None, PAYMENTS)
    clock.advance_ms(10)

    stale_or_not = got.subscription_id + subscription_offset
    failed = manager.push(got.client_instance_id, stale_or_not, False, compression, METRICS, PAYMENTS)
    again = manager.get_subscriptions(got.client_instance_id, PAYMENTS)
    once_more = manager.get_subscriptions(got.client_instance_id, PAYMENTS)

    assert failed.error_code == error
    assert again.error_code == 0
    assert once_more.error_code == THROTTLING_QUOTA_EXCEEDED  # the exception clears with the successful Get


# --- the PushTelemetry ladder ---------------------------------------------------------------------------------------


@pytest.fixture
def subscribed(store, manager, clock):
    """A client that fetched its subscription (interval 1000 ms, max 4096 bytes) and may push once at once."""
    subscribe(store, "s", metrics="org.apache.kafka.producer.", interval_ms="1000")
    small = TelemetryManager(store, telemetry_max_bytes=4096, clock=clock)
    got = small.get_subscriptions(None, PAYMENTS)
    return small, got.client_instance_id, got.subscription_id


@pytest.mark.parametrize("client", [None, uuid.UUID(int=0), uuid.UUID(int=1)])
def test_a_push_with_a_zero_or_reserved_instance_id_is_an_invalid_request(manager, client):
    result = manager.push(client, 0, False, 0, METRICS, PAYMENTS)

    assert (result.error_code, result.payload) == (INVALID_REQUEST, None)
    assert manager.client_count() == 0


def test_first_push_after_a_get_is_accepted_at_once_and_carries_the_decompressed_payload(subscribed):
    manager, client, sub_id = subscribed

    result = manager.push(client, sub_id, False, 4, compress(METRICS, "zstd"), PAYMENTS)

    assert (result.error_code, result.payload) == (0, METRICS)
    assert (result.subscription_id, result.push_interval_ms, result.terminating) == (sub_id, 1000, False)


def test_a_second_push_within_the_interval_is_throttled_and_one_after_it_is_accepted(subscribed, clock):
    manager, client, sub_id = subscribed
    manager.push(client, sub_id, False, 0, METRICS, PAYMENTS)

    clock.advance_ms(999)
    too_soon = manager.push(client, sub_id, False, 0, METRICS, PAYMENTS)
    clock.advance_ms(1)
    on_time = manager.push(client, sub_id, False, 0, METRICS, PAYMENTS)

    assert (too_soon.error_code, too_soon.payload) == (THROTTLING_QUOTA_EXCEEDED, None)
    assert on_time.error_code == 0


def test_a_terminating_push_skips_throttling_and_every_later_push_is_an_invalid_request(subscribed, clock):
    manager, client, sub_id = subscribed
    manager.push(client, sub_id, False, 0, METRICS, PAYMENTS)

    last = manager.push(client, sub_id, True, 0, METRICS, PAYMENTS)
    clock.advance_ms(5000)
    after = manager.push(client, sub_id, True, 0, METRICS, PAYMENTS)

    assert (last.error_code, last.terminating, last.payload) == (0, True, METRICS)
    assert after.error_code == INVALID_REQUEST


def test_a_rejected_terminating_push_still_ends_the_client(subscribed, clock):
    manager, client, sub_id = subscribed

    rejected = manager.push(client, sub_id + 1, True, 0, METRICS, PAYMENTS)
    clock.advance_ms(5000)

    assert rejected.error_code == UNKNOWN_SUBSCRIPTION_ID
    assert manager.push(client, sub_id, True, 0, METRICS, PAYMENTS).error_code == INVALID_REQUEST


def test_terminated_is_checked_before_throttling_and_the_subscription_id(subscribed):
    manager, client, sub_id = subscribed
    manager.push(client, sub_id, True, 0, METRICS, PAYMENTS)

    assert manager.push(client, sub_id + 1, True, 99, METRICS, PAYMENTS).error_code == INVALID_REQUEST


def test_throttling_is_checked_before_the_subscription_id(subscribed):
    manager, client, sub_id = subscribed
    manager.push(client, sub_id, False, 0, METRICS, PAYMENTS)

    assert manager.push(client, sub_id + 1, False, 99, METRICS, PAYMENTS).error_code == THROTTLING_QUOTA_EXCEEDED


def test_a_stale_subscription_id_is_checked_before_the_codec(subscribed):
    manager, client, sub_id = subscribed

    assert manager.push(client, sub_id + 1, False, 99, METRICS, PAYMENTS).error_code == UNKNOWN_SUBSCRIPTION_ID


def test_an_unknown_codec_is_checked_before_the_size(subscribed):
    manager, client, sub_id = subscribed

    assert manager.push(client, sub_id, False, 5, bytes(5000), PAYMENTS).error_code == UNSUPPORTED_COMPRESSION_TYPE


def test_a_payload_larger_than_telemetry_max_bytes_is_too_large(subscribed):
    manager, client, sub_id = subscribed

    assert manager.push(client, sub_id, False, 0, bytes(4097), PAYMENTS).error_code == TELEMETRY_TOO_LARGE


def test_a_payload_that_decompresses_beyond_telemetry_max_bytes_is_an_invalid_record(subscribed):
    # Kafka 4.3.1: the exporter's bounded decompression fails -> INVALID_RECORD.
    manager, client, sub_id = subscribed
    bomb = compress(bytes(100_000), "gzip")

    assert len(bomb) < 4096
    result = manager.push(client, sub_id, False, 1, bomb, PAYMENTS)

    assert (result.error_code, result.payload) == (INVALID_RECORD, None)
    # The failure is remembered as the client's last error, so an immediate Get is still throttled.
    assert manager.get_subscriptions(client, PAYMENTS).error_code == THROTTLING_QUOTA_EXCEEDED


@pytest.mark.parametrize(
    ("compression", "data"),
    [(0, b"\xff\xff\xff\xff"), (1, b"\x1f\x8b not gzip"), (4, compress(b"\x0a\xff\xff", "zstd"))],
)
def test_a_payload_that_is_not_metrics_data_is_an_invalid_record(subscribed, compression, data):
    manager, client, sub_id = subscribed

    result = manager.push(client, sub_id, False, compression, data, PAYMENTS)

    assert (result.error_code, result.payload) == (INVALID_RECORD, None)


@pytest.mark.parametrize(("compression", "name"), [(0, "none"), (1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd")])
def test_every_kafka_codec_is_accepted_and_decompressed(subscribed, compression, name):
    manager, client, sub_id = subscribed

    result = manager.push(client, sub_id, False, compression, compress(METRICS, name), PAYMENTS)

    assert (result.error_code, result.payload) == (0, METRICS)


def test_an_empty_push_is_accepted_with_nothing_to_write(subscribed):
    manager, client, sub_id = subscribed

    result = manager.push(client, sub_id, True, 0, b"", PAYMENTS)

    assert (result.error_code, result.payload, result.terminating) == (0, None, True)


def test_an_unknown_instance_id_gets_fresh_state_then_fails_the_subscription_check_then_recovers(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    client = uuid.uuid4()  # e.g. known to another broker, or forgotten here

    pushed = manager.push(client, 12345, False, 0, METRICS, PAYMENTS)
    got = manager.get_subscriptions(client, PAYMENTS)
    clock.advance_ms(1000)
    retried = manager.push(client, got.subscription_id, False, 0, METRICS, PAYMENTS)

    assert pushed.error_code == UNKNOWN_SUBSCRIPTION_ID
    assert (got.error_code, got.client_instance_id) == (0, client)
    assert retried.error_code == 0


def test_a_subscription_change_gives_a_client_fresh_state(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    got = manager.get_subscriptions(None, PAYMENTS)
    manager.push(got.client_instance_id, got.subscription_id, True, 0, METRICS, PAYMENTS)

    subscribe(store, "s", metrics="b.")
    stale = manager.push(got.client_instance_id, got.subscription_id, False, 0, METRICS, PAYMENTS)

    # Kafka re-creates the client instance, so termination is forgotten and the old id is now stale.
    assert stale.error_code == UNKNOWN_SUBSCRIPTION_ID


def test_a_subscription_change_re_evaluates_matching_with_the_first_requests_attributes(store, manager):
    subscribe(store, "payments", metrics="a.", match="client_id=payments-.*")
    got = manager.get_subscriptions(None, PAYMENTS)
    assert got.requested_metrics == ["a."]

    # The same instance now arrives with another identity (a new connection, another client id); Kafka keeps the
    # ClientMetricsInstanceMetadata of the first request, so after a change it still matches as payments-producer.
    subscribe(store, "payments", metrics="b.", match="client_id=payments-.*")
    again = manager.get_subscriptions(got.client_instance_id, JAVA)

    assert (again.error_code, again.requested_metrics) == (0, ["b."])


# --- bounded client state ---------------------------------------------------------------------------------------


def test_clients_not_seen_for_the_expiry_time_are_forgotten(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="30000")
    manager.get_subscriptions(None, PAYMENTS)

    clock.advance_ms(89_999)  # the expiry is max(60 s, 3 x push interval) after the last request
    manager.get_subscriptions(None, JAVA)
    assert manager.client_count() == 2
    clock.advance_ms(1001)
    manager.get_subscriptions(None, JAVA)

    assert manager.client_count() == 2  # the first client went, a third one came


def test_a_client_is_forgotten_as_soon_as_its_expiry_passes(store, manager, clock):
    subscribe(store, "s", metrics="a.", interval_ms="30000")
    got = manager.get_subscriptions(None, PAYMENTS)
    manager.push(got.client_instance_id, got.subscription_id, True, 0, METRICS, PAYMENTS)
    clock.advance_ms(89_500)
    manager.get_subscriptions(None, JAVA)

    clock.advance_ms(500)  # 90 s after the terminating push
    result = manager.push(got.client_instance_id, got.subscription_id, False, 0, METRICS, PAYMENTS)

    assert result.error_code == 0  # fresh state: a remembered, terminated client would be an INVALID_REQUEST


def test_the_least_recently_used_client_is_dropped_beyond_the_cache_size(manager, monkeypatch):
    monkeypatch.setattr(telemetry, "CACHE_MAX_SIZE", 2)
    first = manager.get_subscriptions(None, PAYMENTS).client_instance_id
    second = manager.get_subscriptions(None, PAYMENTS).client_instance_id
    manager.get_subscriptions(first, PAYMENTS)  # throttled, but a use all the same

    manager.get_subscriptions(None, PAYMENTS)

    assert manager.client_count() == 2
    # The second client's throttling state is gone, so an immediate Get is answered again; the first's is kept.
    assert manager.get_subscriptions(first, PAYMENTS).error_code == THROTTLING_QUOTA_EXCEEDED
    assert manager.get_subscriptions(second, PAYMENTS).error_code == 0


def test_closing_the_connection_a_client_started_on_forgets_it(manager):
    client = manager.get_subscriptions(None, PAYMENTS, connection_id="conn-1").client_instance_id

    manager.connection_closed("conn-2")
    assert manager.get_subscriptions(client, PAYMENTS).error_code == THROTTLING_QUOTA_EXCEEDED
    manager.connection_closed("conn-1")

    assert manager.client_count() == 0
    assert manager.get_subscriptions(client, PAYMENTS).error_code == 0


def _one_subscription_manager(max_bytes: int = 1048576) -> tuple[TelemetryManager, FakeClock]:
    store, clock = SubscriptionStore(), FakeClock()
    subscribe(store, "s", metrics="a.", interval_ms="1000")
    return TelemetryManager(store, telemetry_max_bytes=max_bytes, clock=clock), clock


@pytest.mark.parametrize("payload", [b"", METRICS], ids=["empty", "metrics"])
def test_an_accepted_push_clears_a_remembered_codec_failure(payload):
    manager, clock = _one_subscription_manager()
    got = manager.get_subscriptions(None, PAYMENTS)
    refused = manager.push(got.client_instance_id, got.subscription_id, False, 9, METRICS, PAYMENTS)
    assert refused.error_code == UNSUPPORTED_COMPRESSION_TYPE
    clock.advance_ms(1000)
    assert manager.push(got.client_instance_id, got.subscription_id, False, 0, payload, PAYMENTS).error_code == 0
    # Kafka's lastKnownError is NONE again, so an early Get is throttled like any other (after 76 it would not be).
    assert manager.get_subscriptions(got.client_instance_id, PAYMENTS).error_code == THROTTLING_QUOTA_EXCEEDED


def test_subscription_id_folds_the_uuid_halves_with_xor_as_uuid_hash_code_does():
    # Halves whose bits overlap (the other tests' ids have complementary halves or one zero half); the values are
    # what Kafka's computeSubscriptionId gives with kafka-clients 4.3.0's Uuid and Crc32C on a JVM.
    client = uuid.UUID("0123456789abcdef0f1e2d3c4b5a6978")
    assert subscription_id([], 1000, client) == -1503982844
    assert subscription_id(["org.apache.kafka.producer."], 60000, client) == 254245164


def test_ipv4_mapped_and_scoped_ipv6_addresses_read_as_java_prints_them():
    # A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d; InetAddress.getHostAddress prints a.b.c.d, which
    # is what a client_source_address pattern is written against.
    assert java_host_address("::ffff:10.0.0.7") == "10.0.0.7"
    assert java_host_address("fe80::1%eth0") == "fe80:0:0:0:0:0:0:1%eth0"


def test_a_client_that_expired_and_came_back_on_another_connection_survives_the_first_one_closing():
    manager, clock = _one_subscription_manager()
    client = manager.get_subscriptions(None, PAYMENTS, connection_id="c1").client_instance_id
    clock.advance_ms(61_000)   # expired: the next request creates it again, on its new connection
    manager.get_subscriptions(client, PAYMENTS, connection_id="c2")
    manager.connection_closed("c1")
    assert manager.client_count() == 1


def test_decompression_stops_at_telemetry_max_bytes_not_at_what_the_push_expands_to():
    manager, _ = _one_subscription_manager(max_bytes=4096)
    got = manager.get_subscriptions(None, PAYMENTS)
    bomb = compress(bytes(64 * 1024 * 1024), "zstd")   # a few KiB that expand to 64 MiB
    tracemalloc.start()
    try:
        result = manager.push(got.client_instance_id, got.subscription_id, False, 4, bomb, PAYMENTS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.error_code == INVALID_RECORD
    assert peak < 4 * 1024 * 1024, peak
