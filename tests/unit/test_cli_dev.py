"""The pure parts of ``cronscale dev`` and of process logging (no processes started)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2
from scheduler.cli.dev import (
    DEMO_ID,
    DevOptions,
    LineFilter,
    RunReporter,
    child_argv,
    child_env,
    demo_create_request,
)
from scheduler.cli.logs import LEVEL_PREFIX, JsonFormatter, TextFormatter
from scheduler.cli.processes import ENV_PARENT_PID
from scheduler.credentials import DevKeys

OPTIONS = DevOptions(
    api="127.0.0.1:50099", log_dir=Path("/tmp/logs"), worker_args=("--import", "m")
)
T0 = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)


def _run(run_id: str, seconds: int, status: int, attempt: int = 1) -> schedule_pb2.Run:
    ts = Timestamp()
    ts.FromDatetime(T0 + timedelta(seconds=seconds))
    start = Timestamp()
    start.FromDatetime(T0 + timedelta(seconds=seconds, milliseconds=20))
    return schedule_pb2.Run(
        run_id=run_id,
        status=status,  # type: ignore[arg-type]
        scheduled_for=ts,
        start_time=start,
        attempt=attempt,
        handler="echo",
    )


SUCCEEDED = schedule_pb2.RUN_STATUS_SUCCEEDED
RUNNING = schedule_pb2.RUN_STATUS_RUNNING
FAILED = schedule_pb2.RUN_STATUS_FAILED


def test_children_run_this_interpreter() -> None:
    assert child_argv("api", OPTIONS) == [
        sys.executable, "-m", "scheduler.cli", "api", "--log-level", "INFO"
    ]  # fmt: skip
    assert child_argv("worker", OPTIONS)[-2:] == ["--import", "m"]
    assert "--import" not in child_argv("dispatcher", OPTIONS)


def test_child_env_points_at_the_api() -> None:
    env = child_env(OPTIONS, {"PATH": "/bin", "CRONSCALE_API": "elsewhere:1"}, parent_pid=42)
    assert env["CRONSCALE_API"] == "127.0.0.1:50099"
    assert env["CRONSCALE_API_LISTEN"] == "127.0.0.1:50099"
    assert env["PATH"] == "/bin"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env[ENV_PARENT_PID] == "42"
    kept = child_env(OPTIONS, {"CRONSCALE_API_LISTEN": "0.0.0.0:50099"}, parent_pid=1)
    assert kept["CRONSCALE_API_LISTEN"] == "0.0.0.0:50099"


def test_demo_request() -> None:
    request = demo_create_request()
    assert request.schedule_id == DEMO_ID == "demo-every-5s"
    assert request.schedule.handler == "echo"
    assert request.schedule.spec.cron.expression == "*/5 * * * * *"
    assert request.schedule.spec.cron.timezone == "UTC"
    assert json.loads(request.schedule.payload) == {"hello": "cronscale"}


def test_run_reporter_primes_then_prints_each_finished_run_once() -> None:
    reporter = RunReporter()
    # Runs already finished when dev starts are not printed again.
    assert reporter.new_lines([_run("old", 0, SUCCEEDED)]) == []
    # Newest first, as ListRuns returns them; printed oldest first; RUNNING waits.
    page = [_run("c", 15, RUNNING), _run("b", 10, SUCCEEDED), _run("a", 5, SUCCEEDED),
            _run("old", 0, SUCCEEDED)]  # fmt: skip
    lines = reporter.new_lines(page)
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["a", "b"]
    assert lines[0] == "2026-12-02T15:00:05Z  lag  0.020s  echo  SUCCEEDED  run a"
    assert reporter.new_lines(page) == []
    page[0] = _run("c", 15, SUCCEEDED)
    assert [line.rsplit(" ", 1)[1] for line in reporter.new_lines(page)] == ["c"]


def test_run_reporter_prints_a_retry_again() -> None:
    reporter = RunReporter()
    reporter.new_lines([])
    assert len(reporter.new_lines([_run("a", 5, FAILED, attempt=1)])) == 1
    assert len(reporter.new_lines([_run("a", 5, SUCCEEDED, attempt=2)])) == 1
    assert reporter.new_lines([_run("a", 5, SUCCEEDED, attempt=2)]) == []


def _line(level: str, message: str = "m", logger: str = "some.logger") -> str:
    return f"2026-12-02T15:00:00.123Z {level} {logger}: {message}"


def test_line_filter_startup_then_warnings_only() -> None:
    f = LineFilter(Path("/tmp/api.log"))
    assert f.lines_to_show(_line("INFO"), everything=True, now=0.0) == [_line("INFO")]
    assert f.lines_to_show("a stray print", everything=True, now=0.0) == ["a stray print"]
    assert f.lines_to_show(_line("INFO", logger="b"), everything=False, now=1.0) == []
    assert f.lines_to_show("  continuation of an INFO record", everything=False, now=1.0) == []
    assert f.lines_to_show(_line("DEBUG", logger="b"), everything=False, now=1.0) == []
    warning = _line("WARNING", logger="b")
    assert f.lines_to_show(warning, everything=False, now=1.0) == [warning]
    error = _line("ERROR", "boom", logger="c")
    assert f.lines_to_show(error, everything=False, now=1.0) == [error]
    # A traceback follows the record it belongs to.
    traceback = "Traceback (most recent call last):"
    assert f.lines_to_show(traceback, everything=False, now=1.0) == [traceback]


def test_line_filter_limits_bursts_per_logger() -> None:
    f = LineFilter(Path("/tmp/dispatcher.log"), burst=2, window_s=10.0)
    claimed = [_line("INFO", f"claimed shard {i}", logger="bucketer.ownership") for i in range(5)]
    shown = [f.lines_to_show(line, everything=True, now=0.5) for line in claimed]
    assert shown[:2] == [[claimed[0]], [claimed[1]]]
    assert shown[2] == [
        "... more bucketer.ownership lines in the next 10 s: see /tmp/dispatcher.log"
    ]
    assert shown[3:] == [[], []]
    # Other loggers keep their own budget; a new window starts afresh.
    other = _line("INFO", logger="scheduler.api.server")
    assert f.lines_to_show(other, everything=True, now=0.6) == [other]
    assert f.lines_to_show(claimed[4], everything=True, now=11.0) == [claimed[4]]


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "scheduler.api", logging.WARNING, __file__, 1, "slow %s", ("x",), None
    )
    record.created = T0.timestamp() + 0.5
    record.msecs = 500.0
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_text_log_format_is_what_dev_parses() -> None:
    line = TextFormatter().format(_record(run_id="r-1", schedule_id="s-1"))
    assert line == (
        "2026-12-02T15:00:00.500Z WARNING scheduler.api: slow x run_id=r-1 schedule_id=s-1"
    )
    match = LEVEL_PREFIX.match(line)
    assert match is not None
    assert (match.group("level"), match.group("logger")) == ("WARNING", "scheduler.api")


def test_json_log_format() -> None:
    data = json.loads(JsonFormatter().format(_record(tenant="t")))
    assert data == {
        "time": "2026-12-02T15:00:00.500Z",
        "level": "WARNING",
        "logger": "scheduler.api",
        "message": "slow x",
        "tenant": "t",
    }


def test_child_env_carries_the_dev_keys_unless_set() -> None:
    keys = DevKeys(admin="csk_admin", worker="csk_worker")
    env = child_env(OPTIONS, {}, parent_pid=1, keys=keys)
    assert env["CRONSCALE_BOOTSTRAP_ADMIN_KEY"] == "csk_admin"
    assert env["CRONSCALE_BOOTSTRAP_WORKER_KEY"] == "csk_worker"
    assert env["CRONSCALE_API_TOKEN"] == "csk_worker"
    mine = child_env(OPTIONS, {"CRONSCALE_API_TOKEN": "csk_mine"}, parent_pid=1, keys=keys)
    assert mine["CRONSCALE_API_TOKEN"] == "csk_mine"
