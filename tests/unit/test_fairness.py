"""Per-tenant token buckets: the rate, the burst, the booking of deferred firings, the share."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from scheduler.fairness import CachedDirectory, TenantLimits, Throttle


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_unlimited_tenants_always_fire() -> None:
    throttle = Throttle(clock=Clock())
    assert all(throttle.admit("a", TenantLimits()) == 0.0 for _ in range(10_000))


def test_a_burst_fires_then_the_rest_is_spread_at_the_rate() -> None:
    clock = Clock()
    throttle = Throttle(clock=clock)
    limits = TenantLimits(enqueue_rate=10.0, burst=5.0)
    waits = [throttle.admit("noisy", limits) for _ in range(25)]
    assert waits[:5] == [0.0] * 5
    # The other 20 are booked a tenth of a second apart: 0.1 s, 0.2 s, ... 2.0 s.
    assert [round(w, 3) for w in waits[5:]] == [round(0.1 * i, 3) for i in range(1, 21)]
    # Another tenant is not affected by the first one's debt.
    assert throttle.admit("quiet", limits) == 0.0
    # After the debt is paid and the bucket refilled, the burst is back.
    clock.t += 2.0 + 0.5
    assert [throttle.admit("noisy", limits) for _ in range(5)] == [0.0] * 5
    assert throttle.admit("noisy", limits) > 0.0


def test_a_dispatcher_enforces_its_share_of_the_rate() -> None:
    clock = Clock()
    throttle = Throttle(share=lambda: 0.25, clock=clock)
    limits = TenantLimits(enqueue_rate=100.0, burst=100.0)
    admitted = sum(throttle.admit("t", limits) == 0.0 for _ in range(100))
    assert admitted == 25
    clock.t += 1.0
    # The next second's worth is 25 tokens, all booked already by the deferred ones.
    assert throttle.admit("t", limits) > 0.0


async def test_the_directory_cache_asks_the_source_once_per_tenant_per_ttl() -> None:
    clock = Clock()
    asked: list[list[str]] = []
    table = {"a": TenantLimits(tier="premium", enqueue_rate=5.0)}
    failing = False

    async def fetch(tenants: Collection[str]) -> Mapping[str, TenantLimits]:
        if failing:
            raise ConnectionError("Cassandra away")
        asked.append(sorted(tenants))
        return {t: table[t] for t in tenants if t in table}

    directory = CachedDirectory(fetch, ttl=10.0, clock=clock)
    assert await directory.limits({"a", "b"}) == {"a": table["a"]}
    assert await directory.limits({"a", "b"}) == {"a": table["a"]}
    assert asked == [["a", "b"]]
    clock.t += 11
    failing = True
    # The source is away: the last known limits stay in force.
    assert await directory.limits({"a"}) == {"a": table["a"]}
    failing = False
    table["a"] = TenantLimits(tier="free", enqueue_rate=1.0)
    clock.t += 11
    assert (await directory.limits({"a"}))["a"].tier == "free"
