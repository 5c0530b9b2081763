"""SchedulerService.PreviewSchedule: the next fire times of a stored schedule or a dry-run spec.

The domain (``scheduler.preview``) computes them with the dispatcher's own ``next_slot``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.api.convert import from_ts, spec_from_proto, ts
from scheduler.api.scope import check_schedule
from scheduler.api.status import Context, grpc_errors
from scheduler.errors import InvalidArgument
from scheduler.model import validate_schedule_id
from scheduler.preview import (
    Preview,
    PreviewEntry,
    dry_run_schedule,
    preview,
    preview_count,
    preview_stored,
)
from scheduler.service import ScheduleService


def _entry(e: PreviewEntry) -> schedule_pb2.FireTimePreview:
    return schedule_pb2.FireTimePreview(utc=ts(e.utc), local=e.local, note=e.note)


def preview_to_proto(p: Preview) -> scheduler_service_pb2.PreviewScheduleResponse:
    """The response for a computed preview."""
    return scheduler_service_pb2.PreviewScheduleResponse(
        fire_times=[_entry(e) for e in p.fire_times],
        timezone=p.timezone,
        skipped=[_entry(e) for e in p.skipped],
    )


class PreviewRpcs:
    _svc: ScheduleService

    @grpc_errors
    async def PreviewSchedule(
        self, request: scheduler_service_pb2.PreviewScheduleRequest, context: Context
    ) -> scheduler_service_pb2.PreviewScheduleResponse:
        """Fire times strictly after ``after`` (default now) of ``id`` or of a dry-run ``spec``;
        nothing is stored."""
        count = preview_count(request.count)
        after = from_ts(request.after) if request.HasField("after") else None
        target = request.WhichOneof("target")
        if target == "id":
            if not request.id:
                raise InvalidArgument("id", "is required")
            sid = validate_schedule_id(request.id, "id")
            await check_schedule(self._svc, sid)
            return preview_to_proto(await preview_stored(self._svc, sid, after, count))
        if target == "spec":
            now = datetime.now(UTC)
            s = dry_run_schedule(spec_from_proto(request.spec, now=now, field="spec"))
            # Off the event loop: cron arithmetic for a rare spec takes a while.
            found = await asyncio.to_thread(preview, s, after or now, count)
            return preview_to_proto(found)
        raise InvalidArgument("target", "one of id or spec is required")
