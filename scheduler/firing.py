"""What happens when timers are due: the dispatcher's firing logic, one batch at a time.

For a batch of due timers: read their schedules in one multi-partition query and drop the
timers a change has superseded (generation mismatch, paused, deleted). For each live fire timer
decide, by the schedule's policies, which slots run and which are recorded SKIPPED with a reason
(misfire, overlap, max_runs, dst); record the runs (ENQUEUED or SKIPPED), mark enqueued runs in
progress (on the schedule's next fire timer, or on the schedule row; decision 0013), put each
schedule's next timer (grouped writes), then produce the run messages to Kafka and wait for
their acknowledgement. Only then does the scanner move its
checkpoint, so a crash anywhere re-fires the batch with the same run ids (at-least-once).

Carried leases: every enqueued attempt holds a lease (scheduler.retries). A run fired from a
slot whose schedule's next slot comes due before that lease does writes no lease timer: the
next fire timer carries the lease. When that timer fires (or is found superseded), the schedule
row read for it says whether the run finished (``done_run``); if so the lease is settled
without a write, else it is written then as an ordinary lease timer, due when it was always
due. The API has nothing to settle for such a run (its message carries no lease time). So a
recurring schedule's firing costs no lease write and no settle, and a lost run is still found
at its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from aiokafka.errors import KafkaError

from bucketer.cql import TRANSIENT_STORAGE_ERRORS, Write
from bucketer.model import Timer, micros
from scheduler import metrics
from scheduler.backfill import TICK as BACKFILL_TICK
from scheduler.backfill import BackfillDriver
from scheduler.errors import InvalidArgument, Unavailable
from scheduler.fairness import (
    UNLIMITED,
    ConcurrencyGate,
    TenantDirectory,
    TenantLanes,
    TenantLimits,
    Throttle,
    Unlimited,
)
from scheduler.kafka import MESSAGE_ERRORS, Keyed, run_message
from scheduler.model import (
    DONE_NOTE_LEAD,
    MISFIRE_THRESHOLD,
    STALE_RUN,
    BufferedRun,
    FollowUp,
    OverlapMode,
    Run,
    RunEventRecord,
    RunStatus,
    Schedule,
    ScheduleState,
    SkipReason,
    generation_minted,
    millis,
    parse_run_id,
    run_id_for,
    to_millisecond,
)
from scheduler.overlap import OverlapAction, decide_overlap
from scheduler.retries import (
    HEARTBEAT_LEASE,
    START_LEASE,
    DeadLetterPublisher,
    Failures,
    LeaseCheck,
    retry_due_rows,
)
from scheduler.schedule_cache import ScheduleCache
from scheduler.slots import (
    MAX_ENUMERATED_MISSES,
    Slot,
    dst_skips,
    next_slot,
    plan_misfire,
    slots_between,
)
from scheduler.stores import RunQueue, RunStore, ScheduleStore, TimerStore
from scheduler.timers import (
    BACKFILL,
    DEAD_LETTER,
    FIRE,
    LEASE,
    RUN,
    BackfillTimer,
    DeadLetterTimer,
    FireTimer,
    LeaseTimer,
    RunTimer,
)

logger = logging.getLogger(__name__)

# Counters' children counted once per fire timer, looked up once (``labels()`` costs ~2 µs).
_LEASES_SETTLED = metrics.LEASES_CARRIED.labels(outcome="settled")
_LEASES_WRITTEN = metrics.LEASES_CARRIED.labels(outcome="written")

# Fire-ahead: messages due within this of each other are produced together (at the last one's
# time), so a batch of spread slots is a few produce calls, not one per slot. A batch of
# BUSY_RELEASES or more (a busy dispatcher, as the scanner's busy round) is released in
# BUSY_RELEASE_SLICE slices: at 100,000 firings a minute 25 ms slices of ~40 messages made every
# stage after them (the produce, the worker's fetches and reports, the API's writes) work in
# batches that small, and cost more CPU per firing than firing without fire-ahead; 100 ms slices
# cost less (decision 0011).
RELEASE_SLICE = timedelta(milliseconds=25)
BUSY_RELEASE_SLICE = timedelta(milliseconds=100)
BUSY_RELEASES = 20
# The API writes the first timer of a change (create, update, resume) before the row that makes
# its generation current (decision 0002), so a scanner can hand it in between and find no
# schedule, or the schedule's previous generation. Such a timer is looked at again every
# IN_FLIGHT_RECHECK while the change may still be landing (IN_FLIGHT_WAIT after its slot for a
# missing row, after its generation was minted for a mismatch), then dropped: a deleted
# schedule's last timer, or the timer of a change whose compare-and-set lost, costs a few
# rewrites.
IN_FLIGHT_RECHECK = timedelta(seconds=2)
IN_FLIGHT_WAIT = timedelta(seconds=10)
# How far the API's clock (which mints generations) may be ahead of a dispatcher's: the skew
# either tolerates (bucketer/clock.py, 0.5 s by default) and a margin.
_MINT_SKEW = timedelta(seconds=1)


def change_in_flight(f: FireTimer, s: Schedule | None, now: datetime) -> bool:
    """Whether fire timer ``f``, not current for ``s`` (its schedule, or None if no row), may
    belong to a change whose row is still being written: a create whose row is missing, or an
    update or resume whose generation was minted after the schedule's current one, less than
    ``IN_FLIGHT_WAIT`` ago. A generation minted before the current one was superseded."""
    if s is None:
        return now - f.scheduled_for < IN_FLIGHT_WAIT
    if s.generation == f.generation:
        return False
    minted = generation_minted(f.generation)
    current = generation_minted(s.generation)
    if minted <= current <= now + _MINT_SKEW:
        return False
    return -_MINT_SKEW <= now - minted < IN_FLIGHT_WAIT


class Release(NamedTuple):
    """An enqueued run's message and its own rows, produced and written together at ``at``."""

    at: datetime
    message: Keyed
    rows: list[Write]


