"""The Kafka side of a worker: fetch run messages, run them concurrently, commit safely.

Offsets are committed only past messages whose outcome the API acknowledged (see
:mod:`worker.offsets`), so a worker that dies at any moment loses nothing: Kafka hands the
unfinished messages to another member of the group, which runs them again with the same run_id.
Each commit also names the finished messages above the commit point (in the commit's metadata),
and a worker taking a partition over skips them: a killed worker's successor re-runs only what
was unfinished, not everything after its oldest run.

A rebalance revokes partitions while their runs may still be in progress. The worker waits up
to ``revoke_grace`` for them, then hands the rest over: it commits them as finished and sees
them through itself (running, reporting), so the next owner does not start them a second time
beside it. Should this worker die before they finish, the runs' leases (the API side) retry
them. A stopping worker hands nothing over: what it cancels is delivered again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from worker import metrics
from worker.config import WorkerConfig
from worker.errors import MessageDecodeError, ReportRejected, UnsupportedMessageVersion
from worker.health import KAFKA, WorkerHealth
from worker.messages import RunTask, decode_run_message
from worker.offsets import Commit, OffsetTracker, decode_finished
from worker.runner import Runner

logger = logging.getLogger(__name__)

COMMIT_INTERVAL = 0.2
# Runs whose handler is over but whose outcome awaits the API's ack hold no concurrency slot;
# this many of them at most (two full report batches) before fetching pauses.
MAX_AWAITING_ACK = 1000
_POLL_MS = 200
# A commit waiting longer than this marks Kafka down (cronscale_worker_kafka_up) and is logged.
COMMIT_SLOW = 5.0
# How long stopping a consumer taken for wedged may take before it is left behind.
_DROP_WAIT = 5.0
# Reading committed offsets and looking offsets up by time, on assignment.
_LOOKUP_ATTEMPTS = 3
# How many finished (partition, offset) pairs are remembered against a re-fetch.
RECENTLY_DONE = 100_000
# How many (run_id, attempt) pairs started here are remembered against a second message of the
# same attempt (a batch sent again after a timeout, a refire).
RECENT_RUNS = 100_000
_START_BACKOFF_MAX = 10.0


class ConsumerWedged(Exception):
    """The consumer's offset commit has waited ``WorkerConfig.commit_stuck`` seconds."""


