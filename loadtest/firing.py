"""The firing-load harness: N schedules firing at a steady rate through the real stack.

    python -m loadtest.firing --rate 20000 --minutes 2

Registers ``rate`` schedules on ``* * * * *`` with a 60 s jitter window (each fires once a
minute at its own stable offset, so the load is ``rate`` firings per minute, spread evenly),
starts the real api, dispatcher(s) and worker(s) on the local Cassandra and Kafka, lets them
run for ``--minutes`` after a warm-up minute, and measures:

- from the handlers' own record (``loadtest.tally``, not the scheduler's bookkeeping): every
  slot due in the window that never ran (lost) or ran more than once (doubled), and the lag
  (handler start - scheduled_for) of every run; a slot that never ran but that the scheduler
  recorded as SKIPPED by its schedule's policy (a misfire) is counted apart, from its run row;
- firings in the window, from the dispatcher's ``cronscale_runs_enqueued_total``;
- CPU seconds of every process (dispatchers, workers, api, Cassandra, Kafka) from /proc, and
  so CPU milliseconds per firing.
- Cassandra's own count of its operations per firing, by table, and the node's compactions
  that ended in the window (loadtest.table_ops);
- Cassandra's and Kafka's CPU by thread (loadtest.threads: the collector's, the JIT's and the
  kernel's share, which a JVM's sampling profile does not see);
- the box's own speed beside the run: CPU time of a fixed workload (loadtest.canary);
- with ``--profile``, py-spy and JFR profiles of the window (loadtest.profiling).

Writes ``loadtest/reports/firing-<time>.md`` and a CSV of the lags. Load stays on
loopback and stops after ``--minutes``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from bucketer.cql import connect
from bucketer.model import Timer
from loadtest import figures
from loadtest.canary import DEFAULT_EVERY_S, read_samples, speed_between
from loadtest.figures import pct
from loadtest.netns import SimulatedHost
from loadtest.profiling import ProfilerMissing, WindowProfiler, find_jcmd, find_pyspy
from loadtest.table_ops import (
    Compactions,
    Counts,
    compactions_line,
    node_compactions,
    per_firing_ops,
    report_line,
    table_counts,
)
from loadtest.tally import ENV_DIR, Execution, read_tallies
from loadtest.threads import by_group, thread_cpu, thread_line
from ops.local import LocalSettings
from ops.migrate import migrate
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.config import Config
from scheduler.credentials import fresh_keys_env
from scheduler.kafka import delete_topics
from scheduler.model import (
    Run,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    new_generation,
    parse_run_id,
    run_id_for,
)
from scheduler.slots import next_slot
from scheduler.timers import FireTimer

REPO = Path(__file__).resolve().parents[1]
_T = TypeVar("_T")
REPORTS = REPO / "loadtest" / "reports"
_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_of(address: str) -> int:
    """The port of ``host:port`` (the first of a comma-separated list)."""
    return int(address.split(",")[0].rsplit(":", 1)[1])


def failover(
    timeline: list[tuple[float, float]], killed_at: float, *, late: float = 2.0
) -> dict[str, float]:
    """How the slots due from ``killed_at`` on fared after a host was lost: the longest lag,
    and how long after the kill the last slot later than ``late`` seconds started (the time
    until every shard fired on time again). ``timeline`` holds (scheduled, lag) in epoch
    seconds."""
    after = [(at, lag) for at, lag in timeline if at >= killed_at]
    slow = [at + lag for at, lag in after if lag > late]
    return {
        "slots_after_kill": float(len(after)),
        "max_lag_s": max((lag for _at, lag in after), default=math.nan),
        "recovered_after_s": (max(slow) - killed_at) if slow else 0.0,
    }


def herd_second(now: datetime, count: int) -> datetime:
    """When a one-off herd of ``count`` schedules is due: a whole minute after their import
    (at ~4,000/s, the harness's direct import on this box is faster) and the processes' start."""
    at = now + timedelta(seconds=count / 4000 + 150)
    return at.replace(second=0, microsecond=0) + timedelta(minutes=1)


def queue_wait(e: Execution, scheduled: float) -> float | None:
    """How long a run waited between its message's produce (its enqueue where the record's
    time is not known; its slot, if that came later) and its handler's start: the run queue's
    part of its lag (Kafka, the worker); the rest is the dispatcher's. None if the worker did
    not say when it was produced or enqueued."""
    sent = e.produced if e.produced is not None else e.enqueued
    return None if sent is None else e.started - max(sent, scheduled)


def account_herd(
    herd: list[Schedule], tally_dir: Path, due: datetime
) -> tuple[list[str], dict[str, int], list[float], list[float]]:
    """From the handlers' own record, the one-off herd due at ``due``: which slots never ran,
    which ran more than once, each one's start lag, and each one's wait after its enqueue."""
    expected = {run_id_for(s.schedule_id, due) for s in herd}
    counts: dict[str, int] = {}
    lags: list[float] = []
    waits: list[float] = []
    at = due.timestamp()
    for e in read_tallies(tally_dir):
        if e.run_id in expected:
            counts[e.run_id] = counts.get(e.run_id, 0) + 1
            if counts[e.run_id] == 1:
                lags.append(e.started - at)
                wait = queue_wait(e, at)
                if wait is not None:
                    waits.append(wait)
    lost = sorted(expected - counts.keys())
    return lost, {r: n for r, n in counts.items() if n > 1}, lags, waits


def herd_lines(
    at: datetime | None,
    count: int,
    lost: list[str],
    twice: dict[str, int],
    lags: list[float],
    timeline: list[tuple[float, float]],
    waits: Sequence[float] = (),
    queued: Sequence[tuple[float, float | None]] = (),
    skipped: Mapping[str, str] | None = None,
) -> list[str]:
    """The report's lines on a one-off herd: how it drained, and the lag of the other slots
    due while it drained; with ``waits`` (the herd's) and ``queued`` (the other slots'
    (scheduled, wait or None)), how much of it was spent after the produce."""
    if at is None:
        return []
    drained = max(lags, default=math.nan)
    t0 = at.timestamp()
    beside = [lag for due, lag in timeline if t0 <= due <= t0 + drained]
    beside_waits = [w for due, w in queued if w is not None and t0 <= due <= t0 + drained]
    return [
        f"- **herd of {count:,} due at {at:%H:%M:%S}**: "
        f"{count - len(lost) - len(skipped or {}):,} ran, "
        f"**{len(lost):,} lost**{skipped_text(skipped or {})}, "
        f"**{len(twice):,} ran more than once**; start lag p50 "
        f"{pct(lags, 0.5):.2f} s, p99 {pct(lags, 0.99):.2f} s, the last {drained:.1f} s after "
        f"the second ({count / drained if drained > 0 else math.nan:,.0f} herd firings/s)"
        + _after_produce(waits),
        f"- the {len(beside):,} other slots due while it drained: lag p50 "
        f"{pct(beside, 0.5):.2f} s, p99 {pct(beside, 0.99):.2f} s, max "
        f"{max(beside, default=math.nan):.2f} s" + _after_produce(beside_waits),
    ]


def skipped_text(skipped: Mapping[str, str]) -> str:
    """ ", N skipped by their schedules' policy (misfire: N; e.g. <run ids>)", or ""."""
    if not skipped:
        return ""
    reasons = Counter(skipped.values())
    by_reason = ", ".join(f"{why}: {n:,}" for why, n in sorted(reasons.items()))
    return (
        f", **{len(skipped):,} skipped by their schedules' policy** ({by_reason}; recorded as "
        f"SKIPPED runs, e.g. {', '.join(sorted(skipped)[:3])})"
    )


def _after_produce(waits: Sequence[float]) -> str:
    if not waits:
        return ""
    return (
        f"; of it after the produce (the run queue: Kafka and the worker) p50 "
        f"{pct(waits, 0.5):.2f} s, p99 {pct(waits, 0.99):.2f} s"
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _service_pid(settings: LocalSettings, name: str) -> int | None:
    try:
        return int(settings.pid_file(name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _unless_unread(what: str, read: Callable[[], _T]) -> _T | None:
    """``read()``, or None (said on stderr) if Cassandra cannot give ``what``: the report
    matters more than the one line of it that needs it."""
    try:
        return read()
    except Exception as e:
        print(f"could not read Cassandra's {what}: {e}", file=sys.stderr)
        return None


def _ops(session: Session, keyspace: str) -> Counts | None:
    """Cassandra's operation counts (None, said on stderr, if it cannot give them)."""
    return _unless_unread("operation counts", lambda: table_counts(session, keyspace))


