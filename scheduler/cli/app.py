"""The ``cronscale`` command line: argparse wiring and error handling.

Exit status: 0 success, 1 an error (the API refused, a service is unreachable, ...), 2 a usage
error (argparse), 3 ``local status`` found a service down, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from importlib import metadata
from typing import Any, NamedTuple

import grpc

from scheduler.cli import backfills, dead_letters, lifecycle, processes, schedules, tenants
from scheduler.cli import preview as preview_cmd
from scheduler.cli.build import (
    MISFIRES,
    parse_at,
    parse_choice,
    parse_duration,
    parse_payload,
    parse_seconds,
)
from scheduler.cli.client import configure, default_api, describe_rpc_error
from scheduler.cli.logs import LEVELS
from scheduler.cli.spec_options import (
    add_policy_options,
    add_spec_options,
    check_dst_needs_cron,
)
from scheduler.errors import CronscaleError

RpcCommand = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

_CREATE_EPILOG = """\
examples:
  cronscale schedule create --name nightly --handler billing.nightly \\
      --cron '0 2 * * *' --tz Europe/Berlin --payload '{"region": "eu"}'
  cronscale schedule create --name once --handler echo --at 2026-12-02T15:00:00Z
  cronscale schedule create --name poll --handler http --every 1h30m --max-runtime 60
  cronscale schedule create --name spread --handler echo --cron '0 0 * * *' \\
      --jitter 10m --end 2026-12-31T00:00:00Z --overlap BUFFER_ONE --misfire FIRE_ALL

The server is the authority on validation (cron syntax, time zone names, handler names,
payload size, interval bounds, ids) and answers INVALID_ARGUMENT naming the field; the CLI
only checks what it must to build the request.
"""


_UPDATE_EPILOG = """\
examples:
  cronscale schedule get nightly                      # note its version, e.g. 3
  cronscale schedule update nightly --version 3 --cron '30 2 * * *'
  cronscale schedule update poll --version 1 --every 10m --payload '{"deep": true}'

The CLI reads the schedule and sends it back with your changes and --version. If it changed
since you read it, the server answers ABORTED: read it again and retry.
"""


_PREVIEW_EPILOG = """\
examples:
  cronscale schedule preview nightly-report --count 5
  cronscale schedule preview --cron '30 2 * * *' --tz America/New_York \\
      --after 2026-03-07T12:00:00Z --count 3 --json

