"""DeadLetterService: list, read and re-drive runs whose last attempt failed."""

from __future__ import annotations

from datetime import UTC, datetime

from cronscale.v1 import dead_letter_service_pb2 as dl_pb2
from cronscale.v1 import dead_letter_service_pb2_grpc as dl_grpc
from cronscale.v1 import schedule_pb2
from scheduler.api.auth import principal
from scheduler.api.convert import from_ts, run_to_proto
from scheduler.api.paging import page_size as _page_size
from scheduler.api.schedules import _id
from scheduler.api.scope import check_run, check_schedule
from scheduler.api.status import Context, grpc_errors
from scheduler.errors import InvalidArgument, NotFound
from scheduler.lifecycle import Lifecycle
from scheduler.model import parse_run_id, validate_schedule_id
from scheduler.service import ScheduleService


def _run_id(value: str) -> str:
    if not value:
        raise InvalidArgument("run_id", "is required")
    parse_run_id(value)
    return value


class DeadLetterServicer(dl_grpc.DeadLetterServiceServicer):
    def __init__(self, svc: ScheduleService) -> None:
        self._svc = svc

    @grpc_errors
    async def ListDeadLetters(
        self, request: dl_pb2.ListDeadLettersRequest, context: Context
    ) -> dl_pb2.ListDeadLettersResponse:
        schedule_id = (
            validate_schedule_id(request.schedule_id, "schedule_id") if request.schedule_id else ""
        )
        if schedule_id:
            await check_schedule(self._svc, schedule_id)
        letters, token = await self._svc.dead_letters.list_page(
            schedule_id=schedule_id,
            page_size=_page_size(request.page_size),
            page_token=request.page_token,
            now=datetime.now(UTC),
        )
        return dl_pb2.ListDeadLettersResponse(
            # A tenant role's page holds its own among those read: it may be short.
            dead_letters=[d.to_proto() for d in letters if principal().sees(d.tenant)],
            next_page_token=token,
        )

    @grpc_errors
    async def GetDeadLetter(
        self, request: dl_pb2.GetDeadLetterRequest, context: Context
    ) -> dl_pb2.DeadLetter:
        run_id = _run_id(request.run_id)
        history = await self._svc.runs.attempts(run_id)
        letter = await self._svc.dead_letters.get(run_id, history)
        if not principal().sees(letter.tenant):
            raise NotFound(f"run {run_id!r} is not dead-lettered")
        return letter.to_proto()

    @grpc_errors
    async def RedriveDeadLetter(
        self, request: dl_pb2.RedriveDeadLetterRequest, context: Context
    ) -> schedule_pb2.Run:
        run_id = _run_id(request.run_id)
        await check_run(self._svc, run_id)
        run = await Lifecycle(self._svc).redrive(run_id, request_id=request.request_id)
        return run_to_proto(run)

    @grpc_errors
    async def RedriveDeadLetters(
        self, request: dl_pb2.RedriveDeadLettersRequest, context: Context
    ) -> dl_pb2.RedriveDeadLettersResponse:
        start = from_ts(request.start_time) if request.HasField("start_time") else None
        end = from_ts(request.end_time) if request.HasField("end_time") else None
        if start is not None and end is not None and end <= start:
            raise InvalidArgument("end_time", "must be after start_time")
        schedule_id = _id(request.schedule_id, "schedule_id")
        await check_schedule(self._svc, schedule_id)
        runs = await Lifecycle(self._svc).redrive_many(schedule_id, start=start, end=end)
        return dl_pb2.RedriveDeadLettersResponse(runs=[run_to_proto(r) for r in runs])
