"""PreviewSchedule's domain: the fire times the dispatcher will fire, and the DST-skipped ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from scheduler.errors import InvalidArgument
from scheduler.firing import FiringPlan, plan_fire
from scheduler.model import Schedule, ScheduleSpec, SpecKind
from scheduler.preview import (
    DEFAULT_COUNT,
    MAX_COUNT,
    Preview,
    _chain_start,
    dry_run_schedule,
    preview,
    preview_count,
)
from scheduler.timers import FireTimer
from scheduler.timespec import (
    NOTE_GAP_SHIFTED,
    NOTE_GAP_SKIPPED,
    NOTE_OVERLAP_SECOND,
    GapPolicy,
    OverlapPolicy,
    jitter_offset,
)

NY = "America/New_York"


def _utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def _cron(expr: str, tz: str = "UTC", **fields: object) -> ScheduleSpec:
    return ScheduleSpec(kind=SpecKind.CRON, cron=expr, timezone=tz, **fields)  # type: ignore[arg-type]


def _dry(expr: str, tz: str = NY, **fields: object) -> Schedule:
    return dry_run_schedule(_cron(expr, tz, **fields))


def _utcs(p: Preview) -> list[str]:
    return [e.utc.isoformat().replace("+00:00", "Z") for e in p.fire_times]


def test_fixed_time_in_spring_gap_shifts_to_the_end_of_the_gap() -> None:
    p = preview(_dry("30 2 * * *"), _utc(2026, 3, 7, 12), 3)
    assert _utcs(p) == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
    first = p.fire_times[0]
    assert first.local == "2026-03-08T03:00:00-04:00"
    assert first.note == NOTE_GAP_SHIFTED
    assert [e.note for e in p.fire_times[1:]] == ["", ""]
    assert p.fire_times[1].local == "2026-03-09T02:30:00-04:00"
    assert p.skipped == [] and p.timezone == NY


def test_gap_skip_leaves_the_time_out_and_lists_it_as_skipped() -> None:
    p = preview(_dry("30 2 * * *", dst_gap=GapPolicy.SKIP), _utc(2026, 3, 7, 12), 3)
    assert _utcs(p) == ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z", "2026-03-11T06:30:00Z"]
    assert len(p.skipped) == 1
    skipped = p.skipped[0]
    # Recorded at the instant the clock jumped 02:00 -> 03:00 EDT, with the wall time lost.
    assert skipped.utc == _utc(2026, 3, 8, 7)
    assert skipped.local == "2026-03-08T02:30:00"
    assert skipped.note == NOTE_GAP_SKIPPED


def test_fixed_time_on_fall_back_day() -> None:
    # 02:30 is after the repeated hour (01:00-02:00): it happens once, in EST.
    p = preview(_dry("30 2 * * *"), _utc(2026, 10, 31, 12), 2)
    assert _utcs(p) == ["2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]
    assert p.fire_times[0].local == "2026-11-01T02:30:00-05:00"
    # 01:30 is repeated: once at its first occurrence by default, both with BOTH.
    once = preview(_dry("30 1 * * *"), _utc(2026, 10, 31, 12), 2)
    assert _utcs(once) == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    both = preview(_dry("30 1 * * *", dst_overlap=OverlapPolicy.BOTH), _utc(2026, 10, 31, 12), 3)
    assert _utcs(both) == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]
    assert [e.note for e in both.fire_times] == ["", NOTE_OVERLAP_SECOND, ""]


def test_wildcard_job_follows_the_real_clock_across_fall_back() -> None:
    p = preview(_dry("*/30 * * * *"), _utc(2026, 11, 1, 4, 45), 6)
    assert [(e.local, e.note) for e in p.fire_times] == [
        ("2026-11-01T01:00:00-04:00", ""),
        ("2026-11-01T01:30:00-04:00", ""),
        ("2026-11-01T01:00:00-05:00", NOTE_OVERLAP_SECOND),
        ("2026-11-01T01:30:00-05:00", NOTE_OVERLAP_SECOND),
        ("2026-11-01T02:00:00-05:00", ""),
        ("2026-11-01T02:30:00-05:00", ""),
    ]
    assert _utcs(p)[:4] == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:30:00Z",
    ]


def test_wildcard_job_across_spring_forward_skips_the_gap_and_says_so() -> None:
    p = preview(_dry("*/30 * * * *"), _utc(2026, 3, 8, 6, 15), 3)
    assert [e.local for e in p.fire_times] == [
        "2026-03-08T01:30:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-08T03:30:00-04:00",
    ]
    assert [(e.local, e.note) for e in p.skipped] == [
        ("2026-03-08T02:00:00", NOTE_GAP_SKIPPED),
        ("2026-03-08T02:30:00", NOTE_GAP_SKIPPED),
    ]


def test_stored_schedule_times_carry_its_jitter_offset() -> None:
    window = timedelta(minutes=10)
    for sid in ("nightly-1", "nightly-2", "billing.eu"):
        s = Schedule(schedule_id=sid, handler="echo", spec=_cron("0 0 * * *", jitter=window))
        p = preview(s, _utc(2026, 6, 1, 12), 3)
        offset = jitter_offset(sid, window)
        assert [e.utc for e in p.fire_times] == [_utc(2026, 6, d) + offset for d in (2, 3, 4)]
        if offset.microseconds:
            assert "." in p.fire_times[0].local  # milliseconds shown when jittered


def test_a_slot_whose_jittered_time_is_still_ahead_is_listed() -> None:
    sid = "jittered"
    window = timedelta(minutes=10)
    offset = jitter_offset(sid, window)
    assert offset > timedelta(seconds=1)
    s = Schedule(schedule_id=sid, handler="echo", spec=_cron("0 0 * * *", jitter=window))
    # Just after midnight: the midnight slot has not fired yet (it fires at midnight + offset).
    after = _utc(2026, 6, 2) + offset - timedelta(seconds=1)
    p = preview(s, after, 2)
    assert [e.utc for e in p.fire_times] == [_utc(2026, 6, 2) + offset, _utc(2026, 6, 3) + offset]
    # ... but not when the schedule's timer chain began after that slot.
    p = preview(s, after, 1, chain_start=_utc(2026, 6, 2, 0, 0, 0, 500))
    assert [e.utc for e in p.fire_times] == [_utc(2026, 6, 3) + offset]


def test_dry_run_has_no_jitter_offset_but_validates_the_window() -> None:
    s = _dry("0 0 * * *", "UTC", jitter=timedelta(hours=1))
    assert s.spec.jitter == timedelta(0)
    assert _utcs(preview(s, _utc(2026, 6, 1, 12), 1)) == ["2026-06-02T00:00:00Z"]
    with pytest.raises(InvalidArgument) as err:
        _dry("* * * * *", "UTC", jitter=timedelta(minutes=5))
    assert err.value.field == "spec.jitter"


def test_bounds_and_max_runs() -> None:
    start, end = _utc(2026, 6, 10), _utc(2026, 6, 12, 0, 0, 0)
    s = _dry("0 0 * * *", "UTC", start_time=start, end_time=end)
    # Starts at the start bound (inclusive), ends at the end bound (inclusive).
    p = preview(s, _utc(2026, 6, 1), 10)
    assert _utcs(p) == ["2026-06-10T00:00:00Z", "2026-06-11T00:00:00Z", "2026-06-12T00:00:00Z"]
    limited = _dry("0 0 * * *", "UTC", max_runs=3)
    assert len(preview(limited, _utc(2026, 6, 1), 10).fire_times) == 3
    assert len(preview(limited, _utc(2026, 6, 1), 10, fired=2).fire_times) == 1
    assert preview(limited, _utc(2026, 6, 1), 10, fired=5).fire_times == []


def test_count_bounds() -> None:
    assert preview_count(0) == DEFAULT_COUNT == 10
    assert preview_count(1000) == MAX_COUNT
    for bad in (-1, 1001):
        with pytest.raises(InvalidArgument) as err:
            preview_count(bad)
        assert err.value.field == "count"


def test_interval_and_one_shot() -> None:
    anchor = _utc(2026, 6, 1, 0, 0, 0)
    s = dry_run_schedule(
        ScheduleSpec(kind=SpecKind.INTERVAL, every=timedelta(seconds=90), anchor=anchor)
    )
    p = preview(s, _utc(2026, 6, 1, 0, 1), 2)
    assert _utcs(p) == ["2026-06-01T00:01:30Z", "2026-06-01T00:03:00Z"]
    once = dry_run_schedule(ScheduleSpec(kind=SpecKind.ONCE, at=_utc(2026, 6, 2)))
    assert _utcs(preview(once, _utc(2026, 6, 1), 5)) == ["2026-06-02T00:00:00Z"]
    assert preview(once, _utc(2026, 6, 3), 5).fire_times == []


@pytest.mark.parametrize(
    ("expr", "tz", "created", "gap"),
    [
        ("*/30 * * * *", NY, _utc(2026, 3, 7, 22, 10), None),
        ("*/30 * * * *", NY, _utc(2026, 10, 31, 22, 10), None),
        ("30 2 * * *", NY, _utc(2026, 3, 5, 22, 10), None),
        ("30 2 * * *", NY, _utc(2026, 3, 5, 22, 10), GapPolicy.SKIP),
        ("15,45 2 * * *", "Europe/Berlin", _utc(2026, 3, 27), GapPolicy.SKIP),
        ("0 */2 * * *", "Australia/Lord_Howe", _utc(2026, 4, 3), None),
    ],
)
def test_preview_is_what_the_dispatcher_fires(
    expr: str, tz: str, created: datetime, gap: GapPolicy | None
) -> None:
    """Walk the dispatcher's own timer chain (plan_fire on time, from the first timer create
    puts) and compare every fired slot and every DST-skipped record with the preview."""
    s = Schedule(
        schedule_id=f"chain-{expr}-{tz}",
        handler="echo",
        spec=_cron(expr, tz, dst_gap=gap, jitter=timedelta(minutes=7)),
    )
    count = 12
    p = preview(s, created, count, chain_start=created)
    fired: list[datetime] = []
    skipped: list[datetime] = []
    first = preview(s, created, 1, chain_start=created).fire_times[0]
    timer = FireTimer(
        schedule_id=s.schedule_id,
        generation=s.generation,
        slot=first.utc - jitter_offset(s.schedule_id, s.spec.jitter),
        scheduled_for=first.utc,
    )
    while len(fired) < count:
        plan = FiringPlan()
        plan_fire(s, timer, timer.scheduled_for, plan, 64)
        fired += [run.scheduled_for for _s, run in plan.enqueue]
        if len(fired) < count:
            skipped += [r.scheduled_for for r in plan.skipped if r.skip_reason == "dst"]
        nxt: Timer = plan.next_timers[0]
        timer = FireTimer.from_timer(nxt)
    assert [e.utc for e in p.fire_times] == fired
    assert [e.utc for e in p.skipped] == skipped


def test_chain_start_of_a_stored_schedule() -> None:
    created = _utc(2026, 6, 2, 0, 0, 0, 123_000)  # as Cassandra hands it back: milliseconds
    s = Schedule(schedule_id="x", handler="echo", spec=_cron("* * * * * *"), update_time=created)
    # The whole millisecond counts as before the chain (the exact instant was within it).
    assert _chain_start(s, created) == created + timedelta(microseconds=999)
    assert _chain_start(s, _utc(2026, 6, 3)) == created + timedelta(microseconds=999)
    # A preview of the past shows the spec's times.
    assert _chain_start(s, created - timedelta(seconds=5)) is None
    p = preview(s, created - timedelta(seconds=2), 3, chain_start=_chain_start(s, created))
    assert [e.utc for e in p.fire_times] == [_utc(2026, 6, 2, 0, 0, n) for n in (1, 2, 3)]
