"""Validation of a schedule as a whole, shared by CreateSchedule and UpdateSchedule.

Everything here raises ``InvalidArgument`` with the request's field path (``schedule.spec...``)
before anything is written.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from scheduler.errors import InvalidArgument
from scheduler.model import (
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    validate_handler,
    validate_payload,
)
from scheduler.timespec import CronSpec

# Time-spec errors name bare fields; these are their paths in the request.
_SPEC_FIELDS = {
    "cron": "schedule.spec.cron.expression",
    "timezone": "schedule.spec.cron.timezone",
    "interval": "schedule.spec.interval.every",
    "anchor": "schedule.spec.interval.anchor",
    "at": "schedule.spec.once.at",
}


def spec_error(
    e: InvalidArgument, kind: SpecKind, prefix: str = "schedule.spec"
) -> InvalidArgument:
    """A time-spec error re-addressed to the request field it came from (under ``prefix``:
    ``schedule.spec`` in a schedule, ``spec`` in a dry-run preview)."""
    field = _SPEC_FIELDS.get(e.field, e.field)
    if e.field == "timezone" and kind is not SpecKind.CRON:
        field = f"schedule.spec.{kind.value}.timezone"
    if prefix != "schedule.spec" and field.startswith("schedule.spec"):
        field = prefix + field.removeprefix("schedule.spec")
    return InvalidArgument(field, e.problem)


def _fmt(d: timedelta) -> str:
    """A duration as the API's users write it: ``1d2h``, ``1m30s``, ``1.5s``, ``-2s``."""
    if d < timedelta(0):
        return "-" + _fmt(-d)
    ms = d // timedelta(milliseconds=1)
    days, ms = divmod(ms, 86_400_000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    if ms or not parts:
        parts.append(f"{ms / 1000:g}s")
    return "".join(parts)


def shortest_period(spec: ScheduleSpec) -> timedelta | None:
    """The shortest time between two slots of ``spec``: the cron expression's minimum period,
    the interval; None for a one-shot (it has no period). The spec must parse."""
    if spec.kind is SpecKind.CRON:
        ts = spec.timespec
        assert isinstance(ts, CronSpec)
        return ts.min_period()
    if spec.kind is SpecKind.INTERVAL:
        return spec.every
    return None


def validate_spec(spec: ScheduleSpec, *, field: str = "schedule.spec") -> None:
    """Checks a spec's expression, zone, interval, bounds, max_runs and jitter; raises
    InvalidArgument naming the first problem under ``field``.

    Jitter may equal the shortest period (offsets lie in ``[0, jitter)``, so slots keep their
    order) but not exceed it. A one-shot has no period: any non-negative jitter is allowed.
    """
    try:
        spec.timespec  # noqa: B018 - parsing validates the expression, zone and interval
    except InvalidArgument as e:
        raise spec_error(e, spec.kind, field) from None
    start, end = spec.start_time, spec.end_time
    if start is not None and end is not None and end <= start:
        raise InvalidArgument(
            f"{field}.end_time",
            f"{end.isoformat()} must be after start_time {start.isoformat()}",
        )
    if spec.max_runs < 0:
        raise InvalidArgument(
            f"{field}.max_runs", f"must not be negative (0 means no limit), got {spec.max_runs}"
        )
    if spec.jitter < timedelta(0):
        raise InvalidArgument(f"{field}.jitter", f"must not be negative, got {_fmt(spec.jitter)}")
    period = shortest_period(spec)
    if spec.jitter and period is not None and spec.jitter > period:
        raise InvalidArgument(
            f"{field}.jitter",
            f"{_fmt(spec.jitter)} is longer than the spec's shortest period {_fmt(period)}",
        )


def validate_policies(p: SchedulePolicies, *, field: str = "schedule.policies") -> None:
    """Checks the execution policies' numbers (the enums were checked when converted)."""
    if p.catch_up_window <= timedelta(0):
        raise InvalidArgument(
            f"{field}.catch_up_window", f"must be positive, got {_fmt(p.catch_up_window)}"
        )
    if p.max_catch_up < 0:
        raise InvalidArgument(
            f"{field}.max_catch_up", f"must not be negative, got {p.max_catch_up}"
        )


def validate_schedule(s: Schedule, now: datetime) -> None:
    """Checks every field of ``s`` that a client sets; raises InvalidArgument naming the first
    problem found."""
    validate_handler(s.handler)
    validate_payload(s.payload)
    if s.max_runtime is not None and s.max_runtime.total_seconds() <= 0:
        raise InvalidArgument("schedule.max_runtime", "must be positive when set")
    validate_spec(s.spec)
    validate_policies(s.policies)
    if s.spec.end_time is not None and s.spec.end_time <= now:
        raise InvalidArgument(
            "schedule.spec.end_time",
            f"{s.spec.end_time.isoformat()} is in the past (now {now:%Y-%m-%dT%H:%M:%SZ})",
        )
    if s.spec.kind is SpecKind.ONCE and s.spec.at is not None and s.spec.at <= now:
        raise InvalidArgument(
            "schedule.spec.once.at",
            f"{s.spec.at.isoformat()} is in the past (now {now:%Y-%m-%dT%H:%M:%SZ})",
        )
