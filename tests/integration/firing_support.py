"""A dispatcher's firing logic and the API's run reports on the real stores and Kafka, and
reading back what they produced."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer
from cassandra.cluster import Session

from bucketer.cassandra import CassandraTimerStore
from cronscale.v1 import run_message_pb2
from scheduler.backfill import BackfillDriver, CassandraBackfillStore
from scheduler.cassandra import CassandraRunStore, CassandraScheduleStore
from scheduler.dead_letters import CassandraDeadLetterStore
from scheduler.firing import Firing
from scheduler.kafka import KafkaRunQueue
from scheduler.model import (
    Run,
    RunStatus,
    Schedule,
    ScheduleSpec,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.reports import RunReports
from scheduler.retries import DeadLetterPublisher, Failures, failures_of
from scheduler.schedule_cache import ScheduleCache
from scheduler.session import Stores
from scheduler.stores import ScheduleStore


def firing_on(
    stores: Stores,
    queue: KafkaRunQueue,
    topic: str,
    keyspace: str,
    *,
    fire_ahead: timedelta = timedelta(0),
    cache: ScheduleCache | None = None,
    schedules: ScheduleStore | None = None,
) -> Firing:
    """The dispatcher's ``Firing`` as a dispatcher builds it, every tier producing to ``topic``
    (without a schedule cache unless given one; ``schedules`` in place of the stores' own)."""
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
