"""Turning command-line values into API requests. Pure functions, unit-tested without a server.

The server is the authority on validation: it checks cron expressions, time zones, handler
names, payload size, interval bounds and ids, and answers INVALID_ARGUMENT naming the field. The
CLI checks only what it must to *build* a request: that ``--payload`` is JSON (the CLI's
contract is JSON payloads), that ``--at`` is an instant (a naive time has no single meaning),
and that durations parse. The ``parse_*`` functions are argparse ``type=`` callables: they raise
``argparse.ArgumentTypeError``, which argparse reports as a usage error naming the option.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from cronscale.v1 import schedule_pb2, scheduler_service_pb2

_DURATION = re.compile(
    r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m(?!s))?(?:(?P<s>\d+(?:\.\d+)?)s)?"
    r"(?:(?P<ms>\d+)ms)?"
)


def parse_payload(text: str) -> bytes:
    """``--payload``: a JSON document, returned as its UTF-8 bytes exactly as written."""
    try:
        json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be valid JSON: {exc}") from None
    return text.encode("utf-8")


def parse_at(text: str) -> datetime:
    """``--at``: an ISO 8601 instant with a UTC offset or ``Z``, e.g. ``2026-12-02T15:00:00Z``."""
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r}; use e.g. 2026-12-02T15:00:00Z"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"must include a UTC offset, e.g. 2026-12-02T15:00:00Z (got {text!r})"
        )
    return value


def parse_duration(text: str) -> timedelta:
    """``--every``: a duration such as ``90s``, ``5m``, ``1h30m``, ``1d``, ``250ms``.

    Units (in this order, each at most once): d, h, m, s (may be fractional), ms.
    """
    raw = text.strip()
    match = _DURATION.fullmatch(raw)
    if not raw or match is None or not any(match.groupdict().values()):
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r}; use e.g. 90s, 5m, 1h30m (units d, h, m, s, ms)"
        )
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return timedelta(
        days=parts.get("d", 0),
        hours=parts.get("h", 0),
        minutes=parts.get("m", 0),
        seconds=parts.get("s", 0),
        milliseconds=parts.get("ms", 0),
    )


def parse_seconds(text: str) -> timedelta:
    """``--max-runtime``: seconds as a number (``300``, ``2.5``) or a duration (``5m``)."""
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        pass
    try:
        return parse_duration(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"not a number of seconds: {text!r}; use e.g. 300 or 5m"
        ) from None


@dataclass(frozen=True, kw_only=True)
class CreateArgs:
    """What ``schedule create`` was given, already parsed; exactly one of cron/at/every is set."""

    name: str
    handler: str
    cron: str | None = None
    timezone: str | None = None
    at: datetime | None = None
    every: timedelta | None = None
    payload: bytes | None = None
    max_runtime: timedelta | None = None
    schedule_id: str | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> CreateArgs:
        """From the namespace argparse built for ``schedule create``."""
        return cls(
            name=ns.name,
            handler=ns.handler,
            cron=ns.cron,
            timezone=ns.tz,
            at=ns.at,
            every=ns.every,
            payload=ns.payload,
            max_runtime=ns.max_runtime,
            schedule_id=ns.id,
        )


def build_create_request(args: CreateArgs) -> scheduler_service_pb2.CreateScheduleRequest:
    """The CreateScheduleRequest for ``args``.

    Raises ValueError when not exactly one of cron/at/every is set, or when a time zone is
    given without a cron expression (argparse reports both before this is reached).
    """
    kinds = [k for k in (args.cron, args.at, args.every) if k is not None]
    if len(kinds) != 1:
        raise ValueError("exactly one of cron, at, every must be set")
    if args.timezone is not None and args.cron is None:
        raise ValueError("a time zone applies only to a cron expression")

    schedule = schedule_pb2.Schedule(name=args.name, handler=args.handler)
    if args.cron is not None:
        schedule.spec.cron.expression = args.cron
        schedule.spec.cron.timezone = args.timezone or ""
    elif args.at is not None:
        schedule.spec.once.at.FromDatetime(args.at)
    elif args.every is not None:
        schedule.spec.interval.every.FromTimedelta(args.every)
    if args.payload is not None:
        schedule.payload = args.payload
    if args.max_runtime is not None:
        schedule.max_runtime.FromTimedelta(args.max_runtime)
    return scheduler_service_pb2.CreateScheduleRequest(
        schedule=schedule, schedule_id=args.schedule_id or ""
    )
