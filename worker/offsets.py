"""Which Kafka offsets are safe to commit, and what the commit tells the partition's next owner.

Runs finish out of order, but a committed offset means "everything before it is done": a worker
that restarts resumes after it. So per partition the tracker remembers the offsets it was given,
in order, and only moves the commit point past a prefix of finished ones. Offsets need not be
consecutive (compaction and transaction markers leave holes); order is what counts.

One long run pins its partition's commit point, and everything that finished after it would
run again under the next owner. So every commit also carries, in the commit's metadata string
(which Kafka stores with the offset), the finished offsets above the commit point
(:func:`encode_finished`); the next owner reads it back (:meth:`OffsetTracker.restore`) and
does not run those again. Only what was unfinished is delivered twice.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Hashable)

METADATA_PREFIX = "cs1:"
"""Marks commit metadata written by this module (version 1 of the layout)."""

MAX_METADATA_CHARS = 4000
"""Kafka refuses commit metadata above ``offset.metadata.max.bytes`` (4096 by default)."""

MAX_DECODED = 100_000
"""A metadata string naming more offsets than this is not ours (or corrupt): ignored."""


@dataclass(frozen=True, kw_only=True)
class Commit:
    """What to commit for one partition: the next offset to consume, and the offsets above it
    that are finished already (carried in the commit's metadata)."""

    offset: int
    finished: tuple[int, ...] = ()

    @property
    def metadata(self) -> str:
        """The commit's metadata string (empty when nothing above the offset is finished)."""
        return encode_finished(self.offset, self.finished)


def encode_finished(offset: int, finished: Iterable[int], limit: int = MAX_METADATA_CHARS) -> str:
    """Encodes the offsets of ``finished`` at or above ``offset`` for a commit's metadata.

    Runs of consecutive offsets become ``gap+extra`` items (hex; ``gap`` counted from the end
    of the previous run, the first from ``offset``). Past ``limit`` characters the highest
    offsets are left out: their runs are delivered again, which is safe (at-least-once).
    """
    items: list[str] = []
    size = len(METADATA_PREFIX)
    prev = offset
    ordered = sorted(o for o in set(finished) if o >= offset)
    i = 0
    while i < len(ordered):
        start = end = ordered[i]
        while i + 1 < len(ordered) and ordered[i + 1] == end + 1:
            i += 1
            end = ordered[i]
        i += 1
        gap = start - prev
        item = f"{gap:x}" if end == start else f"{gap:x}+{end - start:x}"
        if size + len(item) + 1 > limit:
            break
        items.append(item)
        size += len(item) + 1
        prev = end + 1
    return METADATA_PREFIX + ",".join(items) if items else ""


def decode_finished(offset: int, metadata: str | None) -> list[int]:
    """The finished offsets :func:`encode_finished` wrote for a commit at ``offset``.

    Empty for empty metadata, metadata some other program wrote, or a malformed string (logged):
    then those runs are delivered again, which is safe.
    """
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return []
    body = metadata[len(METADATA_PREFIX) :]
    out: list[int] = []
    prev = offset
    try:
        for item in body.split(","):
            gap_text, _, extra_text = item.partition("+")
            gap = int(gap_text, 16)
            extra = int(extra_text, 16) if extra_text else 0
            if gap < 0 or extra < 0 or len(out) + extra + 1 > MAX_DECODED:
                raise ValueError(f"item {item!r} out of range")
            start = prev + gap
            out.extend(range(start, start + extra + 1))
            prev = start + extra + 1
    except ValueError as e:
        logger.warning("ignoring malformed commit metadata %r: %s", metadata[:80], e)
        return []
    return out


class _Partition:
    __slots__ = ("done", "inherited", "next", "pending", "running", "sent")

    def __init__(self, offset: int) -> None:
        # Offsets handed out and not yet passed by the commit point, in the order received.
        self.pending: deque[int] = deque()
        # Of those, the ones still being processed and the finished ones.
        self.running: set[int] = set()
        self.done: set[int] = set()
        # Offsets a previous owner finished (from the commit metadata), not yet passed.
        self.inherited: set[int] = set()
        # The offset to commit: one past the finished prefix (where consuming started, at
        # first).
        self.next = offset
        # The last commit made (or found), as (offset, finished above it).
        self.sent: tuple[int, tuple[int, ...]] = (offset, ())

    def finished_above(self) -> tuple[int, ...]:
        return tuple(sorted(self.done | self.inherited))

    def advance(self) -> None:
        while self.pending and self.pending[0] in self.done:
            first = self.pending.popleft()
            self.done.discard(first)
            self.next = first + 1
        if self.inherited:
            self.inherited = {o for o in self.inherited if o >= self.next}


class OffsetTracker(Generic[P]):
    """Per-partition bookkeeping of started and finished offsets (pure; no Kafka)."""

    def __init__(self) -> None:
        self._partitions: dict[P, _Partition] = {}

    def restore(self, partition: P, offset: int, finished: Iterable[int]) -> None:
        """Starts tracking a newly assigned ``partition`` from its committed ``offset``, with
        the offsets above it that the previous owner committed as finished."""
        p = _Partition(offset)
        p.inherited = {o for o in finished if o >= offset}
        p.sent = (offset, tuple(sorted(p.inherited)))
        self._partitions[partition] = p

    def add(self, partition: P, offset: int) -> bool:
        """Records that ``offset`` of ``partition`` was received and is being processed;
        False (and nothing changes) for a repeated or older offset, which the caller must not
        process again.

        Offsets of one partition must be added in increasing order (Kafka delivers them so).
        """
        p = self._partitions.get(partition)
        if p is None:
            # Not restored: consuming starts here, so everything before is as good as done.
            p = self._partitions[partition] = _Partition(offset)
        last = p.pending[-1] if p.pending else p.next - 1
        if offset <= last:
            return False
        p.pending.append(offset)
        p.running.add(offset)
        return True

    def inherited(self, partition: P, offset: int) -> bool:
        """Whether a previous owner of ``partition`` committed ``offset`` as finished: the
        caller completes it without processing it again."""
        p = self._partitions.get(partition)
        return p is not None and offset in p.inherited

    def complete(self, partition: P, offset: int) -> bool:
        """Records that ``offset`` is finished; False when it is not tracked (e.g. revoked)."""
        p = self._partitions.get(partition)
        if p is None or offset not in p.running:
            return False
        p.running.remove(offset)
        p.done.add(offset)
        p.inherited.discard(offset)
        p.advance()
        return True

    def committable(self) -> dict[P, Commit]:
        """What to commit now: partitions whose commit point or finished set above it changed
        since the last commit."""
        out: dict[P, Commit] = {}
        for tp, p in self._partitions.items():
            finished = p.finished_above()
            if (p.next, finished) != p.sent and p.next >= p.sent[0]:
                out[tp] = Commit(offset=p.next, finished=finished)
        return out

    def mark_committed(self, commits: dict[P, Commit]) -> None:
        """Records that ``commits`` (as returned by :meth:`committable`) were committed."""
        for tp, c in commits.items():
            p = self._partitions.get(tp)
            if p is not None and c.offset >= p.sent[0]:
                p.sent = (c.offset, c.finished)

    def revoke(self, partitions: Iterable[P], *, hand_over: bool = False) -> dict[P, Commit]:
        """Stops tracking ``partitions``; returns their last commits.

        Without ``hand_over``, offsets still running are left to the next owner, which receives
        them again (at-least-once), and ones finishing later are ignored by :meth:`complete`.
        With ``hand_over`` they are committed as finished: the caller promises to see them
        through itself (and the run's lease is the backstop should it die first).
        """
        result: dict[P, Commit] = {}
        for tp in partitions:
            p = self._partitions.pop(tp, None)
            if p is None:
                continue
            if hand_over and p.pending:
                p.done |= p.running
                p.running.clear()
                p.advance()
            finished = p.finished_above()
            if (p.next, finished) != p.sent and p.next >= p.sent[0]:
                result[tp] = Commit(offset=p.next, finished=finished)
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
