"""Dependencies: cycle detection, dependency-only schedules, and the dispatcher's edge checks."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from scheduler.dependencies import find_cycle, format_cycle
from scheduler.firing import FiringPlan, dependent_run_wanted
from scheduler.model import (
    RunStatus,
    Schedule,
    ScheduleSpec,
    ScheduleState,
    SkipReason,
    SpecKind,
    run_id_for,
)
from scheduler.reports import dependent_run_id
from scheduler.slots import next_slot, slots_between
from scheduler.timers import RunTimer
from scheduler.validation import validate_schedule

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("sid", "after", "graph", "cycle"),
    [
        # no edges at all
        ("x", [], {}, None),
        # self reference
        ("x", ["x"], {}, ["x", "x"]),
        # x after y, y after x
        ("x", ["y"], {"y": ["x"]}, ["x", "y", "x"]),
        # x after y, y after z, z after x: fires x -> z -> y -> x
        ("x", ["y"], {"y": ["z"], "z": ["x"]}, ["x", "z", "y", "x"]),
        # a diamond is not a cycle: x after b and c, both after a
        ("x", ["b", "c"], {"b": ["a"], "c": ["a"]}, None),
        # a cycle elsewhere upstream does not involve x (and the walk still ends)
        ("x", ["a"], {"a": ["b"], "b": ["a"]}, None),
        # unknown upstreams (dangling ids) are leaves
        ("x", ["gone"], {}, None),
        # the shortest cycle is named when there are several
        ("x", ["a", "b"], {"a": ["c"], "c": ["d"], "d": ["x"], "b": ["x"]}, ["x", "b", "x"]),
        # x's stored after set is ignored: the new one replaces it
        ("x", ["a"], {"x": ["a"], "a": []}, None),
    ],
)
def test_find_cycle(
    sid: str, after: list[str], graph: dict[str, list[str]], cycle: list[str] | None
) -> None:
    assert find_cycle(sid, after, graph) == cycle


def test_cycles_are_named_in_firing_order() -> None:
    # x after y, y after z, z after x: a run of x fires z, whose success fires y, then x again.
    cycle = find_cycle("x", ["y"], {"y": ["z"], "z": ["x"]})
    assert cycle is not None
    assert format_cycle(cycle) == "x -> z -> y -> x"
    upstream_of = {"x": {"y"}, "y": {"z"}, "z": {"x"}}
    for up, down in itertools.pairwise(cycle):
        assert up in upstream_of[down]


def test_find_cycle_on_a_long_chain() -> None:
    graph = {f"n{i}": [f"n{i + 1}"] for i in range(5000)}
    graph["n5000"] = ["x"]
    cycle = find_cycle("x", ["n0"], graph)
    assert cycle is not None and len(cycle) == 5003 and cycle[0] == cycle[-1] == "x"


def _dependent(after: frozenset[str] = frozenset({"up"})) -> Schedule:
    return Schedule(
        schedule_id="down",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.NONE),
        after=after,
    )


def test_a_dependency_only_schedule_has_no_slots_and_validates() -> None:
    s = _dependent()
    assert next_slot(s, T0) is None
    assert slots_between(s, T0, T0.replace(year=2027), 10) == []
    validate_schedule(s, T0)
    assert ScheduleSpec.from_json(s.spec.to_json()) == s.spec


def _timer(origin: str) -> RunTimer:
    return RunTimer(
        schedule_id="down",
        run_id=dependent_run_id("down", origin, T0),
        scheduled_for=T0,
        fire_at=T0,
        origin_run_id=origin,
    )


def test_a_dependent_run_goes_ahead_while_the_edge_exists() -> None:
    plan = FiringPlan()
    assert dependent_run_wanted(_dependent(), _timer(run_id_for("up", T0)), plan)
    assert not plan.skipped


def test_a_dependent_run_is_dropped_when_the_edge_is_gone() -> None:
    plan = FiringPlan()
    s = _dependent(after=frozenset({"other"}))
    assert not dependent_run_wanted(s, _timer(run_id_for("up", T0)), plan)
    assert not plan.skipped


def test_a_dependent_run_of_a_paused_schedule_is_skipped_with_a_reason() -> None:
    plan = FiringPlan()
    s = Schedule(
        schedule_id="down",
        handler="echo",
        spec=ScheduleSpec(kind=SpecKind.NONE),
        after=frozenset({"up"}),
        state=ScheduleState.PAUSED,
    )
    origin = run_id_for("up", T0)
    assert not dependent_run_wanted(s, _timer(origin), plan)
    [skipped] = plan.skipped
    assert skipped.status is RunStatus.SKIPPED
    assert skipped.skip_reason == SkipReason.PAUSED.value
    assert skipped.origin_run_id == origin


def test_runs_that_are_not_dependent_are_not_concerned() -> None:
    plan = FiringPlan()
    s = _dependent(after=frozenset())
    # a rerun: its origin is a run of the same schedule
    rerun = RunTimer(
        schedule_id="down",
        run_id=run_id_for("down", T0, manual=True),
        scheduled_for=T0,
        fire_at=T0,
        manual=True,
        origin_run_id=run_id_for("down", T0),
    )
    assert dependent_run_wanted(s, rerun, plan)
    plain = RunTimer(
        schedule_id="down", run_id=run_id_for("down", T0), scheduled_for=T0, fire_at=T0
    )
    assert dependent_run_wanted(s, plain, plan)


def test_dependent_run_ids_derive_from_the_upstream_run() -> None:
    a = dependent_run_id("down", run_id_for("up", T0), T0)
    assert a == dependent_run_id("down", run_id_for("up", T0), T0)
    assert a != dependent_run_id("down", run_id_for("up2", T0), T0)
    assert a.startswith("down@20260301T120000.000Z~d")
