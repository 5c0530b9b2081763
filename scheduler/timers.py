"""What the control plane stores in a timer: which schedule, which slot, which generation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from bucketer.keys import shard_of
from bucketer.model import Timer
from scheduler.model import UnsupportedVersion

FIRE = "fire"
_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class FireTimer:
    """A schedule's pending firing.

    ``slot`` is the spec's time (what the next slot is computed from); ``scheduled_for`` is the
    slot plus the schedule's jitter (when it fires, and what its run id derives from).
    """

    schedule_id: str
    generation: int
    slot: datetime
    scheduled_for: datetime

    def to_timer(self, shard_count: int) -> Timer:
        data = json.dumps(
            {
                "v": _VERSION,
                "g": self.generation,
                "slot": _ms(self.slot),
                "at": _ms(self.scheduled_for),
            },
            separators=(",", ":"),
        ).encode()
        return Timer(
            fire_time=self.scheduled_for,
            timer_id=self.schedule_id,
            shard=shard_of(self.schedule_id, shard_count),
            kind=FIRE,
            key=self.schedule_id,
            data=data,
        )

    @classmethod
    def from_timer(cls, timer: Timer) -> FireTimer:
        doc = json.loads(timer.data)
        if doc.get("v", 0) > _VERSION:
            raise UnsupportedVersion(f"fire timer version {doc['v']} is newer than {_VERSION}")
        return cls(
            schedule_id=timer.key,
            generation=int(doc["g"]),
            slot=_from_ms(doc["slot"]),
            scheduled_for=_from_ms(doc["at"]),
        )


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
