"""Spec fields and execution policies across the API edge, and their validation messages."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2
from scheduler.api.convert import (
    policies_from_proto,
    policies_to_proto,
    schedule_from_proto,
    schedule_to_proto,
    spec_from_proto,
)
from scheduler.errors import InvalidArgument
from scheduler.model import (
    MisfireMode,
    OverlapMode,
    RetryPolicy,
    Schedule,
    SchedulePolicies,
    ScheduleSpec,
    SpecKind,
    millis,
    to_millisecond,
)
from scheduler.timespec import GapPolicy, OverlapPolicy, jitter_offset
from scheduler.validation import validate_schedule, validate_spec

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _ts(t: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(t)
    return out


def _dur(d: timedelta) -> Duration:
    out = Duration()
    out.FromTimedelta(d)
    return out


def _cron_msg(expr: str = "0 2 * * *", **spec: Any) -> schedule_pb2.Schedule:
    return schedule_pb2.Schedule(
        handler="echo",
        spec=schedule_pb2.ScheduleSpec(
            cron=schedule_pb2.CronSpec(expression=expr, timezone="America/New_York"), **spec
        ),
    )


def test_everything_round_trips() -> None:
    msg = _cron_msg(
        start_time=_ts(NOW + timedelta(days=1)),
        end_time=_ts(NOW + timedelta(days=30)),
        max_runs=7,
        jitter=_dur(timedelta(minutes=5)),
    )
    msg.spec.cron.dst.gap = schedule_pb2.DST_GAP_POLICY_SKIP
    msg.spec.cron.dst.overlap = schedule_pb2.DST_OVERLAP_POLICY_BOTH
    msg.policies.overlap = schedule_pb2.OVERLAP_POLICY_CANCEL_PREVIOUS
    msg.policies.misfire = schedule_pb2.MISFIRE_POLICY_FIRE_ALL
    msg.policies.catch_up_window.FromTimedelta(timedelta(minutes=20))
    msg.policies.max_catch_up = 3
    msg.policies.retry.max_attempts = 5
    msg.policies.retry.initial_backoff.FromTimedelta(timedelta(seconds=2))
    msg.policies.retry.backoff_multiplier = 3.0
    msg.policies.retry.max_backoff.FromTimedelta(timedelta(minutes=1))
    msg.policies.retry.jitter = 0.5
    s = schedule_from_proto(msg, now=NOW)
    assert s.spec.dst_gap is GapPolicy.SKIP and s.spec.dst_overlap is OverlapPolicy.BOTH
    assert s.spec.start_time == NOW + timedelta(days=1)
    assert s.spec.end_time == NOW + timedelta(days=30)
    assert s.spec.max_runs == 7 and s.spec.jitter == timedelta(minutes=5)
    assert s.policies == SchedulePolicies(
        overlap=OverlapMode.CANCEL_PREVIOUS,
        misfire=MisfireMode.FIRE_ALL,
        catch_up_window=timedelta(minutes=20),
        max_catch_up=3,
        retry=RetryPolicy(
            max_attempts=5,
            initial_backoff=timedelta(seconds=2),
            multiplier=3.0,
            max_backoff=timedelta(minutes=1),
            jitter=0.5,
        ),
    )
    out = schedule_to_proto(replace(s, schedule_id="x"))
    assert out.spec == msg.spec
    assert out.policies == msg.policies
    # ... and back again: the domain values survive a second trip, and the stored JSON too.
    again = schedule_from_proto(out, now=NOW)
    assert again.spec == s.spec and again.policies == s.policies
    assert ScheduleSpec.from_json(s.spec.to_json()) == s.spec
    assert SchedulePolicies.from_json(s.policies.to_json()) == s.policies


def test_the_tenant_given_overrides_the_requests_own() -> None:
    msg = _cron_msg()
    msg.tenant = "asked-for"
    assert schedule_from_proto(msg, now=NOW).tenant == "asked-for"
    assert schedule_from_proto(msg, now=NOW, tenant="resolved").tenant == "resolved"
    msg.tenant = ""
    assert schedule_from_proto(msg, now=NOW).tenant == "default"


def test_times_cross_the_edge_to_the_microsecond() -> None:
    at = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    s = replace(schedule_from_proto(_cron_msg(), now=NOW), schedule_id="x", create_time=at)
    out = schedule_to_proto(s)
    assert out.create_time == _ts(at)
    assert (out.create_time.seconds, out.create_time.nanos) == (int(at.timestamp()), 123456000)


def test_evolve_is_replace() -> None:
    s = schedule_from_proto(_cron_msg(), now=NOW)
    changes: dict[str, Any] = {
        "schedule_id": "x",
        "tenant": "t",
        "generation": 7,
        "create_time": NOW,
        "after": frozenset({"up"}),
    }
    evolved = s.evolve(**changes)
    assert evolved == replace(s, **changes)
    assert type(evolved) is Schedule and evolved is not s
    assert s.schedule_id == "" and s.tenant == "default"  # the original is left alone
    with pytest.raises(TypeError, match="no field"):
        s.evolve(schedule="x")


def test_unspecified_takes_the_defaults() -> None:
    s = schedule_from_proto(_cron_msg(), now=NOW)
    assert s.spec.dst_gap is None and s.spec.dst_overlap is None  # the expression's default
    assert s.spec.start_time is None and s.spec.end_time is None
    assert s.spec.max_runs == 0 and s.spec.jitter == timedelta(0)
    assert s.policies == SchedulePolicies()
    out = schedule_to_proto(replace(s, schedule_id="x"))
    assert not out.spec.cron.HasField("dst")
    assert not out.spec.HasField("jitter") and not out.spec.HasField("start_time")
    # The effective policies are spelled out, never UNSPECIFIED.
    assert out.policies.overlap == schedule_pb2.OVERLAP_POLICY_SKIP
    assert out.policies.misfire == schedule_pb2.MISFIRE_POLICY_FIRE_ONCE
    assert out.policies.catch_up_window.ToTimedelta() == timedelta(hours=1)
    assert out.policies.max_catch_up == 100


@pytest.mark.parametrize(
    ("overlap", "mode"),
    [
        (schedule_pb2.OVERLAP_POLICY_SKIP, OverlapMode.SKIP),
        (schedule_pb2.OVERLAP_POLICY_ALLOW, OverlapMode.ALLOW),
        (schedule_pb2.OVERLAP_POLICY_BUFFER_ONE, OverlapMode.BUFFER_ONE),
        (schedule_pb2.OVERLAP_POLICY_CANCEL_PREVIOUS, OverlapMode.CANCEL_PREVIOUS),
    ],
)
def test_each_overlap_policy_round_trips(overlap: int, mode: OverlapMode) -> None:
    p = policies_from_proto(schedule_pb2.SchedulePolicies(overlap=overlap))  # type: ignore[arg-type]
    assert p.overlap is mode
    assert policies_to_proto(p).overlap == overlap


@pytest.mark.parametrize(
    ("misfire", "mode"),
    [
        (schedule_pb2.MISFIRE_POLICY_SKIP, MisfireMode.SKIP),
        (schedule_pb2.MISFIRE_POLICY_FIRE_ONCE, MisfireMode.FIRE_ONCE),
        (schedule_pb2.MISFIRE_POLICY_FIRE_ALL, MisfireMode.FIRE_ALL),
    ],
)
def test_each_misfire_policy_round_trips(misfire: int, mode: MisfireMode) -> None:
    p = policies_from_proto(schedule_pb2.SchedulePolicies(misfire=misfire))  # type: ignore[arg-type]
    assert p.misfire is mode
    assert policies_to_proto(p).misfire == misfire


def _set(msg: schedule_pb2.Schedule, path: str, value: int) -> schedule_pb2.Schedule:
    target = msg
    *parents, leaf = path.split(".")
    for name in parents:
        target = getattr(target, name)
    setattr(target, leaf, value)
    return msg


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("policies.overlap", "schedule.policies.overlap: unknown overlap policy 9"),
        ("policies.misfire", "schedule.policies.misfire: unknown misfire policy 9"),
        ("spec.cron.dst.gap", "schedule.spec.cron.dst.gap: unknown DST gap policy 9"),
        ("spec.cron.dst.overlap", "schedule.spec.cron.dst.overlap: unknown DST overlap policy 9"),
    ],
)
def test_unknown_enum_numbers_name_the_field(path: str, message: str) -> None:
    msg = _set(_cron_msg(), path, 9)
    with pytest.raises(InvalidArgument) as err:
        schedule_from_proto(msg, now=NOW)
    assert err.value.message == message


def test_dry_run_spec_fields_are_named_under_spec() -> None:
    spec = schedule_pb2.ScheduleSpec(cron=schedule_pb2.CronSpec(expression="0 2 * * *"))
    spec.cron.dst.gap = 5  # type: ignore[assignment]
    with pytest.raises(InvalidArgument) as err:
        spec_from_proto(spec, now=NOW, field="spec")
    assert err.value.field == "spec.cron.dst.gap"
    with pytest.raises(InvalidArgument) as err:
        spec_from_proto(schedule_pb2.ScheduleSpec(), now=NOW, field="spec")
    assert err.value.field == "spec"


def test_interval_and_once_carry_the_common_fields() -> None:
    msg = schedule_pb2.Schedule(
        handler="echo",
        spec=schedule_pb2.ScheduleSpec(
            interval=schedule_pb2.IntervalSpec(every=_dur(timedelta(seconds=90))),
            max_runs=2,
            jitter=_dur(timedelta(seconds=30)),
        ),
    )
    s = schedule_from_proto(msg, now=NOW)
    assert s.spec.kind is SpecKind.INTERVAL and s.spec.anchor == NOW
    assert s.spec.max_runs == 2 and s.spec.jitter == timedelta(seconds=30)
    once = schedule_pb2.Schedule(
        handler="echo",
        spec=schedule_pb2.ScheduleSpec(
            once=schedule_pb2.OneShotSpec(at=_ts(NOW + timedelta(hours=1))),
            jitter=_dur(timedelta(hours=5)),
        ),
    )
    s = schedule_from_proto(once, now=NOW)
    assert s.spec.kind is SpecKind.ONCE and s.spec.jitter == timedelta(hours=5)
    validate_schedule(replace(s, schedule_id="x"), NOW)  # a one-shot has no period to exceed


def _schedule(**spec: object) -> Schedule:
    fields: dict[str, object] = {"kind": SpecKind.CRON, "cron": "*/30 * * * *"}
    fields.update(spec)
    return Schedule(schedule_id="s", handler="echo", spec=ScheduleSpec(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schedule", "field", "detail"),
    [
        (
            _schedule(start_time=NOW + timedelta(days=2), end_time=NOW + timedelta(days=1)),
            "schedule.spec.end_time",
            "must be after start_time",
        ),
        (
            _schedule(start_time=NOW + timedelta(days=1), end_time=NOW + timedelta(days=1)),
            "schedule.spec.end_time",
            "must be after start_time",
        ),
        (_schedule(end_time=NOW - timedelta(seconds=1)), "schedule.spec.end_time", "past"),
        (_schedule(max_runs=-1), "schedule.spec.max_runs", "-1"),
        (_schedule(jitter=timedelta(seconds=-1)), "schedule.spec.jitter", "negative"),
        (
            _schedule(jitter=timedelta(minutes=31)),
            "schedule.spec.jitter",
            "longer than the spec's shortest period",
        ),
        (
            _schedule(cron="0 9 * * 1-5", jitter=timedelta(days=2)),
            "schedule.spec.jitter",
            "shortest period",
        ),
        (
            _schedule(
                kind=SpecKind.INTERVAL,
                cron="",
                every=timedelta(seconds=90),
                anchor=NOW,
                jitter=timedelta(seconds=91),
            ),
            "schedule.spec.jitter",
            "1m31s is longer than the spec's shortest period 1m30s",
        ),
        (
            _schedule(kind=SpecKind.INTERVAL, cron="", every=timedelta(0), anchor=NOW),
            "schedule.spec.interval.every",
            "at least 1s",
        ),
        (
            replace(_schedule(), policies=SchedulePolicies(catch_up_window=timedelta(0))),
            "schedule.policies.catch_up_window",
            "positive",
        ),
        (
            replace(_schedule(), policies=SchedulePolicies(catch_up_window=timedelta(-5))),
            "schedule.policies.catch_up_window",
            "positive",
        ),
        (
            replace(_schedule(), policies=SchedulePolicies(max_catch_up=-2)),
            "schedule.policies.max_catch_up",
            "-2",
        ),
        # Limits: accepted once, these failed later in a dispatcher, Kafka or Cassandra.
        (
            replace(
                _schedule(),
                policies=SchedulePolicies(catch_up_window=timedelta(days=365 * 5000)),
            ),
            "schedule.policies.catch_up_window",
            "longer than the limit 366d",
        ),
        (
            replace(_schedule(), policies=SchedulePolicies(max_catch_up=10_001)),
            "schedule.policies.max_catch_up",
            "above the limit 10000",
        ),
        (replace(_schedule(), tenant="t" * 1_000_000), "schedule.tenant", "limit is 128"),
        (replace(_schedule(), name="n" * 257), "schedule.name", "limit is 256"),
        (
            replace(_schedule(), max_runtime=timedelta(days=8)),
            "schedule.max_runtime",
            "longer than the limit 7d",
        ),
        (
            _schedule(kind=SpecKind.ONCE, cron="", at=datetime(9999, 1, 1, tzinfo=UTC)),
            "schedule.spec.once.at",
            "before 2200-01-01",
        ),
        (
            _schedule(cron="0 " + "1" * 5000 + " * * *"),
            "schedule.spec.cron.expression",
            "limit is 256",
        ),
    ],
)
def test_validation_names_the_field(schedule: Schedule, field: str, detail: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_schedule(schedule, NOW)
    assert err.value.field == field
    assert detail in err.value.problem


def test_jitter_up_to_the_period_and_a_future_start_are_fine() -> None:
    validate_schedule(_schedule(jitter=timedelta(minutes=30)), NOW)
    validate_schedule(_schedule(cron="0 0 * * *", jitter=timedelta(hours=24)), NOW)
    validate_schedule(
        _schedule(start_time=NOW + timedelta(days=3), end_time=NOW + timedelta(days=4)), NOW
    )


def test_dry_run_validation_names_fields_under_spec() -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_spec(ScheduleSpec(kind=SpecKind.CRON, cron="61 * * * *"), field="spec")
    assert err.value.field == "spec.cron.expression"
    with pytest.raises(InvalidArgument) as err:
        validate_spec(
            ScheduleSpec(kind=SpecKind.CRON, cron="* * * * *", jitter=timedelta(minutes=2)),
            field="spec",
        )
    assert err.value.field == "spec.jitter"


@pytest.mark.parametrize("ms", [1, 999, 1001, 1003, 4100, 60_001, 86_400_001])
def test_stored_durations_keep_every_millisecond(ms: int) -> None:
    # `int(d.total_seconds() * 1000)` stored 1.001 s as 1000 ms (741 of the first 100,000
    # millisecond values came back one short).
    d = timedelta(milliseconds=ms)
    assert millis(d) == ms
    spec = ScheduleSpec(
        kind=SpecKind.INTERVAL,
        every=d,
        anchor=datetime(2026, 12, 5, tzinfo=UTC),
        jitter=d,
    )
    again = ScheduleSpec.from_json(spec.to_json())
    assert (again.every, again.jitter) == (d, d)
    policies = SchedulePolicies(
        catch_up_window=d, retry=RetryPolicy(initial_backoff=d, max_backoff=d)
    )
    back = SchedulePolicies.from_json(policies.to_json())
    assert back.catch_up_window == d
    assert (back.retry.initial_backoff, back.retry.max_backoff) == (d, d)


def test_instants_are_cut_to_the_millisecond_as_cassandra_keeps_them() -> None:
    t = datetime(2026, 12, 5, 14, 0, 0, 123_999, tzinfo=UTC)
    assert to_millisecond(t) == datetime(2026, 12, 5, 14, 0, 0, 123_000, tzinfo=UTC)
    assert to_millisecond(to_millisecond(t)) == to_millisecond(t)


def test_a_schedules_jitter_offset_is_kept_and_evolve_leaves_it_behind() -> None:
    """``Schedule.slot_offset`` is computed once per instance; a schedule evolved from it (a
    new id, a new spec) computes its own."""
    s = replace(schedule_from_proto(_cron_msg(), now=NOW), schedule_id="a")
    s = s.evolve(spec=replace(s.spec, jitter=timedelta(minutes=10)))
    offset = s.slot_offset
    assert offset == jitter_offset("a", timedelta(minutes=10)) and s.slot_offset is offset
    renamed = s.evolve(schedule_id="b")
    assert renamed.slot_offset == jitter_offset("b", timedelta(minutes=10))
    assert s.evolve(spec=replace(s.spec, jitter=timedelta(0))).slot_offset == timedelta(0)
    assert renamed == replace(s, schedule_id="b")  # the kept offset is not a field
