"""The worker against the real local Kafka: run, report, and commit only what is recorded.

Each test uses its own topic prefix (so its own topic and consumer group). The reporting side is
an in-process gRPC server implementing our own RunReportingService contract, recording events.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import grpc
import grpc.aio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from cronscale.v1 import run_message_pb2
from cronscale.v1 import run_reporting_service_pb2 as pb
from cronscale.v1 import run_reporting_service_pb2_grpc as pb_grpc
from worker.builtin import register_builtins
from worker.config import WorkerConfig
from worker.handlers import HandlerContext, HandlerRegistry
from worker.main import run_worker

pytestmark = pytest.mark.integration

BOOTSTRAP = os.environ.get("CRONSCALE_KAFKA_BOOTSTRAP") or (
    f"127.0.0.1:{os.environ.get('CRONSCALE_LOCAL_KAFKA_PORT') or 9092}"
)
PARTITIONS = 3


class Recorder(pb_grpc.RunReportingServiceServicer):
    """Records every ReportRuns event; acks each one."""

    def __init__(self) -> None:
        self.events: list[pb.RunEvent] = []

    async def ReportRuns(
        self,
        request: pb.ReportRunsRequest,
        context: grpc.aio.ServicerContext[pb.ReportRunsRequest, pb.ReportRunsResponse],
    ) -> pb.ReportRunsResponse:
        self.events.extend(request.events)
        return pb.ReportRunsResponse(acks=[pb.RunEventAck(run_id=e.run_id) for e in request.events])

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


def _require_kafka() -> None:
    host, _, port = BOOTSTRAP.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), 3).close()
    except OSError as e:
        pytest.fail(
            f"Kafka is not reachable at {BOOTSTRAP} ({e}); "
            "start it with `cronscale local up` (or make dev)",
            pytrace=False,
        )


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
    _require_kafka()
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


def _message(run_id: str, handler: str, payload: object = None) -> bytes:
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
    return msg.SerializeToString()


async def _produce(topic: str, messages: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    await producer.start()
    try:
        for run_id, value in messages:
            await producer.send(topic, value, key=run_id.encode())
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
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


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
async def test_outcomes_wait_for_the_api_and_offsets_wait_for_the_ack(
    config: WorkerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    port = int(config.api_target.rsplit(":", 1)[1])
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
        # The API goes away while the handlers are still running.
        await server.stop(None)
        await _until(lambda: len(finished) == 3, 10, "the slow handlers to finish")
        await asyncio.sleep(1.0)
        # Outcomes are not acknowledged, so nothing may be committed yet.
        assert await _committed(config.group_id, config.topic) == {}
        assert not recorder.finished()
        assert "retrying" in caplog.text

        server = await _serve(recorder, port)
        await _until(lambda: recorder.finished() == set(run_ids), 20, "the retried outcomes")
        await _until(lambda: _committed_equals_end(config), 15, "offsets committed after the ack")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)
    for run_id in run_ids:
        assert recorder.kinds(run_id) == ["STARTED", "SUCCEEDED"]
    assert await _committed(config.group_id, config.topic) == end
