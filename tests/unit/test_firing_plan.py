"""The dispatcher's per-slot decisions (scheduler.firing.plan_fire): pure, no services."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.firing import FiringPlan, plan_fire
from scheduler.model import (
    STALE_RUN,
    BufferedRun,
    MisfireMode,
    OverlapMode,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
)
from scheduler.timers import FireTimer
from scheduler.timespec import GapPolicy

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
THRESHOLD = timedelta(seconds=30)


def _schedule(
    cron: str = "* * * * *",
    *,
    tz: str = "UTC",
    policies: SchedulePolicies | None = None,
    active: tuple[str, datetime] | None = None,
    done: str = "",
    buffered: BufferedRun | None = None,
    max_runs: int = 0,
    gap: GapPolicy | None = None,
) -> Schedule:
    return Schedule(
        schedule_id="s1",
        handler="echo",
        spec=ScheduleSpec(
            kind=SpecKind.CRON, cron=cron, timezone=tz, max_runs=max_runs, dst_gap=gap
        ),
        generation=7,
        policies=policies or SchedulePolicies(),
        active_run=active[0] if active else "",
        active_seen=active[1] if active else None,
        done_run=done,
        buffered=buffered,
    )


def _timer(slot: datetime, fired: int = 0) -> FireTimer:
    return FireTimer(schedule_id="s1", generation=7, slot=slot, scheduled_for=slot, fired=fired)


def _plan(s: Schedule, f: FireTimer, now: datetime) -> FiringPlan:
    plan = FiringPlan()
    plan_fire(s, f, now, plan, 8, misfire_threshold=THRESHOLD)
    return plan


def _next_slot(plan: FiringPlan) -> datetime:
    (t,) = plan.next_timers
    return FireTimer.from_timer(t).slot


def test_on_time_slot_runs_and_next_is_put_from_the_slot() -> None:
    plan = _plan(_schedule(), _timer(T0), T0 + timedelta(milliseconds=300))
    assert [r.scheduled_for for _s, r in plan.enqueue] == [T0]
    assert plan.enqueue[0][1].run_id == "s1@20260601T120000.000Z"
    assert plan.skipped == []
    assert _next_slot(plan) == T0 + timedelta(minutes=1)
    assert FireTimer.from_timer(plan.next_timers[0]).fired == 1


@pytest.mark.parametrize(
    ("mode", "ran", "skipped"),
    [
        (MisfireMode.SKIP, [], [0, 1, 2, 3, 4, 5]),
        (MisfireMode.FIRE_ONCE, [5], [0, 1, 2, 3, 4]),
        (MisfireMode.FIRE_ALL, [0, 1, 2, 3, 4, 5], []),
    ],
)
def test_misfire_policies_after_an_outage(
    mode: MisfireMode, ran: list[int], skipped: list[int]
) -> None:
    # Down from 12:00 to 12:05:30: slots 12:00 .. 12:05 were missed.
    s = _schedule(policies=SchedulePolicies(misfire=mode))
    now = T0 + timedelta(minutes=5, seconds=30)
    plan = _plan(s, _timer(T0), now)
    minute = timedelta(minutes=1)
    assert [r.scheduled_for for _s, r in plan.enqueue] == [T0 + i * minute for i in ran]
    assert [r.scheduled_for for r in plan.skipped] == [T0 + i * minute for i in skipped]
    assert all(r.skip_reason == "misfire" and r.status is RunStatus.SKIPPED for r in plan.skipped)
    assert _next_slot(plan) == T0 + 6 * minute


def test_fire_all_respects_the_catch_up_window_and_max() -> None:
    policies = SchedulePolicies(
        misfire=MisfireMode.FIRE_ALL, catch_up_window=timedelta(minutes=3), max_catch_up=2
    )
    now = T0 + timedelta(minutes=5, seconds=30)
    plan = _plan(_schedule(policies=policies), _timer(T0), now)
    minute = timedelta(minutes=1)
    assert [r.scheduled_for for _s, r in plan.enqueue] == [T0 + 4 * minute, T0 + 5 * minute]
    assert len(plan.skipped) == 4


def test_small_lag_is_not_a_misfire() -> None:
    plan = _plan(_schedule(), _timer(T0), T0 + timedelta(seconds=10))
    assert len(plan.enqueue) == 1 and plan.skipped == []


@pytest.mark.parametrize("mode", list(OverlapMode))
def test_overlap_policies_with_a_run_in_progress(mode: OverlapMode) -> None:
    now = T0 + timedelta(milliseconds=200)
    s = _schedule(policies=SchedulePolicies(overlap=mode), active=("s1@prev", now))
    plan = _plan(s, _timer(T0), now)
    if mode is OverlapMode.SKIP:
        assert plan.enqueue == [] and [r.skip_reason for r in plan.skipped] == ["overlap"]
    elif mode is OverlapMode.ALLOW:
        assert len(plan.enqueue) == 1 and plan.skipped == [] and plan.cancel == []
    elif mode is OverlapMode.BUFFER_ONE:
        assert plan.enqueue == [] and plan.skipped == []
        assert [b.run_id for _s, b in plan.buffered] == ["s1@20260601T120000.000Z"]
    else:
        assert len(plan.enqueue) == 1 and plan.cancel == ["s1@prev"]
    assert len(plan.next_timers) == 1, "the schedule advances whatever the overlap policy"


def test_buffer_one_holds_only_one() -> None:
    now = T0 + timedelta(milliseconds=200)
    held = BufferedRun(run_id="s1@held", scheduled_for=T0 - timedelta(minutes=1))
    s = _schedule(
        policies=SchedulePolicies(overlap=OverlapMode.BUFFER_ONE),
        active=("s1@prev", now),
        buffered=held,
    )
    plan = _plan(s, _timer(T0), now)
    assert plan.buffered == [] and [r.skip_reason for r in plan.skipped] == ["overlap"]


def test_a_stale_run_in_progress_does_not_block() -> None:
    now = T0 + timedelta(milliseconds=200)
    s = _schedule(active=("s1@lost", now - STALE_RUN - timedelta(seconds=1)))
    assert len(_plan(s, _timer(T0), now).enqueue) == 1


def test_a_finished_run_does_not_block() -> None:
    now = T0 + timedelta(milliseconds=200)
    s = _schedule(active=("s1@prev", now), done="s1@prev")
    assert len(_plan(s, _timer(T0), now).enqueue) == 1


@pytest.mark.parametrize("mode", list(OverlapMode))
def test_a_refired_slot_produces_the_same_run_again(mode: OverlapMode) -> None:
    """Loss path 1: rows written, the produce failed, the batch is fired again. The slot's own
    earlier attempt is recorded as the schedule's active run; it must not count as another run
    in progress, under any overlap policy."""
    now = T0 + timedelta(milliseconds=200)
    first = _plan(_schedule(policies=SchedulePolicies(overlap=mode)), _timer(T0), now)
    [(_s, run)] = first.enqueue
    again = _schedule(policies=SchedulePolicies(overlap=mode), active=(run.run_id, now))
    second = _plan(again, _timer(T0), now + timedelta(seconds=1))
    assert [r.run_id for _s, r in second.enqueue] == [run.run_id]
    assert second.skipped == [] and second.buffered == [] and second.cancel == []


def test_a_refired_buffered_slot_is_buffered_again_not_skipped() -> None:
    """A BUFFER_ONE slot held back by the batch's first attempt is held again on refire: a
    SKIPPED record would contradict the run the buffer later releases under the same id."""
    now = T0 + timedelta(milliseconds=200)
    policies = SchedulePolicies(overlap=OverlapMode.BUFFER_ONE)
    first = _plan(_schedule(policies=policies, active=("s1@prev", now)), _timer(T0), now)
    [(_s, held)] = first.buffered
    again = _schedule(policies=policies, active=("s1@prev", now), buffered=held)
    second = _plan(again, _timer(T0), now + timedelta(seconds=1))
    assert [b.run_id for _s, b in second.buffered] == [held.run_id] and second.skipped == []


def test_max_runs_completes_the_schedule() -> None:
    s = _schedule(max_runs=3)
    plan = _plan(s, _timer(T0, fired=2), T0)
    assert len(plan.enqueue) == 1
    assert plan.next_timers == [] and [c[0].schedule_id for c in plan.completed] == ["s1"]


def test_one_shot_completes_after_firing() -> None:
    s = Schedule(
        schedule_id="s1",
        handler="echo",
        generation=7,
        spec=ScheduleSpec(kind=SpecKind.ONCE, at=T0),
    )
    plan = _plan(s, _timer(T0), T0)
    assert len(plan.enqueue) == 1 and plan.next_timers == [] and len(plan.completed) == 1


def test_dst_gap_skip_is_recorded() -> None:
    # 02:30 does not exist in New York on 2026-03-08; with gap SKIP it is recorded, not lost.
    s = _schedule("30 2 * * *", tz="America/New_York", gap=GapPolicy.SKIP)
    slot = datetime(2026, 3, 7, 7, 30, tzinfo=UTC)  # 2026-03-07 02:30 EST
    plan = _plan(s, _timer(slot), slot)
    assert _next_slot(plan) == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)
    (dst,) = plan.skipped
    assert dst.skip_reason == "dst"
    assert dst.scheduled_for == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    assert dst.run_id.endswith("~dst-023000")


def test_fire_timers_keep_microseconds() -> None:
    """Regression: slots were stored to the millisecond, so a one-shot (or interval) at
    12:00:00.242817 read back as 12:00:00.242, and "the next slot strictly after it" was the
    same slot again: it fired every half second until the grace window passed."""
    at = T0 + timedelta(microseconds=242_817)
    f = _timer(at)
    assert FireTimer.from_timer(f.to_timer(8)) == f
    s = Schedule(
        schedule_id="s1",
        handler="echo",
        generation=7,
        spec=ScheduleSpec(kind=SpecKind.ONCE, at=at),
    )
    plan = _plan(s, FireTimer.from_timer(f.to_timer(8)), at + timedelta(milliseconds=5))
    assert len(plan.enqueue) == 1 and plan.next_timers == []


def test_outages_are_transient_and_bad_timers_are_poison() -> None:
    from aiokafka.errors import (
        KafkaConnectionError,
        KafkaError,
        MessageSizeTooLargeError,
        OutOfOrderSequenceNumber,
        ProducerClosed,
        RecordTooLargeError,
    )
    from cassandra import OperationTimedOut

    from scheduler.firing import Firing
    from scheduler.model import UnsupportedVersion

    for transient in (
        KafkaConnectionError(),
        OperationTimedOut(),
        ConnectionResetError(),
        # The producer's own state, not the message: it is replaced and the batch sent again
        # (as poison, a producer stuck on a partition quarantined every timer it carried).
        OutOfOrderSequenceNumber(),
        ProducerClosed(),
        KafkaError("the producer dropped a record batch unsent (stopped?)"),
    ):
        assert Firing.is_transient(transient), transient
    for poison in (
        MessageSizeTooLargeError(),
        RecordTooLargeError(),
        OverflowError(),
        UnsupportedVersion("v9"),
    ):
        assert not Firing.is_transient(poison), poison


def test_a_slot_the_tenant_quota_held_back_is_not_a_misfire_and_its_successors_wait() -> None:
    """Deferred by the enqueue-rate quota for 3 minutes: the slot runs (SKIP misfire policy or
    not), the run records the deferral, and the next slot (already past) is put due now,
    marked as held back by the quota, instead of being skipped as missed."""
    s = _schedule(policies=SchedulePolicies(misfire=MisfireMode.SKIP))
    held = FireTimer(
        schedule_id="s1",
        generation=7,
        slot=T0,
        scheduled_for=T0,
        deferred_ms=180_000,
    )
    now = T0 + timedelta(minutes=3)
    plan = _plan(s, held, now)
    assert [r.scheduled_for for _s, r in plan.enqueue] == [T0] and plan.skipped == []
    assert plan.enqueue[0][1].deferred == timedelta(minutes=3)
    nxt = FireTimer.from_timer(plan.next_timers[0])
    assert nxt.slot == T0 + timedelta(minutes=1) and nxt.quota_behind and nxt.held_by_quota
    # That successor, fired late, is not a misfire either.
    later = _plan(s, nxt, now + timedelta(seconds=1))
    assert [r.scheduled_for for _s, r in later.enqueue] == [T0 + timedelta(minutes=1)]
    # The same lateness without the quota is a misfire (SKIP: recorded, not run).
    missed = _plan(s, _timer(T0), now)
    assert missed.enqueue == [] and {r.skip_reason for r in missed.skipped} == {"misfire"}


def test_a_deferred_timer_is_due_after_its_deferral_and_round_trips() -> None:
    held = FireTimer(schedule_id="s1", generation=7, slot=T0, scheduled_for=T0, deferred_ms=1500)
    t = held.to_timer(8)
    assert t.fire_time == T0 + timedelta(milliseconds=1500)
    assert FireTimer.from_timer(t) == held


LEASE_AT = T0 + timedelta(minutes=5)


def test_a_run_whose_next_slot_comes_before_its_lease_has_the_lease_carried() -> None:
    """Once a minute with a 5-minute lease: the next fire timer carries the run's lease (no
    lease timer of its own), due when the lease is, stamped with the enqueue instant."""
    now = T0 + timedelta(milliseconds=300, microseconds=417)
    plan = FiringPlan()
    plan_fire(_schedule(), _timer(T0), now, plan, 8, misfire_threshold=THRESHOLD, lease_at=LEASE_AT)
    (_s, run) = plan.enqueue[0]
    assert plan.carried == {run.run_id}
    nxt = FireTimer.from_timer(plan.next_timers[0])
    assert nxt.lease is not None
    assert (nxt.lease.run_id, nxt.lease.attempt, nxt.lease.fire_at) == (run.run_id, 1, LEASE_AT)
    assert nxt.lease.stamp == int((T0 + timedelta(milliseconds=300)).timestamp() * 1_000_000)
    assert FireTimer.from_timer(nxt.to_timer(8)) == nxt, "the carried lease round-trips"


@pytest.mark.parametrize(
    ("cron", "lease_at", "why"),
    [
        ("0 * * * *", LEASE_AT, "the next slot (an hour on) comes after the lease"),
        ("* * * * *", None, "no lease time given (callers outside the dispatcher)"),
    ],
)
def test_a_lease_is_not_carried_past_its_own_expiry(
    cron: str, lease_at: datetime | None, why: str
) -> None:
    plan = FiringPlan()
    plan_fire(
        _schedule(cron), _timer(T0), T0, plan, 8, misfire_threshold=THRESHOLD, lease_at=lease_at
    )
    assert len(plan.enqueue) == 1, why
    assert plan.carried == set() and FireTimer.from_timer(plan.next_timers[0]).lease is None, why


def test_several_runs_of_one_slot_or_none_carry_no_lease() -> None:
    """FIRE_ALL after an outage enqueues several runs: each keeps a lease timer of its own.
    A slot skipped for overlap enqueues nothing, so there is nothing to carry."""
    catch_up = SchedulePolicies(
        misfire=MisfireMode.FIRE_ALL, catch_up_window=timedelta(minutes=3), max_catch_up=3
    )
    now = T0 + timedelta(minutes=3, seconds=40)
    plan = FiringPlan()
    plan_fire(
        _schedule(policies=catch_up),
        _timer(T0),
        now,
        plan,
        8,
        misfire_threshold=THRESHOLD,
        lease_at=now + timedelta(minutes=5),
    )
    assert len(plan.enqueue) == 3 and plan.carried == set()
    assert FireTimer.from_timer(plan.next_timers[0]).lease is None
    busy = _schedule(active=("s1@prev", T0))
    skipped = FiringPlan()
    plan_fire(busy, _timer(T0), T0, skipped, 8, misfire_threshold=THRESHOLD, lease_at=LEASE_AT)
    assert skipped.enqueue == [] and skipped.carried == set()
    assert FireTimer.from_timer(skipped.next_timers[0]).lease is None


def _next(plan: FiringPlan) -> FireTimer:
    (timer,) = plan.next_timers
    return FireTimer.from_timer(timer)


def test_a_single_run_whose_end_can_go_on_the_next_timer_is_marked_there() -> None:
    """Decision 0013: the next fire timer names the run; no overlap cell is planned."""
    now = T0 + timedelta(milliseconds=200)
    plan = _plan(_schedule(), _timer(T0), now)
    ((_s, run),) = plan.enqueue
    assert plan.note_on == {run.run_id: T0 + timedelta(minutes=1)}
    assert _next(plan).running == (run.run_id,)


def test_a_run_whose_next_slot_is_too_near_is_marked_on_the_schedule_row() -> None:
    now = T0 + timedelta(milliseconds=200)
    s = _schedule(cron="*/5 * * * * *")
    plan = _plan(s, _timer(T0), now)
    assert plan.note_on == {} and _next(plan).running == ()


def test_a_slot_skipped_for_runs_the_timer_carried_hands_them_on() -> None:
    now = T0 + timedelta(milliseconds=200)
    s = replace(_schedule(), running=("s1@prev",))
    plan = _plan(s, _timer(T0), now)
    assert [r.skip_reason for r in plan.skipped] == ["overlap"]
    assert _next(plan).running == ("s1@prev",)


def test_cancel_previous_cancels_a_run_the_timer_carried() -> None:
    now = T0 + timedelta(milliseconds=200)
    s = replace(
        _schedule(policies=SchedulePolicies(overlap=OverlapMode.CANCEL_PREVIOUS)),
        running=("s1@prev",),
    )
    plan = _plan(s, _timer(T0), now)
    ((_s, run),) = plan.enqueue
    assert plan.cancel == ["s1@prev"] and _next(plan).running == (run.run_id,)


def test_runs_in_progress_join_the_row_s_and_the_timer_s() -> None:
    now = T0 + timedelta(milliseconds=200)
    s = replace(_schedule(active=("s1@manual", now)), running=("s1@prev", "s1@manual"))
    assert s.in_progress(now, stale_after=STALE_RUN) == ["s1@prev", "s1@manual"]
    assert s.in_progress(now, stale_after=STALE_RUN, besides={"s1@prev"}) == ["s1@manual"]


def test_a_fire_timer_keeps_the_runs_it_carries() -> None:
    f = replace(_timer(T0), running=("s1@a", "s1@b"))
    assert FireTimer.from_timer(f.to_timer(8)).running == ("s1@a", "s1@b")
    assert FireTimer.from_timer(_timer(T0).to_timer(8)).running == ()
