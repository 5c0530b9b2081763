"""Reading back what a dispatcher produced, for tests against the real Kafka."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer

from cronscale.v1 import run_message_pb2


async def read_run_messages(bootstrap: str, topic: str) -> list[run_message_pb2.RunMessage]:
    """Every run message on ``topic`` (a fresh consumer group from the earliest offset)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=f"{topic}.check",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=5000)
        return [
            run_message_pb2.RunMessage.FromString(rec.value)
            for records in batch.values()
            for rec in records
            if rec.value is not None
        ]
    finally:
        await consumer.stop()
