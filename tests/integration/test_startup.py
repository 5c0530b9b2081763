"""A dispatcher or API replica started while Cassandra or Kafka is away waits for it, saying
why, instead of exiting (issue 7, services down); it still stops at once when told."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time

import pytest

from scheduler.api.server import serve
from scheduler.config import Config
from scheduler.dispatcher.service import run_dispatcher


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until_logged(caplog: pytest.LogCaptureFixture, text: str, times: int) -> None:
    deadline = time.monotonic() + 40
    while caplog.text.count(text) < times:
        assert time.monotonic() < deadline, f"{text!r} not logged {times} times:\n{caplog.text}"
        await asyncio.sleep(0.2)


@pytest.mark.timeout(90)
async def test_a_dispatcher_started_while_kafka_is_away_waits_for_it(
    migrated: Config, caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(
        migrated, kafka_bootstrap=f"127.0.0.1:{_free_port()}", metrics_port=0
    )
    stop = asyncio.Event()
    dispatcher = asyncio.create_task(run_dispatcher(config, stop))
    try:
        await _until_logged(caplog, "starting the Kafka producer: cannot reach Kafka at", 2)
        assert not dispatcher.done()  # still there, not exited
        assert "retrying in" in caplog.text
    finally:
        stop.set()
        await asyncio.wait_for(dispatcher, 15)


@pytest.mark.timeout(90)
async def test_an_api_started_while_cassandra_is_away_waits_for_it(
    migrated: Config, caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(
        migrated,
        cassandra_port=_free_port(),
        api_listen=f"127.0.0.1:{_free_port()}",
        metrics_port=0,
    )
    stop = asyncio.Event()
    api = asyncio.create_task(serve(config, stop))
    try:
        await _until_logged(caplog, "opening Cassandra: cannot reach Cassandra at", 2)
        assert not api.done()
    finally:
        stop.set()
        await asyncio.wait_for(api, 15)
