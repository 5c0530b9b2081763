"""TenantService and ApiKeyService: tenants with their tier and quotas, and API keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from cronscale.v1 import api_key_service_pb2 as key_pb2
from cronscale.v1 import api_key_service_pb2_grpc as key_grpc
from cronscale.v1 import tenant_service_pb2 as tenant_pb2
from cronscale.v1 import tenant_service_pb2_grpc as tenant_grpc
from scheduler.api.auth import KeyVerifier, principal
from scheduler.api.convert import ts
from scheduler.api.status import Context, grpc_errors
from scheduler.cassandra_tenancy import NO_TENANT, CassandraTenantStore
from scheduler.errors import InvalidArgument, NotFound, PermissionDenied
from scheduler.fairness import DEFAULT_TIER
from scheduler.model import to_millisecond
from scheduler.tenancy import (
    MAX_KEY_NAME_CHARS,
    ApiKey,
    Role,
    Tenant,
    TenantQuotas,
    new_key,
    parse_role,
    validate_tenant,
    validate_tenant_id,
)


def _tenant_from_proto(msg: tenant_pb2.Tenant) -> Tenant:
    q = msg.quotas
    return Tenant(
        tenant_id=msg.id,
        tier=msg.tier or DEFAULT_TIER,
        quotas=TenantQuotas(
            max_schedules=q.max_schedules,
            max_concurrent_runs=q.max_concurrent_runs,
            max_enqueue_rate=q.max_enqueue_rate,
            enqueue_burst=q.enqueue_burst,
            max_payload_bytes=q.max_payload_bytes,
        ),
    )


def tenant_to_proto(t: Tenant) -> tenant_pb2.Tenant:
    q = t.quotas
    return tenant_pb2.Tenant(
        id=t.tenant_id,
        tier=t.tier,
        quotas=tenant_pb2.TenantQuotas(
            max_schedules=q.max_schedules,
            max_concurrent_runs=q.max_concurrent_runs,
            max_enqueue_rate=q.max_enqueue_rate,
            enqueue_burst=q.enqueue_burst,
            max_payload_bytes=q.max_payload_bytes,
        ),
        create_time=ts(t.create_time),
        update_time=ts(t.update_time),
    )


def key_to_proto(k: ApiKey) -> key_pb2.ApiKey:
    return key_pb2.ApiKey(
        key_id=k.key_id,
        role=k.role.value,
        tenant_id=k.tenant_id,
        tenants=sorted(k.tenants),
        name=k.name,
        create_time=ts(k.create_time),
        revoke_time=ts(k.revoke_time),
    )


Clock = Callable[[], datetime]


def _now() -> datetime:
    return to_millisecond(datetime.now(UTC))


class TenantServicer(tenant_grpc.TenantServiceServicer):
    def __init__(self, store: CassandraTenantStore, *, tiers: tuple[str, ...]) -> None:
        self._store = store
        self._tiers = tiers

    def _valid(self, request_tenant: tenant_pb2.Tenant, present: bool) -> Tenant:
        if not present:
            raise InvalidArgument("tenant", "is required")
        t = _tenant_from_proto(request_tenant)
        validate_tenant(t, self._tiers)
        return t

    @grpc_errors
    async def CreateTenant(
        self, request: tenant_pb2.CreateTenantRequest, context: Context
    ) -> tenant_pb2.Tenant:
        now = _now()
        t = replace(
            self._valid(request.tenant, request.HasField("tenant")),
            create_time=now,
            update_time=now,
        )
        await self._store.create(t)
        return tenant_to_proto(t)

    @grpc_errors
    async def GetTenant(
        self, request: tenant_pb2.GetTenantRequest, context: Context
    ) -> tenant_pb2.Tenant:
        tenant_id = validate_tenant_id(request.id, "id")
        if not principal().sees(tenant_id):
            raise NotFound(f"tenant {tenant_id!r} not found")
        return tenant_to_proto(await self._store.get(tenant_id))

    @grpc_errors
    async def ListTenants(
        self, request: tenant_pb2.ListTenantsRequest, context: Context
    ) -> tenant_pb2.ListTenantsResponse:
        return tenant_pb2.ListTenantsResponse(
            tenants=[tenant_to_proto(t) for t in await self._store.list_all()]
        )

    @grpc_errors
    async def UpdateTenant(
        self, request: tenant_pb2.UpdateTenantRequest, context: Context
    ) -> tenant_pb2.Tenant:
        t = self._valid(request.tenant, request.HasField("tenant"))
        before = await self._store.get(t.tenant_id)
        after = replace(t, create_time=before.create_time, update_time=_now())
        await self._store.update(after)
        return tenant_to_proto(after)

    @grpc_errors
    async def DeleteTenant(
        self, request: tenant_pb2.DeleteTenantRequest, context: Context
    ) -> tenant_pb2.DeleteTenantResponse:
        tenant_id = validate_tenant_id(request.id, "id")
        await self._store.delete(tenant_id)
        # Its keys die with it: nothing may act for a tenant that no longer exists.
        now = _now()
        for k in await self._store.keys_of(tenant_id):
            if not k.revoked:
                await self._store.revoke_key(k.key_id, now)
        return tenant_pb2.DeleteTenantResponse()


class ApiKeyServicer(key_grpc.ApiKeyServiceServicer):
    def __init__(self, store: CassandraTenantStore, verifier: KeyVerifier) -> None:
        self._store = store
        self._verifier = verifier

    @grpc_errors
    async def CreateApiKey(
        self, request: key_pb2.CreateApiKeyRequest, context: Context
    ) -> key_pb2.CreateApiKeyResponse:
        who = principal()
        role = parse_role(request.role)
        tenant_id = request.tenant_id
        if len(request.name) > MAX_KEY_NAME_CHARS:
            raise InvalidArgument("name", f"at most {MAX_KEY_NAME_CHARS} characters")
        if who.role is Role.TENANT_ADMIN:
            if role not in (Role.TENANT_ADMIN, Role.TENANT_READER):
                raise PermissionDenied(f"role: a tenant-admin may not create {role.value} keys")
            if tenant_id and tenant_id != who.tenant_id:
                raise PermissionDenied("tenant_id: a tenant-admin creates keys of its own tenant")
            tenant_id = who.tenant_id
        tenants: frozenset[str] = frozenset()
        if role in (Role.ADMIN, Role.WORKER):
            if tenant_id:
                raise InvalidArgument("tenant_id", f"must be empty for a {role.value} key")
            if role is Role.WORKER:
                tenants = frozenset(
                    validate_tenant_id(t, f"tenants[{i}]") for i, t in enumerate(request.tenants)
                )
        else:
            validate_tenant_id(tenant_id, "tenant_id")
            await self._store.get(tenant_id)  # NotFound for a tenant that is not registered
        if request.tenants and role is not Role.WORKER:
            raise InvalidArgument("tenants", "only worker keys list tenants")
        made = new_key(
            role=role, tenant_id=tenant_id, tenants=tenants, name=request.name, now=_now()
        )
        await self._store.add_key(made.key)
        return key_pb2.CreateApiKeyResponse(key=key_to_proto(made.key), secret=made.token)

    @grpc_errors
    async def ListApiKeys(
        self, request: key_pb2.ListApiKeysRequest, context: Context
    ) -> key_pb2.ListApiKeysResponse:
        who = principal()
        tenant_id = request.tenant_id
        if who.role is Role.TENANT_ADMIN:
            if tenant_id and tenant_id != who.tenant_id:
                raise PermissionDenied("tenant_id: a tenant-admin lists its own tenant's keys")
            tenant_id = who.tenant_id
        keys = await self._store.keys_of(tenant_id or NO_TENANT)
        return key_pb2.ListApiKeysResponse(keys=[key_to_proto(k) for k in keys])

    @grpc_errors
    async def RevokeApiKey(
        self, request: key_pb2.RevokeApiKeyRequest, context: Context
    ) -> key_pb2.ApiKey:
        who = principal()
        if not request.key_id:
            raise InvalidArgument("key_id", "is required")
        key = await self._store.get_key(request.key_id)
        if key is None or (who.role is not Role.ADMIN and key.tenant_id != who.tenant_id):
            raise NotFound(f"key {request.key_id!r} not found")
        now = _now()
        await self._store.revoke_key(key.key_id, now)
        self._verifier.forget(key.key_id)
        return key_to_proto(replace(key, revoke_time=key.revoke_time or now))
