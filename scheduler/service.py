"""Schedule lifecycle operations: the domain behind the SchedulerService API.

Every change replaces the schedule's ``generation``; its pending timer carries the generation it
was put with, so a superseded timer is dropped when it comes due instead of being deleted.
Timers are written before the schedule row they belong to, so a failure in between leaves at
most a timer nobody honours, never a schedule that silently stops firing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from bucketer.cassandra import CassandraTimerStore
from bucketer.model import Timer
from scheduler.backfill import BackfillService
from scheduler.cassandra import CassandraRequestStore, CassandraRunStore, CassandraScheduleStore
from scheduler.dead_letters import CassandraDeadLetterStore
from scheduler.dependencies import DependencyGraph
from scheduler.errors import (
    Aborted,
    CronscaleError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from scheduler.model import (
    STALE_RUN,
    MisfireMode,
    OverlapMode,
    Run,
    RunStatus,
    Schedule,
    ScheduleState,
    SkipReason,
    new_generation,
    run_id_for,
    to_millisecond,
    validate_request_id,
    validate_schedule_id,
)
from scheduler.slots import (
    MAX_ENUMERATED_MISSES,
    next_slot,
    plan_misfire,
    slots_between,
)
from scheduler.timers import FIRE, FireTimer, RunTimer, fire_timer_place
from scheduler.validation import spec_error, validate_schedule

logger = logging.getLogger(__name__)

# Items per BatchCreateSchedules call.
MAX_BATCH_CREATE = 1000


@dataclass(frozen=True, kw_only=True)
class CreateResult:
    """One item of a batch create: the stored schedule (new, or ``already_existed``), or the
    error that refused it (nothing of it was written)."""

    schedule: Schedule | None = None
    already_existed: bool = False
    error: CronscaleError | None = None


class ScheduleService:
    """Create, read, pause, resume and delete schedules."""

    def __init__(
        self,
        *,
        schedules: CassandraScheduleStore,
        runs: CassandraRunStore,
        timers: CassandraTimerStore,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._schedules = schedules
        self._runs = runs
        self._timers = timers
        self._clock = clock
        self.requests = CassandraRequestStore(runs.session, schedules)
        self.dead_letters = CassandraDeadLetterStore(runs.session, keyspace=schedules.q.keyspace)
        self.dependencies = DependencyGraph(schedules, runs.session)
        self.backfills = BackfillService(
            schedules=schedules, session=runs.session, timers=timers, clock=clock
        )

    @property
    def schedules(self) -> CassandraScheduleStore:
        return self._schedules

    @property
    def runs(self) -> CassandraRunStore:
        return self._runs

    @property
    def timers(self) -> CassandraTimerStore:
        return self._timers

    def now(self) -> datetime:
        return self._clock()

    async def in_progress(self, s: Schedule, now: datetime) -> list[str]:
        """The schedule's runs in progress, as its overlap policy weighs them: those its run
        rows show (``RunStore.running_of``: the run of a slot is marked in progress on the
        schedule's next fire timer, not on its row; decision 0013), and the schedule row's
        (``Schedule.in_progress``: a triggered or released run, not enqueued yet) less any
        that ended. Reads the run rows: for trigger, cancel, update and resume only."""
        rows = await self._runs.running_of(s.schedule_id, now=now, stale_after=STALE_RUN)
        marked = [r for r in s.in_progress(now, stale_after=STALE_RUN) if r not in rows]
        if marked:
            ended = await self._runs.ended(marked, now=now, stale_after=STALE_RUN)
            marked = [r for r in marked if r not in ended]
        return [*rows, *marked]

    async def carried_on(self, s: Schedule, now: datetime) -> list[str]:
        """The runs in progress a change's first fire timer carries (decision 0013): none
        under ALLOW, which never weighs them, so its changes read no run rows."""
        if s.policies.overlap is OverlapMode.ALLOW:
            return []
        return await self.in_progress(s, now)

    async def keep_carried_lease(self, s: Schedule, since: datetime) -> None:
        """Writes the lease that ``s``'s pending fire timer carries (decision 0010) as a lease
        timer of its own, before a change supersedes that timer. Superseded, the timer would
        write it when it comes due, unless a timer of the new chain, due at the same instant,
        has overwritten its row by then (both are stored under the schedule's id): then the
        lease was lost, and a run whose worker died stayed RUNNING. Only a pending timer due
        after ``since`` can be overwritten so: it is looked for at the schedule's first two
        slots after ``since`` (one read each; the second, for a chain that fire-ahead moved on
        already; a timer a quota put off lies where no timer of the new chain will land)."""
        shards = self._timers.shard_count
        places: list[datetime] = []
        try:
            nxt = next_slot(s, since)
            if nxt is not None:
                places.append(nxt.at)
                after = next_slot(s, nxt.slot)
                if after is not None:
                    places.append(after.at)
        except InvalidArgument:
            return  # a spec no slot can be computed for had no chain to carry anything
        found = await asyncio.gather(
            *(self._timers.read(fire_timer_place(s.schedule_id, at, shards)) for at in places)
        )
        leases: list[Timer] = []
        for t in found:
            lease = FireTimer.from_timer(t).lease if t is not None and t.kind == FIRE else None
            if lease is not None:
                leases.append(lease.to_timer(shards))
        if leases:
            await self._timers.put(leases, now=self._clock())

    def first_fire(
        self, s: Schedule, now: datetime, *, fired: int = 0, running: Sequence[str] = ()
    ) -> FireTimer | None:
        """The schedule's pending timer for its first slot after ``now`` (the dispatcher's
        own rule: bounds and jitter applied), or None if it never fires again. ``running``:
        the schedule's runs in progress (``in_progress``), which the superseded chain's timer
        carried (decision 0013)."""
        try:
            nxt = next_slot(s, now)
        except InvalidArgument as e:
            raise spec_error(e, s.spec.kind) from None
        if nxt is None or (s.spec.max_runs and fired >= s.spec.max_runs):
            return None
        return FireTimer(
            schedule_id=s.schedule_id,
            generation=s.generation,
            slot=nxt.slot,
            scheduled_for=nxt.at,
            fired=fired,
            tenant=s.tenant,
            first=True,
            running=tuple(running),
        )

    async def create_many(
        self, items: Sequence[tuple[Schedule | CronscaleError, str]]
    ) -> list[CreateResult]:
        """Creates many schedules at once: ``items`` are (draft, or the error its conversion
        raised; client-chosen id or ""). Each item is validated on its own and refused alone
        (its error's field prefixed ``items[i].``); an item whose id exists is reported
        ``already_existed`` with the stored schedule. The rest (schedule rows and first
        timers) are written grouped by partition, without the per-row existence check
        (an LWT each) of :meth:`create`: ids the client did not choose are fresh UUIDs, and
        chosen ones are looked up first, in one read.

        Dependencies (``after``) are refused here: linking them is a read-modify-write per
        upstream (use :meth:`create`).
        """
        if len(items) > MAX_BATCH_CREATE:
            raise InvalidArgument("items", f"at most {MAX_BATCH_CREATE} per call, got {len(items)}")
        now = self._clock()
        results: list[CreateResult | None] = [None] * len(items)
        ready: dict[int, tuple[Schedule, FireTimer | None]] = {}
        seen: dict[str, int] = {}
        for i, (draft, chosen) in enumerate(items):
            try:
                if isinstance(draft, CronscaleError):
                    raise draft
                s, first = self._prepare(draft, chosen, now)
                if chosen and chosen in seen:
                    raise InvalidArgument("schedule_id", f"repeats items[{seen[chosen]}]")
            except CronscaleError as e:
                results[i] = CreateResult(error=_item_error(e, i))
                continue
            if s.after:
                results[i] = CreateResult(
                    error=InvalidArgument(
                        f"items[{i}].schedule.after", "dependencies are set with CreateSchedule"
                    )
                )
                continue
            if chosen:
                seen[chosen] = i
            ready[i] = (s, first)
        existing = await self._schedules.get_many([sid for sid in seen])
        timers = []
        rows = []
        for i, (s, first) in ready.items():
            stored = existing.get(s.schedule_id)
            if stored is not None:
                results[i] = CreateResult(schedule=stored, already_existed=True)
                continue
            if first is not None:
                timers.append(first.to_timer(self._timers.shard_count))
            rows.append(s)
            results[i] = CreateResult(schedule=s)
        # Timers first, as in create(): a schedule row never exists without its timer.
        await self._timers.put(timers, now=now)
        await self._schedules.create_unchecked(rows)
        logger.info("created %d schedules in a batch of %d", len(rows), len(items))
        return [r if r is not None else CreateResult() for r in results]

    def _prepare(
        self, draft: Schedule, schedule_id: str, now: datetime
    ) -> tuple[Schedule, FireTimer | None]:
        """A draft made a new schedule (id, state, times) and validated, with its first timer;
        InvalidArgument if it is invalid or never fires."""
        sid = validate_schedule_id(schedule_id) if schedule_id else str(uuid.uuid4())
        stamp = to_millisecond(now)  # as stored
        # evolve, not replace: a batch create prepares up to 500 of these per call.
        s = draft.evolve(
            schedule_id=sid,
            state=ScheduleState.ACTIVE,
            version=1,
            generation=new_generation(),
            create_time=stamp,
            update_time=stamp,
        )
        validate_schedule(s, now)
        first = self.first_fire(s, now)
        # A schedule with upstreams fires after their successes even without times of its own.
        if first is None and not s.after:
            raise InvalidArgument("schedule.spec", "never fires after now")
        return s.evolve(next_fire_time=first.scheduled_for if first else None), first

    async def create(
        self, draft: Schedule, *, schedule_id: str = "", request_id: str = ""
    ) -> Schedule:
        """Validates and stores a schedule and its first timer; nothing is stored on error.

        With ``request_id`` a retry of the call returns the schedule the first call created
        (for a day), instead of a second schedule firing every slot again.
        """
        now = self._clock()
        sid = schedule_id or str(uuid.uuid4())
        # An id this call minted is free, so its row needs no existence check (an LWT); a
        # chosen id, or a retry's, is checked (ALREADY_EXISTS if taken).
        checked = bool(schedule_id)
        if request_id:
            # Per tenant: another tenant's request_id must neither collide with this one nor
            # answer with its schedule.
            claimed = await self.requests.claim(
                f"create:{draft.tenant}:{validate_request_id(request_id)}", sid
            )
            if claimed != sid:
                try:
                    return await self.get(claimed)  # a retry: the first call's schedule
                except NotFound:
                    pass  # the first call stopped before storing it: store it now
                sid, checked = claimed, True
        s, first = self._prepare(draft, sid, now)
        await self.dependencies.validate(s)
        # Timer first: if the insert then fails (or the id is taken), the timer's fresh
        # generation matches no schedule and is dropped when due.
        if first is not None:
            await self._timers.put([first.to_timer(self._timers.shard_count)], now=now)
        if checked:
            await self._schedules.create(s)
        else:
            await self._schedules.create_unchecked([s])
        if s.after:
            await self._link_upstreams(s)
        logger.info("created schedule %s", sid, extra={"schedule_id": sid, "tenant": s.tenant})
        return s

    async def get(self, schedule_id: str) -> Schedule:
        s = await self._schedules.get(schedule_id)
        return self._with_next(s)

    def _with_next(self, s: Schedule) -> Schedule:
        """The stored row with ``next_fire_time`` as preview computes it (active only; none
        while a timer of it is quarantined: it will not fire until changed or resumed)."""
        if s.state is not ScheduleState.ACTIVE or s.quarantine_error:
            return replace(s, next_fire_time=None)
        now = self._clock()
        if s.next_fire_time is not None and s.next_fire_time > now:
            return s
        # A slot fires at slot + the schedule's offset: the next one to fire is the first slot
        # after now - offset (preview's rule), not the first slot after now.
        nxt = self.first_fire(s, now - s.slot_offset)
        return replace(s, next_fire_time=nxt.scheduled_for if nxt else None)

    async def list_page(
        self, page_size: int, page_token: str, *, tenant: str | None = None
    ) -> tuple[list[Schedule], str]:
        """One page of every schedule, or of ``tenant``'s only (by its index, not a scan)."""
        items, token = await self._schedules.list(page_size, page_token, tenant=tenant)
        return [self._with_next(s) for s in items], token

    async def pause(self, schedule_id: str, *, note: str, paused_by: str) -> Schedule:
        s = await self._schedules.get(schedule_id)
        if s.state is ScheduleState.PAUSED:
            return s
        if s.state is not ScheduleState.ACTIVE:
            raise FailedPrecondition(f"schedule {schedule_id!r} is {s.state.value}, not ACTIVE")
        now = self._clock()
        gen = new_generation()
        if not await self._schedules.change_state(
            s,
            state=ScheduleState.PAUSED,
            generation=gen,
            now=now,
            next_fire_time=None,
            pause_note=note,
            paused_by=paused_by,
            pause_time=now,
        ):
            raise Aborted(f"schedule {schedule_id!r} changed concurrently; read it and retry")
        return await self.get(schedule_id)

    async def resume(
        self, schedule_id: str, *, misfire_override: MisfireMode | None = None
    ) -> Schedule:
        """Fires again from the next slot after now. The slots that came due while paused are
        handled by the misfire policy (or ``misfire_override``): SKIPPED with reason
        ``paused``, or run now (the latest, or all inside the catch-up window)."""
        s = await self._schedules.get(schedule_id)
        if s.state is ScheduleState.ACTIVE:
            return self._with_next(s)
        if s.state is not ScheduleState.PAUSED:
            raise FailedPrecondition(f"schedule {schedule_id!r} is {s.state.value}, not PAUSED")
        now = self._clock()
        resumed = replace(s, generation=new_generation(), state=ScheduleState.ACTIVE)
        missed = slots_between(resumed, s.pause_time or now, now, MAX_ENUMERATED_MISSES)
        decided = plan_misfire(s.policies, missed, now, mode=misfire_override)
        fired = await self.fired_so_far(s) if s.spec.max_runs else 0
        catch_up = (
            decided.fire[: max(0, s.spec.max_runs - fired)] if s.spec.max_runs else decided.fire
        )
        # Minted again just before the timers are written (as in Lifecycle.update).
        resumed = replace(resumed, generation=new_generation())
        running = await self.carried_on(s, now)
        await self.keep_carried_lease(s, s.pause_time or now)
        first = self.first_fire(resumed, now, fired=fired + len(catch_up), running=running)
        timers = [
            RunTimer(
                schedule_id=s.schedule_id,
                run_id=run_id_for(s.schedule_id, slot.at),
                scheduled_for=slot.at,
                fire_at=now,
                tenant=s.tenant,
            ).to_timer(self._timers.shard_count)
            for slot in catch_up
        ]
        if first is not None:
            timers.append(first.to_timer(self._timers.shard_count))
        await self._timers.put(timers, now=now)
        if not await self._schedules.change_state(
            s,
            state=(
                ScheduleState.ACTIVE if first or catch_up or s.after else ScheduleState.COMPLETED
            ),
            generation=resumed.generation,
            now=now,
            next_fire_time=first.scheduled_for if first else None,
        ):
            raise Aborted(f"schedule {schedule_id!r} changed concurrently; read it and retry")
        if s.quarantine_error:
            await self._schedules.clear_quarantine(schedule_id)  # re-armed by this resume
        fire_slots = {slot.slot for slot in catch_up}
        skipped = [
            Run(
                run_id=run_id_for(s.schedule_id, slot.at),
                schedule_id=s.schedule_id,
                scheduled_for=slot.at,
                status=RunStatus.SKIPPED,
                handler=s.handler,
                tenant=s.tenant,
                skip_reason=SkipReason.PAUSED.value,
            )
            for slot in missed
            if slot.slot not in fire_slots
        ]
        await self._runs.write(self._runs.insert_rows(skipped))
        logger.info(
            "resumed schedule %s: %d missed slots, %d run now, %d skipped",
            schedule_id,
            len(missed),
            len(catch_up),
            len(skipped),
            extra={"schedule_id": schedule_id},
        )
        return await self.get(schedule_id)

    async def fired_so_far(self, s: Schedule) -> int:
        """Scheduled runs of ``s`` fired so far, read from its run history (for ``max_runs``
        across a pause or an update)."""
        count, token = 0, ""
        while True:
            runs, token = await self._runs.list(s.schedule_id, 1000, token)
            count += sum(
                1
                for r in runs
                if r.status is not RunStatus.SKIPPED
                and not r.manual
                and not r.backfill_id
                and not r.origin_run_id
            )
            if not token:
                return count

    async def _link_upstreams(self, s: Schedule) -> None:
        """Reverse edges after the row; if they cannot be written the new row is taken back,
        so a failed create leaves no schedule that silently never runs after its upstreams."""
        try:
            await self.dependencies.link(s.schedule_id, s.after)
        except Exception:
            try:
                await self._schedules.delete(s.schedule_id)
            except Exception:
                logger.exception("could not take back schedule %s", s.schedule_id)
            raise

    async def delete(self, schedule_id: str) -> None:
        """Deletes a schedule; FailedPrecondition naming its dependents if others run after
        it. Its upstreams forget it afterwards (a crash in between leaves a harmless dangling
        id in their ``downstream`` sets)."""
        s = await self._schedules.get(schedule_id)
        await self.dependencies.check_deletable(s)
        await self._schedules.delete(schedule_id)
        if s.after:
            await self.dependencies.unlink(schedule_id, s.after)
        logger.info("deleted schedule %s", schedule_id, extra={"schedule_id": schedule_id})

    async def list_runs(
        self, schedule_id: str, page_size: int, page_token: str
    ) -> tuple[list[Run], str]:
        return await self._runs.list(schedule_id, page_size, page_token)

    async def get_run(self, run_id: str) -> Run:
        return await self._runs.get(run_id)


def _item_error(e: CronscaleError, index: int) -> CronscaleError:
    """``e`` with its field addressed to item ``index`` of a batch."""
    if isinstance(e, InvalidArgument):
        return InvalidArgument(f"items[{index}].{e.field}", e.problem)
    return e
