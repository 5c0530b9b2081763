"""A process's CPU by thread, from /proc: what a JVM's sampling profile cannot show.

JFR samples Java code only: not the collector's threads, not the JIT's, and not the time a
thread spends in the kernel (socket writes, futex waits and wake-ups between Cassandra's
request stages). ``/proc/<pid>/task/<tid>/stat`` has every thread's user and system CPU, so two
readings around the measured window say where all of a process's CPU went, at the cost of
reading a few hundred small files.

Threads are grouped by name with their numbers taken out (``GC Thread#3`` and ``GC Thread#0``
are ``GC Thread#``). The kernel truncates a thread's name to 15 characters, and Cassandra names
its request threads after the stage they last worked for (``Native-Transpor``,
``MutationStage-#``, ``ReadStage-#``): one pool of threads (its SEP executor) moving between
stages, so those names are one group here, ``request stages``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_DIGITS = re.compile(r"#?\d+")

# Cassandra's shared request pool, whatever stage a thread last worked for (names as the
# kernel keeps them: at most 15 characters, numbers taken out).
_REQUEST_STAGES = (
    "Native-Transpor",
    "MutationStage-#",
    "ReadStage-#",
    "CounterMutation",
    "ViewMutationSta",
)
REQUEST_STAGES = "request stages"


@dataclass(frozen=True)
class ThreadCpu:
    """CPU seconds of a group of threads: in user space and in the kernel."""

    user: float
    system: float

    @property
    def total(self) -> float:
        return self.user + self.system


def group_of(name: str) -> str:
    """The group a thread of this name counts in: its name with numbers as ``#``, Cassandra's
    request stages as one."""
    group = _DIGITS.sub("#", name)
    return REQUEST_STAGES if group in _REQUEST_STAGES else group


def thread_cpu(pid: int) -> dict[str, ThreadCpu]:
    """CPU seconds so far of each live thread of ``pid``, by thread id (as ``name/tid``, so a
    thread that renames itself stays one entry). Empty if the process is gone."""
    out: dict[str, ThreadCpu] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{tid}"] = ThreadCpu(int(fields[11]) / _TICKS, int(fields[12]) / _TICKS)
    return out


def by_group(
    before: Mapping[str, ThreadCpu], after: Mapping[str, ThreadCpu]
) -> dict[str, ThreadCpu]:
    """The CPU each group of threads used between two readings of ``thread_cpu``. A thread
    started meanwhile counts from zero; one that ended meanwhile is not counted (its CPU is
    gone from /proc with it). A thread that renamed itself counts under its new name."""
    by_tid = {key.rpartition("/")[2]: cpu for key, cpu in before.items()}
    user: dict[str, float] = {}
    system: dict[str, float] = {}
    for key, cpu in after.items():
        name, _, tid = key.rpartition("/")
        was = by_tid.get(tid, ThreadCpu(0.0, 0.0))
        group = group_of(name)
        user[group] = user.get(group, 0.0) + max(0.0, cpu.user - was.user)
        system[group] = system.get(group, 0.0) + max(0.0, cpu.system - was.system)
    return {g: ThreadCpu(user[g], system[g]) for g in user}


def thread_line(process: str, groups: Mapping[str, ThreadCpu], fired: float, top: int = 6) -> str:
    """A report line: ``process``'s CPU per firing by its largest groups of threads, each with
    its share spent in the kernel."""
    total = sum(g.total for g in groups.values())
    if total <= 0 or fired <= 0:
        return f"- {process}'s CPU by thread: nothing measured"
    largest = sorted(groups.items(), key=lambda kv: (-kv[1].total, kv[0]))[:top]
    parts = [
        f"{name} {1e3 * cpu.total / fired:.3f} ({cpu.system / cpu.total:.0%} in the kernel)"
        if cpu.total > 0
        else f"{name} 0.000"
        for name, cpu in largest
    ]
    kernel = sum(g.system for g in groups.values()) / total
    return (
        f"- {process}'s CPU by thread, CPU-ms per firing (/proc; {kernel:.0%} of it in the "
        f"kernel): " + ", ".join(parts)
    )
