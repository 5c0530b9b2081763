"""Schedules fire end to end: api -> Cassandra -> dispatcher -> Kafka -> worker -> api."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TERMINAL = {schedule_pb2.RUN_STATUS_SUCCEEDED, schedule_pb2.RUN_STATUS_FAILED}


def _ts(t: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(t)
    return out


def _runs(stack: Stack, schedule_id: str) -> list[schedule_pb2.Run]:
    resp = stack.api.ListRuns(
        scheduler_service_pb2.ListRunsRequest(schedule_id=schedule_id, page_size=1000), timeout=10
    )
    return list(resp.runs)


def _wait_for(
    stack: Stack, schedule_id: str, done: Callable[[list[schedule_pb2.Run]], bool], timeout: float
) -> list[schedule_pb2.Run]:
    deadline = time.monotonic() + timeout
    while True:
        runs = _runs(stack, schedule_id)
        if done(runs):
            return runs
        if time.monotonic() > deadline:
            pytest.fail(
                f"runs of {schedule_id} not as expected after {timeout} s: "
                f"{[(r.run_id, schedule_pb2.RunStatus.Name(r.status)) for r in runs]}\n"
                f"--- dispatcher\n{stack.tail('dispatcher')}\n--- worker\n{stack.tail('worker')}"
            )
        time.sleep(0.2)


def _create(stack: Stack, **fields: Any) -> schedule_pb2.Schedule:
    return stack.api.CreateSchedule(
        scheduler_service_pb2.CreateScheduleRequest(schedule=schedule_pb2.Schedule(**fields)),
        timeout=10,
    )


def test_one_shot_fires_exactly_once_within_5s(stack: Stack) -> None:
    at = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    s = _create(
        stack,
        name="one-shot",
        handler="e2e.record",
        spec=schedule_pb2.ScheduleSpec(once=schedule_pb2.OneShotSpec(at=_ts(at))),
    )
    runs = _wait_for(
        stack,
        s.id,
        lambda rs: any(r.status == schedule_pb2.RUN_STATUS_SUCCEEDED for r in rs),
        timeout=at.timestamp() - time.time() + 5,
    )
    time.sleep(1.0)  # nothing else may follow
    runs = _runs(stack, s.id)
    assert len(runs) == 1, runs
    run = runs[0]
    assert run.status == schedule_pb2.RUN_STATUS_SUCCEEDED
    assert run.scheduled_for.ToDatetime(tzinfo=UTC) == at
    lag = (run.enqueue_time.ToDatetime(tzinfo=UTC) - at).total_seconds()
    done_after = (run.finish_time.ToDatetime(tzinfo=UTC) - at).total_seconds()
    print(f"one-shot: enqueued {lag:.3f} s after its time, succeeded after {done_after:.3f} s")
    assert done_after < 5.0
    got = stack.api.GetRun(scheduler_service_pb2.GetRunRequest(run_id=run.run_id), timeout=10)
    assert got.run_id == run.run_id and got.status == schedule_pb2.RUN_STATUS_SUCCEEDED
    after = stack.api.GetSchedule(scheduler_service_pb2.GetScheduleRequest(id=s.id), timeout=10)
    assert after.state == schedule_pb2.SCHEDULE_STATE_COMPLETED


def test_seconds_cron_fires_on_consecutive_slots(stack: Stack) -> None:
    s = _create(
        stack,
        name="every-2s",
        handler="echo",
        payload=json.dumps({"n": 1}).encode(),
        spec=schedule_pb2.ScheduleSpec(
            cron=schedule_pb2.CronSpec(expression="*/2 * * * * *", timezone="Europe/Berlin")
        ),
    )
    runs = _wait_for(
        stack,
        s.id,
        lambda rs: sum(r.status == schedule_pb2.RUN_STATUS_SUCCEEDED for r in rs) >= 4,
        timeout=15,
    )
    stack.api.PauseSchedule(scheduler_service_pb2.PauseScheduleRequest(id=s.id), timeout=10)
    done = sorted(
        (r for r in runs if r.status == schedule_pb2.RUN_STATUS_SUCCEEDED),
        key=lambda r: r.scheduled_for.ToDatetime(),
    )
    slots = [r.scheduled_for.ToDatetime(tzinfo=UTC) for r in done]
    assert all(t.second % 2 == 0 and t.microsecond == 0 for t in slots)
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
    assert gaps == {2.0}, f"slots not consecutive: {slots}"
    assert len({r.run_id for r in done}) == len(done)
    lags = [
        (r.enqueue_time.ToDatetime() - r.scheduled_for.ToDatetime()).total_seconds() for r in done
    ]
    print(f"every-2s: enqueue lag max {max(lags):.3f} s over {len(lags)} runs")
    assert max(lags) < 2.0


def test_failing_handler_run_is_failed_with_its_error(stack: Stack) -> None:
    at = datetime.now(UTC) + timedelta(seconds=2)
    s = _create(
        stack,
        name="fails",
        handler="fail",
        payload=json.dumps({"error": "disk full on /var/backups"}).encode(),
        spec=schedule_pb2.ScheduleSpec(once=schedule_pb2.OneShotSpec(at=_ts(at))),
    )
    runs = _wait_for(stack, s.id, lambda rs: any(r.status in TERMINAL for r in rs), timeout=10)
    assert runs[0].status == schedule_pb2.RUN_STATUS_FAILED
    assert "disk full on /var/backups" in runs[0].error


def test_unknown_handler_fails_the_run(stack: Stack) -> None:
    at = datetime.now(UTC) + timedelta(seconds=2)
    s = _create(
        stack,
        name="unknown",
        handler="no.such.handler",
        spec=schedule_pb2.ScheduleSpec(once=schedule_pb2.OneShotSpec(at=_ts(at))),
    )
    runs = _wait_for(stack, s.id, lambda rs: any(r.status in TERMINAL for r in rs), timeout=10)
    assert runs[0].status == schedule_pb2.RUN_STATUS_FAILED
    assert "no.such.handler" in runs[0].error


def test_paused_schedule_does_not_fire_and_resumes(stack: Stack) -> None:
    s = _create(
        stack,
        name="pausable",
        handler="echo",
        spec=schedule_pb2.ScheduleSpec(cron=schedule_pb2.CronSpec(expression="* * * * * *")),
    )
    _wait_for(stack, s.id, lambda rs: len(rs) >= 1, timeout=10)
    paused = stack.api.PauseSchedule(
        scheduler_service_pb2.PauseScheduleRequest(id=s.id, note="maintenance", paused_by="ops"),
        timeout=10,
    )
    assert paused.state == schedule_pb2.SCHEDULE_STATE_PAUSED and paused.pause_note == "maintenance"
    time.sleep(1.5)  # let a firing that raced the pause land
    before = len(_runs(stack, s.id))
    time.sleep(3)
    assert len(_runs(stack, s.id)) == before, "a paused schedule fired"
    resumed = stack.api.ResumeSchedule(
        scheduler_service_pb2.ResumeScheduleRequest(id=s.id), timeout=10
    )
    assert resumed.state == schedule_pb2.SCHEDULE_STATE_ACTIVE
    _wait_for(stack, s.id, lambda rs: len(rs) >= before + 2, timeout=10)
    stack.api.DeleteSchedule(scheduler_service_pb2.DeleteScheduleRequest(id=s.id), timeout=10)
    time.sleep(1.5)
    count = len(_runs(stack, s.id))
    time.sleep(3)
    assert len(_runs(stack, s.id)) == count, "a deleted schedule fired"
    with pytest.raises(grpc.RpcError) as err:
        stack.api.GetSchedule(scheduler_service_pb2.GetScheduleRequest(id=s.id), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_dispatcher_killed_and_replaced_keeps_firing(stack: Stack) -> None:
    s = _create(
        stack,
        name="survives-failover",
        handler="echo",
        spec=schedule_pb2.ScheduleSpec(cron=schedule_pb2.CronSpec(expression="* * * * * *")),
    )
    _wait_for(stack, s.id, lambda rs: len(rs) >= 2, timeout=10)
    stack.kill("dispatcher")  # SIGKILL: no clean release, leases must run out
    killed_at = datetime.now(UTC)
    stack.start("dispatcher", "dispatcher")
    runs = _wait_for(
        stack,
        s.id,
        lambda rs: any(
            r.scheduled_for.ToDatetime(tzinfo=UTC) > killed_at + timedelta(seconds=1)
            and r.status == schedule_pb2.RUN_STATUS_SUCCEEDED
            for r in rs
        ),
        timeout=30,
    )
    resumed = min(
        r.enqueue_time.ToDatetime(tzinfo=UTC)
        for r in runs
        if r.scheduled_for.ToDatetime(tzinfo=UTC) > killed_at + timedelta(seconds=1)
    )
    print(f"failover: firing resumed {(resumed - killed_at).total_seconds():.1f} s after the kill")
    assert (resumed - killed_at).total_seconds() < 20
    stack.api.DeleteSchedule(scheduler_service_pb2.DeleteScheduleRequest(id=s.id), timeout=10)
