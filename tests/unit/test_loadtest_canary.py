"""The box's speed beside a benchmark (loadtest.canary): the samples' arithmetic, the file it
writes, and the process the firing harness runs."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import time
from pathlib import Path

from loadtest.canary import Speed, read_samples, sample, speed_between, unit

REPO = Path(__file__).resolve().parents[2]


def test_the_unit_is_the_same_work_every_time() -> None:
    assert unit() == unit()
    assert sample(repeats=3) > 0


def test_the_window_s_samples_are_summed_up_and_the_rest_left_out() -> None:
    samples = [(float(t), float(us)) for t, us in enumerate(range(1000, 1100, 10))]
    # t 0..9 with 1000, 1010, ... 1090 µs; the window [2, 7) holds 1020..1060.
    assert speed_between(samples, 2, 7) == Speed(samples=5, median_us=1040.0, p90_us=1060.0)
    empty = speed_between(samples, 20, 30)
    assert empty.samples == 0 and math.isnan(empty.median_us) and math.isnan(empty.p90_us)


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "canary.txt"
    path.write_text("1700000000.000 1012.5\nnot a sample\n1700000002.000 1020.0\n1700000004.0")
    assert read_samples(path) == [(1700000000.0, 1012.5), (1700000002.0, 1020.0)]
    assert read_samples(tmp_path / "missing.txt") == []


def test_the_process_appends_a_sample_every_interval_until_stopped(tmp_path: Path) -> None:
    out = tmp_path / "canary.txt"
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest.canary", "--every", "0.2", "--out", str(out)], cwd=REPO
    )
    try:
        deadline = time.monotonic() + 20
        while len(read_samples(out)) < 3:
            assert proc.poll() is None, "the canary exited"
            assert time.monotonic() < deadline, "no three samples in 20 s"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    got = read_samples(out)
    assert all(started <= at <= time.time() and us > 0 for at, us in got)
    assert all(b[0] - a[0] >= 0.2 for a, b in itertools.pairwise(got))


def test_a_non_positive_interval_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loadtest.canary", "--every", "0", "--out", str(tmp_path / "c")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "--every must be positive, got 0.0" in done.stderr
