"""scheduler.cron's naive wall-clock matching, checked against croniter on naive datetimes."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from croniter import croniter

from scheduler.cron import parse_pattern

# Standard syntax where our grammar and croniter's (day_or=True) must agree exactly.
EXPRESSIONS = [
    "*/15 * * * *",
    "0 0 * * *",
    "5 4 * * sun",
    "0 0 1,15 * 1",
    "0 0 L * *",
    "0 12 L 2 *",
    "15 10 L,15 * *",
    "0 0 29 2 *",
    "0 9 * * MON-FRI",
    "0 0 31 * *",
    "30 6 1-7 * MON",
    "0 0 */2 * MON",
    "*/7 3-5 * JAN-MAR *",
    "0 0 * * 5-7",
    "0 0 * * SAT-SUN",
    "0 22-2 * * *",
    "10/20 * * * *",
    "0 0 1 * 0-7",
    "0 0 ? * MON",
    "0 0 13 * FRI",
    "59 23 31 12 *",
    "0 0 * FEB *",
    "0 0 1-31 * MON",
    "0 0 */1 * MON",
    "0 0 * * 7",
    "0 0 * * */2",
    "0 0 * * SUN/2",
    "23 0-20/2 * * *",
    "0 0 * 2/3 *",
    "@weekly",
    "@monthly",
    "*/10 * * * * *",
    "30 0 12 * * ?",
    "0 */5 9 * * MON",
    "15,45 30 2 * * *",
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_naive_matches_agree_with_croniter(expression: str) -> None:
    pattern = parse_pattern(expression)
    start = datetime(2023, 12, 25)
    reference = croniter(
        expression,
        start,
        ret_type=datetime,
        day_or=True,
        second_at_beginning=pattern.has_seconds,
    )
    horizon = datetime(9999, 1, 1)
    cursor = start
    for _ in range(150):
        want = reference.get_next(datetime)
        got = pattern.next_at_or_after(cursor + timedelta(seconds=1), horizon)
        assert got == want, f"after {cursor}"
        cursor = want


def test_next_at_or_after_respects_bounds() -> None:
    pattern = parse_pattern("30 2 * * *")
    assert pattern.next_at_or_after(datetime(2026, 3, 8, 2), datetime(2026, 3, 8, 3)) == datetime(
        2026, 3, 8, 2, 30
    )
    assert pattern.next_at_or_after(datetime(2026, 3, 8, 2), datetime(2026, 3, 8, 2, 30)) is None
    # Inclusive low bound; microseconds round up to the next whole second.
    assert pattern.next_at_or_after(datetime(2026, 3, 8, 2, 30), datetime(2027, 1, 1)) == datetime(
        2026, 3, 8, 2, 30
    )
    assert pattern.next_at_or_after(
        datetime(2026, 3, 8, 2, 30, 0, 1), datetime(2027, 1, 1)
    ) == datetime(2026, 3, 9, 2, 30)


@pytest.mark.parametrize(
    ("expression", "wall", "selected"),
    [
        ("0 0 13 * FRI", datetime(2026, 3, 6), True),  # a Friday, not the 13th
        ("0 0 13 * FRI", datetime(2026, 4, 13), True),  # the 13th, a Monday
        ("0 0 13 * FRI", datetime(2026, 4, 14), False),
        ("0 0 * * FRI", datetime(2026, 4, 13), False),
        ("0 0 L * *", datetime(2028, 2, 29), True),
        ("0 0 L * *", datetime(2028, 2, 28), False),
        ("0 0 * * 7", datetime(2026, 3, 8), True),  # Sunday
        ("0 0 * * *", datetime(2026, 3, 8, 0, 0, 1), False),
    ],
)
def test_matches(expression: str, wall: datetime, selected: bool) -> None:
    assert parse_pattern(expression).matches(wall) is selected
