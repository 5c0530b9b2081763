"""Decoding run messages, including the refusal of newer layouts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronscale.v1 import run_message_pb2
from worker.errors import MessageDecodeError, UnsupportedMessageVersion
from worker.messages import RunTask, decode_run_message, encode_run_message

WHEN = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


def message(**fields: object) -> run_message_pb2.RunMessage:
    msg = run_message_pb2.RunMessage(
        schema_version=1,
        run_id="run-1",
        schedule_id="sched-1",
        tenant="acme",
        handler="echo",
        payload=b'{"x": 1}',
        attempt=2,
    )
    msg.scheduled_for.FromDatetime(WHEN)
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def test_decodes_every_field() -> None:
    msg = message(manual=True)
    msg.enqueue_time.FromDatetime(WHEN + timedelta(seconds=1))
    msg.max_runtime.FromTimedelta(timedelta(seconds=90))
    msg.next_fire_time.FromDatetime(WHEN + timedelta(minutes=1))
    task = decode_run_message(msg.SerializeToString())
    assert task == RunTask(
        run_id="run-1",
        schedule_id="sched-1",
        tenant="acme",
        handler="echo",
        payload=b'{"x": 1}',
        scheduled_for=WHEN,
        enqueue_time=WHEN + timedelta(seconds=1),
        attempt=2,
        manual=True,
        max_runtime=90.0,
        next_fire_time=WHEN + timedelta(minutes=1),
        schema_version=1,
    )
    assert task.scheduled_for.tzinfo is not None


def test_no_max_runtime_means_the_default() -> None:
    task = decode_run_message(message().SerializeToString())
    assert task.max_runtime is None
    assert task.enqueue_time is None


def test_round_trip() -> None:
    task = decode_run_message(message().SerializeToString())
    assert decode_run_message(encode_run_message(task)) == task


def test_a_newer_schema_version_is_refused_clearly() -> None:
    with pytest.raises(UnsupportedMessageVersion) as info:
        decode_run_message(message(schema_version=2).SerializeToString())
    assert "schema_version 2 is newer than this worker supports (1)" in str(info.value)
    assert isinstance(info.value.task, RunTask)
    assert info.value.task.run_id == "run-1"


def test_unset_schema_version_reads_as_the_first_layout() -> None:
    assert decode_run_message(message(schema_version=0).SerializeToString()).schema_version == 1


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "no value"),
        (b"\xff\xff\xff", "not a RunMessage"),
        (message(run_id="").SerializeToString(), "lacks run_id"),
        (message(handler="").SerializeToString(), "lacks handler"),
        (run_message_pb2.RunMessage(run_id="r", handler="h").SerializeToString(), "scheduled_for"),
    ],
)
def test_undecodable_records_are_refused(value: bytes | None, problem: str) -> None:
    with pytest.raises(MessageDecodeError, match=problem):
        decode_run_message(value)
