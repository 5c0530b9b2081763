"""The chaos verdict, computed from the execution log the handlers wrote (never from the
scheduler's own bookkeeping), the cron specs, the fault timeline and a ListRuns read for runs
stuck in ENQUEUED or RUNNING.

Pure functions over plain data: the harness gathers the inputs, this module judges them.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from croniter import croniter

from loadtest.figures import pct
from tests.chaos.handlers import FAIL, FLAKY, HANG, OK

logger = logging.getLogger(__name__)

HANDLER_CLASSES = (OK, FLAKY, FAIL, HANG)
"""Every handler a chaos schedule uses; ``OK`` is the one whose slots must never be lost."""


@dataclass(frozen=True, kw_only=True)
class ChaosSchedule:
    """One registered schedule: its id, handler and cron expression (no jitter, no bounds)."""

    schedule_id: str
    handler: str
    cron: str


@dataclass(frozen=True, kw_only=True)
class Execution:
    """One line of the execution log: a handler started for a run."""

    run_id: str
    schedule_id: str
    scheduled_for: datetime
    attempt: int
    start: float
    handler: str
    pid: int
    # The run message's enqueue time (ISO 8601; empty if unknown): the same for one message
    # delivered twice, new for a run fired twice.
    enqueued: str = ""

    @property
    def lag(self) -> float:
        """Seconds from the slot to the handler's start."""
        return self.start - self.scheduled_for.timestamp()


@dataclass(frozen=True, kw_only=True)
class FaultWindow:
    """One injected fault: from the moment it hit until its target answered again."""

    kind: str
    target: str
    start: float
    end: float


@dataclass(frozen=True, kw_only=True)
class RunView:
    """A run as ListRuns shows it (for the stuck check and for evidence about lost slots)."""

    run_id: str
    schedule_id: str
    status: str
    scheduled_for: datetime
    enqueue_time: datetime | None
    skip_reason: str
    error: str
    start_time: datetime | None = None
    finish_time: datetime | None = None
    worker_id: str = ""
    attempt: int = 1
    next_attempt_time: datetime | None = None

    def describe(self) -> str:
        """Status and what the workers' reports left on the row, for evidence."""
        parts = [f"run {self.run_id} {self.status} attempt {self.attempt}"]
        if self.skip_reason:
            parts.append(f"({self.skip_reason})")
        for label, t in (
            ("enqueued", self.enqueue_time),
            ("started", self.start_time),
            ("finished", self.finish_time),
        ):
            parts.append(f"{label} {t:%H:%M:%S.%f}" if t else f"not {label}")
        if self.worker_id:
            parts.append(f"by {self.worker_id}")
        if self.next_attempt_time:
            parts.append(f"next attempt due {self.next_attempt_time:%H:%M:%S.%f}")
        if self.error:
            parts.append(f"error {self.error[:120]!r}")
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Lost:
    """An expected slot no execution line stands for, with what the scheduler says of it."""

    schedule_id: str
    handler: str
    slot: datetime
    scheduler_view: str


@dataclass(kw_only=True)
class ClassCounts:
    """Slots of one handler class inside the window."""

    expected: int = 0
    executed: int = 0

    @property
    def unexecuted(self) -> int:
        return self.expected - self.executed


