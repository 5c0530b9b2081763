"""The control plane's Cassandra backend: schedules and run history."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE, SimpleStatement

from bucketer.cql import (
    Queries,
    Write,
    aexecute,
    aexecute_all,
    execute_conditional,
    first,
    write_grouped,
)
from bucketer.keys import minute_bucket
from bucketer.model import Timer, aware, micros
from scheduler.dead_letters import Attempt
from scheduler.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from scheduler.model import (
    Run,
    RunEventRecord,
    RunStatus,
    Schedule,
    ScheduleState,
    day_of,
    is_backfill_run,
    millis,
    parse_run_id,
)
from scheduler.schedule_cache import ANNOUNCE_LIMIT, CHANGE_GRACE, HOLD

logger = logging.getLogger(__name__)
T = TypeVar("T")

# How far back ListRuns looks: the run table's TTL.
RUN_RETENTION_DAYS = 30
# A run's row goes out with its message, at its slot (fire-ahead holds both until then): a run
# with no row this long after its slot never went out (its dispatcher died holding it; the
# slot's next owner fires it again, under the same id, or records it missed), and holds up no
# later slot.
UNRECORDED_RUN = timedelta(seconds=10)
# Run rows of one day read when asking which of a schedule's runs are in progress (an
# every-second schedule skipping its slots behind a long run writes 3,600 an hour).
RUNS_LOOKED_AT = 10_000
MAX_ERROR_CHARS = 4096
# Statuses that do not show a worker took the run (its message may never have reached Kafka).
_NOT_TAKEN = (RunStatus.ENQUEUED.value, RunStatus.SKIPPED.value)
# An attempt with one of these is over, and nothing more follows from it.
_FINISHED = frozenset(
    s.value for s in (RunStatus.SUCCEEDED, RunStatus.CANCELLED, RunStatus.DEAD_LETTERED)
)
# An attempt with one of these is over (a failed one may be retried: a new attempt, in progress
# again once enqueued).
_ENDED = frozenset(
    s.value
    for s in (
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.TIMED_OUT,
        RunStatus.CANCELLED,
        RunStatus.DEAD_LETTERED,
        RunStatus.SKIPPED,
    )
)
# Over, and to be retried: done once the retry is written too (next_attempt_time).
_FAILURES = frozenset(s.value for s in (RunStatus.FAILED, RunStatus.TIMED_OUT))


# A run row's status cells are written at a timestamp derived from the run itself, never from
# a clock: slot + attempt * 4 + rank. So a worker's report (RUNNING, then an outcome) always
# wins over the dispatcher's ENQUEUED of the same attempt, whatever either clock says or which
# lands first, and the next attempt's ENQUEUED wins over a late outcome of the one before.
_ENQUEUED_RANK = 0
_RUNNING_RANK = 1
_OUTCOME_RANK = 2
_DEAD_LETTER_RANK = 3
_ATTEMPT_STRIDE = 4


def _set(value: object) -> object:
    """A value to bind, or "unset" for None: a null bound in an insert is written as a
    tombstone cell; an unset one writes nothing."""
    return UNSET_VALUE if value is None else value


def _run_key(schedule_id: str, day: int, scheduled_for: datetime, run_id: str) -> dict[str, Any]:
    """A run row's primary key, as the named markers of the run statements bind it."""
    return {
        "schedule_id": schedule_id,
        "day": day,
        "scheduled_for": scheduled_for,
        "run_id": run_id,
    }


def retry_pending(row: Any, now: datetime, stale_after: timedelta) -> bool:
    """Whether a run row shows a failed attempt whose retry is written and not yet taken: the
    run is still in progress as its schedule's overlap policy weighs it (a slot due during the
    backoff must not start beside the retry), until ``stale_after`` past the retry's due time
    (a retry never enqueued by then, its timer lost, no longer holds the schedule)."""
    at = row.next_attempt_time
    return row.status in _FAILURES and at is not None and now - aware(at) < stale_after


