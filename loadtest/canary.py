"""The box's own speed beside a benchmark: a fixed pure-Python workload, run every few seconds
in a process of its own and timed on its own CPU clock.

This machine is a 2-vCPU KVM guest whose speed drifts: the same code has cost 0.62 and 0.93
CPU-ms a firing within an hour, every process at once, Cassandra included, with no steal time
counted by the kernel (``loadtest/README.md``). A firing report that also says how long a fixed
piece of work took in its window tells a slower box from slower code: a change that costs more
CPU per firing while the canary's unit costs the same is the change's.

The unit is CPU time, not wall time: waiting for a core is not counted, only how fast the core
ran the work once it had it. Each sample is the median of ``REPEATS`` units (~2 ms each).

Run by the firing harness (``loadtest.firing``); alone: ``python -m loadtest.canary --every 2
--out canary.txt`` appends ``<unix time> <CPU µs a unit>`` lines until stopped.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.figures import pct

REPEATS = 5
DEFAULT_EVERY_S = 2.0


def unit() -> int:
    """The fixed work: integer arithmetic, dict stores, string formatting and joining (what
    the Python processes of a firing do most), the same every call."""
    acc = 0
    table: dict[int, int] = {}
    for i in range(6_000):
        acc = (acc + i * i) % 1_000_003
        table[i & 511] = acc
    text = ",".join(f"{k}:{v}" for k, v in table.items())
    return acc + len(text)


def sample(repeats: int = REPEATS) -> float:
    """CPU microseconds a unit: the median of ``repeats`` units, each on the thread's clock."""
    costs = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        unit()
        costs.append((time.thread_time_ns() - t0) / 1_000)
    return statistics.median(costs)


@dataclass(frozen=True)
class Speed:
    """The canary's samples in a window: their count, median and 90th percentile (µs a unit)."""

    samples: int
    median_us: float
    p90_us: float


def read_samples(path: Path) -> list[tuple[float, float]]:
    """The (unix time, µs a unit) lines the canary wrote; a torn last line is skipped."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) == 2:
            try:
                out.append((float(fields[0]), float(fields[1])))
            except ValueError:
                continue
    return out


def speed_between(samples: Iterable[tuple[float, float]], since: float, until: float) -> Speed:
    """The samples taken in [since, until) (unix times), summed up; NaN figures if none."""
    costs = [us for at, us in samples if since <= at < until]
    if not costs:
        return Speed(0, float("nan"), float("nan"))
    return Speed(len(costs), statistics.median(costs), pct(costs, 0.9))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--every", type=float, default=DEFAULT_EVERY_S, help="seconds between samples"
    )
    parser.add_argument("--out", type=Path, required=True, help="file to append samples to")
    args = parser.parse_args(argv)
    if args.every <= 0:
        parser.error(f"--every must be positive, got {args.every}")
    with args.out.open("a") as out:
        while True:
            us = sample()
            out.write(f"{time.time():.3f} {us:.1f}\n")
            out.flush()
            time.sleep(args.every)


if __name__ == "__main__":
    raise SystemExit(main())