@dataclass(kw_only=True)
class Report:
    """Everything the proof prints; ``lost`` and ``stuck`` must be empty."""

    window_start: datetime
    window_end: datetime
    schedules: int
    classes: dict[str, ClassCounts]
    lost: list[Lost]
    unexecuted_other: list[Lost]
    executions: int
    duplicate_executions: int
    duplicated_runs: list[tuple[str, int]]
    duplicates_by_fault: dict[str, int]
    split_slots: list[tuple[str, datetime, list[str]]]
    unexpected: list[Execution]
    stuck: list[RunView]
    stuck_executions: dict[str, list[Execution]]
    stuck_bound_s: float
    lag_quiet: list[float]
    lag_all: list[float]
    faults: list[FaultWindow]
    fault_grace_s: float
    malformed_lines: int
    duration_s: float
    dlq: DlqCheck
    notes: list[str] = field(default_factory=list)
    # Duplicate executions by what caused them: "same message again" (the same enqueue time: one
    # Kafka record delivered again, or the same message sent again after a send timed out), "run
    # fired again" (a new enqueue time: the dispatcher side), the former split by whether the
    # same worker process ran it again.
    duplicates_by_cause: dict[str, int] = field(default_factory=dict)
    # Workers running at the end that executed nothing in the last ``silent_s`` before the last
    # execution, as "name (pid N)": a worker wedged for good while its peers took its partitions
    # (seen once: after a Kafka restart, 2026-12-07). Must be empty.
    silent_workers: list[str] = field(default_factory=list)
    silent_s: float = 0.0

    @property
    def expected(self) -> int:
        return sum(c.expected for c in self.classes.values())

    @property
    def executed(self) -> int:
        return sum(c.executed for c in self.classes.values())

    @property
    def duplicate_rate(self) -> float:
        return self.duplicate_executions / self.executed if self.executed else 0.0

    def render(self) -> str:
        """The report as text (Markdown)."""
        kinds = Counter(f.kind for f in self.faults)
        lines = [
            "# cronscale chaos report",
            "",
            f"- window {self.window_start:%H:%M:%S}-{self.window_end:%H:%M:%S} UTC "
            f"({(self.window_end - self.window_start).total_seconds():.0f} s of slots), "
            f"run {self.duration_s:.0f} s, {self.schedules} schedules",
            f"- faults: {len(self.faults)} ("
            + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
            + ")",
            f"- slots expected: {self.expected}",
            f"- slots executed: {self.executed}",
            f"- **lost** (slots of {OK} schedules never executed): **{len(self.lost)}**",
            f"- unexecuted slots of the other handlers: {len(self.unexecuted_other)}",
            f"- executions in the window: {self.executions}; duplicate executions (same run_id "
            f"and attempt again): {self.duplicate_executions} = "
            f"{100 * self.duplicate_rate:.2f}% of executed slots, over "
            f"{len(self.duplicated_runs)} runs",
            "- duplicate executions by cause: "
            + (
                ", ".join(f"{k} {n}" for k, n in sorted(self.duplicates_by_cause.items())) or "none"
            ),
            "- duplicate executions by the fault window they started in: "
            + (
                ", ".join(f"{k} {n}" for k, n in sorted(self.duplicates_by_fault.items())) or "none"
            ),
            f"- slots executed under more than one run_id: {len(self.split_slots)}",
            f"- executions of no expected slot: {len(self.unexpected)}",
            f"- **stuck** (ENQUEUED or RUNNING, or a retry overdue, by more than "
            f"{self.stuck_bound_s:.0f} s): "
            f"**{len(self.stuck)}**",
            "- fire lag (handler start - scheduled_for) outside fault windows "
            f"(+{self.fault_grace_s:.0f} s): " + _lag_line(self.lag_quiet),
            "- fire lag over every execution in the window: " + _lag_line(self.lag_all),
            f"- DLQ: {self.dlq.render()}",
            f"- **silent workers** (running at the end, no execution in the last "
            f"{self.silent_s:.0f} s of the run): **{', '.join(self.silent_workers) or 'none'}**",
            f"- malformed execution-log lines: {self.malformed_lines}",
            "",
            "| handler | expected | executed | unexecuted |",
            "| --- | --- | --- | --- |",
            *(
                f"| {h} | {c.expected} | {c.executed} | {c.unexecuted} |"
                for h, c in self.classes.items()
            ),
            "",
            "## Faults",
            "",
            "| kind | target | at (s) | recovered after (s) |",
            "| --- | --- | --- | --- |",
            *(
                f"| {f.kind} | {f.target} | {f.start - self.window_start.timestamp():.1f} | "
                f"{f.end - f.start:.1f} |"
                for f in self.faults
            ),
        ]
        if self.lost or self.unexecuted_other:
            lines += ["", "## Unexecuted slots (first 50)", ""]
            lines += [
                f"- {x.handler} {x.schedule_id} @ {x.slot.isoformat()}: {x.scheduler_view}"
                for x in (self.lost + self.unexecuted_other)[:50]
            ]
        if self.dlq.missing_runs:
            lines += ["", "## Dead letters missing: the runs as ListRuns shows them (first 50)", ""]
            lines += [f"- {m}" for m in self.dlq.missing_runs[:50]]
        if self.stuck:
            lines += ["", "## Stuck runs (first 50)", ""]
            lines += [
                f"- {r.describe()}, scheduled {r.scheduled_for:%H:%M:%S}; executed "
                + _executed(self.stuck_executions.get(r.run_id, []))
                for r in self.stuck[:50]
            ]
        if self.split_slots:
            lines += ["", "## Slots under several run ids (first 20)", ""]
            lines += [f"- {s} @ {t.isoformat()}: {ids}" for s, t, ids in self.split_slots[:20]]
        if self.duplicated_runs:
            lines += ["", "## Duplicated runs (first 20: run_id, executions)", ""]
            lines += [f"- {r} x{n}" for r, n in self.duplicated_runs[:20]]
        if self.notes:
            lines += ["", "## Notes", "", *(f"- {n}" for n in self.notes)]
        return "\n".join(lines) + "\n"


