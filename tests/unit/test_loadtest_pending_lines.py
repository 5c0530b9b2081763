"""The pending-lines microbenchmark (loadtest/pending_lines.py) replays a spread load through
``bucketer.pending`` and hands every timer it reads exactly once."""

from __future__ import annotations

from datetime import timedelta

from loadtest.pending_lines import SHARDS, one_pass, spread


def test_the_spread_is_in_order_over_every_shard_at_the_given_rate() -> None:
    timers = spread(3_000, 100)
    assert [t.position for t in timers] == sorted(t.position for t in timers)
    assert {t.shard for t in timers} == set(range(SHARDS))
    assert timers[-1].fire_time - timers[0].fire_time < timedelta(seconds=30)


def test_a_pass_reads_and_hands_every_timer_once() -> None:
    cpu, handed = one_pass(spread(3_000, 100))
    assert handed == 3_000 and cpu > 0
