"""BUFFER_ONE release against the real Cassandra (issue 7, path 10): the run held back is
released by a run timer written *before* the buffer is cleared, so an API that dies between
the two steps loses nothing: the held run is released again, under the same run id."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.config import Config
from scheduler.model import (
    BufferedRun,
    FollowUp,
    OverlapMode,
    RunEventRecord,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.reports import RunReports
from tests.integration.firing_support import reports_on


class Crash(Exception):
    """The API process dying between two steps."""


class CrashingRunStore(CassandraRunStore):
    """The real run store, except that clearing the buffer "crashes" while ``crash`` is set."""

    crash = True

    async def clear_buffered(self, schedule_id: str, buffered_json: str) -> bool:
        if self.crash:
            raise Crash(schedule_id)
        return await super().clear_buffered(schedule_id, buffered_json)


Parts = tuple[RunReports, CassandraScheduleStore, CrashingRunStore, CassandraTimerStore]


@pytest.fixture
def parts(session: Session, migrated: Config) -> Parts:
    schedules = CassandraScheduleStore(session, keyspace=migrated.keyspace)
    runs = CrashingRunStore(session, schedules)
    reports, timers = reports_on(session, migrated.keyspace, migrated.shard_count, schedules, runs)
    return reports, schedules, runs, timers


async def test_a_crash_between_release_and_clear_releases_the_held_run_again(
    parts: Parts,
    session: Session,
    migrated: Config,
) -> None:
    reports, schedules, runs, _timers = parts
    now = datetime.now(UTC).replace(microsecond=0)
    sid = f"buffer-{uuid.uuid4().hex[:8]}"
    await schedules.create(
        Schedule(
            schedule_id=sid,
            handler="echo",
            spec=ScheduleSpec(kind=SpecKind.CRON, cron="* * * * *"),
            generation=new_generation(),
            policies=SchedulePolicies(overlap=OverlapMode.BUFFER_ONE),
            create_time=now,
            update_time=now,
        )
    )
    running_at = now - timedelta(minutes=1)
    running = run_id_for(sid, running_at)
    held = BufferedRun(run_id=run_id_for(sid, now), scheduled_for=now)
    await runs.write([schedules.mark_active(sid, running, running_at)])
    assert await schedules.hold_buffered(sid, held.to_json())
    finished = RunEventRecord(
        run_id=running,
        schedule_id=sid,
        scheduled_for=running_at,
        status=RunStatus.SUCCEEDED,
        event_time=now,
        enqueue_time=running_at,
        follow_up=FollowUp.REQUIRED,
    )

    with pytest.raises(Crash):
        await reports.record([finished])
    # The release timer is written, and the run is still held: nothing is lost.
    assert _release_timers(session, migrated.keyspace, sid) == [held.run_id]
    assert (await schedules.get(sid)).buffered == held

    # The worker's report is retried (its ack never came): the same run is released again,
    # under the same run id, and the buffer is cleared this time.
    runs.crash = False
    await reports.record([finished])
    assert set(_release_timers(session, migrated.keyspace, sid)) == {held.run_id}
    assert (await schedules.get(sid)).buffered is None


def _release_timers(session: Session, keyspace: str, schedule_id: str) -> list[str]:
    rows = session.execute(
        f"SELECT timer_id, kind FROM {keyspace}.timers WHERE key = %s ALLOW FILTERING",
        (schedule_id,),
    )
    return [r.timer_id for r in rows if r.kind == "run"]
