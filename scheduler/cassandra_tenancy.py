"""The Cassandra backend of tenants, API keys and per-tenant schedule counts."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bucketer.cql import Queries, aeach_page, aexecute, aexecute_all, execute_conditional, first
from scheduler.errors import AlreadyExists, NotFound
from scheduler.fairness import TenantLimits
from scheduler.tenancy import ApiKey, Tenant

# Admin and worker keys are listed under this id in api_keys_by_tenant (no tenant id has a *).
NO_TENANT = "*"
# Rows a page of a recount's read of a tenant's schedules.
RECOUNT_PAGE = 5_000


class CassandraTenantStore:
    """Tenants by id, API keys by key id, and how many schedules each tenant has."""

    def __init__(self, session: Session, *, keyspace: str) -> None:
        self._session = session
        self.q = Queries(session, Path(__file__).with_name("tenancy.cql"), keyspace=keyspace)

    async def create(self, t: Tenant) -> None:
        q = t.quotas
        applied, _ = await execute_conditional(
            self._session,
            self.q["insert_tenant"],
            (
                t.tenant_id,
                t.tier,
                q.max_schedules,
                q.max_concurrent_runs,
                q.max_enqueue_rate,
                q.enqueue_burst,
                q.max_payload_bytes,
                t.create_time,
                t.update_time,
            ),
        )
        if not applied:
            raise AlreadyExists(f"tenant.id: {t.tenant_id!r} already exists")

    async def update(self, t: Tenant) -> None:
        q = t.quotas
        applied, _ = await execute_conditional(
            self._session,
            self.q["update_tenant"],
            (
                t.tier,
                q.max_schedules,
                q.max_concurrent_runs,
                q.max_enqueue_rate,
                q.enqueue_burst,
                q.max_payload_bytes,
                t.update_time,
                t.tenant_id,
            ),
        )
        if not applied:
            raise NotFound(f"tenant {t.tenant_id!r} not found")

    async def get(self, tenant_id: str) -> Tenant:
        row = first(await aexecute(self._session, self.q["get_tenant"], (tenant_id,)))
        if row is None:
            raise NotFound(f"tenant {tenant_id!r} not found")
        return Tenant.from_row(row)

    async def find(self, tenant_id: str) -> Tenant | None:
        try:
            return await self.get(tenant_id)
        except NotFound:
            return None

    async def limits(self, tenant_ids: Collection[str]) -> Mapping[str, TenantLimits]:
        """The tier, enqueue-rate and concurrent-runs quotas of the tenants among
        ``tenant_ids`` that have a row, as the firing path enforces them (dispatchers cache
        this: scheduler.fairness)."""
        ids = sorted(set(tenant_ids))
        out: dict[str, TenantLimits] = {}
        for start in range(0, len(ids), 100):
            chunk = ids[start : start + 100]
            for row in await aexecute(self._session, self.q["get_tenants"], (chunk,)):
                t = Tenant.from_row(row)
                out[t.tenant_id] = TenantLimits(
                    tier=t.tier,
                    enqueue_rate=t.quotas.max_enqueue_rate or None,
                    burst=t.quotas.enqueue_burst or None,
                    max_concurrent=t.quotas.max_concurrent_runs or None,
                )
        return out

    async def list_all(self) -> list[Tenant]:
        """Every tenant (a tenant registry holds hundreds, not millions)."""
        rows = await aexecute_all(self._session, self.q["list_tenants"])
        return sorted((Tenant.from_row(r) for r in rows), key=lambda t: t.tenant_id)

    async def delete(self, tenant_id: str) -> None:
        applied, _ = await execute_conditional(self._session, self.q["delete_tenant"], (tenant_id,))
        if not applied:
            raise NotFound(f"tenant {tenant_id!r} not found")

    async def add_key(self, key: ApiKey) -> bool:
        """Stores a key (its hash); False if its id is taken (a bootstrap key already there)."""
        applied, _ = await execute_conditional(
            self._session,
            self.q["insert_key"],
            (
                key.key_id,
                key.role.value,
                key.tenant_id,
                set(key.tenants) or None,
                key.name,
                key.salt,
                key.digest,
                key.create_time,
            ),
        )
        # The index row is written even when the key existed: harmless, and it repairs an
        # index write lost to a crash after the key row.
        await aexecute(self._session, self.q["index_key"], (key.tenant_id or NO_TENANT, key.key_id))
        return applied

    async def get_key(self, key_id: str) -> ApiKey | None:
        row = first(await aexecute(self._session, self.q["get_key"], (key_id,)))
        return None if row is None else ApiKey.from_row(row)

    async def keys_of(self, tenant_id: str) -> builtins.list[ApiKey]:
        """The keys listed under ``tenant_id`` (``NO_TENANT``: admin and worker keys)."""
        ids = [
            r.key_id
            for r in await aexecute_all(self._session, self.q["keys_of_tenant"], (tenant_id,))
        ]
        pages = await asyncio.gather(
            *(
                aexecute(self._session, self.q["get_keys"], (ids[i : i + 100],))
                for i in range(0, len(ids), 100)
            )
        )
        keys = [ApiKey.from_row(r) for rows in pages for r in rows]
        return sorted(keys, key=lambda k: (k.create_time is None, k.create_time, k.key_id))

    async def revoke_key(self, key_id: str, now: datetime) -> None:
        applied, _ = await execute_conditional(self._session, self.q["revoke_key"], (now, key_id))
        if not applied:
            raise NotFound(f"key {key_id!r} not found")

    async def count_schedules(self, tenant_id: str, delta: int) -> None:
        if delta:
            await aexecute(self._session, self.q["count_schedule"], (delta, tenant_id))

    async def schedule_count(self, tenant_id: str) -> int:
        return max(0, await self._counter(tenant_id))

    async def _counter(self, tenant_id: str) -> int:
        row = first(await aexecute(self._session, self.q["get_usage"], (tenant_id,)))
        return int(row.schedules or 0) if row is not None else 0

    async def counted_tenants(self) -> builtins.list[str]:
        """Every tenant with a schedule count or registered, sorted."""
        ids: set[str] = set()
        for query in ("counted_tenants", "tenant_ids"):
            ids.update(r.tenant_id for r in await aexecute_all(self._session, self.q[query]))
        return sorted(ids)

    async def recount_schedules(self, tenant_id: str) -> tuple[int, int]:
        """Sets the tenant's schedule count (``max_schedules``) to its schedules as stored,
        counted by the ``schedules_by_tenant`` index; returns (the count before, after).

        The count is a counter moved by creates and deletes: a call that died between its
        schedule write and its count, a counter write that timed out yet landed, or schedules
        made before schema version 10 leave it off. Creates and deletes of the tenant during the
        recount may leave it off by those in flight (a counter cannot be set, only moved):
        recount while the tenant is quiet, or again."""
        stored = 0

        def tally(rows: Sequence[Any]) -> None:
            nonlocal stored
            stored += sum(1 for r in rows if r.handler is not None)

        statement = self.q["schedules_of_tenant"].bind((tenant_id,))
        statement.fetch_size = RECOUNT_PAGE
        await aeach_page(self._session, statement, None, tally)
        before = await self._counter(tenant_id)
        await self.count_schedules(tenant_id, stored - before)
        return before, stored
