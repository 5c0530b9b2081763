"""Scanning one owned shard: read due timers, hand them over in batches, move checkpoints.

Per shard the scanner walks the minute buckets from the first unfinished one to the current
one. In each it reads timers after the partition's checkpoint and due by now, hands the ones it
has not handed yet to ``on_due``, and afterwards moves the checkpoint forward with a write fenced
by the shard's epoch. The checkpoint trails now by ``grace``: a timer written moments late (an
in-flight write, a writer's clock slightly behind) still lands after it and is picked up, while
the in-memory set of handed timers keeps the re-read window from firing twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from bucketer.cassandra import CassandraTimerStore, LostOwnership, epoch_start
from bucketer.keys import bucket_end, minute_bucket
from bucketer.model import Checkpoint, ShardLease, Timer

logger = logging.getLogger(__name__)

OnDue = Callable[[list[Timer]], Awaitable[None]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ShardScanner:
    """Fires the due timers of one shard while this process holds it at ``lease.epoch``."""

    def __init__(
        self,
        store: CassandraTimerStore,
        lease: ShardLease,
        on_due: OnDue,
        *,
        poll: timedelta = timedelta(milliseconds=250),
        grace: timedelta = timedelta(seconds=2),
        batch: int = 1000,
        checkpoint_every: timedelta = timedelta(seconds=1),
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._store = store
        self.shard = lease.shard
        self.epoch = lease.epoch
        self._on_due = on_due
        self._poll = poll
        self._grace = grace
        self._batch = batch
        self._checkpoint_every = checkpoint_every
        self._clock = clock
        self._done_through = (
            lease.done_through if lease.done_through is not None else minute_bucket(clock()) - 1
        )
        self._checkpoints: dict[int, Checkpoint] = {}
        self._dirty: set[int] = set()
        self._last_flush = clock()
        # Timers handed over but still inside the re-read window, by position.
        self._handed: set[tuple[datetime, str]] = set()

    async def run(self) -> None:
        """Scans until cancelled or until the shard is lost (LostOwnership ends the loop)."""
        self._checkpoints = await self._store.read_checkpoints(self.shard, self._done_through)
        while True:
            try:
                busy = await self.scan_once()
            except LostOwnership:
                logger.warning("shard %d: fenced out at epoch %d; stopping", self.shard, self.epoch)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("shard %d: scan failed; retrying", self.shard)
                busy = False
            if not busy:
                await asyncio.sleep(self._poll.total_seconds())

    async def scan_once(self) -> bool:
        """One pass over the unfinished buckets; True if a batch was full (more is waiting)."""
        now = self._clock()
        horizon = now - self._grace
        current = minute_bucket(now)
        busy = False
        finished = self._done_through
        for bucket in range(self._done_through + 1, current + 1):
            full = await self._scan_bucket(bucket, now, horizon)
            busy = busy or full
            if finished == bucket - 1 and not full and bucket_end(bucket) <= horizon:
                finished = bucket
        await self._flush(now, force=finished > self._done_through)
        if finished > self._done_through:
            await self._store.finish_through(self.shard, self.epoch, finished)
            for b in range(self._done_through + 1, finished + 1):
                self._checkpoints.pop(b, None)
            self._done_through = finished
        return busy

    async def _scan_bucket(self, bucket: int, now: datetime, horizon: datetime) -> bool:
        cp = self._checkpoints.get(bucket)
        after = (cp.fire_time, cp.timer_id) if cp else (epoch_start(), "")
        timers = await self._store.scan(
            shard=self.shard, bucket=bucket, after=after, until=now, limit=self._batch
        )
        fresh = [t for t in timers if t.position not in self._handed]
        if fresh:
            await self._on_due(fresh)
            self._handed.update(t.position for t in fresh)
        full = len(timers) >= self._batch
        # Everything read has fired. Move the checkpoint to the last timer read, but never past
        # the grace horizon while the batch was not full: timers may still land behind it.
        target = timers[-1].position if full else (horizon, "")
        if target > after:
            self._checkpoints[bucket] = Checkpoint(
                bucket=bucket, fire_time=target[0], timer_id=target[1]
            )
            if fresh:
                self._dirty.add(bucket)
            self._handed = {p for p in self._handed if p > target}
        return full

    async def _flush(self, now: datetime, *, force: bool) -> None:
        """Persists changed checkpoints, at most once per ``checkpoint_every`` unless forced."""
        if not self._dirty or (not force and now - self._last_flush < self._checkpoint_every):
            return
        for bucket in sorted(self._dirty):
            cp = self._checkpoints.get(bucket)
            if cp is not None and bucket > self._done_through:
                await self._store.advance_checkpoint(self.shard, self.epoch, cp)
        self._dirty.clear()
        self._last_flush = now
