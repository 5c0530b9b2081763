"""Which Kafka offsets are safe to commit.

Runs finish out of order, but a committed offset means "everything before it is done": a worker
that restarts resumes after it. So per partition the tracker remembers the offsets it was given,
in order, and only moves the commit point past a prefix of finished ones. Offsets need not be
consecutive (compaction and transaction markers leave holes); order is what counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class _Partition:
    __slots__ = ("committed", "done", "next", "pending", "running")

    def __init__(self) -> None:
        # Offsets handed out and not yet passed by the commit point, in the order received.
        self.pending: deque[int] = deque()
        # Of those, the ones still being processed and the finished ones.
        self.running: set[int] = set()
        self.done: set[int] = set()
        # The offset to commit: one past the last offset of the finished prefix; -1 for none.
        self.next = -1
        self.committed = -1


class OffsetTracker(Generic[P]):
    """Per-partition bookkeeping of started and finished offsets (pure; no Kafka)."""

    def __init__(self) -> None:
        self._partitions: dict[P, _Partition] = {}

    def add(self, partition: P, offset: int) -> bool:
        """Records that ``offset`` of ``partition`` was received and is being processed;
        False (and nothing changes) for a repeated or older offset, which the caller must not
        process again.

        Offsets of one partition must be added in increasing order (Kafka delivers them so).
        """
        p = self._partitions.get(partition)
        if p is None:
            p = self._partitions[partition] = _Partition()
        last = p.pending[-1] if p.pending else p.next - 1
        if offset <= last:
            return False
        p.pending.append(offset)
        p.running.add(offset)
        return True

    def complete(self, partition: P, offset: int) -> bool:
        """Records that ``offset`` is finished; False when it is not tracked (e.g. revoked)."""
        p = self._partitions.get(partition)
        if p is None or offset not in p.running:
            return False
        p.running.remove(offset)
        p.done.add(offset)
        while p.pending and p.pending[0] in p.done:
            first = p.pending.popleft()
            p.done.discard(first)
            p.next = first + 1
        return True

    def committable(self) -> dict[P, int]:
        """Offsets to commit now: partitions whose finished prefix moved since the last commit."""
        return {tp: p.next for tp, p in self._partitions.items() if p.next > p.committed}

    def mark_committed(self, offsets: dict[P, int]) -> None:
        """Records that ``offsets`` (as returned by :meth:`committable`) were committed."""
        for tp, offset in offsets.items():
            p = self._partitions.get(tp)
            if p is not None and offset > p.committed:
                p.committed = offset

    def revoke(self, partitions: Iterable[P]) -> dict[P, int]:
        """Stops tracking ``partitions``; returns what of them is still committable.

        Offsets of these partitions that finish later are ignored by :meth:`complete`: the new
        owner receives them again (at-least-once).
        """
        result: dict[P, int] = {}
        for tp in partitions:
            p = self._partitions.pop(tp, None)
            if p is not None and p.next > p.committed:
                result[tp] = p.next
        return result

    def in_flight(self, partition: P | None = None) -> int:
        """How many received offsets are not finished (in ``partition``, or in all)."""
        if partition is not None:
            p = self._partitions.get(partition)
            return 0 if p is None else len(p.running)
        return sum(len(p.running) for p in self._partitions.values())

    def partitions(self) -> list[P]:
        """The partitions being tracked."""
        return list(self._partitions)
