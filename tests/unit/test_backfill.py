"""Backfills: range and concurrency validation, slots, ids, and the dispatcher's step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from bucketer.keys import shard_of
from scheduler.backfill import (
    BackfillRow,
    RunProgress,
    backfill_id_for,
    backfill_run_id,
    backfill_slots,
    plan_step,
    progress_of,
    validate_concurrency,
    validate_range,
)
from scheduler.errors import InvalidArgument
from scheduler.model import (
    STALE_RUN,
    RunStatus,
    Schedule,
    ScheduleSpec,
    SpecKind,
    is_backfill_run,
    parse_run_id,
    run_id_for,
)
from scheduler.timers import BackfillTimer

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)


def _cron(expr: str, *, jitter: timedelta = timedelta(0), tz: str = "UTC") -> Schedule:
    return Schedule(
        schedule_id="s1",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron=expr, timezone=tz, jitter=jitter),
    )


@pytest.mark.parametrize(
    ("start", "end", "field", "words"),
    [
        (None, NOW, "start_time", "is required"),
        (NOW - H, None, "end_time", "is required"),
        (NOW - H, NOW - 2 * H, "end_time", "before start_time"),
        (NOW - H, NOW - H, "end_time", "empty"),
        (NOW - H, NOW + H, "end_time", "in the future"),
        (NOW - timedelta(days=367), NOW, "end_time", "at most 366 days"),
    ],
)
def test_bad_ranges_name_the_field(
    start: datetime | None, end: datetime | None, field: str, words: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_range(start, end, NOW)
    assert err.value.field == field
    assert words in err.value.problem


def test_a_good_range_comes_back_in_utc() -> None:
    start = (NOW - 2 * H).astimezone(ZoneInfo("Europe/Berlin"))
    got = validate_range(start, NOW, NOW)
    assert got == (NOW - 2 * H, NOW)
    assert got[0].tzinfo is UTC
    assert validate_range(NOW - timedelta(days=366), NOW, NOW)[0] == NOW - timedelta(days=366)


@pytest.mark.parametrize(("value", "want"), [(0, 10), (1, 1), (20, 20), (1000, 1000)])
def test_concurrency(value: int, want: int) -> None:
    assert validate_concurrency(value) == want


@pytest.mark.parametrize("value", [-1, 1001, -1000])
def test_bad_concurrency(value: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_concurrency(value)
    assert err.value.field == "concurrency"


def test_slots_are_those_of_the_range_start_inclusive_end_exclusive() -> None:
    s = _cron("*/15 * * * *")
    start = NOW - H
    slots = backfill_slots(s, start, NOW)
    assert slots == [start + timedelta(minutes=15 * i) for i in range(4)]


def test_slots_carry_the_schedule_jitter_like_live_firings() -> None:
    s = _cron("0 * * * *", jitter=timedelta(minutes=10))
    slots = backfill_slots(s, NOW - 3 * H, NOW)
    offsets = {t - t.replace(minute=0, second=0, microsecond=0) for t in slots}
    assert len(slots) == 3 and len(offsets) == 1
    assert timedelta(0) <= offsets.pop() < timedelta(minutes=10)


def test_slots_follow_the_zone_and_dst() -> None:
    # 02:30 Berlin does not exist on 2026-03-29; the fixed-time default shifts it to 03:00.
    s = _cron("30 2 * * *", tz="Europe/Berlin")
    start = datetime(2026, 3, 27, tzinfo=UTC)
    slots = backfill_slots(s, start, start + timedelta(days=4))
    assert [t.isoformat() for t in slots] == [
        "2026-03-27T01:30:00+00:00",
        "2026-03-28T01:30:00+00:00",
        "2026-03-29T01:00:00+00:00",
        "2026-03-30T00:30:00+00:00",
    ]


def test_a_range_without_slots_is_refused() -> None:
    with pytest.raises(InvalidArgument) as err:
        backfill_slots(_cron("0 0 1 1 *"), NOW - H, NOW)
    assert err.value.field == "end_time" and "no slot" in err.value.problem
    dependency_only = Schedule(
        schedule_id="d", handler="echo", spec=ScheduleSpec(kind=SpecKind.NONE)
    )
    with pytest.raises(InvalidArgument):
        backfill_slots(dependency_only, NOW - H, NOW)


def test_more_than_10000_slots_are_refused() -> None:
    s = _cron("* * * * *")
    assert len(backfill_slots(s, NOW - timedelta(minutes=10_000), NOW)) == 10_000
    with pytest.raises(InvalidArgument) as err:
        backfill_slots(s, NOW - timedelta(minutes=10_001), NOW)
    assert err.value.field == "end_time" and "more than 10000" in err.value.problem


def test_ids_are_deterministic_and_distinct() -> None:
    a = backfill_id_for("s1", NOW - H, NOW)
    assert (
        a
        == backfill_id_for("s1", NOW - H, NOW)
        == "s1@bf-20260310T110000.000Z-20260310T120000.000Z"
    )
    assert a != backfill_id_for("s1", NOW - 2 * H, NOW)
    assert a != backfill_id_for("s2", NOW - H, NOW)
    rid = backfill_run_id("s1", NOW)
    assert rid == "s1@20260310T120000.000Z~bf" and is_backfill_run(rid)
    assert rid != run_id_for("s1", NOW) and not is_backfill_run(run_id_for("s1", NOW))
    ref = parse_run_id(rid)
    assert (ref.schedule_id, ref.scheduled_for, ref.suffix) == ("s1", NOW, "bf")


def test_backfill_timer_round_trip() -> None:
    t = BackfillTimer(backfill_id="s1@bf-x-y", tick=7, fire_at=NOW)
    timer = t.to_timer(64)
    assert timer.kind == "backfill" and timer.timer_id == "s1@bf-x-y#7"
    assert timer.shard == shard_of("s1@bf-x-y", 64)
    assert BackfillTimer.from_timer(timer) == t


def _row(n: int, *, concurrency: int = 3, enqueued: int = 0, inflight: int = 0) -> BackfillRow:
    slots = tuple(NOW - timedelta(minutes=n - i) for i in range(n))
    return BackfillRow(
        backfill_id="b",
        schedule_id="s1",
        start_time=slots[0],
        end_time=NOW,
        slots=slots,
        concurrency=concurrency,
        enqueued=enqueued,
        inflight=frozenset(slots[enqueued - inflight : enqueued]),
    )


def _p(status: RunStatus, seen: datetime = NOW) -> RunProgress:
    return RunProgress(status=status, last_seen=seen)


def test_first_step_enqueues_up_to_the_concurrency() -> None:
    row = _row(10)
    step = plan_step(row, {}, NOW)
    assert step.enqueue == row.slots[:3]
    assert step.inflight == frozenset(row.slots[:3])
    assert (step.enqueued, step.done, step.more) == (3, 0, True)


def test_finished_runs_free_their_slots() -> None:
    row = _row(10, enqueued=3, inflight=3)
    a, b, c = row.slots[:3]
    step = plan_step(
        row, {a: _p(RunStatus.SUCCEEDED), b: _p(RunStatus.FAILED), c: _p(RunStatus.RUNNING)}, NOW
    )
    assert step.enqueue == row.slots[3:5]
    assert step.inflight == frozenset({c, *row.slots[3:5]})
    assert (step.enqueued, step.done, step.more) == (5, 2, True)


def test_enqueued_runs_waiting_in_kafka_keep_holding_their_slots() -> None:
    row = _row(10, enqueued=3, inflight=3)
    long_ago = NOW - 10 * STALE_RUN
    step = plan_step(row, dict.fromkeys(row.slots[:3], _p(RunStatus.ENQUEUED, long_ago)), NOW)
    assert step.enqueue == ()
    assert (step.enqueued, step.more) == (3, True)


def test_a_silent_running_run_stops_holding_its_slot() -> None:
    row = _row(10, enqueued=3, inflight=3)
    a, b, c = row.slots[:3]
    stale = NOW - STALE_RUN - timedelta(seconds=1)
    progress = {a: _p(RunStatus.RUNNING, stale), b: _p(RunStatus.RUNNING), c: _p(RunStatus.RUNNING)}
    step = plan_step(row, progress, NOW)
    assert step.enqueue == row.slots[3:4]
    assert a in step.inflight  # still watched: if it finishes after all, it counts as done


def test_last_step_stops_when_everything_finished() -> None:
    row = _row(4, enqueued=4, inflight=2)
    progress = dict.fromkeys(row.slots[2:], _p(RunStatus.SUCCEEDED))
    step = plan_step(row, progress, NOW)
    assert step.enqueue == () and step.inflight == frozenset()
    assert (step.enqueued, step.done, step.more) == (4, 2, False)


def test_progress_folds_in_the_runs_in_flight() -> None:
    row = BackfillRow(**{**_row(10, enqueued=6, inflight=3).__dict__, "done": 3})
    a, b, c = sorted(row.inflight)
    got = progress_of(row, {a: _p(RunStatus.SUCCEEDED), b: _p(RunStatus.RUNNING), c: None})
    assert (got.total, got.enqueued, got.done, got.concurrency) == (10, 6, 4, 3)
