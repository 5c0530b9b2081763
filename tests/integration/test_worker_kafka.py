"""The worker against the real local Kafka: run, report, and commit only what is recorded.

Each test uses its own topic prefix (so its own topic and consumer group). The reporting side is
an in-process gRPC server implementing our own RunReportingService contract, recording events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import REGISTRY

from cronscale.v1 import run_message_pb2
from cronscale.v1 import run_reporting_service_pb2 as pb
from cronscale.v1 import run_reporting_service_pb2_grpc as pb_grpc
from tests.services import KAFKA_BOOTSTRAP as BOOTSTRAP
from tests.services import health_status, require_kafka
from worker.builtin import register_builtins
from worker.config import WorkerConfig
from worker.consumer import KafkaRunConsumer
from worker.handlers import HandlerContext, HandlerRegistry
from worker.main import run_worker
from worker.offsets import decode_finished
from worker.reporter import RunReporter
from worker.runner import CANCEL_GRACE, Runner

pytestmark = pytest.mark.integration

PARTITIONS = 3
REPO = Path(__file__).resolve().parents[2]


class Recorder(pb_grpc.RunReportingServiceServicer):
    """Records every ReportRuns event; acks each one (``done`` on a STARTED asking
    ``check_done`` of a run it has an outcome for), or, while ``hold_acks``, never answers."""

    def __init__(self) -> None:
        self.events: list[pb.RunEvent] = []
        self.hold_acks = False

    async def ReportRuns(
        self,
        request: pb.ReportRunsRequest,
        context: grpc.aio.ServicerContext[pb.ReportRunsRequest, pb.ReportRunsResponse],
    ) -> pb.ReportRunsResponse:
        finished = self.finished()
        self.events.extend(request.events)
        if self.hold_acks:
            await asyncio.Event().wait()  # recorded, never acknowledged
        return pb.ReportRunsResponse(
            acks=[
                pb.RunEventAck(run_id=e.run_id, done=e.check_done and e.run_id in finished)
                for e in request.events
            ]
        )

    async def StartRun(self, request: pb.RunEvent, context: object) -> pb.RunEventAck:
        raise NotImplementedError

    HeartbeatRun = CompleteRun = StartRun

    def kinds(self, run_id: str) -> list[str]:
        """The run's events by kind; an outcome that carries its start (the worker merged a
        STARTED still unsent into it) counts as both."""
        out: list[str] = []
        for e in self.events:
            if e.run_id != run_id or e.kind == pb.RUN_EVENT_KIND_HEARTBEAT:
                continue
            if e.HasField("start_time"):
                out.append("STARTED")
            out.append(pb.RunEventKind.Name(e.kind).removeprefix("RUN_EVENT_KIND_"))
        return out

    def finished(self) -> set[str]:
        done = (pb.RUN_EVENT_KIND_SUCCEEDED, pb.RUN_EVENT_KIND_FAILED)
        return {e.run_id for e in self.events if e.kind in done}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(recorder: Recorder, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_RunReportingServiceServicer_to_server(recorder, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


@pytest.fixture
async def config() -> AsyncIterator[WorkerConfig]:
    """A worker configuration with a fresh 3-partition topic (deleted afterwards)."""
    require_kafka(BOOTSTRAP)
    config = WorkerConfig(
        kafka_bootstrap=BOOTSTRAP,
        topic_prefix=f"test-worker-{uuid.uuid4().hex[:10]}",
        api_target=f"127.0.0.1:{_free_port()}",
        instance_id="it-worker",
        concurrency=8,
        shutdown_grace=5,
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(config.topic, num_partitions=PARTITIONS, replication_factor=1)]
        )
        yield config
        await admin.delete_topics([config.topic])
    finally:
        await admin.close()


def _message(
    run_id: str, handler: str, payload: object = None, max_runtime: float | None = None
) -> bytes:
    msg = run_message_pb2.RunMessage(
        schema_version=1,
        run_id=run_id,
        schedule_id=f"sched-{run_id}",
        tenant="acme",
        handler=handler,
        payload=b"" if payload is None else json.dumps(payload).encode(),
        attempt=1,
    )
    msg.scheduled_for.FromDatetime(datetime.now(UTC))
    msg.enqueue_time.FromDatetime(datetime.now(UTC))
    if max_runtime is not None:
        msg.max_runtime.FromNanoseconds(round(max_runtime * 1e9))
    return msg.SerializeToString()


async def _produce(
    topic: str,
    messages: list[tuple[str, bytes]],
    *,
    partition: int | None = None,
    timestamp_ms: int | None = None,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    await producer.start()
    try:
        for run_id, value in messages:
            await producer.send(
                topic, value, key=run_id.encode(), partition=partition, timestamp_ms=timestamp_ms
            )
        await producer.flush()
    finally:
        await producer.stop()


async def _end_offsets(topic: str) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def _committed(group: str, topic: str) -> dict[TopicPartition, int]:
    return {tp: offset for tp, (offset, _) in (await _commits(group, topic)).items()}


async def _commits(group: str, topic: str) -> dict[TopicPartition, tuple[int, list[int]]]:
    """Each partition's committed offset and the finished offsets its metadata names."""
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {
        tp: (meta.offset, decode_finished(meta.offset, meta.metadata))
        for tp, meta in offsets.items()
        if tp.topic == topic
    }


