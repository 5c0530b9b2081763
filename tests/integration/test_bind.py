"""``bucketer.cql.bind`` against the driver's own ``PreparedStatement.bind``, on statements
prepared by the real Cassandra: the same bytes for every value, null and unset alike, by
position and by name, and the driver's errors where it would raise; and what
``grouped_batches`` sends of the rows it binds."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE, BatchStatement, BoundStatement

import bucketer
import scheduler
from bucketer.cql import Queries, Write, bind, grouped_batches
from scheduler.config import Config

NOW = datetime(2026, 12, 4, 12, 0, 0, 123000, tzinfo=UTC)
# An ENQUEUED run row's values in insert_run's marker order.
RUN_ROW = (
    "s1",
    20426,
    NOW,
    "s1@2026-12-04T12:00:00Z",
    "ENQUEUED",
    1,
    "echo",
    "acme",
    False,
    NOW,
    UNSET_VALUE,
    None,
    UNSET_VALUE,
    UNSET_VALUE,
    None,
    1500,
    1764849600000000,
)


@pytest.fixture
def queries(session: Session, migrated: Config) -> Iterator[tuple[Queries, Queries]]:
    yield (
        Queries(
            session, Path(scheduler.__file__).parent / "queries.cql", keyspace=migrated.keyspace
        ),
        Queries(
            session, Path(bucketer.__file__).parent / "queries.cql", keyspace=migrated.keyspace
        ),
    )


def test_positional_values_bind_as_the_driver_binds_them(queries: tuple[Queries, Queries]) -> None:
    runs, _timers = queries
    stmt = runs["insert_run"]
    values = RUN_ROW
    ours, theirs = bind(stmt, values), stmt.bind(values)
    assert ours.values == theirs.values
    assert ours.routing_key == theirs.routing_key
    assert ours.keyspace == theirs.keyspace


def test_a_run_row_by_name_binds_as_by_position(queries: tuple[Queries, Queries]) -> None:
    # The firing path writes run rows by name: the same bytes as the positional values above.
    runs, _timers = queries
    stmt = runs["insert_run"]
    params = {
        "schedule_id": "s1",
        "day": 20426,
        "scheduled_for": NOW,
        "run_id": "s1@2026-12-04T12:00:00Z",
        "status": "ENQUEUED",
        "attempt": 1,
        "handler": "echo",
        "tenant": "acme",
        "manual": False,
        "enqueue_time": NOW,
        "skip_reason": UNSET_VALUE,
        "error": None,
        "next_attempt_time": None,
        "deferred_ms": 1500,
        "ts": 1764849600000000,
    }  # origin_run_id and backfill_id left out: unset
    positional = RUN_ROW
    ours = bind(stmt, params)
    assert ours.values == bind(stmt, positional).values == stmt.bind(params).values
    assert ours.routing_key == stmt.bind(positional).routing_key


def test_named_values_and_missing_ones_bind_as_the_driver_binds_them(
    queries: tuple[Queries, Queries],
) -> None:
    runs, _timers = queries
    stmt = runs["mark_active"]
    params = {"ts": 1764849600000000, "run_id": "s1@x", "schedule_id": "s1"}  # "seen" left out
    ours, theirs = bind(stmt, params), stmt.bind(params)
    assert ours.values == theirs.values
    assert UNSET_VALUE in ours.values
    assert ours.routing_key == theirs.routing_key


def test_short_positional_values_are_unset_at_the_end(queries: tuple[Queries, Queries]) -> None:
    _runs, timers = queries
    stmt = timers["put_timer"]
    values = (29000000, 3, NOW, "f:s1:1", "fire", "s1")  # data and TTL left out
    assert bind(stmt, values).values == stmt.bind(values).values


def test_bad_values_get_the_drivers_errors(queries: tuple[Queries, Queries]) -> None:
    _runs, timers = queries
    stmt = timers["put_timer"]
    with pytest.raises(TypeError, match='column "shard"'):
        bind(stmt, (29000000, "three", NOW, "f:s1:1", "fire", "s1", b"", 60))
    with pytest.raises(ValueError, match="Too many arguments"):
        bind(stmt, (29000000, 3, NOW, "f:s1:1", "fire", "s1", b"", 60, 1))
    with pytest.raises(ValueError, match="routing key"):
        bind(stmt, (UNSET_VALUE, 3, NOW, "f:s1:1", "fire", "s1", b"", 60))


def test_timestamps_bind_as_the_driver_binds_them(queries: tuple[Queries, Queries]) -> None:
    # insert_run's two timestamp columns go through bucketer.cql.serialize_timestamp.
    runs, _timers = queries
    stmt = runs["insert_run"]
    zone = ZoneInfo("America/New_York")
    for moment in (
        NOW,
        NOW.replace(tzinfo=None),  # naive: taken as UTC, as the driver takes it
        NOW.astimezone(zone),
        datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
    ):
        values = (*RUN_ROW[:2], moment, *RUN_ROW[3:9], moment, *RUN_ROW[10:])
        assert bind(stmt, values).values == stmt.bind(values).values, moment


def test_a_lone_row_goes_as_its_own_statement_and_rows_together_as_one_batch(
    session: Session, queries: tuple[Queries, Queries]
) -> None:
    runs, _timers = queries
    stmt = runs["insert_run"]
    second = ("s2", *RUN_ROW[1:3], "s2@2026-12-04T12:00:00Z", *RUN_ROW[4:])
    (alone,) = grouped_batches(session, [Write("s1", stmt, RUN_ROW)])
    assert isinstance(alone, BoundStatement)
    assert alone.values == bind(stmt, RUN_ROW).values
    (together,) = grouped_batches(session, [Write("s1", stmt, RUN_ROW), Write("s2", stmt, second)])
    assert isinstance(together, BatchStatement)
    assert len(together._statements_and_parameters) == 2


def test_rows_go_in_batches_by_size_when_every_host_replicates_every_partition(
    session: Session, queries: tuple[Queries, Queries]
) -> None:
    """On a cluster where each host holds every partition (this one node), the partitions
    are not grouped by their replica: the first partition's replicas say so, and the rest go
    without a routing key and a replica lookup each (~3 µs a partition)."""
    runs, _timers = queries
    stmt = runs["insert_run"]
    rows = [
        Write(f"s{i}", stmt, (f"s{i}", *RUN_ROW[1:3], f"s{i}@2026-12-04T12:00:00Z", *RUN_ROW[4:]))
        for i in range(250)
    ]
    metadata = session.cluster.metadata
    looked_up = 0
    get_replicas = metadata.get_replicas

    def counted(keyspace: str, key: bytes) -> list[object]:
        nonlocal looked_up
        looked_up += 1
        return list(get_replicas(keyspace, key))

    metadata.get_replicas = counted
    try:
        batches = grouped_batches(session, rows)
    finally:
        del metadata.get_replicas  # the class's method again
    assert looked_up == 1
    sizes = [len(b._statements_and_parameters) for b in batches if isinstance(b, BatchStatement)]
    assert sizes == [100, 100, 50]
    sent = [v for b in batches for _, _, v in b._statements_and_parameters]
    assert sent == [bind(stmt, w.params).values for w in rows]
