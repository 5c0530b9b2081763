"""The run queue against the real Kafka: produced run messages arrive intact and keyed."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.protocol.metadata import MetadataRequest, MetadataRequest_v1, MetadataRequest_v5

from cronscale.v1 import run_message_pb2
from scheduler.config import Config
from scheduler.kafka import KafkaRunQueue, ensure_topics


async def test_enqueue_produces_versioned_messages(config: Config) -> None:
    topic = config.topic()
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=3)
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=3)  # idempotent
    queue = KafkaRunQueue(config.kafka_bootstrap)
    await queue.start()
    try:
        sent = [
            run_message_pb2.RunMessage(
                schema_version=1, run_id=f"s{i % 3}@r{i}", schedule_id=f"s{i % 3}", handler="echo"
            )
            for i in range(30)
        ]
        await queue.enqueue(topic, sent)
    finally:
        await queue.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=config.kafka_bootstrap,
        auto_offset_reset="earliest",
        group_id=f"{topic}.check",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        got: list[tuple[bytes, run_message_pb2.RunMessage]] = []
        while len(got) < len(sent):
            batch = await consumer.getmany(timeout_ms=5000)
            assert batch, "timed out waiting for run messages"
            for records in batch.values():
                for rec in records:
                    assert rec.key is not None and rec.value is not None
                    got.append((rec.key, run_message_pb2.RunMessage.FromString(rec.value)))
    finally:
        await consumer.stop()
    assert sorted(m.run_id for _, m in got) == sorted(m.run_id for m in sent)
    assert all(key.decode() == m.schedule_id for key, m in got)
    # One schedule's runs stay in order: they share a partition.
    for sid in ("s0", "s1", "s2"):
        ordered = [m.run_id for _, m in got if m.schedule_id == sid]
        assert ordered == [m.run_id for m in sent if m.schedule_id == sid]


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
