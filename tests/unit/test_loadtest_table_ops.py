"""The harness's per-firing Cassandra operations (loadtest.table_ops): the arithmetic and the
report line; the counters themselves are read in tests/integration/test_loadtest_table_ops.py."""

from __future__ import annotations

from loadtest.table_ops import per_firing_ops, report_line


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
