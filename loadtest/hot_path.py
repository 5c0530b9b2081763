"""The Python of the firing path's busiest steps, timed in this process (microbenchmarks).

    python -m loadtest.hot_path --events 1000 --messages 20000

The firing benchmark (``loadtest.firing``) measures every process together, and this box's
slow and quiet spells move its figures by 10-30 %: more than a change of a few microseconds a
firing. These steps are timed alone, with the process CPU clock, against the local stack
(``cronscale local up``), in a keyspace and a topic of their own, dropped at the end:

- ``report``: the api's Python for ``--events`` worker reports (a short run's merged
  STARTED+SUCCEEDED, its next fire timer named): decoding each (``event_from_proto``), building
  its run row and the done note on its schedule's next fire timer, and binding both;
- ``plan``: the dispatcher's Python for a firing batch of ``--events`` fire timers decided from
  its schedule cache (every-minute cron schedules with a 60 s jitter, the firing benchmark's):
  decoding each timer (``FireTimer.from_timer``), planning its slot (``plan_fire``: the run,
  its next fire timer carrying the run in progress), and building the run row, the next timer's
  row and the run message (not binding them: that is the next step's);
- ``grouped write``: the dispatcher's grouped write of a firing batch of ``--events`` ENQUEUED
  run rows and next fire timers, bound and batched (``bucketer.cql.grouped_batches``; the
  batches are not sent, so Cassandra's share is not in it);
- ``produce``: ``KafkaRunQueue.enqueue`` of ``--messages`` run messages in slices of 170 (a
  100 ms release at 100,000 firings a minute) to a 12-partition topic, acknowledgements
  included; the first pass hashes every key, later ones find the hashes kept;
- ``run``: the worker's Python for ``--runs`` run messages, 170 every 100 ms (100,000 firings a
  minute): the consumer's dispatch of each fetched record (``KafkaRunConsumer``; the fetching
  itself, aiokafka's, is not in it), the runner calling a handler that returns at once, and the
  reporter's batches to a real api process started on this keyspace (its CPU is not in the
  figure; its acks are: the pass ends when every run's outcome is acknowledged, and the step
  checks that the api recorded every run of the last pass as ended).

Each prints the third best of ``--repeat`` passes (the others are the box's noise), in µs per
event, firing or message. Compare two commits by running this from a worktree of each,
alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from bucketer.cql import bind, grouped_batches
from bucketer.model import Timer
from cronscale.v1 import run_message_pb2
from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from loadtest.firing import _free_port
from loadtest.registration import _wait_serving
from ops.migrate import migrate
from scheduler.api.convert import event_from_proto
from scheduler.cli.processes import use_fast_event_loop
from scheduler.config import Config
from scheduler.credentials import fresh_keys_env
from scheduler.firing import FiringPlan, plan_fire
from scheduler.kafka import KafkaRunQueue, delete_topics, ensure_topics, run_message
from scheduler.model import (
    STALE_RUN,
    Run,
    RunStatus,
    Schedule,
    ScheduleSpec,
    SpecKind,
    new_generation,
    run_id_for,
)
from scheduler.reports import RunReports
from scheduler.retries import Failures
from scheduler.session import Stores, open_stores
from scheduler.slots import next_slot
from scheduler.timers import FireTimer
from worker.config import WorkerConfig
from worker.consumer import KafkaRunConsumer
from worker.handlers import HandlerContext, HandlerRegistry
from worker.reporter import RunReporter
from worker.runner import Runner
from worker.runtime import tune_gc
from worker.timestamps import set_timestamp

RELEASE = 170  # run messages in one 100 ms release at 100,000 firings a minute
RELEASE_EVERY = 0.1
API_START_TIMEOUT = 60.0
PARTITIONS = 12
RUN_HANDLER = "hot-path.returns"  # the run step's handler: returns at once


def third_best(
    step: Callable[[], object], repeat: int, clock: Callable[[], float] = time.process_time
) -> float:
    """The third best process-CPU time of ``repeat`` calls of ``step`` (the best if fewer)."""
    times = []
    for _ in range(repeat):
        t0 = clock()
        step()
        times.append(clock() - t0)
    times.sort()
    return times[2] if len(times) >= 3 else times[0]


def report_events(count: int, now: datetime) -> list[rr_pb2.RunEvent]:
    """``count`` merged STARTED+SUCCEEDED events, as a worker reports short runs."""
    events = []
    for i in range(count):
        sid = str(uuid.uuid4())
        slot = now.replace(microsecond=0) - timedelta(seconds=i % 60)
        e = rr_pb2.RunEvent(
            run_id=run_id_for(sid, slot),
            schedule_id=sid,
            attempt=1,
            worker_id="hot-path",
            kind=rr_pb2.RUN_EVENT_KIND_SUCCEEDED,
            follow_up=run_message_pb2.FOLLOW_UP_NONE,
        )
        for name, at in (
            ("scheduled_for", slot),
            ("enqueue_time", slot),
            ("next_fire_time", slot + timedelta(minutes=1)),
            ("start_time", now),
            ("event_time", now),
        ):
            set_timestamp(getattr(e, name), at)
        events.append(e)
    return events


def time_report(stores: Stores, count: int, repeat: int) -> float:
    """µs of the api's Python per reported event (see the module's docstring)."""
    now = datetime.now(UTC)
    events = report_events(count, now)
    reports = RunReports(
        schedules=stores.schedules,
        runs=stores.runs,
        timers=stores.timers,
        failures=Failures(
            schedules=stores.schedules,
            runs=stores.runs,
            timers=stores.timers,
            dead_letters=stores.dead_letters,
        ),
    )

    def step() -> None:
        records = [event_from_proto(e, i, now=now) for i, e in enumerate(events)]
        rows = stores.runs.event_rows(records, now=now) + reports.settle_rows(records, now)
        for _, statement, params in rows:
            bind(statement, params)

    return 1e6 * third_best(step, repeat) / count


def time_plan(stores: Stores, count: int, repeat: int) -> float:
    """µs of the dispatcher's Python per fire timer planned (see the module's docstring)."""
    slot = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=2)
    spec = ScheduleSpec(kind=SpecKind.CRON, cron="* * * * *", jitter=timedelta(seconds=60))
    shards = stores.timers.shard_count
    schedules, timers = [], []
    for _ in range(count):
        s = Schedule(
            schedule_id=str(uuid.uuid4()),
            handler="loadtest.tally",
            spec=spec,
            generation=new_generation(),
            create_time=slot,
            update_time=slot,
        )
        nxt = next_slot(s, slot - timedelta(minutes=1))
        if nxt is None:
            raise RuntimeError("an every-minute schedule has no next slot")
        previous = run_id_for(s.schedule_id, nxt.at - timedelta(minutes=1))
        fire = FireTimer(
            schedule_id=s.schedule_id,
            generation=s.generation,
            slot=nxt.slot,
            scheduled_for=nxt.at,
            fired=5,
            tenant=s.tenant,
            running=(previous,),
        )
        schedules.append(s)
        timers.append(fire.to_timer(shards))
    now = slot + timedelta(seconds=30)
    lease_at = now + timedelta(minutes=5)

    def step() -> None:
        plan = FiringPlan()
        for s, t in zip(schedules, timers, strict=True):
            plan_fire(s, FireTimer.from_timer(t), now, plan, shards, lease_at=lease_at)
        stores.runs.insert_rows([run for _s, run in plan.enqueue])
        stores.timers.rows(plan.next_timers, now=now)
        for s, run in plan.enqueue:
            run_message(s, run, lease_at=None, next_fire=plan.note_on.get(run.run_id))
        if len(plan.enqueue) != count:
            raise RuntimeError(f"planned {len(plan.enqueue)} runs of {count} timers")

    return 1e6 * third_best(step, repeat) / count


def time_grouped_write(stores: Stores, count: int, repeat: int) -> float:
    """µs of the dispatcher's Python per firing for its grouped write (run row, next timer)."""
    now = datetime.now(UTC).replace(microsecond=0)
    runs, timers = [], []
    for i in range(count):
        sid = str(uuid.uuid4())
        runs.append(
            Run(
                run_id=run_id_for(sid, now),
                schedule_id=sid,
                scheduled_for=now,
                status=RunStatus.ENQUEUED,
                handler="loadtest.tally",
                enqueue_time=now,
            )
        )
        timers.append(
            Timer(
                fire_time=now + timedelta(minutes=1, seconds=i % 60),
                timer_id=f"f:{sid}",
                shard=i % stores.timers.shard_count,
                kind="fire",
                key=sid,
                data=b'{"g":"0123456789abcdef","r":"x"}',
                stamp=1,
            )
        )

    def step() -> None:
        items = stores.runs.insert_rows(runs) + stores.timers.rows(timers, now=now)
        grouped_batches(stores.session, items)

    return 1e6 * third_best(step, repeat) / count


