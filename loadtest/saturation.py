"""The saturation sweep: the highest firing rate the stack sustains at fire lag p99 <= 2 s.

    python -m loadtest.saturation --rates 60000 70000 80000 90000 100000 --minutes 1

Runs the spread firing benchmark (``loadtest.firing``, a fresh keyspace and fresh processes per
step) at each rate in turn, lowest first, and stops after the first rate that is not sustained:
a slot of the window lost, a slot run twice, fire lag p99 above ``--p99``, or fewer firings in
the window than 95 % of the rate. The sustained rate is the highest step below that one.

Writes ``loadtest/reports/saturation-<time>.md`` (one row per step) and a JSON of every step's
figures, and prints the report.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from loadtest import firing

# A step whose window fired fewer than this share of the offered rate fell behind.
KEPT_UP = 0.95


def verdict(step: Mapping[str, Any], *, p99_limit: float) -> str:
    """Why a step's rate was not sustained, or "" if it was."""
    rate = float(step["rate_per_min"])
    fired_per_min = float(step["fired"]) / float(step["wall_s"]) * 60
    p99 = float(step["lag_s"]["p99"])
    if step["lost"]:
        return f"{step['lost']:,} slots lost"
    if step["ran_twice"]:
        return f"{step['ran_twice']:,} slots ran twice"
    if math.isnan(p99) or p99 > p99_limit:
        return f"lag p99 {p99:.2f} s > {p99_limit:g} s"
    if fired_per_min < KEPT_UP * rate:
        return f"fired {fired_per_min:,.0f}/min, under {KEPT_UP:.0%} of the rate"
    return ""


def sweep(
    rates: Sequence[int],
    bench: Callable[[int], Mapping[str, Any]],
    *,
    p99_limit: float,
) -> tuple[list[tuple[Mapping[str, Any], str]], int]:
    """Runs ``bench`` at each rate, lowest first, until one is not sustained. Returns every
    step run with its verdict, and the highest sustained rate (0 if none)."""
    steps: list[tuple[Mapping[str, Any], str]] = []
    sustained = 0
    for rate in sorted(rates):
        step = bench(rate)
        why = verdict(step, p99_limit=p99_limit)
        steps.append((step, why))
        if why:
            break
        sustained = rate
    return steps, sustained


def report(
    steps: Sequence[tuple[Mapping[str, Any], str]], sustained: int, *, p99_limit: float
) -> str:
    """The sweep's markdown report."""
    lines = [
        f"# Saturation sweep {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"**Sustained: {sustained:,} firings/min ({sustained / 60:,.0f}/s)** at lag p99 <= "
        f"{p99_limit:g} s, nothing lost or run twice"
        if sustained
        else f"**No rate was sustained** at lag p99 <= {p99_limit:g} s",
        "",
        "| offered /min | fired /min | lag p50 s | lag p99 s | lost | twice | CPU ms per firing "
        "| busy cores | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for step, why in steps:
        fired_per_min = float(step["fired"]) / float(step["wall_s"]) * 60
        lines.append(
            f"| {step['rate_per_min']:,} | {fired_per_min:,.0f} | {step['lag_s']['p50']:.3f} "
            f"| {step['lag_s']['p99']:.3f} | {step['lost']:,} | {step['ran_twice']:,} "
            f"| {step['cpu_ms_per_firing_total']:.3f} | {step.get('busy_cores', math.nan):.2f} "
            f"| {why or 'sustained'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.saturation", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--rates",
        type=int,
        nargs="+",
        default=[60_000, 70_000, 80_000, 90_000, 100_000, 120_000],
        help="firings per minute to try, lowest first",
    )
    p.add_argument("--minutes", type=float, default=1.0, help="measured minutes per step")
    p.add_argument("--drain", type=float, default=30.0, help="seconds for a step's last runs")
    p.add_argument("--p99", type=float, default=2.0, help="the lag p99 a rate must keep, s")
    args = p.parse_args(argv)
    if any(r <= 0 for r in args.rates):
        p.error("--rates: every rate must be a positive number of firings per minute")
    if args.p99 <= 0:
        p.error("--p99: must be a positive number of seconds")

    def bench(rate: int) -> Mapping[str, Any]:
        return firing.run(
            ["--rate", str(rate), "--minutes", str(args.minutes), "--drain", str(args.drain)]
        )

    steps, sustained = sweep(args.rates, bench, p99_limit=args.p99)
    text = report(steps, sustained, p99_limit=args.p99)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    firing.REPORTS.mkdir(parents=True, exist_ok=True)
    (firing.REPORTS / f"saturation-{stamp}.md").write_text(text)
    (firing.REPORTS / f"saturation-{stamp}.json").write_text(
        json.dumps(
            {
                "sustained_per_min": sustained,
                "p99_limit_s": args.p99,
                "steps": [{**step, "verdict": why} for step, why in steps],
            },
            indent=2,
            default=str,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
