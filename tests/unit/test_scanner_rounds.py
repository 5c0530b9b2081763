"""A scanner's rounds over a deep backlog (bucketer/scanner.py ``_due``): bounded, fair across
lanes, oldest first within a lane, and every timer handed once. Pure logic: the timers are put
in the scanner's memory as its reads would leave them; nothing here reads or writes a store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import cast

from bucketer.cassandra import CassandraTimerStore
from bucketer.model import Timer
from bucketer.scanner import ShardProgress, WheelScanner

NOW = datetime(2026, 12, 4, 17, 0, tzinfo=UTC)


class _ByPrefix:
    """The lane of a timer is its key up to the first "-" (a tenant)."""

    def lane(self, timer: Timer) -> str:
        return timer.key.split("-", 1)[0]

    def weight(self, lane: str) -> int:
        return 1


def _scanner(handed: list[list[Timer]], *, lanes: bool = True) -> WheelScanner:
    async def on_due(batch: list[Timer]) -> None:
        handed.append(batch)

    # The store is never reached: rounds work on what is already in memory.
    return WheelScanner(
        cast(CassandraTimerStore, None),
        on_due,
        batch=100,
        batches_in_flight=2,
        lanes=_ByPrefix() if lanes else None,
        clock=lambda: NOW,
    )


def _fill(scanner: WheelScanner, timers: list[Timer]) -> None:
    for t in sorted(timers, key=lambda t: t.position):  # a read leaves them in this order
        p = scanner.shards.setdefault(
            t.shard, ShardProgress(shard=t.shard, epoch=1, done_through=0)
        )
        p.pending.put(t, _ByPrefix().lane(t) if scanner._lanes is not None else "")


def _position_of(t: Timer) -> tuple[datetime, str]:
    return (t.fire_time, t.timer_id)


def _timer(key: str, shard: int, at: datetime, n: int) -> Timer:
    return Timer(fire_time=at, timer_id=f"{key}-{n:06d}", shard=shard, kind="t", key=key)


def test_a_round_over_a_herd_hands_the_other_lane_first_and_stays_bounded() -> None:
    herd_at = NOW - timedelta(seconds=5)
    herd = [_timer(f"a-{i}", i % 4, herd_at, i) for i in range(20_000)]
    # One timer of another tenant, due in the same second, read last of its shard.
    other = _timer("b-1", 3, herd_at, 999_999)
    handed: list[list[Timer]] = []
    scanner = _scanner(handed)
    _fill(scanner, [*herd, other])

    due, waiting = scanner._due(NOW)
    assert len(due) == 201 and waiting == 20_001 - 201  # a's 200 oldest, and b's one
    assert other in due
    assert [t.timer_id for t in due if t.key != "b-1"] == sorted(t.timer_id for t in herd)[:200]

    asyncio.run(scanner.fire_due())
    first = [t for batch in handed for t in batch]
    assert other in first and len(first) <= 200
    assert scanner._backlog  # the next round starts at once


def test_rounds_drain_a_backlog_oldest_first_each_timer_once() -> None:
    timers = [
        _timer(f"a-{i}", i % 8, NOW - timedelta(seconds=60 - i % 50), i) for i in range(3_000)
    ] + [_timer(f"c-{i}", i % 8, NOW - timedelta(seconds=30), i) for i in range(500)]
    handed: list[list[Timer]] = []
    scanner = _scanner(handed)
    _fill(scanner, timers)
    rounds: list[list[Timer]] = []
    while any(p.pending for p in scanner.shards.values()):
        before = len(handed)
        asyncio.run(scanner.fire_due())
        rounds.append([t for batch in handed[before:] for t in batch])
        assert len(rounds) < 100
    out = [t for r in rounds for t in r]
    assert len(out) == len(timers) and len(set(out)) == len(timers)
    # Within a lane, every round takes the oldest timer left (the backlog's head always moves;
    # timers due later take turns with it), and each lane's rounds end oldest first once only
    # its head is left.
    for lane in ("a", "c"):
        left = sorted((t for t in timers if t.key.startswith(lane + "-")), key=_position_of)
        for r in rounds:
            mine = {t for t in r if t.key.startswith(lane + "-")}
            if left:
                assert left[0] in mine
            left = [t for t in left if t not in mine]
        assert not left


def test_a_single_lane_takes_larger_rounds_and_without_lanes_everything_goes() -> None:
    herd_at = NOW - timedelta(seconds=1)
    herd = [_timer(f"a-{i}", i % 4, herd_at, i) for i in range(5_000)]
    scanner = _scanner([])
    _fill(scanner, herd)
    due, waiting = scanner._due(NOW)
    assert len(due) == 1_600 and waiting == 3_400  # batch 100 x 2 in flight x 8
    unfair = _scanner([], lanes=False)
    _fill(unfair, herd)
    assert unfair._due(NOW) == (sorted(herd, key=lambda t: t.position), 0)


def test_timers_not_yet_due_are_left_out() -> None:
    scanner = _scanner([])
    _fill(
        scanner,
        [
            _timer("a-1", 0, NOW - timedelta(seconds=1), 1),
            _timer("a-2", 0, NOW + timedelta(seconds=1), 2),
        ],
    )
    due, waiting = scanner._due(NOW)
    assert [t.timer_id for t in due] == ["a-1-000001"] and waiting == 0


def test_a_read_starts_no_earlier_than_grace_before_the_last_read_began() -> None:
    p = ShardProgress(shard=1, epoch=1, done_through=0)
    bucket = 29_940_000
    grace = timedelta(seconds=2)
    assert p.read_from(bucket, grace) == p.after(bucket)  # never read: from the checkpoint
    p.checkpoints[bucket] = (NOW - timedelta(minutes=3), "")  # a herd still pending behind it
    p.read_at = NOW
    assert p.read_from(bucket, grace) == (NOW - grace, "")
    p.checkpoints[bucket] = (NOW, "x")  # a checkpoint later than that wins
    assert p.read_from(bucket, grace) == (NOW, "x")


def test_a_herd_backlog_leaves_room_for_the_same_lanes_later_timers() -> None:
    # A tenant's herd, due a minute ago and still draining, and that tenant's schedules of
    # the current second: they go in the next round, not after the whole backlog.
    herd_at = NOW - timedelta(seconds=60)
    herd = [_timer(f"a-{i}", i % 4, herd_at, i) for i in range(20_000)]
    fresh = [_timer(f"a-new{i}", i % 4, NOW - timedelta(milliseconds=300), i) for i in range(50)]
    handed: list[list[Timer]] = []
    scanner = _scanner(handed)
    _fill(scanner, [*herd, *fresh])

    due, waiting = scanner._due(NOW)
    # A round as short as when lanes take turns (batch 100 x 2 in flight), not eight times it.
    assert len(due) == 200 and waiting == 20_050 - 200
    assert set(fresh) <= set(due)
    # The rest of the round is the backlog's oldest.
    backlog = sorted(herd, key=lambda t: t.position)[:150]
    assert [t for t in due if t not in fresh] == backlog

    asyncio.run(scanner.fire_due())
    assert set(fresh) <= {t for batch in handed for t in batch}


def test_timers_due_seconds_after_a_herd_are_not_held_behind_it() -> None:
    # The seconds right after a herd's: already a few seconds old when a round gets to them,
    # they are still due after the herd's head, so they take turns with it.
    herd_at = NOW - timedelta(seconds=10)
    herd = [_timer(f"a-{i}", i % 4, herd_at, i) for i in range(20_000)]
    after = [_timer(f"a-s{i}", i % 4, herd_at + timedelta(seconds=3 + i % 5), i) for i in range(60)]
    # And one due within the herd's second, a moment after its instant.
    after.append(_timer("a-soon", 1, herd_at + timedelta(milliseconds=150), 1))
    scanner = _scanner([])
    _fill(scanner, [*herd, *after])
    due, _ = scanner._due(NOW)
    assert set(after) <= set(due) and len(due) == 200


def test_later_timers_take_at_most_half_a_round_while_the_head_waits() -> None:
    herd = [_timer(f"a-{i}", i % 4, NOW - timedelta(seconds=60), i) for i in range(1_000)]
    fresh = [_timer(f"a-new{i}", i % 4, NOW, i) for i in range(1_000)]
    scanner = _scanner([])
    _fill(scanner, [*herd, *fresh])
    due, _ = scanner._due(NOW)
    assert len(due) == 200
    later = set(fresh)
    assert sum(t in later for t in due) == 100  # half the later ones, half the herd's oldest
    # Oldest first within each half.
    assert [t for t in due if t in later] == sorted(fresh, key=lambda t: t.position)[:100]


def test_a_herd_alone_still_drains_in_large_rounds() -> None:
    herd = [_timer(f"a-{i}", i % 4, NOW - timedelta(seconds=30), i) for i in range(5_000)]
    scanner = _scanner([])
    _fill(scanner, herd)
    due, waiting = scanner._due(NOW)
    assert len(due) == 1_600 and waiting == 3_400  # nothing due after its head: 8x rounds


def test_pruning_forgets_handed_timers_a_re_read_cannot_meet_bucket_by_bucket() -> None:
    # A re-read starts after a bucket's checkpoint, and a finished bucket is never read again:
    # handed positions at or before the checkpoint, or in a finished bucket, are forgotten;
    # the rest are kept until the checkpoint passes them.
    handed: list[list[Timer]] = []
    scanner = _scanner(handed)
    minute = NOW.replace(second=0)
    old, herd_bucket = _timer("a", 0, minute - timedelta(minutes=1), 0), _timer("a", 0, NOW, 1)
    later = _timer("a", 0, NOW + timedelta(seconds=5), 2)
    _fill(scanner, [old, herd_bucket, later])
    asyncio.run(scanner._deliver([old, herd_bucket, later]))
    p = scanner.shards[0]
    assert p.handed == {
        old.bucket: {old.position},
        herd_bucket.bucket: {herd_bucket.position, later.position},
    }
    p.done_through = old.bucket  # the old minute is finished
    p.checkpoints[herd_bucket.bucket] = (NOW, "~")  # past the herd's timer, not the later one
    WheelScanner._prune_handed(p)
    assert p.handed == {herd_bucket.bucket: {later.position}}
    p.checkpoints[herd_bucket.bucket] = (later.fire_time, "~")
    WheelScanner._prune_handed(p)
    assert p.handed == {} and p.pruned_at == {}
