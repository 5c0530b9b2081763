"""Previews of rare specs are bounded and do not hold up the API's event loop."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from cronscale.v1 import run_reporting_service_pb2_grpc as rr_grpc
from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from scheduler.credentials import authed_channel
from tests.e2e.conftest import Stack
from tests.e2e.support import create_schedule, cron_spec, ts


def test_a_rare_spec_preview_is_bounded_and_reporting_stays_responsive(stack: Stack) -> None:
    s = create_schedule(stack, name="beat", handler="echo", spec=cron_spec("0 0 1 1 *", "UTC"))
    run = stack.api.TriggerSchedule(
        scheduler_service_pb2.TriggerScheduleRequest(id=s.id, force=True), timeout=10
    )
    beat = rr_pb2.RunEvent(
        kind=rr_pb2.RUN_EVENT_KIND_HEARTBEAT,
        run_id=run.run_id,
        schedule_id=s.id,
        scheduled_for=run.scheduled_for,
        attempt=1,
        worker_id="preview-test",
        event_time=ts(datetime.now(UTC)),
    )
    answers: list[scheduler_service_pb2.PreviewScheduleResponse] = []

    def rare(spec: schedule_pb2.ScheduleSpec) -> None:
        answers.append(
            stack.api.PreviewSchedule(
                scheduler_service_pb2.PreviewScheduleRequest(spec=spec, count=1000), timeout=60
            )
        )

    specs = [
        cron_spec("0 0 29 2 *", "UTC"),
        # A DST gap SKIP in New York: 02:30 does not exist on spring-forward days.
        schedule_pb2.ScheduleSpec(
            cron=schedule_pb2.CronSpec(
                expression="30 2 * * *",
                timezone="America/New_York",
                dst=schedule_pb2.DstPolicy(gap=schedule_pb2.DST_GAP_POLICY_SKIP),
            )
        ),
    ]
    threads = [threading.Thread(target=rare, args=(spec,)) for spec in specs]
    with authed_channel(stack.config.api_target, stack.worker_key) as channel:
        reports = rr_grpc.RunReportingServiceStub(channel)
        reports.HeartbeatRun(beat, timeout=10)  # warm the channel
        for t in threads:
            t.start()
        slowest = 0.0
        while any(t.is_alive() for t in threads):
            started = time.monotonic()
            reports.HeartbeatRun(beat, timeout=10)
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.02)
        for t in threads:
            t.join()
    assert slowest < 0.5, f"a heartbeat took {slowest:.2f} s during the previews"
    by_count = sorted(answers, key=lambda a: len(a.fire_times))
    leap = by_count[0]
    # Every 29 February before 2200-01-01, the last instant a spec may name; not 1000.
    assert 40 <= len(leap.fire_times) < 1000
    assert all(f.utc.ToDatetime(tzinfo=UTC).year < 2200 for f in leap.fire_times)
    assert len(by_count[1].fire_times) == 1000 and by_count[1].skipped
