"""How many messages parsing a serialised OTLP MetricsData would build, counted on the wire before it is parsed.

protobuf's C parser builds every message a payload holds, about 80 bytes each: 16 MiB of empty data points (a 1.5 KB
zstd record) is 8 million messages and some 670 MiB, enough to kill a bridge pod, which would read the record again
after its restart. Every reader of the topic checks a large payload here first.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

# Messages one payload may build (about 80 MiB parsed; a real client's 1 MiB push builds tens of thousands).
MAX_MESSAGES = 1_000_000
_MAX_DEPTH = 100  # protobuf's own recursion limit: a deeper payload fails to parse, whatever this says

_Table = dict[int, "_Table"]  # message-typed field number → the table of that field's message type


def _tables(descriptor: Descriptor, built: dict[str, _Table]) -> _Table:
    table = built.get(descriptor.full_name)
    if table is None:
        table = built[descriptor.full_name] = {}
        for found in descriptor.fields:
            if found.type == FieldDescriptor.TYPE_MESSAGE:
                table[found.number] = _tables(found.message_type, built)
    return table


_METRICS_DATA = _tables(MetricsData.DESCRIPTOR, {})


def builds_more_than(payload: bytes, limit: int = MAX_MESSAGES) -> bool:
    """Whether parsing `payload` as MetricsData would build more than `limit` messages; counted without building
    any, and never past `limit`. A malformed payload counts what precedes the fault (the parser reports it)."""
    if len(payload) <= 2 * limit:  # each message takes 2 bytes at least: the walk (Python) is not needed
        return False
    left, depth = limit, 0
    frames: list[tuple[int, _Table]] = []  # each enclosing message: (its end, its table); depth-first
    position, end, table = 0, len(payload), _METRICS_DATA
    try:
        while True:
            while position >= end:
                if not frames:
                    return False
                end, table = frames.pop()
                depth -= 1
            tag = payload[position]
            position += 1
            if tag >= 0x80:
                tag, position = _varint(payload, position, tag)
            wire_type = tag & 7
            if wire_type == 2:
                length = payload[position]
                position += 1
                if length >= 0x80:
                    length, position = _varint(payload, position, length)
                child = table.get(tag >> 3)
                if child is not None:
                    left -= 1
                    if left < 0:
                        return True
                    if length and depth < _MAX_DEPTH:
                        frames.append((end, table))
                        depth += 1
                        end, table = min(position + length, end), child
                        continue
                position += length
            elif wire_type == 0:
                byte = payload[position]
                position += 1
                if byte >= 0x80:
                    _, position = _varint(payload, position, byte)
            elif wire_type == 1:
                position += 8
            elif wire_type == 5:
                position += 4
            elif wire_type in (3, 4):   # a group's start or end: no OTLP field, and the parser skips past it
                continue
            else:
                return False
    except IndexError:  # truncated: the parser says so
        return False


def _varint(data: bytes, position: int, first: int) -> tuple[int, int]:
    result, shift, byte = first & 0x7F, 7, first
    while byte >= 0x80:
        if shift > 63:   # longer than 10 bytes: malformed, as the parser will say (an unbounded one cost hours)
            raise IndexError
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        shift += 7
    return result, position
