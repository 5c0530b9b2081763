"""Fire-ahead (scheduler.firing, decision 0011), against the real Cassandra and Kafka: a fire
timer handed before its slot has its schedule's next timer written at once, and its run's rows
and message at the slot's time; a dispatcher stopped while holding them has recorded nothing
of the run."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from cronscale.v1 import run_message_pb2
from scheduler.config import Config
from scheduler.firing import Firing
from scheduler.kafka import KafkaRunQueue, Keyed, ensure_topics
from scheduler.model import RunStatus, Schedule, ScheduleSpec, SpecKind, new_generation, run_id_for
from scheduler.session import Stores, open_stores
from scheduler.timers import FireTimer
from tests.integration.firing_support import firing_on, read_run_records

AHEAD = timedelta(milliseconds=2500)
# How long before its slot the tests hand a timer (within AHEAD; wider than a scanner's 1 s
# lookahead allows, which the firing logic does not know), and how close to the slot the next
# timer must have been seen. The gap between them is what a loaded CI machine gets for one
# write: 150 ms proved too little there.
HANDED = timedelta(seconds=2)
SEEN_BY = timedelta(milliseconds=300)


@dataclass
class Rig:
    stores: Stores
    firing: Firing
    topic: str
    bootstrap: str


@pytest.fixture
async def rig(migrated: Config) -> AsyncIterator[Rig]:
    stores = await open_stores(migrated)
    topic = f"{migrated.topic()}.ahead-{uuid.uuid4().hex[:6]}"
    await ensure_topics(migrated.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(migrated.kafka_bootstrap)
    await queue.start()
    firing = firing_on(stores, queue, topic, migrated.keyspace, fire_ahead=AHEAD)
    try:
        yield Rig(stores, firing, topic, migrated.kafka_bootstrap)
    finally:
        await queue.stop()
        stores.close()


async def _slot_at(rig: Rig, at: datetime) -> tuple[Schedule, Timer]:
    """A schedule every second, and the fire timer of its slot at ``at`` (a whole second)."""
    s = Schedule(
        schedule_id=f"ahead-{uuid.uuid4().hex[:8]}",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="* * * * * *"),
        generation=new_generation(),
        create_time=at,
        update_time=at,
    )
    await rig.stores.schedules.create(s)
    timer = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=at, scheduled_for=at
    ).to_timer(rig.stores.timers.shard_count)
    return s, timer


async def _produced(rig: Rig) -> list[tuple[run_message_pb2.RunMessage, datetime]]:
    return await read_run_records(rig.bootstrap, rig.topic)


async def _next_whole_second(lead: timedelta) -> datetime:
    """The next whole second at least ``lead`` away."""
    at = (datetime.now(UTC) + lead + timedelta(seconds=1)).replace(microsecond=0)
    return at


async def _next_timer_written(rig: Rig, s: Schedule, after: datetime) -> bool:
    """Whether the fire timer of ``s``'s slot after ``after`` (one second later) is stored."""
    nxt = after + timedelta(seconds=1)
    timer = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=nxt, scheduled_for=nxt
    ).to_timer(rig.stores.timers.shard_count)
    found = await rig.stores.timers.scan(
        shard=timer.shard,
        bucket=timer.bucket,
        after=(nxt - timedelta(milliseconds=1), ""),
        until=nxt,
        limit=100,
    )
    return any(t.timer_id == timer.timer_id for t in found)


