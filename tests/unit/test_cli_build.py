"""Building API requests from ``schedule create`` arguments."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta, timezone

import pytest

from cronscale.v1 import scheduler_service_pb2
from scheduler.cli.app import parse_args
from scheduler.cli.build import (
    CreateArgs,
    build_create_request,
    parse_at,
    parse_duration,
    parse_payload,
    parse_seconds,
)


def _request(*spec: str) -> scheduler_service_pb2.CreateScheduleRequest:
    args = parse_args(["schedule", "create", "--name", "n", "--handler", "echo", *spec])
    return build_create_request(CreateArgs.from_namespace(args))


def test_cron_request_from_args() -> None:
    request = _request(
        "--cron", "0 2 * * *", "--tz", "Europe/Berlin", "--payload", '{"region": "eu"}',
        "--max-runtime", "90", "--id", "nightly",
    )  # fmt: skip
    schedule = request.schedule
    assert request.schedule_id == "nightly"
    assert schedule.name == "n"
    assert schedule.handler == "echo"
    assert schedule.spec.WhichOneof("kind") == "cron"
    assert schedule.spec.cron.expression == "0 2 * * *"
    assert schedule.spec.cron.timezone == "Europe/Berlin"
    assert schedule.payload == b'{"region": "eu"}'
    assert schedule.max_runtime.ToTimedelta() == timedelta(seconds=90)
    # The server sets these; the CLI leaves them unset.
    assert schedule.id == "" and schedule.state == 0 and schedule.version == 0
    assert not schedule.HasField("create_time")


def test_cron_without_tz_sends_empty_zone() -> None:
    schedule = _request("--cron", "*/5 * * * * *").schedule
    assert schedule.spec.cron.timezone == ""
    assert schedule.payload == b""
    assert not schedule.HasField("max_runtime")


def test_at_request_is_utc() -> None:
    request = _request("--at", "2026-12-02T16:00:00+01:00")
    spec = request.schedule.spec
    assert spec.WhichOneof("kind") == "once"
    assert spec.once.at.ToJsonString() == "2026-12-02T15:00:00Z"
    assert request.schedule_id == ""


def test_every_request() -> None:
    spec = _request("--every", "90s").schedule.spec
    assert spec.WhichOneof("kind") == "interval"
    assert spec.interval.every.ToTimedelta() == timedelta(seconds=90)
    assert not spec.interval.HasField("anchor")


def test_payload_is_sent_as_written() -> None:
    text = '{"greeting": "grüß dich", "n": 1.50}'
    assert parse_payload(text) == text.encode("utf-8")
    assert parse_payload("[]") == b"[]"
    assert parse_payload('"s"') == b'"s"'


@pytest.mark.parametrize("text", ["{", "", "{'a': 1}", "nope"])
def test_payload_must_be_json(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be valid JSON"):
        parse_payload(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-02T15:00:00Z", datetime(2026, 12, 2, 15, tzinfo=UTC)),
        ("2026-12-02T15:00:00z", datetime(2026, 12, 2, 15, tzinfo=UTC)),
        ("2026-12-02T15:00:00.250Z", datetime(2026, 12, 2, 15, 0, 0, 250_000, tzinfo=UTC)),
        ("2026-12-02T15:00:00+00:00", datetime(2026, 12, 2, 15, tzinfo=UTC)),
        (
            "2026-12-02T10:00:00-05:00",
            datetime(2026, 12, 2, 10, tzinfo=timezone(timedelta(hours=-5))),
        ),
    ],
)
def test_parse_at(text: str, expected: datetime) -> None:
    assert parse_at(text) == expected


def test_parse_at_refuses_naive_and_garbage() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must include a UTC offset"):
        parse_at("2026-12-02T15:00:00")
    with pytest.raises(argparse.ArgumentTypeError, match="must include a UTC offset"):
        parse_at("2026-12-02")
    with pytest.raises(argparse.ArgumentTypeError, match="not an ISO 8601 time"):
        parse_at("tomorrow")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h30m15s", timedelta(hours=1, minutes=30, seconds=15)),
        ("2d", timedelta(days=2)),
        ("1.5s", timedelta(seconds=1.5)),
        ("250ms", timedelta(milliseconds=250)),
        ("1m500ms", timedelta(minutes=1, milliseconds=500)),
        ("0s", timedelta(0)),  # the server decides whether zero is allowed
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "90", "5 m", "1m1h", "1x", "-5s", "h", "1.5m"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        parse_duration(text)


def test_parse_seconds() -> None:
    assert parse_seconds("300") == timedelta(seconds=300)
    assert parse_seconds("2.5") == timedelta(seconds=2.5)
    assert parse_seconds("5m") == timedelta(minutes=5)
    with pytest.raises(argparse.ArgumentTypeError, match="not a number of seconds"):
        parse_seconds("soon")


def test_build_refuses_inconsistent_args() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        build_create_request(CreateArgs(name="n", handler="h"))
    with pytest.raises(ValueError, match="exactly one"):
        build_create_request(
            CreateArgs(name="n", handler="h", cron="* * * * *", every=timedelta(seconds=5))
        )
    with pytest.raises(ValueError, match="time zone"):
        build_create_request(
            CreateArgs(name="n", handler="h", every=timedelta(seconds=5), timezone="UTC")
        )
