"""Whether a run is in progress by its run row (``scheduler.cassandra.run_alive``): what the
overlap policies weigh when a slot's run is not marked on the schedule row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from scheduler.cassandra import retry_pending, run_alive
from scheduler.model import STALE_RUN, RunStatus

SLOT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _row(status: RunStatus, *, seen: datetime, retry_at: datetime | None = None) -> SimpleNamespace:
    """A run row as the driver hands it back (naive UTC datetimes)."""
    naive = seen.replace(tzinfo=None)
    return SimpleNamespace(
        status=status.value,
        enqueue_time=naive,
        start_time=naive,
        heartbeat_time=None,
        next_attempt_time=retry_at.replace(tzinfo=None) if retry_at else None,
    )


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.TIMED_OUT])
def test_a_failed_attempt_with_its_retry_pending_is_in_progress_until_after_the_retry_is_due(
    status: RunStatus,
) -> None:
    retry_at = SLOT + timedelta(minutes=30)
    row = _row(status, seen=SLOT, retry_at=retry_at)
    for now in (SLOT + timedelta(minutes=10), retry_at, retry_at + STALE_RUN / 2):
        assert retry_pending(row, now, STALE_RUN)
        assert run_alive(row, SLOT, now, STALE_RUN)
    # A retry never enqueued well after its time (its timer lost) no longer holds the schedule.
    late = retry_at + STALE_RUN
    assert not retry_pending(row, late, STALE_RUN)
    assert not run_alive(row, SLOT, late, STALE_RUN)


@pytest.mark.parametrize(
    "status",
    [RunStatus.FAILED, RunStatus.SUCCEEDED, RunStatus.DEAD_LETTERED, RunStatus.CANCELLED],
)
def test_an_attempt_over_with_no_retry_written_has_ended(status: RunStatus) -> None:
    row = _row(status, seen=SLOT)
    now = SLOT + timedelta(seconds=1)
    assert not retry_pending(row, now, STALE_RUN)
    assert not run_alive(row, SLOT, now, STALE_RUN)


def test_a_retry_time_on_an_attempt_taken_again_does_not_count_as_pending() -> None:
    """The retry's ENQUEUED or RUNNING row is in progress by its own signs of life."""
    retry_at = SLOT + timedelta(minutes=30)
    running = _row(RunStatus.RUNNING, seen=retry_at, retry_at=retry_at)
    assert not retry_pending(running, retry_at, STALE_RUN)
    assert run_alive(running, SLOT, retry_at + timedelta(seconds=5), STALE_RUN)
    assert not run_alive(running, SLOT, retry_at + STALE_RUN, STALE_RUN)
