"""A new schedule's first timer handed before the schedule's row landed (the API writes the timer
first), against the real Cassandra and Kafka: it is looked at again shortly rather than dropped,
so the schedule is not lost; a timer whose schedule stays missing is dropped in the end."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.keys import minute_bucket
from bucketer.model import Timer
from scheduler.config import Config
from scheduler.firing import NEW_SCHEDULE_RECHECK, NEW_SCHEDULE_WAIT, Firing
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.model import RunStatus, Schedule, ScheduleSpec, SpecKind, run_id_for
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


def _draft(schedule_id: str, at: datetime) -> Schedule:
    return Schedule(
        schedule_id=schedule_id,
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
        generation=7,
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


async def test_a_first_timer_handed_before_its_schedule_row_fires_once_the_row_is_there(
    rig: tuple[Stores, Firing, str, str],
) -> None:
    stores, firing, topic, bootstrap = rig
    slot = datetime.now(UTC).replace(microsecond=0)
    sid = f"race-{uuid.uuid4().hex[:8]}"
    first = FireTimer(schedule_id=sid, generation=7, slot=slot, scheduled_for=slot)
    timer = first.to_timer(stores.timers.shard_count)
    await stores.timers.put([timer], now=slot)
    # Handed while the API's insert of the schedule row is still in flight.
    await firing.on_due([timer])
    again = [t for t in await _rows_of(stores, timer, slot) if t.fire_time > slot]
    assert len(again) == 1
    assert again[0].fire_time - datetime.now(UTC) <= NEW_SCHEDULE_RECHECK
    assert await read_run_messages(bootstrap, topic) == []
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
    slot = (datetime.now(UTC) - NEW_SCHEDULE_WAIT - timedelta(seconds=1)).replace(microsecond=0)
    sid = f"gone-{uuid.uuid4().hex[:8]}"
    timer = FireTimer(schedule_id=sid, generation=7, slot=slot, scheduled_for=slot).to_timer(
        stores.timers.shard_count
    )
    await stores.timers.put([timer], now=slot)
    await firing.on_due([timer])
    assert [t.fire_time for t in await _rows_of(stores, timer, slot)] == [timer.fire_time]
