"""Audit at the API edge: an interceptor that records every successful mutating RPC, and the
read-only AuditService.

``AUDITED`` names each mutating method with how to find its target and the entity before
the change (read just before the call); the response is the entity after it. A method that
changes something must have a row here (``tests/e2e/test_audit.py`` walks them all). A key's
secret never enters an entry: CreateApiKey records the key's metadata only.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from cronscale.v1 import audit_service_pb2 as audit_pb2
from cronscale.v1 import audit_service_pb2_grpc as audit_grpc
from scheduler.api.auth import principal
from scheduler.api.convert import from_ts, run_to_proto, schedule_to_proto, ts
from scheduler.api.status import Context, grpc_errors
from scheduler.api.tenants import key_to_proto, tenant_to_proto
from scheduler.audit import NO_TENANT, AuditEntry, AuditQuery, CassandraAuditLog, audit_range
from scheduler.cassandra_tenancy import CassandraTenantStore
from scheduler.errors import CronscaleError, InvalidArgument
from scheduler.model import to_millisecond
from scheduler.service import ScheduleService
from scheduler.tenancy import Role

logger = logging.getLogger(__name__)

MAX_PAGE = 1000


@dataclass(frozen=True, kw_only=True)
class Stores:
    svc: ScheduleService
    tenancy: CassandraTenantStore


Loader = Callable[[Stores, Any], Awaitable[Message | None]]


async def _schedule(stores: Stores, schedule_id: str) -> Message | None:
    if not schedule_id:
        return None
    try:
        return schedule_to_proto(await stores.svc.schedules.get(schedule_id))
    except CronscaleError:
        return None


async def _run(stores: Stores, run_id: str) -> Message | None:
    try:
        return run_to_proto(await stores.svc.get_run(run_id))
    except CronscaleError:
        return None


async def _tenant(stores: Stores, tenant_id: str) -> Message | None:
    t = await stores.tenancy.find(tenant_id) if tenant_id else None
    return tenant_to_proto(t) if t is not None else None


async def _key(stores: Stores, key_id: str) -> Message | None:
    k = await stores.tenancy.get_key(key_id) if key_id else None
    return key_to_proto(k) if k is not None else None


async def _nothing(stores: Stores, request: Any) -> Message | None:
    return None


@dataclass(frozen=True, kw_only=True)
class Audited:
    # The target, from (request, response).
    target: Callable[[Any, Any], str]
    before: Loader = _nothing
    # What to record as "after" (default: the response).
    after: Callable[[Any, Any], Message | dict[str, Any] | None] = lambda req, resp: resp


def _sched(field: str) -> Loader:
    def load(stores: Stores, req: Any) -> Awaitable[Message | None]:
        return _schedule(stores, _get(req, field))

    return load


def _get(msg: Any, path: str) -> str:
    for part in path.split("."):
        msg = getattr(msg, part)
    return str(msg)


def _run_of(field: str) -> Loader:
    def load(stores: Stores, req: Any) -> Awaitable[Message | None]:
        return _run(stores, _get(req, field))

    return load


def _S(method: str) -> str:
    return f"/cronscale.v1.SchedulerService/{method}"


def _field(path: str) -> Callable[[Any, Any], str]:
    return lambda req, resp: _get(req, path)


AUDITED: Mapping[str, Audited] = {
    _S("CreateSchedule"): Audited(target=lambda req, resp: resp.id),
    _S("BatchCreateSchedules"): Audited(
        target=lambda req, resp: "batch",
        after=lambda req, resp: {
            "created": [
                r.schedule.id for r in resp.results if not r.error_code and not r.already_existed
            ],
            "refused": sum(1 for r in resp.results if r.error_code),
        },
    ),
    _S("PauseSchedule"): Audited(target=_field("id"), before=_sched("id")),
    _S("ResumeSchedule"): Audited(target=_field("id"), before=_sched("id")),
    _S("DeleteSchedule"): Audited(
        target=_field("id"), before=_sched("id"), after=lambda req, resp: None
    ),
    _S("UpdateSchedule"): Audited(target=_field("schedule.id"), before=_sched("schedule.id")),
    _S("CancelSchedule"): Audited(target=_field("id"), before=_sched("id")),
    _S("TriggerSchedule"): Audited(target=_field("id")),
    _S("RerunRun"): Audited(target=_field("run_id"), before=_run_of("run_id")),
    _S("BackfillSchedule"): Audited(target=_field("id")),
    "/cronscale.v1.DeadLetterService/RedriveDeadLetter": Audited(
        target=_field("run_id"), before=_run_of("run_id")
    ),
    "/cronscale.v1.DeadLetterService/RedriveDeadLetters": Audited(
        target=_field("schedule_id"),
        after=lambda req, resp: {"runs": [r.run_id for r in resp.runs]},
    ),
    "/cronscale.v1.TenantService/CreateTenant": Audited(target=lambda req, resp: resp.id),
    "/cronscale.v1.TenantService/UpdateTenant": Audited(
        target=_field("tenant.id"), before=lambda s, req: _tenant(s, req.tenant.id)
    ),
    "/cronscale.v1.TenantService/DeleteTenant": Audited(
        target=_field("id"),
        before=lambda s, req: _tenant(s, req.id),
        after=lambda req, resp: None,
    ),
    # The response carries the key's secret: only its metadata is recorded.
    "/cronscale.v1.ApiKeyService/CreateApiKey": Audited(
        target=lambda req, resp: resp.key.key_id, after=lambda req, resp: resp.key
    ),
    "/cronscale.v1.ApiKeyService/RevokeApiKey": Audited(
        target=_field("key_id"), before=lambda s, req: _key(s, req.key_id)
    ),
}


def _json(value: Message | dict[str, Any] | None) -> str:
    if value is None:
        return ""
    if isinstance(value, Message):
        return json_format.MessageToJson(
            value, preserving_proto_field_name=True, indent=None, sort_keys=True
        )
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _tenant_of(*messages: Any) -> str:
    """The tenant an entity belongs to: a schedule's or run's ``tenant``, a tenant's ``id``,
    a key's ``tenant_id``."""
    for m in messages:
        if m is None or isinstance(m, dict):
            continue
        name = m.DESCRIPTOR.full_name
        if name == "cronscale.v1.Tenant":
            return str(m.id)
        if name == "cronscale.v1.ApiKey":
            return str(m.tenant_id) or NO_TENANT
        for field in ("tenant",):
            if field in m.DESCRIPTOR.fields_by_name and getattr(m, field):
                return str(getattr(m, field))
    return ""


