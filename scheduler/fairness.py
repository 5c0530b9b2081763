"""Per-tenant enqueue quotas and tiers in the dispatcher (issue 9: one noisy tenant cannot
starve the others).

Each dispatcher keeps a token bucket per tenant holding its share of the tenant's enqueue rate:
the rate times the share of shards it owns (schedules spread over shards by hash, so a tenant's
firings do too). A due timer of a tenant whose bucket is empty is not fired now: it is put
again when the bucket will hold a token, its total deferral counted on the timer and recorded
on the run when it finally fires (``Run.deferred``). The token is booked ahead when the timer is
put off, so it fires without asking again, and a herd over the quota goes out at exactly the
rate. Nothing is dropped, and a deferred slot is never treated as a misfire: the quota, not the
fleet, held it back.

The max-concurrent-runs quota works the same way, per dispatcher at its share of the shards
(``ConcurrencyGate``): the runs it enqueued for a capped tenant count until their rows show an
outcome; a firing that would pass the cap is put off (a later timer, recorded as a deferral,
never dropped). Only capped tenants at their cap cost anything: one read per run in progress,
at most once per poll interval; no other firing reads or writes anything more.

A tenant under its rate is never held back by one over it: the over-quota tenant's excess costs
the dispatcher a timer write per deferral instead of a firing, so the other tenants' timers in
the same due second go out in the same pass. Limits come from a ``TenantDirectory`` (cached;
no read per firing); a tenant it does not know is unlimited, on the default tier.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bucketer.model import Timer
from scheduler.model import Run, RunStatus

logger = logging.getLogger(__name__)

DEFAULT_TIER = "standard"


@dataclass(frozen=True, kw_only=True)
class TenantLimits:
    """What the firing path enforces for one tenant."""

    tier: str = DEFAULT_TIER
    # Firings per second across the fleet; None: unlimited.
    enqueue_rate: float | None = None
    # Firings allowed at once above the rate (the bucket's size); None: one second's worth.
    burst: float | None = None
    # Runs of the tenant enqueued or running at once across the fleet; None: unlimited.
    max_concurrent: int | None = None


UNLIMITED = TenantLimits()


class TenantDirectory(Protocol):
    """Where the dispatcher learns tenants' tiers and quotas; implementations cache, since
    this is asked for every batch."""

    async def limits(self, tenants: Collection[str]) -> Mapping[str, TenantLimits]: ...


class Unlimited:
    """Every tenant unlimited, on the default tier (no tenant registry configured)."""

    async def limits(self, tenants: Collection[str]) -> Mapping[str, TenantLimits]:
        return {}


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class Throttle:
    """Token buckets per tenant, sized to this dispatcher's ``share`` (0..1] of each rate."""

    def __init__(
        self,
        share: Callable[[], float] = lambda: 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._share = share
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, tenant: str, limits: TenantLimits) -> float:
        """Takes a token for one firing of ``tenant``: 0.0 if it may fire now; else the token
        is booked ahead (the bucket goes into debt) and the answer is how many seconds from now
        it will have been earned: the firing is put off that long and then fires without asking
        again. A herd over the quota is so spread at exactly the rate."""
        if limits.enqueue_rate is None:
            return 0.0
        share = max(self._share(), 1e-6)
        rate = max(limits.enqueue_rate * share, 1e-9)
        size = max((limits.burst if limits.burst is not None else limits.enqueue_rate) * share, 1.0)
        now = self._clock()
        b = self._buckets.get(tenant)
        if b is None:
            b = self._buckets[tenant] = _Bucket(size, now)
        b.tokens = min(size, b.tokens + (now - b.stamp) * rate)
        b.stamp = now
        b.tokens -= 1.0
        return 0.0 if b.tokens >= 0.0 else -b.tokens / rate


