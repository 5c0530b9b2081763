"""A dispatcher cut off from Kafka alone, staged: does it hand its shards over, and take them
back when Kafka returns?

Two dispatchers share 64 shards: one on this host, one on a simulated host (``loadtest.netns``)
that reaches Cassandra and Kafka through relays of its own. Once they have split the shards,
the simulated host's Kafka relay is stopped (Cassandra stays reachable, so its shard leases keep
renewing); it should step aside after ``CRONSCALE_KAFKA_STEP_ASIDE`` and its peer take every
shard. Then the relay is started again, and it should rejoin and get half back. Shard owners
are read from the ``shards`` table every half second; the report gives each phase's time.

    python -m loadtest.step_aside [--step-aside 20] [--firing 20] [--timeout 120]

With ``--firing`` schedules firing every second (no worker runs them: their messages stay in
Kafka), the cut-off dispatcher's batches fail and its producer is replaced, the path on which a
dispatcher aside must bring the producer back through its health probe alone.

Needs root (``ip netns``) and the local Cassandra and Kafka (``make services``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from cassandra.cluster import Session

from bucketer.cql import connect
from loadtest.firing import REPO, REPORTS, _free_port, _port_of, register
from loadtest.netns import SimulatedHost
from ops.migrate import migrate
from scheduler.config import Config
from scheduler.model import OverlapMode, SchedulePolicies, ScheduleSpec, SpecKind

SHARDS = 64
POLL_S = 0.5


def _owners(session: Session, keyspace: str) -> Counter[str]:
    """How many shards each dispatcher holds a live lease on, by the ``shards`` table."""
    now_ms = time.time() * 1000
    # One row per shard: the lease columns are static (the rows under them are checkpoints).
    rows = session.execute(f"SELECT DISTINCT shard, owner, lease_expires FROM {keyspace}.shards")
    return Counter(
        r.owner
        for r in rows
        if r.owner and r.lease_expires and r.lease_expires.timestamp() * 1000 > now_ms
    )


def _until(
    what: str,
    holds: Callable[[Counter[str]], bool],
    owners: Callable[[], Counter[str]],
    limit: float,
) -> float:
    """Seconds until ``holds(owners())``; exits the run with what was seen if ``limit`` passes."""
    start = time.monotonic()
    seen: Counter[str] = Counter()
    while time.monotonic() - start < limit:
        seen = owners()
        if holds(seen):
            return time.monotonic() - start
        time.sleep(POLL_S)
    raise SystemExit(f"not reached in {limit:g} s: {what} (owners: {dict(seen)})")


def _runs(session: Session, keyspace: str) -> int:
    return int(session.execute(f"SELECT COUNT(*) FROM {keyspace}.runs").one()[0])


def _wait_for_runs(session: Session, keyspace: str, limit: float) -> float:
    """Seconds until the first run row appears; exits the run if ``limit`` passes."""
    start = time.monotonic()
    while _runs(session, keyspace) == 0:
        if time.monotonic() - start > limit:
            raise SystemExit(f"no run recorded in {limit:g} s")
        time.sleep(1)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-aside", type=int, default=20, help="CRONSCALE_KAFKA_STEP_ASIDE, s")
    p.add_argument("--timeout", type=float, default=120.0, help="the longest wait of a phase, s")
    p.add_argument(
        "--firing",
        type=int,
        default=20,
        help="schedules firing every second (default 20), so the cut-off dispatcher has batches "
        "whose sends fail",
    )
    args = p.parse_args(argv)
    if args.step_aside < 1:
        p.error("--step-aside: must be at least 1")
    if args.firing < 0:
        p.error("--firing: must be 0 or more")
    token = uuid.uuid4().hex[:8]
    config = replace(
        Config.from_env(),
        keyspace=f"cs_aside_{token}",
        topic_prefix=f"cs-aside-{token}.runs",
        shard_count=SHARDS,
    )
    logs = REPORTS / f"logs-aside-{token}"
    logs.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "proto"))),
        "CRONSCALE_KEYSPACE": config.keyspace,
        "CRONSCALE_TOPIC_PREFIX": config.topic_prefix,
        "CRONSCALE_SHARDS": str(SHARDS),
        "CRONSCALE_KAFKA_STEP_ASIDE": str(args.step_aside),
        "CRONSCALE_REPAIR_INTERVAL": "0",
    }
    kafka_port = _port_of(config.kafka_bootstrap)
    host = SimulatedHost(f"cs-aside-{token}", 200, env=env, logs=logs)
    procs: list[subprocess.Popen[bytes]] = []
    session = connect(config.cassandra_hosts, config.cassandra_port)

    def start(name: str, wrap: Callable[[list[str]], list[str]]) -> None:
        argv = [sys.executable, "-m", "scheduler.cli", "dispatcher", "--log-level", "INFO"]
        with (logs / f"{name}.log").open("ab") as log:
            procs.append(
                subprocess.Popen(
                    wrap(argv),
                    env={
                        **env,
                        "CRONSCALE_INSTANCE_ID": name,
                        "CRONSCALE_METRICS_PORT": str(_free_port()),
                    },
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                )
            )

    try:
        migrate(config, out=lambda _line: None)
        if args.firing:
            # ALLOW: with no worker to end them, runs would hold their schedules' slots else.
            every_second = ScheduleSpec(kind=SpecKind.CRON, cron="* * * * * *")
            allow = SchedulePolicies(overlap=OverlapMode.ALLOW)
            asyncio.run(register(config, args.firing, every_second, allow))
        # Cassandra through one relay pair, Kafka through another that can be stopped alone.
        host.up([config.cassandra_port])
        kafka_relays = host.relay([kafka_port])
        start("here", lambda argv: argv)
        start("there", host.command)

        def owners() -> Counter[str]:
            return _owners(session, config.keyspace)

        split = _until(
            "both dispatchers hold shards",
            lambda o: o["here"] > 0 and o["there"] > 0 and sum(o.values()) == SHARDS,
            owners,
            args.timeout,
        )
        before = owners()
        print(f"split after {split:.1f} s: here {before['here']}, there {before['there']}")
        if args.firing:
            # The imported schedules start at the minute after next at the latest.
            waited = _wait_for_runs(session, config.keyspace, 150.0)
            print(f"firing {waited:.0f} s later")
        host.stop_relays(kafka_relays)
        cut = time.monotonic()
        aside = _until(
            "the cut-off one owns nothing", lambda o: o["there"] == 0, owners, args.timeout
        )
        _until("its peer owns every shard", lambda o: o["here"] == SHARDS, owners, args.timeout)
        print(
            f"Kafka cut for 'there' (Cassandra reachable): it owned none {aside:.1f} s after the "
            f"cut (step-aside {args.step_aside} s), its peer all {SHARDS} "
            f"{time.monotonic() - cut:.1f} s after the cut"
        )
        host.relay([kafka_port])
        back = _until(
            "the returned one holds shards again",
            lambda o: o["there"] > 0 and o["here"] < SHARDS and sum(o.values()) == SHARDS,
            owners,
            args.timeout,
        )
        after = owners()
        print(
            f"Kafka back for 'there': it held shards again {back:.1f} s later "
            f"(here {after['here']}, there {after['there']}); logs in {logs}"
        )
        print(f"runs recorded: {_runs(session, config.keyspace)}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        host.down()
        session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        session.cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
