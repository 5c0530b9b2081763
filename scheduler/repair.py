"""The repair sweep: ACTIVE schedules whose timer chain is gone are re-armed.

A schedule's timers form a chain: firing a slot writes the next slot's timer in the same grouped
write, and a failed write fires the batch again, so the chain cannot break by design. Data can
still be lost (a replica restored from an old backup, an operator's stray delete, a bug), and a
schedule without a timer would be dead for good while GetSchedule still shows a plausible next
fire time. So the dispatcher that owns shard 0 walks the schedules table at a bounded rate,
once per ``CRONSCALE_REPAIR_INTERVAL``, and checks each ACTIVE schedule with a spec (not
quarantined) for the timer of its next slot, with its current generation. A schedule without
one is a suspect: the chain may just be behind (its last slot due and not yet fired), so it is
checked again ``SUSPECT_DELAY`` later; still missing, its chain is re-armed at its latest slot
at or before now (due now: the misfire policy decides what the late slot means; if the chain
was only behind, this is the very timer it was about to fire) or, with none in the last hour,
at its next slot. Cost: one timer read per schedule per sweep, off the firing path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from bucketer.cassandra import CassandraTimerStore
from scheduler import metrics
from scheduler.model import Schedule, ScheduleState, SpecKind
from scheduler.service import ScheduleService
from scheduler.slots import next_slot, slots_between
from scheduler.timers import FIRE, FireTimer

logger = logging.getLogger(__name__)

PAGE = 500
# A suspect is checked again this much later: a live chain is never behind for so long.
SUSPECT_DELAY = timedelta(seconds=30)
# How far back a re-armed chain looks for the slot it missed.
LOOKBACK = timedelta(hours=1)
_LOOKBACK_SLOTS = 4000


class RepairSweep:
    def __init__(
        self,
        svc: ScheduleService,
        *,
        rate: float = 500.0,
        suspect_delay: timedelta = SUSPECT_DELAY,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._svc = svc
        self._timers: CassandraTimerStore = svc.timers
        self._rate = rate
        self._suspect_delay = suspect_delay
        self._clock = clock

    async def run(
        self, stop: asyncio.Event, *, leading: Callable[[], bool], interval: timedelta
    ) -> None:
        """Sweeps every ``interval`` while ``leading()`` (this dispatcher owns shard 0)."""
        while not stop.is_set():
            if leading():
                try:
                    repaired = await self.sweep()
                    logger.info("repair sweep done: %d schedules re-armed", len(repaired))
                except Exception:
                    logger.exception("repair sweep failed; next one in %s", interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval.total_seconds())

    async def sweep(self) -> list[str]:
        """One pass over every schedule; returns the ids of those re-armed."""
        suspects: list[str] = []
        token = ""
        while True:
            started = asyncio.get_running_loop().time()
            page, token = await self._svc.schedules.list(PAGE, token)
            checked = await asyncio.gather(*(self._alive(s) for s in page if _armed(s)))
            suspects.extend(sid for sid, alive in checked if not alive)
            if not token:
                break
            # Bounded rate: a sweep of 10 million schedules must not crowd out firing.
            spent = asyncio.get_running_loop().time() - started
            await asyncio.sleep(max(0.0, len(page) / self._rate - spent))
        if not suspects:
            return []
        await asyncio.sleep(self._suspect_delay.total_seconds())
        repaired: list[str] = []
        for s in (await self._svc.schedules.get_many(suspects)).values():
            if _armed(s) and not (await self._alive(s))[1]:
                await self._rearm(s)
                repaired.append(s.schedule_id)
        return repaired

    async def _alive(self, s: Schedule) -> tuple[str, bool]:
        """Whether the timer of ``s``'s next slot exists, with its current generation."""
        nxt = next_slot(s, self._clock())
        if nxt is None:
            return s.schedule_id, True  # never fires again: nothing to arm
        pending = FireTimer(
            schedule_id=s.schedule_id,
            generation=s.generation,
            slot=nxt.slot,
            scheduled_for=nxt.at,
        )
        # In its chain's row, or, not yet fired since the change, in the change's own row.
        for first in (False, True):
            want = replace(pending, first=first).to_timer(self._timers.shard_count)
            found = await self._timers.read(want)
            if (
                found is not None
                and found.kind == FIRE
                and json.loads(found.data).get("g") == s.generation
            ):
                return s.schedule_id, True
        return s.schedule_id, False

    async def _rearm(self, s: Schedule) -> None:
        now = self._clock()
        fired = await self._svc.fired_so_far(s) if s.spec.max_runs else 0
        running = tuple(await self._svc.carried_on(s, now))
        missed = slots_between(s, now - LOOKBACK, now, _LOOKBACK_SLOTS)
        if missed:
            last = missed[-1]
            timer: FireTimer | None = FireTimer(
                schedule_id=s.schedule_id,
                generation=s.generation,
                slot=last.slot,
                scheduled_for=last.at,
                fired=fired,
                tenant=s.tenant,
                first=True,
                running=running,
            )
        else:
            timer = self._svc.first_fire(s, now, fired=fired, running=running)
        if timer is None:
            return
        await self._timers.put([timer.to_timer(self._timers.shard_count)], now=now)
        metrics.TIMERS_REPAIRED.inc()
        logger.warning(
            "schedule %s had no timer; re-armed at %s",
            s.schedule_id,
            timer.scheduled_for.isoformat(),
            extra={"schedule_id": s.schedule_id},
        )


def _armed(s: Schedule) -> bool:
    """Whether ``s`` should have a timer chain: active, with times of its own, not set aside."""
    return (
        s.state is ScheduleState.ACTIVE
        and s.spec.kind is not SpecKind.NONE
        and not s.quarantine_error
    )