async def _until(
    condition: Callable[[], Awaitable[bool] | bool], seconds: float, what: str
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            pytest.fail(f"timed out after {seconds:g} s waiting for {what}")
        await asyncio.sleep(0.1)


def _gauge(name: str, tier: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"tier": tier})


def _nonempty(offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    return {tp: o for tp, o in offsets.items() if o > 0}


async def _committed_equals_end(config: WorkerConfig) -> bool:
    end = _nonempty(await _end_offsets(config.topic))
    return await _committed(config.group_id, config.topic) == end


@pytest.mark.timeout(120)
async def test_runs_reports_and_commits_every_message(config: WorkerConfig) -> None:
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    registry = HandlerRegistry()
    register_builtins(registry)
    messages = []
    for i in range(20):
        if i % 3 == 0:
            messages.append((f"run-{i}", _message(f"run-{i}", "fail", {"error": f"boom {i}"})))
        else:
            messages.append((f"run-{i}", _message(f"run-{i}", "echo", {"i": i})))
    await _produce(config.topic, messages)
    end = _nonempty(await _end_offsets(config.topic))
    assert sum(end.values()) == 20
    assert len(end) > 1, "the 20 keys should spread over several partitions"

    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(config, stop, registry))
    try:
        await _until(lambda: len(recorder.finished()) == 20, 60, "20 reported outcomes")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)

    for i in range(20):
        run_id = f"run-{i}"
        if i % 3 == 0:
            assert recorder.kinds(run_id) == ["STARTED", "FAILED"], run_id
            failed = [e for e in recorder.events if e.run_id == run_id][-1]
            assert failed.error == f"HandlerFailed: boom {i}"
        else:
            assert recorder.kinds(run_id) == ["STARTED", "SUCCEEDED"], run_id
    started = next(e for e in recorder.events if e.run_id == "run-1")
    assert started.kind == pb.RUN_EVENT_KIND_STARTED or started.HasField("start_time")
    assert (started.schedule_id, started.attempt, started.worker_id) == (
        "sched-run-1",
        1,
        "it-worker",
    )
    assert await _committed(config.group_id, config.topic) == end


