"""Readiness (scheduler.health) over several dependencies: the first that fails names the
reason, the clock guard counts too, and only changes of the verdict are published."""

from __future__ import annotations

from datetime import timedelta

from bucketer.clock import ClockGuard
from scheduler.health import Probe, Readiness


async def test_the_first_failing_dependency_is_the_reason_and_changes_are_published() -> None:
    down: set[str] = set()
    verdicts: list[bool] = []

    def probe(name: str) -> Probe:
        async def check() -> None:
            if name in down:
                raise ConnectionError(f"{name} refused")

        return check

    async def publish(ok: bool) -> None:
        verdicts.append(ok)

    guard = ClockGuard(tolerance=timedelta(milliseconds=500))
    readiness = Readiness([("Cassandra", probe("c")), ("Kafka", probe("k"))], guard, publish)
    assert await readiness.probe() is True
    down.add("k")
    assert await readiness.probe() is False
    assert readiness.reason == "Kafka does not answer: ConnectionError: k refused"
    down.add("c")
    assert await readiness.probe() is False
    assert readiness.reason == "Cassandra does not answer: ConnectionError: c refused"
    down.clear()
    guard.record(timedelta(seconds=3))
    assert await readiness.probe() is False and "behind the cluster" in readiness.reason
    guard.record(timedelta(0))
    assert await readiness.probe() is True
    assert verdicts == [True, False, True]
