"""Value objects of the timer wheel."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from bucketer.keys import minute_bucket

T = TypeVar("T")

# The kind of a timer settled before it was due (``CassandraTimerStore.settle_rows``): its row
# stays, inert; scanners skip it.
SETTLED = "settled"


@dataclass(frozen=True, kw_only=True)
class Timer:
    """A durable timer: fires at ``fire_time``; ``kind``, ``key`` and ``data`` are the caller's.

    ``timer_id`` is unique within (fire_time, shard); putting the same (fire_time, timer_id)
    again overwrites it, which makes putting idempotent.
    """

    fire_time: datetime
    timer_id: str
    shard: int
    kind: str
    key: str
    data: bytes = b""
    # An explicit write timestamp (µs) for a timer that may be settled before it is due; the
    # settling marker is written at ``stamp + 1``. None: the driver's clock.
    stamp: int | None = None
    # Set by the scanner on a timer it hands over soon after its shard changed owner, due
    # before the previous owner can have stopped: that owner may have fired it already (its
    # checkpoint trails what it fired), so the caller may check before doing the work twice.
    after_takeover: bool = False
    # A note left on the timer's row before it was due (``CassandraTimerStore.done_rows``):
    # for a schedule's fire timer, the run fired at the previous slot that has ended.
    done_run: str = ""

    @functools.cached_property
    def bucket(self) -> int:
        # Cached: a scanner asks each pending timer for it every round (a herd of a million).
        return minute_bucket(self.fire_time)

    def memo(self, name: str, compute: Callable[[Timer], T]) -> T:
        """``compute(self)``, computed once for this timer object and kept with it: a value a
        caller derives from the timer and asks for every round the timer waits (the
        dispatcher's fairness lane). Not a field: equality and hashing ignore it."""
        memos: dict[str, Any] = self.__dict__.setdefault("_memo", {})
        if name not in memos:
            memos[name] = compute(self)
        return cast(T, memos[name])

    @property
    def position(self) -> tuple[datetime, str]:
        """The timer's place in its partition's clustering order."""
        return (self.fire_time, self.timer_id)

    @classmethod
    def from_row(cls, row: Any, *, shard: int) -> Timer:
        return cls(
            fire_time=aware(row.fire_time),
            timer_id=row.timer_id,
            shard=shard,
            kind=row.kind or "",
            key=row.key or "",
            data=bytes(row.data or b""),
            done_run=getattr(row, "done_run", None) or "",
        )


@dataclass(frozen=True, kw_only=True)
class ShardLease:
    """The ownership state of one shard as stored."""

    shard: int
    epoch: int
    owner: str | None
    lease_expires: datetime | None
    done_through: int | None

    @classmethod
    def from_row(cls, shard: int, row: Any) -> ShardLease:
        if row is None:
            return cls(shard=shard, epoch=0, owner=None, lease_expires=None, done_through=None)
        return cls(
            shard=shard,
            epoch=row.epoch or 0,
            owner=row.owner,
            lease_expires=aware(row.lease_expires) if row.lease_expires else None,
            done_through=row.done_through,
        )


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Progress inside one (bucket, shard) partition: everything at or before it has fired."""

    bucket: int
    fire_time: datetime
    timer_id: str


def aware(t: datetime) -> datetime:
    """Cassandra hands back naive UTC datetimes; make them aware."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def micros(t: datetime) -> int:
    """Microseconds since the Unix epoch, exactly (integer arithmetic: a slot read back must
    equal the instant written, or "the next slot strictly after it" could be the same one)."""
    return (aware(t) - _EPOCH) // _MICRO


def from_micros(us: int) -> datetime:
    """The inverse of :func:`micros`."""
    return _EPOCH + timedelta(microseconds=us)
