"""The audit log: who changed what, when, and what it looked like before and after.

Entries are written once and never updated; the API has no RPC that alters or deletes them. An
entry is two rows, in its UTC minute's partition of ``audit_log_by_tenant`` and of ``audit_log``
(every tenant's); before a minute's first entry from an API process, the minute is noted in
``audit_minutes``, one partition per scope and UTC day (decision 0014). A listing reads a day's
noted minutes, then those minutes' partitions, newest first, at most ``MAX_READS_A_PAGE``
partition reads a page. Schema 11 kept a whole day in one partition (``audit_by_tenant``,
``audit_by_day``), which grew without bound; while those tables exist on a keyspace that had
them before schema 15, their entries are read too, merged in order.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bucketer.cql import Queries, Write, aexecute, aexecute_all, write_grouped
from bucketer.keys import BUCKET_SECONDS, bucket_start, minute_bucket
from scheduler.errors import InvalidArgument
from scheduler.model import aware, day_of

# The tenant of changes that belong to none (admin and worker keys, their own keys).
NO_TENANT = "*"
# The `audit_minutes` scope of `audit_log`, every tenant's entries (a tenant id is never empty).
ALL_TENANTS = ""
DEFAULT_SPAN = timedelta(days=30)
MAX_SPAN = timedelta(days=366)
# Partition reads (noted minutes, entries, schema 11's days) one listing page may make: a filter
# that matches little would otherwise read every noted minute of the range in one call. A page
# that runs out comes back short, even empty, with the token to go on from.
MAX_READS_A_PAGE = 128
# Rows a listing reads from one partition at a time (filters may drop most of them).
_READ_ROWS = 500
# (scope, minute) pairs an API process remembers having noted in `audit_minutes`.
_NOTED_MINUTES = 4096
_MINUTES_A_DAY = 86400 // BUCKET_SECONDS
# Schema 11's day tables were created this long before schema 15 on a keyspace that never ran
# an API of their time (one `db migrate` applied both): nothing can be in them.
_ONE_MIGRATE_RUN = timedelta(hours=1)
_DAY_TABLES = ("audit_by_tenant", "audit_by_day")

# An exclusive upper bound in the log's order: entries sort by (event_time, event_id), newest
# first, and ("", at t) sorts before every entry at t.
Before = tuple[datetime, str]
# What a listing's streams yield, newest first: an entry with its (time, id), or a bound
# (time, "", None) above which the stream has nothing more (a minute read to its start).
_Item = tuple[datetime, str, "AuditEntry | None"]


class _OutOfReads(Exception):
    """The page's partition reads are spent."""


class _Reads:
    def __init__(self, budget: int) -> None:
        self.left = budget

    def take(self) -> None:
        if self.left <= 0:
            raise _OutOfReads
        self.left -= 1


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    event_id: str
    event_time: datetime
    tenant_id: str
    actor_key_id: str
    actor_role: str
    action: str
    target: str
    request_id: str
    before_json: str = ""
    after_json: str = ""

    @classmethod
    def from_row(cls, row: Any) -> AuditEntry:
        t = aware(row.event_time)
        assert t is not None
        return cls(
            event_id=row.event_id,
            event_time=t,
            tenant_id=row.tenant_id,
            actor_key_id=row.actor_key_id or "",
            actor_role=row.actor_role or "",
            action=row.action or "",
            target=row.target or "",
            request_id=row.request_id or "",
            before_json=row.before_json or "",
            after_json=row.after_json or "",
        )


@dataclass(frozen=True, kw_only=True)
class AuditQuery:
    tenant_id: str = ""
    target: str = ""
    actor_key_id: str = ""
    action: str = ""
    start: datetime
    end: datetime

    def matches(self, e: AuditEntry) -> bool:
        return (
            (not self.target or e.target == self.target)
            and (not self.actor_key_id or e.actor_key_id == self.actor_key_id)
            and (not self.action or e.action == self.action)
        )


def audit_range(
    start: datetime | None, end: datetime | None, now: datetime
) -> tuple[datetime, datetime]:
    """The [start, end) a listing covers: default the last 30 days, at most 366."""
    end = end or now
    start = start or end - DEFAULT_SPAN
    if end <= start:
        raise InvalidArgument("end_time", "must be after start_time")
    if end - start > MAX_SPAN:
        raise InvalidArgument("start_time", f"at most {MAX_SPAN.days} days before end_time")
    return start, end


