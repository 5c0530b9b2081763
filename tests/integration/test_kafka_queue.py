"""The run queue against the real Kafka: produced run messages arrive intact and keyed."""

from __future__ import annotations

import asyncio
import logging
import socket
from asyncio import StreamReader, StreamWriter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.metadata import MetadataRequest, MetadataRequest_v1, MetadataRequest_v5

from cronscale.v1 import run_message_pb2
from scheduler.config import Config
from scheduler.errors import Unavailable
from scheduler.kafka import KafkaRunQueue, ensure_topics


async def _consume(config: Config, topic: str, count: int) -> list[tuple[int, bytes, bytes]]:
    """The first ``count`` records of ``topic``, as (partition, key, value), in arrival order."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=config.kafka_bootstrap,
        auto_offset_reset="earliest",
        group_id=f"{topic}.check",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    got: list[tuple[int, bytes, bytes]] = []
    try:
        while len(got) < count:
            batch = await consumer.getmany(timeout_ms=5000)
            assert batch, "timed out waiting for run messages"
            for records in batch.values():
                for rec in records:
                    assert rec.key is not None and rec.value is not None
                    got.append((rec.partition, rec.key, rec.value))
    finally:
        await consumer.stop()
    return got


async def _consumed_run_ids(config: Config, topic: str, count: int) -> list[str]:
    """The run ids of the first ``count`` records of ``topic``, in arrival order."""
    return [
        run_message_pb2.RunMessage.FromString(v).run_id
        for _, _, v in await _consume(config, topic, count)
    ]


async def _produce(
    config: Config, topic: str, *slices: Sequence[run_message_pb2.RunMessage]
) -> None:
    """Enqueues each of ``slices`` in turn through one run queue."""
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    try:
        for messages in slices:
            await queue.enqueue(topic, messages)
    finally:
        await queue.stop()


async def test_enqueue_produces_versioned_messages(config: Config) -> None:
    topic = config.topic()
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=3)
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=3)  # idempotent
    sent = [
        run_message_pb2.RunMessage(
            schema_version=1, run_id=f"s{i % 3}@r{i}", schedule_id=f"s{i % 3}", handler="echo"
        )
        for i in range(30)
    ]
    await _produce(config, topic, sent)

    got = [
        (key, run_message_pb2.RunMessage.FromString(value))
        for _, key, value in await _consume(config, topic, len(sent))
    ]
    assert sorted(m.run_id for _, m in got) == sorted(m.run_id for m in sent)
    assert all(key.decode() == m.schedule_id for key, m in got)
    # One schedule's runs stay in order: they share a partition.
    for sid in ("s0", "s1", "s2"):
        ordered = [m.run_id for _, m in got if m.schedule_id == sid]
        assert ordered == [m.run_id for m in sent if m.schedule_id == sid]


async def test_each_message_goes_to_its_keys_partition_as_send_would_put_it(
    config: Config,
) -> None:
    """A batch per partition puts every message where a producer's own ``send()`` (and the Java
    client's default partitioner) puts its key: tools and other producers agree on it."""
    topic = config.topic("partitioned")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=7)
    sent = [
        run_message_pb2.RunMessage(
            schema_version=1, run_id=f"sched-{i}@r", schedule_id=f"sched-{i}", handler="echo"
        )
        for i in range(200)
    ]
    await _produce(config, topic, sent, sent[:50])  # the second from the keys' hashes kept
    got = await _consume(config, topic, 250)
    partitions = list(range(7))
    for partition, key, _ in got:
        assert partition == DefaultPartitioner()(key, partitions, partitions), key


async def test_a_partition_fuller_than_one_batch_keeps_its_order(config: Config) -> None:
    """Messages of one partition over several record batches (256 KiB each) arrive whole and
    in the order they were given."""
    topic = config.topic("large")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=2)
    sent = [
        run_message_pb2.RunMessage(
            schema_version=1,
            run_id=f"big@r{i}",
            schedule_id="big",
            handler="echo",
            payload=bytes([i]) * 100_000,
        )
        for i in range(8)
    ]
    await _produce(config, topic, sent)
    got = await _consume(config, topic, len(sent))
    assert [run_message_pb2.RunMessage.FromString(v).run_id for _, _, v in got] == [
        m.run_id for m in sent
    ]
    assert [run_message_pb2.RunMessage.FromString(v).payload for _, _, v in got] == [
        m.payload for m in sent
    ]


