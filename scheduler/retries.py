"""Retries, run leases and dead letters: what follows when an attempt fails, times out or is lost.

A failed attempt reaches here two ways: its worker reports FAILED or TIMED_OUT (the API,
``scheduler.reports``), or the attempt's lease comes due unsettled and a dispatcher finds it
lost (``LeaseCheck``: never started, or stopped heartbeating). Either way ``Failures.handle``
applies the schedule's retry policy:

- attempts left: a run timer for the next attempt (same run id, ``attempt + 1``) due after the
  backoff (never a sleep in a worker), and the run row shows when it is due;
- none left, or the handler said retrying cannot help: the run is DEAD_LETTERED (its row, the
  ``dead_letters`` tables and a message on the dead-letter topic, ``scheduler.dead_letters``).

Every failed attempt is kept in ``run_attempts``: the history a dead letter carries. A run that
succeeds costs none of this: the dispatcher writes its lease timer with the batch it fires in,
and the API settles that timer in the same grouped write as the outcome, so a lease costs a
timer row per firing and no read (decision 0008).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from bucketer.cql import Write
from scheduler import metrics
from scheduler.cassandra import MAX_ERROR_CHARS
from scheduler.dead_letters import Attempt, DeadLetter
from scheduler.errors import NotFound
from scheduler.model import (
    FollowUp,
    RetryPolicy,
    RunEventRecord,
    RunStatus,
    Schedule,
    ScheduleState,
)
from scheduler.session import Stores
from scheduler.stores import (
    DeadLetterReader,
    DeadLetterStore,
    RunQueue,
    RunStore,
    ScheduleStore,
    TimerStore,
)
from scheduler.timers import DeadLetterTimer, LeaseTimer, RunTimer

logger = logging.getLogger(__name__)

FAILURES = (RunStatus.FAILED, RunStatus.TIMED_OUT)
# Defaults of the two leases (Config: CRONSCALE_RUN_LEASE, CRONSCALE_HEARTBEAT_LEASE).
START_LEASE = timedelta(minutes=5)
HEARTBEAT_LEASE = timedelta(seconds=60)
# A re-armed lease is never due sooner than this.
_MIN_REARM = timedelta(seconds=1)


def backoff(policy: RetryPolicy, attempt: int, run_id: str) -> timedelta:
    """The wait after failed ``attempt`` (1 is the first) before the next one.

    ``initial_backoff * multiplier ** (attempt - 1)``, capped at ``max_backoff``, less a random
    share (``jitter``; 1.0 is full jitter: uniform between zero and the cap). The random draw
    derives from (run id, attempt), so a repeated report of the same failure waits the same.
    """
    exponent = max(attempt - 1, 0)
    cap = policy.max_backoff.total_seconds()
    base = policy.initial_backoff.total_seconds()
    # multiplier ** exponent overflows a float for silly inputs long after it passes the cap.
    wait = cap if exponent > 1000 else min(cap, base * policy.multiplier**exponent)
    digest = hashlib.blake2b(f"{run_id}#{attempt}".encode(), digest_size=8).digest()
    share = int.from_bytes(digest, "big") / 2**64
    return timedelta(seconds=wait * (1.0 - policy.jitter * share))


def next_attempt_at(policy: RetryPolicy, e: RunEventRecord, now: datetime) -> datetime | None:
    """When the attempt after the failed ``e`` is due; None if ``e`` was the last one (or its
    handler said retrying cannot help). A handler's "retry after" replaces the backoff, within
    ``max_backoff``."""
    if e.non_retryable or e.attempt >= policy.max_attempts:
        return None
    wait = e.retry_after if e.retry_after is not None else backoff(policy, e.attempt, e.run_id)
    return now + min(wait, policy.max_backoff)


def retry_due_rows(
    runs: RunStore,
    schedules: ScheduleStore,
    s: Schedule,
    run_id: str,
    failed_attempt: int,
    at: datetime,
) -> list[Write]:
    """Items: the retry after ``failed_attempt`` of ``run_id`` (a run of ``s``) is due ``at``,
    when a failure is recorded or a quota puts the retry off. The run stays in progress until
    then (``scheduler.cassandra.retry_pending``); marked in progress on the schedule row rather
    than a fire timer, it shows its next sign of life there at ``at``, however long the backoff
    (``Schedule.in_progress``)."""
    rows = [runs.retry_at_row(run_id, failed_attempt, at)]
    if s.active_run == run_id:
        rows.append(schedules.touch_active(s.schedule_id, at))
    return rows


class DeadLetterPublisher:
    """The dispatcher's side of dead letters: produces those whose ``DeadLetterTimer`` is due
    to the dead-letter topic (a read of each, with its failed attempts: never per firing)."""

    def __init__(
        self, *, dead_letters: DeadLetterReader, runs: RunStore, queue: RunQueue, topic: str
    ) -> None:
        self._dead_letters = dead_letters
        self._runs = runs
        self._queue = queue
        self.topic = topic

    async def publish(self, due: Sequence[DeadLetterTimer]) -> None:
        """Produces every due dead letter; raises if any was not acknowledged, so the batch is
        fired again (a repeat carries the same run id: consumers dedupe by it)."""
        if not due:
            return

        async def one(t: DeadLetterTimer) -> DeadLetter | None:
            try:
                history = await self._runs.attempts(t.run_id)
                return await self._dead_letters.get(t.run_id, history)
            except NotFound:
                return None  # its schedule's row expired or was deleted: nothing to say

        letters = [d for d in await asyncio.gather(*(one(t) for t in due)) if d is not None]
        if letters:
            await self._queue.enqueue(self.topic, [d.to_proto() for d in letters])


class Failures:
    """Applies retry policies to failed attempts (see the module docstring)."""

    def __init__(
        self,
        *,
        schedules: ScheduleStore,
        runs: RunStore,
        timers: TimerStore,
        dead_letters: DeadLetterStore,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._schedules = schedules
        self._runs = runs
        self._timers = timers
        self._dead_letters = dead_letters
        self._clock = clock

    async def handle(
        self,
        failed: Sequence[RunEventRecord],
        schedules: Mapping[str, Schedule] | None = None,
        *,
        outcomes: Callable[[frozenset[str]], Sequence[Write]] | None = None,
    ) -> frozenset[str]:
        """Retries or dead-letters each failed attempt (all FAILED or TIMED_OUT); idempotent,
        so a repeated report repeats the same rows. ``schedules`` may hold what the caller read
        already. A failure of a deleted or cancelled schedule stays as recorded: nothing is to
        run for it any more. Returns the runs whose retry follows.

        ``outcomes`` builds the attempts' outcome rows, given the runs whose retry follows
        (their end is not noted on the schedule: a run with a retry pending is still in
        progress, and its schedule's overlap policy holds later slots until the retry ends);
        they go in the last write, with the markers."""
        if not failed:
            return frozenset()
        now = self._clock()
        if schedules is None:
            schedules = await self._schedules.get_many([e.schedule_id for e in failed])
        items: list[Write] = self._runs.attempt_rows(failed)
        # What tells a redelivered message that its attempt is done (RunStore.finished): the
        # run row's retry time or its DEAD_LETTERED. Written only once everything it stands for
        # (the retry's timer; the dead letter's rows and publish timer) has landed: one grouped
        # write is not atomic across partitions, and a marker landing without them (Cassandra
        # restarting mid-write, the reporting worker dying before it reports again) left a run
        # dead-lettered with no dead letter, or a retry that never fires. The same holds for the
        # outcome itself (``outcomes``): an attempt found FAILED or TIMED_OUT is finished to a
        # lease handed again, which would not retry it; it lands with its marker (the run's
        # own partition, one batch).
        markers: list[Write] = []
        retried: set[str] = set()
        retries: list[RunTimer] = []
        hopeless: list[tuple[RunEventRecord, Schedule]] = []
        for e in failed:
            s = schedules.get(e.schedule_id)
            if s is None or s.state is ScheduleState.CANCELLED:
                continue
            at = next_attempt_at(s.policies.retry, e, now)
            if at is None:
                hopeless.append((e, s))
                continue
            retries.append(
                RunTimer(
                    schedule_id=e.schedule_id,
                    run_id=e.run_id,
                    scheduled_for=e.scheduled_for,
                    fire_at=at,
                    attempt=e.attempt + 1,
                    tenant=s.tenant,
                )
            )
            markers.extend(retry_due_rows(self._runs, self._schedules, s, e.run_id, e.attempt, at))
            retried.add(e.run_id)
            metrics.RUNS_RETRIED.labels(reason=e.status.value if e.status else "").inc()
        letters = await self._letters(hopeless, now)
        publish: list[DeadLetterTimer] = []
        for (e, _s), d in zip(hopeless, letters, strict=True):
            markers.append(self._runs.dead_letter_row(e))
            items.extend(self._dead_letters.rows(d))
            publish.append(DeadLetterTimer(schedule_id=d.schedule_id, run_id=d.run_id, fire_at=now))
        # A dispatcher produces the dead letters to their topic (DeadLetterPublisher): this
        # path, run reporting included, never waits on Kafka. If a write fails, the caller's
        # report (or lease check) is retried and writes the same rows again; if the caller dies
        # first, the markers are not written and a redelivery runs the attempt again.
        # Retries with full jitter and dead letters are due at once or nearly: written at a
        # late stamp, and put again if the write was slow (a lost one would leave its run
        # FAILED for good, neither retried nor dead-lettered).
        shards = self._timers.shard_count
        timers = [t.to_timer(shards) for t in retries] + [t.to_timer(shards) for t in publish]
        written_at = self._clock()
        items.extend(self._timers.rows(timers, now=written_at))
        await self._runs.write(items)
        await self._timers.repeat_if_slow(timers, written_at=written_at)
        if outcomes is not None:
            markers.extend(outcomes(frozenset(retried)))
        if markers:
            await self._runs.write(markers)
        for d in letters:
            metrics.RUNS_DEAD_LETTERED.labels(tier="standard").inc()
            logger.warning(
                "run %s dead-lettered after %d attempts: %s",
                d.run_id,
                d.attempts,
                d.error[:200],
                extra={"run_id": d.run_id, "schedule_id": d.schedule_id},
            )
        return frozenset(retried)

    async def _letters(
        self, hopeless: Sequence[tuple[RunEventRecord, Schedule]], now: datetime
    ) -> list[DeadLetter]:
        """The dead letters of runs whose last attempt failed, each with every failed attempt
        (read from ``run_attempts``: one read per dead letter, never per firing)."""

        async def one(e: RunEventRecord, s: Schedule) -> DeadLetter:
            earlier = await self._runs.attempts(e.run_id)
            last = Attempt(
                attempt=e.attempt,
                status=e.status or RunStatus.FAILED,
                error=e.error[:MAX_ERROR_CHARS],
                start_time=e.start_time,
                finish_time=e.event_time,
                worker_id=e.worker_id,
            )
            history = [a for a in earlier if a.attempt != e.attempt] + [last]
            return DeadLetter(
                run_id=e.run_id,
                schedule_id=e.schedule_id,
                tenant=s.tenant,
                handler=s.handler,
                payload=s.payload,
                scheduled_for=e.scheduled_for,
                dead_letter_time=now,
                attempts=e.attempt,
                error=last.error,
                history=tuple(sorted(history, key=lambda a: a.attempt)),
            )

        return list(await asyncio.gather(*(one(e, s) for e, s in hopeless)))


class LeaseCheck:
    """The dispatcher's side of run leases: a lease timer that comes due unsettled means its
    attempt has not finished; the run row says whether it is still alive (RUNNING with a
    recent heartbeat: the lease is re-armed) or lost (never started, or silent): then the
    attempt is recorded TIMED_OUT and its retry policy applies."""

    def __init__(
        self,
        *,
        runs: RunStore,
        timers: TimerStore,
        failures: Failures,
        heartbeat_lease: timedelta = HEARTBEAT_LEASE,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._runs = runs
        self._timers = timers
        self._failures = failures
        self._heartbeat_lease = heartbeat_lease
        self._clock = clock

    async def check(self, leases: Sequence[LeaseTimer]) -> None:
        if not leases:
            return
        now = self._clock()
        runs = await self._runs.get_many([lease.run_id for lease in leases])
        lost: list[RunEventRecord] = []
        rearm: list[LeaseTimer] = []
        for lease in leases:
            r = runs.get(lease.run_id)
            if r is None or r.attempt != lease.attempt:
                continue  # gone, or a later attempt superseded this one
            enqueued = r.enqueue_time or r.scheduled_for
            if r.status is RunStatus.RUNNING:
                seen = max(
                    (t for t in (r.heartbeat_time, r.start_time) if t is not None),
                    default=None,
                )
                if seen is not None and now - seen < self._heartbeat_lease:
                    at = max(seen + self._heartbeat_lease, now + _MIN_REARM)
                    rearm.append(replace(lease, fire_at=at))
                    continue
                silent = f"{(now - seen).total_seconds():.0f} s" if seen else "ever"
                error = f"lost: no heartbeat for {silent} (worker {r.worker_id or 'unknown'})"
                metrics.RUNS_LOST.labels(state="running").inc()
            elif r.status is RunStatus.ENQUEUED:
                waited = (now - enqueued).total_seconds()
                error = f"lost: not started {waited:.0f} s after it was enqueued"
                metrics.RUNS_LOST.labels(state="enqueued").inc()
            else:
                continue  # finished (its outcome landed after the lease timer was read)
            logger.warning(
                "run %s attempt %d %s",
                lease.run_id,
                lease.attempt,
                error,
                extra={"run_id": lease.run_id, "schedule_id": lease.schedule_id},
            )
            lost.append(
                RunEventRecord(
                    run_id=lease.run_id,
                    schedule_id=lease.schedule_id,
                    scheduled_for=r.scheduled_for,
                    status=RunStatus.TIMED_OUT,
                    event_time=now,
                    attempt=lease.attempt,
                    worker_id=r.worker_id,
                    error=error,
                    enqueue_time=enqueued,
                    follow_up=FollowUp.NONE,
                    start_time=r.start_time,
                )
            )
        if rearm:
            await self._timers.put([t.to_timer(self._timers.shard_count) for t in rearm], now=now)
        if lost:
            # The outcome only after the retry or the dead letter: were the outcome to land and
            # the rest to fail, the lease (handed again) would find the attempt finished and
            # the run would never be retried (``Failures.handle`` writes it with the markers).
            await self._failures.handle(
                lost,
                outcomes=lambda retried: self._runs.event_rows(lost, now=now, retried=retried),
            )


def failures_of(stores: Stores) -> Failures:
    """The ``Failures`` of a process, on its stores."""
    return Failures(
        schedules=stores.schedules,
        runs=stores.runs,
        timers=stores.timers,
        dead_letters=stores.dead_letters,
    )