@pytest.mark.timeout(120)
async def test_a_handler_is_told_when_its_message_was_produced(config: WorkerConfig) -> None:
    """The record's timestamp reaches the handler as ``produce_time``: with fire-ahead the
    enqueue time is before the slot, so only this tells the run queue's wait apart."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    seen: list[HandlerContext] = []

    async def note(ctx: HandlerContext) -> None:
        seen.append(ctx)

    registry = HandlerRegistry()
    registry.register("note", note)
    produced = datetime.now(UTC).replace(microsecond=123_000) - timedelta(seconds=5)
    await _produce(
        config.topic,
        [("stamped", _message("stamped", "note"))],
        timestamp_ms=round(produced.timestamp() * 1000),
    )
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(config, stop, registry))
    try:
        await _until(lambda: len(recorder.finished()) == 1, 60, "the outcome")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)
    (ctx,) = seen
    assert ctx.produce_time == produced
    assert ctx.enqueue_time is not None and ctx.enqueue_time > produced


@pytest.mark.timeout(120)
async def test_outcomes_wait_for_the_api_and_offsets_wait_for_the_ack(
    config: WorkerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    port = int(config.api_target.rsplit(":", 1)[1])
    config = dataclasses.replace(config, health_listen=f"127.0.0.1:{_free_port()}")
    recorder = Recorder()
    server = await _serve(recorder, port)
    registry = HandlerRegistry()
    finished: list[str] = []

    async def slow(ctx: HandlerContext) -> None:
        await asyncio.sleep(1.0)
        finished.append(ctx.run_id)

    registry.register("slow", slow)
    run_ids = [f"slow-{i}" for i in range(3)]
    await _produce(config.topic, [(r, _message(r, "slow")) for r in run_ids])
    end = _nonempty(await _end_offsets(config.topic))

    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(config, stop, registry))
    try:
        await _until(
            lambda: all(recorder.kinds(r) == ["STARTED"] for r in run_ids), 60, "3 STARTED events"
        )
        assert await health_status(config.health_listen) == "SERVING"
        # The API goes away while the handlers are still running.
        await server.stop(None)
        await _until(lambda: len(finished) == 3, 10, "the slow handlers to finish")
        await asyncio.sleep(1.0)
        # Outcomes are not acknowledged, so nothing may be committed yet.
        assert await _committed(config.group_id, config.topic) == {}
        assert not recorder.finished()
        assert "retrying" in caplog.text
        assert _gauge("cronscale_worker_api_up", config.tier) == 0
        assert await health_status(config.health_listen) == "NOT_SERVING"
        assert f"not serving: API: {config.api_target} does not take run reports" in caplog.text

        server = await _serve(recorder, port)
        await _until(lambda: recorder.finished() == set(run_ids), 20, "the retried outcomes")
        # The API records the outcomes before its answer reaches the worker, which marks the
        # API up on that answer: waited for, not read at once.
        await _until(
            lambda: _gauge("cronscale_worker_api_up", config.tier) == 1, 10, "the API marked up"
        )
        assert await health_status(config.health_listen) == "SERVING"
        assert "serving again" in caplog.text
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed after the ack")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)
    for run_id in run_ids:
        assert recorder.kinds(run_id) == ["STARTED", "SUCCEEDED"]
    assert await _committed(config.group_id, config.topic) == end


def _counting_registry(ran: list[str], *, block: asyncio.Event | None = None) -> HandlerRegistry:
    """``echo`` and ``sleep`` that record each run_id they execute; ``sleep`` waits for
    ``block`` when given (else returns at once)."""
    registry = HandlerRegistry()

    async def echo(ctx: HandlerContext) -> None:
        ran.append(ctx.run_id)

    async def sleep(ctx: HandlerContext) -> None:
        ran.append(ctx.run_id)
        if block is not None:
            await block.wait()

    registry.register("echo", echo)
    registry.register("sleep", sleep)
    return registry


def _start_worker_process(
    config: WorkerConfig, instance_id: str, log: Path, *imports: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CRONSCALE_KAFKA_BOOTSTRAP": BOOTSTRAP,
        "CRONSCALE_TOPIC_PREFIX": config.topic_prefix,
        "CRONSCALE_API": config.api_target,
        "CRONSCALE_INSTANCE_ID": instance_id,
        "CRONSCALE_WORKER_SHUTDOWN_GRACE": str(config.shutdown_grace),
        "CRONSCALE_WORKER_GROUP_INSTANCE_ID": config.group_instance_id,
        "PYTHONPATH": str(REPO),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "worker", *(f"--import={m}" for m in imports)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


@pytest.mark.timeout(180)
async def test_a_killed_workers_successor_runs_only_what_was_left_unfinished(
    config: WorkerConfig, tmp_path: Path
) -> None:
    """A long run pins its partition's commit point; the ten runs after it finish. The worker
    is SIGKILLed: its successor runs the long one again, and none of the ten."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    blocker = "kill-block"
    oks = [f"kill-ok-{i}" for i in range(10)]
    await _produce(
        config.topic,
        [
            (blocker, _message(blocker, "sleep", {"seconds": 3600})),
            *[(r, _message(r, "echo")) for r in oks],
        ],
        partition=0,
    )
    tp = TopicPartition(config.topic, 0)
    victim = _start_worker_process(config, "it-victim", tmp_path / "victim.log")
    try:
        await _until(lambda: recorder.finished() >= set(oks), 60, "the victim's 10 outcomes")

        async def pinned() -> bool:
            commit = (await _commits(config.group_id, config.topic)).get(tp)
            return commit is not None and commit == (0, list(range(1, 11)))

        await _until(pinned, 15, "a commit at the long run naming the 10 finished after it")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    ran: list[str] = []
    stop = asyncio.Event()
    successor = asyncio.create_task(
        run_worker(
            dataclasses.replace(config, instance_id="it-successor"), stop, _counting_registry(ran)
        )
    )
    try:
        await _until(lambda: blocker in ran, 60, "the successor to run the unfinished one")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        stop.set()
        await asyncio.wait_for(successor, 30)
        await server.stop(None)
    assert ran == [blocker], "only the unfinished run may run again"


