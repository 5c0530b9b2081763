"""What a dispatcher keeps of the schedules it fires, so that most firings read no schedule.

A fire timer carries its schedule's generation; the firing needs the rest of the schedule
(handler, payload, spec, policies, state) and, under an overlap policy other than ALLOW,
whether a run of the schedule is still in progress. Both come from here when they can be
trusted, else from a read of the schedule row (``scheduler.firing``):

- **What the API changes.** Every change to a schedule's state, generation, spec, policies,
  handler, payload or dependents is announced in ``schedule_changes`` *before* it is written
  (``CassandraScheduleStore.announce``). Before a batch uses the cache, :meth:`refresh` reads
  the announcements since its last look (less ``CHANGE_GRACE``, for records that landed late or
  a writer's clock behind) and forgets the schedules named. For ``HOLD`` after that, those
  schedules are read at every firing and not cached: the announced change may land after the
  announcement. An API call that returned before a batch began is seen by that batch, as with a
  read. A dispatcher that did not look for longer than ``MAX_GAP`` forgets everything.
- **What the dispatcher itself writes.** The run it marked in progress last (``ran``).
- **What the worker reports.** The run fired at a slot notes its end on the row of the
  schedule's next fire timer (``Timer.done_run``, written by the API while that timer is far
  from due). When that timer fires naming the run this dispatcher marked in progress last,
  nothing of the schedule is in progress.

Anything else (a timer handed after a shard changed owner, BUFFER_ONE, a run of another origin
in progress, an entry evicted) takes the read. Entries are evicted least recently used beyond
``capacity``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from bucketer.model import Timer
from scheduler import metrics
from scheduler.model import OverlapMode, Schedule, ScheduleState

# The counters' children, looked up once (``labels()`` costs ~2 µs, and a hit is counted per
# fire timer).
_HITS = metrics.SCHEDULE_CACHE.labels(outcome="hit")
_READS = metrics.SCHEDULE_CACHE.labels(outcome="read")

# An announced change (``CassandraScheduleStore.announce``) whose record took longer than this to
# write is not made: the record might land after a dispatcher looked past its time.
ANNOUNCE_LIMIT = timedelta(seconds=5)
# How far back each look at the announcements reaches past the previous look: an announcement
# lands within ANNOUNCE_LIMIT of its time, written by a clock within the dispatchers' skew
# tolerance (0.5 s by default).
CHANGE_GRACE = 2 * ANNOUNCE_LIMIT
# How long a schedule named in an announcement is read at every firing: its change is written
# after the announcement, within the API's statement timeouts and compare-and-set retries.
HOLD = timedelta(seconds=60)
# Longer than this without a look, and the cache starts over.
MAX_GAP = timedelta(minutes=2)


class ChangeFeed(Protocol):
    """Where announced schedule changes are read (``ScheduleStore.changes``)."""

    async def changes(self, since: datetime, until: datetime) -> Sequence[tuple[datetime, str]]:
        """The changes announced between ``since`` and ``until``: (when, schedule id)."""
        ...


@dataclass
class _Entry:
    schedule: Schedule
    # The run this dispatcher last marked in progress ("" if none is known to be).
    active_run: str


class ScheduleCache:
    """Schedules by id as this dispatcher last read them, and their run in progress."""

    def __init__(
        self,
        feed: ChangeFeed,
        *,
        capacity: int,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._feed = feed
        self.capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # Schedules named in an announcement, read at every firing until then.
        self._held: dict[str, datetime] = {}
        # Announcements already applied (re-read within the grace), until they leave it.
        self._seen: dict[tuple[datetime, str], None] = {}
        self._looked_at: datetime | None = None
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    async def refresh(self, asked_at: datetime) -> None:
        """Applies the announcements recorded up to at least ``asked_at`` (a batch's start).
        One read per minute the window spans, shared by batches that ask together."""
        if self.capacity <= 0:
            return
        async with self._lock:
            if self._looked_at is not None and self._looked_at >= asked_at:
                return
            now = self._clock()
            since = (self._looked_at or now) - CHANGE_GRACE
            if self._looked_at is None or now - self._looked_at > MAX_GAP:
                self._entries.clear()
                self._seen.clear()
                since = now - CHANGE_GRACE
            changes = await self._feed.changes(since, now + CHANGE_GRACE)
            for at, schedule_id in changes:
                if (at, schedule_id) in self._seen:
                    continue
                self._seen[(at, schedule_id)] = None
                self._entries.pop(schedule_id, None)
                self._held[schedule_id] = now + HOLD
            self._looked_at = now
            self._prune(now, since)

    def _prune(self, now: datetime, since: datetime) -> None:
        for key in [k for k in self._seen if k[0] < since]:
            del self._seen[key]
        for sid in [s for s, until in self._held.items() if until <= now]:
            del self._held[sid]

    def ready_to_fire(self, timer: Timer, schedule_id: str, generation: int) -> Schedule | None:
        """The cached schedule, if a fire timer of it (``timer``, of ``generation``) can be
        decided from the cache alone: current (same generation, active, no announced change
        pending), not handed after a shard changed owner, and nothing of it in progress that
        its overlap policy would weigh. None: read the schedule."""
        entry = self._entries.get(schedule_id)
        if (
            entry is None
            or timer.after_takeover
            or schedule_id in self._held
            or entry.schedule.generation != generation
            or entry.schedule.state is not ScheduleState.ACTIVE
        ):
            return None
        overlap = entry.schedule.policies.overlap
        if overlap is OverlapMode.BUFFER_ONE:
            return None
        if overlap is not OverlapMode.ALLOW and not (
            entry.active_run and timer.done_run == entry.active_run
        ):
            return None
        self._entries.move_to_end(schedule_id)
        _HITS.inc()
        return entry.schedule

    def missed(self, count: int = 1) -> None:
        _READS.inc(count)

    def put(self, s: Schedule, *, active_run: str) -> None:
        """Keeps ``s`` as just read (with its run in progress, "" if none), unless an
        announced change of it is pending."""
        if self.capacity <= 0 or s.schedule_id in self._held:
            return
        self._entries[s.schedule_id] = _Entry(schedule=_static(s), active_run=active_run)
        self._entries.move_to_end(s.schedule_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def ran(self, schedule_id: str, run_id: str) -> None:
        """This dispatcher marked ``run_id`` the schedule's run in progress."""
        entry = self._entries.get(schedule_id)
        if entry is not None:
            entry.active_run = run_id

    def forget(self, schedule_id: str) -> None:
        self._entries.pop(schedule_id, None)


def _static(s: Schedule) -> Schedule:
    """``s`` without what changes at every firing (the overlap cells): the cache keeps the run
    in progress itself, and a cached schedule is only used with nothing in progress."""
    if not (s.active_run or s.done_run or s.active_seen or s.buffered or s.running):
        return s
    return replace(s, active_run="", done_run="", active_seen=None, buffered=None, running=())
