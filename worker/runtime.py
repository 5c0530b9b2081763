"""Tuning of the Python runtime shared by every long-running process (api, dispatcher, worker).

The cyclic garbage collector. With CPython's default thresholds (700, 10, 10) these processes
ran a young collection every few hundred allocations and a full one every few seconds, and a
full collection walks every live object: a dispatcher holding 60,000 cached schedules spent
~80 ms per full collection, stalling its event loop. Their garbage is almost all freed by
reference counting (protobuf messages, bound statements, futures), so collecting for cycles far
less often costs little memory. Measured at 60,000 firings/min (``loadtest/README.md``): CPU per
firing worker 0.278 -> 0.164 ms, dispatcher 0.550 -> 0.418 ms, lag p50 0.59 -> 0.21 s.

``CRONSCALE_GC_THRESHOLD``: three integers for ``gc.set_threshold`` (default 50000,20,100), or
``python`` to keep CPython's own.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

ENV_GC_THRESHOLD = "CRONSCALE_GC_THRESHOLD"
DEFAULT_GC_THRESHOLD = (50_000, 20, 100)


def gc_threshold(environ: Mapping[str, str]) -> tuple[int, int, int] | None:
    """The thresholds ``CRONSCALE_GC_THRESHOLD`` asks for (None: CPython's own); raises
    ValueError naming the variable and the problem."""
    raw = environ.get(ENV_GC_THRESHOLD, "").strip()
    if not raw:
        return DEFAULT_GC_THRESHOLD
    if raw == "python":
        return None
    parts = raw.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or any(v < 1 for v in values):
        raise ValueError(
            f"{ENV_GC_THRESHOLD} must be three positive integers (gen0,gen1,gen2) or 'python', "
            f"got {raw!r}"
        )
    return values[0], values[1], values[2]


def tune_gc(environ: Mapping[str, str] = os.environ) -> tuple[int, int, int] | None:
    """Applies ``CRONSCALE_GC_THRESHOLD`` and moves what start-up allocated (modules, classes,
    compiled statements) out of the collector's way (``gc.freeze``). Call once, when the
    process's imports are done. Returns the thresholds set (None: CPython's own kept)."""
    threshold = gc_threshold(environ)
    if threshold is None:
        return None
    gc.collect()
    gc.freeze()
    gc.set_threshold(*threshold)
    return threshold
