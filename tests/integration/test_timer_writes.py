"""A firing batch's next timers written with other batches' (``timer_write_window``; bucketer.cql
.CoalescedWrites), against the real Cassandra and Kafka: two batches planned within the window
put their next timers in one write, and both land; a next timer due soon is not held."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.cql import Write
from bucketer.model import Timer
from scheduler.config import Config
from scheduler.firing import Firing
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.model import Schedule, ScheduleSpec, SpecKind, new_generation
from scheduler.session import Stores, open_stores
from scheduler.timers import FIRE, FireTimer
from tests.integration.firing_support import firing_on

# Long, so that a batch held for it and one that was not are told apart on a loaded machine.
WINDOW = timedelta(seconds=3)


@dataclass
class Rig:
    stores: Stores
    firing: Firing
    # The schedule ids of the fire timers each grouped write carried, one set per write.
    timer_writes: list[set[str]] = field(default_factory=list)


@pytest.fixture
async def rig(migrated: Config) -> AsyncIterator[Rig]:
    stores = await open_stores(migrated)
    topic = f"{migrated.topic()}.together-{uuid.uuid4().hex[:6]}"
    await ensure_topics(migrated.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(migrated.kafka_bootstrap)
    await queue.start()
    written: list[set[str]] = []
    write = stores.runs.write

    async def watched(items: Sequence[Write]) -> None:
        keys = {
            w.params["key"]
            for w in items
            if isinstance(w.params, dict) and w.params.get("kind") == FIRE
        }
        if keys:
            written.append(keys)
        await write(items)

    stores.runs.write = watched  # type: ignore[method-assign]
    firing = firing_on(stores, queue, topic, migrated.keyspace, timer_write_window=WINDOW)
    try:
        yield Rig(stores, firing, written)
    finally:
        await queue.stop()
        stores.close()


async def _due_now(rig: Rig, cron: str) -> tuple[Schedule, Timer]:
    """A schedule on ``cron`` and a fire timer of it due now."""
    now = datetime.now(UTC).replace(microsecond=0)
    s = Schedule(
        schedule_id=f"together-{uuid.uuid4().hex[:8]}",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron=cron),
        generation=new_generation(),
        create_time=now,
        update_time=now,
    )
    await rig.stores.schedules.create(s)
    timer = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=now, scheduled_for=now
    ).to_timer(rig.stores.timers.shard_count)
    return s, timer


async def _next_timer(rig: Rig, s: Schedule, at: datetime) -> bool:
    """Whether ``s``'s fire timer due ``at`` is stored."""
    timer = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=at, scheduled_for=at
    ).to_timer(rig.stores.timers.shard_count)
    found = await rig.stores.timers.scan(
        shard=timer.shard,
        bucket=timer.bucket,
        after=(at - timedelta(milliseconds=1), ""),
        until=at,
        limit=100,
    )
    return any(t.timer_id == timer.timer_id for t in found)


async def test_two_batches_within_the_window_write_their_next_timers_once(rig: Rig) -> None:
    yearly = "0 0 1 1 *"  # the next slot is months away: well past the 10 s kept at once
    (a, timer_a), (b, timer_b) = [await _due_now(rig, yearly) for _ in range(2)]
    first = asyncio.create_task(rig.firing.on_due([timer_a]))
    await asyncio.sleep(0.5)
    assert not first.done()  # its next timer waits for the window
    second = asyncio.create_task(rig.firing.on_due([timer_b]))
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert rig.timer_writes == [{a.schedule_id, b.schedule_id}]
    next_year = datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC)
    assert await _next_timer(rig, a, next_year)
    assert await _next_timer(rig, b, next_year)


async def test_a_next_timer_due_soon_is_written_at_once(rig: Rig) -> None:
    s, timer = await _due_now(rig, "* * * * * *")  # next slot one second on
    # Written with the batch's other rows, not held for the window: the scanners' grace
    # would not cover a due timer written that late.
    await asyncio.wait_for(rig.firing.on_due([timer]), WINDOW.total_seconds() / 2)
    assert rig.timer_writes == [{s.schedule_id}]
