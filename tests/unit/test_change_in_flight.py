"""Telling a timer of a change still being written from a superseded one
(``scheduler.firing.change_in_flight``, ``scheduler.model.new_generation``)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from scheduler.firing import IN_FLIGHT_WAIT, change_in_flight
from scheduler.model import Schedule, ScheduleSpec, SpecKind, generation_minted, new_generation
from scheduler.timers import FireTimer

SLOT = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _minted_at(at: datetime) -> int:
    """A generation minted at ``at`` (the layout ``new_generation`` uses)."""
    return (int(at.timestamp() * 1000) << 20) | secrets.randbits(20)


def _schedule(generation: int) -> Schedule:
    return Schedule(
        schedule_id="s1",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="* * * * * *"),
        generation=generation,
        create_time=SLOT,
        update_time=SLOT,
    )


def _timer(generation: int) -> FireTimer:
    return FireTimer(schedule_id="s1", generation=generation, slot=SLOT, scheduled_for=SLOT)


def test_a_generation_tells_when_it_was_minted_and_fits_a_signed_bigint() -> None:
    before = datetime.now(UTC)
    g = new_generation()
    after = datetime.now(UTC)
    assert 0 < g < 2**63
    assert before - timedelta(milliseconds=1) <= generation_minted(g) <= after
    # Within one millisecond 20 random bits tell generations apart (a schedule changes far
    # less often than that); across milliseconds the time does.
    assert generation_minted(_minted_at(SLOT)) == SLOT
    assert _minted_at(SLOT + timedelta(milliseconds=1)) > _minted_at(SLOT)


def test_a_timer_minted_after_the_current_generation_is_in_flight_for_a_while() -> None:
    current = _minted_at(SLOT - timedelta(hours=1))
    timer = _timer(_minted_at(SLOT))
    assert change_in_flight(timer, _schedule(current), SLOT + timedelta(milliseconds=5))
    assert change_in_flight(timer, _schedule(current), SLOT + IN_FLIGHT_WAIT / 2)
    assert not change_in_flight(timer, _schedule(current), SLOT + IN_FLIGHT_WAIT)


def test_a_timer_minted_before_the_current_generation_is_superseded() -> None:
    timer = _timer(_minted_at(SLOT))
    later = _schedule(_minted_at(SLOT + timedelta(milliseconds=300)))
    assert not change_in_flight(timer, later, SLOT + timedelta(seconds=1))


def test_a_current_timer_is_not_in_flight() -> None:
    g = _minted_at(SLOT)
    assert not change_in_flight(_timer(g), _schedule(g), SLOT)


def test_random_generations_of_older_versions_are_superseded_as_before() -> None:
    """A timer whose generation is a random 63-bit number (written before generations told
    time) decodes to a time far from now: dropped, as every mismatch was."""
    old = 0x5F3759DF5F3759DF
    assert not change_in_flight(_timer(old), _schedule(_minted_at(SLOT)), SLOT)


def test_a_missing_schedule_is_waited_for_near_the_slot_only() -> None:
    timer = _timer(_minted_at(SLOT))
    assert change_in_flight(timer, None, SLOT + timedelta(seconds=1))
    assert not change_in_flight(timer, None, SLOT + IN_FLIGHT_WAIT)
