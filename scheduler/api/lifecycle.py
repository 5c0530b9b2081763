"""SchedulerService.UpdateSchedule, CancelSchedule, TriggerSchedule and RerunRun."""

from __future__ import annotations

import grpc

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.api.status import Context
from scheduler.service import ScheduleService


class LifecycleRpcs:
    _svc: ScheduleService

    async def UpdateSchedule(
        self, request: scheduler_service_pb2.UpdateScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "UpdateSchedule is being built")
        raise AssertionError

    async def CancelSchedule(
        self, request: scheduler_service_pb2.CancelScheduleRequest, context: Context
    ) -> schedule_pb2.Schedule:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "CancelSchedule is being built")
        raise AssertionError

    async def TriggerSchedule(
        self, request: scheduler_service_pb2.TriggerScheduleRequest, context: Context
    ) -> schedule_pb2.Run:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "TriggerSchedule is being built")
        raise AssertionError

    async def RerunRun(
        self, request: scheduler_service_pb2.RerunRunRequest, context: Context
    ) -> schedule_pb2.Run:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "RerunRun is being built")
        raise AssertionError
