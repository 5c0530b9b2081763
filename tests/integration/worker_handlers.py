"""Handlers the worker processes of ``test_worker_kafka.py`` load (``--import``)."""

from __future__ import annotations

import time

from worker.handlers import HandlerContext, handler


@handler("it.sync_forever")
def sync_forever(ctx: HandlerContext) -> None:
    """A plain handler that does not return for an hour (and cannot be interrupted)."""
    time.sleep(3600)