async def _five_recorded_then_killed(
    config: WorkerConfig, recorder: Recorder, tmp_path: Path
) -> list[str]:
    """A worker process runs five messages of partition 0 whose outcomes the API records
    without its acks reaching the worker (no commit past them), and is SIGKILLed; then a
    message arrives while no worker is up ("while-down"). Returns the five run ids."""
    tp = TopicPartition(config.topic, 0)
    await _produce(config.topic, [("warm-0", _message("warm-0", "echo"))], partition=0)
    victim = _start_worker_process(config, "it-victim", tmp_path / "victim.log")
    held = [f"held-{i}" for i in range(5)]
    try:
        await _until(lambda: "warm-0" in recorder.finished(), 60, "the first outcome")

        async def committed_past_warm() -> bool:
            return (await _committed(config.group_id, config.topic)).get(tp) == 1

        await _until(committed_past_warm, 15, "the commit past the first message")
        recorder.hold_acks = True
        await _produce(config.topic, [(r, _message(r, "echo")) for r in held], partition=0)
        await _until(lambda: recorder.finished() >= set(held), 30, "five outcomes recorded")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    recorder.hold_acks = False
    await _produce(config.topic, [("while-down", _message("while-down", "echo"))], partition=0)
    return held


@pytest.mark.timeout(180)
async def test_runs_recorded_but_not_committed_when_a_worker_died_are_not_run_again(
    config: WorkerConfig, tmp_path: Path
) -> None:
    """The API recorded five outcomes but its acks never reached the worker, so Kafka has no
    commit past them; the worker is SIGKILLed. Its successor asks before running each message
    its predecessor may have run (check_done), runs none of the five, runs the message that
    arrived while no worker was up, and runs a message produced after the takeover without
    asking."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    held = await _five_recorded_then_killed(config, recorder, tmp_path)
    ran: list[str] = []
    stop = asyncio.Event()
    successor = asyncio.create_task(
        run_worker(
            dataclasses.replace(config, instance_id="it-successor"), stop, _counting_registry(ran)
        )
    )
    try:
        await _until(lambda: "while-down" in ran, 60, "the message no worker had seen")
        await _produce(config.topic, [("late", _message("late", "echo"))], partition=0)
        await _until(lambda: "late" in ran, 30, "the message produced after the takeover")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        stop.set()
        await asyncio.wait_for(successor, 30)
        await server.stop(None)
    assert ran == ["while-down", "late"]
    asked = {
        e.run_id: e.check_done
        for e in recorder.events
        if e.worker_id == "it-successor" and e.kind == pb.RUN_EVENT_KIND_STARTED
    }
    assert asked == {**dict.fromkeys(held, True), "while-down": True}
    # Not asked about: its STARTED went out merged into its outcome, as for any short run.
    assert not any(e.check_done for e in recorder.events if e.run_id == "late")
    assert "late" in recorder.finished()


@pytest.mark.timeout(180)
async def test_a_takeover_that_cannot_read_where_its_partitions_were_left_still_asks_first(
    config: WorkerConfig, tmp_path: Path
) -> None:
    """As above, but Kafka does not answer the successor's offset lookups in time (here: a
    lookup timeout no answer can meet): it cannot know up to where its predecessor fetched,
    so every message below the end its first fetch shows asks before it runs; none of the five runs
    again."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    held = await _five_recorded_then_killed(config, recorder, tmp_path)
    ran: list[str] = []
    stop = asyncio.Event()
    impatient = dataclasses.replace(
        config, instance_id="it-impatient", offset_lookup_timeout=0.000_001
    )
    successor = asyncio.create_task(run_worker(impatient, stop, _counting_registry(ran)))
    try:
        await _until(lambda: "while-down" in ran, 60, "the message no worker had seen")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        stop.set()
        await asyncio.wait_for(successor, 30)
        await server.stop(None)
    assert ran == ["while-down"]
    asked = {
        e.run_id: e.check_done
        for e in recorder.events
        if e.worker_id == "it-impatient" and e.kind == pb.RUN_EVENT_KIND_STARTED
    }
    assert asked == {**dict.fromkeys(held, True), "while-down": True}


