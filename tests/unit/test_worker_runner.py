"""The runner: events in order, outcomes and their error texts, timeouts, heartbeats, cancel."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from cronscale.v1 import run_reporting_service_pb2 as pb
from tests.fake_reports import acked
from worker import builtin
from worker.errors import NonRetryable, RetryAfter
from worker.handlers import HandlerContext, HandlerRegistry
from worker.messages import RunTask
from worker.runner import Runner


class RecordingReporter:
    """Collects events; answers cancel_requested for the run ids in ``cancel``."""

    def __init__(self) -> None:
        self.events: list[pb.RunEvent] = []
        self.cancel: set[str] = set()

    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        self.events.append(event)
        return acked(
            pb.RunEventAck(run_id=event.run_id, cancel_requested=event.run_id in self.cancel)
        )

    def kinds(self) -> list[str]:
        return [pb.RunEventKind.Name(e.kind).removeprefix("RUN_EVENT_KIND_") for e in self.events]


def task(handler: str, payload: bytes = b"", max_runtime: float | None = None) -> RunTask:
    return RunTask(
        run_id="run-1",
        schedule_id="sched-1",
        tenant="acme",
        handler=handler,
        payload=payload,
        scheduled_for=datetime.now(UTC) - timedelta(seconds=2),
        enqueue_time=None,
        attempt=3,
        manual=False,
        max_runtime=max_runtime,
    )


def make_runner(
    reporter: RecordingReporter, default_timeout: float = 5.0, heartbeat_interval: float = 10.0
) -> tuple[Runner, HandlerRegistry]:
    registry = HandlerRegistry()
    builtin.register_builtins(registry)
    runner = Runner(
        registry=registry,
        reporter=reporter,
        worker_id="w-1",
        default_timeout=default_timeout,
        heartbeat_interval=heartbeat_interval,
    )
    return runner, registry


async def test_success_reports_started_then_succeeded() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    t = task("echo", b"hi")
    outcome = await runner.run(t)
    assert outcome.succeeded and outcome.error == ""
    assert 1.9 < outcome.start_lag < 10
    assert reporter.kinds() == ["STARTED", "SUCCEEDED"]
    started = reporter.events[0]
    assert (started.run_id, started.schedule_id, started.attempt, started.worker_id) == (
        "run-1",
        "sched-1",
        3,
        "w-1",
    )
    assert started.scheduled_for.ToDatetime(tzinfo=UTC) == t.scheduled_for


async def test_the_outcome_echoes_what_the_message_asked_echoed() -> None:
    """The lease time and the next fire time, which tell the API where to settle the lease and
    note the run's end (RunMessage.lease_expire_time, next_fire_time)."""
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    lease, nxt = datetime(2026, 12, 4, 13, 5, tzinfo=UTC), datetime(2026, 12, 4, 13, 1, tzinfo=UTC)
    await runner.run(replace(task("echo"), lease_expire_time=lease, next_fire_time=nxt))
    outcome = reporter.events[-1]
    assert outcome.lease_expire_time.ToDatetime(tzinfo=UTC) == lease
    assert outcome.next_fire_time.ToDatetime(tzinfo=UTC) == nxt
    await runner.run(task("echo"))
    assert not reporter.events[-1].HasField("next_fire_time")


async def test_the_fail_handler_reports_its_message() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    outcome = await runner.run(task("fail"))
    assert not outcome.succeeded
    assert reporter.kinds() == ["STARTED", "FAILED"]
    assert reporter.events[1].error == "HandlerFailed: the fail handler always fails"


async def test_any_exception_becomes_type_and_text() -> None:
    reporter = RecordingReporter()
    runner, registry = make_runner(reporter)

    def broken(ctx: HandlerContext) -> None:
        raise KeyError("account")

    registry.register("broken", broken)
    await runner.run(task("broken"))
    assert reporter.events[-1].error == "KeyError: 'account'"


async def test_unknown_handler_fails_the_run() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    outcome = await runner.run(task("nope"))
    assert outcome.error == "unknown handler 'nope'"
    assert reporter.kinds() == ["STARTED", "FAILED"]
    assert reporter.events[1].error == "unknown handler 'nope'"


async def test_the_message_max_runtime_times_the_handler_out() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    outcome = await runner.run(task("sleep", b'{"seconds": 30}', max_runtime=0.05))
    assert loop.time() - t0 < 2
    assert outcome.error == "timed out after 0.05 s"
    assert reporter.kinds() == ["STARTED", "TIMED_OUT"]
    assert reporter.events[1].error == "timed out after 0.05 s"


