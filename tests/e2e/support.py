"""Helpers the end-to-end test modules share: time conversions, run statuses, schedule specs,
thin wrappers of the API calls, and waits that fail with the runs seen and the process logs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, TypeAlias

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack

RunStatus: TypeAlias = schedule_pb2.RunStatus.ValueType
"""A run status, as the generated stubs type it."""

ENQUEUED: Final[RunStatus] = schedule_pb2.RUN_STATUS_ENQUEUED
RUNNING: Final[RunStatus] = schedule_pb2.RUN_STATUS_RUNNING
SUCCEEDED: Final[RunStatus] = schedule_pb2.RUN_STATUS_SUCCEEDED
FAILED: Final[RunStatus] = schedule_pb2.RUN_STATUS_FAILED
SKIPPED: Final[RunStatus] = schedule_pb2.RUN_STATUS_SKIPPED
CANCELLED: Final[RunStatus] = schedule_pb2.RUN_STATUS_CANCELLED
DEAD_LETTERED: Final[RunStatus] = schedule_pb2.RUN_STATUS_DEAD_LETTERED
TIMED_OUT: Final[RunStatus] = schedule_pb2.RUN_STATUS_TIMED_OUT
TERMINAL: Final[frozenset[RunStatus]] = frozenset({SUCCEEDED, FAILED})
"""The statuses of a run that ran its handler to the end, well or not."""

RunOrder: TypeAlias = Literal["listed", "slot", "slot_id"]
"""How `list_runs` orders the runs:

- ``"listed"``: as ListRuns answers, newest slot first (run id descending within a slot);
- ``"slot"``: oldest slot first, the runs of one slot left as listed;
- ``"slot_id"``: oldest slot first, then by run id ascending.
"""

LOGS: Final = ("api", "dispatcher", "worker")
"""The processes whose log tails a failed wait shows."""


# --- conversions -------------------------------------------------------------------------------


def ts(t: datetime) -> Timestamp:
    """``t`` as a protobuf Timestamp."""
    out = Timestamp()
    out.FromDatetime(t)
    return out


def dt(t: Timestamp) -> datetime:
    """``t`` as a timezone-aware UTC datetime."""
    return t.ToDatetime(tzinfo=UTC)


def dur(d: timedelta) -> Duration:
    """``d`` as a protobuf Duration."""
    out = Duration()
    out.FromTimedelta(d)
    return out


def status_name(status: RunStatus) -> str:
    """The enum name of a run status, e.g. ``RUN_STATUS_SUCCEEDED``."""
    return schedule_pb2.RunStatus.Name(status)


def json_payload(doc: Any) -> bytes:
    """``doc`` encoded as a JSON payload; no payload (``b""``) for None."""
    return json.dumps(doc).encode() if doc is not None else b""


# --- specs -------------------------------------------------------------------------------------


def cron_spec(expression: str, timezone: str = "", **spec: Any) -> schedule_pb2.ScheduleSpec:
    """A cron spec (an empty ``timezone`` is UTC); ``spec`` sets the other ScheduleSpec fields
    (``start_time``, ``end_time``, ``jitter``, ``max_runs``)."""
    return schedule_pb2.ScheduleSpec(
        cron=schedule_pb2.CronSpec(expression=expression, timezone=timezone), **spec
    )


def once_spec(at: datetime) -> schedule_pb2.ScheduleSpec:
    """A one-shot spec that fires at ``at``."""
    return schedule_pb2.ScheduleSpec(once=schedule_pb2.OneShotSpec(at=ts(at)))


# --- API calls ---------------------------------------------------------------------------------


def create_schedule(stack: Stack, schedule_id: str = "", **fields: Any) -> schedule_pb2.Schedule:
    """CreateSchedule of a Schedule with ``fields``; the id is the server's unless given."""
    return stack.api.CreateSchedule(
        scheduler_service_pb2.CreateScheduleRequest(
            schedule=schedule_pb2.Schedule(**fields), schedule_id=schedule_id
        ),
        timeout=10,
    )


def create_with_policies(
    stack: Stack,
    *,
    name: str,
    handler: str,
    spec: schedule_pb2.ScheduleSpec,
    payload: Any = None,
    **policies: Any,
) -> schedule_pb2.Schedule:
    """CreateSchedule with a JSON ``payload`` (none for None) and SchedulePolicies set from
    ``policies`` (``overlap``, ``misfire``, ``catch_up_window``, ...; set even when empty)."""
    return create_schedule(
        stack,
        name=name,
        handler=handler,
        spec=spec,
        payload=json_payload(payload),
        policies=schedule_pb2.SchedulePolicies(**policies),
    )


