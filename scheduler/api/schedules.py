"""SchedulerService: validate, convert, call the domain, convert back."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from cronscale.v1 import schedule_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc
from scheduler.api.auth import principal
from scheduler.api.backfills import BackfillRpcs
from scheduler.api.convert import (
    misfire_from_proto,
    run_to_proto,
    schedule_from_proto,
    schedule_summary_to_proto,
    schedule_to_proto,
)
from scheduler.api.lifecycle import LifecycleRpcs
from scheduler.api.paging import page_size as _page_size
from scheduler.api.preview import PreviewRpcs
from scheduler.api.quotas import ApiQuotas, full
from scheduler.api.scope import (
    check_schedule,
    schedule_missing,
    tenant_for_create,
    tenant_to_list,
    visible_run,
    visible_schedules,
)
from scheduler.api.status import Context, code_for, grpc_errors
from scheduler.errors import CronscaleError, InvalidArgument, PermissionDenied
from scheduler.model import Schedule, parse_run_id, to_millisecond, validate_schedule_id
from scheduler.service import ScheduleService


def _id(value: str, field: str = "id") -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return validate_schedule_id(value, field)


class SchedulerServicer(
    PreviewRpcs, LifecycleRpcs, BackfillRpcs, scheduler_service_pb2_grpc.SchedulerServiceServicer
):
    """The SchedulerService. The core RPCs are here; the rest come from one mixin per concern
    (``api/preview.py``, ``api/lifecycle.py``, ``api/backfills.py``)."""

    def __init__(self, service: ScheduleService, quotas: ApiQuotas) -> None:
        self._svc = service
        self._quotas = quotas

    @grpc_errors
    async def CreateSchedule(
        self, request: scheduler_service_pb2.CreateScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        if not request.HasField("schedule"):
            raise InvalidArgument("schedule", "is required")
        draft = schedule_from_proto(
            request.schedule,
            now=datetime.now(UTC),
            tenant=tenant_for_create(request.schedule.tenant),
        )
        await self._quotas.check_payload(draft.tenant, draft.payload, "schedule.payload")
        await self._quotas.check_room(draft.tenant)
        started = to_millisecond(datetime.now(UTC))
        created = await self._svc.create(
            draft, schedule_id=request.schedule_id, request_id=request.request_id
        )
        # A retried request_id answers the first call's schedule: counted once, by that call.
        if created.create_time is not None and created.create_time >= started:
            await self._quotas.counted(created.tenant, 1)
        return schedule_to_proto(created)

    @grpc_errors
    async def BatchCreateSchedules(
        self, request: scheduler_service_pb2.BatchCreateSchedulesRequest, context: Context
    ) -> scheduler_service_pb2.BatchCreateSchedulesResponse:
        now = datetime.now(UTC)
        items: list[tuple[Schedule | CronscaleError, str]] = []
        for i, item in enumerate(request.items):
            draft: Schedule | CronscaleError
            if not item.HasField("schedule"):
                draft = InvalidArgument("schedule", "is required")
            else:
                try:
                    tenant = tenant_for_create(item.schedule.tenant, f"items[{i}].schedule.tenant")
                    draft = schedule_from_proto(item.schedule, now=now, tenant=tenant)
                except (InvalidArgument, PermissionDenied) as e:
                    draft = e
            items.append((draft, item.schedule_id))
        items = await self._admit(items)
        results = await self._svc.create_many(items)
        created: Counter[str] = Counter(
            r.schedule.tenant for r in results if r.schedule is not None and not r.already_existed
        )
        for tenant, n in created.items():
            await self._quotas.counted(tenant, n)
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

    async def _admit(
        self, items: list[tuple[Schedule | CronscaleError, str]]
    ) -> list[tuple[Schedule | CronscaleError, str]]:
        """Items past their tenant's max_payload_bytes or max_schedules quota refused alone
        (RESOURCE_EXHAUSTED naming the quota and the current use), the rest kept."""
        room: dict[str, tuple[int, int] | None] = {}
        taken: Counter[str] = Counter()
        out: list[tuple[Schedule | CronscaleError, str]] = []
        for i, (draft, chosen) in enumerate(items):
            if isinstance(draft, Schedule):
                t = draft.tenant
                try:
                    await self._quotas.check_payload(
                        t, draft.payload, f"items[{i}].schedule.payload"
                    )
                except InvalidArgument as e:
                    out.append((e, chosen))
                    continue
                if t not in room:
                    room[t] = await self._quotas.usage(t)
                usage = room[t]
                if usage is not None and usage[1] + taken[t] >= usage[0]:
                    out.append((full(t, *usage), chosen))
                    continue
                taken[t] += 1
            out.append((draft, chosen))
        return out

    @grpc_errors
    async def GetSchedule(
        self, request: scheduler_service_pb2.GetScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        sid = _id(request.id)
        s = await self._svc.get(sid)
        if not principal().sees(s.tenant):
            raise schedule_missing(sid)
        return schedule_to_proto(s)

    @grpc_errors
    async def ListSchedules(
        self, request: scheduler_service_pb2.ListSchedulesRequest, context: Context
    ) -> scheduler_service_pb2.ListSchedulesResponse:
        items, token = await self._svc.list_page(
            _page_size(request.page_size),
            request.page_token,
            tenant=tenant_to_list(request.tenant),
        )
        return scheduler_service_pb2.ListSchedulesResponse(
            schedules=[schedule_to_proto(s) for s in visible_schedules(items)],
            next_page_token=token,
        )

    @grpc_errors
    async def PauseSchedule(
        self, request: scheduler_service_pb2.PauseScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        sid = _id(request.id)
        await check_schedule(self._svc, sid)
        s = await self._svc.pause(sid, note=request.note, paused_by=request.paused_by)
        return schedule_to_proto(s)

    @grpc_errors
    async def ResumeSchedule(
        self, request: scheduler_service_pb2.ResumeScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        override = misfire_from_proto(request.misfire_override, "misfire_override")
        sid = _id(request.id)
        await check_schedule(self._svc, sid)
        return schedule_to_proto(await self._svc.resume(sid, misfire_override=override))

    @grpc_errors
    async def DeleteSchedule(
        self, request: scheduler_service_pb2.DeleteScheduleRequest, context: Context
    ) -> scheduler_service_pb2.DeleteScheduleResponse:
        sid = _id(request.id)
        s = await self._svc.schedules.get(sid)
        if not principal().sees(s.tenant):
            raise schedule_missing(sid)
        await self._svc.delete(sid)
        await self._quotas.counted(s.tenant, -1)
        return scheduler_service_pb2.DeleteScheduleResponse()

    @grpc_errors
    async def ListRuns(
        self, request: scheduler_service_pb2.ListRunsRequest, context: Context
    ) -> scheduler_service_pb2.ListRunsResponse:
        sid = _id(request.schedule_id, "schedule_id")
        who = principal()
        if not who.is_admin:
            # A deleted schedule's runs stay listable by their tenant (each run names it).
            found = await self._svc.schedules.get_many([sid])
            if sid in found and not who.sees(found[sid].tenant):
                raise schedule_missing(sid)
        runs, token = await self._svc.list_runs(
            sid, _page_size(request.page_size), request.page_token
        )
        return scheduler_service_pb2.ListRunsResponse(
            runs=[run_to_proto(r) for r in runs if who.sees(r.tenant)], next_page_token=token
        )

    @grpc_errors
    async def GetRun(
        self, request: scheduler_service_pb2.GetRunRequest, context: Context
    ) -> schedule_pb2.Run:
        if not request.run_id:
            raise InvalidArgument("run_id", "is required")
        parse_run_id(request.run_id)
        return run_to_proto(visible_run(await self._svc.get_run(request.run_id)))
