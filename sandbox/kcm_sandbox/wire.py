"""Kafka wire framing: size-prefixed frames and the request header fields the gateway routes on."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

# A broker refuses frames above socket.request.max.bytes (100 MiB by default); so do we.
MAX_FRAME_BYTES = 100 * 1024 * 1024
_FIXED = struct.Struct(">hhi")


class FrameError(ValueError):
    """A frame that cannot be a Kafka request; the connection is closed, as a broker would."""


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    end: int  # offset just past the client id (flexible headers continue with tagged fields)


def parse_header(frame: bytes) -> RequestHeader:
    """The routing fields of a request frame (without its size prefix); these sit at fixed places in every version."""
    if len(frame) < _FIXED.size + 2:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _FIXED.unpack_from(frame)
    (length,) = struct.unpack_from(">h", frame, _FIXED.size)
    start = _FIXED.size + 2
    if length < 0:
        return RequestHeader(api_key, api_version, correlation_id, None, start)
    if start + length > len(frame):
        raise FrameError("request header's client id runs past the end of the request")
    client_id = frame[start:start + length].decode("utf-8", errors="replace")
    return RequestHeader(api_key, api_version, correlation_id, client_id, start + length)


class FrameBudget:
    """Bytes of frames being read across connections, reserved before a body is read (a broker's memory pool).

    A frame waits while the pool is spent, except frames of at most `small` bytes, so huge ones cannot stall others.
    """

    def __init__(self, limit: int, small: int = 1 << 20) -> None:
        self.limit = limit
        self.small = small
        self.used = 0
        self._freed = asyncio.Event()

    async def reserve(self, size: int) -> None:
        # An oversized frame may go alone, as a non-strict pool allows one allocation past its limit.
        while size > self.small and self.used and self.used + size > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size
        self._freed.set()


async def read_frame(reader: asyncio.StreamReader, idle_timeout_s: float | None = None,
                     budget: FrameBudget | None = None) -> bytes | None:
    """The next frame's bytes (without the size prefix), or None at a clean end of stream.

    No frame started, or one not finished, within `idle_timeout_s` is an error; a frame read under `budget` is
    reserved there, and the caller releases it."""
    try:
        async with asyncio.timeout(idle_timeout_s):
            prefix = await reader.readexactly(4)
    except TimeoutError:
        raise FrameError(f"idle for {idle_timeout_s:g} s (connections.max.idle.ms)") from None
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("connection closed in the middle of a frame size") from None
        return None
    (size,) = struct.unpack(">i", prefix)
    if size < 0 or size > MAX_FRAME_BYTES:
        raise FrameError(f"frame size {size} is outside 0..{MAX_FRAME_BYTES}")
    if budget is not None:
        await budget.reserve(size)
    try:
        async with asyncio.timeout(idle_timeout_s):
            return await reader.readexactly(size)
    except BaseException as exc:
        if budget is not None:
            budget.release(size)
        if isinstance(exc, TimeoutError):
            raise FrameError(f"{size}-byte frame not complete after {idle_timeout_s:g} s") from None
        if isinstance(exc, asyncio.IncompleteReadError):
            raise FrameError(f"connection closed after {size}-byte frame was announced") from None
        raise


def correlation_id(response_frame: bytes) -> int:
    """The correlation id every response starts with."""
    if len(response_frame) < 4:
        raise FrameError(f"response of {len(response_frame)} bytes has no correlation id")
    return struct.unpack_from(">i", response_frame)[0]


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def produce_expects_response(frame_bytes: bytes, header: RequestHeader) -> bool:
    """Whether a Produce request wants an answer: acks=0 requests get none."""
    offset = header.end
    try:
        if header.api_version >= 9:
            # Flexible: the header ends with tagged fields; transactional_id is a compact nullable string.
            count, offset = _uvarint(frame_bytes, offset)
            for _ in range(count):
                _, offset = _uvarint(frame_bytes, offset)
                size, offset = _uvarint(frame_bytes, offset)
                offset += size
            length, offset = _uvarint(frame_bytes, offset)
            offset += max(length - 1, 0)
        elif header.api_version >= 3:
            (length,) = struct.unpack_from(">h", frame_bytes, offset)
            offset += 2 + max(length, 0)
        (acks,) = struct.unpack_from(">h", frame_bytes, offset)
    except struct.error:
        raise FrameError("Produce request ends before its acks field") from None
    return acks != 0


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if offset >= len(data):
            raise FrameError("truncated varint in request")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 35:
            raise FrameError("varint too long in request")
