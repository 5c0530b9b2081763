"""Fair order for a deep backlog of due timers: weighted round-robin across lanes.

A lane is whatever the caller groups timers by (the scheduler: the tenant a timer fires for);
the wheel itself knows nothing of tenants. While a scanner's due timers fit in one round they
go out oldest first, as ever. When more are due than one round hands over (a :00 herd, a
backlog after an outage), the round is filled lane by lane: each cycle takes up to ``weight``
timer keys from every lane with timers waiting, oldest first within the lane, so a lane with
100,000 timers due takes its turns beside a lane with 10 instead of ahead of it. Timers that
share a key stay together and in order (two timers of one schedule never race each other).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
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


def fair_order(due: Sequence[Timer], lanes: Lanes) -> list[list[Timer]]:
    """``due`` (oldest first) as key groups in weighted round-robin order across lanes.

    Each key group holds one key's timers in their original order; within a lane groups keep
    the order of their first timer, and lanes take turns in the order their first timer came.
    """
    groups: dict[str, list[Timer]] = {}
    for t in due:
        group = groups.get(t.key)
        if group is None:
            groups[t.key] = [t]
        else:
            group.append(t)
    queues: dict[str, deque[list[Timer]]] = {}
    for group in groups.values():
        lane = lanes.lane(group[0])
        queue = queues.get(lane)
        if queue is None:
            queues[lane] = deque([group])
        else:
            queue.append(group)
    weights = {lane: max(1, lanes.weight(lane)) for lane in queues}
    out: list[list[Timer]] = []
    while queues:
        for lane in list(queues):
            queue = queues[lane]
            for _ in range(weights[lane]):
                out.append(queue.popleft())
                if not queue:
                    del queues[lane]
                    break
    return out


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
