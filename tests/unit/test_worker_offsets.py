"""OffsetTracker: commit only past a finished prefix of what each partition delivered."""

from __future__ import annotations

from worker.offsets import Commit, OffsetTracker, decode_finished, encode_finished

A = ("runs", 0)
B = ("runs", 1)


def C(offset: int, *finished: int) -> Commit:
    return Commit(offset=offset, finished=finished)


def test_in_order_completion_commits_one_past_the_last() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(3):
        t.add(A, o)
    assert t.committable() == {}
    for o in range(3):
        assert t.complete(A, o)
    assert t.committable() == {A: C(3)}


def test_out_of_order_completion_waits_for_the_gap() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(5):
        t.add(A, o)
    t.complete(A, 2)
    t.complete(A, 4)
    # The commit point stays at 0, and the commit carries what finished above it.
    assert t.committable() == {A: C(0, 2, 4)}
    t.complete(A, 0)
    assert t.committable() == {A: C(1, 2, 4)}
    t.complete(A, 1)
    assert t.committable() == {A: C(3, 4)}
    t.complete(A, 3)
    assert t.committable() == {A: C(5)}
    assert t.in_flight(A) == 0


def test_offset_holes_from_compaction_do_not_block() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in (10, 11, 15, 16):
        t.add(A, o)
    t.complete(A, 16)
    t.complete(A, 10)
    t.complete(A, 11)
    assert t.committable() == {A: C(12, 16)}
    t.complete(A, 15)
    assert t.committable() == {A: C(17)}


def test_partitions_are_independent() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.add(B, 7)
    t.add(B, 8)
    t.complete(B, 7)
    assert t.committable() == {B: C(8)}
    assert t.in_flight() == 2


def test_mark_committed_hides_until_progress() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.add(A, 1)
    t.complete(A, 0)
    t.mark_committed(t.committable())
    assert t.committable() == {}
    t.complete(A, 1)
    assert t.committable() == {A: C(2)}


def test_unknown_repeated_and_untracked_offsets_are_ignored() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.add(A, 0)  # a repeat is ignored
    assert t.in_flight(A) == 1
    assert not t.complete(A, 5)  # never delivered
    assert not t.complete(B, 0)  # unknown partition
    assert t.complete(A, 0)
    assert not t.complete(A, 0)  # twice
    assert t.committable() == {A: C(1)}
    t.add(A, 0)  # older than the commit point
    assert t.in_flight(A) == 0


def test_revocation_returns_the_committable_part_and_forgets() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(3):
        t.add(A, o)
        t.add(B, o)
    t.complete(A, 0)
    t.complete(A, 2)
    assert t.revoke([A]) == {A: C(1, 2)}
    assert t.partitions() == [B]
    # A handler of the revoked partition finishing late changes nothing.
    assert not t.complete(A, 1)
    assert t.committable() == {}
    # Reassigned later: tracking starts afresh.
    t.add(A, 1)
    t.complete(A, 1)
    assert t.committable() == {A: C(2)}


def test_revoking_an_already_committed_partition_returns_nothing() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.add(A, 0)
    t.complete(A, 0)
    t.mark_committed({A: C(1)})
    assert t.revoke([A, B]) == {}


def test_add_says_whether_the_offset_is_new() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    assert tracker.add("p", 5) is True
    assert tracker.add("p", 5) is False, "a repeated offset must not be processed again"
    assert tracker.add("p", 4) is False
    assert tracker.complete("p", 5)
    assert tracker.add("p", 5) is False, "nor a finished one"
    assert tracker.add("p", 6) is True


def test_a_pinned_partition_commits_what_finished_above_the_pin() -> None:
    """One long run at offset 0 pins the commit point; every commit still says what finished
    after it, and a change of that set alone is worth a commit."""
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(4):
        t.add(A, o)
    t.complete(A, 1)
    t.mark_committed(t.committable())
    assert t.committable() == {}
    t.complete(A, 3)
    assert t.committable() == {A: C(0, 1, 3)}


def test_the_next_owner_skips_what_the_previous_one_finished() -> None:
    previous: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(100, 106):
        previous.add(A, o)
    for o in (101, 102, 104):
        previous.complete(A, o)
    last = previous.committable()[A]
    assert last == C(100, 101, 102, 104)
    # The previous owner dies; the next one reads the commit (offset and metadata) back.
    nxt: OffsetTracker[tuple[str, int]] = OffsetTracker()
    nxt.restore(A, last.offset, decode_finished(last.offset, last.metadata))
    ran: list[int] = []
    for o in range(100, 107):
        assert nxt.add(A, o)
        if nxt.inherited(A, o):
            nxt.complete(A, o)
        else:
            ran.append(o)
    assert ran == [100, 103, 105, 106]
    # Until the commit point passes them, the inherited offsets travel with every commit.
    nxt.complete(A, 103)
    assert nxt.committable() == {A: C(100, 101, 102, 103, 104)}
    nxt.complete(A, 100)
    assert nxt.committable() == {A: C(105)}


def test_a_restored_partition_commits_nothing_until_something_changes() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    t.restore(A, 50, [52, 40])  # 40 is below the commit point: meaningless, dropped
    assert t.committable() == {}
    assert not t.inherited(A, 40)
    assert t.add(A, 50) and not t.add(A, 49)


def test_hand_over_commits_the_running_offsets_as_finished() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    for o in range(5):
        t.add(A, o)
    t.complete(A, 1)
    assert t.revoke([A]) == {A: C(0, 1)}
    for o in range(5):
        t.add(B, o)
    t.complete(B, 1)
    assert t.revoke([B], hand_over=True) == {B: C(5)}


def test_finished_offsets_round_trip_through_the_metadata() -> None:
    finished = [101, 102, 103, 107, 200, 201, 5000]
    text = encode_finished(100, [*finished, 99, 95])
    assert text.startswith("cs1:")
    assert decode_finished(100, text) == finished
    assert encode_finished(100, []) == ""
    assert decode_finished(100, "") == []


def test_metadata_of_others_or_malformed_is_ignored() -> None:
    assert decode_finished(0, "some other tool's note") == []
    assert decode_finished(0, "cs1:zz") == []
    assert decode_finished(0, "cs1:-1") == []
    assert decode_finished(0, "cs1:0+ffffffffff") == [], "absurd ranges are refused"


def test_metadata_past_the_limit_drops_the_highest_offsets() -> None:
    scattered = list(range(0, 20_000, 2))
    text = encode_finished(0, scattered, limit=200)
    assert len(text) <= 200
    kept = decode_finished(0, text)
    assert kept == scattered[: len(kept)] and 0 < len(kept) < len(scattered)
