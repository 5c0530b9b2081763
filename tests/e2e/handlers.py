"""Handlers the end-to-end tests load into the real worker with `--import tests.e2e.handlers`."""

from __future__ import annotations

import asyncio

from worker.handlers import HandlerContext, handler


@handler("e2e.record")
async def record(ctx: HandlerContext) -> str:
    """Succeeds, returning its idempotency key (the run id)."""
    return ctx.run_id


@handler("e2e.sleep_cancellable")
async def sleep_cancellable(ctx: HandlerContext) -> None:
    """Sleeps ``{"seconds": N}``; if cancelled, appends the run id to the file named by
    ``{"marker": PATH}`` (proof that the handler saw the cancellation) and re-raises."""
    doc = ctx.json() or {}
    try:
        await asyncio.sleep(float(doc.get("seconds", 30)))
    except asyncio.CancelledError:
        if doc.get("marker"):
            _append(doc["marker"], f"{ctx.run_id}\n")
        raise


@handler("e2e.fail_until")
async def fail_until(ctx: HandlerContext) -> int:
    """Fails every attempt before ``{"succeed_at": N}`` (by ``ctx.attempt``), then succeeds."""
    doc = ctx.json() or {}
    if ctx.attempt < int(doc.get("succeed_at", 2)):
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    return ctx.attempt


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)
