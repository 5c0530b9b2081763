"""The firing benchmark's measured window starts once every schedule has fired once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from loadtest.firing import SHAPES, new_schedule, warm_window_start

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
