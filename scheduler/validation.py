"""Validation of a schedule as a whole, shared by CreateSchedule and UpdateSchedule.

Everything here raises ``InvalidArgument`` with the request's field path (``schedule.spec...``)
before anything is written.
"""

from __future__ import annotations

from datetime import datetime

from scheduler.errors import InvalidArgument
from scheduler.model import (
    Schedule,
    SpecKind,
    validate_handler,
    validate_payload,
)

# Time-spec errors name bare fields; these are their paths in the request.
_SPEC_FIELDS = {
    "cron": "schedule.spec.cron.expression",
    "timezone": "schedule.spec.cron.timezone",
    "interval": "schedule.spec.interval.every",
    "anchor": "schedule.spec.interval.anchor",
    "at": "schedule.spec.once.at",
}


def spec_error(e: InvalidArgument, kind: SpecKind) -> InvalidArgument:
    """A time-spec error re-addressed to the request field it came from."""
    field = _SPEC_FIELDS.get(e.field, e.field)
    if e.field == "timezone" and kind is not SpecKind.CRON:
        field = f"schedule.spec.{kind.value}.timezone"
    return InvalidArgument(field, e.problem)


def validate_schedule(s: Schedule, now: datetime) -> None:
    """Checks every field of ``s`` that a client sets; raises InvalidArgument naming the first
    problem found."""
    validate_handler(s.handler)
    validate_payload(s.payload)
    if s.max_runtime is not None and s.max_runtime.total_seconds() <= 0:
        raise InvalidArgument("schedule.max_runtime", "must be positive when set")
    try:
        s.spec.timespec  # noqa: B018 - parsing validates the expression, zone and interval
    except InvalidArgument as e:
        raise spec_error(e, s.spec.kind) from None
    if s.spec.kind is SpecKind.ONCE and s.spec.at is not None and s.spec.at <= now:
        raise InvalidArgument(
            "schedule.spec.once.at",
            f"{s.spec.at.isoformat()} is in the past (now {now:%Y-%m-%dT%H:%M:%SZ})",
        )
