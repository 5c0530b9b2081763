"""Run messages: the Kafka record a dispatcher produces for every firing, decoded.

The protobuf ``cronscale.v1.RunMessage`` stops here; the rest of the worker sees a frozen
:class:`RunTask`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from google.protobuf.message import DecodeError

from cronscale.v1 import run_message_pb2
from worker.errors import MessageDecodeError, UnsupportedMessageVersion
from worker.timestamps import from_timestamp

SCHEMA_VERSION = 1
"""The newest ``RunMessage.schema_version`` this worker understands."""


@dataclass(frozen=True, kw_only=True)
class RunTask:
    """One run to execute, as the dispatcher described it."""

    run_id: str
    schedule_id: str
    tenant: str
    handler: str
    payload: bytes
    scheduled_for: datetime
    enqueue_time: datetime | None
    attempt: int
    manual: bool
    # Seconds; None means the worker's default timeout.
    max_runtime: float | None
    # RunMessage.follow_up, echoed in the run's events (0: not known).
    follow_up: run_message_pb2.FollowUp.ValueType = run_message_pb2.FOLLOW_UP_UNSPECIFIED
    # RunMessage.lease_expire_time, echoed in the run's terminal event (None: not set).
    lease_expire_time: datetime | None = None
    # RunMessage.next_fire_time, echoed in the run's events (None: not set).
    next_fire_time: datetime | None = None
    schema_version: int = SCHEMA_VERSION
    # When the message was produced: its Kafka record's CreateTime (None: not known).
    produce_time: datetime | None = None


def decode_run_message(value: bytes | None, *, produce_time: datetime | None = None) -> RunTask:
    """Decodes a Kafka record value into a :class:`RunTask`.

    Raises :class:`UnsupportedMessageVersion` for a ``schema_version`` above
    :data:`SCHEMA_VERSION` (with what could be read, for reporting) and
    :class:`MessageDecodeError` for anything else that is not a runnable message (not protobuf,
    no run_id, no handler, no scheduled_for). ``produce_time`` is the record's timestamp, kept
    as the task's.
    """
    if value is None:
        raise MessageDecodeError("the record has no value (a tombstone?)")
    msg = run_message_pb2.RunMessage()
    try:
        msg.ParseFromString(value)
    except DecodeError as e:
        raise MessageDecodeError(f"the record is not a RunMessage: {e}") from e
    missing = [f for f in ("run_id", "handler") if not getattr(msg, f)]
    if not msg.HasField("scheduled_for"):
        missing.append("scheduled_for")
    if msg.schema_version > SCHEMA_VERSION:
        # Protobuf keeps old field numbers readable, so the ids usually survive a new layout.
        readable = _to_task(msg, produce_time) if not missing or missing == ["handler"] else None
        raise UnsupportedMessageVersion(msg.schema_version, SCHEMA_VERSION, task=readable)
    if missing:
        raise MessageDecodeError(f"the run message lacks {', '.join(missing)}")
    return _to_task(msg, produce_time)


def _to_task(msg: run_message_pb2.RunMessage, produce_time: datetime | None) -> RunTask:
    max_runtime = (
        msg.max_runtime.ToTimedelta().total_seconds() if msg.HasField("max_runtime") else 0
    )
    return RunTask(
        run_id=msg.run_id,
        schedule_id=msg.schedule_id,
        tenant=msg.tenant,
        handler=msg.handler,
        payload=msg.payload,
        scheduled_for=from_timestamp(msg.scheduled_for),
        enqueue_time=from_timestamp(msg.enqueue_time) if msg.HasField("enqueue_time") else None,
        attempt=msg.attempt,
        manual=msg.manual,
        max_runtime=max_runtime if max_runtime > 0 else None,
        follow_up=msg.follow_up,
        lease_expire_time=from_timestamp(msg.lease_expire_time)
        if msg.HasField("lease_expire_time")
        else None,
        next_fire_time=from_timestamp(msg.next_fire_time)
        if msg.HasField("next_fire_time")
        else None,
        # 0 is proto3's "unset": a producer that predates versioning wrote the first layout.
        schema_version=msg.schema_version or SCHEMA_VERSION,
        produce_time=produce_time,
    )


def encode_run_message(task: RunTask) -> bytes:
    """The inverse of :func:`decode_run_message` (for tests and tools; dispatchers own theirs)."""
    msg = run_message_pb2.RunMessage(
        schema_version=task.schema_version,
        run_id=task.run_id,
        schedule_id=task.schedule_id,
        tenant=task.tenant,
        handler=task.handler,
        payload=task.payload,
        attempt=task.attempt,
        manual=task.manual,
        follow_up=task.follow_up,
    )
    msg.scheduled_for.FromDatetime(task.scheduled_for)
    if task.enqueue_time is not None:
        msg.enqueue_time.FromDatetime(task.enqueue_time)
    if task.lease_expire_time is not None:
        msg.lease_expire_time.FromDatetime(task.lease_expire_time)
    if task.next_fire_time is not None:
        msg.next_fire_time.FromDatetime(task.next_fire_time)
    if task.max_runtime:
        msg.max_runtime.FromNanoseconds(round(task.max_runtime * 1e9))
    return msg.SerializeToString()
