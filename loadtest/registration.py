"""Bulk registration through the public API: `cronscale schedule import` of N schedules.

    python -m loadtest.registration --count 100000

Writes N schedules (every minute, a 60 s jitter window, ids chosen by the file) to a JSON-lines
file, starts a real api on a keyspace of its own, runs ``cronscale schedule import`` (the
BatchCreateSchedules RPC: batches of 500, 4 in flight) and reports schedules/s with the CPU
seconds of the api and Cassandra. Then imports the same file again: every line must come back
``already_existed`` (a retried import is safe). Load stays on loopback.

    python -m loadtest.registration --single 20000 --in-flight 64

registers through CreateSchedule instead, one schedule a call, ``--in-flight`` calls at once:
first with ids the server picks, then as many with ids the client chooses (the path that
must refuse a taken id), and reports each pass's schedules/s, call latency and CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bucketer.cql import connect
from cronscale.v1 import schedule_pb2
from cronscale.v1 import scheduler_service_pb2 as api_pb2
from cronscale.v1 import scheduler_service_pb2_grpc as api_grpc
from loadtest.figures import pct
from loadtest.firing import REPO, _free_port, _service_pid, cpu_seconds
from loadtest.table_ops import per_firing_ops, report_line, table_counts
from ops.local import LocalSettings
from ops.migrate import migrate
from scheduler.cli.client import open_channel
from scheduler.config import Config
from scheduler.credentials import ENV_API_KEY, fresh_keys_env


def _write_file(path: Path, count: int, token: str) -> None:
    with path.open("w") as f:
        for i in range(count):
            line = {
                "schedule_id": f"reg-{token}-{i}",
                "schedule": {
                    "name": f"registration {i}",
                    "handler": "echo",
                    "spec": {"cron": {"expression": "* * * * *"}, "jitter": "60s"},
                },
            }
            f.write(json.dumps(line) + "\n")


def _wait_serving(target: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit(f"the api at {target} did not become healthy in {timeout:.0f} s")


def _request(i: int, schedule_id: str) -> api_pb2.CreateScheduleRequest:
    return api_pb2.CreateScheduleRequest(
        schedule_id=schedule_id,
        schedule=schedule_pb2.Schedule(
            name=f"registration {i}",
            handler="echo",
            spec=schedule_pb2.ScheduleSpec(
                cron=schedule_pb2.CronSpec(expression="* * * * *"),
                jitter=Duration(seconds=60),
            ),
        ),
    )


async def _create_one_by_one(
    target: str, key: str, requests: list[api_pb2.CreateScheduleRequest], in_flight: int
) -> list[float]:
    """Sends every request as its own CreateSchedule call, ``in_flight`` at once; each call's
    seconds. A refused call stops the pass."""
    latencies: list[float] = []
    todo = iter(requests)
    async with open_channel(target, api_key=key) as channel:
        stub = api_grpc.SchedulerServiceStub(channel)

        async def caller() -> None:
            for req in todo:
                t0 = time.perf_counter()
                await stub.CreateSchedule(req, timeout=30)
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(caller() for _ in range(in_flight)))
    return latencies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.registration")
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument(
        "--single",
        type=int,
        default=0,
        metavar="N",
        help="N CreateSchedule calls (then N more with client-chosen ids) instead of the import",
    )
    p.add_argument("--in-flight", type=int, default=64, help="calls at once with --single")
    args = p.parse_args(argv)
    token = uuid.uuid4().hex[:8]
    port = _free_port()
    config = replace(
        Config.from_env(),
        keyspace=f"cs_reg_{token}",
        api_listen=f"127.0.0.1:{port}",
        api_target=f"127.0.0.1:{port}",
    )
    migrate(config, out=lambda _line: None)
    settings = LocalSettings.from_env()
    cassandra = _service_pid(settings, "cassandra")
    if cassandra is None:
        raise SystemExit("cannot find the local Cassandra's pid (is `cronscale local up` done?)")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "proto"))),
        "CRONSCALE_KEYSPACE": config.keyspace,
        "CRONSCALE_API": config.api_target,
        "CRONSCALE_API_LISTEN": config.api_listen,
        # A private API: its own admin key, presented by the import below.
        **fresh_keys_env(),
    }
    cli = [sys.executable, "-m", "scheduler.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "schedules.jsonl"
        if not args.single:
            _write_file(path, args.count, token)
        api = subprocess.Popen([*cli, "api", "--log-level", "WARNING"], env=env, cwd=REPO)
        try:
            _wait_serving(config.api_target)
            if args.single:
                return _single(args.single, args.in_flight, token, env, config, api.pid, cassandra)
            runs = []
            for attempt in ("first", "again"):
                cpu0 = (cpu_seconds(api.pid), cpu_seconds(cassandra))
                t0 = time.monotonic()
                out = subprocess.run(
                    [*cli, "schedule", "import", str(path), "--json", "--timeout", "120"],
                    env=env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                wall = time.monotonic() - t0
                cpu1 = (cpu_seconds(api.pid), cpu_seconds(cassandra))
                if out.returncode != 0:
                    raise SystemExit(f"import failed ({out.returncode}): {out.stderr[-2000:]}")
                summary = json.loads(out.stdout)
                runs.append((attempt, summary, wall, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]))
        finally:
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=30)
            session = connect(
                config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
            )
            session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
            session.cluster.shutdown()
    for attempt, summary, wall, api_cpu, cass_cpu in runs:
        print(
            f"{attempt}: {summary['lines']:,} lines in {wall:.1f} s = "
            f"{summary['lines'] / wall:,.0f} schedules/s (import {summary['seconds']:.1f} s); "
            f"created {summary['created']:,}, already existed {summary['already_existed']:,}, "
            f"refused {summary['refused']:,}; CPU s: api {api_cpu:.1f}, cassandra {cass_cpu:.1f}"
        )
    return 0


def _single(
    count: int,
    in_flight: int,
    token: str,
    env: dict[str, str],
    config: Config,
    api: int,
    cassandra: int,
) -> int:
    session = connect(
        config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
    )
    for label, ids in (("server-chosen ids", False), ("client-chosen ids", True)):
        requests = [_request(i, f"one-{token}-{i}" if ids else "") for i in range(count)]
        ops0 = table_counts(session, config.keyspace)
        cpu0 = (cpu_seconds(api), cpu_seconds(cassandra))
        t0 = time.monotonic()
        latencies = asyncio.run(
            _create_one_by_one(env["CRONSCALE_API"], env[ENV_API_KEY], requests, in_flight)
        )
        wall = time.monotonic() - t0
        api_cpu, cass_cpu = cpu_seconds(api) - cpu0[0], cpu_seconds(cassandra) - cpu0[1]
        print(
            f"CreateSchedule, {label}: {count:,} calls ({in_flight} in flight) in {wall:.1f} s = "
            f"{count / wall:,.0f} schedules/s; call p50 {pct(latencies, 0.5) * 1000:.1f} ms, "
            f"p99 {pct(latencies, 0.99) * 1000:.1f} ms; CPU s: api {api_cpu:.1f}, "
            f"cassandra {cass_cpu:.1f} ({(api_cpu + cass_cpu) / count * 1000:.3f} ms a schedule)"
        )
        per = per_firing_ops(ops0, table_counts(session, config.keyspace), count)
        print(report_line(per, unit="schedule"))
    session.cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
