"""Argument parsing of every ``cronscale`` subcommand (no server involved)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.cli import main
from scheduler.cli.app import parse_args


def test_schedule_create_cron_with_everything() -> None:
    args = parse_args(
        [
            "schedule", "create", "--name", "nightly", "--handler", "billing.nightly",
            "--cron", "0 2 * * *", "--tz", "Europe/Berlin", "--payload", '{"a": 1}',
            "--max-runtime", "300", "--id", "nightly-1", "--json", "--api", "h:1",
        ]
    )  # fmt: skip
    assert (args.command, args.schedule_command) == ("schedule", "create")
    assert args.name == "nightly"
    assert args.handler == "billing.nightly"
    assert args.cron == "0 2 * * *"
    assert args.tz == "Europe/Berlin"
    assert args.at is None and args.every is None
    assert args.payload == b'{"a": 1}'
    assert args.max_runtime == timedelta(seconds=300)
    assert args.id == "nightly-1"
    assert args.json is True
    assert args.api == "h:1"


def test_schedule_create_at_and_every() -> None:
    at = parse_args(
        ["schedule", "create", "--name", "n", "--handler", "h", "--at", "2026-12-02T15:00:00Z"]
    )
    assert at.at == datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
    every = parse_args(["schedule", "create", "--name", "n", "--handler", "h", "--every", "1h30m"])
    assert every.every == timedelta(hours=1, minutes=30)


@pytest.mark.parametrize(
    "spec",
    [
        [],
        ["--cron", "* * * * *", "--every", "5m"],
        ["--at", "2026-12-02T15:00:00Z", "--every", "5m"],
        ["--cron", "* * * * *", "--at", "2026-12-02T15:00:00Z"],
    ],
)
def test_schedule_create_needs_exactly_one_spec(
    spec: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["schedule", "create", "--name", "n", "--handler", "h", *spec])
    assert code == 2
    err = capsys.readouterr().err
    assert "--cron" in err or "--every" in err or "--at" in err


def test_invalid_payload_is_a_usage_error_naming_payload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["schedule", "create", "--name", "n", "--handler", "h", "--every", "5s",
         "--payload", "{not json"]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "argument --payload: must be valid JSON" in err


def test_naive_at_is_a_usage_error_naming_at(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["schedule", "create", "--name", "n", "--handler", "h", "--at", "2026-12-02T15:00:00"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "argument --at: must include a UTC offset, e.g. 2026-12-02T15:00:00Z" in err


def test_tz_without_cron_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["schedule", "create", "--name", "n", "--handler", "h", "--every", "5s", "--tz", "UTC"]
    )
    assert code == 2
    assert "argument --tz: applies only to --cron" in capsys.readouterr().err


def test_bad_every_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["schedule", "create", "--name", "n", "--handler", "h", "--every", "90"])
    assert code == 2
    assert "argument --every: not a duration" in capsys.readouterr().err


def test_name_and_handler_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "create", "--handler", "h", "--every", "5s"]) == 2
    assert "--name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["schedule", "get", "abc"], {"schedule_command": "get", "id": "abc"}),
        (["schedule", "resume", "abc"], {"schedule_command": "resume", "id": "abc"}),
        (["schedule", "delete", "abc"], {"schedule_command": "delete", "id": "abc"}),
        (
            ["schedule", "pause", "abc", "--note", "maintenance", "--by", "ops"],
            {"schedule_command": "pause", "id": "abc", "note": "maintenance", "by": "ops"},
        ),
        (
            ["schedule", "pause", "abc"],
            {"schedule_command": "pause", "id": "abc", "note": "", "by": None},
        ),
        (
            ["schedule", "list"],
            {"schedule_command": "list", "page_size": 0, "page_token": "", "all": False},
        ),
        (
            ["schedule", "list", "--page-size", "10", "--page-token", "t", "--all", "--json"],
            {"page_size": 10, "page_token": "t", "all": True, "json": True},
        ),
        (
            ["schedule", "runs", "abc", "--page-size", "5", "--page-token", "t"],
            {"schedule_command": "runs", "id": "abc", "page_size": 5, "page_token": "t"},
        ),
        (["run", "get", "r-1", "--json"], {"run_command": "get", "run_id": "r-1", "json": True}),
    ],
)
def test_api_subcommands(argv: list[str], expected: dict[str, object]) -> None:
    args = parse_args(argv)
    for key, value in expected.items():
        assert getattr(args, key) == value, key
    assert callable(args.run)
    assert args.timeout == 10.0


def test_api_defaults_to_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRONSCALE_API", raising=False)
    assert parse_args(["schedule", "get", "x"]).api == "127.0.0.1:50051"
    monkeypatch.setenv("CRONSCALE_API", "api.example:6000")
    assert parse_args(["schedule", "get", "x"]).api == "api.example:6000"
    assert parse_args(["schedule", "get", "x", "--api", "other:1"]).api == "other:1"


@pytest.mark.parametrize(
    ("argv", "attr", "value"),
    [
        (["local", "up"], "local_command", "up"),
        (["local", "down"], "local_command", "down"),
        (["local", "reset"], "local_command", "reset"),
        (["local", "status"], "local_command", "status"),
        (["db", "migrate"], "db_command", "migrate"),
        (["db", "recount-usage", "--tenant", "acme"], "tenant", "acme"),
        (["api"], "command", "api"),
        (["dispatcher", "--log-level", "debug", "--log-json"], "log_level", "DEBUG"),
    ],
)
def test_operator_and_process_commands(argv: list[str], attr: str, value: str) -> None:
    args = parse_args(argv)
    assert getattr(args, attr) == value
    assert callable(args.run)


def test_worker_passes_unknown_arguments_through_in_order() -> None:
    args = parse_args(
        ["worker", "--import", "mypkg.jobs", "--concurrency", "4", "--log-level", "WARNING",
         "--tier", "gold", "--help"]
    )  # fmt: skip
    assert args.command == "worker"
    assert args.log_level == "WARNING"
    assert args.worker_argv == [
        "--import", "mypkg.jobs", "--concurrency", "4", "--tier", "gold", "--help"
    ]  # fmt: skip


def test_unknown_arguments_are_refused_outside_worker(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "get", "x", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_dev_options() -> None:
    args = parse_args(["dev"])
    assert args.demo is True and args.verbose is False and args.imports == []
    args = parse_args(
        ["dev", "--no-demo", "--verbose", "--import", "a.b", "--import", "c", "--api", "h:2"]
    )
    assert args.demo is False and args.verbose is True
    assert args.imports == ["a.b", "c"]
    assert args.api == "h:2"


def test_no_command_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "schedule" in capsys.readouterr().out
    assert main(["schedule", "create", "--help"]) == 0
    assert "server is the authority on validation" in capsys.readouterr().out