def _messages(prefix: str, count: int) -> list[run_message_pb2.RunMessage]:
    return [
        run_message_pb2.RunMessage(
            schema_version=1, run_id=f"{prefix}@r{i}", schedule_id=prefix, handler="echo"
        )
        for i in range(count)
    ]


async def test_concurrent_enqueues_share_a_partitions_record_batch(config: Config) -> None:
    """Ten calls at once (a herd's releases) fill one record batch of the partition rather than
    ten, each of which would wait for the one before it to leave the producer; every call's
    messages arrive, each call's in its order."""
    topic = config.topic("shared")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    producer = queue._producer
    submitted: list[int] = []
    real = producer.send_batch

    async def counting(batch: Any, topic: str, *, partition: int) -> Any:
        submitted.append(batch.record_count())
        return await real(batch, topic, partition=partition)

    producer.send_batch = counting
    calls = [_messages(f"c{c}", 20) for c in range(10)]
    try:
        await queue.enqueue(topic, _messages("warm", 1))  # the topic's metadata known
        submitted.clear()
        await asyncio.gather(*(queue.enqueue(topic, ms) for ms in calls))
    finally:
        await queue.stop()
    assert submitted == [200]
    got = await _consumed_run_ids(config, topic, 201)
    for ms in calls:
        assert [r for r in got if r.startswith(ms[0].schedule_id + "@")] == [m.run_id for m in ms]


async def test_a_call_given_up_on_does_not_fail_the_calls_sharing_its_batch(
    config: Config,
) -> None:
    """A call cancelled while its batch is on its way (its deadline passed) leaves the batch to
    the other calls in it: theirs are acknowledged and arrive (and so do its own, as at-least-once
    allows: its firings are sent again)."""
    topic = config.topic("cancelled")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    try:
        await queue.enqueue(topic, _messages("warm", 1))
        first = asyncio.create_task(queue.enqueue(topic, _messages("first", 5)))
        second = asyncio.create_task(queue.enqueue(topic, _messages("second", 5)))
        await asyncio.sleep(0)  # both appended, neither acknowledged
        first.cancel()
        await second
        assert first.cancelled()
    finally:
        await queue.stop()
    got = await _consumed_run_ids(config, topic, 11)
    assert [r for r in got if r.startswith("second@")] == [f"second@r{i}" for i in range(5)]


async def test_a_batch_the_producer_refuses_fails_every_call_in_it(config: Config) -> None:
    """A batch whose hand-over fails (the producer's wait for the partition's previous batch
    timed out) fails every call whose messages it carries, with the producer's error, and sends
    none of them; the partition's next batch goes out as usual."""
    topic = config.topic("refused")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    producer = queue._producer
    real = producer.send_batch
    refused: list[int] = []

    async def refusing_once(batch: Any, topic: str, *, partition: int) -> Any:
        if not refused:
            refused.append(batch.record_count())
            raise KafkaTimeoutError()
        return await real(batch, topic, partition=partition)

    producer.send_batch = refusing_once
    try:
        outcomes = await asyncio.gather(
            queue.enqueue(topic, _messages("a", 3)),
            queue.enqueue(topic, _messages("b", 3)),
            return_exceptions=True,
        )
        assert refused == [6]
        assert [type(o) for o in outcomes] == [KafkaTimeoutError, KafkaTimeoutError]
        await queue.enqueue(topic, _messages("c", 3))
    finally:
        await queue.stop()
    got = await _consumed_run_ids(config, topic, 3)
    assert got == ["c@r0", "c@r1", "c@r2"]


async def test_a_batch_dropped_unsent_fails_its_calls_as_a_kafka_error(config: Config) -> None:
    """A batch whose delivery the producer cancels (it was stopped under it) fails its calls
    with a KafkaError, which has the firing batch sent again, never with a CancelledError, which
    would read as the caller's own cancellation."""
    topic = config.topic("dropped")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()

    async def dropped(batch: Any, topic: str, *, partition: int) -> Any:
        sent = asyncio.get_running_loop().create_future()
        sent.cancel()
        return sent

    queue._producer.send_batch = dropped
    try:
        with pytest.raises(KafkaError, match="dropped a record batch"):
            await queue.enqueue(topic, _messages("d", 2))
    finally:
        await queue.stop()


