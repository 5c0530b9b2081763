"""A process's CPU by thread (loadtest.threads): grouping, the readings' arithmetic, /proc."""

from __future__ import annotations

import os
import threading
import time

import pytest

from loadtest.threads import REQUEST_STAGES, ThreadCpu, by_group, group_of, thread_cpu, thread_line


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("GC Thread#3", "GC Thread#"),
        ("G1 Conc#0", "G# Conc#"),
        ("C2 CompilerThre", "C# CompilerThre"),
        ("epollEventLoopG", "epollEventLoopG"),
        ("MutationStage-12", REQUEST_STAGES),
        ("ReadStage-3", REQUEST_STAGES),
        ("Native-Transpor", REQUEST_STAGES),
        ("CounterMutation", REQUEST_STAGES),
        ("MemtableFlushWr", "MemtableFlushWr"),
    ],
)
def test_threads_are_grouped_by_name_without_their_numbers(name: str, group: str) -> None:
    assert group_of(name) == group


def test_the_readings_difference_counts_each_thread_once_under_its_last_name() -> None:
    before = {
        "GC Thread#0/10": ThreadCpu(1.0, 0.5),
        "GC Thread#1/11": ThreadCpu(2.0, 0.0),
        "ReadStage-1/20": ThreadCpu(5.0, 1.0),
        "gone/30": ThreadCpu(9.0, 9.0),
    }
    after = {
        "GC Thread#0/10": ThreadCpu(1.5, 0.5),
        "GC Thread#1/11": ThreadCpu(2.25, 0.25),
        # The same thread, renamed by the stage it worked for last: one request thread.
        "MutationStage-4/20": ThreadCpu(6.0, 3.0),
        # Started after the first reading: all of its CPU is the window's.
        "MemtableFlushWriter/40": ThreadCpu(0.5, 0.25),
    }
    groups = by_group(before, after)
    assert groups == {
        "GC Thread#": ThreadCpu(0.75, 0.25),
        REQUEST_STAGES: ThreadCpu(1.0, 2.0),
        "MemtableFlushWriter": ThreadCpu(0.5, 0.25),
    }
    assert groups[REQUEST_STAGES].total == 3.0


def test_the_report_line_gives_cpu_ms_per_firing_and_the_kernel_share() -> None:
    groups = {REQUEST_STAGES: ThreadCpu(6.0, 3.0), "GC Thread#": ThreadCpu(1.0, 0.0)}
    line = thread_line("Cassandra", groups, fired=10_000)
    assert line == (
        "- Cassandra's CPU by thread, CPU-ms per firing (/proc; 30% of it in the kernel): "
        "request stages 0.900 (33% in the kernel), GC Thread# 0.100 (0% in the kernel)"
    )
    assert thread_line("Kafka", {}, fired=10_000) == "- Kafka's CPU by thread: nothing measured"
    assert thread_line("Kafka", groups, fired=0) == "- Kafka's CPU by thread: nothing measured"


def test_a_busy_thread_of_this_process_shows_its_cpu() -> None:
    started, go, spun, release = (threading.Event() for _ in range(4))
    tid: list[int] = []

    def spin() -> None:
        tid.append(threading.get_native_id())
        started.set()
        go.wait()  # read once before it spins
        # Its own CPU (thread_time): the process's other threads do not shorten the spin.
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        spun.set()
        release.wait()  # and once more before it ends

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        started.wait()
        before = thread_cpu(os.getpid())
        go.set()
        spun.wait()
        during = thread_cpu(os.getpid())
    finally:
        go.set()
        release.set()
        worker.join()
    key = next(k for k in during if k.endswith(f"/{tid[0]}"))
    assert key in before
    assert during[key].total - before[key].total >= 0.2
    assert sum(g.total for g in by_group(before, during).values()) >= 0.2
    # An ended thread leaves /proc: read once it is gone, its CPU is not counted.
    assert not any(k.endswith(f"/{tid[0]}") for k in thread_cpu(os.getpid()))


def test_a_process_that_is_gone_has_no_threads() -> None:
    assert thread_cpu(2**22 + 12345) == {}
