"""What happens when timers are due: the dispatcher's firing logic, one batch at a time.

For a batch of due fire timers: read their schedules in one multi-partition query, drop the
timers a change has superseded (generation mismatch, paused, deleted), record each run as
ENQUEUED and put each schedule's next timer (grouped writes), then produce the run messages to
Kafka and wait for their acknowledgement. Only then does the scanner move its checkpoint, so a
crash anywhere re-fires the batch with the same run ids (at-least-once, never lost).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from bucketer.cassandra import CassandraTimerStore
from bucketer.cql import write_grouped
from bucketer.model import Timer
from cronscale.v1 import run_message_pb2
from scheduler import metrics
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.kafka import RUN_MESSAGE_SCHEMA_VERSION, KafkaRunQueue
from scheduler.model import Run, RunStatus, Schedule, ScheduleState, run_id_for
from scheduler.timers import FIRE, FireTimer
from scheduler.timespec import jitter_offset

logger = logging.getLogger(__name__)


def next_fire(schedule: Schedule, after_slot: datetime, now: datetime) -> FireTimer | None:
    """The schedule's next pending firing after ``after_slot``.

    If that slot is already past (the fleet was down, or this firing ran late by a whole
    period), the firing being made stands for the missed slots and the next one is the first
    after ``now`` (misfire policy FIRE_ONCE, the default).
    """
    spec = schedule.spec.timespec
    nxt = spec.next_after(after_slot)
    if nxt is not None and nxt.utc <= now:
        nxt = spec.next_after(now)
    if nxt is None:
        return None
    return FireTimer(
        schedule_id=schedule.schedule_id,
        generation=schedule.generation,
        slot=nxt.utc,
        scheduled_for=nxt.utc + jitter_offset(schedule.schedule_id, schedule_jitter(schedule)),
    )


def schedule_jitter(schedule: Schedule) -> timedelta:
    """The schedule's jitter window (none until schedules carry one)."""
    return timedelta(0)


def _ts(t: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(t.astimezone(UTC))
    return ts


class Firing:
    """Turns due timers into enqueued runs and next timers."""

    def __init__(
        self,
        *,
        schedules: CassandraScheduleStore,
        runs: CassandraRunStore,
        timers: CassandraTimerStore,
        queue: KafkaRunQueue,
        topic: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._schedules = schedules
        self._runs = runs
        self._timers = timers
        self._queue = queue
        self._topic = topic
        self._clock = clock

    async def on_due(self, due: Sequence[Timer]) -> None:
        """Fires a batch; raises if anything failed, so the scanner retries the batch."""
        started = time.perf_counter()
        fires: list[FireTimer] = []
        for t in due:
            if t.kind != FIRE:
                logger.warning("ignoring timer of unknown kind %r (%s)", t.kind, t.timer_id)
                continue
            fires.append(FireTimer.from_timer(t))
        if not fires:
            return
        schedules = await self._schedules.get_many([f.schedule_id for f in fires])
        now = self._clock()
        runs: list[Run] = []
        messages: list[run_message_pb2.RunMessage] = []
        next_timers: list[Timer] = []
        completed: list[tuple[Schedule, FireTimer]] = []
        for f in fires:
            s = schedules.get(f.schedule_id)
            if s is None or s.generation != f.generation or s.state is not ScheduleState.ACTIVE:
                metrics.TIMERS_SUPERSEDED.inc()
                continue
            run = Run(
                run_id=run_id_for(s.schedule_id, f.scheduled_for),
                schedule_id=s.schedule_id,
                scheduled_for=f.scheduled_for,
                status=RunStatus.ENQUEUED,
                attempt=1,
                handler=s.handler,
                tenant=s.tenant,
                enqueue_time=now,
            )
            runs.append(run)
            messages.append(self._message(s, run))
            nxt = next_fire(s, f.slot, now)
            if nxt is None:
                completed.append((s, f))
            else:
                next_timers.append(nxt.to_timer(self._timers.shard_count))
        if not runs:
            return
        items = self._runs.insert_rows(runs)
        q = self._schedules.q
        for s, f in completed:
            items.append(
                (
                    s.schedule_id,
                    q["record_completed"],
                    (
                        int(f.scheduled_for.timestamp() * 1_000_000),
                        f.scheduled_for,
                        ScheduleState.COMPLETED.value,
                        s.schedule_id,
                    ),
                )
            )
        await write_grouped(self._runs_session, items)
        await self._timers.put(next_timers, now=now)
        await self._queue.enqueue(self._topic, messages)
        done = self._clock()
        for r in runs:
            metrics.RUNS_ENQUEUED.labels(tier="standard").inc()
            metrics.FIRE_LAG.observe(max(0.0, (done - r.scheduled_for).total_seconds()))
        logger.debug("fired %d runs in %.1f ms", len(runs), (time.perf_counter() - started) * 1e3)

    @property
    def _runs_session(self) -> Any:
        return self._runs.session

    def _message(self, s: Schedule, run: Run) -> run_message_pb2.RunMessage:
        m = run_message_pb2.RunMessage(
            schema_version=RUN_MESSAGE_SCHEMA_VERSION,
            run_id=run.run_id,
            schedule_id=s.schedule_id,
            tenant=s.tenant,
            handler=s.handler,
            payload=s.payload,
            attempt=run.attempt,
            manual=run.manual,
        )
        m.scheduled_for.CopyFrom(_ts(run.scheduled_for))
        assert run.enqueue_time is not None
        m.enqueue_time.CopyFrom(_ts(run.enqueue_time))
        if s.max_runtime:
            d = Duration()
            d.FromTimedelta(s.max_runtime)
            m.max_runtime.CopyFrom(d)
        return m
