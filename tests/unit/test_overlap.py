"""The overlap decision shared by the dispatcher's slots and manual triggers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.model import BufferedRun, OverlapMode
from scheduler.overlap import OverlapAction, OverlapDecision, decide_overlap

RUN = OverlapDecision(action=OverlapAction.RUN)
SKIP = OverlapDecision(action=OverlapAction.SKIP)
BUFFER = OverlapDecision(action=OverlapAction.BUFFER)


@pytest.mark.parametrize("mode", list(OverlapMode))
@pytest.mark.parametrize("buffered", [False, True])
def test_nothing_in_progress_runs_whatever_the_policy(mode: OverlapMode, buffered: bool) -> None:
    assert decide_overlap(mode, [], buffered=buffered) == RUN


@pytest.mark.parametrize(
    ("mode", "buffered", "expected"),
    [
        (OverlapMode.ALLOW, False, RUN),
        (OverlapMode.ALLOW, True, RUN),
        (OverlapMode.SKIP, False, SKIP),
        (OverlapMode.SKIP, True, SKIP),
        (OverlapMode.BUFFER_ONE, False, BUFFER),
        (OverlapMode.BUFFER_ONE, True, SKIP),
        (
            OverlapMode.CANCEL_PREVIOUS,
            False,
            OverlapDecision(action=OverlapAction.RUN, cancel=("a@1", "a@2")),
        ),
        (
            OverlapMode.CANCEL_PREVIOUS,
            True,
            OverlapDecision(action=OverlapAction.RUN, cancel=("a@1", "a@2")),
        ),
    ],
)
def test_runs_in_progress(mode: OverlapMode, buffered: bool, expected: OverlapDecision) -> None:
    assert decide_overlap(mode, ["a@1", "a@2"], buffered=buffered) == expected


def test_a_held_manual_run_round_trips_and_a_slot_keeps_its_old_form() -> None:
    at = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    manual = BufferedRun(run_id="s@x~ab", scheduled_for=at, manual=True)
    assert BufferedRun.from_json(manual.to_json()) == manual
    # The JSON is compared by text (clear_buffered IF buffered = ?): reading and writing it
    # again must give the same text.
    again = BufferedRun.from_json(manual.to_json())
    assert again is not None and again.to_json() == manual.to_json()
    slot = BufferedRun(run_id="s@x", scheduled_for=at)
    assert "manual" not in slot.to_json()
    assert BufferedRun.from_json(slot.to_json()) == slot
