"""Fire-ahead (scheduler.firing), against the real Cassandra and Kafka: a fire timer handed
before its slot has its run row written at once and its message produced at the slot's time."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from cronscale.v1 import run_message_pb2
from scheduler.config import Config
from scheduler.firing import Firing
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.model import RunStatus, Schedule, ScheduleSpec, SpecKind, new_generation, run_id_for
from scheduler.session import Stores, open_stores
from scheduler.timers import FireTimer
from tests.integration.firing_support import firing_on, read_run_records

AHEAD = timedelta(milliseconds=800)


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


async def test_a_slot_handed_ahead_is_recorded_at_once_and_produced_at_its_time(
    rig: Rig,
) -> None:
    at = await _next_whole_second(timedelta(milliseconds=200))
    s, timer = await _slot_at(rig, at)
    # Handed as the scanner hands it: within the fire-ahead before the slot.
    await asyncio.sleep(max(0.0, (at - AHEAD / 2 - datetime.now(UTC)).total_seconds()))
    handed = datetime.now(UTC)
    assert handed < at
    firing = asyncio.create_task(rig.firing.on_due([timer]))
    run_id = run_id_for(s.schedule_id, at)
    # The run row is written ahead, while its message waits for the slot.
    row = None
    while row is None and datetime.now(UTC) < at - timedelta(milliseconds=50):
        row = (await rig.stores.runs.get_many([run_id])).get(run_id)
    assert row is not None and row.status is RunStatus.ENQUEUED
    assert not firing.done()
    await asyncio.wait_for(firing, 5)
    ((message, produced),) = await _produced(rig)
    assert message.run_id == run_id
    # CreateTime is in milliseconds: the produce happened at or after the slot.
    assert produced >= at
    assert produced - at < timedelta(milliseconds=500)


async def test_a_message_is_held_no_longer_than_the_fire_ahead(rig: Rig) -> None:
    """A slot further ahead than the fire-ahead (the scanner never hands one; a clock that
    jumped could) is not held past the fire-ahead."""
    at = await _next_whole_second(timedelta(seconds=4))
    s, timer = await _slot_at(rig, at)
    started = datetime.now(UTC)
    await asyncio.wait_for(rig.firing.on_due([timer]), 5)
    took = datetime.now(UTC) - started
    assert AHEAD * 0.9 <= took < AHEAD + timedelta(seconds=1)
    ((message, produced),) = await _produced(rig)
    assert message.run_id == run_id_for(s.schedule_id, at) and produced < at
