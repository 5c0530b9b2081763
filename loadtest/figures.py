"""The firing harness's figures: a JSON of every number in the report, and a PNG with lag
percentiles over time, handler starts per second, and CPU by process.

Series come from the handlers' own record (each run's scheduled time and start lag) and from
``/proc`` samples of every measured process taken once a second during the window.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BUCKET_S = 5


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile: the value at rank ``q * n`` of the sorted values (NaN for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def lag_series(timeline: Sequence[tuple[float, float]], t0: float) -> list[dict[str, float]]:
    """Per ``BUCKET_S`` seconds of scheduled time from ``t0``: runs, lag p50/p99/max."""
    buckets: dict[int, list[float]] = defaultdict(list)
    for scheduled, lag in timeline:
        buckets[int((scheduled - t0) // BUCKET_S)].append(lag)
    return [
        {
            "t": b * BUCKET_S,
            "runs": len(lags),
            "p50": round(pct(lags, 0.5), 4),
            "p99": round(pct(lags, 0.99), 4),
            "max": round(max(lags), 4),
        }
        for b, lags in sorted(buckets.items())
    ]


def start_series(timeline: Sequence[tuple[float, float]], t0: float) -> list[dict[str, float]]:
    """Handler starts per second of wall time from ``t0``."""
    per_second: dict[int, int] = defaultdict(int)
    for scheduled, lag in timeline:
        per_second[int(scheduled + lag - t0)] += 1
    return [{"t": s, "starts": n} for s, n in sorted(per_second.items())]


def cpu_series(
    samples: Sequence[tuple[float, Mapping[str, float]]], t0: float
) -> list[dict[str, Any]]:
    """Per process, the share of one core used between consecutive samples (1.0 = a core)."""
    out: list[dict[str, Any]] = []
    for (ta, a), (tb, b) in itertools.pairwise(samples):
        dt = tb - ta
        if dt <= 0:
            continue
        out.append(
            {"t": round(tb - t0, 2), **{n: round((b[n] - a[n]) / dt, 4) for n in b if n in a}}
        )
    return out


def write(
    stem: Path,
    summary: Mapping[str, Any],
    timeline: Sequence[tuple[float, float]],
    samples: Sequence[tuple[float, Mapping[str, float]]],
    t0: float,
) -> tuple[Path, Path]:
    """Writes ``<stem>.json`` (the summary and the three series) and ``<stem>.png``."""
    lags, starts = lag_series(timeline, t0), start_series(timeline, t0)
    cpu = cpu_series(samples, t0)
    doc = {**summary, "lag_by_5s": lags, "starts_per_s": starts, "cpu_by_s": cpu}
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    png_path = stem.with_suffix(".png")
    _plot(png_path, str(summary.get("title", stem.name)), lags, starts, cpu)
    return json_path, png_path


def _plot(
    path: Path,
    title: str,
    lags: Sequence[Mapping[str, float]],
    starts: Sequence[Mapping[str, float]],
    cpu: Sequence[Mapping[str, Any]],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lag, ax_rate, ax_cpu) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    fig.suptitle(title)
    t = [row["t"] for row in lags]
    for key in ("p50", "p99", "max"):
        ax_lag.plot(t, [row[key] for row in lags], label=key)
    ax_lag.set_ylabel(f"fire lag, s (per {BUCKET_S} s of slots)")
    ax_lag.legend(loc="upper right")
    ax_lag.grid(alpha=0.3)
    ax_rate.plot([row["t"] for row in starts], [row["starts"] for row in starts])
    ax_rate.set_ylabel("handler starts / s")
    ax_rate.grid(alpha=0.3)
    names = sorted({k for row in cpu for k in row if k != "t"})
    for name in names:
        share = [100 * row.get(name, 0.0) for row in cpu]
        ax_cpu.plot([row["t"] for row in cpu], share, label=name)
    ax_cpu.set_ylabel("CPU, % of one core")
    ax_cpu.set_xlabel("seconds into the window")
    ax_cpu.legend(loc="upper right", fontsize="small")
    ax_cpu.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
