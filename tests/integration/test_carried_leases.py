"""Carried leases (scheduler.firing), against the real Cassandra and Kafka.

A run fired from a slot whose schedule fires again before the run's lease expires writes no
lease timer: the next fire timer carries the lease. When that timer fires, the lease is settled
without a write if the run finished (the schedule row's ``done_run``), and written as an
ordinary lease timer, due at its own time, if not: also when the slot itself is superseded.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from scheduler import metrics
from scheduler.config import Config
from scheduler.firing import Firing
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.lifecycle import Lifecycle
from scheduler.model import (
    FollowUp,
    OverlapMode,
    RunEventRecord,
    RunStatus,
    Schedule,
    ScheduleSpec,
    ScheduleState,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.retries import START_LEASE
from scheduler.service import ScheduleService
from scheduler.session import Stores, open_stores
from scheduler.timers import FIRE, LEASE, FireTimer
from tests.integration.firing_support import every_minute, firing_on, read_run_messages

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)


@dataclass
class Rig:
    stores: Stores
    firing: Firing
    topic: str
    bootstrap: str
    keyspace: str


@pytest.fixture
async def rig(migrated: Config) -> AsyncIterator[Rig]:
    stores = await open_stores(migrated)
    topic = f"{migrated.topic()}.carried-{uuid.uuid4().hex[:6]}"
    await ensure_topics(migrated.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(migrated.kafka_bootstrap)
    await queue.start()
    firing = firing_on(stores, queue, topic, migrated.keyspace)
    try:
        yield Rig(stores, firing, topic, migrated.kafka_bootstrap, migrated.keyspace)
    finally:
        await queue.stop()
        stores.close()


async def _every_second(rig: Rig) -> tuple[Schedule, Timer]:
    """A schedule firing every second, and the timer of its slot one second ago."""
    now = datetime.now(UTC).replace(microsecond=0)
    s = Schedule(
        schedule_id=f"carried-{uuid.uuid4().hex[:8]}",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="* * * * * *"),
        generation=new_generation(),
        create_time=now,
        update_time=now,
    )
    await rig.stores.schedules.create(s)
    slot = now - SECOND
    timer = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=slot, scheduled_for=slot
    ).to_timer(rig.stores.timers.shard_count)
    return s, timer


def _timers_of(rig: Rig, schedule_id: str) -> list[Timer]:
    rows = rig.stores.session.execute(
        f"SELECT * FROM {rig.keyspace}.timers WHERE key = %s ALLOW FILTERING", (schedule_id,)
    )
    return [Timer.from_row(r, shard=r.shard) for r in rows]


def _fire_timer_after(rig: Rig, schedule_id: str, slot: datetime) -> Timer:
    (t,) = [
        t
        for t in _timers_of(rig, schedule_id)
        if t.kind == FIRE and FireTimer.from_timer(t).slot > slot
    ]
    return t


def _leases(rig: Rig, schedule_id: str) -> dict[str, datetime]:
    return {t.timer_id: t.fire_time for t in _timers_of(rig, schedule_id) if t.kind == LEASE}


def _carried_count(outcome: str) -> float:
    return float(metrics.LEASES_CARRIED.labels(outcome=outcome)._value.get())


async def test_a_finished_run_s_carried_lease_is_settled_without_a_write(rig: Rig) -> None:
    s, first = await _every_second(rig)
    await rig.firing.on_due([first])
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)

    # No lease timer: the next fire timer carries it, and the message has no lease to echo.
    assert _leases(rig, s.schedule_id) == {}
    nxt = _fire_timer_after(rig, s.schedule_id, slot)
    carried = FireTimer.from_timer(nxt).lease
    assert carried is not None and carried.run_id == run_id
    assert START_LEASE - 5 * SECOND < carried.fire_at - datetime.now(UTC) <= START_LEASE
    (message,) = await read_run_messages(rig.bootstrap, rig.topic)
    assert message.run_id == run_id and not message.HasField("lease_expire_time")

    # The worker's outcome lands as the API records it (done_run on the schedule row).
    row = await rig.stores.runs.get(run_id)
    await rig.stores.runs.record_events(
        [
            RunEventRecord(
                run_id=run_id,
                schedule_id=s.schedule_id,
                scheduled_for=slot,
                status=RunStatus.SUCCEEDED,
                event_time=datetime.now(UTC),
                attempt=1,
                enqueue_time=row.enqueue_time,
                start_time=datetime.now(UTC),
                follow_up=FollowUp.NONE,
            )
        ],
        now=datetime.now(UTC),
    )
    settled = _carried_count("settled")
    await rig.firing.on_due([nxt])
    assert _carried_count("settled") == settled + 1
    assert _leases(rig, s.schedule_id) == {}, "a finished run's lease costs no write"
    # The slot just fired carries its own run's lease on in turn.
    following = _fire_timer_after(rig, s.schedule_id, FireTimer.from_timer(nxt).slot)
    lease = FireTimer.from_timer(following).lease
    assert lease is not None
    assert lease.run_id == run_id_for(s.schedule_id, FireTimer.from_timer(nxt).slot)


async def test_an_unfinished_run_s_carried_lease_is_written_due_at_its_own_time(
    rig: Rig,
) -> None:
    """No outcome by the next slot: the lease becomes a lease timer due when it always was,
    also when that next slot is superseded (the schedule was paused meanwhile)."""
    s, first = await _every_second(rig)
    await rig.firing.on_due([first])
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    nxt = _fire_timer_after(rig, s.schedule_id, slot)
    carried = FireTimer.from_timer(nxt).lease
    assert carried is not None

    current = await rig.stores.schedules.get(s.schedule_id)
    assert await rig.stores.schedules.change_state(
        current,
        state=ScheduleState.PAUSED,
        generation=new_generation(),
        now=datetime.now(UTC),
        next_fire_time=None,
    )
    written = _carried_count("written")
    await rig.firing.on_due([nxt])
    assert _carried_count("written") == written + 1
    assert _leases(rig, s.schedule_id) == {f"{run_id}#lease1": carried.fire_at}
    # The superseded slot enqueued nothing: the one message is the first slot's.
    assert [m.run_id for m in await read_run_messages(rig.bootstrap, rig.topic)] == [run_id]


async def test_a_fire_timer_put_again_does_not_carry_its_lease_again(rig: Rig) -> None:
    """A timer whose change is still landing is looked at again later: the lease it carried
    is resolved now (written, the run being unfinished), and the timer put again carries none,
    so the lease is never resolved twice."""
    s, first = await _every_second(rig)
    await rig.firing.on_due([first])
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    nxt = FireTimer.from_timer(_fire_timer_after(rig, s.schedule_id, slot))
    assert nxt.lease is not None
    # An update's first timer, minted after the row's generation, whose row has not landed.
    landing = replace(nxt, generation=new_generation())
    await rig.firing.on_due([landing.to_timer(rig.stores.timers.shard_count)])

    assert _leases(rig, s.schedule_id) == {f"{run_id}#lease1": nxt.lease.fire_at}
    (again,) = [
        f
        for f in (FireTimer.from_timer(t) for t in _timers_of(rig, s.schedule_id) if t.kind == FIRE)
        if f.generation == landing.generation
    ]
    assert again.slot == nxt.slot and again.lease is None


async def test_a_change_whose_chain_overwrites_the_pending_timer_keeps_its_lease(
    rig: Rig,
) -> None:
    """The run fired at a minute's slot has its lease carried by the timer of the next minute.
    An update (same times) is made before that timer is due; the new chain's first timer fires
    and writes its own next timer at the same instant, over the old one's row (both are stored
    under the schedule's id). The update wrote the carried lease as a timer of its own first,
    so the run keeps its lease."""
    svc = ScheduleService(
        schedules=rig.stores.schedules, runs=rig.stores.runs, timers=rig.stores.timers
    )
    s, first = await every_minute(rig.stores, OverlapMode.ALLOW)
    slot = FireTimer.from_timer(first).slot
    await rig.firing.on_due([first])  # handed early, as fire-ahead does
    run_id = run_id_for(s.schedule_id, slot)
    carried = FireTimer.from_timer(_fire_timer_after(rig, s.schedule_id, slot)).lease
    assert carried is not None and carried.run_id == run_id

    current = await svc.get(s.schedule_id)
    updated = await Lifecycle(svc).update(
        replace(current, payload=b"changed"),
        schedule_id=s.schedule_id,
        version=current.version,
    )
    assert _leases(rig, s.schedule_id) == {f"{run_id}#lease1": carried.fire_at}
    (change,) = [
        t
        for t in _timers_of(rig, s.schedule_id)
        if t.kind == FIRE and FireTimer.from_timer(t).generation == updated.generation
    ]
    await rig.firing.on_due([change])
    (over,) = [
        FireTimer.from_timer(t)
        for t in _timers_of(rig, s.schedule_id)
        if t.kind == FIRE and FireTimer.from_timer(t).slot == slot + MINUTE
    ]
    assert over.generation == updated.generation, "the new chain's timer took the row"
    assert _leases(rig, s.schedule_id).get(f"{run_id}#lease1") == carried.fire_at