def _compactions(session: Session, since: datetime, until: datetime) -> list[Compactions] | None:
    """The node's compactions that ended in the window (None, said on stderr, if unread)."""
    return _unless_unread("compaction history", lambda: node_compactions(session, since, until))


def _scrape(address: str, metric: str) -> float:
    """The sum of ``metric``'s samples at ``address`` (host:port of a /metrics endpoint)."""
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(metric) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def warm_window_start(schedules: list[Schedule], now: datetime) -> datetime:
    """The first whole minute after every schedule's first slot (and at least a minute from
    ``now``, for the processes to start): the window where each has fired once already."""
    first = max((s.next_fire_time for s in schedules if s.next_fire_time), default=now)
    start = first.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return max(start, (now + timedelta(minutes=2)).replace(second=0, microsecond=0))


def _cache_counts(addresses: list[str]) -> dict[str, float]:
    """The dispatchers' fire timers decided from their schedule cache and after a read, and
    the batches their firing logic was handed."""
    counts = {
        outcome: sum(
            _scrape(a, f'cronscale_schedule_cache_total{{outcome="{outcome}"}}') for a in addresses
        )
        for outcome in ("hit", "read")
    }
    counts["batches"] = sum(_scrape(a, "cronscale_firing_batch_timers_count") for a in addresses)
    return counts


SHAPES = {
    # Each schedule once a minute at its own stable offset: the load is spread evenly.
    "spread": ScheduleSpec(kind=SpecKind.CRON, cron="* * * * *", jitter=timedelta(seconds=60)),
    # Every schedule at second 0 of every minute: a :00 herd each minute.
    "herd": ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
}
# The --stored schedules: stored and live, due once a year (Jan 1 00:00 UTC), so never in a run.
STORED = ScheduleSpec(kind=SpecKind.CRON, cron="0 0 1 1 *")
STORED_CHUNK = 5000
# Seconds Cassandra and Kafka are measured alone before an idle run (--rate 0).
IDLE_BASELINE_S = 30.0
STORED_IN_FLIGHT = 4


