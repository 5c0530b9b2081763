"""The chaos harness: the real fleet (api x2, dispatcher x3, worker x3) on real Cassandra and
Kafka, a few hundred schedules firing every few seconds, and a timeline of faults: SIGKILLed and
restarted dispatchers, workers and APIs, one dispatcher SIGSTOPped past its shard lease, one
Kafka and one Cassandra restart. The verdict comes from the handlers' execution log
(:mod:`tests.chaos.report`).

    python -m tests.chaos.harness --duration 10m        # what `make chaos DURATION=10m` runs

By default Cassandra and Kafka are a private pair started for the run (its own home, its own
ports, jars shared with the main local stack): restarting the shared local stack would break
every other test and benchmark using it. ``--shared-services`` runs on the already-running local
stack instead (own keyspace and topic) and then restarts neither service.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bucketer.cql import connect
from cronscale.v1 import dead_letter_service_pb2 as dl_pb2
from cronscale.v1 import dead_letter_service_pb2_grpc as dl_grpc
from cronscale.v1 import schedule_pb2
from ops.local import LocalSettings, down, up
from ops.local import process as local_process
from ops.migrate import migrate
from scheduler.cli.build import parse_seconds
from scheduler.config import Config
from tests.chaos import handlers
from tests.chaos.report import (
    ChaosSchedule,
    FaultWindow,
    LetterView,
    Report,
    RunView,
    build_report,
    expected_slots,
    read_executions,
)
from tests.e2e.conftest import Stack, _free_port
from tests.e2e.support import (
    create_schedule,
    cron_spec,
    dt,
    dur,
    json_payload,
    list_runs,
    status_name,
)
from tests.services import private_stack_settings, require_services, test_config

logger = logging.getLogger(__name__)

SHARD_LEASE_S: Final = 10.0
"""The dispatchers' shard lease (bucketer.ownership's default): a SIGSTOP must outlast it."""

PROCESS_KILLS: Final = ("kill_dispatcher", "kill_worker", "kill_api")
SERVICE_RESTARTS: Final = ("restart_cassandra", "restart_kafka")
STOP_DISPATCHER: Final = "stop_dispatcher"
# Retry policies of the chaos schedules: the always-failing (and hanging) ones must be
# dead-lettered after exactly this many attempts; the flaky ones (30 % failures) get so many
# that none should be (0.3 ** 12 ~ 5e-7 per run).
HOPELESS_ATTEMPTS: Final = 3
FLAKY_ATTEMPTS: Final = 12


@dataclass(frozen=True, kw_only=True)
class ChaosOptions:
    """One chaos run. The defaults are the long run of ``make chaos``."""

    duration_s: float = 600.0
    """Seconds of faults (the slot window is this, less ``edge_s`` at each end)."""
    schedules: int = 300
    periods_s: tuple[int, ...] = (2, 3, 4, 5)
    """Each schedule fires every one of these seconds (``*/N * * * * *``), round-robin."""
    fail_share: float = 0.06
    flaky_share: float = 0.06
    hang_share: float = 0.06
    flaky_fail_rate: float = 0.3
    hang_s: float = 60.0
    hang_max_runtime_s: float = 2.0
    apis: int = 2
    dispatchers: int = 3
    workers: int = 3
    shards: int = 16
    topic_partitions: int = 6
    kill_every_s: float = 20.0
    """Mean spacing of the process SIGKILLs."""
    restart_after_s: tuple[float, float] = (0.5, 5.0)
    """A killed process is started again after a random delay in this range."""
    stop_s: float = SHARD_LEASE_S + 15.0
    """How long the SIGSTOPped dispatcher stays stopped (past its lease)."""
    restart_services: bool = True
    """Restart Kafka once and Cassandra once (needs the private services)."""
    private_services: bool = True
    edge_s: float = 5.0
    """Slots this close to the start or the end of the fault period are not counted."""
    stuck_bound_s: float = 30.0
    """A run still ENQUEUED or RUNNING this long after its slot is stuck."""
    fault_grace_s: float = 15.0
    """Lag is "outside fault windows" from this long after a fault's target is back."""
    drain_timeout_s: float = 120.0
    dlq_timeout_s: float = 180.0
    """How long the always-failing runs of the window may take to be dead-lettered after it: a
    run whose report was lost to a fault comes back only through its lease (90 s here), then
    has its remaining attempts."""
    seed: int | None = None
    out_dir: Path | None = None
    """Where logs, the execution log and the report go (default: a new temp folder)."""
    keep_data: bool = False
    """Keep the private Cassandra and Kafka data (for a post-mortem with cqlsh) after the run."""
    static_workers: bool = True
    """Workers join as Kafka static members (CRONSCALE_WORKER_GROUP_INSTANCE_ID = their name),
    as fixed worker slots would in production: a restarted worker takes its partitions back
    without a rebalance."""

    def __post_init__(self) -> None:
        if self.restart_services and not self.private_services:
            raise ValueError(
                "restarting Cassandra and Kafka needs private services: restarting the shared "
                "local stack would break everything else that uses it"
            )


