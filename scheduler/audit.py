"""The audit log: who changed what, when, and what it looked like before and after.

Entries are written once and never updated; the API has no RPC that alters or deletes them. An
entry is two rows, in its UTC minute's partition of ``audit_log_by_tenant`` and of ``audit_log``
(every tenant's), and a minute's first entry from an API process also notes the minute in
``audit_minutes``, one partition per scope and UTC day: a listing reads a day's noted minutes,
then those minutes' partitions, newest first. Schema 11 kept a whole day in one partition
(``audit_by_tenant``, ``audit_by_day``), which grew without bound; its entries are still read,
merged in order, for the days up to the day after schema 15 was applied.
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
from bucketer.keys import minute_bucket
from scheduler.errors import InvalidArgument
from scheduler.model import aware, day_of

# The tenant of changes that belong to none (admin and worker keys, their own keys).
NO_TENANT = "*"
# The `audit_minutes` scope of `audit_log`, every tenant's entries (a tenant id is never empty).
ALL_TENANTS = ""
DEFAULT_SPAN = timedelta(days=30)
MAX_SPAN = timedelta(days=366)
# The schema version that partitioned the log by minute; days before it are in schema 11's tables.
MINUTE_PARTITIONS_VERSION = 15
# Rows a listing reads from one partition at a time (filters may drop most of them).
_READ_ROWS = 500
# (scope, minute) pairs an API process remembers having noted in `audit_minutes`.
_NOTED_MINUTES = 4096
_MINUTES_A_DAY = 1440

# An exclusive upper bound in the log's order: entries sort by (event_time, event_id), newest
# first, and ("", at t) sorts before every entry at t.
Before = tuple[datetime, str]


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
    that hold entries in ``audit_minutes``; schema 11's day partitions read where they may hold
    entries (see the module's docstring)."""

    def __init__(
        self, session: Session, *, keyspace: str, legacy_last_day: int | None = None
    ) -> None:
        """``legacy_last_day``: the last UTC day whose entries may be in schema 11's tables; by
        default the day after ``schema_migrations`` records schema 15 applied (API processes
        running older code write there until they are replaced)."""
        self._session = session
        self.q = Queries(session, Path(__file__).with_name("tenancy.cql"), keyspace=keyspace)
        if legacy_last_day is None:
            rows = session.execute(
                f"SELECT applied_at FROM {keyspace}.schema_migrations WHERE version = %s",
                (MINUTE_PARTITIONS_VERSION,),
            ).all()
            applied = aware(rows[0].applied_at) if rows else None
            legacy_last_day = day_of(applied or datetime.now(UTC)) + 1
        self.legacy_last_day = legacy_last_day
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
            "before_json": e.before_json or None,
            "after_json": e.after_json or None,
        }
        writes = [
            Write(("audit_log_by_tenant", e.tenant_id, minute), self.q["audit_log_by_tenant"], row),
            Write(("audit_log", minute), self.q["audit_log"], row),
        ]
        notes = [(s, minute) for s in (e.tenant_id, ALL_TENANTS) if (s, minute) not in self._noted]
        writes += [
            Write(
                ("audit_minutes", scope, day),
                self.q["audit_minute"],
                {"scope": scope, "day": day, "minute_bucket": m},
            )
            for scope, m in notes
        ]
        # The notes go with the entry: a write that fails is retried by the caller (the RPC
        # answers UNAVAILABLE), and a minute is remembered as noted only once it is.
        await write_grouped(self._session, writes)
        if len(self._noted) + len(notes) > _NOTED_MINUTES:
            self._noted.clear()
        self._noted.update(notes)

    async def page(
        self, query: AuditQuery, page_size: int, page_token: str
    ) -> tuple[list[AuditEntry], str]:
        """Up to ``page_size`` matching entries, newest first, and the next page's token ("" once
        the range is read to its start)."""
        before = _decode(page_token, query)
        out: list[AuditEntry] = []
        first_day = day_of(query.start)
        day = day_of(_last_instant(before))
        while day >= first_day:
            async with aclosing(self._day(query, day, before)) as entries:
                async for e in entries:
                    before = (e.event_time, e.event_id)
                    if query.matches(e):
                        out.append(e)
                        if len(out) == page_size:
                            return out, _encode(before)
            before = (_day_start(day), "")
            day -= 1
        return out, ""

    async def _day(
        self, query: AuditQuery, day: int, before: Before
    ) -> AsyncGenerator[AuditEntry, None]:
        """The day's entries of the query's scope below ``before``, newest first."""
        if day > self.legacy_last_day:
            async with aclosing(self._minutes(query, day, before)) as entries:
                async for e in entries:
                    yield e
            return
        async with (
            aclosing(self._minutes(query, day, before)) as minutes,
            aclosing(self._legacy(query, day, before)) as legacy,
        ):
            async for e in _newest_first(minutes, legacy):
                yield e

    async def _minutes(
        self, query: AuditQuery, day: int, before: Before
    ) -> AsyncGenerator[AuditEntry, None]:
        scope = query.tenant_id or ALL_TENANTS
        first = max(minute_bucket(query.start), day * _MINUTES_A_DAY)
        last = min(minute_bucket(_last_instant(before)), (day + 1) * _MINUTES_A_DAY - 1)
        if last < first:
            return
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
            async for e in self._read(statement, params, before):
                yield e

    async def _legacy(
        self, query: AuditQuery, day: int, before: Before
    ) -> AsyncGenerator[AuditEntry, None]:
        params: dict[str, Any] = {"day": day, "start": query.start}
        if query.tenant_id:
            params["tenant_id"] = query.tenant_id
            statement = self.q["audit_tenant_page"]
        else:
            statement = self.q["audit_day_page"]
        async for e in self._read(statement, params, before):
            yield e

    async def _read(
        self, statement: Any, params: dict[str, Any], before: Before
    ) -> AsyncGenerator[AuditEntry, None]:
        """One partition's entries below ``before``, newest first, ``_READ_ROWS`` a request."""
        while True:
            rows = await aexecute(
                self._session,
                statement,
                {**params, "before_time": before[0], "before_id": before[1]},
            )
            for row in rows:
                e = AuditEntry.from_row(row)
                before = (e.event_time, e.event_id)
                yield e
            if len(rows) < _READ_ROWS:
                return


async def _newest_first(
    a: AsyncIterator[AuditEntry], b: AsyncIterator[AuditEntry]
) -> AsyncGenerator[AuditEntry, None]:
    """Two newest-first streams of distinct entries merged into one."""
    x = await anext(a, None)
    y = await anext(b, None)
    while x is not None or y is not None:
        if y is None or (x is not None and (x.event_time, x.event_id) > (y.event_time, y.event_id)):
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
    doc = {"t": int(t.timestamp() * 1000), "i": event_id}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def _decode(token: str, query: AuditQuery) -> Before:
    if not token:
        # Entries at exactly `end` are out of range: (end, "") sorts before any id at end.
        return query.end, ""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        before = (datetime.fromtimestamp(int(doc["t"]) / 1000, UTC), str(doc["i"]))
        if "d" in doc:
            # A token from before schema 15 also named the day it was reading.
            before = min(before, (_day_start(int(doc["d"]) + 1), ""))
        return before
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument("page_token", "is not a token this API returned") from None
