"""OffsetTracker: commit only past a finished prefix of what each partition delivered."""

from __future__ import annotations

from worker.offsets import OffsetTracker

A = ("runs", 0)
B = ("runs", 1)


def test_in_order_completion_commits_one_past_the_last() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(3):
        t.add(A, o)
    assert t.committable() == {}
    for o in range(3):
        assert t.complete(A, o)
    assert t.committable() == {A: 3}


def test_out_of_order_completion_waits_for_the_gap() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(5):
        t.add(A, o)
    t.complete(A, 2)
    t.complete(A, 4)
    assert t.committable() == {}
    t.complete(A, 0)
    assert t.committable() == {A: 1}
    t.complete(A, 1)
    assert t.committable() == {A: 3}
    t.complete(A, 3)
    assert t.committable() == {A: 5}
    assert t.in_flight(A) == 0


def test_offset_holes_from_compaction_do_not_block() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in (10, 11, 15, 16):
        t.add(A, o)
    t.complete(A, 16)
    t.complete(A, 10)
    t.complete(A, 11)
    assert t.committable() == {A: 12}
    t.complete(A, 15)
    assert t.committable() == {A: 17}


def test_partitions_are_independent() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.add(B, 7)
    t.add(B, 8)
    t.complete(B, 7)
    assert t.committable() == {B: 8}
    assert t.in_flight() == 2


def test_mark_committed_hides_until_progress() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.add(A, 1)
    t.complete(A, 0)
    t.mark_committed(t.committable())
    assert t.committable() == {}
    t.complete(A, 1)
    assert t.committable() == {A: 2}


def test_unknown_repeated_and_untracked_offsets_are_ignored() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.add(A, 0)  # a repeat is ignored
    assert t.in_flight(A) == 1
    assert not t.complete(A, 5)  # never delivered
    assert not t.complete(B, 0)  # unknown partition
    assert t.complete(A, 0)
    assert not t.complete(A, 0)  # twice
    assert t.committable() == {A: 1}
    t.add(A, 0)  # older than the commit point
    assert t.in_flight(A) == 0


def test_revocation_returns_the_committable_part_and_forgets() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(3):
        t.add(A, o)
        t.add(B, o)
    t.complete(A, 0)
    t.complete(A, 2)
    assert t.revoke([A]) == {A: 1}
    assert t.partitions() == [B]
    # A handler of the revoked partition finishing late changes nothing.
    assert not t.complete(A, 1)
    assert t.committable() == {}
    # Reassigned later: tracking starts afresh.
    t.add(A, 1)
    t.complete(A, 1)
    assert t.committable() == {A: 2}


def test_revoking_an_already_committed_partition_returns_nothing() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.complete(A, 0)
    t.mark_committed({A: 1})
    assert t.revoke([A, B]) == {}


def test_add_says_whether_the_offset_is_new() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    assert tracker.add("p", 5) is True
    assert tracker.add("p", 5) is False, "a repeated offset must not be processed again"
    assert tracker.add("p", 4) is False
    assert tracker.complete("p", 5)
    assert tracker.add("p", 5) is False, "nor a finished one"
    assert tracker.add("p", 6) is True
