"""The audit log against the real Cassandra: entries land in their UTC minute's partitions (by
tenant and for every tenant), the minutes that hold entries are noted per day, and a listing
pages through them newest first, across minutes and days, with filters that drop most rows,
and merged in order with entries of schema 11's day partitions where those may hold some."""

from __future__ import annotations

import base64
import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session

from bucketer.cql import aexecute
from bucketer.keys import minute_bucket
from scheduler.audit import (
    ALL_TENANTS,
    AuditEntry,
    AuditQuery,
    CassandraAuditLog,
    _day_tables_may_hold_entries,
)
from scheduler.config import Config
from scheduler.errors import InvalidArgument
from scheduler.model import day_of

# Days in 2019-2021, each handed out once: a day's partitions hold only one test's entries.
_PAST_DAYS = iter(random.sample(range(3 * 365), 3 * 365))


def _a_past_day() -> datetime:
    """Midnight of a day no other test here writes (the keyspace is shared)."""
    return datetime(2019, 1, 1, tzinfo=UTC) + timedelta(days=next(_PAST_DAYS))


def _entry(tenant: str, at: datetime, *, action: str = "UpdateSchedule", n: int = 0) -> AuditEntry:
    return AuditEntry(
        event_id=f"{uuid.uuid4()}",
        event_time=at,
        tenant_id=tenant,
        actor_key_id="key-1",
        actor_role="tenant-admin",
        action=action,
        target=f"sched-{n}",
        request_id=f"req-{n}",
        after_json=json.dumps({"n": n}),
    )


def _log(
    session: Session, config: Config, *, day_tables: bool = False, max_reads: int = 128
) -> CassandraAuditLog:
    return CassandraAuditLog(
        session,
        keyspace=config.keyspace,
        read_day_tables=day_tables,
        max_reads_a_page=max_reads,
    )


async def _list_all(log: CassandraAuditLog, query: AuditQuery, page_size: int) -> list[AuditEntry]:
    out: list[AuditEntry] = []
    token = ""
    for _ in range(100_000):
        page, token = await log.page(query, page_size, token)
        assert len(page) <= page_size
        out += page
        if not token:
            return out
    raise AssertionError("the listing did not end")


def _newest_first(entries: list[AuditEntry]) -> list[str]:
    return [e.event_id for e in sorted(entries, key=lambda e: (e.event_time, e.event_id))][::-1]


async def test_an_entry_lands_in_its_minutes_partitions_and_the_minute_is_noted(
    session: Session, migrated: Config
) -> None:
    log = _log(session, migrated)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    at = _a_past_day() + timedelta(hours=13, minutes=7, seconds=5, milliseconds=250)
    e = _entry(tenant, at)
    await log.append(e)
    minute = minute_bucket(at)
    ks = migrated.keyspace
    by_tenant = await aexecute(
        session,
        f"SELECT event_id, after_json FROM {ks}.audit_log_by_tenant "
        "WHERE tenant_id = %s AND minute_bucket = %s",
        (tenant, minute),
    )
    assert [(r.event_id, r.after_json) for r in by_tenant] == [(e.event_id, e.after_json)]
    every = await aexecute(
        session, f"SELECT event_id FROM {ks}.audit_log WHERE minute_bucket = %s", (minute,)
    )
    assert [r.event_id for r in every] == [e.event_id]
    for scope in (tenant, ALL_TENANTS):
        noted = await aexecute(
            session,
            f"SELECT minute_bucket FROM {ks}.audit_minutes WHERE scope = %s AND day = %s",
            (scope, day_of(at)),
        )
        assert [r.minute_bucket for r in noted] == [minute]
    # Nothing goes to schema 11's day partitions any more.
    legacy = await aexecute(
        session,
        f"SELECT event_id FROM {ks}.audit_by_tenant WHERE tenant_id = %s AND day = %s",
        (tenant, day_of(at)),
    )
    assert legacy == []