def release_slices(releases: Sequence[Release], now: datetime) -> list[list[Release]]:
    """Fire-ahead's releases in the groups that go out together, each at its last one's time,
    oldest first: everything already due at ``now`` in one group, the rest in slices of
    ``RELEASE_SLICE`` from each slice's first release (``BUSY_RELEASE_SLICE`` when there are
    ``BUSY_RELEASES`` or more)."""
    ordered = sorted(releases, key=lambda r: r.at)
    due = [r for r in ordered if r.at <= now]
    width = BUSY_RELEASE_SLICE if len(ordered) >= BUSY_RELEASES else RELEASE_SLICE
    slices: list[list[Release]] = [due] if due else []
    for item in ordered[len(due) :]:
        if not slices or slices[-1] is due or item.at - slices[-1][0].at > width:
            slices.append([])
        slices[-1].append(item)
    return slices


@dataclass
class FiringPlan:
    """Everything one batch writes and produces, accumulated before any I/O."""

    enqueue: list[tuple[Schedule, Run]] = field(default_factory=list)
    skipped: list[Run] = field(default_factory=list)
    next_timers: list[Timer] = field(default_factory=list)
    completed: list[tuple[Schedule, datetime]] = field(default_factory=list)
    buffered: list[tuple[Schedule, BufferedRun]] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    # Runs whose lease their schedule's next fire timer carries (no lease timer of their own).
    carried: set[str] = field(default_factory=set)
    # Runs whose end the API notes on their schedule's next fire timer, due at this time
    # (RunMessage.next_fire_time; scheduler.schedule_cache).
    note_on: dict[str, datetime] = field(default_factory=dict)
    # The tenants' tiers and quotas (scheduler.fairness), for the batch's schedules.
    limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    # Other rows the batch writes (a put-off retry's new due time).
    rows: list[Write] = field(default_factory=list)

    def skip(self, s: Schedule, slot: Slot | datetime, reason: SkipReason, note: str = "") -> None:
        at = slot.at if isinstance(slot, Slot) else slot
        self.skipped.append(
            Run(
                run_id=run_id_for(s.schedule_id, at),
                schedule_id=s.schedule_id,
                scheduled_for=at,
                status=RunStatus.SKIPPED,
                handler=s.handler,
                tenant=s.tenant,
                skip_reason=reason.value,
                error=note,
            )
        )


