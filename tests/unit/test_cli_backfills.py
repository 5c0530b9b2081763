"""``schedule backfill|deps``, ``backfill get`` and ``schedule create --after`` (no server)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2
from scheduler.cli import main
from scheduler.cli.app import parse_args
from scheduler.cli.backfills import build_backfill_request, format_backfill, format_edges
from scheduler.cli.build import CreateArgs, build_create_request


def _ts(t: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(t)
    return out


def test_schedule_backfill() -> None:
    args = parse_args(
        [
            "schedule", "backfill", "nightly", "--from", "2026-01-01T00:00:00Z",
            "--to", "2026-01-02T00:00:00+01:00", "--concurrency", "50", "--json",
        ]
    )  # fmt: skip
    assert (args.command, args.schedule_command, args.id) == ("schedule", "backfill", "nightly")
    request = build_backfill_request(args)
    assert request.id == "nightly" and request.concurrency == 50
    assert request.start_time.ToDatetime(tzinfo=UTC) == datetime(2026, 1, 1, tzinfo=UTC)
    assert request.end_time.ToDatetime(tzinfo=UTC) == datetime(2026, 1, 1, 23, tzinfo=UTC)
    assert args.json is True


def test_schedule_backfill_concurrency_defaults_to_the_server() -> None:
    args = parse_args(
        ["schedule", "backfill", "x", "--from", "2026-01-01T00:00Z", "--to", "2026-01-02T00:00Z"]
    )
    assert build_backfill_request(args).concurrency == 0


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--from", "2026-01-01T00:00:00Z"],
        ["--to", "2026-01-01T00:00:00Z"],
        ["--from", "2026-01-01T00:00:00", "--to", "2026-01-02T00:00:00Z"],
        ["--from", "yesterday", "--to", "2026-01-02T00:00:00Z"],
    ],
)
def test_schedule_backfill_usage_errors(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedule", "backfill", "x", *extra]) == 2
    err = capsys.readouterr().err
    assert "--from" in err or "--to" in err


def test_backfill_get_and_schedule_deps() -> None:
    got = parse_args(["backfill", "get", "x@bf-1-2", "--json"])
    assert (got.command, got.backfill_command, got.backfill_id) == ("backfill", "get", "x@bf-1-2")
    one = parse_args(["schedule", "deps", "nightly"])
    assert (one.schedule_command, one.id) == ("deps", "nightly")
    everything = parse_args(["schedule", "deps", "--json"])
    assert everything.id == "" and everything.json is True


def test_schedule_create_after_alone_or_with_a_spec() -> None:
    alone = parse_args(
        ["schedule", "create", "--name", "n", "--handler", "h", "--after", "a", "--after", "b"]
    )
    request = build_create_request(CreateArgs.from_namespace(alone))
    assert list(request.schedule.after) == ["a", "b"]
    assert request.schedule.spec.WhichOneof("kind") is None
    both = parse_args(
        ["schedule", "create", "--name", "n", "--handler", "h", "--cron", "0 * * * *",
         "--after", "a"]
    )  # fmt: skip
    request = build_create_request(CreateArgs.from_namespace(both))
    assert list(request.schedule.after) == ["a"]
    assert request.schedule.spec.cron.expression == "0 * * * *"


def test_build_create_request_needs_a_spec_or_after() -> None:
    with pytest.raises(ValueError, match="after"):
        build_create_request(CreateArgs(name="n", handler="h"))


def test_format_backfill() -> None:
    text = format_backfill(
        schedule_pb2.Backfill(
            backfill_id="s@bf",
            schedule_id="s",
            start_time=_ts(datetime(2026, 1, 1, tzinfo=UTC)),
            end_time=_ts(datetime(2026, 1, 2, tzinfo=UTC)),
            total=24,
            enqueued=10,
            done=7,
            concurrency=5,
        )
    )
    lines = dict(line.split(None, 1) for line in text.splitlines())
    assert lines["range"] == "[2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z)"
    assert (lines["total"], lines["enqueued"], lines["done"], lines["concurrency"]) == (
        "24",
        "10",
        "7",
        "5",
    )


def test_format_edges() -> None:
    assert format_edges([]) == "no dependencies"
    text = format_edges(
        [
            schedule_pb2.DependencyEdge(upstream_id="a", downstream_id="b"),
            schedule_pb2.DependencyEdge(upstream_id="extract", downstream_id="load"),
        ]
    )
    assert text.splitlines() == [
        "UPSTREAM  DOWNSTREAM",
        "a         b",
        "extract   load",
    ]
