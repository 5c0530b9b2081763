"""A brute-force oracle for cron across DST transitions.

Independently of scheduler.timespec's algorithm, walk every UTC minute of the 48 h around a
real transition, decide from the stated rules (using only zoneinfo and a tiny field matcher)
whether that instant fires, and compare with what ``fire_times`` / ``next_after`` return.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduler.timespec import (
    NOTE_GAP_SHIFTED,
    NOTE_OVERLAP_SECOND,
    GapPolicy,
    OverlapPolicy,
    parse_cron,
)

MINUTE = timedelta(minutes=1)

# zone -> (local dates of its transitions, expressions to try there)
ZONES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "America/New_York": (
        ("2026-03-08", "2026-11-01"),
        ("30 2 * * *", "0,30 2 * * *", "*/15 * * * *", "0 * * * *", "30 1 * * *", "0 2,3 * * *"),
    ),
    "Europe/Berlin": (("2026-03-29", "2026-10-25"), ("30 2 * * *", "*/15 * * * *", "0 3 * * *")),
    "Australia/Lord_Howe": (
        ("2026-10-04", "2026-04-05"),
        ("15 2 * * *", "*/15 * * * *", "45 1 * * *", "0,15,30,45 2 * * *"),
    ),
    "Pacific/Chatham": (("2026-09-27", "2026-04-05"), ("0 3 * * *", "0 * * * *", "50 2 * * *")),
    "America/Sao_Paulo": (
        ("2018-11-04", "2018-02-17"),
        ("0 0 * * *", "30 23 * * *", "*/20 * * * *"),
    ),
}
CASES = [
    (zone, day, expression)
    for zone, (days, expressions) in ZONES.items()
    for day in days
    for expression in expressions
]
POLICIES = [
    (None, None),
    (GapPolicy.SHIFT, OverlapPolicy.ONCE),
    (GapPolicy.SHIFT, OverlapPolicy.BOTH),
    (GapPolicy.SKIP, OverlapPolicy.ONCE),
    (GapPolicy.SKIP, OverlapPolicy.BOTH),
]


def _field(text: str, size: int) -> set[int]:
    if text == "*":
        return set(range(size))
    if text.startswith("*/"):
        return set(range(0, size, int(text[2:])))
    return {int(part) for part in text.split(",")}


@functools.cache
def _timeline(zone_name: str, day: str) -> list[tuple[datetime, datetime, bool, datetime]]:
    """Each UTC minute of the window: (instant, wall time, is a repeated wall time, wall before)."""
    zone = ZoneInfo(zone_name)
    start = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=12)
    timeline = []
    for step in range(48 * 60):
        instant = start + step * MINUTE
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None)
        # A wall time is repeated when its fold=1 reading is a different instant, and this
        # instant is the later one.
        repeated = local.fold == 1 and (
            wall.replace(tzinfo=zone, fold=0).utcoffset()
            != wall.replace(tzinfo=zone, fold=1).utcoffset()
        )
        previous_wall = (instant - MINUTE).astimezone(zone).replace(tzinfo=None)
        timeline.append((instant, wall, repeated, previous_wall))
    return timeline


def _oracle(
    expression: str, zone_name: str, day: str, gap: GapPolicy, overlap: OverlapPolicy
) -> list[tuple[datetime, str]]:
    """Every (instant, note) in the 48 h window that the stated rules say must fire."""
    minute_text, hour_text, *rest = expression.split()
    assert rest == ["*", "*", "*"], "the oracle only understands minute and hour"
    minutes, hours = _field(minute_text, 60), _field(hour_text, 24)

    def selected(wall: datetime) -> bool:
        return wall.minute in minutes and wall.hour in hours

    fires: list[tuple[datetime, str]] = []
    for instant, wall, repeated, previous_wall in _timeline(zone_name, day):
        if selected(wall):
            if not repeated:
                fires.append((instant, ""))
            elif overlap is OverlapPolicy.BOTH:
                fires.append((instant, NOTE_OVERLAP_SECOND))
        elif gap is GapPolicy.SHIFT and wall - previous_wall > MINUTE:
            # The wall clock jumped: the minutes it skipped fire here, once, if any is selected.
            jumped = (wall - previous_wall) // MINUTE
            if any(selected(previous_wall + k * MINUTE) for k in range(1, jumped)):
                fires.append((instant, NOTE_GAP_SHIFTED))
    return fires


@pytest.mark.parametrize(("gap", "overlap"), POLICIES)
@pytest.mark.parametrize(("zone", "day", "expression"), CASES)
def test_fire_times_match_brute_force(
    zone: str, day: str, expression: str, gap: GapPolicy | None, overlap: OverlapPolicy | None
) -> None:
    spec = parse_cron(expression, zone, gap=gap, overlap=overlap)
    expected = _oracle(expression, zone, day, spec.gap, spec.overlap)
    start = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=12)
    end = start + timedelta(hours=48)
    got: list[tuple[datetime, str]] = []
    cursor = start - MINUTE
    while (fire := spec.next_after(cursor)) is not None and fire.utc < end:
        got.append((fire.utc, fire.note))
        cursor = fire.utc
    assert got == expected


@pytest.mark.parametrize(("zone", "day", "expression"), CASES)
def test_next_after_from_every_minute_matches_brute_force(
    zone: str, day: str, expression: str
) -> None:
    # Starting points inside gaps' neighbourhoods and overlaps are where exactness is hard.
    spec = parse_cron(expression, zone)
    expected = _oracle(expression, zone, day, spec.gap, spec.overlap)
    start = datetime.fromisoformat(day).replace(tzinfo=UTC) - timedelta(hours=12)
    for step in range(0, 40 * 60, 7):
        after = start + step * MINUTE + timedelta(seconds=step % 60)
        want = next(((i, n) for i, n in expected if i > after), None)
        fire = spec.next_after(after)
        if want is not None:
            assert fire is not None, after
            assert (fire.utc, fire.note) == want, after


@pytest.mark.parametrize(
    ("fold", "overlap", "expected"),
    [
        (0, OverlapPolicy.BOTH, "2026-11-01T05:45:00+00:00"),  # 01:45 EDT
        (1, OverlapPolicy.BOTH, "2026-11-01T06:45:00+00:00"),  # 01:45 EST
        (0, OverlapPolicy.ONCE, "2026-11-01T05:45:00+00:00"),
        (1, OverlapPolicy.ONCE, "2026-11-01T07:00:00+00:00"),  # 02:00 EST, not a repeat
    ],
)
def test_after_given_as_ambiguous_local_time_respects_fold(
    fold: int, overlap: OverlapPolicy, expected: str
) -> None:
    spec = parse_cron("*/15 * * * *", "America/New_York", overlap=overlap)
    after = datetime(2026, 11, 1, 1, 30, tzinfo=ZoneInfo("America/New_York"), fold=fold)
    fire = spec.next_after(after)
    assert fire is not None
    assert fire.utc.isoformat() == expected
