"""Tenants: their tier and quotas, stored in ``tenants`` and read by dispatchers (through
``scheduler.fairness.CachedDirectory``) to enforce them in the firing path.

A schedule names its tenant in ``tenant``; a tenant without a row is unlimited, on the default
tier. Validation names the field: an unknown tier or a negative or non-finite quota is
INVALID_ARGUMENT and nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bucketer.cql import Queries, aexecute, execute_conditional, first
from scheduler.errors import AlreadyExists, InvalidArgument, NotFound
from scheduler.fairness import DEFAULT_TIER, TenantLimits
from scheduler.model import MAX_PAYLOAD_BYTES, aware, validate_schedule_id

# Far beyond what a 2-core box fires; a typo of extra zeros is refused.
MAX_RATE = 1_000_000.0


@dataclass(frozen=True, kw_only=True)
class Tenant:
    tenant_id: str
    tier: str = DEFAULT_TIER
    # 0: unlimited / the default.
    max_enqueue_rate: float = 0.0
    enqueue_burst: float = 0.0
    max_payload_bytes: int = 0
    create_time: datetime | None = None
    update_time: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Tenant:
        return cls(
            tenant_id=row.tenant_id,
            tier=row.tier or DEFAULT_TIER,
            max_enqueue_rate=row.max_enqueue_rate or 0.0,
            enqueue_burst=row.enqueue_burst or 0.0,
            max_payload_bytes=row.max_payload_bytes or 0,
            create_time=aware(row.create_time),
            update_time=aware(row.update_time),
        )

    @property
    def limits(self) -> TenantLimits:
        return TenantLimits(
            tier=self.tier,
            enqueue_rate=self.max_enqueue_rate or None,
            burst=self.enqueue_burst or None,
        )

    @property
    def payload_limit(self) -> int:
        return min(self.max_payload_bytes or MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES)


def validate_tenant(t: Tenant, tiers: Collection[str], field: str = "tenant") -> None:
    """Raises InvalidArgument naming the field of the first problem."""
    validate_schedule_id(t.tenant_id, f"{field}.id")
    if t.tier not in tiers:
        raise InvalidArgument(
            f"{field}.tier", f"unknown tier {t.tier!r}; the tiers are {', '.join(sorted(tiers))}"
        )
    for name, value, limit in (
        ("max_enqueue_rate", t.max_enqueue_rate, MAX_RATE),
        ("enqueue_burst", t.enqueue_burst, MAX_RATE),
    ):
        if not math.isfinite(value) or not 0 <= value <= limit:
            raise InvalidArgument(
                f"{field}.quotas.{name}", f"must be between 0 and {limit:,.0f}, got {value}"
            )
    if not 0 <= t.max_payload_bytes <= MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            f"{field}.quotas.max_payload_bytes",
            f"must be between 0 and {MAX_PAYLOAD_BYTES}, got {t.max_payload_bytes}",
        )


class CassandraTenantStore:
    """The ``tenants`` table."""

    def __init__(self, session: Session, *, keyspace: str) -> None:
        self._session = session
        self._q = Queries(session, Path(__file__).with_name("tenants.cql"), keyspace=keyspace)

    async def create(self, t: Tenant) -> None:
        applied, _ = await execute_conditional(
            self._session,
            self._q["insert_tenant"],
            (
                t.tenant_id,
                t.tier,
                t.max_enqueue_rate,
                t.enqueue_burst,
                t.max_payload_bytes,
                t.create_time,
                t.update_time,
            ),
        )
        if not applied:
            raise AlreadyExists(f"tenant {t.tenant_id!r} exists")

    async def update(self, t: Tenant) -> None:
        applied, _ = await execute_conditional(
            self._session,
            self._q["update_tenant"],
            (
                t.tier,
                t.max_enqueue_rate,
                t.enqueue_burst,
                t.max_payload_bytes,
                t.update_time,
                t.tenant_id,
            ),
        )
        if not applied:
            raise NotFound(f"tenant {t.tenant_id!r} not found")

    async def get(self, tenant_id: str) -> Tenant:
        row = first(await aexecute(self._session, self._q["get_tenant"], (tenant_id,)))
        if row is None:
            raise NotFound(f"tenant {tenant_id!r} not found")
        return Tenant.from_row(row)

    async def get_many(self, tenant_ids: Collection[str]) -> dict[str, Tenant]:
        ids = sorted(set(tenant_ids))
        out: dict[str, Tenant] = {}
        for start in range(0, len(ids), 100):
            rows = await aexecute(
                self._session, self._q["get_tenants"], (ids[start : start + 100],)
            )
            out.update((r.tenant_id, Tenant.from_row(r)) for r in rows)
        return out

    async def list(self) -> list[Tenant]:
        rows = await aexecute(self._session, self._q["list_tenants"])
        return sorted((Tenant.from_row(r) for r in rows), key=lambda t: t.tenant_id)

    async def delete(self, tenant_id: str) -> None:
        applied, _ = await execute_conditional(
            self._session, self._q["delete_tenant"], (tenant_id,)
        )
        if not applied:
            raise NotFound(f"tenant {tenant_id!r} not found")

    async def limits(self, tenant_ids: Collection[str]) -> Mapping[str, TenantLimits]:
        """What the firing path enforces, for the tenants that have a row."""
        return {t: tenant.limits for t, tenant in (await self.get_many(tenant_ids)).items()}