# --- the services ------------------------------------------------------------------------------


def private_settings(home: Path) -> LocalSettings:
    """The chaos stack's own Cassandra + Kafka (tests.services.private_stack_settings)."""
    # The proof SIGKILLs this single node: without a replica, only a synced commit log keeps
    # what it acknowledged (ops/local/cassandra.yaml.tmpl).
    return private_stack_settings(home, commitlog_sync="group")


def restart_service(settings: LocalSettings, name: str) -> None:
    """SIGKILLs the private ``name`` (cassandra or kafka) and starts it again; returns once it
    answers clients."""
    record = local_process.read_pid_file(settings.pid_file(name))
    if record is None:
        raise RuntimeError(f"{name} of the chaos stack is not running")
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while local_process.is_running(record.pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} (pid {record.pid}) survived SIGKILL for 30 s")
        time.sleep(0.1)
    # The dead server's sockets linger (FIN_WAIT) for a while after a SIGKILL, and `up` refuses
    # ports still held: wait for the kernel to let go.
    ports = [spec.port for spec in settings.ports(name)]
    released = _wait(
        lambda: not any(local_process.port_in_use(settings.host, p) for p in ports), 120, 0.5
    )
    if not released:
        raise RuntimeError(f"ports {ports} of {name} still held 120 s after SIGKILL")
    up(settings, out=lambda line: logger.info("%s", line))


# --- the fleet ---------------------------------------------------------------------------------


