"""SchedulerService.BackfillSchedule, GetBackfill and ListDependencies."""

from __future__ import annotations

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.api.auth import principal
from scheduler.api.convert import from_ts, ts
from scheduler.api.paging import page_size
from scheduler.api.scope import check_schedule
from scheduler.api.status import Context, grpc_errors
from scheduler.backfill import Backfill
from scheduler.errors import InvalidArgument, NotFound
from scheduler.model import validate_schedule_id
from scheduler.service import ScheduleService


def backfill_to_proto(b: Backfill) -> schedule_pb2.Backfill:
    """The API form of a backfill's progress."""
    return schedule_pb2.Backfill(
        backfill_id=b.backfill_id,
        schedule_id=b.schedule_id,
        start_time=ts(b.start_time),
        end_time=ts(b.end_time),
        total=b.total,
        enqueued=b.enqueued,
        done=b.done,
        create_time=ts(b.create_time),
        concurrency=b.concurrency,
    )


class BackfillRpcs:
    _svc: ScheduleService

    @grpc_errors
    async def BackfillSchedule(
        self, request: scheduler_service_pb2.BackfillScheduleRequest, context: Context
    ) -> schedule_pb2.Backfill:
        """One run per slot in [start_time, end_time); a repeat of the same range returns the
        existing backfill. INVALID_ARGUMENT names the field; NOT_FOUND for an unknown id."""
        if not request.id:
            raise InvalidArgument("id", "is required")
        validate_schedule_id(request.id, "id")
        await check_schedule(self._svc, request.id)
        b = await self._svc.backfills.start(
            request.id,
            from_ts(request.start_time) if request.HasField("start_time") else None,
            from_ts(request.end_time) if request.HasField("end_time") else None,
            concurrency=request.concurrency,
        )
        return backfill_to_proto(b)

    @grpc_errors
    async def GetBackfill(
        self, request: scheduler_service_pb2.GetBackfillRequest, context: Context
    ) -> schedule_pb2.Backfill:
        """A backfill's progress: total, enqueued, done, concurrency."""
        if not request.backfill_id:
            raise InvalidArgument("backfill_id", "is required")
        b = await self._svc.backfills.get(request.backfill_id)
        try:
            await check_schedule(self._svc, b.schedule_id)
        except NotFound:
            raise NotFound(f"backfill {request.backfill_id!r} not found") from None
        return backfill_to_proto(b)

    @grpc_errors
    async def ListDependencies(
        self, request: scheduler_service_pb2.ListDependenciesRequest, context: Context
    ) -> scheduler_service_pb2.ListDependenciesResponse:
        """Edges upstream -> downstream touching ``schedule_id``, or all of them."""
        sid = request.schedule_id
        token = ""
        if sid:
            validate_schedule_id(sid, "schedule_id")
            await check_schedule(self._svc, sid)
            edges = await self._svc.dependencies.edges(sid)
        else:
            edges, token = await self._svc.dependencies.edges_page(
                page_size(request.page_size), request.page_token
            )
        who = principal()
        if not who.is_admin:
            # Edges never cross tenants (dependencies are refused across them): an edge is
            # the caller's when its downstream is.
            ends = await self._svc.schedules.get_many([e.downstream_id for e in edges])
            edges = [
                e
                for e in edges
                if e.downstream_id in ends and who.sees(ends[e.downstream_id].tenant)
            ]
        return scheduler_service_pb2.ListDependenciesResponse(
            edges=[
                schedule_pb2.DependencyEdge(
                    upstream_id=e.upstream_id, downstream_id=e.downstream_id
                )
                for e in edges
            ],
            next_page_token=token,
        )