def _import_stores(
    config: Config,
) -> tuple[Session, CassandraScheduleStore, CassandraTimerStore]:
    """A session of its own and the two stores a direct import writes (the caller shuts the
    session's cluster down)."""
    session = connect(
        config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
    )
    schedules = CassandraScheduleStore(session, keyspace=config.keyspace)
    timers = CassandraTimerStore(session, keyspace=config.keyspace, shard_count=config.shard_count)
    return session, schedules, timers


async def register_stored(config: Config, count: int) -> float:
    """Imports ``count`` schedules (and their first timers) that do not fire during the run,
    like :func:`register` but kept nowhere (10 million would not fit in this process);
    returns schedules/s. Chunks go in ``STORED_IN_FLIGHT`` at a time."""
    session, schedules, timers = _import_stores(config)
    try:
        now = datetime.now(UTC)
        started = time.perf_counter()
        gate = asyncio.Semaphore(STORED_IN_FLIGHT)

        async def chunk(n: int) -> None:
            rows, fires = [], []
            for _ in range(n):
                s, first = new_schedule("stored", STORED, now, now, config.shard_count)
                rows.append(s)
                fires.append(first)
            async with gate:
                await timers.put(fires, now=now)
                await schedules.create_unchecked(rows)

        done = 0
        step = STORED_CHUNK * STORED_IN_FLIGHT * 10
        for start in range(0, count, step):
            n = min(step, count - start)
            await asyncio.gather(
                *(chunk(min(STORED_CHUNK, n - i)) for i in range(0, n, STORED_CHUNK))
            )
            done += n
            rate = done / (time.perf_counter() - started)
            print(f"  stored {done:,} of {count:,} ({rate:,.0f}/s)", flush=True)
        return count / (time.perf_counter() - started)
    finally:
        session.cluster.shutdown()


def new_schedule(
    prefix: str,
    spec: ScheduleSpec,
    now: datetime,
    after: datetime,
    shard_count: int,
    policies: SchedulePolicies | None = None,
) -> tuple[Schedule, Timer]:
    """A load schedule (handler ``loadtest.tally``; ``policies``, else the defaults) with its
    first slot after ``after``, and that slot's fire timer."""
    s = Schedule(
        schedule_id=f"{prefix}-{uuid.uuid4().hex[:16]}",
        handler="loadtest.tally",
        spec=spec,
        policies=policies or SchedulePolicies(),
        generation=new_generation(),
        create_time=now,
        update_time=now,
    )
    slot = next_slot(s, after)
    assert slot is not None
    # Its tenant on it, as the API writes a first timer: the wheel's lanes are tenants, and a
    # timer without one would sit in a lane of its own (until 48f59b3 a one-off herd here was
    # in another lane than the spread schedules' later timers, as if of another tenant).
    first = FireTimer(
        schedule_id=s.schedule_id,
        generation=s.generation,
        slot=slot.slot,
        scheduled_for=slot.at,
        tenant=s.tenant,
    )
    return replace(s, next_fire_time=slot.at), first.to_timer(shard_count)


