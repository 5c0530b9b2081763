"""Running one run: report STARTED (without waiting), call the handler under a timeout, report
the outcome and wait for its acknowledgement.

The runner owns everything between "a message arrived" and "its outcome is acknowledged": the
consumer only decides which messages to run and when to commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from cronscale.v1 import run_reporting_service_pb2 as pb
from worker import metrics
from worker.errors import NonRetryable, RetryAfter, UnknownHandler
from worker.handlers import HandlerContext, HandlerRegistry
from worker.health import API, WorkerHealth
from worker.messages import RunTask
from worker.threads import SyncThreads
from worker.timestamps import set_timestamp

logger = logging.getLogger(__name__)

# Explicit heartbeats closer together than this are coalesced into one event.
MIN_HEARTBEAT_SPACING = 1.0
# How long ctx.heartbeat() waits for the API's ack before letting the handler go on.
HEARTBEAT_ACK_WAIT = 2.0
# The API truncates longer error texts anyway.
MAX_ERROR_CHARS = 4096
# How long a handler that was cancelled (timed out, cancel requested, shutdown) may take to
# stop before the runner gives up on it: a handler that swallows the cancellation would
# otherwise hold its run, its Kafka offset and the worker's shutdown forever.
CANCEL_GRACE = 5.0


class EventReporter(Protocol):
    """Where run events go (:class:`worker.reporter.RunReporter` in production)."""

    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        """Queues ``event`` for delivery; the future resolves once the API acknowledged it.
        Cancelling the future does not withdraw the event."""
        ...


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of a run, as reported to the API."""

    run_id: str
    handler: str
    succeeded: bool
    # Empty when the run succeeded.
    error: str
    # Seconds the handler ran (0 when it never started).
    duration: float
    # Seconds between scheduled_for and the handler's start.
    start_lag: float
    # An operator (or a CANCEL_PREVIOUS slot) asked to cancel it, and it did not succeed:
    # reported CANCELLED rather than FAILED.
    cancelled: bool = False
    # Not run: asked before running it, the API said this attempt has run already.
    ran_before: bool = False


class _RunState:
    """Mutable per-run bookkeeping shared by the handler's heartbeats and the runner."""

    def __init__(self) -> None:
        self.handler_task: asyncio.Task[object] | None = None
        self.cancel_requested = False
        self.last_heartbeat = float("-inf")
        # loop.time() when the handler started.
        self.started = 0.0
        # How the handler failed, beyond its error text: past its timeout, or raising one of
        # the retry-steering errors (worker.errors.NonRetryable, RetryAfter).
        self.timed_out = False
        self.raised: BaseException | None = None
        # What every event of the run carries (ids, times), built once and copied per event.
        self.event_base: pb.RunEvent | None = None

    def request_cancel(self) -> None:
        self.cancel_requested = True
        if self.handler_task is not None and not self.handler_task.done():
            self.handler_task.cancel()


