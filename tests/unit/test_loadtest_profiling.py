"""The firing harness's window profiles (loadtest.profiling): the summary of py-spy's stacks,
the flag's bounds, and a real py-spy recording of a process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.firing import run
from loadtest.profiling import WindowProfiler, find_pyspy, top_functions


def test_the_top_functions_count_self_and_inclusive_shares_per_function() -> None:
    stacks = [
        "main (app.py:1);loop (app.py:5);work (app.py:9) 6",
        "main (app.py:1);loop (app.py:6);work (app.py:10) 2",  # other lines, same functions
        "main (app.py:1);loop (app.py:5);loop (app.py:7) 2",  # recursion counts once
        "not a stack line",
        "",
    ]
    samples, table = top_functions(stacks, n=3)
    assert samples == 10
    self_part = table[table.index("self:") + 1 : table.index("inclusive:") - 1]
    inclusive = table[table.index("inclusive:") + 1 :]
    assert self_part == [" 80.0 % work (app.py)", " 20.0 % loop (app.py)"]
    assert inclusive[:2] == ["100.0 % loop (app.py)", "100.0 % main (app.py)"]
    assert inclusive[2] == " 80.0 % work (app.py)"


def test_no_samples_says_so() -> None:
    assert top_functions([]) == (0, ["no samples"])


def test_a_profile_longer_than_the_window_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        run(["--minutes", "1", "--profile", "61"])
    assert "--profile: must be between 0 and the window (60 s)" in capsys.readouterr().err


def test_a_python_process_is_recorded_and_summed_up(tmp_path: Path) -> None:
    """py-spy attached to a real process for a second: its stacks and its top functions."""
    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "def spin():\n"
            "    end = time.monotonic() + 30\n"
            "    while time.monotonic() < end:\n"
            "        pass\n"
            "spin()\n",
        ]
    )
    try:
        time.sleep(0.3)  # let the interpreter reach spin()
        profiler = WindowProfiler(tmp_path / "profile", 1.0, find_pyspy(), jcmd=None)
        profiler.start({"spinner": busy.pid})
        lines = profiler.finish()
    finally:
        busy.kill()
        busy.wait()
    top = (tmp_path / "profile" / "spinner.top.txt").read_text()
    assert "spin (<string>)" in top, top + (tmp_path / "profile/spinner.pyspy.log").read_text()
    assert lines and "spinner.pyspy.txt" in lines[0] and "spinner.top.txt" in lines[0]
