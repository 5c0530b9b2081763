"""Shared helpers for tests that need the real local Cassandra and Kafka."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

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
