"""SchedulerService.PreviewSchedule."""

from __future__ import annotations

import grpc

from cronscale.v1 import scheduler_service_pb2
from scheduler.api.status import Context
from scheduler.service import ScheduleService


class PreviewRpcs:
    _svc: ScheduleService

    async def PreviewSchedule(
        self, request: scheduler_service_pb2.PreviewScheduleRequest, context: Context
    ) -> scheduler_service_pb2.PreviewScheduleResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "PreviewSchedule is being built")
        raise AssertionError