def _lag_line(lags: list[float]) -> str:
    if not lags:
        return "no samples"
    return (
        f"p50 {pct(lags, 0.5):.3f} s, p99 {pct(lags, 0.99):.3f} s, max {max(lags):.3f} s "
        f"({len(lags)} executions)"
    )


def _executed(executions: list[Execution]) -> str:
    if not executions:
        return "never (no execution-log line)"
    starts = ", ".join(
        f"{datetime.fromtimestamp(e.start, UTC):%H:%M:%S.%f} by pid {e.pid}" for e in executions
    )
    return f"{len(executions)}x: {starts}"


def read_executions(log_dir: Path) -> tuple[list[Execution], int]:
    """Every execution line under ``log_dir`` (``exec-*.jsonl``) and the count of lines that
    did not parse (there should be none: each line is one write)."""
    out: list[Execution] = []
    bad = 0
    for path in sorted(log_dir.glob("exec-*.jsonl")):
        for raw in path.read_bytes().splitlines():
            try:
                doc = json.loads(raw)
                out.append(
                    Execution(
                        run_id=str(doc["run_id"]),
                        schedule_id=str(doc["schedule_id"]),
                        scheduled_for=datetime.fromisoformat(doc["scheduled_for"]).astimezone(UTC),
                        attempt=int(doc["attempt"]),
                        start=float(doc["start"]),
                        handler=str(doc["handler"]),
                        pid=int(doc["pid"]),
                        enqueued=str(doc.get("enqueued", "")),
                    )
                )
            except (ValueError, KeyError, TypeError):
                bad += 1
                logger.warning("malformed execution-log line in %s: %r", path, raw[:200])
    return out, bad


def expected_slots(cron: str, start: datetime, end: datetime) -> list[datetime]:
    """The slots of ``cron`` (UTC, 5 or 6 fields, seconds first) in ``[start, end)``, computed
    by croniter, independently of the scheduler's own cron code."""
    it = croniter(
        cron, start - timedelta(microseconds=1), second_at_beginning=len(cron.split()) == 6
    )
    out: list[datetime] = []
    while True:
        t = it.get_next(datetime).astimezone(UTC)
        if t >= end:
            return out
        out.append(t)


@dataclass(frozen=True, kw_only=True)
class LetterView:
    """A dead letter as ListDeadLetters shows it."""

    run_id: str
    schedule_id: str
    scheduled_for: datetime
    attempts: int


@dataclass(kw_only=True)
class DlqCheck:
    """The dead letters against what must be there: every slot of an always-failing (or
    always-hanging) schedule in the window, each after exactly ``attempts`` attempts, and
    nothing of the other schedules."""

    expected: int = 0
    found: int = 0
    missing: list[tuple[str, datetime]] = field(default_factory=list)
    # What ListRuns showed of each missing one at the end (evidence, not judged).
    missing_runs: list[str] = field(default_factory=list)
    wrong_attempts: list[LetterView] = field(default_factory=list)
    unexpected: list[LetterView] = field(default_factory=list)
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return not self.missing and not self.wrong_attempts and not self.unexpected

    def render(self) -> str:
        missing = "".join(f"\n  - {m}" for m in self.missing_runs[:10])
        return (
            f"{self.found} of {self.expected} runs of the always-failing schedules dead-lettered "
            f"after exactly {self.attempts} attempts; missing {len(self.missing)}, "
            f"other attempt counts {len(self.wrong_attempts)}, "
            f"dead letters of other schedules {len(self.unexpected)}{missing}"
        )


