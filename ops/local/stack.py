"""``cronscale local up|down|status``: the local Cassandra + Kafka pair as one stack."""

from __future__ import annotations

import fcntl
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal

from ops.local import process
from ops.local.cassandra import CassandraService
from ops.local.errors import LocalStackError
from ops.local.kafka import KafkaService
from ops.local.maven import ResolveResult, lib_complete, resolve
from ops.local.prereqs import check_java, check_maven
from ops.local.process import PidRecord, StopOutcome
from ops.local.service import LocalService
from ops.local.settings import LocalSettings, PortSpec

logger = logging.getLogger(__name__)

Output = Callable[[str], object]
"""Where progress lines go: ``print`` for the CLI, ``list.append`` in tests."""

_POLL_INTERVAL_S: Final = 0.5
_LOG_TAIL_LINES: Final = 30
_PORT_RELEASE_WAIT_S: Final = 5.0


@dataclass(frozen=True, kw_only=True)
class ServiceUp:
    """One service after :func:`up`: answering clients on ``port``."""

    name: str
    pid: int
    port: int
    started: bool
    """True when this call launched the process, False when it was already running."""
    ready_after_s: float | None
    """Seconds from launch to first answer (None when it was already up)."""
    resolved: ResolveResult | None
    """The Maven resolution this call had to do, if any."""


@dataclass(frozen=True, kw_only=True)
class UpResult:
    """What :func:`up` found or did, one entry per service (cassandra, kafka)."""

    services: tuple[ServiceUp, ...]

    @property
    def started_any(self) -> bool:
        """Whether any service was launched by this call."""
        return any(service.started for service in self.services)

    def service(self, name: str) -> ServiceUp:
        """The entry of service ``name``."""
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)


@dataclass(frozen=True, kw_only=True)
class ServiceStop:
    """One service after :func:`down`."""

    name: str
    pid: int | None
    outcome: StopOutcome | Literal["not running", "stale pid file"]


@dataclass(frozen=True, kw_only=True)
class ServiceStatus:
    """One service as :func:`status` sees it; ``state`` is "up" only when it answers clients."""

    name: str
    state: Literal["up", "down"]
    pid: int | None
    port: int
    detail: str


def _services(settings: LocalSettings) -> list[LocalService]:
    # Cassandra first: it is the slow starter, so it boots while Kafka is being formatted.
    return [CassandraService(settings), KafkaService(settings)]


@contextmanager
def _stack_lock(settings: LocalSettings) -> Iterator[None]:
    """Serialise up/down on one home folder (``make test`` may run several at once)."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    with (settings.run_dir / "stack.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _recorded_pid(service: LocalService, out: Output | None) -> int | None:
    """The pid of this service's live server, cleaning a pid file that no longer applies."""
    record = process.read_pid_file(service.pid_file)
    if record is None:
        if service.pid_file.exists():
            process.remove_pid_file(service.pid_file)
        return None
    if process.owned_by_stack(record.pid, service.markers()):
        return record.pid
    process.remove_pid_file(service.pid_file)
    if out is not None:
        if process.is_running(record.pid):
            out(
                f"{service.name}: pid {record.pid} now belongs to another process; "
                "removed the stale pid file"
            )
        else:
            out(f"{service.name} was down (process {record.pid} exited); starting it again")
    return None


def check_ports(settings: LocalSettings, names: tuple[str, ...] | None = None) -> None:
    """Fail when a port of the named services (default: all) is held by another process.

    The message names the port and the variable that moves it, e.g. "port 9042 is already in
    use by another process; set CRONSCALE_LOCAL_CQL_PORT or stop it".
    """
    problems = [
        f"port {spec.port} is already in use by another process; set {spec.env} or stop it"
        for _service, spec in _held_ports(settings, names)
    ]
    if problems:
        raise LocalStackError("\n".join(problems))


def _held_ports(
    settings: LocalSettings, names: tuple[str, ...] | None = None
) -> list[tuple[LocalService, PortSpec]]:
    """The ports of the named services (default: all) that something listens on."""
    return [
        (service, spec)
        for service in _services(settings)
        if names is None or service.name in names
        for spec in service.ports()
        if process.port_in_use(settings.host, spec.port)
    ]


def up(settings: LocalSettings, out: Output = print) -> UpResult:
    """Make sure the local Cassandra and Kafka run and answer clients; idempotent.

    Services whose recorded process is alive and answering are left alone ("already up").
    Otherwise: check Java 17 (and Maven when a classpath must be resolved) and the ports,
    resolve missing classpaths from Maven Central, launch both JVMs, then wait until
    Cassandra answers ``SELECT release_version FROM system.local`` and Kafka answers a
    Metadata request. A service that exits or misses ``settings.start_timeout_s`` is stopped
    and reported in the :class:`LocalStackError`, with the tail of its log; the other one is
    still waited for and left running.
    """
    check_java(settings.java)
    with _stack_lock(settings):
        return _up_locked(settings, out)


@dataclass(kw_only=True)
class _Pending:
    service: LocalService
    pid: int
    since: float
    launched: bool
    resolved: ResolveResult | None = None


