"""Scanning the owned shards: read due timers ahead of time, fire them on time, checkpoint.

One scanner serves every shard its member owns. Each tick it reads, for every unfinished
(minute_bucket, shard) partition of its shards, the timers due by ``now + lookahead`` that it
has not seen, with one multi-partition query per bucket (chunks of shards), not a query per
shard: an idle dispatcher with 64 shards costs two queries a tick, not 64. Timers wait in
memory until due and are handed to ``on_due`` in batches the moment they are; the read-ahead is
what keeps the :00 burst from being I/O bound ("read bucket t+1 ahead of time"). With more due
than one batch and ``lanes`` given, a round hands at most ``batches_in_flight`` batches in
weighted round-robin order across lanes (bucketer.lanes), and the next round starts at once.
A round over a deeper backlog orders only each lane's oldest round's worth, not all of it
(a herd of a million), and within a lane the timers due after its backlog's head (the
herd's instant) take turns with that head, so a tenant's herd does not hold its own later
seconds until it has drained.

A batch's hand-over may end before what it sends has gone out (``OnDue``: the dispatcher's
fire-ahead holds messages until their slots): the next round is planned meanwhile, and the
batch's timers wait apart (``ShardProgress.in_flight``), neither pending nor handed, until its
sending ends; if it fails they are pending again. Reads run beside the rounds (``_scan``).

Progress: after a batch is handed, each partition's checkpoint may move to the first timer
still pending or still sending, but never past ``grace`` before the start of the last read
(nor past ``now - grace``). The grace window lets a timer written moments late (a write in
flight, a writer's clock a little behind) still be read, however long firing took since;
re-read timers are recognised by position and not handed twice. Checkpoints and finished
buckets are written with the shard's epoch as condition (fencing), at most once per
``checkpoint_every`` per shard and only when something was handed, so a new owner resumes
where this one provably got to.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from bucketer.cassandra import CassandraTimerStore, LostOwnership, epoch_start
from bucketer.keys import bucket_end, bucket_start, minute_bucket
from bucketer.lanes import Lanes, fair_order, fill_batches
from bucketer.model import SETTLED, Checkpoint, ShardLease, Timer
from bucketer.pending import Line, PendingTimers

logger = logging.getLogger(__name__)

# Hands a batch over. It may return an awaitable: the batch is planned and its timers are
# handed, but what it sends is still on its way (the dispatcher's fire-ahead holds messages
# until their slots). The scanner's next round does not wait for it; the batch's timers hold
# their buckets' checkpoints until it ends, and are handed again if it fails.
OnDue = Callable[[list[Timer]], Awaitable[Awaitable[None] | None]]
OnPoison = Callable[[Timer, BaseException], Awaitable[None]]
Position = tuple[datetime, str]

# The longest pause between attempts while scanning keeps failing.
MAX_BACKOFF = 2.0

# A timer that failed alone this many rounds, while other timers *of its kind* were handed fine,
# is poison even when its error looks transient. (Of its kind: while Kafka is down, timers that
# need no Kafka still go through, and must not make every timer that does look poisonous.)
POISON_STRIKES = 5

# Seconds between two prunings of a shard's handed timers. A pruning walks a bucket's handed
# timers only if its checkpoint moved since the last: a herd's million, handed while its
# checkpoint waits on the herd's instant, is walked once when the checkpoint passes it.
PRUNE_EVERY = 5.0

# Timers are kept to the millisecond (Cassandra's timestamps): the first position after every
# timer of an instant.
_AFTER_INSTANT = timedelta(milliseconds=1)

# A round of a single lane's backlog hands this many times ``batches_in_flight`` batches.
_SINGLE_LANE_ROUNDS = 8

# Batches handed and still sending (``OnDue``) at most, for each of ``batches_in_flight``.
_SENDING_PER_SLOT = 2


def _marked(t: Timer, takeover_until: datetime | None) -> Timer:
    if takeover_until is not None and t.fire_time <= takeover_until:
        return replace(t, after_takeover=True)
    return t


def _position(t: Timer) -> Position:
    return (t.fire_time, t.timer_id)


def _entry_position(entry: tuple[Timer, datetime | None]) -> Position:
    return (entry[0].fire_time, entry[0].timer_id)


class _DueLine(NamedTuple):
    """A pending line's due part in a round: its timers due by ``until``, ``size`` of them,
    at instants ``first`` to ``last``."""

    line: Line
    takeover_until: datetime | None
    until: datetime
    size: int
    first: datetime
    last: datetime

    def entries(
        self, since: datetime | None, before: datetime | None
    ) -> Iterator[tuple[Timer, datetime | None]]:
        """Its due timers from ``since`` and before ``before`` (None: no bound), oldest first,
        with the shard's takeover instant; lazily."""
        until = self.until
        for t in self.line.timers(since, until):
            if before is not None and t.fire_time >= before:
                return
            yield t, self.takeover_until


