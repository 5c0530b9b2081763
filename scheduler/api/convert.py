"""Protobuf <-> domain conversion. Protobuf types do not cross below the API edge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from cronscale.v1 import schedule_pb2
from scheduler.cassandra import RunEventRecord
from scheduler.errors import InvalidArgument
from scheduler.model import (
    DEFAULT_TENANT,
    MisfireMode,
    Run,
    RunStatus,
    Schedule,
    ScheduleSpec,
    ScheduleState,
    SpecKind,
)

_STATE = {
    ScheduleState.ACTIVE: schedule_pb2.SCHEDULE_STATE_ACTIVE,
    ScheduleState.PAUSED: schedule_pb2.SCHEDULE_STATE_PAUSED,
    ScheduleState.COMPLETED: schedule_pb2.SCHEDULE_STATE_COMPLETED,
    ScheduleState.CANCELLED: schedule_pb2.SCHEDULE_STATE_CANCELLED,
}
_STATUS = {
    RunStatus.ENQUEUED: schedule_pb2.RUN_STATUS_ENQUEUED,
    RunStatus.RUNNING: schedule_pb2.RUN_STATUS_RUNNING,
    RunStatus.SUCCEEDED: schedule_pb2.RUN_STATUS_SUCCEEDED,
    RunStatus.FAILED: schedule_pb2.RUN_STATUS_FAILED,
    RunStatus.SKIPPED: schedule_pb2.RUN_STATUS_SKIPPED,
    RunStatus.DEAD_LETTERED: schedule_pb2.RUN_STATUS_DEAD_LETTERED,
    RunStatus.CANCELLED: schedule_pb2.RUN_STATUS_CANCELLED,
}
_EVENT_STATUS: dict[int, RunStatus | None] = {
    rr_pb2.RUN_EVENT_KIND_STARTED: RunStatus.RUNNING,
    rr_pb2.RUN_EVENT_KIND_HEARTBEAT: None,
    rr_pb2.RUN_EVENT_KIND_SUCCEEDED: RunStatus.SUCCEEDED,
    rr_pb2.RUN_EVENT_KIND_FAILED: RunStatus.FAILED,
}


_MISFIRE = {
    schedule_pb2.MISFIRE_POLICY_SKIP: MisfireMode.SKIP,
    schedule_pb2.MISFIRE_POLICY_FIRE_ONCE: MisfireMode.FIRE_ONCE,
    schedule_pb2.MISFIRE_POLICY_FIRE_ALL: MisfireMode.FIRE_ALL,
}


def misfire_from_proto(value: int, field: str) -> MisfireMode | None:
    """A misfire policy enum; None when unspecified; InvalidArgument naming ``field`` if
    the number is not a known policy."""
    if value == schedule_pb2.MISFIRE_POLICY_UNSPECIFIED:
        return None
    if value not in _MISFIRE:
        raise InvalidArgument(field, f"unknown misfire policy {value}")
    return _MISFIRE[value]  # type: ignore[index]


def ts(t: datetime | None) -> Timestamp | None:
    if t is None:
        return None
    out = Timestamp()
    out.FromDatetime(t.astimezone(UTC))
    return out


def from_ts(t: Timestamp) -> datetime:
    return t.ToDatetime(tzinfo=UTC)


def duration(d: timedelta | None) -> Duration | None:
    if d is None:
        return None
    out = Duration()
    out.FromTimedelta(d)
    return out


def schedule_from_proto(msg: schedule_pb2.Schedule, *, now: datetime) -> Schedule:
    """A draft schedule from a CreateSchedule request; server-owned fields are ignored."""
    kind = msg.spec.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument("schedule.spec", "one of cron, interval or once is required")
    if kind == "cron":
        if not msg.spec.cron.expression.strip():
            raise InvalidArgument("schedule.spec.cron.expression", "is required")
        spec = ScheduleSpec(
            kind=SpecKind.CRON,
            cron=msg.spec.cron.expression.strip(),
            timezone=msg.spec.cron.timezone or "UTC",
        )
    elif kind == "interval":
        every = msg.spec.interval.every.ToTimedelta()
        anchor = from_ts(msg.spec.interval.anchor) if msg.spec.interval.HasField("anchor") else now
        spec = ScheduleSpec(kind=SpecKind.INTERVAL, every=every, anchor=anchor)
    else:
        if not msg.spec.once.HasField("at"):
            raise InvalidArgument("schedule.spec.once.at", "is required")
        spec = ScheduleSpec(kind=SpecKind.ONCE, at=from_ts(msg.spec.once.at))
    max_runtime = msg.max_runtime.ToTimedelta() if msg.HasField("max_runtime") else None
    if max_runtime is not None and max_runtime <= timedelta(0):
        raise InvalidArgument("schedule.max_runtime", "must be positive when set")
    return Schedule(
        schedule_id="",
        tenant=msg.tenant or DEFAULT_TENANT,
        name=msg.name,
        handler=msg.handler.strip(),
        spec=spec,
        payload=bytes(msg.payload),
        max_runtime=max_runtime,
    )


def schedule_to_proto(s: Schedule) -> schedule_pb2.Schedule:
    spec = schedule_pb2.ScheduleSpec()
    if s.spec.kind is SpecKind.CRON:
        spec.cron.expression = s.spec.cron
        spec.cron.timezone = s.spec.timezone
    elif s.spec.kind is SpecKind.INTERVAL:
        assert s.spec.every is not None and s.spec.anchor is not None
        spec.interval.every.FromTimedelta(s.spec.every)
        spec.interval.anchor.FromDatetime(s.spec.anchor.astimezone(UTC))
    else:
        assert s.spec.at is not None
        spec.once.at.FromDatetime(s.spec.at.astimezone(UTC))
    return schedule_pb2.Schedule(
        id=s.schedule_id,
        tenant=s.tenant,
        name=s.name,
        handler=s.handler,
        spec=spec,
        payload=s.payload,
        state=_STATE[s.state],
        version=s.version,
        create_time=ts(s.create_time),
        update_time=ts(s.update_time),
        next_fire_time=ts(s.next_fire_time),
        pause_note=s.pause_note,
        paused_by=s.paused_by,
        pause_time=ts(s.pause_time),
        max_runtime=duration(s.max_runtime),
    )


def run_to_proto(r: Run) -> schedule_pb2.Run:
    return schedule_pb2.Run(
        run_id=r.run_id,
        schedule_id=r.schedule_id,
        status=_STATUS[r.status],
        scheduled_for=ts(r.scheduled_for),
        enqueue_time=ts(r.enqueue_time),
        start_time=ts(r.start_time),
        finish_time=ts(r.finish_time),
        attempt=r.attempt,
        handler=r.handler,
        error=r.error,
        worker_id=r.worker_id,
        manual=r.manual,
        skip_reason=r.skip_reason,
        tenant=r.tenant,
        origin_run_id=r.origin_run_id,
        backfill_id=r.backfill_id,
    )


def event_from_proto(e: rr_pb2.RunEvent, index: int, *, now: datetime) -> RunEventRecord:
    """A worker's run event; InvalidArgument names ``events[i].field`` when malformed."""
    where = f"events[{index}]"
    if e.kind not in _EVENT_STATUS:
        raise InvalidArgument(f"{where}.kind", f"unknown run event kind {e.kind}")
    if not e.run_id:
        raise InvalidArgument(f"{where}.run_id", "is required")
    if not e.schedule_id:
        raise InvalidArgument(f"{where}.schedule_id", "is required")
    if not e.HasField("scheduled_for"):
        raise InvalidArgument(f"{where}.scheduled_for", "is required")
    return RunEventRecord(
        run_id=e.run_id,
        schedule_id=e.schedule_id,
        scheduled_for=from_ts(e.scheduled_for),
        status=_EVENT_STATUS[e.kind],
        event_time=from_ts(e.event_time) if e.HasField("event_time") else now,
        attempt=e.attempt or 1,
        worker_id=e.worker_id,
        error=e.error,
    )
