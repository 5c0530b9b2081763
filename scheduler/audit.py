"""The audit log: who changed what, when, and what it looked like before and after.

Entries are written once (two rows: by tenant and day, and by day) and never updated; the API
has no RPC that alters or deletes them. Reads walk the days of the asked range newest first.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bucketer.cql import Queries, Write, aexecute, write_grouped
from scheduler.errors import InvalidArgument
from scheduler.model import aware, day_of

# The tenant of changes that belong to none (admin and worker keys, their own keys).
NO_TENANT = "*"
DEFAULT_SPAN = timedelta(days=30)
MAX_SPAN = timedelta(days=366)


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
    """Audit entries in ``audit_by_tenant`` and ``audit_by_day``."""

    def __init__(self, session: Session, *, keyspace: str) -> None:
        self._session = session
        self.q = Queries(session, Path(__file__).with_name("tenancy.cql"), keyspace=keyspace)

    async def append(self, e: AuditEntry) -> None:
        day = day_of(e.event_time)
        common = (
            e.actor_key_id,
            e.actor_role,
            e.action,
            e.target,
            e.request_id,
            e.before_json or None,
            e.after_json or None,
        )
        await write_grouped(
            self._session,
            [
                Write(
                    (e.tenant_id, day),
                    self.q["audit_by_tenant"],
                    (e.tenant_id, day, e.event_time, e.event_id, *common),
                ),
                Write(
                    day,
                    self.q["audit_by_day"],
                    (day, e.event_time, e.event_id, e.tenant_id, *common),
                ),
            ],
        )

    async def page(
        self, query: AuditQuery, page_size: int, page_token: str
    ) -> tuple[list[AuditEntry], str]:
        """Up to ``page_size`` matching entries, newest first, and the next page's token."""
        day, cur_time, cur_id = _decode(page_token, query)
        out: list[AuditEntry] = []
        first_day = day_of(query.start)
        while day >= first_day and len(out) < page_size:
            if query.tenant_id:
                rows = await aexecute(
                    self._session,
                    self.q["audit_tenant_page"],
                    (query.tenant_id, day, query.start, cur_time, cur_id),
                )
            else:
                rows = await aexecute(
                    self._session,
                    self.q["audit_day_page"],
                    (day, query.start, cur_time, cur_id),
                )
            for row in rows:
                e = AuditEntry.from_row(row)
                cur_time, cur_id = e.event_time, e.event_id
                if query.matches(e):
                    out.append(e)
                    if len(out) == page_size:
                        break
            if len(out) == page_size:
                break
            if len(rows) < 500:
                day -= 1
                cur_time, cur_id = query.end, ""
        if day < first_day:
            return out, ""
        return out, _encode(day, cur_time, cur_id)


def _encode(day: int, t: datetime, event_id: str) -> str:
    doc = {"d": day, "t": int(t.timestamp() * 1000), "i": event_id}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def _decode(token: str, query: AuditQuery) -> tuple[int, datetime, str]:
    if not token:
        # Entries at exactly `end` are out of range: (end, "") sorts before any id at end.
        return day_of(query.end - timedelta(microseconds=1)), query.end, ""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        return (
            int(doc["d"]),
            datetime.fromtimestamp(int(doc["t"]) / 1000, UTC),
            str(doc["i"]),
        )
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument("page_token", "is not a token this API returned") from None
