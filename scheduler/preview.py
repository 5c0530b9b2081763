"""PreviewSchedule: the next fire times of a stored schedule or of a spec to try.

What preview says is what fires: the times come from ``scheduler.slots.next_slot``, the very
function the dispatcher advances a schedule with (start/end bounds, DST rules, jitter).

- A fire time is the slot plus the schedule's jitter offset; preview lists fire times strictly
  after ``after``, so a slot at or just before ``after`` whose jittered time is still ahead is
  listed (it has not fired yet).
- A stored ACTIVE schedule's timer chain began when it was created, resumed or updated
  (``update_time``): slots at or before that moment never fire on their own (create and resume
  put the first timer for the first slot after that moment), so they are not listed. With an
  ``after`` before that moment, preview shows the spec's times (the run history shows what
  actually happened then).
- A PAUSED schedule is previewed as if resumed at ``after``: the times it fires from then on.
  Slots missed while paused are the misfire policy's business (ResumeSchedule), not preview's.
- A COMPLETED or CANCELLED schedule, and a dependency-only one, has no fire times.
- ``max_runs``: a stored schedule's list stops after the runs it has left at ``after`` (its
  run history up to ``after``, plus the slots due between now and a future ``after``); a dry
  run counts from ``after`` as if created then.
- A dry run (a spec, no schedule id) has no jitter offset: the offset derives from the id.
  Its jitter window is still validated.
- Fire times stop before ``validation.LAST_INSTANT`` (2200-01-01), the last instant a spec may
  name: fewer than ``count`` come back for a spec that fires rarely (``0 0 29 2 *``). The
  search runs off the event loop, so a long one does not hold up other calls.
- ``skipped`` lists wall times in the previewed span a DST gap dropped (gap policy SKIP), at
  the instant the dispatcher records their SKIPPED run; they are never in ``fire_times``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from scheduler.errors import InvalidArgument
from scheduler.model import RunStatus, Schedule, ScheduleSpec, ScheduleState, SpecKind
from scheduler.service import ScheduleService
from scheduler.slots import Slot, dst_skips, next_slot
from scheduler.timespec import CronSpec, load_zone
from scheduler.validation import LAST_INSTANT, validate_spec

DEFAULT_COUNT = 10
MAX_COUNT = 1000
_TINY = timedelta(microseconds=1)


@dataclass(frozen=True, kw_only=True)
class PreviewEntry:
    """One fire time (or one DST-skipped wall time)."""

    utc: datetime
    # ISO-8601 on the schedule's wall clock with its UTC offset (a skipped wall time, which
    # never existed, has none).
    local: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Preview:
    """What PreviewSchedule answers."""

    fire_times: list[PreviewEntry]
    skipped: list[PreviewEntry]
    timezone: str


def preview_count(value: int) -> int:
    """The request's ``count``: 0 means the default; negative or above the maximum is refused."""
    if value < 0:
        raise InvalidArgument("count", f"must not be negative, got {value}")
    if value > MAX_COUNT:
        raise InvalidArgument("count", f"must be at most {MAX_COUNT}, got {value}")
    return value or DEFAULT_COUNT


def format_local(t: datetime) -> str:
    """ISO-8601 with the offset; milliseconds only when the instant has them (jitter)."""
    return t.isoformat(timespec="milliseconds" if t.microsecond else "seconds")


def preview(
    s: Schedule,
    after: datetime,
    count: int,
    *,
    chain_start: datetime | None = None,
    fired: int = 0,
) -> Preview:
    """Up to ``count`` fire times of ``s`` strictly after ``after``, and the DST-skipped wall
    times among them.

    ``chain_start``: slots at or before it are left out (the schedule's first timer was put
    for the first slot after it); ``fired``: runs already counted against ``max_runs``.
    """
    spec = s.spec
    zone = load_zone(spec.timezone or "UTC")
    empty = Preview(fire_times=[], skipped=[], timezone=spec.timezone)
    if spec.kind is SpecKind.NONE:
        return empty
    limit = count
    if spec.max_runs:
        limit = min(limit, max(0, spec.max_runs - fired))
    # A slot fires at slot + offset, so it is after `after` exactly when slot > after - offset.
    cursor = after - s.slot_offset
    if chain_start is not None:
        cursor = max(cursor, chain_start)
    slots: list[Slot] = []
    while len(slots) < limit:
        nxt = next_slot(s, cursor)
        # Past the last instant the system names (validation.LAST_INSTANT) nothing is
        # listed: it bounds the search for rare specs (`0 0 29 2 *` x 1000 would reach the
        # year 6148 after ~17 s of cron arithmetic).
        if nxt is None or nxt.slot >= LAST_INSTANT:
            break
        slots.append(nxt)
        cursor = nxt.slot
    fire_times = [
        PreviewEntry(utc=x.at, local=format_local(x.at.astimezone(zone)), note=x.note)
        for x in slots
    ]
    skipped: list[PreviewEntry] = []
    if slots:
        low = after
        if spec.start_time is not None:
            low = max(low, spec.start_time - _TINY)
        skipped = _dst_skipped(s, low, slots[-1].slot)
    return Preview(fire_times=fire_times, skipped=skipped, timezone=spec.timezone)