async def test_a_listing_pages_newest_first_across_minutes_and_days(
    session: Session, migrated: Config
) -> None:
    log = _log(session, migrated)
    tenant, other = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    day = _a_past_day()
    rng = random.Random(7)
    entries: list[AuditEntry] = []
    # Two days, entries in a few dozen minutes, several in the same millisecond.
    for n in range(120):
        at = day + timedelta(
            hours=rng.choice([0, 11, 23, 24 + 5, 24 + 23]),
            minutes=rng.choice([0, 1, 59]),
            milliseconds=rng.choice([0, 0, 1, 999, 59_999]),
        )
        entries.append(_entry(tenant if n % 3 else other, at, n=n))
    for e in entries:
        await log.append(e)
    span = AuditQuery(start=day, end=day + timedelta(days=2))
    mine = AuditQuery(tenant_id=tenant, start=day, end=day + timedelta(days=2))
    for size in (1, 7, 500):
        got = await _list_all(log, span, size)
        assert [e.event_id for e in got] == _newest_first(entries)
        got = await _list_all(log, mine, size)
        assert [e.event_id for e in got] == _newest_first(
            [e for e in entries if e.tenant_id == tenant]
        )
    # The range bounds it: [start, end), the end's own millisecond out.
    cut = sorted(e.event_time for e in entries)[60]
    got = await _list_all(log, AuditQuery(tenant_id=tenant, start=day, end=cut), 10)
    assert [e.event_id for e in got] == _newest_first(
        [e for e in entries if e.tenant_id == tenant and e.event_time < cut]
    )


async def test_filters_read_past_partitions_of_non_matching_entries(
    session: Session, migrated: Config
) -> None:
    log = _log(session, migrated)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    minute = _a_past_day() + timedelta(hours=9)
    entries = [
        _entry(
            tenant,
            minute + timedelta(milliseconds=n * 40),
            action="DeleteSchedule" if n % 300 == 7 else "CreateSchedule",
            n=n,
        )
        for n in range(1300)  # more than one 500-row read of the minute's partition
    ]
    for e in entries:
        await log.append(e)
    q = AuditQuery(
        tenant_id=tenant,
        action="DeleteSchedule",
        start=minute - timedelta(days=1),
        end=minute + timedelta(days=1),
    )
    got = await _list_all(log, q, 2)
    assert [e.event_id for e in got] == _newest_first(
        [e for e in entries if e.action == "DeleteSchedule"]
    )
    assert len(got) == 5


async def test_schema_11_day_partitions_are_merged_in_order_while_they_are_read(
    session: Session, migrated: Config
) -> None:
    day = _a_past_day()
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ks = migrated.keyspace
    old = [_entry(tenant, day + timedelta(hours=h, minutes=3), n=h) for h in range(0, 48, 5)]
    for e in old:
        cells = (e.actor_key_id, e.actor_role, e.action, e.target, e.request_id, e.after_json)
        await aexecute(
            session,
            f"INSERT INTO {ks}.audit_by_tenant (tenant_id, day, event_time, event_id, "
            "actor_key_id, actor_role, action, target, request_id, after_json) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (tenant, day_of(e.event_time), e.event_time, e.event_id, *cells),
        )
        await aexecute(
            session,
            f"INSERT INTO {ks}.audit_by_day (day, event_time, event_id, tenant_id, "
            "actor_key_id, actor_role, action, target, request_id, after_json) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (day_of(e.event_time), e.event_time, e.event_id, tenant, *cells),
        )
    # Written by the new code in the same hours (a rolling upgrade: both kinds on one day).
    new = [_entry(tenant, day + timedelta(hours=h, minutes=4), n=100 + h) for h in range(0, 48, 3)]
    log = _log(session, migrated, day_tables=True)
    for e in new:
        await log.append(e)
    window = AuditQuery(tenant_id=tenant, start=day, end=day + timedelta(days=2))
    for size in (1, 4, 100):
        got = await _list_all(log, window, size)
        assert [e.event_id for e in got] == _newest_first(old + new)
    got = await _list_all(log, AuditQuery(start=day, end=day + timedelta(days=2)), 3)
    assert [e.event_id for e in got] == _newest_first(old + new)
    # Pages cut short by the read budget still list every entry once, in order.
    tight = _log(session, migrated, day_tables=True, max_reads=4)
    got = await _list_all(tight, window, 100)
    assert [e.event_id for e in got] == _newest_first(old + new)
    # Without them (a new keyspace, or once they are dropped) only the new entries are listed.
    got = await _list_all(_log(session, migrated), window, 5)
    assert [e.event_id for e in got] == _newest_first(new)


