"""For test reporters standing in for the API: an event's ack, already resolved."""

from __future__ import annotations

import asyncio

from cronscale.v1 import run_reporting_service_pb2 as pb


def acked(ack: pb.RunEventAck) -> asyncio.Future[pb.RunEventAck]:
    """A future (on the running loop) resolved with ``ack``: what ``EventReporter.submit``
    returns once the API took the event."""
    future: asyncio.Future[pb.RunEventAck] = asyncio.get_running_loop().create_future()
    future.set_result(ack)
    return future
