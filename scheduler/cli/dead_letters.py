"""``cronscale dlq list|get|redrive|redrive-all``: dead letters, read and re-driven."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from cronscale.v1 import dead_letter_service_pb2 as dl
from cronscale.v1 import schedule_pb2
from scheduler.cli.build import parse_at
from scheduler.cli.client import dead_letter_stub
from scheduler.cli.output import (
    _key_values,
    _one_line,
    _table,
    dumps,
    enum_name,
    format_payload,
    format_run,
    format_time,
    message_to_json,
)

RpcCommand = Callable[[argparse.Namespace], Any]


def format_dead_letter(d: dl.DeadLetter) -> str:
    """A dead letter as a key-value block, then one line per failed attempt."""
    rows = [
        ("run_id", d.run_id),
        ("schedule_id", d.schedule_id),
        ("tenant", d.tenant),
        ("handler", d.handler),
        ("scheduled_for", format_time(d.scheduled_for)),
        ("dead_lettered", format_time(d.dead_letter_time)),
        ("attempts", str(d.attempts)),
        ("error", d.error),
        ("payload", format_payload(d.payload)),
        ("redriven_as", d.redrive_run_id or "-"),
    ]
    out = _key_values(rows)
    if d.history:
        lines = [
            (
                str(a.attempt),
                enum_name(schedule_pb2.RunStatus.DESCRIPTOR, a.status),
                format_time(a.finish_time if a.HasField("finish_time") else None),
                a.worker_id or "-",
                _one_line(a.error, 80),
            )
            for a in d.history
        ]
        out += "\n\n" + _table(("ATTEMPT", "STATUS", "FINISHED", "WORKER", "ERROR"), lines)
    return out


def format_dead_letters_table(letters: Sequence[dl.DeadLetter]) -> str:
    return _table(
        ("RUN_ID", "DEAD_LETTERED", "ATTEMPTS", "REDRIVEN_AS", "ERROR"),
        [
            (
                d.run_id,
                format_time(d.dead_letter_time),
                str(d.attempts),
                d.redrive_run_id or "-",
                _one_line(d.error, 60),
            )
            for d in letters
        ],
    )


async def list_letters(args: argparse.Namespace) -> int:
    """``dlq list [--schedule ID]``: newest first, a page (or ``--all``)."""
    letters: list[dl.DeadLetter] = []
    token = args.page_token
    async with dead_letter_stub(args.api) as stub:
        while True:
            resp = await stub.ListDeadLetters(
                dl.ListDeadLettersRequest(
                    schedule_id=args.schedule or "", page_size=args.page_size, page_token=token
                ),
                timeout=args.timeout,
            )
            letters.extend(resp.dead_letters)
            token = resp.next_page_token
            if not args.all or not token:
                break
    if args.json:
        print(
            dumps(
                {
                    "dead_letters": [message_to_json(d) for d in letters],
                    "next_page_token": token,
                }
            )
        )
    else:
        print(format_dead_letters_table(letters))
        if token:
            print(f"\nmore: --page-token {token}")
    return 0


async def get_letter(args: argparse.Namespace) -> int:
    """``dlq get RUN_ID``: the dead letter with every failed attempt."""
    async with dead_letter_stub(args.api) as stub:
        d = await stub.GetDeadLetter(
            dl.GetDeadLetterRequest(run_id=args.run_id), timeout=args.timeout
        )
    print(dumps(message_to_json(d)) if args.json else format_dead_letter(d))
    return 0


async def redrive(args: argparse.Namespace) -> int:
    """``dlq redrive RUN_ID``: a new attempt series under a fresh run id; prints the run."""
    async with dead_letter_stub(args.api) as stub:
        run = await stub.RedriveDeadLetter(
            dl.RedriveDeadLetterRequest(run_id=args.run_id, request_id=args.request_id or ""),
            timeout=args.timeout,
        )
    print(dumps(message_to_json(run)) if args.json else format_run(run))
    return 0


async def redrive_all(args: argparse.Namespace) -> int:
    """``dlq redrive-all SCHEDULE_ID [--since T] [--until T]``: every dead letter not
    re-driven yet (dead-lettered in the range); prints the new runs' ids."""
    request = dl.RedriveDeadLettersRequest(schedule_id=args.schedule_id)
    since: datetime | None = args.since
    until: datetime | None = args.until
    if since is not None:
        request.start_time.FromDatetime(since)
    if until is not None:
        request.end_time.FromDatetime(until)
    async with dead_letter_stub(args.api) as stub:
        resp = await stub.RedriveDeadLetters(request, timeout=args.timeout)
    if args.json:
        print(dumps({"runs": [message_to_json(r) for r in resp.runs]}))
    else:
        for r in resp.runs:
            print(f"{r.origin_run_id} -> {r.run_id}")
        print(f"re-drove {len(resp.runs)} dead letters")
    return 0


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: Sequence[argparse.ArgumentParser],
    parser: Callable[..., argparse.ArgumentParser],
    rpc: Callable[[RpcCommand], Callable[[argparse.Namespace], int]],
    add_page_options: Callable[[argparse.ArgumentParser, str], None],
) -> None:
    """``cronscale dlq ...``."""
    dlq = parser(commands, "dlq", "dead letters: runs whose last attempt failed")
    sub = dlq.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND", required=True)
    ls = parser(sub, "list", "list dead letters, newest first", parents)
    ls.add_argument("--schedule", metavar="ID", help="only this schedule's")
    add_page_options(ls, "dead letters")
    ls.set_defaults(run=rpc(list_letters))
    get = parser(sub, "get", "show a dead letter with every failed attempt", parents)
    get.add_argument("run_id", metavar="RUN_ID")
    get.set_defaults(run=rpc(get_letter))
    rd = parser(sub, "redrive", "run a dead letter again (a new attempt series)", parents)
    rd.add_argument("run_id", metavar="RUN_ID")
    rd.add_argument(
        "--request-id", metavar="KEY", help="idempotency key: a retried call starts no second run"
    )
    rd.set_defaults(run=rpc(redrive))
    ra = parser(sub, "redrive-all", "re-drive every dead letter of a schedule", parents)
    ra.add_argument("schedule_id", metavar="SCHEDULE_ID")
    ra.add_argument("--since", metavar="ISO8601", type=parse_at, help="dead-lettered at or after")
    ra.add_argument("--until", metavar="ISO8601", type=parse_at, help="dead-lettered before")
    ra.set_defaults(run=rpc(redrive_all))
