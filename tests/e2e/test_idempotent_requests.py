"""Client retries do not double work (loss path 13): CreateSchedule, TriggerSchedule and
RerunRun with a request_id return the first call's result when retried."""

from __future__ import annotations

import uuid

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    SUCCEEDED,
    create_schedule,
    cron_spec,
    list_runs,
    refusal,
    wait_for_runs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _create(stack: Stack, request_id: str) -> schedule_pb2.Schedule:
    return stack.api.CreateSchedule(
        scheduler_service_pb2.CreateScheduleRequest(
            schedule=schedule_pb2.Schedule(
                name="retried", handler="e2e.record", spec=cron_spec("0 0 1 1 *")
            ),
            request_id=request_id,
        ),
        timeout=10,
    )


def test_a_retried_create_returns_the_first_schedule(stack: Stack) -> None:
    request_id = f"create-{uuid.uuid4()}"
    first = _create(stack, request_id)
    again = _create(stack, request_id)
    assert again.id == first.id and again.create_time == first.create_time
    other = _create(stack, f"create-{uuid.uuid4()}")
    assert other.id != first.id, "another request_id is another schedule"
    err = refusal(lambda: _create(stack, "x" * 129))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.details.startswith("request_id:")


def test_retried_trigger_and_rerun_return_the_first_run(stack: Stack) -> None:
    s = create_schedule(stack, name="t", handler="e2e.record", spec=cron_spec("0 0 1 1 *"))
    trigger = scheduler_service_pb2.TriggerScheduleRequest(id=s.id, request_id="trigger-1")
    first = stack.api.TriggerSchedule(trigger, timeout=10)
    again = stack.api.TriggerSchedule(trigger, timeout=10)
    assert again.run_id == first.run_id
    runs = wait_for_runs(stack, s.id, lambda rs: any(r.status == SUCCEEDED for r in rs), timeout=15)
    assert len(runs) == 1, runs

    rerun = scheduler_service_pb2.RerunRunRequest(run_id=first.run_id, request_id="rerun-1")
    r1 = stack.api.RerunRun(rerun, timeout=10)
    r2 = stack.api.RerunRun(rerun, timeout=10)
    assert r1.run_id == r2.run_id != first.run_id
    wait_for_runs(
        stack, s.id, lambda rs: sum(1 for r in rs if r.status == SUCCEEDED) >= 2, timeout=15
    )
    assert len(list_runs(stack, s.id)) == 2