def dlq_accounting(
    schedules: list[ChaosSchedule],
    letters: list[LetterView],
    window_start: datetime,
    window_end: datetime,
    attempts: int,
    runs: Iterable[RunView] = (),
) -> DlqCheck:
    """Checks the DLQ (issue 7): exactly the always-failing schedules' runs, each after exactly
    ``attempts`` attempts (their retry policy's max), none of the healthy or flaky ones."""
    hopeless = {s.schedule_id for s in schedules if s.handler in (FAIL, HANG)}
    check = DlqCheck(attempts=attempts)
    in_window = [d for d in letters if window_start <= d.scheduled_for < window_end]
    by_slot = {(d.schedule_id, d.scheduled_for): d for d in in_window}
    for s in schedules:
        if s.schedule_id not in hopeless:
            continue
        for slot in expected_slots(s.cron, window_start, window_end):
            check.expected += 1
            letter = by_slot.get((s.schedule_id, slot))
            if letter is None:
                check.missing.append((s.schedule_id, slot))
            elif letter.attempts != attempts:
                check.wrong_attempts.append(letter)
            else:
                check.found += 1
    check.unexpected = [d for d in in_window if d.schedule_id not in hopeless]
    run_by_slot = {(r.schedule_id, r.scheduled_for): r for r in runs}
    for key in check.missing:
        r = run_by_slot.get(key)
        check.missing_runs.append(r.describe() if r else f"{key[0]} @ {key[1]:%H:%M:%S}: no run")
    return check


def _cause(again: Execution, earlier: list[Execution]) -> str:
    """Why ``again`` ran although ``earlier`` executions of its run and attempt did."""
    if not again.enqueued:
        return "unknown"
    same = [e for e in earlier if e.enqueued == again.enqueued]
    if not same:
        return "run fired again"
    where = "same worker" if any(e.pid == again.pid for e in same) else "another worker"
    return f"same message again ({where})"


def silent_workers(
    executions: Iterable[Execution], workers: Mapping[str, int], silent_s: float
) -> list[str]:
    """The workers (name to pid) with no execution in the last ``silent_s`` before the last
    execution of all, as "name (pid N, last execution ...)"."""
    last_by_pid: dict[int, float] = {}
    for e in executions:
        last_by_pid[e.pid] = max(e.start, last_by_pid.get(e.pid, e.start))
    if not last_by_pid:
        return []
    end = max(last_by_pid.values())
    silent = []
    for name, pid in sorted(workers.items()):
        last = last_by_pid.get(pid)
        if last is None or last < end - silent_s:
            seen = (
                "never executed"
                if last is None
                else f"last execution {end - last:.0f} s before the run's last"
            )
            silent.append(f"{name} (pid {pid}, {seen})")
    return silent


def in_fault(t: float, faults: Iterable[FaultWindow], grace_s: float) -> bool:
    """Whether a slot at ``t`` falls inside a fault window or the ``grace_s`` after it."""
    return any(f.start <= t <= f.end + grace_s for f in faults)


