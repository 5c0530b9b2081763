"""Readiness of an api or dispatcher: what its gRPC health service says, and why.

NOT_SERVING while one of the process's dependencies does not answer a probe (every
``PROBE_EVERY``: Cassandra for both, Kafka too for a dispatcher) or while its clock is off the
cluster's (bucketer.clock); each change is logged with its reason and shown in
``cronscale_ready``. Load balancers and orchestrators (a Kubernetes ``grpc`` probe) route
around a process that is not serving; it goes back to SERVING by itself when the cause ends.

The api answers health on its own port. A dispatcher serves nothing else, so it answers on
``CRONSCALE_HEALTH_LISTEN`` (:func:`serve_health`) when that is set, NOT_SERVING from the
moment it starts until Cassandra and Kafka both answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import grpc
from cassandra.cluster import Session
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bucketer.clock import ClockGuard
from bucketer.cql import aexecute
from scheduler import metrics

logger = logging.getLogger(__name__)

PROBE_EVERY = timedelta(seconds=2)
PROBE_TIMEOUT = timedelta(seconds=2)

# A dependency's probe: returns when the dependency answered, raises when it did not.
Probe = Callable[[], Awaitable[object]]

_CASSANDRA_PROBE = "SELECT release_version FROM system.local"


def cassandra_probe(session: Session) -> Probe:
    """A probe of the Cassandra node ``session`` is connected to: one local read."""
    return lambda: aexecute(session, _CASSANDRA_PROBE)


class Readiness:
    """Combines the dependencies' probes and the clock guard into one verdict with a reason.

    ``checks`` are (name, probe) pairs, probed in order each round; the reason names the first
    that failed, e.g. ``Kafka does not answer: KafkaConnectionError: ...``.
    """

    def __init__(
        self,
        checks: Sequence[tuple[str, Probe]],
        guard: ClockGuard,
        on_change: Callable[[bool], Awaitable[None]],
    ) -> None:
        self._checks = list(checks)
        self._guard = guard
        self._on_change = on_change
        self._failure = ""
        self.ok: bool | None = None
        # Per check: since when (time.monotonic) it has failed every round it was probed in,
        # and its last failure; absent while it answers (or was never probed).
        self._failing: dict[str, tuple[float, str]] = {}

    @property
    def reason(self) -> str:
        return self._failure or self._guard.reason

    def down_for(self, name: str, at_least: timedelta) -> str:
        """Why check ``name`` has failed every probe for ``at_least`` (its last failure), or
        "" if it answered within that time (or a check before it failed, so it was not
        probed: nothing new is known of it)."""
        failing = self._failing.get(name)
        if failing is None or time.monotonic() - failing[0] < at_least.total_seconds():
            return ""
        return failing[1]

    async def probe(self) -> bool:
        """One round of probes; publishes the verdict if it changed. Returns it."""
        self._failure = ""
        for name, check in self._checks:
            try:
                await asyncio.wait_for(check(), PROBE_TIMEOUT.total_seconds())
            except Exception as e:
                self._failure = f"{name} does not answer: {type(e).__name__}: {e}"[:300]
                since = self._failing.get(name, (time.monotonic(), ""))[0]
                self._failing[name] = (since, self._failure)
                break
            self._failing.pop(name, None)
        ok = not self._failure and self._guard.ok
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


class HealthStatus:
    """The gRPC health service of a process: one status for the server ("") and for each of
    the services it names."""

    def __init__(self, services: Sequence[str] = ()) -> None:
        self.servicer = health.aio.HealthServicer()
        self._names = ("", *services)

    async def publish(self, ok: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._names:
            await self.servicer.set(name, status)


async def serve_health(listen: str, status: HealthStatus) -> grpc.aio.Server:
    """Starts a gRPC server on ``listen`` with the health service (and reflection) alone;
    NOT_SERVING until ``status`` is published otherwise. OSError if it cannot listen."""
    await status.publish(False)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(status.servicer, server)
    reflection.enable_server_reflection((health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"cannot listen on {listen} for health checks")
    await server.start()
    logger.info("health service listening on %s", listen)
    return server