@pytest.mark.timeout(180)
async def test_a_rebalance_hands_runs_in_progress_over_instead_of_running_them_twice(
    config: WorkerConfig,
) -> None:
    """Worker A holds a long run in every partition (and has finished five after each) when
    worker B joins. The partitions B takes are handed over: A finishes its long runs, B runs
    only what arrives after; nothing runs twice."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    blockers = {f"rb-block-{p}" for p in range(PARTITIONS)}
    oks = {f"rb-ok-{p}-{i}" for p in range(PARTITIONS) for i in range(5)}
    for p in range(PARTITIONS):
        await _produce(
            config.topic,
            [(f"rb-block-{p}", _message(f"rb-block-{p}", "sleep"))]
            + [(f"rb-ok-{p}-{i}", _message(f"rb-ok-{p}-{i}", "echo")) for i in range(5)],
            partition=p,
        )
    release = asyncio.Event()
    ran_a: list[str] = []
    ran_b: list[str] = []
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    # Instance ids sort B before A, so the round-robin assignor moves partitions to B.
    config_a = dataclasses.replace(config, instance_id="it-z", revoke_grace=0.5)
    config_b = dataclasses.replace(config, instance_id="it-b", revoke_grace=0.5)
    a = asyncio.create_task(run_worker(config_a, stop_a, _counting_registry(ran_a, block=release)))
    b: asyncio.Task[None] | None = None
    try:
        await _until(lambda: recorder.finished() >= oks, 60, "A's first outcomes")
        assert sorted(ran_a) == sorted(oks | blockers)
        b = asyncio.create_task(run_worker(config_b, stop_b, _counting_registry(ran_b)))
        # Markers sent until B runs one: then the group has settled with B in it.
        markers: set[str] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not any(r.startswith("rb-mark") for r in ran_b):
            if loop.time() > deadline:
                pytest.fail("B never got a partition")
            for p in range(PARTITIONS):
                marker = f"rb-mark-{p}-{len(markers)}"
                markers.add(marker)
                await _produce(config.topic, [(marker, _message(marker, "echo"))], partition=p)
            await asyncio.sleep(1.0)
        release.set()
        everything = oks | blockers | markers
        await _until(lambda: recorder.finished() >= everything, 30, "every outcome")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        release.set()
        stop_a.set()
        stop_b.set()
        await asyncio.wait_for(a, 30)
        if b is not None:
            await asyncio.wait_for(b, 30)
        await server.stop(None)
    executions = ran_a + ran_b
    assert sorted(executions) == sorted(everything), "every run exactly once"
    assert not (set(ran_b) & (oks | blockers)), "B ran nothing A had started"


@pytest.mark.timeout(120)
async def test_a_new_group_starts_its_lookback_back_not_at_the_start_of_the_retention(
    config: WorkerConfig,
) -> None:
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    two_hours_ago = int((time.time() - 7200) * 1000)
    await _produce(
        config.topic,
        [("old-0", _message("old-0", "echo"))],
        partition=0,
        timestamp_ms=two_hours_ago,
    )
    await _produce(config.topic, [("new-0", _message("new-0", "echo"))], partition=0)
    # Partition 1 holds only an old message: the worker starts at its end.
    await _produce(
        config.topic,
        [("old-1", _message("old-1", "echo"))],
        partition=1,
        timestamp_ms=two_hours_ago,
    )
    ran: list[str] = []
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(
            dataclasses.replace(config, new_group_lookback=3600), stop, _counting_registry(ran)
        )
    )
    try:
        await _until(lambda: "new-0" in ran, 60, "the recent message to run")
        # Nothing is lost at the end it started from: a message sent now runs.
        await _produce(config.topic, [("late-1", _message("late-1", "echo"))], partition=1)
        await _until(lambda: "late-1" in ran, 30, "a message sent after the start to run")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)
    assert sorted(ran) == ["late-1", "new-0"], "messages older than the lookback are not run"


@pytest.mark.timeout(120)
async def test_a_handler_that_ignores_its_cancellation_neither_pins_its_offset_nor_holds_shutdown(
    config: WorkerConfig,
) -> None:
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    quit_now = asyncio.Event()

    async def stubborn(ctx: HandlerContext) -> None:
        while not quit_now.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # swallows every cancellation

    registry = HandlerRegistry()
    register_builtins(registry)
    registry.register("stubborn", stubborn)
    oks = [f"after-{i}" for i in range(3)]
    await _produce(
        config.topic,
        [("stubborn-0", _message("stubborn-0", "stubborn", max_runtime=0.2))]
        + [(r, _message(r, "echo")) for r in oks],
        partition=0,
    )
    config = dataclasses.replace(config, shutdown_grace=0.5)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(config, stop, registry))
    try:
        await _until(
            lambda: recorder.kinds("stubborn-0")[-1:] == ["TIMED_OUT"], 30, "stubborn-0 TIMED_OUT"
        )
        await _until(lambda: recorder.finished() >= set(oks), 10, "the runs after it")
        await _until(lambda: _committed_equals_end(config), 15, "its offset not pinned")
        # Another stubborn run is in progress when the worker is told to stop.
        await _produce(
            config.topic,
            [("stubborn-1", _message("stubborn-1", "stubborn", max_runtime=600))],
            partition=0,
        )
        await _until(lambda: recorder.kinds("stubborn-1") == ["STARTED"], 30, "stubborn-1 STARTED")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stop.set()
        await asyncio.wait_for(worker, 30)
        # The grace, then the runner's CANCEL_GRACE for the handler to stop, then it gives up.
        assert loop.time() - t0 < config.shutdown_grace + CANCEL_GRACE + 3
    finally:
        quit_now.set()
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)
    # Cancelled by the shutdown, not finished: not committed, so it is delivered again.
    assert await _committed(config.group_id, config.topic) == {TopicPartition(config.topic, 0): 4}
    assert recorder.kinds("stubborn-1") == ["STARTED"]


@pytest.mark.timeout(120)
async def test_a_sync_handler_that_never_returns_does_not_keep_the_worker_from_exiting(
    config: WorkerConfig, tmp_path: Path
) -> None:
    """SIGTERM with a plain handler stuck in its thread: the worker drains and exits anyway,
    and the run's message stays uncommitted (delivered again)."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    await _produce(
        config.topic,
        [("sync-0", _message("sync-0", "it.sync_forever", max_runtime=600))],
        partition=0,
    )
    config = dataclasses.replace(config, shutdown_grace=0.5)
    log = tmp_path / "worker.log"
    proc = _start_worker_process(config, "it-sync", log, "tests.integration.worker_handlers")
    try:
        await _until(lambda: recorder.kinds("sync-0") == ["STARTED"], 60, "sync-0 STARTED")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(proc.wait, 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not exit 20 s after SIGTERM:\n{log.read_text()[-3000:]}")
        assert code == 0, log.read_text()[-3000:]
        assert time.monotonic() - t0 < config.shutdown_grace + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        await server.stop(None)
    assert await _committed(config.group_id, config.topic) == {}


@pytest.mark.timeout(120)
async def test_a_second_message_for_an_attempt_already_run_is_not_run_again(
    config: WorkerConfig,
) -> None:
    """A dispatcher sent the same message twice (again after a send timed out) and fired the
    run again: one attempt runs once. The next attempt of the run does run."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    first = _message("dup-0", "echo")
    refired = _message("dup-0", "echo")  # a new enqueue_time
    retry = run_message_pb2.RunMessage.FromString(first)
    retry.attempt = 2
    await _produce(
        config.topic,
        [
            ("dup-0", first),
            ("dup-0", first),
            ("dup-0", refired),
            ("dup-0", retry.SerializeToString()),
        ],
        partition=0,
    )
    ran: list[tuple[str, int]] = []
    registry = HandlerRegistry()

    async def echo(ctx: HandlerContext) -> None:
        ran.append((ctx.run_id, ctx.attempt))

    registry.register("echo", echo)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(config, stop, registry))
    try:
        await _until(lambda: ("dup-0", 2) in ran, 60, "the second attempt to run")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed to the end")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)
    assert ran == [("dup-0", 1), ("dup-0", 2)]


@pytest.mark.timeout(60)
async def test_kafka_out_of_reach_at_start_is_retried_said_and_measured(
    config: WorkerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens at the bootstrap address: the worker keeps retrying with backoff, says
    why, shows it on cronscale_worker_kafka_up and its health, and still stops at once when
    told."""
    config = dataclasses.replace(
        config,
        kafka_bootstrap=f"127.0.0.1:{_free_port()}",
        health_listen=f"127.0.0.1:{_free_port()}",
    )
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(config, stop, HandlerRegistry()))
    try:
        await _until(
            lambda: caplog.text.count("cannot reach Kafka at") >= 2, 30, "two logged retries"
        )
        assert _gauge("cronscale_worker_kafka_up", config.tier) == 0
        assert "retrying in" in caplog.text
        assert await health_status(config.health_listen) == "NOT_SERVING"
        assert f"not serving: Kafka: cannot reach {config.kafka_bootstrap}" in caplog.text
    finally:
        stop.set()
        await asyncio.wait_for(worker, 10)


