"""Kafka framing and the request-header fields the gateway routes on (kcm_sandbox.wire), without a network."""

from __future__ import annotations

import asyncio
import struct

import pytest
from kafka.protocol.producer.produce import ProduceRequest

from kcm_sandbox import wire


def request_bytes(request, client_id: str | None = "producer-1", correlation_id: int = 7) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True))


def produce(version: int, acks: int, transactional_id: str | None = None) -> bytes:
    fields = {"acks": acks, "timeout_ms": 1000, "topic_data": []}
    if version >= 3:
        fields["transactional_id"] = transactional_id
    return request_bytes(ProduceRequest[version](**fields))


def read(data: bytes, **options) -> bytes | None:
    """`wire.read_frame` over a stream holding `data`, then end of stream."""
    async def go() -> bytes | None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await wire.read_frame(reader, **options)

    return asyncio.run(go())


# --- request headers ----------------------------------------------------------------------------------------------


def test_parse_header_reads_the_routing_fields_and_where_the_client_id_ends():
    frame = produce(3, acks=1)

    header = wire.parse_header(frame)

    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (0, 3, 7, "producer-1")
    assert header.end == 10 + len("producer-1")


def test_a_null_client_id_parses_as_none():
    header = wire.parse_header(request_bytes(ProduceRequest[3](acks=1, timeout_ms=1, topic_data=[],
                                                               transactional_id=None), client_id=None))

    assert (header.client_id, header.end) == (None, 10)


@pytest.mark.parametrize("frame", [b"", b"\x00" * 9, struct.pack(">hhih", 0, 3, 7, 50) + b"short"],
                         ids=["empty", "shorter-than-a-header", "client-id-past-the-end"])
def test_a_truncated_header_is_a_frame_error(frame):
    with pytest.raises(wire.FrameError):
        wire.parse_header(frame)


# --- acks=0 Produce expects no answer ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, 3, 8, 9, 12])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_only_an_acks_0_produce_expects_no_response_in_every_header_layout(version, acks):
    frame = produce(version, acks, transactional_id="a-transaction" if version >= 3 else None)

    assert wire.produce_expects_response(frame, wire.parse_header(frame)) is (acks != 0)


@pytest.mark.parametrize("version", [3, 9])
def test_a_null_transactional_id_is_skipped_to_find_acks(version):
    frame = produce(version, acks=0, transactional_id=None)

    assert wire.produce_expects_response(frame, wire.parse_header(frame)) is False


def test_tagged_fields_in_a_flexible_header_are_skipped_to_find_acks():
    frame = produce(9, acks=0, transactional_id="tx")
    header = wire.parse_header(frame)
    # Insert one tagged field (tag 5, 3 bytes) into the header's empty tagged-field section.
    tagged = frame[:header.end] + b"\x01\x05\x03abc" + frame[header.end + 1:]

    assert wire.produce_expects_response(tagged, wire.parse_header(tagged)) is False


def test_a_produce_that_ends_before_acks_is_a_frame_error():
    frame = produce(3, acks=0, transactional_id="tx")
    header = wire.parse_header(frame)

    with pytest.raises(wire.FrameError):
        wire.produce_expects_response(frame[:header.end + 4], header)


# --- frames -----------------------------------------------------------------------------------------------------


def test_read_frame_returns_each_frame_and_none_at_a_clean_end():
    async def go() -> list[bytes | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(wire.frame(b"first") + wire.frame(b"") + wire.frame(b"third"))
        reader.feed_eof()
        return [await wire.read_frame(reader) for _ in range(4)]

    assert asyncio.run(go()) == [b"first", b"", b"third", None]


@pytest.mark.parametrize("data", [b"\x00\x00", struct.pack(">i", 10) + b"12345"],
                         ids=["inside-the-size", "inside-the-body"])
def test_a_stream_that_ends_inside_a_frame_is_a_frame_error(data):
    with pytest.raises(wire.FrameError):
        read(data)


@pytest.mark.parametrize("size", [-1, wire.MAX_FRAME_BYTES + 1])
def test_a_frame_size_outside_what_a_broker_accepts_is_refused_before_reading_it(size):
    with pytest.raises(wire.FrameError, match="outside"):
        read(struct.pack(">i", size))


def test_a_connection_that_sends_nothing_times_out():
    async def go() -> None:
        await wire.read_frame(asyncio.StreamReader(), idle_timeout_s=0.05)

    with pytest.raises(wire.FrameError, match="idle"):
        asyncio.run(go())


def test_a_frame_that_does_not_complete_in_time_is_an_error_and_gives_its_reservation_back():
    budget = wire.FrameBudget(limit=1 << 30, small=0)

    async def go() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">i", 100) + b"partial")
        await wire.read_frame(reader, idle_timeout_s=0.05, budget=budget)

    with pytest.raises(wire.FrameError, match="not complete"):
        asyncio.run(go())
    assert budget.used == 0


