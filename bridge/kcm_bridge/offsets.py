"""Which offset each partition may commit: only past records that were all exported or dead-lettered."""

from __future__ import annotations

import threading

Partition = tuple[str, int]
# A partition's spans are swept of finished ones when they reach this many, then each time they double again.
_SWEEP_SPANS = 64


class Ticket:
    """Work that finishes when `parts` deliveries (exports to endpoints, a dead-letter write) have each ended."""

    __slots__ = ("_lock", "_remaining", "done", "size")

    def __init__(self, parts: int = 1, size: int = 0) -> None:
        self._lock = threading.Lock()
        self._remaining = parts
        self.done = parts == 0
        self.size = size

    def set_parts(self, parts: int) -> None:
        with self._lock:
            self._remaining = parts
            self.done = parts == 0

    def add_parts(self, parts: int) -> None:
        """More deliveries to wait for (from any thread), added while one of its own is still out."""
        with self._lock:
            assert not self.done, "parts added to a finished ticket"
            self._remaining += parts

    def finish_part(self) -> bool:
        """Mark one delivery ended (from any thread); True when that ended the ticket."""
        with self._lock:
            self._remaining -= 1
            if self._remaining == 0:
                self.done = True
                return True
            return False


class _Span:
    __slots__ = ("ticket", "first")

    def __init__(self, ticket: Ticket, offset: int) -> None:
        self.ticket, self.first = ticket, offset


class OffsetTracker:
    """Per partition, the spans of consumed records in order, each owned by a ticket; called from one thread.

    A span is the first offset of a run of records finished with one ticket: the commit position is the first span
    not finished, so finished spans are dropped wherever they are, also behind one that stays unfinished (a dead
    letter the topic keeps refusing)."""

    def __init__(self) -> None:
        self._spans: dict[Partition, list[_Span]] = {}
        self._sweep_at: dict[Partition, int] = {}
        self._consumed: dict[Partition, int] = {}   # next offset after the last consumed record
        self._committed: dict[Partition, int] = {}

    def add(self, partition: Partition, offset: int, ticket: Ticket | None) -> None:
        """Record `offset` as consumed; it is finished with `ticket`, or at once when `ticket` is None (skipped)."""
        self._consumed[partition] = offset + 1
        if ticket is None:
            return
        spans = self._spans.setdefault(partition, [])
        if spans and spans[-1].ticket is ticket:
            return
        spans.append(_Span(ticket, offset))
        if len(spans) >= self._sweep_at.get(partition, _SWEEP_SPANS):   # bounded between positions asked for too
            self._sweep(partition)

    def commit_position(self, partition: Partition) -> int | None:
        """The offset to commit: the first record not yet finished, else one past the last consumed."""
        spans = self._spans.get(partition)
        if spans and (len(spans) > 1 or spans[0].ticket.done):
            spans = self._sweep(partition)
        if spans:
            return spans[0].first
        self._sweep_at.pop(partition, None)
        return self._consumed.get(partition)

    def _sweep(self, partition: Partition) -> list[_Span]:
        """Drop the partition's finished spans; the next sweep on `add` comes when the rest has doubled."""
        kept = [span for span in self._spans[partition] if not span.ticket.done]
        self._spans[partition] = kept
        self._sweep_at[partition] = max(_SWEEP_SPANS, 2 * len(kept))
        return kept

    def to_commit(self) -> dict[Partition, int]:
        """Positions that moved since the last `committed` call."""
        positions = {}
        for partition in self._consumed:
            position = self.commit_position(partition)
            if position is not None and position != self._committed.get(partition):
                positions[partition] = position
        return positions

    def committed(self, positions: dict[Partition, int]) -> None:
        self._committed.update(positions)

    def forget(self, partitions: list[Partition]) -> list[Ticket]:
        """Drop the state of partitions this member no longer owns; the tickets of their records not finished."""
        unfinished: dict[int, Ticket] = {}
        for partition in partitions:
            for span in self._spans.pop(partition, ()):
                if not span.ticket.done:
                    unfinished[id(span.ticket)] = span.ticket
            self._sweep_at.pop(partition, None)
            self._consumed.pop(partition, None)
            self._committed.pop(partition, None)
        return list(unfinished.values())

    def holds(self, partition: Partition, ticket: Ticket) -> bool:
        """Whether `ticket` still finishes records of `partition` (the partition was not forgotten since)."""
        return any(span.ticket is ticket for span in self._spans.get(partition, ()))

    def pending(self, partitions: list[Partition] | None = None) -> int:
        """Unfinished tickets (batches and dead-letter writes) holding records of `partitions`, or of any: each once,
        however many spans and partitions its records make."""
        keys = self._spans if partitions is None else [p for p in partitions if p in self._spans]
        return len({id(span.ticket) for key in keys for span in self._spans[key] if not span.ticket.done})
