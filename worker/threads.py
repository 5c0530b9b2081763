"""Threads for plain (sync) handlers: a bounded pool of their own.

``asyncio.to_thread`` would put sync handlers on the event loop's default executor (five or so
threads on a small machine), shared with everything else that needs a thread (DNS lookups, the
chaos log's fsync, libraries): a few slow sync handlers would starve it all. And a thread cannot
be stopped: a sync handler past its timeout runs on, so it must not keep its slot either, nor
keep the process from exiting (executor threads are joined at exit; these are daemon threads).

:class:`SyncThreads` runs at most ``size`` sync handlers at once. A call whose caller gives up
(the run timed out or was cancelled) is *abandoned*: the run is reported at once, its thread
finishes in the background, counted by ``cronscale_worker_sync_threads_overrunning`` (a gauge
of those still running) and ``cronscale_worker_sync_threads_abandoned_total``. An abandoned
thread gives its slot back so other runs go on, up to ``size`` abandoned threads; past that it
keeps its slot until it ends, so a handler that never returns cannot grow the thread count
without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from worker import metrics

logger = logging.getLogger(__name__)

A = TypeVar("A")
R = TypeVar("R")


class SyncThreads:
    """Runs blocking callables on daemon threads, at most ``size`` at once (see the module)."""

    def __init__(self, size: int, *, tier: str = "standard") -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._slots = asyncio.Semaphore(size)
        self._abandoned = 0
        self._abandoned_gauge = metrics.SYNC_THREADS_ABANDONED.labels(tier)
        self._abandoned_total = metrics.SYNC_THREADS_ABANDONED_TOTAL.labels(tier)
        self._busy_gauge = metrics.SYNC_THREADS_BUSY.labels(tier)

    @property
    def abandoned(self) -> int:
        """Threads whose caller gave up on them and that have not returned yet."""
        return self._abandoned

    async def run(self, fn: Callable[[A], R], arg: A, *, name: str = "sync-handler") -> R:
        """``fn(arg)`` on a thread of the pool; its result, or its exception.

        Waits for a free slot first. Cancelling the caller abandons the thread (it runs on,
        counted) and re-raises the cancellation at once.
        """
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[R] = loop.create_future()
        # Loop-side state of this call: whether the thread has ended, whether it was abandoned,
        # whether it still holds its slot.
        ended = False
        abandoned = False
        holds_slot = True
        self._busy_gauge.inc()

        def settle(value: R | None, error: BaseException | None) -> None:
            if result.done():
                return  # abandoned: nobody waits for it any more
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(value)  # type: ignore[arg-type]

        def on_end() -> None:
            nonlocal ended, holds_slot
            ended = True
            self._busy_gauge.dec()
            # The thread ended by something no handler should raise (SystemExit...).
            settle(None, RuntimeError(f"the sync handler thread ({name}) ended without a result"))
            if abandoned:
                self._abandoned -= 1
                self._abandoned_gauge.dec()
                logger.info("an abandoned sync handler thread (%s) returned at last", name)
            if holds_slot:
                holds_slot = False
                self._slots.release()

        def call_soon(callback: Callable[..., None], *args: object) -> None:
            # The loop may be gone by the time an abandoned thread returns.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(callback, *args)

        def target() -> None:
            try:
                value = fn(arg)
            except Exception as e:
                call_soon(settle, None, e)
            else:
                call_soon(settle, value, None)
            finally:
                call_soon(on_end)

        threading.Thread(target=target, name=name, daemon=True).start()
        try:
            return await result
        except asyncio.CancelledError:
            if not ended:
                abandoned = True
                self._abandoned += 1
                self._abandoned_gauge.inc()
                self._abandoned_total.inc()
                if self._abandoned <= self.size:
                    holds_slot = False
                    self._slots.release()
                logger.warning(
                    "a sync handler (%s) ran past its deadline; it cannot be stopped, so it "
                    "finishes in the background (%d such threads now)",
                    name,
                    self._abandoned,
                )
            raise
