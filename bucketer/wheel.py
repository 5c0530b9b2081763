"""The timer wheel as a whole: shard ownership plus the scanner of the owned shards."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta

from bucketer.cassandra import CassandraTimerStore
from bucketer.lanes import Lanes
from bucketer.ownership import ShardOwnership
from bucketer.scanner import OnDue, OnPoison, WheelScanner

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
        tick: timedelta = timedelta(milliseconds=500),
        grace: timedelta = timedelta(seconds=2),
        on_poison: OnPoison | None = None,
        is_transient: Callable[[BaseException], bool] | None = None,
        lanes: Lanes | None = None,
        ahead: Mapping[str, timedelta] | None = None,
        fit: Callable[[], str] | None = None,
    ) -> None:
        self.ownership: ShardOwnership
        self.scanner = WheelScanner(
            store,
            on_due,
            tick=tick,
            grace=grace,
            on_poison=on_poison,
            is_transient=is_transient,
            may_fire=lambda shard: self.ownership.may_fire(shard),
            lanes=lanes,
            ahead=ahead,
            checkpoints_with_lease=True,
        )
        self.ownership = ShardOwnership(
            store,
            instance=instance,
            on_gain=self.scanner.add_shard,
            on_loss=self._lose,
            on_release=self.scanner.hand_over,
            fit=fit,
            lease=lease,
            cycle=cycle,
            checkpoints=self.scanner,
        )

    @property
    def owned_shards(self) -> list[int]:
        return sorted(self.ownership.owned)

    async def run(self, stop: asyncio.Event) -> None:
        """Owns and scans shards until ``stop`` is set; then stops scanning and releases."""
        scanning = asyncio.create_task(self.scanner.run(), name="timer-scanner")
        try:
            await self.ownership.run(stop)
        finally:
            scanning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scanning

    async def _lose(self, shard: int) -> None:
        self.scanner.remove_shard(shard)
