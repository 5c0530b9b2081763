"""Retry policies: backoff, the retry-or-dead-letter decision, limits, and the stored form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronscale.v1 import schedule_pb2
from scheduler.api.convert import retry_from_proto, retry_to_proto
from scheduler.errors import InvalidArgument
from scheduler.model import RetryPolicy, RunEventRecord, RunStatus, SchedulePolicies
from scheduler.retries import backoff, next_attempt_at
from scheduler.validation import validate_retry

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
EXACT = RetryPolicy(
    max_attempts=6,
    initial_backoff=timedelta(seconds=10),
    multiplier=2.0,
    max_backoff=timedelta(seconds=60),
    jitter=0.0,
)


def _failed(attempt: int, **kw: object) -> RunEventRecord:
    return RunEventRecord(
        run_id="s1@20261203T120000.000",
        schedule_id="s1",
        scheduled_for=NOW,
        status=RunStatus.FAILED,
        event_time=NOW,
        attempt=attempt,
        **kw,  # type: ignore[arg-type]
    )


def test_backoff_grows_by_the_multiplier_up_to_the_cap() -> None:
    waits = [backoff(EXACT, a, "r").total_seconds() for a in range(1, 7)]
    assert waits == [10, 20, 40, 60, 60, 60]


def test_full_jitter_stays_within_zero_and_the_cap_and_is_repeatable() -> None:
    full = RetryPolicy(initial_backoff=timedelta(seconds=8), max_backoff=timedelta(seconds=8))
    waits = [backoff(full, 1, f"run-{i}") for i in range(500)]
    assert all(timedelta(0) <= w <= timedelta(seconds=8) for w in waits)
    # Spread over the range, not bunched: full jitter draws uniformly.
    assert min(waits) < timedelta(seconds=1) and max(waits) > timedelta(seconds=7)
    assert backoff(full, 1, "run-7") == backoff(full, 1, "run-7")


def test_absurd_multipliers_do_not_overflow() -> None:
    p = RetryPolicy(max_attempts=100, multiplier=10.0, max_backoff=timedelta(days=7), jitter=0)
    assert backoff(p, 100, "r") == timedelta(days=7)
    assert backoff(p, 10_000, "r") == timedelta(days=7)


def test_attempts_left_get_a_retry_and_the_last_one_does_not() -> None:
    assert next_attempt_at(EXACT, _failed(1), NOW) == NOW + timedelta(seconds=10)
    assert next_attempt_at(EXACT, _failed(5), NOW) == NOW + timedelta(seconds=60)
    assert next_attempt_at(EXACT, _failed(6), NOW) is None
    assert next_attempt_at(RetryPolicy(max_attempts=1), _failed(1), NOW) is None


def test_the_handler_can_refuse_retries_or_choose_the_wait() -> None:
    assert next_attempt_at(EXACT, _failed(1, non_retryable=True), NOW) is None
    asked = _failed(2, retry_after=timedelta(seconds=3))
    assert next_attempt_at(EXACT, asked, NOW) == NOW + timedelta(seconds=3)
    # ... within the policy's max backoff, and never beyond its last attempt.
    greedy = _failed(2, retry_after=timedelta(hours=5))
    assert next_attempt_at(EXACT, greedy, NOW) == NOW + timedelta(seconds=60)
    assert next_attempt_at(EXACT, _failed(6, retry_after=timedelta(seconds=1)), NOW) is None


@pytest.mark.parametrize(
    ("policy", "field", "words"),
    [
        (RetryPolicy(max_attempts=0), "max_attempts", "between 1 and 100"),
        (RetryPolicy(max_attempts=101), "max_attempts", "between 1 and 100"),
        (
            RetryPolicy(initial_backoff=timedelta(milliseconds=10)),
            "initial_backoff",
            "between 0.1s and 7d",
        ),
        (RetryPolicy(max_backoff=timedelta(days=8)), "max_backoff", "between"),
        (
            RetryPolicy(initial_backoff=timedelta(minutes=5), max_backoff=timedelta(minutes=1)),
            "max_backoff",
            "shorter than initial_backoff",
        ),
        (RetryPolicy(multiplier=0.5), "backoff_multiplier", "between 1.0 and 10"),
        (RetryPolicy(multiplier=float("nan")), "backoff_multiplier", "between 1.0 and 10"),
        (RetryPolicy(jitter=1.5), "jitter", "between 0.0 and 1.0"),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_field(
    policy: RetryPolicy, field: str, words: str
) -> None:
    with pytest.raises(InvalidArgument) as e:
        validate_retry(policy, field="schedule.policies.retry")
    assert e.value.field == f"schedule.policies.retry.{field}"
    assert words in str(e.value)


def test_proto_round_trip_and_defaults() -> None:
    assert retry_from_proto(schedule_pb2.RetryPolicy()) == RetryPolicy()
    assert retry_from_proto(retry_to_proto(EXACT)) == EXACT
    no_jitter = schedule_pb2.RetryPolicy(max_attempts=2, no_jitter=True)
    assert retry_from_proto(no_jitter).jitter == 0.0


def test_stored_policies_keep_the_retry_policy_and_old_rows_read_as_defaults() -> None:
    p = SchedulePolicies(retry=EXACT)
    assert SchedulePolicies.from_json(p.to_json()) == p
    old = '{"v":1,"overlap":"SKIP","misfire":"FIRE_ONCE","catch_up_ms":3600000,"max_catch_up":100}'
    assert SchedulePolicies.from_json(old).retry == RetryPolicy()
