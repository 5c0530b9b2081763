"""A worker's health: SERVING while Kafka and the API both take what it sends, and why not.

Two conditions, each set where the worker learns it (no probes of its own):

- **Kafka**: down from start until the consumer joins, and from a failed start, a failed offset
  commit or one Kafka has not taken for ``consumer.COMMIT_SLOW`` until the next one succeeds
  (``cronscale_worker_kafka_up``).
- **API**: down from a report batch the API did not take until one is acknowledged
  (``cronscale_worker_api_up``).

With ``CRONSCALE_WORKER_HEALTH_LISTEN`` set, the worker answers gRPC health checks there
(a Kubernetes ``grpc`` probe): NOT_SERVING while either condition is down. Each change is
logged with its reason.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from worker import metrics

logger = logging.getLogger(__name__)

KAFKA = "Kafka"
API = "API"
_NOT_YET = "not connected yet"


class WorkerHealth:
    """The worker's conditions, their gauges and its gRPC health status."""

    def __init__(self, tier: str) -> None:
        self.servicer = health.aio.HealthServicer()
        self._gauges = {KAFKA: metrics.KAFKA_UP.labels(tier), API: metrics.API_UP.labels(tier)}
        # Conditions that are down, with why. Kafka is down until the consumer has joined.
        self._down: dict[str, str] = {KAFKA: _NOT_YET}
        self._gauges[KAFKA].set(0)
        self._gauges[API].set(1)
        self._publishing: set[asyncio.Task[None]] = set()
        self._served = False

    @property
    def serving(self) -> bool:
        return not self._down

    @property
    def reason(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in self._down.items())

    def up(self, name: str) -> None:
        """``name`` works again (cheap when it already did: called once per report)."""
        if name not in self._down:
            return
        del self._down[name]
        self._gauges[name].set(1)
        if not self._down:
            if self._served:
                logger.warning("serving again")
            else:
                logger.info("serving")
            self._served = True
            self._publish(True)

    def down(self, name: str, why: str) -> None:
        """``name`` fails, for the reason ``why``: logged once per failure (its retries are
        the caller's to log)."""
        new = self._down.get(name, _NOT_YET) == _NOT_YET
        self._down[name] = why
        self._gauges[name].set(0)
        if new:
            logger.error("not serving: %s", self.reason)
            self._publish(False)

    def _publish(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        try:
            task = asyncio.get_running_loop().create_task(self.servicer.set("", status))
        except RuntimeError:
            return  # no event loop (a unit test of the conditions): nothing to publish to
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def serve(self, listen: str) -> grpc.aio.Server:
        """Answers gRPC health checks on ``listen`` until the returned server is stopped."""
        await self.servicer.set(
            "",
            health_pb2.HealthCheckResponse.SERVING
            if self.serving
            else health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        if server.add_insecure_port(listen) == 0:
            raise OSError(f"cannot listen on {listen} for health checks")
        await server.start()
        logger.info("health service listening on %s", listen)
        return server
