"""The first timer of a change handed before the change's row landed (the API writes the timer
first, decision 0002), against the real Cassandra and Kafka: a new schedule's, or a resumed
schedule's under its new generation, is looked at again shortly rather than dropped, so the
schedule does not stop firing; a timer whose schedule stays missing, or that a later change
superseded, is dropped."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.keys import minute_bucket
from bucketer.model import Timer
from scheduler.config import Config
from scheduler.firing import IN_FLIGHT_RECHECK, IN_FLIGHT_WAIT, Firing
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.lifecycle import Lifecycle
from scheduler.model import (
    RunStatus,
    Schedule,
    ScheduleSpec,
    ScheduleState,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.service import ScheduleService
from scheduler.session import Stores, open_stores
from scheduler.timers import FireTimer
from tests.integration.firing_support import firing_on, read_run_messages


@pytest.fixture
async def rig(migrated: Config) -> AsyncIterator[tuple[Stores, Firing, str, str]]:
    stores = await open_stores(migrated)
    topic = f"{migrated.topic()}.race-{uuid.uuid4().hex[:6]}"
    await ensure_topics(migrated.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(migrated.kafka_bootstrap)
    await queue.start()
    try:
        yield (
            stores,
            firing_on(stores, queue, topic, migrated.keyspace),
            topic,
            (migrated.kafka_bootstrap),
        )
    finally:
        await queue.stop()
        stores.close()


def _draft(
    schedule_id: str,
    at: datetime,
    *,
    generation: int = 7,
    state: ScheduleState = ScheduleState.ACTIVE,
) -> Schedule:
    return Schedule(
        schedule_id=schedule_id,
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
        generation=generation,
        state=state,
        create_time=at,
        update_time=at,
    )


async def _rows_of(stores: Stores, timer: Timer, around: datetime) -> list[Timer]:
    """The rows of ``timer``'s id within a minute of ``around`` (whatever minute bucket)."""
    found: list[Timer] = []
    for bucket in range(minute_bucket(around) - 1, minute_bucket(around) + 2):
        found += await stores.timers.scan(
            shard=timer.shard,
            bucket=bucket,
            after=(around - timedelta(minutes=1), ""),
            until=around + timedelta(minutes=1),
            limit=100,
        )
    return [t for t in found if t.timer_id == timer.timer_id]


async def _handed_in_the_gap(
    stores: Stores, firing: Firing, timer: Timer, slot: datetime, bootstrap: str, topic: str
) -> list[Timer]:
    """Hands ``timer`` (due at ``slot``) while the change that wrote it has not landed: it is
    written again shortly after, not fired and not dropped. Returns the row written again."""
    await stores.timers.put([timer], now=slot)
    await firing.on_due([timer])
    again = [t for t in await _rows_of(stores, timer, slot) if t.fire_time > slot]
    assert len(again) == 1
    assert again[0].fire_time - datetime.now(UTC) <= IN_FLIGHT_RECHECK
    assert await read_run_messages(bootstrap, topic) == []
    return again


async def test_a_first_timer_handed_before_its_schedule_row_fires_once_the_row_is_there(
    rig: tuple[Stores, Firing, str, str],
) -> None:
    stores, firing, topic, bootstrap = rig
    slot = datetime.now(UTC).replace(microsecond=0)
    sid = f"race-{uuid.uuid4().hex[:8]}"
    first = FireTimer(schedule_id=sid, generation=7, slot=slot, scheduled_for=slot)
    # Handed while the API's insert of the schedule row is still in flight.
    again = await _handed_in_the_gap(
        stores, firing, first.to_timer(stores.timers.shard_count), slot, bootstrap, topic
    )
    # The row lands; the timer comes round again and fires the slot it was written for.
    await stores.schedules.create(_draft(sid, slot))
    await firing.on_due(again)
    run_id = run_id_for(sid, slot)
    row = (await stores.runs.get_many([run_id]))[run_id]
    assert row.status is RunStatus.ENQUEUED
    assert [m.run_id for m in await read_run_messages(bootstrap, topic)] == [run_id]


async def test_a_timer_whose_schedule_stays_missing_is_dropped_in_the_end(
    rig: tuple[Stores, Firing, str, str],
) -> None:
    stores, firing, _topic, _bootstrap = rig
    slot = (datetime.now(UTC) - IN_FLIGHT_WAIT - timedelta(seconds=1)).replace(microsecond=0)
    sid = f"gone-{uuid.uuid4().hex[:8]}"
    timer = FireTimer(schedule_id=sid, generation=7, slot=slot, scheduled_for=slot).to_timer(
        stores.timers.shard_count
    )
    await stores.timers.put([timer], now=slot)
    await firing.on_due([timer])
    assert [t.fire_time for t in await _rows_of(stores, timer, slot)] == [timer.fire_time]


