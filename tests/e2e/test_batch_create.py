"""BatchCreateSchedules and `cronscale schedule import`: per-item validation and errors,
nothing written for a refused item, a retried batch is safe, created schedules fire."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import SUCCEEDED, cron_spec, get_schedule, refusal, wait_for_runs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _item(
    schedule_id: str = "", cron: str = "* * * * * *"
) -> scheduler_service_pb2.CreateScheduleRequest:
    return scheduler_service_pb2.CreateScheduleRequest(
        schedule=schedule_pb2.Schedule(name="batch", handler="e2e.record", spec=cron_spec(cron)),
        schedule_id=schedule_id,
    )


def test_batch_create_validates_each_item_and_is_safe_to_retry(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:8]
    chosen, bad = f"batch-{tag}", f"batch-bad-{tag}"
    request = scheduler_service_pb2.BatchCreateSchedulesRequest(
        items=[_item(chosen), _item(), _item(bad, cron="61 * * * *"), _item(cron="0 0 1 1 *")]
    )
    first = stack.api.BatchCreateSchedules(request, timeout=30).results
    assert [r.error_code for r in first] == ["", "", "INVALID_ARGUMENT", ""]
    assert first[2].error.startswith("items[2].schedule.spec.cron.expression:"), first[2].error
    assert not first[2].HasField("schedule")
    assert refusal(lambda: get_schedule(stack, bad)).code == grpc.StatusCode.NOT_FOUND
    assert first[0].schedule.id == chosen and not first[0].already_existed
    assert get_schedule(stack, first[1].schedule.id).name == "batch"

    again = stack.api.BatchCreateSchedules(request, timeout=30).results
    assert again[0].already_existed and again[0].schedule.id == chosen
    assert again[0].schedule.create_time == first[0].schedule.create_time

    wait_for_runs(stack, chosen, lambda rs: any(r.status == SUCCEEDED for r in rs), timeout=15)


def test_batch_create_refuses_too_many_items_and_dependencies(stack: Stack) -> None:
    too_many = scheduler_service_pb2.BatchCreateSchedulesRequest(items=[_item()] * 1001)
    err = refusal(lambda: stack.api.BatchCreateSchedules(too_many, timeout=30))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "at most 1000" in err.details
    dependent = _item()
    dependent.schedule.after.append("someone")
    [result] = stack.api.BatchCreateSchedules(
        scheduler_service_pb2.BatchCreateSchedulesRequest(items=[dependent]), timeout=30
    ).results
    assert result.error_code == "INVALID_ARGUMENT"
    assert result.error.startswith("items[0].schedule.after:")


def test_cli_import_reports_progress_and_refused_lines(stack: Stack, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    good = {
        "schedule_id": f"imported-{tag}",
        "schedule": {
            "name": "n",
            "handler": "e2e.record",
            "spec": {"cron": {"expression": "0 0 * * *"}},
        },
    }
    refused = {
        "schedule": {"name": "n", "handler": "", "spec": {"cron": {"expression": "0 0 * * *"}}}
    }
    path = tmp_path / "schedules.jsonl"
    # A blank line is skipped; refused lines are named by their line in the file.
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(refused) + "\n")
    out = stack.cli("schedule", "import", str(path))
    assert out.returncode == 1, out
    assert "line 3: INVALID_ARGUMENT: items[1].schedule.handler: is required" in out.stderr
    assert "1 created, 0 already existed, 1 refused" in out.stdout
    assert get_schedule(stack, f"imported-{tag}").name == "n"

    path.write_text(json.dumps(good) + "\n")
    out = stack.cli("schedule", "import", str(path), "--json")
    assert out.returncode == 0, out
    assert json.loads(out.stdout)["already_existed"] == 1

    path.write_text("{not json\n")
    out = stack.cli("schedule", "import", str(path))
    assert out.returncode != 0 and f"{path}:1:" in out.stderr

    # A line that does not parse stops the import before any line is sent, even the good
    # lines of earlier batches.
    lines = [dict(good, schedule_id=f"unsent-{tag}-{i}") for i in range(600)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"schedule": 1}\n')
    out = stack.cli("schedule", "import", str(path))
    assert out.returncode != 0 and f"{path}:601:" in out.stderr, out
    with pytest.raises(grpc.RpcError) as e:
        get_schedule(stack, f"unsent-{tag}-0")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
