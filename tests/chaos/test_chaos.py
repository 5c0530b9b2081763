"""The short fault-injection proof: every kind of fault on the real fleet, judged from the
handlers' execution log. Nothing lost, nothing stuck; the duplicate rate is printed, not
asserted (a worker killed with outcomes the API had not acknowledged, or while Kafka was down,
has those runs re-run by its successor; see docs/operations/chaos.md)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.harness import (
    PROCESS_KILLS,
    SERVICE_RESTARTS,
    STOP_DISPATCHER,
    ChaosOptions,
    run_chaos,
)

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(600)]

SHORT = ChaosOptions(
    duration_s=150.0,
    schedules=150,
    kill_every_s=22.0,
    restart_services=True,
    drain_timeout_s=60.0,
)
"""About 4 minutes in all: ~70 slots/s over ~140 s of window, 5 process SIGKILLs, a SIGSTOP
past the shard lease, a Kafka and a Cassandra restart."""


def test_nothing_lost_or_stuck_under_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_chaos(dataclasses.replace(SHORT, out_dir=tmp_path))
    with capsys.disabled():
        print("\n" + report.render())

    kinds = Counter(f.kind for f in report.faults)
    expected_kinds = {*PROCESS_KILLS, STOP_DISPATCHER, *SERVICE_RESTARTS}
    assert expected_kinds <= set(kinds), f"faults injected: {dict(kinds)}"
    assert report.expected >= 1000, f"only {report.expected} slots in the window"
    assert report.malformed_lines == 0
    assert not report.lost, f"{len(report.lost)} slots lost:\n{report.render()}"
    assert not report.stuck, f"{len(report.stuck)} runs stuck:\n{report.render()}"
    assert report.dlq.ok, f"DLQ: {report.dlq.render()}"
    assert not report.silent_workers, f"workers silent at the end:\n{report.render()}"
    # Reported, not asserted (issue 7 asks for < 0.5 % once the worker stops re-running).
    print(f"duplicate rate {100 * report.duplicate_rate:.2f}%")
