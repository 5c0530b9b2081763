"""The run message the dispatcher produces (scheduler.kafka.run_message), read back the way a
worker reads it (worker.messages.decode_run_message): the two sides of the Kafka contract."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronscale.v1 import run_message_pb2
from scheduler.kafka import RUN_MESSAGE_SCHEMA_VERSION, run_message
from scheduler.model import (
    OverlapMode,
    Run,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    run_id_for,
)
from worker.messages import decode_run_message

T0 = datetime(2026, 12, 5, 14, 0, tzinfo=UTC)
# Microseconds that a float conversion would round: the message must carry them exactly.
SLOT = datetime(2026, 12, 5, 14, 1, 0, 999_999, tzinfo=UTC)


def _schedule(
    *, overlap: OverlapMode = OverlapMode.SKIP, max_runtime: timedelta | None = None
) -> Schedule:
    return Schedule(
        schedule_id="billing-nightly",
        tenant="acme",
        handler="billing.nightly",
        payload=b"\x00{json}",
        spec=ScheduleSpec(kind=SpecKind.CRON, cron="0 * * * * *"),
        policies=SchedulePolicies(overlap=overlap),
        max_runtime=max_runtime,
        generation=7,
        create_time=T0,
        update_time=T0,
    )


def _run(*, attempt: int = 1, manual: bool = False, enqueued: bool = True) -> Run:
    return Run(
        run_id=run_id_for("billing-nightly", SLOT),
        schedule_id="billing-nightly",
        scheduled_for=SLOT,
        status=RunStatus.ENQUEUED,
        attempt=attempt,
        handler="billing.nightly",
        tenant="acme",
        manual=manual,
        enqueue_time=T0 + timedelta(microseconds=123_457) if enqueued else None,
    )


def test_a_worker_reads_back_everything_the_dispatcher_sent() -> None:
    s, r = _schedule(max_runtime=timedelta(seconds=90, milliseconds=500)), _run(attempt=3)
    lease, next_fire = T0 + timedelta(minutes=5), T0 + timedelta(minutes=1)
    m = run_message(s, r, lease_at=lease, next_fire=next_fire)
    task = decode_run_message(m.SerializeToString())
    assert m.run_id == task.run_id == r.run_id
    assert task.schedule_id == s.schedule_id
    assert (task.tenant, task.handler, task.payload) == ("acme", "billing.nightly", b"\x00{json}")
    assert task.scheduled_for == SLOT
    assert task.enqueue_time == r.enqueue_time
    assert (task.attempt, task.manual) == (3, False)
    assert task.max_runtime == 90.5
    assert task.lease_expire_time == lease
    assert task.next_fire_time == next_fire
    assert task.follow_up == run_message_pb2.FOLLOW_UP_NONE
    assert task.schema_version == RUN_MESSAGE_SCHEMA_VERSION


def test_a_carried_lease_and_an_unnoted_end_leave_their_times_unset() -> None:
    task = decode_run_message(
        run_message(
            _schedule(), _run(manual=True), lease_at=None, next_fire=None
        ).SerializeToString()
    )
    assert task.lease_expire_time is None
    assert task.next_fire_time is None
    assert task.max_runtime is None  # the worker's default timeout
    assert task.manual


@pytest.mark.parametrize(
    ("overlap", "downstream", "follow_up"),
    [
        (OverlapMode.SKIP, (), run_message_pb2.FOLLOW_UP_NONE),
        (OverlapMode.ALLOW, (), run_message_pb2.FOLLOW_UP_NONE),
        (OverlapMode.BUFFER_ONE, (), run_message_pb2.FOLLOW_UP_REQUIRED),
        (OverlapMode.SKIP, ("reports-daily",), run_message_pb2.FOLLOW_UP_REQUIRED),
    ],
)
def test_a_run_whose_end_starts_something_asks_for_the_follow_up(
    overlap: OverlapMode, downstream: tuple[str, ...], follow_up: int
) -> None:
    s = _schedule(overlap=overlap)
    if downstream:
        s = s.evolve(downstream=frozenset(downstream))
    m = run_message(s, _run(), lease_at=None, next_fire=None)
    assert m.follow_up == follow_up


def test_a_run_never_enqueued_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"billing-nightly.*no enqueue time"):
        run_message(_schedule(), _run(enqueued=False), lease_at=None, next_fire=None)
