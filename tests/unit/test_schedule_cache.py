"""The dispatcher's schedule cache (scheduler.schedule_cache): when a fire timer may be decided
without reading its schedule, and how announced changes make it read again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from scheduler.model import (
    OverlapMode,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    ScheduleState,
    SpecKind,
)
from scheduler.schedule_cache import CHANGE_GRACE, HOLD, MAX_GAP, ScheduleCache

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


class Feed:
    """Announcements as ``schedule_changes`` holds them: (when, schedule id)."""

    def __init__(self) -> None:
        self.rows: list[tuple[datetime, str]] = []
        self.asked: list[tuple[datetime, datetime]] = []

    async def changes(self, since: datetime, until: datetime) -> Sequence[tuple[datetime, str]]:
        self.asked.append((since, until))
        return [(at, sid) for at, sid in self.rows if since <= at <= until]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _schedule(sid: str, overlap: OverlapMode = OverlapMode.SKIP, generation: int = 7) -> Schedule:
    return Schedule(
        schedule_id=sid,
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
        policies=SchedulePolicies(overlap=overlap),
        generation=generation,
        create_time=T0,
        update_time=T0,
    )


def _timer(sid: str, *, done: str = "", after_takeover: bool = False) -> Timer:
    return Timer(
        fire_time=T0,
        timer_id=sid,
        shard=0,
        kind="fire",
        key=sid,
        done_run=done,
        after_takeover=after_takeover,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def feed() -> Feed:
    return Feed()


@pytest.fixture
def cache(feed: Feed, clock: Clock) -> ScheduleCache:
    return ScheduleCache(feed, capacity=3, clock=clock)


async def test_a_fire_timer_is_decided_from_the_cache_only_when_its_last_run_is_noted_done(
    cache: ScheduleCache,
) -> None:
    await cache.refresh(T0)
    cache.put(_schedule("a"), active_run="")
    # Nothing known to have run: a SKIP schedule is read (another origin may have run).
    assert cache.ready_to_fire(_timer("a"), "a", 7) is None
    cache.ran("a", "a@1")
    assert cache.ready_to_fire(_timer("a", done="a@0"), "a", 7) is None  # another run ended
    assert cache.ready_to_fire(_timer("a"), "a", 7) is None  # no note: maybe still running
    assert cache.ready_to_fire(_timer("a", done="a@1"), "a", 7) == _schedule("a")
    # Not after a shard changed owner, nor for another generation.
    assert cache.ready_to_fire(_timer("a", done="a@1", after_takeover=True), "a", 7) is None
    assert cache.ready_to_fire(_timer("a", done="a@1"), "a", 8) is None


async def test_allow_needs_no_note_buffer_one_is_always_read_and_only_active_ones_fire(
    cache: ScheduleCache,
) -> None:
    await cache.refresh(T0)
    cache.put(_schedule("allow", OverlapMode.ALLOW), active_run="")
    cache.put(_schedule("buffer", OverlapMode.BUFFER_ONE), active_run="b@1")
    cache.put(replace(_schedule("paused"), state=ScheduleState.PAUSED), active_run="p@1")
    assert cache.ready_to_fire(_timer("allow"), "allow", 7) is not None
    assert cache.ready_to_fire(_timer("buffer", done="b@1"), "buffer", 7) is None
    assert cache.ready_to_fire(_timer("paused", done="p@1"), "paused", 7) is None


async def test_the_overlap_cells_are_not_kept(cache: ScheduleCache) -> None:
    """What the schedule row said was in progress when read is the cache's ``active_run``;
    the schedule handed out carries none of it."""
    await cache.refresh(T0)
    row = replace(_schedule("a"), active_run="a@1", done_run="a@0", active_seen=T0)
    cache.put(row, active_run="a@1")
    got = cache.ready_to_fire(_timer("a", done="a@1"), "a", 7)
    assert got is not None
    assert (got.active_run, got.done_run, got.active_seen) == ("", "", None)


async def test_an_announced_change_is_read_for_the_hold_then_cached_again(
    cache: ScheduleCache, feed: Feed, clock: Clock
) -> None:
    await cache.refresh(T0)
    cache.put(_schedule("a"), active_run="a@1")
    feed.rows.append((T0 + timedelta(seconds=1), "a"))
    clock.now = T0 + timedelta(seconds=2)
    await cache.refresh(clock.now)
    assert cache.ready_to_fire(_timer("a", done="a@1"), "a", 7) is None
    cache.put(_schedule("a"), active_run="a@1")  # a read during the hold is not kept
    assert len(cache) == 0
    # The same announcement read again within the grace does not restart the hold.
    clock.now = T0 + HOLD + timedelta(seconds=3)
    await cache.refresh(clock.now)
    cache.put(_schedule("a"), active_run="a@1")
    assert cache.ready_to_fire(_timer("a", done="a@1"), "a", 7) is not None


async def test_an_announcement_landing_late_is_still_seen_within_the_grace(
    cache: ScheduleCache, feed: Feed, clock: Clock
) -> None:
    await cache.refresh(T0)
    cache.put(_schedule("a"), active_run="a@1")
    clock.now = T0 + timedelta(seconds=1)
    await cache.refresh(clock.now)
    # Recorded at T0 + 0.5 s by a clock a little behind, landed after the look at T0 + 1 s.
    feed.rows.append((T0 + timedelta(milliseconds=500) - CHANGE_GRACE / 4, "a"))
    clock.now = T0 + timedelta(seconds=2)
    await cache.refresh(clock.now)
    assert cache.ready_to_fire(_timer("a", done="a@1"), "a", 7) is None


async def test_batches_asking_together_share_one_look(
    cache: ScheduleCache, feed: Feed, clock: Clock
) -> None:
    await cache.refresh(T0)
    await cache.refresh(T0)  # asked by a batch that began before that look ended
    assert len(feed.asked) == 1
    clock.now = T0 + timedelta(milliseconds=10)
    await cache.refresh(clock.now)
    assert len(feed.asked) == 2


async def test_a_long_gap_between_looks_forgets_everything(
    cache: ScheduleCache, clock: Clock
) -> None:
    await cache.refresh(T0)
    cache.put(_schedule("a"), active_run="a@1")
    clock.now = T0 + MAX_GAP + timedelta(seconds=1)
    await cache.refresh(clock.now)
    assert len(cache) == 0


async def test_the_least_recently_fired_are_evicted_beyond_capacity(cache: ScheduleCache) -> None:
    await cache.refresh(T0)
    for sid in ("a", "b", "c"):
        cache.put(_schedule(sid, OverlapMode.ALLOW), active_run="")
    assert cache.ready_to_fire(_timer("a"), "a", 7) is not None  # "a" is now the most recent
    cache.put(_schedule("d", OverlapMode.ALLOW), active_run="")
    assert len(cache) == 3
    assert cache.ready_to_fire(_timer("b"), "b", 7) is None
    assert cache.ready_to_fire(_timer("a"), "a", 7) is not None


async def test_capacity_zero_caches_nothing_and_reads_no_announcements(
    feed: Feed, clock: Clock
) -> None:
    off = ScheduleCache(feed, capacity=0, clock=clock)
    await off.refresh(T0)
    off.put(_schedule("a", OverlapMode.ALLOW), active_run="")
    assert off.ready_to_fire(_timer("a"), "a", 7) is None
    assert feed.asked == []