def run_alive(row: Any, scheduled_for: datetime, now: datetime, stale_after: timedelta) -> bool:
    """Whether a run is in progress by its run row (None: not written): not ended (a failed
    attempt with its retry pending is not: ``retry_pending``), and a sign of life (its slot,
    enqueue, start or last heartbeat) within ``stale_after``. A run with no row is in progress
    only until ``UNRECORDED_RUN`` past its slot."""
    if row is None:
        return now - scheduled_for < min(stale_after, UNRECORDED_RUN)
    if row.status in _ENDED:
        return retry_pending(row, now, stale_after)
    seen = [t for t in (row.enqueue_time, row.start_time, row.heartbeat_time) if t]
    return now - max([scheduled_for, *(aware(t) for t in seen)]) < stale_after


def run_cell_time(scheduled_for: datetime, attempt: int, rank: int) -> int:
    """The write timestamp of a run row's status cells (see above)."""
    return micros(scheduled_for) + max(attempt, 1) * _ATTEMPT_STRIDE + rank


class CassandraScheduleStore:
    """Schedules by id. Changes are compare-and-set on ``version`` (rare, so LWT is fine)."""

    def __init__(
        self,
        session: Session,
        *,
        keyspace: str,
        announce_limit: timedelta = ANNOUNCE_LIMIT,
        announce_again_after: timedelta = HOLD - CHANGE_GRACE,
    ) -> None:
        self._session = session
        self.q = Queries(session, Path(__file__).with_name("queries.cql"), keyspace=keyspace)
        self._announce_limit = announce_limit
        self._announce_again_after = announce_again_after

    async def create(self, s: Schedule) -> None:
        """Stores a new schedule; AlreadyExists if its id is taken."""
        applied, _ = await execute_conditional(
            self._session, self.q["insert_schedule"], self._row(s)
        )
        if not applied:
            raise AlreadyExists(f"schedule_id: {s.schedule_id!r} already exists")

    async def create_unchecked(self, schedules: Sequence[Schedule]) -> None:
        """Stores new schedules without :meth:`create`'s existence check (an LWT each), for
        ids no other row can hold: minted by the server (a random UUID), or looked up first
        (a batch create's chosen ids); grouped by partition, one request for them all."""
        await write_grouped(
            self._session,
            [Write(s.schedule_id, self.q["import_schedule"], self._row(s)) for s in schedules],
        )

    @staticmethod
    def _row(s: Schedule) -> dict[str, Any]:
        """An insert's values; absent ones unset (a bound null would be a tombstone cell)."""
        return {
            "schedule_id": s.schedule_id,
            "tenant": s.tenant,
            "name": s.name,
            "handler": s.handler,
            "spec": s.spec.to_json(),
            "payload": s.payload,
            "state": s.state.value,
            "version": s.version,
            "generation": s.generation,
            "create_time": _set(s.create_time),
            "update_time": _set(s.update_time),
            "max_runtime_ms": millis(s.max_runtime) if s.max_runtime else UNSET_VALUE,
            "next_fire_time": _set(s.next_fire_time),
            "policies": s.policies.to_json(),
            "after": set(s.after) or UNSET_VALUE,
        }

    async def get(self, schedule_id: str) -> Schedule:
        rows = await aexecute(self._session, self.q["get_schedule"], (schedule_id,))
        row = first(rows)
        # A row without a handler is what a late dispatcher write leaves of a deleted schedule.
        if row is None or row.handler is None:
            raise NotFound(f"schedule {schedule_id!r} not found")
        return Schedule.from_row(row)

    async def get_many(self, ids: Sequence[str]) -> dict[str, Schedule]:
        """The schedules among ``ids`` that exist, in one multi-partition read per 100 ids."""
        out: dict[str, Schedule] = {}
        unique = list(dict.fromkeys(ids))
        pages = await asyncio.gather(
            *(
                aexecute(self._session, self.q["get_schedules"], (unique[start : start + 100],))
                for start in range(0, len(unique), 100)
            )
        )
        for rows in pages:
            for row in rows:
                if row.handler is not None:
                    out[row.schedule_id] = Schedule.from_row(row)
        return out

    async def list(
        self, page_size: int, page_token: str, *, tenant: str | None = None
    ) -> tuple[list[Schedule], str]:
        """One page in token order, and the token of the next page ('' when done). With
        ``tenant``, that tenant's schedules only, found by the ``schedules_by_tenant`` index."""
        if tenant is None:
            stmt = SimpleStatement(
                f"SELECT * FROM {self.q.keyspace}.schedules", fetch_size=page_size
            )
            values: tuple[Any, ...] = ()
        else:
            stmt = SimpleStatement(
                f"SELECT * FROM {self.q.keyspace}.schedules WHERE tenant = %s",
                fetch_size=page_size,
            )
            values = (tenant,)
        paging_state = None
        if page_token:
            try:
                paging_state = base64.urlsafe_b64decode(page_token.encode())
            except (ValueError, TypeError):
                raise InvalidArgument("page_token", "is not a token this API returned") from None
        try:
            rs = await _execute_page(self._session, stmt, paging_state, values)
        except Exception as e:
            if paging_state is not None and "paging state" in str(e).lower():
                raise InvalidArgument("page_token", "is not a token this API returned") from None
            raise
        rows, next_state = rs
        schedules = [Schedule.from_row(r) for r in rows if r.handler is not None]
        token = base64.urlsafe_b64encode(next_state).decode() if next_state else ""
        return schedules, token

    async def announce(self, schedule_ids: Iterable[str]) -> None:
        """Records that these schedules are about to change (``schedule_changes``), before the
        change is written: a dispatcher that sees the record reads them afresh instead of from
        its cache (``scheduler.schedule_cache``), for long enough that the change has landed.
        Raises Unavailable, and the caller makes no change, if the record took longer than
        ``ANNOUNCE_LIMIT``: dispatchers might have looked past it."""
        ids = sorted(set(schedule_ids))
        if not ids:
            return
        now = datetime.now(UTC)
        bucket = minute_bucket(now)
        await write_grouped(
            self._session,
            [Write((bucket,), self.q["announce_change"], (bucket, now, sid)) for sid in ids],
        )
        took = datetime.now(UTC) - now
        if took > self._announce_limit:
            raise Unavailable(
                f"recording the change took {took.total_seconds():.1f} s (Cassandra overloaded); "
                "nothing was changed, try again"
            )

    async def changes(self, since: datetime, until: datetime) -> Sequence[tuple[datetime, str]]:
        """The announced changes recorded between ``since`` and ``until`` (both included),
        as (when, schedule id), one read per minute they span."""
        first_bucket, last_bucket = minute_bucket(since), minute_bucket(until)
        pages = await asyncio.gather(
            *(
                aexecute_all(self._session, self.q["changes_since"], (bucket, since, until))
                for bucket in range(first_bucket, last_bucket + 1)
            )
        )
        return [(aware(r.changed_at), r.schedule_id) for rows in pages for r in rows]

    async def announced(self, schedule_ids: Iterable[str], change: Callable[[], Awaitable[T]]) -> T:
        """Makes ``change`` after announcing it (:meth:`announce`), and announces it again if it
        landed later than dispatchers hold the schedules out of their caches (``HOLD``, less
        the announcements' grace): meanwhile one may have cached the rows as they were, and
        would go on firing from that copy."""
        ids = list(schedule_ids)
        started = datetime.now(UTC)
        await self.announce(ids)
        result = await change()
        took = datetime.now(UTC) - started
        if took > self._announce_again_after:
            logger.warning(
                "a change of %s landed %.0f s after its announcement; announcing it again",
                ", ".join(ids[:5]),
                took.total_seconds(),
            )
            try:
                await self.announce(ids)
            except Unavailable as e:
                # The change is made: refusing the call would tell the client it was not.
                logger.error(
                    "announcing the change of %s again failed (%s): a dispatcher that cached "
                    "them meanwhile fires from its copy until it reads them again",
                    ", ".join(ids[:5]),
                    e,
                )
        return result

    async def change_state(
        self,
        current: Schedule,
        *,
        state: ScheduleState,
        generation: int,
        now: datetime,
        next_fire_time: datetime | None,
        pause_note: str = "",
        paused_by: str = "",
        pause_time: datetime | None = None,
    ) -> bool:
        """Compare-and-set on ``current.version``; False if a concurrent change won."""
        applied, _ = await self.announced(
            [current.schedule_id],
            lambda: execute_conditional(
                self._session,
                self.q["set_state"],
                {
                    "state": state.value,
                    "version": current.version + 1,
                    "generation": generation,
                    "update_time": now,
                    "pause_note": pause_note or None,
                    "paused_by": paused_by or None,
                    "pause_time": pause_time,
                    "next_fire_time": next_fire_time,
                    "schedule_id": current.schedule_id,
                    "expected_version": current.version,
                },
            ),
        )
        return applied

    async def update(self, s: Schedule, *, expected_version: int) -> tuple[bool, int | None]:
        """Replaces the client-set fields of ``s`` (name, handler, spec, payload, max runtime,
        policies, after) with its state, version, generation, update and next fire times: a
        compare-and-set on ``expected_version``. Returns (applied, the stored version when a
        concurrent change won, None if the schedule is gone)."""
        applied, current = await self.announced(
            [s.schedule_id],
            lambda: execute_conditional(
                self._session,
                self.q["update_schedule"],
                {
                    "name": s.name,
                    "handler": s.handler,
                    "spec": s.spec.to_json(),
                    "payload": s.payload,
                    "max_runtime_ms": millis(s.max_runtime) if s.max_runtime else None,
                    "policies": s.policies.to_json(),
                    "after": set(s.after) or None,
                    "state": s.state.value,
                    "version": s.version,
                    "generation": s.generation,
                    "update_time": s.update_time,
                    "next_fire_time": s.next_fire_time,
                    "schedule_id": s.schedule_id,
                    "expected_version": expected_version,
                },
            ),
        )
        version = current.get("version")
        return applied, int(version) if version is not None else None

    async def hold_buffered(self, schedule_id: str, buffered_json: str) -> bool:
        """Holds a run back on the schedule (BUFFER_ONE) unless one is held already."""
        applied, _ = await execute_conditional(
            self._session, self.q["hold_buffered"], (buffered_json, schedule_id)
        )
        return applied

    # Bookkeeping written with a firing or a report, as grouped-write items ---------------------

    def mark_active(self, schedule_id: str, run_id: str, now: datetime) -> Write:
        """The run enqueued last (overlap policies read it); timestamped ``now``, the enqueue."""
        return Write(
            schedule_id,
            self.q["mark_active"],
            {"ts": micros(now), "run_id": run_id, "seen": now, "schedule_id": schedule_id},
        )

    def touch_active(self, schedule_id: str, now: datetime) -> Write:
        """A sign of life of the schedule's run in progress at ``now`` (a heartbeat), or the
        one expected then (its retry's due time: ``Failures.handle``)."""
        return Write(schedule_id, self.q["touch_active"], {"seen": now, "schedule_id": schedule_id})

    def mark_done(self, schedule_id: str, run_id: str, enqueued: datetime) -> Write:
        """The run finished; of two finished runs the later-enqueued one is kept."""
        return Write(
            schedule_id,
            self.q["mark_done"],
            {"ts": micros(enqueued) + 1, "run_id": run_id, "schedule_id": schedule_id},
        )

    def set_buffered(self, schedule_id: str, buffered_json: str) -> Write:
        """Holds a run back (BUFFER_ONE) until the one in progress finishes."""
        return Write(schedule_id, self.q["set_buffered"], (buffered_json, schedule_id))

    def record_completed(self, schedule_id: str, last_slot: datetime) -> Write:
        """A schedule with no next slot is COMPLETED, timestamped with its last slot so an
        operator's later change always wins."""
        return Write(
            schedule_id,
            self.q["record_completed"],
            (micros(last_slot), last_slot, ScheduleState.COMPLETED.value, schedule_id),
        )

    async def quarantine(self, timer: Timer, error: str, now: datetime) -> None:
        """Sets a poison timer aside with its error; the schedule it names (its key) shows the
        error until :meth:`clear_quarantine`."""
        error = error[:MAX_ERROR_CHARS]
        await aexecute(
            self._session,
            self.q["quarantine_timer"],
            {
                "day": day_of(now),
                "quarantine_time": now,
                "timer_id": timer.timer_id,
                "shard": timer.shard,
                "fire_time": timer.fire_time,
                "kind": timer.kind,
                "key": timer.key,
                "data": timer.data,
                "error": error,
            },
        )
        if timer.key:
            await execute_conditional(
                self._session,
                self.q["mark_quarantined"],
                {"error": error, "quarantine_time": now, "schedule_id": timer.key},
            )

    async def clear_quarantine(self, schedule_id: str) -> None:
        """Forgets a quarantined timer's error (the schedule was changed or resumed)."""
        await aexecute(self._session, self.q["clear_quarantine"], {"schedule_id": schedule_id})

    async def delete(self, schedule_id: str) -> None:
        applied, _ = await self.announced(
            [schedule_id],
            lambda: execute_conditional(self._session, self.q["delete_schedule"], (schedule_id,)),
        )
        if not applied:
            raise NotFound(f"schedule {schedule_id!r} not found")


