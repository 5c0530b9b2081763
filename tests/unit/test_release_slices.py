"""Fire-ahead's release groups (``scheduler.firing.release_slices``, decision 0011)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronscale.v1 import run_message_pb2
from scheduler.firing import (
    BUSY_RELEASE_SLICE,
    BUSY_RELEASES,
    RELEASE_SLICE,
    Release,
    release_slices,
)

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def _release(at: datetime, run_id: str) -> Release:
    return Release(at, run_message_pb2.RunMessage(run_id=run_id), [])


def _ids(groups: list[list[Release]]) -> list[list[str]]:
    return [[r.message.run_id for r in g] for g in groups]


def test_what_is_due_goes_out_at_once_and_the_rest_in_slices_oldest_first() -> None:
    releases = [
        _release(NOW + 40 * MS, "c"),
        _release(NOW - 3 * MS * 1000, "late"),
        _release(NOW + 10 * MS, "a"),
        _release(NOW, "due"),
        _release(NOW + 30 * MS, "b"),
    ]
    assert _ids(release_slices(releases, NOW)) == [["late", "due"], ["a", "b"], ["c"]]
    assert RELEASE_SLICE == 25 * MS


def test_nothing_due_makes_no_empty_group() -> None:
    assert _ids(release_slices([_release(NOW + 5 * MS, "a")], NOW)) == [["a"]]
    assert release_slices([], NOW) == []


def test_a_busy_batch_is_released_in_wider_slices() -> None:
    """At 100,000 firings a minute a batch holds hundreds of releases; 25 ms slices of ~40
    messages cost more CPU in every stage after them than firing without fire-ahead."""
    spread = [_release(NOW + (1 + 6 * i) * MS, f"r{i}") for i in range(BUSY_RELEASES)]
    groups = release_slices(spread, NOW)
    assert [len(g) for g in groups] == [17, 3]  # 1..97 ms, then 103..115 ms
    assert all(g[-1].at - g[0].at <= BUSY_RELEASE_SLICE for g in groups)
    fewer = release_slices(spread[: BUSY_RELEASES - 1], NOW)
    assert all(g[-1].at - g[0].at <= RELEASE_SLICE for g in fewer)
    assert len(fewer) == 4  # 1..25, 31..55, 61..85, 91..109 ms