async def test_a_cancelled_submitter_fails_its_lanes_batches_at_once(config: Config) -> None:
    """A partition's submitter cancelled (the queue or the process stopping) while it waits to
    hand a batch over fails that batch and the ones queued behind it with a KafkaError at once,
    not at their senders' 15-second deadline; the partition's next message starts afresh."""
    topic = config.topic("cancelled-submitter")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    real = queue._producer.send_batch
    handing = asyncio.Event()

    async def stuck(batch: Any, topic: str, *, partition: int) -> Any:
        handing.set()
        await asyncio.Event().wait()  # the previous batch never leaves the accumulator

    queue._producer.send_batch = stuck
    try:
        first = asyncio.create_task(queue.enqueue(topic, _messages("first", 2)))
        await handing.wait()
        # The first batch is in hand; a second call's messages fill the next batch.
        second = asyncio.create_task(queue.enqueue(topic, _messages("second", 2)))
        (lane,) = queue._lanes.values()
        for _ in range(100):
            if lane.queued:
                break
            await asyncio.sleep(0.01)
        assert lane.submitter is not None and len(lane.queued) == 1
        lane.submitter.cancel()
        outcomes = await asyncio.wait_for(
            asyncio.gather(first, second, return_exceptions=True), timeout=2
        )
        assert [type(o) for o in outcomes] == [KafkaError, KafkaError]
        assert "stopped before the record batch was handed over" in str(outcomes[0])
        assert lane.submitter is None and not lane.queued and lane.open is None
        queue._producer.send_batch = real
        await queue.enqueue(topic, _messages("third", 2))
    finally:
        await queue.stop()
    assert await _consumed_run_ids(config, topic, 2) == ["third@r0", "third@r1"]


async def test_a_producer_that_fails_on_its_own_state_is_replaced_once(config: Config) -> None:
    """A batch failing with an error about the producer's state (OutOfOrderSequenceNumber: its
    idempotence numbering went wrong after a batch expired) marks the producer stale; the
    calls that find it stale together replace it once, and their messages go out on the new
    one. An error about the message itself (too large) does not replace it."""
    topic = config.topic("stale-producer")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    first = queue._producer

    async def out_of_order(batch: Any, topic: str, *, partition: int) -> Any:
        raise OutOfOrderSequenceNumber()

    first.send_batch = out_of_order
    made = 0
    new_producer = queue._new_producer

    def counted() -> Any:
        nonlocal made
        made += 1
        return new_producer()

    queue._new_producer = counted  # type: ignore[method-assign]
    try:
        with pytest.raises(OutOfOrderSequenceNumber):
            await queue.enqueue(topic, _messages("a", 2))
        assert queue._stale
        await asyncio.gather(
            queue.enqueue(topic, _messages("b", 2)), queue.enqueue(topic, _messages("c", 2))
        )
        assert made == 1
        assert queue._producer is not first and not queue._stale
        second = queue._producer
        with pytest.raises(MessageSizeTooLargeError):
            big = run_message_pb2.RunMessage(
                schedule_id="big", run_id="big@r0", payload=b"x" * (2 << 20)
            )
            await queue.enqueue(topic, [big])
        assert not queue._stale and queue._producer is second
    finally:
        await queue.stop()
    got = await _consumed_run_ids(config, topic, 4)
    assert sorted(got) == ["b@r0", "b@r1", "c@r0", "c@r1"]


async def test_a_replaced_producer_that_cannot_flush_is_closed_all_the_same(
    config: Config,
) -> None:
    """A replaced producer whose flush does not end within its stop deadline (its batches stuck on a
    broker that is away) has its sender stopped and its connections closed: left running, it
    delivered its batches once Kafka was back, long after their firings were sent again."""
    topic = config.topic("unflushed")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap, stop_deadline=0.2)
    await queue.start()
    old = queue._producer

    async def never_drains() -> None:
        await asyncio.Event().wait()

    old._message_accumulator.close = never_drains
    queue._stale = True
    try:
        await queue.enqueue(topic, _messages("after", 1))
        assert queue._producer is not old
        assert old._sender.sender_task.done()
        assert all(conn.connected() is False for conn in old.client._conns.values())
    finally:
        await queue.stop()
    assert await _consumed_run_ids(config, topic, 1) == ["after@r0"]


