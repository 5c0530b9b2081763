"""The scale-out benchmark's pieces: the TCP relay to a simulated host (loadtest/forward.py,
over real loopback sockets) and the failover figures (loadtest/firing.py)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import socket

import pytest

from loadtest.firing import _port_of, failover
from loadtest.forward import parse_route, serve


def test_routes_are_parsed_and_bad_ones_name_the_part_that_is_wrong() -> None:
    assert parse_route("10.77.1.1:9042=127.0.0.1:9042") == (
        ("10.77.1.1", 9042),
        ("127.0.0.1", 9042),
    )
    with pytest.raises(ValueError, match="expected LISTEN_HOST:PORT=TARGET_HOST:PORT"):
        parse_route("127.0.0.1:9042")
    with pytest.raises(
        ValueError, match=re.escape("the target address '127.0.0.1:x' is not HOST:PORT")
    ):
        parse_route("127.0.0.1:1=127.0.0.1:x")
    with pytest.raises(ValueError, match="the listen address ':9042' is not HOST:PORT"):
        parse_route(":9042=127.0.0.1:9042")
    with pytest.raises(ValueError, match=re.escape("the listen address '127.0.0.1:70000'")):
        parse_route("127.0.0.1:70000=127.0.0.1:1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_relay_copies_both_ways_and_passes_on_a_close() -> None:
    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    target = await asyncio.start_server(upper, "127.0.0.1", 0)
    target_port = target.sockets[0].getsockname()[1]
    listen = _free_port()
    relay = asyncio.create_task(serve([(("127.0.0.1", listen), ("127.0.0.1", target_port))]))
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", listen)
                break
            await asyncio.sleep(0.02)
        big = b"cronscale" * 50_000  # larger than a chunk: several reads each way
        writer.write(big)
        await writer.drain()
        got = await reader.readexactly(len(big))
        assert got == big.upper()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the target's close came through
        writer.close()
    finally:
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        target.close()


def test_failover_is_measured_from_the_slots_due_after_the_kill() -> None:
    kill = 1000.0
    timeline = [
        (990.0, 9.0),  # due before the kill: not counted, however late
        (1000.0, 0.2),
        (1001.0, 12.5),  # a shard of the lost host: started at 1013.5
        (1005.0, 8.0),  # started at 1013.0
        (1020.0, 0.3),
    ]
    got = failover(timeline, kill)
    assert got == {"slots_after_kill": 4.0, "max_lag_s": 12.5, "recovered_after_s": 13.5}
    assert failover([(1001.0, 0.1)], kill)["recovered_after_s"] == 0.0
    assert math.isnan(failover([], kill)["max_lag_s"])


def test_the_kafka_port_is_read_from_the_bootstrap_list() -> None:
    assert _port_of("127.0.0.1:9092") == 9092
    assert _port_of("a:9093,b:9094") == 9093
