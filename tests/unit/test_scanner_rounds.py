"""A scanner's rounds over a deep backlog (bucketer/scanner.py ``_due``): bounded, fair across
lanes, oldest first within a lane, and every timer handed once. Pure logic: the timers are put
in the scanner's memory as its reads would leave them; nothing here reads or writes a store."""

from __future__ import annotations

import asyncio
import itertools
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
        p.pending[t.position] = t


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
    # Within a lane, oldest first from round to round (a round's batches go out together).
    for lane in ("a", "c"):
        mine = [[t.position for t in r if t.key.startswith(lane + "-")] for r in rounds]
        mine = [r for r in mine if r]
        assert all(max(r) < min(later) for r, later in itertools.pairwise(mine))


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
