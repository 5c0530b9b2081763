"""Protobuf <-> domain conversion. Protobuf types do not cross below the API edge."""

from __future__ import annotations

from datetime import datetime, timedelta

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import run_message_pb2, schedule_pb2
from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from scheduler.errors import InvalidArgument
from scheduler.model import (
    DEFAULT_CATCH_UP_WINDOW,
    DEFAULT_MAX_CATCH_UP,
    DEFAULT_TENANT,
    FollowUp,
    MisfireMode,
    OverlapMode,
    RetryPolicy,
    Run,
    RunEventRecord,
    RunStatus,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    ScheduleState,
    SpecKind,
)
from scheduler.timespec import GapPolicy, OverlapPolicy
from worker.timestamps import from_timestamp_ms, set_timestamp

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
    RunStatus.TIMED_OUT: schedule_pb2.RUN_STATUS_TIMED_OUT,
}
_EVENT_STATUS: dict[int, RunStatus | None] = {
    rr_pb2.RUN_EVENT_KIND_STARTED: RunStatus.RUNNING,
    rr_pb2.RUN_EVENT_KIND_HEARTBEAT: None,
    rr_pb2.RUN_EVENT_KIND_SUCCEEDED: RunStatus.SUCCEEDED,
    rr_pb2.RUN_EVENT_KIND_FAILED: RunStatus.FAILED,
    rr_pb2.RUN_EVENT_KIND_CANCELLED: RunStatus.CANCELLED,
    rr_pb2.RUN_EVENT_KIND_TIMED_OUT: RunStatus.TIMED_OUT,
}
_OUTCOMES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT)
# Run rows order their status cells by attempt (scheduler.cassandra.run_cell_time).
MAX_ATTEMPT = 1_000_000


_MISFIRE = {
    schedule_pb2.MISFIRE_POLICY_SKIP: MisfireMode.SKIP,
    schedule_pb2.MISFIRE_POLICY_FIRE_ONCE: MisfireMode.FIRE_ONCE,
    schedule_pb2.MISFIRE_POLICY_FIRE_ALL: MisfireMode.FIRE_ALL,
}


_MISFIRE_OUT = {mode: number for number, mode in _MISFIRE.items()}
_OVERLAP = {
    schedule_pb2.OVERLAP_POLICY_SKIP: OverlapMode.SKIP,
    schedule_pb2.OVERLAP_POLICY_ALLOW: OverlapMode.ALLOW,
    schedule_pb2.OVERLAP_POLICY_BUFFER_ONE: OverlapMode.BUFFER_ONE,
    schedule_pb2.OVERLAP_POLICY_CANCEL_PREVIOUS: OverlapMode.CANCEL_PREVIOUS,
}
_OVERLAP_OUT = {mode: number for number, mode in _OVERLAP.items()}
_DST_GAP = {
    schedule_pb2.DST_GAP_POLICY_SHIFT: GapPolicy.SHIFT,
    schedule_pb2.DST_GAP_POLICY_SKIP: GapPolicy.SKIP,
}
_DST_GAP_OUT = {policy: number for number, policy in _DST_GAP.items()}
_DST_OVERLAP = {
    schedule_pb2.DST_OVERLAP_POLICY_ONCE: OverlapPolicy.ONCE,
    schedule_pb2.DST_OVERLAP_POLICY_BOTH: OverlapPolicy.BOTH,
}
_DST_OVERLAP_OUT = {policy: number for number, policy in _DST_OVERLAP.items()}


def misfire_from_proto(value: int, field: str) -> MisfireMode | None:
    """A misfire policy enum; None when unspecified; InvalidArgument naming ``field`` if
    the number is not a known policy."""
    if value == schedule_pb2.MISFIRE_POLICY_UNSPECIFIED:
        return None
    if value not in _MISFIRE:
        raise InvalidArgument(field, f"unknown misfire policy {value}")
    return _MISFIRE[value]  # type: ignore[index]


def overlap_from_proto(value: int, field: str) -> OverlapMode | None:
    """An overlap policy enum; None when unspecified; InvalidArgument naming ``field`` if the
    number is not a known policy (proto3 enums are open: any int32 arrives)."""
    if value == schedule_pb2.OVERLAP_POLICY_UNSPECIFIED:
        return None
    if value not in _OVERLAP:
        raise InvalidArgument(field, f"unknown overlap policy {value}")
    return _OVERLAP[value]  # type: ignore[index]


