"""The overlap decision: what a new run does while earlier runs of its schedule are in progress.

One pure function shared by the dispatcher (a due slot, ``scheduler.firing.plan_fire``) and the
API (a manual trigger, ``scheduler.lifecycle``), so both apply a schedule's overlap policy the
same way:

- nothing in progress, or ALLOW: the run goes ahead;
- SKIP: the run is recorded SKIPPED (reason ``overlap``);
- BUFFER_ONE: the run is held back until the running one finishes, if no run is held yet;
  otherwise it is SKIPPED;
- CANCEL_PREVIOUS: the runs in progress are asked to cancel (the worker sees it at their next
  heartbeat) and the new run goes ahead.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.model import OverlapMode


class OverlapAction(enum.Enum):
    """What becomes of the new run."""

    RUN = "run"
    SKIP = "skip"
    BUFFER = "buffer"


@dataclass(frozen=True, kw_only=True)
class OverlapDecision:
    """The new run's fate, and the runs in progress to cancel first (CANCEL_PREVIOUS)."""

    action: OverlapAction
    cancel: tuple[str, ...] = ()


def decide_overlap(
    mode: OverlapMode, in_progress: Sequence[str], *, buffered: bool
) -> OverlapDecision:
    """Applies overlap policy ``mode`` to a new run of a schedule.

    ``in_progress`` holds the run ids still in progress (``Schedule.in_progress``); ``buffered``
    says whether the schedule already holds a run back (``Schedule.buffered``).
    """
    if not in_progress or mode is OverlapMode.ALLOW:
        return OverlapDecision(action=OverlapAction.RUN)
    if mode is OverlapMode.SKIP:
        return OverlapDecision(action=OverlapAction.SKIP)
    if mode is OverlapMode.BUFFER_ONE:
        return OverlapDecision(action=OverlapAction.SKIP if buffered else OverlapAction.BUFFER)
    return OverlapDecision(action=OverlapAction.RUN, cancel=tuple(in_progress))
