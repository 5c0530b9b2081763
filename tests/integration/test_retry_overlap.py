"""A run whose failed attempt will be retried is still in progress: its schedule's overlap
policy holds the slots due during the backoff, on the real Cassandra and Kafka. The failure's
end is not noted (on the next fire timer nor the schedule row), the run rows count a pending
retry as in progress, and a run asked to cancel while its retry waits is not retried."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from bucketer.model import Timer
from scheduler.config import Config
from scheduler.model import (
    STALE_RUN,
    FollowUp,
    OverlapMode,
    RetryPolicy,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.reports import dependent_run_id
from scheduler.service import ScheduleService
from scheduler.tenancy import Tenant, TenantQuotas
from scheduler.timers import RUN, FireTimer, RunTimer
from tests.integration.firing_support import (
    MINUTE,
    FiringRig,
    every_minute,
    firing_on,
    next_fire_timer,
    open_firing_rig,
    read_run_messages,
    report_slot,
)

# Retried ten minutes after a failure: longer than a run without a sign of life stays in
# progress (STALE_RUN), so only the pending retry can hold the schedule.
LONG_BACKOFF = RetryPolicy(max_attempts=3, initial_backoff=timedelta(minutes=10), jitter=0.0)


@pytest.fixture
async def rig(migrated: Config) -> AsyncIterator[FiringRig]:
    async with open_firing_rig(migrated, "retry-overlap") as opened:
        yield opened


def _retry_timer(rig: FiringRig, schedule_id: str, run_id: str) -> Timer:
    """The run's retry timer as written."""
    rows = rig.stores.session.execute(
        f"SELECT * FROM {rig.keyspace}.timers WHERE key = %s ALLOW FILTERING", (schedule_id,)
    )
    (t,) = [
        t
        for t in (Timer.from_row(r, shard=r.shard) for r in rows)
        if t.kind == RUN and RunTimer.from_timer(t).run_id == run_id
    ]
    return t


async def test_a_slot_due_while_a_retry_is_pending_skips_until_the_retry_ends(
    rig: FiringRig,
) -> None:
    s, first = await every_minute(rig.stores, OverlapMode.SKIP, retry=LONG_BACKOFF)
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.FAILED, slot + MINUTE)
    failed = await rig.stores.runs.get(run_id)
    assert failed.status is RunStatus.FAILED and failed.next_attempt_time is not None
    # Its end is noted nowhere: neither on the next fire timer nor on the schedule row.
    second = next_fire_timer(rig, s.schedule_id, slot)
    assert second.done_run == ""
    assert (await rig.stores.schedules.get(s.schedule_id)).done_run == ""

    await rig.firing.on_due([second])
    skipped = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + MINUTE))
    assert (skipped.status, skipped.skip_reason) == (RunStatus.SKIPPED, "overlap")
    # A dispatcher with nothing cached (its shard changed owner) weighs it the same.
    rig.cache.forget(s.schedule_id)
    third = next_fire_timer(rig, s.schedule_id, slot + MINUTE)
    assert FireTimer.from_timer(third).running == (run_id,)
    await rig.firing.on_due([third])
    again = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + 2 * MINUTE))
    assert again.skip_reason == "overlap"

    # The retry goes out (handed early) and succeeds: the slot after fires.
    await rig.firing.on_due([_retry_timer(rig, s.schedule_id, run_id)])
    assert (await rig.stores.runs.get(run_id)).attempt == 2
    await report_slot(rig, s, slot, RunStatus.SUCCEEDED, None, attempt=2)
    await rig.firing.on_due([next_fire_timer(rig, s.schedule_id, slot + 2 * MINUTE)])
    fired = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + 3 * MINUTE))
    assert fired.status is RunStatus.ENQUEUED
    messages = await read_run_messages(rig.bootstrap, rig.topic)
    assert [(m.run_id, m.attempt) for m in messages] == [
        (run_id, 1),
        (run_id, 2),
        (fired.run_id, 1),
    ]


