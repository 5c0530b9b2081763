"""Cassandra's own count of its operations by table, per firing, for the firing harness.

Cassandra counts every local partition read, partition write (a mutation: the rows of one
partition in one request) and range scan per table (the virtual tables
``system_views.local_read_latency``, ``local_write_latency`` and ``local_scan_latency``). Read
at both ends of the measured window and divided by the firings, they say what a firing costs the
database in operations, whatever the Python side believes it sends: a schedule read per firing
creeping back onto the hot path shows as ``schedules`` reads, a lightweight transaction per
firing as ``system.paxos`` writes (counted over the node: every keyspace's transactions).

It also lists the compactions that ended in the window (``system.compaction_history``), by
table, over the whole node: a compaction takes a core for seconds, and one of a table outside
the benchmark (a ``system.paxos`` grown by earlier runs' lightweight transactions, rewritten
whole each time a few KiB of it are flushed) moves a window's CPU and lag as much as any change
of the firing path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from cassandra.cluster import Session

OPS = ("read", "write", "scan")
# Outside the benchmark's keyspace, only Paxos's own table: one write per round of a
# lightweight transaction's protocol.
PAXOS = ("system", "paxos")

Counts = dict[tuple[str, str], int]
"""An operation count by (table, operation)."""


def table_counts(session: Session, keyspace: str) -> Counts:
    """Cassandra's counts of each operation on each table of ``keyspace``, and on Paxos's."""
    out: Counts = {}
    for op in OPS:
        for ks in (keyspace, PAXOS[0]):
            rows = session.execute(
                f"SELECT table_name, count FROM system_views.local_{op}_latency "
                "WHERE keyspace_name = %s",
                (ks,),
            )
            for row in rows:
                if ks == keyspace:
                    out[(row.table_name, op)] = row.count
                elif row.table_name == PAXOS[1]:
                    out[(".".join(PAXOS), op)] = row.count
    return out


def per_firing_ops(before: Counts, after: Counts, fired: float) -> dict[str, dict[str, float]]:
    """The operations each firing cost between two counts, by table and operation; tables and
    operations that did not move are left out."""
    out: dict[str, dict[str, float]] = {}
    if fired <= 0:
        return out
    for (table, op), count in sorted(after.items()):
        moved = count - before.get((table, op), 0)
        if moved > 0:
            out.setdefault(table, {})[op] = moved / fired
    return out


def report_line(per: Mapping[str, Mapping[str, float]], *, unit: str = "firing") -> str:
    """One line of the report: the tables with the most operations per ``unit`` first."""
    if not per:
        return f"- Cassandra's operations per {unit}: none counted"
    plural = {"read": "partition reads", "write": "partition writes", "scan": "range scans"}
    ordered = sorted(per.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    parts = [
        f"{table} " + ", ".join(f"{ops[op]:.3g} {plural[op]}" for op in OPS if op in ops)
        for table, ops in ordered
    ]
    return f"- Cassandra's operations per {unit} in the window, by its own counters: " + "; ".join(
        parts
    )


@dataclass(frozen=True)
class Compactions:
    """The compactions of one table that ended in the window, and the bytes they read."""

    table: str
    count: int
    bytes_in: int


def compactions_between(
    rows: Iterable[tuple[str, str, datetime, int]], since: datetime, until: datetime
) -> list[Compactions]:
    """From (keyspace, table, compacted_at, bytes_in) rows, each table's compactions that ended
    in [since, until), the most bytes first (a naive ``compacted_at`` is UTC, as the driver
    reads a timestamp)."""
    by_table: dict[str, tuple[int, int]] = {}
    for keyspace, table, at, bytes_in in rows:
        when = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        if since <= when < until:
            count, total = by_table.get(f"{keyspace}.{table}", (0, 0))
            by_table[f"{keyspace}.{table}"] = (count + 1, total + (bytes_in or 0))
    out = [Compactions(table, count, total) for table, (count, total) in by_table.items()]
    return sorted(out, key=lambda c: (-c.bytes_in, c.table))


def node_compactions(session: Session, since: datetime, until: datetime) -> list[Compactions]:
    """The compactions Cassandra recorded as ended in [since, until), by table."""
    rows = session.execute(
        "SELECT keyspace_name, columnfamily_name, compacted_at, bytes_in "
        "FROM system.compaction_history"
    )
    return compactions_between(
        ((r.keyspace_name, r.columnfamily_name, r.compacted_at, r.bytes_in) for r in rows),
        since,
        until,
    )


def compactions_line(found: Iterable[Compactions], *, keyspace: str) -> str:
    """One line of the report; the benchmark's own keyspace is named ``<bench>``."""
    parts = []
    for c in found:
        name = c.table.replace(f"{keyspace}.", "<bench>.", 1)
        parts.append(f"{name} {c.count} ({c.bytes_in / 2**20:,.1f} MiB read)")
    if not parts:
        return "- Cassandra's compactions that ended in the window: none"
    return "- Cassandra's compactions that ended in the window, by table: " + "; ".join(parts)
