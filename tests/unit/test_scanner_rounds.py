"""A scanner's rounds over a deep backlog (bucketer/scanner.py ``_due``): bounded, fair across
lanes, oldest first within a lane, and every timer handed once. Pure logic: the timers are put
in the scanner's memory as its reads would leave them; nothing here reads or writes a store."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest

from bucketer.cassandra import CassandraTimerStore
from bucketer.keys import minute_bucket
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


# Half a minute into a minute bucket: these tests' timers and checkpoints stay in it.
MID = NOW + timedelta(seconds=30)


class _Sends:
    """An ``OnDue`` that plans at once and keeps each batch's sending open until told: what
    the dispatcher's fire-ahead does while it holds messages until their slots."""

    def __init__(self) -> None:
        self.batches: list[list[Timer]] = []
        self.open: list[asyncio.Future[None]] = []

    async def __call__(self, batch: list[Timer]) -> asyncio.Future[None]:
        self.batches.append(batch)
        sending = asyncio.get_running_loop().create_future()
        self.open.append(sending)
        return sending


async def _turns() -> None:
    """A few turns of the event loop: a sending that ended is seen, its task done."""
    for _ in range(5):
        await asyncio.sleep(0)


def _sending_scanner(sends: _Sends) -> WheelScanner:
    # No checkpoint is written in these tests (the store is never reached): none is due.
    return WheelScanner(
        cast(CassandraTimerStore, None),
        sends,
        batch=100,
        clock=lambda: MID,
        checkpoint_every=timedelta(days=1e6),
    )


def _sending_with(timers: list[Timer]) -> tuple[_Sends, WheelScanner]:
    """A scanner over ``_Sends`` holding ``timers`` as a read just done leaves them."""
    sends = _Sends()
    scanner = _sending_scanner(sends)
    _fill(scanner, timers)
    _read(scanner)
    return sends, scanner


def _read(scanner: WheelScanner) -> None:
    """What a read just done leaves: everything due by a second from now is read."""
    for p in scanner.shards.values():
        p.read_until, p.read_at = MID + timedelta(seconds=1), MID
        p.done_through = minute_bucket(MID) - 1


def test_a_round_does_not_wait_for_its_batches_sending_and_they_hold_the_checkpoint() -> None:
    first = _timer("a-1", 0, MID - timedelta(seconds=5), 1)
    second = _timer("a-2", 0, MID - timedelta(seconds=4), 2)
    sends, scanner = _sending_with([first, second])
    p = scanner.shards[0]

    async def scenario() -> None:
        # The round returns with its batch still sending: the next round can be planned.
        assert await asyncio.wait_for(scanner.fire_due(), 1) == 2
        assert len(sends.open) == 1 and not p.pending
        assert set(p.in_flight) == {first.position, second.position}
        # A re-read meets them (a re-read window covers them) and passes over them.
        assert scanner._known(first.bucket)(0, first.position, first.data)
        scanner._take(p, first.bucket, [first, second])
        assert not p.pending
        # The next round finds nothing to hand again.
        assert await scanner.fire_due() == 0
        # No checkpoint passes the first timer whose batch is still sending.
        await scanner.record_progress()
        assert p.after(first.bucket) <= first.position
        sends.open[0].set_result(None)
        await _turns()
        assert not p.in_flight and p.handed[first.bucket] == {first.position, second.position}
        await scanner.record_progress()
        assert p.after(first.bucket) > second.position

    asyncio.run(scenario())


