"""TenantService: tenants' tiers and quotas."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import UTC, datetime

from cronscale.v1 import tenant_service_pb2 as t_pb2
from cronscale.v1 import tenant_service_pb2_grpc as t_grpc
from scheduler.api.convert import ts
from scheduler.api.status import Context, grpc_errors
from scheduler.errors import InvalidArgument
from scheduler.fairness import DEFAULT_TIER
from scheduler.model import validate_schedule_id
from scheduler.tenants import CassandraTenantStore, Tenant, validate_tenant


def tenant_from_proto(msg: t_pb2.Tenant) -> Tenant:
    q = msg.quotas
    return Tenant(
        tenant_id=msg.id,
        tier=msg.tier or DEFAULT_TIER,
        max_enqueue_rate=q.max_enqueue_rate,
        enqueue_burst=q.enqueue_burst,
        max_payload_bytes=q.max_payload_bytes,
    )


def tenant_to_proto(t: Tenant) -> t_pb2.Tenant:
    return t_pb2.Tenant(
        id=t.tenant_id,
        tier=t.tier,
        quotas=t_pb2.TenantQuotas(
            max_enqueue_rate=t.max_enqueue_rate,
            enqueue_burst=t.enqueue_burst,
            max_payload_bytes=t.max_payload_bytes,
        ),
        create_time=ts(t.create_time),
        update_time=ts(t.update_time),
    )


class TenantServicer(t_grpc.TenantServiceServicer):
    def __init__(
        self,
        store: CassandraTenantStore,
        tiers: Collection[str],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._tiers = tuple(tiers)
        self._clock = clock

    def _valid(self, request_tenant: t_pb2.Tenant, *, has: bool) -> Tenant:
        if not has:
            raise InvalidArgument("tenant", "is required")
        if not request_tenant.id:
            raise InvalidArgument("tenant.id", "is required")
        t = tenant_from_proto(request_tenant)
        validate_tenant(t, self._tiers)
        return t

    @grpc_errors
    async def CreateTenant(
        self, request: t_pb2.CreateTenantRequest, context: Context
    ) -> t_pb2.Tenant:
        now = self._clock()
        t = self._valid(request.tenant, has=request.HasField("tenant"))
        created = replace(t, create_time=now, update_time=now)
        await self._store.create(created)
        return tenant_to_proto(created)

    @grpc_errors
    async def GetTenant(self, request: t_pb2.GetTenantRequest, context: Context) -> t_pb2.Tenant:
        return tenant_to_proto(await self._store.get(_id(request.id)))

    @grpc_errors
    async def ListTenants(
        self, request: t_pb2.ListTenantsRequest, context: Context
    ) -> t_pb2.ListTenantsResponse:
        return t_pb2.ListTenantsResponse(
            tenants=[tenant_to_proto(t) for t in await self._store.list()]
        )

    @grpc_errors
    async def UpdateTenant(
        self, request: t_pb2.UpdateTenantRequest, context: Context
    ) -> t_pb2.Tenant:
        t = self._valid(request.tenant, has=request.HasField("tenant"))
        await self._store.update(replace(t, update_time=self._clock()))
        return tenant_to_proto(await self._store.get(t.tenant_id))

    @grpc_errors
    async def DeleteTenant(
        self, request: t_pb2.DeleteTenantRequest, context: Context
    ) -> t_pb2.DeleteTenantResponse:
        await self._store.delete(_id(request.id))
        return t_pb2.DeleteTenantResponse()


def _id(value: str) -> str:
    if not value:
        raise InvalidArgument("id", "is required")
    return validate_schedule_id(value, "id")