async def test_the_default_timeout_applies_without_max_runtime() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter, default_timeout=0.1)
    outcome = await runner.run(task("sleep", b'{"seconds": 30}'))
    assert outcome.error == "timed out after 0.1 s"


async def test_context_heartbeat_sends_heartbeat_events() -> None:
    reporter = RecordingReporter()
    runner, registry = make_runner(reporter)
    seen: list[HandlerContext] = []

    async def beating(ctx: HandlerContext) -> None:
        seen.append(ctx)
        await ctx.heartbeat()
        await ctx.heartbeat()  # coalesced: less than a second after the first

    registry.register("beating", beating)
    enqueued = datetime.now(UTC) - timedelta(seconds=1)
    await runner.run(replace(task("beating", b'{"k": 1}'), enqueue_time=enqueued))
    assert reporter.kinds() == ["STARTED", "HEARTBEAT", "SUCCEEDED"]
    ctx = seen[0]
    assert (ctx.run_id, ctx.schedule_id, ctx.tenant, ctx.attempt) == ("run-1", "sched-1", "acme", 3)
    assert ctx.json() == {"k": 1}
    assert ctx.enqueue_time == enqueued


class BeatCounter(RecordingReporter):
    """Records events, and sets ``enough`` once every run in ``runs`` has heartbeated
    ``beats`` times; keeps each heartbeat's loop time by run."""

    def __init__(self, runs: set[str], beats: int) -> None:
        super().__init__()
        self.enough = asyncio.Event()
        self.beat_times: dict[str, list[float]] = {run: [] for run in runs}
        self._beats = beats

    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        if event.kind == pb.RUN_EVENT_KIND_HEARTBEAT:
            self.beat_times[event.run_id].append(asyncio.get_running_loop().time())
            if all(len(times) >= self._beats for times in self.beat_times.values()):
                self.enough.set()
        return super().submit(event)


def wait_for_beats(registry: HandlerRegistry, reporter: BeatCounter) -> None:
    """Registers "wait-for-beats": a handler that never heartbeats itself and returns once
    ``reporter`` has seen its heartbeats (failing the run if they do not come in 4 s). Waiting
    on them, not sleeping a fixed time, keeps the test true on a machine too busy to tick on
    time."""

    async def handler(ctx: HandlerContext) -> None:
        await asyncio.wait_for(reporter.enough.wait(), 4)

    registry.register("wait-for-beats", handler)


async def test_long_runs_heartbeat_on_their_own() -> None:
    reporter = BeatCounter({"run-1"}, beats=3)
    runner, registry = make_runner(reporter, heartbeat_interval=0.05)
    wait_for_beats(registry, reporter)
    outcome = await runner.run(task("wait-for-beats"))
    assert outcome.succeeded, outcome.error
    assert reporter.kinds().count("HEARTBEAT") >= 3
    assert reporter.kinds()[-1] == "SUCCEEDED"


async def test_an_operator_cancel_stops_the_handler() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter, heartbeat_interval=0.05)
    running = asyncio.create_task(runner.run(task("sleep", b'{"seconds": 30}')))
    await asyncio.sleep(0.1)
    reporter.cancel.add("run-1")
    outcome = await asyncio.wait_for(running, 5)
    assert outcome.error == "cancelled by an operator"
    assert outcome.cancelled and not outcome.succeeded
    assert reporter.kinds()[-1] == "CANCELLED"


async def test_a_cancel_before_start_skips_the_handler() -> None:
    reporter = RecordingReporter()
    reporter.cancel.add("run-1")
    runner, registry = make_runner(reporter)
    called: list[bool] = []
    registry.register("x", lambda ctx: called.append(True))
    outcome = await runner.run(task("x"))
    assert not called
    assert outcome.error.startswith("cancelled by an operator")
    assert outcome.cancelled
    assert reporter.kinds() == ["STARTED", "CANCELLED"]


async def test_a_handler_that_turns_the_cancel_into_an_error_is_still_cancelled() -> None:
    reporter = RecordingReporter()
    runner, registry = make_runner(reporter, heartbeat_interval=0.05)

    async def cleanup_then_raise(ctx: HandlerContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("interrupted while copying") from None

    registry.register("stubborn", cleanup_then_raise)
    running = asyncio.create_task(runner.run(task("stubborn")))
    await asyncio.sleep(0.1)
    reporter.cancel.add("run-1")
    outcome = await asyncio.wait_for(running, 5)
    assert outcome.cancelled and "interrupted while copying" in outcome.error
    assert reporter.kinds()[-1] == "CANCELLED"
    assert reporter.events[-1].error == outcome.error


async def test_a_timeout_is_timed_out_not_cancelled(caplog: pytest.LogCaptureFixture) -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter, heartbeat_interval=0.05)
    outcome = await runner.run(task("sleep", b'{"seconds": 30}', max_runtime=0.2))
    assert not outcome.cancelled and outcome.error.startswith("timed out")
    assert reporter.kinds()[-1] == "TIMED_OUT"
    assert "run run-1 sleep TIMED_OUT in" in caplog.text


