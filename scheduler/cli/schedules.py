"""``cronscale schedule ...`` and ``cronscale run ...``: one SchedulerService RPC each.

Each command is ``async (args) -> exit code``; ``app.main`` runs it and turns gRPC errors into
``error: CODE: message`` on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from cronscale.v1 import scheduler_service_pb2 as api
from scheduler.cli.build import MISFIRES, CreateArgs, build_create_request
from scheduler.cli.client import scheduler_stub
from scheduler.cli.import_file import ImportBatch, ImportFileError, read_import_file
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


IMPORT_IN_FLIGHT = 4


async def import_file(args: argparse.Namespace) -> int:
    """``schedule import FILE.jsonl``: the whole file read first (``cli/import_file.py``), then
    BatchCreateSchedules, batches of 500, 4 in flight, with progress on stderr; refused lines
    are listed (line number, field, problem) and the exit status is 1 if any was refused."""
    try:
        batches, total = read_import_file(args.file)
    except ImportFileError as e:
        raise SystemExit(f"error: {e}") from None
    done = created = existed = 0
    refused: list[str] = []
    started = time.monotonic()
    sem = asyncio.Semaphore(IMPORT_IN_FLIGHT)

    def progress(final: bool = False) -> None:
        if args.json or not (final or sys.stderr.isatty()):
            return
        rate = done / max(time.monotonic() - started, 1e-6)
        width = 30
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if final else "\r"
        print(f"[{bar}] {done:,}/{total:,} ({rate:,.0f}/s)", end=end, file=sys.stderr, flush=True)

    async with scheduler_stub(args.api) as stub:

        async def send(batch: ImportBatch) -> None:
            nonlocal done, created, existed
            async with sem:
                response = await stub.BatchCreateSchedules(
                    api.BatchCreateSchedulesRequest.FromString(batch.request),
                    timeout=args.timeout,
                )
            for line, result in zip(batch.lines, response.results, strict=True):
                if result.error_code:
                    refused.append(f"line {line}: {result.error_code}: {result.error}")
                elif result.already_existed:
                    existed += 1
                else:
                    created += 1
            done += len(batch.lines)
            progress()

        await asyncio.gather(*(send(batch) for batch in batches))
    progress(final=True)
    seconds = time.monotonic() - started
    summary = {
        "lines": total,
        "created": created,
        "already_existed": existed,
        "refused": len(refused),
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(dumps({**summary, "errors": refused}))
    else:
        for problem in refused:
            print(problem, file=sys.stderr)
        print(
            f"imported {total:,} lines in {seconds:.1f} s: {created:,} created, "
            f"{existed:,} already existed, {len(refused):,} refused"
        )
    return 1 if refused else 0


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
            request = api.ListSchedulesRequest(
                page_size=args.page_size, page_token=token, tenant=args.tenant
            )
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
