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


def test_pending_counts_only_unfinished_batches_without_a_commit_in_between():
    """A revoke and the shutdown wait while batches are pending: a batch finished since the last commit must not hold
    them until their timeouts."""
    tracker = OffsetTracker()
    ticket = Ticket()
    for offset in range(500):   # one batch of many records: one pending batch, not 500
        tracker.add(P, offset, ticket)
    assert tracker.pending() == 1
    ticket.finish_part()
    assert tracker.pending() == 0


def test_forget_returns_only_the_unfinished_tickets_and_resets_what_was_committed():
    tracker = OffsetTracker()
    done, waiting = Ticket(), Ticket()
    tracker.add(P, 0, done)
    tracker.add(P, 1, waiting)
    done.finish_part()
    tracker.committed({P: 10})
    assert tracker.forget([P]) == [waiting]
    tracker.add(P, 9, None)   # back later, from an earlier position (an offset reset): committed again
    assert tracker.to_commit() == {P: 10}


def test_holds_is_false_for_a_ticket_from_before_the_partition_was_revoked_and_assigned_again():
    """A letter waiting for its dead-letter write is written only while its batch is still this member's: once the
    partition was revoked, the next owner reads the record again, even if that owner is this member."""
    tracker = OffsetTracker()
    old, new = Ticket(), Ticket()
    tracker.add(P, 0, old)
    assert tracker.holds(P, old)
    tracker.forget([P])
    tracker.add(P, 0, new)
    assert not tracker.holds(P, old) and tracker.holds(P, new)


def test_pending_counts_each_unfinished_ticket_once_however_many_spans_and_partitions_it_holds():
    """What the shutdown's warning reports: a batch split by a dead letter, on two partitions, is one batch."""
    tracker, other = OffsetTracker(), ("metrics", 1)
    batch, letter = Ticket(), Ticket()
    tracker.add(P, 0, batch)
    tracker.add(P, 1, letter)
    tracker.add(P, 2, batch)
    tracker.add(other, 0, batch)
    assert (tracker.pending(), tracker.pending([P]), tracker.pending([other])) == (2, 2, 1)
    letter.finish_part()
    assert (tracker.pending(), tracker.pending([P])) == (1, 1)
    batch.finish_part()
    assert tracker.pending() == 0
