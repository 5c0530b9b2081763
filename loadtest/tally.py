"""The load tests' handler: records every execution, so lost and doubled runs are counted from
the handlers' side, not from the scheduler's own bookkeeping.

``cronscale worker --import loadtest.tally`` registers ``loadtest.tally``; each call appends
``<run_id> <attempt> <start unix time>`` to ``$CRONSCALE_LOADTEST_TALLY/tally-<pid>.log``
(line-buffered: a worker killed mid-run loses at most the line being written).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

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
    _file().write(f"{ctx.run_id} {ctx.attempt} {time.time():.6f}\n")


def read_tallies(folder: Path) -> list[tuple[str, int, float]]:
    """Every execution recorded under ``folder``: (run_id, attempt, start unix time)."""
    out: list[tuple[str, int, float]] = []
    for path in sorted(folder.glob("tally-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                out.append((parts[0], int(parts[1]), float(parts[2])))
    return out
