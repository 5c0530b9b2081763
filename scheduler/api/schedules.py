"""SchedulerService: validate, convert, call the domain, convert back."""

from __future__ import annotations

from datetime import UTC, datetime

from cronscale.v1 import schedule_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc
from scheduler.api.backfills import BackfillRpcs
from scheduler.api.convert import (
    misfire_from_proto,
    run_to_proto,
    schedule_from_proto,
    schedule_summary_to_proto,
    schedule_to_proto,
)
from scheduler.api.lifecycle import LifecycleRpcs
from scheduler.api.preview import PreviewRpcs
from scheduler.api.status import Context, code_for, grpc_errors
from scheduler.errors import CronscaleError, InvalidArgument
from scheduler.model import Schedule, parse_run_id, validate_schedule_id
from scheduler.service import ScheduleService

MAX_PAGE = 1000
DEFAULT_PAGE = 100


def _page_size(value: int) -> int:
    if value < 0:
        raise InvalidArgument("page_size", f"must not be negative, got {value}")
    if value > MAX_PAGE:
        raise InvalidArgument("page_size", f"must be at most {MAX_PAGE}, got {value}")
    return value or DEFAULT_PAGE


def _id(value: str, field: str = "id") -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return validate_schedule_id(value, field)


class SchedulerServicer(
    PreviewRpcs, LifecycleRpcs, BackfillRpcs, scheduler_service_pb2_grpc.SchedulerServiceServicer
):
    """The SchedulerService. The core RPCs are here; the rest come from one mixin per concern
    (``api/preview.py``, ``api/lifecycle.py``, ``api/backfills.py``)."""

    def __init__(self, service: ScheduleService) -> None:
        self._svc = service

    @grpc_errors
    async def CreateSchedule(
        self, request: scheduler_service_pb2.CreateScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        if not request.HasField("schedule"):
            raise InvalidArgument("schedule", "is required")
        draft = schedule_from_proto(request.schedule, now=datetime.now(UTC))
        created = await self._svc.create(
            draft, schedule_id=request.schedule_id, request_id=request.request_id
        )
        return schedule_to_proto(created)

    @grpc_errors
    async def BatchCreateSchedules(
        self, request: scheduler_service_pb2.BatchCreateSchedulesRequest, context: Context
    ) -> scheduler_service_pb2.BatchCreateSchedulesResponse:
        now = datetime.now(UTC)
        items: list[tuple[Schedule | CronscaleError, str]] = []
        for item in request.items:
            draft: Schedule | CronscaleError
            if not item.HasField("schedule"):
                draft = InvalidArgument("schedule", "is required")
            else:
                try:
                    draft = schedule_from_proto(item.schedule, now=now)
                except InvalidArgument as e:
                    draft = e
            items.append((draft, item.schedule_id))
        results = await self._svc.create_many(items)
        return scheduler_service_pb2.BatchCreateSchedulesResponse(
            results=[
                scheduler_service_pb2.BatchCreateResult(
                    schedule=schedule_summary_to_proto(r.schedule) if r.schedule else None,
                    already_existed=r.already_existed,
                    error_code=code_for(r.error).name if r.error else "",
                    error=str(r.error) if r.error else "",
                )
                for r in results
            ]
        )

    @grpc_errors
    async def GetSchedule(
        self, request: scheduler_service_pb2.GetScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        return schedule_to_proto(await self._svc.get(_id(request.id)))

    @grpc_errors
    async def ListSchedules(
        self, request: scheduler_service_pb2.ListSchedulesRequest, context: Context
    ) -> scheduler_service_pb2.ListSchedulesResponse:
        items, token = await self._svc.list_page(_page_size(request.page_size), request.page_token)
        return scheduler_service_pb2.ListSchedulesResponse(
            schedules=[schedule_to_proto(s) for s in items], next_page_token=token
        )

    @grpc_errors
    async def PauseSchedule(
        self, request: scheduler_service_pb2.PauseScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        s = await self._svc.pause(_id(request.id), note=request.note, paused_by=request.paused_by)
        return schedule_to_proto(s)

    @grpc_errors
    async def ResumeSchedule(
        self, request: scheduler_service_pb2.ResumeScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        override = misfire_from_proto(request.misfire_override, "misfire_override")
        return schedule_to_proto(await self._svc.resume(_id(request.id), misfire_override=override))

    @grpc_errors
    async def DeleteSchedule(
        self, request: scheduler_service_pb2.DeleteScheduleRequest, context: Context
    ) -> scheduler_service_pb2.DeleteScheduleResponse:
        await self._svc.delete(_id(request.id))
        return scheduler_service_pb2.DeleteScheduleResponse()

    @grpc_errors
    async def ListRuns(
        self, request: scheduler_service_pb2.ListRunsRequest, context: Context
    ) -> scheduler_service_pb2.ListRunsResponse:
        runs, token = await self._svc.list_runs(
            _id(request.schedule_id, "schedule_id"),
            _page_size(request.page_size),
            request.page_token,
        )
        return scheduler_service_pb2.ListRunsResponse(
            runs=[run_to_proto(r) for r in runs], next_page_token=token
        )

    @grpc_errors
    async def GetRun(
        self, request: scheduler_service_pb2.GetRunRequest, context: Context
    ) -> schedule_pb2.Run:
        if not request.run_id:
            raise InvalidArgument("run_id", "is required")
        parse_run_id(request.run_id)
        return run_to_proto(await self._svc.get_run(request.run_id))
