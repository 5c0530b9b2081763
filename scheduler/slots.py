"""Slot arithmetic shared by the dispatcher, the API and preview: pure functions, no I/O.

What preview shows is what fires: both call ``next_slot``, which applies the spec's start and
end bounds and the schedule's jitter to the time spec's next fire time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from scheduler.model import MisfireMode, Schedule, SchedulePolicies, SkipReason, run_id_for
from scheduler.timespec import CronSpec, FireTime

_TINY = timedelta(microseconds=1)
# At most this many missed slots are enumerated one by one after an outage; beyond it the
# misfire is recorded as one SKIPPED run that says how many slots it stands for.
MAX_ENUMERATED_MISSES = 1000


@dataclass(frozen=True, kw_only=True)
class Slot:
    """A fire time of a schedule: ``slot`` is the spec's instant, ``at`` adds the jitter."""

    slot: datetime
    at: datetime
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A slot that will not run, and why."""

    run_id: str
    scheduled_for: datetime
    reason: str


def next_slot(s: Schedule, after: datetime) -> Slot | None:
    """The schedule's first slot strictly after ``after`` inside its start/end bounds."""
    spec = s.spec
    if spec.start_time is not None and after < spec.start_time:
        after = spec.start_time - _TINY
    nxt: FireTime | None = spec.timespec.next_after(after)
    if nxt is None or (spec.end_time is not None and nxt.utc > spec.end_time):
        return None
    return Slot(slot=nxt.utc, at=nxt.utc + s.slot_offset, note=nxt.note)


def slots_between(s: Schedule, after: datetime, until: datetime, limit: int) -> list[Slot]:
    """Slots in ``(after, until]``, at most ``limit`` (by slot time, jitter aside)."""
    out: list[Slot] = []
    cursor = after
    while len(out) < limit:
        nxt = next_slot(s, cursor)
        if nxt is None or nxt.slot > until:
            break
        out.append(nxt)
        cursor = nxt.slot
    return out


def dst_skips(s: Schedule, after: datetime, until: datetime) -> list[Skipped]:
    """Wall times in ``(after, until]`` a DST gap dropped (gap policy SKIP), as SKIPPED runs.

    A dropped wall time has no instant of its own: it is recorded at the end of its gap, with a
    run id suffix naming the wall time so that several never collide with each other or with a
    real slot.
    """
    spec = s.spec.timespec
    if not isinstance(spec, CronSpec):
        return []
    out = []
    for wall, _note in spec.skipped_between(after, until):
        instant = _gap_end(spec, wall)
        out.append(
            Skipped(
                run_id=run_id_for(s.schedule_id, instant, suffix=f"dst-{wall:%H%M%S}"),
                scheduled_for=instant,
                reason=SkipReason.DST.value,
            )
        )
    return out


def _gap_end(spec: CronSpec, wall: datetime) -> datetime:
    """The UTC instant at which the local clock jumped over the naive ``wall`` time."""
    # fold=1 maps a nonexistent wall time with the offset from before the gap, which lands
    # after the transition; walk back to the transition instant to the second.
    guess = wall.replace(tzinfo=spec.zone, fold=0).astimezone(UTC)
    after = wall.replace(tzinfo=spec.zone, fold=1).astimezone(UTC)
    lo, hi = min(guess, after), max(guess, after)
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(spec.zone).replace(tzinfo=None) >= wall:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


@dataclass(frozen=True, kw_only=True)
class MisfirePlan:
    fire: list[Slot]
    skip: list[Slot]


def plan_misfire(
    policies: SchedulePolicies,
    missed: list[Slot],
    now: datetime,
    mode: MisfireMode | None = None,
) -> MisfirePlan:
    """Which of the ``missed`` slots (oldest first) run and which are SKIPPED (misfire).

    SKIP runs none; FIRE_ONCE runs the latest, standing for all of them; FIRE_ALL runs those
    inside the catch-up window, at most ``max_catch_up`` (the newest), oldest first.
    """
    mode = mode or policies.misfire
    if not missed:
        return MisfirePlan(fire=[], skip=[])
    if mode is MisfireMode.SKIP:
        return MisfirePlan(fire=[], skip=list(missed))
    if mode is MisfireMode.FIRE_ONCE:
        return MisfirePlan(fire=[missed[-1]], skip=list(missed[:-1]))
    window_start = now - policies.catch_up_window
    inside = [m for m in missed if m.at >= window_start]
    fire = inside[-policies.max_catch_up :] if policies.max_catch_up > 0 else []
    chosen = {m.slot for m in fire}
    return MisfirePlan(fire=fire, skip=[m for m in missed if m.slot not in chosen])
