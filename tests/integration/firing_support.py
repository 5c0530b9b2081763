"""A dispatcher's firing logic and the API's run reports on the real stores and Kafka, and
reading back what they produced."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer
from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from bucketer.model import Timer
from cronscale.v1 import run_message_pb2
from scheduler.backfill import BackfillDriver, CassandraBackfillStore
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.config import Config
from scheduler.dead_letters import CassandraDeadLetterStore
from scheduler.fairness import CachedDirectory, Throttle
from scheduler.firing import Firing
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.model import (
    DEFAULT_TENANT,
    FollowUp,
    OverlapMode,
    RetryPolicy,
    Run,
    RunEventRecord,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.reports import RunReports
from scheduler.retries import DeadLetterPublisher, Failures, failures_of
from scheduler.schedule_cache import ScheduleCache
from scheduler.session import Stores, open_stores
from scheduler.stores import ScheduleStore
from scheduler.timers import FIRE, FireTimer

MINUTE = timedelta(minutes=1)


def firing_on(
    stores: Stores,
    queue: KafkaRunQueue,
    topic: str,
    keyspace: str,
    *,
    fire_ahead: timedelta = timedelta(0),
    cache: ScheduleCache | None = None,
    schedules: ScheduleStore | None = None,
    tenant_quotas: bool = False,
) -> Firing:
    """The dispatcher's ``Firing`` as a dispatcher builds it, every tier producing to ``topic``
    (without a schedule cache unless given one; ``schedules`` in place of the stores' own;
    enforcing the registered tenants' enqueue rates with ``tenant_quotas``)."""
    return Firing(
        schedules=schedules or stores.schedules,
        runs=stores.runs,
        timers=stores.timers,
        queue=queue,
        backfills=BackfillDriver(
            store=CassandraBackfillStore(stores.session, keyspace=keyspace),
            schedules=stores.schedules,
        ),
        topic=lambda _tier: topic,
        failures=failures_of(stores),
        dead_letters=DeadLetterPublisher(
            dead_letters=stores.dead_letters, runs=stores.runs, queue=queue, topic=topic
        ),
        fire_ahead=fire_ahead,
        cache=cache,
        tenants=CachedDirectory(stores.tenants.limits) if tenant_quotas else None,
        throttle=Throttle() if tenant_quotas else None,
    )


async def yearly_schedule_with_a_run(
    stores: Stores, prefix: str, now: datetime, *, slot_ago: timedelta
) -> tuple[str, Run]:
    """A schedule due once a year (nothing of its own comes due in a test), stored, and the
    ENQUEUED first attempt of its slot ``slot_ago`` before ``now`` (not written)."""
    sid = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await stores.schedules.create(
        Schedule(
            schedule_id=sid,
            handler="echo",
            spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 0 1 1 *"),
            generation=new_generation(),
            create_time=now,
            update_time=now,
        )
    )
    slot = now - slot_ago
    run = Run(
        run_id=run_id_for(sid, slot),
        schedule_id=sid,
        scheduled_for=slot,
        status=RunStatus.ENQUEUED,
        attempt=1,
        handler="echo",
        tenant="default",
        enqueue_time=slot,
    )
    return sid, run


def reports_on(
    session: Session,
    keyspace: str,
    shard_count: int,
    schedules: CassandraScheduleStore,
    runs: CassandraRunStore,
) -> tuple[RunReports, CassandraTimerStore]:
    """The API's ``RunReports`` over ``schedules`` and ``runs`` (a test may pass a run store
    of its own making), and the timer store it writes to."""
    timers = CassandraTimerStore(session, keyspace=keyspace, shard_count=shard_count)
    failures = Failures(
        schedules=schedules,
        runs=runs,
        timers=timers,
        dead_letters=CassandraDeadLetterStore(session, keyspace=keyspace),
    )
    return RunReports(schedules=schedules, runs=runs, timers=timers, failures=failures), timers


async def read_run_messages(bootstrap: str, topic: str) -> list[run_message_pb2.RunMessage]:
    """Every run message on ``topic`` (a fresh consumer group from the earliest offset)."""
    return [m for m, _produced in await read_run_records(bootstrap, topic)]


async def read_run_records(
    bootstrap: str, topic: str
) -> list[tuple[run_message_pb2.RunMessage, datetime]]:
    """Every run message on ``topic`` with the time it was produced (its CreateTime, to the
    millisecond), read by a fresh consumer group from the earliest offset."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=f"{topic}.check",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=5000)
        return [
            (
                run_message_pb2.RunMessage.FromString(rec.value),
                datetime.fromtimestamp(rec.timestamp / 1000, UTC),
            )
            for records in batch.values()
            for rec in records
            if rec.value is not None
        ]
    finally:
        await consumer.stop()


class CountingSchedules(CassandraScheduleStore):
    """The real schedule store, counting the schedules the firing path reads."""

    reads: list[str]

    async def get_many(self, ids: Sequence[str]) -> dict[str, Schedule]:
        self.reads.extend(ids)
        return await super().get_many(ids)


@dataclass
class FiringRig:
    """A dispatcher's ``Firing`` (with a schedule cache) and the API's ``RunReports`` on the
    real stores, producing to a topic of their own."""

    stores: Stores
    schedules: CountingSchedules
    cache: ScheduleCache
    firing: Firing
    reports: RunReports
    topic: str
    bootstrap: str
    keyspace: str
    queue: KafkaRunQueue


@asynccontextmanager
async def open_firing_rig(migrated: Config, name: str) -> AsyncIterator[FiringRig]:
    """A ``FiringRig`` on ``migrated``'s keyspace and a fresh one-partition topic named after
    ``name``."""
    stores = await open_stores(migrated)
    schedules = CountingSchedules(stores.session, keyspace=migrated.keyspace)
    schedules.reads = []
    cache = ScheduleCache(schedules, capacity=100)
    topic = f"{migrated.topic()}.{name}-{uuid.uuid4().hex[:6]}"
    await ensure_topics(migrated.kafka_bootstrap, [topic], partitions=1)
    queue = KafkaRunQueue(migrated.kafka_bootstrap)
    await queue.start()
    firing = firing_on(stores, queue, topic, migrated.keyspace, cache=cache, schedules=schedules)
    reports, _ = reports_on(
        stores.session, migrated.keyspace, stores.timers.shard_count, schedules, stores.runs
    )
    try:
        yield FiringRig(
            stores,
            schedules,
            cache,
            firing,
            reports,
            topic,
            migrated.kafka_bootstrap,
            migrated.keyspace,
            queue,
        )
    finally:
        await queue.stop()
        stores.close()


async def every_minute(
    stores: Stores,
    overlap: OverlapMode = OverlapMode.SKIP,
    *,
    retry: RetryPolicy | None = None,
    tenant: str = DEFAULT_TENANT,
) -> tuple[Schedule, Timer]:
    """A schedule firing at every minute's start, and the timer of its coming slot (handed
    early, as fire-ahead does: its next slot is then a minute away, far beyond the lead)."""
    now = datetime.now(UTC)
    policies = SchedulePolicies(overlap=overlap, retry=retry or RetryPolicy())
    s = Schedule(
        schedule_id=f"minutely-{uuid.uuid4().hex[:8]}",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
        policies=policies,
        tenant=tenant,
        generation=new_generation(),
        create_time=now,
        update_time=now,
    )
    await stores.schedules.create(s)
    slot = now.replace(second=0, microsecond=0) + MINUTE
    timer = FireTimer(
        schedule_id=s.schedule_id, generation=s.generation, slot=slot, scheduled_for=slot
    ).to_timer(stores.timers.shard_count)
    return s, timer


def next_fire_timer(rig: FiringRig, schedule_id: str, slot: datetime) -> Timer:
    """The schedule's fire timer after ``slot`` as a scanner reads it (with its note)."""
    rows = rig.stores.session.execute(
        f"SELECT * FROM {rig.keyspace}.timers WHERE key = %s ALLOW FILTERING", (schedule_id,)
    )
    (t,) = [
        t
        for t in (Timer.from_row(r, shard=r.shard) for r in rows)
        if t.kind == FIRE and FireTimer.from_timer(t).slot > slot
    ]
    return t


async def report_slot(
    rig: FiringRig,
    s: Schedule,
    slot: datetime,
    status: RunStatus,
    next_fire: datetime | None,
    *,
    attempt: int = 1,
    follow_up: FollowUp = FollowUp.NONE,
    run_id: str = "",
) -> None:
    """The worker's report of (``attempt`` of) the run fired at ``slot`` (or of ``run_id``,
    scheduled for ``slot``), echoing its message."""
    run_id = run_id or run_id_for(s.schedule_id, slot)
    row = await rig.stores.runs.get(run_id)
    now = datetime.now(UTC)
    await rig.reports.record(
        [
            RunEventRecord(
                run_id=run_id,
                schedule_id=s.schedule_id,
                scheduled_for=slot,
                status=status,
                event_time=now,
                attempt=attempt,
                enqueue_time=row.enqueue_time,
                start_time=now if status is not RunStatus.RUNNING else None,
                error="failed on purpose" if status is RunStatus.FAILED else "",
                follow_up=follow_up,
                next_fire_time=next_fire,
            )
        ]
    )