async def test_a_filter_that_matches_little_reads_a_bounded_number_of_partitions_a_page(
    session: Session, migrated: Config
) -> None:
    log = _log(session, migrated, max_reads=10)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    day = _a_past_day()
    # An entry in each of 200 minutes; the one match is the oldest.
    entries = [
        _entry(tenant, day + timedelta(minutes=m), action="Match" if m == 0 else "Other", n=m)
        for m in range(200)
    ]
    for e in entries:
        await log.append(e)
    q = AuditQuery(
        tenant_id=tenant, action="Match", start=day - timedelta(days=1), end=day + timedelta(days=1)
    )
    pages = 0
    token = ""
    found: list[AuditEntry] = []
    while True:
        page, token = await log.page(q, 50, token)
        pages += 1
        found += page
        if not token:
            break
    assert [e.event_id for e in found] == [entries[0].event_id]
    # 200 minute partitions and 3 days of noted minutes at 10 reads a page.
    assert pages >= 20


async def test_noted_minutes_without_entries_do_not_stall_the_listing(
    session: Session, migrated: Config
) -> None:
    """A minute noted whose entry was then not written (the write failed after the note) is
    read and found empty; a page whose reads run out among such minutes still moves on."""
    log = _log(session, migrated, max_reads=3)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    day = _a_past_day()
    oldest = _entry(tenant, day + timedelta(hours=1))
    await log.append(oldest)
    for m in range(1, 30):
        minute = minute_bucket(day + timedelta(hours=1, minutes=m))
        await aexecute(
            session,
            f"INSERT INTO {migrated.keyspace}.audit_minutes (scope, day, minute_bucket) "
            "VALUES (%s, %s, %s)",
            (tenant, day_of(day), minute),
        )
    q = AuditQuery(tenant_id=tenant, start=day, end=day + timedelta(days=1))
    assert [e.event_id for e in await _list_all(log, q, 10)] == [oldest.event_id]


async def test_day_tables_are_read_only_where_an_api_before_schema_15_may_have_written(
    session: Session, migrated: Config
) -> None:
    ks = migrated.keyspace
    # One `db migrate` created this keyspace: the day tables and schema 15 came together.
    assert CassandraAuditLog(session, keyspace=ks).day_tables is None
    rows = await aexecute(
        session, f"SELECT applied_at FROM {ks}.schema_migrations WHERE version = 11"
    )
    applied = rows[0].applied_at
    try:
        # Schema 11 applied two days before schema 15: an API may have written them since.
        await aexecute(
            session,
            f"UPDATE {ks}.schema_migrations SET applied_at = %s WHERE version = 11",
            (applied - timedelta(days=2),),
        )
        assert CassandraAuditLog(session, keyspace=ks).day_tables is not None
    finally:
        await aexecute(
            session,
            f"UPDATE {ks}.schema_migrations SET applied_at = %s WHERE version = 11",
            (applied,),
        )
    # Dropped (their entries past retention): not read, nor prepared.
    bare = f"{ks}_bare"
    await aexecute(
        session,
        f"CREATE KEYSPACE IF NOT EXISTS {bare} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
    )
    try:
        assert not _day_tables_may_hold_entries(session, bare)
    finally:
        await aexecute(session, f"DROP KEYSPACE IF EXISTS {bare}")


async def test_page_tokens(session: Session, migrated: Config) -> None:
    log = _log(session, migrated)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    day = _a_past_day()
    entries = [_entry(tenant, day + timedelta(hours=h), n=h) for h in range(0, 24, 2)]
    for e in entries:
        await log.append(e)
    q = AuditQuery(tenant_id=tenant, start=day, end=day + timedelta(days=1))
    with pytest.raises(InvalidArgument) as err:
        await log.page(q, 5, "not-a-token")
    assert err.value.field == "page_token"
    # A token from before schema 15 ({"d": day, "t": ms, "i": id}) still continues the listing:
    # one naming the day before, with `t` at the range's end, reads that day from its end.
    old = {"d": day_of(day) - 1, "t": int((day + timedelta(days=1)).timestamp() * 1000), "i": ""}
    token = base64.urlsafe_b64encode(json.dumps(old).encode()).decode()
    wide = AuditQuery(tenant_id=tenant, start=day - timedelta(days=1), end=day + timedelta(days=1))
    page, _ = await log.page(wide, 5, token)
    assert page == []
    newest = sorted(entries, key=lambda e: e.event_time)[-1]
    old = {"d": day_of(day), "t": int(newest.event_time.timestamp() * 1000), "i": newest.event_id}
    token = base64.urlsafe_b64encode(json.dumps(old).encode()).decode()
    page, _ = await log.page(q, 3, token)
    assert [e.event_id for e in page] == _newest_first(entries)[1:4]