class AuditInterceptor(grpc.aio.ServerInterceptor):
    """Records an entry after every successful call of a method in ``AUDITED``. Installed
    after the AuthInterceptor, so the caller is known."""

    def __init__(self, stores: Stores, log: CassandraAuditLog) -> None:
        self._stores = stores
        self._log = log

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        spec = AUDITED.get(method)
        if spec is None or handler is None or handler.unary_unary is None:
            return handler
        inner: Any = handler.unary_unary
        metadata = dict(handler_call_details.invocation_metadata or ())
        stores, log = self._stores, self._log

        async def audited(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            before = await spec.before(stores, request)
            # A refused call raises (its servicer aborts): only a change gets here.
            response = await inner(request, context)
            after = spec.after(request, response)
            who = principal()
            tenant = who.tenant_id if who.role in (Role.TENANT_ADMIN, Role.TENANT_READER) else ""
            tenant = tenant or _tenant_of(after, before, response) or NO_TENANT
            request_id = str(metadata.get("x-request-id") or "")
            if not request_id and "request_id" in request.DESCRIPTOR.fields_by_name:
                request_id = request.request_id
            entry = AuditEntry(
                event_id=uuid.uuid4().hex,
                event_time=_now(),
                tenant_id=tenant,
                actor_key_id=who.key_id,
                actor_role=who.role.value,
                action=method.rsplit("/", 1)[-1],
                target=spec.target(request, response),
                request_id=request_id or uuid.uuid4().hex,
                before_json=_json(before),
                after_json=_json(after),
            )
            try:
                await log.append(entry)
            except Exception:
                logger.exception("could not write the audit entry of %s", entry.action)
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"{entry.action} was applied but its audit entry could not be written; "
                    "retry the call (it is idempotent or answers the same)",
                )
            return response

        return grpc.unary_unary_rpc_method_handler(
            audited,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _now() -> datetime:
    return to_millisecond(datetime.now(UTC))


def entry_to_proto(e: AuditEntry) -> audit_pb2.AuditEvent:
    return audit_pb2.AuditEvent(
        event_id=e.event_id,
        time=ts(e.event_time),
        actor_key_id=e.actor_key_id,
        actor_role=e.actor_role,
        tenant_id=e.tenant_id,
        action=e.action,
        target=e.target,
        request_id=e.request_id,
        before_json=e.before_json,
        after_json=e.after_json,
    )


class AuditServicer(audit_grpc.AuditServiceServicer):
    def __init__(self, log: CassandraAuditLog) -> None:
        self._log = log

    @grpc_errors
    async def ListAuditEvents(
        self, request: audit_pb2.ListAuditEventsRequest, context: Context
    ) -> audit_pb2.ListAuditEventsResponse:
        who = principal()
        if not 0 <= request.page_size <= MAX_PAGE:
            raise InvalidArgument("page_size", f"must be between 0 and {MAX_PAGE}")
        tenant = request.tenant_id
        if not who.is_admin:
            if tenant and tenant != who.tenant_id:
                return audit_pb2.ListAuditEventsResponse()
            tenant = who.tenant_id
        start, end = audit_range(
            from_ts(request.start_time) if request.HasField("start_time") else None,
            from_ts(request.end_time) if request.HasField("end_time") else None,
            datetime.now(UTC),
        )
        query = AuditQuery(
            tenant_id=tenant,
            target=request.target,
            actor_key_id=request.actor_key_id,
            action=request.action,
            start=start,
            end=end,
        )
        entries, token = await self._log.page(query, request.page_size or 100, request.page_token)
        return audit_pb2.ListAuditEventsResponse(
            events=[entry_to_proto(e) for e in entries], next_page_token=token
        )