async def test_a_run_marked_on_its_schedule_row_stays_in_progress_through_a_long_backoff(
    rig: FiringRig,
) -> None:
    """BUFFER_ONE marks its runs on the schedule row: the failure leaves the run there, alive
    until its retry is due, so a slot during the backoff is held back (not released by the
    failure) and released when the retry succeeds."""
    s, first = await every_minute(rig.stores, OverlapMode.BUFFER_ONE, retry=LONG_BACKOFF)
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.FAILED, None, follow_up=FollowUp.REQUIRED)
    row = await rig.stores.schedules.get(s.schedule_id)
    assert (row.active_run, row.done_run) == (run_id, "")
    later = datetime.now(UTC) + STALE_RUN + timedelta(minutes=3)
    assert row.in_progress(later, stale_after=STALE_RUN) == [run_id]
    svc = ScheduleService(schedules=rig.schedules, runs=rig.stores.runs, timers=rig.stores.timers)
    assert await svc.in_progress(row, later) == [run_id]

    await rig.firing.on_due([next_fire_timer(rig, s.schedule_id, slot)])
    held = run_id_for(s.schedule_id, slot + MINUTE)
    row = await rig.stores.schedules.get(s.schedule_id)
    assert row.buffered is not None and row.buffered.run_id == held

    await rig.firing.on_due([_retry_timer(rig, s.schedule_id, run_id)])
    await report_slot(
        rig, s, slot, RunStatus.SUCCEEDED, None, attempt=2, follow_up=FollowUp.REQUIRED
    )
    row = await rig.stores.schedules.get(s.schedule_id)
    assert row.buffered is None and row.active_run == held


async def test_a_run_asked_to_cancel_while_its_retry_waits_is_not_retried(rig: FiringRig) -> None:
    """CANCEL_PREVIOUS: the slot due during the backoff cancels the run, and its retry, once
    due, is not sent: the run is recorded CANCELLED."""
    s, first = await every_minute(rig.stores, OverlapMode.CANCEL_PREVIOUS, retry=LONG_BACKOFF)
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.FAILED, slot + MINUTE)
    await rig.firing.on_due([next_fire_timer(rig, s.schedule_id, slot)])
    nxt = run_id_for(s.schedule_id, slot + MINUTE)
    assert (await rig.stores.runs.get(nxt)).status is RunStatus.ENQUEUED
    assert (await rig.stores.runs.get(run_id)).cancel_requested

    await rig.firing.on_due([_retry_timer(rig, s.schedule_id, run_id)])
    cancelled = await rig.stores.runs.get(run_id)
    assert (cancelled.status, cancelled.next_attempt_time) == (RunStatus.CANCELLED, None)
    messages = await read_run_messages(rig.bootstrap, rig.topic)
    assert [(m.run_id, m.attempt) for m in messages] == [(run_id, 1), (nxt, 1)]


async def test_a_failure_with_no_retry_left_ends_the_run_as_before(rig: FiringRig) -> None:
    """The last attempt (here the only one) failed: its end is noted on the next fire timer,
    and that slot fires from the cache without a read."""
    s, first = await every_minute(rig.stores, OverlapMode.SKIP, retry=RetryPolicy(max_attempts=1))
    slot = FireTimer.from_timer(first).slot
    run_id = run_id_for(s.schedule_id, slot)
    await rig.firing.on_due([first])
    await report_slot(rig, s, slot, RunStatus.FAILED, slot + MINUTE)
    assert (await rig.stores.runs.get(run_id)).status is RunStatus.DEAD_LETTERED
    second = next_fire_timer(rig, s.schedule_id, slot)
    assert second.done_run == run_id
    reads = len(rig.schedules.reads)  # the firing's, and the report's for its retry policy
    await rig.firing.on_due([second])
    assert rig.schedules.reads[reads:] == [], "the second slot read no schedule"
    fired = await rig.stores.runs.get(run_id_for(s.schedule_id, slot + MINUTE))
    assert fired.status is RunStatus.ENQUEUED


