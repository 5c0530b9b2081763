"""loadtest.hot_path's pure parts: which pass it reports, and refused arguments."""

from __future__ import annotations

import pytest

from loadtest.hot_path import main, third_best


def test_the_third_best_pass_is_reported() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    durations = iter([5.0, 1.0, 4.0, 2.0, 3.0])

    def step() -> None:
        now[0] += next(durations)

    assert third_best(step, 5, clock) == 3.0
    durations = iter([7.0])
    assert third_best(step, 1, clock) == 7.0  # fewer than three passes: the best


@pytest.mark.parametrize("flag", ["--events", "--messages", "--repeat"])
def test_a_count_below_one_is_refused_naming_the_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([flag, "0"])
    assert f"{flag} must be at least 1" in capsys.readouterr().err


def test_a_negative_run_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "-1"])
    assert "--runs must be 0 or more" in capsys.readouterr().err
