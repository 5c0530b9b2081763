"""A TCP relay for the simulated second host (``loadtest.netns``): listens on addresses and
copies each connection's bytes both ways to a target address.

    python -m loadtest.forward 10.77.1.1:9042=127.0.0.1:9042 10.77.1.1:9092=127.0.0.1:9092

Prints ``ready`` once every listener is bound. Cassandra, Kafka and the api listen on the root
namespace's loopback only; a pair of relays (one inside the namespace on its own loopback, one
outside on the veth address) lets processes in the namespace reach them at the addresses the
services advertise (Kafka's metadata names 127.0.0.1), over the veth pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys

_CHUNK = 1 << 16


def parse_route(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``LISTEN_HOST:PORT=TARGET_HOST:PORT`` -> ((host, port), (host, port))."""
    listen, sep, target = text.partition("=")
    if not sep:
        raise ValueError(f"route {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT")

    def address(part: str, what: str) -> tuple[str, int]:
        host, colon, port = part.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"route {text!r}: the {what} address {part!r} is not HOST:PORT")
        return host, int(port)

    return address(listen, "listen"), address(target, "target")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(routes: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    async def relay(
        target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    servers = []
    for listen, target in routes:
        servers.append(
            await asyncio.start_server(
                functools.partial(relay, target), listen[0], listen[1], reuse_address=True
            )
        )
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        routes = [parse_route(a) for a in args]
    except ValueError as e:
        print(f"loadtest.forward: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(routes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