def wait_serving(target: str, timeout: float) -> bool:
    """True once the API at ``target`` answers its health check with SERVING."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    return False


class Fleet(Stack):
    """The e2e :class:`Stack`, grown to several named replicas per role, each started with its
    own environment (API port, the API a worker reports to) and restartable by name."""

    def __init__(self, config: Config, logs: Path, extra_env: dict[str, str]) -> None:
        super().__init__(config, logs)
        self.env.update(extra_env)
        self.specs: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}
        self.api_targets: dict[str, str] = {}

    def launch(self, name: str, args: tuple[str, ...], env: dict[str, str]) -> None:
        """Starts ``name`` (``cronscale <args>`` with ``env`` over the fleet's) and remembers
        how, for :meth:`restart`."""
        self.specs[name] = (args, env)
        base = self.env
        self.env = {**base, **env}
        try:
            self.start(name, *args)
        finally:
            self.env = base

    def restart(self, name: str) -> None:
        args, env = self.specs[name]
        self.launch(name, args, env)

    def role(self, prefix: str) -> list[str]:
        return sorted(n for n in self.specs if n.startswith(prefix))

    def stop_all(self) -> None:
        """Workers first (so their last reports still find an API), then the rest."""
        workers = [self.procs[n] for n in self.role("worker") if n in self.procs]
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        super().stop_all()


def start_fleet(config: Config, logs: Path, options: ChaosOptions, env: dict[str, str]) -> Fleet:
    fleet = Fleet(config, logs, env)
    host = config.api_listen.rpartition(":")[0]
    targets = [config.api_target] + [f"{host}:{_free_port()}" for _ in range(options.apis - 1)]
    for i, target in enumerate(targets, 1):
        fleet.api_targets[f"api{i}"] = target
        fleet.launch(f"api{i}", ("api",), {"CRONSCALE_API_LISTEN": target, "CRONSCALE_API": target})
    for i in range(1, options.dispatchers + 1):
        fleet.launch(f"dispatcher{i}", ("dispatcher",), {})
    for i in range(1, options.workers + 1):
        # Workers spread their reports over the APIs.
        target = targets[(i - 1) % len(targets)]
        fleet.launch(
            f"worker{i}",
            ("worker", "--log-level", "WARNING", "--import", "tests.chaos.handlers"),
            {
                "CRONSCALE_API": target,
                "CRONSCALE_WORKER_GROUP_INSTANCE_ID": f"worker{i}"
                if options.static_workers
                else "",
            },
        )
    for name, target in fleet.api_targets.items():
        if not wait_serving(target, 60):
            raise RuntimeError(f"{name} not serving after 60 s:\n{fleet.tail(name)}")
    return fleet


# --- schedules ---------------------------------------------------------------------------------


def plan_schedules(options: ChaosOptions, rng: random.Random) -> list[ChaosSchedule]:
    """``options.schedules`` schedules: the failing, flaky and hanging shares, the rest OK."""
    n = options.schedules
    kinds = (
        [handlers.FAIL] * round(n * options.fail_share)
        + [handlers.FLAKY] * round(n * options.flaky_share)
        + [handlers.HANG] * round(n * options.hang_share)
    )
    kinds += [handlers.OK] * (n - len(kinds))
    rng.shuffle(kinds)
    out = []
    for i, kind in enumerate(kinds):
        period = options.periods_s[i % len(options.periods_s)]
        out.append(
            ChaosSchedule(
                schedule_id=f"chaos-{kind.split('.')[1]}-{i:04d}",
                handler=kind,
                cron=f"*/{period} * * * * *",
            )
        )
    return out


def register(
    fleet: Fleet, planned: list[ChaosSchedule], options: ChaosOptions, exec_dir: Path
) -> None:
    """CreateSchedule for each: overlap ALLOW and misfire FIRE_ALL (so every slot must run, even
    late), a max runtime below the hang for the hanging ones. Retries are quick (1 s, x2, at most
    4 s): the always-failing and hanging ones end in the DLQ after ``HOPELESS_ATTEMPTS``; the
    flaky ones get enough attempts that none should."""
    for s in planned:
        attempts = FLAKY_ATTEMPTS if s.handler == handlers.FLAKY else HOPELESS_ATTEMPTS
        policies = schedule_pb2.SchedulePolicies(
            overlap=schedule_pb2.OVERLAP_POLICY_ALLOW,
            misfire=schedule_pb2.MISFIRE_POLICY_FIRE_ALL,
            catch_up_window=dur(timedelta(hours=1)),
            max_catch_up=1000,
            retry=schedule_pb2.RetryPolicy(
                max_attempts=attempts,
                initial_backoff=dur(timedelta(seconds=1)),
                max_backoff=dur(timedelta(seconds=4)),
            ),
        )
        payload: dict[str, object] = {"log_dir": str(exec_dir)}
        extra: dict[str, object] = {}
        if s.handler == handlers.FLAKY:
            payload["fail_rate"] = options.flaky_fail_rate
        if s.handler == handlers.HANG:
            payload["hang_s"] = options.hang_s
            extra["max_runtime"] = dur(timedelta(seconds=options.hang_max_runtime_s))
        create_schedule(
            fleet,
            s.schedule_id,
            name=s.schedule_id,
            handler=s.handler,
            spec=cron_spec(s.cron),
            payload=json_payload(payload),
            policies=policies,
            **extra,
        )


# --- faults ------------------------------------------------------------------------------------


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    action: Callable[[], None] = dataclasses.field(compare=False)
    label: str = dataclasses.field(compare=False, default="")


def plan_faults(options: ChaosOptions, rng: random.Random, start: float) -> list[tuple[float, str]]:
    """(monotonic time, kind) of every fault: the SIGSTOP early, Cassandra at 40 % and Kafka at
    70 % of the period, process SIGKILLs spread over it, each kind at least once; none in the
    last ``restart_after_s + fault_grace_s`` so the fleet is whole again before the end."""
    d = options.duration_s
    lead = min(10.0, d * 0.05)
    last = d - options.restart_after_s[1] - options.fault_grace_s
    plan = [(start + max(lead, d * 0.1), STOP_DISPATCHER)]
    if options.restart_services:
        plan += [(start + d * 0.4, "restart_cassandra"), (start + d * 0.7, "restart_kafka")]
    count = max(len(PROCESS_KILLS), int((last - lead) / options.kill_every_s))
    kinds = list(PROCESS_KILLS)
    rng.shuffle(kinds)
    kinds += [rng.choice(PROCESS_KILLS) for _ in range(count - len(kinds))]
    step = (last - lead) / count
    for i, kind in enumerate(kinds):
        plan.append((start + lead + step * (i + rng.uniform(0.1, 0.9)), kind))
    return sorted(plan)


class FaultInjector:
    """Runs the fault timeline on the fleet, records each fault's window, and (like any
    supervisor would) restarts a process that exits on its own, noting it."""

    def __init__(
        self,
        fleet: Fleet,
        settings: LocalSettings | None,
        options: ChaosOptions,
        rng: random.Random,
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self.options = options
        self.rng = rng
        self.faults: list[FaultWindow] = []
        self.notes: list[str] = []
        self.stopped: set[str] = set()
        self._down: set[str] = set()
        self._queue: list[_Event] = []
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._errors: list[Exception] = []
        self._lock = threading.Lock()
        self._service_lock = threading.Lock()
        # Monotonic -> wall clock, for the fault windows (the slots are wall-clock times).
        self._offset = time.time() - time.monotonic()

    def _wall(self, mono: float) -> float:
        return mono + self._offset

    def _at(self, at: float, label: str, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Event(at, self._seq, action, label))

    def run(self, plan: list[tuple[float, str]], until: float) -> None:
        """Injects ``plan``, then returns once every restart is done and ``until`` passed."""
        for at, kind in plan:
            self._at(at, kind, functools.partial(self._inject, kind))
        while self._queue or self._threads or time.monotonic() < until:
            self._watch()
            self._threads = [t for t in self._threads if t.is_alive()]
            if self._errors:
                raise self._errors[0]
            nxt = self._queue[0].at if self._queue else until
            if time.monotonic() < nxt:
                # The timeline's own clock: nothing to wait on but the next fault's time.
                time.sleep(min(0.5, nxt - time.monotonic()))
                continue
            if self._queue:
                event = heapq.heappop(self._queue)
                logger.info("chaos: %s", event.label)
                event.action()

    def _pick(self, prefix: str) -> str:
        live = [n for n in self.fleet.role(prefix) if n not in self._down | self.stopped]
        return self.rng.choice(live or self.fleet.role(prefix))

    def _inject(self, kind: str) -> None:
        now = time.monotonic()
        if kind in PROCESS_KILLS:
            name = self._pick(kind.removeprefix("kill_"))
            if name in self.stopped or name in self._down:
                logger.info("chaos: %s skipped, every %s is already down", kind, name)
                return
            self.fleet.kill(name, signal.SIGKILL)
            self._down.add(name)
            delay = self.rng.uniform(*self.options.restart_after_s)
            self._at(now + delay, f"restart {name}", lambda: self._restart(kind, name, now))
        elif kind == STOP_DISPATCHER:
            name = self._pick("dispatcher")
            self.fleet.procs[name].send_signal(signal.SIGSTOP)
            self.stopped.add(name)
            self._at(now + self.options.stop_s, f"SIGCONT {name}", lambda: self._cont(name, now))
        elif kind in SERVICE_RESTARTS:
            settings = self.settings
            assert settings is not None
            service = kind.removeprefix("restart_")

            def restart() -> None:
                # One at a time: `up` starts every service of the pair that is down.
                with self._service_lock:
                    restart_service(settings, service)
                self._record(kind, service, now)

            self._background(restart)

    def _background(self, fn: Callable[[], None]) -> None:
        """Runs a slow step (a service restart, a wait for an API) beside the timeline, so the
        faults after it keep their times."""

        def guarded() -> None:
            try:
                fn()
            except Exception as e:
                logger.exception("chaos: background step failed")
                self._errors.append(e)

        thread = threading.Thread(target=guarded, name="chaos-step", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _restart(self, kind: str, name: str, since: float) -> None:
        self.fleet.restart(name)
        self._down.discard(name)
        target = self.fleet.api_targets.get(name)
        if target is None:
            self._record(kind, name, since)
            return

        def serving() -> None:
            if not wait_serving(target, 60):
                self.notes.append(f"{name} not serving 60 s after its restart")
            self._record(kind, name, since)

        self._background(serving)

    def _cont(self, name: str, since: float) -> None:
        proc = self.fleet.procs.get(name)
        if proc is not None:
            proc.send_signal(signal.SIGCONT)
        self.stopped.discard(name)
        self._record(STOP_DISPATCHER, name, since)

    def _record(self, kind: str, target: str, since: float) -> None:
        window = FaultWindow(
            kind=kind, target=target, start=self._wall(since), end=self._wall(time.monotonic())
        )
        logger.info("chaos: %s %s over after %.1f s", kind, target, window.end - window.start)
        with self._lock:
            self.faults.append(window)

    def _watch(self) -> None:
        """A process that exited without being killed is noted and started again."""
        for name, proc in list(self.fleet.procs.items()):
            if name in self._down or proc.poll() is None:
                continue
            note = (
                f"{name} exited on its own (status {proc.returncode}) at "
                f"{datetime.now(UTC):%H:%M:%S}; restarted. Log tail:\n{self.fleet.tail(name, 15)}"
            )
            logger.warning("chaos: %s", note)
            self.notes.append(note)
            self.fleet.procs.pop(name)
            self.fleet.restart(name)

    def resume_all(self) -> None:
        for name in list(self.stopped):
            proc = self.fleet.procs.get(name)
            if proc is not None:
                proc.send_signal(signal.SIGCONT)
        self.stopped.clear()


# --- the run -----------------------------------------------------------------------------------


def read_dead_letters(fleet: Fleet, planned: list[ChaosSchedule]) -> list[LetterView]:
    """Every dead letter of every chaos schedule, through ListDeadLetters."""
    stub = dl_grpc.DeadLetterServiceStub(fleet.channel)
    out: list[LetterView] = []
    for s in planned:
        token = ""
        while True:
            resp = stub.ListDeadLetters(
                dl_pb2.ListDeadLettersRequest(
                    schedule_id=s.schedule_id, page_size=1000, page_token=token
                ),
                timeout=30,
            )
            out.extend(
                LetterView(
                    run_id=d.run_id,
                    schedule_id=d.schedule_id,
                    scheduled_for=dt(d.scheduled_for),
                    attempts=d.attempts,
                )
                for d in resp.dead_letters
            )
            token = resp.next_page_token
            if not token:
                break
    return out


def read_runs(fleet: Fleet, planned: list[ChaosSchedule]) -> list[RunView]:
    """Every run of every chaos schedule, through ListRuns."""
    out: list[RunView] = []
    for s in planned:
        for r in list_runs(fleet, s.schedule_id):
            out.append(
                RunView(
                    run_id=r.run_id,
                    schedule_id=r.schedule_id,
                    status=status_name(r.status).removeprefix("RUN_STATUS_"),
                    scheduled_for=dt(r.scheduled_for),
                    enqueue_time=dt(r.enqueue_time) if r.HasField("enqueue_time") else None,
                    skip_reason=r.skip_reason,
                    error=r.error,
                    start_time=dt(r.start_time) if r.HasField("start_time") else None,
                    finish_time=dt(r.finish_time) if r.HasField("finish_time") else None,
                    worker_id=r.worker_id,
                    attempt=r.attempt,
                    next_attempt_time=(
                        dt(r.next_attempt_time) if r.HasField("next_attempt_time") else None
                    ),
                )
            )
    return out


def code_version() -> str:
    """The commit the fleet runs, and how many files of the product differ from it (the
    processes run this working tree, uncommitted changes included)."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "bucketer", "scheduler", "worker", "ops"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    return f"{head}" + (f" + {len(dirty)} uncommitted product files" if dirty else " (clean)")


