"""Cassandra's own operation counters, as the firing harness reads them (loadtest.table_ops)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session

from loadtest.table_ops import node_compactions, per_firing_ops, table_counts
from scheduler.config import Config


def test_a_write_a_read_and_a_lightweight_transaction_are_counted_by_table(
    session: Session, migrated: Config
) -> None:
    ks = migrated.keyspace
    before = table_counts(session, ks)
    assert ("runs", "write") in before and ("schedules", "read") in before
    session.execute(
        f"INSERT INTO {ks}.schedule_changes (minute_bucket, changed_at, schedule_id) "
        "VALUES (0, toTimestamp(now()), %s)",  # bucket 0: no cache reads that far back
        ("table-ops-test",),
    )
    session.execute(f"SELECT * FROM {ks}.schedules WHERE schedule_id = %s", ("table-ops-test",))
    session.execute(
        f"INSERT INTO {ks}.dispatchers (grp, instance) VALUES (%s, %s) IF NOT EXISTS",
        ("table-ops-test", "table-ops-test"),
    )
    after = table_counts(session, ks)
    moved = per_firing_ops(before, after, fired=1)
    assert moved["schedule_changes"]["write"] >= 1
    assert moved["schedules"]["read"] >= 1
    assert moved["system.paxos"]["write"] >= 1


def test_the_node_s_compaction_history_is_read_whole_over_a_window_that_spans_it(
    session: Session,
) -> None:
    """Every compaction the node kept (a week's) falls in a window from long before to now,
    each counted once under its table."""
    kept = list(
        session.execute("SELECT keyspace_name, columnfamily_name FROM system.compaction_history")
    )
    # A node that has applied the schema has compacted its schema tables (seconds after
    # `cronscale db migrate` on an emptied node).
    assert kept, "no compaction recorded on a migrated node"
    now = datetime.now(UTC) + timedelta(minutes=1)
    found = node_compactions(session, now - timedelta(days=365), now)
    assert sum(c.count for c in found) >= len(kept)  # more may have ended since
    assert {f"{r.keyspace_name}.{r.columnfamily_name}" for r in kept} <= {c.table for c in found}
    assert node_compactions(session, now, now + timedelta(days=1)) == []
