"""Starting the run queue's producer (scheduler.kafka.KafkaRunQueue.start) against a broker
address that accepts connections and never answers (a cluster half up): it gives up within
START_DEADLINE with Unavailable naming the address, instead of hanging the process's start.
Loopback only; no Kafka needed."""

from __future__ import annotations

import asyncio

import pytest

import scheduler.kafka
from scheduler.errors import Unavailable
from scheduler.kafka import KafkaRunQueue


async def test_a_broker_that_never_answers_fails_the_start_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler.kafka, "START_DEADLINE", 0.5)
    monkeypatch.setattr(scheduler.kafka, "STOP_DEADLINE", 0.2)
    held: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    queue = KafkaRunQueue(f"127.0.0.1:{port}")
    try:
        with pytest.raises(Unavailable, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
            await asyncio.wait_for(queue.start(), 5)
    finally:
        await queue.stop()  # the fresh producer it keeps for the next start
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