async def time_produce(bootstrap: str, topic: str, count: int, repeat: int) -> list[float]:
    """µs of this process's CPU per run message produced, for each of ``repeat`` passes."""
    messages = []
    for _ in range(count):
        sid = str(uuid.uuid4())
        m = run_message_pb2.RunMessage(
            schema_version=1,
            run_id=run_id_for(sid, datetime(2026, 12, 6, tzinfo=UTC)),
            schedule_id=sid,
            tenant="default",
            handler="loadtest.tally",
            attempt=1,
        )
        m.scheduled_for.seconds = 1_796_515_200
        messages.append(m)
    queue = KafkaRunQueue(bootstrap)
    await queue.start()
    try:
        await queue.enqueue(topic, messages[:1])  # connected, the topic's metadata known
        passes = []
        for _ in range(repeat):
            t0 = time.process_time()
            for start in range(0, count, RELEASE):
                await queue.enqueue(topic, messages[start : start + RELEASE])
            passes.append(1e6 * (time.process_time() - t0) / count)
        return passes
    finally:
        await queue.stop()


def run_messages(count: int, now: datetime) -> list[bytes]:
    """``count`` run messages as a dispatcher produces them for a once-a-minute schedule."""
    out = []
    for _ in range(count):
        sid = str(uuid.uuid4())
        slot = now.replace(microsecond=0)
        m = run_message_pb2.RunMessage(
            schema_version=1,
            run_id=run_id_for(sid, slot),
            schedule_id=sid,
            tenant="default",
            handler=RUN_HANDLER,
            attempt=1,
            follow_up=run_message_pb2.FOLLOW_UP_NONE,
        )
        set_timestamp(m.scheduled_for, slot)
        set_timestamp(m.enqueue_time, now)
        set_timestamp(m.next_fire_time, slot + timedelta(minutes=1))
        out.append(m.SerializeToString())
    return out