Each line is `UTC  local  note`; the note says when a DST rule moved a time
(dst_gap_shifted, dst_overlap_second). Wall times a DST gap dropped are listed apart.
"""


def _version() -> str:
    try:
        return metadata.version("cronscale")
    except metadata.PackageNotFoundError:
        return "unknown"


def _parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    parents: Sequence[argparse.ArgumentParser] = (),
    **kwargs: Any,
) -> argparse.ArgumentParser:
    if "epilog" in kwargs:  # examples, laid out by hand
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    return sub.add_parser(
        name,
        help=summary,
        description=summary,
        parents=list(parents),
        allow_abbrev=False,
        **kwargs,
    )


def _add_api_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--api", metavar="HOST:PORT", default=default_api(), help=help)


def _add_log_level_option(p: argparse.ArgumentParser, *, default: str, help: str) -> None:
    p.add_argument(
        "--log-level", default=default, type=str.upper, choices=LEVELS, metavar="LEVEL", help=help
    )


def _api_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_api_option(p, "the cronscale API (default: $CRONSCALE_API, else 127.0.0.1:50051)")
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=10.0,
        help="deadline of each RPC (default: 10)",
    )
    p.add_argument("--json", action="store_true", help="print JSON (proto field names)")
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default="",
        help="API key (default: $CRONSCALE_API_KEY, else the local stack's development key "
        "when the API is on loopback)",
    )
    p.add_argument(
        "--ca-file",
        metavar="PEM",
        default="",
        help="verify the API's TLS certificate against this CA (default: "
        "$CRONSCALE_TLS_CA_FILE; neither: plaintext)",
    )
    return p


def _log_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_log_level_option(p, default="INFO", help="the lowest level logged (default: INFO)")
    p.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    return p


def _rpc(command: RpcCommand) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        configure(api_key=getattr(args, "api_key", ""), ca_file=getattr(args, "ca_file", ""))
        try:
            return asyncio.run(command(args))
        except grpc.aio.AioRpcError as exc:
            print(f"error: {describe_rpc_error(exc, args.api)}", file=sys.stderr)
            return 1

    return run


def _rpc_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    parents: Sequence[argparse.ArgumentParser],
    command: RpcCommand,
    *positionals: str,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """A leaf running ``command`` over RPC, with the positional arguments ``positionals``
    (``run_id`` shows as RUN_ID)."""
    p = _parser(sub, name, summary, parents, **kwargs)
    for dest in positionals:
        p.add_argument(dest, metavar=dest.upper())
    p.set_defaults(run=_rpc(command))
    return p


def _add_page_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--page-size",
        type=int,
        default=0,
        metavar="N",
        help=f"{what} per page (server default 100, at most 1000)",
    )
    p.add_argument(
        "--page-token",
        default="",
        metavar="TOKEN",
        help="continue from a previous page's next_page_token",
    )
    p.add_argument("--all", action="store_true", help="follow next_page_token to the last page")


class _FieldHelp(NamedTuple):
    """The help texts of the options :func:`_add_schedule_fields` adds."""

    name: str
    handler: str
    cron: str
    at: str
    every: str
    tz: str
    payload: str
    max_runtime: str


_CREATE_HELP = _FieldHelp(
    name="a human name",
    handler="the handler the worker runs, e.g. echo",
    cron="5 fields (m h dom mon dow), 6 with seconds first, or a macro like @daily",
    at="fire once at this instant; needs a UTC offset, e.g. 2026-12-02T15:00:00Z",
    every="fire at this interval from now, e.g. 90s, 5m, 1h30m",
    tz="IANA zone the --cron expression is evaluated in (default UTC)",
    payload="JSON handed to the handler (sent as UTF-8 bytes)",
    max_runtime="run timeout the worker enforces, in seconds (or 5m, 1h)",
)

_UPDATE_HELP = _FieldHelp(
    name="a new human name",
    handler="a new handler name",
    cron="a new cron expression",
    at="fire once at this instant instead",
    every="fire at this interval from now instead, e.g. 90s, 5m",
    tz="the IANA zone of the (new or stored) cron expression",
    payload="a new JSON payload",
    max_runtime="a new run timeout, in seconds (or 5m, 1h)",
)


def _add_schedule_fields(p: argparse.ArgumentParser, help: _FieldHelp, *, required: bool) -> None:
    """``--name --handler (--cron | --at | --every) --tz --payload --max-runtime``: the fields
    of :class:`scheduler.cli.build.ScheduleFields` plus name and handler (``required`` ones
    for create). --cron/--at/--every exclude each other but none is required here: a schedule
    with --after alone runs only after its upstreams succeed."""
    p.add_argument("--name", required=required, help=help.name)
    p.add_argument("--handler", required=required, help=help.handler)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--cron", metavar="EXPR", help=help.cron)
    when.add_argument("--at", metavar="ISO8601", type=parse_at, help=help.at)
    when.add_argument("--every", metavar="DURATION", type=parse_duration, help=help.every)
    p.add_argument("--tz", metavar="ZONE", help=help.tz)
    p.add_argument("--payload", metavar="JSON", type=parse_payload, help=help.payload)
    p.add_argument("--max-runtime", metavar="SECONDS", type=parse_seconds, help=help.max_runtime)


def _check_create(args: argparse.Namespace) -> str | None:
    if args.cron is None and args.at is None and args.every is None and not args.after:
        return "one of the arguments --cron --at --every is required (or --after)"
    if args.tz is not None and args.cron is None:
        return "argument --tz: applies only to --cron"
    return check_dst_needs_cron(args)


def build_parser() -> argparse.ArgumentParser:
    """The full ``cronscale`` parser. Each leaf sets ``run`` (args -> exit status)."""
    api = _api_options()
    logs = _log_options()
    parser = argparse.ArgumentParser(
        prog="cronscale",
        description="cronscale: a distributed job scheduler on Cassandra and Kafka.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"cronscale {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # schedule ...
    schedule = _parser(
        commands, "schedule", "create, inspect, change, trigger, pause, cancel, delete schedules"
    )
    sched = schedule.add_subparsers(dest="schedule_command", metavar="SUBCOMMAND", required=True)

    create = _rpc_command(
        sched, "create", "register a new schedule", [api], schedules.create, epilog=_CREATE_EPILOG
    )
    _add_schedule_fields(create, _CREATE_HELP, required=True)
    create.add_argument(
        "--id", metavar="ID", help="choose the schedule id (default: server-assigned)"
    )
    add_spec_options(create)
    add_policy_options(create)
    backfills.add_after_option(create)
    create.set_defaults(check=_check_create, parser=create)

    import_ = _rpc_command(
        sched,
        "import",
        "create many schedules from a JSON-lines file (one CreateScheduleRequest per line)",
        [api],
        schedules.import_file,
    )
    import_.add_argument("file", metavar="FILE.jsonl", help='e.g. {"schedule": {...}} per line')

    _rpc_command(sched, "get", "show one schedule", [api], schedules.get, "id")

    list_ = _rpc_command(sched, "list", "list schedules", [api], schedules.list_schedules)
    _add_page_options(list_, "schedules")
    list_.add_argument(
        "--tenant",
        default="",
        metavar="ID",
        help="only this tenant's schedules (an admin key; a tenant key lists its own anyway)",
    )

    pause = _rpc_command(
        sched, "pause", "stop firing until resumed (idempotent)", [api], schedules.pause, "id"
    )
    pause.add_argument("--note", default="", metavar="TEXT", help="why; shown by `schedule get`")
    pause.add_argument("--by", metavar="WHO", help="who pauses (default: your user name)")

    resume = _rpc_command(
        sched, "resume", "fire again from the next slot after now", [api], schedules.resume, "id"
    )
    resume.add_argument(
        "--misfire",
        metavar="|".join(MISFIRES),
        type=parse_choice,
        choices=list(MISFIRES),
        help="for the slots missed while paused, instead of the schedule's misfire policy",
    )

    _rpc_command(
        sched, "delete", "delete a schedule (its run history stays)", [api], schedules.delete, "id"
    )

    preview = _rpc_command(
        sched,
        "preview",
        "the next fire times of a schedule, or of a cron spec to try (nothing is stored)",
        [api],
        preview_cmd.preview,
        epilog=_PREVIEW_EPILOG,
    )
    preview_cmd.add_arguments(preview)
    preview.set_defaults(check=preview_cmd.check, parser=preview)

    update = _rpc_command(
        sched,
        "update",
        "change a schedule; options not given keep their stored values",
        [api],
        lifecycle.update,
        "id",
        epilog=_UPDATE_EPILOG,
    )
    update.add_argument(
        "--version",
        required=True,
        type=int,
        metavar="N",
        help="the version you read (`schedule get`); a stale one is refused with ABORTED",
    )
    _add_schedule_fields(update, _UPDATE_HELP, required=False)

    cancel = _rpc_command(
        sched, "cancel", "stop a schedule for good (no further runs)", [api], lifecycle.cancel, "id"
    )
    cancel.add_argument(
        "--cancel-running",
        action="store_true",
        help="also ask the workers to cancel its runs in progress",
    )

    trigger = _rpc_command(
        sched,
        "trigger",
        "run now with a fresh run id (subject to the overlap policy)",
        [api],
        lifecycle.trigger,
        "id",
    )
    trigger.add_argument(
        "--force", action="store_true", help="run even if the overlap policy would not"
    )

    backfills.add_schedule_commands(sched, [api], _parser, _rpc)

    runs = _rpc_command(
        sched, "runs", "list a schedule's runs, newest slot first", [api], schedules.list_runs, "id"
    )
    _add_page_options(runs, "runs")

    # run ...
    run = _parser(commands, "run", "inspect and re-run runs")
    run_cmds = run.add_subparsers(dest="run_command", metavar="SUBCOMMAND", required=True)
    _rpc_command(run_cmds, "get", "show one run", [api], schedules.get_run, "run_id")
    _rpc_command(
        run_cmds,
        "rerun",
        "run a finished run again (a fresh run id linked to it)",
        [api],
        lifecycle.rerun,
        "run_id",
    )

    # backfill ...
    backfills.add_backfill_commands(commands, [api], _parser, _rpc)

    # dlq ..., tenant ...
    dead_letters.add_commands(commands, [api], _parser, _rpc, _add_page_options)
    tenants.add_commands(commands, [api], _parser, _rpc, _add_page_options)

    # local ..., db ...
    local = _parser(commands, "local", "the local Cassandra + Kafka for development")
    local_cmds = local.add_subparsers(dest="local_command", metavar="SUBCOMMAND", required=True)
    _parser(local_cmds, "up", "start them (fetched from Maven Central on first use)").set_defaults(
        run=processes.local_up
    )
    _parser(local_cmds, "down", "stop them").set_defaults(run=processes.local_down)
    _parser(
        local_cmds, "reset", "stop them and delete their data (every keyspace and topic)"
    ).set_defaults(run=processes.local_reset)
    _parser(local_cmds, "status", "show whether they answer (exit 3 if one is down)").set_defaults(
        run=processes.local_status
    )

    db = _parser(commands, "db", "the Cassandra schema")
    db_cmds = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    migrate = _parser(db_cmds, "migrate", "apply pending schema migrations")
    _add_log_level_option(
        migrate, default="WARNING", help="the lowest level logged (default: WARNING)"
    )
    migrate.set_defaults(run=processes.db_migrate, log_json=False)
    recount = _parser(
        db_cmds,
        "recount-usage",
        "set each tenant's schedule count (its max_schedules quota) to its stored schedules",
    )
    recount.add_argument(
        "--tenant", metavar="ID", help="only this tenant (default: every tenant with a count)"
    )
    recount.set_defaults(run=processes.db_recount_usage, log_json=False)

    # processes
    _parser(commands, "api", "run the gRPC API server", [logs]).set_defaults(run=processes.api)
    _parser(commands, "dispatcher", "run a dispatcher (fires due timers)", [logs]).set_defaults(
        run=processes.dispatcher
    )
    worker = _parser(
        commands,
        "worker",
        "run a worker; other options (--import, --concurrency, --tier, --help) go to it",
        [logs],
        add_help=False,
    )
    worker.set_defaults(run=_run_worker, passthrough=True)

    dev = _parser(commands, "dev", "run api + dispatcher + worker here, with a demo schedule")
    _add_api_option(
        dev, "where the api listens and is reached (default: $CRONSCALE_API, else 127.0.0.1:50051)"
    )
    dev.add_argument(
        "--no-demo",
        dest="demo",
        action="store_false",
        help="do not register and follow the demo schedule",
    )
    dev.add_argument(
        "--verbose",
        action="store_true",
        help="echo every log line of the processes, not only WARNING and above",
    )
    dev.add_argument(
        "--log-dir", metavar="DIR", help="where <name>.log files go (default: <local home>/logs)"
    )
    _add_log_level_option(dev, default="INFO", help="the processes' log level (default: INFO)")
    dev.add_argument(
        "--ready-timeout",
        metavar="SECONDS",
        type=float,
        default=90.0,
        help="how long to wait for the api to serve (default: 90)",
    )
    dev.add_argument(
        "--import",
        dest="imports",
        metavar="MODULE",
        action="append",
        default=[],
        help="passed to the worker: a module that registers handlers (repeatable)",
    )
    dev.set_defaults(run=_run_dev)
    return parser


def _run_worker(args: argparse.Namespace) -> int:
    return processes.worker(args, list(args.worker_argv))


def _run_dev(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scheduler.cli.dev import DevOptions, default_log_dir, run_dev

    worker_args: list[str] = []
    for module in args.imports:
        worker_args += ["--import", module]
    options = DevOptions(
        api=args.api,
        demo=args.demo,
        log_dir=Path(args.log_dir) if args.log_dir else default_log_dir(),
        log_level=args.log_level,
        verbose=args.verbose,
        ready_timeout_s=args.ready_timeout,
        worker_args=tuple(worker_args),
    )
    return run_dev(options)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``argv`` like ``cronscale`` does; usage errors raise SystemExit(2).

    Arguments ``cronscale worker`` does not know are kept, in order, in ``worker_argv``.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.worker_argv = extra
    check = getattr(args, "check", None)
    if check is not None and (problem := check(args)) is not None:
        args.parser.error(problem)
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs ``cronscale`` with ``argv`` (default ``sys.argv[1:]``) and returns the exit status."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return _exit_status(exc)
    try:
        status: int = args.run(args)
    except CronscaleError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`cronscale schedule list | head`): no traceback, and no second
        # error when Python flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1
