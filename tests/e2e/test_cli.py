"""The CLI against the real API: --json output and errors."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_cli_create_get_runs_pause_delete(stack: Stack) -> None:
    api = ["--api", stack.config.api_target]
    out = stack.cli(
        "schedule",
        "create",
        *api,
        "--name",
        "cli",
        "--handler",
        "echo",
        "--cron",
        "* * * * * *",
        "--tz",
        "Asia/Kolkata",
        "--payload",
        '{"from": "cli"}',
        "--json",
        check=True,
    )
    created = json.loads(out.stdout)
    sid = created["id"]
    assert created["state"] == "ACTIVE" and created["handler"] == "echo"
    got = json.loads(stack.cli("schedule", "get", sid, *api, "--json", check=True).stdout)
    assert got["spec"]["cron"]["timezone"] == "Asia/Kolkata"
    deadline = time.monotonic() + 10
    runs: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        runs = json.loads(stack.cli("schedule", "runs", sid, *api, "--json", check=True).stdout)[
            "runs"
        ]
        if any(r["status"] == "SUCCEEDED" for r in runs):
            break
        time.sleep(0.5)
    assert any(r["status"] == "SUCCEEDED" for r in runs), runs
    assert all(str(r["run_id"]).startswith(sid + "@") for r in runs)
    paused = json.loads(
        stack.cli("schedule", "pause", sid, *api, "--note", "cli test", "--json", check=True).stdout
    )
    assert paused["state"] == "PAUSED" and paused["pause_note"] == "cli test"
    stack.cli("schedule", "delete", sid, *api, check=True)
    missing = stack.cli("schedule", "get", sid, *api)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_cli_reports_invalid_argument(stack: Stack) -> None:
    bad = stack.cli(
        "schedule",
        "create",
        "--api",
        stack.config.api_target,
        "--name",
        "bad",
        "--handler",
        "echo",
        "--cron",
        "0 25 * * *",
    )
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT" in bad.stderr and "schedule.spec.cron.expression" in bad.stderr
