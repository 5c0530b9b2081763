"""Locust load on the gRPC API: register, read and list schedules, read runs.

    locust -f loadtest/locustfile.py --headless -u 50 -r 10 -t 1m --host 127.0.0.1:50051

Each simulated client creates one-shot-free cron schedules (a far-future daily time, so the
load measures the API and Cassandra, not firing), then mostly reads them back. Request times
and failures land in Locust's statistics under the RPC's name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
from locust import User, between, events, task

from cronscale.v1 import schedule_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc
from scheduler.credentials import authed_channel


def timed_call(name: str, call: Callable[[], Any]) -> Any:
    """Makes a gRPC call and reports it to Locust under ``name``; its response, or None after
    an RPC error (reported as a failure)."""
    started = time.perf_counter()
    exc: Exception | None = None
    response: Any = None
    try:
        response = call()
    except grpc.RpcError as e:
        exc = e
    events.request.fire(  # type: ignore[no-untyped-call]
        request_type="grpc",
        name=name,
        response_time=(time.perf_counter() - started) * 1000,
        response_length=response.ByteSize() if hasattr(response, "ByteSize") else 0,
        exception=exc,
    )
    return response


class GrpcUser(User):
    """A client of SchedulerService; every call is reported to Locust by its RPC name."""

    abstract = True
    wait_time = between(0.01, 0.1)

    def on_start(self) -> None:
        self._channel = authed_channel(self.host or "127.0.0.1:50051")
        self.api = scheduler_service_pb2_grpc.SchedulerServiceStub(self._channel)
        self.ids: list[str] = []

    def on_stop(self) -> None:
        self._channel.close()

    def call(self, name: str, fn: Callable[..., Any], request: Any) -> Any:
        return timed_call(name, lambda: fn(request, timeout=10))


class SchedulerClient(GrpcUser):
    @task(1)
    def create(self) -> None:
        s = self.call(
            "CreateSchedule",
            self.api.CreateSchedule,
            scheduler_service_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.Schedule(
                    name=f"locust-{uuid.uuid4().hex[:8]}",
                    handler="echo",
                    spec=schedule_pb2.ScheduleSpec(
                        cron=schedule_pb2.CronSpec(expression="17 3 * * *", timezone="UTC")
                    ),
                )
            ),
        )
        if s is not None:
            self.ids.append(s.id)

    @task(5)
    def get(self) -> None:
        if self.ids:
            self.call(
                "GetSchedule",
                self.api.GetSchedule,
                scheduler_service_pb2.GetScheduleRequest(id=self.ids[-1]),
            )

    @task(1)
    def list_runs(self) -> None:
        if self.ids:
            self.call(
                "ListRuns",
                self.api.ListRuns,
                scheduler_service_pb2.ListRunsRequest(schedule_id=self.ids[0], page_size=20),
            )
