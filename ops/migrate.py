"""Schema migrations: ``cronscale db migrate``.

Numbered ``ops/migrations/NNNN_name.cql`` files are applied in order inside the keyspace and
recorded in ``schema_migrations``; running it again applies only what is new. The keyspace's
replication comes from configuration (SimpleStrategy locally, NetworkTopologyStrategy in
production). ``ops/schema.cql`` is the same schema in one file, checked equal by a test.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from bucketer.cql import connect
from bucketer.keys import minute_bucket
from scheduler.config import Config
from scheduler.errors import InvalidArgument

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
SCHEMA = Path(__file__).with_name("schema.cql")
_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.cql$")
_KEYSPACE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


@dataclass(frozen=True, kw_only=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]


def discover(folder: Path = MIGRATIONS) -> list[Migration]:
    """The migrations in ``folder``, by version; refuses gaps and duplicates."""
    found = []
    for p in sorted(folder.glob("*.cql")):
        m = _FILE.match(p.name)
        if m is None:
            raise ValueError(f"{p.name}: migration files are named NNNN_name.cql")
        found.append(Migration(version=int(m["version"]), name=m["name"], path=p))
    for expected, mig in enumerate(found, start=1):
        if mig.version != expected:
            raise ValueError(f"migration {expected:04d} is missing (found {mig.path.name})")
    return found


def split_statements(text: str) -> list[str]:
    """Splits a CQL file into statements (`;`-terminated; `--` comments dropped)."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def replication_clause(spec: str) -> str:
    """``SimpleStrategy:1`` or ``NetworkTopologyStrategy:dc1=3,dc2=3`` as a CQL map."""
    strategy, _, rest = spec.partition(":")
    if strategy == "SimpleStrategy":
        if not rest.isdigit() or int(rest) < 1:
            raise InvalidArgument("CRONSCALE_REPLICATION", f"SimpleStrategy needs :N, got {spec!r}")
        return f"{{'class': 'SimpleStrategy', 'replication_factor': {int(rest)}}}"
    if strategy == "NetworkTopologyStrategy":
        parts = []
        for item in rest.split(","):
            dc, _, rf = item.partition("=")
            if not dc or not rf.isdigit():
                raise InvalidArgument(
                    "CRONSCALE_REPLICATION", f"expected dc=N pairs after ':', got {spec!r}"
                )
            parts.append(f"'{dc}': {int(rf)}")
        return "{'class': 'NetworkTopologyStrategy', " + ", ".join(parts) + "}"
    raise InvalidArgument(
        "CRONSCALE_REPLICATION",
        f"unknown strategy {strategy!r}; use SimpleStrategy:N or NetworkTopologyStrategy:dc=N",
    )


def apply_file(session: Session, path: Path) -> None:
    for stmt in split_statements(path.read_text()):
        session.execute(stmt, timeout=60)


def migrate(config: Config, out: Callable[[str], None] = print) -> None:
    """Creates the keyspace if needed and applies pending migrations, recording each."""
    if not _KEYSPACE.match(config.keyspace):
        raise InvalidArgument("CRONSCALE_KEYSPACE", f"{config.keyspace!r} is not a keyspace name")
    session = connect(
        config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
    )
    try:
        session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {config.keyspace} "
            f"WITH replication = {replication_clause(config.replication)}",
            timeout=60,
        )
        session.set_keyspace(config.keyspace)
        session.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version int PRIMARY KEY, name text, checksum text, applied_at timestamp)",
            timeout=60,
        )
        applied = {r.version: r for r in session.execute("SELECT * FROM schema_migrations")}
        pending = [m for m in discover() if m.version not in applied]
        for m in discover():
            if m.version in applied and applied[m.version].checksum != m.checksum:
                logger.warning("migration %s changed after it was applied", m.path.name)
        for m in pending:
            apply_file(session, m.path)
            session.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at)"
                " VALUES (%s, %s, %s, %s)",
                (m.version, m.name, m.checksum, datetime.now(UTC)),
            )
            out(f"applied migration {m.version:04d}_{m.name}")
        current = max([*applied, *(m.version for m in pending)], default=0)
        shards = _init_cluster_settings(session, config.shard_count)
        asyncio.run(_init_shards(config, shards))
        out(
            f"keyspace {config.keyspace} at schema version {current} "
            f"({len(pending)} applied now, {shards} shards)"
        )
    finally:
        session.cluster.shutdown()


async def _init_shards(config: Config, shards: int) -> None:
    # A session without a default keyspace: the stores name it per prepared statement.
    session = connect(
        config.cassandra_hosts, config.cassandra_port, security=config.cassandra_security
    )
    try:
        store = CassandraTimerStore(session, keyspace=config.keyspace, shard_count=shards)
        await store.init_shards(minute_bucket(datetime.now(UTC)))
    finally:
        session.cluster.shutdown()


def _init_cluster_settings(session: Session, shard_count: int) -> int:
    """Records the shard count on first migration; afterwards the stored value rules."""
    session.execute(
        "INSERT INTO cluster_settings (name, value) VALUES ('shard_count', %s) IF NOT EXISTS",
        (str(shard_count),),
    )
    row = session.execute("SELECT value FROM cluster_settings WHERE name = 'shard_count'").one()
    return int(row.value)