def test_a_batch_whose_sending_failed_is_handed_again_and_its_sending_awaited() -> None:
    timers = [_timer(f"a-{i}", 0, MID - timedelta(seconds=5 - i), i) for i in range(3)]
    sends, scanner = _sending_with(timers)
    p = scanner.shards[0]

    async def scenario() -> None:
        await scanner.fire_due()
        sends.open[0].set_exception(ConnectionError("broker gone"))
        await _turns()
        # Pending again, and held at the checkpoint meanwhile.
        assert not p.in_flight and len(p.pending) == 3
        await scanner.record_progress()
        assert p.after(timers[0].bucket) <= timers[0].position
        # Handed again: this round waits for the sending, so a second failure is the round's
        # (split in halves, then raised as the batch's transient error).
        round_ = asyncio.create_task(scanner.fire_due())
        await asyncio.sleep(0.01)
        assert not round_.done() and len(sends.open) == 2
        sends.open[1].set_result(None)
        assert await asyncio.wait_for(round_, 1) == 3
        assert not p.pending and not p.in_flight and not scanner._resend
        assert p.handed[timers[0].bucket] == {t.position for t in timers}

    asyncio.run(scenario())


def test_a_stopped_scanner_cancels_the_sending_it_was_waiting_for() -> None:
    t = _timer("a-1", 0, MID - timedelta(seconds=1), 1)
    sends, scanner = _sending_with([t])

    async def scenario() -> None:
        await scanner.fire_due()
        (task,) = scanner._sending
        running = asyncio.create_task(scanner.run())
        await asyncio.sleep(0.01)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        assert task.cancelled() and sends.open[0].cancelled()
        # Never handed: its checkpoint still holds it for the shard's next owner.
        assert t.position in scanner.shards[0].in_flight

    asyncio.run(scenario())


def test_a_sending_cancelled_by_its_sender_counts_as_failed() -> None:
    t = _timer("a-1", 0, MID - timedelta(seconds=1), 1)
    sends, scanner = _sending_with([t])

    async def scenario() -> None:
        await scanner.fire_due()
        sends.open[0].cancel()
        await _turns()
        p = scanner.shards[0]
        assert not p.in_flight and t.position in p.pending and t.position in scanner._resend

    asyncio.run(scenario())


def test_a_lost_shard_takes_its_timers_marks_with_it() -> None:
    # A batch whose sending failed marks its timers to be sent again; the shard lost before
    # they were handed again leaves no mark behind (no round would ever meet them again).
    mine = _timer("a-1", 0, MID - timedelta(seconds=2), 1)
    other = _timer("b-1", 1, MID - timedelta(seconds=1), 2)
    sends, scanner = _sending_with([mine, other])

    async def scenario() -> None:
        await scanner.fire_due()
        sends.open[0].set_exception(ConnectionError("broker gone"))
        await _turns()
        assert scanner._resend == {mine.position, other.position}
        scanner._strikes[mine.position] = 1
        scanner.remove_shard(0)
        assert scanner._resend == {other.position} and scanner._strikes == {}

    asyncio.run(scenario())


def test_rounds_go_on_while_a_read_waits_for_cassandra() -> None:
    """A read runs beside the rounds: timers already read and falling due are handed while
    the next read still waits for its rows (130-220 ms on a busy box, every tick)."""

    class SlowReads:
        """A store whose multi-shard scans wait until released; nothing else is reached."""

        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.scans = 0

        async def scan_shards(self, **_: object) -> dict[int, object]:
            self.scans += 1
            await self.release.wait()
            return {}

    store = SlowReads()
    handed: list[Timer] = []

    async def on_due(batch: list[Timer]) -> None:
        handed.extend(batch)

    now = [MID]
    scanner = WheelScanner(
        cast(CassandraTimerStore, store),
        on_due,
        clock=lambda: now[0],
        checkpoint_every=timedelta(days=1e6),
    )
    soon = _timer("a-1", 0, MID + timedelta(milliseconds=50), 1)
    _fill(scanner, [soon])
    _read(scanner)

    async def scenario() -> None:
        running = asyncio.create_task(scanner.run())
        try:
            await asyncio.sleep(0.02)
            assert store.scans == 1 and not handed  # reading, and nothing due yet
            now[0] = MID + timedelta(milliseconds=60)
            scanner._wake.set()
            await asyncio.sleep(0.05)
            assert handed == [soon] and store.scans == 1  # the read still waits
            store.release.set()
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        assert scanner._reading is None

    asyncio.run(scenario())


