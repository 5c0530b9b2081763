"""The firing-load harness: N schedules firing at a steady rate through the real stack.

    python -m loadtest.firing --rate 20000 --minutes 2

Registers ``rate`` schedules on ``* * * * *`` with a 60 s jitter window (each fires once a
minute at its own stable offset, so the load is ``rate`` firings per minute, spread evenly),
starts the real api, dispatcher(s) and worker(s) on the local Cassandra and Kafka, lets them
run for ``--minutes`` after a warm-up minute, and measures:

- fire lag (enqueue_time - scheduled_for) and start lag (start_time - scheduled_for) of every
  run of a sample of schedules inside the window, read back from the run history;
- firings in the window, from the dispatcher's ``cronscale_runs_enqueued_total``;
- CPU seconds of every process (dispatchers, workers, api, Cassandra, Kafka) from /proc, and
  so CPU milliseconds per firing.

Writes ``loadtest/reports/firing-<time>.md`` and a CSV of the sampled lags. Load stays on
loopback and stops after ``--minutes``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bucketer.cassandra import CassandraTimerStore
from bucketer.cql import connect
from ops.local import LocalSettings
from ops.migrate import migrate
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.config import Config
from scheduler.model import RunStatus, Schedule, ScheduleSpec, SpecKind, new_generation
from scheduler.slots import next_slot
from scheduler.timers import FireTimer

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "loadtest" / "reports"
_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _scrape(port: int, metric: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(metric) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def register(config: Config, count: int) -> tuple[list[str], float]:
    """Imports ``count`` schedules and their first timers; returns ids and schedules/s."""
    session = connect(config.cassandra_hosts, config.cassandra_port)
    try:
        schedules = CassandraScheduleStore(session, keyspace=config.keyspace)
        timers = CassandraTimerStore(
            session, keyspace=config.keyspace, shard_count=config.shard_count
        )
        now = datetime.now(UTC)
        spec = ScheduleSpec(kind=SpecKind.CRON, cron="* * * * *", jitter=timedelta(seconds=60))
        ids: list[str] = []
        started = time.perf_counter()
        for start in range(0, count, 5000):
            chunk = []
            fires = []
            for _ in range(min(5000, count - start)):
                s = Schedule(
                    schedule_id=f"load-{uuid.uuid4().hex[:16]}",
                    handler="echo",
                    spec=spec,
                    generation=new_generation(),
                    create_time=now,
                    update_time=now,
                )
                # Skip the current minute: every schedule starts at the next one.
                slot = next_slot(s, now + timedelta(seconds=60))
                assert slot is not None
                s = replace(s, next_fire_time=slot.at)
                chunk.append(s)
                fires.append(
                    FireTimer(
                        schedule_id=s.schedule_id,
                        generation=s.generation,
                        slot=slot.slot,
                        scheduled_for=slot.at,
                    ).to_timer(config.shard_count)
                )
            await timers.put(fires, now=now)
            await schedules.import_many(chunk)
            ids.extend(s.schedule_id for s in chunk)
        return ids, count / (time.perf_counter() - started)
    finally:
        session.cluster.shutdown()


async def sample_lags(
    config: Config, ids: list[str], lo: datetime, hi: datetime
) -> list[tuple[str, float, float | None]]:
    session = connect(config.cassandra_hosts, config.cassandra_port)
    try:
        runs = CassandraRunStore(session, CassandraScheduleStore(session, keyspace=config.keyspace))
        out: list[tuple[str, float, float | None]] = []
        for sid in ids:
            page, _ = await runs.list(sid, 100, "")
            for r in page:
                if not (lo <= r.scheduled_for < hi) or r.status is RunStatus.SKIPPED:
                    continue
                if r.enqueue_time is None:
                    continue
                fire = (r.enqueue_time - r.scheduled_for).total_seconds()
                start = (r.start_time - r.scheduled_for).total_seconds() if r.start_time else None
                out.append((r.run_id, fire, start))
        return out
    finally:
        session.cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.firing", description=__doc__.split("\n")[0]
    )
    p.add_argument("--rate", type=int, default=10_000, help="firings per minute (= schedules)")
    p.add_argument("--minutes", type=float, default=2.0, help="measured minutes after warm-up")
    p.add_argument("--dispatchers", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--sample", type=int, default=300, help="schedules whose runs are read back")
    args = p.parse_args(argv)

    token = uuid.uuid4().hex[:8]
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
    ids, reg_rate = asyncio.run(register(config, args.rate))
    print(f"registered {len(ids)} schedules at {reg_rate:,.0f}/s (direct import)")

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
    }
    logs = REPORTS / f"logs-{token}"
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    metric_ports: dict[str, int] = {}

    def start(name: str, *cmd: str) -> None:
        port = _free_port()
        metric_ports[name] = port
        with (logs / f"{name}.log").open("ab") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "scheduler.cli", *cmd],
                env={
                    **env,
                    "CRONSCALE_METRICS_PORT": str(port),
                    "CRONSCALE_INSTANCE_ID": f"{name}-{token}",
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )

    settings = LocalSettings.from_env()
    try:
        start("api", "api", "--log-level", "WARNING")
        for i in range(args.dispatchers):
            start(f"dispatcher{i}", "dispatcher", "--log-level", "WARNING")
        for i in range(args.workers):
            start(f"worker{i}", "worker", "--log-level", "WARNING")
        # Warm up: the first minute of slots, then measure whole minutes.
        now = datetime.now(UTC)
        lo = (now + timedelta(minutes=2)).replace(second=0, microsecond=0)
        hi = lo + timedelta(minutes=args.minutes)
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
        cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        fired0 = sum(
            _scrape(metric_ports[n], "cronscale_runs_enqueued_total")
            for n in procs
            if n.startswith("dispatcher")
        )
        wall0 = time.monotonic()
        time.sleep(max(0.0, (hi - datetime.now(UTC)).total_seconds()))
        wall = time.monotonic() - wall0
        cpu1 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        fired = (
            sum(
                _scrape(metric_ports[n], "cronscale_runs_enqueued_total")
                for n in procs
                if n.startswith("dispatcher")
            )
            - fired0
        )
        time.sleep(10)  # let the last runs of the window finish and report
        sample = random.sample(ids, min(args.sample, len(ids)))
        lags = asyncio.run(sample_lags(config, sample, lo, hi))
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        session = connect(config.cassandra_hosts, config.cassandra_port)
        session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        session.cluster.shutdown()

    cpu = {n: cpu1[n] - cpu0[n] for n in cpu1}
    fire = [f for _r, f, _s in lags]
    start_l = [s for _r, _f, s in lags if s is not None]
    per_firing = {n: 1000 * c / fired for n, c in cpu.items()} if fired else {}
    ours = sum(v for n, v in per_firing.items() if n not in ("cassandra", "kafka"))
    REPORTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with (REPORTS / f"firing-{stamp}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "fire_lag_s", "start_lag_s"])
        w.writerows(lags)
    lines = [
        f"# Firing load {stamp}",
        "",
        f"- target {args.rate:,} firings/min ({args.rate / 60:,.0f}/s); {args.dispatchers} "
        f"dispatcher(s), {args.workers} worker(s), {args.shards} shards; window "
        f"{lo:%H:%M:%S}-{hi:%H:%M:%S} UTC ({wall:.0f} s)",
        f"- fired {fired:,.0f} runs = {fired / wall * 60:,.0f}/min",
        f"- fire lag (enqueue - scheduled), {len(fire)} sampled runs: p50 {pct(fire, 0.5):.3f} s,"
        f" p99 {pct(fire, 0.99):.3f} s, max {max(fire, default=float('nan')):.3f} s",
        f"- start lag (worker start - scheduled): p50 {pct(start_l, 0.5):.3f} s, "
        f"p99 {pct(start_l, 0.99):.3f} s",
        f"- registration (direct import): {reg_rate:,.0f} schedules/s",
        "",
        "| process | CPU s | CPU ms per firing |",
        "| --- | --- | --- |",
        *(f"| {n} | {cpu[n]:.1f} | {per_firing.get(n, float('nan')):.3f} |" for n in sorted(cpu)),
        f"| **all cronscale processes** | | **{ours:.3f}** |",
        f"| **everything** | | **{sum(per_firing.values()):.3f}** |",
        "",
        f"mean fire lag {statistics.fmean(fire) if fire else float('nan'):.3f} s",
    ]
    report = "\n".join(lines) + "\n"
    (REPORTS / f"firing-{stamp}.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
