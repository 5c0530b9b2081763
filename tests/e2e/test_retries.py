"""Retries with backoff, dead letters and their re-drive, and lost runs found by their lease,
through the real api, dispatcher and worker on the real Cassandra and Kafka."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import grpc
from aiokafka import AIOKafkaConsumer

from bucketer.cql import connect
from cronscale.v1 import dead_letter_service_pb2 as dl_pb2
from cronscale.v1 import dead_letter_service_pb2_grpc as dl_grpc
from cronscale.v1 import schedule_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    DEAD_LETTERED,
    ENQUEUED,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
    create_schedule,
    cron_spec,
    dt,
    dur,
    get_run,
    json_payload,
    list_runs,
    once_spec,
    pause_schedule,
    refusal,
    wait_until,
)


def _retry(attempts: int, backoff_s: float = 0.5) -> schedule_pb2.SchedulePolicies:
    return schedule_pb2.SchedulePolicies(
        retry=schedule_pb2.RetryPolicy(
            max_attempts=attempts,
            initial_backoff=dur(timedelta(seconds=backoff_s)),
            backoff_multiplier=2.0,
            no_jitter=True,
        )
    )


def _dlq(stack: Stack) -> dl_grpc.DeadLetterServiceStub:
    return dl_grpc.DeadLetterServiceStub(stack.channel)


def _once(
    stack: Stack,
    handler: str,
    payload: object,
    policies: schedule_pb2.SchedulePolicies,
    in_s: float = 1.0,
) -> str:
    """A one-shot schedule ``in_s`` from now; returns its id."""
    at = datetime.now(UTC) + timedelta(seconds=in_s)
    s = create_schedule(
        stack,
        name=handler,
        handler=handler,
        payload=json_payload(payload),
        spec=once_spec(at),
        policies=policies,
    )
    return s.id


def _only_run_id(stack: Stack, schedule_id: str) -> str:
    found: list[str] = []

    def one() -> bool:
        found[:] = [r.run_id for r in list_runs(stack, schedule_id)]
        return len(found) == 1

    wait_until(stack, one, 15, f"the run of {schedule_id}")
    return found[0]


def _dlq_messages(
    stack: Stack, run_id: str, want: int, timeout: float = 20
) -> list[dl_pb2.DeadLetter]:
    """Dead letters of ``run_id`` on the dead-letter topic (read from the start)."""

    async def read() -> list[dl_pb2.DeadLetter]:
        consumer = AIOKafkaConsumer(
            f"{stack.config.topic_prefix}.dlq",
            bootstrap_servers=stack.config.kafka_bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        out: list[dl_pb2.DeadLetter] = []
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            while len(out) < want and asyncio.get_running_loop().time() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for rec in records:
                        d = dl_pb2.DeadLetter()
                        d.ParseFromString(rec.value)
                        if d.run_id == run_id:
                            out.append(d)
        finally:
            await consumer.stop()
        return out

    return asyncio.run(read())


def test_a_failing_run_is_retried_with_backoff_then_dead_lettered(stack: Stack) -> None:
    sid = _once(stack, "fail", {"error": "upstream said 503"}, _retry(3))
    run_id = _only_run_id(stack, sid)
    wait_until(
        stack,
        lambda: get_run(stack, run_id).status == DEAD_LETTERED,
        40,
        "the run dead-lettered after its third attempt",
    )
    run = get_run(stack, run_id)
    assert run.attempt == 3 and "upstream said 503" in run.error
    assert not run.HasField("next_attempt_time")

    letter = _dlq(stack).GetDeadLetter(dl_pb2.GetDeadLetterRequest(run_id=run_id), timeout=10)
    assert letter.attempts == 3 and letter.schedule_id == sid and letter.handler == "fail"
    assert [a.attempt for a in letter.history] == [1, 2, 3]
    assert all("upstream said 503" in a.error for a in letter.history)
    # The backoff (0.5 s, then 1 s, no jitter) separates the attempts.
    finishes = [dt(a.finish_time) for a in letter.history]
    starts = [dt(a.start_time) for a in letter.history]
    assert starts[1] - finishes[0] >= timedelta(seconds=0.5)
    assert starts[2] - finishes[1] >= timedelta(seconds=1.0)

    listed = _dlq(stack).ListDeadLetters(dl_pb2.ListDeadLettersRequest(schedule_id=sid), timeout=10)
    assert [d.run_id for d in listed.dead_letters] == [run_id]
    overall = _dlq(stack).ListDeadLetters(dl_pb2.ListDeadLettersRequest(), timeout=10)
    assert run_id in {d.run_id for d in overall.dead_letters}

    # The CLI shows the same.
    api = ["--api", stack.config.api_target]
    shown = stack.cli("dlq", "get", run_id, "--json", *api)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["attempts"] == 3
    listed_cli = stack.cli("dlq", "list", "--schedule", sid, *api)
    assert listed_cli.returncode == 0 and run_id in listed_cli.stdout

    (message,) = _dlq_messages(stack, run_id, want=1)
    assert message.attempts == 3 and len(message.history) == 3
    assert message.payload == json_payload({"error": "upstream said 503"})


def test_a_run_that_fails_then_succeeds_is_not_dead_lettered(stack: Stack) -> None:
    sid = _once(stack, "e2e.fail_until", {"succeed_at": 2}, _retry(3))
    run_id = _only_run_id(stack, sid)
    wait_until(stack, lambda: get_run(stack, run_id).status == SUCCEEDED, 30, "success on try 2")
    assert get_run(stack, run_id).attempt == 2
    # Both attempts' leases were settled by their outcomes: no dispatcher will read the run.
    session = connect(stack.config.cassandra_hosts, stack.config.cassandra_port)
    try:
        rows = session.execute(
            f"SELECT timer_id, kind FROM {stack.config.keyspace}.timers "
            "WHERE key = %s ALLOW FILTERING",
            (sid,),
        )
        leases = {r.timer_id: r.kind for r in rows if "#lease" in r.timer_id}
    finally:
        session.cluster.shutdown()
    assert leases == {f"{run_id}#lease1": "settled", f"{run_id}#lease2": "settled"}
    code, _ = refusal(
        lambda: _dlq(stack).GetDeadLetter(dl_pb2.GetDeadLetterRequest(run_id=run_id), timeout=10)
    )
    assert code == grpc.StatusCode.NOT_FOUND


def test_redrive_starts_a_new_attempt_series_once(stack: Stack) -> None:
    sid = _once(stack, "e2e.fail_until", {"succeed_at": 2}, _retry(1))
    run_id = _only_run_id(stack, sid)
    wait_until(stack, lambda: get_run(stack, run_id).status == DEAD_LETTERED, 30, "dead letter")

    dlq = _dlq(stack)
    request = dl_pb2.RedriveDeadLetterRequest(run_id=run_id, request_id="redrive-1")
    again = dlq.RedriveDeadLetter(request, timeout=10)
    assert again.origin_run_id == run_id and again.run_id != run_id and again.manual
    # A retried call answers the same run; another re-drive is refused.
    assert dlq.RedriveDeadLetter(request, timeout=10).run_id == again.run_id
    code, details = refusal(
        lambda: dlq.RedriveDeadLetter(dl_pb2.RedriveDeadLetterRequest(run_id=run_id), timeout=10)
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and again.run_id in details
    letter = dlq.GetDeadLetter(dl_pb2.GetDeadLetterRequest(run_id=run_id), timeout=10)
    assert letter.redrive_run_id == again.run_id
    # The re-driven run is attempt 1 of a new series (here it fails, and is dead-lettered).
    wait_until(
        stack, lambda: get_run(stack, again.run_id).status == DEAD_LETTERED, 30, "second letter"
    )
    bulk = dlq.RedriveDeadLetters(dl_pb2.RedriveDeadLettersRequest(schedule_id=sid), timeout=10)
    assert [r.origin_run_id for r in bulk.runs] == [again.run_id]


def test_dead_letter_bad_input(stack: Stack) -> None:
    dlq = _dlq(stack)
    code, details = refusal(
        lambda: dlq.GetDeadLetter(dl_pb2.GetDeadLetterRequest(run_id="nope@x"), timeout=10)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "run_id" in details
    code, details = refusal(
        lambda: dlq.RedriveDeadLetter(
            dl_pb2.RedriveDeadLetterRequest(run_id="ghost@20261203T120000.000"), timeout=10
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = refusal(
        lambda: dlq.ListDeadLetters(dl_pb2.ListDeadLettersRequest(page_size=5000), timeout=10)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "page_size" in details
    code, details = refusal(
        lambda: dlq.RedriveDeadLetters(dl_pb2.RedriveDeadLettersRequest(), timeout=10)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "schedule_id" in details
    bad = _retry(0)
    bad.retry.max_attempts = 500
    code, details = refusal(
        lambda: create_schedule(
            stack,
            name="bad-retry",
            handler="echo",
            spec=once_spec(datetime.now(UTC) + timedelta(hours=1)),
            policies=bad,
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "schedule.policies.retry.max_attempts" in details


def test_a_run_no_worker_takes_is_found_lost_and_retried(stack: Stack) -> None:
    """With no worker, the attempt's lease (10 s in these tests) comes due while it is still
    ENQUEUED: it is recorded TIMED_OUT and the next attempt enqueued; after the last one the
    run is dead-lettered. A worker that comes back later runs the stale messages, and their
    reports cannot overwrite the newer state."""
    stack.kill("worker")
    try:
        sid = _once(stack, "echo", {"hello": 1}, _retry(2))
        run_id = _only_run_id(stack, sid)
        wait_until(
            stack,
            lambda: get_run(stack, run_id).status == DEAD_LETTERED,
            45,
            "the run dead-lettered after two lost attempts",
        )
        letter = _dlq(stack).GetDeadLetter(dl_pb2.GetDeadLetterRequest(run_id=run_id), timeout=10)
        assert [a.status for a in letter.history] == [TIMED_OUT, TIMED_OUT]
        assert all("not started" in a.error for a in letter.history)
    finally:
        stack.start("worker", "worker", "--import", "tests.e2e.handlers")

    # The restarted worker takes the stale attempts: it runs them (the echo handler logs each
    # run it is given, with its run_id) or, for a partition it took over, finds them finished
    # and runs them not again. Either way the run stays dead-lettered.
    def taken(line: str) -> bool:
        return run_id in line and ("echo:" in line or "has run already" in line)

    wait_until(
        stack,
        lambda: any(taken(line) for line in stack.tail("worker", 100_000).splitlines()),
        30,
        "the stale attempts run by the restarted worker",
    )
    assert get_run(stack, run_id).status == DEAD_LETTERED


def test_a_recurring_schedule_s_lost_run_is_found_by_its_carried_lease(stack: Stack) -> None:
    """Every 2 s with a 10 s lease: each run's lease rides on the next fire timer (no lease
    timer is written at enqueue). With no worker, the next slot finds the run unfinished and
    writes its lease then; due at the enqueue + 10 s, it finds the run never started."""
    stack.kill("worker")
    try:
        s = create_schedule(
            stack,
            name="carried",
            handler="echo",
            spec=cron_spec("*/2 * * * * *"),
            policies=_retry(1),
        )
        first: list[schedule_pb2.Run] = []

        def lost() -> bool:
            runs = sorted(list_runs(stack, s.id), key=lambda r: dt(r.scheduled_for))
            first[:] = runs[:1]
            return bool(runs) and runs[0].status == DEAD_LETTERED

        wait_until(stack, lost, 40, "the first run found lost by its lease and dead-lettered")
        (run,) = first
        enqueued, dead = dt(run.enqueue_time), datetime.now(UTC)
        assert dead - enqueued >= timedelta(seconds=10), "not before its lease expired"
        letter = _dlq(stack).GetDeadLetter(
            dl_pb2.GetDeadLetterRequest(run_id=run.run_id), timeout=10
        )
        assert [a.status for a in letter.history] == [TIMED_OUT]
        assert "not started" in letter.history[0].error
    finally:
        pause_schedule(stack, s.id)
        stack.start("worker", "worker", "--import", "tests.e2e.handlers")


def test_a_run_whose_worker_dies_mid_handler_is_retried_after_its_heartbeat_lease(
    stack: Stack,
) -> None:
    """The worker is SIGKILLed while the handler sleeps: heartbeats stop, the lease finds the
    attempt silent (5 s heartbeat lease here) and enqueues attempt 2, which a new worker runs."""
    sid = _once(stack, "sleep", {"seconds": 4}, _retry(2), in_s=1.0)
    run_id = _only_run_id(stack, sid)
    wait_until(stack, lambda: get_run(stack, run_id).status == RUNNING, 15, "attempt 1 running")
    stack.kill("worker")
    try:
        wait_until(
            stack,
            lambda: get_run(stack, run_id).attempt == 2,
            40,
            "attempt 2 after attempt 1 went silent",
        )
        assert get_run(stack, run_id).status == ENQUEUED
    finally:
        stack.start("worker", "worker", "--import", "tests.e2e.handlers")
    wait_until(stack, lambda: get_run(stack, run_id).status == SUCCEEDED, 40, "attempt 2 ran")
    assert get_run(stack, run_id).attempt == 2
