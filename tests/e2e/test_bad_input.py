"""Bad input gets INVALID_ARGUMENT naming the field, and nothing is stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import cron_spec, once_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


CASES = [
    (
        "invalid cron",
        dict(handler="echo", spec=cron_spec("61 * * * *", "UTC")),
        "schedule.spec.cron.expression",
        "61",
    ),
    (
        "cron with 7 fields",
        dict(handler="echo", spec=cron_spec("* * * * * * *", "UTC")),
        "schedule.spec.cron.expression",
        "fields",
    ),
    (
        "unknown zone",
        dict(handler="echo", spec=cron_spec("0 2 * * *", "Mars/Olympus_Mons")),
        "schedule.spec.cron.timezone",
        "Mars/Olympus_Mons",
    ),
    ("missing handler", dict(spec=cron_spec("0 2 * * *", "UTC")), "schedule.handler", "required"),
    ("neither cron nor at", dict(handler="echo"), "schedule.spec", "required"),
    (
        "at in the past",
        dict(handler="echo", spec=once_spec(datetime.now(UTC) - timedelta(minutes=5))),
        "schedule.spec.once.at",
        "past",
    ),
    (
        "payload too large",
        dict(handler="echo", spec=cron_spec("0 2 * * *", "UTC"), payload=b"x" * 70_000),
        "schedule.payload",
        "65536",
    ),
]


def _count(stack: Stack) -> int:
    resp = stack.api.ListSchedules(
        scheduler_service_pb2.ListSchedulesRequest(page_size=1000), timeout=10
    )
    return len(resp.schedules)


@pytest.mark.parametrize(("case", "fields", "field", "detail"), CASES, ids=[c[0] for c in CASES])
def test_create_refuses_bad_input(
    stack: Stack, case: str, fields: dict[str, object], field: str, detail: str
) -> None:
    before = _count(stack)
    with pytest.raises(grpc.RpcError) as err:
        stack.api.CreateSchedule(
            scheduler_service_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.Schedule(name=case, **fields)  # type: ignore[arg-type]
            ),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = err.value.details() or ""
    assert message.startswith(field + ":"), message
    assert detail in message, message
    assert _count(stack) == before, "a refused schedule was stored"


def test_unknown_schedule_is_not_found(stack: Stack) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stack.api.GetSchedule(scheduler_service_pb2.GetScheduleRequest(id="no-such-id"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_duplicate_id_is_already_exists(stack: Stack) -> None:
    req = scheduler_service_pb2.CreateScheduleRequest(
        schedule_id="dup-check",
        schedule=schedule_pb2.Schedule(handler="echo", spec=cron_spec("0 3 * * *", "UTC")),
    )
    stack.api.CreateSchedule(req, timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        stack.api.CreateSchedule(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
