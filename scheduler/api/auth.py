"""Authentication and authorization at the API edge: one server interceptor.

Every RPC except health and reflection needs ``authorization: Bearer <key>``. The method's
allowed roles come from ``METHOD_ROLES``; a method missing from it is refused to everyone
(default deny), so a new RPC is closed until someone decides who may call it. Missing,
malformed, unknown or revoked keys get UNAUTHENTICATED; a role not in the method's row gets
PERMISSION_DENIED. Tenant scoping (a foreign id answers NOT_FOUND) is the servicers' job, with
the caller's ``Principal`` from :func:`principal`.

Verified keys are cached in-process for ``KEY_CACHE_TTL_S`` (10 s): a key revoked on another
replica keeps working there at most that long; on the replica that revoked it, never again.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc

from scheduler.cassandra_tenancy import CassandraTenantStore
from scheduler.errors import InvalidArgument
from scheduler.tenancy import ApiKey, Principal, Role, parse_token

logger = logging.getLogger(__name__)

KEY_CACHE_TTL_S = 10.0
KEY_CACHE_MAX = 10_000

_ADMIN = frozenset({Role.ADMIN})
_MANAGE = frozenset({Role.ADMIN, Role.TENANT_ADMIN})
_READ = frozenset({Role.ADMIN, Role.TENANT_ADMIN, Role.TENANT_READER})
_WORKER = frozenset({Role.WORKER})


def _rows(service: str, roles: frozenset[Role], *methods: str) -> dict[str, frozenset[Role]]:
    return {f"/cronscale.v1.{service}/{m}": roles for m in methods}


# Who may call what. Every RPC the server offers must have a row; see the module docstring.
METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    **_rows(
        "SchedulerService",
        _READ,
        "GetSchedule",
        "ListSchedules",
        "ListRuns",
        "GetRun",
        "GetBackfill",
        "PreviewSchedule",
        "ListDependencies",
    ),
    **_rows(
        "SchedulerService",
        _MANAGE,
        "CreateSchedule",
        "BatchCreateSchedules",
        "PauseSchedule",
        "ResumeSchedule",
        "DeleteSchedule",
        "UpdateSchedule",
        "CancelSchedule",
        "TriggerSchedule",
        "RerunRun",
        "BackfillSchedule",
    ),
    **_rows(
        "RunReportingService", _WORKER, "ReportRuns", "StartRun", "HeartbeatRun", "CompleteRun"
    ),
    **_rows("DeadLetterService", _READ, "ListDeadLetters", "GetDeadLetter"),
    **_rows("DeadLetterService", _MANAGE, "RedriveDeadLetter", "RedriveDeadLetters"),
    **_rows("TenantService", _ADMIN, "CreateTenant", "ListTenants", "UpdateTenant", "DeleteTenant"),
    **_rows("TenantService", _READ, "GetTenant"),
    **_rows("ApiKeyService", _MANAGE, "CreateApiKey", "ListApiKeys", "RevokeApiKey"),
    **_rows("AuditService", _READ, "ListAuditEvents"),
}

# Reachable without a key: load balancers' health checks and tooling's reflection.
PUBLIC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/")

_PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar("cronscale_principal")


def principal() -> Principal:
    """The caller of the RPC being served (set by :class:`AuthInterceptor`)."""
    try:
        return _PRINCIPAL.get()
    except LookupError:
        raise RuntimeError("no authenticated caller: is the AuthInterceptor installed?") from None


class KeyVerifier:
    """Checks presented keys against their stored hashes, caching the stored rows briefly so a
    busy client costs no read per RPC."""

    def __init__(
        self,
        store: CassandraTenantStore,
        *,
        ttl: float = KEY_CACHE_TTL_S,
        max_entries: int = KEY_CACHE_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._cache: dict[str, tuple[float, ApiKey | None]] = {}

    def forget(self, key_id: str) -> None:
        """Drops a cached key (revoked here: it stops working on this replica at once)."""
        self._cache.pop(key_id, None)

    async def verify(self, token: str) -> Principal | None:
        """The principal of a valid, unrevoked key; None otherwise (never says which)."""
        try:
            key_id, secret = parse_token(token)
        except InvalidArgument:
            return None
        now = self._clock()
        cached = self._cache.get(key_id)
        if cached is not None and cached[0] > now:
            key = cached[1]
        else:
            key = await self._store.get_key(key_id)
            if len(self._cache) >= self._max:
                # Oldest insert first: dicts keep insertion order.
                self._cache.pop(next(iter(self._cache)))
            self._cache.pop(key_id, None)
            self._cache[key_id] = (now + self._ttl, key)
        if key is None or key.revoked or not key.matches(secret):
            return None
        return Principal.of(key)


def bearer(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    for name, value in metadata or ():
        if name == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return None
            return token.strip()
    return None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every non-public RPC and checks its role against ``METHOD_ROLES``."""

    def __init__(self, verifier: KeyVerifier) -> None:
        self._verifier = verifier

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if method.startswith(PUBLIC_PREFIXES) or handler is None:
            return handler
        metadata = handler_call_details.invocation_metadata
        roles = METHOD_ROLES.get(method)
        inner: Any = handler.unary_unary
        verifier = self._verifier

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            token = bearer(metadata)
            if token is None:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "authorization: missing; send `authorization: Bearer <API key>`",
                )
            assert token is not None
            who = await verifier.verify(token)
            if who is None:
                # Never echo the key: it may be a real one with a typo.
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "authorization: unknown or revoked API key"
                )
            assert who is not None
            if roles is None or inner is None:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, f"{method} is not open to any role"
                )
            assert roles is not None and inner is not None
            if who.role not in roles:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"role {who.role.value!r} may not call {method.rsplit('/', 1)[-1]}",
                )
            reset = _PRINCIPAL.set(who)
            try:
                return await inner(request, context)
            finally:
                _PRINCIPAL.reset(reset)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
