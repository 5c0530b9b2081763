"""Dead letters: runs whose last attempt failed (scheduler.retries puts them here).

Each is a row of ``dead_letters`` (by schedule; the payload and every failed attempt's error
and times), indexed by UTC day in ``dead_letters_by_day`` for the overall list, and a message
on the dead-letter topic (``cronscale.v1.DeadLetter``, keyed by run id) for whatever consumes
failures downstream. Re-driving starts a new attempt series under a fresh run id linked to the
original (``scheduler.service.ScheduleService.redrive``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bucketer.cql import Queries, Write, aexecute, execute_conditional, first
from bucketer.model import from_micros, micros
from cronscale.v1 import dead_letter_service_pb2 as dl_pb2
from cronscale.v1 import schedule_pb2
from scheduler.errors import InvalidArgument, NotFound
from scheduler.model import RunStatus, aware, day_of, parse_run_id

# As long as run history.
RETENTION_DAYS = 30


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One failed attempt of a run."""

    attempt: int
    status: RunStatus
    error: str
    start_time: datetime | None
    finish_time: datetime | None
    worker_id: str

    @classmethod
    def from_row(cls, row: Any) -> Attempt:
        return cls(
            attempt=row.attempt,
            status=RunStatus(row.status or RunStatus.FAILED.value),
            error=row.error or "",
            start_time=aware(row.start_time),
            finish_time=aware(row.finish_time),
            worker_id=row.worker_id or "",
        )


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    run_id: str
    schedule_id: str
    tenant: str
    handler: str
    payload: bytes
    scheduled_for: datetime
    dead_letter_time: datetime
    attempts: int
    error: str
    origin_run_id: str = ""
    history: tuple[Attempt, ...] = field(default=())
    redrive_run_id: str = ""
    redrive_time: datetime | None = None

    @classmethod
    def from_row(cls, row: Any, history: Sequence[Attempt] = ()) -> DeadLetter:
        return cls(
            run_id=row.run_id,
            schedule_id=row.schedule_id,
            tenant=row.tenant or "",
            handler=row.handler or "",
            payload=bytes(row.payload or b""),
            scheduled_for=aware(row.scheduled_for) or datetime.min.replace(tzinfo=UTC),
            dead_letter_time=aware(row.dead_letter_time) or datetime.min.replace(tzinfo=UTC),
            attempts=row.attempts or 0,
            error=row.error or "",
            origin_run_id=row.origin_run_id or "",
            history=tuple(history),
            redrive_run_id=row.redrive_run_id or "",
            redrive_time=aware(row.redrive_time),
        )

    def to_proto(self) -> dl_pb2.DeadLetter:
        out = dl_pb2.DeadLetter(
            run_id=self.run_id,
            schedule_id=self.schedule_id,
            tenant=self.tenant,
            handler=self.handler,
            payload=self.payload,
            attempts=self.attempts,
            error=self.error,
            redrive_run_id=self.redrive_run_id,
            origin_run_id=self.origin_run_id,
        )
        out.scheduled_for.FromDatetime(self.scheduled_for)
        out.dead_letter_time.FromDatetime(self.dead_letter_time)
        if self.redrive_time is not None:
            out.redrive_time.FromDatetime(self.redrive_time)
        for a in self.history:
            h = out.history.add(
                attempt=a.attempt,
                status=(
                    schedule_pb2.RUN_STATUS_TIMED_OUT
                    if a.status is RunStatus.TIMED_OUT
                    else schedule_pb2.RUN_STATUS_FAILED
                ),
                error=a.error,
                worker_id=a.worker_id,
            )
            if a.start_time is not None:
                h.start_time.FromDatetime(a.start_time)
            if a.finish_time is not None:
                h.finish_time.FromDatetime(a.finish_time)
        return out


