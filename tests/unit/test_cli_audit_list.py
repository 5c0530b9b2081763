"""``cronscale audit list`` against an AuditService that answers short pages (it reads a
bounded number of partitions a call): the command follows the tokens until it has a page's
worth, asking each time for what is still missing, or the listing ends."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from cronscale.v1 import audit_service_pb2 as audit_pb2
from scheduler.cli import tenants


class _ShortPages:
    """Serves ``events`` newest first, at most ``per_call`` a call whatever the page size."""

    def __init__(self, events: int, per_call: int, *, empty_first: bool = False) -> None:
        self.events = [audit_pb2.AuditEvent(event_id=f"e{i}") for i in range(events)]
        self.per_call = per_call
        self.empty_first = empty_first
        self.asked: list[tuple[int, str]] = []

    async def ListAuditEvents(
        self, request: audit_pb2.ListAuditEventsRequest, **_: Any
    ) -> audit_pb2.ListAuditEventsResponse:
        self.asked.append((request.page_size, request.page_token))
        if self.empty_first and len(self.asked) == 1:
            return audit_pb2.ListAuditEventsResponse(next_page_token="0")
        start = int(request.page_token or 0)
        end = min(start + min(request.page_size or 100, self.per_call), len(self.events))
        return audit_pb2.ListAuditEventsResponse(
            events=self.events[start:end],
            next_page_token=str(end) if end < len(self.events) else "",
        )


def _args(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {
        "tenant": "",
        "target": "",
        "actor": "",
        "action": "",
        "page_size": 0,
        "since": None,
        "until": None,
        "page_token": "",
        "all": False,
        "json": True,
        "api": "unused",
        "timeout": 5.0,
    }
    base.update(kw)
    return argparse.Namespace(**base)


def _serve(monkeypatch: pytest.MonkeyPatch, service: _ShortPages) -> None:
    @asynccontextmanager
    async def stub(target: str) -> AsyncIterator[_ShortPages]:
        yield service

    monkeypatch.setattr(tenants, "audit_stub", stub)


async def test_a_page_is_filled_from_short_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = _ShortPages(events=50, per_call=7)
    _serve(monkeypatch, service)
    assert await tenants.list_audit(_args(page_size=20)) == 0
    out = capsys.readouterr().out
    assert out.count('"event_id"') == 20 and '"next_page_token": "20"' in out
    assert service.asked == [(20, ""), (13, "7"), (6, "14")]


async def test_an_empty_answer_before_the_last_is_followed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = _ShortPages(events=3, per_call=2, empty_first=True)
    _serve(monkeypatch, service)
    assert await tenants.list_audit(_args()) == 0
    out = capsys.readouterr().out
    assert out.count('"event_id"') == 3 and '"next_page_token": ""' in out
    assert service.asked == [(100, ""), (100, "0"), (98, "2")]


async def test_all_follows_every_token_at_the_asked_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = _ShortPages(events=10, per_call=3)
    _serve(monkeypatch, service)
    assert await tenants.list_audit(_args(all=True, page_size=4)) == 0
    assert capsys.readouterr().out.count('"event_id"') == 10
    assert service.asked == [(4, ""), (4, "3"), (4, "6"), (4, "9")]
