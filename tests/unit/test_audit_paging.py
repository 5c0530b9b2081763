"""The audit log's page tokens and the merge of its newest-first streams (scheduler.audit):
pure logic, no Cassandra."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.audit import (
    AuditEntry,
    AuditQuery,
    _decode,
    _encode,
    _Item,
    _last_instant,
    _newest_first,
)
from scheduler.errors import InvalidArgument

T0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
QUERY = AuditQuery(start=T0 - timedelta(days=30), end=T0)


def _token(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def test_a_token_carries_the_bound_it_was_made_from() -> None:
    before = (T0 - timedelta(hours=3, milliseconds=1), "id-7")
    assert _decode(_encode(before), QUERY) == before
    assert _decode(_encode((T0 - timedelta(days=2), "")), QUERY) == (T0 - timedelta(days=2), "")


def test_no_token_starts_below_the_ranges_end() -> None:
    assert _decode("", QUERY) == (T0, "")


def test_a_token_past_the_queries_end_is_held_to_it() -> None:
    later = _encode((T0 + timedelta(days=1), "z"))
    assert _decode(later, QUERY) == (T0, "")


def test_a_token_from_before_schema_15_reads_no_further_than_its_days_end() -> None:
    day = int((T0 - timedelta(days=3)).timestamp()) // 86400
    end_of_query = int(T0.timestamp() * 1000)
    got = _decode(_token({"d": day, "t": end_of_query, "i": ""}), QUERY)
    assert got == (datetime.fromtimestamp((day + 1) * 86400, UTC), "")
    inside = int((T0 - timedelta(days=3, hours=-1)).timestamp() * 1000)
    assert _decode(_token({"d": day, "t": inside, "i": "e1"}), QUERY)[1] == "e1"


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        _token({"t": 1}),
        _token({"i": "x"}),
        _token({"t": "soon", "i": "x"}),
        _token({"t": 10**20, "i": "x"}),
        _token({"d": 10**12, "t": 1, "i": "x"}),
        _token([1, 2]),
    ],
)
def test_a_token_the_api_did_not_make_is_refused_naming_the_field(token: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        _decode(token, QUERY)
    assert err.value.field == "page_token"


def test_the_last_instant_below_a_bound() -> None:
    assert _last_instant((T0, "")) == T0 - timedelta(milliseconds=1)
    assert _last_instant((T0, "e")) == T0


def _entry(t: datetime, event_id: str) -> _Item:
    e = AuditEntry(
        event_id=event_id,
        event_time=t,
        tenant_id="t",
        actor_key_id="k",
        actor_role="admin",
        action="A",
        target="x",
        request_id="r",
    )
    return t, event_id, e


async def _stream(items: Sequence[_Item]) -> AsyncIterator[_Item]:
    for item in items:
        yield item


async def test_two_streams_merge_newest_first_with_their_bounds_in_place() -> None:
    a = [
        _entry(T0, "b"),
        _entry(T0 - timedelta(seconds=1), "a"),
        (T0 - timedelta(minutes=1), "", None),  # a minute read to its start
        _entry(T0 - timedelta(minutes=2), "c"),
    ]
    b = [
        _entry(T0, "c"),
        _entry(T0 - timedelta(seconds=30), "z"),
        _entry(T0 - timedelta(minutes=3), "d"),
    ]
    merged = [(t, i) async for t, i, _ in _newest_first(_stream(a), _stream(b))]
    assert merged == [
        (T0, "c"),
        (T0, "b"),
        (T0 - timedelta(seconds=1), "a"),
        (T0 - timedelta(seconds=30), "z"),
        # The bound comes out only once the other stream's next item is below it.
        (T0 - timedelta(minutes=1), ""),
        (T0 - timedelta(minutes=2), "c"),
        (T0 - timedelta(minutes=3), "d"),
    ]
    assert [x async for x in _newest_first(_stream([]), _stream(b))] == b
