"""Spec bounds, max_runs, jitter, PreviewSchedule and pause/resume misfire overrides, over the
real stack: what preview says is what fires."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.timespec import jitter_offset
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    SKIPPED,
    SUCCEEDED,
    create_schedule,
    cron_spec,
    delete_schedule,
    dt,
    dur,
    get_schedule,
    list_runs,
    ts,
    wait_for_runs,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FIVE_MINUTELY = "*/5 * * * *"


def _whole_second(delay: float) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=delay)).replace(microsecond=0)


def _create(
    stack: Stack,
    expr: str,
    *,
    policies: schedule_pb2.SchedulePolicies | None = None,
    sid: str = "",
    **spec: Any,
) -> schedule_pb2.Schedule:
    """An ``e2e.record`` schedule on ``expr`` (more ScheduleSpec fields in ``spec``), named by
    its id (a fresh ``sp-...`` one unless ``sid`` is given)."""
    sid = sid or f"sp-{uuid.uuid4().hex[:10]}"
    return create_schedule(
        stack,
        sid,
        name=sid,
        handler="e2e.record",
        spec=cron_spec(expr, **spec),
        policies=policies,
    )


def _wait_state(
    stack: Stack, schedule_id: str, state: schedule_pb2.ScheduleState.ValueType, timeout: float
) -> None:
    wait_until(
        stack,
        lambda: get_schedule(stack, schedule_id).state == state,
        timeout,
        f"{schedule_id} {schedule_pb2.ScheduleState.Name(state)}",
        poll=0.2,
    )


def _fired(runs: list[schedule_pb2.Run]) -> list[schedule_pb2.Run]:
    return [r for r in runs if r.status != SKIPPED and not r.manual]


def test_preview_of_a_jittered_schedule_is_what_fires(stack: Stack) -> None:
    window = timedelta(milliseconds=1500)
    # An id whose offset is well inside the window, so a jitter ignored anywhere shows.
    sid = next(
        sid
        for sid in (f"jit-{uuid.uuid4().hex[:10]}" for _ in range(1000))
        if timedelta(milliseconds=600) < jitter_offset(sid, window) < timedelta(milliseconds=1400)
    )
    s = _create(stack, "*/2 * * * * *", sid=sid, jitter=dur(window))
    preview = stack.api.PreviewSchedule(
        scheduler_service_pb2.PreviewScheduleRequest(id=s.id, count=4), timeout=10
    )
    previewed = [dt(f.utc) for f in preview.fire_times]
    assert len(previewed) == 4
    offset = jitter_offset(s.id, window)
    for t in previewed:
        slot = t - offset
        assert slot.microsecond == 0 and slot.second % 2 == 0, (t, offset)
    assert previewed[0] == dt(s.next_fire_time)
    assert all(f.local.endswith("+00:00") and f.note == "" for f in preview.fire_times)

    runs = wait_for_runs(
        stack,
        s.id,
        lambda rs: any(dt(r.scheduled_for) >= previewed[-1] for r in rs),
        timeout=(previewed[-1] - datetime.now(UTC)).total_seconds() + 8,
        what="the last previewed time fired",
        order="slot",
    )
    # Between a slot and its jittered time, GetSchedule's next fire time is still that slot's
    # jittered time, as in preview (it once jumped to the following slot).
    now = datetime.now(UTC)
    next_even = now.replace(microsecond=0) + timedelta(seconds=2 - now.second % 2)
    time.sleep((next_even + offset / 2 - now).total_seconds())
    got = get_schedule(stack, s.id)
    assert dt(got.next_fire_time) == next_even + offset, (dt(got.next_fire_time), next_even)
    delete_schedule(stack, s.id)
    upto = [r for r in runs if dt(r.scheduled_for) <= previewed[-1]]
    assert [dt(r.scheduled_for) for r in upto] == previewed
    assert all(r.status != SKIPPED for r in upto)
    lags = [(dt(r.enqueue_time) - dt(r.scheduled_for)).total_seconds() for r in upto]
    print(f"jittered */2s (offset {offset}): enqueue lag max {max(lags):.3f} s over {len(lags)}")
    assert max(lags) < 2.0


def test_nothing_fires_before_the_start_bound(stack: Stack) -> None:
    start = _whole_second(4)
    s = _create(stack, "* * * * * *", start_time=ts(start))
    assert dt(s.next_fire_time) == start
    preview = stack.api.PreviewSchedule(
        scheduler_service_pb2.PreviewScheduleRequest(id=s.id, count=2), timeout=10
    )
    assert [dt(f.utc) for f in preview.fire_times] == [start, start + timedelta(seconds=1)]
    runs = wait_for_runs(stack, s.id, lambda rs: len(_fired(rs)) >= 2, timeout=12, what="two runs")
    delete_schedule(stack, s.id)
    assert min(dt(r.scheduled_for) for r in runs) == start


def test_end_bound_fires_until_the_end_then_completes(stack: Stack) -> None:
    end = _whole_second(4)
    s = _create(stack, "* * * * * *", end_time=ts(end))
    _wait_state(stack, s.id, schedule_pb2.SCHEDULE_STATE_COMPLETED, timeout=15)
    runs = wait_for_runs(
        stack, s.id, lambda rs: any(dt(r.scheduled_for) == end for r in rs), 5, "the end slot"
    )
    fired = [dt(r.scheduled_for) for r in _fired(runs)]
    assert max(fired) == end
    assert 3 <= len(fired) <= 5, fired
    time.sleep(2)
    assert len(list_runs(stack, s.id)) == len(runs), "a completed schedule fired"
    preview = stack.api.PreviewSchedule(
        scheduler_service_pb2.PreviewScheduleRequest(id=s.id), timeout=10
    )
    assert list(preview.fire_times) == []


def test_max_runs_fires_exactly_that_many_then_completes(stack: Stack) -> None:
    s = _create(stack, "* * * * * *", max_runs=3)
    # From the creation on (a run may already have fired by now): the three runs it will have.
    preview = stack.api.PreviewSchedule(
        scheduler_service_pb2.PreviewScheduleRequest(id=s.id, count=10, after=s.create_time),
        timeout=10,
    )
    assert len(preview.fire_times) == 3
    _wait_state(stack, s.id, schedule_pb2.SCHEDULE_STATE_COMPLETED, timeout=15)
    time.sleep(2.5)
    runs = list_runs(stack, s.id, order="slot")
    fired = _fired(runs)
    assert len(fired) == 3, [(r.run_id, r.status) for r in runs]
    assert [r.scheduled_for for r in fired] == [f.utc for f in preview.fire_times]


def _pause_wait_resume(
    stack: Stack, override: int
) -> tuple[schedule_pb2.Schedule, list[datetime], list[schedule_pb2.Run]]:
    """A `* * * * * *` schedule paused for ~4 s, then resumed with ``override``: returns the
    schedule, its missed slots, and its runs once the resume's catch-up has settled."""
    s = _create(stack, "* * * * * *")
    wait_for_runs(stack, s.id, lambda rs: len(rs) >= 1, 10, "a first run")
    # Paused just after a whole second: the next slot is then further away than the
    # dispatcher's fire-ahead (300 ms), which plans a slot that far ahead, pause or not
    # (decision 0011).
    time.sleep(1.05 - time.time() % 1)
    paused = stack.api.PauseSchedule(
        scheduler_service_pb2.PauseScheduleRequest(id=s.id, note="misfire test"), timeout=10
    )
    time.sleep(4.2)
    resumed = stack.api.ResumeSchedule(
        scheduler_service_pb2.ResumeScheduleRequest(id=s.id, misfire_override=override),  # type: ignore[arg-type]
        timeout=10,
    )
    assert resumed.state == schedule_pb2.SCHEDULE_STATE_ACTIVE
    pause_time, resume_time = dt(paused.pause_time), dt(resumed.update_time)
    first = pause_time.replace(microsecond=0) + timedelta(seconds=1)
    missed = []
    while first <= resume_time:
        missed.append(first)
        first += timedelta(seconds=1)
    assert 3 <= len(missed) <= 6, (pause_time, resume_time)

    # Settled: the first live slot after the resume has finished, so any catch-up has too.
    def settled(rs: list[schedule_pb2.Run]) -> bool:
        live = any(dt(r.scheduled_for) > resume_time and r.status == SUCCEEDED for r in rs)
        done = [r for r in rs if dt(r.scheduled_for) in missed and r.status in (SKIPPED, SUCCEEDED)]
        return live and len(done) == len(missed)

    runs = wait_for_runs(
        stack, s.id, settled, timeout=15, what="missed slots settled after the resume", order="slot"
    )
    delete_schedule(stack, s.id)
    return s, missed, [r for r in runs if dt(r.scheduled_for) in missed]


