"""The tenant quotas the API enforces: max schedules and max payload bytes.

(The enqueue-rate and concurrent-runs quotas act in the dispatcher's firing path.) A tenant
without a registry entry, or a quota of 0, is unlimited. The schedule count is a counter per
tenant (``tenant_usage``), read once per create call and moved by creates and deletes; two
creates racing for the last slot may both pass (the quota can be overshot by the calls in
flight at once), which keeps creating free of a lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler.cassandra_tenancy import CassandraTenantStore
from scheduler.errors import InvalidArgument, ResourceExhausted
from scheduler.tenancy import Tenant, TenantQuotas

QUOTA_CACHE_TTL_S = 10.0


class ApiQuotas:
    """Tenants' quotas (cached ``ttl`` seconds) and schedule counts."""

    def __init__(
        self,
        store: CassandraTenantStore,
        *,
        ttl: float = QUOTA_CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._clock = clock
        self._known: dict[str, tuple[float, Tenant | None]] = {}

    async def quotas(self, tenant: str) -> TenantQuotas:
        now = self._clock()
        known = self._known.get(tenant)
        if known is None or known[0] <= now:
            if len(self._known) > 10_000:
                self._known.clear()
            known = (now + self._ttl, await self._store.find(tenant))
            self._known[tenant] = known
        return known[1].quotas if known[1] is not None else TenantQuotas()

    async def usage(self, tenant: str) -> tuple[int, int] | None:
        """(max_schedules, schedules now) of ``tenant``; None when unlimited."""
        q = await self.quotas(tenant)
        if not q.max_schedules:
            return None
        return q.max_schedules, await self._store.schedule_count(tenant)

    async def check_room(self, tenant: str) -> None:
        """RESOURCE_EXHAUSTED naming the quota and the current use if ``tenant`` is full."""
        usage = await self.usage(tenant)
        if usage is not None and usage[1] >= usage[0]:
            raise full(tenant, *usage)

    async def check_payload(self, tenant: str, payload: bytes, field: str) -> None:
        q = await self.quotas(tenant)
        if q.max_payload_bytes and len(payload) > q.max_payload_bytes:
            raise InvalidArgument(
                field,
                f"is {len(payload)} bytes; tenant {tenant!r} has a max_payload_bytes quota "
                f"of {q.max_payload_bytes}",
            )

    async def counted(self, tenant: str, delta: int) -> None:
        await self._store.count_schedules(tenant, delta)


def full(tenant: str, limit: int, used: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"max_schedules: tenant {tenant!r} has {used} schedules; its quota is {limit}"
    )