async def _returns(ctx: HandlerContext) -> None:
    return None


async def time_runs(stores: Stores, config: Config, count: int, repeat: int) -> list[float]:
    """µs of this process's CPU per run message run and reported, for each of ``repeat``
    passes (see the module's docstring)."""
    keys = fresh_keys_env()
    listen = f"127.0.0.1:{_free_port()}"
    api = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scheduler.cli",
        "api",
        "--log-level",
        "WARNING",
        env={
            **os.environ,
            **keys,
            "CRONSCALE_KEYSPACE": config.keyspace,
            "CRONSCALE_TOPIC_PREFIX": config.topic_prefix,
            "CRONSCALE_API_LISTEN": listen,
            "CRONSCALE_METRICS_PORT": str(_free_port()),
        },
    )
    try:
        registry = HandlerRegistry()
        registry.register(RUN_HANDLER, _returns)
        worker = WorkerConfig(
            topic_prefix=config.topic_prefix,
            api_target=listen,
            api_token=keys["CRONSCALE_API_TOKEN"],
        )
        async with RunReporter(listen, token=worker.api_token) as reporter:
            runner = Runner(registry=registry, reporter=reporter, worker_id="hot-path")
            consumer = KafkaRunConsumer(worker, runner)
            tp = TopicPartition(worker.topic, 0)
            offset = 0

            async def one_pass(values: list[bytes]) -> None:
                nonlocal offset
                for start in range(0, len(values), RELEASE):
                    for value in values[start : start + RELEASE]:
                        consumer._dispatch(tp, _record(tp, offset, value))
                        offset += 1
                    await asyncio.sleep(RELEASE_EVERY)
                while consumer._tasks:
                    await asyncio.wait(list(consumer._tasks))

            await asyncio.to_thread(_wait_serving, listen, API_START_TIMEOUT)
            await one_pass(run_messages(RELEASE, datetime.now(UTC)))
            passes = []
            for _ in range(repeat):
                values = run_messages(count, datetime.now(UTC))
                t0 = time.process_time()
                await one_pass(values)
                passes.append(1e6 * (time.process_time() - t0) / count)
        run_ids = [run_message_pb2.RunMessage.FromString(v).run_id for v in values]
        ended = await stores.runs.ended(run_ids, now=datetime.now(UTC), stale_after=STALE_RUN)
        if len(ended) != count:
            raise RuntimeError(
                f"the api recorded {len(ended)} of the last pass's {count} runs as ended"
            )
        return passes
    finally:
        api.terminate()
        await asyncio.wait_for(api.wait(), 30)


