"""Shard ownership: each dispatcher holds an even share of the shards under renewable leases.

Balancing is by counting peers: every member heartbeats into one small partition, so each knows
how many share the shards and aims at ceil(shards / members). It claims free or expired shards
(one LWT bumping the epoch), renews its own, and releases extras when peers join. A member that
stops renewing loses its shards when their leases end; fencing by epoch makes a late former
owner harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from bucketer.cassandra import CassandraTimerStore, LostOwnership
from bucketer.model import ShardLease

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ShardOwnership:
    """Keeps this member's share of shards claimed and renewed; reports gains and losses."""

    def __init__(
        self,
        store: CassandraTimerStore,
        *,
        instance: str,
        on_gain: Callable[[ShardLease], Awaitable[None]],
        on_loss: Callable[[int], Awaitable[None]],
        group: str = "dispatchers",
        lease: timedelta = timedelta(seconds=10),
        cycle: timedelta = timedelta(seconds=2),
        clock: Clock = _utcnow,
    ) -> None:
        self._store = store
        self.instance = instance
        self._on_gain = on_gain
        self._on_loss = on_loss
        self._group = group
        self._lease = lease
        self._cycle = cycle
        self._clock = clock
        self.owned: dict[int, ShardLease] = {}
        # A per-member rotation of the shard order, so members starting together try different
        # shards first instead of all contending for shard 0.
        self._offset = int.from_bytes(hashlib.blake2b(instance.encode(), digest_size=4).digest())

    async def run(self, stop: asyncio.Event) -> None:
        """Balances until ``stop`` is set, then releases every owned shard."""
        try:
            while not stop.is_set():
                try:
                    await self.balance_once()
                except Exception:
                    logger.exception(
                        "shard balancing failed; retrying", extra={"action": "balance"}
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._cycle.total_seconds())
        finally:
            await self.release_all()

    async def balance_once(self) -> None:
        """One round: heartbeat, renew, then claim up to or release down to the fair share."""
        ttl = max(1, int(self._lease.total_seconds()))
        await self._store.heartbeat_member(self._group, self.instance, ttl)
        members = await self._store.members(self._group)
        if self.instance not in members:
            members.append(self.instance)
        target = math.ceil(self._store.shard_count / len(members))
        await self._renew_all()
        if len(self.owned) > target:
            for shard in sorted(self.owned)[target:]:
                await self._release(shard)
        elif len(self.owned) < target:
            await self._claim_up_to(target)

    async def _renew_all(self) -> None:
        expires = self._clock() + self._lease

        async def renew(lease: ShardLease) -> None:
            try:
                await self._store.renew(lease.shard, lease.epoch, expires)
            except LostOwnership:
                logger.warning("lost shard %d (epoch %d)", lease.shard, lease.epoch)
                self.owned.pop(lease.shard, None)
                await self._on_loss(lease.shard)
                return
            except Exception:
                # Cassandra slow or away: keep scanning while our lease may still hold, but stop
                # before it can have run out, so a peer taking over does not race us for long.
                if lease.lease_expires is not None and self._clock() >= lease.lease_expires:
                    logger.warning("lease of shard %d ran out unrenewed; stopping it", lease.shard)
                    self.owned.pop(lease.shard, None)
                    await self._on_loss(lease.shard)
                return
            self.owned[lease.shard] = ShardLease(
                shard=lease.shard,
                epoch=lease.epoch,
                owner=self.instance,
                lease_expires=expires,
                done_through=lease.done_through,
            )

        await asyncio.gather(*(renew(lease) for lease in list(self.owned.values())))

    async def _claim_up_to(self, target: int) -> None:
        now = self._clock()
        n = self._store.shard_count
        order = [(self._offset + i) % n for i in range(n)]
        candidates = [s for s in order if s not in self.owned]
        leases = await asyncio.gather(*(self._store.read_lease(s) for s in candidates))
        for lease in leases:
            if len(self.owned) >= target:
                break
            free = lease.owner is None or lease.lease_expires is None or lease.lease_expires <= now
            if not free and lease.owner != self.instance:
                continue
            claimed = await self._store.claim(
                lease, owner=self.instance, lease_expires=now + self._lease
            )
            if claimed is None:
                continue
            logger.info(
                "claimed shard %d at epoch %d (previous owner %s)",
                claimed.shard,
                claimed.epoch,
                lease.owner,
            )
            self.owned[claimed.shard] = claimed
            await self._on_gain(claimed)

    async def _release(self, shard: int) -> None:
        lease = self.owned.pop(shard)
        await self._on_loss(shard)
        try:
            await self._store.release(shard, lease.epoch)
            logger.info("released shard %d (epoch %d)", shard, lease.epoch)
        except LostOwnership:
            pass

    async def release_all(self) -> None:
        """Stops and releases every owned shard, and leaves the group (clean shutdown)."""
        for shard in list(self.owned):
            try:
                await self._release(shard)
            except Exception:
                logger.exception("releasing shard %d failed", shard)
        try:
            await self._store.leave_group(self._group, self.instance)
        except Exception:
            logger.exception("leaving the dispatcher group failed")