def test_resume_with_misfire_skip_records_every_paused_slot(stack: Stack) -> None:
    _s, missed, runs = _pause_wait_resume(stack, schedule_pb2.MISFIRE_POLICY_SKIP)
    assert [dt(r.scheduled_for) for r in runs] == missed
    assert all(r.status == SKIPPED and r.skip_reason == "paused" for r in runs), runs
    assert not any(r.worker_id for r in runs), "a skipped slot ran"


def test_resume_with_fire_once_runs_the_latest_missed_slot(stack: Stack) -> None:
    _s, missed, runs = _pause_wait_resume(stack, schedule_pb2.MISFIRE_POLICY_FIRE_ONCE)
    assert [dt(r.scheduled_for) for r in runs] == missed
    assert [r.status for r in runs] == [SKIPPED] * (len(missed) - 1) + [SUCCEEDED]
    assert all(r.skip_reason == "paused" for r in runs[:-1])


def test_resume_with_fire_all_runs_every_missed_slot(stack: Stack) -> None:
    _s, missed, runs = _pause_wait_resume(stack, schedule_pb2.MISFIRE_POLICY_FIRE_ALL)
    assert [dt(r.scheduled_for) for r in runs] == missed
    assert all(r.status == SUCCEEDED for r in runs), runs


def _bad_policies(**fields: Any) -> schedule_pb2.SchedulePolicies:
    return schedule_pb2.SchedulePolicies(**fields)


