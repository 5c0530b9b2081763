"""The timer wheel's Cassandra backend: timers, shard leases with fencing epochs, checkpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType

from bucketer.clock import ClockGuard
from bucketer.cql import (
    Queries,
    Write,
    aexecute,
    aexecute_all,
    bind,
    execute_conditional,
    first,
    write_grouped,
)
from bucketer.keys import minute_bucket
from bucketer.model import SETTLED, Checkpoint, ShardLease, Timer, aware

logger = logging.getLogger(__name__)


class ShardScan(NamedTuple):
    """One partition's part of a multi-partition read of timers (``scan_shards``)."""

    timers: list[Timer]
    """The timers read that the caller did not already know (see ``known``)."""
    rows: int
    """Rows the read returned, known or not: as many as the limit means more may follow."""
    last: tuple[datetime, str] | None
    """The last row's position (fire time, timer id): where a next page starts."""


_EPOCH_START = datetime(1970, 1, 1, tzinfo=UTC)
# Timers stay readable this long after they were due (for audits and late scans).
TIMER_RETENTION = timedelta(days=2)
# Cassandra refuses TTLs above 20 years; a timer due later is written without one (0), since a
# TTL capped below its due time would expire it before it fires.
_MAX_TTL = 630_720_000
# Half the scanners' grace window: a due-now timer whose write took longer may land behind a
# checkpoint.
SLOW_WRITE = timedelta(seconds=1)


class LostOwnership(Exception):
    """A fenced write was refused: another owner claimed the shard (its epoch moved on)."""

    def __init__(self, shard: int, epoch: int, current: object) -> None:
        super().__init__(f"shard {shard}: epoch {epoch} is no longer current ({current})")
        self.shard = shard
        self.epoch = epoch