def dst_from_proto(
    msg: schedule_pb2.DstPolicy, field: str
) -> tuple[GapPolicy | None, OverlapPolicy | None]:
    """A cron spec's DST policies; None for an unspecified one (the expression's default)."""
    gap: GapPolicy | None = None
    overlap: OverlapPolicy | None = None
    if msg.gap != schedule_pb2.DST_GAP_POLICY_UNSPECIFIED:
        if msg.gap not in _DST_GAP:
            raise InvalidArgument(f"{field}.gap", f"unknown DST gap policy {msg.gap}")
        gap = _DST_GAP[msg.gap]
    if msg.overlap != schedule_pb2.DST_OVERLAP_POLICY_UNSPECIFIED:
        if msg.overlap not in _DST_OVERLAP:
            raise InvalidArgument(f"{field}.overlap", f"unknown DST overlap policy {msg.overlap}")
        overlap = _DST_OVERLAP[msg.overlap]
    return gap, overlap


def policies_from_proto(
    msg: schedule_pb2.SchedulePolicies, field: str = "schedule.policies"
) -> SchedulePolicies:
    """Execution policies; unspecified enums and unset fields take the defaults.

    ``max_catch_up`` 0 reads as the default (proto3 cannot tell 0 from unset); a negative one
    is kept for ``validate_schedule`` to refuse, as is a non-positive ``catch_up_window``.
    """
    return SchedulePolicies(
        overlap=overlap_from_proto(msg.overlap, f"{field}.overlap") or OverlapMode.SKIP,
        misfire=misfire_from_proto(msg.misfire, f"{field}.misfire") or MisfireMode.FIRE_ONCE,
        catch_up_window=(
            msg.catch_up_window.ToTimedelta()
            if msg.HasField("catch_up_window")
            else DEFAULT_CATCH_UP_WINDOW
        ),
        max_catch_up=msg.max_catch_up or DEFAULT_MAX_CATCH_UP,
        retry=retry_from_proto(msg.retry) if msg.HasField("retry") else RetryPolicy(),
    )


def retry_from_proto(msg: schedule_pb2.RetryPolicy) -> RetryPolicy:
    """A retry policy; zero fields take the defaults (``validate_policies`` checks ranges)."""
    d = RetryPolicy()
    return RetryPolicy(
        max_attempts=msg.max_attempts or d.max_attempts,
        initial_backoff=(
            msg.initial_backoff.ToTimedelta()
            if msg.HasField("initial_backoff")
            else d.initial_backoff
        ),
        multiplier=msg.backoff_multiplier or d.multiplier,
        max_backoff=msg.max_backoff.ToTimedelta() if msg.HasField("max_backoff") else d.max_backoff,
        jitter=0.0 if msg.no_jitter else (msg.jitter or d.jitter),
    )


def retry_to_proto(p: RetryPolicy) -> schedule_pb2.RetryPolicy:
    out = schedule_pb2.RetryPolicy(
        max_attempts=p.max_attempts,
        backoff_multiplier=p.multiplier,
        jitter=p.jitter,
        no_jitter=p.jitter == 0.0,
    )
    out.initial_backoff.FromTimedelta(p.initial_backoff)
    out.max_backoff.FromTimedelta(p.max_backoff)
    return out


def policies_to_proto(p: SchedulePolicies) -> schedule_pb2.SchedulePolicies:
    """The effective policies, defaults spelled out (never UNSPECIFIED)."""
    out = schedule_pb2.SchedulePolicies(
        overlap=_OVERLAP_OUT[p.overlap],
        misfire=_MISFIRE_OUT[p.misfire],
        max_catch_up=p.max_catch_up,
    )
    out.catch_up_window.FromTimedelta(p.catch_up_window)
    out.retry.CopyFrom(retry_to_proto(p.retry))
    return out


