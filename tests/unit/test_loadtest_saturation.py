"""The saturation sweep's verdicts and stopping rule (loadtest/saturation.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from loadtest.saturation import report, sweep, verdict


def _step(
    rate: int, *, p99: float, fired: float | None = None, lost: int = 0, twice: int = 0
) -> dict[str, Any]:
    return {
        "rate_per_min": rate,
        "fired": rate if fired is None else fired,
        "wall_s": 60.0,
        "lag_s": {"p50": p99 / 4, "p99": p99, "max": p99 * 2},
        "lost": lost,
        "ran_twice": twice,
        "cpu_ms_per_firing_total": 1.0,
        "busy_cores": 1.5,
    }


@pytest.mark.parametrize(
    ("step", "why"),
    [
        (_step(60_000, p99=0.5), ""),
        (_step(60_000, p99=2.5), "lag p99 2.50 s > 2 s"),
        (_step(60_000, p99=math.nan), "lag p99 nan s > 2 s"),
        (_step(60_000, p99=0.5, lost=3), "3 slots lost"),
        (_step(60_000, p99=0.5, twice=1), "1 slots ran twice"),
        (_step(60_000, p99=0.5, fired=50_000), "fired 50,000/min, under 95% of the rate"),
    ],
)
def test_a_step_is_sustained_only_with_nothing_lost_or_doubled_on_time_and_kept_up(
    step: Mapping[str, Any], why: str
) -> None:
    assert verdict(step, p99_limit=2.0) == why


def test_the_sweep_stops_at_the_first_rate_not_sustained() -> None:
    p99s = {60_000: 0.4, 80_000: 1.5, 100_000: 3.0, 120_000: 0.1}
    ran: list[int] = []

    def bench(rate: int) -> Mapping[str, Any]:
        ran.append(rate)
        return _step(rate, p99=p99s[rate])

    steps, sustained = sweep([100_000, 60_000, 120_000, 80_000], bench, p99_limit=2.0)
    assert ran == [60_000, 80_000, 100_000]  # lowest first; 120,000 never tried
    assert sustained == 80_000
    assert [why for _s, why in steps] == ["", "", "lag p99 3.00 s > 2 s"]
    text = report(steps, sustained, p99_limit=2.0)
    assert "Sustained: 80,000 firings/min (1,333/s)" in text
    assert "| 100,000 | 100,000 | 0.750 | 3.000 |" in text


def test_a_sweep_whose_first_rate_fails_sustains_nothing() -> None:
    steps, sustained = sweep([60_000], lambda r: _step(r, p99=9.0), p99_limit=2.0)
    assert sustained == 0 and len(steps) == 1
    assert "No rate was sustained" in report(steps, sustained, p99_limit=2.0)
