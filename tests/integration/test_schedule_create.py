"""CreateSchedule's storage against the real Cassandra: an id the server mints is stored with
a plain write (no lightweight transaction), a chosen id through the existence check that
answers ALREADY_EXISTS; either way the first timer is written, and a request_id still makes a
retry answer the first call's schedule. The LWT is read from Cassandra's own Paxos state
(``system.paxos``), which only a conditional write leaves for a partition."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from bucketer.cql import aexecute
from bucketer.keys import minute_bucket
from scheduler.config import Config
from scheduler.errors import AlreadyExists
from scheduler.model import Schedule, ScheduleSpec, SpecKind
from scheduler.service import ScheduleService
from scheduler.session import Stores, open_stores
from scheduler.timers import FireTimer


@pytest.fixture
async def svc(migrated: Config) -> AsyncIterator[tuple[ScheduleService, Stores]]:
    stores = await open_stores(migrated)
    try:
        yield (
            ScheduleService(schedules=stores.schedules, runs=stores.runs, timers=stores.timers),
            stores,
        )
    finally:
        stores.close()


def _draft() -> Schedule:
    return Schedule(
        schedule_id="",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
    )


async def _conditional_writes_to(stores: Stores, schedule_id: str) -> int:
    """Paxos rows Cassandra keeps for the schedule row's partition: one once an LWT ran."""
    keyspace = stores.schedules.q.keyspace
    table = await aexecute(
        stores.session,
        "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
        (keyspace, "schedules"),
    )
    rows = await aexecute(
        stores.session,
        "SELECT row_key FROM system.paxos WHERE row_key = %s AND cf_id = %s",
        (schedule_id.encode(), table[0].id),
    )
    return len(rows)


async def _first_timer_of(stores: Stores, s: Schedule) -> bool:
    """Whether the schedule's first fire timer, of its generation, is stored."""
    at = s.next_fire_time
    assert at is not None
    want = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=at, scheduled_for=at, first=True
    ).to_timer(stores.timers.shard_count)
    found = await stores.timers.scan(
        shard=want.shard,
        bucket=minute_bucket(want.fire_time),
        after=(want.fire_time - timedelta(microseconds=1), ""),
        until=want.fire_time,
        limit=100,
    )
    return any(t.timer_id == want.timer_id and FireTimer.from_timer(t).slot == at for t in found)


async def test_an_id_the_server_mints_is_stored_without_a_conditional_write(
    svc: tuple[ScheduleService, Stores],
) -> None:
    service, stores = svc
    s = await service.create(_draft())
    assert uuid.UUID(s.schedule_id).version == 4
    stored = await service.get(s.schedule_id)
    assert (stored.generation, stored.handler) == (s.generation, "echo")
    assert await _first_timer_of(stores, s)
    assert await _conditional_writes_to(stores, s.schedule_id) == 0


async def test_a_chosen_id_is_checked_and_refused_when_taken(
    svc: tuple[ScheduleService, Stores],
) -> None:
    service, stores = svc
    sid = f"chosen-{uuid.uuid4().hex[:8]}"
    s = await service.create(_draft(), schedule_id=sid)
    assert s.schedule_id == sid
    assert await _first_timer_of(stores, s)
    assert await _conditional_writes_to(stores, sid) == 1
    with pytest.raises(AlreadyExists, match="schedule_id"):
        await service.create(_draft(), schedule_id=sid)
    assert (await service.get(sid)).generation == s.generation


async def test_a_request_id_retry_answers_the_first_calls_minted_schedule(
    svc: tuple[ScheduleService, Stores],
) -> None:
    service, stores = svc
    request_id = f"req-{uuid.uuid4().hex}"
    first = await service.create(_draft(), request_id=request_id)
    again = await service.create(_draft(), request_id=request_id)
    assert again.schedule_id == first.schedule_id
    assert again.generation == first.generation
    assert await _conditional_writes_to(stores, first.schedule_id) == 0