class CachedDirectory:
    """A ``TenantDirectory`` over a slower source (the tenants table), each tenant's limits
    kept ``ttl`` seconds: a dispatcher asks the source at most once per tenant per ``ttl``,
    never per firing. A source that fails leaves the last known limits in force (or none)."""

    def __init__(
        self,
        fetch: Callable[[Collection[str]], Awaitable[Mapping[str, TenantLimits]]],
        *,
        ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._clock = clock
        self._known: dict[str, tuple[float, TenantLimits | None]] = {}

    async def limits(self, tenants: Collection[str]) -> Mapping[str, TenantLimits]:
        now = self._clock()
        stale = [t for t in tenants if t not in self._known or self._known[t][0] <= now]
        if stale:
            try:
                fresh = await self._fetch(stale)
            except Exception:
                logger.warning("reading tenant limits failed; keeping the last known")
            else:
                for t in stale:
                    self._known[t] = (now + self._ttl, fresh.get(t))
        out: dict[str, TenantLimits] = {}
        for t in tenants:
            known = self._known.get(t)
            if known is not None and known[1] is not None:
                out[t] = known[1]
        return out


class TenantLanes:
    """The wheel's lanes (bucketer.lanes) for the dispatcher: a timer's lane is its tenant,
    a tenant's weight its tier's (``CRONSCALE_TIER_WEIGHTS``). The order is used only when
    more firings are due than one round hands over, so a tenant with 100,000 schedules due at
    00:00 takes turns with one that has 10 instead of going first; but every timer's lane is
    worked out once, when it is read (the scanner keeps its pending timers in lines by lane,
    bucketer.pending): ~1 µs a timer, a regex over its data. The tier is the one last seen
    for the tenant in a batch (``learn``), the default tier before.
    """

    def __init__(self, weights: Mapping[str, int], lane_of: Callable[[Timer], str]) -> None:
        self._weights = dict(weights)
        self._lane_of = lane_of
        self._tiers: dict[str, str] = {}

    def learn(self, limits: Mapping[str, TenantLimits]) -> None:
        """Records the tiers of tenants a batch just looked up."""
        for tenant, known in limits.items():
            self._tiers[tenant] = known.tier

    def lane(self, timer: Timer) -> str:
        # Timers wait in a backlog for many rounds: each one's tenant is decoded once, and
        # kept with the timer (a cache of its own, bounded at 200,000, was emptied and
        # refilled every round under a herd of a million: most of a round was decoding).
        return timer.memo("lane", self._lane_of)

    def weight(self, lane: str) -> int:
        return self._weights.get(self._tiers.get(lane, DEFAULT_TIER), 1)


class RunReader(Protocol):
    """The run rows the concurrency gate checks (scheduler.stores.RunStore.get_many)."""

    async def get_many(self, run_ids: Sequence[str]) -> Mapping[str, Run]: ...


# Statuses of a run still in progress (it holds one of its tenant's concurrent-run places).
_IN_PROGRESS = (RunStatus.ENQUEUED, RunStatus.RUNNING)


class ConcurrencyGate:
    """``max_concurrent_runs`` per tenant in one dispatcher, at its ``share`` of the shards
    (rounded up: with several dispatchers the fleet may run up to one more per dispatcher).

    The dispatcher tells the gate each run it enqueues for a capped tenant (``started``); the
    run holds a place until its row shows it finished (any outcome, or a later attempt, which
    is enqueued, and counted, anew). The rows are read only for a tenant at its cap, at most
    once per ``poll`` seconds (``refresh``, before a batch is planned). A firing over the cap
    waits ``poll`` seconds, the k-th one of a pass over the cap ``poll * (1 + k // cap)``, so a
    herd is spread over the time the cap lets it through instead of re-put every poll. A row
    not found yet belongs to a batch still being written (or one that failed): it keeps its
    place for ``young`` seconds. Runs a previous shard owner enqueued are not known here: after
    a hand-over the tenant may briefly run more than its cap.
    """

    def __init__(
        self,
        runs: RunReader,
        *,
        share: Callable[[], float] = lambda: 1.0,
        poll: float = 1.0,
        young: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runs = runs
        self._share = share
        self._poll = poll
        self._young = young
        self._clock = clock
        # tenant -> run id -> (attempt, when the gate learnt of it)
        self._in_flight: dict[str, dict[str, tuple[int, float]]] = {}
        self._checked: dict[str, float] = {}
        self._over: dict[str, int] = {}

    def cap(self, limits: TenantLimits) -> int | None:
        """This dispatcher's share of the tenant's cap; None if it has none."""
        if not limits.max_concurrent:
            return None
        return max(1, math.ceil(limits.max_concurrent * max(self._share(), 0.0)))

    def in_flight(self, tenant: str) -> int:
        return len(self._in_flight.get(tenant, ()))

    async def refresh(self, limits: Mapping[str, TenantLimits]) -> None:
        """Before a pass: forgets the finished runs of the capped tenants at their cap (read at
        most once per poll each), and starts the pass's over-cap counts afresh."""
        self._over.clear()
        now = self._clock()
        due: list[str] = []
        for tenant, lim in limits.items():
            cap = self.cap(lim)
            if cap is None or self.in_flight(tenant) < cap:
                continue
            if now - self._checked.get(tenant, -math.inf) < self._poll:
                continue
            self._checked[tenant] = now
            due.append(tenant)
        if not due:
            return
        ids = [run_id for t in due for run_id in self._in_flight.get(t, {})]
        rows = await self._runs.get_many(ids)
        for tenant in due:
            runs = self._in_flight.get(tenant, {})
            for run_id, (attempt, learnt) in list(runs.items()):
                row = rows.get(run_id)
                if row is None:
                    if now - learnt >= self._young:
                        del runs[run_id]
                elif row.attempt > attempt or row.status not in _IN_PROGRESS:
                    del runs[run_id]

    def admit(self, tenant: str, limits: TenantLimits) -> float:
        """0.0 if ``tenant`` may have one more run in progress; else how long to put it off."""
        cap = self.cap(limits)
        if cap is None or self.in_flight(tenant) < cap:
            return 0.0
        k = self._over.get(tenant, 0)
        self._over[tenant] = k + 1
        return self._poll * (1 + k // cap)

    def started(self, tenant: str, run_id: str, attempt: int) -> None:
        """``run_id`` (at ``attempt``) was enqueued for ``tenant``: it holds a place."""
        self._in_flight.setdefault(tenant, {})[run_id] = (attempt, self._clock())
