"""The Kafka side of a worker: fetch run messages, run them concurrently, commit safely.

Offsets are committed only past messages whose outcome the API acknowledged (see
:mod:`worker.offsets`), so a worker that dies at any moment loses nothing: Kafka hands the
unfinished messages to another member of the group, which runs them again with the same run_id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from worker import metrics
from worker.config import WorkerConfig
from worker.errors import MessageDecodeError, ReportRejected, UnsupportedMessageVersion
from worker.messages import RunTask, decode_run_message
from worker.offsets import OffsetTracker
from worker.runner import Runner

logger = logging.getLogger(__name__)

COMMIT_INTERVAL = 0.2
# Runs whose handler is over but whose outcome awaits the API's ack hold no concurrency slot;
# this many of them at most (two full report batches) before fetching pauses.
MAX_AWAITING_ACK = 1000
# How long a revoked partition's running handlers may finish before the partition is let go.
REVOKE_GRACE = 5.0
_POLL_MS = 200
# How many finished (partition, offset) pairs are remembered against a re-fetch.
RECENTLY_DONE = 100_000
_START_BACKOFF_MAX = 10.0


class KafkaRunConsumer:
    """Consumes one tier's topic in the tier's consumer group and runs each message."""

    def __init__(self, config: WorkerConfig, runner: Runner) -> None:
        self._config = config
        self._runner = runner
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._tasks: dict[asyncio.Task[None], TopicPartition] = {}
        # Runs from fetch until their handler is over: what `concurrency` limits.
        self._busy = 0
        self._slot_freed = asyncio.Event()
        self._consumer: Any = None
        self._paused = False
        self._last_commit = 0.0
        # (partition, offset) of messages whose run is in progress here, and of the last ones
        # finished: a partition revoked and assigned back is fetched again from its committed
        # offset, and what is still running or just finished must not run twice.
        self._running: set[tuple[TopicPartition, int]] = set()
        self._recently_done: collections.OrderedDict[tuple[TopicPartition, int], None] = (
            collections.OrderedDict()
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Consumes until ``stop`` is set, then drains (see :meth:`_shutdown`) and leaves."""
        consumer = await self._start(stop)
        if consumer is None:
            return
        self._consumer = consumer
        logger.info(
            "consuming %s as group %s (concurrency %d)",
            self._config.topic,
            self._config.group_id,
            self._config.concurrency,
        )
        try:
            await self._loop(consumer, stop)
        finally:
            await self._shutdown(consumer)

    async def _start(self, stop: asyncio.Event) -> Any:
        """Starts a consumer, retrying while Kafka is unreachable; None if stopped first."""
        delay = 0.5
        while not stop.is_set():
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._config.kafka_bootstrap,
                group_id=self._config.group_id,
                client_id=f"cronscale-worker-{self._config.instance_id}",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
            consumer.subscribe([self._config.topic], listener=_Rebalance(self))
            try:
                await consumer.start()
            except KafkaError as e:
                await consumer.stop()
                logger.warning(
                    "cannot reach Kafka at %s (%s); retrying in %.1f s",
                    self._config.kafka_bootstrap,
                    e,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, _START_BACKOFF_MAX)
                continue
            return consumer
        return None

    async def _loop(self, consumer: Any, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            free = min(
                self._config.concurrency - self._busy,
                self._config.concurrency + MAX_AWAITING_ACK - len(self._tasks),
            )
            if free <= 0:
                # Keep calling getmany (the group counts a silent member as dead after
                # max_poll_interval) but fetch nothing until a handler finishes.
                self._pause(consumer)
                self._slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), _POLL_MS / 1000)
                records = await consumer.getmany(timeout_ms=0)
            else:
                self._resume(consumer)
                records = await consumer.getmany(timeout_ms=_POLL_MS, max_records=free)
            for tp, messages in records.items():
                for message in messages:
                    self._dispatch(tp, message)
            if loop.time() - self._last_commit >= COMMIT_INTERVAL:
                await self._commit(consumer, self._tracker.committable())

    def _dispatch(self, tp: TopicPartition, message: Any) -> None:
        key = (tp, message.offset)
        if not self._tracker.add(tp, message.offset):
            return  # delivered twice in one assignment: it is running or done already
        if key in self._running:
            # The partition was revoked and assigned back while this message still ran here:
            # the run in progress completes the offset, it is not started a second time.
            return
        if key in self._recently_done:
            # Finished here after the partition was revoked, fetched again before the commit
            # caught up: done, not to be run again.
            self._tracker.complete(tp, message.offset)
            return
        where = {"topic": tp.topic, "partition": tp.partition, "offset": message.offset}
        try:
            task = decode_run_message(message.value)
        except UnsupportedMessageVersion as e:
            metrics.MESSAGES_SKIPPED.labels(self._config.tier, "unsupported_version").inc()
            logger.error(
                "skipping %s[%d]@%d: %s", tp.topic, tp.partition, message.offset, e, extra=where
            )
            if isinstance(e.task, RunTask):
                readable, reason = e.task, str(e)
                self._spawn(
                    tp, message.offset, lambda release: self._refuse(readable, reason, release)
                )
            else:
                self._tracker.complete(tp, message.offset)
            return
        except MessageDecodeError as e:
            metrics.MESSAGES_SKIPPED.labels(self._config.tier, "undecodable").inc()
            logger.error(
                "skipping %s[%d]@%d: %s", tp.topic, tp.partition, message.offset, e, extra=where
            )
            self._tracker.complete(tp, message.offset)
            return
        self._spawn(tp, message.offset, lambda release: self._runner.run(task, release))

    async def _refuse(self, task: RunTask, reason: str, release: Callable[[], None]) -> None:
        release()
        await self._runner.refuse(task, reason)

    def _spawn(
        self,
        tp: TopicPartition,
        offset: int,
        work: Callable[[Callable[[], None]], Awaitable[object]],
    ) -> None:
        """Starts ``work(release)`` for one message; ``release()`` frees its concurrency slot."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._busy -= 1
                self._slot_freed.set()

        self._busy += 1
        self._running.add((tp, offset))
        task = asyncio.create_task(
            self._finish(tp, offset, work, release), name=f"run {tp.topic}[{tp.partition}]@{offset}"
        )
        self._tasks[task] = tp
        task.add_done_callback(lambda _: release())
        task.add_done_callback(lambda _: self._running.discard((tp, offset)))
        task.add_done_callback(self._task_done)

    async def _finish(
        self,
        tp: TopicPartition,
        offset: int,
        work: Callable[[Callable[[], None]], Awaitable[object]],
        release: Callable[[], None],
    ) -> None:
        try:
            await work(release)
        except ReportRejected:
            pass  # the reporter logged it; resending cannot help, so let the offset go
        except Exception:
            # A bug, not a handler failure (the runner catches those). Let the offset go
            # rather than wedge the partition: the run's lease brings it back if it matters.
            logger.exception("running %s@%d failed unexpectedly", tp, offset)
        # A CancelledError (shutdown) skips this: the offset stays uncommitted, Kafka redelivers.
        self._tracker.complete(tp, offset)
        self._recently_done[(tp, offset)] = None
        if len(self._recently_done) > RECENTLY_DONE:
            self._recently_done.popitem(last=False)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._slot_freed.set()

    def _pause(self, consumer: Any) -> None:
        assigned = consumer.assignment()
        if assigned:
            consumer.pause(*assigned)
        self._paused = True

    def _resume(self, consumer: Any) -> None:
        if self._paused:
            paused = consumer.paused()
            if paused:
                consumer.resume(*paused)
            self._paused = False

    async def _commit(self, consumer: Any, offsets: dict[TopicPartition, int]) -> None:
        self._last_commit = asyncio.get_running_loop().time()
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as e:
            # The next commit carries these offsets again (or the new owner re-runs them).
            logger.warning("committing offsets %s failed: %s", _fmt(offsets), e)
            return
        self._tracker.mark_committed(offsets)
        logger.debug("committed %s", _fmt(offsets))

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return
        running = [t for t, tp in self._tasks.items() if tp in revoked]
        if running:
            logger.info(
                "partitions %s revoked; waiting up to %.0f s for %d running handlers",
                _fmt_tps(revoked),
                REVOKE_GRACE,
                len(running),
            )
            await asyncio.wait(running, timeout=REVOKE_GRACE)
        offsets = self._tracker.revoke(revoked)
        if self._consumer is not None:
            await self._commit(self._consumer, offsets)

    async def _shutdown(self, consumer: Any) -> None:
        """Stops fetching, gives running handlers the grace period, commits, leaves the group."""
        self._pause(consumer)
        grace = self._config.shutdown_grace
        if self._tasks:
            logger.info(
                "stopping: waiting up to %.0f s for %d running handlers", grace, len(self._tasks)
            )
            _, still = await asyncio.wait(list(self._tasks), timeout=grace)
            if still:
                logger.warning(
                    "stopping: cancelling %d handlers still running after %.0f s; "
                    "their messages will be delivered again",
                    len(still),
                    grace,
                )
                for task in still:
                    task.cancel()
                await asyncio.gather(*still, return_exceptions=True)
        await self._commit(consumer, self._tracker.committable())
        await consumer.stop()
        self._consumer = None
        logger.info("consumer stopped")


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaRunConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._owner._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        logger.info("assigned partitions %s", _fmt_tps(assigned))


def _fmt_tps(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)) or "none"


def _fmt(offsets: dict[TopicPartition, int]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]={o}" for tp, o in sorted(offsets.items()))
