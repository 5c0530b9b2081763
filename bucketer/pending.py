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
from collections.abc import Iterator
from datetime import datetime

from bucketer.model import Timer

Position = tuple[datetime, str]

# A line's list of instants keeps an emptied instant (its timers all handed) until this many
# are dead and they are half of it: instants are handed oldest first, so most are removed from
# the front, where deleting from a list of a million costs a copy of the million each time.
_COMPACT_AT = 64


class Line:
    """One (kind, lane) of a shard's pending timers, by instant, oldest first."""

    __slots__ = ("_dead", "_groups", "_instants", "count", "kind", "lane")

    def __init__(self, kind: str, lane: str) -> None:
        self.kind = kind
        self.lane = lane
        self.count = 0
        # Sorted; may hold instants whose group is empty (dead) until the next compaction.
        self._instants: list[datetime] = []
        self._groups: dict[datetime, dict[str, Timer]] = {}
        self._dead = 0

    def add(self, t: Timer) -> None:
        at = t.fire_time
        group = self._groups.get(at)
        if group is None:
            group = self._groups[at] = {}
            if not self._instants or at > self._instants[-1]:
                self._instants.append(at)  # read in order: the usual case
            else:
                bisect.insort(self._instants, at)
        elif not group:
            self._dead -= 1  # an emptied instant, still listed, comes back to life
        group[t.timer_id] = t
        self.count += 1

    def remove(self, t: Timer) -> None:
        group = self._groups[t.fire_time]
        del group[t.timer_id]
        self.count -= 1
        if not group:
            self._dead += 1
            if self._dead >= _COMPACT_AT and self._dead * 2 >= len(self._instants):
                self._instants = [at for at in self._instants if self._groups[at]]
                self._groups = {at: self._groups[at] for at in self._instants}
                self._dead = 0

    def instants(self) -> Iterator[tuple[datetime, dict[str, Timer]]]:
        """The instants that hold timers, oldest first, each with its timers (by id)."""
        groups = self._groups
        for at in self._instants:
            group = groups[at]
            if group:
                yield at, group

    def first(self) -> datetime | None:
        """The oldest instant holding a timer."""
        for at, _group in self.instants():
            return at
        return None

    def first_from(self, start: datetime) -> datetime | None:
        """The oldest instant at or after ``start`` holding a timer."""
        groups = self._groups
        instants = self._instants
        for i in range(bisect.bisect_left(instants, start), len(instants)):
            if groups[instants[i]]:
                return instants[i]
        return None

    def due(self, until: datetime) -> tuple[int, datetime | None, datetime | None]:
        """How many timers are due by ``until``, and the first and last instant of them."""
        count = 0
        first: datetime | None = None
        last: datetime | None = None
        for at, group in self.instants():
            if at > until:
                break
            if first is None:
                first = at
            last = at
            count += len(group)
        return count, first, last

    def timers(self, since: datetime | None, until: datetime) -> Iterator[Timer]:
        """The timers due from ``since`` (None: the first) up to ``until`` (inclusive), oldest
        first; lazily, so taking the first few of a herd touches only those."""
        for at, group in self.instants():
            if at > until:
                return
            if since is None or at >= since:
                yield from group.values()

    def count_before(self, cut: datetime) -> int:
        """How many timers are due before ``cut``."""
        count = 0
        for at, group in self.instants():
            if at >= cut:
                break
            count += len(group)
        return count


class PendingTimers:
    """A shard's timers read and not yet handed: by position, and in lines by kind and lane.

    ``put`` is given the timer's lane (the scanner's fairness lane, "" without lanes): it is
    worked out once, when the timer is read, and a round then needs no timer's lane.
    """

    __slots__ = ("_lines", "_timers")

    def __init__(self) -> None:
        self._timers: dict[Position, tuple[Timer, str]] = {}
        self._lines: dict[tuple[str, str], Line] = {}

    def __len__(self) -> int:
        return len(self._timers)

    def __bool__(self) -> bool:
        return bool(self._timers)

    def __contains__(self, pos: Position) -> bool:
        return pos in self._timers

    def get(self, pos: Position) -> Timer | None:
        held = self._timers.get(pos)
        return None if held is None else held[0]

    def put(self, t: Timer, lane: str = "") -> None:
        """Keeps ``t``, in place of a timer read before at its position (a row written again)."""
        pos = (t.fire_time, t.timer_id)
        if pos in self._timers:
            self.pop(pos)
        self._timers[pos] = (t, lane)
        key = (t.kind, lane)
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = Line(t.kind, lane)
        line.add(t)

    def pop(self, pos: Position) -> Timer | None:
        """Forgets the timer at ``pos`` (handed); returns it, or None if none was pending."""
        held = self._timers.pop(pos, None)
        if held is None:
            return None
        t, lane = held
        key = (t.kind, lane)
        line = self._lines[key]
        line.remove(t)
        if not line.count:
            del self._lines[key]
        return t

    def lines(self) -> Iterator[Line]:
        """The lines holding timers."""
        return iter(self._lines.values())

    def first_from(self, start: datetime) -> datetime | None:
        """The fire time of the oldest pending timer due at or after ``start``, of any line."""
        found = [at for line in self._lines.values() if (at := line.first_from(start)) is not None]
        return min(found) if found else None