class CassandraRequestStore:
    """Idempotency keys of client requests (``request_id`` on mutating RPCs), kept a day."""

    def __init__(self, session: Session, schedules: CassandraScheduleStore) -> None:
        self._session = session
        self._q = schedules.q

    async def claim(self, key: str, result: str) -> str:
        """Records ``result`` under ``key`` unless the key is known; returns what is recorded
        (``result`` for a first call, the first call's result for a retry). One LWT: this is
        for client calls, never the firing path."""
        applied, current = await execute_conditional(
            self._session, self._q["claim_request"], {"request_key": key, "result": result}
        )
        return result if applied else str(current.get("result") or result)


class CassandraRunStore:
    """Run history, by schedule and day. Hot-path writes go out grouped, never one per call."""

    def __init__(self, session: Session, schedules: CassandraScheduleStore) -> None:
        self.session = session
        self.q = schedules.q
        self._schedules = schedules

    def insert_rows(self, runs: Iterable[Run]) -> list[Write]:
        """Grouped-write items recording each run as enqueued (or skipped), at the run's own
        cell time (``run_cell_time``): re-recording a re-fired slot never hides a worker's
        report (RUNNING, SUCCEEDED) of the same attempt."""
        items: list[Write] = []
        for r in runs:
            day = day_of(r.scheduled_for)
            items.append(
                Write(
                    (r.schedule_id, day),
                    self.q["insert_run"],
                    {
                        "schedule_id": r.schedule_id,
                        "day": day,
                        "scheduled_for": r.scheduled_for,
                        "run_id": r.run_id,
                        "status": r.status.value,
                        "attempt": r.attempt,
                        "handler": r.handler,
                        "tenant": r.tenant,
                        "manual": r.manual,
                        "enqueue_time": _set(r.enqueue_time),
                        "skip_reason": r.skip_reason or UNSET_VALUE,
                        "error": r.error or UNSET_VALUE,
                        "origin_run_id": r.origin_run_id or UNSET_VALUE,
                        "backfill_id": r.backfill_id or UNSET_VALUE,
                        # A retry's row no longer waits for it.
                        "next_attempt_time": None if r.attempt > 1 else UNSET_VALUE,
                        "deferred_ms": _set(millis(r.deferred) if r.deferred else None),
                        "ts": run_cell_time(r.scheduled_for, r.attempt, _ENQUEUED_RANK),
                    },
                )
            )
        return items

    async def write(self, items: Sequence[Write]) -> None:
        """Writes grouped-write items (see ``write_grouped``)."""
        await write_grouped(self.session, items)

    def cancel_rows(self, run_ids: Iterable[str]) -> list[Write]:
        """Grouped-write items asking workers to cancel these runs (seen at their heartbeat)."""
        items: list[Write] = []
        for run_id in run_ids:
            ref = parse_run_id(run_id)
            day = day_of(ref.scheduled_for)
            items.append(
                Write(
                    (ref.schedule_id, day),
                    self.q["request_cancel"],
                    (ref.schedule_id, day, ref.scheduled_for, run_id),
                )
            )
        return items

    def retry_at_row(self, run_id: str, failed_attempt: int, at: datetime) -> Write:
        """A grouped-write item: the retry after ``failed_attempt`` is due ``at``. Written at
        that attempt's outcome rank, whatever the writer: of two such writes the later time
        wins the tie (a retry a quota put off moves it later), and the retry's own start
        clears it (``run_retry_taken``, a rank above)."""
        ref = parse_run_id(run_id)
        day = day_of(ref.scheduled_for)
        ts = run_cell_time(ref.scheduled_for, failed_attempt, _OUTCOME_RANK)
        where = (ref.schedule_id, day, ref.scheduled_for, run_id)
        return Write((ref.schedule_id, day), self.q["run_retry_at"], (ts, at, *where))

    def dead_letter_row(self, e: RunEventRecord) -> Write:
        """A grouped-write item marking the run DEAD_LETTERED after its last attempt ``e``."""
        day = day_of(e.scheduled_for)
        ts = run_cell_time(e.scheduled_for, e.attempt, _DEAD_LETTER_RANK)
        where = (e.schedule_id, day, e.scheduled_for, e.run_id)
        return Write(
            (e.schedule_id, day),
            self.q["run_dead_lettered"],
            (ts, RunStatus.DEAD_LETTERED.value, *where),
        )

    def attempt_rows(self, failed: Iterable[RunEventRecord]) -> list[Write]:
        """Grouped-write items recording failed attempts (the history a dead letter carries)."""
        return [
            Write(
                (e.run_id,),
                self.q["insert_attempt"],
                {
                    "run_id": e.run_id,
                    "attempt": e.attempt,
                    "status": e.status.value if e.status else None,
                    "error": e.error[:MAX_ERROR_CHARS],
                    "start_time": e.start_time,
                    "finish_time": e.event_time,
                    "worker_id": e.worker_id,
                },
            )
            for e in failed
        ]

    async def attempts(self, run_id: str) -> list[Attempt]:
        """The recorded failed attempts of a run, oldest first."""
        rows = await aexecute(self.session, self.q["list_attempts"], (run_id,))
        return sorted((Attempt.from_row(r) for r in rows), key=lambda a: a.attempt)

    async def get_many(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The runs among ``run_ids`` that exist (one read each, concurrently). For the few runs
        whose lease came due unsettled or whose retry is due, never for every firing."""

        async def one(run_id: str) -> Run | None:
            try:
                return await self.get(run_id)
            except NotFound:
                return None

        found = await asyncio.gather(*(one(r) for r in dict.fromkeys(run_ids)))
        return {r.run_id: r for r in found if r is not None}

    async def record_events(
        self,
        events: Sequence[RunEventRecord],
        *,
        now: datetime,
        also: Sequence[Write] = (),
    ) -> None:
        """Applies worker reports, and ``also``, in one grouped write (see ``event_rows``)."""
        await write_grouped(self.session, [*self.event_rows(events, now=now), *also])

    def event_rows(
        self, events: Sequence[RunEventRecord], *, now: datetime, retried: Collection[str] = ()
    ) -> list[Write]:
        """Applies worker reports, grouped by partition: each run row at its cell time, and the
        schedule's overlap cells (a heartbeat is a sign of life, an outcome ends the run,
        unless the run is among ``retried``: a failed attempt whose retry follows leaves its
        run in progress).

        No write here is ordered by a worker's clock. Backfill runs stay out of the overlap
        cells, so they never hold up the schedule's own slots. A retry's start or outcome also
        clears the retry time its earlier attempt left (``run_retry_taken``), whether or not
        the retry's own ENQUEUED row landed.
        """
        items: list[Write] = []
        for e in events:
            day = day_of(e.scheduled_for)
            where = (e.schedule_id, day, e.scheduled_for, e.run_id)
            tracked = not is_backfill_run(e.run_id)
            if e.status is not None and e.attempt > 1:
                items.append(
                    Write(
                        (e.schedule_id, day),
                        self.q["run_retry_taken"],
                        (run_cell_time(e.scheduled_for, e.attempt, _RUNNING_RANK), *where),
                    )
                )
            if e.status is None:
                items.append(
                    Write((e.schedule_id, day), self.q["run_heartbeat"], (e.event_time, *where))
                )
                if tracked:
                    items.append(self._schedules.touch_active(e.schedule_id, now))
            elif e.status is RunStatus.RUNNING:
                items.append(
                    Write(
                        (e.schedule_id, day),
                        self.q["run_started"],
                        {
                            "ts": run_cell_time(e.scheduled_for, e.attempt, _RUNNING_RANK),
                            "status": e.status.value,
                            "start_time": e.event_time,
                            "heartbeat_time": e.event_time,
                            "worker_id": e.worker_id,
                            "attempt": e.attempt,
                            **_run_key(*where),
                        },
                    )
                )
            else:
                ts = run_cell_time(e.scheduled_for, e.attempt, _OUTCOME_RANK)
                # No error: a first attempt has no earlier error to clear, so nothing is
                # written (a null would be a tombstone in every successful run's row); a later
                # attempt clears its predecessor's.
                error = e.error[:MAX_ERROR_CHARS] or (None if e.attempt > 1 else UNSET_VALUE)
                if e.start_time is not None:
                    items.append(
                        Write(
                            (e.schedule_id, day),
                            self.q["run_ran"],
                            {
                                "ts": ts,
                                "status": e.status.value,
                                "start_time": e.start_time,
                                "finish_time": e.event_time,
                                "error": error,
                                "worker_id": e.worker_id,
                                "attempt": e.attempt,
                                **_run_key(*where),
                            },
                        )
                    )
                else:
                    items.append(
                        Write(
                            (e.schedule_id, day),
                            self.q["run_finished"],
                            {
                                "ts": ts,
                                "status": e.status.value,
                                "finish_time": e.event_time,
                                "error": error,
                                "worker_id": e.worker_id,
                                **_run_key(*where),
                            },
                        )
                    )
                # A run whose message names its schedule's next fire timer was marked in
                # progress on that timer, not on the schedule row: its end is noted there, or,
                # that timer too close to due, found from its run row when the timer fires.
                if tracked and e.next_fire_time is None and e.run_id not in retried:
                    items.append(
                        self._schedules.mark_done(
                            e.schedule_id, e.run_id, e.enqueue_time or e.scheduled_for
                        )
                    )
        return items

    async def delivered(self, attempts: Mapping[str, int]) -> set[str]:
        """Which of the runs a worker has taken *at* the given attempt or a later one (RUNNING,
        or an outcome recorded): their messages reached Kafka. A retry's run shows its earlier
        attempt's outcome, which does not mean the retry was taken. For the few timers a new
        shard owner may be firing a second time, never for every firing."""
        return await self._runs_where(
            "get_run_status",
            list(attempts),
            lambda row: (
                row.status not in (None, *_NOT_TAKEN) and (row.attempt or 1) >= attempts[row.run_id]
            ),
        )

    async def finished(self, attempts: Mapping[str, int]) -> set[str]:
        """Which of the runs are done with the given attempt: a later attempt exists, or this
        one's outcome is recorded together with what follows it (a failure: its retry or its
        dead letter). Asked by a worker before it runs a message that may have run already (a
        redelivery after its partition's previous consumer died uncommitted), never for every
        run. A failure recorded without its retry (the API died in between) is not done: run
        again, its report writes the retry."""

        def done(row: Any) -> bool:
            attempt, asked = row.attempt or 1, attempts[row.run_id]
            if attempt != asked:
                return attempt > asked
            if row.status in _FAILURES:
                return row.next_attempt_time is not None
            return row.status in _FINISHED

        return await self._runs_where("get_run_outcome", list(attempts), done)

    async def ended(
        self, run_ids: Sequence[str], *, now: datetime, stale_after: timedelta
    ) -> set[str]:
        """Which of the runs have ended (their latest attempt has an outcome and no retry is
        pending, ``retry_pending``; or they were skipped): for the few runs a schedule row
        still shows in progress whose end was noted elsewhere (a fire timer's ``done_run``),
        never for every firing."""
        return await self._runs_where(
            "get_run_outcome",
            list(run_ids),
            lambda row: row.status in _ENDED and not retry_pending(row, now, stale_after),
        )

    async def still_running(
        self, run_ids: Sequence[str], *, now: datetime, stale_after: timedelta
    ) -> set[str]:
        """Which of the runs are still in progress (``run_alive``): one read each, for the
        runs a fire timer carries as its schedule's runs in progress (``FireTimer.running``)
        when the dispatcher cannot decide the slot from its cache, never for every firing."""

        rows = await self._rows("get_run_life", run_ids)
        return {
            r
            for r, row in rows.items()
            if run_alive(row, parse_run_id(r).scheduled_for, now, stale_after)
        }

    async def running_of(
        self, schedule_id: str, *, now: datetime, stale_after: timedelta
    ) -> list[str]:
        """The schedule's runs in progress by its run rows (``run_alive``; backfill runs
        left out), newest slot first: today's and yesterday's rows, at most
        ``RUNS_LOOKED_AT`` of each. For TriggerSchedule, CancelSchedule, resume and update
        (the run of a slot is marked in progress on its schedule's next fire timer, which
        these calls do not read), never for a firing."""
        found: list[str] = []
        for day in (day_of(now), day_of(now) - 1):
            rows = await aexecute_all(
                self.session, self.q["runs_life_day"], (schedule_id, day, RUNS_LOOKED_AT)
            )
            for row in rows:
                if row.backfill_id:
                    continue
                ref = parse_run_id(row.run_id)
                if run_alive(row, ref.scheduled_for, now, stale_after):
                    found.append(row.run_id)
        return found

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        """Which of ``run_ids`` an operator or a CANCEL_PREVIOUS slot asked to cancel."""
        return await self._runs_where(
            "get_cancel_requested", run_ids, lambda row: bool(row.cancel_requested)
        )

    async def _runs_where(
        self, query: str, run_ids: Sequence[str], holds: Callable[[Any], bool]
    ) -> set[str]:
        """The run ids whose row, read with ``query`` (one read each, concurrently), exists
        and satisfies ``holds``."""

        rows = await self._rows(query, run_ids)
        return {r for r, row in rows.items() if row is not None and holds(row)}

    async def _rows(self, query: str, run_ids: Sequence[str]) -> dict[str, Any | None]:
        """Each run's row read with ``query`` (one read each, concurrently); None if absent."""

        async def one(run_id: str) -> Any | None:
            ref = parse_run_id(run_id)
            rows = await aexecute(
                self.session,
                self.q[query],
                (ref.schedule_id, day_of(ref.scheduled_for), ref.scheduled_for, run_id),
            )
            return first(rows)

        ids = list(dict.fromkeys(run_ids))
        return dict(zip(ids, await asyncio.gather(*(one(r) for r in ids)), strict=True))

    async def clear_buffered(self, schedule_id: str, buffered_json: str) -> bool:
        """Takes the held-back run off the schedule, once (concurrent API replicas race)."""
        applied, _ = await execute_conditional(
            self.session, self.q["clear_buffered"], (schedule_id, buffered_json)
        )
        return applied

    async def get(self, run_id: str) -> Run:
        ref = parse_run_id(run_id)
        rows = await aexecute(
            self.session,
            self.q["get_run"],
            (ref.schedule_id, day_of(ref.scheduled_for), ref.scheduled_for, run_id),
        )
        row = first(rows)
        if row is None:
            raise NotFound(f"run {run_id!r} not found")
        return Run.from_row(row)

    async def list(
        self, schedule_id: str, page_size: int, page_token: str, *, now: datetime | None = None
    ) -> tuple[list[Run], str]:
        """Runs newest slot first, walking day partitions back through the retention window."""
        now = now or datetime.now(UTC)
        newest_day = day_of(now + timedelta(days=1))
        oldest_day = day_of(now) - RUN_RETENTION_DAYS
        day, after = newest_day, None
        if page_token:
            day, after = _decode_run_token(page_token)
        out: list[Run] = []
        while day >= oldest_day and len(out) < page_size:
            want = page_size - len(out)
            if after is None:
                rows = await aexecute(
                    self.session, self.q["list_runs_day"], (schedule_id, day, want)
                )
            else:
                rows = await aexecute(
                    self.session,
                    self.q["list_runs_day_before"],
                    (schedule_id, day, after[0], after[1], want),
                )
            batch = [Run.from_row(r) for r in rows]
            out.extend(batch)
            if len(batch) < want:
                day, after = day - 1, None
            else:
                after = (batch[-1].scheduled_for, batch[-1].run_id)
        if len(out) < page_size or day < oldest_day:
            return out, ""
        last = out[-1]
        return out, _encode_run_token(day_of(last.scheduled_for), last.scheduled_for, last.run_id)


def _encode_run_token(day: int, scheduled_for: datetime, run_id: str) -> str:
    raw = f"{day}|{micros(scheduled_for)}|{run_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_run_token(token: str) -> tuple[int, tuple[datetime, str]]:
    try:
        day_s, us_s, run_id = base64.urlsafe_b64decode(token.encode()).decode().split("|", 2)
        t = datetime.fromtimestamp(int(us_s) / 1_000_000, tz=UTC)
        return int(day_s), (t, run_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token", "is not a token this API returned") from None


async def _execute_page(
    session: Session,
    stmt: SimpleStatement,
    paging_state: bytes | None,
    values: tuple[Any, ...] = (),
) -> tuple[list[Any], bytes | None]:
    """One page of a paged query and the paging state of the next one (not a hot path)."""
    rs = await asyncio.to_thread(session.execute, stmt, values or None, paging_state=paging_state)
    return list(rs.current_rows), rs.paging_state
