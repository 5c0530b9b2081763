"""The load tests' handler: records every execution, so lost and doubled runs are counted from
the handlers' side, not from the scheduler's own bookkeeping.

``cronscale worker --import loadtest.tally`` registers ``loadtest.tally``; each call appends
``<run_id> <attempt> <start unix time> <enqueue unix time, or -> <produce unix time, or ->`` to
``$CRONSCALE_LOADTEST_TALLY/tally-<pid>.log`` (line-buffered: a worker killed mid-run loses at
most the line being written). The produce time (the run message's Kafka record timestamp)
splits a run's lag into the dispatcher's part and the run queue's (Kafka and the worker); the
enqueue time (the dispatcher's, from the run message) tells one delivery from another.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple, TextIO

from worker.handlers import HandlerContext, handler

ENV_DIR = "CRONSCALE_LOADTEST_TALLY"

_out: TextIO | None = None


def _file() -> TextIO:
    global _out
    if _out is None:
        folder = Path(os.environ.get(ENV_DIR) or ".")
        folder.mkdir(parents=True, exist_ok=True)
        _out = (folder / f"tally-{os.getpid()}.log").open("a", buffering=1)
    return _out


@handler("loadtest.tally")
async def tally(ctx: HandlerContext) -> None:
    started = time.time()
    enqueued = f"{ctx.enqueue_time.timestamp():.6f}" if ctx.enqueue_time else "-"
    produced = f"{ctx.produce_time.timestamp():.3f}" if ctx.produce_time else "-"
    _file().write(f"{ctx.run_id} {ctx.attempt} {started:.6f} {enqueued} {produced}\n")


class Execution(NamedTuple):
    """One line of a tally: a run's execution as its handler saw it (unix times)."""

    run_id: str
    attempt: int
    started: float
    enqueued: float | None
    produced: float | None = None


def parse_line(line: str) -> Execution | None:
    """One tally line (lines from before the enqueue or the produce time was written have
    fewer fields: none for them); None for a line that is not one (a partial last line)."""
    parts = line.split()
    if not 3 <= len(parts) <= 5:
        return None
    enqueued = float(parts[3]) if len(parts) >= 4 and parts[3] != "-" else None
    produced = float(parts[4]) if len(parts) == 5 and parts[4] != "-" else None
    return Execution(parts[0], int(parts[1]), float(parts[2]), enqueued, produced)


def read_tallies(folder: Path) -> list[Execution]:
    """Every execution recorded under ``folder``."""
    out: list[Execution] = []
    for path in sorted(folder.glob("tally-*.log")):
        for line in path.read_text().splitlines():
            e = parse_line(line)
            if e is not None:
                out.append(e)
    return out