def _wait(check: Callable[[], bool], timeout: float, poll: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def run_chaos(options: ChaosOptions) -> Report:
    """One whole chaos run; returns the report (also written to ``<out>/report.md``)."""
    began = time.monotonic()
    seed = options.seed if options.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    out = options.out_dir or Path(tempfile.mkdtemp(prefix="cronscale-chaos-"))
    logs, exec_dir = out / "logs", out / "exec"
    logs.mkdir(parents=True, exist_ok=True)
    exec_dir.mkdir(parents=True, exist_ok=True)
    version = code_version()
    logger.info("chaos run in %s (seed %d) on %s", out, seed, version)

    settings: LocalSettings | None = None
    token = uuid.uuid4().hex[:8]
    api_port = _free_port()
    overrides: dict[str, object] = {
        "keyspace": f"cs_chaos_{token}",
        "topic_prefix": f"cs-chaos-{token}.runs",
        "shard_count": options.shards,
        "topic_partitions": options.topic_partitions,
        "api_listen": f"127.0.0.1:{api_port}",
        "api_target": f"127.0.0.1:{api_port}",
    }
    if options.private_services:
        settings = private_settings(out / "local")
        overrides["cassandra_port"] = settings.cql_port
        overrides["kafka_bootstrap"] = f"{settings.host}:{settings.kafka_port}"
    config = test_config(**overrides)
    fleet: Fleet | None = None
    injector: FaultInjector | None = None
    try:
        if settings is not None:
            up(settings, out=lambda line: logger.info("%s", line))
        require_services(config)
        migrate(config, out=lambda _line: None)
        env = {
            "CRONSCALE_CASSANDRA_PORT": str(config.cassandra_port),
            "CRONSCALE_KAFKA_BOOTSTRAP": config.kafka_bootstrap,
            # The product's default, not the e2e tests' 3 s.
            "CRONSCALE_MISFIRE_THRESHOLD": "30",
            # Leases short enough to be exercised in a few minutes (a hanging handler, a worker
            # killed mid-run), long enough that a Kafka restart's backlog (~40 s of lag) is not
            # taken for lost runs (the e2e tests' 10 s would double every run it delays).
            "CRONSCALE_RUN_LEASE": "90",
            "CRONSCALE_HEARTBEAT_LEASE": "20",
        }
        fleet = start_fleet(config, logs, options, env)
        planned = plan_schedules(options, rng)
        register(fleet, planned, options, exec_dir)
        logger.info("registered %d schedules", len(planned))

        # Warm-up: every schedule has fired once.
        def warmed() -> bool:
            seen = {e.schedule_id for e in read_executions(exec_dir)[0]}
            return len(seen) >= len(planned)

        if not _wait(warmed, 60):
            raise RuntimeError(f"not every schedule executed within 60 s; logs in {logs}")
        chaos_start = time.monotonic()
        wall_start = datetime.now(UTC)
        window_start = wall_start.replace(microsecond=0) + timedelta(seconds=options.edge_s + 1)
        window_end = (wall_start + timedelta(seconds=options.duration_s - options.edge_s)).replace(
            microsecond=0
        )
        injector = FaultInjector(fleet, settings, options, rng)
        injector.run(plan_faults(options, rng, chaos_start), until=chaos_start + options.duration_s)
        logger.info("faults over; draining")

        ok_slots = {
            (s.schedule_id, t)
            for s in planned
            if s.handler == handlers.OK
            for t in expected_slots(s.cron, window_start, window_end)
        }

        def drained() -> bool:
            done = {(e.schedule_id, e.scheduled_for) for e in read_executions(exec_dir)[0]}
            return ok_slots <= done

        _wait(drained, options.drain_timeout_s, poll=2.0)
        # The stuck check covers every slot of the window.
        stuck_before = window_end
        _wait(
            lambda: datetime.now(UTC) >= window_end + timedelta(seconds=options.stuck_bound_s),
            options.stuck_bound_s + 5,
        )
        runs = read_runs(fleet, planned)
        # The always-failing runs of the window go through three attempts, each behind the
        # backlog the faults left, and one whose report a fault lost only after its lease: wait
        # (bounded) until none of them is still between attempts, then read the DLQ.
        hopeless = [s for s in planned if s.handler in (handlers.FAIL, handlers.HANG)]

        def settled() -> bool:
            runs_now = read_runs(fleet, hopeless)
            return all(
                r.status == "DEAD_LETTERED"
                for r in runs_now
                if window_start <= r.scheduled_for < window_end
            )

        _wait(settled, options.dlq_timeout_s, poll=5.0)
        letters = read_dead_letters(fleet, planned)
        final_runs = read_runs(fleet, hopeless)
        executions, bad = read_executions(exec_dir)
        report = build_report(
            schedules=planned,
            executions=executions,
            malformed_lines=bad,
            runs=runs,
            faults=sorted(injector.faults, key=lambda f: f.start),
            window_start=window_start,
            window_end=window_end,
            stuck_before=stuck_before,
            stuck_bound_s=options.stuck_bound_s,
            fault_grace_s=options.fault_grace_s,
            duration_s=time.monotonic() - began,
            letters=letters,
            max_attempts=HOPELESS_ATTEMPTS,
            final_runs=final_runs,
            workers={n: fleet.procs[n].pid for n in fleet.role("worker") if n in fleet.procs},
        )
        report.notes += injector.notes
        report.notes.append(
            f"code {version}; seed {seed}; artifacts (process logs, execution log) in {out}; "
            f"keyspace {config.keyspace}; workers "
            + ("static members" if options.static_workers else "dynamic members")
        )
        (out / "report.md").write_text(report.render())
        return report
    finally:
        if injector is not None:
            injector.resume_all()
        if fleet is not None:
            fleet.stop_all()
        if settings is not None:
            down(settings, out=lambda line: logger.info("%s", line))
            if not options.keep_data:
                for svc in ("cassandra", "kafka"):
                    shutil.rmtree(settings.data_dir(svc), ignore_errors=True)
        else:
            session = connect(config.cassandra_hosts, config.cassandra_port)
            try:
                session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=60)
            finally:
                session.cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos.harness", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--duration", type=parse_seconds, default=timedelta(minutes=10), help="e.g. 10m, 90s"
    )
    p.add_argument("--schedules", type=int, default=ChaosOptions.schedules)
    p.add_argument("--kill-every", type=float, default=ChaosOptions.kill_every_s, metavar="S")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", type=Path, help="artifacts folder (default: a new temp folder)")
    p.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the private Cassandra and Kafka data in the artifacts folder",
    )
    p.add_argument(
        "--shared-services",
        action="store_true",
        help="use the running local stack (own keyspace/topic); no Cassandra/Kafka restarts",
    )
    p.add_argument(
        "--dynamic-workers",
        action="store_true",
        help="workers join the consumer group as new members on every start (no static ids)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("cassandra").setLevel(logging.WARNING)
    options = ChaosOptions(
        duration_s=args.duration.total_seconds(),
        schedules=args.schedules,
        kill_every_s=args.kill_every,
        seed=args.seed,
        out_dir=args.out,
        keep_data=args.keep_data,
        private_services=not args.shared_services,
        restart_services=not args.shared_services,
        static_workers=not args.dynamic_workers,
    )
    report = run_chaos(options)
    sys.stdout.write(report.render())
    ok = not report.lost and not report.stuck and report.dlq.ok and not report.silent_workers
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
