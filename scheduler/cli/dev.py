"""``cronscale dev``: api + dispatcher + worker in one terminal, with a demo schedule firing.

Assumes the local Cassandra and Kafka are up and the schema is migrated (``make dev`` does
both first). Starts the three processes as children of this one (same interpreter), copies
their full output to ``<local home>/logs/<name>.log`` and echoes it prefixed with ``[api]``,
``[dispatcher]``, ``[worker]``: everything while they start, then only WARNING and above so the
demo's lines stay readable, and at most a few lines per logger every 10 s (``--verbose``
echoes everything). Once the API answers its gRPC
health check, registers (or reuses) the schedule ``demo-every-5s`` and prints one line per
finished run.

Ctrl-C or SIGTERM stops the children: worker and dispatcher first (so their last reports still
reach the API), then the API; each gets SIGTERM, then SIGKILL after 10 s. A second Ctrl-C
kills them at once. If a child exits on its own, its last log lines are printed, the others
are stopped and the exit status is 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.cli.client import describe_rpc_error, scheduler_stub
from scheduler.cli.logs import LEVEL_PREFIX, LEVELS
from scheduler.cli.output import TERMINAL_RUN_STATUSES, enum_name, format_run_line
from scheduler.cli.processes import ENV_PARENT_PID
from scheduler.credentials import DevKeys, dev_keys, local_home

DEMO_ID = "demo-every-5s"
DEMO_CRON = "*/5 * * * * *"
DEMO_HANDLER = "echo"
DEMO_PAYLOAD = b'{"hello": "cronscale"}'
CHILDREN = ("api", "dispatcher", "worker")
# Stopped in this order: the worker reports finished runs to the API, so the API goes last.
STOP_ORDER = (("worker", "dispatcher"), ("api",))
STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.5
# How long child INFO lines keep being echoed after the demo is set up.
QUIET_AFTER_S = 3.0
TAIL_LINES = 30
_PREFIX_WIDTH = max(len(f"[{name}]") for name in (*CHILDREN, "dev"))


@dataclass(frozen=True, kw_only=True)
class DevOptions:
    """What ``cronscale dev`` was asked to do."""

    api: str
    demo: bool = True
    log_dir: Path
    log_level: str = "INFO"
    verbose: bool = False
    ready_timeout_s: float = 90.0
    worker_args: tuple[str, ...] = ()


def child_argv(name: str, options: DevOptions, python: str = sys.executable) -> list[str]:
    """The command line of child ``name``: this interpreter running ``scheduler.cli``."""
    argv = [python, "-m", "scheduler.cli", name, "--log-level", options.log_level]
    if name == "worker":
        argv += options.worker_args
    return argv


def child_env(
    options: DevOptions, base: Mapping[str, str], parent_pid: int, keys: DevKeys | None = None
) -> dict[str, str]:
    """The children's environment: ours, pointed at ``options.api``, unbuffered, and told
    who their parent is so they stop if it dies. With the local stack's development ``keys``,
    the api stores them as bootstrap keys and the worker reports with the worker key (unless
    the environment names keys already)."""
    env = dict(base)
    if keys is not None:
        env.setdefault("CRONSCALE_BOOTSTRAP_ADMIN_KEY", keys.admin)
        env.setdefault("CRONSCALE_BOOTSTRAP_WORKER_KEY", keys.worker)
        env.setdefault("CRONSCALE_API_TOKEN", keys.worker)
    env["CRONSCALE_API"] = options.api
    env.setdefault("CRONSCALE_API_LISTEN", options.api)
    env["PYTHONUNBUFFERED"] = "1"
    env[ENV_PARENT_PID] = str(parent_pid)
    return env


def demo_create_request() -> scheduler_service_pb2.CreateScheduleRequest:
    """The request that registers the demo schedule under its fixed id."""
    schedule = schedule_pb2.Schedule(
        name="demo: echo every 5 s",
        handler=DEMO_HANDLER,
        payload=DEMO_PAYLOAD,
        spec=schedule_pb2.ScheduleSpec(
            cron=schedule_pb2.CronSpec(expression=DEMO_CRON, timezone="UTC")
        ),
    )
    return scheduler_service_pb2.CreateScheduleRequest(schedule=schedule, schedule_id=DEMO_ID)


class LineFilter:
    """Decides which lines of one child's output reach the terminal.

    A line that starts a log record (``<time> <LEVEL> <logger>: ...``) is shown when the
    startup window is open or its level is WARNING or above, and then only the first
    ``burst`` records of each logger per ``window_s`` (a burst such as 64 "claimed shard"
    lines becomes a few lines and a notice). Lines that do not start a record (tracebacks,
    multi-line messages, stray prints) follow the record before them.
    """

    def __init__(self, log_path: Path, *, burst: int = 3, window_s: float = 10.0) -> None:
        self._log_path = log_path
        self._burst = burst
        self._window_s = window_s
        self._showing = True
        # logger -> (window start, records shown in it, notice printed)
        self._windows: dict[str, tuple[float, int, bool]] = {}

    def lines_to_show(self, line: str, *, everything: bool, now: float) -> list[str]:
        """What to print for ``line``: itself, nothing, or a notice that lines were held
        back. ``everything`` is true while the startup window is open."""
        match = LEVEL_PREFIX.match(line)
        if match is None:
            return [line] if self._showing else []
        level, logger = match.group("level"), match.group("logger")
        important = level in LEVELS and LEVELS.index(level) >= LEVELS.index("WARNING")
        if not (everything or important):
            self._showing = False
            return []
        start, shown, noticed = self._windows.get(logger, (now, 0, False))
        if now - start >= self._window_s:
            start, shown, noticed = now, 0, False
        if shown < self._burst:
            self._windows[logger] = (start, shown + 1, noticed)
            self._showing = True
            return [line]
        self._showing = False
        if noticed:
            return []
        self._windows[logger] = (start, shown, True)
        return [f"... more {logger} lines in the next {self._window_s:.0f} s: see {self._log_path}"]


class RunReporter:
    """Turns successive ListRuns pages into one line per run that reached a terminal state.

    The first page only primes it: runs that had finished before ``cronscale dev`` started are
    not printed again. A run is printed once per terminal status and attempt (a retried run
    that failed and then succeeded prints two lines).
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, int, int]] = set()
        self._primed = False

    def new_lines(self, runs: Iterable[schedule_pb2.Run]) -> list[str]:
        """The lines for runs not reported yet, oldest slot first."""
        fresh = []
        for run in runs:
            if run.status not in TERMINAL_RUN_STATUSES:
                continue
            key = (run.run_id, run.attempt, run.status)
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(run)
        if not self._primed:
            self._primed = True
            return []
        fresh.sort(key=lambda r: (r.scheduled_for.seconds, r.scheduled_for.nanos))
        return [format_run_line(run) for run in fresh]


