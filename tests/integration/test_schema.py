"""The schema: migrations are idempotent and a fresh schema.cql equals all migrations applied."""

from __future__ import annotations

import uuid
from typing import Any

from cassandra.cluster import Session

from ops.migrate import SCHEMA, apply_file, discover, migrate
from scheduler.config import Config

_IGNORED_TABLE_OPTIONS = {"keyspace_name", "table_name", "id"}


def _describe(session: Session, keyspace: str) -> dict[str, Any]:
    tables = {
        r.table_name: {k: v for k, v in r._asdict().items() if k not in _IGNORED_TABLE_OPTIONS}
        for r in session.execute(
            "SELECT * FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
        )
    }
    columns = sorted(
        (r.table_name, r.column_name, r.type, r.kind, r.position, r.clustering_order)
        for r in session.execute(
            "SELECT * FROM system_schema.columns WHERE keyspace_name = %s", (keyspace,)
        )
    )
    indexes = sorted(
        (r.table_name, r.index_name, r.kind, sorted(r.options.items()))
        for r in session.execute(
            "SELECT * FROM system_schema.indexes WHERE keyspace_name = %s", (keyspace,)
        )
    )
    return {"tables": tables, "columns": columns, "indexes": indexes}


def test_fresh_schema_equals_all_migrations(session: Session, migrated: Config) -> None:
    fresh = f"cs_fresh_{uuid.uuid4().hex[:8]}"
    session.execute(
        f"CREATE KEYSPACE {fresh} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        timeout=60,
    )
    try:
        session.set_keyspace(fresh)
        apply_file(session, SCHEMA)
        got = _describe(session, fresh)
        want = _describe(session, migrated.keyspace)
        want["tables"].pop("schema_migrations")
        want["columns"] = [c for c in want["columns"] if c[0] != "schema_migrations"]
        assert got == want
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {fresh}", timeout=60)


def test_migrate_is_idempotent_and_records_versions(session: Session, migrated: Config) -> None:
    lines: list[str] = []
    migrate(migrated, out=lines.append)
    assert not any(line.startswith("applied migration") for line in lines)
    rows = session.execute(f"SELECT version, name FROM {migrated.keyspace}.schema_migrations")
    assert sorted((r.version, r.name) for r in rows) == [(m.version, m.name) for m in discover()]
