"""aiokafka on uvloop: a request written to a connection the broker has just reset.

When a broker goes away (killed, restarted, its host lost), the kernel resets its connections.
The event loop closes the transport at once, but aiokafka notices only a loop iteration or two
later, when its reader task fails and closes the connection. A request sent in between is
written to the closed transport: the stdlib loop drops the bytes (the response then never comes
and the request fails at its timeout, or when the connection is closed), while uvloop raises
``RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the handler is
closed``. aiokafka catches only ``OSError`` there (aio-libs/aiokafka#1038, open), so the
``RuntimeError`` escapes whatever sent the request. When that is the client's metadata task, the
task ends for good: every later metadata refresh waits forever, and with it the group
coordinator's lookup, the consumer's heartbeats and its offset commits. A worker hit by it
stopped fetching after a Kafka restart and never resumed (the chaos test of 2026-12-07 00:23:
the group gave its partitions to the other workers once its session expired; alone, it would
have stalled every run).

:func:`tolerate_reset_connections` makes such a write fail the way aiokafka expects a broken
connection to fail: the connection is closed and the request raises ``KafkaConnectionError``,
which every aiokafka loop retries (metadata from another broker, a coordinator lookup again, a
fetch or produce sent again). It is installed with uvloop (``scheduler.cli.processes``); on the
stdlib loop it changes nothing, as nothing raises there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from aiokafka.conn import AIOKafkaConnection, CloseReason
from aiokafka.errors import KafkaConnectionError

# Marks the wrapped methods, so installing twice wraps once.
_GUARDED: Final = "_cronscale_tolerates_reset"


def tolerate_reset_connections() -> None:
    """Wraps ``AIOKafkaConnection``'s two write paths (requests and SASL tokens) so that a
    write to a transport the loop has already closed raises ``KafkaConnectionError`` and closes
    the connection, instead of raising ``RuntimeError``. Idempotent."""
    for name in ("send", "_send_sasl_token"):
        method = getattr(AIOKafkaConnection, name)
        if not getattr(method, _GUARDED, False):
            setattr(AIOKafkaConnection, name, _guarded(method))


def _guarded(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def guarded(self: AIOKafkaConnection, *args: Any, **kwargs: Any) -> Any:
        try:
            return write(self, *args, **kwargs)
        except RuntimeError as e:
            # Looked at only here: a request that goes through costs one call more, no more.
            transport = _transport(self)
            if transport is None or not transport.is_closing():
                raise  # not the closed-transport write this guards against
            self.close(reason=CloseReason.CONNECTION_BROKEN, exc=e)
            raise KafkaConnectionError(
                f"Connection at {self.host}:{self.port} broken: the broker reset it ({e})"
            ) from e

    setattr(guarded, _GUARDED, True)
    return guarded


def _transport(conn: AIOKafkaConnection) -> Any:
    """The connection's transport, or None when it has none (not connected, or closed)."""
    writer = getattr(conn, "_writer", None)
    return None if writer is None else writer.transport
