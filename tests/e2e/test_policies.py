"""Overlap and misfire policies over the real stack; every slot that does not run is recorded."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from cronscale.v1 import schedule_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    FAILED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    create_with_policies,
    cron_spec,
    dt,
    pause_schedule,
    wait_for_runs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXECUTED = {SUCCEEDED, RUNNING, FAILED}


def _create(stack: Stack, cron: str, handler: str, payload: Any = None, **policies: Any) -> str:
    """A schedule on ``cron`` named after it, with ``policies``; returns its id."""
    return create_with_policies(
        stack,
        name=f"policy-{cron}",
        handler=handler,
        spec=cron_spec(cron),
        payload=payload,
        **policies,
    ).id


def _wait_finished(stack: Stack, sid: str, timeout: float = 20) -> list[schedule_pb2.Run]:
    """The runs once all have SUCCEEDED or been SKIPPED, or as they are after ``timeout`` s."""
    return wait_for_runs(
        stack,
        sid,
        lambda rs: all(r.status in (SUCCEEDED, SKIPPED) for r in rs),
        timeout,
        order="slot_id",
        poll=0.5,
        fail=False,
    )


def _assert_no_overlap(executed: list[schedule_pb2.Run]) -> None:
    by_start = sorted(executed, key=lambda r: dt(r.start_time))
    for prev, nxt in itertools.pairwise(by_start):
        assert dt(nxt.start_time) >= dt(prev.finish_time) - timedelta(milliseconds=50), (
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
        pause_schedule(stack, sid)
    time.sleep(1)

    runs = _wait_finished(stack, skip)
    executed = [r for r in runs if r.status in EXECUTED]
    skipped = [r for r in runs if r.status == SKIPPED]
    assert executed and skipped, runs
    assert all(r.skip_reason == "overlap" for r in skipped)
    _assert_no_overlap([r for r in executed if r.status == SUCCEEDED])

    runs = _wait_finished(stack, allow)
    assert not [r for r in runs if r.status == SKIPPED]
    done = sorted((r for r in runs if r.status == SUCCEEDED), key=lambda r: dt(r.start_time))
    assert any(dt(b.start_time) < dt(a.finish_time) for a, b in itertools.pairwise(done)), (
        "ALLOW runs never overlapped"
    )

    runs = _wait_finished(stack, buffer, timeout=30)
    executed = [r for r in runs if r.status == SUCCEEDED]
    _assert_no_overlap(executed)
    held = [r for r in executed if dt(r.start_time) - dt(r.scheduled_for) > timedelta(seconds=1)]
    assert held, "no run was held back behind a running one"
    assert all(r.skip_reason == "overlap" for r in runs if r.status == SKIPPED)


def test_overlap_skip_holds_slots_while_a_failed_run_waits_for_its_retry(stack: Stack) -> None:
    """Every run's first attempt fails and is retried 4 s later: the run is in progress until
    its retry ends, so the slots due during the backoff are skipped, not run beside it."""
    sid = _create(
        stack,
        "*/2 * * * * *",
        "e2e.fail_until",
        {"succeed_at": 2},
        overlap=schedule_pb2.OVERLAP_POLICY_SKIP,
        retry=schedule_pb2.RetryPolicy(
            max_attempts=2, initial_backoff=Duration(seconds=4), no_jitter=True
        ),
    )
    time.sleep(14)
    pause_schedule(stack, sid)
    runs = _wait_finished(stack, sid, timeout=30)
    executed = [r for r in runs if r.status in EXECUTED]
    skipped = [r for r in runs if r.status == SKIPPED]
    assert executed and skipped, runs
    assert all(r.skip_reason == "overlap" for r in skipped)
    retried = [r for r in executed if r.status == SUCCEEDED and r.attempt == 2]
    assert retried, runs
    # A run's start and finish are its last attempt's: the next run started after it ended.
    _assert_no_overlap([r for r in executed if r.status == SUCCEEDED])
    # Nor did any slot run between a retried run's first attempt (at its slot) and its end.
    for r in retried:
        inside = [
            e.run_id
            for e in executed
            if dt(r.scheduled_for) < dt(e.scheduled_for) < dt(r.finish_time)
        ]
        assert not inside, f"{inside} ran while {r.run_id} waited for its retry"


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
        pause_schedule(stack, sid)
    time.sleep(1.5)

    # Slots that were certainly missed: due after the stop, well before the restart.
    lo, hi = stopped + timedelta(seconds=1.5), restarted - timedelta(seconds=1)
    for policy, sid in ids.items():
        runs = _wait_finished(stack, sid)
        window = [r for r in runs if lo <= dt(r.scheduled_for) <= hi and "~" not in r.run_id]
        seconds = {dt(r.scheduled_for).replace(microsecond=0) for r in window}
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
        after = [r for r in runs if dt(r.scheduled_for) > hi and r.status == SUCCEEDED]
        if policy == "FIRE_ONCE":
            assert after, "FIRE_ONCE: no run stood for the missed slots"