def spec_from_proto(
    msg: schedule_pb2.ScheduleSpec, *, now: datetime, field: str = "schedule.spec"
) -> ScheduleSpec:
    """A cron, interval or one-shot spec with its DST policies, bounds, max_runs and jitter.

    Only what conversion needs is checked here (InvalidArgument naming fields under ``field``,
    which is ``spec`` for a dry-run preview); ``validate_spec`` checks the values.
    """
    kind = msg.WhichOneof("kind")
    start = from_ts(msg.start_time) if msg.HasField("start_time") else None
    end = from_ts(msg.end_time) if msg.HasField("end_time") else None
    jitter = msg.jitter.ToTimedelta() if msg.HasField("jitter") else timedelta(0)
    if kind == "cron":
        if not msg.cron.expression.strip():
            raise InvalidArgument(f"{field}.cron.expression", "is required")
        gap, overlap = dst_from_proto(msg.cron.dst, f"{field}.cron.dst")
        return ScheduleSpec(
            kind=SpecKind.CRON,
            cron=msg.cron.expression.strip(),
            timezone=msg.cron.timezone or "UTC",
            dst_gap=gap,
            dst_overlap=overlap,
            start_time=start,
            end_time=end,
            max_runs=msg.max_runs,
            jitter=jitter,
        )
    if kind == "interval":
        every = msg.interval.every.ToTimedelta()
        anchor = from_ts(msg.interval.anchor) if msg.interval.HasField("anchor") else now
        return ScheduleSpec(
            kind=SpecKind.INTERVAL,
            every=every,
            anchor=anchor,
            start_time=start,
            end_time=end,
            max_runs=msg.max_runs,
            jitter=jitter,
        )
    if kind == "once":
        if not msg.once.HasField("at"):
            raise InvalidArgument(f"{field}.once.at", "is required")
        return ScheduleSpec(
            kind=SpecKind.ONCE,
            at=from_ts(msg.once.at),
            start_time=start,
            end_time=end,
            max_runs=msg.max_runs,
            jitter=jitter,
        )
    raise InvalidArgument(field, "one of cron, interval or once is required")


def spec_to_proto(spec: ScheduleSpec) -> schedule_pb2.ScheduleSpec:
    """The stored spec as the API shows it; unset DST policies stay UNSPECIFIED."""
    out = schedule_pb2.ScheduleSpec()
    if spec.kind is SpecKind.CRON:
        out.cron.expression = spec.cron
        out.cron.timezone = spec.timezone
        if spec.dst_gap is not None:
            out.cron.dst.gap = _DST_GAP_OUT[spec.dst_gap]
        if spec.dst_overlap is not None:
            out.cron.dst.overlap = _DST_OVERLAP_OUT[spec.dst_overlap]
    elif spec.kind is SpecKind.INTERVAL:
        assert spec.every is not None and spec.anchor is not None
        out.interval.every.FromTimedelta(spec.every)
        set_timestamp(out.interval.anchor, spec.anchor)
    elif spec.kind is SpecKind.ONCE:
        assert spec.at is not None
        set_timestamp(out.once.at, spec.at)
    if spec.start_time is not None:
        set_timestamp(out.start_time, spec.start_time)
    if spec.end_time is not None:
        set_timestamp(out.end_time, spec.end_time)
    out.max_runs = spec.max_runs
    if spec.jitter:
        out.jitter.FromTimedelta(spec.jitter)
    return out


def ts(t: datetime | None) -> Timestamp | None:
    if t is None:
        return None
    out = Timestamp()
    set_timestamp(out, t)
    return out


def from_ts(t: Timestamp) -> datetime:
    """An instant from the wire, truncated to the millisecond: Cassandra keeps milliseconds,
    and run ids name the slot to the millisecond."""
    return from_timestamp_ms(t)


def duration(d: timedelta | None) -> Duration | None:
    if d is None:
        return None
    out = Duration()
    out.FromTimedelta(d)
    return out


