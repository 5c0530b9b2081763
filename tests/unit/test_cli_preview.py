"""``schedule preview``, the spec/policy options of ``schedule create`` and ``resume --misfire``
(parsing, request building and output; no server involved)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.cli import main
from scheduler.cli.app import parse_args
from scheduler.cli.build import (
    CreateArgs,
    PreviewArgs,
    SpecOptions,
    build_create_request,
    build_preview_request,
)
from scheduler.cli.output import format_schedule, message_to_json
from scheduler.cli.preview import format_preview


def _preview(*argv: str) -> scheduler_service_pb2.PreviewScheduleRequest:
    return build_preview_request(
        PreviewArgs.from_namespace(parse_args(["schedule", "preview", *argv]))
    )


def test_dry_run_request() -> None:
    request = _preview(
        "--cron", "30 2 * * *", "--tz", "America/New_York", "--dst-gap", "skip",
        "--dst-overlap", "BOTH", "--jitter", "90s", "--start", "2026-03-01T00:00:00Z",
        "--end", "2026-04-01T00:00:00+02:00", "--after", "2026-03-07T12:00:00Z", "--count", "3",
    )  # fmt: skip
    assert request.WhichOneof("target") == "spec"
    spec = request.spec
    assert spec.cron.expression == "30 2 * * *" and spec.cron.timezone == "America/New_York"
    assert spec.cron.dst.gap == schedule_pb2.DST_GAP_POLICY_SKIP
    assert spec.cron.dst.overlap == schedule_pb2.DST_OVERLAP_POLICY_BOTH
    assert spec.jitter.ToTimedelta() == timedelta(seconds=90)
    assert spec.start_time.ToJsonString() == "2026-03-01T00:00:00Z"
    assert spec.end_time.ToJsonString() == "2026-03-31T22:00:00Z"
    assert request.after.ToJsonString() == "2026-03-07T12:00:00Z"
    assert request.count == 3


def test_stored_schedule_request() -> None:
    request = _preview("nightly", "--count", "5")
    assert request.WhichOneof("target") == "id" and request.id == "nightly"
    assert request.count == 5 and not request.HasField("after")


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        ([], "either a schedule ID or --cron"),
        (["nightly", "--cron", "* * * * *"], "either a schedule ID or --cron"),
        (["nightly", "--tz", "UTC"], "apply only to --cron"),
        (["nightly", "--jitter", "5s"], "apply only to --cron"),
        (["nightly", "--dst-gap", "SKIP"], "apply only to --cron"),
        (["--cron", "* * * * *", "--dst-gap", "LATER"], "invalid choice"),
        (["--cron", "* * * * *", "--after", "2026-03-07T12:00:00"], "UTC offset"),
    ],
)
def test_preview_usage_errors(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedule", "preview", *argv]) == 2
    assert problem in capsys.readouterr().err


def test_preview_builder_refuses_what_argparse_would() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        build_preview_request(PreviewArgs())
    with pytest.raises(ValueError, match="only to --cron"):
        build_preview_request(
            PreviewArgs(schedule_id="x", spec_options=SpecOptions(jitter=timedelta(1)))
        )


def _response() -> scheduler_service_pb2.PreviewScheduleResponse:
    response = scheduler_service_pb2.PreviewScheduleResponse(timezone="America/New_York")
    for at, local, note in [
        (datetime(2026, 3, 8, 7, tzinfo=UTC), "2026-03-08T03:00:00-04:00", "dst_gap_shifted"),
        (datetime(2026, 3, 9, 6, 30, 1, 250_000, UTC), "2026-03-09T02:30:01.250-04:00", ""),
    ]:
        entry = response.fire_times.add(local=local, note=note)
        entry.utc.FromDatetime(at)
    skipped = response.skipped.add(local="2026-03-08T02:30:00", note="dst_gap_skipped")
    skipped.utc.FromDatetime(datetime(2026, 3, 8, 7, tzinfo=UTC))
    return response


def test_human_preview_is_one_line_per_fire_time() -> None:
    lines = format_preview(_response()).splitlines()
    assert lines[0] == "2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00  dst_gap_shifted"
    assert lines[1] == "2026-03-09T06:30:01.250Z  2026-03-09T02:30:01.250-04:00"
    assert lines[3] == "skipped by DST (never fire):"
    assert lines[4] == "2026-03-08T07:00:00Z  2026-03-08T02:30:00  dst_gap_skipped"
    text = format_preview(scheduler_service_pb2.PreviewScheduleResponse(), dry_run_jitter="5m")
    assert text.startswith("(no fire times)") and "[0, 5m)" in text


def test_json_preview_holds_utc_iso_under_fire_times() -> None:
    data = message_to_json(_response())
    assert [f["utc"] for f in data["fire_times"]] == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:01.250Z",
    ]
    assert data["fire_times"][0] == {
        "utc": "2026-03-08T07:00:00Z",
        "local": "2026-03-08T03:00:00-04:00",
        "note": "dst_gap_shifted",
    }
    assert data["skipped"][0]["note"] == "dst_gap_skipped"
    assert data["timezone"] == "America/New_York"


def test_create_with_spec_and_policy_options() -> None:
    args = parse_args(
        [
            "schedule", "create", "--name", "n", "--handler", "echo", "--cron", "0 0 * * *",
            "--tz", "Europe/Berlin", "--jitter", "10m", "--start", "2026-06-01T00:00:00Z",
            "--end", "2026-07-01T00:00:00Z", "--max-runs", "5", "--dst-gap", "SKIP",
            "--dst-overlap", "both", "--overlap", "buffer-one", "--misfire", "FIRE_ALL",
            "--catch-up-window", "20m", "--max-catch-up", "4",
        ]
    )  # fmt: skip
    schedule = build_create_request(CreateArgs.from_namespace(args)).schedule
    spec = schedule.spec
    assert spec.jitter.ToTimedelta() == timedelta(minutes=10)
    assert spec.start_time.ToJsonString() == "2026-06-01T00:00:00Z"
    assert spec.end_time.ToJsonString() == "2026-07-01T00:00:00Z"
    assert spec.max_runs == 5
    assert spec.cron.dst.gap == schedule_pb2.DST_GAP_POLICY_SKIP
    assert spec.cron.dst.overlap == schedule_pb2.DST_OVERLAP_POLICY_BOTH
    p = schedule.policies
    assert p.overlap == schedule_pb2.OVERLAP_POLICY_BUFFER_ONE
    assert p.misfire == schedule_pb2.MISFIRE_POLICY_FIRE_ALL
    assert p.catch_up_window.ToTimedelta() == timedelta(minutes=20)
    assert p.max_catch_up == 4


def test_create_without_options_leaves_them_unset() -> None:
    args = parse_args(["schedule", "create", "--name", "n", "--handler", "h", "--every", "5s"])
    schedule = build_create_request(CreateArgs.from_namespace(args)).schedule
    assert not schedule.HasField("policies")
    assert schedule.spec.max_runs == 0 and not schedule.spec.HasField("jitter")


def test_dst_options_need_cron(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "schedule",
            "create",
            "--name",
            "n",
            "--handler",
            "h",
            "--every",
            "5s",
            "--dst-gap",
            "SKIP",
        ]
    )
    assert code == 2
    assert "argument --dst-gap: applies only to --cron" in capsys.readouterr().err


def test_resume_misfire_override_parses() -> None:
    args = parse_args(["schedule", "resume", "nightly", "--misfire", "fire_once"])
    assert args.misfire == "FIRE_ONCE"
    assert parse_args(["schedule", "resume", "nightly"]).misfire is None


def test_schedule_block_shows_spec_options_and_policies() -> None:
    schedule = schedule_pb2.Schedule(id="x", handler="echo")
    schedule.spec.cron.expression = "0 0 * * *"
    schedule.spec.cron.dst.gap = schedule_pb2.DST_GAP_POLICY_SKIP
    schedule.spec.jitter.FromTimedelta(timedelta(minutes=10))
    schedule.spec.max_runs = 3
    schedule.policies.overlap = schedule_pb2.OVERLAP_POLICY_ALLOW
    schedule.policies.misfire = schedule_pb2.MISFIRE_POLICY_SKIP
    schedule.policies.catch_up_window.FromTimedelta(timedelta(hours=1))
    schedule.policies.max_catch_up = 100
    lines = dict(line.split(None, 1) for line in format_schedule(schedule).splitlines())
    assert lines["dst"] == "gap SKIP, overlap default"
    assert lines["jitter"] == "10m"
    assert lines["max_runs"] == "3"
    assert lines["overlap"] == "ALLOW"
    assert lines["misfire"] == "SKIP (catch-up window 1h, at most 100)"