BAD = [
    (
        "end before start",
        dict(
            spec=cron_spec(
                FIVE_MINUTELY,
                start_time=ts(datetime.now(UTC) + timedelta(days=2)),
                end_time=ts(datetime.now(UTC) + timedelta(days=1)),
            )
        ),
        "schedule.spec.end_time",
        "after start_time",
    ),
    (
        "jitter longer than the period",
        dict(spec=cron_spec(FIVE_MINUTELY, jitter=dur(timedelta(minutes=6)))),
        "schedule.spec.jitter",
        "shortest period 5m",
    ),
    (
        "negative jitter",
        dict(spec=cron_spec(FIVE_MINUTELY, jitter=dur(timedelta(seconds=-1)))),
        "schedule.spec.jitter",
        "negative",
    ),
    (
        "negative max_runs",
        dict(spec=cron_spec(FIVE_MINUTELY, max_runs=-3)),
        "schedule.spec.max_runs",
        "-3",
    ),
    (
        "unknown overlap policy",
        dict(spec=cron_spec(FIVE_MINUTELY), policies=_bad_policies(overlap=9)),
        "schedule.policies.overlap",
        "unknown overlap policy 9",
    ),
    (
        "unknown misfire policy",
        dict(spec=cron_spec(FIVE_MINUTELY), policies=_bad_policies(misfire=7)),
        "schedule.policies.misfire",
        "unknown misfire policy 7",
    ),
    (
        "unknown DST gap policy",
        dict(
            spec=schedule_pb2.ScheduleSpec(
                cron=schedule_pb2.CronSpec(
                    expression="0 2 * * *",
                    dst=schedule_pb2.DstPolicy(gap=4),  # type: ignore[arg-type]
                )
            )
        ),
        "schedule.spec.cron.dst.gap",
        "unknown DST gap policy 4",
    ),
    (
        "catch-up window zero",
        dict(
            spec=cron_spec(FIVE_MINUTELY), policies=_bad_policies(catch_up_window=dur(timedelta(0)))
        ),
        "schedule.policies.catch_up_window",
        "positive",
    ),
    (
        "interval below 1s",
        dict(
            spec=schedule_pb2.ScheduleSpec(
                interval=schedule_pb2.IntervalSpec(every=dur(timedelta(milliseconds=500)))
            )
        ),
        "schedule.spec.interval.every",
        "at least 1s",
    ),
]


