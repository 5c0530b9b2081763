"""aiokafka on uvloop, against the real Kafka: a request written to a connection the broker has
just reset fails as a broken connection (``KafkaConnectionError``, which aiokafka retries), not
with uvloop's ``RuntimeError``, which ended the client's metadata task and wedged a worker
(``worker/kafka_uvloop.py``).

The reset is what the event loop does when the broker's reset arrives: the transport is closed
at once, while aiokafka's connection still counts as connected until its reader task notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.metadata import MetadataRequest

from tests.services import KAFKA_BOOTSTRAP as BOOTSTRAP
from tests.services import require_kafka
from worker.kafka_uvloop import tolerate_reset_connections

pytestmark = pytest.mark.integration


def _on_uvloop(test: Callable[[], Awaitable[None]]) -> None:
    """Runs ``test`` on a uvloop event loop, as the cronscale processes run."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(test(), 30))


class _ResettingProxy:
    """A TCP proxy to the broker that can reset its clients' connections, as a broker's host
    does when the broker is killed (an RST: the client reads ECONNRESET)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._clients: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return "127.0.0.1", int(self._server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._clients:
            writer.close()

    def reset_clients(self) -> None:
        for writer in self._clients:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.append(writer)
        up_reader, up_writer = await asyncio.open_connection(*self._target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, RuntimeError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def _request_in_reset_window(
    conn: Any, proxy: _ResettingProxy
) -> tuple[bool, BaseException | None]:
    """Resets ``conn`` and sends a request in the window that follows: the loop has closed the
    transport (``connection_lost`` ran with the reset), aiokafka's reader task has failed but
    its callback has not closed the connection yet, so it still counts as connected. Returns
    whether it did, and what the request raised (None if nothing)."""
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[tuple[bool, BaseException | None]] = loop.create_future()

    def in_window(_: object) -> None:
        still_connected = conn.connected()
        try:
            sent = conn.send(MetadataRequest([]))
        except Exception as e:  # what the test is about
            seen.set_result((still_connected, e))
            return
        sent.close()  # the wait for an answer that cannot come
        seen.set_result((still_connected, None))

    # connection_lost resolves this future after failing the reader: its callbacks run before
    # the reader task's own done callback, which closes the connection.
    conn._closed_fut.add_done_callback(in_window)
    proxy.reset_clients()
    return await seen


def test_a_request_on_a_reset_connection_fails_as_a_broken_connection() -> None:
    host, port = require_kafka(BOOTSTRAP)
    tolerate_reset_connections()

    async def test() -> None:
        proxy = _ResettingProxy(host, port)
        async with proxy as (proxy_host, proxy_port):
            conn = await create_conn(proxy_host, proxy_port)
            try:
                answer = await conn.send(MetadataRequest([]))
                assert answer.brokers  # the connection works before the reset
                still_connected, error = await _request_in_reset_window(conn, proxy)
                assert still_connected  # aiokafka would have handed this connection out
                assert isinstance(error, KafkaConnectionError), repr(error)
                assert "broken" in str(error)
                assert not conn.connected()  # closed, so the next request opens a new one
            finally:
                conn.close()

    _on_uvloop(test)


def test_installing_twice_wraps_once() -> None:
    from aiokafka.conn import AIOKafkaConnection

    tolerate_reset_connections()
    send = AIOKafkaConnection.send
    tolerate_reset_connections()
    assert AIOKafkaConnection.send is send
    assert not hasattr(send.__wrapped__, "_cronscale_tolerates_reset")
