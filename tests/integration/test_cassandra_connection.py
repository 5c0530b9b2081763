"""The control plane's Cassandra connections, against the real Cassandra: Nagle's algorithm is
off on every one of them. The driver leaves it on, and a request written while the previous one
on its connection was unacknowledged waited for the peer's delayed ACK (~40 ms on Linux):
grouped writes of small rows went at a twentieth of their rate (``loadtest/README.md``)."""

from __future__ import annotations

import socket
from typing import Any

from bucketer.cql import connect
from scheduler.config import Config


def _sockets(session: Any) -> list[socket.socket]:
    """The sockets of the session's control connection and of its pools' connections."""
    conns = [session.cluster.control_connection._connection]
    for pool in session.get_pools():
        conns += [getattr(pool, "_connection", None), *getattr(pool, "_connections", [])]
    return [c._socket for c in conns if c is not None]


def test_every_connection_sends_without_waiting_for_acknowledgements(migrated: Config) -> None:
    session = connect(migrated.cassandra_hosts, migrated.cassandra_port)
    try:
        session.execute("SELECT release_version FROM system.local")
        socks = _sockets(session)
        assert len(socks) >= 2
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks)
    finally:
        session.cluster.shutdown()
