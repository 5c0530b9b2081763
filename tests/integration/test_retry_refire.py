"""A retry fired again after its produce failed goes out again (issue 7, loss path 1 for
retries), against the real Cassandra and Kafka.

The dispatcher writes a retry's run row (attempt n, ENQUEUED) and produces its message
together; when the produce fails the scanner hands the same timer again. That second hand-over
finds the row already at attempt n and must still produce: only a worker having taken the
attempt (or a later one) makes the retry superseded. Before the fix it was dropped, and the run
waited for its start lease (minutes) to be found lost.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka.errors import KafkaConnectionError

from scheduler.config import Config
from scheduler.kafka import KafkaRunQueue, Keyed, ensure_topics
from scheduler.model import (
    FollowUp,
    RunEventRecord,
    RunStatus,
)
from scheduler.session import Stores, open_stores
from scheduler.timers import RunTimer
from tests.integration.firing_support import (
    firing_on,
    read_run_messages,
    yearly_schedule_with_a_run,
)


class BrokerAwayOnce(KafkaRunQueue):
    """The real producer, except that the first ``enqueue`` fails as a broker restart does."""

    failed = False

    async def enqueue(self, topic: str, messages: Sequence[Keyed]) -> None:
        if not self.failed:
            self.failed = True
            raise KafkaConnectionError("broker restarting (injected)")
        await super().enqueue(topic, messages)


@pytest.fixture
async def stores(migrated: Config) -> AsyncIterator[Stores]:
    s = await open_stores(migrated)
    yield s
    s.close()


async def test_a_retry_handed_again_after_its_produce_failed_is_produced(
    stores: Stores, migrated: Config
) -> None:
    topic = f"{migrated.topic()}.refire-{uuid.uuid4().hex[:6]}"
    await ensure_topics(migrated.kafka_bootstrap, [topic], partitions=1)
    queue = BrokerAwayOnce(migrated.kafka_bootstrap)
    await queue.start()
    firing = firing_on(stores, queue, topic, migrated.keyspace)
    now = datetime.now(UTC).replace(microsecond=0)
    sid, first = await yearly_schedule_with_a_run(
        stores, "refire", now, slot_ago=timedelta(seconds=30)
    )
    run_id, slot = first.run_id, first.scheduled_for
    # Attempt 1 ran and failed: its row shows it, and the retry (attempt 2) is due.
    failed = RunEventRecord(
        run_id=run_id,
        schedule_id=sid,
        scheduled_for=slot,
        status=RunStatus.FAILED,
        event_time=slot + timedelta(seconds=1),
        attempt=1,
        enqueue_time=slot,
        error="boom",
        follow_up=FollowUp.NONE,
    )
    await stores.runs.write(
        [*stores.runs.insert_rows([first]), *stores.runs.event_rows([failed], now=now)]
    )
    retry = RunTimer(
        schedule_id=sid, run_id=run_id, scheduled_for=slot, fire_at=now, attempt=2
    ).to_timer(stores.timers.shard_count)

    try:
        with pytest.raises(KafkaConnectionError):
            await firing.on_due([retry])
        # The rows of the failed hand-over land: attempt 2, not yet taken. (The release writes
        # them while it produces and raises at the produce's failure, so the write may still be
        # on its way: waited for, not read at once.)
        deadline = asyncio.get_running_loop().time() + 5
        row = await stores.runs.get(run_id)
        while (row.attempt, row.status) != (2, RunStatus.ENQUEUED):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
            row = await stores.runs.get(run_id)
        assert (row.attempt, row.status) == (2, RunStatus.ENQUEUED)

        await firing.on_due([retry])  # the scanner hands the batch again
    finally:
        await queue.stop()

    got = await read_run_messages(migrated.kafka_bootstrap, topic)
    assert [(m.run_id, m.attempt) for m in got] == [(run_id, 2)]
