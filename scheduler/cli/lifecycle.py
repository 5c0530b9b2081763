"""``cronscale schedule update|cancel|trigger`` and ``cronscale run rerun``.

``schedule update`` is read-modify-write: it reads the schedule, applies the options given (the
others keep their stored values) and sends the whole schedule with ``--version``, the version
the caller read; a stale one gets ABORTED. :func:`build_update_request` is the pure part.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from cronscale.v1 import schedule_pb2
from cronscale.v1 import scheduler_service_pb2 as api
from scheduler.cli.build import ScheduleFields
from scheduler.cli.client import scheduler_stub
from scheduler.cli.output import dumps, format_run, format_schedule, message_to_json
from scheduler.errors import InvalidArgument


@dataclass(frozen=True, kw_only=True)
class UpdateArgs(ScheduleFields):
    """What ``schedule update`` was given; None means "keep the stored value"."""

    schedule_id: str
    version: int
    name: str | None = None
    handler: str | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> UpdateArgs:
        """From the namespace argparse built for ``schedule update``."""
        return cls(
            schedule_id=ns.id,
            version=ns.version,
            name=ns.name,
            handler=ns.handler,
            **cls.fields_from_namespace(ns),
        )


def build_update_request(
    current: schedule_pb2.Schedule, args: UpdateArgs
) -> api.UpdateScheduleRequest:
    """The UpdateScheduleRequest: ``current`` (as read) with the options of ``args`` applied.

    A new ``--cron``, ``--at`` or ``--every`` replaces the spec's kind (its bounds, jitter and
    max runs stay); ``--tz`` alone changes the zone of a cron schedule. Raises InvalidArgument
    naming the option when ``--tz`` is given for a schedule that is not (or no longer) cron.
    """
    if args.kind_count() > 1:
        raise ValueError("at most one of cron, at, every may be set")
    schedule = schedule_pb2.Schedule()
    schedule.CopyFrom(current)
    schedule.id = args.schedule_id
    schedule.version = args.version
    if args.name is not None:
        schedule.name = args.name
    if args.handler is not None:
        schedule.handler = args.handler
    spec = schedule.spec
    # A new cron expression keeps the stored zone; a new interval is anchored at the update
    # (the server's "now"), like `create --every`.
    args.apply_kind(spec, zone=spec.cron.timezone if spec.WhichOneof("kind") == "cron" else "")
    if args.timezone is not None:
        kind = spec.WhichOneof("kind")
        if kind != "cron":
            raise InvalidArgument(
                "--tz", f"applies only to a cron schedule; this one is {kind or 'without a spec'}"
            )
        spec.cron.timezone = args.timezone
    args.apply_what(schedule)
    return api.UpdateScheduleRequest(schedule=schedule)


def _show_schedule(args: argparse.Namespace, schedule: schedule_pb2.Schedule) -> None:
    print(dumps(message_to_json(schedule)) if args.json else format_schedule(schedule))


def _show_run(args: argparse.Namespace, run: schedule_pb2.Run) -> None:
    print(dumps(message_to_json(run)) if args.json else format_run(run))


async def update(args: argparse.Namespace) -> int:
    """``schedule update ID --version N ...``: reads the schedule, sends it back changed."""
    async with scheduler_stub(args.api) as stub:
        current = await stub.GetSchedule(api.GetScheduleRequest(id=args.id), timeout=args.timeout)
        request = build_update_request(current, UpdateArgs.from_namespace(args))
        schedule = await stub.UpdateSchedule(request, timeout=args.timeout)
    _show_schedule(args, schedule)
    return 0


async def cancel(args: argparse.Namespace) -> int:
    """``schedule cancel ID [--cancel-running]``: no further runs, for good."""
    request = api.CancelScheduleRequest(id=args.id, cancel_running=args.cancel_running)
    async with scheduler_stub(args.api) as stub:
        schedule = await stub.CancelSchedule(request, timeout=args.timeout)
    _show_schedule(args, schedule)
    return 0


async def trigger(args: argparse.Namespace) -> int:
    """``schedule trigger ID [--force]``: a manual run now; prints it (ENQUEUED or SKIPPED)."""
    request = api.TriggerScheduleRequest(id=args.id, force=args.force)
    async with scheduler_stub(args.api) as stub:
        run = await stub.TriggerSchedule(request, timeout=args.timeout)
    _show_run(args, run)
    return 0


async def rerun(args: argparse.Namespace) -> int:
    """``run rerun RUN_ID``: the finished run again under a fresh run id; prints the new run."""
    async with scheduler_stub(args.api) as stub:
        run = await stub.RerunRun(api.RerunRunRequest(run_id=args.run_id), timeout=args.timeout)
    _show_run(args, run)
    return 0