def _keyspace_bytes(settings: LocalSettings, keyspace: str) -> int:
    """Bytes on disk of ``keyspace``'s tables in the local Cassandra (SSTables, indexes;
    what its memtables hold is not counted)."""
    folder = settings.home / "cassandra" / "data" / "data" / keyspace
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _rss_mib(pid: int) -> float:
    """Resident memory of a live process, MiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def register(
    config: Config, count: int, spec: ScheduleSpec, policies: SchedulePolicies | None = None
) -> tuple[list[Schedule], float]:
    """Imports ``count`` schedules (``policies``, else the defaults) and their first timers;
    returns them and schedules/s."""
    session, schedules, timers = _import_stores(config)
    try:
        now = datetime.now(UTC)
        registered: list[Schedule] = []
        started = time.perf_counter()
        for start in range(0, count, 5000):
            chunk = []
            fires = []
            for _ in range(min(5000, count - start)):
                # Skip the current minute: every schedule starts at the next one.
                s, first = new_schedule(
                    "load", spec, now, now + timedelta(seconds=60), config.shard_count, policies
                )
                chunk.append(s)
                fires.append(first)
            await timers.put(fires, now=now)
            await schedules.create_unchecked(chunk)
            registered.extend(chunk)
        return registered, count / (time.perf_counter() - started)
    finally:
        session.cluster.shutdown()


# Slots no handler ran whose run rows the harness looks up; beyond this many (a run that
# lost far more than a few) the rest count as lost without a look.
MAX_LOOKED_UP = 10_000


def skipped_by_policy(unran: Sequence[str], runs: Mapping[str, Run]) -> dict[str, str]:
    """Of the slots no handler ran, those the scheduler recorded as SKIPPED (run id -> the
    skip reason: a misfire policy standing one run for missed slots, an overlap policy):
    the product's documented outcome, not lost. The rest, with no run row or another
    status, were lost."""
    return {
        run_id: runs[run_id].skip_reason or "unknown"
        for run_id in unran
        if run_id in runs and runs[run_id].status is RunStatus.SKIPPED
    }


async def recorded_runs(session: Session, keyspace: str, run_ids: Sequence[str]) -> dict[str, Run]:
    """The run rows of ``run_ids`` (the first ``MAX_LOOKED_UP``) in ``keyspace``, read 200 at
    a time."""
    store = CassandraRunStore(session, CassandraScheduleStore(session, keyspace=keyspace))
    found: dict[str, Run] = {}
    wanted = run_ids[:MAX_LOOKED_UP]
    for start in range(0, len(wanted), 200):
        found.update(await store.get_many(wanted[start : start + 200]))
    return found


def account(
    schedules: list[Schedule], tally_dir: Path, lo: datetime, hi: datetime
) -> tuple[
    int, list[str], dict[str, int], list[tuple[float, float]], list[tuple[float, float | None]]
]:
    """From the handlers' own record: the slots due in [lo, hi) (every schedule fires once a
    minute at its jitter offset), which of them never ran (lost), which ran more than once
    (run id -> executions), each run's scheduled time (epoch seconds) and start lag
    (handler start - scheduled_for), and each run's scheduled time and wait after its produce
    (``queue_wait``; None where not known), in the same order."""
    expected: set[str] = set()
    first_minute = lo.replace(second=0, microsecond=0) - timedelta(minutes=1)
    minutes = int((hi - first_minute).total_seconds() // 60) + 1
    for s in schedules:
        offset = s.slot_offset
        for m in range(minutes):
            at = first_minute + timedelta(minutes=m) + offset
            if lo <= at < hi:
                expected.add(run_id_for(s.schedule_id, at))
    counts: dict[str, int] = {}
    timeline: list[tuple[float, float]] = []
    queued: list[tuple[float, float | None]] = []
    for e in read_tallies(tally_dir):
        if e.run_id not in expected:
            continue
        counts[e.run_id] = counts.get(e.run_id, 0) + 1
        if counts[e.run_id] == 1:
            scheduled = parse_run_id(e.run_id).scheduled_for.timestamp()
            timeline.append((scheduled, e.started - scheduled))
            queued.append((scheduled, queue_wait(e, scheduled)))
    lost = sorted(expected - counts.keys())
    doubled = {r: n for r, n in counts.items() if n > 1}
    return len(expected), lost, doubled, timeline, queued


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs one benchmark (``argv`` as on the command line); returns the report's figures (what
    the JSON beside the report holds)."""
    p = argparse.ArgumentParser(
        prog="python -m loadtest.firing", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--rate",
        type=int,
        default=10_000,
        help="firings per minute (= schedules); 0: the idle cost, nothing due",
    )
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="spread",
        help="spread: each schedule at its own second; herd: all at second 0 of each minute",
    )
    p.add_argument("--minutes", type=float, default=2.0, help="measured minutes after warm-up")
    p.add_argument("--dispatchers", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument(
        "--drain", type=float, default=30.0, help="seconds to wait for the window's last runs"
    )
    p.add_argument(
        "--netns-pairs",
        type=int,
        default=0,
        help="more dispatcher + worker pairs, each on a simulated host of its own (a network "
        "namespace joined by a veth pair; loadtest.netns; needs root)",
    )
    p.add_argument(
        "--kill-netns-after",
        type=float,
        default=None,
        help="seconds into the window to SIGKILL the simulated hosts' processes (a host lost): "
        "the report gives the failover (how long their shards' slots waited)",
    )
    p.add_argument(
        "--herd-once",
        type=int,
        default=0,
        help="more schedules, all due in one second inside the window and not again (daily "
        "cron): how fast a herd of this size drains beside the --rate load",
    )
    p.add_argument(
        "--stored",
        type=int,
        default=0,
        help="more schedules stored beside the firing ones, due once a year (not in the run): "
        "the firing cost and lag among 10 million stored schedules",
    )
    p.add_argument(
        "--profile",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="profile the window's first SECONDS: py-spy of every Python process and JFR of "
        "Cassandra, into loadtest/reports/profile-<token>/ (loadtest.profiling; the profilers' "
        "own CPU makes the run's figures incomparable with an unprofiled run's)",
    )
    args = p.parse_args(argv)
    if args.rate < 0:
        p.error("--rate: must be 0 (idle) or more firings per minute")
    if args.herd_once < 0:
        p.error("--herd-once: must be 0 or more schedules")
    if args.netns_pairs < 0:
        p.error("--netns-pairs: must be 0 or more")
    if args.kill_netns_after is not None and (
        not args.netns_pairs or not 0 <= args.kill_netns_after < args.minutes * 60
    ):
        p.error("--kill-netns-after: needs --netns-pairs and a time within the window")
    if not 0 <= args.profile <= args.minutes * 60:
        p.error(f"--profile: must be between 0 and the window ({args.minutes * 60:g} s)")
    token = uuid.uuid4().hex[:8]
    profiler: WindowProfiler | None = None
    if args.profile:
        try:
            pyspy, jcmd = find_pyspy(), find_jcmd(LocalSettings.from_env().java)
        except ProfilerMissing as e:
            p.error(str(e))
        profiler = WindowProfiler(REPORTS / f"profile-{token}", args.profile, pyspy, jcmd)

    api_port = _free_port()
    base = Config.from_env()
    config = replace(
        base,
        keyspace=f"cs_bench_{token}",
        topic_prefix=f"cs-bench-{token}.runs",
        shard_count=args.shards,
        api_listen=f"127.0.0.1:{api_port}",
        api_target=f"127.0.0.1:{api_port}",
    )
    print(f"keyspace {config.keyspace}, {args.rate} schedules, {args.shards} shards")
    migrate(config, out=lambda _line: None)
    # The stored ones first: the firing schedules' first slots are the minute after they are
    # registered, which a long import would leave in the past.
    stored_rate = asyncio.run(register_stored(config, args.stored)) if args.stored else 0.0
    herd: list[Schedule] = []
    herd_at: datetime | None = None
    if args.herd_once:
        herd_at = herd_second(datetime.now(UTC), args.herd_once)
        daily = ScheduleSpec(kind=SpecKind.CRON, cron=f"0 {herd_at.minute} {herd_at.hour} * * *")
        herd, herd_rate = asyncio.run(register(config, args.herd_once, daily))
        print(f"registered a herd of {len(herd)} due at {herd_at:%H:%M:%S} ({herd_rate:,.0f}/s)")
    schedules, reg_rate = asyncio.run(register(config, args.rate, SHAPES[args.shape]))
    print(f"registered {len(schedules)} schedules at {reg_rate:,.0f}/s (direct import)")

    env = {
        **os.environ,
        # This checkout's code and generated stubs, not the installed ones: a benchmark can run
        # from a `git worktree` of any commit (before/after comparisons in one session).
        "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "proto"))),
        "CRONSCALE_KEYSPACE": config.keyspace,
        "CRONSCALE_TOPIC_PREFIX": config.topic_prefix,
        "CRONSCALE_API": config.api_target,
        "CRONSCALE_API_LISTEN": config.api_listen,
        "CRONSCALE_SHARDS": str(args.shards),
        "CRONSCALE_WORKER_CONCURRENCY": "256",
        # A private stack: its own admin and worker keys (the API requires them).
        **fresh_keys_env(),
    }
    logs = REPORTS / f"logs-{token}"
    logs.mkdir(parents=True, exist_ok=True)
    tally_dir = logs / "tally"
    env[ENV_DIR] = str(tally_dir)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    # Where each process serves /metrics (host:port).
    metric_at: dict[str, str] = {}
    hosts: list[SimulatedHost] = []
    # The processes on simulated hosts (killed with --kill-netns-after).
    remote: set[str] = set()

    def start(name: str, *cmd: str, host: SimulatedHost | None = None) -> None:
        port = _free_port()
        address = host.address if host else "127.0.0.1"
        metric_at[name] = f"{address}:{port}"
        argv = [sys.executable, "-m", "scheduler.cli", *cmd]
        with (logs / f"{name}.log").open("ab") as log:
            procs[name] = subprocess.Popen(
                host.command(argv) if host else argv,
                env={
                    **env,
                    "CRONSCALE_METRICS_PORT": str(port),
                    "CRONSCALE_METRICS_ADDR": address,
                    "CRONSCALE_INSTANCE_ID": f"{name}-{token}",
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        if host:
            remote.add(name)

    settings = LocalSettings.from_env()
    killed_at: float | None = None
    relay_cpu = 0.0
    # With nothing to fire (--rate 0), what Cassandra and Kafka cost on their own first.
    alone: dict[str, float] = {}
    if args.rate == 0:
        services = {svc: _service_pid(settings, svc) for svc in ("cassandra", "kafka")}
        before = {svc: cpu_seconds(pid) for svc, pid in services.items() if pid}
        time.sleep(IDLE_BASELINE_S)
        alone = {
            svc: (cpu_seconds(pid) - before[svc]) / IDLE_BASELINE_S
            for svc, pid in services.items()
            if pid
        }
    # The harness's own session: Cassandra's counters at both ends of the window, the run rows
    # of slots no handler ran, and the keyspace's drop at the end.
    cql: Session | None = None
    # The box's own speed through the run (loadtest.canary); not a measured process.
    canary_at = logs / "canary.txt"
    canary = subprocess.Popen(
        [sys.executable, "-m", "loadtest.canary", "--out", str(canary_at)],
        stdout=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        start("api", "api", "--log-level", "WARNING")
        for i in range(args.dispatchers):
            start(f"dispatcher{i}", "dispatcher", "--log-level", "WARNING")
        for i in range(args.workers):
            start(f"worker{i}", "worker", "--log-level", "WARNING", "--import", "loadtest.tally")
        for i in range(args.netns_pairs):
            host = SimulatedHost(f"cs-{token}-{i + 1}", i + 1, env=env, logs=logs)
            hosts.append(host)
            host.up([config.cassandra_port, _port_of(config.kafka_bootstrap), api_port])
            start(f"dispatcher-ns{i + 1}", "dispatcher", "--log-level", "WARNING", host=host)
            start(
                f"worker-ns{i + 1}",
                "worker",
                "--log-level",
                "WARNING",
                "--import",
                "loadtest.tally",
                host=host,
            )
        # Warm up: every schedule fires once before the window (the steady state of schedules
        # that fire every minute: a first firing reads a schedule no dispatcher has cached),
        # then measure whole minutes.
        lo = warm_window_start(schedules, datetime.now(UTC))
        if herd_at is not None:
            if herd_at < lo:
                raise SystemExit(
                    f"the herd came due at {herd_at:%H:%M:%S}, before the window could start "
                    f"({lo:%H:%M:%S}): the import was slower than herd_second assumes"
                )
            lo = max(lo, herd_at - timedelta(minutes=1))
        hi = lo + timedelta(minutes=args.minutes)
        cql = connect(
            config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
        )
        time.sleep(max(0.0, (lo - datetime.now(UTC)).total_seconds()))
        pids = {n: p.pid for n, p in procs.items()}
        for svc in ("cassandra", "kafka"):
            pid = _service_pid(settings, svc)
            if not pid:
                raise SystemExit(
                    f"cannot find the pid of the local {svc} under {settings.home}: its CPU "
                    "would be missing from the report (set CRONSCALE_LOCAL_HOME when running "
                    "from another checkout)"
                )
            pids[svc] = pid
        relays = [pid for h in hosts for pid in h.relay_pids]
        relay0 = sum(cpu_seconds(pid) for pid in relays)
        if profiler is not None:
            profiler.start(pids)
        # A killed process keeps the CPU and counts it had when it was killed.
        last_cpu = {n: cpu_seconds(pid) for n, pid in pids.items()}

        def cpu_now() -> dict[str, float]:
            for n, pid in pids.items():
                if n not in remote or killed_at is None:
                    last_cpu[n] = cpu_seconds(pid)
            return dict(last_cpu)

        dispatchers = [n for n in procs if n.startswith("dispatcher")]
        frozen: dict[str, tuple[float, dict[str, float]]] = {}

        def counts() -> tuple[float, dict[str, float]]:
            fired = 0.0
            cache = {"hit": 0.0, "read": 0.0, "batches": 0.0}
            for n in dispatchers:
                if n in frozen:
                    f, c = frozen[n]
                else:
                    f = _scrape(metric_at[n], "cronscale_runs_enqueued_total")
                    c = _cache_counts([metric_at[n]])
                fired += f
                cache = {k: v + c[k] for k, v in cache.items()}
            return fired, cache

        ops0 = _ops(cql, config.keyspace)  # Cassandra's own counts (loadtest.table_ops)
        measured_from = datetime.now(UTC)
        cpu0 = cpu_now()
        # The JVMs' CPU by thread (loadtest.threads): collector, JIT and kernel time included.
        threads0 = {svc: thread_cpu(pids[svc]) for svc in ("cassandra", "kafka")}
        fired0, cache0 = counts()
        wall0 = time.monotonic()
        # Every measured process's CPU once a second, for the figures.
        samples: list[tuple[float, dict[str, float]]] = [(time.time(), cpu0)]
        kill_at = (
            lo + timedelta(seconds=args.kill_netns_after)
            if args.kill_netns_after is not None
            else None
        )
        while (left := (hi - datetime.now(UTC)).total_seconds()) > 0:
            if kill_at is not None and killed_at is None and datetime.now(UTC) >= kill_at:
                for n in dispatchers:
                    if n in remote:
                        frozen[n] = (
                            _scrape(metric_at[n], "cronscale_runs_enqueued_total"),
                            _cache_counts([metric_at[n]]),
                        )
                cpu_now()
                for n in remote:
                    procs[n].kill()
                killed_at = time.time()
                print(f"killed the simulated hosts' processes at {datetime.now(UTC):%H:%M:%S}")
            time.sleep(min(1.0, left))
            samples.append((time.time(), cpu_now()))
        wall = time.monotonic() - wall0
        cpu1 = cpu_now()
        threads = {svc: by_group(t0, thread_cpu(pids[svc])) for svc, t0 in threads0.items()}
        profiled = profiler.finish() if profiler is not None else []
        relay_cpu = sum(cpu_seconds(pid) for pid in relays) - relay0
        rss = {n: _rss_mib(pid) for n, pid in pids.items() if killed_at is None or n not in remote}
        fired_at_end, cache_at_end = counts()
        ops1 = _ops(cql, config.keyspace)
        compacted = _compactions(cql, measured_from, datetime.now(UTC))
        fired = fired_at_end - fired0
        cache = {k: v - cache0[k] for k, v in cache_at_end.items()}
        # Let the window's last runs start (a backlog drains), then count from the handlers.
        deadline = time.monotonic() + args.drain
        expected, lost, doubled, timeline, queued = account(schedules, tally_dir, lo, hi)
        herd_lost, herd_twice, herd_lags, herd_waits = (
            account_herd(herd, tally_dir, herd_at) if herd_at else ([], {}, [], [])
        )
        while (lost or herd_lost) and time.monotonic() < deadline:
            time.sleep(2)
            expected, lost, doubled, timeline, queued = account(schedules, tally_dir, lo, hi)
            if herd_at:
                herd_lost, herd_twice, herd_lags, herd_waits = account_herd(
                    herd, tally_dir, herd_at
                )
        disk = _keyspace_bytes(settings, config.keyspace) if args.stored else 0
        # Slots that never ran may have been skipped by the schedule's own policy (a slot
        # later than the misfire threshold): the scheduler records those as SKIPPED runs.
        unran = [*lost, *herd_lost]
        runs: dict[str, Run] = {}
        try:
            runs = asyncio.run(recorded_runs(cql, config.keyspace, unran)) if unran else {}
        except Exception as e:  # the report matters more: they count as lost, unread
            print(f"could not read the run rows of {len(unran):,} slots: {e}", file=sys.stderr)
        skipped = skipped_by_policy(unran, runs)
        lost = [r for r in lost if r not in skipped]
        herd_skipped = {r: skipped[r] for r in herd_lost if r in skipped}
        herd_lost = [r for r in herd_lost if r not in skipped]
        window_skipped = {r: why for r, why in skipped.items() if r not in herd_skipped}
    finally:
        canary.kill()
        canary.wait()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for host in hosts:
            host.down()
        try:
            asyncio.run(
                delete_topics(
                    config.kafka_bootstrap, config.topic_prefix, security=config.kafka_security
                )
            )
        except Exception as e:  # the run's own outcome matters more than its clean-up
            print(f"could not delete the topics {config.topic_prefix}.*: {e}", file=sys.stderr)
        if cql is None:  # the run failed before the window
            cql = connect(
                config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
            )
        cql.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        cql.cluster.shutdown()

    cpu = {n: cpu1[n] - cpu0[n] for n in cpu1}
    canary_samples = read_samples(canary_at)
    speed = speed_between(canary_samples, lo.timestamp(), hi.timestamp())
    speed_before = speed_between(canary_samples, 0.0, lo.timestamp())
    table_ops = per_firing_ops(ops0, ops1, fired) if ops0 is not None and ops1 is not None else None
    lost_host = failover(timeline, killed_at) if killed_at is not None else None
    per_firing = {n: 1000 * c / fired for n, c in cpu.items()} if fired else {}
    ours = sum(v for n, v in per_firing.items() if n not in ("cassandra", "kafka"))
    REPORTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    lags = [lag for _scheduled, lag in timeline]
    waits = [wait for _scheduled, wait in queued if wait is not None]
    with (REPORTS / f"firing-{stamp}.csv").open("w", newline="") as f:
        csv.writer(f).writerows(
            [
                ("scheduled_for", "start_lag_s", "queue_s"),
                *(
                    (round(t, 3), round(x, 4), "" if w is None else round(w, 4))
                    for (t, x), (_t, w) in zip(timeline, queued, strict=True)
                ),
            ]
        )
    busy = sum(cpu.values()) / wall
    ours_busy = sum(c for n, c in cpu.items() if n not in ("cassandra", "kafka")) / wall
    lines = [
        f"# Firing load {stamp}",
        "",
        f"- shape {args.shape}: target {args.rate:,} firings/min ({args.rate / 60:,.0f}/s); "
        f"{args.dispatchers} "
        f"dispatcher(s), {args.workers} worker(s), {args.shards} shards; window "
        f"{lo:%H:%M:%S}-{hi:%H:%M:%S} UTC ({wall:.0f} s)",
        f"- fired {fired:,.0f} runs = {fired / wall * 60:,.0f}/min",
        f"- from the handlers: {expected:,} slots due in the window, "
        f"{expected - len(lost) - len(window_skipped):,} ran, **{len(lost):,} lost**"
        + (f" (e.g. {', '.join(lost[:3])})" if lost else "")
        + skipped_text(window_skipped)
        + f", **{len(doubled):,} ran more than once**",
        f"- lag (handler start - scheduled_for), all {len(lags):,} runs: p50 "
        f"{pct(lags, 0.5):.3f} s, p99 {pct(lags, 0.99):.3f} s, max "
        f"{max(lags, default=float('nan')):.3f} s, mean "
        f"{statistics.fmean(lags) if lags else float('nan'):.3f} s",
        *(
            [
                f"- of it, after the produce (the run queue: Kafka and the worker; the rest is "
                f"the dispatcher's): p50 {pct(waits, 0.5):.3f} s, p99 {pct(waits, 0.99):.3f} s"
            ]
            if waits
            else []
        ),
        *(
            [
                f"- {args.netns_pairs} more dispatcher + worker pair(s) on simulated hosts "
                "(network namespaces over veth pairs); their relays took "
                f"{relay_cpu:.1f} CPU s (not counted below)"
            ]
            if args.netns_pairs
            else []
        ),
        *(
            [
                f"- **host lost**: the simulated hosts' processes were SIGKILLed "
                f"{args.kill_netns_after:g} s into the window; of the "
                f"{lost_host['slots_after_kill']:,.0f} slots due after it the longest waited "
                f"{lost_host['max_lag_s']:.2f} s, and the last one later than 2 s started "
                f"{lost_host['recovered_after_s']:.1f} s after the kill"
            ]
            if lost_host is not None
            else []
        ),
        *(
            herd_lines(
                herd_at,
                len(herd),
                herd_lost,
                herd_twice,
                herd_lags,
                timeline,
                herd_waits,
                queued,
                skipped=herd_skipped,
            )
        ),
        f"- registration (direct import): {reg_rate:,.0f} schedules/s",
        *(
            [
                f"- stored beside them: {args.stored:,} schedules due once a year "
                f"(imported at {stored_rate:,.0f}/s); the keyspace's SSTables take "
                f"{disk / 2**30:.2f} GiB",
            ]
            if args.stored
            else []
        ),
        f"- fire timers decided from the dispatchers' schedule cache: {cache['hit']:,.0f}, "
        f"after reading their schedules: {cache['read']:,.0f}; firing batches "
        f"{cache['batches']:,.0f} ({fired / max(cache['batches'], 1):,.1f} runs each)",
        "- resident memory at the window's end: "
        + ", ".join(f"{n} {rss[n]:,.0f} MiB" for n in sorted(rss)),
        f"- the measured processes kept {busy:.0%} of one core busy on average",
        report_line(table_ops)
        if table_ops is not None
        else "- Cassandra's operation counts: unread",
        compactions_line(compacted, keyspace=config.keyspace)
        if compacted is not None
        else "- Cassandra's compactions: unread",
        thread_line("Cassandra", threads["cassandra"], fired),
        thread_line("Kafka", threads["kafka"], fired),
        f"- the box's speed (`loadtest.canary`: a fixed pure-Python unit every "
        f"{DEFAULT_EVERY_S:g} s, CPU µs a unit; higher is a slower box): median "
        f"{speed.median_us:,.0f}, p90 {speed.p90_us:,.0f} over the window's {speed.samples} "
        f"samples; median {speed_before.median_us:,.0f} before it (start-up, registration, "
        "warm-up)",
        *profiled,
        "",
        *(
            [
                "- idle (`--rate 0`): before any cronscale process started, over "
                f"{IDLE_BASELINE_S:g} s, "
                + ", ".join(f"{n} alone used {v:.1%} of a core" for n, v in sorted(alone.items()))
            ]
            if alone
            else []
        ),
        "",
        "| process | CPU s | % of a core | CPU ms per firing |",
        "| --- | --- | --- | --- |",
        *(
            f"| {n} | {cpu[n]:.1f} | {cpu[n] / wall:.1%} | {per_firing.get(n, float('nan')):.3f} |"
            for n in sorted(cpu)
        ),
        f"| **all cronscale processes** | | {ours_busy:.1%} | **{ours:.3f}** |",
        f"| **everything** | | {busy:.1%} | **{sum(per_firing.values()):.3f}** |",
    ]
    title = (
        f"{args.shape} {args.rate:,}/min, {args.dispatchers} dispatcher(s), {args.workers} "
        f"worker(s): {sum(per_firing.values()):.3f} CPU ms/firing, lag p99 {pct(lags, 0.99):.3f} s"
    )
    numbers: dict[str, Any] = {
        "title": title,
        "shape": args.shape,
        "rate_per_min": args.rate,
        "dispatchers": args.dispatchers,
        "workers": args.workers,
        "shards": args.shards,
        "window": [lo.isoformat(), hi.isoformat()],
        "wall_s": round(wall, 2),
        "fired": fired,
        "schedule_cache": cache,
        "expected": expected,
        "lost": len(lost),
        "skipped_by_policy": len(window_skipped),
        "ran_twice": len(doubled),
        "cassandra_ops_per_firing": table_ops,
        "canary_us": {
            "window": {"samples": speed.samples, "median": speed.median_us, "p90": speed.p90_us},
            "before": {"samples": speed_before.samples, "median": speed_before.median_us},
        },
        "canary_by_s": [
            {"t": round(at - lo.timestamp(), 2), "us": us} for at, us in canary_samples
        ],
        "cassandra_compactions": (
            [{"table": c.table, "count": c.count, "bytes_in": c.bytes_in} for c in compacted]
            if compacted is not None
            else None
        ),
        "lag_s": {
            "p50": pct(lags, 0.5),
            "p99": pct(lags, 0.99),
            "max": max(lags, default=math.nan),
        },
        "after_enqueue_s": {"p50": pct(waits, 0.5), "p99": pct(waits, 0.99)},
        "cpu_s": cpu,
        "cpu_s_by_thread": {
            svc: {g: {"user": round(c.user, 2), "system": round(c.system, 2)} for g, c in t.items()}
            for svc, t in threads.items()
        },
        "cpu_ms_per_firing": per_firing,
        "cpu_ms_per_firing_total": sum(per_firing.values()),
        "registration_per_s": reg_rate,
        "stored": args.stored,
        "stored_disk_bytes": disk,
        "rss_mib": rss,
        "busy_cores": round(busy, 3),
        "netns_pairs": args.netns_pairs,
        "relay_cpu_s": round(relay_cpu, 2),
        "host_lost": lost_host,
        "herd_once": {
            "count": len(herd),
            "due": herd_at.isoformat() if herd_at else None,
            "lost": len(herd_lost),
            "skipped_by_policy": len(herd_skipped),
            "ran_twice": len(herd_twice),
            "lag_s": {
                "p50": pct(herd_lags, 0.5),
                "p99": pct(herd_lags, 0.99),
                "max": max(herd_lags, default=math.nan),
            },
            "after_enqueue_s": {"p50": pct(herd_waits, 0.5), "p99": pct(herd_waits, 0.99)},
        },
    }
    json_path, png_path = figures.write(
        REPORTS / f"firing-{stamp}",
        numbers,
        timeline,
        samples,
        lo.timestamp(),
    )
    lines.append(f"- figures: {png_path.name}, numbers: {json_path.name}")
    report = "\n".join(lines) + "\n"
    (REPORTS / f"firing-{stamp}.md").write_text(report)
    print(report)
    return numbers


if __name__ == "__main__":
    raise SystemExit(main())