def test_the_budget_holds_a_large_frame_back_until_another_is_released_but_never_a_small_one():
    async def go() -> list[str]:
        budget = wire.FrameBudget(limit=100, small=10)
        events: list[str] = []
        await budget.reserve(80)

        async def large() -> None:
            await budget.reserve(50)
            events.append("large admitted")

        waiting = asyncio.create_task(large())
        await budget.reserve(10)  # small frames pass even when the budget is spent
        events.append("small admitted")
        await asyncio.sleep(0.01)
        events.append("releasing")
        budget.release(80)
        await asyncio.wait_for(waiting, 1.0)
        assert budget.used == 60
        return events

    assert asyncio.run(go()) == ["small admitted", "releasing", "large admitted"]


def test_an_oversized_frame_is_admitted_alone():
    async def go() -> int:
        budget = wire.FrameBudget(limit=100, small=10)
        await asyncio.wait_for(budget.reserve(500), 1.0)
        return budget.used

    assert asyncio.run(go()) == 500


def test_correlation_id_of_a_response_and_framing_round_trip():
    assert wire.correlation_id(struct.pack(">i", 42) + b"body") == 42
    assert wire.frame(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(wire.FrameError):
        wire.correlation_id(b"\x00\x01")


# --- sandbox/kcm_sandbox/wire.py ----------------------------------------------------------------------------------


def test_a_request_that_is_only_a_header_parses_as_apiversions_v0_to_v2_requests_are():
    import struct

    from kcm_sandbox import wire

    frame = struct.pack(">hhih", 18, 2, 5, 3) + b"cli"  # ApiVersions v2: no body after the client id

    header = wire.parse_header(frame)

    assert (header.api_key, header.api_version, header.correlation_id, header.client_id, header.end) == (
        18, 2, 5, "cli", len(frame))


def test_a_frame_of_exactly_small_bytes_never_waits_and_one_that_fills_the_pool_exactly_does_not_either():
    import asyncio

    from kcm_sandbox import wire

    async def go() -> tuple[int, int]:
        spent = wire.FrameBudget(limit=100, small=10)
        await spent.reserve(95)
        await asyncio.wait_for(spent.reserve(10), 0.5)  # "at most `small` bytes" pass a spent pool
        exact = wire.FrameBudget(limit=100, small=10)
        await exact.reserve(60)
        await asyncio.wait_for(exact.reserve(40), 0.5)  # 60 + 40 is within the limit, not past it
        return spent.used, exact.used

    assert asyncio.run(go()) == (105, 100)


def test_a_frame_of_exactly_the_brokers_maximum_is_accepted_and_read():
    import asyncio
    import struct

    from kcm_sandbox import wire

    async def go() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">i", wire.MAX_FRAME_BYTES))
        reader.feed_eof()
        await wire.read_frame(reader)

    # A broker refuses only sizes above socket.request.max.bytes; this one is read (and here cut short).
    with pytest.raises(wire.FrameError, match="announced"):
        asyncio.run(go())


@pytest.mark.parametrize("length", [0, 3])
def test_a_response_shorter_than_a_correlation_id_is_a_frame_error(length):
    from kcm_sandbox import wire

    with pytest.raises(wire.FrameError, match="no correlation id"):
        wire.correlation_id(b"\x01" * length)


@pytest.mark.parametrize("version", [3, 9, 12])
def test_acks_0_is_found_exactly_after_a_transactional_id_whatever_follows_it(version):
    from kafka.protocol.producer.produce import ProduceRequest

    from kcm_sandbox import wire

    # A timeout whose first byte is not 0: reading acks one byte late would see it and wait for an answer.
    request = ProduceRequest[version](transactional_id="a-transaction", acks=0, timeout_ms=0x7FFFFFFF, topic_data=[])
    request.with_header(correlation_id=7, client_id="producer-1")
    frame = bytes(request.encode(header=True))

    assert wire.produce_expects_response(frame, wire.parse_header(frame)) is False
