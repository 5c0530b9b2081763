"""Firing without a schedule read (scheduler.schedule_cache), against the real Cassandra and
Kafka: the run fired at a slot has its end noted on the schedule's next fire timer by the API,
and the dispatcher fires that timer from its cache; an announced change, a run still in
progress, or a note that never reached the timer make it read the schedule as before."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from scheduler.cassandra import CassandraScheduleStore
from scheduler.config import Config
from scheduler.errors import Unavailable
from scheduler.lifecycle import Lifecycle
from scheduler.model import (
    DONE_NOTE_LEAD,
    RunStatus,
    ScheduleSpec,
    ScheduleState,
    SpecKind,
    run_id_for,
)
from scheduler.service import ScheduleService
from scheduler.timers import FIRE, FireTimer
from tests.integration.firing_support import (
    MINUTE,
    FiringRig,
    every_minute,
    next_fire_timer,
    open_firing_rig,
    read_run_messages,
    report_slot,
)


@pytest.fixture
async def rig(migrated: Config) -> AsyncIterator[FiringRig]:
    async with open_firing_rig(migrated, "cache") as opened:
        yield opened


async def test_a_run_s_end_noted_on_the_next_timer_lets_it_fire_without_a_read(
    rig: FiringRig,
) -> None:
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    assert rig.schedules.reads == [s.schedule_id]  # not cached yet

    (message,) = await read_run_messages(rig.bootstrap, rig.topic)
    nxt = slot + MINUTE
    assert message.next_fire_time.ToDatetime(tzinfo=UTC) == nxt
    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, nxt)
    # Noted on the timer, and the schedule row left alone.
    timer = next_fire_timer(rig, s.schedule_id, slot)
    assert timer.done_run == run_id_for(s.schedule_id, slot)
    assert (await rig.stores.schedules.get(s.schedule_id)).done_run == ""

    await rig.firing.on_due([timer])
    assert rig.schedules.reads == [s.schedule_id], "the second slot read no schedule"
    fired = await rig.stores.runs.get(run_id_for(s.schedule_id, nxt))
    assert fired.status is RunStatus.ENQUEUED
    messages = await read_run_messages(rig.bootstrap, rig.topic)
    assert [m.run_id for m in messages] == [message.run_id, fired.run_id]
    assert messages[1].payload == s.payload and messages[1].handler == s.handler


async def test_an_announced_change_is_read_before_the_next_firing(rig: FiringRig) -> None:
    """A pause that keeps the generation (so only the announcement can tell): the next slot
    reads the schedule, finds it paused, and fires nothing."""
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, slot + MINUTE)
    current = await rig.stores.schedules.get(s.schedule_id)
    assert await rig.stores.schedules.change_state(
        current,
        state=ScheduleState.PAUSED,
        generation=current.generation,
        now=datetime.now(UTC),
        next_fire_time=None,
    )
    await rig.firing.on_due([next_fire_timer(rig, s.schedule_id, slot)])
    assert rig.schedules.reads == [s.schedule_id] * 2
    assert [m.run_id for m in await read_run_messages(rig.bootstrap, rig.topic)] == [
        run_id_for(s.schedule_id, slot)
    ]


async def test_a_run_still_in_progress_is_read_and_skips_the_slot(rig: FiringRig) -> None:
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.RUNNING, slot + MINUTE)
    timer = next_fire_timer(rig, s.schedule_id, slot)
    assert timer.done_run == ""
    await rig.firing.on_due([timer])
    assert rig.schedules.reads == [s.schedule_id] * 2
    skipped = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + MINUTE))
    assert (skipped.status, skipped.skip_reason) == (RunStatus.SKIPPED, "overlap")


async def test_an_ended_run_whose_note_the_timer_missed_is_found_by_its_run_row(
    rig: FiringRig,
) -> None:
    """The note landed after the scanner had read the timer (or on a timer a quota put off):
    the schedule row still shows the run in progress; its run row says it ended, so the slot
    fires."""
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, slot + MINUTE)
    read_early = replace(next_fire_timer(rig, s.schedule_id, slot), done_run="")
    await rig.firing.on_due([read_early])
    assert rig.schedules.reads == [s.schedule_id] * 2
    fired = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + MINUTE))
    assert fired.status is RunStatus.ENQUEUED


async def test_an_end_reported_too_close_to_the_next_slot_is_found_from_the_run_row(
    rig: FiringRig,
) -> None:
    """Too late to note on the next timer: nothing goes on the schedule row either (the run
    was never marked there); the next slot reads the run row, finds it ended, and fires."""
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    soon = datetime.now(UTC) + DONE_NOTE_LEAD - timedelta(seconds=1)
    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, soon)
    row = await rig.stores.schedules.get(s.schedule_id)
    assert (row.active_run, row.done_run) == ("", "")
    timer = next_fire_timer(rig, s.schedule_id, slot)
    assert timer.done_run == ""
    await rig.firing.on_due([timer])
    fired = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + MINUTE))
    assert fired.status is RunStatus.ENQUEUED


async def test_a_slot_s_run_is_marked_in_progress_on_its_next_timer_not_the_schedule_row(
    rig: FiringRig,
) -> None:
    """Decision 0013: no overlap cell is written for the run of a slot whose end can be noted
    on the next fire timer; that timer names it instead."""
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    row = await rig.stores.schedules.get(s.schedule_id)
    assert (row.active_run, row.active_seen) == ("", None)
    nxt = FireTimer.from_timer(next_fire_timer(rig, s.schedule_id, slot))
    assert nxt.running == (run_id_for(s.schedule_id, slot),)


async def test_a_slot_skipped_for_a_run_carries_it_on_to_the_slot_after(rig: FiringRig) -> None:
    """A run outlasting two slots: the first slot after it is skipped and its timer hands
    the run on; once the run ends (too late to note on any timer), the slot after fires."""
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.RUNNING, slot + MINUTE)
    await rig.firing.on_due([next_fire_timer(rig, s.schedule_id, slot)])
    skipped = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + MINUTE))
    assert skipped.skip_reason == "overlap"
    third = next_fire_timer(rig, s.schedule_id, slot + MINUTE)
    assert FireTimer.from_timer(third).running == (run_id,)
    # A dispatcher with nothing cached (the shard changed owner) still skips while it runs.
    rig.cache.forget(s.schedule_id)
    await rig.firing.on_due([third])
    again = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + 2 * MINUTE))
    assert again.skip_reason == "overlap"
    fourth = next_fire_timer(rig, s.schedule_id, slot + 2 * MINUTE)
    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, slot + MINUTE)
    await rig.firing.on_due([fourth])
    fired = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + 3 * MINUTE))
    assert fired.status is RunStatus.ENQUEUED


async def test_an_update_hands_the_run_in_progress_to_its_first_timer(rig: FiringRig) -> None:
    """The run in progress rode on the superseded chain's timer: the change's first timer
    names it too, so the new spec's first slot still skips for it."""
    svc = ScheduleService(schedules=rig.schedules, runs=rig.stores.runs, timers=rig.stores.timers)
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.RUNNING, slot + MINUTE)
    current = await svc.get(s.schedule_id)
    updated = await Lifecycle(svc).update(
        replace(current, spec=ScheduleSpec(kind=SpecKind.CRON, cron="30 * * * * *")),
        schedule_id=s.schedule_id,
        version=current.version,
    )
    (change,) = [
        t
        for t in (
            Timer.from_row(r, shard=r.shard)
            for r in rig.stores.session.execute(
                f"SELECT * FROM {rig.keyspace}.timers WHERE key = %s ALLOW FILTERING",
                (s.schedule_id,),
            )
        )
        if t.kind == FIRE and FireTimer.from_timer(t).generation == updated.generation
    ]
    assert FireTimer.from_timer(change).running == (run_id,)
    await rig.firing.on_due([change])
    at = FireTimer.from_timer(change).scheduled_for
    skipped = await rig.stores.runs.get(run_id_for(s.schedule_id, at))
    assert (skipped.status, skipped.skip_reason) == (RunStatus.SKIPPED, "overlap")