async def test_a_retry_a_tenant_quota_puts_off_holds_its_schedule_until_its_new_time(
    migrated: Config,
) -> None:
    """The retry comes due while its tenant is over its enqueue rate: it is put off, and the
    run's retry time moves with it, so the run stays in progress until the retry is sent."""
    async with open_firing_rig(migrated, "retry-quota") as rig:
        tenant = f"slow-{uuid.uuid4().hex[:6]}"
        await rig.stores.tenants.create(
            Tenant(tenant_id=tenant, quotas=TenantQuotas(max_enqueue_rate=0.001))
        )
        firing = firing_on(rig.stores, rig.queue, rig.topic, rig.keyspace, tenant_quotas=True)
        s, first = await every_minute(
            rig.stores, OverlapMode.SKIP, retry=LONG_BACKOFF, tenant=tenant
        )
        slot = FireTimer.from_timer(first).slot
        run_id = run_id_for(s.schedule_id, slot)
        await firing.on_due([first])  # the tenant's one token
        await report_slot(rig, s, slot, RunStatus.FAILED, slot + MINUTE)
        due = (await rig.stores.runs.get(run_id)).next_attempt_time
        assert due is not None

        await firing.on_due([_retry_timer(rig, s.schedule_id, run_id)])
        row = await rig.stores.runs.get(run_id)
        assert (row.attempt, row.status) == (1, RunStatus.FAILED), "the retry was put off"
        assert row.next_attempt_time is not None
        assert row.next_attempt_time > due + timedelta(minutes=5)  # 1,000 s from now
        later = row.next_attempt_time + STALE_RUN / 2
        assert await rig.stores.runs.still_running([run_id], now=later, stale_after=STALE_RUN)


async def test_a_dependent_runs_retry_due_while_its_schedule_is_paused_ends_the_run(
    rig: FiringRig,
) -> None:
    """A run fired by an upstream's success failed; its schedule is paused before the retry
    is due. The retry is not run while paused (as the dependent run itself would not be): it
    is recorded SKIPPED (``paused``) at the retry's attempt, above the failure, which ends the
    run instead of leaving it in progress with a retry time that never comes."""
    now = datetime.now(UTC)
    upstream = f"up-{uuid.uuid4().hex[:8]}"
    s = Schedule(
        schedule_id=f"down-{uuid.uuid4().hex[:8]}",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.NONE),
        after=frozenset({upstream}),
        policies=SchedulePolicies(retry=LONG_BACKOFF),
        generation=new_generation(),
        create_time=now,
        update_time=now,
    )
    await rig.stores.schedules.create(s)
    at = now.replace(microsecond=0)
    origin = run_id_for(upstream, at)
    run_id = dependent_run_id(s.schedule_id, origin, at)
    first = RunTimer(
        schedule_id=s.schedule_id, run_id=run_id, scheduled_for=at, fire_at=at, origin_run_id=origin
    )
    await rig.firing.on_due([first.to_timer(rig.stores.timers.shard_count)])
    assert (await rig.stores.runs.get(run_id)).status is RunStatus.ENQUEUED
    await report_slot(rig, s, at, RunStatus.FAILED, None, run_id=run_id)
    assert (await rig.stores.runs.get(run_id)).next_attempt_time is not None

    svc = ScheduleService(schedules=rig.schedules, runs=rig.stores.runs, timers=rig.stores.timers)
    await svc.pause(s.schedule_id, note="", paused_by="test")
    await rig.firing.on_due([_retry_timer(rig, s.schedule_id, run_id)])
    row = await rig.stores.runs.get(run_id)
    assert (row.status, row.skip_reason, row.attempt) == (RunStatus.SKIPPED, "paused", 2)
    assert row.next_attempt_time is None
    later = datetime.now(UTC) + timedelta(minutes=20)
    assert not await rig.stores.runs.still_running([run_id], now=later, stale_after=STALE_RUN)
    messages = await read_run_messages(rig.bootstrap, rig.topic)
    assert [(m.run_id, m.attempt) for m in messages] == [(run_id, 1)]