def _up_locked(settings: LocalSettings, out: Output) -> UpResult:
    results: dict[str, ServiceUp] = {}
    pending: list[_Pending] = []
    to_start: list[LocalService] = []
    for service in _services(settings):
        pid = _recorded_pid(service, out)
        if pid is None:
            to_start.append(service)
            continue
        if service.probe() is not None:
            out(f"{service.name} already up (pid {pid}, port {service.port})")
            results[service.name] = ServiceUp(
                name=service.name,
                pid=pid,
                port=service.port,
                started=False,
                ready_after_s=None,
                resolved=None,
            )
            continue
        out(f"{service.name} is running (pid {pid}) but not answering yet; waiting for it...")
        pending.append(_Pending(service=service, pid=pid, since=time.monotonic(), launched=False))

    if to_start:
        check_ports(settings, tuple(service.name for service in to_start))
        unresolved = [s for s in to_start if not lib_complete(s.lib_dir, s.main_jar)]
        if unresolved:
            check_maven(settings.mvn)
        resolutions = {service.name: _resolve(service, settings, out) for service in unresolved}
        for service in to_start:
            service.prepare()
            out(f"starting {service.name} {service.version} on {service.address}...")
            proc = process.launch(
                service.command(),
                log_path=service.console_log,
                cwd=settings.service_dir(service.name),
                timer_slack_ns=service.timer_slack_ns,
            )
            process.write_pid_file(service.pid_file, PidRecord(pid=proc.pid, port=service.port))
            logger.info("launched %s as pid %s", service.name, proc.pid)
            pending.append(
                _Pending(
                    service=service,
                    pid=proc.pid,
                    since=time.monotonic(),
                    launched=True,
                    resolved=resolutions.get(service.name),
                )
            )

    errors = _wait_ready(settings, pending, results, out)
    if errors:
        raise LocalStackError("\n\n".join(errors))
    return UpResult(services=tuple(results[s.name] for s in _services(settings)))


def _resolve(service: LocalService, settings: LocalSettings, out: Output) -> ResolveResult:
    out(f"resolving {service.name} {service.version} from Maven Central...")
    result = resolve(
        mvn=settings.mvn,
        pom=service.pom,
        version_property=service.version_property,
        version=service.version,
        lib_dir=service.lib_dir,
        main_jar=service.main_jar,
    )
    out(f"resolved in {result.seconds:.1f} s ({result.jars} jars)")
    return result


def _wait_ready(
    settings: LocalSettings,
    pending: list[_Pending],
    results: dict[str, ServiceUp],
    out: Output,
) -> list[str]:
    """Poll every pending service until it answers, exits, or times out; return the errors."""
    errors: list[str] = []
    while pending:
        for item in list(pending):
            service = item.service
            elapsed = time.monotonic() - item.since
            if not process.is_running(item.pid):
                pending.remove(item)
                process.remove_pid_file(service.pid_file)
                code = process.exit_code(item.pid)
                how = f"exit code {code}" if code is not None else f"pid {item.pid}"
                errors.append(
                    f"{service.name} exited during startup ({how}) after {elapsed:.1f} s; "
                    f"last log lines ({service.console_log}):\n{_log_tail(service)}"
                )
                continue
            if service.probe() is not None:
                pending.remove(item)
                out(f"{service.name} ready after {elapsed:.1f} s")
                results[service.name] = ServiceUp(
                    name=service.name,
                    pid=item.pid,
                    port=service.port,
                    started=item.launched,
                    ready_after_s=elapsed,
                    resolved=item.resolved,
                )
                continue
            if elapsed >= settings.start_timeout_s:
                pending.remove(item)
                # Read the log before stopping, so it shows the stuck state, not the shutdown.
                log_tail = _log_tail(service)
                process.stop([item.pid], timeout_s=settings.stop_timeout_s)
                process.remove_pid_file(service.pid_file)
                errors.append(
                    f"{service.name} did not become ready within "
                    f"{settings.start_timeout_s:.0f} s; last log lines "
                    f"({service.console_log}):\n{log_tail}"
                )
        if pending:
            time.sleep(_POLL_INTERVAL_S)
    return errors


def _log_tail(service: LocalService) -> str:
    return process.tail(service.console_log, _LOG_TAIL_LINES)


