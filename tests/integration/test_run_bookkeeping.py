"""Run rows and the schedule's overlap cells against the real Cassandra: ordering that no
worker clock decides, and no tombstones on a schedule row touched at every firing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session

from bucketer.cql import Write
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.config import Config
from scheduler.dead_letters import CassandraDeadLetterStore
from scheduler.errors import Unavailable
from scheduler.model import (
    STALE_RUN,
    Run,
    RunEventRecord,
    RunStatus,
    Schedule,
    ScheduleSpec,
    SpecKind,
    day_of,
    new_generation,
    run_id_for,
)
from tests.integration.firing_support import reports_on

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
def stores(session: Session, migrated: Config) -> tuple[CassandraScheduleStore, CassandraRunStore]:
    schedules = CassandraScheduleStore(session, keyspace=migrated.keyspace)
    return schedules, CassandraRunStore(session, schedules)


async def _schedule(schedules: CassandraScheduleStore, schedule_id: str) -> Schedule:
    s = Schedule(
        schedule_id=schedule_id,
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="* * * * * *"),
        generation=new_generation(),
        create_time=T0,
        update_time=T0,
    )
    await schedules.create(s)
    return s


def _enqueued(s: Schedule, at: datetime, *, attempt: int = 1) -> Run:
    return Run(
        run_id=run_id_for(s.schedule_id, at),
        schedule_id=s.schedule_id,
        scheduled_for=at,
        status=RunStatus.ENQUEUED,
        attempt=attempt,
        handler=s.handler,
        tenant=s.tenant,
        enqueue_time=at,
    )


def _event(run: Run, status: RunStatus | None, at: datetime, **kw: object) -> RunEventRecord:
    return RunEventRecord(
        run_id=run.run_id,
        schedule_id=run.schedule_id,
        scheduled_for=run.scheduled_for,
        status=status,
        event_time=at,
        attempt=run.attempt,
        enqueue_time=run.enqueue_time,
        **kw,  # type: ignore[arg-type]
    )


async def _fire(
    schedules: CassandraScheduleStore, runs: CassandraRunStore, run: Run, now: datetime
) -> None:
    """What a dispatcher writes for an enqueued run (scheduler.firing.Firing._apply)."""
    assert run.enqueue_time is not None
    await runs.write(
        [*runs.insert_rows([run]), schedules.mark_active(run.schedule_id, run.run_id, now)]
    )


async def test_a_worker_clock_behind_does_not_lose_its_reports(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """Loss path 8: a worker 200 ms behind reported RUNNING and SUCCEEDED stamped before the
    slot; the ENQUEUED record (stamped at the slot) won, and history showed ENQUEUED forever,
    with the run left in progress on its schedule."""
    schedules, runs = stores
    s = await _schedule(schedules, "clock-behind")
    run = _enqueued(s, T0)
    await _fire(schedules, runs, run, T0)
    behind = T0 - timedelta(milliseconds=200)
    await runs.record_events([_event(run, RunStatus.RUNNING, behind)], now=T0)
    await runs.record_events(
        [_event(run, RunStatus.SUCCEEDED, behind + timedelta(milliseconds=5))], now=T0
    )
    assert (await runs.get(run.run_id)).status is RunStatus.SUCCEEDED
    after = await schedules.get(s.schedule_id)
    assert after.in_progress(T0 + timedelta(seconds=1), stale_after=STALE_RUN) == []


async def test_an_outcome_landing_before_the_enqueue_record_still_wins(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """Rows and the Kafka message go out together: a fast worker's outcome can land first."""
    schedules, runs = stores
    s = await _schedule(schedules, "outcome-first")
    run = _enqueued(s, T0)
    started = T0 + timedelta(milliseconds=3)
    await runs.record_events(
        [_event(run, RunStatus.SUCCEEDED, started, start_time=started)], now=T0
    )
    await _fire(schedules, runs, run, T0)  # the dispatcher's write lands late
    stored = await runs.get(run.run_id)
    assert (stored.status, stored.start_time) == (RunStatus.SUCCEEDED, started)
    after = await schedules.get(s.schedule_id)
    assert after.in_progress(T0 + timedelta(seconds=1), stale_after=STALE_RUN) == []


