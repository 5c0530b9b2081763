"""Reporting run events to the API in batches.

Every run produces a STARTED and an outcome (SUCCEEDED, FAILED, CANCELLED), so one RPC per event
would cost a round trip per run. :class:`RunReporter` gathers the events of all concurrent runs
and sends them in one ``ReportRuns`` call every 100 ms (or as soon as 500 are waiting). An outcome
reported while its run's STARTED is still waiting replaces it, carrying the start time: a short
run costs the API one event, not two. Each ``report()`` resolves only when the API acknowledged
the batch that carried its event: the consumer commits a Kafka offset only after the run's
outcome is recorded.

While the API is unreachable the batch is resent with backoff, forever: an event is never
dropped. (A batch the API rejects as invalid is split to find the offending events; those fail
with :class:`ReportRejected`. So is one refused ``STUBBORN_TRIES`` times in a row with an answer
that does not say the API is away (PERMISSION_DENIED, INTERNAL, ...): one event the API cannot
take would otherwise hold every later report of the worker behind it, and with them its
offsets and fetching. A run whose outcome is refused is found by its lease and retried.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import grpc.aio

from cronscale.v1 import run_reporting_service_pb2 as pb
from cronscale.v1 import run_reporting_service_pb2_grpc as pb_grpc
from worker.errors import ReportRejected

logger = logging.getLogger(__name__)

# How long an event waits for others. As long as a fire-ahead release slice (100 ms at load),
# so one call carries a slice's runs rather than a part of it: at 100,000 firings a minute,
# 100 ms against 20 ms cost the API 0.01-0.02 CPU-ms a firing less in three pairs of runs, and
# Cassandra 0.02-0.03 less in two of them (loadtest/README.md, "the worker's report interval").
# CRONSCALE_WORKER_REPORT_INTERVAL.
FLUSH_INTERVAL = 0.1
MAX_BATCH = 500
# Per call. Calls fail fast while the API is unreachable and this module's loop retries them,
# so every retry is visible in the log and in cronscale_worker_report_retries_total.
CALL_TIMEOUT = 5.0
BACKOFF_INITIAL = 0.05
BACKOFF_MAX = 2.0

# A rejection that resending the same batch cannot cure.
_REJECTED = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})
# Answers from an API that is up but will not take the batch (a worker key no longer allowed a
# tenant's runs, a bug, storage refusing a write): resending may cure it, a few times.
_STUBBORN = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DATA_LOSS,
    }
)
# Tries of a batch refused with one of _STUBBORN before its offending events are isolated.
STUBBORN_TRIES = 3

_CHANNEL_OPTIONS = [
    # Reconnect quickly after an API restart instead of gRPC's default (up to 120 s) backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30_000),
]


_OUTCOMES = frozenset(
    {pb.RUN_EVENT_KIND_SUCCEEDED, pb.RUN_EVENT_KIND_FAILED, pb.RUN_EVENT_KIND_CANCELLED}
)


@dataclass(eq=False, slots=True)
class _Pending:
    event: pb.RunEvent
    future: asyncio.Future[pb.RunEventAck]
    queued_at: float
    # Callers whose events were merged into this one (a STARTED absorbed by its outcome).
    merged: list[asyncio.Future[pb.RunEventAck]] = field(default_factory=list)

    def resolve(self, ack: pb.RunEventAck | None, error: BaseException | None = None) -> None:
        for f in (self.future, *self.merged):
            if f.done():
                continue
            if error is not None:
                f.set_exception(error)
            else:
                f.set_result(ack)  # type: ignore[arg-type]

    def cancel(self) -> None:
        for f in (self.future, *self.merged):
            if not f.done():
                f.cancel()


def _run_key(event: pb.RunEvent) -> tuple[str, int]:
    return event.run_id, event.attempt


class RunReporter:
    """Sends :class:`RunEvent`\\ s to ``RunReportingService.ReportRuns`` in batches.

    Use as ``async with RunReporter(target) as reporter:`` or call :meth:`start` and
    :meth:`close`. Batches go out one at a time, in order, so a run's events arrive in the order
    they were reported.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str = "",
        root_certificates: bytes | None = None,
        flush_interval: float = FLUSH_INTERVAL,
        max_batch: int = MAX_BATCH,
        call_timeout: float = CALL_TIMEOUT,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self._target = target
        self._root_certificates = root_certificates
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._flush_interval = flush_interval
        self._max_batch = max_batch
        self._call_timeout = call_timeout
        self._on_retry = on_retry
        self._queue: list[_Pending] = []
        # STARTED events queued and not yet sent, by run: an outcome reported before its
        # STARTED went out replaces it (one event, one write for the API, instead of two).
        self._unsent_starts: dict[tuple[str, int], _Pending] = {}
        self._wakeup = asyncio.Event()
        self._full = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.RunReportingServiceAsyncStub | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.retries = 0
        """How many times a batch was resent (for metrics and tests)."""

    async def __aenter__(self) -> RunReporter:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Opens the channel and starts the background sender."""
        if self._task is not None:
            return
        if self._root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
            self._channel = grpc.aio.secure_channel(self._target, creds, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.RunReportingServiceStub(self._channel)
        self._task = asyncio.create_task(self._run(), name="run-reporter")

    async def report(self, event: pb.RunEvent) -> pb.RunEventAck:
        """Queues ``event``; returns the API's ack once the batch carrying it was accepted.

        Cancelling the caller does not withdraw the event: it is still sent.
        Raises :class:`ReportRejected` if the API refuses the event as invalid.
        """
        return await self.submit(event)

    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        """Queues ``event`` now; the future resolves with the API's ack (as :meth:`report`).

        For events nobody waits on at once (a STARTED, a heartbeat): no task per event.
        Cancelling the future does not withdraw the event: it is still sent. The event is the
        reporter's from then on: an outcome whose STARTED is still queued gets its start time
        set and goes out in that STARTED's place.
        """
        if self._task is None or self._closing:
            raise RuntimeError("the reporter is not running")
        loop = asyncio.get_running_loop()
        if event.kind in _OUTCOMES:
            start = self._unsent_starts.pop(_run_key(event), None)
            if start is not None:
                # The outcome goes out in the STARTED's place, carrying its start time (set on
                # the outcome itself: the event is the reporter's once submitted).
                event.start_time.CopyFrom(start.event.event_time)
                start.event = event
                mine: asyncio.Future[pb.RunEventAck] = loop.create_future()
                start.merged.append(mine)
                return mine
        pending = _Pending(event, loop.create_future(), loop.time())
        if event.kind == pb.RUN_EVENT_KIND_STARTED:
            self._unsent_starts[_run_key(event)] = pending
        self._queue.append(pending)
        self._wakeup.set()
        if len(self._queue) >= self._max_batch:
            self._full.set()
        return pending.future

    async def close(self, drain_seconds: float = 5.0) -> None:
        """Sends what is queued (waiting at most ``drain_seconds``), then closes the channel.

        Events still unsent after that are abandoned with a warning; their runs' offsets
        were not committed, so Kafka delivers them again.
        """
        if self._task is None:
            return
        self._closing = True
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), drain_seconds)
        except TimeoutError:
            logger.warning(
                "the API at %s did not take %d run events within %.1f s; giving up on them",
                self._target,
                len(self._queue),
                drain_seconds,
            )
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for pending in self._queue:
            pending.cancel()
        self._queue.clear()
        self._unsent_starts.clear()
        if self._channel is not None:
            await self._channel.close()
        self._task = None

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            # Let the batch fill until its oldest event waited one interval, or until it is full.
            wait = (
                self._queue[0].queued_at + self._flush_interval - asyncio.get_running_loop().time()
            )
            if wait > 0 and len(self._queue) < self._max_batch and not self._closing:
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait)
            batch = self._queue[: self._max_batch]
            del self._queue[: len(batch)]
            for pending in batch:
                key = _run_key(pending.event)
                if self._unsent_starts.get(key) is pending:
                    del self._unsent_starts[key]
            await self._send(batch)

    async def _send(self, batch: Sequence[_Pending]) -> None:
        """Sends ``batch`` until the API takes it; resolves every future in it."""
        delay = BACKOFF_INITIAL
        stubborn = 0
        while True:
            try:
                acks = await self._call(batch)
            except grpc.aio.AioRpcError as e:
                stubborn = stubborn + 1 if e.code() in _STUBBORN else 0
                if e.code() in _REJECTED or stubborn >= STUBBORN_TRIES:
                    await self._isolate_rejected(batch, e)
                    return
                self.retries += 1
                if self._on_retry is not None:
                    self._on_retry()
                logger.warning(
                    "reporting %d run events to %s failed (%s: %s); retrying in %.2f s",
                    len(batch),
                    self._target,
                    e.code().name,
                    e.details(),
                    delay,
                )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            for pending, ack in zip(batch, acks, strict=True):
                pending.resolve(ack)
            return

    async def _call(self, batch: Sequence[_Pending]) -> list[pb.RunEventAck]:
        assert self._stub is not None
        response = await self._stub.ReportRuns(
            pb.ReportRunsRequest(events=[p.event for p in batch]),
            timeout=self._call_timeout,
            metadata=self._metadata,
        )
        acks = list(response.acks)
        if len(acks) != len(batch):
            # The contract is one ack per event, in order; without it, match by run_id.
            by_run = {a.run_id: a for a in acks}
            acks = [
                by_run.get(p.event.run_id, pb.RunEventAck(run_id=p.event.run_id)) for p in batch
            ]
        return acks

    async def _isolate_rejected(
        self, batch: Sequence[_Pending], error: grpc.aio.AioRpcError
    ) -> None:
        if len(batch) == 1:
            pending = batch[0]
            logger.error(
                "the API rejected the %s event of run %s (%s: %s)",
                pb.RunEventKind.Name(pending.event.kind),
                pending.event.run_id,
                error.code().name,
                error.details(),
                extra={"run_id": pending.event.run_id, "schedule_id": pending.event.schedule_id},
            )
            pending.resolve(None, ReportRejected(str(error.details())))
            return
        middle = len(batch) // 2
        await self._send(batch[:middle])
        await self._send(batch[middle:])
