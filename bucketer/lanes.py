"""Fair order for a deep backlog of due timers: weighted round-robin across lanes.

A lane is whatever the caller groups timers by (the scheduler: the tenant a timer fires for);
the wheel itself knows nothing of tenants. While a scanner's due timers fit in one round they
go out oldest first, as ever. When more are due than one round hands over (a :00 herd, a
backlog after an outage), the round is filled lane by lane: each cycle takes up to ``weight``
timer keys from every lane with timers waiting, oldest first within the lane, so a lane with
100,000 timers due takes its turns beside a lane with 10 instead of ahead of it. Timers that
share a key stay together and in order (two timers of one schedule never race each other).

Within a lane, a backlog's head (its oldest timers: a :00 herd) and the timers due
after it take turns too, the later ones first, each oldest first: a tenant's herd of a million
then delays the same tenant's schedules of later seconds by a round, not by the whole drain
(past the misfire threshold, where they would count as missed), and the herd still takes at
least every other turn. Quartz, likewise, acquires on-time triggers apart from misfired ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from bucketer.model import Timer


class Lanes(Protocol):
    """How the caller groups due timers for fairness."""

    def lane(self, timer: Timer) -> str:
        """The lane of ``timer``. A key's timers go together in the lane of its oldest one
        (a schedule's lease timers, in no tenant's lane, travel with its fire timers)."""
        ...

    def weight(self, lane: str) -> int:
        """How many timer keys ``lane`` takes per cycle (at least 1)."""
        ...


def fair_order(
    due: Sequence[Timer], lanes: Lanes, *, later_from: Mapping[str, datetime] | None = None
) -> list[list[Timer]]:
    """``due`` (oldest first) as key groups in weighted round-robin order across lanes.

    Each key group holds one key's timers in their original order; lanes take turns in the
    order their first timer came. Within a lane groups keep the order of their first timer,
    except in a lane named in ``later_from``: there the groups whose first timer is due at or
    after its time (later than the lane's backlog head) and the others alternate, later first.
    """
    groups: dict[str, list[Timer]] = {}
    for t in due:
        group = groups.get(t.key)
        if group is None:
            groups[t.key] = [t]
        else:
            group.append(t)
    split = later_from or {}
    queues: dict[str, _LaneQueue] = {}
    for group in groups.values():
        lane = lanes.lane(group[0])
        queue = queues.get(lane)
        if queue is None:
            queue = queues[lane] = _LaneQueue()
        cut = split.get(lane)
        (queue.later if cut is not None and group[0].fire_time >= cut else queue.head).append(group)
    weights = {lane: max(1, lanes.weight(lane)) for lane in queues}
    out: list[list[Timer]] = []
    while queues:
        for lane in list(queues):
            queue = queues[lane]
            for _ in range(weights[lane]):
                out.append(queue.take())
                if not queue:
                    del queues[lane]
                    break
    return out


class _LaneQueue:
    """A lane's key groups: its backlog's head and those due later, apart; ``take``
    alternates between the two, later first."""

    __slots__ = ("_head_next", "head", "later")

    def __init__(self) -> None:
        self.head: deque[list[Timer]] = deque()
        self.later: deque[list[Timer]] = deque()
        self._head_next = False

    def __bool__(self) -> bool:
        return bool(self.head or self.later)

    def take(self) -> list[Timer]:
        head = (self._head_next and bool(self.head)) or not self.later
        self._head_next = not head
        return (self.head if head else self.later).popleft()


def fill_batches(groups: Sequence[list[Timer]], size: int, limit: int) -> list[list[Timer]]:
    """Key groups packed, in order, into batches of about ``size`` timers (a group is never
    split; one larger than ``size`` is a batch of its own), stopping once ``limit`` timers are
    packed: what is left waits for the next round, where it is ordered afresh."""
    batches: list[list[Timer]] = []
    current: list[Timer] = []
    packed = 0
    for group in groups:
        if packed >= limit:
            break
        if current and len(current) + len(group) > size:
            batches.append(current)
            current = []
        current.extend(group)
        packed += len(group)
    if current:
        batches.append(current)
    return batches
