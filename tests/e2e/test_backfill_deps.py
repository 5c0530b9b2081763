"""Backfills and dependencies end to end: api -> Cassandra -> dispatcher -> Kafka -> worker."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from bucketer.keys import shard_of
from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.backfill import backfill_id_for
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    FAILED,
    SKIPPED,
    SUCCEEDED,
    TERMINAL,
    create_schedule,
    cron_spec,
    delete_schedule,
    dt,
    get_schedule,
    json_payload,
    list_runs,
    pause_schedule,
    refusal,
    ts,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _backfill(
    stack: Stack, schedule_id: str, start: datetime, end: datetime, concurrency: int = 0
) -> schedule_pb2.Backfill:
    return stack.api.BackfillSchedule(
        scheduler_service_pb2.BackfillScheduleRequest(
            id=schedule_id, start_time=ts(start), end_time=ts(end), concurrency=concurrency
        ),
        timeout=30,
    )


def _get_backfill(stack: Stack, backfill_id: str) -> schedule_pb2.Backfill:
    return stack.api.GetBackfill(
        scheduler_service_pb2.GetBackfillRequest(backfill_id=backfill_id), timeout=10
    )


def _edges(stack: Stack, schedule_id: str = "") -> set[tuple[str, str]]:
    resp = stack.api.ListDependencies(
        scheduler_service_pb2.ListDependenciesRequest(schedule_id=schedule_id), timeout=30
    )
    return {(e.upstream_id, e.downstream_id) for e in resp.edges}


# --- backfill ---------------------------------------------------------------------------------


def test_backfill_of_300_slots_completes_while_live_schedule_keeps_its_lag(stack: Stack) -> None:
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(hours=5)
    target = create_schedule(
        stack, "bf-target", name="backfilled-minutely", handler="echo", spec=cron_spec("* * * * *")
    )
    # The live schedule shares the backfill timer's shard: the dispatcher handles both in the
    # same scan loop, the hardest case for the live schedule's lag.
    shard = shard_of(backfill_id_for(target.id, start, end), stack.config.shard_count)
    live_id = next(
        f"bf-live-{n}"
        for n in range(1000)
        if shard_of(f"bf-live-{n}", stack.config.shard_count) == shard
    )
    live = create_schedule(
        stack, live_id, name="live-every-second", handler="echo", spec=cron_spec("* * * * * *")
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

    wait_until(stack, finished, 180, "backfill done")
    took = (datetime.now(UTC) - began).total_seconds()
    ended = datetime.now(UTC)

    progress = _get_backfill(stack, b.backfill_id)
    assert (progress.total, progress.enqueued, progress.done) == (300, 300, 300)
    assert most_unfinished <= 20, f"{most_unfinished} backfill runs unfinished at once"

    runs = [r for r in list_runs(stack, target.id) if r.backfill_id == b.backfill_id]
    assert len(runs) == 300
    assert len({r.run_id for r in runs}) == 300
    assert all(r.status == SUCCEEDED and r.run_id.endswith("~bf") for r in runs)
    slots = sorted(dt(r.scheduled_for) for r in runs)
    assert slots == [start + timedelta(minutes=i) for i in range(300)]

    # Asked again: the same backfill, nothing new enqueued.
    again = _backfill(stack, target.id, start, end, concurrency=20)
    assert again.backfill_id == b.backfill_id
    assert (again.total, again.enqueued, again.done) == (300, 300, 300)
    time.sleep(3)
    after = [r for r in list_runs(stack, target.id) if r.backfill_id]
    assert len(after) == 300 and {r.run_id for r in after} == {r.run_id for r in runs}

    # The live schedule kept firing on time throughout.
    pause_schedule(stack, live.id)
    during = [
        r
        for r in list_runs(stack, live.id)
        if began <= dt(r.scheduled_for) <= ended and r.HasField("enqueue_time")
    ]
    lags = [(dt(r.enqueue_time) - dt(r.scheduled_for)).total_seconds() for r in during]
    slots_during = int((ended - began).total_seconds())
    print(
        f"backfill: 300 slots at concurrency 20 done in {took:.1f} s; live every-second "
        f"schedule: {len(lags)} runs during it, enqueue lag max {max(lags):.3f} s, "
        f"mean {sum(lags) / len(lags):.3f} s"
    )
    # What the slots without an enqueue were (a SKIPPED one: its previous run not yet reported
    # ended, under the overlap policy), to tell a slow box from a slot not fired.
    others = [
        f"{r.scheduled_for.ToJsonString()} {schedule_pb2.RunStatus.Name(r.status)}"
        for r in list_runs(stack, live.id)
        if began <= dt(r.scheduled_for) <= ended and not r.HasField("enqueue_time")
    ]
    assert len(lags) >= slots_during - 2, (
        f"live schedule fired {len(lags)} of ~{slots_during}; its other slots: {others}"
    )
    assert max(lags) < 2.0
    delete_schedule(stack, live.id)
    delete_schedule(stack, target.id)


def test_backfill_bad_input_names_the_field(stack: Stack) -> None:
    s = create_schedule(stack, name="bf-bad-input", handler="echo", spec=cron_spec("* * * * *"))
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
                scheduler_service_pb2.BackfillScheduleRequest(id=s.id, end_time=ts(now)),
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
        err = refusal(call)
        print(f"{name}: {err.code.name}: {err.details}")
        assert err.code == code, (name, err.details)
        assert err.details.startswith(prefix), (name, err.details)
    delete_schedule(stack, s.id)


# --- dependencies ------------------------------------------------------------------------------


def test_downstream_runs_once_per_upstream_success_and_never_after_a_failure(
    stack: Stack,
) -> None:
    ok = create_schedule(
        stack, "dep-up-ok", name="up-ok", handler="echo", spec=cron_spec("* * * * * *")
    )
    bad = create_schedule(
        stack,
        "dep-up-fail",
        name="up-fail",
        handler="fail",
        payload=json_payload({"error": "upstream broke"}),
        spec=cron_spec("* * * * * *"),
        # Every slot fires though the failed runs before it wait for their retries (under
        # SKIP a run waiting for its retry holds the slots after it): failures keep coming.
        policies=schedule_pb2.SchedulePolicies(overlap=schedule_pb2.OVERLAP_POLICY_ALLOW),
    )
    down = create_schedule(
        stack, "dep-down", name="down", handler="e2e.record", after=[ok.id, bad.id]
    )
    assert down.state == schedule_pb2.SCHEDULE_STATE_ACTIVE
    assert not down.HasField("next_fire_time")
    assert list(down.after) == sorted([ok.id, bad.id])

    wait_until(
        stack,
        lambda: sum(r.status == SUCCEEDED for r in list_runs(stack, ok.id)) >= 3,
        20,
        "3 upstream successes",
    )
    wait_until(
        stack,
        lambda: sum(r.status == FAILED for r in list_runs(stack, bad.id)) >= 2,
        20,
        "2 upstream failures",
    )
    pause_schedule(stack, ok.id)
    pause_schedule(stack, bad.id)

    # A dependency applies to the upstream runs enqueued once it exists: a run already in
    # flight when `down` was linked may not fire it (the run message says whether anything
    # follows its end; docs/concepts/backfill-and-dependencies.md). Allow 1 s for the link.
    linked = dt(down.create_time) + timedelta(seconds=1)

    def settled() -> bool:
        ups = list_runs(stack, ok.id)
        if not all(r.status in TERMINAL | {SKIPPED} for r in ups):
            return False
        wanted = {r.run_id for r in ups if r.status == SUCCEEDED and dt(r.enqueue_time) > linked}
        downs = list_runs(stack, down.id)
        return wanted <= {r.origin_run_id for r in downs} and all(
            r.status == SUCCEEDED for r in downs
        )

    wait_until(stack, settled, 30, "downstream caught up")
    time.sleep(2)  # nothing more may follow
    ups = list_runs(stack, ok.id)
    succeeded = {r.run_id: r for r in ups if r.status == SUCCEEDED}
    after_link = {rid for rid, r in succeeded.items() if dt(r.enqueue_time) > linked}
    downs = list_runs(stack, down.id)
    per_origin = Counter(r.origin_run_id for r in downs)
    assert after_link <= set(per_origin) <= set(succeeded)
    assert set(per_origin.values()) == {1}, per_origin
    failed = {r.run_id for r in list_runs(stack, bad.id) if r.status == FAILED}
    assert failed and not failed & set(per_origin)
    for r in downs:
        upstream = succeeded[r.origin_run_id]
        assert r.scheduled_for == upstream.scheduled_for
        assert r.run_id.startswith(f"{down.id}@") and "~d" in r.run_id
    lags = [
        (dt(r.enqueue_time) - dt(succeeded[r.origin_run_id].finish_time)).total_seconds()
        for r in downs
    ]
    print(
        f"dependency: {len(succeeded)} upstream successes -> {len(downs)} downstream runs, "
        f"{len(failed)} failures -> 0; enqueued max {max(lags):.3f} s after the upstream finished"
    )

    assert _edges(stack, down.id) == {(ok.id, down.id), (bad.id, down.id)}
    assert _edges(stack, ok.id) == {(ok.id, down.id)}
    assert {(ok.id, down.id), (bad.id, down.id)} <= _edges(stack)

    err = refusal(lambda: delete_schedule(stack, ok.id))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "dep-down" in err.details
    delete_schedule(stack, down.id)
    assert _edges(stack, ok.id) == set()
    delete_schedule(stack, ok.id)
    delete_schedule(stack, bad.id)


def test_dependency_input_errors_name_the_field(stack: Stack) -> None:
    up = create_schedule(
        stack, "dep-check-up", name="up", handler="echo", spec=cron_spec("0 0 1 1 *")
    )
    cases: list[tuple[str, Callable[[], object], str]] = [
        (
            "unknown upstream",
            lambda: create_schedule(stack, name="x", handler="echo", after=["nope-not-there"]),
            "schedule.after: unknown schedule 'nope-not-there'",
        ),
        (
            "self reference",
            lambda: create_schedule(
                stack, "dep-self", name="x", handler="echo", after=["dep-self"]
            ),
            "schedule.after: cycle dep-self -> dep-self",
        ),
        (
            "foreign schedule",
            lambda: create_schedule(stack, name="x", tenant="other", handler="echo", after=[up.id]),
            "schedule.after: unknown schedule 'dep-check-up'",
        ),
        (
            "neither spec nor after",
            lambda: create_schedule(stack, name="x", handler="echo"),
            "schedule.spec:",
        ),
    ]
    for name, call, prefix in cases:
        err = refusal(call)
        print(f"{name}: {err.code.name}: {err.details}")
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (name, err.details)
        assert err.details.startswith(prefix), (name, err.details)
    missing = refusal(
        lambda: stack.api.GetSchedule(
            scheduler_service_pb2.GetScheduleRequest(id="dep-self"), timeout=10
        )
    )
    assert missing.code == grpc.StatusCode.NOT_FOUND  # nothing half-written
    assert _edges(stack, up.id) == set()
    delete_schedule(stack, up.id)


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

    wait_until(stack, done, 60, "cli backfill done", poll=1.0)
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


def test_update_replaces_after_and_refuses_a_cycle(stack: Stack) -> None:
    x = create_schedule(stack, "dep-upd-x", name="x", handler="echo", spec=cron_spec("0 0 1 1 *"))
    # y fires on its own times too, so it stays valid once its dependency is dropped.
    y = create_schedule(
        stack, "dep-upd-y", name="y", handler="echo", spec=cron_spec("0 0 1 1 *"), after=[x.id]
    )
    assert _edges(stack, x.id) == {(x.id, y.id)}

    def update(s: schedule_pb2.Schedule, after: list[str]) -> schedule_pb2.Schedule:
        changed = schedule_pb2.Schedule()
        changed.CopyFrom(get_schedule(stack, s.id))
        del changed.after[:]
        changed.after.extend(after)
        return stack.api.UpdateSchedule(
            scheduler_service_pb2.UpdateScheduleRequest(schedule=changed), timeout=10
        )

    # x after y would close the loop x -> y -> x: refused, nothing changed.
    err = refusal(lambda: update(x, [y.id]))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details.startswith("schedule.after: cycle"), err.details
    assert list(get_schedule(stack, x.id).after) == []
    # Dropping the dependency removes the edge.
    update(y, [])
    assert _edges(stack, x.id) == set()
    delete_schedule(stack, x.id)
    delete_schedule(stack, y.id)
