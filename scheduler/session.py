"""Opening the control plane's Cassandra session and reading cluster settings."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from bucketer.clock import ClockGuard
from bucketer.cql import aexecute, connect, first
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.cassandra_tenancy import CassandraTenantStore
from scheduler.config import Config
from scheduler.dead_letters import CassandraDeadLetterStore
from scheduler.errors import FailedPrecondition

logger = logging.getLogger(__name__)


def open_session(config: Config) -> Session:
    """A session on the configured keyspace (StorageUnavailable says how to start Cassandra)."""
    session = connect(
        config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
    )
    rows = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (config.keyspace,),
    )
    if rows.one() is None:
        session.cluster.shutdown()
        raise FailedPrecondition(
            f"keyspace {config.keyspace!r} does not exist; run `cronscale db migrate` first"
        )
    return session


async def shard_count(session: Session, keyspace: str) -> int:
    """The shard count fixed when the keyspace was migrated."""
    rows = await aexecute(
        session, f"SELECT value FROM {keyspace}.cluster_settings WHERE name = %s", ("shard_count",)
    )
    row = first(rows)
    if row is None:
        raise FailedPrecondition("cluster_settings has no shard_count; run `cronscale db migrate`")
    return int(row.value)


@dataclass(frozen=True, kw_only=True)
class Stores:
    """The Cassandra stores a control-plane process works with, on one session."""

    session: Session
    timers: CassandraTimerStore
    schedules: CassandraScheduleStore
    runs: CassandraRunStore
    dead_letters: CassandraDeadLetterStore
    tenants: CassandraTenantStore

    def close(self) -> None:
        self.session.cluster.shutdown()


async def open_stores(config: Config) -> Stores:
    """Connects (off the event loop) and prepares every store; the caller closes them."""
    session = await asyncio.to_thread(open_session, config)
    try:
        shards = await shard_count(session, config.keyspace)
    except BaseException:
        session.cluster.shutdown()
        raise
    schedules = CassandraScheduleStore(session, keyspace=config.keyspace)
    return Stores(
        session=session,
        timers=CassandraTimerStore(
            session,
            keyspace=config.keyspace,
            shard_count=shards,
            clock_guard=ClockGuard(
                tolerance=timedelta(milliseconds=config.clock_skew_tolerance_ms)
            ),
        ),
        schedules=schedules,
        runs=CassandraRunStore(session, schedules),
        dead_letters=CassandraDeadLetterStore(session, keyspace=config.keyspace),
        tenants=CassandraTenantStore(session, keyspace=config.keyspace),
    )


async def measure_clock(guard: ClockGuard, session: Session) -> None:
    """The first clock-skew measurement, before a process serves; logged either way."""
    try:
        skew = await guard.measure(session)
    except Exception as e:
        logger.warning("could not measure the clock against the cluster: %s", e)
        return
    if guard.ok:
        logger.info("clock within %.3f s of the cluster's", abs(skew.total_seconds()))
