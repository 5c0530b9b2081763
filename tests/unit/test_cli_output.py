"""Rendering API messages: ``--json`` conventions and the human tables."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.cli.output import (
    dumps,
    enum_name,
    enum_prefix,
    format_run,
    format_run_line,
    format_runs_table,
    format_schedule,
    format_schedules_table,
    format_time,
    format_timedelta,
    message_to_json,
)


def _ts(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


T0 = datetime(2026, 12, 2, 15, 0, 5, tzinfo=UTC)


def _schedule(**overrides: object) -> schedule_pb2.Schedule:
    schedule = schedule_pb2.Schedule(
        id="demo-every-5s",
        tenant="default",
        name="demo",
        handler="echo",
        payload=b'{"hello": "cronscale"}',
        state=schedule_pb2.SCHEDULE_STATE_ACTIVE,
        version=3,
        create_time=_ts(T0),
        next_fire_time=_ts(T0 + timedelta(seconds=5)),
    )
    schedule.spec.cron.expression = "*/5 * * * * *"
    schedule.spec.cron.timezone = "UTC"
    for key, value in overrides.items():
        setattr(schedule, key, value)
    return schedule


def _run(**overrides: object) -> schedule_pb2.Run:
    run = schedule_pb2.Run(
        run_id="r-1",
        schedule_id="demo-every-5s",
        status=schedule_pb2.RUN_STATUS_SUCCEEDED,
        scheduled_for=_ts(T0),
        start_time=_ts(T0 + timedelta(milliseconds=142)),
        finish_time=_ts(T0 + timedelta(milliseconds=150)),
        attempt=1,
        handler="echo",
        worker_id="w-1",
        tenant="default",
    )
    for key, value in overrides.items():
        setattr(run, key, value)
    return run


def test_schedule_json_uses_proto_names_bare_enums_and_decoded_payload() -> None:
    data = message_to_json(_schedule())
    assert data["id"] == "demo-every-5s"
    assert data["state"] == "ACTIVE"
    assert data["payload"] == {"hello": "cronscale"}
    assert data["version"] == 3  # int64 as a JSON number
    assert data["spec"] == {
        "cron": {"expression": "*/5 * * * * *", "timezone": "UTC"},
        "max_runs": 0,
    }
    assert data["create_time"] == "2026-12-02T15:00:05Z"
    assert data["next_fire_time"] == "2026-12-02T15:00:10Z"
    # Fields without presence are printed even when default; unset messages are not.
    assert data["pause_note"] == "" and data["paused_by"] == ""
    assert "pause_time" not in data
    assert "update_time" not in data


def test_default_enum_and_unknown_enum_values() -> None:
    assert message_to_json(schedule_pb2.Schedule())["state"] == "UNSPECIFIED"
    assert message_to_json(schedule_pb2.Run(status=99))["status"] == "99"  # type: ignore[arg-type]


def test_run_json() -> None:
    data = message_to_json(_run(manual=True))
    assert data["run_id"] == "r-1"
    assert data["status"] == "SUCCEEDED"
    assert data["scheduled_for"] == "2026-12-02T15:00:05Z"
    assert data["start_time"] == "2026-12-02T15:00:05.142Z"
    assert data["attempt"] == 1
    assert data["manual"] is True
    assert data["error"] == ""


def test_dead_lettered_and_cancelled_strip_only_their_own_prefix() -> None:
    dead = message_to_json(_run(status=schedule_pb2.RUN_STATUS_DEAD_LETTERED))
    assert dead["status"] == "DEAD_LETTERED"
    cancelled = message_to_json(_schedule(state=schedule_pb2.SCHEDULE_STATE_CANCELLED))
    assert cancelled["state"] == "CANCELLED"


def test_enum_prefix_comes_from_the_descriptor() -> None:
    assert enum_prefix(schedule_pb2.ScheduleState.DESCRIPTOR) == "SCHEDULE_STATE_"
    assert enum_prefix(schedule_pb2.RunStatus.DESCRIPTOR) == "RUN_STATUS_"
    assert enum_name(schedule_pb2.RunStatus.DESCRIPTOR, 3) == "SUCCEEDED"


def test_payload_that_is_not_json_is_base64() -> None:
    raw = b"\xff\x00binary"
    data = message_to_json(_schedule(payload=raw))
    assert data["payload"] == base64.b64encode(raw).decode()
    text = message_to_json(_schedule(payload=b"not json"))
    assert text["payload"] == base64.b64encode(b"not json").decode()
    assert message_to_json(_schedule(payload=b"[1, 2]"))["payload"] == [1, 2]


def test_strings_that_look_like_enums_are_left_alone() -> None:
    data = message_to_json(_schedule(name="SCHEDULE_STATE_ACTIVE", pause_note="RUN_STATUS_X"))
    assert data["name"] == "SCHEDULE_STATE_ACTIVE"
    assert data["pause_note"] == "RUN_STATUS_X"


def test_list_responses_render_nested_messages() -> None:
    response = scheduler_service_pb2.ListRunsResponse(
        runs=[_run(), _run(run_id="r-2", status=schedule_pb2.RUN_STATUS_FAILED, error="boom")],
        next_page_token="next",
    )
    data = message_to_json(response)
    assert [r["status"] for r in data["runs"]] == ["SUCCEEDED", "FAILED"]
    assert data["next_page_token"] == "next"
    schedules = message_to_json(
        scheduler_service_pb2.ListSchedulesResponse(schedules=[_schedule()])
    )
    assert schedules["schedules"][0]["payload"] == {"hello": "cronscale"}
    assert schedules["next_page_token"] == ""


def test_interval_and_once_specs_in_json() -> None:
    schedule = schedule_pb2.Schedule()
    schedule.spec.interval.every.FromTimedelta(timedelta(minutes=90))
    assert message_to_json(schedule)["spec"] == {"interval": {"every": "5400s"}, "max_runs": 0}
    once = schedule_pb2.Schedule()
    once.spec.once.at.FromDatetime(T0)
    assert message_to_json(once)["spec"] == {"once": {"at": "2026-12-02T15:00:05Z"}, "max_runs": 0}


def test_dumps_is_valid_json_keeping_unicode() -> None:
    text = dumps(message_to_json(_schedule(payload='{"g": "grüß"}'.encode())))
    assert "grüß" in text
    assert json.loads(text)["payload"] == {"g": "grüß"}


def test_human_schedule_block() -> None:
    text = format_schedule(_schedule())
    lines = dict(line.split(None, 1) for line in text.splitlines())
    assert lines["id"] == "demo-every-5s"
    assert lines["state"] == "ACTIVE"
    assert lines["spec"] == "cron '*/5 * * * * *' (UTC)"
    assert lines["next_fire_time"] == "2026-12-02T15:00:10Z"
    assert lines["payload"] == '{"hello": "cronscale"}'
    assert lines["update_time"] == "-"
    assert "pause_note" not in lines
    paused = format_schedule(
        _schedule(state=schedule_pb2.SCHEDULE_STATE_PAUSED, pause_note="deploy", paused_by="ops")
    )
    assert "pause_note      deploy" in paused
    assert "base64:" in format_schedule(_schedule(payload=b"\xff"))


def test_human_tables() -> None:
    table = format_schedules_table([_schedule(), _schedule(id="b", name="")])
    header, first, second = table.splitlines()
    assert header.split() == ["ID", "NAME", "HANDLER", "STATE", "SPEC", "NEXT", "FIRE", "(UTC)"]
    assert first.startswith("demo-every-5s  demo ")
    assert "2026-12-02T15:00:10Z" in first
    assert second.split()[1] == "-"  # empty cells show a dash
    runs = format_runs_table([_run(), _run(run_id="r-2", status=4, error="boom\nline 2")])
    assert "0.142s" in runs.splitlines()[1]
    assert runs.splitlines()[2].endswith("boom line 2")
    assert format_schedules_table([]).startswith("ID")


def test_human_run_block() -> None:
    text = format_run(_run(status=schedule_pb2.RUN_STATUS_SKIPPED, skip_reason="overlap"))
    assert "status         SKIPPED" in text
    assert "skip_reason    overlap" in text
    assert "start_lag      0.142s" in text


def test_dev_run_line() -> None:
    assert format_run_line(_run()) == (
        "2026-12-02T15:00:05Z  lag  0.142s  echo  SUCCEEDED  run r-1"
    )
    skipped = _run(status=schedule_pb2.RUN_STATUS_SKIPPED, skip_reason="previous run active")
    skipped.ClearField("start_time")
    assert format_run_line(skipped) == (
        "2026-12-02T15:00:05Z  lag       -  echo  SKIPPED  run r-1  (previous run active)"
    )


def test_time_and_duration_formats() -> None:
    assert format_time(None) == "-"
    assert format_time(Timestamp()) == "-"
    assert format_time(_ts(T0 + timedelta(microseconds=1500))) == "2026-12-02T15:00:05.001Z"
    assert format_timedelta(timedelta(hours=1, minutes=30)) == "1h30m"
    assert format_timedelta(timedelta(seconds=1.5)) == "1.5s"
    assert format_timedelta(timedelta(days=1, seconds=4)) == "1d4s"
    assert format_timedelta(timedelta(0)) == "-"
