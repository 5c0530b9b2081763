"""Starting the run queue's producer (scheduler.kafka.KafkaRunQueue.start) against a broker
address that accepts connections and never answers (a cluster half up): it gives up within
its start deadline with Unavailable naming the address, instead of hanging the process's start.
Loopback only; no Kafka needed."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.errors import Unavailable
from scheduler.kafka import KafkaRunQueue


async def test_a_broker_that_never_answers_fails_the_start_in_time() -> None:
    held: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    queue = KafkaRunQueue(f"127.0.0.1:{port}", start_deadline=0.5, stop_deadline=0.2)
    try:
        with pytest.raises(Unavailable, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
            await asyncio.wait_for(queue.start(), 5)
    finally:
        await queue.stop()  # the fresh producer it keeps for the next start
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