@dataclass(kw_only=True)
class _Child:
    name: str
    argv: list[str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    pump: asyncio.Task[None] | None = None
    filter: LineFilter = field(init=False)

    def __post_init__(self) -> None:
        self.filter = LineFilter(self.log_path)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def signal(self, sig: signal.Signals) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        # Each child leads its own process group (start_new_session), so this also reaches
        # anything a handler spawned.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)


class DevRunner:
    """Runs the three children, the readiness wait, the demo and the shutdown."""

    def __init__(self, options: DevOptions, out: TextIO = sys.stdout) -> None:
        self._options = options
        self._out = out
        self._children = [
            _Child(
                name=name,
                argv=child_argv(name, options),
                log_path=options.log_dir / f"{name}.log",
            )
            for name in CHILDREN
        ]
        self._stop = asyncio.Event()
        self._killing = False
        # Child INFO lines are echoed until this monotonic time (None: not decided yet).
        self._quiet_from: float | None = None

    # Output ---------------------------------------------------------------------------------

    def _print(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def say(self, text: str) -> None:
        """A line from the runner itself, prefixed ``[dev]``."""
        self._print(f"{'[dev]':<{_PREFIX_WIDTH}} {text}")

    def _in_startup(self) -> bool:
        return self._quiet_from is None or time.monotonic() < self._quiet_from

    # Main -------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Runs until Ctrl-C/SIGTERM (exit 0) or until something fails (exit 1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        self._options.log_dir.mkdir(parents=True, exist_ok=True)
        logs = ", ".join(str(c.log_path) for c in self._children)
        self.say(f"starting api, dispatcher, worker (full logs: {logs})")
        keys = dev_keys(local_home(), create=True)
        env = child_env(self._options, os.environ, os.getpid(), keys)
        exits: dict[asyncio.Future[int], _Child] = {}
        tasks: list[asyncio.Future[Any]] = []
        code = 0
        try:
            for child in self._children:
                await self._start(child, env)
                assert child.process is not None
                exits[asyncio.ensure_future(child.process.wait())] = child
            session = asyncio.ensure_future(self._session())
            stop = asyncio.ensure_future(self._stop.wait())
            tasks = [session, stop, *exits]
            pending: set[asyncio.Future[Any]] = set(tasks)
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if stop in done:
                    break
                exited = [exits[t] for t in done if t in exits]
                if exited:
                    await self._report_exit(exited[0])
                    code = 1
                    break
                if session in done and (exc := session.exception()) is not None:
                    text = str(exc) if isinstance(exc, RuntimeError) else repr(exc)
                    self.say(f"error: {text}")
                    code = 1
                    break
        finally:
            tasks += [t for t in exits if t not in tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._stop_children()
        self.say(
            "stopped api, dispatcher and worker. The local Cassandra and Kafka keep running; "
            "`cronscale local down` stops them."
        )
        return code

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            self._print("")
            self.say(f"{sig.name}: stopping (again to kill at once)")
            self._stop.set()
        elif not self._killing:
            self._killing = True
            self.say(f"{sig.name} again: killing the processes")
            for child in self._children:
                child.signal(signal.SIGKILL)

    # Children ---------------------------------------------------------------------------------

    async def _start(self, child: _Child, env: Mapping[str, str]) -> None:
        child.process = await asyncio.create_subprocess_exec(
            *child.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
            limit=1 << 20,
        )
        child.pump = asyncio.ensure_future(self._pump(child))

    async def _pump(self, child: _Child) -> None:
        assert child.process is not None and child.process.stdout is not None
        stream = child.process.stdout
        prefix = f"{'[' + child.name + ']':<{_PREFIX_WIDTH}} "
        with child.log_path.open("w", encoding="utf-8", buffering=1) as log:
            while True:
                try:
                    raw = await stream.readline()
                except ValueError:  # a line over the 1 MiB limit; asyncio dropped it
                    raw = b"[cronscale dev: dropped a line longer than 1 MiB]\n"
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                log.write(line + "\n")
                child.tail.append(line)
                if self._options.verbose:
                    shown = [line]
                else:
                    shown = child.filter.lines_to_show(
                        line, everything=self._in_startup(), now=time.monotonic()
                    )
                for text in shown:
                    self._print(prefix + text)

    async def _report_exit(self, child: _Child) -> None:
        if child.pump is not None:
            # Let the pump read what the child wrote before it died.
            await asyncio.wait({child.pump}, timeout=2.0)
        assert child.process is not None
        self.say(
            f"{child.name} exited unexpectedly ({_describe_status(child.process.returncode)}); "
            f"last lines of {child.log_path}:"
        )
        self._print_tail(child)
        if child.process.returncode is not None and child.process.returncode > 0:
            self.say(
                "is the local stack up and migrated? `cronscale local status` checks, "
                "`make dev` starts it and migrates."
            )
        self.say("stopping the other processes")

    def _print_tail(self, child: _Child) -> None:
        for line in child.tail:
            self._print(f"    | {line}")

    async def _stop_children(self) -> None:
        by_name = {c.name: c for c in self._children}
        for group in STOP_ORDER:
            targets = [by_name[name] for name in group if by_name[name].running]
            for child in targets:
                child.signal(signal.SIGTERM)
            await self._wait_or_kill(targets)
        pumps = [c.pump for c in self._children if c.pump is not None]
        if pumps:
            await asyncio.wait(pumps, timeout=2.0)
        for task in pumps:
            task.cancel()

    async def _wait_or_kill(self, targets: Sequence[_Child]) -> None:
        waits = [c.process.wait() for c in targets if c.process is not None]
        if not waits:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*waits), STOP_GRACE_S)
        except TimeoutError:
            for child in targets:
                if child.running:
                    self.say(f"{child.name} did not stop within {STOP_GRACE_S:.0f} s: killing it")
                    child.signal(signal.SIGKILL)
            await asyncio.gather(
                *(c.process.wait() for c in targets if c.process is not None),
                return_exceptions=True,
            )

    # Readiness and the demo -------------------------------------------------------------------

    async def _session(self) -> None:
        started = time.monotonic()
        try:
            await wait_until_serving(self._options.api, self._options.ready_timeout_s)
        except TimeoutError as exc:
            api = next(c for c in self._children if c.name == "api")
            tail = "\n".join(f"    | {line}" for line in api.tail)
            raise RuntimeError(
                f"{exc}; is the local stack up (`cronscale local status`) and migrated "
                f"(`cronscale db migrate`)? Last lines of {api.log_path}:\n{tail}"
            ) from None
        self.say(f"api is serving at {self._options.api} after {time.monotonic() - started:.1f} s")
        if not self._options.demo:
            self._quiet_soon()
            self.say("--no-demo: not registering a schedule. Ctrl-C stops everything.")
            return
        async with scheduler_stub(self._options.api) as stub:
            await self._ensure_demo(stub)
            self._quiet_soon()
            await self._follow_runs(stub)

    def _quiet_soon(self) -> None:
        self._quiet_from = time.monotonic() + QUIET_AFTER_S
        if not self._options.verbose:
            self.say(
                "from here on only WARNING and above from the processes "
                "(--verbose shows everything; the log files have it all)"
            )

    async def _ensure_demo(self, stub: Any) -> None:
        try:
            schedule = await _register_demo(stub)
        except grpc.aio.AioRpcError as exc:
            problem = describe_rpc_error(exc, self._options.api)
            raise RuntimeError(f"could not register the demo schedule: {problem}") from None
        state = enum_name(schedule_pb2.ScheduleState.DESCRIPTOR, schedule.state)
        self.say(
            f"demo schedule {DEMO_ID}: cron {DEMO_CRON!r} (UTC, every 5 s), handler "
            f"{DEMO_HANDLER}, payload {DEMO_PAYLOAD.decode()}, state {state}"
        )
        if schedule.state == schedule_pb2.SCHEDULE_STATE_PAUSED:
            self.say(f"it is paused: `cronscale schedule resume {DEMO_ID}` lets it fire")
        self.say(
            "try in another terminal: `cronscale schedule list`, "
            f"`cronscale schedule runs {DEMO_ID}`. Ctrl-C stops everything."
        )
        self.say("finished runs (scheduled_for UTC, start lag, handler, status, run id):")

    async def _follow_runs(self, stub: Any) -> None:
        reporter = RunReporter()
        last_error: str | None = None
        request = scheduler_service_pb2.ListRunsRequest(schedule_id=DEMO_ID, page_size=50)
        while True:
            try:
                page = await stub.ListRuns(request, timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                # Keep following: the API may be restarting or briefly overloaded.
                text = describe_rpc_error(exc, self._options.api)
                if text != last_error:
                    self.say(f"ListRuns failed, retrying: {text}")
                    last_error = text
            else:
                last_error = None
                for line in reporter.new_lines(page.runs):
                    self._print(line)
            await asyncio.sleep(POLL_INTERVAL_S)


async def _register_demo(stub: Any) -> Any:
    """Gets the demo schedule, creating it under its fixed id when it does not exist."""
    get = scheduler_service_pb2.GetScheduleRequest(id=DEMO_ID)
    try:
        return await stub.GetSchedule(get, timeout=5.0)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
    try:
        return await stub.CreateSchedule(demo_create_request(), timeout=10.0)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.ALREADY_EXISTS:  # a concurrent `cronscale dev` won
            raise
    return await stub.GetSchedule(get, timeout=5.0)


async def wait_until_serving(target: str, timeout_s: float) -> None:
    """Polls the gRPC health service at ``target`` until the server and ``SchedulerService``
    report SERVING (a service the server did not register counts as the server's status).

    Raises TimeoutError after ``timeout_s``, RuntimeError when the health check fails other
    than by the server not answering yet.
    """
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    service = scheduler_service_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
    serving = health_pb2.HealthCheckResponse.SERVING
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                overall = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if overall.status == serving:
                    ours = await health.Check(
                        health_pb2.HealthCheckRequest(service=service), timeout=1.0
                    )
                    if ours.status == serving:
                        return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return  # the server serves but does not report per service
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise RuntimeError(
                        f"health check of {target} failed: {describe_rpc_error(exc, target)}"
                    ) from None
            await asyncio.sleep(0.25)
    raise TimeoutError(f"no SERVING health status from {target} within {timeout_s:.0f} s")


def _describe_status(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def default_log_dir() -> Path:
    """``<local home>/logs``: next to the local stack's files (``CRONSCALE_LOCAL_HOME``,
    default ``<repo>/.local``)."""
    from ops.local import LocalSettings

    return LocalSettings.from_env().home / "logs"


def run_dev(options: DevOptions) -> int:
    """Runs ``cronscale dev`` to completion and returns its exit status."""
    return asyncio.run(DevRunner(options).run())
