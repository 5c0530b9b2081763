"""The harness's per-firing Cassandra operations (loadtest.table_ops): the arithmetic and the
report line; the counters themselves are read in tests/integration/test_loadtest_table_ops.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from loadtest.table_ops import (
    Compactions,
    compactions_between,
    compactions_line,
    per_firing_ops,
    report_line,
)


def test_operations_per_firing_are_what_moved_in_the_window() -> None:
    before = {("runs", "write"): 1_000, ("timers", "read"): 10, ("schedules", "read"): 500}
    after = {
        ("runs", "write"): 3_000,
        ("timers", "read"): 60,
        ("timers", "write"): 300,  # a table first counted in the window
        ("schedules", "read"): 500,  # did not move: left out
    }
    per = per_firing_ops(before, after, fired=1_000)
    assert per == {"runs": {"write": 2.0}, "timers": {"read": 0.05, "write": 0.3}}
    assert per_firing_ops(before, after, fired=0) == {}


def test_the_report_line_puts_the_busiest_table_first() -> None:
    line = report_line({"timers": {"read": 0.05, "write": 0.3}, "runs": {"write": 2.0}})
    tiny = report_line({"api_keys": {"read": 0.000123}})
    assert line == (
        "- Cassandra's operations per firing in the window, by its own counters: "
        "runs 2 partition writes; timers 0.05 partition reads, 0.3 partition writes"
    )
    assert tiny.endswith("api_keys 0.000123 partition reads")  # three figures, however small
    assert report_line({}) == "- Cassandra's operations per firing: none counted"


def test_compactions_in_the_window_are_summed_by_table_the_most_bytes_first() -> None:
    t0 = datetime(2026, 12, 6, 22, 0, tzinfo=UTC)
    rows = [
        ("system", "paxos", (t0 + timedelta(seconds=10)).replace(tzinfo=None), 65 << 20),
        ("system", "paxos", (t0 + timedelta(seconds=50)).replace(tzinfo=None), 65 << 20),
        ("cs_bench_1", "runs", t0.replace(tzinfo=None), 3 << 20),  # at the start: in
        ("cs_bench_1", "timers", (t0 + timedelta(seconds=60)).replace(tzinfo=None), 1),  # end: out
        ("cs_bench_1", "timers", t0 - timedelta(seconds=1), 1),  # aware, before: out
    ]
    found = compactions_between(rows, t0, t0 + timedelta(seconds=60))
    assert found == [
        Compactions("system.paxos", 2, 130 << 20),
        Compactions("cs_bench_1.runs", 1, 3 << 20),
    ]
    assert compactions_line(found, keyspace="cs_bench_1") == (
        "- Cassandra's compactions that ended in the window, by table: "
        "system.paxos 2 (130.0 MiB read); <bench>.runs 1 (3.0 MiB read)"
    )
    assert compactions_line([], keyspace="cs_bench_1").endswith("in the window: none")
