"""RunReporter against an in-process RunReportingService (our own contract; loopback only)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from cronscale.v1 import run_reporting_service_pb2 as pb
from cronscale.v1 import run_reporting_service_pb2_grpc as pb_grpc
from worker.errors import ReportRejected
from worker.reporter import STUBBORN_TRIES, RunReporter


class Recorder(pb_grpc.RunReportingServiceServicer):
    def __init__(self) -> None:
        self.batches: list[list[pb.RunEvent]] = []
        self.reject_run: str | None = None
        self.deny_run: str | None = None
        self.denied = 0
        self.cancel: set[str] = set()

    async def ReportRuns(
        self,
        request: pb.ReportRunsRequest,
        context: grpc.aio.ServicerContext[pb.ReportRunsRequest, pb.ReportRunsResponse],
    ) -> pb.ReportRunsResponse:
        if any(e.run_id == self.reject_run for e in request.events):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "events[0].run_id: bad")
        if any(e.run_id == self.deny_run for e in request.events):
            self.denied += 1
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not this worker's tenant")
        self.batches.append(list(request.events))
        return pb.ReportRunsResponse(
            acks=[
                pb.RunEventAck(run_id=e.run_id, cancel_requested=e.run_id in self.cancel)
                for e in request.events
            ]
        )

    async def StartRun(self, request: pb.RunEvent, context: object) -> pb.RunEventAck:
        raise NotImplementedError

    HeartbeatRun = CompleteRun = StartRun


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(recorder: Recorder, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_RunReportingServiceServicer_to_server(recorder, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


@pytest.fixture
async def api() -> AsyncIterator[tuple[Recorder, int]]:
    recorder = Recorder()
    port = free_port()
    server = await serve(recorder, port)
    yield recorder, port
    await server.stop(None)


def event(run_id: str, kind: int = pb.RUN_EVENT_KIND_STARTED) -> pb.RunEvent:
    return pb.RunEvent(kind=kind, run_id=run_id)  # type: ignore[arg-type]


async def test_concurrent_reports_share_a_batch(api: tuple[Recorder, int]) -> None:
    recorder, port = api
    async with RunReporter(f"127.0.0.1:{port}") as reporter:
        recorder.cancel.add("r7")
        acks = await asyncio.gather(*(reporter.report(event(f"r{i}")) for i in range(50)))
    assert [a.run_id for a in acks] == [f"r{i}" for i in range(50)]
    assert [a.cancel_requested for a in acks].count(True) == 1
    assert len(recorder.batches) == 1
    assert [e.run_id for e in recorder.batches[0]] == [f"r{i}" for i in range(50)]


async def test_batches_are_capped(api: tuple[Recorder, int]) -> None:
    recorder, port = api
    async with RunReporter(f"127.0.0.1:{port}", max_batch=10) as reporter:
        await asyncio.gather(*(reporter.report(event(f"r{i}")) for i in range(35)))
    assert [len(b) for b in recorder.batches] == [10, 10, 10, 5]


async def test_events_wait_for_the_api_and_are_not_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    port = free_port()
    async with RunReporter(f"127.0.0.1:{port}", call_timeout=0.2) as reporter:
        pending = asyncio.ensure_future(reporter.report(event("r1")))
        await asyncio.sleep(0.8)
        assert not pending.done()
        assert reporter.retries >= 1
        server = await serve(recorder, port)
        try:
            ack = await asyncio.wait_for(pending, 10)
        finally:
            await server.stop(None)
    assert ack.run_id == "r1"
    assert [e.run_id for b in recorder.batches for e in b] == ["r1"]
    assert "retrying" in caplog.text


async def test_a_rejected_event_is_isolated(api: tuple[Recorder, int]) -> None:
    recorder, port = api
    recorder.reject_run = "bad"
    async with RunReporter(f"127.0.0.1:{port}") as reporter:
        results = await asyncio.gather(
            *(reporter.report(event(r)) for r in ("a", "b", "bad", "c")), return_exceptions=True
        )
    assert isinstance(results[2], ReportRejected)
    assert [r.run_id for r in results if isinstance(r, pb.RunEventAck)] == ["a", "b", "c"]
    assert sorted(e.run_id for b in recorder.batches for e in b) == ["a", "b", "c"]


async def test_an_event_the_api_keeps_refusing_does_not_hold_the_others(
    api: tuple[Recorder, int],
) -> None:
    """An API that is up but answers PERMISSION_DENIED for one event (or INTERNAL, ...), every
    time: after a few tries the batch is split, the others are taken, and that one fails with
    ReportRejected instead of holding every later report behind it."""
    recorder, port = api
    recorder.deny_run = "denied"
    async with RunReporter(f"127.0.0.1:{port}") as reporter:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(reporter.report(event(r)) for r in ("a", "denied", "b", "c")),
                return_exceptions=True,
            ),
            10,
        )
        later = await asyncio.wait_for(reporter.report(event("d")), 5)
    assert isinstance(results[1], ReportRejected)
    assert [r.run_id for r in results if isinstance(r, pb.RunEventAck)] == ["a", "b", "c"]
    assert later.run_id == "d"
    # Each batch holding it was tried STUBBORN_TRIES times, down to the event alone.
    assert recorder.denied >= 2 * STUBBORN_TRIES


async def test_report_after_close_is_an_error(api: tuple[Recorder, int]) -> None:
    _, port = api
    reporter = RunReporter(f"127.0.0.1:{port}")
    await reporter.start()
    await reporter.close()
    with pytest.raises(RuntimeError):
        await reporter.report(event("late"))


async def test_an_outcome_replaces_its_unsent_started(api: tuple[Recorder, int]) -> None:
    """A run that ends before its STARTED went out costs one event: the outcome, carrying the
    start time; both callers get the ack."""
    recorder, port = api
    async with RunReporter(f"127.0.0.1:{port}", flush_interval=0.2) as reporter:
        started = event("r1")
        started.event_time.FromSeconds(1_000)
        start_ack = asyncio.ensure_future(reporter.report(started))
        await asyncio.sleep(0)
        done = await reporter.report(event("r1", pb.RUN_EVENT_KIND_SUCCEEDED))
        assert (await start_ack).run_id == done.run_id == "r1"
    [[sent]] = recorder.batches
    assert sent.kind == pb.RUN_EVENT_KIND_SUCCEEDED
    assert sent.start_time.seconds == 1_000


async def test_a_started_already_sent_is_not_merged(api: tuple[Recorder, int]) -> None:
    recorder, port = api
    async with RunReporter(f"127.0.0.1:{port}") as reporter:
        await reporter.report(event("r1"))
        await reporter.report(event("r1", pb.RUN_EVENT_KIND_FAILED))
        # Another attempt's outcome never absorbs this attempt's STARTED.
        other = event("r2")
        pending = asyncio.ensure_future(reporter.report(other))
        await asyncio.sleep(0)
        retry = event("r2", pb.RUN_EVENT_KIND_FAILED)
        retry.attempt = 2
        await asyncio.gather(pending, reporter.report(retry))
    kinds = [(e.run_id, e.kind, e.HasField("start_time")) for b in recorder.batches for e in b]
    assert kinds == [
        ("r1", pb.RUN_EVENT_KIND_STARTED, False),
        ("r1", pb.RUN_EVENT_KIND_FAILED, False),
        ("r2", pb.RUN_EVENT_KIND_STARTED, False),
        ("r2", pb.RUN_EVENT_KIND_FAILED, False),
    ]


async def test_a_submitted_event_goes_out_even_when_its_future_is_cancelled(
    api: tuple[Recorder, int],
) -> None:
    """submit() queues at once (no task): the event is sent whether or not anybody waits, and
    an outcome submitted after its STARTED still rides in the STARTED's place."""
    recorder, port = api
    async with RunReporter(f"127.0.0.1:{port}") as reporter:
        started = reporter.submit(event("r1"))
        dropped = reporter.submit(event("r2"))
        dropped.cancel()
        outcome = reporter.submit(event("r1", pb.RUN_EVENT_KIND_SUCCEEDED))
        assert (await outcome).run_id == "r1"
        assert (await started).run_id == "r1"
    sent = [(e.run_id, e.kind, e.HasField("start_time")) for b in recorder.batches for e in b]
    assert sent == [
        ("r1", pb.RUN_EVENT_KIND_SUCCEEDED, True),
        ("r2", pb.RUN_EVENT_KIND_STARTED, False),
    ]
