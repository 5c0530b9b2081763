"""A report is applied whole even when the worker that sent it goes away mid-call (a SIGKILL
cancels the RPC): its outcome is not left recorded without its retry, dependents or release."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from scheduler.api.reporting import RunReportingServicer
from scheduler.model import RunEventRecord
from scheduler.reports import Recorded


class _SlowReports:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.applied: list[str] = []

    async def record(self, events: Sequence[RunEventRecord]) -> Recorded:
        self.entered.set()
        await self.release.wait()
        self.applied += [e.run_id for e in events]
        return Recorded()


class _AnyTenant:
    async def tenants_of(self, schedule_ids: Sequence[str]) -> dict[str, str]:
        return {}


async def test_a_cancelled_report_call_still_applies_its_events(monkeypatch: Any) -> None:
    async def no_check(*_args: object) -> None:
        return None

    monkeypatch.setattr("scheduler.api.reporting.check_reports", no_check)
    reports = _SlowReports()
    servicer = RunReportingServicer(reports, _AnyTenant())  # type: ignore[arg-type]
    event = rr_pb2.RunEvent(
        kind=rr_pb2.RUN_EVENT_KIND_FAILED,
        run_id="s@20261204T000000.000Z",
        schedule_id="s",
        attempt=1,
        error="boom",
    )
    event.scheduled_for.FromDatetime(datetime(2026, 12, 4, tzinfo=UTC))
    call = asyncio.create_task(servicer._record([event]))
    await reports.entered.wait()
    call.cancel()  # the worker went away
    await asyncio.sleep(0)
    reports.release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert call.cancelled()
    assert reports.applied == ["s@20261204T000000.000Z"]