def down(settings: LocalSettings, out: Output = print) -> tuple[ServiceStop, ...]:
    """Stop the servers this stack started (by recorded pid) and remove their pid files.

    A pid is signalled only while its command line still carries this stack's markers, so a
    recycled pid is never touched. SIGTERM, up to ``settings.stop_timeout_s`` to exit, then
    SIGKILL. Idempotent: with nothing running it only reports that.
    """
    with _stack_lock(settings):
        stops: list[ServiceStop] = []
        signalled: list[tuple[LocalService, int, float]] = []
        for service in _services(settings):
            record = process.read_pid_file(service.pid_file)
            if record is None:
                process.remove_pid_file(service.pid_file)
                out(f"{service.name} is not running")
                stops.append(ServiceStop(name=service.name, pid=None, outcome="not running"))
            elif not process.owned_by_stack(record.pid, service.markers()):
                process.remove_pid_file(service.pid_file)
                if process.is_running(record.pid):
                    out(
                        f"{service.name}: pid {record.pid} is no longer ours; "
                        "removed the stale pid file without signalling it"
                    )
                    outcome: Literal["not running", "stale pid file"] = "stale pid file"
                else:
                    out(f"{service.name} was not running (process {record.pid} had exited)")
                    outcome = "not running"
                stops.append(ServiceStop(name=service.name, pid=record.pid, outcome=outcome))
            else:
                out(f"stopping {service.name} (pid {record.pid})...")
                signalled.append((service, record.pid, time.monotonic()))
        # Both servers get SIGTERM at once and drain in parallel.
        outcomes = process.stop([pid for _, pid, _ in signalled], timeout_s=settings.stop_timeout_s)
        for service, pid, started in signalled:
            process.remove_pid_file(service.pid_file)
            _wait_ports_released(settings, service)
            took = time.monotonic() - started
            verb = "killed" if outcomes[pid] == "killed" else "stopped"
            out(f"{verb} {service.name} (pid {pid}) in {took:.1f} s")
            stops.append(ServiceStop(name=service.name, pid=pid, outcome=outcomes[pid]))
        return tuple(stops)


def reset(settings: LocalSettings, out: Output = print) -> tuple[ServiceStop, ...]:
    """Stop the servers (as :func:`down`) and delete their data: every keyspace, table and row
    of Cassandra and every topic of Kafka. The fetched jars, the logs and Kafka's cluster id
    stay; the next ``up`` starts empty nodes (Kafka's storage formatted again), to be migrated.

    For a development node that has outlived thousands of test and benchmark keyspaces: their
    lightweight transactions' state stays in ``system.paxos`` for the tables' ``gc_grace_seconds``
    (10 days by default) after the keyspaces are dropped, and every flush of that table is
    compacted with all of it (``docs/operations/local-stack.md``).
    """
    stops = down(settings, out)
    with _stack_lock(settings):
        # A server this stack has no pid of (started by hand on this home?) may still be
        # writing there: its data is not deleted from under it.
        held = _held_ports(settings)
        if held:
            service, spec = held[0]
            raise LocalStackError(
                f"{service.name}'s port {spec.port} is still in use after stopping what "
                "this stack started; stop whatever holds it, then reset again"
            )
        for service in _services(settings):
            data = settings.data_dir(service.name)
            if not data.exists():
                out(f"{service.name} has no data to delete")
                continue
            size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
            shutil.rmtree(data)
            out(f"deleted {service.name}'s data ({size / 2**20:,.1f} MiB, {data})")
    return stops


def _wait_ports_released(settings: LocalSettings, service: LocalService) -> None:
    """Wait briefly until the kernel has let go of the ports of a server that just exited.

    Observed: Cassandra's JMX listener outlived the reaped JVM by a fraction of a second, so an
    ``up`` right after ``down`` would otherwise report its port as taken.
    """
    deadline = time.monotonic() + _PORT_RELEASE_WAIT_S
    while any(process.port_in_use(settings.host, spec.port) for spec in service.ports()):
        if time.monotonic() >= deadline:
            logger.warning("ports of %s still held after it exited", service.name)
            return
        time.sleep(0.1)


def status(settings: LocalSettings) -> list[ServiceStatus]:
    """Report each service: "up" (answers clients) or "down", with pid, port and a detail."""
    return [_service_status(service) for service in _services(settings)]


def _service_status(service: LocalService) -> ServiceStatus:
    record = process.read_pid_file(service.pid_file)
    if record is None:
        return ServiceStatus(
            name=service.name, state="down", pid=None, port=service.port, detail="not started"
        )
    pid, port = record.pid, record.port
    if not process.is_running(pid):
        detail = f"process {pid} exited"
    elif not process.owned_by_stack(pid, service.markers()):
        detail = f"stale pid file: pid {pid} belongs to another process"
    else:
        answer = service.probe()
        if answer is not None:
            return ServiceStatus(name=service.name, state="up", pid=pid, port=port, detail=answer)
        detail = f"process running but not answering on {service.address}"
    return ServiceStatus(name=service.name, state="down", pid=pid, port=port, detail=detail)


def format_status(statuses: list[ServiceStatus]) -> str:
    """Render :func:`status` as aligned lines for a terminal, one per service, e.g.::

    cassandra  up (release 5.0.8)          pid 4242   port 9042
    kafka      down (process 4243 exited)  pid 4243   port 9092
    """
    states = [f"{item.state} ({item.detail})" for item in statuses]
    width = max((len(state) for state in states), default=0)
    lines = []
    for item, state in zip(statuses, states, strict=True):
        pid = f"pid {item.pid}" if item.pid is not None else "-"
        lines.append(f"{item.name:<10} {state:<{width}}  {pid:<10} port {item.port}")
    return "\n".join(lines)
