"""SchedulerService.UpdateSchedule, CancelSchedule, TriggerSchedule and RerunRun.

Thin: check the request's required fields, convert, call ``scheduler.lifecycle``, convert back.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.api.auth import principal
from scheduler.api.convert import run_to_proto, schedule_from_proto, schedule_to_proto
from scheduler.api.quotas import ApiQuotas
from scheduler.api.scope import check_run, check_schedule, schedule_missing
from scheduler.api.status import Context, grpc_errors
from scheduler.errors import InvalidArgument
from scheduler.lifecycle import Lifecycle
from scheduler.model import parse_run_id, validate_schedule_id
from scheduler.service import ScheduleService


def _schedule_id(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return validate_schedule_id(value, field)


class LifecycleRpcs:
    """The lifecycle RPCs, mixed into ``SchedulerServicer`` (which sets ``_svc``)."""

    _svc: ScheduleService
    _quotas: ApiQuotas

    @grpc_errors
    async def UpdateSchedule(
        self, request: scheduler_service_pb2.UpdateScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        """A new version of the schedule; ABORTED if ``schedule.version`` is not the stored one."""
        if not request.HasField("schedule"):
            raise InvalidArgument("schedule", "is required")
        sid = _schedule_id(request.schedule.id, "schedule.id")
        if request.schedule.version <= 0:
            raise InvalidArgument(
                "schedule.version", "is required: the version you read (GetSchedule)"
            )
        stored = await self._svc.schedules.get(sid)
        if not principal().sees(stored.tenant):
            raise schedule_missing(sid)
        draft = schedule_from_proto(request.schedule, now=datetime.now(UTC))
        await self._quotas.check_payload(stored.tenant, draft.payload, "schedule.payload")
        updated = await Lifecycle(self._svc).update(
            draft, schedule_id=sid, version=request.schedule.version
        )
        return schedule_to_proto(updated)

    @grpc_errors
    async def CancelSchedule(
        self, request: scheduler_service_pb2.CancelScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        """CANCELLED for good; with ``cancel_running`` the runs in progress are cancelled too."""
        sid = _schedule_id(request.id, "id")
        await check_schedule(self._svc, sid)
        cancelled = await Lifecycle(self._svc).cancel(sid, cancel_running=request.cancel_running)
        return schedule_to_proto(cancelled)

    @grpc_errors
    async def TriggerSchedule(
        self, request: scheduler_service_pb2.TriggerScheduleRequest, context: Context
    ) -> schedule_pb2.Run:
        """A manual run now (ENQUEUED), or SKIPPED by the overlap policy unless ``force``."""
        sid = _schedule_id(request.id, "id")
        await check_schedule(self._svc, sid)
        run = await Lifecycle(self._svc).trigger(
            sid, force=request.force, request_id=request.request_id
        )
        return run_to_proto(run)

    @grpc_errors
    async def RerunRun(
        self, request: scheduler_service_pb2.RerunRunRequest, context: Context
    ) -> schedule_pb2.Run:
        """A finished run again, with a fresh run id whose ``origin_run_id`` is the original."""
        if not request.run_id:
            raise InvalidArgument("run_id", "is required")
        parse_run_id(request.run_id)
        await check_run(self._svc, request.run_id)
        return run_to_proto(
            await Lifecycle(self._svc).rerun(request.run_id, request_id=request.request_id)
        )
