"""The timer wheel as a whole: shard ownership plus one scanner per owned shard."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from bucketer.cassandra import CassandraTimerStore
from bucketer.model import ShardLease
from bucketer.ownership import ShardOwnership
from bucketer.scanner import OnDue, ShardScanner

logger = logging.getLogger(__name__)


class TimerWheel:
    """Runs ``on_due`` for every due timer of the shards this member owns, until stopped."""

    def __init__(
        self,
        store: CassandraTimerStore,
        *,
        instance: str,
        on_due: OnDue,
        lease: timedelta = timedelta(seconds=10),
        cycle: timedelta = timedelta(seconds=2),
        poll: timedelta = timedelta(milliseconds=250),
        grace: timedelta = timedelta(seconds=2),
    ) -> None:
        self._store = store
        self._on_due = on_due
        self._poll = poll
        self._grace = grace
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.ownership = ShardOwnership(
            store,
            instance=instance,
            on_gain=self._start_shard,
            on_loss=self._stop_shard,
            lease=lease,
            cycle=cycle,
        )

    @property
    def owned_shards(self) -> list[int]:
        return sorted(self.ownership.owned)

    async def run(self, stop: asyncio.Event) -> None:
        """Owns and scans shards until ``stop`` is set; then stops scanners and releases."""
        try:
            await self.ownership.run(stop)
        finally:
            for shard in list(self._tasks):
                await self._stop_shard(shard)

    async def _start_shard(self, lease: ShardLease) -> None:
        await self._stop_shard(lease.shard)
        scanner = ShardScanner(self._store, lease, self._on_due, poll=self._poll, grace=self._grace)
        self._tasks[lease.shard] = asyncio.create_task(
            scanner.run(), name=f"scan-shard-{lease.shard}"
        )

    async def _stop_shard(self, shard: int) -> None:
        task = self._tasks.pop(shard, None)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