@pytest.mark.parametrize(("case", "fields", "field", "detail"), BAD, ids=[c[0] for c in BAD])
def test_bad_spec_and_policies_are_refused_and_nothing_is_stored(
    stack: Stack, case: str, fields: dict[str, Any], field: str, detail: str
) -> None:
    sid = f"bad-{uuid.uuid4().hex[:10]}"
    with pytest.raises(grpc.RpcError) as err:
        stack.api.CreateSchedule(
            scheduler_service_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.Schedule(name=case, handler="echo", **fields),
                schedule_id=sid,
            ),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = err.value.details() or ""
    assert message.startswith(field + ":"), message
    assert detail in message, message
    with pytest.raises(grpc.RpcError) as gone:
        get_schedule(stack, sid)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_preview_bad_input(stack: Stack) -> None:
    cases: list[tuple[scheduler_service_pb2.PreviewScheduleRequest, grpc.StatusCode, str]] = [
        (
            scheduler_service_pb2.PreviewScheduleRequest(spec=cron_spec(FIVE_MINUTELY), count=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "count:",
        ),
        (
            scheduler_service_pb2.PreviewScheduleRequest(spec=cron_spec(FIVE_MINUTELY), count=1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "count:",
        ),
        (
            scheduler_service_pb2.PreviewScheduleRequest(
                spec=cron_spec(FIVE_MINUTELY, jitter=dur(timedelta(hours=1)))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec.jitter:",
        ),
        (
            scheduler_service_pb2.PreviewScheduleRequest(spec=cron_spec("0 25 * * *")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "spec.cron.expression:",
        ),
        (
            scheduler_service_pb2.PreviewScheduleRequest(),
            grpc.StatusCode.INVALID_ARGUMENT,
            "target:",
        ),
        (
            scheduler_service_pb2.PreviewScheduleRequest(id="no-such-schedule"),
            grpc.StatusCode.NOT_FOUND,
            "no-such-schedule",
        ),
    ]
    for request, code, detail in cases:
        with pytest.raises(grpc.RpcError) as err:
            stack.api.PreviewSchedule(request, timeout=10)
        assert err.value.code() == code, (request, err.value.details())
        assert detail in (err.value.details() or ""), err.value.details()


def test_cli_preview_new_york_spring_forward(stack: Stack) -> None:
    api = ["--api", stack.config.api_target]
    argv = ["schedule", "preview", "--cron", "30 2 * * *", "--tz", "America/New_York"]
    argv += ["--after", "2026-03-07T12:00:00Z", "--count", "3"]
    result = stack.cli(*argv, "--json", *api)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [f["utc"] for f in data["fire_times"]] == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
        "2026-03-10T06:30:00Z",
    ]
    assert data["fire_times"][0]["local"] == "2026-03-08T03:00:00-04:00"
    assert data["fire_times"][0]["note"] == "dst_gap_shifted"
    assert data["skipped"] == []
    human = stack.cli(*argv, *api)
    assert human.returncode == 0, human.stderr
    assert human.stdout.splitlines()[0] == (
        "2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00  dst_gap_shifted"
    )
    skip = stack.cli(*argv, "--dst-gap", "SKIP", "--json", *api)
    assert skip.returncode == 0, skip.stderr
    data = json.loads(skip.stdout)
    assert data["fire_times"][0]["utc"] == "2026-03-09T06:30:00Z"
    assert [(k["local"], k["note"]) for k in data["skipped"]] == [
        ("2026-03-08T02:30:00", "dst_gap_skipped")
    ]
    bad = stack.cli("schedule", "preview", "--cron", "* * * * *", "--count", "-1", *api)
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "count" in bad.stderr


def test_cli_create_with_policies_and_resume_override(stack: Stack) -> None:
    api = ["--api", stack.config.api_target]
    sid = f"cli-{uuid.uuid4().hex[:8]}"
    created = stack.cli(
        "schedule", "create", "--name", sid, "--id", sid, "--handler", "echo",
        "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--jitter", "10m", "--max-runs", "5",
        "--dst-gap", "SKIP", "--overlap", "ALLOW", "--misfire", "FIRE_ALL",
        "--catch-up-window", "30m", "--max-catch-up", "7", "--max-attempts", "4",
        "--initial-backoff", "5s", "--backoff-multiplier", "3", "--max-backoff", "2m",
        "--retry-jitter", "0", "--json", *api,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    data = json.loads(created.stdout)
    assert data["spec"]["jitter"] == "600s" and data["spec"]["max_runs"] == 5
    assert data["spec"]["cron"]["dst"]["gap"] == "SKIP"
    assert data["policies"] == {
        "overlap": "ALLOW",
        "misfire": "FIRE_ALL",
        "catch_up_window": "1800s",
        "max_catch_up": 7,
        "retry": {
            "max_attempts": 4,
            "initial_backoff": "5s",
            "backoff_multiplier": 3.0,
            "max_backoff": "120s",
            "jitter": 0.0,
            "no_jitter": True,
        },
    }
    assert stack.cli("schedule", "pause", sid, *api).returncode == 0
    resumed = stack.cli("schedule", "resume", sid, "--misfire", "SKIP", "--json", *api)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "ACTIVE"
    preview = stack.cli("schedule", "preview", sid, "--count", "2", "--json", *api)
    assert preview.returncode == 0, preview.stderr
    times = json.loads(preview.stdout)["fire_times"]
    offset = jitter_offset(sid, timedelta(minutes=10))
    for entry in times:
        utc = datetime.fromisoformat(entry["utc"].replace("Z", "+00:00"))
        local = datetime.fromisoformat(entry["local"])
        assert local == utc
        assert (local - offset).astimezone(local.tzinfo).strftime("%H:%M:%S") == "03:00:00"
    delete_schedule(stack, sid)
