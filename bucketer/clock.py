"""The clock-skew guard: a process whose clock is off the cluster's neither owns shards nor
writes timers.

Scanners read each partition up to ``now + lookahead`` and let their checkpoints trail their
clock by a grace window; a timer written "due now" by a process whose clock runs behind by more
than that lands behind the checkpoint and is never read. So every process that writes timers or
owns shards compares its clock with Cassandra's (the coordinator's ``now()``) at start and
periodically, and refuses both while the difference exceeds a tolerance well inside the grace
window, saying why in its log and health.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session

from bucketer.cql import aexecute, first

logger = logging.getLogger(__name__)

# Inside the scanner's 2 s grace window, with room for a slow write.
DEFAULT_TOLERANCE = timedelta(milliseconds=500)
CHECK_EVERY = timedelta(seconds=30)

_CLUSTER_NOW = "SELECT toUnixTimestamp(now()) AS t FROM system.local"


class ClockSkewed(Exception):
    """This process's clock differs from the cluster's beyond the tolerance."""


class ClockGuard:
    """Measures this process's clock against Cassandra's; ``check()`` raises while off."""

    def __init__(
        self,
        *,
        tolerance: timedelta = DEFAULT_TOLERANCE,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.tolerance = tolerance
        self._clock = clock
        # Cluster time minus ours; None until measured (trusted until then: the first
        # measurement runs before a process serves).
        self.skew: timedelta | None = None
        self._on_change: list[Callable[[bool], None]] = []

    @property
    def ok(self) -> bool:
        return self.skew is None or abs(self.skew) <= self.tolerance

    @property
    def reason(self) -> str:
        if self.ok or self.skew is None:
            return ""
        direction = "behind" if self.skew > timedelta(0) else "ahead of"
        return (
            f"this clock is {abs(self.skew).total_seconds():.3f} s {direction} the cluster's "
            f"(tolerance {self.tolerance.total_seconds():.3f} s): fix time sync (NTP/chrony)"
        )

    def check(self) -> None:
        """Raises :class:`ClockSkewed` while the last measurement was off."""
        if not self.ok:
            raise ClockSkewed(self.reason)

    def on_change(self, callback: Callable[[bool], None]) -> None:
        """Calls ``callback(ok)`` whenever a measurement flips the verdict."""
        self._on_change.append(callback)

    def record(self, skew: timedelta) -> None:
        """Takes a measurement (cluster minus ours)."""
        was = self.ok
        self.skew = skew
        if self.ok != was:
            if self.ok:
                logger.warning("clock back within tolerance of the cluster's (skew %s)", skew)
            else:
                logger.error("%s; refusing to own shards and to write timers", self.reason)
            for callback in self._on_change:
                callback(self.ok)

    async def measure(self, session: Session) -> timedelta:
        """One measurement: the coordinator's now() against the midpoint of the round trip.

        The midpoint is off by up to half the round trip (the request may wait in a queue on
        its way in or its answer on its way back). A round trip longer than twice the
        tolerance therefore cannot tell a clock within tolerance from one beyond it: such a
        sample is returned but keeps the verdict. (An overloaded box, 10 million schedules
        being compacted under a full firing load, measured a 0.97 s "skew" this way and gave
        up all its shards.)
        """
        before = self._clock()
        t0 = time.monotonic()
        row = first(await aexecute(session, _CLUSTER_NOW))
        rtt = time.monotonic() - t0
        cluster = datetime.fromtimestamp(row.t / 1000, tz=UTC)
        skew = cluster - (before + timedelta(seconds=rtt / 2))
        if timedelta(seconds=rtt) > 2 * self.tolerance:
            logger.warning(
                "clock check inconclusive: the round trip to Cassandra took %.3f s (skew "
                "%.3f s +- %.3f s); keeping the last verdict",
                rtt,
                skew.total_seconds(),
                rtt / 2,
            )
            return skew
        self.record(skew)
        return skew

    async def run(self, session: Session, *, every: timedelta = CHECK_EVERY) -> None:
        """Measures every ``every`` until cancelled; a failed measurement keeps the verdict."""
        while True:
            try:
                await self.measure(session)
            except Exception as e:
                logger.warning("measuring the clock against the cluster failed: %s", e)
            await asyncio.sleep(every.total_seconds())