class KafkaRunConsumer:
    """Consumes one tier's topic in the tier's consumer group and runs each message."""

    def __init__(
        self, config: WorkerConfig, runner: Runner, health: WorkerHealth | None = None
    ) -> None:
        self._config = config
        self._runner = runner
        self._health = health or WorkerHealth(config.tier)
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._tasks: dict[asyncio.Task[None], TopicPartition] = {}
        # Runs from fetch until their handler is over: what `concurrency` limits.
        self._busy = 0
        self._slot_freed = asyncio.Event()
        self._consumer: Any = None
        self._admin: Any = None
        self._paused = False
        # Newly assigned partitions held paused until their previous owner's commit is read.
        self._holding: set[TopicPartition] = set()
        self._stopping = False
        self._last_commit = 0.0
        # (partition, offset) of messages whose run is in progress here, and of the last ones
        # finished: a partition revoked and assigned back is fetched again from its committed
        # offset, and what is still running or just finished must not run twice.
        self._running: set[tuple[TopicPartition, int]] = set()
        self._recently_done: collections.OrderedDict[tuple[TopicPartition, int], None] = (
            collections.OrderedDict()
        )
        # (run_id, attempt) of the runs started here lately: one attempt is one execution, so a
        # second message for it (a dispatcher sent the batch again after a send timed out, or
        # fired the run again) is not run again. Such copies share the partition (the
        # message key), so they reach the worker that ran the first.
        self._recent_runs: collections.OrderedDict[tuple[str, int], None] = (
            collections.OrderedDict()
        )
        # Per partition taken over from a previous owner: the end offset at the takeover.
        # Messages between the committed offset and it that the commit does not name as
        # finished may have run already (the owner died before committing them): their run
        # asks the API first (Runner.run's check_done).
        self._redelivered_below: dict[TopicPartition, int] = {}
        # Partitions taken over whose offsets could not be read (Kafka slow or away during the
        # rebalance): their end is taken from the first fetch instead (its high watermark, no
        # clock involved), and every message below it asks first.
        self._end_unknown: set[TopicPartition] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Consumes until ``stop`` is set, then drains (see :meth:`_shutdown`) and leaves."""
        consumer = await self._start(stop)
        if consumer is None:
            return
        logger.info(
            "consuming %s as group %s (concurrency %d)",
            self._config.topic,
            self._config.group_id,
            self._config.concurrency,
        )
        try:
            while True:
                try:
                    await self._loop(consumer, stop)
                    return
                except ConsumerWedged as e:
                    # aiokafka's consumer can wedge for good: a Kafka restart once ended its
                    # metadata task, and with it the coordinator lookup, the heartbeats and
                    # every commit (worker/kafka_uvloop.py). Kafka itself may be away, too: the
                    # new consumer then waits for it as at start-up.
                    logger.error("%s; replacing the Kafka consumer", e)
                    metrics.CONSUMERS_REPLACED.labels(self._config.tier).inc()
                    await self._drop(consumer)
                    consumer = await self._start(stop)
                    if consumer is None:
                        return
                    logger.info("the new Kafka consumer started; partitions come on assignment")
        finally:
            await self._shutdown(consumer)

    async def _start(self, stop: asyncio.Event) -> Any:
        """Starts a consumer, retrying while Kafka is unreachable; None if stopped first."""
        delay = 0.5
        while not stop.is_set():
            # The admin client reads the commits' metadata on assignment: up before the consumer
            # joins the group.
            security = self._config.kafka_security.client_options()
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self._config.kafka_bootstrap,
                client_id=f"cronscale-worker-{self._config.instance_id}-admin",
                **security,
            )
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._config.kafka_bootstrap,
                group_id=self._config.group_id,
                client_id=f"cronscale-worker-{self._config.instance_id}",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                group_instance_id=self._config.group_instance_id or None,
                **security,
            )
            consumer.subscribe([self._config.topic], listener=_Rebalance(self, consumer))
            self._admin, self._consumer = admin, consumer
            try:
                await admin.start()
                await consumer.start()
            except KafkaError as e:
                await consumer.stop()
                await admin.close()
                self._admin = self._consumer = None
                self._health.down(KAFKA, f"cannot reach {self._config.kafka_bootstrap}: {e}")
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
            self._health.up(KAFKA)
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
            if stop.is_set():
                # Told to stop while fetching: what came back is not started (nor committed),
                # another worker runs it.
                break
            for tp, messages in records.items():
                for message in messages:
                    self._dispatch(tp, message)
            if loop.time() - self._last_commit >= COMMIT_INTERVAL:
                await self._commit(
                    consumer, self._tracker.committable(), stuck_after=self._config.commit_stuck
                )

    def _dispatch(self, tp: TopicPartition, message: Any) -> None:
        key = (tp, message.offset)
        if not self._tracker.add(tp, message.offset):
            return  # delivered twice in one assignment: it is running or done already
        if self._tracker.inherited(tp, message.offset):
            # The partition's previous owner finished it (or handed it over running).
            metrics.MESSAGES_SKIPPED.labels(self._config.tier, "finished_before").inc()
            self._tracker.complete(tp, message.offset)
            return
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
            task = decode_run_message(message.value, produce_time=_record_time(message))
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
        run = (task.run_id, task.attempt)
        if run in self._recent_runs:
            # Its first message holds the commit point until that run is done (it came first).
            metrics.MESSAGES_SKIPPED.labels(self._config.tier, "duplicate_run").inc()
            logger.info(
                "skipping %s[%d]@%d: run %s attempt %d already ran here",
                tp.topic,
                tp.partition,
                message.offset,
                task.run_id,
                task.attempt,
                extra={**where, "run_id": task.run_id, "schedule_id": task.schedule_id},
            )
            self._tracker.complete(tp, message.offset)
            return
        self._recent_runs[run] = None
        if len(self._recent_runs) > RECENT_RUNS:
            self._recent_runs.popitem(last=False)
        if self._end_unknown and tp in self._end_unknown:
            end = self._consumer.highwater(tp) if self._consumer is not None else None
            if end is not None:
                self._redelivered_below[tp] = end
                self._end_unknown.discard(tp)
        check = tp in self._end_unknown or message.offset < self._redelivered_below.get(tp, -1)
        self._spawn(
            tp, message.offset, lambda release: self._runner.run(task, release, check_done=check)
        )

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

        def done(task: asyncio.Task[None]) -> None:
            release()
            self._running.discard((tp, offset))
            self._task_done(task)

        task.add_done_callback(done)

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
            paused = set(consumer.paused()) - self._holding
            if paused:
                consumer.resume(*paused)
            self._paused = False

    async def _commit(
        self,
        consumer: Any,
        commits: dict[TopicPartition, Commit],
        *,
        stuck_after: float | None = None,
    ) -> None:
        """Commits every partition's offset with its finished offsets above (one request).

        With ``stuck_after``, a commit still waiting after that many seconds is given up and
        :class:`ConsumerWedged` raised: the caller replaces the consumer."""
        self._last_commit = asyncio.get_running_loop().time()
        if not commits:
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # aiokafka retries a commit while the group coordinator is unreachable (a Kafka outage)
        # instead of failing it: say so while waiting, rather than look healthy.
        sent = asyncio.ensure_future(
            consumer.commit({tp: (c.offset, c.metadata) for tp, c in commits.items()})
        )
        slow = COMMIT_SLOW if stuck_after is None else min(COMMIT_SLOW, stuck_after)
        try:
            done, _ = await asyncio.wait({sent}, timeout=slow)
            if not done:
                self._health.down(KAFKA, f"an offset commit waits for over {slow:g} s")
                logger.warning(
                    "Kafka has not taken an offset commit for %.0f s (is it down?); still "
                    "trying, the runs in progress go on meanwhile",
                    slow,
                )
                rest = None if stuck_after is None else stuck_after - slow
                if not (await asyncio.wait({sent}, timeout=rest))[0]:
                    sent.cancel()
                    raise ConsumerWedged(
                        f"Kafka has not taken an offset commit for {loop.time() - t0:.0f} s"
                    )
            await sent
            if not done:
                logger.warning("Kafka took the offset commit after %.1f s", loop.time() - t0)
        except KafkaError as e:
            # The next commit carries these offsets again (or the new owner re-runs them).
            metrics.COMMIT_FAILURES.labels(self._config.tier).inc()
            self._health.down(KAFKA, f"an offset commit failed: {e}")
            logger.warning("committing offsets %s failed: %s", _fmt(commits), e)
            return
        self._health.up(KAFKA)
        self._tracker.mark_committed(commits)
        logger.debug("committed %s", _fmt(commits))

    async def _drop(self, consumer: Any) -> None:
        """Lets go of a consumer taken for wedged, keeping the runs in progress.

        Its partitions are no longer tracked (what still runs is left to whoever is assigned the
        partition next, this worker's new consumer usually: a message fetched again while its
        run goes on here is not started twice, and one finished here since is completed without
        running again). Stopping it is bounded: one whose group coordination is stuck never
        finishes stopping, and is left behind, paused."""
        self._consumer = None  # its rebalance callbacks no longer act on this worker's state
        dropped = set(self._tracker.partitions())
        self._tracker.revoke(dropped)
        self._holding.clear()
        for tp in dropped:
            self._redelivered_below.pop(tp, None)
        self._end_unknown.clear()
        with contextlib.suppress(Exception):
            self._pause(consumer)  # a consumer left behind fetches nothing more
        self._paused = False  # the new consumer starts unpaused
        for name, closing in (("consumer", consumer.stop), ("admin client", self._admin.close)):
            try:
                await asyncio.wait_for(closing(), _DROP_WAIT)
            except Exception as e:  # whatever it is, the new consumer goes ahead
                logger.warning(
                    "the wedged Kafka %s did not close within %.0f s (%s); left behind",
                    name,
                    _DROP_WAIT,
                    e or type(e).__name__,
                )
        self._admin = None

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._holding -= revoked
        for tp in revoked:
            self._redelivered_below.pop(tp, None)
            self._end_unknown.discard(tp)
        if not revoked:
            return
        grace = self._config.revoke_grace
        running = [t for t, tp in self._tasks.items() if tp in revoked]
        if running and grace > 0:
            logger.info(
                "partitions %s revoked; waiting up to %.1f s for %d running handlers",
                _fmt_tps(revoked),
                grace,
                len(running),
            )
            await asyncio.wait(running, timeout=grace)
        # A stopping worker cancels what still runs, so it cannot promise to finish it.
        hand_over = not self._stopping
        still = sum(1 for t in running if not t.done())
        commits = self._tracker.revoke(revoked, hand_over=hand_over)
        if still and hand_over:
            metrics.RUNS_HANDED_OVER.labels(self._config.tier).inc(still)
            logger.info(
                "partitions %s revoked with %d runs in progress: committed as handed over, "
                "this worker finishes and reports them",
                _fmt_tps(revoked),
                still,
            )
        if self._consumer is not None:
            await self._commit(self._consumer, commits)

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Resumes each newly assigned partition where its previous owner left it: from the
        committed offset, skipping the runs the commit names as finished; a partition with no
        commit starts ``new_group_lookback`` seconds back, not at the start of the retention."""
        consumer = self._consumer
        if not assigned or consumer is None:
            return
        # No record of these may be handed out before the tracker knows what to skip. This runs
        # before the first await of the callback: nothing was fetched for them yet.
        consumer.pause(*assigned)
        self._holding |= assigned
        try:
            committed = await self._read_committed(assigned)
            fresh: list[TopicPartition] = []
            resumed: list[TopicPartition] = []
            for tp in sorted(assigned):
                meta = committed.get(tp)
                if meta is None or meta.offset < 0:
                    fresh.append(tp)
                    continue
                resumed.append(tp)
                finished = decode_finished(meta.offset, meta.metadata)
                self._tracker.restore(tp, meta.offset, finished)
                if finished:
                    logger.info(
                        "%s[%d] resumes at offset %d; %d messages above it were finished "
                        "by its previous owner and are skipped",
                        tp.topic,
                        tp.partition,
                        meta.offset,
                        len(finished),
                    )
            if resumed:
                await self._mark_redelivered(consumer, resumed, committed)
            if fresh:
                await self._start_fresh(consumer, fresh)
        except (KafkaError, TimeoutError) as e:
            # Where the previous owner stopped is unknown: every message it could have fetched
            # (below the end the first fetch shows) asks the API first.
            self._end_unknown |= {tp for tp in assigned if tp not in self._redelivered_below}
            logger.warning(
                "could not read where partitions %s were left (%s); they resume from their "
                "committed offsets (the earliest message without one), and the runs of "
                "messages up to their end ask the API whether they ran already",
                _fmt_tps(assigned),
                e or type(e).__name__,
            )
        finally:
            self._holding -= assigned
            if not self._paused:
                mine = set(consumer.assignment())
                ready = [tp for tp in assigned if tp in mine and tp not in self._holding]
                if ready:
                    consumer.resume(*ready)
        logger.info("assigned partitions %s", _fmt_tps(assigned))

    async def _mark_redelivered(
        self, consumer: Any, tps: list[TopicPartition], committed: dict[TopicPartition, Any]
    ) -> None:
        """Notes, for partitions resumed from a commit, up to where their messages may have
        run already: everything the previous owner could have fetched, i.e. up to the end."""
        ends = await asyncio.wait_for(consumer.end_offsets(tps), self._config.offset_lookup_timeout)
        for tp in tps:
            if ends[tp] > committed[tp].offset:
                self._redelivered_below[tp] = ends[tp]
                logger.info(
                    "%s[%d]: offsets %d-%d may have run under the previous owner; their runs "
                    "ask the API first",
                    tp.topic,
                    tp.partition,
                    committed[tp].offset,
                    ends[tp] - 1,
                )

    async def _read_committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, Any]:
        """Each partition's committed offset and metadata (``OffsetAndMetadata``)."""
        delay = 0.2
        for attempt in range(1, _LOOKUP_ATTEMPTS + 1):
            try:
                result: dict[TopicPartition, Any] = await asyncio.wait_for(
                    self._admin.list_consumer_group_offsets(
                        self._config.group_id, partitions=list(tps)
                    ),
                    self._config.offset_lookup_timeout,
                )
                return result
            except (KafkaError, TimeoutError):
                if attempt == _LOOKUP_ATTEMPTS:
                    raise
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def _start_fresh(self, consumer: Any, tps: list[TopicPartition]) -> None:
        """Seeks partitions without a committed offset to the first message of the lookback
        window (or to their end when none is that recent); with no lookback, leaves them to
        ``auto_offset_reset`` (the earliest retained message)."""
        lookback = self._config.new_group_lookback
        if lookback <= 0:
            return
        since_ms = int((time.time() - lookback) * 1000)
        found = await asyncio.wait_for(
            consumer.offsets_for_times({tp: since_ms for tp in tps}),
            self._config.offset_lookup_timeout,
        )
        missing = [tp for tp in tps if found.get(tp) is None]
        ends = (
            await asyncio.wait_for(
                consumer.end_offsets(missing), self._config.offset_lookup_timeout
            )
            if missing
            else {}
        )
        for tp in tps:
            hit = found.get(tp)
            offset = hit.offset if hit is not None else ends[tp]
            consumer.seek(tp, offset)
            logger.info(
                "%s[%d] has no committed offset: starting at offset %d, %s",
                tp.topic,
                tp.partition,
                offset,
                f"its first message of the last {lookback:g} s"
                if hit is not None
                else f"its end (no message in the last {lookback:g} s)",
            )

    async def _shutdown(self, consumer: Any | None) -> None:
        """Stops fetching, gives running handlers the grace period, commits, leaves the group.
        ``consumer`` is None when the worker was stopped while replacing a wedged one: the
        handlers still get their grace, and there is nothing to commit to."""
        self._stopping = True
        if consumer is not None:
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
        if consumer is None:
            logger.info("consumer stopped (none was running)")
            return
        try:
            await self._commit(
                consumer, self._tracker.committable(), stuck_after=self._config.commit_stuck
            )
        except ConsumerWedged as e:
            # Their messages are delivered again; the runs that finished ask the API first.
            logger.error("%s; stopping without it", e)
            await self._drop(consumer)
            logger.info("consumer stopped")
            return
        await consumer.stop()
        await self._admin.close()
        self._consumer = self._admin = None
        logger.info("consumer stopped")


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Hands ``consumer``'s rebalances to its owner while it is the owner's consumer: one
    dropped as wedged and left behind must not revoke what its successor tracks."""

    def __init__(self, owner: KafkaRunConsumer, consumer: Any) -> None:
        self._owner = owner
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self._owner._consumer is self._consumer:
            await self._owner._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._owner._consumer is self._consumer:
            await self._owner._on_assigned(set(assigned))


def _fmt_tps(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)) or "none"


def _fmt(commits: dict[TopicPartition, Commit]) -> str:
    return ", ".join(
        f"{tp.topic}[{tp.partition}]={c.offset}" + (f"+{len(c.finished)}" if c.finished else "")
        for tp, c in sorted(commits.items())
    )


def _record_time(message: Any) -> datetime | None:
    """A fetched record's timestamp (its CreateTime, or the broker's append time if the topic
    says so); None if it has none."""
    ms = message.timestamp
    return datetime.fromtimestamp(ms / 1000, UTC) if ms is not None and ms >= 0 else None
