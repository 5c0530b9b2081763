"""What follows from workers' run reports, beyond recording them.

When runs finish: a run that BUFFER_ONE held back is released once its schedule has nothing in
progress, and a successful run fires its downstream schedules once each (dependencies). Both
are put as run timers due now, so every enqueue goes through a dispatcher. Heartbeats learn
whether their run was asked to cancel.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bucketer.cql import Write
from bucketer.model import micros
from scheduler.model import (
    STALE_RUN,
    FollowUp,
    RunEventRecord,
    RunStatus,
    Schedule,
    run_id_for,
)
from scheduler.retries import FAILURES, Failures
from scheduler.stores import RunStore, ScheduleStore, TimerStore
from scheduler.timers import LeaseTimer, RunTimer, fire_timer_place

logger = logging.getLogger(__name__)

_TERMINAL = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT)


def dependent_run_id(downstream_id: str, upstream_run_id: str, scheduled_for: datetime) -> str:
    """The run id of ``downstream_id`` fired by one upstream run: derived from that run, so a
    repeated success report of it fires the downstream under the same id."""
    digest = hashlib.blake2b(upstream_run_id.encode(), digest_size=4).hexdigest()
    return run_id_for(downstream_id, scheduled_for, suffix=f"d{digest}")


@dataclass(frozen=True)
class Recorded:
    """What :meth:`RunReports.record` answers besides writing: runs whose heartbeat should
    cancel them, and runs whose STARTED asked ``check_done`` and had run already."""

    cancel: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)


class RunReports:
    """Records run events and applies their consequences."""

    def __init__(
        self,
        *,
        schedules: ScheduleStore,
        runs: RunStore,
        timers: TimerStore,
        failures: Failures,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._schedules = schedules
        self._runs = runs
        self._timers = timers
        self._failures = failures
        self._clock = clock

    async def record(self, events: Sequence[RunEventRecord]) -> Recorded:
        """Records ``events``; returns the run ids among heartbeats that should cancel, and
        those among the STARTED events with ``check_done`` whose attempt has run already
        (nothing is recorded for these).

        An outcome settles its attempt's lease timer in the same grouped write, so a run that
        finishes in time costs its dispatcher no read when the lease comes due."""
        checks = {e.run_id: e.attempt for e in events if e.check_done}
        done = await self._runs.finished(checks) if checks else set()
        if done:
            events = [e for e in events if not (e.check_done and e.run_id in done)]
        now = self._clock()
        failed = [e for e in events if e.status in FAILURES]
        rest = [e for e in events if e.status not in FAILURES] if failed else events
        if rest:
            await self._runs.record_events(rest, now=now, also=self.settle_rows(rest, now))
        # A run whose message said nothing follows its end (no dependents, no held-back run)
        # costs no schedule read here, unless it failed (its retry policy is on the schedule).
        finished = [e for e in events if e.status in _TERMINAL and e.follow_up is not FollowUp.NONE]
        if finished or failed:
            schedules = await self._schedules.get_many(
                [e.schedule_id for e in (*finished, *failed)]
            )
            # A failure's outcome is written with what follows it (its retry or dead letter),
            # and a run whose retry follows stays in progress: its end is not noted, nor does
            # it release a held-back run.
            retried: frozenset[str] = frozenset()
            if failed:
                retried = await self._failures.handle(
                    failed,
                    schedules,
                    outcomes=lambda retried: [
                        *self._runs.event_rows(failed, now=now, retried=retried),
                        *self.settle_rows(failed, now, retried=retried),
                    ],
                )
            finished = [e for e in finished if e.run_id not in retried]
            if finished:
                busy = {e.schedule_id for e in failed if e.run_id in retried}
                await self._after_finish(finished, schedules, busy)
        beats = [e.run_id for e in events if e.status is None]
        cancel = await self._runs.cancel_requested(beats) if beats else set()
        return Recorded(cancel=cancel, done=done)

    def settle_rows(
        self, events: Sequence[RunEventRecord], now: datetime, *, retried: Collection[str] = ()
    ) -> list[Write]:
        """Items settling finished attempts' lease timers, and noting on their schedules' next
        fire timers the runs that ended (``RunEventRecord.done_noted_on_timer``; the store
        then leaves the schedule row alone), less those whose retry follows (``retried``)."""
        shards = self._timers.shard_count
        notes = [
            (fire_timer_place(e.schedule_id, e.next_fire_time, shards), e.run_id)
            for e in events
            if e.next_fire_time is not None
            and e.done_noted_on_timer(now)
            and e.run_id not in retried
        ]
        items = self._timers.done_rows(notes, now=now) if notes else []
        leases = [
            LeaseTimer(
                schedule_id=e.schedule_id,
                run_id=e.run_id,
                attempt=e.attempt,
                fire_at=e.lease_expire_time,
                stamp=micros(e.enqueue_time),
            ).to_timer(self._timers.shard_count)
            for e in events
            if e.status in _TERMINAL
            and e.lease_expire_time is not None
            and e.enqueue_time is not None
        ]
        return items + self._timers.settle_rows(leases, now=now) if leases else items

    async def _after_finish(
        self,
        finished: Sequence[RunEventRecord],
        schedules: Mapping[str, Schedule],
        busy: Collection[str],
    ) -> None:
        """Fires the downstream schedules of runs that succeeded, and releases the runs
        BUFFER_ONE held back on schedules with nothing left in progress (``busy``: schedules
        with a run whose retry follows)."""
        now = self._clock()
        timers: list[RunTimer] = []
        for e in finished:
            s = schedules.get(e.schedule_id)
            if s is None:
                continue
            if e.status is RunStatus.SUCCEEDED:
                for down in sorted(s.downstream):
                    timers.append(
                        RunTimer(
                            schedule_id=down,
                            run_id=dependent_run_id(down, e.run_id, e.scheduled_for),
                            scheduled_for=e.scheduled_for,
                            fire_at=now,
                            origin_run_id=e.run_id,
                            tenant=s.tenant,
                        )
                    )
        released: list[Write] = []
        to_clear: list[tuple[str, str]] = []
        for sid, s in schedules.items():
            if s.buffered is None or sid in busy:
                continue
            done = {e.run_id for e in finished if e.schedule_id == sid}
            still = [r for r in s.in_progress(now, stale_after=STALE_RUN) if r not in done]
            if still == [s.buffered.run_id]:
                # Released already (its timer written, it marked in progress) by a report that
                # died before clearing the buffer: only the clear is left to do.
                to_clear.append((sid, s.buffered.to_json()))
                continue
            if still:
                continue
            timers.append(
                RunTimer(
                    schedule_id=sid,
                    run_id=s.buffered.run_id,
                    scheduled_for=s.buffered.scheduled_for,
                    fire_at=now,
                    manual=s.buffered.manual,
                    tenant=s.tenant,
                )
            )
            # In progress from now on, not only once a dispatcher enqueues it: a slot due in
            # between must see it (else both would run, defeating BUFFER_ONE).
            released.append(self._schedules.mark_active(sid, s.buffered.run_id, now))
            to_clear.append((sid, s.buffered.to_json()))
        # The release timer is written before the buffer is cleared: a crash in between leaves
        # the run held and released again later under the same run id, never lost. Concurrent
        # replicas write the same timer (same id); the conditional clear lets one of them win.
        if timers:
            due = [t.to_timer(self._timers.shard_count) for t in timers]
            written_at = self._clock()
            await self._runs.write(released + self._timers.rows(due, now=written_at))
            await self._timers.repeat_if_slow(due, written_at=written_at)
        for sid, held in to_clear:
            if await self._runs.clear_buffered(sid, held):
                logger.info("released the buffered run of %s", sid, extra={"schedule_id": sid})