def build_report(
    *,
    schedules: list[ChaosSchedule],
    executions: list[Execution],
    malformed_lines: int,
    runs: list[RunView],
    faults: list[FaultWindow],
    window_start: datetime,
    window_end: datetime,
    stuck_before: datetime,
    stuck_bound_s: float,
    fault_grace_s: float,
    duration_s: float,
    letters: list[LetterView] | None = None,
    max_attempts: int = 3,
    final_runs: Iterable[RunView] = (),
    workers: Mapping[str, int] | None = None,
    silent_s: float = 30.0,
) -> Report:
    """Judges one chaos run. ``runs`` is what ListRuns returned for every schedule;
    a run is stuck when its slot is before ``stuck_before`` and it is ENQUEUED or RUNNING, or
    waits for a retry that was due before then. ``final_runs`` (the hopeless schedules' runs
    read last) explain any dead letter missing. ``workers`` names the worker processes running
    at the end, by pid: one that executed nothing in the last ``silent_s`` before the last
    execution of all is reported silent."""
    by_slot: dict[tuple[str, datetime], list[Execution]] = defaultdict(list)
    for e in executions:
        by_slot[(e.schedule_id, e.scheduled_for)].append(e)
    run_by_slot = {(r.schedule_id, r.scheduled_for): r for r in runs}

    classes = {h: ClassCounts() for h in HANDLER_CLASSES}
    lost: list[Lost] = []
    other: list[Lost] = []
    expected_keys: set[tuple[str, datetime]] = set()
    for s in schedules:
        counts = classes.setdefault(s.handler, ClassCounts())
        for slot in expected_slots(s.cron, window_start, window_end):
            key = (s.schedule_id, slot)
            expected_keys.add(key)
            counts.expected += 1
            if key in by_slot:
                counts.executed += 1
                continue
            run = run_by_slot.get(key)
            view = "no run row" if run is None else run.describe()
            miss = Lost(
                schedule_id=s.schedule_id, handler=s.handler, slot=slot, scheduler_view=view
            )
            (lost if s.handler == OK else other).append(miss)

    in_window = [e for e in executions if window_start <= e.scheduled_for < window_end]
    per_attempt = Counter((e.run_id, e.attempt) for e in in_window)
    duplicate_executions = sum(n - 1 for n in per_attempt.values() if n > 1)
    per_run = Counter(e.run_id for e in in_window)
    duplicated_runs = sorted(((r, n) for r, n in per_run.items() if n > 1), key=lambda x: -x[1])
    seen: dict[tuple[str, int], list[Execution]] = {}
    duplicates_by_fault: Counter[str] = Counter()
    duplicates_by_cause: Counter[str] = Counter()
    for e in sorted(in_window, key=lambda e: e.start):
        earlier = seen.setdefault((e.run_id, e.attempt), [])
        earlier.append(e)
        if len(earlier) == 1:
            continue
        duplicates_by_cause[_cause(e, earlier[:-1])] += 1
        kinds = sorted({f.kind for f in faults if f.start <= e.start <= f.end + fault_grace_s})
        duplicates_by_fault["+".join(kinds) or "no fault"] += 1
    split_slots = [
        (sid, slot, sorted({e.run_id for e in es}))
        for (sid, slot), es in by_slot.items()
        if len({e.run_id for e in es}) > 1
    ]
    unexpected = [e for e in in_window if (e.schedule_id, e.scheduled_for) not in expected_keys]

    first: dict[str, Execution] = {}
    for e in sorted(in_window, key=lambda e: e.start):
        first.setdefault(e.run_id, e)
    lag_all = [e.lag for e in first.values()]
    lag_quiet = [
        e.lag
        for e in first.values()
        if not in_fault(e.scheduled_for.timestamp(), faults, fault_grace_s)
    ]
    # Stuck: still waiting for a worker, or a retry whose time came long ago and that no
    # dispatcher fired (the run sits FAILED or TIMED_OUT between attempts for good).
    stuck = [
        r
        for r in runs
        if r.scheduled_for < stuck_before
        and (
            r.status in ("ENQUEUED", "RUNNING")
            or (r.next_attempt_time is not None and r.next_attempt_time < stuck_before)
        )
    ]
    stuck_ids = {r.run_id for r in stuck}
    stuck_executions: dict[str, list[Execution]] = defaultdict(list)
    for e in sorted(executions, key=lambda e: e.start):
        if e.run_id in stuck_ids:
            stuck_executions[e.run_id].append(e)
    return Report(
        silent_workers=silent_workers(executions, workers or {}, silent_s),
        silent_s=silent_s,
        window_start=window_start,
        window_end=window_end,
        schedules=len(schedules),
        classes=classes,
        lost=lost,
        unexecuted_other=other,
        executions=len(in_window),
        duplicate_executions=duplicate_executions,
        duplicated_runs=duplicated_runs,
        duplicates_by_fault=dict(duplicates_by_fault),
        duplicates_by_cause=dict(duplicates_by_cause),
        split_slots=split_slots,
        unexpected=unexpected,
        dlq=dlq_accounting(
            schedules, letters or [], window_start, window_end, max_attempts, final_runs
        ),
        stuck=stuck,
        stuck_executions=dict(stuck_executions),
        stuck_bound_s=stuck_bound_s,
        lag_quiet=lag_quiet,
        lag_all=lag_all,
        faults=faults,
        fault_grace_s=fault_grace_s,
        malformed_lines=malformed_lines,
        duration_s=duration_s,
    )