@pytest.mark.timeout(120)
async def test_sigterm_finishes_what_it_can_within_the_grace_and_commits_only_that(
    config: WorkerConfig, tmp_path: Path
) -> None:
    """A worker process gets SIGTERM with a 1.5 s run and a 60 s run in progress and a 3 s
    grace: it stops fetching, the short run finishes, is reported and committed; the long one
    is cancelled, left uncommitted for another worker, and the process exits 0 on time."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    await _produce(
        config.topic, [("short", _message("short", "sleep", {"seconds": 1.5}))], partition=0
    )
    await _produce(
        config.topic, [("long", _message("long", "sleep", {"seconds": 60}))], partition=1
    )
    config = dataclasses.replace(config, shutdown_grace=3)
    log = tmp_path / "worker.log"
    proc = _start_worker_process(config, "it-term", log)
    try:
        await _until(
            lambda: (
                recorder.kinds("short") == ["STARTED"] and recorder.kinds("long") == ["STARTED"]
            ),
            60,
            "both runs STARTED",
        )
        # Sent after the signal: a draining worker must not start it.
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        await _produce(
            config.topic, [("late", _message("late", "sleep", {"seconds": 0}))], partition=0
        )
        code = await asyncio.to_thread(proc.wait, 30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        await server.stop(None)
    assert code == 0, log.read_text()[-3000:]
    assert elapsed < config.shutdown_grace + 3
    assert recorder.kinds("short") == ["STARTED", "SUCCEEDED"]
    assert recorder.kinds("long") == ["STARTED"]
    assert recorder.kinds("late") == []
    assert await _committed(config.group_id, config.topic) == {TopicPartition(config.topic, 0): 1}


@pytest.mark.timeout(120)
async def test_a_static_member_restarted_after_sigkill_resumes_at_once(
    config: WorkerConfig, tmp_path: Path
) -> None:
    """With a group instance id, a worker SIGKILLed and started again under the same id gets its
    partitions back without waiting for the dead member's session to expire (10 s), and does
    not run again what it had finished."""
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    config = dataclasses.replace(config, group_instance_id="it-static-1")
    first = [f"st-{i}" for i in range(5)]
    await _produce(config.topic, [(r, _message(r, "echo")) for r in first], partition=0)
    log = tmp_path / "worker.log"
    proc = _start_worker_process(config, "it-static", log)
    try:
        await _until(lambda: recorder.finished() >= set(first), 60, "the first outcomes")
        await _until(lambda: _committed_equals_end(config), 15, "their commit")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc = _start_worker_process(config, "it-static", log)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await _produce(config.topic, [("st-after", _message("st-after", "echo"))], partition=0)
        await _until(lambda: "st-after" in recorder.finished(), 60, "a run after the restart")
        assert loop.time() - t0 < 8, "the restarted member waited for the old one's session"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        await server.stop(None)
    for run_id in first:
        assert recorder.kinds(run_id).count("SUCCEEDED") == 1, run_id


@pytest.mark.timeout(120)
@pytest.mark.parametrize("member", ["it-wedged", ""], ids=["static member", "dynamic member"])
async def test_a_consumer_whose_commit_never_returns_is_replaced_and_nothing_runs_twice(
    config: WorkerConfig, caplog: pytest.LogCaptureFixture, member: str
) -> None:
    """The wedge of a Kafka restart (2026-12-07): aiokafka's commit waited forever and the
    worker executed nothing more. A commit still waiting after ``commit_stuck`` has the worker
    drop its consumer and start another, which rejoins the group (under the same static member
    name, or as a new member once the old one has left); what the old one ran and could not
    commit is not run again."""
    config = dataclasses.replace(config, commit_stuck=2.0, group_instance_id=member)
    recorder = Recorder()
    server = await _serve(recorder, int(config.api_target.rsplit(":", 1)[1]))
    registry = HandlerRegistry()
    register_builtins(registry)
    reporter = RunReporter(config.api_target)
    await reporter.start()
    runner = Runner(registry=registry, reporter=reporter, worker_id=config.instance_id)
    worker = KafkaRunConsumer(config, runner)
    replaced_before = _gauge("cronscale_worker_consumers_replaced_total", config.tier) or 0.0

    def batch(prefix: str) -> list[tuple[str, bytes]]:
        return [(f"{prefix}-{i}", _message(f"{prefix}-{i}", "echo", {"i": i})) for i in range(10)]

    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await _produce(config.topic, batch("a"))
        await _until(lambda: _committed_equals_end(config), 60, "the first batch committed")
        wedged = worker._consumer
        assert wedged is not None

        async def never(*_args: object, **_kwargs: object) -> None:
            await asyncio.Event().wait()  # as the wedged client's commit did

        wedged.commit = never
        await _produce(config.topic, batch("b"))
        await _until(lambda: worker._consumer is not wedged, 30, "the consumer replaced")
        await _produce(config.topic, batch("c"))
        await _until(lambda: _committed_equals_end(config), 60, "every batch committed")
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await reporter.close()
        await server.stop(None)

    for prefix in "abc":
        for i in range(10):
            run_id = f"{prefix}-{i}"
            assert recorder.kinds(run_id) == ["STARTED", "SUCCEEDED"], run_id
    assert "Kafka has not taken an offset commit for 2 s; replacing the Kafka consumer" in (
        caplog.text
    )
    replaced = _gauge("cronscale_worker_consumers_replaced_total", config.tier)
    assert replaced == replaced_before + 1
