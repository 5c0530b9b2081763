"""Update, cancel, trigger and re-run over the real stack (api, dispatcher, worker processes)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    CANCELLED,
    ENQUEUED,
    FAILED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    RunStatus,
    create_with_policies,
    cron_spec,
    delete_schedule,
    dt,
    get_run,
    get_schedule,
    list_runs,
    once_spec,
    pause_schedule,
    refusal,
    status_name,
    ts,
    wait_for_runs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _create(
    stack: Stack,
    *,
    handler: str,
    cron: str = "",
    at: datetime | None = None,
    payload: Any = None,
    **policies: Any,
) -> schedule_pb2.Schedule:
    """A schedule on ``cron``, or else once at ``at`` (a day from now by default)."""
    spec = cron_spec(cron) if cron else once_spec(at or datetime.now(UTC) + timedelta(days=1))
    return create_with_policies(
        stack, name="lifecycle", handler=handler, spec=spec, payload=payload, **policies
    )


def _wait_status(stack: Stack, run_id: str, statuses: set[RunStatus], timeout: float) -> None:
    sid = run_id.rpartition("@")[0]
    wait_for_runs(
        stack,
        sid,
        lambda rs: any(r.run_id == run_id and r.status in statuses for r in rs),
        timeout,
        f"{run_id} in {sorted(status_name(s) for s in statuses)}",
        order="slot_id",
    )


def _trigger(stack: Stack, sid: str, force: bool = False) -> schedule_pb2.Run:
    return stack.api.TriggerSchedule(
        scheduler_service_pb2.TriggerScheduleRequest(id=sid, force=force), timeout=10
    )


def _update(stack: Stack, schedule: schedule_pb2.Schedule) -> schedule_pb2.Schedule:
    return stack.api.UpdateSchedule(
        scheduler_service_pb2.UpdateScheduleRequest(schedule=schedule), timeout=10
    )


def _cancel(stack: Stack, sid: str, cancel_running: bool = False) -> schedule_pb2.Schedule:
    return stack.api.CancelSchedule(
        scheduler_service_pb2.CancelScheduleRequest(id=sid, cancel_running=cancel_running),
        timeout=10,
    )


def test_update_with_a_stale_version_is_aborted_and_changes_nothing(stack: Stack) -> None:
    s = _create(stack, handler="e2e.record", cron="0 0 1 1 *")
    assert s.version == 1
    changed = schedule_pb2.Schedule()
    changed.CopyFrom(s)
    changed.name = "renamed"
    v2 = _update(stack, changed)
    assert (v2.version, v2.name) == (2, "renamed")
    stale = schedule_pb2.Schedule()
    stale.CopyFrom(s)  # still carries version 1
    stale.name = "lost update"
    stale.spec.cron.expression = "*/2 * * * * *"
    code, message = refusal(lambda: _update(stack, stale))
    assert code == grpc.StatusCode.ABORTED
    assert "schedule.version" in message and "1" in message and "current version is 2" in message
    after = get_schedule(stack, s.id)
    assert (after.version, after.name, after.spec.cron.expression) == (2, "renamed", "0 0 1 1 *")
    assert after.update_time == v2.update_time
    time.sleep(2.5)
    assert list_runs(stack, s.id) == [], "the refused spec fired"
    # A missing version is a bad request, not a conflict.
    stale.version = 0
    code, message = refusal(lambda: _update(stack, stale))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "schedule.version" in message


def test_update_replaces_the_pending_timer_so_the_old_spec_never_fires(stack: Stack) -> None:
    s = _create(stack, handler="e2e.record", cron="* * * * * *")
    wait_for_runs(
        stack,
        s.id,
        lambda rs: len(rs) >= 2,
        10,
        "two runs of the every-second spec",
        order="slot_id",
    )
    current = get_schedule(stack, s.id)
    far = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    changed = schedule_pb2.Schedule()
    changed.CopyFrom(current)
    changed.spec.once.CopyFrom(schedule_pb2.OneShotSpec(at=ts(far)))
    updated = _update(stack, changed)
    returned = datetime.now(UTC)
    assert updated.version == current.version + 1
    assert updated.spec.WhichOneof("kind") == "once"
    assert updated.state == schedule_pb2.SCHEDULE_STATE_ACTIVE
    assert dt(updated.next_fire_time) == far
    time.sleep(4)
    late = [
        r
        for r in list_runs(stack, s.id, order="slot_id")
        if dt(r.scheduled_for) > returned + timedelta(seconds=1)
    ]
    assert late == [], f"the old spec fired after the update: {[r.run_id for r in late]}"
    # A paused schedule takes a new spec and stays paused.
    pause_schedule(stack, s.id)
    paused = get_schedule(stack, s.id)
    paused.spec.cron.CopyFrom(schedule_pb2.CronSpec(expression="* * * * * *"))
    still = _update(stack, paused)
    assert still.state == schedule_pb2.SCHEDULE_STATE_PAUSED
    assert still.spec.cron.expression == "* * * * * *"
    count = len(list_runs(stack, s.id))
    time.sleep(2.5)
    assert len(list_runs(stack, s.id)) == count, "a paused schedule fired after an update"
    delete_schedule(stack, s.id)


def test_trigger_runs_now_with_a_fresh_manual_run_id(stack: Stack) -> None:
    s = _create(stack, handler="e2e.record")
    first = _trigger(stack, s.id)
    # Under SKIP (the default) a triggered run still queued is in progress: the next trigger
    # waits for it to finish (decision 0013: the API weighs the run rows).
    _wait_status(stack, first.run_id, {SUCCEEDED}, 10)
    second = _trigger(stack, s.id)
    assert first.status == ENQUEUED and first.manual
    assert first.run_id.startswith(f"{s.id}@") and "~" in first.run_id
    assert second.run_id != first.run_id
    for run in (first, second):
        _wait_status(stack, run.run_id, {SUCCEEDED}, 10)
        got = get_run(stack, run.run_id)
        assert got.manual and got.status == SUCCEEDED
        lag = (dt(got.start_time) - dt(got.scheduled_for)).total_seconds()
        print(f"trigger: {run.run_id} started {lag:.3f} s after the trigger")
        assert lag < 3
    assert {r.run_id for r in list_runs(stack, s.id)} == {first.run_id, second.run_id}
    # A paused schedule can be triggered: its times stay paused, the manual run runs.
    pause_schedule(stack, s.id)
    third = _trigger(stack, s.id)
    _wait_status(stack, third.run_id, {SUCCEEDED}, 10)
    assert get_schedule(stack, s.id).state == schedule_pb2.SCHEDULE_STATE_PAUSED
    # A trigger of an unknown schedule.
    code, _ = refusal(lambda: _trigger(stack, "no-such-schedule"))
    assert code == grpc.StatusCode.NOT_FOUND


def test_trigger_respects_skip_unless_forced(stack: Stack, tmp_path: Path) -> None:
    s = _create(
        stack,
        handler="e2e.sleep_cancellable",
        payload={"seconds": 6},
        overlap=schedule_pb2.OVERLAP_POLICY_SKIP,
    )
    long = _trigger(stack, s.id)
    _wait_status(stack, long.run_id, {RUNNING}, 10)
    skipped = _trigger(stack, s.id)
    assert skipped.status == SKIPPED and skipped.skip_reason == "overlap" and skipped.manual
    stored = get_run(stack, skipped.run_id)
    assert stored.status == SKIPPED and stored.skip_reason == "overlap"
    # A run in progress cannot be re-run.
    code, message = refusal(
        lambda: stack.api.RerunRun(
            scheduler_service_pb2.RerunRunRequest(run_id=long.run_id), timeout=10
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "RUNNING" in message
    forced = _trigger(stack, s.id, force=True)
    assert forced.status == ENQUEUED
    _wait_status(stack, forced.run_id, {RUNNING}, 10)
    assert get_run(stack, long.run_id).status == RUNNING, "both run at once when forced"
    _cancel(stack, s.id, cancel_running=True)
    wait_for_runs(
        stack,
        s.id,
        lambda rs: all(r.status in (SKIPPED, CANCELLED, SUCCEEDED) for r in rs),
        10,
        "runs finished after the cancel",
        order="slot_id",
    )


def test_cancel_previous_cancels_the_running_run_and_starts_the_next(
    stack: Stack, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled.txt"
    s = _create(
        stack,
        handler="e2e.sleep_cancellable",
        cron="*/4 * * * * *",
        payload={"seconds": 10, "marker": str(marker)},
        overlap=schedule_pb2.OVERLAP_POLICY_CANCEL_PREVIOUS,
    )

    def cancelled_then_next(rs: list[schedule_pb2.Run]) -> bool:
        done = [r for r in rs if r.status == CANCELLED]
        return bool(done) and any(
            dt(r.scheduled_for) > dt(done[0].scheduled_for) and r.HasField("start_time") for r in rs
        )

    runs = wait_for_runs(
        stack,
        s.id,
        cancelled_then_next,
        25,
        "a run CANCELLED and the next started",
        order="slot_id",
    )
    _cancel(stack, s.id, cancel_running=True)
    first = next(r for r in runs if r.status == CANCELLED)
    nxt = next(r for r in runs if dt(r.scheduled_for) > dt(first.scheduled_for))
    assert (dt(nxt.scheduled_for) - dt(first.scheduled_for)).total_seconds() == 4
    assert "cancelled by an operator" in first.error
    assert first.HasField("finish_time") and first.HasField("start_time")
    # Cancelled soon after the next slot fired (a heartbeat later), not after its 10 s sleep.
    ran = (dt(first.finish_time) - dt(first.start_time)).total_seconds()
    assert ran < 8, f"the previous run ran {ran:.1f} s"
    assert first.run_id in marker.read_text().split(), "the handler did not see the cancel"
    print(
        f"cancel_previous: {first.run_id} ran {ran:.1f} s; next started "
        f"{(dt(nxt.start_time) - dt(nxt.scheduled_for)).total_seconds():.3f} s after its slot"
    )


def test_rerun_of_a_failed_run_is_linked_to_it(stack: Stack) -> None:
    at = datetime.now(UTC) + timedelta(seconds=2)
    s = _create(stack, handler="fail", at=at, payload={"error": "flaky upstream"})
    runs = wait_for_runs(
        stack,
        s.id,
        lambda rs: any(r.status == FAILED for r in rs),
        10,
        "a FAILED run",
        order="slot_id",
    )
    original = next(r for r in runs if r.status == FAILED)
    time.sleep(1.0)  # a redelivered duplicate (at-least-once) would make it RUNNING again
    _wait_status(stack, original.run_id, {FAILED}, 10)
    rerun = stack.api.RerunRun(
        scheduler_service_pb2.RerunRunRequest(run_id=original.run_id), timeout=10
    )
    assert rerun.run_id != original.run_id and rerun.run_id.startswith(f"{s.id}@")
    assert rerun.origin_run_id == original.run_id
    assert rerun.manual and rerun.status == ENQUEUED
    assert rerun.scheduled_for == original.scheduled_for
    _wait_status(stack, rerun.run_id, {FAILED}, 10)
    got = get_run(stack, rerun.run_id)
    assert got.origin_run_id == original.run_id and "flaky upstream" in got.error
    _wait_status(stack, original.run_id, {FAILED}, 10)  # the original is left as it was
    code, _ = refusal(
        lambda: stack.api.RerunRun(
            scheduler_service_pb2.RerunRunRequest(run_id=f"{s.id}@20200101T000000.000Z"),
            timeout=10,
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, message = refusal(
        lambda: stack.api.RerunRun(
            scheduler_service_pb2.RerunRunRequest(run_id="not a run id"), timeout=10
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "run_id" in message


def test_cancel_with_cancel_running_stops_the_run_and_the_schedule_for_good(
    stack: Stack, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled.txt"
    s = _create(
        stack,
        handler="e2e.sleep_cancellable",
        cron="* * * * * *",
        payload={"seconds": 60, "marker": str(marker)},
    )
    runs = wait_for_runs(
        stack,
        s.id,
        lambda rs: any(r.status == RUNNING for r in rs),
        10,
        "a RUNNING run",
        order="slot_id",
    )
    running = next(r for r in runs if r.status == RUNNING)
    cancelled = _cancel(stack, s.id, cancel_running=True)
    assert cancelled.state == schedule_pb2.SCHEDULE_STATE_CANCELLED
    assert not cancelled.HasField("next_fire_time")
    _wait_status(stack, running.run_id, {CANCELLED}, 8)
    assert running.run_id in marker.read_text().split(), "the handler did not see the cancel"
    time.sleep(1.5)  # let a firing that raced the cancel land
    count = len(list_runs(stack, s.id))
    time.sleep(3)
    assert len(list_runs(stack, s.id)) == count, "a cancelled schedule fired"
    assert get_schedule(stack, s.id).state == schedule_pb2.SCHEDULE_STATE_CANCELLED
    # Cancelled for good.
    code, message = refusal(
        lambda: stack.api.ResumeSchedule(
            scheduler_service_pb2.ResumeScheduleRequest(id=s.id), timeout=10
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "CANCELLED" in message
    current = get_schedule(stack, s.id)
    code, message = refusal(lambda: _update(stack, current))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "CANCELLED" in message
    code, _ = refusal(lambda: _trigger(stack, s.id, force=True))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = refusal(
        lambda: stack.api.RerunRun(
            scheduler_service_pb2.RerunRunRequest(run_id=running.run_id), timeout=10
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    # Idempotent.
    assert _cancel(stack, s.id).state == schedule_pb2.SCHEDULE_STATE_CANCELLED


def test_cli_update_trigger_rerun_cancel(stack: Stack) -> None:
    api = ["--api", stack.config.api_target]
    s = _create(stack, handler="e2e.record", cron="0 0 1 1 *")

    def cli_json(*args: str) -> Any:
        out = stack.cli(*args, *api, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    updated = cli_json("schedule", "update", s.id, "--version", "1", "--name", "via-cli")
    assert (updated["version"], updated["name"]) == (2, "via-cli")
    assert updated["spec"]["cron"]["expression"] == "0 0 1 1 *"
    stale = stack.cli("schedule", "update", s.id, *api, "--version", "1", "--tz", "Asia/Kolkata")
    assert stale.returncode == 1
    assert "ABORTED" in stale.stderr and "schedule.version" in stale.stderr
    run = cli_json("schedule", "trigger", s.id)
    assert run["status"] == "ENQUEUED" and run["manual"] is True
    _wait_status(stack, run["run_id"], {SUCCEEDED}, 10)
    again = cli_json("run", "rerun", run["run_id"])
    assert again["origin_run_id"] == run["run_id"] and again["status"] == "ENQUEUED"
    _wait_status(stack, again["run_id"], {SUCCEEDED}, 10)
    cancelled = cli_json("schedule", "cancel", s.id, "--cancel-running")
    assert cancelled["state"] == "CANCELLED"
    refused = stack.cli("schedule", "trigger", s.id, *api)
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr
