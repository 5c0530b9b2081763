"""Handlers the end-to-end tests load into the real worker with `--import tests.e2e.handlers`."""

from __future__ import annotations

from worker.handlers import HandlerContext, handler


@handler("e2e.record")
async def record(ctx: HandlerContext) -> str:
    """Succeeds, returning its idempotency key (the run id)."""
    return ctx.run_id
