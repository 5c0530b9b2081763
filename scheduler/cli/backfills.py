"""``cronscale schedule backfill|deps``, ``cronscale backfill get`` and ``schedule create --after``.

Each command is ``async (args) -> exit code``; ``app.main`` runs it and turns gRPC errors into
``error: CODE: message`` on stderr with exit status 1. The formatters are pure functions.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from cronscale.v1 import schedule_pb2
from cronscale.v1 import scheduler_service_pb2 as api
from scheduler.cli.build import parse_at
from scheduler.cli.client import scheduler_stub
from scheduler.cli.output import _key_values, _table, dumps, format_time, message_to_json

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
ParserFactory = Callable[..., argparse.ArgumentParser]
RpcWrapper = Callable[[Command], Callable[[argparse.Namespace], int]]

_BACKFILL_EPILOG = """\
examples:
  cronscale schedule backfill nightly --from 2026-01-01T00:00:00Z --to 2026-02-01T00:00:00Z
  cronscale schedule backfill poll --from 2026-03-01T08:00:00Z --to 2026-03-01T12:00:00Z \\
      --concurrency 50 --json

One run per slot in [--from, --to), each with its own scheduled_for and a run id derived from
it: asking again for the same range returns the same backfill and enqueues nothing new.
Follow it with `cronscale backfill get BACKFILL_ID`.
"""


def add_after_option(create: argparse.ArgumentParser) -> None:
    """``schedule create --after ID`` (repeatable)."""
    create.add_argument(
        "--after",
        metavar="ID",
        action="append",
        default=[],
        help="run once after each successful run of this schedule (repeatable); with none of "
        "--cron/--at/--every the schedule runs only after its upstreams",
    )


def add_schedule_commands(
    sched: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: Sequence[argparse.ArgumentParser],
    parser: ParserFactory,
    rpc: RpcWrapper,
) -> None:
    """``schedule backfill`` and ``schedule deps``."""
    backfill = parser(
        sched,
        "backfill",
        "run a schedule once for every slot of a past range",
        parents,
        epilog=_BACKFILL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backfill.add_argument("id", metavar="ID")
    backfill.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="ISO8601",
        type=parse_at,
        help="first instant of the range (inclusive), with a UTC offset",
    )
    backfill.add_argument(
        "--to",
        dest="end",
        required=True,
        metavar="ISO8601",
        type=parse_at,
        help="end of the range (exclusive), with a UTC offset; not in the future",
    )
    backfill.add_argument(
        "--concurrency",
        type=int,
        default=0,
        metavar="N",
        help="backfill runs unfinished at once (default 10, at most 1000)",
    )
    backfill.set_defaults(run=rpc(backfill_schedule))

    deps = parser(sched, "deps", "the dependency graph: upstream -> downstream edges", parents)
    deps.add_argument(
        "id", metavar="ID", nargs="?", default="", help="only edges touching this schedule"
    )
    deps.set_defaults(run=rpc(list_dependencies))


def add_backfill_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: Sequence[argparse.ArgumentParser],
    parser: ParserFactory,
    rpc: RpcWrapper,
) -> None:
    """``backfill get``."""
    backfill = parser(commands, "backfill", "follow backfills")
    cmds = backfill.add_subparsers(dest="backfill_command", metavar="SUBCOMMAND", required=True)
    get = parser(cmds, "get", "show a backfill's progress", parents)
    get.add_argument("backfill_id", metavar="BACKFILL_ID")
    get.set_defaults(run=rpc(get_backfill))


def build_backfill_request(args: argparse.Namespace) -> api.BackfillScheduleRequest:
    """The BackfillScheduleRequest of ``schedule backfill`` (the server validates the range)."""
    request = api.BackfillScheduleRequest(id=args.id, concurrency=args.concurrency)
    request.start_time.FromDatetime(args.start)
    request.end_time.FromDatetime(args.end)
    return request


def format_backfill(b: schedule_pb2.Backfill) -> str:
    """A backfill's progress as an aligned key-value block."""
    return _key_values(
        [
            ("backfill_id", b.backfill_id),
            ("schedule_id", b.schedule_id),
            ("range", f"[{format_time(b.start_time)}, {format_time(b.end_time)})"),
            ("total", str(b.total)),
            ("enqueued", str(b.enqueued)),
            ("done", str(b.done)),
            ("concurrency", str(b.concurrency)),
            ("create_time", format_time(b.create_time)),
        ]
    )


def format_edges(edges: Sequence[schedule_pb2.DependencyEdge]) -> str:
    """Edges as a two-column table; a note when there are none."""
    if not edges:
        return "no dependencies"
    return _table(["UPSTREAM", "DOWNSTREAM"], [[e.upstream_id, e.downstream_id] for e in edges])


async def backfill_schedule(args: argparse.Namespace) -> int:
    """``schedule backfill ID --from --to``: starts (or finds) the backfill of the range."""
    async with scheduler_stub(args.api) as stub:
        b = await stub.BackfillSchedule(build_backfill_request(args), timeout=args.timeout)
    print(dumps(message_to_json(b)) if args.json else format_backfill(b))
    return 0


async def get_backfill(args: argparse.Namespace) -> int:
    """``backfill get BACKFILL_ID``."""
    async with scheduler_stub(args.api) as stub:
        request = api.GetBackfillRequest(backfill_id=args.backfill_id)
        b = await stub.GetBackfill(request, timeout=args.timeout)
    print(dumps(message_to_json(b)) if args.json else format_backfill(b))
    return 0


async def list_dependencies(args: argparse.Namespace) -> int:
    """``schedule deps [ID]``: ``--json`` prints ``{"edges": [{upstream_id, downstream_id}]}``."""
    edges: list[schedule_pb2.DependencyEdge] = []
    token = ""
    async with scheduler_stub(args.api) as stub:
        while True:  # every page: without an id the server answers a page of schedules a call
            request = api.ListDependenciesRequest(
                schedule_id=args.id, page_size=1000, page_token=token
            )
            page = await stub.ListDependencies(request, timeout=args.timeout)
            edges.extend(page.edges)
            token = page.next_page_token
            if not token:
                break
    if args.json:
        print(dumps({"edges": [message_to_json(e) for e in edges]}))
    else:
        print(format_edges(edges))
    return 0