def plan_fire(
    s: Schedule,
    f: FireTimer,
    now: datetime,
    plan: FiringPlan,
    shard_count: int,
    *,
    misfire_threshold: timedelta = MISFIRE_THRESHOLD,
    lease_at: datetime | None = None,
) -> None:
    """Decides what a due slot of ``s`` does, by its policies; appends to ``plan``.

    A slot later than ``misfire_threshold`` counts as missed, with every slot after it up to
    now: the misfire policy picks which run. Otherwise the slot runs, subject to the overlap
    policy; then the next slot is put, or the schedule completes. ``lease_at`` is when the
    lease of a run enqueued now expires: a single run's lease is carried by the next fire
    timer when that is due first (see "carried leases" above).
    """
    due = Slot(slot=f.slot, at=f.scheduled_for)
    # Late because the tenant's enqueue quota held it back is not missed (scheduler.fairness).
    if not f.held_by_quota and now - f.scheduled_for > misfire_threshold:
        more = slots_between(s, f.slot, now, MAX_ENUMERATED_MISSES)
        missed = [due, *more]
        decided = plan_misfire(s.policies, missed, now)
        to_fire, to_skip = decided.fire, decided.skip
        last = missed[-1].slot
        for m in to_skip:
            plan.skip(s, m, SkipReason.MISFIRE)
        if len(more) == MAX_ENUMERATED_MISSES:
            # Far too many to list: one more record stands for the rest, and says so.
            plan.skip(
                s,
                now,
                SkipReason.MISFIRE,
                f"further slots after {last.isoformat()} "
                f"up to {now.isoformat()} were missed and are not listed one by one",
            )
            last = now
    else:
        to_fire, last = [due], f.slot

    fired = f.fired
    if s.spec.max_runs:
        allowed = max(0, s.spec.max_runs - fired)
        for extra in to_fire[allowed:]:
            plan.skip(s, extra, SkipReason.MAX_RUNS)
        to_fire = to_fire[:allowed]

    # Each slot's run id, named once: the run, its overlap check, its lease and its done note.
    ids = [run_id_for(s.schedule_id, slot.at) for slot in to_fire]
    if to_fire:
        # A refire of these slots (the batch retried after a partial failure) finds their own
        # earlier attempt recorded: that is the same firing again, not another run in progress.
        ours = set(ids)
        decision = decide_overlap(
            s.policies.overlap,
            s.in_progress(now, stale_after=STALE_RUN, besides=ours),
            buffered=s.buffered is not None and s.buffered.run_id not in ours,
        )
        plan.cancel.extend(decision.cancel)
        if decision.action is OverlapAction.BUFFER:
            first, rest = to_fire[0], to_fire[1:]
            plan.buffered.append((s, BufferedRun(run_id=ids[0], scheduled_for=first.at)))
            fired += 1
            for slot in rest:
                plan.skip(s, slot, SkipReason.OVERLAP)
            to_fire, ids = [], []
        elif decision.action is OverlapAction.SKIP:
            for slot in to_fire:
                plan.skip(s, slot, SkipReason.OVERLAP)
            to_fire, ids = [], []

    deferred = timedelta(milliseconds=f.deferred_ms) if f.deferred_ms else None
    for slot, run_id in zip(to_fire, ids, strict=True):
        plan.enqueue.append((s, _run(s, run_id, slot.at, now, deferred=deferred)))
    fired += len(to_fire)

    nxt = None
    behind = False
    if not (s.spec.max_runs and fired >= s.spec.max_runs):
        nxt = next_slot(s, last)
        if nxt is not None and nxt.slot <= now:
            if f.held_by_quota:
                behind = True  # the quota holds the tenant back: its slots wait, never skip
            elif now - nxt.at > misfire_threshold:
                nxt = next_slot(s, now)
    until = nxt.slot if nxt is not None else last + timedelta(days=1)
    plan.skipped.extend(_dst_runs(s, last, until))
    if nxt is None:
        plan.completed.append((s, f.scheduled_for))
        return
    lease = None
    if lease_at is not None and len(to_fire) == 1 and nxt.at <= lease_at:
        lease = LeaseTimer(
            schedule_id=s.schedule_id,
            run_id=ids[0],
            attempt=1,
            fire_at=lease_at,
            # The batch's enqueue instant, to the millisecond as the worker echoes it back.
            stamp=micros(to_millisecond(now)),
        )
        plan.carried.add(lease.run_id)
    # The run marked in progress on the next fire timer rather than the schedule row (decision
    # 0013): a single run whose end the API can note on that timer. Nothing enqueued (the slot
    # skipped or held back for runs in progress): the timer carries on those it came with.
    running: tuple[str, ...] = () if to_fire else s.running
    if (
        len(to_fire) == 1
        and s.policies.overlap is not OverlapMode.BUFFER_ONE
        and nxt.at - now > DONE_NOTE_LEAD
    ):
        plan.note_on[ids[0]] = nxt.at
        running = (ids[0],)
    plan.next_timers.append(
        FireTimer(
            schedule_id=s.schedule_id,
            generation=s.generation,
            slot=nxt.slot,
            scheduled_for=nxt.at,
            fired=fired,
            quota_behind=behind,
            tenant=s.tenant,
            lease=lease,
            running=running,
        ).to_timer(shard_count)
    )


async def _nothing() -> set[str]:
    return set()


def _dst_runs(s: Schedule, after: datetime, until: datetime) -> list[Run]:
    return [
        Run(
            run_id=k.run_id,
            schedule_id=s.schedule_id,
            scheduled_for=k.scheduled_for,
            status=RunStatus.SKIPPED,
            handler=s.handler,
            tenant=s.tenant,
            skip_reason=k.reason,
        )
        for k in dst_skips(s, after, until)
    ]


def _run(
    s: Schedule,
    run_id: str,
    scheduled_for: datetime,
    now: datetime,
    *,
    manual: bool = False,
    origin_run_id: str = "",
    backfill_id: str = "",
    attempt: int = 1,
    deferred: timedelta | None = None,
) -> Run:
    return Run(
        run_id=run_id,
        schedule_id=s.schedule_id,
        scheduled_for=scheduled_for,
        status=RunStatus.ENQUEUED,
        attempt=attempt,
        handler=s.handler,
        tenant=s.tenant,
        manual=manual,
        enqueue_time=now,
        origin_run_id=origin_run_id,
        backfill_id=backfill_id,
        deferred=deferred,
    )


def plan_run(s: Schedule, r: RunTimer, now: datetime, plan: FiringPlan) -> None:
    """A prepared run (trigger, rerun, released buffer, dependent, backfill) is enqueued."""
    plan.enqueue.append(
        (
            s,
            _run(
                s,
                r.run_id,
                r.scheduled_for,
                now,
                manual=r.manual,
                origin_run_id=r.origin_run_id,
                backfill_id=r.backfill_id,
                attempt=r.attempt,
                deferred=timedelta(milliseconds=r.deferred_ms) if r.deferred_ms else None,
            ),
        )
    )


def dependent_run_wanted(s: Schedule, r: RunTimer, plan: FiringPlan) -> bool:
    """Whether a run timer of ``s`` goes ahead as far as dependencies go.

    A dependent run (its origin is a run of another schedule) is dropped when ``s`` no longer
    runs after that schedule (an edge removed, or a stale ``downstream`` entry naming a
    recreated id), and recorded SKIPPED (reason ``paused``) while ``s`` is paused: at the
    timer's attempt, so a retry skipped so ranks above the failure it follows and ends the run
    (a failure with a retry time is in progress until that retry).
    """
    if not r.origin_run_id:
        return True
    try:
        upstream = parse_run_id(r.origin_run_id).schedule_id
    except InvalidArgument:
        return True
    if upstream == s.schedule_id:
        return True  # a rerun of the schedule's own run
    if upstream not in s.after:
        metrics.TIMERS_SUPERSEDED.inc()
        return False
    if s.state is ScheduleState.PAUSED:
        plan.skipped.append(
            Run(
                run_id=r.run_id,
                schedule_id=s.schedule_id,
                scheduled_for=r.scheduled_for,
                status=RunStatus.SKIPPED,
                handler=s.handler,
                tenant=s.tenant,
                skip_reason=SkipReason.PAUSED.value,
                origin_run_id=r.origin_run_id,
                attempt=r.attempt,
            )
        )
        return False
    return True


