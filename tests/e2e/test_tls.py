"""TLS end to end: the API serving a self-signed certificate made here; the CLI and the
worker's reporter verify it (and refuse an API they cannot verify)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from cronscale.v1 import scheduler_service_pb2
from tests.e2e.conftest import Stack, _free_port
from tests.e2e.support import create_schedule, cron_spec, ts
from tests.tls import self_signed
from worker.reporter import RunReporter


def test_the_api_serves_tls_and_clients_verify_it(stack: Stack, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "api")
    other, _ = self_signed(tmp_path, "other")
    target = f"127.0.0.1:{_free_port()}"
    saved = dict(stack.env)
    stack.env.update(
        {
            "CRONSCALE_API_LISTEN": target,
            "CRONSCALE_API": target,
            "CRONSCALE_TLS_CERT_FILE": str(cert),
            "CRONSCALE_TLS_KEY_FILE": str(key),
        }
    )
    try:
        stack.start("api-tls", "api")
    finally:
        stack.env.clear()
        stack.env.update(saved)
    try:
        deadline = time.monotonic() + 60
        while True:
            done = stack.cli("schedule", "list", "--api", target, "--ca-file", str(cert))
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"TLS api not answering: {done.stderr}\n{stack.tail('api-tls')}")
            time.sleep(0.5)
        plain = stack.cli("schedule", "list", "--api", target)
        assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr, plain.stderr
        wrong = stack.cli("schedule", "list", "--api", target, "--ca-file", str(other))
        assert wrong.returncode == 1 and "UNAVAILABLE" in wrong.stderr, wrong.stderr

        s = create_schedule(stack, name="tls", handler="echo", spec=cron_spec("0 0 1 1 *", "UTC"))
        run = stack.api.TriggerSchedule(
            scheduler_service_pb2.TriggerScheduleRequest(id=s.id, force=True), timeout=10
        )
        event = rr_pb2.RunEvent(
            kind=rr_pb2.RUN_EVENT_KIND_HEARTBEAT,
            run_id=run.run_id,
            schedule_id=s.id,
            scheduled_for=run.scheduled_for,
            attempt=1,
            worker_id="tls-test",
            event_time=ts(datetime.now(UTC)),
        )

        async def report(ca: bytes) -> rr_pb2.RunEventAck:
            reporter = RunReporter(
                target,
                token=stack.worker_key,
                root_certificates=ca,
                call_timeout=3,
            )
            async with reporter:
                return await asyncio.wait_for(reporter.report(event), 10)

        ack = asyncio.run(report(cert.read_bytes()))
        assert ack.run_id == run.run_id
        with pytest.raises(TimeoutError):
            asyncio.run(report(other.read_bytes()))  # never verified: the reporter keeps retrying
    finally:
        stack.kill("api-tls", 15)
