"""How the API's servicers answer failures (scheduler.api.status.grpc_errors): an outage of
storage is UNAVAILABLE (retry), a request storage refuses is INTERNAL (the same request again
is refused again: a worker's reporter stops resending it after a few tries)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from cassandra import InvalidRequest, OperationTimedOut

from scheduler.api.status import grpc_errors
from scheduler.errors import InvalidArgument


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise _Aborted


class _Servicer:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    @grpc_errors
    async def Call(self, request: Any, context: Any) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (OperationTimedOut("no answer"), grpc.StatusCode.UNAVAILABLE),
        (InvalidRequest("Batch too large"), grpc.StatusCode.INTERNAL),
        (InvalidArgument("schedule.name", "is empty"), grpc.StatusCode.INVALID_ARGUMENT),
        (RuntimeError("a bug"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_failures_answer_with_their_status(
    error: BaseException, code: grpc.StatusCode
) -> None:
    context = _Context()
    with pytest.raises(_Aborted):
        await _Servicer(error).Call(None, context)  # type: ignore[arg-type]
    assert context.code == code