def _transient_by_default(error: BaseException) -> bool:
    return isinstance(error, OSError | TimeoutError)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class ShardProgress:
    """What this member knows of one owned shard."""

    shard: int
    epoch: int
    done_through: int
    checkpoints: dict[int, Position] = field(default_factory=dict)
    # Read but not yet handed over (by kind, lane and instant: bucketer.pending), and handed
    # over but still inside the re-read window.
    pending: PendingTimers = field(default_factory=PendingTimers)
    handed: dict[int, set[Position]] = field(default_factory=dict)  # by bucket
    # Handed in a batch still sending (``OnDue``): neither pending nor handed yet. A re-read
    # passes over them, and no checkpoint passes them until their batch has ended.
    in_flight: dict[Position, Timer] = field(default_factory=dict)
    # Each bucket's checkpoint when its handed timers were last pruned.
    pruned_at: dict[int, Position] = field(default_factory=dict)
    # Buckets with timers handed since their checkpoint was last written.
    dirty: set[int] = field(default_factory=set)
    # Busy partitions read only part way (more due timers than a tick's pages): the last
    # position read. The next read goes on from there, not from the checkpoint, so a :00 herd
    # of any size drains; the bucket's checkpoint cannot pass it, and it is not finished.
    cursors: dict[int, Position] = field(default_factory=dict)
    # Everything due by this instant has been read (None: not read since claimed). No
    # checkpoint may pass it: what was not read cannot have fired.
    read_until: datetime | None = None
    # When the last read of this shard began. A timer landing after that instant may not have
    # been read, and the grace only covers timers due no earlier than ``grace`` before they
    # land: no checkpoint may pass ``read_at - grace``, however long the hand-over since the
    # read took (a batch slowed by a recovering Cassandra took many seconds; checkpoints
    # moved by the clock after it passed timers written meanwhile, never read: lost retries).
    read_at: datetime | None = None
    last_flush: float = 0.0
    last_prune: float = 0.0
    # Timers due by this instant may have been fired by the shard's previous owner (it kept
    # firing until it stopped, before this member claimed the shard, plus its read-ahead).
    takeover_until: datetime | None = None

    def after(self, bucket: int) -> Position:
        return self.checkpoints.get(bucket, (epoch_start(), ""))

    def read_from(self, bucket: int, grace: timedelta) -> Position:
        """Where the next read of ``bucket`` starts: after its checkpoint, but once a read has
        been through the partition, no earlier than ``grace`` before that read began. A timer
        landing after that read is due no earlier than that (the grace, decision 0003), and
        every timer due before it was read then. (Read from the checkpoint every tick, a
        backlog still pending behind it, a herd of a million, was read again page by page
        every tick, and the dispatcher fired ~130 a second.)"""
        after = self.after(bucket)
        if self.read_at is None:
            return after
        return max(after, (self.read_at - grace, ""))


# Shards whose progress (checkpoints, finished buckets: LWTs) is written at once.
PROGRESS_IN_FLIGHT = 16


