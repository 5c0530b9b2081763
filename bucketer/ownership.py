"""Shard ownership: each dispatcher holds an even share of the shards under renewable leases.

Balancing is by counting peers: every member heartbeats into one small partition, so each knows
how many share the shards and aims at ceil(shards / members). It claims free or expired shards
(one LWT bumping the epoch), renews its own, and releases extras when peers join. A member that
stops renewing loses its shards when their leases end; fencing by epoch makes a late former
owner harmless. A renewal also records the shard's progress (its checkpoints, from a
``CheckpointSource``: the scanner), in the same LWT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from bucketer.cassandra import CassandraTimerStore, LostOwnership
from bucketer.model import Checkpoint, ShardLease

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]

# A lease counts as ours only until this long before it ends by our own (monotonic) reckoning:
# room for the peers' clocks, which judge expiry, to run ahead of ours.
LEASE_MARGIN = timedelta(seconds=2)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class CheckpointSource(Protocol):
    """The progress a lease renewal records with the lease (``bucketer.scanner.WheelScanner``)."""

    def take_checkpoints(self, shard: int, epoch: int) -> list[Checkpoint]:
        """The shard's checkpoints not yet written; they count as written from now on."""
        ...

    def restore_checkpoints(self, shard: int, epoch: int, taken: Sequence[Checkpoint]) -> None:
        """Gives back what ``take_checkpoints`` returned, for a renewal that failed."""
        ...


class ShardOwnership:
    """Keeps this member's share of shards claimed and renewed; reports gains and losses."""

    def __init__(
        self,
        store: CassandraTimerStore,
        *,
        instance: str,
        on_gain: Callable[[ShardLease], Awaitable[None]],
        on_loss: Callable[[int], Awaitable[None]],
        on_release: Callable[[int], Awaitable[None]] | None = None,
        fit: Callable[[], str] | None = None,
        group: str = "dispatchers",
        lease: timedelta = timedelta(seconds=10),
        cycle: timedelta = timedelta(seconds=2),
        clock: Clock = _utcnow,
        checkpoints: CheckpointSource | None = None,
    ) -> None:
        self._store = store
        # Each renewal of a shard's lease carries the checkpoints its scanner moved since the
        # last one: one LWT every cycle for both, not one for each (an LWT costs Cassandra
        # ~3.5 times a plain write, loadtest/README.md).
        self._checkpoints = checkpoints
        self.instance = instance
        self._on_gain = on_gain
        self._on_loss = on_loss
        # A shard given up on purpose (it can still write its progress first).
        self._on_release = on_release or on_loss
        # Why this member must own no shard now ("" while it may): besides its clock, what its
        # process needs to fire (a dispatcher: Kafka). Such a member steps aside (releases its
        # shards, leaves the group) so that its peers take its share.
        self._fit = fit or (lambda: "")
        self._aside = False
        self._group = group
        self._lease = lease
        self._cycle = cycle
        self._clock = clock
        self.owned: dict[int, ShardLease] = {}
        # Per owned shard: until when (time.monotonic) this member may fire it. Counted from
        # the start of the write that claimed or renewed the lease, so a process paused
        # (SIGSTOP, a long GC) or cut off from Cassandra stops firing before a peer can have
        # taken the shard over, whatever the wall clock says.
        self._valid_until: dict[int, float] = {}
        # A per-member rotation of the shard order, so members starting together try different
        # shards first instead of all contending for shard 0.
        self._offset = int.from_bytes(hashlib.blake2b(instance.encode(), digest_size=4).digest())

    def may_fire(self, shard: int) -> bool:
        """Whether this member can still prove its lease of ``shard`` (renewed recently
        enough); the scanner hands no timer of a shard that fails this."""
        return time.monotonic() < self._valid_until.get(shard, 0.0)

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
                await self._drop_lapsed()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._cycle.total_seconds())
        finally:
            await self.release_all()

    async def balance_once(self) -> None:
        """One round: heartbeat, renew, then claim up to or release down to the fair share."""
        ttl = max(1, int(self._lease.total_seconds()))
        # A clock that would misjudge due times and leases, or a process that cannot fire:
        # own nothing, and count out of the group, until that is fixed.
        unfit = self._store.clock_guard.reason if not self._store.clock_guard.ok else ""
        unfit = unfit or self._fit()
        if unfit:
            if self.owned or not self._aside:
                logger.error(
                    "stepping aside, releasing %d shards: %s",
                    len(self.owned),
                    unfit,
                    extra={"action": "step_aside"},
                )
                await self.release_all()
                self._aside = True
            return
        if self._aside:
            logger.warning("fit to own shards again; rejoining", extra={"action": "rejoin"})
            self._aside = False
        # Leases first: a failing membership write must not keep them from being renewed.
        await self._renew_all()
        await self._store.heartbeat_member(self._group, self.instance, ttl)
        members = await self._store.members(self._group)
        if self.instance not in members:
            members.append(self.instance)
        target = math.ceil(self._store.shard_count / len(members))
        if len(self.owned) > target:
            for shard in sorted(self.owned)[target:]:
                await self._release(shard)
        elif len(self.owned) < target:
            await self._claim_up_to(target)

    def _deadline(self, started: float) -> float:
        return started + (self._lease - LEASE_MARGIN).total_seconds()

    async def _drop_lapsed(self) -> None:
        """Stops firing the shards whose lease this member can no longer prove."""
        for shard in [s for s in self.owned if not self.may_fire(s)]:
            logger.warning("lease of shard %d lapsed unrenewed; stopping it", shard)
            self.owned.pop(shard, None)
            self._valid_until.pop(shard, None)
            await self._on_loss(shard)

    async def _renew_all(self) -> None:
        expires = self._clock() + self._lease
        started = time.monotonic()

        async def renew(lease: ShardLease) -> None:
            source = self._checkpoints
            progress = source.take_checkpoints(lease.shard, lease.epoch) if source else []
            try:
                await self._store.renew(lease.shard, lease.epoch, expires, progress)
            except LostOwnership:
                logger.warning("lost shard %d (epoch %d)", lease.shard, lease.epoch)
                self.owned.pop(lease.shard, None)
                self._valid_until.pop(lease.shard, None)
                await self._on_loss(lease.shard)
                return
            except Exception:
                # Cassandra slow or away: keep scanning while our lease provably holds
                # (may_fire); _drop_lapsed stops the shard before a peer can take it over.
                # The progress goes with the next renewal.
                if source is not None and progress:
                    source.restore_checkpoints(lease.shard, lease.epoch, progress)
                return
            self._valid_until[lease.shard] = self._deadline(started)
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
        started = time.monotonic()
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
            self._valid_until[claimed.shard] = self._deadline(started)
            await self._on_gain(claimed)

    async def _release(self, shard: int) -> None:
        lease = self.owned.pop(shard)
        self._valid_until.pop(shard, None)
        await self._on_release(shard)
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