class CassandraDeadLetterStore:
    """The ``dead_letters`` tables and the failed-attempt history behind them."""

    def __init__(self, session: Session, *, keyspace: str) -> None:
        self._session = session
        self._q = Queries(session, Path(__file__).with_name("dead_letters.cql"), keyspace=keyspace)

    def rows(self, d: DeadLetter) -> list[Write]:
        """Grouped-write items storing ``d`` (idempotent: a repeat overwrites the same rows)."""
        return [
            Write(
                (d.schedule_id,),
                self._q["insert_dead_letter"],
                (
                    d.schedule_id,
                    d.run_id,
                    d.tenant,
                    d.handler,
                    d.payload,
                    d.scheduled_for,
                    d.dead_letter_time,
                    d.attempts,
                    d.error,
                    d.origin_run_id or None,
                ),
            ),
            Write(
                (day_of(d.dead_letter_time),),
                self._q["index_dead_letter"],
                (
                    day_of(d.dead_letter_time),
                    d.dead_letter_time,
                    d.run_id,
                    d.schedule_id,
                    d.tenant,
                ),
            ),
        ]

    async def get(self, run_id: str, history: Sequence[Attempt] = ()) -> DeadLetter:
        """The dead letter of ``run_id``; NotFound if the run is not dead-lettered."""
        schedule_id = parse_run_id(run_id).schedule_id
        row = first(
            await aexecute(self._session, self._q["get_dead_letter"], (schedule_id, run_id))
        )
        if row is None:
            raise NotFound(f"run {run_id!r} is not dead-lettered")
        return DeadLetter.from_row(row, history)

    async def of_schedule(self, schedule_id: str) -> list[DeadLetter]:
        """Every dead letter of one schedule, newest first."""
        rows = await aexecute(self._session, self._q["list_schedule_dead_letters"], (schedule_id,))
        out = [DeadLetter.from_row(r) for r in rows]
        return sorted(out, key=lambda d: (d.dead_letter_time, d.run_id), reverse=True)

    async def list_page(
        self, *, schedule_id: str, page_size: int, page_token: str, now: datetime
    ) -> tuple[list[DeadLetter], str]:
        """A page of dead letters, newest first: one schedule's, or every schedule's (walking
        the day index back through the retention window)."""
        if schedule_id:
            every = await self.of_schedule(schedule_id)
            start = _decode_offset(page_token)
            page = every[start : start + page_size]
            more = start + page_size < len(every)
            return page, _encode_offset(start + page_size) if more else ""
        day, after = day_of(now), None
        if page_token:
            day, after = _decode_day_token(page_token)
        oldest = day_of(now) - RETENTION_DAYS
        refs: list[tuple[datetime, str, str]] = []
        while day >= oldest and len(refs) < page_size:
            want = page_size - len(refs)
            if after is None:
                rows = await aexecute(self._session, self._q["list_day"], (day, want))
            else:
                rows = await aexecute(
                    self._session, self._q["list_day_before"], (day, after[0], after[1], want)
                )
            got = [(aware(r.dead_letter_time) or now, r.run_id, r.schedule_id) for r in rows]
            refs.extend(got)
            if len(got) < want:
                day, after = day - 1, None
            else:
                after = (got[-1][0], got[-1][1])
        out: list[DeadLetter] = []
        for _t, run_id, schedule_id_ in refs:
            row = first(
                await aexecute(self._session, self._q["get_dead_letter"], (schedule_id_, run_id))
            )
            if row is not None:
                out.append(DeadLetter.from_row(row))
        if len(refs) < page_size or day < oldest:
            return out, ""
        t, run_id, _s = refs[-1]
        return out, _encode_day_token(day_of(t), t, run_id)

    async def mark_redriven(self, d: DeadLetter, redrive_run_id: str, now: datetime) -> bool:
        """Records the re-drive, once; False if another re-drive came first."""
        applied, _ = await execute_conditional(
            self._session,
            self._q["mark_redriven"],
            (redrive_run_id, now, d.schedule_id, d.run_id),
        )
        return applied


def _encode_offset(n: int) -> str:
    return base64.urlsafe_b64encode(f"o|{n}".encode()).decode()


def _decode_offset(token: str) -> int:
    if not token:
        return 0
    try:
        kind, n = base64.urlsafe_b64decode(token.encode()).decode().split("|", 1)
        if kind != "o":
            raise ValueError(kind)
        return max(0, int(n))
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token", "is not a token this API returned") from None


def _encode_day_token(day: int, t: datetime, run_id: str) -> str:
    return base64.urlsafe_b64encode(f"d|{day}|{micros(t)}|{run_id}".encode()).decode()


def _decode_day_token(token: str) -> tuple[int, tuple[datetime, str]]:
    try:
        kind, day, us, run_id = base64.urlsafe_b64decode(token.encode()).decode().split("|", 3)
        if kind != "d":
            raise ValueError(kind)
        return int(day), (from_micros(int(us)), run_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token", "is not a token this API returned") from None