def _retry_wanted(row: Run, r: RunTimer) -> bool:
    """Whether retry timer ``r`` still has to go out, given its run's row: the row shows an
    earlier attempt (the one that failed), or this very attempt written but not yet taken."""
    return row.attempt < r.attempt or (
        row.attempt == r.attempt and row.status is RunStatus.ENQUEUED
    )


def _cancelled_before(row: Run, r: RunTimer, now: datetime) -> RunEventRecord:
    """The end of a run asked to cancel while its retry ``r`` was pending: CANCELLED at the
    retry's attempt (above the failure it follows; it clears the retry time), its end noted on
    its schedule as a worker's report of it would be."""
    return RunEventRecord(
        run_id=row.run_id,
        schedule_id=row.schedule_id,
        scheduled_for=row.scheduled_for,
        status=RunStatus.CANCELLED,
        event_time=now,
        attempt=r.attempt,
        error=f"cancelled before attempt {r.attempt}",
        worker_id=row.worker_id,
        enqueue_time=row.enqueue_time,
        follow_up=FollowUp.NONE,
    )


class Firing:
    """Turns due timers into enqueued (or skipped) runs and next timers."""

    def __init__(
        self,
        *,
        schedules: ScheduleStore,
        runs: RunStore,
        timers: TimerStore,
        queue: RunQueue,
        backfills: BackfillDriver,
        topic: Callable[[str], str],
        failures: Failures,
        dead_letters: DeadLetterPublisher,
        tenants: TenantDirectory | None = None,
        throttle: Throttle | None = None,
        concurrency: ConcurrencyGate | None = None,
        lanes: TenantLanes | None = None,
        misfire_threshold: timedelta = MISFIRE_THRESHOLD,
        start_lease: timedelta = START_LEASE,
        heartbeat_lease: timedelta = HEARTBEAT_LEASE,
        fire_ahead: timedelta = timedelta(0),
        cache: ScheduleCache | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._misfire_threshold = misfire_threshold
        # Fire timers decided without reading their schedules (scheduler.schedule_cache).
        self._cache = cache
        # The scanner hands fire timers up to this early; their messages wait for their time.
        self._fire_ahead = fire_ahead.total_seconds()
        self._start_lease = start_lease
        self._leases = LeaseCheck(
            runs=runs,
            timers=timers,
            failures=failures,
            heartbeat_lease=heartbeat_lease,
            clock=clock,
        )
        self._schedules = schedules
        self._runs = runs
        self._timers = timers
        self._queue = queue
        self._topic = topic
        self._tenants: TenantDirectory = tenants or Unlimited()
        self._throttle = throttle or Throttle()
        self._gate = concurrency or ConcurrencyGate(runs)
        self._lanes = lanes
        self._clock = clock
        self._backfills = backfills
        self._dead_letters = dead_letters

    async def quarantine(self, timer: Timer, error: BaseException) -> None:
        """Sets aside a timer whose firing fails on its own (the scanner isolated it): stored
        with its error in the quarantine table and on its schedule, counted, logged."""
        metrics.TIMERS_QUARANTINED.labels(kind=timer.kind).inc()
        if self._cache is not None and timer.key:
            self._cache.forget(timer.key)
        await self._schedules.quarantine(timer, f"{type(error).__name__}: {error}", self._clock())
        if timer.kind == FIRE:
            # The lease it carries still needs its check (the run it guards is not poison).
            try:
                lease = FireTimer.from_timer(timer).lease
            except Exception:
                lease = None  # unreadable: the quarantine row keeps the data for an operator
            if lease is not None:
                await self._timers.put([lease.to_timer(self._timers.shard_count)])

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """Whether retrying can cure ``error`` (a service down or slow), as opposed to poison
        (a timer or schedule that cannot be fired, e.g. a value Kafka or Cassandra refuses)."""
        if isinstance(error, KafkaError):
            # Only an answer about the message itself is poison; the rest (brokers away, a
            # producer whose state went wrong and is replaced) passes with a retry.
            return not isinstance(error, MESSAGE_ERRORS)
        return isinstance(error, (*TRANSIENT_STORAGE_ERRORS, Unavailable, OSError, TimeoutError))

    async def on_due(self, due: Sequence[Timer]) -> None:
        """Fires a batch, its held messages included; raises if anything failed."""
        sending = await self.start(due)
        if sending is not None:
            await sending

    async def start(self, due: Sequence[Timer]) -> asyncio.Task[None] | None:
        """Fires a batch (the scanner's ``OnDue``): plans it and starts its writes and
        produces. With fire-ahead, returns the task that sends them, holding each message
        until its slot, so the scanner plans its next round meanwhile; else returns once all
        is out (None). Raises, or the task does, if anything failed: the scanner hands the
        batch again (same run ids)."""
        started = time.perf_counter()
        metrics.FIRING_BATCH.observe(len(due))
        fires: list[FireTimer] = []
        fire_timers: list[Timer] = []
        runs: list[RunTimer] = []
        run_timers: list[Timer] = []
        backfills: list[BackfillTimer] = []
        leases: list[LeaseTimer] = []
        letters: list[DeadLetterTimer] = []
        for t in due:
            if t.kind == FIRE:
                fires.append(FireTimer.from_timer(t))
                fire_timers.append(t)
            elif t.kind == RUN:
                runs.append(RunTimer.from_timer(t))
                run_timers.append(t)
            elif t.kind == BACKFILL:
                backfills.append(BackfillTimer.from_timer(t))
            elif t.kind == LEASE:
                leases.append(LeaseTimer.from_timer(t))
            elif t.kind == DEAD_LETTER:
                letters.append(DeadLetterTimer.from_timer(t))
            else:
                logger.warning("ignoring timer of unknown kind %r (%s)", t.kind, t.timer_id)
        # Leases first: a lost attempt's retry is a run timer written now, fired later.
        await self._leases.check(leases)
        await self._dead_letters.publish(letters)
        if not fires and not runs:
            await self._backfill_due(backfills)
            return None
        runs, run_timers = await self._current_retries(runs, run_timers)
        schedules = await self._schedules_for(fires, fire_timers, runs)
        now = self._clock()
        lease_at = self._lease_at(now)
        plan = FiringPlan()
        plan.limits = await self._tenants.limits({s.tenant for s in schedules.values()})
        if self._lanes is not None:
            self._lanes.learn(plan.limits)
        await self._gate.refresh(plan.limits)
        # Runs of timers a new shard owner hands over that its previous owner may have fired.
        recheck: set[str] = set()
        for f, timer in zip(fires, fire_timers, strict=True):
            s = schedules.get(f.schedule_id)
            if f.lease is not None:
                # Resolved whatever becomes of the slot (fired, put off, superseded): a timer
                # put again below goes without it (``lease=None``).
                self._resolve_carried(f.lease, s, timer, plan)
            if change_in_flight(f, s, now):
                # A create, update or resume in flight: its row lands right after this timer.
                again = replace(f, lease=None).to_timer(self._timers.shard_count)
                plan.next_timers.append(replace(again, fire_time=now + IN_FLIGHT_RECHECK))
                metrics.TIMERS_RECHECKED.inc()
                continue
            if s is None or s.generation != f.generation or s.state is not ScheduleState.ACTIVE:
                metrics.TIMERS_SUPERSEDED.inc()
                continue
            wait, capped = self._admit(s, plan, booked=f.deferred_ms > 0 and not f.capped)
            if wait:
                at = now + timedelta(seconds=wait)
                later = replace(
                    f,
                    deferred_ms=max(1, millis(at - f.scheduled_for)),
                    capped=capped,
                    lease=None,
                )
                plan.next_timers.append(later.to_timer(self._timers.shard_count))
                continue
            before = len(plan.enqueue)
            plan_fire(
                s,
                f,
                now,
                plan,
                self._timers.shard_count,
                misfire_threshold=self._misfire_threshold,
                lease_at=lease_at,
            )
            self._hold_places(s, plan, before)
            if timer.after_takeover:
                recheck.update(run.run_id for _s, run in plan.enqueue[before:])
        for r, timer in zip(runs, run_timers, strict=True):
            s = schedules.get(r.schedule_id)
            if s is None or s.state is ScheduleState.CANCELLED:
                metrics.TIMERS_SUPERSEDED.inc()
                continue
            if not dependent_run_wanted(s, r, plan):
                continue
            wait, capped = self._admit(s, plan, booked=r.deferred_ms > 0 and not r.capped)
            if wait:
                at = now + timedelta(seconds=wait)
                put_off = replace(
                    r,
                    fire_at=at,
                    deferred_ms=r.deferred_ms + max(1, millis(at - r.fire_at)),
                    capped=capped,
                )
                plan.next_timers.append(put_off.to_timer(self._timers.shard_count))
                if r.attempt > 1:  # the run stays in progress until its retry, now later
                    plan.rows.extend(
                        retry_due_rows(self._runs, self._schedules, s, r.run_id, r.attempt - 1, at)
                    )
                continue
            before = len(plan.enqueue)
            plan_run(s, r, now, plan)
            self._hold_places(s, plan, before)
            if timer.after_takeover:
                recheck.add(r.run_id)
        if recheck:
            await self._drop_delivered(plan, recheck)
        out = self._apply(plan, now)

        async def send() -> None:
            await out
            done = self._clock()
            # Counted by label, each label's child looked up once a batch, not once a run.
            tiers = Counter(plan.limits.get(s.tenant, UNLIMITED).tier for s, _ in plan.enqueue)
            for tier, count in tiers.items():
                metrics.RUNS_ENQUEUED.labels(tier=tier).inc(count)
            for _s, run in plan.enqueue:
                metrics.FIRE_LAG.observe(max(0.0, (done - run.scheduled_for).total_seconds()))
            for reason, count in Counter(run.skip_reason for run in plan.skipped).items():
                metrics.RUNS_SKIPPED.labels(reason=reason).inc(count)
            logger.debug(
                "fired %d runs, skipped %d in %.1f ms",
                len(plan.enqueue),
                len(plan.skipped),
                (time.perf_counter() - started) * 1e3,
            )
            # Backfills last: live firings of the batch are out before any backfill run.
            await self._backfill_due(backfills)

        if self._fire_ahead <= 0 or not plan.enqueue:
            await send()
            return None
        sending = asyncio.create_task(send(), name="firing-send")
        # Cancelled (the dispatcher stopping) even before it began to wait: nothing more goes.
        sending.add_done_callback(lambda _task: out.cancel())
        return sending

    def _lease_at(self, now: datetime) -> datetime:
        """When the lease of an attempt enqueued by a batch started ``now`` comes due: the same
        instant whether a lease timer or the next fire timer carries it."""
        return to_millisecond(now) + self._start_lease

    async def _schedules_for(
        self, fires: list[FireTimer], fire_timers: list[Timer], runs: list[RunTimer]
    ) -> dict[str, Schedule]:
        """The schedules the batch's fire and run timers name: from the cache where a fire
        timer can be decided from it (scheduler.schedule_cache), else read in one
        multi-partition query. A read schedule whose run in progress has ended (noted on the
        fire timer, or its run row shows an outcome) is returned with that run done."""
        cache = self._cache
        cached: dict[str, Schedule] = {}
        if cache is not None and fires:
            await cache.refresh(self._clock())
            for f, timer in zip(fires, fire_timers, strict=True):
                s = cache.ready_to_fire(timer, f.schedule_id, f.generation)
                if s is not None:
                    cached[f.schedule_id] = s
        wanted = [f.schedule_id for f in fires if f.schedule_id not in cached]
        wanted += [r.schedule_id for r in runs]
        read = await self._schedules.get_many(wanted) if wanted else {}
        fired = {f.schedule_id for f in fires} - cached.keys()
        if cache is not None:
            cache.missed(len(fired))
        if not read:
            return cached
        now = self._clock()
        noted = {t.key: t.done_run for t in fire_timers if t.done_run}
        in_progress: dict[str, str] = {}
        weighed = {
            sid
            for sid in fired & read.keys()
            if read[sid].policies.overlap is not OverlapMode.ALLOW
        }
        for sid in weighed:
            s = read[sid]
            if s.active_run and s.active_run != s.done_run and noted.get(sid) == s.active_run:
                s = read[sid] = replace(s, done_run=s.active_run)
            for run_id in s.in_progress(now, stale_after=STALE_RUN):
                in_progress[run_id] = sid
        # Runs the fire timers mark in progress (decision 0013), less one whose end the API
        # noted on the timer: looked up in their run rows.
        carried: dict[str, str] = {}
        for f, timer in zip(fires, fire_timers, strict=True):
            if f.schedule_id in weighed:
                for run_id in f.running:
                    if run_id != timer.done_run:
                        carried[run_id] = f.schedule_id
        # The schedule row shows the run enqueued last in progress until a report marks it
        # done there; a run whose end was noted on a fire timer is done, yet marked only there.
        ended, alive = await asyncio.gather(
            (
                self._runs.ended(list(in_progress), now=now, stale_after=STALE_RUN)
                if in_progress
                else _nothing()
            ),
            (
                self._runs.still_running(list(carried), now=now, stale_after=STALE_RUN)
                if carried
                else _nothing()
            ),
        )
        for run_id in ended:
            sid = in_progress.pop(run_id)
            read[sid] = replace(read[sid], done_run=run_id)
        running: dict[str, list[str]] = {}
        for run_id, sid in carried.items():
            if run_id in alive:
                running.setdefault(sid, []).append(run_id)
        for sid, ids in running.items():
            read[sid] = replace(read[sid], running=tuple(ids))
        if cache is not None:
            for sid in fired & read.keys():
                s = read[sid]
                marked = s.active_run if s.active_run != s.done_run else ""
                cache.put(s, active_run=marked or (s.running[0] if s.running else ""))
        return {**cached, **read}

    def _resolve_carried(
        self, lease: LeaseTimer, s: Schedule | None, timer: Timer, plan: FiringPlan
    ) -> None:
        """A lease carried by a fire timer now due: settled if its run finished (noted on the
        timer, or the schedule row's ``done_run``), else written as a lease timer, due at its
        own time."""
        if timer.done_run == lease.run_id or (s is not None and s.done_run == lease.run_id):
            _LEASES_SETTLED.inc()
            return
        _LEASES_WRITTEN.inc()
        plan.next_timers.append(lease.to_timer(self._timers.shard_count))

    def _admit(self, s: Schedule, plan: FiringPlan, *, booked: bool) -> tuple[float, bool]:
        """(0.0, False) if ``s``'s tenant may enqueue one more run now; else how long to put it
        off, and whether its concurrent-runs cap (rather than its rate) is the reason. A timer
        the rate put off before has its token ``booked`` and is not asked for another."""
        limits = plan.limits.get(s.tenant, UNLIMITED)
        wait = self._gate.admit(s.tenant, limits)
        capped = wait > 0
        if not capped and not booked:
            wait = self._throttle.admit(s.tenant, limits)
        if wait:
            quota = "concurrency" if capped else "rate"
            metrics.FIRINGS_DEFERRED.labels(tier=limits.tier, quota=quota).inc()
        return wait, capped

    def _hold_places(self, s: Schedule, plan: FiringPlan, before: int) -> None:
        """The runs just planned for ``s`` hold places under its tenant's concurrent-runs cap."""
        if not plan.limits.get(s.tenant, UNLIMITED).max_concurrent:
            return
        for _s, run in plan.enqueue[before:]:
            self._gate.started(s.tenant, run.run_id, run.attempt)

    async def _current_retries(
        self, runs: list[RunTimer], timers: list[Timer]
    ) -> tuple[list[RunTimer], list[Timer]]:
        """The retries among ``runs`` (attempt above 1) that are still wanted, completed from
        their run rows (manual, origin, backfill). A retry whose run a worker took at that
        attempt or later, or that moved past it, is dropped. A row showing the retry's own
        attempt still ENQUEUED is fired again: that is this batch handed again after its rows
        were written and its produce failed (the message may never have reached Kafka; loss
        path 1 as for first attempts), not a second timer. A retry of a run asked to cancel
        while its retry was pending (CANCEL_PREVIOUS, CancelSchedule) is not sent: the run is
        recorded CANCELLED. One read per retry, never per firing."""
        retries = [r for r in runs if r.attempt > 1]
        if not retries:
            return runs, timers
        rows = await self._runs.get_many([r.run_id for r in retries])
        kept: list[RunTimer] = []
        kept_timers: list[Timer] = []
        seen: set[tuple[str, int]] = set()
        cancelled: list[RunEventRecord] = []
        now = self._clock()
        for r, t in zip(runs, timers, strict=True):
            if r.attempt > 1:
                row = rows.get(r.run_id)
                if row is None or (r.run_id, r.attempt) in seen or not _retry_wanted(row, r):
                    metrics.TIMERS_SUPERSEDED.inc()
                    continue
                seen.add((r.run_id, r.attempt))
                if row.cancel_requested and row.attempt < r.attempt:
                    cancelled.append(_cancelled_before(row, r, now))
                    continue
                r = replace(
                    r,
                    manual=row.manual,
                    origin_run_id=row.origin_run_id,
                    backfill_id=row.backfill_id,
                )
            kept.append(r)
            kept_timers.append(t)
        if cancelled:
            await self._runs.write(self._runs.event_rows(cancelled, now=now))
            for e in cancelled:
                logger.info(
                    "run %s cancelled before its attempt %d",
                    e.run_id,
                    e.attempt,
                    extra={"run_id": e.run_id, "schedule_id": e.schedule_id},
                )
        return kept, kept_timers

    async def _drop_delivered(self, plan: FiringPlan, recheck: set[str]) -> None:
        """Takes out of ``plan`` the runs among ``recheck`` that a worker already took (the
        shard's previous owner fired them): no second message and no rewrite of their row.
        The rest of the plan (next timers, skips) is written again, idempotently: the previous
        owner may have stopped part way through writing it. A run recorded but not taken is
        produced again: its message may never have reached Kafka."""
        attempts = {run.run_id: run.attempt for _s, run in plan.enqueue if run.run_id in recheck}
        taken = await self._runs.delivered(attempts)
        if not taken:
            return
        plan.enqueue = [(s, run) for s, run in plan.enqueue if run.run_id not in taken]
        metrics.REFIRES_AVOIDED.inc(len(taken))
        logger.info("%d runs were already taken by workers; not produced again", len(taken))

    async def _backfill_due(self, due: list[BackfillTimer]) -> None:
        """Tops up the backfills whose timers are due: their next slots up to each one's free
        concurrency go out as ordinary runs through ``_apply`` (with the next backfill timers),
        then each backfill row advances (scheduler.backfill; decision 0005)."""
        if not due:
            return
        now = self._clock()
        try:
            step = await self._backfills.plan(due, now)
            plan = FiringPlan()
            plan.limits = await self._tenants.limits({s.tenant for s, _r in step.runs})
            for s, r in step.runs:
                plan_run(s, r, now, plan)
            plan.next_timers.extend(t.to_timer(self._timers.shard_count) for t in step.next_timers)
            await self._apply(plan, now)
            await self._backfills.commit(step)
        except Exception:
            # Kept apart from the live timers of the batch (a failing backfill must not make
            # them fire again): the same steps are retried a tick later, same run ids.
            logger.exception("backfill step failed; retrying in %s", BACKFILL_TICK)
            retry = [replace(t, fire_at=now + BACKFILL_TICK) for t in due]
            await self._timers.put([t.to_timer(self._timers.shard_count) for t in retry], now=now)
            return
        for s, _run in plan.enqueue:
            metrics.RUNS_ENQUEUED.labels(tier=plan.limits.get(s.tenant, UNLIMITED).tier).inc()

    def _apply(self, plan: FiringPlan, now: datetime) -> asyncio.Future[list[None]]:
        """Starts writing the batch's rows and producing its messages; the future is done when
        all of them are.

        Each enqueued run's own rows (its run row, ENQUEUED; its schedule's overlap cell,
        unless its next fire timer marks it in progress; its lease timer) go out with its
        message: at once without fire-ahead, at the message's
        release with it (decision 0011). Everything else (skipped slots, next timers, buffered
        and completed cells, cancel requests) is written at once, so a schedule's chain of
        timers never waits for a held message."""
        schedules = self._schedules
        items = [*self._runs.insert_rows(plan.skipped), *plan.rows]
        # Each enqueued run's own rows, in the order of plan.enqueue.
        own: list[list[Write]] = [
            [row] for row in self._runs.insert_rows([r for _s, r in plan.enqueue])
        ]
        for (s, run), rows in zip(plan.enqueue, own, strict=True):
            if run.backfill_id:
                continue  # backfill runs never hold up the schedule's own slots (overlap)
            if self._cache is not None:
                self._cache.ran(s.schedule_id, run.run_id)
            if run.run_id in plan.note_on:
                continue  # marked in progress on the schedule's next fire timer instead
            # Stamped with the batch's start: a finish reported for this run is stamped with
            # the same enqueue time (echoed by the worker), so neither clock nor arrival order
            # decides whether the schedule sees it in progress.
            rows.append(schedules.mark_active(s.schedule_id, run.run_id, now))
        # A schedule's other cells go with its run's rows when it has one in the batch: its
        # partition's rows stay one write.
        first_run: dict[str, int] = {}
        for i, (s, _run) in enumerate(plan.enqueue):
            first_run.setdefault(s.schedule_id, i)

        def cell(schedule_id: str, row: Write) -> None:
            i = first_run.get(schedule_id)
            (own[i] if i is not None else items).append(row)

        for s, buffered in plan.buffered:
            cell(s.schedule_id, schedules.set_buffered(s.schedule_id, buffered.to_json()))
        for s, at in plan.completed:
            cell(s.schedule_id, schedules.record_completed(s.schedule_id, at))
        # A previous run is cancelled by the run that replaces it (CANCEL_PREVIOUS): with it.
        for run_id, row in zip(plan.cancel, self._runs.cancel_rows(plan.cancel), strict=True):
            cell(parse_run_id(run_id).schedule_id, row)
        # Stamped as late as possible: a next timer already due is written at this instant,
        # and must land before the scanners' checkpoints pass it (see the re-put below).
        stamped = self._clock()
        items.extend(self._timers.rows(plan.next_timers, now=stamped))
        # Every attempt enqueued holds a lease (scheduler.retries): a timer the API settles
        # when the outcome arrives, checked by a dispatcher only if it does not.
        # Both to the millisecond, as the API reads them back from the worker's echo (and as
        # Cassandra keeps the fire time): the API settles the very row written here.
        enqueued_ms = to_millisecond(now)
        lease_at = self._lease_at(now)
        stamp = micros(enqueued_ms)
        shards = self._timers.shard_count
        for (s, run), rows in zip(plan.enqueue, own, strict=True):
            if run.run_id in plan.carried:
                continue
            lease_timer = LeaseTimer(
                schedule_id=s.schedule_id,
                run_id=run.run_id,
                attempt=run.attempt,
                fire_at=lease_at,
                stamp=stamp,
            ).to_timer(shards)
            rows.extend(self._timers.rows([lease_timer], now=now))
        # Rows and messages go out together: every row carries a timestamp that orders it
        # against the worker's reports (run rows by slot, attempt and status; overlap cells by
        # enqueue time), so which lands first does not matter; if either fails the batch is
        # fired again, with the same run ids.
        # Each tenant's runs go to its tier's topic, so workers can be dedicated per tier.
        by_topic: dict[str, list[Release]] = {}
        for (s, r), rows in zip(plan.enqueue, own, strict=True):
            tier = plan.limits.get(s.tenant, UNLIMITED).tier
            lease = None if r.run_id in plan.carried else lease_at
            at = r.scheduled_for + r.deferred if r.deferred else r.scheduled_for
            message = run_message(s, r, lease_at=lease, next_fire=plan.note_on.get(r.run_id))
            if not self._fire_ahead:
                items.extend(rows)  # everything in one write, with the produce
            by_topic.setdefault(self._topic(tier), []).append(
                Release(at, message, rows if self._fire_ahead else [])
            )

        async def write() -> None:
            await self._runs.write(items)
            # A next timer already due (the slot fired late) was written at `stamped`: if
            # this took longer than the scanners' grace allows, a checkpoint may have passed
            # that instant before the row landed and the schedule's chain would end there
            # (chaos runs under load: whole schedules stopped for good). Put again at a fresh
            # instant.
            await self._timers.repeat_if_slow(plan.next_timers, written_at=stamped)

        return asyncio.gather(
            write(), *(self._produce(topic, releases) for topic, releases in by_topic.items())
        )

    async def _produce(self, topic: str, releases: list[Release]) -> None:
        """Produces each release's message and writes its rows, none before its time.

        Fire-ahead: the scanner hands a fire timer up to ``fire_ahead`` before its slot, so
        its schedule's next timer is written by then, and the run's message and rows go out at
        the slot's time: the handler starts on time instead of a read, a write and a produce
        late. A dispatcher that dies while holding them has recorded nothing of the run: the
        slot's next owner fires it (or records it missed) as if it had never been handed
        (decision 0011). Releases due within ``RELEASE_SLICE`` of each other go out together,
        at the latest one's time (``BUSY_RELEASE_SLICE`` for a batch of ``BUSY_RELEASES`` or
        more). A release time further ahead than ``fire_ahead`` (a clock that jumped) does not
        hold a message longer than that.
        """
        if self._fire_ahead <= 0:
            await self._release(topic, None, releases)
            return
        await asyncio.gather(
            *(
                self._release(topic, group[-1].at, group)
                for group in release_slices(releases, self._clock())
            )
        )

    async def _release(self, topic: str, at: datetime | None, releases: list[Release]) -> None:
        """Waits until ``at`` (None: not at all), then produces the messages and writes their
        runs' rows together."""
        if at is not None:
            wait = (at - self._clock()).total_seconds()
            if wait > 0:
                await asyncio.sleep(min(wait, self._fire_ahead))
        rows = [row for r in releases for row in r.rows]
        messages = [r.message for r in releases]
        if rows:
            await asyncio.gather(self._queue.enqueue(topic, messages), self._runs.write(rows))
        else:
            await self._queue.enqueue(topic, messages)
