"""The repair sweep against the real Cassandra (issue 7, path 5): an ACTIVE schedule whose
timer is gone is re-armed, due now, at the slot it missed; live, paused and quarantined
schedules are left alone."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from bucketer.keys import minute_bucket
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.config import Config
from scheduler.model import Schedule, ScheduleSpec, SpecKind
from scheduler.repair import RepairSweep
from scheduler.service import ScheduleService
from scheduler.slots import slots_between


@pytest.fixture
def svc(session: Session, migrated: Config) -> ScheduleService:
    schedules = CassandraScheduleStore(session, keyspace=migrated.keyspace)
    return ScheduleService(
        schedules=schedules,
        runs=CassandraRunStore(session, schedules),
        timers=CassandraTimerStore(
            session, keyspace=migrated.keyspace, shard_count=migrated.shard_count
        ),
    )


async def _create(svc: ScheduleService, name: str) -> Schedule:
    draft = Schedule(
        schedule_id="",
        name=name,
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="*/2 * * * *"),
    )
    return await svc.create(draft, schedule_id=f"{name}-{uuid.uuid4().hex[:8]}")


def _fire_timers(session: Session, keyspace: str, schedule_id: str) -> list[tuple[datetime, str]]:
    """Every live fire timer of the schedule, by scanning (a test's luxury)."""
    rows = session.execute(
        f"SELECT fire_time, kind, data FROM {keyspace}.timers WHERE key = %s ALLOW FILTERING",
        (schedule_id,),
    )
    return [(r.fire_time, r.kind) for r in rows if r.kind == "fire"]


async def test_a_schedule_without_a_timer_is_rearmed_at_its_missed_slot(
    svc: ScheduleService, session: Session, migrated: Config
) -> None:
    ks = migrated.keyspace
    lost = await _create(svc, "lost")
    alive = await _create(svc, "alive")
    paused = await _create(svc, "paused")
    await svc.pause(paused.schedule_id, note="", paused_by="test")
    # The fault: every timer of `lost` and `paused` vanishes (a restored backup, a stray delete).
    for sid in (lost.schedule_id, paused.schedule_id):
        for r in session.execute(
            f"SELECT minute_bucket, shard, fire_time, timer_id FROM {ks}.timers "
            "WHERE key = %s ALLOW FILTERING",
            (sid,),
        ):
            session.execute(
                f"DELETE FROM {ks}.timers WHERE minute_bucket = %s AND shard = %s "
                "AND fire_time = %s AND timer_id = %s",
                (r.minute_bucket, r.shard, r.fire_time, r.timer_id),
            )
    assert _fire_timers(session, ks, lost.schedule_id) == []
    before = _fire_timers(session, ks, alive.schedule_id)

    now = datetime.now(UTC)
    repaired = await RepairSweep(svc, rate=100_000, suspect_delay=timedelta(0)).sweep()

    assert lost.schedule_id in repaired
    assert alive.schedule_id not in repaired and paused.schedule_id not in repaired
    assert _fire_timers(session, ks, alive.schedule_id) == before
    assert _fire_timers(session, ks, paused.schedule_id) == []
    # Re-armed due now, for the latest slot at or before now: the misfire policy decides.
    (timer,) = session.execute(
        f"SELECT fire_time, data FROM {ks}.timers WHERE key = %s ALLOW FILTERING",
        (lost.schedule_id,),
    )
    assert minute_bucket(timer.fire_time.replace(tzinfo=UTC)) >= minute_bucket(now)
    missed = slots_between(lost, now - timedelta(hours=1), now, 100)[-1]
    doc = json.loads(timer.data)
    assert doc["slot_us"] == int(missed.slot.timestamp() * 1_000_000)
    assert doc["g"] == lost.generation
