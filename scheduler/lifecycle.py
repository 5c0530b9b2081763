"""Update, cancel, trigger and re-run: the lifecycle operations beyond create/pause/resume/delete.

Like the rest of the lifecycle (``scheduler.service``), every change to a schedule replaces its
``generation`` and writes timers *before* the compare-and-set that makes them current, so a
superseded timer is dropped when due and a failure in between leaves a timer nobody honours,
never a schedule that silently stops firing (decision 0002).

Manual runs (a trigger, a re-run) are never produced to Kafka by the API: they are put as run
timers due now, so every enqueue goes through a dispatcher, which enqueues them within a poll.
Their run row is written right away (ENQUEUED), so GetRun finds them at once.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from bucketer.cql import Write
from scheduler import metrics
from scheduler.dead_letters import DeadLetter
from scheduler.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from scheduler.model import (
    BufferedRun,
    Run,
    RunStatus,
    Schedule,
    ScheduleState,
    SkipReason,
    new_generation,
    parse_run_id,
    run_id_for,
    to_millisecond,
    validate_request_id,
)
from scheduler.overlap import OverlapAction, OverlapDecision, decide_overlap
from scheduler.service import ScheduleService
from scheduler.timers import RunTimer
from scheduler.validation import validate_schedule

logger = logging.getLogger(__name__)

# The states after which a run changes no more, and so may be run again.
RERUNNABLE = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.TIMED_OUT,
        RunStatus.CANCELLED,
        RunStatus.DEAD_LETTERED,
    }
)
# RedriveDeadLetters re-drives at most this many per call.
MAX_BULK_REDRIVE = 1000
# CancelSchedule retries its compare-and-set this often when a concurrent change wins.
_CANCEL_ATTEMPTS = 3


def stale_version(given: int, current: int) -> Aborted:
    """The ABORTED error of an update that carried a version other than the stored one."""
    return Aborted(
        f"schedule.version: {given} is stale; the current version is {current} "
        "(read the schedule again and retry)"
    )


class Lifecycle:
    """UpdateSchedule, CancelSchedule, TriggerSchedule and RerunRun on a ``ScheduleService``."""

    def __init__(self, service: ScheduleService) -> None:
        self._svc = service

    async def update(self, draft: Schedule, *, schedule_id: str, version: int) -> Schedule:
        """Replaces name, handler, spec, payload, max runtime and policies of a schedule.

        ``version`` is the version the caller read: anything else is ABORTED and nothing is
        written. ``after`` is replaced too (checked for unknown, foreign and cyclic upstreams
        first; reverse edges follow after the write). The tenant and the pause note are kept. An
        ACTIVE (or COMPLETED) schedule becomes ACTIVE on the new spec: its first timer is put
        under a new generation before the compare-and-set, so the old spec's pending timer is
        superseded and never fires. A PAUSED schedule stays PAUSED and gets no timer (resume
        puts one). A CANCELLED schedule cannot be updated (FAILED_PRECONDITION).
        """
        svc = self._svc
        s = await svc.schedules.get(schedule_id)
        if s.state is ScheduleState.CANCELLED:
            raise FailedPrecondition(
                f"schedule {schedule_id!r} is CANCELLED; a cancelled schedule cannot be updated"
            )
        if version != s.version:
            raise stale_version(version, s.version)
        now = svc.now()
        updated = replace(
            s,
            name=draft.name,
            handler=draft.handler,
            spec=draft.spec,
            payload=draft.payload,
            max_runtime=draft.max_runtime,
            policies=draft.policies,
            after=draft.after,
            version=s.version + 1,
            generation=new_generation(),
            update_time=now,
        )
        validate_schedule(updated, now)
        await svc.dependencies.validate(updated)
        if s.state is ScheduleState.PAUSED:
            updated = replace(updated, next_fire_time=None)
        else:
            fired = await svc.fired_so_far(updated) if updated.spec.max_runs else 0
            running = await svc.carried_on(updated, now)
            await svc.keep_carried_lease(s, now)
            # Minted again just before its timer is written: a dispatcher that finds the timer
            # before the compare-and-set lands waits for it only so long after the mint
            # (scheduler.firing.change_in_flight), and the reads above can be slow.
            updated = replace(updated, generation=new_generation())
            first = svc.first_fire(updated, now, fired=fired, running=running)
            # A schedule with upstreams fires after their successes even without times of its own.
            if first is None and not updated.after:
                why = (
                    f" (max_runs {updated.spec.max_runs} reached: {fired} runs fired)"
                    if updated.spec.max_runs and fired >= updated.spec.max_runs
                    else ""
                )
                raise InvalidArgument("schedule.spec", f"never fires after now{why}")
            updated = replace(
                updated,
                state=ScheduleState.ACTIVE,
                next_fire_time=first.scheduled_for if first is not None else None,
            )
            if first is not None:
                # Timer first: if the compare-and-set then loses, its generation is never
                # current.
                await svc.timers.put([first.to_timer(svc.timers.shard_count)], now=now)
        applied, current = await svc.schedules.update(updated, expected_version=s.version)
        if not applied:
            if current is None:
                raise NotFound(f"schedule {schedule_id!r} not found")
            raise stale_version(version, current)
        if s.state is not ScheduleState.PAUSED:
            # Again once the old chain is superseded: it may have fired a slot early (fire-ahead)
            # and written its next timer, carrying that run's lease, after the look above.
            await svc.keep_carried_lease(s, now)
        if updated.after != s.after:
            await svc.dependencies.relink(schedule_id, s.after, updated.after)
        if s.quarantine_error:
            await svc.schedules.clear_quarantine(schedule_id)  # re-armed by this change
        logger.info(
            "updated schedule %s to version %d",
            schedule_id,
            updated.version,
            extra={"schedule_id": schedule_id, "tenant": s.tenant},
        )
        return await svc.get(schedule_id)

    async def cancel(self, schedule_id: str, *, cancel_running: bool) -> Schedule:
        """Stops a schedule for good: CANCELLED under a new generation, so its pending timer and
        any run timer not yet enqueued are dropped when due. Idempotent.

        With ``cancel_running``, each run in progress is marked cancel-requested; its worker
        sees that at the run's next heartbeat, cancels the handler and reports it CANCELLED.
        """
        svc = self._svc
        for attempt in range(_CANCEL_ATTEMPTS):
            s = await svc.schedules.get(schedule_id)
            if s.state is ScheduleState.CANCELLED:
                break
            if await svc.schedules.change_state(
                s,
                state=ScheduleState.CANCELLED,
                generation=new_generation(),
                now=svc.now(),
                next_fire_time=None,
            ):
                logger.info(
                    "cancelled schedule %s", schedule_id, extra={"schedule_id": schedule_id}
                )
                break
            if attempt == _CANCEL_ATTEMPTS - 1:
                raise Aborted(f"schedule {schedule_id!r} changed concurrently; retry")
        # Read after the state change: a run a dispatcher enqueued just before it is included.
        s = await svc.get(schedule_id)
        if cancel_running:
            running = await svc.in_progress(s, svc.now())
            if running:
                await svc.runs.write(svc.runs.cancel_rows(running))
                logger.info(
                    "asked %d runs of %s to cancel",
                    len(running),
                    schedule_id,
                    extra={"schedule_id": schedule_id},
                )
        return s

    async def _first_result(self, key: str, request_id: str, planned: str) -> str | None:
        """For a call with ``request_id``: None if this is the first call (``planned`` is
        recorded as its result), else the run id the first call recorded."""
        if not request_id:
            return None
        recorded = await self._svc.requests.claim(
            f"{key}:{validate_request_id(request_id)}", planned
        )
        return None if recorded == planned else recorded

    async def trigger(self, schedule_id: str, *, force: bool, request_id: str = "") -> Run:
        """Runs a schedule now, outside its slots: a fresh run id, marked manual.

        Subject to the overlap policy unless ``force``: with runs in progress, SKIP records the
        run SKIPPED (reason ``overlap``); BUFFER_ONE holds it back until the running one
        finishes (returned ENQUEUED without an enqueue time; SKIPPED if a run is held already);
        CANCEL_PREVIOUS asks the running ones to cancel and runs it; ALLOW runs it. Works on
        ACTIVE, PAUSED and COMPLETED schedules; FAILED_PRECONDITION on a CANCELLED one.
        """
        svc = self._svc
        s = await svc.schedules.get(schedule_id)
        _require_not_cancelled(s, "a cancelled schedule cannot be triggered")
        now = to_millisecond(svc.now())  # as the run id and the run row hold it
        run_id = run_id_for(s.schedule_id, now, manual=True)
        first = await self._first_result(f"trigger:{s.schedule_id}", request_id, run_id)
        if first is not None:
            # A retry: answer the first call's run. Gone (the first call stopped before
            # recording it)? Then go on under its run id and time.
            if s.buffered is not None and s.buffered.run_id == first:
                return Run(
                    run_id=first,
                    schedule_id=s.schedule_id,
                    scheduled_for=s.buffered.scheduled_for,
                    status=RunStatus.ENQUEUED,
                    handler=s.handler,
                    tenant=s.tenant,
                    manual=True,
                )
            try:
                return await svc.runs.get(first)
            except NotFound:
                run_id, now = first, parse_run_id(first).scheduled_for
        run = Run(
            run_id=run_id,
            schedule_id=s.schedule_id,
            scheduled_for=now,
            status=RunStatus.ENQUEUED,
            handler=s.handler,
            tenant=s.tenant,
            manual=True,
        )
        decision = (
            OverlapDecision(action=OverlapAction.RUN)
            if force
            else decide_overlap(
                s.policies.overlap,
                await svc.in_progress(s, now),
                buffered=s.buffered is not None,
            )
        )
        ids = {"schedule_id": s.schedule_id, "run_id": run.run_id}
        if decision.action is OverlapAction.BUFFER:
            held = BufferedRun(run_id=run.run_id, scheduled_for=now, manual=True)
            if await svc.schedules.hold_buffered(s.schedule_id, held.to_json()):
                logger.info("triggered run %s held back (BUFFER_ONE)", run.run_id, extra=ids)
                return run
            decision = OverlapDecision(action=OverlapAction.SKIP)
        if decision.action is OverlapAction.SKIP:
            skipped = replace(run, status=RunStatus.SKIPPED, skip_reason=SkipReason.OVERLAP.value)
            await svc.runs.write(svc.runs.insert_rows([skipped]))
            logger.info("triggered run %s skipped (overlap)", run.run_id, extra=ids)
            return skipped
        items = svc.runs.cancel_rows(decision.cancel)
        run = replace(run, enqueue_time=now)
        await self._enqueue(run, items)
        logger.info("triggered run %s", run.run_id, extra=ids)
        return run

    async def rerun(self, run_id: str, *, request_id: str = "") -> Run:
        """Runs a finished run again: a fresh manual run id, ``origin_run_id`` the original.

        The new run keeps the original's ``scheduled_for`` (the slot it stands for, which
        handlers may use as their logical date) and runs the schedule's current handler and
        payload. It is an operator's explicit act, so the overlap policy does not apply.
        NOT_FOUND if the run or its schedule is gone; FAILED_PRECONDITION if the run has not
        finished (SUCCEEDED, FAILED, CANCELLED, DEAD_LETTERED) or the schedule is CANCELLED.
        """
        original, s = await self._rerunnable(run_id)
        new_id = run_id_for(s.schedule_id, original.scheduled_for, manual=True)
        first = await self._first_result(f"rerun:{run_id}", request_id, new_id)
        if first is not None:
            try:
                return await self._svc.runs.get(first)  # a retry: the first call's run
            except NotFound:
                new_id = first  # the first call stopped before recording it
        return await self._run_again(original, s, new_id)

    async def redrive(self, run_id: str, *, request_id: str = "") -> Run:
        """Re-drives a dead letter: a new attempt series (the retry policy applies afresh)
        under a fresh manual run id linked to the original, like ``rerun``; the dead letter
        records it, once. NOT_FOUND if the run is not dead-lettered; FAILED_PRECONDITION if it
        was re-driven already (a retry with the same ``request_id`` answers the first run)."""
        svc = self._svc
        letter = await svc.dead_letters.get(run_id)
        original, s = await self._rerunnable(run_id)
        new_id = run_id_for(s.schedule_id, original.scheduled_for, manual=True)
        first = await self._first_result(f"redrive:{run_id}", request_id, new_id)
        if first is not None:
            try:
                return await svc.runs.get(first)  # a retry: the first call's run
            except NotFound:
                new_id = first  # the first call stopped before recording it
        await self._claim_redrive(letter, new_id)
        run = await self._run_again(original, s, new_id)
        metrics.DEAD_LETTERS_REDRIVEN.inc()
        return run

    async def _claim_redrive(self, letter: DeadLetter, new_id: str) -> None:
        """Records on the dead letter that ``new_id`` re-drives it, unless another run did."""
        svc = self._svc
        taken = letter.redrive_run_id
        if not taken and not await svc.dead_letters.mark_redriven(letter, new_id, svc.now()):
            taken = (await svc.dead_letters.get(letter.run_id)).redrive_run_id
        if taken and taken != new_id:
            raise FailedPrecondition(f"run {letter.run_id!r} was re-driven already, as {taken!r}")

    async def redrive_many(
        self, schedule_id: str, *, start: datetime | None, end: datetime | None
    ) -> list[Run]:
        """Re-drives every dead letter of ``schedule_id`` not re-driven yet, dead-lettered in
        [start, end) when given. At most ``MAX_BULK_REDRIVE`` per call (call again for more)."""
        svc = self._svc
        await svc.schedules.get(schedule_id)  # NOT_FOUND for an unknown schedule
        letters = [
            d
            for d in await svc.dead_letters.of_schedule(schedule_id)
            if not d.redrive_run_id
            and (start is None or d.dead_letter_time >= start)
            and (end is None or d.dead_letter_time < end)
        ]
        runs: list[Run] = []
        for d in sorted(letters, key=lambda d: d.dead_letter_time)[:MAX_BULK_REDRIVE]:
            try:
                runs.append(await self.redrive(d.run_id))
            except FailedPrecondition:
                continue  # re-driven concurrently by someone else
        return runs

    async def _rerunnable(self, run_id: str) -> tuple[Run, Schedule]:
        svc = self._svc
        original = await svc.runs.get(run_id)
        if original.status not in RERUNNABLE:
            raise FailedPrecondition(
                f"run {run_id!r} is {original.status.value}; only a finished run (SUCCEEDED, "
                "FAILED, TIMED_OUT, CANCELLED or DEAD_LETTERED) can be re-run"
            )
        s = await svc.schedules.get(original.schedule_id)
        _require_not_cancelled(s, f"run {run_id!r} of it cannot be re-run")
        return original, s

    async def _run_again(self, original: Run, s: Schedule, new_id: str) -> Run:
        run = Run(
            run_id=new_id,
            schedule_id=s.schedule_id,
            scheduled_for=original.scheduled_for,
            status=RunStatus.ENQUEUED,
            handler=s.handler,
            tenant=s.tenant,
            manual=True,
            enqueue_time=self._svc.now(),
            origin_run_id=original.run_id,
        )
        await self._enqueue(run, [])
        logger.info(
            "re-running %s as %s",
            original.run_id,
            run.run_id,
            extra={"schedule_id": s.schedule_id, "run_id": run.run_id},
        )
        return run

    async def _enqueue(self, run: Run, items: list[Write]) -> None:
        """Puts ``run`` as a run timer due now, then records it ENQUEUED (with ``items``)."""
        svc = self._svc
        assert run.enqueue_time is not None
        timer = RunTimer(
            schedule_id=run.schedule_id,
            run_id=run.run_id,
            scheduled_for=run.scheduled_for,
            fire_at=run.enqueue_time,
            manual=run.manual,
            origin_run_id=run.origin_run_id,
            tenant=run.tenant,
        )
        # Timer first: a failure after it still enqueues the run (the dispatcher records it).
        await svc.timers.put([timer.to_timer(svc.timers.shard_count)], now=run.enqueue_time)
        await svc.runs.write([*items, *svc.runs.insert_rows([run])])


def _require_not_cancelled(s: Schedule, what: str) -> None:
    if s.state is ScheduleState.CANCELLED:
        raise FailedPrecondition(f"schedule {s.schedule_id!r} is CANCELLED; {what}")
