"""Commit positions: never past a record that was not exported or dead-lettered."""

from __future__ import annotations

from kcm_bridge.offsets import OffsetTracker, Ticket

P = ("metrics", 0)


def test_commit_stops_at_the_first_unfinished_record_even_when_later_ones_finished():
    tracker = OffsetTracker()
    first, second = Ticket(parts=1), Ticket(parts=2)
    for offset in range(0, 5):
        tracker.add(P, offset, first)
    for offset in range(5, 9):
        tracker.add(P, offset, second)

    second.finish_part()
    second.finish_part()
    assert tracker.commit_position(P) == 0
    first.finish_part()
    assert tracker.commit_position(P) == 9


def test_a_ticket_with_several_endpoints_finishes_only_when_each_delivered():
    tracker = OffsetTracker()
    ticket = Ticket(parts=2)
    tracker.add(P, 0, ticket)
    ticket.finish_part()
    assert tracker.commit_position(P) == 0
    ticket.finish_part()
    assert tracker.commit_position(P) == 1


def test_a_dead_letter_in_the_middle_of_a_batch_splits_its_span():
    tracker = OffsetTracker()
    batch, dead_letter = Ticket(), Ticket()
    tracker.add(P, 10, batch)
    tracker.add(P, 11, dead_letter)
    tracker.add(P, 12, batch)
    batch.finish_part()
    assert tracker.commit_position(P) == 11
    dead_letter.finish_part()
    assert tracker.commit_position(P) == 13


def test_skipped_records_advance_the_position_and_forget_drops_a_revoked_partition():
    tracker = OffsetTracker()
    tracker.add(P, 3, None)
    assert tracker.to_commit() == {P: 4}
    tracker.committed({P: 4})
    assert tracker.to_commit() == {}
    tracker.add(P, 4, Ticket())
    tracker.forget([P])
    assert tracker.to_commit() == {} and tracker.pending() == 0


def test_finished_spans_behind_one_that_stays_unfinished_are_not_kept_and_the_position_waits_for_it():
    """A dead letter the topic keeps refusing stays unfinished while the partition flows on: the records after it
    must not each be held until it is written, and nothing is committed past it or past another unfinished one."""
    tracker = OffsetTracker()
    stuck, later = Ticket(), []
    tracker.add(P, 0, stuck)
    for offset in range(1, 1001):
        ticket = Ticket()
        tracker.add(P, offset, ticket)
        later.append(ticket)
        if offset != 500:
            ticket.finish_part()
    assert tracker.commit_position(P) == 0
    assert len(tracker._spans[P]) <= 64, "a span kept per finished ticket"
    assert tracker.pending() == 2
    stuck.finish_part()
    assert tracker.commit_position(P) == 500
    later[499].finish_part()
    assert tracker.commit_position(P) == 1001 and tracker.pending() == 0
