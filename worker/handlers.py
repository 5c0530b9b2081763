"""Handlers: the user code a run executes, registered under a name.

A handler is an async or plain callable taking a :class:`HandlerContext`::

    from worker.handlers import HandlerContext, handler

    @handler("billing.nightly")
    async def nightly(ctx: HandlerContext) -> None:
        await charge(ctx.json()["account"], idempotency_key=ctx.run_id)

It returns to succeed and raises to fail. ``cronscale worker --import mypkg.jobs`` imports the
module so its decorators run.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from worker.errors import DuplicateHandler, HandlerImportError, UnknownHandler

if TYPE_CHECKING:
    from worker.threads import SyncThreads

logger = logging.getLogger(__name__)

HandlerFn = Callable[["HandlerContext"], Any]
"""An ``async def f(ctx)`` or a plain ``def f(ctx)``; the return value is logged, not stored."""

AsyncHandlerFn = Callable[["HandlerContext"], Awaitable[object]]

F = TypeVar("F", bound=HandlerFn)


async def _no_heartbeat() -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class HandlerContext:
    """What a handler knows about the run it executes."""

    # The idempotency key: the same for every delivery and every retry of one firing, so a
    # handler that passes it on (as the ``http`` built-in does) makes duplicates harmless.
    run_id: str
    schedule_id: str
    tenant: str
    # 1 for the first try; a retry keeps run_id and increments attempt.
    attempt: int
    # The (aware, UTC) time the run was due, jitter included: use it, not "now", as the logical
    # time of the run, so a late or repeated run computes the same thing.
    scheduled_for: datetime
    payload: bytes
    # Tells the API the run is alive (the worker also does so on its own every few seconds).
    heartbeat: Callable[[], Awaitable[None]] = _no_heartbeat
    handler: str = ""
    manual: bool = False
    # When the dispatcher enqueued this delivery (None if the message did not say). Two calls
    # for one run_id and attempt with the same enqueue_time are one message delivered twice;
    # different ones are the run fired twice (see docs/concepts/delivery.md).
    enqueue_time: datetime | None = None
    # When the dispatcher produced this delivery to the run queue (the Kafka record's
    # CreateTime, to the millisecond; None if the record does not carry one). With fire-ahead
    # the enqueue time comes before the slot and the produce at it: start minus this is the
    # time the run spent in the queue (Kafka and the worker).
    produce_time: datetime | None = None

    def json(self) -> Any:
        """The payload decoded as JSON; ``None`` for an empty payload.

        Raises ``ValueError`` (``json.JSONDecodeError``) when the payload is not JSON.
        """
        if not self.payload:
            return None
        return json.loads(self.payload)


class HandlerRegistry:
    """Names to handlers. Plain callables are wrapped to run in a thread."""

    def __init__(self) -> None:
        self._handlers: dict[str, AsyncHandlerFn] = {}
        self._originals: dict[str, HandlerFn] = {}

    def register(self, name: str, fn: HandlerFn) -> None:
        """Registers ``fn`` under ``name``.

        Registering the same callable twice is a no-op (a module imported twice); a different
        callable under a taken name raises :class:`DuplicateHandler`.
        """
        if not name:
            raise ValueError("a handler name must not be empty")
        existing = self._originals.get(name)
        if existing is not None:
            if existing is fn:
                return
            raise DuplicateHandler(
                f"handler {name!r} is already registered to {_describe(existing)}; "
                f"cannot register {_describe(fn)}"
            )
        self._originals[name] = fn
        self._handlers[name] = _as_async(fn)

    def get(self, name: str, threads: SyncThreads | None = None) -> AsyncHandlerFn:
        """The handler registered under ``name`` as an async callable.

        A plain (sync) callable runs on ``threads`` when given (the worker's own bounded pool),
        else on asyncio's default executor. Raises :class:`UnknownHandler` when there is none.
        """
        try:
            fn = self._handlers[name]
        except KeyError:
            raise UnknownHandler(name) from None
        original = self._originals[name]
        if threads is not None and fn is not original:
            return _on_threads(original, threads)
        return fn

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def handler(self, name: str) -> Callable[[F], F]:
        """A decorator that registers the decorated callable under ``name`` in this registry."""

        def decorate(fn: F) -> F:
            self.register(name, fn)
            return fn

        return decorate


default_registry = HandlerRegistry()
"""The registry ``@handler`` writes to and ``cronscale worker`` runs from."""


def handler(name: str, *, registry: HandlerRegistry | None = None) -> Callable[[F], F]:
    """Registers the decorated async or plain callable as the handler called ``name``.

    Plain (sync) callables run on a thread of the worker's own pool
    (``CRONSCALE_WORKER_SYNC_THREADS``) so they do not block the event loop; a timeout cannot
    stop a thread: the run is reported TIMED_OUT on time and the thread finishes in the
    background (see :mod:`worker.threads`).
    """
    return (registry or default_registry).handler(name)


def load_imports(modules: list[str]) -> None:
    """Imports each module so the ``@handler`` decorators in it register.

    Raises :class:`HandlerImportError` naming the module and the cause when one fails.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:
            raise HandlerImportError(
                f"cannot import handler module {module!r}: {type(e).__name__}: {e}"
            ) from e
        logger.info("imported handler module %s", module)


def _as_async(fn: HandlerFn) -> AsyncHandlerFn:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    ):
        return fn

    async def in_thread(ctx: HandlerContext) -> object:
        result = await asyncio.to_thread(fn, ctx)
        # A plain function may still hand back an awaitable (e.g. a lambda returning a coroutine).
        if inspect.isawaitable(result):
            return await result
        return result

    in_thread.__name__ = getattr(fn, "__name__", "handler")
    in_thread.__qualname__ = getattr(fn, "__qualname__", in_thread.__name__)
    return in_thread


def _on_threads(fn: HandlerFn, threads: SyncThreads) -> AsyncHandlerFn:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "handler")

    async def on_threads(ctx: HandlerContext) -> object:
        result = await threads.run(fn, ctx, name=f"sync {name} {ctx.run_id}")
        if inspect.isawaitable(result):
            return await result
        return result

    return on_threads


def _describe(fn: object) -> str:
    module = getattr(fn, "__module__", "?")
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{module}.{name}"