class WheelScanner:
    """Fires the due timers of every shard added to it, until they are removed."""

    def __init__(
        self,
        store: CassandraTimerStore,
        on_due: OnDue,
        *,
        tick: timedelta = timedelta(milliseconds=500),
        lookahead: timedelta = timedelta(seconds=1),
        grace: timedelta = timedelta(seconds=2),
        batch: int = 1000,
        per_shard_limit: int = 1000,
        pages_per_read: int = 10,
        batches_in_flight: int = 4,
        batch_timeout: timedelta = timedelta(seconds=20),
        max_pending_per_shard: int = 50_000,
        shards_per_query: int = 32,
        checkpoint_every: timedelta = timedelta(seconds=2),
        checkpoints_with_lease: bool = False,
        coalesce: timedelta = timedelta(milliseconds=25),
        busy_coalesce: timedelta = timedelta(milliseconds=100),
        busy_round: int = 20,
        clock: Callable[[], datetime] = _utcnow,
        on_poison: OnPoison | None = None,
        is_transient: Callable[[BaseException], bool] | None = None,
        may_fire: Callable[[int], bool] | None = None,
        lanes: Lanes | None = None,
        ahead: Mapping[str, timedelta] | None = None,
        backlog_head: timedelta = timedelta(milliseconds=1),
    ) -> None:
        # How long before its fire time a timer of a kind is handed (the dispatcher's
        # fire-ahead); other kinds at their time. Within the lookahead, so it has been read.
        self._ahead = {k: v for k, v in (ahead or {}).items() if v > timedelta(0)}
        if any(v > lookahead for v in self._ahead.values()):
            raise ValueError(f"handing timers ahead by more than the lookahead ({lookahead})")
        self._coalesce = coalesce.total_seconds()
        self._busy_coalesce = busy_coalesce.total_seconds()
        self._busy_round = busy_round
        # Timers the last round handed: at least ``busy_round`` means firings are due faster
        # than ``coalesce`` apart, and the next round waits ``busy_coalesce`` to gather more.
        self._last_round = 0
        self._store = store
        self._on_due = on_due
        self._tick = tick.total_seconds()
        self._lookahead = lookahead
        self._grace = grace
        self._batch = batch
        self._limit = per_shard_limit
        self._pages = pages_per_read
        self._in_flight = batches_in_flight
        self._batch_timeout = batch_timeout.total_seconds()
        self._max_pending = max_pending_per_shard
        self._chunk = shards_per_query
        self._checkpoint_every = checkpoint_every.total_seconds()
        # The shards' checkpoints go out with their lease renewals (``take_checkpoints``), not
        # every ``checkpoint_every`` in LWTs of their own; a bucket finished (``done_through``)
        # and a shard handed over are still written here at once.
        self._checkpoints_with_lease = checkpoints_with_lease
        self._clock = clock
        self._on_poison = on_poison
        self._may_fire = may_fire or (lambda _shard: True)
        # With lanes, a round hands at most ``batches_in_flight`` batches, in weighted
        # round-robin order across lanes (bucketer.lanes); the rest wait for the next round,
        # which starts at once and is ordered afresh with whatever fell due meanwhile.
        self._lanes = lanes
        # Under a deep backlog, a lane's head (its timers due within ``backlog_head`` of its
        # oldest: a herd's instant) and its timers due after that take turns (bucketer.lanes),
        # and a round holding both stays short. Set by ``_due`` for its round's ``_batches``.
        self._backlog_head = backlog_head
        self._later_from: dict[str, datetime] = {}
        self._backlog = False
        self._is_transient = is_transient or _transient_by_default
        self._strikes: dict[Position, int] = {}
        # Batches whose planning is done and whose sending goes on (``OnDue``), and the
        # timers of such a batch that failed: handed again, their sending awaited in the round.
        self._sending: set[asyncio.Task[None]] = set()
        self._resend: set[Position] = set()
        # The read under way, beside the rounds (``_scan``).
        self._reading: asyncio.Task[bool] | None = None
        # The kinds of timers handed fine in the current round.
        self._round_ok: set[str] = set()
        self.shards: dict[int, ShardProgress] = {}
        self._wake = asyncio.Event()

    # Ownership ----------------------------------------------------------------------------

    async def add_shard(self, lease: ShardLease) -> None:
        """Starts serving a shard just claimed at ``lease.epoch``, from its checkpoints."""
        done = lease.done_through
        if done is None:
            done = minute_bucket(self._clock()) - 1
        stored = await self._store.read_checkpoints(lease.shard, done)
        self.shards[lease.shard] = ShardProgress(
            shard=lease.shard,
            epoch=lease.epoch,
            done_through=done,
            checkpoints={b: (c.fire_time, c.timer_id) for b, c in stored.items()},
            takeover_until=self._clock() + self._lookahead if lease.epoch > 1 else None,
        )
        self._wake.set()

    def pending_count(self) -> int:
        """Timers read and not yet handed over, over every served shard."""
        return sum(len(p.pending) for p in self.shards.values())

    async def hand_over(self, shard: int) -> None:
        """Writes the shard's progress now rather than at its next periodic flush, then stops
        serving it: a shard given up on purpose (rebalancing, shutdown) is fired again by its
        next owner only from the grace window on, not from a checkpoint seconds older."""
        p = self.shards.get(shard)
        if p is not None:
            now = self._clock()
            try:
                write = self._progress(p, now, (now - self._grace, ""), save=True)
                if write is not None:
                    await write
            except LostOwnership:
                pass
            except Exception as e:
                logger.warning("shard %d: progress not saved at handover: %s", shard, e)
        self.remove_shard(shard)

    def take_checkpoints(self, shard: int, epoch: int) -> list[Checkpoint]:
        """The checkpoints of ``shard`` moved since they were last written, for the lease
        renewal that records them with the lease (``checkpoints_with_lease``); from now on they
        count as written, unless given back (``restore_checkpoints``) when the renewal fails.
        Nothing for a shard no longer served at ``epoch``."""
        p = self.shards.get(shard)
        if p is None or p.epoch != epoch or not p.dirty:
            return []
        taken = [
            Checkpoint(bucket=bucket, fire_time=at, timer_id=timer_id)
            for bucket in sorted(p.dirty)
            if bucket > p.done_through and bucket in p.checkpoints
            for at, timer_id in (p.checkpoints[bucket],)
        ]
        p.dirty.clear()
        return taken

    def restore_checkpoints(self, shard: int, epoch: int, taken: Sequence[Checkpoint]) -> None:
        """Gives back checkpoints taken for a lease renewal that failed: the next one (or the
        next write of progress) records them."""
        p = self.shards.get(shard)
        if p is not None and p.epoch == epoch:
            p.dirty.update(c.bucket for c in taken)

    def remove_shard(self, shard: int) -> None:
        """Stops serving a shard (released or lost); its unfired timers are the next owner's,
        and so are the marks on them (to be sent again, strikes towards poison): forgotten
        here, or they would stay for good (no round meets these timers again)."""
        p = self.shards.pop(shard, None)
        if p is None or not (self._resend or self._strikes):
            return
        theirs = {
            pos for pos in (*self._resend, *self._strikes) if pos in p.pending or pos in p.in_flight
        }
        self._resend.difference_update(theirs)
        for pos in theirs:
            self._strikes.pop(pos, None)

    # Loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Reads, fires and checkpoints until cancelled; survives its own failures, backing
        off (up to 2 s) while they repeat, e.g. while Cassandra or Kafka is down."""
        try:
            await self._scan()
        finally:
            # Stopped: a read under way is dropped, and batches still holding their messages
            # send nothing more. Their timers held their checkpoints: the shards' next owners
            # fire them.
            stopping = [*self._sending, *([self._reading] if self._reading else [])]
            for task in stopping:
                task.cancel()
            if stopping:
                await asyncio.gather(*stopping, return_exceptions=True)
            self._reading = None

    async def _scan(self) -> None:
        """The loop: a read every tick, running beside the rounds, and rounds as timers fall
        due, each followed by a progress pass.

        A read of 64 shards takes 130-220 ms on a busy box, mostly waiting for Cassandra; a
        round waiting for it handed the timers that fell due meanwhile that much later, all
        at once (a saw-tooth of start lag at the read's period, ``loadtest/README.md``). The
        read only adds what it finds to the pending lines, and a round only takes from them:
        they share nothing else but the shards' progress, which is moved only from what a
        read has completed (``read_until``, ``read_at``, set as it ends)."""
        next_read = 0.0
        backoff = 0.0
        while True:
            try:
                read = False
                reading = self._reading
                if reading is not None and reading.done():
                    self._reading = None
                    more = reading.result()  # a failed read fails here
                    read = True
                    next_read = time.monotonic() + (0 if more else self._tick)
                if self._reading is None and time.monotonic() >= next_read:
                    self._reading = asyncio.create_task(self._read(), name="timers-read")
                # Progress only moves after a read or a handover: waking up for nothing (the
                # coalescing sleep) does not walk every shard again.
                if await self.fire_due() or read:
                    await self.record_progress()
                backoff = 0.0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                backoff = min(max(backoff * 2, self._tick), MAX_BACKOFF)
                if backoff < MAX_BACKOFF:
                    logger.exception("timer scan failed; retrying in %.1f s", backoff)
                else:
                    logger.warning(
                        "timer scan still failing (%s); retrying every %.0f s", e, backoff
                    )
                next_read = time.monotonic() + backoff
                await asyncio.sleep(backoff)
                continue
            reading = self._reading
            if reading is None:
                await self._sleep(next_read)
            elif not reading.done():
                await self._sleep(float("inf"))  # its end wakes the loop

    async def _read(self) -> bool:
        """A read of every owned shard (``read``); its end wakes the loop."""
        try:
            return await self.read(self._clock())
        finally:
            self._wake.set()

    async def _sleep(self, next_read: float) -> None:
        if self._backlog:
            return  # due timers were left for the next round: it starts now
        wait = next_read - time.monotonic()
        now = self._clock()
        # Timers due within the coalescing window of each other go out as one batch: one
        # schedule read, one write round and one produce for all of them, not one per timer.
        # At rest the window is short (a lone firing waits at most 25 ms); once a round
        # carries ``busy_round`` timers it widens, so batches grow with the load instead of
        # their number (at 1,000 firings/s: rounds of ~100, not ~25, for 12 % less CPU per
        # firing over every process, loadtest/README.md).
        # A kind handed ahead needs no window: its round holds until its last timer's time,
        # and gathers what comes due meanwhile; waiting a window after that would hand the
        # next timers late.
        plain: datetime | None = None  # the earliest pending timer of a kind handed on time
        ahead: datetime | None = None  # and of a kind handed ahead
        for p in self.shards.values():
            for line in p.pending.lines():
                first = line.first()
                if first is None:
                    continue
                if line.kind in self._ahead:
                    if ahead is None or first < ahead:
                        ahead = first
                elif plain is None or first < plain:
                    plain = first
        if plain is not None:
            wait = min(wait, max((plain - now).total_seconds(), self.coalescing_window()))
        if ahead is not None:
            wait = min(wait, self._ahead_wait(ahead, now))
        self._wake.clear()
        if wait == float("inf"):
            await self._wake.wait()  # a read under way, and nothing pending
        elif wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _ahead_wait(self, due: datetime, now: datetime) -> float:
        """Seconds until the next round for a kind handed ahead whose earliest pending timer
        is ``due``: until its hand-over time; once that has come, a third of the fire-ahead
        while the last round's batches are still sending (below), none once they are not (a
        round that held until its slots gathered what came due meanwhile); the coalescing
        window once it is late (a backlog: without the window, rounds would hand a few late
        timers each, and small batches cost more per firing in every process) or when the
        last round handed nothing (a shard whose lease cannot be proven keeps its timers: no
        spinning)."""
        until_due = (due - now).total_seconds()
        if until_due <= 0:
            return self.coalescing_window()
        span = max(self._ahead.values()).total_seconds()
        if until_due > span:
            return until_due - span
        if not self._last_round:
            return self._coalesce
        if not self._sending:
            return 0.0
        # A round still holding its messages (its batches sending) did not wait for its last
        # slot. The next one gathers a third of the fire-ahead's worth of slots (at least the
        # coalescing window), rather than the few that fell due during that round's planning:
        # it begins two thirds of the fire-ahead before its first slot, less the planning
        # of the round before it, to be planned before that slot. A wider fire-ahead makes
        # fewer, larger rounds, which cost less per firing in every process.
        return max(self.coalescing_window(), span / 3)

    def coalescing_window(self) -> float:
        """Seconds the next round waits at least after this one (see ``_sleep``)."""
        return self._busy_coalesce if self._last_round >= self._busy_round else self._coalesce

    async def read(self, now: datetime) -> bool:
        """Reads every owned shard's unfinished buckets up to now + lookahead into memory.
        Returns True if some partition held more than one read's worth (read again soon).

        A busy partition (more due than a page: a :00 herd) is paged from a cursor, at most
        ``pages_per_read`` pages over all of them per call, so rounds of firing come between
        its pages; and the part of it due after the cursor's instant, from the grace before
        the last read on, is read too every call (``_read_recent``): a herd's instant does
        not hold the timers due in the seconds after it until the whole herd has been read.
        (A herd of 1,000,000 took ~20 s to read, 10 pages per shard per call, and the slots
        due in those seconds waited for it: lag p99 18.4 s.)"""
        until = now + self._lookahead
        last = minute_bucket(until)
        wanted: dict[int, list[ShardProgress]] = {}
        for p in list(self.shards.values()):
            for bucket in range(p.done_through + 1, last + 1):
                wanted.setdefault(bucket, []).append(p)
        more = False
        pages = self._pages  # this call's pages of busy partitions, over all of them
        for bucket, progress in sorted(wanted.items()):
            # A partition read part way goes on from its cursor, on its own.
            busy = [p for p in progress if bucket in p.cursors]
            for p in busy:
                if len(p.pending) >= self._max_pending or not pages:
                    more = True  # fire what is read before reading more
                    continue
                used, partial = await self._read_rest(p, bucket, p.cursors[bucket], until, pages)
                pages -= used
                more |= partial
            rest = [p for p in progress if bucket not in p.cursors]
            for start in range(0, len(rest), self._chunk):
                chunk = rest[start : start + self._chunk]
                after = min(p.read_from(bucket, self._grace) for p in chunk)
                found = await self._store.scan_shards(
                    bucket=bucket,
                    shards=[p.shard for p in chunk],
                    after=after,
                    until=until,
                    limit_per_shard=self._limit,
                    known=self._known(bucket),
                )
                for p in chunk:
                    scan = found.get(p.shard)
                    if scan is None:
                        continue
                    self._take(p, bucket, scan.timers)
                    if scan.rows >= self._limit and scan.last is not None:
                        if pages:
                            used, partial = await self._read_rest(
                                p, bucket, scan.last, until, pages
                            )
                            pages -= used
                            more |= partial
                        else:
                            p.cursors[bucket] = scan.last
                            more = True
            for p in progress:
                cursor = p.cursors.get(bucket)
                if cursor is not None:
                    await self._read_recent(p, bucket, cursor, until)
        for p in {id(p): p for ps in wanted.values() for p in ps}.values():
            p.read_until = until
            p.read_at = now
        return more

    async def _read_rest(
        self, p: ShardProgress, bucket: int, after: Position, until: datetime, pages: int
    ) -> tuple[int, bool]:
        """A busy partition: page through it alone, from ``after``, up to ``pages`` pages.
        Returns the pages read, and True if it holds more (its cursor says where the next
        read goes on)."""
        for page in range(1, pages + 1):
            timers = await self._store.scan(
                shard=p.shard, bucket=bucket, after=after, until=until, limit=self._limit
            )
            self._take(p, bucket, timers)
            if timers:
                after = timers[-1].position
            if len(timers) < self._limit:
                p.cursors.pop(bucket, None)
                return page, False
        p.cursors[bucket] = after
        return pages, True

    async def _read_recent(
        self, p: ShardProgress, bucket: int, cursor: Position, until: datetime
    ) -> None:
        """A busy partition's timers due after its cursor's instant, from the grace before
        the last read on (as a partition read whole is read): one page. What it takes the
        cursor reads again later, and passes over (pending or handed); no checkpoint passes
        the cursor meanwhile, so nothing it skips is lost."""
        after = max((cursor[0] + _AFTER_INSTANT, ""), p.read_from(bucket, self._grace))
        if after[0] > until:
            return
        timers = await self._store.scan(
            shard=p.shard, bucket=bucket, after=after, until=until, limit=self._limit
        )
        self._take(p, bucket, timers)

    def _known(self, bucket: int) -> Callable[[int, Position, bytes], bool]:
        """Whether a row of ``bucket`` read from a shard is one ``_take`` would pass over as
        known: pending as read (same data), handed already, or at or before its checkpoint."""
        shards = self.shards

        def known(shard: int, pos: Position, data: bytes) -> bool:
            p = shards.get(shard)
            if p is None:
                return False
            held = p.pending.get(pos)
            if held is not None:
                return held.data == data
            return pos in p.handed.get(bucket, ()) or pos in p.in_flight or pos <= p.after(bucket)

        return known

    def _take(self, p: ShardProgress, bucket: int, timers: list[Timer]) -> None:
        if self.shards.get(p.shard) is not p:
            return  # lost while reading
        floor = p.after(bucket)
        pending = p.pending
        handed = p.handed.get(bucket, ())
        for t in timers:
            if t.kind == SETTLED or not t.kind:
                continue  # settled, or a note left where no timer was written
            pos = t.position
            held = pending.get(pos)
            if held is not None:
                # Written again since it was read, before it was handed: two chains of a
                # schedule (the one a change superseded and the change's) put their next timers
                # at the same place, and the row holds the last write. Hand what it holds now;
                # a position is handed once.
                if held.data != t.data:
                    pending.put(t, self._lane_of(t))
            elif pos > floor and pos not in handed and pos not in p.in_flight:
                pending.put(t, self._lane_of(t))

    def _lane_of(self, t: Timer) -> str:
        """The fairness lane a pending timer is kept in ("" without lanes)."""
        return "" if self._lanes is None else self._lanes.lane(t)

    async def fire_due(self) -> int:
        """Hands the pending timers that are due to ``on_due``, in batches, oldest first (or,
        with lanes and more than a batch due, a round's worth in fair order across lanes);
        returns how many were handed.

        A batch that fails is split in halves and each half handed again, down to single
        timers, so one timer whose firing raises (poison) cannot hold up the others. A single
        timer whose error is not transient (or that failed alone ``POISON_STRIKES`` rounds
        while others of its kind went through) goes to ``on_poison`` and counts as handed. A
        transient error with nothing handed in the round (Cassandra or Kafka down) is raised:
        the round stops and the timers are tried again next tick.
        """
        due, waiting = self._due(self._clock())
        self._round_ok = set()
        batches = self._batches(due) if due else []
        # Due timers left for the next round (a round stops at its limit): no pause.
        self._backlog = sum(map(len, batches)) < len(due) + waiting
        if not due:
            return 0
        slots = asyncio.Semaphore(self._in_flight)

        handing = 0

        async def hand(batch: list[Timer]) -> int:
            nonlocal handing
            async with slots:
                # Batches still sending are bounded too (those being handed count): a backlog
                # (a herd) is planned faster than it is sent, and would pile up sends past
                # their deadline.
                while len(self._sending) + handing >= self._in_flight * _SENDING_PER_SLOT:
                    await asyncio.wait(set(self._sending), return_when=asyncio.FIRST_COMPLETED)
                handing += 1
                try:
                    return await self._deliver(batch)
                finally:
                    handing -= 1

        # Several batches in flight: one slow write or send does not hold up the others, and a
        # :00 herd's batches overlap their reads, writes and produces.
        results = await asyncio.gather(*(hand(b) for b in batches), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        self._last_round = sum(r for r in results if isinstance(r, int))
        return self._last_round

    def _due(self, now: datetime) -> tuple[list[Timer], int]:
        """This round's candidates among the due pending timers, oldest first, and how many
        more are due beyond them.

        Without lanes, or with no more due than a round hands, every due timer. With a deeper
        backlog (a :00 herd of a million), only each lane's oldest round's worth: a round
        hands at most that many anyway, and ordering the whole backlog afresh every round (a
        sort, a lane and a fair order for each of a million timers, for a few thousand handed)
        wedged the dispatcher: a 1,000,000 herd drained at ~70 firings/s. Nor is there a pass
        over what is pending: each shard keeps its pending timers in lines by kind and lane,
        each by instant (``bucketer.pending``), so what is due is counted from the instants,
        and a lane's oldest are a merge of the fronts of its lines, taken lazily.

        A lane's round's worth is not only its oldest, though: the timers due after its
        backlog's head (``backlog_head`` or more after its oldest timer: a herd's instant)
        take up to half of it, oldest first, and a round of a single lane holding both is as
        short as when lanes take turns. Otherwise a herd's backlog holds the same tenant's
        schedules of later seconds until it has drained, past the misfire threshold: with a
        herd of 200,000 beside 10,000 a minute, 6,665 of those slots counted as missed and the
        rest had p99 30.3 s (``loadtest/README.md``).
        """
        # A kind handed ahead is due that much earlier.
        due_by = {kind: now + ahead for kind, ahead in self._ahead.items()}
        self._later_from = {}
        # Each lane's due lines, from every shard: counted from their instants, not timers.
        by_lane: dict[str, list[_DueLine]] = {}
        total = 0
        for p in self.shards.values():
            for line in p.pending.lines():
                until = due_by.get(line.kind, now)
                count, first, last = line.due(until)
                if count:
                    assert first is not None and last is not None
                    by_lane.setdefault(line.lane, []).append(
                        _DueLine(line, p.takeover_until, until, count, first, last)
                    )
                    total += count
        picked: list[tuple[Timer, datetime | None]]
        if self._lanes is None or total <= self._round_limit(2):
            picked = [
                (t, d.takeover_until)
                for lines in by_lane.values()
                for d in lines
                for t in d.line.due_timers(d.until)
            ]
        else:
            # A deep backlog: each lane's timers due after its head (its oldest instant) and
            # its head take turns; each part is a merge of the fronts of its lines.
            later_from = {
                lane: min(d.first for d in lines) + self._backlog_head
                for lane, lines in by_lane.items()
            }
            mixed = {
                lane
                for lane, lines in by_lane.items()
                if any(d.last >= later_from[lane] for d in lines)
            }
            # A single lane's large rounds are for a herd alone; with later timers behind its
            # head, a round is as short as when lanes take turns.
            cap = self._round_limit(2 if mixed else len(by_lane))
            picked = []
            for lane, lines in by_lane.items():
                cut = later_from[lane]
                head_count = sum(d.line.count_before(cut) for d in lines)
                later_count = sum(d.size for d in lines) - head_count
                # The later ones take up to half, more if the head is short.
                later = min(later_count, max(cap // 2, cap - head_count))
                if later:
                    picked.extend(
                        itertools.islice(
                            heapq.merge(
                                *(d.entries(cut, None) for d in lines), key=_entry_position
                            ),
                            later,
                        )
                    )
                picked.extend(
                    itertools.islice(
                        heapq.merge(*(d.entries(None, cut) for d in lines), key=_entry_position),
                        cap - later,
                    )
                )
            self._later_from = {lane: later_from[lane] for lane in mixed}
        due = sorted((_marked(t, until) for t, until in picked), key=_position)
        return due, total - len(due)

    def _round_limit(self, lanes: int) -> int:
        """How many due timers a round hands at most: ``batches_in_flight`` batches when lanes
        take turns; with a single lane (nobody to be fair to) eight times that, so a herd of
        one tenant drains in few rounds (rounds cost a read and a checkpoint between them),
        while other due timers wait at most one such round."""
        return self._batch * self._in_flight * (1 if lanes > 1 else _SINGLE_LANE_ROUNDS)

    def _batches(self, due: list[Timer]) -> list[list[Timer]]:
        """``due`` in batches of at most about ``batch``, each timer key's timers in one batch
        (batches run concurrently; two timers of one schedule must not race each other)."""
        n = -(-len(due) // self._batch)
        if n == 1:
            return [due]
        lanes = self._lanes
        if lanes is not None:
            count = len({lanes.lane(t) for t in due})
            if count > 1:
                return fill_batches(
                    fair_order(due, lanes, later_from=self._later_from),
                    self._batch,
                    self._round_limit(count),
                )
            # One lane (a single tenant's herd) has nobody to be fair to: no fair order, and
            # a round of ``_round_limit(1)``, or ``_round_limit(2)`` with timers due after its
            # head waiting (``_due`` passed no more, and every one of them goes).
        batches: list[list[Timer]] = [[] for _ in range(n)]
        for t in due:
            batches[hash(t.key) % n].append(t)
        return [b for b in batches if b]

    async def _deliver(self, batch: list[Timer]) -> int:
        """Hands ``batch`` over (see ``fire_due``); returns how many timers it handed.

        The lease is checked before every hand-over, the halves of a failed batch included: a
        member that cannot prove it still owns a shard (paused, cut off) fires nothing more of
        it, and one paused mid-batch (SIGSTOP) comes back to a batch past its deadline.
        """
        batch = [t for t in batch if self._may_fire(t.shard)]
        if not batch:
            return 0
        # A batch holding timers whose sending failed before is sent within the round: if it
        # fails again, its halves are tried, and a timer that fails alone is found.
        resend = bool(self._resend) and any(t.position in self._resend for t in batch)
        try:
            # A deadline: a send or write that never returns (a broker restarted under a
            # producer) must fail the batch, not hold the shard unfired while its lease renews.
            sending = await asyncio.wait_for(self._on_due(batch), self._batch_timeout)
            if sending is not None:
                if not resend:
                    self._send_on(batch, sending)
                    return len(batch)
                await asyncio.wait_for(sending, self._batch_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if len(batch) > 1:
                logger.warning(
                    "a batch of %d due timers failed (%s: %s); handing it again in halves "
                    "(its runs that went out are produced again, same run ids)",
                    len(batch),
                    type(e).__name__,
                    e,
                )
                middle = len(batch) // 2
                return await self._deliver(batch[:middle]) + await self._deliver(batch[middle:])
            await self._poisoned(batch[0], e)
        else:
            self._round_ok.update(t.kind for t in batch)
            if self._strikes:
                for t in batch:
                    self._strikes.pop(t.position, None)
        if resend:
            self._resend.difference_update(t.position for t in batch)
        self._mark_handed(batch)
        return len(batch)

    def _send_on(self, batch: list[Timer], sending: Awaitable[None]) -> None:
        """``batch`` is planned and still sending: its timers leave the pending ones (the next
        round does not take them) but hold their checkpoints until the sending ends."""
        for t in batch:
            p = self.shards.get(t.shard)
            if p is not None and p.pending.pop(t.position) is not None:
                p.in_flight[t.position] = t
        task = asyncio.create_task(self._sent(batch, sending), name="timers-sending")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _sent(self, batch: list[Timer], sending: Awaitable[None]) -> None:
        """Waits for a batch's sending: then its timers are handed; if it failed, pending
        again, and handed again by the next round, which awaits their sending itself."""
        try:
            await asyncio.wait_for(sending, self._batch_timeout)
        except (Exception, asyncio.CancelledError) as e:
            task = asyncio.current_task()
            if isinstance(e, asyncio.CancelledError) and task is not None and task.cancelling():
                raise  # stopped (``run``); a sending cancelled by its sender is a failure
            logger.warning(
                "sending a batch of %d due timers failed (%s: %s); handing them again "
                "(its runs that went out are produced again, same run ids)",
                len(batch),
                type(e).__name__,
                e,
            )
            for t in batch:
                p = self.shards.get(t.shard)
                if p is not None and p.in_flight.pop(t.position, None) is not None:
                    p.pending.put(t, self._lane_of(t))
                    self._resend.add(t.position)
            self._wake.set()
            return
        self._mark_handed(batch)

    async def _poisoned(self, t: Timer, error: Exception) -> None:
        """A single timer failed: quarantine it if it is poison, else raise ``error``."""
        strikes = self._strikes.get(t.position, 0) + 1
        others_ok = t.kind in self._round_ok
        poison = self._on_poison is not None and (
            not self._is_transient(error) or (others_ok and strikes >= POISON_STRIKES)
        )
        if not poison or self._on_poison is None:
            if others_ok:
                self._strikes[t.position] = strikes
            raise error
        logger.error(
            "timer %s (%s %s, shard %d) fails on its own; quarantined: %s",
            t.timer_id,
            t.kind,
            t.key,
            t.shard,
            error,
            exc_info=error,
            extra={"timer_id": t.timer_id, "shard": t.shard},
        )
        await self._on_poison(t, error)
        self._strikes.pop(t.position, None)

    def _mark_handed(self, batch: list[Timer]) -> None:
        for t in batch:
            p = self.shards.get(t.shard)
            if p is None:
                continue
            pos = t.position
            if p.pending.pop(pos) is not None or p.in_flight.pop(pos, None) is not None:
                bucket = t.bucket
                handed = p.handed.get(bucket)
                if handed is None:
                    handed = p.handed[bucket] = set()
                handed.add(pos)
                p.dirty.add(bucket)

    async def record_progress(self) -> None:
        """Moves checkpoints and finishes buckets, fenced by each shard's epoch."""
        now = self._clock()
        horizon: Position = (now - self._grace, "")
        writes = [
            (p, w)
            for p in list(self.shards.values())
            if (w := self._progress(p, now, horizon)) is not None
        ]
        if not writes:
            return
        # The shards' writes (LWTs) go out together, a few at a time: one after the other,
        # a pass whose checkpoints were due (every shard's, every ``checkpoint_every``) held
        # the scanner's loop, and so the next round, for 64 round trips.
        slots = asyncio.Semaphore(PROGRESS_IN_FLIGHT)

        async def one(p: ShardProgress, write: Coroutine[None, None, None]) -> None:
            async with slots:
                try:
                    await write
                except LostOwnership:
                    logger.warning(
                        "shard %d: fenced out at epoch %d; dropping it", p.shard, p.epoch
                    )
                    self.remove_shard(p.shard)

        # Every shard's pass ends before an error is raised: none still writing meanwhile.
        results = await asyncio.gather(*(one(p, w) for p, w in writes), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def _progress(
        self, p: ShardProgress, now: datetime, horizon: Position, *, save: bool = False
    ) -> Coroutine[None, None, None] | None:
        """Moves ``p``'s checkpoints in memory; returns the writes that record them, when due
        or ``save`` (None: nothing to write)."""
        if p.read_until is None or p.read_at is None:
            return None
        horizon = min(horizon, (p.read_until, ""), (p.read_at - self._grace, ""))
        current = minute_bucket(now)
        # Each bucket's first pending timer, from the pending lines' instants (not a pass over
        # every pending timer: a herd's million, every round).
        first_pending: dict[int, datetime] = {}
        if p.pending:
            for bucket in range(p.done_through + 1, current + 1):
                first = p.pending.first_from(bucket_start(bucket))
                if first is not None and first < bucket_end(bucket):
                    first_pending[bucket] = first
        # Timers whose batch is still sending hold their buckets as pending ones do.
        for t in p.in_flight.values():
            held = first_pending.get(t.bucket)
            if held is None or t.fire_time < held:
                first_pending[t.bucket] = t.fire_time
        finished = p.done_through
        for bucket in range(p.done_through + 1, current + 1):
            target = horizon
            if bucket in first_pending:
                target = min(target, (first_pending[bucket], ""))
            if bucket in p.cursors:
                target = min(target, p.cursors[bucket])
            if target > p.after(bucket):
                p.checkpoints[bucket] = target
            if (
                finished == bucket - 1
                and bucket not in first_pending
                and bucket not in p.cursors
                and bucket_end(bucket) <= horizon[0]
            ):
                finished = bucket
        force = finished > p.done_through
        mono = time.monotonic()
        if mono - p.last_prune >= PRUNE_EVERY:
            self._prune_handed(p)
            p.last_prune = mono
        if self._checkpoints_with_lease:
            # Finishing a bucket writes that alone (its own LWT): the later buckets' checkpoints
            # wait for the lease renewal that carries them.
            flush = bool(p.dirty) and save
        else:
            due = mono - p.last_flush >= self._checkpoint_every
            flush = bool(p.dirty) and (force or save or due)
        if not flush and not force:
            return None
        return self._record(p, finished if force else None, mono if flush else None)

    async def _record(self, p: ShardProgress, finished: int | None, flush: float | None) -> None:
        """Writes ``p``'s checkpoints of the buckets handed from since the last flush (if
        ``flush``: that flush's instant) and finishes buckets through ``finished`` (if any)."""
        done = p.done_through if finished is None else finished
        if flush is not None:
            # Taken now: a bucket handed from while these are written is written next time.
            dirty = sorted(p.dirty)
            p.dirty.clear()
            try:
                for bucket in dirty:
                    if bucket > done and bucket in p.checkpoints:
                        at, tid = p.checkpoints[bucket]
                        await self._store.advance_checkpoint(
                            p.shard, p.epoch, Checkpoint(bucket=bucket, fire_time=at, timer_id=tid)
                        )
            except BaseException:
                p.dirty.update(dirty)
                raise
            p.last_flush = flush
        if finished is not None:
            await self._store.finish_through(p.shard, p.epoch, finished)
            for b in range(p.done_through + 1, finished + 1):
                p.checkpoints.pop(b, None)
            p.done_through = finished

    @staticmethod
    def _prune_handed(p: ShardProgress) -> None:
        """Forgets the handed timers a re-read can no longer meet: those of finished buckets,
        and those at or before their bucket's checkpoint (a re-read starts after it)."""
        for bucket in list(p.handed):
            if bucket <= p.done_through:
                del p.handed[bucket]
                p.pruned_at.pop(bucket, None)
                continue
            after = p.after(bucket)
            if p.pruned_at.get(bucket) == after:
                continue  # nothing passed since the last pruning
            kept = {pos for pos in p.handed[bucket] if pos > after}
            if kept:
                p.handed[bucket] = kept
                p.pruned_at[bucket] = after
            else:
                del p.handed[bucket]
                p.pruned_at.pop(bucket, None)
