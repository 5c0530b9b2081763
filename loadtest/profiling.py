"""Profiles of the measured window: py-spy for the Python processes, JFR for the JVMs.

``python -m loadtest.firing ... --profile 40`` records the first 40 s of the measured window
(not of the warm-up minute, whose first firings read every schedule and so profile another
path) and writes, in ``loadtest/reports/profile-<token>/``:

- ``<process>.pyspy.txt``: py-spy's collapsed stacks (``-f raw``, 100 samples a second, of
  the thread holding the GIL), and ``<process>.top.txt``: the functions with the largest
  shares of its samples, their own (self) and with what they call (inclusive);
- ``cassandra.jfr``: a JFR recording (``settings=profile``); read with
  ``jfr print --events jdk.ExecutionSample --stack-depth 200 cassandra.jfr``, or open in JDK
  Mission Control. Not Kafka's: recorded the same way it spent ten times its usual CPU (0.15
  against ~0.015 CPU-ms per firing), for 2-3 % of a firing's cost.

The profilers cost CPU of their own on the same two cores (py-spy's processes, JFR inside
Cassandra): a profiled run's lag and CPU figures are not comparable with an unprofiled one's.

py-spy attaches to running processes (ptrace: run as root, or with ``CAP_SYS_PTRACE``); it is a
development dependency of the project. ``jcmd`` comes with the JDK that runs the local stack.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

JVMS = ("cassandra", "kafka")
# The JVMs recorded with JFR (Kafka's share is too small to be worth what JFR costs it).
JFR_OF = ("cassandra",)
PYSPY_RATE = 100
# A frame as py-spy writes it: "function (path/to/file.py:123)".
_LINE = re.compile(r":\d+\)$")


class ProfilerMissing(Exception):
    """A profiler the run asked for is not installed."""


def find_pyspy() -> str:
    """py-spy beside this interpreter (the project's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise ProfilerMissing(
            "--profile: py-spy is not installed (it is a development dependency: "
            "`make install`, or `pip install py-spy`)"
        )
    return found


def find_jcmd(java: str) -> str:
    """jcmd of the JDK at ``java`` (the local stack's), else on PATH."""
    beside = Path(java).resolve().parent / "jcmd"
    if beside.exists():
        return str(beside)
    found = shutil.which("jcmd")
    if found is None:
        raise ProfilerMissing(f"--profile: no jcmd beside {java} or on PATH (a JDK's tool)")
    return found


def top_functions(stacks: Iterable[str], n: int = 30) -> tuple[int, list[str]]:
    """The samples in py-spy's collapsed ``stacks`` (lines ``frame;frame;... count``) and a
    table of the ``n`` functions with the largest self and inclusive shares, line numbers
    dropped (a function counts once per sample however deep it recurses)."""
    own: Counter[str] = Counter()
    within: Counter[str] = Counter()
    total = 0
    for line in stacks:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            within[frame] += samples
    if not total:
        return 0, ["no samples"]
    lines = [f"{total} samples", "", "self:"]
    lines += [f"{100 * c / total:5.1f} % {f}" for f, c in _largest(own, n)]
    lines += ["", "inclusive:"]
    lines += [f"{100 * c / total:5.1f} % {f}" for f, c in _largest(within, n)]
    return total, lines


def _largest(counts: Counter[str], n: int) -> list[tuple[str, int]]:
    """The ``n`` largest counts, ties by name (the same table for the same stacks)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


@dataclass
class WindowProfiler:
    """Records every measured process for ``seconds``, into ``out``."""

    out: Path
    seconds: float
    pyspy: str
    jcmd: str | None
    _running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _recorded: list[str] = field(default_factory=list)

    def start(self, pids: Mapping[str, int]) -> None:
        """Starts py-spy on each Python process and a JFR recording in Cassandra."""
        self.out.mkdir(parents=True, exist_ok=True)
        duration = max(1, round(self.seconds))
        for name, pid in pids.items():
            if name in JVMS:
                if self.jcmd is None or name not in JFR_OF:
                    continue
                target = self.out / f"{name}.jfr"
                done = subprocess.run(
                    [
                        self.jcmd,
                        str(pid),
                        "JFR.start",
                        f"name=cronscale-bench-{name}",
                        f"duration={duration}s",
                        f"filename={target}",
                        "settings=profile",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                if done.returncode != 0:
                    print(f"--profile: JFR of {name} did not start: {done.stdout}{done.stderr}")
                    continue
                self._recorded.append(f"{name}.jfr")
            else:
                with (self.out / f"{name}.pyspy.log").open("wb") as log:
                    self._running[name] = subprocess.Popen(
                        [
                            self.pyspy,
                            "record",
                            "--pid",
                            str(pid),
                            "--duration",
                            str(duration),
                            "--rate",
                            str(PYSPY_RATE),
                            "--format",
                            "raw",
                            "--threads",
                            # Only the thread holding the GIL: a sample is Python at work.
                            # Without it, py-spy counted the driver's I/O thread as busy while
                            # it waited inside libev (the api's I/O thread: ~25 % of py-spy's
                            # samples, 3 % of the process's CPU by /proc/<pid>/task).
                            "--gil",
                            "--nonblocking",
                            "--output",
                            str(self.out / f"{name}.pyspy.txt"),
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )

    def finish(self) -> list[str]:
        """Waits for py-spy, writes each process's top functions; returns report lines."""
        for name, proc in self._running.items():
            try:
                proc.wait(timeout=self.seconds + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
            stacks = self.out / f"{name}.pyspy.txt"
            if not stacks.exists():
                print(f"--profile: py-spy wrote nothing for {name} (see {name}.pyspy.log)")
                continue
            with stacks.open() as f:
                samples, table = top_functions(f)
            (self.out / f"{name}.top.txt").write_text("\n".join(table) + "\n")
            self._recorded.append(f"{name}.pyspy.txt ({samples:,} samples; {name}.top.txt)")
        self._running.clear()
        if not self._recorded:
            return []
        return [
            f"- profiles of the window's first {self.seconds:g} s in `{self.out.name}/`: "
            + ", ".join(self._recorded)
        ]