def get_schedule(stack: Stack, schedule_id: str) -> schedule_pb2.Schedule:
    """GetSchedule (raises the gRPC error, e.g. NOT_FOUND)."""
    return stack.api.GetSchedule(
        scheduler_service_pb2.GetScheduleRequest(id=schedule_id), timeout=10
    )


def pause_schedule(stack: Stack, schedule_id: str) -> None:
    """PauseSchedule without a note."""
    stack.api.PauseSchedule(scheduler_service_pb2.PauseScheduleRequest(id=schedule_id), timeout=10)


def delete_schedule(stack: Stack, schedule_id: str) -> None:
    """DeleteSchedule (raises the gRPC error, e.g. FAILED_PRECONDITION for an upstream)."""
    stack.api.DeleteSchedule(
        scheduler_service_pb2.DeleteScheduleRequest(id=schedule_id), timeout=10
    )


def get_run(stack: Stack, run_id: str) -> schedule_pb2.Run:
    """GetRun (raises the gRPC error, e.g. NOT_FOUND)."""
    return stack.api.GetRun(scheduler_service_pb2.GetRunRequest(run_id=run_id), timeout=10)


def list_runs(
    stack: Stack, schedule_id: str, *, order: RunOrder = "listed"
) -> list[schedule_pb2.Run]:
    """Every run of a schedule (ListRuns pages of 1000, followed to the last), in ``order``."""
    out: list[schedule_pb2.Run] = []
    token = ""
    while True:
        resp = stack.api.ListRuns(
            scheduler_service_pb2.ListRunsRequest(
                schedule_id=schedule_id, page_size=1000, page_token=token
            ),
            timeout=10,
        )
        out.extend(resp.runs)
        token = resp.next_page_token
        if not token:
            break
    if order == "slot":
        out.sort(key=lambda r: dt(r.scheduled_for))
    elif order == "slot_id":
        out.sort(key=lambda r: (dt(r.scheduled_for), r.run_id))
    return out


class Refusal(NamedTuple):
    """What an RPC that failed answered; unpacks as ``code, details``."""

    code: grpc.StatusCode
    details: str


def refusal(call: Callable[[], object]) -> Refusal:
    """Calls ``call``, which must raise a gRPC error, and returns what the error said."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    return Refusal(err.value.code(), err.value.details() or "")


# --- waits -------------------------------------------------------------------------------------


def log_tails(stack: Stack, names: tuple[str, ...] = LOGS) -> str:
    """The last lines of each process's log, each under a ``--- name`` line."""
    return "\n".join(f"--- {name}\n{stack.tail(name)}" for name in names)


def _poll(check: Callable[[], bool], timeout: float, poll: float) -> bool:
    """True once ``check()`` holds (asked every ``poll`` s); False if ``timeout`` s pass first."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def wait_until(
    stack: Stack, check: Callable[[], bool], timeout: float, what: str, *, poll: float = 0.5
) -> None:
    """Polls ``check`` until it holds; fails the test after ``timeout`` s with the log tails."""
    if not _poll(check, timeout, poll):
        pytest.fail(f"{what}: not reached after {timeout} s\n{log_tails(stack)}")


def wait_for_runs(
    stack: Stack,
    schedule_id: str,
    done: Callable[[list[schedule_pb2.Run]], bool],
    timeout: float,
    what: str = "the runs expected",
    *,
    order: RunOrder = "listed",
    poll: float = 0.2,
    fail: bool = True,
) -> list[schedule_pb2.Run]:
    """Polls the runs of a schedule (`list_runs` in ``order``) until ``done(runs)`` and returns
    them. After ``timeout`` s it fails the test with the runs seen (id, status, skip reason,
    error) and the log tails, or, with ``fail=False``, returns the runs as they are then."""
    seen: list[schedule_pb2.Run] = []

    def reached() -> bool:
        nonlocal seen
        seen = list_runs(stack, schedule_id, order=order)
        return done(seen)

    if not _poll(reached, timeout, poll) and fail:
        listed = [(r.run_id, status_name(r.status), r.skip_reason, r.error) for r in seen]
        pytest.fail(
            f"{what}: not after {timeout} s; runs of {schedule_id}: {listed}\n{log_tails(stack)}"
        )
    return seen