async def test_a_trigger_weighs_a_run_ended_on_the_timer_as_ended(rig: FiringRig) -> None:
    """The run fired at the slot is marked on the next fire timer, not the schedule row: a
    manual trigger under SKIP finds it from the run rows; while it runs, it skips; once it
    ended, it runs."""
    svc = ScheduleService(schedules=rig.schedules, runs=rig.stores.runs, timers=rig.stores.timers)
    s, first = await every_minute(rig.stores)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.RUNNING, slot + MINUTE)
    row = await svc.get(s.schedule_id)
    assert await svc.in_progress(row, datetime.now(UTC)) == [run_id_for(s.schedule_id, slot)]
    skipped = await Lifecycle(svc).trigger(s.schedule_id, force=False)
    assert skipped.status is RunStatus.SKIPPED

    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, slot + MINUTE)
    row = await svc.get(s.schedule_id)
    assert (row.active_run, row.done_run) == ("", "")
    assert await svc.in_progress(row, datetime.now(UTC)) == []
    triggered = await Lifecycle(svc).trigger(s.schedule_id, force=False)
    assert triggered.status is RunStatus.ENQUEUED and triggered.manual


async def test_a_change_whose_announcement_was_too_slow_is_not_made(rig: FiringRig) -> None:
    """A dispatcher may have looked past an announcement that took longer than
    ANNOUNCE_LIMIT to land: the API answers UNAVAILABLE and leaves the schedule as it was."""
    s, _first = await every_minute(rig.stores)
    current = await rig.stores.schedules.get(s.schedule_id)
    # Any announcement takes longer than no time at all.
    impatient = CassandraScheduleStore(
        rig.stores.session, keyspace=rig.keyspace, announce_limit=timedelta(0)
    )
    with pytest.raises(Unavailable, match="nothing was changed, try again"):
        await impatient.change_state(
            current,
            state=ScheduleState.PAUSED,
            generation=current.generation,
            now=datetime.now(UTC),
            next_fire_time=None,
        )
    after = await rig.stores.schedules.get(s.schedule_id)
    assert (after.state, after.version) == (ScheduleState.ACTIVE, current.version)
    # The announcement itself landed: dispatchers read the schedule afresh, which is harmless.
    since = datetime.now(UTC) - timedelta(minutes=1)
    changes = await rig.stores.schedules.changes(since, datetime.now(UTC))
    assert s.schedule_id in {sid for _at, sid in changes}