def _record(tp: TopicPartition, offset: int, value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=tp.topic,
        partition=tp.partition,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=None,
        value=value,
        checksum=None,
        serialized_key_size=-1,
        serialized_value_size=len(value),
        headers=(),
    )


async def _run(config: Config, events: int, messages: int, runs: int, repeat: int) -> None:
    stores = await open_stores(config)
    try:
        print(f"report          {time_report(stores, events, repeat):6.1f} µs an event")
        print(f"plan            {time_plan(stores, events, repeat):6.1f} µs a firing")
        print(f"grouped write   {time_grouped_write(stores, events, repeat):6.1f} µs a firing")
        if runs:
            passes = await time_runs(stores, config, runs, max(3, repeat // 3))
            shown = ", ".join(f"{p:.1f}" for p in passes)
            print(f"run             {min(passes):6.1f} µs a run (best; passes: {shown})")
    finally:
        stores.session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        stores.close()
    topic = config.topic()
    await ensure_topics(config.kafka_bootstrap, [topic], partitions=PARTITIONS)
    try:
        passes = await time_produce(config.kafka_bootstrap, topic, messages, max(2, repeat // 5))
    finally:
        await delete_topics(config.kafka_bootstrap, config.topic_prefix)
    shown = ", ".join(f"{p:.1f}" for p in passes)
    print(f"produce         {passes[-1]:6.1f} µs a message (passes: {shown})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.hot_path", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--events", type=int, default=1000, help="reports, and firings of a batch")
    p.add_argument("--messages", type=int, default=20_000, help="run messages produced a pass")
    p.add_argument(
        "--runs", type=int, default=5000, help="run messages run a pass (0: not the run step)"
    )
    p.add_argument("--repeat", type=int, default=15, help="passes of each step")
    args = p.parse_args(argv)
    for name in ("events", "messages", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.runs < 0:
        p.error("--runs must be 0 or more")
    token = uuid.uuid4().hex[:8]
    config = replace(Config.from_env(), keyspace=f"cs_hot_{token}", topic_prefix=f"hot-{token}")
    print(f"keyspace {config.keyspace} and topics {config.topic_prefix}.* (dropped at the end)")
    migrate(config, out=lambda _line: None)
    # The event loop and collector thresholds of the processes whose steps these are, put
    # back afterwards (a test calls this in its own process).
    policy, threshold = asyncio.get_event_loop_policy(), gc.get_threshold()
    use_fast_event_loop()
    tune_gc()
    try:
        asyncio.run(_run(config, args.events, args.messages, args.runs, args.repeat))
    finally:
        asyncio.set_event_loop_policy(policy)
        gc.unfreeze()
        gc.set_threshold(*threshold)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