def schedule_from_proto(
    msg: schedule_pb2.Schedule, *, now: datetime, tenant: str | None = None
) -> Schedule:
    """A draft schedule from a CreateSchedule request; server-owned fields are ignored.
    ``tenant``: the tenant it is created for (``scope.tenant_for_create``) instead of the
    request's own field."""
    kind = msg.spec.WhichOneof("kind")
    if kind is None and not msg.after:
        raise InvalidArgument(
            "schedule.spec",
            "one of cron, interval or once is required (or `after`, for a schedule that runs "
            "only after others succeed)",
        )
    # No kind: a dependency-only schedule (checked above that it has `after`).
    spec = ScheduleSpec(kind=SpecKind.NONE) if kind is None else spec_from_proto(msg.spec, now=now)
    max_runtime = msg.max_runtime.ToTimedelta() if msg.HasField("max_runtime") else None
    if max_runtime is not None and max_runtime <= timedelta(0):
        raise InvalidArgument("schedule.max_runtime", "must be positive when set")
    return Schedule(
        schedule_id="",
        tenant=tenant if tenant is not None else msg.tenant or DEFAULT_TENANT,
        name=msg.name,
        handler=msg.handler.strip(),
        spec=spec,
        payload=bytes(msg.payload),
        max_runtime=max_runtime,
        policies=policies_from_proto(msg.policies),
        after=frozenset(a.strip() for a in msg.after),
    )


def schedule_to_proto(s: Schedule) -> schedule_pb2.Schedule:
    spec = spec_to_proto(s.spec)
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
        policies=policies_to_proto(s.policies),
        after=sorted(s.after),
        quarantine_error=s.quarantine_error,
        quarantine_time=ts(s.quarantine_time),
    )


def schedule_summary_to_proto(s: Schedule) -> schedule_pb2.Schedule:
    """A schedule's identity, state and times, without its spec, payload and policies: what a
    batch create answers per item (GetSchedule has the rest; echoing whole schedules was ~15%
    of the call)."""
    return schedule_pb2.Schedule(
        id=s.schedule_id,
        tenant=s.tenant,
        name=s.name,
        state=_STATE[s.state],
        version=s.version,
        create_time=ts(s.create_time),
        update_time=ts(s.update_time),
        next_fire_time=ts(s.next_fire_time),
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
        next_attempt_time=ts(r.next_attempt_time),
        deferred=duration(r.deferred),
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
    if not 0 <= e.attempt <= MAX_ATTEMPT:
        raise InvalidArgument(f"{where}.attempt", f"must be between 1 and {MAX_ATTEMPT}")
    if e.HasField("start_time") and _EVENT_STATUS[e.kind] not in _OUTCOMES:
        raise InvalidArgument(f"{where}.start_time", "is only for a run's outcome")
    status = _EVENT_STATUS[e.kind]
    if (e.non_retryable or e.HasField("retry_after")) and status is not RunStatus.FAILED:
        raise InvalidArgument(
            f"{where}.non_retryable" if e.non_retryable else f"{where}.retry_after",
            "is only for a FAILED event",
        )
    if e.check_done and status is not RunStatus.RUNNING:
        raise InvalidArgument(f"{where}.check_done", "is only for a STARTED event")
    retry_after = e.retry_after.ToTimedelta() if e.HasField("retry_after") else None
    if retry_after is not None and retry_after < timedelta(0):
        raise InvalidArgument(f"{where}.retry_after", "must not be negative")
    return RunEventRecord(
        run_id=e.run_id,
        schedule_id=e.schedule_id,
        scheduled_for=from_ts(e.scheduled_for),
        status=_EVENT_STATUS[e.kind],
        event_time=from_ts(e.event_time) if e.HasField("event_time") else now,
        attempt=e.attempt or 1,
        worker_id=e.worker_id,
        error=e.error,
        enqueue_time=from_ts(e.enqueue_time) if e.HasField("enqueue_time") else None,
        follow_up=_FOLLOW_UP.get(e.follow_up, FollowUp.UNKNOWN),
        start_time=from_ts(e.start_time) if e.HasField("start_time") else None,
        non_retryable=e.non_retryable,
        retry_after=retry_after,
        lease_expire_time=(
            from_ts(e.lease_expire_time) if e.HasField("lease_expire_time") else None
        ),
        next_fire_time=from_ts(e.next_fire_time) if e.HasField("next_fire_time") else None,
        check_done=e.check_done,
    )


_FOLLOW_UP = {
    run_message_pb2.FOLLOW_UP_NONE: FollowUp.NONE,
    run_message_pb2.FOLLOW_UP_REQUIRED: FollowUp.REQUIRED,
}