async def test_every_announcement_of_a_busy_minute_is_read(rig: FiringRig) -> None:
    """More changes in a minute than the driver's first page (5,000 rows, a bulk pause): each is
    read, not only the first page's (the cache would go on firing the rest as they were)."""
    ids = [f"bulk-{uuid.uuid4().hex[:8]}-{i}" for i in range(6_000)]
    since = datetime.now(UTC)
    await rig.stores.schedules.announce(ids)
    read = {sid for _, sid in await rig.stores.schedules.changes(since, datetime.now(UTC))}
    assert read >= set(ids), f"{len(set(ids) - read)} announcements not read"


async def test_a_change_landing_after_the_hold_is_announced_again(rig: FiringRig) -> None:
    """A change written later than dispatchers hold its schedule out of their caches (an API
    stalled between announcing and writing): one may have cached the row as it was, so the
    change is announced again once written. One that lands in time is announced once."""
    s, _first = await every_minute(rig.stores)

    async def announcements() -> int:
        since = datetime.now(UTC) - timedelta(minutes=1)
        changes = await rig.stores.schedules.changes(since, datetime.now(UTC))
        return sum(1 for _at, sid in changes if sid == s.schedule_id)

    current = await rig.stores.schedules.get(s.schedule_id)
    assert await rig.stores.schedules.change_state(
        current,
        state=ScheduleState.PAUSED,
        generation=current.generation,
        now=datetime.now(UTC),
        next_fire_time=None,
    )
    assert await announcements() == 1
    # Any change takes longer than no time at all.
    slow = CassandraScheduleStore(
        rig.stores.session, keyspace=rig.keyspace, announce_again_after=timedelta(0)
    )
    paused = await rig.stores.schedules.get(s.schedule_id)
    assert await slow.change_state(
        paused,
        state=ScheduleState.ACTIVE,
        generation=paused.generation,
        now=datetime.now(UTC),
        next_fire_time=None,
    )
    assert await announcements() == 3
    assert (await rig.stores.schedules.get(s.schedule_id)).state is ScheduleState.ACTIVE
