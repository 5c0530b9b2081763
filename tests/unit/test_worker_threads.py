"""Sync handlers on the worker's own thread pool: bounded, and an overrun does not hold others."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from cronscale.v1 import run_reporting_service_pb2 as pb
from tests.fake_reports import acked
from worker.handlers import HandlerContext, HandlerRegistry
from worker.messages import RunTask
from worker.runner import Runner
from worker.threads import SyncThreads


class Reporter:
    def __init__(self) -> None:
        self.events: list[pb.RunEvent] = []

    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        self.events.append(event)
        return acked(pb.RunEventAck(run_id=event.run_id))

    def outcome(self, run_id: str) -> str:
        kinds = [e.kind for e in self.events if e.run_id == run_id]
        return pb.RunEventKind.Name(kinds[-1]).removeprefix("RUN_EVENT_KIND_")


def task(run_id: str, handler: str, max_runtime: float | None = None) -> RunTask:
    return RunTask(
        run_id=run_id,
        schedule_id="s",
        tenant="acme",
        handler=handler,
        payload=b"",
        scheduled_for=datetime.now(UTC),
        enqueue_time=None,
        attempt=1,
        manual=False,
        max_runtime=max_runtime,
    )


async def _until(condition: object, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_overrunning_sync_handlers_are_reported_on_time_and_do_not_hold_other_runs() -> None:
    """More stuck sync handlers than asyncio's default executor has threads time out; each is
    reported TIMED_OUT on time, and a quick sync handler still runs at once."""
    reporter = Reporter()
    registry = HandlerRegistry()
    release = threading.Event()

    def stuck(ctx: HandlerContext) -> None:
        release.wait(30)

    def quick(ctx: HandlerContext) -> str:
        return "done"

    registry.register("stuck", stuck)
    registry.register("quick", quick)
    runner = Runner(registry=registry, reporter=reporter, worker_id="w", sync_threads=8)
    loop = asyncio.get_running_loop()
    try:
        t0 = loop.time()
        stuck_ids = [f"stuck-{i}" for i in range(8)]
        await asyncio.gather(*(runner.run(task(r, "stuck", max_runtime=0.2)) for r in stuck_ids))
        # Reported when the timeout struck, not after the runner's cancel grace.
        assert loop.time() - t0 < 2
        assert {reporter.outcome(r) for r in stuck_ids} == {"TIMED_OUT"}
        t1 = loop.time()
        outcome = await runner.run(task("quick-1", "quick", max_runtime=5))
        assert outcome.succeeded and loop.time() - t1 < 1
        assert runner.threads.abandoned == 8
    finally:
        release.set()
    await _until(lambda: runner.threads.abandoned == 0, 5)


async def test_abandoned_threads_past_the_pool_size_keep_their_slots() -> None:
    threads = SyncThreads(1)
    release = threading.Event()
    for _ in range(2):
        call = asyncio.ensure_future(threads.run(lambda _: release.wait(30), None))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert threads.abandoned == 2
    # One abandoned thread gave its slot back, the second (over the size) kept it.
    blocked = asyncio.ensure_future(threads.run(lambda x: x, "next"))
    await asyncio.sleep(0.2)
    assert not blocked.done(), "the pool is bounded: no thread for it yet"
    release.set()
    assert await asyncio.wait_for(blocked, 5) == "next"
    await _until(lambda: threads.abandoned == 0, 5)


async def test_results_and_exceptions_come_back() -> None:
    threads = SyncThreads(2)

    def boom(_: object) -> None:
        raise ValueError("nope")

    assert await threads.run(lambda x: x * 2, 21) == 42
    with pytest.raises(ValueError, match="nope"):
        await threads.run(boom, None)
    assert threads.abandoned == 0
