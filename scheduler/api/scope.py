"""Tenant scoping of the API: what a caller may see of schedules, runs and their kin.

A tenant role sees only its tenant's resources; anything else answers NOT_FOUND with the very
message a missing id gets, so a foreign id cannot be told from an unknown one. Admins see
everything and cost no extra read; a worker key sees the tenants it serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from scheduler.api.auth import principal
from scheduler.cassandra import CassandraScheduleStore
from scheduler.errors import NotFound, PermissionDenied
from scheduler.model import DEFAULT_TENANT, Run, Schedule, parse_run_id
from scheduler.service import ScheduleService
from scheduler.tenancy import Role, validate_tenant_id


def schedule_missing(schedule_id: str) -> NotFound:
    return NotFound(f"schedule {schedule_id!r} not found")


def run_missing(run_id: str) -> NotFound:
    return NotFound(f"run {run_id!r} not found")


async def check_schedule(svc: ScheduleService, schedule_id: str) -> None:
    """NOT_FOUND unless the caller sees ``schedule_id`` (which must exist for non-admins)."""
    who = principal()
    if who.is_admin:
        return
    s = await svc.schedules.get(schedule_id)
    if not who.sees(s.tenant):
        raise schedule_missing(schedule_id)


async def check_run(svc: ScheduleService, run_id: str) -> None:
    """NOT_FOUND unless the caller sees the run's tenant (its schedule's, or, once the
    schedule is deleted, the one recorded on the run)."""
    who = principal()
    if who.is_admin:
        return
    found = await svc.schedules.get_many([parse_run_id(run_id).schedule_id])
    tenant = next(iter(found.values())).tenant if found else (await svc.get_run(run_id)).tenant
    if not who.sees(tenant):
        raise run_missing(run_id)


def visible_run(run: Run) -> Run:
    if not principal().sees(run.tenant):
        raise run_missing(run.run_id)
    return run


def visible_schedules(items: list[Schedule]) -> list[Schedule]:
    who = principal()
    return items if who.is_admin else [s for s in items if who.sees(s.tenant)]


def tenant_to_list(requested: str, field: str = "tenant") -> str | None:
    """Whose schedules a listing reads: a tenant role's own (naming another one is
    PERMISSION_DENIED, whether or not it exists); an admin's choice, every tenant's when it
    names none (None)."""
    who = principal()
    if requested:
        validate_tenant_id(requested, field)
    if who.is_admin:
        return requested or None
    if requested and requested != who.tenant_id:
        raise PermissionDenied(
            f"{field}: a {who.role.value} key lists the schedules of its own tenant "
            f"{who.tenant_id!r} only"
        )
    return who.tenant_id


def tenant_for_create(requested: str, field: str = "schedule.tenant") -> str:
    """The tenant a new schedule belongs to: a tenant role's own (naming another one is
    PERMISSION_DENIED); an admin's choice, ``default`` when it names none."""
    who = principal()
    if who.role is Role.ADMIN:
        return requested or DEFAULT_TENANT
    if requested and requested != who.tenant_id:
        raise PermissionDenied(
            f"{field}: a {who.role.value} key creates schedules of its own tenant "
            f"{who.tenant_id!r} only"
        )
    return who.tenant_id


class ScheduleTenants:
    """Which tenant each schedule belongs to, for checking a worker key that serves some
    tenants only: cached ``ttl`` seconds per schedule (a schedule's tenant never changes; the
    TTL covers an id deleted and created again by another tenant), so a reporting batch costs
    at most one multi-partition read, for the schedules it has not seen lately."""

    def __init__(
        self,
        schedules: CassandraScheduleStore,
        *,
        ttl: float = 60.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schedules = schedules
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._known: dict[str, tuple[float, str]] = {}

    async def of(self, schedule_ids: Collection[str]) -> dict[str, str]:
        """The tenants of those of ``schedule_ids`` that exist."""
        now = self._clock()
        out: dict[str, str] = {}
        missing: list[str] = []
        for sid in schedule_ids:
            known = self._known.get(sid)
            if known is not None and known[0] > now:
                out[sid] = known[1]
            else:
                missing.append(sid)
        if missing:
            for sid, s in (await self._schedules.get_many(missing)).items():
                while len(self._known) >= self._max:
                    self._known.pop(next(iter(self._known)))
                self._known.pop(sid, None)
                self._known[sid] = (now + self._ttl, s.tenant)
                out[sid] = s.tenant
        return out


async def check_reports(tenants: ScheduleTenants, run_ids: Sequence[str]) -> None:
    """PERMISSION_DENIED naming the first event whose run belongs to a tenant the calling
    worker key does not serve (a key serving all tenants costs nothing). The run id names
    its schedule, so an event cannot borrow another schedule's tenant."""
    who = principal()
    if who.role is not Role.WORKER or not who.tenants:
        return
    owners = [parse_run_id(r).schedule_id for r in run_ids]
    found = await tenants.of(set(owners))
    for i, sid in enumerate(owners):
        tenant = found.get(sid)
        # A run of a deleted schedule has no tenant left to protect.
        if tenant is not None and not who.sees(tenant):
            raise PermissionDenied(
                f"events[{i}].run_id: this worker key does not serve the run's tenant"
            )
