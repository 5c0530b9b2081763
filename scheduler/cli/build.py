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
from datetime import UTC, datetime, timedelta
from typing import Any

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


# Option values (case-insensitive on the command line) -> proto enum numbers.
DST_GAPS = {
    "SHIFT": schedule_pb2.DST_GAP_POLICY_SHIFT,
    "SKIP": schedule_pb2.DST_GAP_POLICY_SKIP,
}
DST_OVERLAPS = {
    "ONCE": schedule_pb2.DST_OVERLAP_POLICY_ONCE,
    "BOTH": schedule_pb2.DST_OVERLAP_POLICY_BOTH,
}
OVERLAPS = {
    "SKIP": schedule_pb2.OVERLAP_POLICY_SKIP,
    "ALLOW": schedule_pb2.OVERLAP_POLICY_ALLOW,
    "BUFFER_ONE": schedule_pb2.OVERLAP_POLICY_BUFFER_ONE,
    "CANCEL_PREVIOUS": schedule_pb2.OVERLAP_POLICY_CANCEL_PREVIOUS,
}
MISFIRES = {
    "SKIP": schedule_pb2.MISFIRE_POLICY_SKIP,
    "FIRE_ONCE": schedule_pb2.MISFIRE_POLICY_FIRE_ONCE,
    "FIRE_ALL": schedule_pb2.MISFIRE_POLICY_FIRE_ALL,
}


def parse_choice(text: str) -> str:
    """An enum option's value: upper case, ``-`` read as ``_`` (``fire-once`` = FIRE_ONCE)."""
    return text.strip().upper().replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class SpecOptions:
    """Bounds, run limit, jitter and DST policies of a spec; None leaves a field unset."""

    jitter: timedelta | None = None
    start: datetime | None = None
    end: datetime | None = None
    max_runs: int | None = None
    dst_gap: str | None = None
    dst_overlap: str | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> SpecOptions:
        """From a namespace with (some of) ``--jitter --start --end --max-runs --dst-*``."""
        return cls(
            jitter=getattr(ns, "jitter", None),
            start=getattr(ns, "start", None),
            end=getattr(ns, "end", None),
            max_runs=getattr(ns, "max_runs", None),
            dst_gap=getattr(ns, "dst_gap", None),
            dst_overlap=getattr(ns, "dst_overlap", None),
        )

    def apply(self, spec: schedule_pb2.ScheduleSpec) -> None:
        """Sets the given fields on ``spec`` (DST policies only on a cron spec)."""
        if self.jitter is not None:
            spec.jitter.FromTimedelta(self.jitter)
        if self.start is not None:
            spec.start_time.FromDatetime(self.start.astimezone(UTC))
        if self.end is not None:
            spec.end_time.FromDatetime(self.end.astimezone(UTC))
        if self.max_runs is not None:
            spec.max_runs = self.max_runs
        if self.dst_gap is not None or self.dst_overlap is not None:
            if spec.WhichOneof("kind") != "cron":
                raise ValueError("DST policies apply only to a cron expression")
            if self.dst_gap is not None:
                spec.cron.dst.gap = DST_GAPS[self.dst_gap]
            if self.dst_overlap is not None:
                spec.cron.dst.overlap = DST_OVERLAPS[self.dst_overlap]


@dataclass(frozen=True, kw_only=True)
class PolicyOptions:
    """Execution policies; None leaves a field unset (the server's default)."""

    overlap: str | None = None
    misfire: str | None = None
    catch_up_window: timedelta | None = None
    max_catch_up: int | None = None
    max_attempts: int | None = None
    initial_backoff: timedelta | None = None
    backoff_multiplier: float | None = None
    max_backoff: timedelta | None = None
    jitter: float | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> PolicyOptions:
        """From a namespace with (some of) ``--overlap --misfire --catch-up-window
        --max-catch-up`` and the retry options."""
        return cls(
            overlap=getattr(ns, "overlap", None),
            misfire=getattr(ns, "misfire", None),
            catch_up_window=getattr(ns, "catch_up_window", None),
            max_catch_up=getattr(ns, "max_catch_up", None),
            max_attempts=getattr(ns, "max_attempts", None),
            initial_backoff=getattr(ns, "initial_backoff", None),
            backoff_multiplier=getattr(ns, "backoff_multiplier", None),
            max_backoff=getattr(ns, "max_backoff", None),
            jitter=getattr(ns, "jitter_share", None),
        )

    def apply(self, policies: schedule_pb2.SchedulePolicies) -> None:
        """Sets the given fields on ``policies``."""
        if self.overlap is not None:
            policies.overlap = OVERLAPS[self.overlap]
        if self.misfire is not None:
            policies.misfire = MISFIRES[self.misfire]
        if self.catch_up_window is not None:
            policies.catch_up_window.FromTimedelta(self.catch_up_window)
        if self.max_catch_up is not None:
            policies.max_catch_up = self.max_catch_up
        retry = policies.retry
        if self.max_attempts is not None:
            retry.max_attempts = self.max_attempts
        if self.initial_backoff is not None:
            retry.initial_backoff.FromTimedelta(self.initial_backoff)
        if self.backoff_multiplier is not None:
            retry.backoff_multiplier = self.backoff_multiplier
        if self.max_backoff is not None:
            retry.max_backoff.FromTimedelta(self.max_backoff)
        if self.jitter is not None:
            retry.jitter = self.jitter
            retry.no_jitter = self.jitter == 0.0


