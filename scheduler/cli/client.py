"""The CLI's connection to ``cronscale api``: one grpc.aio channel per command, errors as text.

Every call carries ``authorization: Bearer <key>`` (``--api-key``, ``$CRONSCALE_API_KEY``, or
on loopback the local stack's development admin key: ``scheduler.credentials``). With a CA file
(``--ca-file``, ``$CRONSCALE_TLS_CA_FILE``) the channel is TLS, verified against it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cronscale.v1 import (
    api_key_service_pb2_grpc,
    audit_service_pb2_grpc,
    dead_letter_service_pb2_grpc,
    scheduler_service_pb2_grpc,
    tenant_service_pb2_grpc,
)
from scheduler.credentials import ENV_CA_FILE, client_key

DEFAULT_API = "127.0.0.1:50051"


@dataclass(kw_only=True)
class _Auth:
    api_key: str = field(default="", repr=False)
    ca_file: str = ""


_auth = _Auth()


def configure(*, api_key: str = "", ca_file: str = "") -> None:
    """Sets this process's key and CA file (from the command line; env and defaults apply
    when empty)."""
    _auth.api_key = api_key
    _auth.ca_file = ca_file


def default_api(env: dict[str, str] | None = None) -> str:
    """The API address when ``--api`` is not given: ``CRONSCALE_API``, else 127.0.0.1:50051."""
    e = os.environ if env is None else env
    return e.get("CRONSCALE_API") or DEFAULT_API


class BearerAuth(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <key>`` to every unary call of a channel."""

    def __init__(self, key: str) -> None:
        self._metadata = ("authorization", f"Bearer {key}")

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()), self._metadata)
        details = grpc.aio.ClientCallDetails(
            method=client_call_details.method,
            timeout=client_call_details.timeout,
            metadata=metadata,
            credentials=client_call_details.credentials,
            wait_for_ready=client_call_details.wait_for_ready,
        )
        return await continuation(details, request)


def open_channel(
    target: str, *, api_key: str = "", ca_file: str = "", options: Any = None
) -> grpc.aio.Channel:
    """An aio channel to ``target`` that authenticates with the client's key; TLS when a CA
    file is configured."""
    key = client_key(target, api_key or _auth.api_key)
    interceptors = [BearerAuth(key)] if key else None
    ca = ca_file or _auth.ca_file or os.environ.get(ENV_CA_FILE, "")
    if ca:
        creds = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())
        return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


@asynccontextmanager
async def scheduler_stub(target: str) -> AsyncIterator[Any]:
    """A ``SchedulerService`` stub on a fresh channel to ``target``, closed on exit."""
    async with open_channel(target) as channel:
        yield scheduler_service_pb2_grpc.SchedulerServiceStub(channel)


@asynccontextmanager
async def dead_letter_stub(target: str) -> AsyncIterator[Any]:
    """A ``DeadLetterService`` stub on a fresh channel to ``target``, closed on exit."""
    async with open_channel(target) as channel:
        yield dead_letter_service_pb2_grpc.DeadLetterServiceStub(channel)


@asynccontextmanager
async def tenant_stubs(target: str) -> AsyncIterator[tuple[Any, Any]]:
    """``TenantService`` and ``ApiKeyService`` stubs on one fresh channel, closed on exit."""
    async with open_channel(target) as channel:
        yield (
            tenant_service_pb2_grpc.TenantServiceStub(channel),
            api_key_service_pb2_grpc.ApiKeyServiceStub(channel),
        )


@asynccontextmanager
async def audit_stub(target: str) -> AsyncIterator[Any]:
    """An ``AuditService`` stub on a fresh channel to ``target``, closed on exit."""
    async with open_channel(target) as channel:
        yield audit_service_pb2_grpc.AuditServiceStub(channel)


def describe_rpc_error(error: grpc.aio.AioRpcError, target: str) -> str:
    """``CODE: server message`` for an RPC failure, with a hint when the API is unreachable."""
    code = error.code()
    name = code.name if code is not None else "UNKNOWN"
    text = f"{name}: {error.details() or ''}".rstrip(": ")
    if code == grpc.StatusCode.UNAVAILABLE:
        text += f" (is `cronscale api` running at {target}? set --api or CRONSCALE_API)"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        text += f" (no answer from {target} in time; --timeout raises the limit)"
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        text += " (set --api-key or CRONSCALE_API_KEY)"
    return text
