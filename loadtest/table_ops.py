"""Cassandra's own count of its operations by table, per firing, for the firing harness.

Cassandra counts every local partition read, partition write (a mutation: the rows of one
partition in one request) and range scan per table (the virtual tables
``system_views.local_read_latency``, ``local_write_latency`` and ``local_scan_latency``). Read
at both ends of the measured window and divided by the firings, they say what a firing costs the
database in operations, whatever the Python side believes it sends: a schedule read per firing
creeping back onto the hot path shows as ``schedules`` reads, a lightweight transaction per
firing as ``system.paxos`` writes (counted over the node: every keyspace's transactions).
"""

from __future__ import annotations

from collections.abc import Mapping

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
