"""RunReportingService: workers report run events; a batch is written grouped by partition."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from cronscale.v1 import run_reporting_service_pb2_grpc as rr_grpc
from scheduler import metrics
from scheduler.api.convert import event_from_proto
from scheduler.api.scope import ScheduleTenants, check_reports
from scheduler.api.status import Context, grpc_errors
from scheduler.errors import InvalidArgument
from scheduler.reports import Recorded, RunReports

MAX_EVENTS = 5000


class RunReportingServicer(rr_grpc.RunReportingServiceServicer):
    def __init__(self, reports: RunReports, tenants: ScheduleTenants) -> None:
        self._reports = reports
        self._tenants = tenants
        self._applying: set[asyncio.Future[Recorded]] = set()

    async def _record(self, events: list[rr_pb2.RunEvent]) -> list[rr_pb2.RunEventAck]:
        if len(events) > MAX_EVENTS:
            raise InvalidArgument("events", f"at most {MAX_EVENTS} per call, got {len(events)}")
        now = datetime.now(UTC)
        records = [event_from_proto(e, i, now=now) for i, e in enumerate(events)]
        await check_reports(self._tenants, [r.run_id for r in records])
        # Applied whole even if the worker goes away meanwhile (a SIGKILL cancels this call):
        # an outcome recorded without its retry, dependents or release would leave them
        # unwritten until the run is reported again.
        applying = asyncio.ensure_future(self._reports.record(records))
        self._applying.add(applying)
        applying.add_done_callback(self._applying.discard)
        recorded = await asyncio.shield(applying)
        # Counted by label, each label's child looked up once a call rather than once an event.
        kinds = Counter(r.status.value if r.status else "HEARTBEAT" for r in records)
        for status, count in kinds.items():
            metrics.RUN_REPORTS.labels(status=status).inc(count)
        return [
            rr_pb2.RunEventAck(
                run_id=e.run_id,
                cancel_requested=e.run_id in recorded.cancel,
                done=e.check_done and e.run_id in recorded.done,
            )
            for e in events
        ]

    @grpc_errors
    async def ReportRuns(
        self, request: rr_pb2.ReportRunsRequest, context: Context
    ) -> rr_pb2.ReportRunsResponse:
        return rr_pb2.ReportRunsResponse(acks=await self._record(list(request.events)))

    @grpc_errors
    async def StartRun(self, request: rr_pb2.RunEvent, context: Context) -> rr_pb2.RunEventAck:
        return (await self._record([_kind(request, rr_pb2.RUN_EVENT_KIND_STARTED)]))[0]

    @grpc_errors
    async def HeartbeatRun(self, request: rr_pb2.RunEvent, context: Context) -> rr_pb2.RunEventAck:
        return (await self._record([_kind(request, rr_pb2.RUN_EVENT_KIND_HEARTBEAT)]))[0]

    @grpc_errors
    async def CompleteRun(self, request: rr_pb2.RunEvent, context: Context) -> rr_pb2.RunEventAck:
        if request.kind not in (
            rr_pb2.RUN_EVENT_KIND_SUCCEEDED,
            rr_pb2.RUN_EVENT_KIND_FAILED,
            rr_pb2.RUN_EVENT_KIND_CANCELLED,
        ):
            raise InvalidArgument("kind", "CompleteRun takes SUCCEEDED, FAILED or CANCELLED")
        return (await self._record([request]))[0]


def _kind(event: rr_pb2.RunEvent, kind: int) -> rr_pb2.RunEvent:
    """The single-event RPCs imply the kind; an explicit conflicting kind is refused."""
    if event.kind not in (rr_pb2.RUN_EVENT_KIND_UNSPECIFIED, kind):
        name = rr_pb2.RunEventKind.Name(kind)  # type: ignore[arg-type]
        raise InvalidArgument("kind", f"must be {name} or unset")
    out = rr_pb2.RunEvent()
    out.CopyFrom(event)
    out.kind = kind  # type: ignore[assignment]
    return out