@dataclass(frozen=True, kw_only=True)
class ScheduleFields:
    """The "when + what" options ``schedule create`` and ``schedule update`` share, parsed.

    When: at most one of cron/at/every, and the time zone of a cron expression. What: the
    payload and the run timeout. None means the option was not given.
    """

    cron: str | None = None
    timezone: str | None = None
    at: datetime | None = None
    every: timedelta | None = None
    payload: bytes | None = None
    max_runtime: timedelta | None = None

    @staticmethod
    def fields_from_namespace(ns: argparse.Namespace) -> dict[str, Any]:
        """These fields from a namespace with ``--cron --tz --at --every --payload
        --max-runtime``, as keyword arguments."""
        return {
            "cron": ns.cron,
            "timezone": ns.tz,
            "at": ns.at,
            "every": ns.every,
            "payload": ns.payload,
            "max_runtime": ns.max_runtime,
        }

    def kind_count(self) -> int:
        """How many of cron/at/every are set."""
        return sum(k is not None for k in (self.cron, self.at, self.every))

    def apply_kind(self, spec: schedule_pb2.ScheduleSpec, *, zone: str) -> None:
        """Replaces the kind of ``spec`` with the one of cron/at/every that is set (if any);
        a cron expression gets ``zone``."""
        if self.cron is not None:
            spec.cron.CopyFrom(schedule_pb2.CronSpec(expression=self.cron, timezone=zone))
        elif self.at is not None:
            spec.once.CopyFrom(schedule_pb2.OneShotSpec())
            spec.once.at.FromDatetime(self.at)
        elif self.every is not None:
            spec.interval.CopyFrom(schedule_pb2.IntervalSpec())
            spec.interval.every.FromTimedelta(self.every)

    def apply_what(self, schedule: schedule_pb2.Schedule) -> None:
        """Sets the payload and run timeout on ``schedule`` when given."""
        if self.payload is not None:
            schedule.payload = self.payload
        if self.max_runtime is not None:
            schedule.max_runtime.FromTimedelta(self.max_runtime)


@dataclass(frozen=True, kw_only=True)
class CreateArgs(ScheduleFields):
    """What ``schedule create`` was given, already parsed; exactly one of cron/at/every is set."""

    name: str
    handler: str
    schedule_id: str | None = None
    spec_options: SpecOptions = SpecOptions()
    policies: PolicyOptions = PolicyOptions()
    # Upstream schedule ids (--after); with none of cron/at/every, a dependency-only schedule.
    after: tuple[str, ...] = ()

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> CreateArgs:
        """From the namespace argparse built for ``schedule create``."""
        return cls(
            name=ns.name,
            handler=ns.handler,
            schedule_id=ns.id,
            spec_options=SpecOptions.from_namespace(ns),
            policies=PolicyOptions.from_namespace(ns),
            after=tuple(getattr(ns, "after", None) or ()),
            **cls.fields_from_namespace(ns),
        )


def build_create_request(args: CreateArgs) -> scheduler_service_pb2.CreateScheduleRequest:
    """The CreateScheduleRequest for ``args``.

    Raises ValueError when not exactly one of cron/at/every is set, or when a time zone is
    given without a cron expression (argparse reports both before this is reached).
    """
    kinds = args.kind_count()
    if kinds > 1 or (not kinds and not args.after):
        raise ValueError("exactly one of cron, at, every must be set (or after)")
    if args.timezone is not None and args.cron is None:
        raise ValueError("a time zone applies only to a cron expression")

    schedule = schedule_pb2.Schedule(name=args.name, handler=args.handler)
    args.apply_kind(schedule.spec, zone=args.timezone or "")
    args.apply_what(schedule)
    args.spec_options.apply(schedule.spec)
    args.policies.apply(schedule.policies)
    schedule.after.extend(args.after)
    return scheduler_service_pb2.CreateScheduleRequest(
        schedule=schedule, schedule_id=args.schedule_id or ""
    )


@dataclass(frozen=True, kw_only=True)
class PreviewArgs:
    """What ``schedule preview`` was given: a stored schedule's id or a cron spec to try."""

    schedule_id: str | None = None
    cron: str | None = None
    timezone: str | None = None
    spec_options: SpecOptions = SpecOptions()
    after: datetime | None = None
    count: int = 0

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> PreviewArgs:
        """From the namespace argparse built for ``schedule preview``."""
        return cls(
            schedule_id=ns.id,
            cron=ns.cron,
            timezone=ns.tz,
            spec_options=SpecOptions.from_namespace(ns),
            after=ns.after,
            count=ns.count,
        )


def build_preview_request(args: PreviewArgs) -> scheduler_service_pb2.PreviewScheduleRequest:
    """The PreviewScheduleRequest for ``args``: by id, or a dry run of ``--cron`` and its spec
    options. Raises ValueError when not exactly one of id/cron is set, or when spec options
    come with an id (argparse reports both before this is reached)."""
    if (args.schedule_id is None) == (args.cron is None):
        raise ValueError("exactly one of a schedule id or a cron expression must be set")
    request = scheduler_service_pb2.PreviewScheduleRequest(count=args.count)
    if args.after is not None:
        request.after.FromDatetime(args.after.astimezone(UTC))
    if args.schedule_id is not None:
        if args.timezone is not None or args.spec_options != SpecOptions():
            raise ValueError("spec options apply only to --cron, not to a stored schedule")
        request.id = args.schedule_id
        return request
    assert args.cron is not None
    request.spec.cron.expression = args.cron
    request.spec.cron.timezone = args.timezone or ""
    args.spec_options.apply(request.spec)
    return request