class CassandraAuditLog:
    """Audit entries in ``audit_log_by_tenant`` and ``audit_log`` by UTC minute, the minutes
    that hold entries in ``audit_minutes``; schema 11's day tables read while they may hold
    entries (see the module's docstring)."""

    def __init__(
        self,
        session: Session,
        *,
        keyspace: str,
        read_day_tables: bool | None = None,
        max_reads_a_page: int = MAX_READS_A_PAGE,
    ) -> None:
        """``read_day_tables``: whether listings read schema 11's day tables too; by default,
        while they exist, unless one ``db migrate`` created them and schema 15 together."""
        self._session = session
        self.q = Queries(session, Path(__file__).with_name("tenancy.cql"), keyspace=keyspace)
        if read_day_tables is None:
            read_day_tables = _day_tables_may_hold_entries(session, keyspace)
        self.day_tables: Queries | None = None
        if read_day_tables:
            path = Path(__file__).with_name("audit_day_tables.cql")
            self.day_tables = Queries(session, path, keyspace=keyspace)
        self._max_reads = max_reads_a_page
        self._noted: set[tuple[str, int]] = set()

    async def append(self, e: AuditEntry) -> None:
        minute = minute_bucket(e.event_time)
        day = day_of(e.event_time)
        row = {
            "tenant_id": e.tenant_id,
            "minute_bucket": minute,
            "event_time": e.event_time,
            "event_id": e.event_id,
            "actor_key_id": e.actor_key_id,
            "actor_role": e.actor_role,
            "action": e.action,
            "target": e.target,
            "request_id": e.request_id,
        }
        # An empty side is left unset, not written null (a null is a tombstone).
        if e.before_json:
            row["before_json"] = e.before_json
        if e.after_json:
            row["after_json"] = e.after_json
        notes = [(s, minute) for s in (e.tenant_id, ALL_TENANTS) if (s, minute) not in self._noted]
        if notes:
            # Noted before the entry is written: the minute of any entry that landed is listed
            # (a note whose entry then failed costs a listing one empty read).
            await write_grouped(
                self._session,
                [
                    Write(
                        ("audit_minutes", scope, day),
                        self.q["audit_minute"],
                        {"scope": scope, "day": day, "minute_bucket": m},
                    )
                    for scope, m in notes
                ],
            )
            if len(self._noted) + len(notes) > _NOTED_MINUTES:
                self._noted.clear()
            self._noted.update(notes)
        await write_grouped(
            self._session,
            [
                Write(
                    ("audit_log_by_tenant", e.tenant_id, minute), self.q["audit_log_by_tenant"], row
                ),
                Write(("audit_log", minute), self.q["audit_log"], row),
            ],
        )

    async def page(
        self, query: AuditQuery, page_size: int, page_token: str
    ) -> tuple[list[AuditEntry], str]:
        """Up to ``page_size`` matching entries, newest first, and the next page's token ("" once
        the range is read to its start). A page holds fewer, even none, before the last when
        its partition reads ran out (``MAX_READS_A_PAGE``)."""
        before = _decode(page_token, query)
        out: list[AuditEntry] = []
        first_day = day_of(query.start)
        day = day_of(_last_instant(before))
        reads = _Reads(self._max_reads)
        try:
            while day >= first_day:
                async with aclosing(self._day(query, day, before, reads)) as items:
                    async for t, event_id, e in items:
                        before = (t, event_id)
                        if e is not None and query.matches(e):
                            out.append(e)
                            if len(out) == page_size:
                                return out, _encode(before)
                before = (_day_start(day), "")
                day -= 1
        except _OutOfReads:
            return out, _encode(before)
        return out, ""

    async def _day(
        self, query: AuditQuery, day: int, before: Before, reads: _Reads
    ) -> AsyncGenerator[_Item, None]:
        """The day's entries of the query's scope below ``before``, newest first."""
        if self.day_tables is None:
            async with aclosing(self._minutes(query, day, before, reads)) as items:
                async for item in items:
                    yield item
            return
        async with (
            aclosing(self._minutes(query, day, before, reads)) as minutes,
            aclosing(self._old_day(self.day_tables, query, day, before, reads)) as old,
            aclosing(_newest_first(minutes, old)) as items,
        ):
            async for item in items:
                yield item

    async def _minutes(
        self, query: AuditQuery, day: int, before: Before, reads: _Reads
    ) -> AsyncGenerator[_Item, None]:
        scope = query.tenant_id or ALL_TENANTS
        first = max(minute_bucket(query.start), day * _MINUTES_A_DAY)
        last = min(minute_bucket(_last_instant(before)), (day + 1) * _MINUTES_A_DAY - 1)
        if last < first:
            return
        reads.take()
        noted = await aexecute_all(
            self._session,
            self.q["audit_minutes_of_day"],
            {"scope": scope, "day": day, "first": first, "last": last},
        )
        for row in noted:  # newest first (the table's clustering order)
            params: dict[str, Any] = {"minute_bucket": row.minute_bucket, "start": query.start}
            if query.tenant_id:
                params["tenant_id"] = query.tenant_id
                statement = self.q["audit_tenant_minute_page"]
            else:
                statement = self.q["audit_minute_page"]
            async with aclosing(self._read(statement, params, before, reads)) as items:
                async for item in items:
                    yield item
            yield bucket_start(row.minute_bucket), "", None

    async def _old_day(
        self, q: Queries, query: AuditQuery, day: int, before: Before, reads: _Reads
    ) -> AsyncGenerator[_Item, None]:
        params: dict[str, Any] = {"day": day, "start": query.start}
        if query.tenant_id:
            params["tenant_id"] = query.tenant_id
            statement = q["audit_tenant_page"]
        else:
            statement = q["audit_day_page"]
        async with aclosing(self._read(statement, params, before, reads)) as items:
            async for item in items:
                yield item

    async def _read(
        self, statement: Any, params: dict[str, Any], before: Before, reads: _Reads
    ) -> AsyncGenerator[_Item, None]:
        """One partition's entries below ``before``, newest first, ``_READ_ROWS`` a request."""
        while True:
            reads.take()
            rows = await aexecute(
                self._session,
                statement,
                {
                    **params,
                    "before_time": before[0],
                    "before_id": before[1],
                    "max_rows": _READ_ROWS,
                },
            )
            for row in rows:
                e = AuditEntry.from_row(row)
                before = (e.event_time, e.event_id)
                yield e.event_time, e.event_id, e
            if len(rows) < _READ_ROWS:
                return


