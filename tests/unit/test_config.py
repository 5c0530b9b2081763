"""The control plane's configuration from the environment: tiers and their weights."""

from __future__ import annotations

import pytest

from scheduler.config import Config
from scheduler.errors import InvalidArgument


def test_tier_weights_default_to_the_configured_tiers() -> None:
    assert dict(Config.from_env({}).tier_weights) == {"free": 1, "standard": 2, "premium": 4}
    only = Config.from_env({"CRONSCALE_TIERS": "standard,gold"})
    assert dict(only.tier_weights) == {"standard": 2}


def test_tier_weights_are_read_from_the_environment() -> None:
    c = Config.from_env({"CRONSCALE_TIERS": "standard,gold", "CRONSCALE_TIER_WEIGHTS": "gold=9"})
    assert dict(c.tier_weights) == {"gold": 9}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("premium", "is not tier=weight"),
        ("gold=2", "tier 'gold' is not one of CRONSCALE_TIERS"),
        ("premium=0", "must be an integer from 1 to 100"),
        ("premium=x", "must be an integer from 1 to 100"),
        ("premium=101", "must be an integer from 1 to 100"),
    ],
)
def test_bad_tier_weights_name_the_variable_and_the_problem(raw: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        Config.from_env({"CRONSCALE_TIER_WEIGHTS": raw})
    assert e.value.field == "CRONSCALE_TIER_WEIGHTS" and problem in str(e.value)


def test_fire_ahead_is_300_ms_by_default_and_read_from_the_environment() -> None:
    assert Config.from_env({}).fire_ahead_ms == 300
    assert Config.from_env({"CRONSCALE_FIRE_AHEAD_MS": "0"}).fire_ahead_ms == 0
    assert Config.from_env({"CRONSCALE_FIRE_AHEAD_MS": "750"}).fire_ahead_ms == 750


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("-1", "must be between 0 and 1000 (the scanner's lookahead), got -1"),
        ("1500", "must be between 0 and 1000 (the scanner's lookahead), got 1500"),
        ("soon", "must be an integer, got 'soon'"),
    ],
)
def test_a_bad_fire_ahead_names_the_variable_and_the_problem(raw: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        Config.from_env({"CRONSCALE_FIRE_AHEAD_MS": raw})
    assert e.value.field == "CRONSCALE_FIRE_AHEAD_MS"
    assert problem in str(e.value)


def test_the_schedule_cache_holds_200k_by_default_and_0_turns_it_off() -> None:
    assert Config.from_env({}).schedule_cache == 200_000
    assert Config.from_env({"CRONSCALE_SCHEDULE_CACHE": "0"}).schedule_cache == 0
    assert Config.from_env({"CRONSCALE_SCHEDULE_CACHE": "5000"}).schedule_cache == 5000


@pytest.mark.parametrize(
    ("raw", "problem"), [("-1", "must be 0 or more, got -1"), ("lots", "must be an integer")]
)
def test_a_bad_schedule_cache_size_names_the_variable_and_the_problem(
    raw: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument) as e:
        Config.from_env({"CRONSCALE_SCHEDULE_CACHE": raw})
    assert e.value.field == "CRONSCALE_SCHEDULE_CACHE"
    assert problem in str(e.value)
