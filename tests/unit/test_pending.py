"""A shard's pending timers (bucketer.pending): kept by kind, lane and instant."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from bucketer.model import Timer
from bucketer.pending import PendingTimers

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _t(n: int, at: datetime, *, kind: str = "fire", data: bytes = b"") -> Timer:
    return Timer(fire_time=at, timer_id=f"t{n:06d}", shard=0, kind=kind, key=f"k{n}", data=data)


def test_timers_are_kept_in_lines_by_kind_and_lane_each_oldest_first() -> None:
    pending = PendingTimers()
    later, herd, earlier = T0 + timedelta(seconds=3), T0, T0 - timedelta(seconds=1)
    pending.put(_t(1, later), "a")
    pending.put(_t(2, herd), "a")
    pending.put(_t(3, herd), "b")
    pending.put(_t(4, earlier, kind="run"), "a")
    pending.put(_t(5, earlier), "a")  # read after a later one: still kept in instant order
    assert len(pending) == 5 and (herd, "t000002") in pending
    lines = {(line.kind, line.lane): line for line in pending.lines()}
    assert set(lines) == {("fire", "a"), ("fire", "b"), ("run", "a")}
    a = lines[("fire", "a")]
    assert [at for at, _ in a.instants()] == [earlier, herd, later]
    assert a.first() == earlier and a.count == 3
    assert a.due(herd) == (2, earlier, herd)
    assert a.count_before(later) == 2
    assert [t.timer_id for t in a.timers(herd, later)] == ["t000002", "t000001"]
    assert pending.first_from(herd) == herd
    assert pending.first_from(herd + timedelta(milliseconds=1)) == later
    assert pending.first_from(later + timedelta(milliseconds=1)) is None


def test_a_timer_read_again_replaces_the_one_at_its_position() -> None:
    pending = PendingTimers()
    pending.put(_t(1, T0, data=b"1"), "a")
    pending.put(_t(1, T0, data=b"2"), "a")
    held = pending.get((T0, "t000001"))
    assert len(pending) == 1 and held is not None and held.data == b"2"
    (line,) = pending.lines()
    assert line.count == 1 and [t.data for t in line.timers(None, T0)] == [b"2"]


def test_popping_forgets_a_timer_and_an_emptied_line() -> None:
    pending = PendingTimers()
    pending.put(_t(1, T0), "a")
    assert pending.pop((T0, "t000001")) is not None
    assert pending.pop((T0, "t000001")) is None
    assert not pending and list(pending.lines()) == [] and pending.first_from(T0) is None


def test_a_backlog_handed_oldest_first_keeps_its_order_through_compaction() -> None:
    # Thousands of instants handed from the front: emptied instants are dropped in bulk, and an
    # instant emptied and then written again (a timer read again) comes back in its place.
    pending = PendingTimers()
    instants = [T0 + timedelta(milliseconds=i) for i in range(3_000)]
    for i, at in enumerate(instants):
        pending.put(_t(i, at), "")
    for i in range(2_000):
        assert pending.pop((instants[i], f"t{i:06d}")) is not None
    pending.put(_t(10, instants[10]), "")
    (line,) = pending.lines()
    assert line.count == 1_001
    assert [at for at, _ in line.instants()] == [instants[10], *instants[2_000:]]
    assert line.due(instants[2_500]) == (502, instants[10], instants[2_500])
    assert pending.first_from(instants[11]) == instants[2_000]


def test_a_line_agrees_with_a_plain_model_through_random_puts_and_pops() -> None:
    # The line keeps a head (its first instant holding timers) and compacts emptied instants
    # in bulk: whatever order timers come and go in, every question it answers must agree
    # with a plain dict of the pending timers.
    rng = random.Random(8)
    pending = PendingTimers()
    model: dict[tuple[datetime, str], Timer] = {}
    instants = [T0 + timedelta(milliseconds=i) for i in range(200)]
    for step in range(20_000):
        if model and rng.random() < 0.5:
            # Mostly from the front, as rounds hand them; sometimes from anywhere.
            pos = min(model) if rng.random() < 0.7 else rng.choice(list(model))
            assert pending.pop(pos) is model.pop(pos)
        else:
            t = _t(rng.randrange(400), rng.choice(instants), data=str(step).encode())
            pending.put(t, "")
            model[t.position] = t
        assert len(pending) == len(model)
        if step % 37:
            continue
        lines = list(pending.lines())
        if not model:
            assert lines == []
            continue
        (line,) = lines
        ordered = sorted(model)
        cut = rng.choice(instants)
        due = [pos for pos in ordered if pos[0] <= cut]
        assert line.count == len(model) and line.first() == ordered[0][0]
        assert line.due(cut) == ((len(due), due[0][0], due[-1][0]) if due else (0, None, None))
        assert sorted(t.position for t in line.due_timers(cut)) == due
        # Oldest first; within an instant, as read.
        taken = [t.position for t in line.timers(None, cut)]
        assert sorted(taken) == due and [at for at, _ in taken] == [at for at, _ in due]
        since = rng.choice(instants)
        assert sorted(t.position for t in line.timers(since, cut)) == [
            pos for pos in due if pos[0] >= since
        ]
        assert line.count_before(cut) == sum(1 for pos in ordered if pos[0] < cut)
        after = [pos[0] for pos in ordered if pos[0] >= cut]
        assert pending.first_from(cut) == (after[0] if after else None)
        assert [at for at, _ in line.instants()] == sorted({pos[0] for pos in ordered})
