"""Fixtures for integration tests: a migrated keyspace of their own on the real Cassandra."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cassandra.cluster import Session

from bucketer.cql import connect
from ops.migrate import migrate
from scheduler.config import Config
from tests.services import require_services, test_config


@pytest.fixture(scope="session")
def config() -> Config:
    cfg = test_config()
    require_services(cfg)
    return cfg


@pytest.fixture(scope="session")
def migrated(config: Config) -> Iterator[Config]:
    migrate(config, out=lambda _line: None)
    yield config
    session = connect(config.cassandra_hosts, config.cassandra_port)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=60)
    finally:
        session.cluster.shutdown()


@pytest.fixture(scope="session")
def session(migrated: Config) -> Iterator[Session]:
    s = connect(migrated.cassandra_hosts, migrated.cassandra_port)
    yield s
    s.cluster.shutdown()
