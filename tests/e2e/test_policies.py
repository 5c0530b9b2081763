"""Overlap and misfire policies over the real stack; every slot that does not run is recorded."""

from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SUCCEEDED = schedule_pb2.RUN_STATUS_SUCCEEDED
SKIPPED = schedule_pb2.RUN_STATUS_SKIPPED
EXECUTED = {SUCCEEDED, schedule_pb2.RUN_STATUS_RUNNING, schedule_pb2.RUN_STATUS_FAILED}


def _create(stack: Stack, cron: str, handler: str, payload: Any = None, **policies: Any) -> str:
    s = stack.api.CreateSchedule(
        scheduler_service_pb2.CreateScheduleRequest(
            schedule=schedule_pb2.Schedule(
                name=f"policy-{cron}",
                handler=handler,
                payload=json.dumps(payload).encode() if payload is not None else b"",
                spec=schedule_pb2.ScheduleSpec(cron=schedule_pb2.CronSpec(expression=cron)),
                policies=schedule_pb2.SchedulePolicies(**policies),
            )
        ),
        timeout=10,
    )
    return s.id


def _runs(stack: Stack, sid: str) -> list[schedule_pb2.Run]:
    resp = stack.api.ListRuns(
        scheduler_service_pb2.ListRunsRequest(schedule_id=sid, page_size=1000), timeout=10
    )
    return sorted(resp.runs, key=lambda r: (r.scheduled_for.ToDatetime(), r.run_id))


def _t(ts: Any) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


def _pause(stack: Stack, sid: str) -> None:
    stack.api.PauseSchedule(scheduler_service_pb2.PauseScheduleRequest(id=sid), timeout=10)


def _wait_finished(stack: Stack, sid: str, timeout: float = 20) -> list[schedule_pb2.Run]:
    deadline = time.monotonic() + timeout
    while True:
        runs = _runs(stack, sid)
        if all(r.status in (SUCCEEDED, SKIPPED) for r in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def _assert_no_overlap(executed: list[schedule_pb2.Run]) -> None:
    by_start = sorted(executed, key=lambda r: _t(r.start_time))
    for prev, nxt in itertools.pairwise(by_start):
        assert _t(nxt.start_time) >= _t(prev.finish_time) - timedelta(milliseconds=50), (
            f"{nxt.run_id} started before {prev.run_id} finished"
        )


def test_overlap_skip_allow_and_buffer_one(stack: Stack) -> None:
    sleep = {"seconds": 3.5}
    skip = _create(stack, "*/2 * * * * *", "sleep", sleep, overlap=schedule_pb2.OVERLAP_POLICY_SKIP)
    allow = _create(
        stack, "*/2 * * * * *", "sleep", sleep, overlap=schedule_pb2.OVERLAP_POLICY_ALLOW
    )
    buffer = _create(
        stack, "*/2 * * * * *", "sleep", sleep, overlap=schedule_pb2.OVERLAP_POLICY_BUFFER_ONE
    )
    time.sleep(13)
    for sid in (skip, allow, buffer):
        _pause(stack, sid)
    time.sleep(1)

    runs = _wait_finished(stack, skip)
    executed = [r for r in runs if r.status in EXECUTED]
    skipped = [r for r in runs if r.status == SKIPPED]
    assert executed and skipped, runs
    assert all(r.skip_reason == "overlap" for r in skipped)
    _assert_no_overlap([r for r in executed if r.status == SUCCEEDED])

    runs = _wait_finished(stack, allow)
    assert not [r for r in runs if r.status == SKIPPED]
    done = sorted((r for r in runs if r.status == SUCCEEDED), key=lambda r: _t(r.start_time))
    assert any(_t(b.start_time) < _t(a.finish_time) for a, b in itertools.pairwise(done)), (
        "ALLOW runs never overlapped"
    )

    runs = _wait_finished(stack, buffer, timeout=30)
    executed = [r for r in runs if r.status == SUCCEEDED]
    _assert_no_overlap(executed)
    held = [r for r in executed if _t(r.start_time) - _t(r.scheduled_for) > timedelta(seconds=1)]
    assert held, "no run was held back behind a running one"
    assert all(r.skip_reason == "overlap" for r in runs if r.status == SKIPPED)


def test_misfire_policies_after_the_dispatchers_were_down(stack: Stack) -> None:
    ids = {
        "SKIP": _create(stack, "* * * * * *", "echo", misfire=schedule_pb2.MISFIRE_POLICY_SKIP),
        "FIRE_ONCE": _create(
            stack, "* * * * * *", "echo", misfire=schedule_pb2.MISFIRE_POLICY_FIRE_ONCE
        ),
        "FIRE_ALL": _create(
            stack,
            "* * * * * *",
            "echo",
            misfire=schedule_pb2.MISFIRE_POLICY_FIRE_ALL,
            catch_up_window=Duration(seconds=600),
        ),
    }
    time.sleep(2)
    stack.kill("dispatcher", sig=15)  # SIGTERM: shards released, the next one claims at once
    stopped = datetime.now(UTC)
    time.sleep(8)
    restarted = datetime.now(UTC)
    stack.start("dispatcher", "dispatcher")
    time.sleep(6)
    for sid in ids.values():
        _pause(stack, sid)
    time.sleep(1.5)

    # Slots that were certainly missed: due after the stop, well before the restart.
    lo, hi = stopped + timedelta(seconds=1.5), restarted - timedelta(seconds=1)
    for policy, sid in ids.items():
        runs = _wait_finished(stack, sid)
        window = [r for r in runs if lo <= _t(r.scheduled_for) <= hi and "~" not in r.run_id]
        seconds = {_t(r.scheduled_for).replace(microsecond=0) for r in window}
        expected = {
            lo.replace(microsecond=0) + timedelta(seconds=i + 1)
            for i in range(int((hi - lo).total_seconds()) - 1)
        }
        assert expected <= seconds, (
            f"{policy}: slots dropped silently: {sorted(expected - seconds)}"
        )
        ran = [r for r in window if r.status == SUCCEEDED]
        skipped = [r for r in window if r.status == SKIPPED]
        assert all(r.skip_reason == "misfire" for r in skipped), policy
        if policy == "FIRE_ALL":
            assert not skipped and ran, f"FIRE_ALL skipped {len(skipped)}"
        else:
            assert not ran and skipped, f"{policy}: {len(ran)} missed slots ran"
        after = [r for r in runs if _t(r.scheduled_for) > hi and r.status == SUCCEEDED]
        if policy == "FIRE_ONCE":
            assert after, "FIRE_ONCE: no run stood for the missed slots"
