"""The firing harness's figures: the series it plots and the JSON and PNG it writes."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest import figures


def test_series_bucket_lags_count_starts_and_turn_cpu_seconds_into_core_shares() -> None:
    t0 = 1_000.0
    timeline = [(t0 + 0.2, 0.1), (t0 + 1.0, 0.3), (t0 + 4.9, 0.2), (t0 + 5.0, 2.0)]
    assert figures.lag_series(timeline, t0) == [
        {"t": 0, "runs": 3, "p50": 0.2, "p99": 0.3, "max": 0.3},
        {"t": 5, "runs": 1, "p50": 2.0, "p99": 2.0, "max": 2.0},
    ]
    assert figures.start_series(timeline, t0) == [
        {"t": 0, "starts": 1},
        {"t": 1, "starts": 1},
        {"t": 5, "starts": 1},
        {"t": 7, "starts": 1},
    ]
    samples = [(t0, {"api": 1.0}), (t0 + 2, {"api": 2.5}), (t0 + 2, {"api": 3.0})]
    assert figures.cpu_series(samples, t0) == [{"t": 2.0, "api": 0.75}]


def test_write_produces_the_numbers_and_a_png(tmp_path: Path) -> None:
    t0 = 1_000.0
    json_path, png_path = figures.write(
        tmp_path / "firing-x",
        {"title": "spread 60/min", "lost": 0},
        [(t0 + i, 0.1 * (i % 3)) for i in range(20)],
        [(t0 + i, {"api": 0.5 * i, "worker0": 0.2 * i}) for i in range(5)],
        t0,
    )
    doc = json.loads(json_path.read_text())
    assert doc["lost"] == 0 and len(doc["lag_by_5s"]) == 4 and len(doc["cpu_by_s"]) == 4
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