def _day_tables_may_hold_entries(session: Session, keyspace: str) -> bool:
    """Whether schema 11's day tables exist and were there before schema 15 (an API of their
    time may have written them)."""
    tables = session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
    ).all()
    if not set(_DAY_TABLES) <= {r.table_name for r in tables}:
        return False  # dropped once their entries were past retention
    applied = {
        r.version: aware(r.applied_at)
        for r in session.execute(
            f"SELECT version, applied_at FROM {keyspace}.schema_migrations"
            " WHERE version IN (11, 15)"
        )
    }
    day_tables, minutes = applied.get(11), applied.get(15)
    if day_tables is None or minutes is None:
        return True
    return minutes - day_tables > _ONE_MIGRATE_RUN


async def _newest_first(
    a: AsyncIterator[_Item], b: AsyncIterator[_Item]
) -> AsyncGenerator[_Item, None]:
    """Two newest-first streams merged into one. A bound comes out once nothing of either
    stream above it is left: the other stream's next item is below it."""
    x = await anext(a, None)
    y = await anext(b, None)
    while x is not None or y is not None:
        if y is None or (x is not None and x[:2] > y[:2]):
            assert x is not None
            yield x
            x = await anext(a, None)
        else:
            yield y
            y = await anext(b, None)


def _last_instant(before: Before) -> datetime:
    """The latest instant an entry below ``before`` can have (the log keeps milliseconds)."""
    t, event_id = before
    return t if event_id else t - timedelta(milliseconds=1)


def _day_start(day: int) -> datetime:
    return datetime.fromtimestamp(day * 86400, UTC)


def _encode(before: Before) -> str:
    t, event_id = before
    # "d" (the day being read) is for API processes of before schema 15 during a rollout.
    doc = {"d": day_of(_last_instant(before)), "t": int(t.timestamp() * 1000), "i": event_id}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def _decode(token: str, query: AuditQuery) -> Before:
    # Entries at exactly `end` are out of range: (end, "") sorts before any id at end.
    end: Before = (query.end, "")
    if not token:
        return end
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        before = (datetime.fromtimestamp(int(doc["t"]) / 1000, UTC), str(doc["i"]))
        if "d" in doc:
            # A token from before schema 15 named the day it was reading: nothing past its end.
            before = min(before, (_day_start(int(doc["d"]) + 1), ""))
    except (ValueError, KeyError, TypeError, OverflowError, OSError):
        raise InvalidArgument("page_token", "is not a token this API returned") from None
    return min(before, end)