async def test_the_probe_asks_for_no_topic(config: Config) -> None:
    """The health probe gets an answer from a broker without asking for every topic's metadata
    (a cluster's thousands of topics, every 2 s). (That it fails while Kafka is down is
    tests/integration/test_dispatcher_health.py's.)"""
    topic = config.topic()
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    sent: list[object] = []
    client = queue._producer.client
    original = client.send

    async def spy(node_id: object, request: object, **kw: object) -> object:
        sent.append(request)
        return await original(node_id, request, **kw)

    client.send = spy
    try:
        await queue.probe()
    finally:
        client.send = original
        await queue.stop()
    [request] = sent
    assert isinstance(request, MetadataRequest)
    # What goes on the wire, at every version a broker can be asked for: an empty topic array
    # (a null one would mean every topic).
    for version in (MetadataRequest_v1, MetadataRequest_v5):
        assert request.build(version).topics == []


def _forward_to(host: str, port: int) -> Callable[[StreamReader, StreamWriter], Awaitable[None]]:
    """A TCP connection handler piping each connection to ``host:port`` (a bootstrap address
    that can be opened and closed; the brokers the metadata names are reached directly)."""

    async def pipe(source: StreamReader, sink: StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    async def handle(reader: StreamReader, writer: StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )

    return handle


async def _probes_until(queue: KafkaRunQueue, *, answered: bool, attempts: int) -> bool:
    """Probes every 0.5 s, ``attempts`` times or, with ``answered``, until one answers;
    whether one did."""
    for _ in range(attempts):
        try:
            await queue.probe()
            if answered:
                return True
        except KafkaError:
            pass
        await asyncio.sleep(0.5)
    return False


async def test_a_producer_that_could_not_start_is_started_by_the_probe_once_kafka_answers(
    config: Config,
) -> None:
    """A dispatcher that stepped aside while Kafka was away sends no batch: its probe alone must
    bring the producer back, or it never serves (nor rejoins) again. Kafka is reached here
    through a bootstrap address nothing listens on at first."""
    topic = config.topic("probe-restart")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    queue = KafkaRunQueue(f"127.0.0.1:{port}", start_deadline=2.0)
    with pytest.raises(Unavailable):
        await queue.start()
    with pytest.raises(KafkaError):
        await queue.probe()
    host, kafka_port = config.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    bootstrap = await asyncio.start_server(_forward_to(host, int(kafka_port)), "127.0.0.1", port)
    try:
        assert await _probes_until(queue, answered=True, attempts=40), "no answer in 20 s"
        await queue.enqueue(topic, _messages("back", 1))
    finally:
        await queue.stop()
        bootstrap.close()
    assert await _consumed_run_ids(config, topic, 1) == ["back@r0"]


async def test_an_outage_is_logged_when_it_begins_and_when_it_ends(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    """While Kafka stays away the probe replaces the producer every 2 s: the replacement is
    logged once, at WARNING, and the producer's return once, at INFO; the attempts between
    are DEBUG. Kafka is reached through a bootstrap address that is closed and opened again."""
    topic = config.topic("outage-log")
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    host, kafka_port = config.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    forward = _forward_to(host, int(kafka_port))
    bootstrap = await asyncio.start_server(forward, "127.0.0.1", port)
    queue = KafkaRunQueue(f"127.0.0.1:{port}", start_deadline=1.0)
    await queue.start()
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.DEBUG, logger="scheduler.kafka")
    try:
        bootstrap.close()
        await bootstrap.wait_closed()
        queue._stale = True  # a batch failed, as in the tests above
        started = loop.time()
        await _probes_until(queue, answered=False, attempts=8)
        assert loop.time() - started > 3
        bootstrap = await asyncio.start_server(forward, "127.0.0.1", port)
        assert await _probes_until(queue, answered=True, attempts=40), (
            "the probe never brought the producer back"
        )
        await queue.enqueue(topic, _messages("after-outage", 1))
    finally:
        await queue.stop()
        bootstrap.close()
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "scheduler.kafka"]
    loud = [(level, text) for level, text in logged if level >= logging.INFO]
    assert [level for level, _ in loud] == [logging.WARNING, logging.INFO], logged
    assert "replacing the Kafka producer" in loud[0][1]
    assert "started after" in loud[1][1]
    assert sum(level == logging.DEBUG for level, _ in logged) >= 2, logged
    assert await _consumed_run_ids(config, topic, 1) == ["after-outage@r0"]
