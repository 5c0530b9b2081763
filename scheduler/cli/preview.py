"""``cronscale schedule preview``: the next fire times of a schedule, or of a cron spec to try.

Human output is one line per fire time, ``UTC  local  note``, then the wall times a DST gap
dropped; ``--json`` prints the PreviewScheduleResponse (``fire_times[*].utc`` in UTC ISO-8601).
"""

from __future__ import annotations

import argparse

from cronscale.v1 import scheduler_service_pb2 as api
from scheduler.cli.build import PreviewArgs, SpecOptions, build_preview_request, parse_at
from scheduler.cli.client import scheduler_stub
from scheduler.cli.output import dumps, format_time, format_timedelta, message_to_json
from scheduler.cli.spec_options import add_spec_options, check_dst_needs_cron


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``schedule preview`` (the ``--api``/``--json`` ones come from a parent)."""
    p.add_argument("id", metavar="ID", nargs="?", help="a stored schedule (or give --cron)")
    p.add_argument("--cron", metavar="EXPR", help="a cron expression to try (nothing is stored)")
    p.add_argument("--tz", metavar="ZONE", help="IANA zone of --cron (default UTC)")
    add_spec_options(p, max_runs=False)
    p.add_argument(
        "--after",
        metavar="ISO8601",
        type=parse_at,
        help="fire times strictly after this instant (default now), e.g. 2026-03-07T12:00:00Z",
    )
    p.add_argument(
        "--count", metavar="N", type=int, default=0, help="how many (default 10, at most 1000)"
    )


def check(args: argparse.Namespace) -> str | None:
    """Usage problems argparse cannot express: exactly one of ID and --cron; spec options only
    with --cron."""
    if (args.id is None) == (args.cron is None):
        return "give either a schedule ID or --cron EXPR"
    has_spec_options = args.tz is not None or SpecOptions.from_namespace(args) != SpecOptions()
    if args.id is not None and has_spec_options:
        return "--tz, --jitter, --start, --end, --dst-gap, --dst-overlap apply only to --cron"
    return check_dst_needs_cron(args)


def format_preview(
    response: api.PreviewScheduleResponse, *, dry_run_jitter: str | None = None
) -> str:
    """One line per fire time (``UTC  local  note``), then the DST-skipped wall times."""
    lines = [f"{format_time(f.utc)}  {f.local}  {f.note}".rstrip() for f in response.fire_times]
    if not lines:
        lines.append("(no fire times)")
    if response.skipped:
        lines.append("")
        lines.append("skipped by DST (never fire):")
        lines += [f"{format_time(k.utc)}  {k.local}  {k.note}".rstrip() for k in response.skipped]
    if dry_run_jitter:
        lines.append("")
        lines.append(
            f"jitter not applied: a stored schedule fires each time plus a fixed offset in "
            f"[0, {dry_run_jitter}) derived from its id"
        )
    return "\n".join(lines)


async def preview(args: argparse.Namespace) -> int:
    """``schedule preview (ID | --cron EXPR ...) [--after] [--count]``."""
    request = build_preview_request(PreviewArgs.from_namespace(args))
    async with scheduler_stub(args.api) as stub:
        response = await stub.PreviewSchedule(request, timeout=args.timeout)
    if args.json:
        print(dumps(message_to_json(response)))
    else:
        jitter = args.jitter if args.cron is not None and args.jitter else None
        print(format_preview(response, dry_run_jitter=format_timedelta(jitter) if jitter else None))
    return 0
