"""SchedulerService.BackfillSchedule, GetBackfill and ListDependencies."""

from __future__ import annotations

import grpc

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.api.status import Context
from scheduler.service import ScheduleService


class BackfillRpcs:
    _svc: ScheduleService

    async def BackfillSchedule(
        self, request: scheduler_service_pb2.BackfillScheduleRequest, context: Context
    ) -> schedule_pb2.Backfill:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "BackfillSchedule is being built")
        raise AssertionError

    async def GetBackfill(
        self, request: scheduler_service_pb2.GetBackfillRequest, context: Context
    ) -> schedule_pb2.Backfill:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetBackfill is being built")
        raise AssertionError

    async def ListDependencies(
        self, request: scheduler_service_pb2.ListDependenciesRequest, context: Context
    ) -> scheduler_service_pb2.ListDependenciesResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListDependencies is being built")
        raise AssertionError
