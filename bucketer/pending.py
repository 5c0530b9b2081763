"""The timers a scanner has read and not yet handed, kept so that a round touches what it hands.

A dispatcher holds every due timer of its shards in memory until it hands it, a :00 herd of a
million included. Kept as one dict per shard, every round passed over all of them: to find
which were due, to sort them into fairness lanes, and (``record_progress``) to find each
bucket's first pending timer. A round hands a few thousand, so a million-timer backlog cost
~250 such passes to drain, and the schedules of other seconds waited behind each pass.

Here a shard's pending timers are kept in *lines*, one per (kind, lane), and within a line by
instant (their fire time), oldest first, each instant's timers in the order they were read. A
round then looks at each line's instants, not its timers: how many are due is a sum over the
due instants, a lane's oldest is the first instant of its lines, and the timers it hands are
taken from the front of those lines and nowhere else. A herd is one instant per shard.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from datetime import datetime

from bucketer.model import Timer

Position = tuple[datetime, str]

# A line's list of instants keeps an emptied instant (its timers all handed) until this many
# are dead and they are half of it: instants are handed oldest first, so most are removed from
# the front, where deleting from a list of a million costs a copy of the million each time.
# Those the line's head has passed cost nothing meanwhile; before the head was kept, every
# round walked them again (under a spread load, up to 64 per line and round: ~1 % of the
# dispatcher, more than the timers it handed cost to look up).
_COMPACT_AT = 64


class Line:
    """One (kind, lane) of a shard's pending timers, by instant, oldest first."""

    __slots__ = ("_dead", "_groups", "_head", "_instants", "count", "kind", "lane")

    def __init__(self, kind: str, lane: str) -> None:
        self.kind = kind
        self.lane = lane
        self.count = 0
        # Sorted. ``_groups`` holds only the instants with timers; the list may still hold
        # emptied (dead) ones, ``_dead`` of them, until the next compaction, but never before
        # ``_head``: the first instant holding timers (or the end).
        self._instants: list[datetime] = []
        self._groups: dict[datetime, dict[str, Timer]] = {}
        self._head = 0
        self._dead = 0

    def add(self, t: Timer) -> None:
        at = t.fire_time
        group = self._groups.get(at)
        if group is None:
            group = self._groups[at] = {}
            instants = self._instants
            if not instants or at > instants[-1]:
                instants.append(at)  # read in order: the usual case
            else:
                i = bisect.bisect_left(instants, at)
                if i < len(instants) and instants[i] == at:
                    self._dead -= 1  # an emptied instant, still listed, comes back to life
                else:
                    instants.insert(i, at)
                if i < self._head:
                    self._head = i
        group[t.timer_id] = t
        self.count += 1

    def remove(self, t: Timer) -> None:
        at = t.fire_time
        groups = self._groups
        group = groups[at]
        del group[t.timer_id]
        self.count -= 1
        if group:
            return
        del groups[at]
        instants = self._instants
        if not self.count:
            instants.clear()
            self._head = self._dead = 0
            return
        self._dead += 1
        head = self._head
        if instants[head] == at:
            # Handed from the front, the usual case: the head moves on to the next instant
            # holding timers, so no walk passes over the handed ones again.
            head += 1
            while instants[head] not in groups:
                head += 1
            self._head = head
        if self._dead >= _COMPACT_AT and self._dead * 2 >= len(instants):
            self._instants = [at for at in instants[head:] if at in groups]
            self._head = self._dead = 0

    def _live(self, lo: int, hi: int) -> Iterator[tuple[datetime, dict[str, Timer]]]:
        """The instants listed from index ``lo`` to ``hi`` that hold timers, with them."""
        groups = self._groups
        instants = self._instants
        for i in range(lo, hi):
            group = groups.get(instants[i])
            if group:
                yield instants[i], group

    def _end(self, until: datetime) -> int:
        """The index after the last listed instant at or before ``until``."""
        return bisect.bisect_right(self._instants, until, self._head)

    def instants(self) -> Iterator[tuple[datetime, dict[str, Timer]]]:
        """The instants that hold timers, oldest first, each with its timers (by id)."""
        return self._live(self._head, len(self._instants))

    def first(self) -> datetime | None:
        """The oldest instant holding a timer."""
        return self._instants[self._head] if self.count else None

    def first_from(self, start: datetime) -> datetime | None:
        """The oldest instant at or after ``start`` holding a timer."""
        start_at = bisect.bisect_left(self._instants, start, self._head)
        for at, _group in self._live(start_at, len(self._instants)):
            return at
        return None

    def due(self, until: datetime) -> tuple[int, datetime | None, datetime | None]:
        """How many timers are due by ``until``, and the first and last instant of them."""
        end = self._end(until)
        if end <= self._head:
            return 0, None, None
        instants = self._instants
        groups = self._groups
        count = 0
        last: datetime | None = None
        for at in instants[self._head : end]:
            group = groups.get(at)
            if group:
                count += len(group)
                last = at
        return count, instants[self._head], last

    def due_timers(self, until: datetime) -> list[Timer]:
        """Every timer due by ``until``, oldest first."""
        groups = self._groups
        return [
            t
            for at in self._instants[self._head : self._end(until)]
            if at in groups
            for t in groups[at].values()
        ]

    def timers(self, since: datetime | None, until: datetime) -> Iterator[Timer]:
        """The timers due from ``since`` (None: the first) up to ``until`` (inclusive), oldest
        first; lazily, so taking the first few of a herd touches only those."""
        lo = self._head if since is None else bisect.bisect_left(self._instants, since, self._head)
        for _at, group in self._live(lo, self._end(until)):
            yield from group.values()

    def count_before(self, cut: datetime) -> int:
        """How many timers are due before ``cut``."""
        end = bisect.bisect_left(self._instants, cut, self._head)
        return sum(len(group) for _at, group in self._live(self._head, end))