async def test_a_resumed_schedules_first_timer_handed_before_the_resume_landed_fires_after_it(
    rig: tuple[Stores, Firing, str, str],
) -> None:
    """Resume writes its first timer under the new generation, then the row (PAUSED -> ACTIVE,
    that generation): handed in between, the timer finds the paused row and its old
    generation. Before the fix it was counted superseded and the schedule never fired again."""
    stores, firing, topic, bootstrap = rig
    slot = datetime.now(UTC).replace(microsecond=0)
    sid = f"resume-{uuid.uuid4().hex[:8]}"
    paused = _draft(sid, slot, generation=new_generation(), state=ScheduleState.PAUSED)
    await stores.schedules.create(paused)
    resumed_generation = new_generation()
    first = FireTimer(schedule_id=sid, generation=resumed_generation, slot=slot, scheduled_for=slot)
    again = await _handed_in_the_gap(
        stores, firing, first.to_timer(stores.timers.shard_count), slot, bootstrap, topic
    )
    stored = (await stores.schedules.get_many([sid]))[sid]
    assert await stores.schedules.change_state(
        stored,
        state=ScheduleState.ACTIVE,
        generation=resumed_generation,
        now=datetime.now(UTC),
        next_fire_time=slot,
    )
    await firing.on_due(again)
    run_id = run_id_for(sid, slot)
    assert (await stores.runs.get_many([run_id]))[run_id].status is RunStatus.ENQUEUED
    assert [m.run_id for m in await read_run_messages(bootstrap, topic)] == [run_id]


async def test_a_timer_a_later_change_superseded_is_dropped_at_once(
    rig: tuple[Stores, Firing, str, str],
) -> None:
    stores, firing, topic, bootstrap = rig
    slot = datetime.now(UTC).replace(microsecond=0)
    sid = f"superseded-{uuid.uuid4().hex[:8]}"
    current = new_generation()
    older = current - (1000 << 20)  # minted a second before the current one (not a tie)
    await stores.schedules.create(_draft(sid, slot, generation=current))
    timer = FireTimer(schedule_id=sid, generation=older, slot=slot, scheduled_for=slot).to_timer(
        stores.timers.shard_count
    )
    await stores.timers.put([timer], now=slot)
    await firing.on_due([timer])
    assert [t.fire_time for t in await _rows_of(stores, timer, slot)] == [timer.fire_time]
    assert await read_run_messages(bootstrap, topic) == []


async def _fire_rows(stores: Stores, schedule_id: str, slot: datetime) -> list[Timer]:
    """Every fire timer row of ``schedule_id`` due at ``slot``, whatever its id."""
    shard = FireTimer(
        schedule_id=schedule_id, generation=0, slot=slot, scheduled_for=slot
    ).to_timer(stores.timers.shard_count)
    found = await stores.timers.scan(
        shard=shard.shard,
        bucket=minute_bucket(slot),
        after=(slot - timedelta(milliseconds=1), ""),
        until=slot,
        limit=100,
    )
    return [t for t in found if t.key == schedule_id and t.kind == "fire"]


async def test_an_update_while_the_next_timer_is_read_keeps_the_schedule_firing(
    rig: tuple[Stores, Firing, str, str],
) -> None:
    """A scanner holds a schedule's next fire timer from a read up to 1 s ahead, and hands a
    position once. An update that keeps the cron writes its first timer for that same slot.
    When the two shared a row, the update overwrote a row the scanner had read: the old timer
    was handed, dropped as superseded, and the update's was never handed. The schedule stopped
    until a repair sweep. The change's first timer now has a row of its own, and fires."""
    stores, firing, topic, bootstrap = rig
    svc = ScheduleService(schedules=stores.schedules, runs=stores.runs, timers=stores.timers)
    # Just after a whole second: the create, the read and the update share the next slot.
    await asyncio.sleep(1.05 - datetime.now(UTC).timestamp() % 1)
    sid = f"update-{uuid.uuid4().hex[:8]}"
    every_second = ScheduleSpec(kind=SpecKind.CRON, cron="* * * * * *")
    created = await svc.create(
        replace(_draft(sid, datetime.now(UTC)), spec=every_second), schedule_id=sid
    )
    slot = created.next_fire_time
    assert slot is not None
    # What a scanner read ahead: the schedule's timer for the slot.
    (read_ahead,) = await _fire_rows(stores, sid, slot)
    updated = await Lifecycle(svc).update(
        replace(created, payload=b"new"), schedule_id=sid, version=created.version
    )
    assert updated.next_fire_time == slot, "the update's first slot is the one already read"
    # The timer read before the update is handed, and dropped: its generation was superseded.
    await firing.on_due([read_ahead])
    assert await read_run_messages(bootstrap, topic) == []
    # The update's timer is in a row the scanner has not handed: it is handed, and fires.
    fresh = [t for t in await _fire_rows(stores, sid, slot) if t.position != read_ahead.position]
    assert [FireTimer.from_timer(t).generation for t in fresh] == [updated.generation]
    await firing.on_due(fresh)
    assert [m.run_id for m in await read_run_messages(bootstrap, topic)] == [run_id_for(sid, slot)]