async def test_cancelling_the_runner_cancels_the_handler_and_reports_nothing() -> None:
    reporter = RecordingReporter()
    runner, registry = make_runner(reporter)
    cancelled = asyncio.Event()

    async def forever(ctx: HandlerContext) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    registry.register("forever", forever)
    running = asyncio.create_task(runner.run(task("forever")))
    await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cancelled.is_set()
    assert reporter.kinds() == ["STARTED"]


async def test_refuse_reports_failed_without_running() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    await runner.refuse(task("echo"), "schema_version 2 is newer")
    assert reporter.kinds() == ["FAILED"]
    assert reporter.events[0].error == "schema_version 2 is newer"


async def test_the_slot_is_released_before_the_outcome_is_reported() -> None:
    reporter = RecordingReporter()
    runner, _ = make_runner(reporter)
    seen_at_release: list[list[str]] = []
    for handler in ("echo", "fail", "nope"):
        reporter.events.clear()
        await runner.run(task(handler), lambda: seen_at_release.append(reporter.kinds()))
    assert seen_at_release == [["STARTED"]] * 3


async def test_a_handler_that_ignores_its_cancellation_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loss path 12: a handler that swallowed the cancellation at its timeout was awaited
    forever, pinning its Kafka offset and the worker's shutdown."""
    monkeypatch.setattr("worker.runner.CANCEL_GRACE", 0.2)
    reporter = RecordingReporter()
    runner, registry = make_runner(reporter)
    release = asyncio.Event()

    async def stubborn(ctx: object) -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # ignores it

    registry.register("stubborn", stubborn)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    outcome = await runner.run(task("stubborn", max_runtime=0.1))
    assert loop.time() - t0 < 2
    assert outcome.error == "timed out after 0.1 s" and not outcome.succeeded
    assert reporter.kinds() == ["STARTED", "TIMED_OUT"]
    release.set()


async def test_long_runs_share_one_heartbeat_ticker() -> None:
    """Runs in progress together are heartbeated by one ticker task, each no more often than
    the interval (a busy machine can only space the beats further apart)."""
    interval = 0.2
    runs = {f"run-{i}" for i in range(3)}
    reporter = BeatCounter(runs, beats=2)
    runner, registry = make_runner(reporter, heartbeat_interval=interval)
    wait_for_beats(registry, reporter)
    before = asyncio.all_tasks()  # a ticker of an earlier test's runner may not have ended yet
    running = [
        asyncio.create_task(runner.run(replace(task("wait-for-beats"), run_id=run)))
        for run in sorted(runs)
    ]
    await asyncio.wait_for(reporter.enough.wait(), 5)
    tickers = [t for t in asyncio.all_tasks() - before if t.get_name() == "run-heartbeats"]
    assert len(tickers) == 1
    outcomes = await asyncio.gather(*running)
    assert all(o.succeeded for o in outcomes), [o.error for o in outcomes]
    for run, times in reporter.beat_times.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(times) >= 2 and min(gaps) >= interval - 0.01, (run, gaps)


async def test_a_handler_steers_its_retries() -> None:
    """NonRetryable marks the failure hopeless; RetryAfter carries the wait it asks for; any
    other exception is a plain, retryable FAILED."""
    reporter = RecordingReporter()
    runner, registry = make_runner(reporter)

    async def hopeless(ctx: HandlerContext) -> None:
        raise NonRetryable("the record was deleted upstream")

    async def throttled(ctx: HandlerContext) -> None:
        raise RetryAfter(7.5, "rate limited")

    async def plain(ctx: HandlerContext) -> None:
        raise RuntimeError("boom")

    registry.register("hopeless", hopeless)
    registry.register("throttled", throttled)
    registry.register("plain", plain)
    for name in ("hopeless", "throttled", "plain"):
        await runner.run(task(name))
    outcomes = [e for e in reporter.events if e.kind == pb.RUN_EVENT_KIND_FAILED]
    assert [e.non_retryable for e in outcomes] == [True, False, False]
    assert [e.HasField("retry_after") for e in outcomes] == [False, True, False]
    assert outcomes[1].retry_after.ToTimedelta() == timedelta(seconds=7.5)
    assert "the record was deleted upstream" in outcomes[0].error
