"""Parsing and request building of `schedule update|cancel|trigger` and `run rerun`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronscale.v1 import schedule_pb2
from scheduler.cli import main
from scheduler.cli.app import parse_args
from scheduler.cli.lifecycle import UpdateArgs, build_update_request
from scheduler.errors import InvalidArgument


def _stored() -> schedule_pb2.Schedule:
    s = schedule_pb2.Schedule(
        id="nightly",
        name="nightly",
        handler="billing.nightly",
        payload=b'{"region": "eu"}',
        state=schedule_pb2.SCHEDULE_STATE_ACTIVE,
        version=3,
        policies=schedule_pb2.SchedulePolicies(overlap=schedule_pb2.OVERLAP_POLICY_BUFFER_ONE),
    )
    s.spec.cron.expression = "0 2 * * *"
    s.spec.cron.timezone = "Europe/Berlin"
    s.spec.max_runs = 10
    s.max_runtime.FromTimedelta(timedelta(seconds=60))
    return s


def _update(*argv: str) -> schedule_pb2.Schedule:
    args = parse_args(["schedule", "update", "nightly", *argv])
    return build_update_request(_stored(), UpdateArgs.from_namespace(args)).schedule


def test_update_parses_every_option() -> None:
    args = parse_args(
        [
            "schedule", "update", "nightly", "--version", "3", "--name", "n2", "--handler", "h2",
            "--cron", "30 2 * * *", "--tz", "Asia/Kolkata", "--payload", '{"a": 1}',
            "--max-runtime", "5m", "--json", "--api", "h:1",
        ]
    )  # fmt: skip
    assert (args.command, args.schedule_command) == ("schedule", "update")
    assert (args.id, args.version, args.name, args.handler) == ("nightly", 3, "n2", "h2")
    assert (args.cron, args.tz, args.at, args.every) == ("30 2 * * *", "Asia/Kolkata", None, None)
    assert args.payload == b'{"a": 1}'
    assert args.max_runtime == timedelta(minutes=5)
    assert args.json is True and args.api == "h:1"


def test_update_without_options_sends_the_stored_schedule_with_the_given_version() -> None:
    sent = _update("--version", "2")
    expected = _stored()
    expected.version = 2
    assert sent == expected


def test_update_replaces_only_what_is_given() -> None:
    sent = _update("--version", "3", "--name", "renamed", "--payload", '{"region": "us"}')
    assert sent.name == "renamed"
    assert sent.payload == b'{"region": "us"}'
    assert sent.handler == "billing.nightly"
    assert sent.spec.cron.expression == "0 2 * * *"
    assert sent.spec.cron.timezone == "Europe/Berlin"
    assert sent.max_runtime.ToTimedelta() == timedelta(seconds=60)
    assert sent.policies.overlap == schedule_pb2.OVERLAP_POLICY_BUFFER_ONE
    assert sent.id == "nightly" and sent.version == 3


def test_a_new_cron_keeps_the_zone_and_the_spec_bounds() -> None:
    sent = _update("--version", "3", "--cron", "*/2 * * * * *")
    assert sent.spec.cron.expression == "*/2 * * * * *"
    assert sent.spec.cron.timezone == "Europe/Berlin"
    assert sent.spec.max_runs == 10


def test_tz_alone_changes_the_zone_of_a_cron_schedule() -> None:
    sent = _update("--version", "3", "--tz", "UTC")
    assert sent.spec.cron.expression == "0 2 * * *"
    assert sent.spec.cron.timezone == "UTC"


def test_at_and_every_replace_the_kind() -> None:
    once = _update("--version", "3", "--at", "2030-01-01T00:00:00+01:00")
    assert once.spec.WhichOneof("kind") == "once"
    assert once.spec.once.at.ToDatetime(tzinfo=UTC) == datetime(2029, 12, 31, 23, 0, tzinfo=UTC)
    every = _update("--version", "3", "--every", "90s")
    assert every.spec.WhichOneof("kind") == "interval"
    assert every.spec.interval.every.ToTimedelta() == timedelta(seconds=90)
    assert not every.spec.interval.HasField("anchor")


def test_tz_on_a_schedule_that_is_no_longer_cron_is_refused() -> None:
    with pytest.raises(InvalidArgument) as err:
        _update("--version", "3", "--every", "90s", "--tz", "UTC")
    assert err.value.field == "--tz"


def test_update_needs_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "update", "nightly", "--name", "x"]) == 2
    assert "--version" in capsys.readouterr().err


def test_update_takes_one_new_spec_kind_at_most(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["schedule", "update", "x", "--version", "1", "--cron", "* * * * *", "--every", "5m"]
    )
    assert code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_cancel_trigger_and_rerun_parse() -> None:
    cancel = parse_args(["schedule", "cancel", "nightly", "--cancel-running", "--json"])
    assert (cancel.schedule_command, cancel.id, cancel.cancel_running) == (
        "cancel",
        "nightly",
        True,
    )
    assert cancel.json is True
    assert parse_args(["schedule", "cancel", "nightly"]).cancel_running is False
    trigger = parse_args(["schedule", "trigger", "nightly", "--force"])
    assert (trigger.schedule_command, trigger.id, trigger.force) == ("trigger", "nightly", True)
    assert parse_args(["schedule", "trigger", "nightly"]).force is False
    rerun = parse_args(["run", "rerun", "nightly@20260301T020000.000Z", "--json"])
    assert (rerun.run_command, rerun.run_id, rerun.json) == (
        "rerun",
        "nightly@20260301T020000.000Z",
        True,
    )
