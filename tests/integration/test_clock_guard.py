"""The clock-skew guard against the real Cassandra: a process whose clock is off the cluster's
writes no timers and owns no shards, and says why (loss path 4)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session

import bucketer.clock
import bucketer.cql
from bucketer.cassandra import CassandraTimerStore
from bucketer.clock import ClockGuard, ClockSkewed
from bucketer.keys import minute_bucket
from bucketer.model import Timer
from bucketer.ownership import ShardOwnership
from scheduler.config import Config


async def _store(session: Session, config: Config, guard: ClockGuard) -> CassandraTimerStore:
    """A store over 128 shards: the lower ones are held by other tests' leases (the test
    keyspace has 8; the fencing test of test_bucketer claims up to 64)."""
    store = CassandraTimerStore(
        session, keyspace=config.keyspace, shard_count=128, clock_guard=guard
    )
    await store.init_shards(minute_bucket(datetime.now(UTC)))
    return store


async def test_a_synced_clock_measures_within_tolerance(session: Session) -> None:
    guard = ClockGuard()
    skew = await guard.measure(session)
    assert abs(skew) < timedelta(milliseconds=200) and guard.ok and guard.reason == ""


async def test_a_clock_3s_behind_refuses_timers_and_shards(
    session: Session, migrated: Config
) -> None:
    guard = ClockGuard(clock=lambda: datetime.now(UTC) - timedelta(seconds=3))
    await guard.measure(session)
    assert not guard.ok and "behind the cluster's" in guard.reason
    store = await _store(session, migrated, guard)
    now = datetime.now(UTC)
    with pytest.raises(ClockSkewed, match="behind the cluster's"):
        await store.put([Timer(fire_time=now, timer_id="t", shard=0, kind="t", key="k")])

    gained: list[int] = []

    async def gain(lease: object) -> None:
        gained.append(0)

    async def lose(_shard: int) -> None:
        return None

    owner = ShardOwnership(
        store, instance="skewed", on_gain=gain, on_loss=lose, group="clock-guard-test"
    )
    await owner.balance_once()
    assert owner.owned == {} and gained == []


async def test_a_member_whose_clock_drifts_releases_its_shards(
    session: Session, migrated: Config
) -> None:
    offset = timedelta(0)
    guard = ClockGuard(clock=lambda: datetime.now(UTC) + offset)
    await guard.measure(session)
    store = await _store(session, migrated, guard)
    lost: list[int] = []

    async def gain(lease: object) -> None:
        return None

    async def lose(shard: int) -> None:
        lost.append(shard)

    owner = ShardOwnership(
        store, instance="drifting", on_gain=gain, on_loss=lose, group="clock-drift-test"
    )
    await owner.balance_once()
    held = sorted(owner.owned)
    assert held
    offset = timedelta(seconds=2)  # the clock jumps ahead
    await guard.measure(session)
    await owner.balance_once()
    assert owner.owned == {} and sorted(lost) == held
    for shard in held:
        assert (await store.read_lease(shard)).owner is None, "released, free for a peer"


async def test_a_round_trip_too_slow_to_tell_keeps_the_verdict(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer that waited 1.2 s on its way back (an overloaded process or node) puts the
    midpoint 0.6 s off, beyond the 0.5 s tolerance: that sample cannot tell, and neither
    flips a good verdict nor clears a bad one."""
    real = bucketer.cql.aexecute

    async def slow_answer(s: Session, statement: str) -> list[object]:
        rows = await real(s, statement)
        await asyncio.sleep(1.2)
        return rows

    guard = ClockGuard()
    await guard.measure(session)
    assert guard.ok
    monkeypatch.setattr(bucketer.clock, "aexecute", slow_answer)
    skew = await guard.measure(session)
    assert abs(skew) > guard.tolerance, "the sample alone would say skewed"
    assert guard.ok, "kept: the round trip was too slow to tell"

    # 0.6 s behind: skewed. A slow sample puts the midpoint 0.6 s the other way and would
    # read as in sync.
    behind = ClockGuard(clock=lambda: datetime.now(UTC) - timedelta(milliseconds=600))
    monkeypatch.setattr(bucketer.clock, "aexecute", real)
    await behind.measure(session)
    assert not behind.ok
    monkeypatch.setattr(bucketer.clock, "aexecute", slow_answer)
    skew = await behind.measure(session)
    assert abs(skew) < guard.tolerance, "the sample alone would say in sync"
    assert not behind.ok, "kept: a slow sample does not clear a skew either"