async def test_a_slot_handed_ahead_has_its_next_timer_written_at_once_and_its_run_at_its_time(
    rig: Rig,
) -> None:
    at = await _next_whole_second(HANDED + timedelta(milliseconds=200))
    s, timer = await _slot_at(rig, at)
    # Handed as the scanner hands it: within the fire-ahead before the slot.
    await asyncio.sleep(max(0.0, (at - HANDED - datetime.now(UTC)).total_seconds()))
    handed = datetime.now(UTC)
    assert handed < at
    firing = asyncio.create_task(rig.firing.on_due([timer]))
    run_id = run_id_for(s.schedule_id, at)
    # The schedule's next timer is written ahead; the run's row waits with its message.
    written = False
    while not written and datetime.now(UTC) < at - SEEN_BY:
        written = await _next_timer_written(rig, s, at)
    assert written
    assert run_id not in await rig.stores.runs.get_many([run_id])
    assert not firing.done()
    await asyncio.wait_for(firing, 5)
    row = (await rig.stores.runs.get_many([run_id]))[run_id]
    assert row.status is RunStatus.ENQUEUED
    # Stamped with the batch's start (the overlap cell and the worker's echo carry it).
    assert row.enqueue_time is not None and row.enqueue_time < at
    ((message, produced),) = await _produced(rig)
    assert message.run_id == run_id
    # CreateTime is in milliseconds: the produce happened at or after the slot.
    assert produced >= at
    assert produced - at < timedelta(seconds=1)


async def test_a_dispatcher_stopped_while_holding_a_slot_recorded_nothing_of_its_run(
    rig: Rig,
) -> None:
    """What a SIGKILL leaves behind between the hand-over and the slot: the next timer only.
    No run row and no overlap cell names the run, so the shard's next owner fires the slot
    (or records it missed) as if it had never been handed, and later slots are not held up
    by a run that never went out."""
    at = await _next_whole_second(HANDED + timedelta(milliseconds=200))
    s, timer = await _slot_at(rig, at)
    await asyncio.sleep(max(0.0, (at - HANDED - datetime.now(UTC)).total_seconds()))
    firing = asyncio.create_task(rig.firing.on_due([timer]))
    written = False
    while not written and datetime.now(UTC) < at - SEEN_BY:
        written = await _next_timer_written(rig, s, at)
    assert written and not firing.done()
    firing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await firing
    await asyncio.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.3)
    run_id = run_id_for(s.schedule_id, at)
    assert run_id not in await rig.stores.runs.get_many([run_id])
    stored = (await rig.stores.schedules.get_many([s.schedule_id]))[s.schedule_id]
    assert not stored.active_run
    assert await _produced(rig) == []


async def test_a_message_is_held_no_longer_than_the_fire_ahead(rig: Rig) -> None:
    """A slot further ahead than the fire-ahead (the scanner never hands one; a clock that
    jumped could) is not held past the fire-ahead."""
    at = await _next_whole_second(AHEAD + timedelta(seconds=2))
    s, timer = await _slot_at(rig, at)
    started = datetime.now(UTC)
    await asyncio.wait_for(rig.firing.on_due([timer]), 5)
    took = datetime.now(UTC) - started
    assert AHEAD * 0.9 <= took < AHEAD + timedelta(seconds=1)
    ((message, produced),) = await _produced(rig)
    assert message.run_id == run_id_for(s.schedule_id, at) and produced < at


async def test_slots_already_due_go_out_in_one_release(rig: Rig) -> None:
    """Slots handed late (a backlog, a retry) wait for nothing: they are produced, and their
    rows written, in one release, however far apart their times (not one per 25 ms slice)."""
    now = datetime.now(UTC).replace(microsecond=0)
    timers = []
    for back in (3, 2, 1):
        _s, timer = await _slot_at(rig, now - timedelta(seconds=back))
        timers.append(timer)
    calls: list[int] = []
    queue = rig.firing._queue
    original = queue.enqueue

    async def counted(topic: str, messages: Sequence[Keyed]) -> None:
        calls.append(len(messages))
        await original(topic, messages)

    queue.enqueue = counted  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(rig.firing.on_due(timers), 5)
    finally:
        queue.enqueue = original  # type: ignore[method-assign]
    assert calls == [3]
    ids = [
        run_id_for(FireTimer.from_timer(t).schedule_id, FireTimer.from_timer(t).scheduled_for)
        for t in timers
    ]
    assert set((await rig.stores.runs.get_many(ids)).keys()) == set(ids)
