"""Backfills: one logical run per slot of a past range, enqueued at a bounded concurrency.

The API (``BackfillService.start``) validates the range, enumerates its slots with the same
code the dispatcher fires with (``scheduler.slots.slots_between``), stores them in a
``backfills`` row whose id derives from (schedule, start, end), and puts a ``BackfillTimer``.
A repeated request for the same range finds the row and enqueues nothing new.

The dispatcher drives the backfill (``BackfillDriver``, called by ``scheduler.firing``): each
time the timer is due it reads the row and the runs of the slots it has in flight (one read per
run partition), enqueues the next slots up to the free concurrency as ordinary runs (the
dispatcher's batched write-and-produce path), puts the timer again ``TICK`` later and advances
the row with one compare-and-set on its ``tick``. A timer whose tick is not the row's is a
stale duplicate (a crash re-fired it) and is dropped. Decision record: docs/decisions/0005.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from bucketer.cql import Queries, aexecute, execute_conditional, first
from scheduler.cassandra import CassandraScheduleStore
from scheduler.errors import FailedPrecondition, InvalidArgument, NotFound
from scheduler.model import (
    BACKFILL_SUFFIX,
    STALE_RUN,
    RunStatus,
    Schedule,
    ScheduleState,
    aware,
    day_of,
    run_id_for,
)
from scheduler.slots import slots_between
from scheduler.timers import BackfillTimer, RunTimer

logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 10
MAX_CONCURRENCY = 1000
MAX_SLOTS = 10_000
MAX_SPAN = timedelta(days=366)
# How often a running backfill looks at its runs and tops up.
TICK = timedelta(seconds=1)
FINISHED = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.DEAD_LETTERED,
        RunStatus.CANCELLED,
        RunStatus.SKIPPED,
    }
)
_TINY = timedelta(microseconds=1)
_IN_CHUNK = 100
_STAMP = "%Y%m%dT%H%M%S"


def _stamp(t: datetime) -> str:
    t = t.astimezone(UTC)
    return f"{t.strftime(_STAMP)}.{t.microsecond // 1000:03d}Z"


def backfill_id_for(schedule_id: str, start: datetime, end: datetime) -> str:
    """The backfill of ``[start, end)`` of a schedule: the same range always gets the same id
    (``<schedule_id>@bf-<start>-<end>``), which is what makes a repeated request idempotent."""
    return f"{schedule_id}@bf-{_stamp(start)}-{_stamp(end)}"


def backfill_run_id(schedule_id: str, at: datetime) -> str:
    """The run id of a backfilled slot: derived from the slot, apart from its live run's id."""
    return run_id_for(schedule_id, at, suffix=BACKFILL_SUFFIX)


def validate_concurrency(value: int) -> int:
    """0 means the default (10); outside 1..1000 is InvalidArgument('concurrency')."""
    if value < 0 or value > MAX_CONCURRENCY:
        raise InvalidArgument(
            "concurrency", f"must be between 1 and {MAX_CONCURRENCY} (0 means 10), got {value}"
        )
    return value or DEFAULT_CONCURRENCY


def validate_range(
    start: datetime | None, end: datetime | None, now: datetime
) -> tuple[datetime, datetime]:
    """Checks ``[start, end)`` before any slot is computed; InvalidArgument names the field:
    missing bounds, an end not after the start, an end in the future, a span over 366 days."""
    if start is None:
        raise InvalidArgument("start_time", "is required")
    if end is None:
        raise InvalidArgument("end_time", "is required")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end < start:
        raise InvalidArgument(
            "end_time", f"{end.isoformat()} is before start_time {start.isoformat()}"
        )
    if end == start:
        raise InvalidArgument(
            "end_time", f"equals start_time ({start.isoformat()}): the range [start, end) is empty"
        )
    if end > now:
        raise InvalidArgument(
            "end_time",
            f"{end.isoformat()} is in the future (now {now.isoformat()}); a backfill covers past "
            "slots, the schedule fires the others itself",
        )
    if end - start > MAX_SPAN:
        raise InvalidArgument(
            "end_time",
            f"the range spans {(end - start) / timedelta(days=1):.1f} days; at most "
            f"{MAX_SPAN.days} days per backfill",
        )
    return start, end


