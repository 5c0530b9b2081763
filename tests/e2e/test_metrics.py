"""The dispatcher serves its Prometheus metrics."""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.e2e.conftest import Stack
from tests.e2e.support import create_schedule, cron_spec, delete_schedule

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_dispatcher_metrics_count_firings_and_owned_shards(stack: Stack) -> None:
    before = _scrape(stack.dispatcher_metrics_port)
    s = create_schedule(stack, name="metrics", handler="echo", spec=cron_spec("* * * * * *"))
    time.sleep(3.5)
    delete_schedule(stack, s.id)
    after = _scrape(stack.dispatcher_metrics_port)
    enqueued = 'cronscale_runs_enqueued_total{tier="standard"}'
    assert after[enqueued] - before.get(enqueued, 0.0) >= 2
    assert after["cronscale_fire_lag_seconds_count"] >= 2
    assert after["cronscale_owned_shards"] == stack.config.shard_count
    assert "cronscale_timers_pending" in after
