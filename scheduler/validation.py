"""Validation of a schedule as a whole, shared by CreateSchedule and UpdateSchedule.

Everything here raises ``InvalidArgument`` with the request's field path (``schedule.spec...``)
before anything is written.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from scheduler.errors import InvalidArgument
from scheduler.model import (
    RetryPolicy,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    validate_handler,
    validate_payload,
)
from scheduler.timespec import CronSpec

# Limits on what one schedule may hold (docs/concepts/policies.md, "Limits"): values past them
# were accepted once and failed later, in a dispatcher (a catch-up window of 5,000 years
# overflowed the slot arithmetic), in Kafka (a 1 MB tenant name) or in Cassandra (a one-shot in
# year 9999), where they stopped other schedules from firing.
MAX_TENANT_CHARS = 128
MAX_NAME_CHARS = 256
MAX_CRON_CHARS = 256
MAX_CATCH_UP_WINDOW = timedelta(days=366)
MAX_CATCH_UP_RUNS = 10_000
MAX_RUNTIME = timedelta(days=7)
# Retry policies (docs/concepts/delivery.md, "Retries").
MAX_ATTEMPTS = 100
MIN_BACKOFF = timedelta(milliseconds=100)
MAX_BACKOFF = timedelta(days=7)
MAX_MULTIPLIER = 10.0
# Instants a spec may name (start, end, one-shot): far enough for any real plan.
LAST_INSTANT = datetime(2200, 1, 1, tzinfo=UTC)

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
    if len(spec.cron) > MAX_CRON_CHARS:
        raise InvalidArgument(
            f"{field}.cron.expression",
            f"is {len(spec.cron)} characters; the limit is {MAX_CRON_CHARS}",
        )
    for name, instant, path in (
        ("start_time", spec.start_time, f"{field}.start_time"),
        ("end_time", spec.end_time, f"{field}.end_time"),
        ("at", spec.at, f"{field}.once.at"),
    ):
        if instant is not None and instant >= LAST_INSTANT:
            raise InvalidArgument(
                path, f"{instant.isoformat()} is too far ahead; {name} must be before 2200-01-01"
            )
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
    if p.catch_up_window > MAX_CATCH_UP_WINDOW:
        raise InvalidArgument(
            f"{field}.catch_up_window",
            f"{_fmt(p.catch_up_window)} is longer than the limit {_fmt(MAX_CATCH_UP_WINDOW)}",
        )
    if p.max_catch_up < 0:
        raise InvalidArgument(
            f"{field}.max_catch_up", f"must not be negative, got {p.max_catch_up}"
        )
    if p.max_catch_up > MAX_CATCH_UP_RUNS:
        raise InvalidArgument(
            f"{field}.max_catch_up", f"{p.max_catch_up} is above the limit {MAX_CATCH_UP_RUNS}"
        )
    validate_retry(p.retry, field=f"{field}.retry")


def validate_retry(r: RetryPolicy, *, field: str) -> None:
    """Checks a retry policy's numbers against the documented limits."""
    if not 1 <= r.max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(
            f"{field}.max_attempts", f"must be between 1 and {MAX_ATTEMPTS}, got {r.max_attempts}"
        )
    if not MIN_BACKOFF <= r.initial_backoff <= MAX_BACKOFF:
        raise InvalidArgument(
            f"{field}.initial_backoff",
            f"must be between {_fmt(MIN_BACKOFF)} and {_fmt(MAX_BACKOFF)}, "
            f"got {_fmt(r.initial_backoff)}",
        )
    if not MIN_BACKOFF <= r.max_backoff <= MAX_BACKOFF:
        raise InvalidArgument(
            f"{field}.max_backoff",
            f"must be between {_fmt(MIN_BACKOFF)} and {_fmt(MAX_BACKOFF)}, "
            f"got {_fmt(r.max_backoff)}",
        )
    if r.max_backoff < r.initial_backoff:
        raise InvalidArgument(
            f"{field}.max_backoff",
            f"{_fmt(r.max_backoff)} is shorter than initial_backoff {_fmt(r.initial_backoff)}",
        )
    if not (math.isfinite(r.multiplier) and 1.0 <= r.multiplier <= MAX_MULTIPLIER):
        raise InvalidArgument(
            f"{field}.backoff_multiplier",
            f"must be between 1.0 and {MAX_MULTIPLIER:g}, got {r.multiplier:g}",
        )
    if not (math.isfinite(r.jitter) and 0.0 <= r.jitter <= 1.0):
        raise InvalidArgument(f"{field}.jitter", f"must be between 0.0 and 1.0, got {r.jitter:g}")


def validate_schedule(s: Schedule, now: datetime) -> None:
    """Checks every field of ``s`` that a client sets; raises InvalidArgument naming the first
    problem found."""
    validate_handler(s.handler)
    validate_payload(s.payload)
    if len(s.tenant) > MAX_TENANT_CHARS:
        raise InvalidArgument(
            "schedule.tenant", f"is {len(s.tenant)} characters; the limit is {MAX_TENANT_CHARS}"
        )
    if len(s.name) > MAX_NAME_CHARS:
        raise InvalidArgument(
            "schedule.name", f"is {len(s.name)} characters; the limit is {MAX_NAME_CHARS}"
        )
    if s.max_runtime is not None and s.max_runtime.total_seconds() <= 0:
        raise InvalidArgument("schedule.max_runtime", "must be positive when set")
    if s.max_runtime is not None and s.max_runtime > MAX_RUNTIME:
        raise InvalidArgument(
            "schedule.max_runtime",
            f"{_fmt(s.max_runtime)} is longer than the limit {_fmt(MAX_RUNTIME)}",
        )
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
