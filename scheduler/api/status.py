"""Domain errors to gRPC status, in one place."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from cassandra import DriverException, RequestValidationException
from cassandra.cluster import NoHostAvailable

from bucketer.clock import ClockSkewed
from bucketer.cql import StorageUnavailable
from scheduler import errors

logger = logging.getLogger(__name__)

_CODES: dict[type[errors.CronscaleError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Req, Context], Awaitable[Resp]]


def code_for(error: errors.CronscaleError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.INTERNAL


def grpc_errors(fn: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Wraps a servicer method: domain errors become their status; storage outages UNAVAILABLE;
    a request storage refuses, and anything else, INTERNAL (logged with its traceback)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Context) -> Resp:
        try:
            return await fn(self, request, context)
        except errors.CronscaleError as e:
            await context.abort(code_for(e), e.message)
        except ClockSkewed as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"this API replica: {e}")
        except RequestValidationException:
            # Cassandra refused the request itself (a batch too large, a value it cannot take):
            # not an outage, and the same request again is refused again.
            logger.exception("storage refused a request in %s", fn.__name__)
            await context.abort(
                grpc.StatusCode.INTERNAL, "storage refused the request; see the API server log"
            )
        except (StorageUnavailable, NoHostAvailable, DriverException) as e:
            logger.warning("storage unavailable in %s: %s", fn.__name__, e)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"storage unavailable: {e}")
        except Exception:
            logger.exception("internal error in %s", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the API server log")
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
