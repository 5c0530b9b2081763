"""Poison isolation end to end: a timer that cannot be fired is quarantined with its error,
visible on its schedule and in a metric, while every other schedule keeps firing."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.cassandra import CassandraTimerStore
from bucketer.cql import connect
from bucketer.keys import shard_of
from bucketer.model import Timer
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    SUCCEEDED,
    create_schedule,
    cron_spec,
    dt,
    get_schedule,
    list_runs,
    wait_for_runs,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _put_raw_timer(stack: Stack, timer: Timer) -> None:
    """Writes a timer as a newer cronscale version (or a bug) might have: straight to the
    wheel, past the API's validation."""
    cfg = stack.config
    session = connect(cfg.cassandra_hosts, cfg.cassandra_port)
    try:
        store = CassandraTimerStore(session, keyspace=cfg.keyspace, shard_count=cfg.shard_count)
        asyncio.run(store.put([timer], now=datetime.now(UTC)))
    finally:
        session.cluster.shutdown()


def _quarantined_metric(stack: Stack) -> float:
    url = f"http://127.0.0.1:{stack.dispatcher_metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("cronscale_timers_quarantined_total{")
    )


def test_a_poison_timer_is_quarantined_and_others_keep_firing(stack: Stack) -> None:
    healthy = create_schedule(
        stack, name="healthy", handler="e2e.record", spec=cron_spec("* * * * * *")
    )
    victim = create_schedule(
        stack, name="victim", handler="e2e.record", spec=cron_spec("0 0 1 1 *")
    )
    before = _quarantined_metric(stack)
    at = datetime.now(UTC) + timedelta(seconds=2)
    # A fire timer of a layout version this dispatcher does not know: firing it raises.
    _put_raw_timer(
        stack,
        Timer(
            fire_time=at,
            timer_id=victim.id,
            shard=shard_of(victim.id, stack.config.shard_count),
            kind="fire",
            key=victim.id,
            data=json.dumps({"v": 99, "g": 1}).encode(),
        ),
    )
    wait_until(
        stack,
        lambda: bool(get_schedule(stack, victim.id).quarantine_error),
        20,
        "the victim quarantined",
    )
    s = get_schedule(stack, victim.id)
    assert "newer" in s.quarantine_error and dt(s.quarantine_time) >= at - timedelta(seconds=1)
    assert not s.HasField("next_fire_time"), "a quarantined schedule shows no next fire time"
    assert _quarantined_metric(stack) == before + 1
    # The healthy schedule kept firing through it, slot after slot.
    quarantined_at = dt(s.quarantine_time)
    wait_for_runs(
        stack,
        healthy.id,
        lambda rs: (
            sum(1 for r in rs if r.status == SUCCEEDED and dt(r.scheduled_for) > quarantined_at)
            >= 3
        ),
        timeout=15,
    )
    assert list_runs(stack, victim.id) == []
