"""Run ids name their slot (scheduler.model.run_id_for): the same text for the same instant,
whichever way it is formatted and whatever zone the instant is given in."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

from scheduler.model import parse_run_id, run_id_for


def _by_strftime(schedule_id: str, t: datetime) -> str:
    """The id as first defined: strftime of the UTC instant, then its milliseconds."""
    u = t.astimezone(UTC)
    return f"{schedule_id}@{u.strftime('%Y%m%dT%H%M%S')}.{u.microsecond // 1000:03d}Z"


def test_run_ids_match_their_strftime_form_across_the_calendar() -> None:
    rng = random.Random(8)
    low = datetime(1, 1, 2, tzinfo=UTC)
    span = (datetime(9999, 12, 30, tzinfo=UTC) - low) // timedelta(microseconds=1)
    instants = [low + timedelta(microseconds=rng.randrange(span)) for _ in range(20_000)]
    instants += [
        datetime(2026, 1, 2, 3, 4, 5, 999_999, tzinfo=UTC),
        datetime(999, 12, 31, 23, tzinfo=UTC),
    ]
    for t in instants:
        assert run_id_for("s-1", t) == _by_strftime("s-1", t)


def test_a_run_id_names_the_instant_not_the_zone_it_was_given_in() -> None:
    t = datetime(2026, 3, 29, 0, 30, 0, 123_456, tzinfo=UTC)
    east = t.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert run_id_for("s", east) == run_id_for("s", t) == "s@20260329T003000.123Z"
    ref = parse_run_id(run_id_for("s", east))
    assert (ref.schedule_id, ref.scheduled_for) == ("s", t.replace(microsecond=123_000))


def test_suffixes_follow_the_slot() -> None:
    t = datetime(2026, 6, 1, 12, tzinfo=UTC)
    assert run_id_for("s", t, suffix="bf") == "s@20260601T120000.000Z~bf"
    manual = run_id_for("s", t, manual=True)
    assert (
        manual.startswith("s@20260601T120000.000Z~")
        and len(manual) == len("s@20260601T120000.000Z~") + 8
    )
