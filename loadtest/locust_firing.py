"""Locust at a firing rate: registers the schedules through the public API, then reports every
handler start as a Locust event whose response time is the fire lag (handler start -
scheduled_for), read from the handlers' own record (``loadtest/tally.py``).

The stack runs apart (see loadtest/README.md): an api, dispatcher(s) and worker(s) started
with ``--import loadtest.tally`` and ``CRONSCALE_LOADTEST_TALLY`` pointing at the folder this
file reads (``--tally-dir``)::

    locust -f loadtest/locust_firing.py --headless -u 1 -r 1 -t 10m \\
        --host 127.0.0.1:50051 --rate 100000 --tally-dir /tmp/cronscale-tally

``--rate`` schedules on ``* * * * *`` with a 60 s jitter window: ``--rate`` firings a minute,
spread evenly. They are created with BatchCreateSchedules (ids ``locust-<run>-<n>``) when the
test starts; the Locust statistics then show "fire lag" (one entry per handler start, lag as
response time: its percentiles are the fire-lag percentiles) beside the API calls.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import gevent
from locust import User, between, events, task
from locust.env import Environment

from cronscale.v1 import schedule_pb2, scheduler_service_pb2, scheduler_service_pb2_grpc
from loadtest.locustfile import timed_call
from loadtest.tally import parse_line
from scheduler.credentials import authed_channel
from scheduler.model import parse_run_id

BATCH = 500


def _options(parser: Any) -> None:
    parser.add_argument("--rate", type=int, default=100_000, help="firings per minute")
    parser.add_argument(
        "--tally-dir", default="/tmp/cronscale-tally", help="the workers' CRONSCALE_LOADTEST_TALLY"
    )


def _register(host: str, rate: int, run: str) -> None:
    spec = schedule_pb2.ScheduleSpec(cron=schedule_pb2.CronSpec(expression="* * * * *"))
    spec.jitter.FromSeconds(60)
    with authed_channel(host) as channel:
        api = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        for start in range(0, rate, BATCH):
            items = [
                scheduler_service_pb2.CreateScheduleRequest(
                    schedule_id=f"locust-{run}-{n}",
                    schedule=schedule_pb2.Schedule(
                        name="locust", handler="loadtest.tally", spec=spec
                    ),
                )
                for n in range(start, min(rate, start + BATCH))
            ]
            timed_call(
                "BatchCreateSchedules",
                functools.partial(
                    api.BatchCreateSchedules,
                    scheduler_service_pb2.BatchCreateSchedulesRequest(items=items),
                    timeout=60,
                ),
            )


def _follow_tallies(folder: Path, prefix: str) -> None:
    """Reports each new execution line of our schedules as a "fire lag" event, forever."""
    offsets: dict[Path, int] = {}
    while True:
        for path in sorted(folder.glob("tally-*.log")):
            with path.open() as f:
                f.seek(offsets.get(path, 0))
                lines = f.readlines()
                offsets[path] = f.tell()
            for line in lines:
                e = parse_line(line)
                if e is None or not e.run_id.startswith(prefix):
                    continue
                lag = e.started - parse_run_id(e.run_id).scheduled_for.timestamp()
                events.request.fire(  # type: ignore[no-untyped-call]
                    request_type="handler",
                    name="fire lag",
                    response_time=max(lag, 0.0) * 1000,
                    response_length=0,
                    exception=None,
                )
        gevent.sleep(0.5)


def _start(environment: Environment, **_kwargs: Any) -> None:
    options = environment.parsed_options
    assert options is not None
    run = uuid.uuid4().hex[:6]
    host = environment.host or "127.0.0.1:50051"
    folder = Path(options.tally_dir)
    folder.mkdir(parents=True, exist_ok=True)
    gevent.spawn(_register, host, options.rate, run)
    gevent.spawn(_follow_tallies, folder, f"locust-{run}-")


events.init_command_line_parser.add_listener(_options)  # type: ignore[no-untyped-call]
events.test_start.add_listener(_start)  # type: ignore[no-untyped-call]


class Observer(User):
    """Reads one of the registered schedules now and then: the load is the firing itself."""

    wait_time = between(1, 2)

    @task
    def get(self) -> None:
        with authed_channel(self.host or "127.0.0.1:50051") as channel:
            api = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
            timed_call(
                "ListSchedules",
                lambda: api.ListSchedules(
                    scheduler_service_pb2.ListSchedulesRequest(page_size=1), timeout=10
                ),
            )
