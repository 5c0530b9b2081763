"""The chaos verdict's arithmetic on hand-made inputs (pure logic, no services)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from tests.chaos.handlers import FAIL, OK
from tests.chaos.report import (
    ChaosSchedule,
    Execution,
    FaultWindow,
    LetterView,
    RunView,
    build_report,
    dlq_accounting,
    expected_slots,
    silent_workers,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _exec(sid: str, slot: datetime, lag: float, pid: int = 1) -> Execution:
    return Execution(
        run_id=f"{sid}@{slot:%H%M%S}",
        schedule_id=sid,
        scheduled_for=slot,
        attempt=1,
        start=slot.timestamp() + lag,
        handler=OK,
        pid=pid,
    )


def test_expected_slots_of_a_six_field_spec_are_seconds_first() -> None:
    slots = expected_slots("*/3 * * * * *", T0, T0 + timedelta(seconds=10))
    assert slots == [T0 + timedelta(seconds=s) for s in (0, 3, 6, 9)]


def test_lost_duplicates_stuck_and_quiet_lag() -> None:
    ok = ChaosSchedule(schedule_id="ok", handler=OK, cron="*/2 * * * * *")
    bad = ChaosSchedule(schedule_id="bad", handler=FAIL, cron="*/5 * * * * *")
    end = T0 + timedelta(seconds=10)
    slots = expected_slots(ok.cron, T0, end)  # 0, 2, 4, 6, 8
    executions = [_exec("ok", t, 0.1) for t in slots if t != slots[2]]
    executions.append(_exec("ok", slots[1], 5.0, pid=2))  # a duplicate of slot 2 s
    lost_run = RunView(
        run_id="ok@120004",
        schedule_id="ok",
        status="ENQUEUED",
        scheduled_for=slots[2],
        enqueue_time=slots[2],
        skip_reason="",
        error="",
    )
    report = build_report(
        schedules=[ok, bad],
        executions=executions,
        malformed_lines=0,
        runs=[lost_run],
        faults=[
            FaultWindow(
                kind="kill_worker",
                target="worker1",
                start=slots[3].timestamp(),
                end=slots[3].timestamp() + 0.5,
            )
        ],
        window_start=T0,
        window_end=end,
        stuck_before=end,
        stuck_bound_s=30,
        fault_grace_s=1.0,
        duration_s=10,
    )
    assert report.expected == 5 + 2
    assert [(x.schedule_id, x.slot) for x in report.lost] == [("ok", slots[2])]
    assert "ENQUEUED" in report.lost[0].scheduler_view
    assert [(x.schedule_id, x.handler) for x in report.unexecuted_other] == [("bad", FAIL)] * 2
    assert report.duplicate_executions == 1
    assert report.duplicated_runs == [("ok@120002", 2)]
    assert report.duplicates_by_fault == {"kill_worker": 1}  # started at 7 s: 6 s + 0.5 + 1
    assert [r.run_id for r in report.stuck] == ["ok@120004"]
    # Slot 6 s is inside the fault window: 0, 2 and 8 s are quiet, each counted once.
    assert [round(x, 3) for x in report.lag_quiet] == [0.1, 0.1, 0.1]
    # No dead letters were read: both slots of the failing schedule are missing from the DLQ.
    assert not report.dlq.ok and report.dlq.missing == [
        ("bad", T0),
        ("bad", T0 + timedelta(seconds=5)),
    ]
    assert "**lost** (slots of chaos.ok schedules never executed): **1**" in report.render()


def test_dlq_accounting_wants_exactly_the_hopeless_runs_after_max_attempts() -> None:
    bad = ChaosSchedule(schedule_id="bad", handler=FAIL, cron="*/5 * * * * *")
    ok = ChaosSchedule(schedule_id="ok", handler=OK, cron="*/5 * * * * *")
    end = T0 + timedelta(seconds=15)
    good = [
        LetterView(
            run_id=f"bad@{s}",
            schedule_id="bad",
            scheduled_for=T0 + timedelta(seconds=s),
            attempts=3,
        )
        for s in (0, 5)
    ]
    short = LetterView(
        run_id="bad@10", schedule_id="bad", scheduled_for=T0 + timedelta(seconds=10), attempts=2
    )
    stray = LetterView(run_id="ok@0", schedule_id="ok", scheduled_for=T0, attempts=3)
    before = LetterView(
        run_id="bad@-5", schedule_id="bad", scheduled_for=T0 - timedelta(seconds=5), attempts=1
    )
    check = dlq_accounting([bad, ok], [*good, short, stray, before], T0, end, attempts=3)
    assert (check.expected, check.found) == (3, 2)
    assert check.wrong_attempts == [short] and check.unexpected == [stray] and not check.missing
    assert not check.ok
    assert dlq_accounting([bad, ok], [*good, replace(short, attempts=3)], T0, end, 3).ok
    # A missing one is shown as ListRuns last saw it.
    between = RunView(
        run_id="bad@10",
        schedule_id="bad",
        status="TIMED_OUT",
        scheduled_for=T0 + timedelta(seconds=10),
        enqueue_time=None,
        skip_reason="",
        error="timed out after 2 s",
        attempt=2,
        next_attempt_time=T0 + timedelta(seconds=13),
    )
    check = dlq_accounting([bad], good, T0, end, 3, runs=[between])
    assert check.missing_runs == [between.describe()]
    assert "TIMED_OUT attempt 2" in check.render() and "next attempt due" in check.render()


def test_a_retry_overdue_is_stuck() -> None:
    """A run between attempts whose next attempt was due long ago: no dispatcher fired it."""
    bad = ChaosSchedule(schedule_id="bad", handler=FAIL, cron="*/5 * * * * *")
    end = T0 + timedelta(seconds=10)

    def waiting(slot_s: int, due_s: int) -> RunView:
        return RunView(
            run_id=f"bad@{slot_s}",
            schedule_id="bad",
            status="FAILED",
            scheduled_for=T0 + timedelta(seconds=slot_s),
            enqueue_time=T0 + timedelta(seconds=slot_s),
            skip_reason="",
            error="boom",
            attempt=2,
            next_attempt_time=T0 + timedelta(seconds=due_s),
        )

    report = build_report(
        schedules=[bad],
        executions=[],
        malformed_lines=0,
        runs=[waiting(0, 3), waiting(5, 12)],
        faults=[],
        window_start=T0,
        window_end=end,
        stuck_before=end,
        stuck_bound_s=30,
        fault_grace_s=1.0,
        duration_s=10,
    )
    assert [r.run_id for r in report.stuck] == ["bad@0"]


def test_duplicates_are_told_apart_by_their_message() -> None:
    """The same enqueue time again is one message run twice (by the same worker or another);
    a new one is the run fired twice."""
    ok = ChaosSchedule(schedule_id="ok", handler=OK, cron="*/2 * * * * *")
    end = T0 + timedelta(seconds=10)
    slots = expected_slots(ok.cron, T0, end)
    first = [replace(_exec("ok", t, 0.1), enqueued=f"{t:%S}.0") for t in slots]
    again = [
        replace(first[0], start=first[0].start + 1),
        replace(first[1], start=first[1].start + 1, pid=2),
        replace(first[2], start=first[2].start + 1, enqueued="refired"),
        replace(first[3], start=first[3].start + 1, enqueued=""),
    ]
    report = build_report(
        schedules=[ok],
        executions=[*first, *again],
        malformed_lines=0,
        runs=[],
        faults=[],
        window_start=T0,
        window_end=end,
        stuck_before=end,
        stuck_bound_s=30,
        fault_grace_s=1.0,
        duration_s=10,
    )
    assert report.duplicate_executions == 4
    assert report.duplicates_by_cause == {
        "same message again (same worker)": 1,
        "same message again (another worker)": 1,
        "run fired again": 1,
        "unknown": 1,
    }
    assert "same message again (another worker) 1" in report.render()


def test_a_worker_that_stopped_executing_while_its_peers_went_on_is_silent() -> None:
    """The wedge of 2026-12-07: one worker executed nothing after a Kafka restart while the
    others took its partitions; a worker restarted late but executing again is not silent."""
    executions = [
        *(_exec("a", T0 + timedelta(seconds=s), 0.1, pid=10) for s in range(0, 40)),
        *(_exec("b", T0 + timedelta(seconds=s), 0.1, pid=20) for s in range(0, 100)),
        *(_exec("c", T0 + timedelta(seconds=s), 0.1, pid=30) for s in range(80, 100)),
    ]
    workers = {"worker1": 10, "worker2": 20, "worker3": 30, "worker4": 40}
    assert silent_workers(executions, workers, silent_s=30) == [
        "worker1 (pid 10, last execution 60 s before the run's last)",
        "worker4 (pid 40, never executed)",
    ]
    assert silent_workers(executions, {"worker2": 20, "worker3": 30}, silent_s=30) == []
    assert silent_workers([], workers, silent_s=30) == []
    report = build_report(
        schedules=[],
        executions=executions,
        malformed_lines=0,
        runs=[],
        faults=[],
        window_start=T0,
        window_end=T0 + timedelta(seconds=100),
        stuck_before=T0,
        stuck_bound_s=30,
        fault_grace_s=1.0,
        duration_s=100,
        workers={"worker1": 10, "worker2": 20},
    )
    assert report.silent_workers == ["worker1 (pid 10, last execution 60 s before the run's last)"]
    assert "**silent workers** (running at the end, no execution in the last 30 s" in (
        report.render()
    )
