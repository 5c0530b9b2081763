"""The CLI's connection to ``cronscale api``: one grpc.aio channel per command, errors as text."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from cronscale.v1 import dead_letter_service_pb2_grpc, scheduler_service_pb2_grpc

DEFAULT_API = "127.0.0.1:50051"


def default_api(env: dict[str, str] | None = None) -> str:
    """The API address when ``--api`` is not given: ``CRONSCALE_API``, else 127.0.0.1:50051."""
    e = os.environ if env is None else env
    return e.get("CRONSCALE_API") or DEFAULT_API


@asynccontextmanager
async def scheduler_stub(target: str) -> AsyncIterator[Any]:
    """A ``SchedulerService`` stub on a fresh insecure channel to ``target``, closed on exit."""
    async with grpc.aio.insecure_channel(target) as channel:
        yield scheduler_service_pb2_grpc.SchedulerServiceStub(channel)


@asynccontextmanager
async def dead_letter_stub(target: str) -> AsyncIterator[Any]:
    """A ``DeadLetterService`` stub on a fresh insecure channel to ``target``, closed on exit."""
    async with grpc.aio.insecure_channel(target) as channel:
        yield dead_letter_service_pb2_grpc.DeadLetterServiceStub(channel)


def describe_rpc_error(error: grpc.aio.AioRpcError, target: str) -> str:
    """``CODE: server message`` for an RPC failure, with a hint when the API is unreachable."""
    code = error.code()
    name = code.name if code is not None else "UNKNOWN"
    text = f"{name}: {error.details() or ''}".rstrip(": ")
    if code == grpc.StatusCode.UNAVAILABLE:
        text += f" (is `cronscale api` running at {target}? set --api or CRONSCALE_API)"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        text += f" (no answer from {target} in time; --timeout raises the limit)"
    return text
