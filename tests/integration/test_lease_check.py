"""A lease come due on a lost attempt (scheduler.retries.LeaseCheck), against the real
Cassandra, when the write of its retry fails part way: the attempt's TIMED_OUT outcome lands
only with its retry (the run's own partition, after the retry's timer), so the lease handed
again finds the attempt still unfinished and retries it. Before, the outcome went in the same
grouped write as the retry's timer, which is not atomic across partitions: an outcome landing
without its timer made the lease handed again find the attempt finished, and the run was never
retried."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cassandra import OperationTimedOut

from bucketer.cql import Write, aexecute
from scheduler.config import Config
from scheduler.model import STALE_RUN, RunStatus
from scheduler.retries import Failures, LeaseCheck
from scheduler.session import Stores, open_stores
from scheduler.timers import LeaseTimer, RunTimer
from tests.integration.firing_support import yearly_schedule_with_a_run


@pytest.fixture
async def stores(migrated: Config) -> AsyncIterator[Stores]:
    s = await open_stores(migrated)
    yield s
    s.close()


_TIMERS = re.compile(r"INTO \w+\.timers\b")


class TimersLostOnce:
    """The run store, except that its first grouped write lands every row but the timers' and
    then times out (a replica gone mid-write)."""

    def __init__(self, runs: Any) -> None:
        self._runs = runs
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runs, name)

    async def write(self, items: Sequence[Write]) -> None:
        if self.failed:
            await self._runs.write(items)
            return
        self.failed = True
        landed = [w for w in items if not _TIMERS.search(w.statement.query_string)]
        assert len(landed) < len(items), "the first write carries the retry's timer"
        await self._runs.write(landed)
        raise OperationTimedOut("timed out (test)")


async def test_a_lost_attempt_whose_retry_failed_to_land_is_retried_when_handed_again(
    stores: Stores, migrated: Config
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    sid, enqueued = await yearly_schedule_with_a_run(
        stores, "lease", now, slot_ago=timedelta(minutes=10)
    )
    run_id, slot = enqueued.run_id, enqueued.scheduled_for
    await stores.runs.write(stores.runs.insert_rows([enqueued]))
    lease = LeaseTimer(schedule_id=sid, run_id=run_id, attempt=1, fire_at=now)

    def check(runs: Any) -> LeaseCheck:
        failures = Failures(
            schedules=stores.schedules,
            runs=runs,
            timers=stores.timers,
            dead_letters=stores.dead_letters,
        )
        return LeaseCheck(runs=runs, timers=stores.timers, failures=failures)

    flaky = TimersLostOnce(stores.runs)
    with pytest.raises(OperationTimedOut):
        await check(flaky).check([lease])
    # Nothing says the attempt is over: the lease, handed again, finds it lost again.
    row = await stores.runs.get(run_id)
    assert (row.status, row.next_attempt_time) == (RunStatus.ENQUEUED, None)

    await check(stores.runs).check([lease])
    row = await stores.runs.get(run_id)
    assert row.status is RunStatus.TIMED_OUT and row.next_attempt_time is not None
    retry = RunTimer(
        schedule_id=sid,
        run_id=run_id,
        scheduled_for=slot,
        fire_at=row.next_attempt_time,
        attempt=2,
    ).to_timer(stores.timers.shard_count)
    found = await aexecute(
        stores.session,
        f"SELECT timer_id FROM {migrated.keyspace}.timers WHERE minute_bucket = %s AND shard = %s"
        " AND fire_time = %s AND timer_id = %s",
        (retry.bucket, retry.shard, retry.fire_time, retry.timer_id),
    )
    assert [r.timer_id for r in found] == [retry.timer_id]


async def test_a_lost_attempt_with_a_retry_to_come_stays_in_progress_on_its_schedule(
    stores: Stores,
) -> None:
    """The lost attempt's run, marked in progress on the schedule row, is not noted done there:
    its retry follows, and until that is due the schedule's overlap policy weighs it."""
    now = datetime.now(UTC).replace(microsecond=0)
    sid, enqueued = await yearly_schedule_with_a_run(
        stores, "lost-busy", now, slot_ago=timedelta(minutes=10)
    )
    run_id = enqueued.run_id
    assert enqueued.enqueue_time is not None
    await stores.runs.write(
        [
            *stores.runs.insert_rows([enqueued]),
            stores.schedules.mark_active(sid, run_id, enqueued.enqueue_time),
        ]
    )
    lease = LeaseTimer(schedule_id=sid, run_id=run_id, attempt=1, fire_at=now)
    failures = Failures(
        schedules=stores.schedules,
        runs=stores.runs,
        timers=stores.timers,
        dead_letters=stores.dead_letters,
    )
    await LeaseCheck(runs=stores.runs, timers=stores.timers, failures=failures).check([lease])
    row = await stores.runs.get(run_id)
    assert row.status is RunStatus.TIMED_OUT and row.next_attempt_time is not None
    s = await stores.schedules.get(sid)
    assert (s.active_run, s.done_run, s.active_seen) == (run_id, "", row.next_attempt_time)
    assert s.in_progress(row.next_attempt_time, stale_after=STALE_RUN) == [run_id]
