"""Starting a process while Cassandra or Kafka is away: wait for it, do not exit.

A dispatcher or API replica started during an outage (a deploy overlapping a broker restart, a
whole-site power-up where the services come up last) retries the step that needs the service
with capped exponential backoff, logging why at every try, until it succeeds or the process is
told to stop. Once running, the drivers reconnect on their own (the Cassandra driver's pool,
aiokafka's producer), and the firing path retries its batches (bucketer.scanner).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka.errors import KafkaError
from cassandra.cluster import NoHostAvailable

from bucketer.cql import TRANSIENT_STORAGE_ERRORS, StorageUnavailable
from scheduler.errors import Unavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What "the service is not there (yet)" looks like at start-up.
NOT_UP: tuple[type[BaseException], ...] = (
    Unavailable,
    StorageUnavailable,
    NoHostAvailable,
    KafkaError,
    OSError,
    TimeoutError,
    *TRANSIENT_STORAGE_ERRORS,
)


async def until_up(
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    stop: asyncio.Event,
    first_delay: float = 0.5,
    max_delay: float = 10.0,
) -> T | None:
    """``step()``'s result once it succeeds; None if ``stop`` is set first. A failure that
    means a service is not up (``NOT_UP``) is logged with its reason and retried after a delay
    that doubles from ``first_delay`` up to ``max_delay``; any other error is raised."""
    delay = first_delay
    while not stop.is_set():
        try:
            return await step()
        except NOT_UP as e:
            logger.warning("%s: %s; retrying in %.1f s", what, e, delay)
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            delay = min(delay * 2, max_delay)
    return None