class Runner:
    """Executes :class:`RunTask`\\ s with a registry's handlers and reports what happened."""

    def __init__(
        self,
        *,
        registry: HandlerRegistry,
        reporter: EventReporter,
        worker_id: str,
        tier: str = "standard",
        default_timeout: float = 300.0,
        heartbeat_interval: float = 10.0,
        sync_threads: int = 16,
        health: WorkerHealth | None = None,
    ) -> None:
        self._registry = registry
        # Plain (sync) handlers run here, not on asyncio's shared default executor.
        self.threads = SyncThreads(sync_threads, tier=tier)
        self._reporter = reporter
        self._worker_id = worker_id
        self._tier = tier
        self._default_timeout = default_timeout
        self._heartbeat_interval = heartbeat_interval
        # Runs whose handler is running, for the one heartbeat ticker they share (a task and
        # a timer per run cost more than most handlers).
        self._live: dict[_RunState, RunTask] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._started = metrics.RUNS_STARTED.labels(tier)
        self._succeeded = metrics.RUNS_SUCCEEDED.labels(tier)
        self._failed = metrics.RUNS_FAILED.labels(tier)
        self._start_lag = metrics.START_LAG.labels(tier)
        self._duration = metrics.RUN_DURATION.labels(tier)
        self._health = health or WorkerHealth(tier)
        self._ran_before = metrics.MESSAGES_SKIPPED.labels(tier, "ran_before")

    async def run(
        self,
        task: RunTask,
        on_handler_done: Callable[[], None] | None = None,
        *,
        check_done: bool = False,
    ) -> Outcome:
        """Runs ``task`` to an acknowledged outcome and returns it.

        ``on_handler_done`` is called once the handler is over, before the outcome is reported:
        the consumer frees the run's concurrency slot then, so waiting for the API's ack does not
        hold a slot.

        ``check_done``: the message may have been run already (delivered again after its
        partition's previous consumer died before committing it). Its STARTED then asks the API
        first and the handler waits for the answer; an attempt the API says has run already is
        not run again (``Outcome.ran_before``) and nothing more is reported for it.

        Never raises for what the handler does (exceptions, timeouts, an unknown name all become
        FAILED; a requested cancel that stopped the handler becomes CANCELLED); raises only if
        reporting itself is refused (:class:`ReportRejected`) or the caller is cancelled, in
        which case no outcome is reported and the run is left to Kafka's redelivery and the
        API's lease.
        """
        ids = _ids(task)
        started_at = datetime.now(UTC)
        lag = (started_at - task.scheduled_for).total_seconds()
        duration = 0.0
        error = ""
        cancelled = False
        state = _RunState()
        # STARTED goes out without holding the handler back: waiting for its ack would put a
        # round trip to the API (and a report batch's wait) before every handler. A short run's
        # STARTED still queued when it ends travels in the same event as its outcome (the
        # reporter merges them). An operator's cancel comes back on the STARTED ack (or a later
        # heartbeat's) and stops the handler; one seen before the handler began skips it.
        if check_done:
            ack = await self._report(
                self._event(task, pb.RUN_EVENT_KIND_STARTED, state, at=started_at, check=True)
            )
            if ack.done:
                if on_handler_done is not None:
                    on_handler_done()
                self._ran_before.inc()
                logger.info(
                    "run %s attempt %d has run already (its message came again after the "
                    "partition's previous consumer stopped): not run again",
                    task.run_id,
                    task.attempt,
                    extra=ids,
                )
                return Outcome(
                    run_id=task.run_id,
                    handler=task.handler,
                    succeeded=True,
                    error="",
                    duration=0.0,
                    start_lag=lag,
                    ran_before=True,
                )
            if ack.cancel_requested:
                state.cancel_requested = True
        else:
            self._send_in_background(task, pb.RUN_EVENT_KIND_STARTED, state, started_at)
        self._started.inc()
        self._start_lag.observe(max(lag, 0.0))
        try:
            try:
                fn = self._registry.get(task.handler, self.threads)
            except UnknownHandler as e:
                error = str(e)
            else:
                if state.cancel_requested:
                    error = "cancelled by an operator before it started"
                    cancelled = True
                else:
                    ctx = self._context(task, state)
                    loop = asyncio.get_running_loop()
                    t0 = loop.time()
                    error = await self._call(task, state, fn(ctx), ids)
                    cancelled = bool(error) and state.cancel_requested
                    duration = loop.time() - t0
                    self._duration.observe(duration)
        finally:
            if on_handler_done is not None:
                on_handler_done()
        outcome = Outcome(
            run_id=task.run_id,
            handler=task.handler,
            succeeded=not error,
            error=error,
            duration=duration,
            start_lag=lag,
            cancelled=cancelled,
        )
        kind = (
            pb.RUN_EVENT_KIND_SUCCEEDED
            if outcome.succeeded
            else pb.RUN_EVENT_KIND_CANCELLED
            if cancelled
            else pb.RUN_EVENT_KIND_TIMED_OUT
            if state.timed_out
            else pb.RUN_EVENT_KIND_FAILED
        )
        await self._report(
            self._event(task, kind, state, error=error[:MAX_ERROR_CHARS], raised=state.raised)
        )
        if cancelled:
            logger.info(
                "run %s %s CANCELLED after %.3fs: %s",
                task.run_id,
                task.handler,
                duration,
                error,
                extra=ids,
            )
        elif outcome.succeeded:
            self._succeeded.inc()
            # DEBUG, not INFO: at 100,000 firings a minute a line per success is 1,667 lines a
            # second, ~12 us of the worker's CPU each (text format; 16 us as JSON). Run history
            # (ListRuns) and cronscale_worker_runs_succeeded_total keep the record; failures
            # and cancellations are still logged.
            logger.debug(
                "run %s %s SUCCEEDED in %.3fs (lag %.2fs)",
                task.run_id,
                task.handler,
                duration,
                lag,
                extra=ids,
            )
        else:
            self._failed.inc()
            logger.warning(
                "run %s %s %s in %.3fs (lag %.2fs): %s",
                task.run_id,
                task.handler,
                "TIMED_OUT" if state.timed_out else "FAILED",
                duration,
                lag,
                error,
                extra=ids,
            )
        return outcome

    async def refuse(self, task: RunTask, error: str) -> None:
        """Reports ``task`` as FAILED with ``error`` without running it (e.g. a newer layout)."""
        await self._report(
            self._event(task, pb.RUN_EVENT_KIND_FAILED, None, error=error[:MAX_ERROR_CHARS])
        )
        self._failed.inc()
        logger.warning("run %s FAILED without running: %s", task.run_id, error, extra=_ids(task))

    def _context(self, task: RunTask, state: _RunState) -> HandlerContext:
        async def heartbeat() -> None:
            await self._heartbeat(task, state, explicit=True)

        return HandlerContext(
            run_id=task.run_id,
            schedule_id=task.schedule_id,
            tenant=task.tenant,
            attempt=task.attempt,
            scheduled_for=task.scheduled_for,
            payload=task.payload,
            heartbeat=heartbeat,
            handler=task.handler,
            manual=task.manual,
            enqueue_time=task.enqueue_time,
            produce_time=task.produce_time,
        )

    async def _call(
        self, task: RunTask, state: _RunState, call: Awaitable[object], ids: dict[str, str]
    ) -> str:
        """Awaits the handler under the timeout; returns the error text, empty on success."""
        timeout = task.max_runtime or self._default_timeout
        handler_task: asyncio.Task[object] = asyncio.ensure_future(call)
        state.handler_task = handler_task
        state.started = asyncio.get_running_loop().time()
        self._live[state] = task
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._heartbeats(), name="run-heartbeats")
        try:
            done = await _ended_within(handler_task, timeout)
        finally:
            self._live.pop(state, None)
            if not handler_task.done():
                # Timed out, or we are being cancelled (shutdown): stop the handler either way.
                handler_task.cancel()
                stopped, _ = await asyncio.wait({handler_task}, timeout=CANCEL_GRACE)
                if not stopped:
                    logger.error(
                        "handler %s ignored its cancellation for %.0f s; giving up on it "
                        "(it may still be running)",
                        task.handler,
                        CANCEL_GRACE,
                        extra=ids,
                    )
        if not done:
            state.timed_out = True
            return f"timed out after {timeout:g} s"
        if handler_task.cancelled() or not handler_task.done():
            if state.cancel_requested:
                return "cancelled by an operator"
            return "CancelledError: the handler was cancelled"
        e = handler_task.exception()
        if e is not None:
            logger.debug("handler %s raised", task.handler, exc_info=e, extra=ids)
            state.raised = e
            return f"{type(e).__name__}: {e}"
        return ""

    async def _heartbeats(self) -> None:
        """Heartbeats every run whose handler has run a heartbeat interval since its last
        sign of life; ends when no handler runs (the next run starts it again)."""
        loop = asyncio.get_running_loop()
        tick = min(self._heartbeat_interval, 1.0)
        while self._live:
            await asyncio.sleep(tick)
            now = loop.time()
            for state, task in list(self._live.items()):
                if now - max(state.started, state.last_heartbeat) >= self._heartbeat_interval:
                    state.last_heartbeat = now
                    self._send_in_background(task, pb.RUN_EVENT_KIND_HEARTBEAT, state)

    async def _heartbeat(self, task: RunTask, state: _RunState, *, explicit: bool) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if explicit and now - state.last_heartbeat < MIN_HEARTBEAT_SPACING:
            return
        state.last_heartbeat = now
        sent = self._send_in_background(task, pb.RUN_EVENT_KIND_HEARTBEAT, state)
        await asyncio.wait({sent}, timeout=HEARTBEAT_ACK_WAIT)

    def _send_in_background(
        self,
        task: RunTask,
        kind: pb.RunEventKind.ValueType,
        state: _RunState,
        at: datetime | None = None,
    ) -> asyncio.Future[pb.RunEventAck]:
        """Reports an event without waiting for it (no task: the reporter's future); a cancel
        request on its ack is applied."""
        sent = self._reporter.submit(self._event(task, kind, state, at=at))

        def on_ack(f: asyncio.Future[pb.RunEventAck]) -> None:
            if f.cancelled():
                return
            error = f.exception()
            if error is not None:
                logger.warning(
                    "a %s event was not delivered: %s", pb.RunEventKind.Name(kind), error
                )
                return
            self._health.up(API)
            if f.result().cancel_requested:
                if not state.cancel_requested:
                    logger.info(
                        "run %s: an operator asked to cancel it", task.run_id, extra=_ids(task)
                    )
                state.request_cancel()

        sent.add_done_callback(on_ack)
        return sent

    async def _report(self, event: pb.RunEvent) -> pb.RunEventAck:
        """Reports ``event`` and waits for the API's ack."""
        ack = await self._reporter.submit(event)
        self._health.up(API)
        return ack

    def _event(
        self,
        task: RunTask,
        kind: pb.RunEventKind.ValueType,
        state: _RunState | None,
        *,
        error: str = "",
        at: datetime | None = None,
        raised: BaseException | None = None,
        check: bool = False,
    ) -> pb.RunEvent:
        """An event of ``task``'s run: its ids and times come from the run's base event (built
        on the run's first event, then copied)."""
        base = state.event_base if state is not None else None
        if base is None:
            base = pb.RunEvent(
                run_id=task.run_id,
                schedule_id=task.schedule_id,
                attempt=task.attempt,
                worker_id=self._worker_id,
                follow_up=task.follow_up,
            )
            set_timestamp(base.scheduled_for, task.scheduled_for)
            if task.enqueue_time is not None:
                set_timestamp(base.enqueue_time, task.enqueue_time)
            if task.lease_expire_time is not None:
                set_timestamp(base.lease_expire_time, task.lease_expire_time)
            if task.next_fire_time is not None:
                set_timestamp(base.next_fire_time, task.next_fire_time)
            if state is not None:
                state.event_base = base
        event = pb.RunEvent()
        event.CopyFrom(base)
        event.kind = kind
        if error:
            event.error = error
        if check:
            event.check_done = True
        if kind == pb.RUN_EVENT_KIND_FAILED:
            # The handler steers its retries: none left, or its own wait.
            event.non_retryable = isinstance(raised, NonRetryable)
            if isinstance(raised, RetryAfter):
                event.retry_after.FromTimedelta(timedelta(seconds=max(raised.seconds, 0.0)))
        set_timestamp(event.event_time, at or datetime.now(UTC))
        return event


async def _ended_within(task: asyncio.Future[object], seconds: float) -> bool:
    """Whether ``task`` ended within ``seconds`` (``asyncio.wait`` for one task, at a
    fraction of its cost). Cancelling the caller leaves ``task`` running."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bool] = loop.create_future()

    def ended(_: object) -> None:
        if not waiter.done():
            waiter.set_result(True)

    def late() -> None:
        if not waiter.done():
            waiter.set_result(False)

    task.add_done_callback(ended)
    timer = loop.call_later(seconds, late)
    try:
        return await waiter
    finally:
        timer.cancel()
        task.remove_done_callback(ended)


def _ids(task: RunTask) -> dict[str, str]:
    return {"run_id": task.run_id, "schedule_id": task.schedule_id, "tenant": task.tenant}
