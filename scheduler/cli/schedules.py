"""``cronscale schedule ...`` and ``cronscale run ...``: one SchedulerService RPC each.

Each command is ``async (args) -> exit code``; ``app.main`` runs it and turns gRPC errors into
``error: CODE: message`` on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from cronscale.v1 import scheduler_service_pb2 as api
from scheduler.cli.build import MISFIRES, CreateArgs, build_create_request
from scheduler.cli.client import scheduler_stub
from scheduler.cli.output import (
    dumps,
    format_run,
    format_runs_table,
    format_schedule,
    format_schedules_table,
    message_to_json,
)


def _show(args: argparse.Namespace, message: Message, human: Callable[[Any], str]) -> None:
    print(dumps(message_to_json(message)) if args.json else human(message))


async def create(args: argparse.Namespace) -> int:
    """``schedule create``: registers a schedule and prints it as the server stored it."""
    request = build_create_request(CreateArgs.from_namespace(args))
    async with scheduler_stub(args.api) as stub:
        schedule = await stub.CreateSchedule(request, timeout=args.timeout)
    _show(args, schedule, format_schedule)
    return 0


async def get(args: argparse.Namespace) -> int:
    """``schedule get ID``."""
    async with scheduler_stub(args.api) as stub:
        schedule = await stub.GetSchedule(api.GetScheduleRequest(id=args.id), timeout=args.timeout)
    _show(args, schedule, format_schedule)
    return 0


async def list_schedules(args: argparse.Namespace) -> int:
    """``schedule list``: one page, or every page from ``--page-token`` on with ``--all``."""
    schedules: list[Any] = []
    token: str = args.page_token
    async with scheduler_stub(args.api) as stub:
        while True:
            request = api.ListSchedulesRequest(page_size=args.page_size, page_token=token)
            page = await stub.ListSchedules(request, timeout=args.timeout)
            schedules.extend(page.schedules)
            token = page.next_page_token
            if not (args.all and token):
                break
    if args.json:
        body = [message_to_json(s) for s in schedules]
        print(dumps({"schedules": body, "next_page_token": token}))
    else:
        print(format_schedules_table(schedules))
        _print_next_page(token, "cronscale schedule list")
    return 0


async def pause(args: argparse.Namespace) -> int:
    """``schedule pause ID``: stops firing until resumed; the note and author are kept."""
    by = args.by if args.by is not None else default_paused_by()
    request = api.PauseScheduleRequest(id=args.id, note=args.note, paused_by=by)
    async with scheduler_stub(args.api) as stub:
        schedule = await stub.PauseSchedule(request, timeout=args.timeout)
    _show(args, schedule, format_schedule)
    return 0


async def resume(args: argparse.Namespace) -> int:
    """``schedule resume ID [--misfire POLICY]``: fires again from the next slot after now; the
    slots missed while paused follow ``--misfire`` if given, else the schedule's policy."""
    misfire = getattr(args, "misfire", None)
    async with scheduler_stub(args.api) as stub:
        request = api.ResumeScheduleRequest(id=args.id)
        if misfire:
            request.misfire_override = MISFIRES[misfire]
        schedule = await stub.ResumeSchedule(request, timeout=args.timeout)
    _show(args, schedule, format_schedule)
    return 0


async def delete(args: argparse.Namespace) -> int:
    """``schedule delete ID``: ``--json`` prints the (empty) DeleteScheduleResponse, ``{}``."""
    async with scheduler_stub(args.api) as stub:
        request = api.DeleteScheduleRequest(id=args.id)
        response = await stub.DeleteSchedule(request, timeout=args.timeout)
    _show(args, response, lambda _: f"deleted schedule {args.id}")
    return 0


async def list_runs(args: argparse.Namespace) -> int:
    """``schedule runs ID``: the schedule's runs, newest slot first."""
    runs: list[Any] = []
    token: str = args.page_token
    async with scheduler_stub(args.api) as stub:
        while True:
            request = api.ListRunsRequest(
                schedule_id=args.id, page_size=args.page_size, page_token=token
            )
            page = await stub.ListRuns(request, timeout=args.timeout)
            runs.extend(page.runs)
            token = page.next_page_token
            if not (args.all and token):
                break
    if args.json:
        print(dumps({"runs": [message_to_json(r) for r in runs], "next_page_token": token}))
    else:
        print(format_runs_table(runs))
        _print_next_page(token, f"cronscale schedule runs {args.id}")
    return 0


async def get_run(args: argparse.Namespace) -> int:
    """``run get RUN_ID``."""
    async with scheduler_stub(args.api) as stub:
        run = await stub.GetRun(api.GetRunRequest(run_id=args.run_id), timeout=args.timeout)
    _show(args, run, format_run)
    return 0


def default_paused_by() -> str:
    """Who pauses when ``--by`` is not given: the local user name, or empty if unknown."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""


def _print_next_page(token: str, command: str) -> None:
    if token:
        print(f"\nmore: {command} --page-token {token}")
