"""An API replica's readiness against the real Cassandra: SERVING while it answers, NOT_SERVING
with the reason when it does not (here: the replica's connection is gone), back by itself."""

from __future__ import annotations

from datetime import timedelta

from bucketer.clock import ClockGuard
from bucketer.cql import connect
from scheduler.config import Config
from scheduler.health import Readiness, cassandra_probe


async def test_readiness_follows_cassandra_and_the_clock(migrated: Config) -> None:
    verdicts: list[bool] = []

    async def publish(ok: bool) -> None:
        verdicts.append(ok)

    session = connect(migrated.cassandra_hosts, migrated.cassandra_port)
    guard = ClockGuard(tolerance=timedelta(milliseconds=500))
    readiness = Readiness([("Cassandra", cassandra_probe(session))], guard, publish)
    assert await readiness.probe() is True
    guard.record(timedelta(seconds=3))  # this clock 3 s behind the cluster's
    assert await readiness.probe() is False and "behind the cluster" in readiness.reason
    guard.record(timedelta(0))
    assert await readiness.probe() is True
    session.cluster.shutdown()  # Cassandra out of reach
    assert await readiness.probe() is False
    assert readiness.reason.startswith("Cassandra does not answer")
    assert verdicts == [True, False, True, False]
