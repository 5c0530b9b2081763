"""Readiness of an API replica: what its gRPC health service says, and why.

NOT_SERVING while Cassandra does not answer a probe (every ``PROBE_EVERY``) or while this
process's clock is off the cluster's (bucketer.clock); each change is logged with its reason
and shown in ``cronscale_ready``. Load balancers and workers route around a replica that is
not serving; it goes back to SERVING by itself when the cause ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from cassandra.cluster import Session

from bucketer.clock import ClockGuard
from bucketer.cql import aexecute
from scheduler import metrics

logger = logging.getLogger(__name__)

PROBE_EVERY = timedelta(seconds=2)
PROBE_TIMEOUT = timedelta(seconds=2)
_PROBE = "SELECT release_version FROM system.local"


class Readiness:
    """Combines the Cassandra probe and the clock guard into one verdict with a reason."""

    def __init__(
        self,
        session: Session,
        guard: ClockGuard,
        on_change: Callable[[bool], Awaitable[None]],
    ) -> None:
        self._session = session
        self._guard = guard
        self._on_change = on_change
        self._storage_error = ""
        self.ok: bool | None = None

    @property
    def reason(self) -> str:
        if self._storage_error:
            return f"Cassandra does not answer: {self._storage_error}"
        return self._guard.reason

    async def probe(self) -> bool:
        """One probe; publishes the verdict if it changed. Returns it."""
        try:
            await asyncio.wait_for(aexecute(self._session, _PROBE), PROBE_TIMEOUT.total_seconds())
            self._storage_error = ""
        except Exception as e:
            self._storage_error = f"{type(e).__name__}: {e}"[:300]
        ok = not self._storage_error and self._guard.ok
        if ok != self.ok:
            was, self.ok = self.ok, ok
            metrics.READY.set(1 if ok else 0)
            if not ok:
                logger.error("not serving: %s", self.reason)
            elif was is not None:
                logger.warning("serving again")
            await self._on_change(ok)
        return ok

    async def run(self, every: timedelta = PROBE_EVERY) -> None:
        """Probes until cancelled."""
        while True:
            await self.probe()
            await asyncio.sleep(every.total_seconds())
