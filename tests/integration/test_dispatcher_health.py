"""A dispatcher's gRPC health (CRONSCALE_HEALTH_LISTEN) against the real Cassandra and Kafka:
NOT_SERVING while it waits for Kafka at start, SERVING once both answer, NOT_SERVING with the
reason in its log while Cassandra is out of reach (its connection runs through a proxy the test
cuts) or while Kafka is down (a private Kafka, SIGKILLed and started again), and SERVING again
by itself when the service is back (issue 7, services down)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc.aio
import pytest

from ops.local import down, up
from ops.local import process as local_process
from ops.migrate import migrate
from scheduler.config import Config
from scheduler.dispatcher.service import run_dispatcher
from tests.services import health_status, private_stack_settings
from tests.services import test_config as isolated_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until(check: Callable[[], object], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


class _Proxy:
    """A TCP proxy on loopback to ``port`` that the test can cut (listener and every
    connection closed) and restore on the same port. It runs on threads of its own: the
    dispatcher under test does blocking Cassandra calls on the test's event loop."""

    def __init__(self, port: int) -> None:
        self.port = _free_port()
        self._target = port
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket()
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen()
        except OSError:
            listener.close()
            raise
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        if self._listener is not None:
            # Closing alone does not wake the thread blocked in accept(), which keeps the
            # port listening; shutting the socket down does.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._sockets |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.mark.timeout(90)
async def test_a_dispatcher_waiting_for_kafka_is_not_serving(migrated: Config) -> None:
    config = dataclasses.replace(
        migrated,
        kafka_bootstrap=f"127.0.0.1:{_free_port()}",
        health_listen=f"127.0.0.1:{_free_port()}",
    )
    stop = asyncio.Event()
    dispatcher = asyncio.create_task(run_dispatcher(config, stop))
    try:
        await _until(lambda: _answers(config.health_listen), 20, "the health service")
        await asyncio.sleep(2)
        assert await health_status(config.health_listen) == "NOT_SERVING"
    finally:
        stop.set()
        await asyncio.wait_for(dispatcher, 15)


async def _answers(listen: str) -> bool:
    try:
        await health_status(listen)
    except grpc.aio.AioRpcError:
        return False
    return True


@pytest.mark.timeout(120)
async def test_a_dispatcher_is_not_serving_while_cassandra_is_out_of_reach(
    migrated: Config, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = _Proxy(migrated.cassandra_port)
    proxy.open()
    config = dataclasses.replace(
        migrated, cassandra_port=proxy.port, health_listen=f"127.0.0.1:{_free_port()}"
    )
    stop = asyncio.Event()
    dispatcher = asyncio.create_task(run_dispatcher(config, stop))
    try:
        await _until(lambda: _health_is(config.health_listen, "SERVING"), 60, "SERVING at first")
        proxy.cut()
        await _until(lambda: _health_is(config.health_listen, "NOT_SERVING"), 20, "NOT_SERVING")
        assert "not serving: Cassandra does not answer" in caplog.text
        proxy.open()
        await _until(lambda: _health_is(config.health_listen, "SERVING"), 60, "SERVING again")
        assert "serving again" in caplog.text
    finally:
        stop.set()
        await asyncio.wait_for(dispatcher, 30)
        proxy.cut()


async def _health_is(listen: str, status: str) -> bool:
    return await health_status(listen) == status


@pytest.mark.timeout(240)
async def test_a_dispatcher_is_not_serving_while_kafka_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka itself goes away (SIGKILL of a private Kafka, which is then started again): the
    dispatcher's probe finds it within seconds and says so, and it serves again by itself."""
    settings = private_stack_settings(tmp_path / "stack")
    await asyncio.to_thread(up, settings, lambda _line: None)
    try:
        config = isolated_config(
            cassandra_port=settings.cql_port,
            kafka_bootstrap=f"{settings.host}:{settings.kafka_port}",
            health_listen=f"127.0.0.1:{_free_port()}",
        )
        await asyncio.to_thread(migrate, config, lambda _line: None)
        stop = asyncio.Event()
        dispatcher = asyncio.create_task(run_dispatcher(config, stop))
        try:
            await _until(
                lambda: _health_is(config.health_listen, "SERVING"), 60, "SERVING at first"
            )
            record = local_process.read_pid_file(settings.pid_file("kafka"))
            assert record is not None
            os.kill(record.pid, signal.SIGKILL)
            await _until(lambda: _health_is(config.health_listen, "NOT_SERVING"), 30, "NOT_SERVING")
            assert "not serving: Kafka does not answer" in caplog.text
            await _until(
                lambda: (
                    not any(
                        local_process.port_in_use(settings.host, s.port)
                        for s in settings.ports("kafka")
                    )
                ),
                60,
                "Kafka's ports to be released",
            )
            await asyncio.to_thread(up, settings, lambda _line: None)
            await _until(lambda: _health_is(config.health_listen, "SERVING"), 60, "SERVING again")
        finally:
            stop.set()
            await asyncio.wait_for(dispatcher, 30)
    finally:
        await asyncio.to_thread(down, settings, lambda _line: None)
