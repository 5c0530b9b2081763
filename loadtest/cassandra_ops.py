"""What one operation of the firing path costs Cassandra, measured in isolation.

    python -m loadtest.cassandra_ops --schedules 20000 --ops 30000

Imports ``--schedules`` schedules into a keyspace of its own, then runs ``--ops`` operations of
each kind the firing path does, through the stores' own code (multi-partition schedule reads of
500 ids, grouped writes), and prints Cassandra's CPU per operation from /proc (the local stack's
Cassandra: run ``cronscale local up`` first). Nothing else may load the machine meanwhile. The
keyspace is dropped at the end. Figures from 2026-12-04 are in ``loadtest/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from loadtest.firing import _service_pid, cpu_seconds
from ops.local import LocalSettings
from ops.migrate import migrate
from scheduler.config import Config
from scheduler.model import (
    Run,
    RunStatus,
    Schedule,
    ScheduleSpec,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.session import Stores, open_stores
from scheduler.timers import FireTimer

CHUNK = 500


async def _measure(
    name: str, op: Callable[[int], Awaitable[None]], total: int, cassandra_pid: int
) -> None:
    cpu0, wall0 = cpu_seconds(cassandra_pid), time.perf_counter()
    for done in range(0, total, CHUNK):
        await op(done)
    cpu = cpu_seconds(cassandra_pid) - cpu0
    wall = time.perf_counter() - wall0
    print(f"{name:32} {total:7,} in {wall:5.1f} s: Cassandra {1e6 * cpu / total:6.1f} µs each")


async def _run(config: Config, count: int, total: int, cassandra_pid: int) -> None:
    stores: Stores = await open_stores(config)
    try:
        now = datetime.now(UTC)
        spec = ScheduleSpec(kind=SpecKind.CRON, cron="* * * * *", jitter=timedelta(seconds=60))
        ids = [f"ops-{uuid.uuid4().hex[:16]}" for _ in range(count)]
        for start in range(0, count, 2000):
            await stores.schedules.create_unchecked(
                [
                    Schedule(
                        schedule_id=sid,
                        handler="loadtest.tally",
                        spec=spec,
                        generation=new_generation(),
                        create_time=now,
                        update_time=now,
                    )
                    for sid in ids[start : start + 2000]
                ]
            )

        def chunk(i: int) -> list[str]:
            return [ids[(i + k) % count] for k in range(CHUNK)]

        async def read_schedules(i: int) -> None:
            await stores.schedules.get_many(chunk(i))

        async def insert_runs(i: int) -> None:
            runs = [
                Run(
                    run_id=run_id_for(sid, now + timedelta(seconds=i + k)),
                    schedule_id=sid,
                    scheduled_for=now + timedelta(seconds=i + k),
                    status=RunStatus.ENQUEUED,
                    handler="loadtest.tally",
                    tenant="default",
                    enqueue_time=now,
                )
                for k, sid in enumerate(chunk(i))
            ]
            await stores.runs.write(stores.runs.insert_rows(runs))

        async def mark_active(i: int) -> None:
            at = datetime.now(UTC)
            await stores.runs.write(
                [stores.schedules.mark_active(sid, f"{sid}@{i}", at) for sid in chunk(i)]
            )

        async def put_fire_timers(i: int) -> None:
            shards = stores.timers.shard_count
            timers = [
                FireTimer(
                    schedule_id=sid,
                    generation=1,
                    slot=now + timedelta(seconds=60 + (i + k) % 60),
                    scheduled_for=now + timedelta(seconds=60 + (i + k) % 60),
                ).to_timer(shards)
                for k, sid in enumerate(chunk(i))
            ]
            await stores.runs.write(stores.timers.rows(timers, now=now))

        await _measure("schedule reads (500 per query)", read_schedules, total, cassandra_pid)
        await _measure("run rows (grouped writes)", insert_runs, total, cassandra_pid)
        await _measure("overlap cells (grouped writes)", mark_active, total, cassandra_pid)
        await _measure("fire timers (grouped writes)", put_fire_timers, total, cassandra_pid)
    finally:
        stores.session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        stores.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.cassandra_ops", description=__doc__.split("\n")[0]
    )
    p.add_argument("--schedules", type=int, default=20_000)
    p.add_argument("--ops", type=int, default=30_000, help="operations of each kind")
    args = p.parse_args(argv)
    pid = _service_pid(LocalSettings.from_env(), "cassandra")
    if pid is None:
        raise SystemExit("no local Cassandra found: start it with `cronscale local up`")
    config = replace(Config.from_env(), keyspace=f"cs_ops_{uuid.uuid4().hex[:8]}")
    migrate(config, out=lambda _line: None)
    asyncio.run(_run(config, args.schedules, args.ops, pid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