def _dst_skipped(s: Schedule, after: datetime, until: datetime) -> list[PreviewEntry]:
    """Wall times in ``(after, until]`` a DST gap dropped: where the dispatcher records them
    (``dst_skips``), with the wall time that never happened."""
    ts = s.spec.timespec
    if not isinstance(ts, CronSpec) or until <= after:
        return []
    walls = ts.skipped_between(after, until)
    records = dst_skips(s, after, until)
    # Both walk the same gaps in the same order; dst_skips adds the recorded instant.
    assert len(walls) == len(records)
    return [
        PreviewEntry(utc=rec.scheduled_for, local=wall.isoformat(), note=note)
        for (wall, note), rec in zip(walls, records, strict=True)
    ]


def dry_run_schedule(spec: ScheduleSpec) -> Schedule:
    """A schedule around a spec to try: validated (errors name ``spec...``), no id, so no
    jitter offset (the window is validated, then set aside)."""
    validate_spec(spec, field="spec")
    return Schedule(schedule_id="", handler="", spec=replace(spec, jitter=timedelta(0)))


def _chain_start(s: Schedule, after: datetime) -> datetime | None:
    """Where an ACTIVE stored schedule's current timer chain began (its last create, resume or
    update): slots at or before it never fire. None when ``after`` is before it: a preview of
    the past shows the spec's times (the run history shows what happened)."""
    t = s.update_time or s.create_time
    # Cassandra keeps milliseconds; the service computed the first slot from the exact instant
    # within that millisecond, so the whole millisecond is taken as before the chain.
    if t is None or after < t:
        return None
    return t + timedelta(microseconds=999) if t.microsecond % 1000 == 0 else t


async def _fired_through(svc: ScheduleService, s: Schedule, until: datetime) -> int:
    """Scheduled runs of ``s`` for slots up to ``until``, from its run history: those count
    against ``max_runs`` before the previewed span (later ones are in it)."""
    count, token = 0, ""
    while True:
        runs, token = await svc.runs.list(s.schedule_id, 1000, token)
        count += sum(
            1
            for r in runs
            if r.scheduled_for <= until
            and r.status is not RunStatus.SKIPPED
            and not (r.manual or r.backfill_id or r.origin_run_id)
        )
        if not token:
            return count


async def preview_stored(
    svc: ScheduleService, schedule_id: str, after: datetime | None, count: int
) -> Preview:
    """The preview of a stored schedule (NotFound if there is none)."""
    s = await svc.schedules.get(schedule_id)
    now = svc.now()
    start = after or now
    if s.state in (ScheduleState.COMPLETED, ScheduleState.CANCELLED):
        return Preview(fire_times=[], skipped=[], timezone=s.spec.timezone)
    # PAUSED: as if resumed at `after`, whose first timer is the first slot after it.
    chain = _chain_start(s, start) if s.state is ScheduleState.ACTIVE else start
    fired = 0
    if s.spec.max_runs:
        fired = await _fired_through(svc, s, min(start, now))
        if start > now and s.state is ScheduleState.ACTIVE:
            # Slots between now and `after` will fire first and use up runs.
            ahead = await asyncio.to_thread(
                preview, s, now, s.spec.max_runs, chain_start=_chain_start(s, now), fired=fired
            )
            fired += sum(1 for e in ahead.fire_times if e.utc <= start)
    return await asyncio.to_thread(preview, s, start, count, chain_start=chain, fired=fired)
