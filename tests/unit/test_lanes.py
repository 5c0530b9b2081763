"""Weighted round-robin across lanes for a deep backlog of due timers (bucketer.lanes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bucketer.lanes import fair_order, fill_batches
from bucketer.model import Timer

T0 = datetime(2026, 12, 3, 0, 0, tzinfo=UTC)


def _timer(key: str, lane: str, n: int, *, kind: str = "fire") -> Timer:
    return Timer(
        fire_time=T0 + timedelta(microseconds=n),
        timer_id=f"{key}#{n}",
        shard=0,
        kind=kind,
        key=key,
        data=lane.encode(),
    )


class _ByData:
    def __init__(self, weights: dict[str, int] | None = None) -> None:
        self.weights = weights or {}

    def lane(self, timer: Timer) -> str:
        return timer.data.decode()

    def weight(self, lane: str) -> int:
        return self.weights.get(lane, 1)


def _herd(noisy: int, quiet: int) -> list[Timer]:
    """``noisy`` timers of lane A, all older than ``quiet`` timers of lane B."""
    due = [_timer(f"a{i}", "A", i) for i in range(noisy)]
    due += [_timer(f"b{i}", "B", noisy + i) for i in range(quiet)]
    return due


def test_a_quiet_lane_takes_turns_with_a_noisy_one_not_after_it() -> None:
    order = [g[0].key for g in fair_order(_herd(1000, 10), _ByData())]
    assert order[:20] == [k for i in range(10) for k in (f"a{i}", f"b{i}")]
    assert order[20:] == [f"a{i}" for i in range(10, 1000)]


def test_weights_give_a_lane_that_many_keys_per_turn() -> None:
    order = [g[0].data.decode() for g in fair_order(_herd(100, 100), _ByData({"B": 3}))]
    assert order[:8] == ["A", "B", "B", "B", "A", "B", "B", "B"]


def test_a_keys_timers_stay_together_in_order_and_nothing_is_lost() -> None:
    due = sorted(
        [*_herd(50, 5), _timer("a3", "A", 10_000, kind="run"), _timer("b1", "B", 10_001)],
        key=lambda t: t.position,
    )
    groups = fair_order(due, _ByData())
    assert sorted(t.position for g in groups for t in g) == [t.position for t in due]
    by_key = {g[0].key: g for g in groups}
    assert len(by_key) == len(groups)
    assert [t.kind for t in by_key["a3"]] == ["fire", "run"]
    assert [t.timer_id for t in by_key["b1"]] == ["b1#51", "b1#10001"]


def test_lanes_take_turns_in_the_order_their_oldest_timer_came() -> None:
    due = [_timer("b0", "B", 0), *(_timer(f"a{i}", "A", 1 + i) for i in range(3))]
    assert [g[0].key for g in fair_order(due, _ByData())] == ["b0", "a0", "a1", "a2"]


def test_batches_keep_whole_groups_and_stop_at_the_round_limit() -> None:
    groups = [
        [_timer("x", "A", 0), _timer("x", "A", 1)],
        *([_timer(f"k{i}", "A", 2 + i)] for i in range(9)),
    ]
    batches = fill_batches(groups, size=4, limit=7)
    assert [[t.key for t in b] for b in batches] == [["x", "x", "k0", "k1"], ["k2", "k3", "k4"]]
    big = [[_timer("y", "A", i) for i in range(6)], [_timer("z", "A", 9)]]
    assert [len(b) for b in fill_batches(big, size=4, limit=100)] == [6, 1]


def test_within_a_lane_the_backlogs_head_and_later_timers_take_turns_later_first() -> None:
    head = [_timer(f"old{i}", "A", i) for i in range(5)]  # a herd
    later = [_timer(f"new{i}", "A", 1_000_000 + i) for i in range(2)]  # due after it
    cut = {"A": T0 + timedelta(seconds=1)}
    order = [g[0].key for g in fair_order([*head, *later], _ByData(), later_from=cut)]
    assert order == ["new0", "old0", "new1", "old1", "old2", "old3", "old4"]
    # A lane not named, or no cut at all: oldest first as ever.
    expected = [*(f"old{i}" for i in range(5)), "new0", "new1"]
    assert [g[0].key for g in fair_order([*head, *later], _ByData())] == expected
    other = {"B": T0}
    assert [g[0].key for g in fair_order([*head, *later], _ByData(), later_from=other)] == expected


def test_a_lane_with_a_backlog_still_takes_one_turn_per_cycle_beside_another_lane() -> None:
    a = [_timer(f"a{i}", "A", i) for i in range(4)]  # A's herd
    a_later = [_timer("an", "A", 2_000_000)]  # and one of A's due after it
    b = [_timer(f"b{i}", "B", 2_000_001 + i) for i in range(3)]
    cut = {"A": T0 + timedelta(seconds=1)}
    order = [g[0].key for g in fair_order([*a, *a_later, *b], _ByData(), later_from=cut)]
    # A takes one key per turn (its later one first), B one: A's split gains it no turns.
    assert order == ["an", "b0", "a0", "b1", "a1", "b2", "a2", "a3"]