def test_shards_progress_is_written_together_not_one_shard_after_another() -> None:
    """Every shard's checkpoint comes due in the same pass (every ``checkpoint_every``): one
    LWT after the other, 64 round trips held the scanner's loop, and the next round."""

    class Checkpoints:
        """A store that records how many checkpoint writes it has at once."""

        def __init__(self) -> None:
            self.writing = 0
            self.most = 0
            self.written: list[int] = []

        async def advance_checkpoint(self, shard: int, *_: object) -> None:
            self.writing += 1
            self.most = max(self.most, self.writing)
            await asyncio.sleep(0.01)
            self.writing -= 1
            self.written.append(shard)

    store = Checkpoints()

    async def on_due(batch: list[Timer]) -> None:
        return None

    scanner = WheelScanner(cast(CassandraTimerStore, store), on_due, clock=lambda: MID)
    bucket = minute_bucket(MID)
    for shard in range(32):
        p = ShardProgress(shard=shard, epoch=1, done_through=bucket - 1)
        p.read_until, p.read_at = MID, MID
        p.dirty.add(bucket)
        p.last_flush = float("-inf")
        scanner.shards[shard] = p
    asyncio.run(scanner.record_progress())
    assert sorted(store.written) == list(range(32))
    assert 1 < store.most <= 16


def test_the_next_round_of_timers_handed_ahead_gathers_a_window_while_one_is_sending() -> None:
    """A round handed ahead that held its messages until its last slot gathered what fell due
    meanwhile, and the next one began at once; one that did not (its batches still sending)
    leaves a third of the fire-ahead (at least the coalescing window) to gather the next
    round's worth, not the few timers that fell due while it was planned."""
    sends = _Sends()
    scanner = WheelScanner(
        cast(CassandraTimerStore, None),
        sends,
        batch=100,
        busy_round=1,
        clock=lambda: MID,
        ahead={"t": timedelta(milliseconds=300)},
    )
    _fill(scanner, [_timer("a-1", 0, MID + timedelta(milliseconds=200), 1)])
    _read(scanner)
    due_soon = MID + timedelta(milliseconds=250)  # within the fire-ahead: its time has come

    async def scenario() -> None:
        assert await scanner.fire_due() == 1
        assert scanner._sending
        assert scanner._ahead_wait(due_soon, MID) == scanner.coalescing_window() == 0.1
        # A third of a wider fire-ahead: fewer, larger rounds.
        scanner._ahead = {"t": timedelta(milliseconds=600)}
        assert scanner._ahead_wait(due_soon, MID) == pytest.approx(0.2)
        sends.open[0].set_result(None)
        await _turns()
        assert not scanner._sending
        assert scanner._ahead_wait(due_soon, MID) == 0.0

    asyncio.run(scenario())


def test_batches_still_sending_are_bounded() -> None:
    """A backlog is planned faster than it is sent: a round waits for batches still sending
    once there are two for each batch it may have in flight."""
    sends = _Sends()
    scanner = WheelScanner(
        cast(CassandraTimerStore, None),
        sends,
        batch=10,
        batches_in_flight=2,
        clock=lambda: MID,
        checkpoint_every=timedelta(days=1e6),
    )
    _fill(scanner, [_timer(f"a-{i}", i % 4, MID - timedelta(seconds=5), i) for i in range(60)])
    _read(scanner)

    async def scenario() -> None:
        round_ = asyncio.create_task(scanner.fire_due())
        for _ in range(10):
            await _turns()
        assert len(sends.open) == 4 and not round_.done()  # 2 in flight x 2 sending each
        sends.open[0].set_result(None)
        for _ in range(10):
            await _turns()
        assert len(sends.open) == 5
        for sending in sends.open[1:]:
            sending.set_result(None)
        for _ in range(10):
            await _turns()
            for sending in sends.open:
                if not sending.done():
                    sending.set_result(None)
        assert await asyncio.wait_for(round_, 1) == 60

    asyncio.run(scenario())
