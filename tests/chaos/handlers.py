"""Handlers the chaos workers load with ``cronscale worker --import tests.chaos.handlers``.

Each appends one JSON line per execution to ``<log_dir>/exec-<pid>.jsonl`` (one file per worker
process, so concurrent workers never interleave) and fsyncs it *before* deciding its outcome: the
log records that the handler ran, whatever happens next. The payload is
``{"log_dir": PATH, "fail_rate": F, "hang_s": S}`` (the last two only where they apply).

The line carries what the proof needs and nothing the scheduler's own bookkeeping decides:
``run_id``, ``schedule_id``, ``scheduled_for`` (ISO 8601, UTC), ``attempt``, ``start`` (the
handler's start, epoch seconds), ``handler``, the worker's ``pid`` and ``enqueued`` (the run
message's enqueue time: the same on a redelivered or re-sent message, new on a refired run).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from typing import Any

from worker.handlers import HandlerContext, handler

OK = "chaos.ok"
FAIL = "chaos.fail"
FLAKY = "chaos.flaky"
HANG = "chaos.hang"

_lock = threading.Lock()
_fds: dict[str, int] = {}


def _fd(log_dir: str) -> int:
    with _lock:
        fd = _fds.get(log_dir)
        if fd is None:
            path = os.path.join(log_dir, f"exec-{os.getpid()}.jsonl")
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _fds[log_dir] = fd
        return fd


def _append(log_dir: str, line: bytes) -> None:
    fd = _fd(log_dir)
    # One write(2) per line on an O_APPEND descriptor, then fsync: a SIGKILL can cut the run
    # short but cannot leave half a line, and the line outlives the process.
    with _lock:
        os.write(fd, line)
        os.fsync(fd)


async def record(ctx: HandlerContext) -> dict[str, Any]:
    """Appends this execution's line to the execution log; returns the payload."""
    start = time.time()
    doc: dict[str, Any] = ctx.json() or {}
    line = json.dumps(
        {
            "run_id": ctx.run_id,
            "schedule_id": ctx.schedule_id,
            "scheduled_for": ctx.scheduled_for.isoformat(),
            "attempt": ctx.attempt,
            "start": start,
            "handler": ctx.handler,
            "pid": os.getpid(),
            "enqueued": ctx.enqueue_time.isoformat() if ctx.enqueue_time else "",
        },
        separators=(",", ":"),
    )
    # fsync takes milliseconds: off the event loop, so other runs of this worker go on.
    await asyncio.to_thread(_append, str(doc["log_dir"]), (line + "\n").encode())
    return doc


@handler(OK)
async def ok(ctx: HandlerContext) -> None:
    """Records the execution and succeeds."""
    await record(ctx)


@handler(FAIL)
async def fail(ctx: HandlerContext) -> None:
    """Records the execution and always fails."""
    await record(ctx)
    raise RuntimeError(f"chaos: {ctx.run_id} always fails")


@handler(FLAKY)
async def flaky(ctx: HandlerContext) -> None:
    """Records the execution and fails with probability ``fail_rate`` (default 0.3)."""
    doc = await record(ctx)
    if random.random() < float(doc.get("fail_rate", 0.3)):
        raise RuntimeError(f"chaos: {ctx.run_id} failed at random")


@handler(HANG)
async def hang(ctx: HandlerContext) -> None:
    """Records the execution, then sleeps ``hang_s`` (default 60 s): longer than the schedule's
    max runtime, so the worker has to cancel it."""
    doc = await record(ctx)
    await asyncio.sleep(float(doc.get("hang_s", 60)))
