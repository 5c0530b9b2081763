"""Per-tenant token buckets: the rate, the burst, the booking of deferred firings, the share."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from bucketer.model import Timer
from scheduler.fairness import (
    CachedDirectory,
    ConcurrencyGate,
    TenantLanes,
    TenantLimits,
    Throttle,
)
from scheduler.model import Run, RunStatus
from scheduler.timers import FireTimer, RunTimer, tenant_of


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


class Rows:
    """Run rows as the gate reads them, set by the test."""

    def __init__(self) -> None:
        self.rows: dict[str, Run] = {}
        self.reads: list[list[str]] = []

    async def get_many(self, run_ids: Sequence[str]) -> Mapping[str, Run]:
        self.reads.append(list(run_ids))
        return {r: self.rows[r] for r in run_ids if r in self.rows}

    def set(self, run_id: str, status: RunStatus, attempt: int = 1) -> None:
        self.rows[run_id] = Run(
            run_id=run_id,
            schedule_id="s",
            scheduled_for=datetime(2026, 1, 1, tzinfo=UTC),
            status=status,
            attempt=attempt,
        )


CAPPED = TenantLimits(max_concurrent=3)


async def test_the_gate_holds_a_tenant_to_its_cap_until_runs_finish() -> None:
    clock, rows = Clock(), Rows()
    gate = ConcurrencyGate(rows, clock=clock)
    await gate.refresh({"t": CAPPED})
    for i in range(3):
        assert gate.admit("t", CAPPED) == 0.0
        gate.started("t", f"r{i}", 1)
        rows.set(f"r{i}", RunStatus.ENQUEUED)
    # Over the cap: put off, the herd spread one poll per cap's worth.
    assert [gate.admit("t", CAPPED) for _ in range(7)] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0]
    # Another tenant, or one without a cap, is not held back.
    assert gate.admit("u", CAPPED) == 0.0 and gate.admit("t", TenantLimits()) == 0.0

    await gate.refresh({"t": CAPPED})  # at the cap: the rows are read
    assert len(rows.reads) == 1 and gate.in_flight("t") == 3
    rows.set("r0", RunStatus.SUCCEEDED)
    rows.set("r1", RunStatus.RUNNING)
    rows.set("r2", RunStatus.FAILED)  # its retry is enqueued (and counted) anew
    await gate.refresh({"t": CAPPED})  # read again only once the poll is over
    assert len(rows.reads) == 1 and gate.in_flight("t") == 3
    clock.t += 1.0
    await gate.refresh({"t": CAPPED})
    assert sorted(rows.reads[1]) == ["r0", "r1", "r2"]
    assert gate.in_flight("t") == 1
    assert gate.admit("t", CAPPED) == 0.0


async def test_the_gate_reads_nothing_below_the_cap_and_forgets_runs_moved_on() -> None:
    clock, rows = Clock(), Rows()
    gate = ConcurrencyGate(rows, clock=clock, young=10.0)
    for i in range(3):
        gate.started("t", f"r{i}", 1)
    rows.set("r0", RunStatus.ENQUEUED, attempt=2)  # a later attempt: that one counts anew
    rows.set("r1", RunStatus.RUNNING)
    # r2 has no row yet: its batch may still be writing it.
    clock.t += 5.0
    await gate.refresh({"t": CAPPED})
    assert gate.in_flight("t") == 2
    clock.t += 6.0
    await gate.refresh({"t": CAPPED})
    assert gate.in_flight("t") == 2  # under the cap now: no read at all
    assert len(rows.reads) == 1
    gate.started("t", "r3", 1)
    rows.set("r3", RunStatus.RUNNING)
    await gate.refresh({"t": CAPPED})
    assert gate.in_flight("t") == 2  # r2 never showed up within `young`: forgotten


def test_a_dispatcher_gets_its_share_of_the_cap_rounded_up() -> None:
    gate = ConcurrencyGate(Rows(), share=lambda: 0.25)
    assert gate.cap(TenantLimits(max_concurrent=10)) == 3
    assert gate.cap(TenantLimits(max_concurrent=1)) == 1
    assert gate.cap(TenantLimits()) is None


def test_tenant_lanes_weigh_a_tenant_by_the_tier_last_seen_and_decode_once() -> None:
    calls: list[str] = []

    def lane_of(timer: Timer) -> str:
        calls.append(timer.timer_id)
        return tenant_of(timer)

    at = datetime(2026, 12, 3, tzinfo=UTC)
    timer = FireTimer(
        schedule_id="s1", generation=1, slot=at, scheduled_for=at, tenant="acme"
    ).to_timer(64)
    lanes = TenantLanes({"standard": 2, "premium": 4}, lane_of)
    assert lanes.lane(timer) == "acme" and lanes.lane(timer) == "acme" and len(calls) == 1
    assert lanes.weight("acme") == 2  # not seen yet: the default tier
    lanes.learn({"acme": TenantLimits(tier="premium")})
    assert lanes.weight("acme") == 4
    lanes.learn({"acme": TenantLimits(tier="free")})
    assert lanes.weight("acme") == 1  # a tier without a weight takes one turn


def test_fire_and_run_timers_carry_their_tenant_and_old_timers_have_none() -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)
    fire = FireTimer(schedule_id="s", generation=1, slot=at, scheduled_for=at, tenant="t1")
    run = RunTimer(schedule_id="s", run_id="r", scheduled_for=at, fire_at=at, tenant="t2")
    assert FireTimer.from_timer(fire.to_timer(8)).tenant == "t1"
    assert RunTimer.from_timer(run.to_timer(8)).tenant == "t2"
    assert [tenant_of(fire.to_timer(8)), tenant_of(run.to_timer(8))] == ["t1", "t2"]
    older = FireTimer(schedule_id="s", generation=1, slot=at, scheduled_for=at).to_timer(8)
    assert b'"t"' not in older.data and tenant_of(older) == ""


def test_a_tenant_is_read_without_decoding_unless_it_needs_unescaping() -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)
    for tenant in ("acme", "", 'quo"te', "back\\slash", "ünï", "a,b}c"):
        fire = FireTimer(schedule_id="s", generation=1, slot=at, scheduled_for=at, tenant=tenant)
        run = RunTimer(schedule_id="s", run_id="r", scheduled_for=at, fire_at=at, tenant=tenant)
        assert tenant_of(fire.to_timer(8)) == tenant
        assert tenant_of(run.to_timer(8)) == tenant
    # A document whose "t" is not the tenant key (inside another value) is decoded whole.
    odd = replace(
        FireTimer(schedule_id="s", generation=1, slot=at, scheduled_for=at).to_timer(8),
        data=b'{"v":1,"x":"{\\"t\\":\\"fake\\"}","t":"real"}',
    )
    assert tenant_of(odd) == "real"


def test_a_timers_lane_is_decoded_once_however_many_rounds_it_waits() -> None:
    calls: list[str] = []

    def lane_of(timer: Timer) -> str:
        calls.append(timer.timer_id)
        return tenant_of(timer)

    at = datetime(2026, 12, 3, tzinfo=UTC)
    timers = [
        FireTimer(
            schedule_id=f"s{i}", generation=1, slot=at, scheduled_for=at, tenant="a"
        ).to_timer(64)
        for i in range(10)
    ]
    lanes = TenantLanes({}, lane_of)
    for _round in range(3):
        assert {lanes.lane(t) for t in timers} == {"a"}
    assert len(calls) == 10
    # Kept with the timer object, not a field: an equal timer read again decodes afresh.
    again = replace(timers[0])
    assert again == timers[0] and lanes.lane(again) == "a" and len(calls) == 11
