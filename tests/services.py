"""Shared helpers for tests that need the real local Cassandra and Kafka."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import uuid
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ops.local import LocalSettings
from scheduler.config import Config

START_HINT = "start them with `cronscale local up` (or `make dev` / `make test`, which do it)"


def _reachable(hostport: str) -> bool:
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def require_services(config: Config) -> None:
    """Fails (never skips) the test run when Cassandra or Kafka is not answering."""
    cql = f"{config.cassandra_hosts[0]}:{config.cassandra_port}"
    missing = [
        f"{name} at {addr}"
        for name, addr in (("Cassandra", cql), ("Kafka", config.kafka_bootstrap))
        if not _reachable(addr)
    ]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not reachable; {START_HINT}", pytrace=False)


# The Kafka the worker's own tests reach directly (no Config): CRONSCALE_KAFKA_BOOTSTRAP, else
# the local stack's broker.
KAFKA_BOOTSTRAP = os.environ.get("CRONSCALE_KAFKA_BOOTSTRAP") or (
    f"127.0.0.1:{os.environ.get('CRONSCALE_LOCAL_KAFKA_PORT') or 9092}"
)


def require_kafka(bootstrap: str = KAFKA_BOOTSTRAP) -> tuple[str, int]:
    """The first broker of ``bootstrap`` as (host, port); fails (never skips) the test run when
    it is not answering."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not _reachable(f"{host}:{port}"):
        pytest.fail(f"Kafka is not reachable at {bootstrap}; {START_HINT}", pytrace=False)
    return host, int(port)


def test_config(**overrides: object) -> Config:
    """A configuration isolated from other tests: its own keyspace and topic prefix."""
    token = uuid.uuid4().hex[:10]
    base = Config.from_env(dict(os.environ))
    values: dict[str, object] = {
        "keyspace": f"cs_test_{token}",
        "topic_prefix": f"cs-test-{token}.runs",
        "shard_count": 8,
        "topic_partitions": 3,
    }
    values.update(overrides)
    return Config(**{**base.__dict__, **values})


def private_stack_settings(home: Path, **overrides: object) -> LocalSettings:
    """A Cassandra + Kafka pair of its own: ``home``, free ports, no JMX, ``overrides`` on top;
    the jars of the main local stack are reused (linked) when it has them, else fetched as
    ``cronscale local up`` does."""
    base = LocalSettings.from_env()
    home.mkdir(parents=True, exist_ok=True)
    if (base.home / "lib").is_dir() and not (home / "lib").exists():
        (home / "lib").symlink_to(base.home / "lib")
    ports: list[int] = []
    with contextlib.ExitStack() as held:  # all bound at once: no port handed out twice
        for _ in range(4):
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    settings = dataclasses.replace(
        base,
        home=home,
        jmx_port=0,
        cql_port=ports[0],
        storage_port=ports[1],
        kafka_port=ports[2],
        kafka_controller_port=ports[3],
    )
    return dataclasses.replace(settings, **overrides)  # type: ignore[arg-type]


async def health_status(listen: str) -> str:
    """What a gRPC health check at ``listen`` answers for the whole server (``SERVING``...)."""
    async with grpc.aio.insecure_channel(listen) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
