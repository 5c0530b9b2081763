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


async def test_how_long_a_dependency_has_been_down_counts_from_its_first_failed_probe() -> None:
    """What a dispatcher asks before stepping aside (``down_for``): a dependency failing every
    round since a given time; one answer starts it over, and a round that stopped at an
    earlier failure tells nothing new of it."""
    down: set[str] = set()

    def probe(name: str) -> Probe:
        async def check() -> None:
            if name in down:
                raise ConnectionError(f"{name} refused")

        return check

    async def publish(_ok: bool) -> None:
        return None

    guard = ClockGuard(tolerance=timedelta(milliseconds=500))
    readiness = Readiness([("Cassandra", probe("c")), ("Kafka", probe("k"))], guard, publish)
    await readiness.probe()
    assert readiness.down_for("Kafka", timedelta(0)) == ""
    down.add("k")
    await readiness.probe()
    reason = "Kafka does not answer: ConnectionError: k refused"
    assert readiness.down_for("Kafka", timedelta(0)) == reason
    assert readiness.down_for("Kafka", timedelta(minutes=1)) == ""
    down.add("c")  # Kafka is not probed this round: it stays down since its first failure
    await readiness.probe()
    assert readiness.down_for("Kafka", timedelta(0)) == reason
    down.clear()
    await readiness.probe()
    assert readiness.down_for("Kafka", timedelta(0)) == ""
    assert readiness.down_for("Cassandra", timedelta(0)) == ""
