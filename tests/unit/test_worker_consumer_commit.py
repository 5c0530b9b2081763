"""The consumer's commit while Kafka does not answer: said in the log and on the gauge."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import TopicPartition
from prometheus_client import REGISTRY

from worker import consumer as consumer_module
from worker.config import WorkerConfig
from worker.consumer import ConsumerWedged, KafkaRunConsumer
from worker.handlers import HandlerRegistry
from worker.offsets import Commit
from worker.runner import Runner


class SlowCommits:
    """Takes commits only once ``answer`` is set, as aiokafka does while the coordinator is
    unreachable (it retries inside ``commit``)."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.committed: list[dict[TopicPartition, tuple[int, str]]] = []

    async def commit(self, offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        await self.answer.wait()
        self.committed.append(offsets)


class NoReports:
    def submit(self, event: object) -> object:
        raise AssertionError("nothing is reported here")


class _Said(logging.Handler):
    """Sets ``event`` once a record whose message starts with ``prefix`` is logged."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.event = asyncio.Event()
        self._prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self._prefix):
            self.event.set()


def _consumer(tier: str) -> KafkaRunConsumer:
    """A consumer of ``tier`` whose runner reports nothing (no run is started here)."""
    runner = Runner(registry=HandlerRegistry(), reporter=NoReports(), worker_id="w")  # type: ignore[arg-type]
    return KafkaRunConsumer(WorkerConfig(tier=tier), runner)


def _kafka_up(tier: str) -> float | None:
    return REGISTRY.get_sample_value("cronscale_worker_kafka_up", {"tier": tier})


async def test_a_commit_kafka_does_not_take_marks_kafka_down_until_it_does(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(consumer_module, "COMMIT_SLOW", 0.05)
    consumer = _consumer("commit-test")
    kafka = SlowCommits()
    tp = TopicPartition("t", 0)
    committing = asyncio.create_task(consumer._commit(kafka, {tp: Commit(offset=5, finished=(7,))}))
    # Until the consumer says so (not a fixed sleep: a busy machine may start the commit late).
    said = _Said("Kafka has not taken an offset commit")
    logging.getLogger(consumer_module.__name__).addHandler(said)
    try:
        await asyncio.wait_for(said.event.wait(), 5)
    finally:
        logging.getLogger(consumer_module.__name__).removeHandler(said)
    assert not committing.done()
    assert _kafka_up("commit-test") == 0
    assert "Kafka has not taken an offset commit" in caplog.text
    kafka.answer.set()
    await asyncio.wait_for(committing, 1)
    assert _kafka_up("commit-test") == 1
    assert "Kafka took the offset commit after" in caplog.text
    assert kafka.committed == [{tp: (5, "cs1:2")}]


async def test_a_commit_waiting_past_the_stuck_bound_takes_the_consumer_for_wedged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumer_module, "COMMIT_SLOW", 0.05)
    consumer = _consumer("stuck-test")
    kafka = SlowCommits()
    tp = TopicPartition("t", 0)
    with pytest.raises(ConsumerWedged, match="Kafka has not taken an offset commit for 0 s"):
        await asyncio.wait_for(
            consumer._commit(kafka, {tp: Commit(offset=5, finished=())}, stuck_after=0.2), 5
        )
    assert _kafka_up("stuck-test") == 0
    kafka.answer.set()  # the abandoned commit was cancelled: it takes nothing later
    await asyncio.sleep(0.05)
    assert kafka.committed == []