class CassandraTimerStore:
    """Timers in (minute_bucket, shard) partitions, and the shards' leases and checkpoints."""

    def __init__(
        self,
        session: Session,
        *,
        keyspace: str,
        shard_count: int,
        clock_guard: ClockGuard | None = None,
    ) -> None:
        self._session = session
        self.clock_guard = clock_guard or ClockGuard()
        self._q = Queries(session, Path(__file__).with_name("queries.cql"), keyspace=keyspace)
        self.shard_count = shard_count

    # Timers -------------------------------------------------------------------------------

    async def put(self, timers: Iterable[Timer], *, now: datetime | None = None) -> None:
        """Writes timers grouped by partition. A fire time in the past is moved to ``now``:
        a partition behind the scanners' checkpoint would never be read again.

        Refused (:class:`ClockSkewed`) while this process's clock is off the cluster's. A write
        that took so long that a timer it made due may already lie behind a scanner's
        checkpoint is repeated for those timers at a fresh ``now`` (a possible second firing
        carries the same run id: at-least-once).
        """
        self.clock_guard.check()
        timers = list(timers)
        started = time.monotonic()
        await write_grouped(self._session, self.rows(timers, now=now))
        elapsed = time.monotonic() - started
        if elapsed > SLOW_WRITE.total_seconds():
            late = datetime.now(UTC)
            due = [t for t in timers if t.fire_time <= late]
            if due:
                logger.warning(
                    "a timer write took %.1f s; putting %d due timers again at %s",
                    elapsed,
                    len(due),
                    late.isoformat(),
                )
                await write_grouped(self._session, self.rows(due, now=late))

    async def repeat_if_slow(self, timers: Iterable[Timer], *, written_at: datetime) -> None:
        """For timers a caller wrote with ``rows(now=written_at)`` in a grouped write of its
        own: if that write ended too late (``SLOW_WRITE``), the ones already due may lie behind
        a scanner's checkpoint by the time they landed; they are put again at a fresh now (a
        possible second firing carries the same ids: at-least-once)."""
        late = datetime.now(UTC)
        if late - written_at <= SLOW_WRITE:
            return
        due = [t for t in timers if t.fire_time <= late]
        if due:
            logger.warning(
                "a write with due timers took %.1f s; putting %d of them again at %s",
                (late - written_at).total_seconds(),
                len(due),
                late.isoformat(),
            )
            await self.put(due, now=late)

    def rows(self, timers: Iterable[Timer], *, now: datetime | None = None) -> list[Write]:
        """``put`` as grouped-write items, for a caller that writes them with other rows."""
        now = now or datetime.now(UTC)
        items: list[Write] = []
        for t in timers:
            fire = max(t.fire_time, now)
            ttl = int((fire - now + TIMER_RETENTION).total_seconds())
            bucket = minute_bucket(fire)
            row: dict[str, Any] = {
                "minute_bucket": bucket,
                "shard": t.shard,
                "fire_time": fire,
                "timer_id": t.timer_id,
                "kind": t.kind,
                "key": t.key,
                "data": t.data,
                "ttl": _ttl(ttl),
            }
            if t.stamp is None:
                items.append(Write((bucket, t.shard), self._q["put_timer"], row))
            else:
                row["ts"] = t.stamp
                items.append(Write((bucket, t.shard), self._q["put_timer_at"], row))
        return items

    def done_rows(self, notes: Iterable[tuple[Timer, str]], *, now: datetime) -> list[Write]:
        """Grouped-write items leaving a note on timers not yet due (each timer given by its
        place: fire time, id, shard): its ``done_run`` cell, read by the scanner with the
        timer. A note on a place where no timer was ever written makes a row the scanners
        skip. The caller makes sure the timer is not read yet (far enough from due)."""
        items: list[Write] = []
        for t, run_id in notes:
            ttl = int((max(t.fire_time, now) - now + TIMER_RETENTION).total_seconds())
            bucket = minute_bucket(t.fire_time)
            items.append(
                Write(
                    (bucket, t.shard),
                    self._q["mark_timer_done"],
                    {
                        "ttl": _ttl(ttl),
                        "done_run": run_id,
                        "minute_bucket": bucket,
                        "shard": t.shard,
                        "fire_time": t.fire_time,
                        "timer_id": t.timer_id,
                    },
                )
            )
        return items

    def settle_rows(self, timers: Iterable[Timer], *, now: datetime) -> list[Write]:
        """Grouped-write items settling timers before they are due: each row is overwritten in
        place by an inert marker the scanners skip, at the timer's ``stamp`` + 1, so the marker
        wins even if it lands before the timer. Timers due by ``now`` are left alone (a scanner
        may hold them already; their consumer must check anyway)."""
        items: list[Write] = []
        for t in timers:
            if t.fire_time <= now or t.stamp is None:
                continue
            ttl = int((t.fire_time - now + TIMER_RETENTION).total_seconds())
            bucket = minute_bucket(t.fire_time)
            items.append(
                Write(
                    (bucket, t.shard),
                    self._q["settle_timer"],
                    {
                        "minute_bucket": bucket,
                        "shard": t.shard,
                        "fire_time": t.fire_time,
                        "timer_id": t.timer_id,
                        "key": t.key,
                        "ttl": _ttl(ttl),
                        "ts": t.stamp + 1,
                    },
                )
            )
        return items

    async def read(self, timer: Timer) -> Timer | None:
        """The stored timer at ``timer``'s place (fire time, id, shard), or None; a settled
        one counts as absent. For repair checks, never on the firing path."""
        bucket = minute_bucket(timer.fire_time)
        rows = await aexecute(
            self._session,
            self._q["get_timer"],
            (bucket, timer.shard, timer.fire_time, timer.timer_id),
        )
        row = first(rows)
        if row is None or row.kind == SETTLED:
            return None
        return Timer.from_row(row, shard=timer.shard)

    async def scan(
        self,
        *,
        shard: int,
        bucket: int,
        after: tuple[datetime, str],
        until: datetime,
        limit: int,
    ) -> list[Timer]:
        """Timers of (bucket, shard) strictly after ``after`` in clustering order and due by
        ``until``, oldest first, at most ``limit``."""
        rows = await aexecute(
            self._session,
            self._q["scan_timers"],
            (bucket, shard, after[0], after[1], until, limit),
        )
        return [Timer.from_row(r, shard=shard) for r in rows]

    async def scan_shards(
        self,
        *,
        bucket: int,
        shards: Sequence[int],
        after: tuple[datetime, str],
        until: datetime,
        limit_per_shard: int,
        known: Callable[[int, tuple[datetime, str], bytes], bool] | None = None,
    ) -> dict[int, ShardScan]:
        """Timers of (bucket, s) for every s in ``shards``, after ``after`` and due by
        ``until``, at most ``limit_per_shard`` each, in one multi-partition read.

        ``known(shard, position, data)`` names rows the caller holds already, as they are:
        they are counted, not decoded. A scanner re-reads its recent past every tick for timers
        that land late, so most rows it reads it has seen; building a ``Timer`` for each cost a
        dispatcher ~7 % of its CPU at 100,000 firings a minute."""
        rows = await aexecute_all(
            self._session,
            self._q["scan_shards"],
            (bucket, list(shards), after[0], after[1], until, limit_per_shard),
        )
        timers: dict[int, list[Timer]] = {s: [] for s in shards}
        counts = dict.fromkeys(shards, 0)
        last: dict[int, tuple[datetime, str]] = {}
        for r in rows:
            shard = r.shard
            position = (aware(r.fire_time), r.timer_id)
            counts[shard] += 1
            last[shard] = position
            if known is None or not known(shard, position, r.data or b""):
                timers[shard].append(Timer.from_row(r, shard=shard))
        return {s: ShardScan(timers[s], counts[s], last.get(s)) for s in shards}

    # Leases -------------------------------------------------------------------------------

    async def init_shards(self, first_bucket: int) -> None:
        """Creates each shard's lease row once (epoch 0); later calls change nothing."""
        for shard in range(self.shard_count):
            await aexecute(self._session, self._q["init_lease"], (shard, first_bucket - 1))

    async def read_lease(self, shard: int) -> ShardLease:
        rows = await aexecute(self._session, self._q["read_lease"], (shard,))
        return ShardLease.from_row(shard, first(rows))

    async def claim(
        self, lease: ShardLease, *, owner: str, lease_expires: datetime
    ) -> ShardLease | None:
        """Takes the shard by bumping its epoch, if nobody changed it since ``lease`` was read.

        One LWT per ownership change; every later progress write is fenced by the new epoch.
        """
        applied, _ = await execute_conditional(
            self._session,
            self._q["claim_shard"],
            (lease.epoch + 1, owner, lease_expires, lease.shard, lease.epoch),
        )
        if not applied:
            return None
        return ShardLease(
            shard=lease.shard,
            epoch=lease.epoch + 1,
            owner=owner,
            lease_expires=lease_expires,
            done_through=lease.done_through,
        )

    async def renew(
        self,
        shard: int,
        epoch: int,
        lease_expires: datetime,
        checkpoints: Sequence[Checkpoint] = (),
    ) -> None:
        """Extends the lease, and records ``checkpoints`` (the shard's progress) with it: one
        LWT, a conditional batch in the shard's partition, instead of one per write (an LWT
        costs Cassandra ~3.5 times a plain write's CPU, loadtest/README.md). Raises
        LostOwnership, with nothing written, if the epoch moved on."""
        if not checkpoints:
            await self._fenced("renew_lease", shard, epoch, (lease_expires, shard, epoch))
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batch.add(bind(self._q["renew_lease"], (lease_expires, shard, epoch)))
        for c in checkpoints:
            batch.add(bind(self._q["save_checkpoint"], (c.fire_time, c.timer_id, shard, c.bucket)))
        await self._fenced_statement(batch, shard, epoch)

    async def release(self, shard: int, epoch: int) -> None:
        """Gives the shard up so a peer can claim it at once; raises LostOwnership if not ours."""
        await self._fenced("release_shard", shard, epoch, (shard, epoch))

    # Progress -----------------------------------------------------------------------------

    async def read_checkpoints(self, shard: int, after_bucket: int) -> dict[int, Checkpoint]:
        """Checkpoints of the shard's buckets later than ``after_bucket``."""
        rows = await aexecute(self._session, self._q["read_checkpoints"], (shard, after_bucket))
        out: dict[int, Checkpoint] = {}
        for r in rows:
            if r.checkpoint_time is None:
                continue
            out[r.minute_bucket] = Checkpoint(
                bucket=r.minute_bucket,
                fire_time=aware(r.checkpoint_time),
                timer_id=r.checkpoint_id or "",
            )
        return out

    async def advance_checkpoint(self, shard: int, epoch: int, checkpoint: Checkpoint) -> None:
        """Records progress in one partition, fenced by ``epoch``."""
        await self._fenced(
            "advance_checkpoint",
            shard,
            epoch,
            (checkpoint.fire_time, checkpoint.timer_id, shard, checkpoint.bucket, epoch),
        )

    async def finish_through(self, shard: int, epoch: int, bucket: int) -> None:
        """Marks every bucket up to ``bucket`` fully fired, fenced by ``epoch``."""
        await self._fenced("finish_through", shard, epoch, (bucket, shard, epoch))

    async def _fenced(self, query: str, shard: int, epoch: int, params: Sequence[object]) -> None:
        await self._fenced_statement(self._q[query], shard, epoch, params)

    async def _fenced_statement(
        self, statement: Any, shard: int, epoch: int, params: Sequence[object] | None = None
    ) -> None:
        """Runs a write conditional on ``epoch``; raises LostOwnership if it was refused."""
        applied, current = await execute_conditional(self._session, statement, params)
        if not applied:
            raise LostOwnership(shard, epoch, current.get("epoch"))

    # Membership ---------------------------------------------------------------------------

    async def heartbeat_member(self, group: str, instance: str, ttl: int) -> None:
        await aexecute(
            self._session,
            self._q["heartbeat_member"],
            (group, instance, datetime.now(UTC), ttl),
        )

    async def leave_group(self, group: str, instance: str) -> None:
        await aexecute(self._session, self._q["leave_group"], (group, instance))

    async def members(self, group: str) -> list[str]:
        rows = await aexecute(self._session, self._q["list_members"], (group,))
        return sorted(r.instance for r in rows)


def _ttl(seconds: int) -> int:
    return seconds if seconds <= _MAX_TTL else 0


def epoch_start() -> datetime:
    """The smallest instant a checkpoint can hold (the start of a never-read partition)."""
    return _EPOCH_START
