"""Backfills and dependencies end to end: api -> Cassandra -> dispatcher -> Kafka -> worker."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from bucketer.keys import shard_of
from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.backfill import backfill_id_for
from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SUCCEEDED = schedule_pb2.RUN_STATUS_SUCCEEDED
FAILED = schedule_pb2.RUN_STATUS_FAILED
TERMINAL = {SUCCEEDED, FAILED}


def _ts(t: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(t)
    return out


def _dt(t: Timestamp) -> datetime:
    return t.ToDatetime(tzinfo=UTC)


def _create(stack: Stack, schedule_id: str = "", **fields: Any) -> schedule_pb2.Schedule:
    return stack.api.CreateSchedule(
        scheduler_service_pb2.CreateScheduleRequest(
            schedule=schedule_pb2.Schedule(**fields), schedule_id=schedule_id
        ),
        timeout=10,
    )


def _cron(expression: str) -> schedule_pb2.ScheduleSpec:
    return schedule_pb2.ScheduleSpec(cron=schedule_pb2.CronSpec(expression=expression))


def _runs(stack: Stack, schedule_id: str) -> list[schedule_pb2.Run]:
    out: list[schedule_pb2.Run] = []
    token = ""
    while True:
        resp = stack.api.ListRuns(
            scheduler_service_pb2.ListRunsRequest(
                schedule_id=schedule_id, page_size=1000, page_token=token
            ),
            timeout=10,
        )
        out.extend(resp.runs)
        token = resp.next_page_token
        if not token:
            return out


def _backfill(
    stack: Stack, schedule_id: str, start: datetime, end: datetime, concurrency: int = 0
) -> schedule_pb2.Backfill:
    return stack.api.BackfillSchedule(
        scheduler_service_pb2.BackfillScheduleRequest(
            id=schedule_id, start_time=_ts(start), end_time=_ts(end), concurrency=concurrency
        ),
        timeout=30,
    )


def _get_backfill(stack: Stack, backfill_id: str) -> schedule_pb2.Backfill:
    return stack.api.GetBackfill(
        scheduler_service_pb2.GetBackfillRequest(backfill_id=backfill_id), timeout=10
    )


def _delete(stack: Stack, schedule_id: str) -> None:
    stack.api.DeleteSchedule(
        scheduler_service_pb2.DeleteScheduleRequest(id=schedule_id), timeout=10
    )


def _pause(stack: Stack, schedule_id: str) -> None:
    stack.api.PauseSchedule(scheduler_service_pb2.PauseScheduleRequest(id=schedule_id), timeout=10)


def _wait(
    what: str, check: Callable[[], bool], timeout: float, stack: Stack, poll: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(
                f"{what}: not reached after {timeout} s\n--- dispatcher\n"
                f"{stack.tail('dispatcher')}\n--- worker\n{stack.tail('worker')}"
            )
        time.sleep(poll)


class _Refused:
    """What an RPC that failed answered."""

    def __init__(self, error: grpc.RpcError) -> None:
        self.code: grpc.StatusCode = error.code()
        self.details: str = error.details() or ""


def _error(call: Callable[[], object]) -> _Refused:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return _Refused(err.value)


def _edges(stack: Stack, schedule_id: str = "") -> set[tuple[str, str]]:
    resp = stack.api.ListDependencies(
        scheduler_service_pb2.ListDependenciesRequest(schedule_id=schedule_id), timeout=30
    )
    return {(e.upstream_id, e.downstream_id) for e in resp.edges}


# --- backfill ---------------------------------------------------------------------------------


def test_backfill_of_300_slots_completes_while_live_schedule_keeps_its_lag(stack: Stack) -> None:
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(hours=5)
    target = _create(
        stack, "bf-target", name="backfilled-minutely", handler="echo", spec=_cron("* * * * *")
    )
    # The live schedule shares the backfill timer's shard: the dispatcher handles both in the
    # same scan loop, the hardest case for the live schedule's lag.
    shard = shard_of(backfill_id_for(target.id, start, end), stack.config.shard_count)
    live_id = next(
        f"bf-live-{n}"
        for n in range(1000)
        if shard_of(f"bf-live-{n}", stack.config.shard_count) == shard
    )
    live = _create(
        stack, live_id, name="live-every-second", handler="echo", spec=_cron("* * * * * *")
    )
    time.sleep(3)  # the live schedule is firing before the backfill starts
    began = datetime.now(UTC)

    b = _backfill(stack, target.id, start, end, concurrency=20)
    assert (b.total, b.concurrency, b.schedule_id) == (300, 20, target.id)
    assert b.enqueued <= 20

    most_unfinished = 0

    def finished() -> bool:
        nonlocal most_unfinished
        p = _get_backfill(stack, b.backfill_id)
        most_unfinished = max(most_unfinished, p.enqueued - p.done)
        return p.done == p.total

    _wait("backfill done", finished, timeout=180, stack=stack)
    took = (datetime.now(UTC) - began).total_seconds()
    ended = datetime.now(UTC)

    progress = _get_backfill(stack, b.backfill_id)
    assert (progress.total, progress.enqueued, progress.done) == (300, 300, 300)
    assert most_unfinished <= 20, f"{most_unfinished} backfill runs unfinished at once"

    runs = [r for r in _runs(stack, target.id) if r.backfill_id == b.backfill_id]
    assert len(runs) == 300
    assert len({r.run_id for r in runs}) == 300
    assert all(r.status == SUCCEEDED and r.run_id.endswith("~bf") for r in runs)
    slots = sorted(_dt(r.scheduled_for) for r in runs)
    assert slots == [start + timedelta(minutes=i) for i in range(300)]

    # Asked again: the same backfill, nothing new enqueued.
    again = _backfill(stack, target.id, start, end, concurrency=20)
    assert again.backfill_id == b.backfill_id
    assert (again.total, again.enqueued, again.done) == (300, 300, 300)
    time.sleep(3)
    after = [r for r in _runs(stack, target.id) if r.backfill_id]
    assert len(after) == 300 and {r.run_id for r in after} == {r.run_id for r in runs}

    # The live schedule kept firing on time throughout.
    _pause(stack, live.id)
    during = [
        r
        for r in _runs(stack, live.id)
        if began <= _dt(r.scheduled_for) <= ended and r.HasField("enqueue_time")
    ]
    lags = [(_dt(r.enqueue_time) - _dt(r.scheduled_for)).total_seconds() for r in during]
    slots_during = int((ended - began).total_seconds())
    print(
        f"backfill: 300 slots at concurrency 20 done in {took:.1f} s; live every-second "
        f"schedule: {len(lags)} runs during it, enqueue lag max {max(lags):.3f} s, "
        f"mean {sum(lags) / len(lags):.3f} s"
    )
    assert len(lags) >= slots_during - 2, f"live schedule fired {len(lags)} of ~{slots_during}"
    assert max(lags) < 2.0
    _delete(stack, live.id)
    _delete(stack, target.id)


def test_backfill_bad_input_names_the_field(stack: Stack) -> None:
    s = _create(stack, name="bf-bad-input", handler="echo", spec=_cron("* * * * *"))
    now = datetime.now(UTC).replace(microsecond=0)
    cases: list[tuple[str, Callable[[], object], grpc.StatusCode, str]] = [
        (
            "empty",
            lambda: _backfill(stack, s.id, now - timedelta(hours=1), now - timedelta(hours=1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "end_time:",
        ),
        (
            "no slot inside",
            lambda: _backfill(
                stack,
                s.id,
                now.replace(second=10) - timedelta(hours=1),
                now.replace(second=20) - timedelta(hours=1),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "end_time:",
        ),
        (
            "reversed",
            lambda: _backfill(stack, s.id, now - timedelta(hours=1), now - timedelta(hours=2)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "end_time:",
        ),
        (
            "too long a span",
            lambda: _backfill(stack, s.id, now - timedelta(days=400), now),
            grpc.StatusCode.INVALID_ARGUMENT,
            "end_time:",
        ),
        (
            "too many slots",
            lambda: _backfill(stack, s.id, now - timedelta(days=8), now),
            grpc.StatusCode.INVALID_ARGUMENT,
            "end_time:",
        ),
        (
            "in the future",
            lambda: _backfill(stack, s.id, now - timedelta(hours=1), now + timedelta(hours=1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "end_time:",
        ),
        (
            "missing start",
            lambda: stack.api.BackfillSchedule(
                scheduler_service_pb2.BackfillScheduleRequest(id=s.id, end_time=_ts(now)),
                timeout=10,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "start_time:",
        ),
        (
            "negative concurrency",
            lambda: _backfill(stack, s.id, now - timedelta(hours=1), now, concurrency=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "concurrency:",
        ),
        (
            "concurrency too high",
            lambda: _backfill(stack, s.id, now - timedelta(hours=1), now, concurrency=1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "concurrency:",
        ),
        (
            "unknown schedule",
            lambda: _backfill(stack, "no-such-schedule", now - timedelta(hours=1), now),
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
        (
            "unknown backfill",
            lambda: _get_backfill(stack, "no-such-backfill"),
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
    ]
    for name, call, code, prefix in cases:
        err = _error(call)
        print(f"{name}: {err.code.name}: {err.details}")
        assert err.code == code, (name, err.details)
        assert err.details.startswith(prefix), (name, err.details)
    _delete(stack, s.id)


# --- dependencies ------------------------------------------------------------------------------


def test_downstream_runs_once_per_upstream_success_and_never_after_a_failure(
    stack: Stack,
) -> None:
    ok = _create(stack, "dep-up-ok", name="up-ok", handler="echo", spec=_cron("* * * * * *"))
    bad = _create(
        stack,
        "dep-up-fail",
        name="up-fail",
        handler="fail",
        payload=json.dumps({"error": "upstream broke"}).encode(),
        spec=_cron("* * * * * *"),
    )
    down = _create(stack, "dep-down", name="down", handler="e2e.record", after=[ok.id, bad.id])
    assert down.state == schedule_pb2.SCHEDULE_STATE_ACTIVE
    assert not down.HasField("next_fire_time")
    assert list(down.after) == sorted([ok.id, bad.id])

    _wait(
        "3 upstream successes",
        lambda: sum(r.status == SUCCEEDED for r in _runs(stack, ok.id)) >= 3,
        timeout=20,
        stack=stack,
    )
    _wait(
        "2 upstream failures",
        lambda: sum(r.status == FAILED for r in _runs(stack, bad.id)) >= 2,
        timeout=20,
        stack=stack,
    )
    _pause(stack, ok.id)
    _pause(stack, bad.id)

    def settled() -> bool:
        ups = _runs(stack, ok.id)
        if not all(r.status in TERMINAL | {schedule_pb2.RUN_STATUS_SKIPPED} for r in ups):
            return False
        wanted = {r.run_id for r in ups if r.status == SUCCEEDED}
        downs = _runs(stack, down.id)
        return {r.origin_run_id for r in downs} == wanted and all(
            r.status == SUCCEEDED for r in downs
        )

    _wait("downstream caught up", settled, timeout=30, stack=stack)
    time.sleep(2)  # nothing more may follow
    ups = _runs(stack, ok.id)
    succeeded = {r.run_id: r for r in ups if r.status == SUCCEEDED}
    downs = _runs(stack, down.id)
    per_origin = Counter(r.origin_run_id for r in downs)
    assert set(per_origin) == set(succeeded)
    assert set(per_origin.values()) == {1}, per_origin
    failed = {r.run_id for r in _runs(stack, bad.id) if r.status == FAILED}
    assert failed and not failed & set(per_origin)
    for r in downs:
        upstream = succeeded[r.origin_run_id]
        assert r.scheduled_for == upstream.scheduled_for
        assert r.run_id.startswith(f"{down.id}@") and "~d" in r.run_id
    lags = [
        (_dt(r.enqueue_time) - _dt(succeeded[r.origin_run_id].finish_time)).total_seconds()
        for r in downs
    ]
    print(
        f"dependency: {len(succeeded)} upstream successes -> {len(downs)} downstream runs, "
        f"{len(failed)} failures -> 0; enqueued max {max(lags):.3f} s after the upstream finished"
    )

    assert _edges(stack, down.id) == {(ok.id, down.id), (bad.id, down.id)}
    assert _edges(stack, ok.id) == {(ok.id, down.id)}
    assert {(ok.id, down.id), (bad.id, down.id)} <= _edges(stack)

    err = _error(lambda: _delete(stack, ok.id))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "dep-down" in err.details
    _delete(stack, down.id)
    assert _edges(stack, ok.id) == set()
    _delete(stack, ok.id)
    _delete(stack, bad.id)


def test_dependency_input_errors_name_the_field(stack: Stack) -> None:
    up = _create(stack, "dep-check-up", name="up", handler="echo", spec=_cron("0 0 1 1 *"))
    cases: list[tuple[str, Callable[[], object], str]] = [
        (
            "unknown upstream",
            lambda: _create(stack, name="x", handler="echo", after=["nope-not-there"]),
            "schedule.after: unknown schedule 'nope-not-there'",
        ),
        (
            "self reference",
            lambda: _create(stack, "dep-self", name="x", handler="echo", after=["dep-self"]),
            "schedule.after: cycle dep-self -> dep-self",
        ),
        (
            "foreign schedule",
            lambda: _create(stack, name="x", tenant="other", handler="echo", after=[up.id]),
            "schedule.after: 'dep-check-up' is a foreign schedule",
        ),
        (
            "neither spec nor after",
            lambda: _create(stack, name="x", handler="echo"),
            "schedule.spec:",
        ),
    ]
    for name, call, prefix in cases:
        err = _error(call)
        print(f"{name}: {err.code.name}: {err.details}")
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (name, err.details)
        assert err.details.startswith(prefix), (name, err.details)
    missing = _error(
        lambda: stack.api.GetSchedule(
            scheduler_service_pb2.GetScheduleRequest(id="dep-self"), timeout=10
        )
    )
    assert missing.code == grpc.StatusCode.NOT_FOUND  # nothing half-written
    assert _edges(stack, up.id) == set()
    _delete(stack, up.id)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_backfill_deps_and_create_after(stack: Stack) -> None:
    up = stack.cli(
        "schedule",
        "create",
        "--name",
        "cli-up",
        "--handler",
        "echo",
        "--cron",
        "0 * * * *",
        "--id",
        "cli-dep-up",
        "--json",
        check=True,
    )
    assert json.loads(up.stdout)["id"] == "cli-dep-up"
    down = stack.cli(
        "schedule",
        "create",
        "--name",
        "cli-down",
        "--handler",
        "echo",
        "--after",
        "cli-dep-up",
        "--id",
        "cli-dep-down",
        "--json",
        check=True,
    )
    assert json.loads(down.stdout)["after"] == ["cli-dep-up"]

    deps = json.loads(stack.cli("schedule", "deps", "cli-dep-up", "--json", check=True).stdout)
    assert deps == {"edges": [{"upstream_id": "cli-dep-up", "downstream_id": "cli-dep-down"}]}
    table = stack.cli("schedule", "deps", "cli-dep-down", check=True).stdout
    assert "cli-dep-up" in table and "UPSTREAM" in table

    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=3)
    started = stack.cli(
        "schedule",
        "backfill",
        "cli-dep-up",
        "--from",
        start.isoformat(),
        "--to",
        end.isoformat(),
        "--concurrency",
        "2",
        "--json",
        check=True,
    )
    b = json.loads(started.stdout)
    assert (b["total"], b["concurrency"], b["schedule_id"]) == (3, 2, "cli-dep-up")

    def done() -> bool:
        got = stack.cli("backfill", "get", b["backfill_id"], "--json", check=True)
        return bool(json.loads(got.stdout)["done"] == 3)

    _wait("cli backfill done", done, timeout=60, stack=stack, poll=1.0)
    human = stack.cli("backfill", "get", b["backfill_id"], check=True).stdout
    assert "done" in human and "3" in human

    bad = stack.cli(
        "schedule",
        "backfill",
        "cli-dep-up",
        "--from",
        end.isoformat(),
        "--to",
        start.isoformat(),
    )
    assert bad.returncode == 1 and "INVALID_ARGUMENT: end_time:" in bad.stderr

    refused = stack.cli("schedule", "delete", "cli-dep-up")
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr
    stack.cli("schedule", "delete", "cli-dep-down", check=True)
    stack.cli("schedule", "delete", "cli-dep-up", check=True)
