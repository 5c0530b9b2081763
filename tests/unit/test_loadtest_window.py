"""The firing benchmark's measured window starts once every schedule has fired once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from loadtest.firing import (
    SHAPES,
    account_herd,
    herd_lines,
    herd_second,
    new_schedule,
    queue_wait,
    skipped_by_policy,
    skipped_text,
    warm_window_start,
)
from loadtest.tally import Execution, parse_line
from scheduler.model import Run, RunStatus, ScheduleSpec, SkipReason, SpecKind, run_id_for
from scheduler.slots import next_slot

NOW = datetime(2026, 12, 4, 13, 0, 20, tzinfo=UTC)


def test_the_window_starts_after_every_first_slot_of_the_spread() -> None:
    schedules = [
        new_schedule("w", SHAPES["spread"], NOW, NOW + timedelta(seconds=60), 64)[0]
        for _ in range(500)
    ]
    lo = warm_window_start(schedules, NOW)
    firsts = [s.next_fire_time for s in schedules if s.next_fire_time]
    assert len(firsts) == 500 and max(firsts) < lo
    assert lo.second == 0 and lo.microsecond == 0
    assert lo - max(firsts) <= timedelta(minutes=1)


def test_a_herd_is_measured_from_its_second_minute() -> None:
    schedules = [new_schedule("h", SHAPES["herd"], NOW, NOW + timedelta(seconds=60), 64)[0]]
    first = schedules[0].next_fire_time
    assert first == datetime(2026, 12, 4, 13, 2, tzinfo=UTC)
    assert warm_window_start(schedules, NOW) == first + timedelta(minutes=1)


def test_the_processes_get_at_least_a_minute_to_start() -> None:
    assert warm_window_start([], NOW) == datetime(2026, 12, 4, 13, 2, tzinfo=UTC)


def test_a_one_off_herd_is_due_once_a_whole_minute_after_its_import() -> None:
    at = herd_second(NOW, 1_000_000)  # 250 s of import + 150 s, then the next whole minute
    assert at == datetime(2026, 12, 4, 13, 8, tzinfo=UTC)
    daily = ScheduleSpec(kind=SpecKind.CRON, cron=f"0 {at.minute} {at.hour} * * *")
    s, _timer = new_schedule("o", daily, NOW, NOW + timedelta(seconds=60), 64)
    assert s.next_fire_time == at
    again = next_slot(s, at)
    assert again is not None and again.at == at + timedelta(days=1)  # not again in the run


def test_a_herd_is_accounted_from_the_handlers_record(tmp_path: Path) -> None:
    at = herd_second(NOW, 3)
    daily = ScheduleSpec(kind=SpecKind.CRON, cron=f"0 {at.minute} {at.hour} * * *")
    herd = [new_schedule("o", daily, NOW, NOW + timedelta(seconds=60), 64)[0] for _ in range(3)]
    ids = [run_id_for(s.schedule_id, at) for s in herd]
    t0 = at.timestamp()
    (tmp_path / "tally-1.log").write_text(
        # The first line as written before the enqueue time was (three fields).
        f"{ids[0]} 1 {t0 + 0.5}\n{ids[1]} 1 {t0 + 4.0} {t0 + 3.0}\n{ids[1]} 1 {t0 + 9.0} -\n"
        f"other 1 {t0} -\n"
    )
    lost, twice, lags, waits = account_herd(herd, tmp_path, at)
    assert lost == [ids[2]] and twice == {ids[1]: 2} and lags == [0.5, 4.0]
    assert waits == [1.0]  # started 1 s after its enqueue; the other line has no enqueue time
    timeline = [(t0 + 1, 0.2), (t0 + 3, 0.6), (t0 + 9, 5.0)]
    lines = herd_lines(at, 3, lost, twice, lags, timeline, waits, [(t0 + 3, 0.5), (t0 + 9, 4.0)])
    assert "2 ran, **1 lost**, **1 ran more than once**" in lines[0]
    assert "the last 4.0 s after the second" in lines[0]
    assert lines[0].endswith("of it after the produce (the run queue: Kafka and the worker) "
                             "p50 1.00 s, p99 1.00 s")  # fmt: skip
    # Only the other slots due while the herd drained (within 4 s of it) count beside it.
    assert lines[1].startswith("- the 2 other slots due while it drained: lag p50 0.60 s")
    assert lines[1].endswith("p50 0.50 s, p99 0.50 s")


def test_a_runs_wait_after_its_enqueue_counts_from_its_slot_if_planned_ahead() -> None:
    # Fire-ahead: enqueued 0.3 s before its slot, the message held until then.
    assert queue_wait(Execution("r", 1, 100.5, 99.7), 100.0) == 0.5
    assert queue_wait(Execution("r", 1, 100.5, 100.25), 100.0) == 0.25
    assert queue_wait(Execution("r", 1, 100.5, None), 100.0) is None


def test_a_runs_wait_in_the_queue_counts_from_its_produce_when_the_record_says() -> None:
    # Planned 0.3 s ahead, held, produced 0.12 s after its slot (a release late), started
    # 0.5 s after it: 0.38 s of its lag was the run queue's, 0.12 s the dispatcher's.
    e = parse_line("r 1 100.500000 99.700000 100.120")
    assert e == Execution("r", 1, 100.5, 99.7, 100.12)
    assert queue_wait(e, 100.0) == 100.5 - 100.12
    assert parse_line("r 1 100.500000 99.700000 -") == Execution("r", 1, 100.5, 99.7, None)
    assert parse_line("r 1 100.5 - - extra") is None


def test_a_slot_the_scheduler_skipped_by_policy_is_told_apart_from_a_lost_one() -> None:
    # A slot no handler ran is lost unless its run row says SKIPPED: a schedule whose slot
    # came due more than the misfire threshold late ran once for all its missed slots, and
    # recorded the others as skipped (misfire).
    at = NOW.replace(second=0)
    ids = [run_id_for("s", at + timedelta(minutes=m)) for m in range(4)]

    def run(run_id: str, status: RunStatus, why: str = "") -> Run:
        return Run(run_id=run_id, schedule_id="s", scheduled_for=at, status=status, skip_reason=why)

    runs = {
        ids[0]: run(ids[0], RunStatus.SKIPPED, SkipReason.MISFIRE),
        ids[1]: run(ids[1], RunStatus.SKIPPED, SkipReason.MISFIRE),
        ids[2]: run(ids[2], RunStatus.ENQUEUED),  # enqueued, never started: lost
    }
    skipped = skipped_by_policy(ids, runs)
    assert skipped == {ids[0]: "misfire", ids[1]: "misfire"}  # ids[3]: no row at all, lost
    assert skipped_text(skipped).startswith(
        ", **2 skipped by their schedules' policy** (misfire: 2; recorded as SKIPPED runs, e.g."
    )
    assert skipped_text({}) == ""
    lines = herd_lines(at, 5, [ids[3]], {}, [1.0, 2.0], [], skipped=skipped)
    assert "2 ran, **1 lost**, **2 skipped by their schedules' policy**" in lines[0]