async def test_a_late_outcome_of_an_earlier_attempt_does_not_overwrite_the_next(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    schedules, runs = stores
    s = await _schedule(schedules, "stale-attempt")
    first = _enqueued(s, T0)
    await _fire(schedules, runs, first, T0)
    second = _enqueued(s, T0, attempt=2)
    await _fire(schedules, runs, second, T0 + timedelta(seconds=30))
    await runs.record_events(
        [_event(first, RunStatus.FAILED, T0 + timedelta(seconds=40), error="late")], now=T0
    )
    stored = await runs.get(first.run_id)
    assert (stored.status, stored.attempt) == (RunStatus.ENQUEUED, 2)


async def test_finished_runs_are_ordered_by_enqueue_not_by_report_arrival(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """The schedule's later run is in progress until its own outcome, even when the earlier
    run's outcome arrives after it."""
    schedules, runs = stores
    s = await _schedule(schedules, "order")
    a = _enqueued(s, T0)
    b = _enqueued(s, T0 + timedelta(seconds=1))
    now = T0 + timedelta(seconds=2)
    await _fire(schedules, runs, a, T0)
    await _fire(schedules, runs, b, T0 + timedelta(seconds=1))
    assert (await schedules.get(s.schedule_id)).in_progress(now, stale_after=STALE_RUN) == [
        b.run_id
    ]
    await runs.record_events([_event(b, RunStatus.SUCCEEDED, now)], now=now)
    await runs.record_events([_event(a, RunStatus.SUCCEEDED, now)], now=now)  # late
    assert (await schedules.get(s.schedule_id)).in_progress(now, stale_after=STALE_RUN) == []


def _tombstones_read(session: Session, schedules: CassandraScheduleStore, schedule_id: str) -> int:
    """The tombstone cells a read of the schedule row went through, as Cassandra traces it."""
    return _tombstones_met(session, schedules.q["get_schedule"], (schedule_id,))


def _tombstones_met(session: Session, statement: object, params: tuple[object, ...]) -> int:
    """The tombstone cells a read went through, as Cassandra traces it."""
    result = session.execute(statement, params, trace=True)
    trace = result.get_query_trace(max_wait_sec=10)
    found = [
        re.search(r"Read \d+ live rows and (\d+) tombstone cells", e.description)
        for e in trace.events
    ]
    counts = [int(m[1]) for m in found if m]
    assert counts, "the trace should say how many tombstone cells the read met"
    return sum(counts)


async def test_firing_and_reporting_leave_no_tombstones_on_the_schedule_row(
    stores: tuple[CassandraScheduleStore, CassandraRunStore], session: Session
) -> None:
    """Loss path 6: the in-progress map took a tombstone per run; an every-second schedule
    crossed the tombstone failure threshold (100,000) in about a day, and then reading it
    failed. Cassandra's trace of a read reports the tombstone cells it went through: 300
    runs fired and reported must not add any."""
    schedules, runs = stores
    s = await _schedule(schedules, "no-tombstones")
    before = _tombstones_read(session, schedules, s.schedule_id)
    for i in range(300):
        at = T0 + timedelta(seconds=i)
        run = _enqueued(s, at)
        await _fire(schedules, runs, run, at)
        await runs.record_events(
            [
                _event(run, RunStatus.RUNNING, at),
                _event(run, None, at),
                _event(run, RunStatus.SUCCEEDED, at),
            ],
            now=at,
        )
    assert _tombstones_read(session, schedules, s.schedule_id) == before


def _run_tombstones(session: Session, runs: CassandraRunStore, s: Schedule, day: int) -> int:
    """The tombstone cells a read of one day of the schedule's runs went through."""
    return _tombstones_met(session, runs.q["list_runs_day"], (s.schedule_id, day, 1000))


async def test_first_attempts_that_succeed_leave_no_tombstones_in_their_run_rows(
    stores: tuple[CassandraScheduleStore, CassandraRunStore], session: Session
) -> None:
    """An outcome without an error wrote the error cell as null: a tombstone in every
    successful run's row, flushed and compacted with it and met by every history read. A
    first attempt has no earlier error to clear."""
    schedules, runs = stores
    s = await _schedule(schedules, "run-row-tombstones")
    fired = []
    for i in range(20):
        at = T0 + timedelta(seconds=i)
        run = _enqueued(s, at)
        fired.append(run)
        await _fire(schedules, runs, run, at)
        if i % 2:  # STARTED and the outcome reported apart, or merged into one event
            await runs.record_events([_event(run, RunStatus.RUNNING, at)], now=at)
            await runs.record_events([_event(run, RunStatus.SUCCEEDED, at)], now=at)
        else:
            await runs.record_events([_event(run, RunStatus.SUCCEEDED, at, start_time=at)], now=at)
    assert {(await runs.get(r.run_id)).status for r in fired} == {RunStatus.SUCCEEDED}
    assert _run_tombstones(session, runs, s, day_of(T0)) == 0


async def test_a_retry_that_succeeds_clears_its_earlier_attempts_error(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    schedules, runs = stores
    s = await _schedule(schedules, "retry-clears-error")
    first = _enqueued(s, T0)
    await _fire(schedules, runs, first, T0)
    await runs.record_events(
        [_event(first, RunStatus.FAILED, T0 + timedelta(seconds=1), error="boom")], now=T0
    )
    assert (await runs.get(first.run_id)).error == "boom"
    retry = _enqueued(s, T0, attempt=2)
    await runs.write(runs.insert_rows([retry]))
    done = T0 + timedelta(seconds=5)
    await runs.record_events([_event(retry, RunStatus.SUCCEEDED, done, start_time=done)], now=T0)
    stored = await runs.get(first.run_id)
    assert (stored.status, stored.attempt, stored.error) == (RunStatus.SUCCEEDED, 2, "")


async def test_an_attempt_reported_failed_and_succeeded_shows_success_without_an_error(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """Two deliveries of one attempt (a redelivered message) reported FAILED and SUCCEEDED:
    their cells share a timestamp, SUCCEEDED wins the status, and the failure's error is not
    shown on it."""
    schedules, runs = stores
    s = await _schedule(schedules, "dup-outcomes")
    run = _enqueued(s, T0)
    await _fire(schedules, runs, run, T0)
    at = T0 + timedelta(seconds=1)
    await runs.record_events([_event(run, RunStatus.SUCCEEDED, at, start_time=at)], now=T0)
    await runs.record_events([_event(run, RunStatus.FAILED, at, error="boom")], now=T0)
    stored = await runs.get(run.run_id)
    assert (stored.status, stored.error) == (RunStatus.SUCCEEDED, "")


async def test_a_retry_is_not_taken_for_delivered_because_its_earlier_attempt_was(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """A new shard owner asks which runs of the timers it hands again were taken by workers
    already. A retry (attempt 2) of a run whose attempt 1 timed out was not: its row shows
    attempt 1's outcome, which must not stop attempt 2 from being produced (seen in chaos runs:
    retries of runs whose shard changed owner were dropped, and never dead-lettered)."""
    schedules, runs = stores
    s = await _schedule(schedules, "delivered-attempts")
    first = _enqueued(s, T0)
    await runs.write(runs.insert_rows([first]))
    await runs.record_events(
        [_event(first, RunStatus.TIMED_OUT, T0 + timedelta(seconds=2))], now=T0
    )
    assert await runs.delivered({first.run_id: 1}) == {first.run_id}
    assert await runs.delivered({first.run_id: 2}) == set()
    retry = _enqueued(s, T0, attempt=2)
    await runs.write(runs.insert_rows([retry]))
    assert await runs.delivered({first.run_id: 2}) == set()  # enqueued, not taken
    await runs.record_events([_event(retry, RunStatus.RUNNING, T0 + timedelta(seconds=5))], now=T0)
    assert await runs.delivered({first.run_id: 2}) == {first.run_id}


async def test_a_retry_that_ran_clears_the_retry_time_even_without_its_enqueued_row(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """Attempt 1 failed and its retry was written; attempt 2's ENQUEUED row never landed (its
    write failed in a fault while its message went out), and attempt 2 ran. The row must not
    keep attempt 1's retry time: seen in a chaos run as a SUCCEEDED run counted stuck with a
    retry overdue. A failed attempt 2's own retry time, written at its outcome's cell time, must
    survive the clear (ranked below it, whatever order the writes land in)."""
    schedules, runs = stores
    s = await _schedule(schedules, "retry-taken")
    later = T0 + timedelta(seconds=1)
    ok, again = _enqueued(s, T0), _enqueued(s, later)
    for run in (ok, again):
        await _fire(schedules, runs, run, run.scheduled_for)
        failed = _event(run, RunStatus.FAILED, run.scheduled_for, error="boom")
        await runs.record_events([failed], now=T0)
        await runs.write(
            [
                runs.retry_at_row(
                    failed.run_id, failed.attempt, run.scheduled_for + timedelta(seconds=1)
                )
            ]
        )
        assert (await runs.get(run.run_id)).next_attempt_time is not None
    ok2, again2 = _enqueued(s, T0, attempt=2), _enqueued(s, later, attempt=2)
    ran = T0 + timedelta(seconds=3)
    await runs.record_events(
        [_event(ok2, RunStatus.SUCCEEDED, ran, start_time=ran, worker_id="w1")], now=ran
    )
    retry_at = T0 + timedelta(seconds=30)
    failed2 = _event(again2, RunStatus.FAILED, ran, start_time=ran, worker_id="w1", error="x")
    await runs.write(
        [runs.retry_at_row(failed2.run_id, failed2.attempt, retry_at)]
    )  # lands before the report itself
    await runs.record_events([_event(again2, RunStatus.RUNNING, ran), failed2], now=ran)
    done = await runs.get(ok.run_id)
    assert (done.status, done.attempt, done.next_attempt_time) == (RunStatus.SUCCEEDED, 2, None)
    waiting = await runs.get(again.run_id)
    assert (waiting.status, waiting.attempt) == (RunStatus.FAILED, 2)
    assert waiting.next_attempt_time == retry_at


async def test_finished_answers_per_attempt_asked(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """A worker asks before running a message that may have run already (check_done): an
    attempt counts as done when a later attempt exists, or its outcome is recorded with what
    follows it (a failure's retry); an enqueued or running one, or a failure whose retry was
    never written (the API died in between), is not."""
    schedules, runs = stores
    s = await _schedule(schedules, "finished-asked")
    pending, running, succeeded, retried, unretried, will_retry = (
        _enqueued(s, T0 + timedelta(seconds=i)) for i in range(6)
    )
    for run in (pending, running, succeeded, retried, unretried, will_retry):
        await _fire(schedules, runs, run, run.scheduled_for)
    await runs.record_events([_event(running, RunStatus.RUNNING, T0)], now=T0)
    await runs.record_events([_event(succeeded, RunStatus.SUCCEEDED, T0)], now=T0)
    for run in (retried, unretried, will_retry):
        await runs.record_events([_event(run, RunStatus.FAILED, T0, error="boom")], now=T0)
    failed = _event(will_retry, RunStatus.FAILED, T0, error="boom")
    await runs.write([runs.retry_at_row(failed.run_id, failed.attempt, T0 + timedelta(seconds=5))])
    second = _enqueued(s, retried.scheduled_for, attempt=2)
    await _fire(schedules, runs, second, T0 + timedelta(seconds=30))
    asked = {r.run_id: 1 for r in (pending, running, succeeded, retried, unretried, will_retry)}
    assert await runs.finished(asked) == {succeeded.run_id, retried.run_id, will_retry.run_id}
    assert await runs.finished({retried.run_id: 2}) == set()
    assert await runs.finished({"finished-asked@20200101T000000.000Z": 1}) == set()


async def test_a_started_asking_check_done_is_answered_and_not_recorded_when_done(
    session: Session, migrated: Config, stores: tuple[CassandraScheduleStore, CassandraRunStore]
) -> None:
    schedules, runs = stores
    reports, _ = reports_on(session, migrated.keyspace, migrated.shard_count, schedules, runs)
    s = await _schedule(schedules, "check-done")
    done, fresh = _enqueued(s, T0), _enqueued(s, T0 + timedelta(seconds=1))
    for run in (done, fresh):
        await _fire(schedules, runs, run, run.scheduled_for)
    finished_at = T0 + timedelta(seconds=2)
    await reports.record(
        [_event(done, RunStatus.SUCCEEDED, finished_at, start_time=finished_at, worker_id="w1")]
    )
    again = T0 + timedelta(seconds=9)
    recorded = await reports.record(
        [
            _event(done, RunStatus.RUNNING, again, worker_id="w2", check_done=True),
            _event(fresh, RunStatus.RUNNING, again, worker_id="w2", check_done=True),
        ]
    )
    assert recorded.done == {done.run_id}
    kept = await runs.get(done.run_id)
    assert (kept.status, kept.worker_id, kept.start_time) == (
        RunStatus.SUCCEEDED,
        "w1",
        finished_at,
    )
    started = await runs.get(fresh.run_id)
    assert (started.status, started.worker_id) == (RunStatus.RUNNING, "w2")


class _WritesFailFrom(CassandraRunStore):
    """The real run store, whose grouped writes fail from the ``fail_from``-th on: the API or
    Cassandra gone in the middle of applying a failure."""

    def __init__(self, session: Session, schedules: CassandraScheduleStore, fail_from: int):
        super().__init__(session, schedules)
        self.fail_from = fail_from
        self.writes = 0

    async def write(self, items: Sequence[Write]) -> None:
        self.writes += 1
        if self.writes >= self.fail_from:
            raise Unavailable("Cassandra went away mid-report")
        await super().write(items)


@pytest.mark.parametrize("hopeless", [False, True], ids=["retried", "dead-lettered"])
async def test_a_failure_is_marked_done_only_after_what_follows_it_is_written(
    session: Session, migrated: Config, hopeless: bool
) -> None:
    """What makes a redelivered attempt "done" (its retry time, its DEAD_LETTERED) is written
    after the retry's timer or the dead letter, never with them: when the report stops between
    the two, the attempt is not done and its redelivery runs it again; the report's retry then
    finishes it, dead letter and all."""
    schedules = CassandraScheduleStore(session, keyspace=migrated.keyspace)
    breaking = _WritesFailFrom(session, schedules, fail_from=3)
    reports, _ = reports_on(session, migrated.keyspace, migrated.shard_count, schedules, breaking)
    s = await _schedule(schedules, f"marked-last-{hopeless}")
    run = _enqueued(s, T0)
    await _fire(schedules, breaking, run, T0)  # write 1
    failed = _event(run, RunStatus.FAILED, T0, error="boom", non_retryable=hopeless)
    # The outcome goes out first (record_events); then write 2, the retry's timer or the dead
    # letter's rows; write 3, the marker, fails.
    with pytest.raises(Unavailable):
        await reports.record([failed])
    assert await breaking.finished({run.run_id: 1}) == set()
    breaking.fail_from = 100  # the report, sent again, goes through
    await reports.record([failed])
    assert await breaking.finished({run.run_id: 1}) == {run.run_id}
    kept = await breaking.get(run.run_id)
    if hopeless:
        assert kept.status is RunStatus.DEAD_LETTERED
        letters = CassandraDeadLetterStore(session, keyspace=migrated.keyspace)
        assert (await letters.get(run.run_id)).run_id == run.run_id
    else:
        assert kept.status is RunStatus.FAILED and kept.next_attempt_time is not None


async def test_runs_in_progress_by_their_rows(
    stores: tuple[CassandraScheduleStore, CassandraRunStore],
) -> None:
    """Decision 0013: which runs a fire timer carries are still in progress, and which runs of
    a schedule the API finds in progress, from the run rows alone."""
    schedules, runs = stores
    s = await _schedule(schedules, f"life-{new_generation()}")
    now = datetime.now(UTC).replace(microsecond=0)
    started = _enqueued(s, now - timedelta(minutes=10))
    ended = _enqueued(s, now - timedelta(minutes=5))
    stale = _enqueued(s, now - timedelta(minutes=4))
    fresh = _enqueued(s, now - timedelta(seconds=30))
    backfill = replace(fresh, run_id=fresh.run_id + "~bf", backfill_id="bf1")
    await runs.write(runs.insert_rows([started, ended, stale, fresh, backfill]))
    await runs.record_events(
        [
            _event(started, RunStatus.RUNNING, now - timedelta(minutes=10)),
            _event(started, None, now - timedelta(seconds=20)),  # a heartbeat
            _event(ended, RunStatus.SUCCEEDED, now - timedelta(minutes=4)),
        ],
        now=now,
    )
    unwritten = run_id_for(s.schedule_id, now - timedelta(seconds=2))
    long_unwritten = run_id_for(s.schedule_id, now - timedelta(seconds=30))
    asked = [started, ended, stale, fresh]
    alive = await runs.still_running(
        [*(r.run_id for r in asked), unwritten, long_unwritten], now=now, stale_after=STALE_RUN
    )
    assert alive == {started.run_id, fresh.run_id, unwritten}
    found = await runs.running_of(s.schedule_id, now=now, stale_after=STALE_RUN)
    assert found == [fresh.run_id, started.run_id]