def backfill_slots(s: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The fire times (jitter applied) of ``s`` whose slot lies in ``[start, end)``, as the
    dispatcher computes them; InvalidArgument('end_time') if there are none or too many."""
    slots = slots_between(s, start - _TINY, end - _TINY, MAX_SLOTS + 1)
    if not slots:
        raise InvalidArgument(
            "end_time",
            f"the range [{start.isoformat()}, {end.isoformat()}) holds no slot of schedule "
            f"{s.schedule_id!r}: nothing to backfill",
        )
    if len(slots) > MAX_SLOTS:
        raise InvalidArgument(
            "end_time",
            f"the range holds more than {MAX_SLOTS} slots of schedule {s.schedule_id!r}; "
            "split it into smaller backfills",
        )
    return [slot.at for slot in slots]


@dataclass(frozen=True, kw_only=True)
class BackfillRow:
    """A stored backfill: its slots in order, how many are enqueued, which are in flight."""

    backfill_id: str
    schedule_id: str
    start_time: datetime
    end_time: datetime
    slots: tuple[datetime, ...]
    concurrency: int
    create_time: datetime | None = None
    enqueued: int = 0
    tick: int = 0
    inflight: frozenset[datetime] = frozenset()
    done: int = 0

    @classmethod
    def from_row(cls, row: Any) -> BackfillRow:
        """From a ``backfills`` row (naive UTC timestamps made aware)."""
        return cls(
            backfill_id=row.backfill_id,
            schedule_id=row.schedule_id,
            start_time=_aware(row.start_time),
            end_time=_aware(row.end_time),
            slots=tuple(_aware(t) for t in row.slots or ()),
            concurrency=row.concurrency or DEFAULT_CONCURRENCY,
            create_time=aware(row.create_time),
            enqueued=row.enqueued or 0,
            tick=row.tick or 0,
            inflight=frozenset(_aware(t) for t in row.inflight or ()),
            done=row.done or 0,
        )


def _aware(t: datetime) -> datetime:
    out = aware(t)
    assert out is not None
    return out


@dataclass(frozen=True, kw_only=True)
class Backfill:
    """A backfill's progress as GetBackfill shows it."""

    backfill_id: str
    schedule_id: str
    start_time: datetime
    end_time: datetime
    total: int
    enqueued: int
    done: int
    concurrency: int
    create_time: datetime | None


@dataclass(frozen=True, kw_only=True)
class RunProgress:
    """What a backfill needs to know of one of its runs."""

    status: RunStatus
    last_seen: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class Step:
    """One tick of a backfill: the slots to enqueue now and the row's next state."""

    enqueue: tuple[datetime, ...]
    inflight: frozenset[datetime]
    enqueued: int
    done: int
    more: bool


def _holds_slot(p: RunProgress | None, now: datetime) -> bool:
    """Whether an in-flight run still counts against the concurrency: not finished, and not a
    RUNNING run silent for STALE_RUN (ENQUEUED ones wait in Kafka; they always count)."""
    if p is None or p.status in FINISHED:
        return False
    if p.status is RunStatus.RUNNING and p.last_seen is not None:
        return now - p.last_seen < STALE_RUN
    return True


def plan_step(
    row: BackfillRow, progress: Mapping[datetime, RunProgress | None], now: datetime
) -> Step:
    """The next tick of ``row``, given the progress of its in-flight runs (missing: unknown,
    e.g. expired). Finished runs leave the in-flight set and count as done; the free
    concurrency is filled with the next slots in order; ``more`` says whether to tick again
    (slots left, or runs still holding a concurrency slot)."""
    finished = {at for at in row.inflight if (p := progress.get(at)) and p.status in FINISHED}
    still = row.inflight - finished
    holding = sum(1 for at in still if _holds_slot(progress.get(at), now))
    free = max(0, row.concurrency - holding)
    take = row.slots[row.enqueued : row.enqueued + free]
    enqueued = row.enqueued + len(take)
    return Step(
        enqueue=tuple(take),
        inflight=frozenset(still | set(take)),
        enqueued=enqueued,
        done=row.done + len(finished),
        more=enqueued < len(row.slots) or holding > 0 or bool(take),
    )


def progress_of(row: BackfillRow, progress: Mapping[datetime, RunProgress | None]) -> Backfill:
    """The row's progress with its in-flight runs' current state folded in (``done`` counts
    runs that finished: SUCCEEDED or FAILED, also dead-lettered or cancelled)."""
    finished = sum(1 for at in row.inflight if (p := progress.get(at)) and p.status in FINISHED)
    return Backfill(
        backfill_id=row.backfill_id,
        schedule_id=row.schedule_id,
        start_time=row.start_time,
        end_time=row.end_time,
        total=len(row.slots),
        enqueued=row.enqueued,
        done=row.done + finished,
        concurrency=row.concurrency,
        create_time=row.create_time,
    )


class CassandraBackfillStore:
    """The ``backfills`` table and the reads of backfill runs' progress."""

    def __init__(self, session: Session, *, keyspace: str) -> None:
        self._session = session
        self._q = Queries(session, Path(__file__).with_name("backfill.cql"), keyspace=keyspace)

    async def create(self, row: BackfillRow) -> bool:
        """Stores a new backfill; False if one with its id exists already."""
        applied, _ = await execute_conditional(
            self._session,
            self._q["insert_backfill"],
            (
                row.backfill_id,
                row.schedule_id,
                row.start_time,
                row.end_time,
                list(row.slots),
                row.enqueued,
                row.concurrency,
                row.create_time,
                row.tick,
                set(row.inflight) or None,
                row.done,
            ),
        )
        return applied

    async def get(self, backfill_id: str) -> BackfillRow | None:
        """The backfill, or None."""
        row = first(await aexecute(self._session, self._q["get_backfill"], (backfill_id,)))
        return BackfillRow.from_row(row) if row is not None and row.schedule_id else None

    async def get_many(self, ids: Iterable[str]) -> dict[str, BackfillRow]:
        """The backfills among ``ids`` that exist, one multi-partition read per 100 ids."""
        unique = list(dict.fromkeys(ids))
        out: dict[str, BackfillRow] = {}
        for start in range(0, len(unique), 100):
            rows = await aexecute(
                self._session, self._q["get_backfills"], (unique[start : start + 100],)
            )
            for r in rows:
                if r.schedule_id:
                    out[r.backfill_id] = BackfillRow.from_row(r)
        return out

    async def advance(self, row: BackfillRow, step: Step) -> bool:
        """Moves the row to its next tick if it is still at ``row.tick`` (compare-and-set)."""
        applied, _ = await execute_conditional(
            self._session,
            self._q["advance_backfill"],
            (
                row.tick + 1,
                step.enqueued,
                set(step.inflight) or None,
                step.done,
                row.backfill_id,
                row.tick,
            ),
        )
        return applied

    async def run_progress(
        self, wanted: Mapping[str, Iterable[datetime]]
    ) -> dict[tuple[str, datetime], RunProgress | None]:
        """The state of the backfill runs of ``{schedule_id: [fire times]}``: one read per
        run partition (schedule, day) and 100 slots, all in flight at once."""
        reads: list[tuple[str, int, list[datetime]]] = []
        for sid, ats in wanted.items():
            by_day: dict[int, list[datetime]] = defaultdict(list)
            for at in ats:
                by_day[day_of(at)].append(at)
            for day, day_ats in by_day.items():
                for i in range(0, len(day_ats), _IN_CHUNK):
                    reads.append((sid, day, day_ats[i : i + _IN_CHUNK]))
        out: dict[tuple[str, datetime], RunProgress | None] = {
            (sid, at): None for sid, ats in wanted.items() for at in ats
        }

        async def one(sid: str, day: int, ats: list[datetime]) -> None:
            ids = {backfill_run_id(sid, at): at for at in ats}
            rows = await aexecute(self._session, self._q["run_progress"], (sid, day, ats))
            for r in rows:
                at = ids.get(r.run_id)
                if at is None or r.status is None:
                    continue
                seen = [t for t in (r.enqueue_time, r.start_time, r.heartbeat_time) if t]
                out[(sid, at)] = RunProgress(
                    status=RunStatus(r.status), last_seen=aware(max(seen)) if seen else None
                )

        await asyncio.gather(*(one(*r) for r in reads))
        return out


@dataclass
class TickPlan:
    """What one batch of due backfill timers does: runs to enqueue (as run timers the
    dispatcher's ``plan_run`` turns into runs), the next timers, and the rows to advance."""

    runs: list[tuple[Schedule, RunTimer]] = field(default_factory=list)
    next_timers: list[BackfillTimer] = field(default_factory=list)
    advances: list[tuple[BackfillRow, Step]] = field(default_factory=list)


class BackfillDriver:
    """The dispatcher's side: turns due backfill timers into enqueued runs, batch-wise."""

    def __init__(self, *, store: CassandraBackfillStore, schedules: CassandraScheduleStore) -> None:
        self._store = store
        self._schedules = schedules

    async def plan(self, due: Sequence[BackfillTimer], now: datetime) -> TickPlan:
        """Reads the backfills of ``due`` (one timer per backfill; stale ticks dropped), their
        schedules and their in-flight runs, and decides each one's step."""
        ticks: dict[str, set[int]] = defaultdict(set)
        for t in due:
            ticks[t.backfill_id].add(t.tick)
        rows = await self._store.get_many(ticks)
        live = [rows[b] for b, seen in ticks.items() if b in rows and rows[b].tick in seen]
        out = TickPlan()
        if not live:
            return out
        schedules = await self._schedules.get_many([r.schedule_id for r in live])
        wanted: dict[str, set[datetime]] = defaultdict(set)
        for r in live:
            wanted[r.schedule_id] |= r.inflight
        progress = await self._store.run_progress(wanted)
        for r in live:
            s = schedules.get(r.schedule_id)
            if s is None or s.state is ScheduleState.CANCELLED:
                logger.info(
                    "backfill %s stops: its schedule is gone or cancelled",
                    r.backfill_id,
                    extra={"schedule_id": r.schedule_id},
                )
                continue
            step = plan_step(r, {at: progress.get((r.schedule_id, at)) for at in r.inflight}, now)
            for at in step.enqueue:
                out.runs.append(
                    (
                        s,
                        RunTimer(
                            schedule_id=s.schedule_id,
                            run_id=backfill_run_id(s.schedule_id, at),
                            scheduled_for=at,
                            fire_at=now,
                            backfill_id=r.backfill_id,
                            tenant=s.tenant,
                        ),
                    )
                )
            if step.more:
                out.next_timers.append(
                    BackfillTimer(backfill_id=r.backfill_id, tick=r.tick + 1, fire_at=now + TICK)
                )
            out.advances.append((r, step))
        return out

    async def commit(self, plan: TickPlan) -> None:
        """Advances each backfill row (after its runs and next timer are written): one
        compare-and-set per backfill, all in flight at once."""
        results = await asyncio.gather(*(self._store.advance(r, s) for r, s in plan.advances))
        for (r, _s), applied in zip(plan.advances, results, strict=True):
            if not applied:
                logger.info("backfill %s: tick %d advanced elsewhere", r.backfill_id, r.tick)


class BackfillService:
    """The API's side: start a backfill, read its progress."""

    def __init__(
        self,
        *,
        schedules: CassandraScheduleStore,
        session: Session,
        timers: CassandraTimerStore,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._schedules = schedules
        self._store = CassandraBackfillStore(session, keyspace=schedules.q.keyspace)
        self._timers = timers
        self._clock = clock

    async def start(
        self,
        schedule_id: str,
        start: datetime | None,
        end: datetime | None,
        *,
        concurrency: int = 0,
    ) -> Backfill:
        """Starts backfilling ``[start, end)`` of a schedule, or returns the progress of the
        backfill of that same range if it exists (enqueuing nothing new)."""
        now = self._clock()
        limit = validate_concurrency(concurrency)
        start, end = validate_range(start, end, now)
        s = await self._schedules.get(schedule_id)
        bid = backfill_id_for(s.schedule_id, start, end)
        existing = await self._store.get(bid)
        if existing is not None:
            return await self._resume(existing, now)
        if s.state is ScheduleState.CANCELLED:
            raise FailedPrecondition(f"schedule {schedule_id!r} is CANCELLED; it runs no more")
        row = BackfillRow(
            backfill_id=bid,
            schedule_id=s.schedule_id,
            start_time=start,
            end_time=end,
            slots=tuple(backfill_slots(s, start, end)),
            concurrency=limit,
            create_time=now,
        )
        # Row first, then its timer: a timer due now must find its row. A crash in between
        # leaves a backfill that a repeated request restarts (``_resume``).
        if not await self._store.create(row):
            existing = await self._store.get(bid)
            if existing is None:
                raise NotFound(f"backfill {bid!r} vanished while being created; retry")
            return await self._resume(existing, now)
        await self._put_timer(row, now)
        logger.info(
            "backfill %s: %d slots at concurrency %d",
            bid,
            len(row.slots),
            limit,
            extra={"schedule_id": s.schedule_id},
        )
        return progress_of(row, {})

    async def _resume(self, row: BackfillRow, now: datetime) -> Backfill:
        """A repeated request: nothing new is enqueued. If the backfill has slots left, its
        timer is put again at its current tick (a duplicate of a live one is dropped as stale
        once the live one advanced the row), so a backfill whose timer was lost recovers."""
        progress = await self.progress(row)
        if progress.enqueued < progress.total:
            await self._put_timer(row, now)
        return progress

    async def _put_timer(self, row: BackfillRow, now: datetime) -> None:
        timer = BackfillTimer(backfill_id=row.backfill_id, tick=row.tick, fire_at=now)
        await self._timers.put([timer.to_timer(self._timers.shard_count)], now=now)

    async def get(self, backfill_id: str) -> Backfill:
        """The backfill's progress; NotFound if unknown (or expired, after 30 days)."""
        row = await self._store.get(backfill_id)
        if row is None:
            raise NotFound(f"backfill {backfill_id!r} not found")
        return await self.progress(row)

    async def progress(self, row: BackfillRow) -> Backfill:
        """``row``'s progress, reading its in-flight runs for an up-to-date ``done``."""
        found = await self._store.run_progress({row.schedule_id: row.inflight})
        return progress_of(row, {at: found.get((row.schedule_id, at)) for at in row.inflight})
