"""Schedules fire end to end: api -> Cassandra -> dispatcher -> Kafka -> worker -> api."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    FAILED,
    SUCCEEDED,
    TERMINAL,
    create_schedule,
    cron_spec,
    delete_schedule,
    dt,
    get_run,
    get_schedule,
    json_payload,
    list_runs,
    once_spec,
    pause_schedule,
    wait_for_runs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_one_shot_fires_exactly_once_within_5s(stack: Stack) -> None:
    at = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    s = create_schedule(stack, name="one-shot", handler="e2e.record", spec=once_spec(at))
    runs = wait_for_runs(
        stack,
        s.id,
        lambda rs: any(r.status == SUCCEEDED for r in rs),
        timeout=at.timestamp() - time.time() + 5,
    )
    time.sleep(1.0)  # nothing else may follow
    runs = list_runs(stack, s.id)
    assert len(runs) == 1, runs
    run = runs[0]
    assert run.status == SUCCEEDED
    assert dt(run.scheduled_for) == at
    lag = (dt(run.enqueue_time) - at).total_seconds()
    done_after = (dt(run.finish_time) - at).total_seconds()
    print(f"one-shot: enqueued {lag:.3f} s after its time, succeeded after {done_after:.3f} s")
    assert done_after < 5.0
    got = get_run(stack, run.run_id)
    assert got.run_id == run.run_id and got.status == SUCCEEDED
    after = get_schedule(stack, s.id)
    assert after.state == schedule_pb2.SCHEDULE_STATE_COMPLETED


def test_seconds_cron_fires_on_consecutive_slots(stack: Stack) -> None:
    s = create_schedule(
        stack,
        name="every-2s",
        handler="echo",
        payload=json_payload({"n": 1}),
        spec=cron_spec("*/2 * * * * *", "Europe/Berlin"),
    )
    runs = wait_for_runs(
        stack,
        s.id,
        lambda rs: sum(r.status == SUCCEEDED for r in rs) >= 4,
        timeout=15,
    )
    pause_schedule(stack, s.id)
    done = sorted(
        (r for r in runs if r.status == SUCCEEDED),
        key=lambda r: r.scheduled_for.ToDatetime(),
    )
    slots = [dt(r.scheduled_for) for r in done]
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
    s = create_schedule(
        stack,
        name="fails",
        handler="fail",
        payload=json_payload({"error": "disk full on /var/backups"}),
        spec=once_spec(at),
    )
    runs = wait_for_runs(stack, s.id, lambda rs: any(r.status in TERMINAL for r in rs), timeout=10)
    assert runs[0].status == FAILED
    assert "disk full on /var/backups" in runs[0].error


def test_unknown_handler_fails_the_run(stack: Stack) -> None:
    at = datetime.now(UTC) + timedelta(seconds=2)
    s = create_schedule(stack, name="unknown", handler="no.such.handler", spec=once_spec(at))
    runs = wait_for_runs(stack, s.id, lambda rs: any(r.status in TERMINAL for r in rs), timeout=10)
    assert runs[0].status == FAILED
    assert "no.such.handler" in runs[0].error


def test_paused_schedule_does_not_fire_and_resumes(stack: Stack) -> None:
    s = create_schedule(stack, name="pausable", handler="echo", spec=cron_spec("* * * * * *"))
    wait_for_runs(stack, s.id, lambda rs: len(rs) >= 1, timeout=10)
    paused = stack.api.PauseSchedule(
        scheduler_service_pb2.PauseScheduleRequest(id=s.id, note="maintenance", paused_by="ops"),
        timeout=10,
    )
    assert paused.state == schedule_pb2.SCHEDULE_STATE_PAUSED and paused.pause_note == "maintenance"
    time.sleep(1.5)  # let a firing that raced the pause land
    before = len(list_runs(stack, s.id))
    time.sleep(3)
    assert len(list_runs(stack, s.id)) == before, "a paused schedule fired"
    resumed = stack.api.ResumeSchedule(
        scheduler_service_pb2.ResumeScheduleRequest(id=s.id), timeout=10
    )
    assert resumed.state == schedule_pb2.SCHEDULE_STATE_ACTIVE
    wait_for_runs(stack, s.id, lambda rs: len(rs) >= before + 2, timeout=10)
    delete_schedule(stack, s.id)
    time.sleep(1.5)
    count = len(list_runs(stack, s.id))
    time.sleep(3)
    assert len(list_runs(stack, s.id)) == count, "a deleted schedule fired"
    with pytest.raises(grpc.RpcError) as err:
        stack.api.GetSchedule(scheduler_service_pb2.GetScheduleRequest(id=s.id), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_dispatcher_killed_and_replaced_keeps_firing(stack: Stack) -> None:
    s = create_schedule(
        stack, name="survives-failover", handler="echo", spec=cron_spec("* * * * * *")
    )
    wait_for_runs(stack, s.id, lambda rs: len(rs) >= 2, timeout=10)
    stack.kill("dispatcher")  # SIGKILL: no clean release, leases must run out
    killed_at = datetime.now(UTC)
    stack.start("dispatcher", "dispatcher")
    runs = wait_for_runs(
        stack,
        s.id,
        lambda rs: any(
            dt(r.scheduled_for) > killed_at + timedelta(seconds=1) and r.status == SUCCEEDED
            for r in rs
        ),
        timeout=30,
    )
    # Slots the outage made a misfire are SKIPPED records without an enqueue time; the first
    # run enqueued after the kill is when firing resumed.
    resumed = min(
        dt(r.enqueue_time)
        for r in runs
        if r.HasField("enqueue_time") and dt(r.enqueue_time) > killed_at
    )
    print(f"failover: firing resumed {(resumed - killed_at).total_seconds():.1f} s after the kill")
    assert (resumed - killed_at).total_seconds() < 20
    delete_schedule(stack, s.id)