class PendingTimers:
    """A shard's timers read and not yet handed: by position, and in lines by kind and lane.

    ``put`` is given the timer's lane (the scanner's fairness lane, "" without lanes): it is
    worked out once, when the timer is read, and a round then needs no timer's lane.
    """

    __slots__ = ("_line_of", "_lines", "_timers", "get")

    def __init__(self) -> None:
        self._timers: dict[Position, Timer] = {}
        self._line_of: dict[Position, Line] = {}  # the line holding each
        self._lines: dict[tuple[str, str], Line] = {}
        # The timer pending at a position, or None: the dict's own ``get``, no call of ours
        # (asked for every row a read returns, twice).
        self.get: Callable[[Position], Timer | None] = self._timers.get

    def __len__(self) -> int:
        return len(self._timers)

    def __bool__(self) -> bool:
        return bool(self._timers)

    def __contains__(self, pos: Position) -> bool:
        return pos in self._timers

    def put(self, t: Timer, lane: str = "") -> None:
        """Keeps ``t``, in place of a timer read before at its position (a row written again)."""
        pos = (t.fire_time, t.timer_id)
        if pos in self._timers:
            self.pop(pos)
        key = (t.kind, lane)
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = Line(t.kind, lane)
        line.add(t)
        self._timers[pos] = t
        self._line_of[pos] = line

    def pop(self, pos: Position) -> Timer | None:
        """Forgets the timer at ``pos`` (handed); returns it, or None if none was pending."""
        t = self._timers.pop(pos, None)
        if t is None:
            return None
        line = self._line_of.pop(pos)
        line.remove(t)
        if not line.count:
            del self._lines[(line.kind, line.lane)]
        return t

    def lines(self) -> Iterator[Line]:
        """The lines holding timers."""
        return iter(self._lines.values())

    def first_from(self, start: datetime) -> datetime | None:
        """The fire time of the oldest pending timer due at or after ``start``, of any line."""
        found = [at for line in self._lines.values() if (at := line.first_from(start)) is not None]
        return min(found) if found else None
