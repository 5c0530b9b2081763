"""The run queue's Kafka backend: the run message a worker receives (``run_message``), and
producing run messages to a tier's topic, in batches."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, cast

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
    UnsupportedForMessageFormatError,
)
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.protocol.metadata import MetadataRequest

from cronscale.v1 import run_message_pb2
from scheduler.errors import Unavailable
from scheduler.model import OverlapMode, Run, Schedule
from worker.kafka_security import KafkaSecurity
from worker.timestamps import set_timestamp

logger = logging.getLogger(__name__)

RUN_MESSAGE_SCHEMA_VERSION = 1
# A batch's sends must be acknowledged within this (above the 10 s request timeout, which
# covers one request, not a wait for metadata or buffer space on a broken connection).
SEND_DEADLINE = 15.0
# How long a replaced producer has to flush before it is closed regardless (``_close``).
STOP_DEADLINE = 5.0
# How long a producer has to start (connect, and get its idempotent producer id).
START_DEADLINE = 30.0
# Kafka's answers about the messages themselves: sending them again cannot succeed (their
# timers are poison). Any other KafkaError is about the brokers or the producer's own state.
MESSAGE_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
    UnsupportedForMessageFormatError,
)


_DEFAULT_PARTITIONER = DefaultPartitioner()


class KeyPartitioner:
    """aiokafka's ``DefaultPartitioner`` (a key's murmur2, as the Java client's default), with
    each key's hash kept: a schedule's runs are produced every slot under the same key, and the
    pure-Python murmur2 cost ~3 µs a message. Keeps at most ``keys`` hashes, then starts over
    (~140 bytes a key: ~18 MiB full at the default, which holds the 100,000 schedules of a
    dispatcher firing 100,000 a minute)."""

    def __init__(self, keys: int = 1 << 17) -> None:
        self._keys = keys
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return cast(int, _DEFAULT_PARTITIONER(key, all_partitions, available))
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= self._keys:
                self._hashes.clear()
            h = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[h % len(all_partitions)]


class Keyed(Protocol):
    """What the queue produces: a run message or a dead letter (both carry these ids)."""

    @property
    def run_id(self) -> str: ...
    @property
    def schedule_id(self) -> str: ...
    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...


def run_message(
    s: Schedule, run: Run, *, lease_at: datetime | None, next_fire: datetime | None
) -> run_message_pb2.RunMessage:
    """The message that hands ``run`` of ``s`` to a worker (decoded by ``worker.messages``).

    ``lease_at`` is set when a lease timer of the run's own waits for its outcome (the API
    settles it), None when its lease is carried by the schedule's next fire timer;
    ``next_fire`` when the API is to note the run's end on that timer, due then (decision
    0013). The run must have its enqueue time: the worker echoes it in its reports."""
    if run.enqueue_time is None:
        raise ValueError(f"run {run.run_id} has no enqueue time; only enqueued runs are sent")
    m = run_message_pb2.RunMessage(
        schema_version=RUN_MESSAGE_SCHEMA_VERSION,
        run_id=run.run_id,
        schedule_id=s.schedule_id,
        tenant=s.tenant,
        handler=s.handler,
        payload=s.payload,
        attempt=run.attempt,
        manual=run.manual,
        follow_up=(
            run_message_pb2.FOLLOW_UP_REQUIRED
            if s.downstream or s.policies.overlap is OverlapMode.BUFFER_ONE
            else run_message_pb2.FOLLOW_UP_NONE
        ),
    )
    set_timestamp(m.scheduled_for, run.scheduled_for)
    set_timestamp(m.enqueue_time, run.enqueue_time)
    if lease_at is not None:
        set_timestamp(m.lease_expire_time, lease_at)
    if next_fire is not None:
        set_timestamp(m.next_fire_time, next_fire)
    if s.max_runtime:
        m.max_runtime.FromTimedelta(s.max_runtime)
    return m


class KafkaRunQueue:
    """Produces RunMessages with ``acks=all`` and the idempotent producer.

    ``enqueue`` sends a whole batch and returns when every message is acknowledged: messages
    are keyed by schedule id, so one schedule's runs stay in order on one partition.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        linger_ms: int = 5,
        security: KafkaSecurity | None = None,
        start_deadline: float = START_DEADLINE,
        stop_deadline: float = STOP_DEADLINE,
    ) -> None:
        self._bootstrap = bootstrap
        self._linger_ms = linger_ms
        self._security = security or KafkaSecurity()
        self._start_deadline = start_deadline
        self._stop_deadline = stop_deadline
        self._stale = False
        # Whether the current producer started (one replaced after a failure has not yet).
        self._running = False
        # Starts that failed since the producer last ran: an outage is logged at its first
        # replacement and at its end, not at every probe's attempt (every 2 s) in between.
        self._failed_starts = 0
        self._restarting = asyncio.Lock()
        # A restart the health probe began (it does not wait for it: ``probe``).
        self._recovery: asyncio.Task[None] | None = None
        self._partitioner = KeyPartitioner()
        self._producer = self._new_producer()
        # Per (topic, partition): the record batches not yet handed to the producer.
        self._lanes: dict[tuple[str, int], _Lane] = {}

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            partitioner=self._partitioner,
            acks="all",
            enable_idempotence=True,
            linger_ms=self._linger_ms,
            max_batch_size=256 * 1024,
            # Well under the misfire threshold (30 s): a stalled send fails and its batch is
            # fired again before the slots it carries count as missed (aiokafka's default, 40 s,
            # turned one stall into a misfire of every due slot).
            request_timeout_ms=10_000,
            client_id="cronscale-dispatcher",
            **self._security.client_options(),
        )

    async def start(self) -> None:
        """Starts the producer; Unavailable if Kafka cannot be reached (the queue may be
        started again: a producer that failed to start is replaced, never restarted)."""
        try:
            # Bounded: aiokafka's start waits for its producer id without end while no broker
            # answers for it (a cluster half up), and a process starting would hang there.
            await asyncio.wait_for(self._producer.start(), self._start_deadline)
        except (KafkaConnectionError, TimeoutError) as e:
            self._failed_starts += 1
            failed, self._producer = self._producer, self._new_producer()
            await _close(failed, self._stop_deadline)
            why = e if str(e) else TimeoutError(f"no answer within {self._start_deadline:g} s")
            raise _unreachable(self._bootstrap, self._security, why) from e
        if self._failed_starts:
            logger.info("the Kafka producer started after %d failed attempts", self._failed_starts)
            self._failed_starts = 0
        self._running = True

    async def stop(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
        await self._producer.stop()

    async def probe(self) -> None:
        """Returns when a broker answers a metadata request; raises (KafkaError) when none
        does: the dispatcher's health probe of Kafka.

        The request names no topic, so the broker answers with its brokers alone. (Asking for
        all metadata, as the client's ``fetch_all_metadata`` does, made every probe, every 2 s,
        carry every topic of the cluster: 633 on the development broker, 2.4 % of a busy
        dispatcher's samples.)

        A producer that failed (stale) or that failed to start is replaced here too, in the
        background, not only by the next batch: a dispatcher that stepped aside while Kafka
        was away (``bucketer.ownership``) sends no batch, and its probe is what tells it to
        rejoin. Until the replacement has started, the probe fails."""
        if self._stale or not self._running:
            if self._recovery is None or self._recovery.done():
                self._recovery = asyncio.create_task(self._recover(), name="kafka-recovery")
            raise KafkaConnectionError("the Kafka producer is being replaced after a failure")
        client = self._producer.client
        nodes = [b.nodeId for b in client.cluster.brokers()]
        if not nodes:
            raise KafkaConnectionError("no Kafka broker is known yet")
        random.shuffle(nodes)
        failure: Exception | None = None
        for node in nodes:  # one broker answering is enough, as for fetch_all_metadata
            try:
                answer = await client.send(node, MetadataRequest([]))
            except KafkaError as e:
                failure = e
                continue
            if answer.brokers:
                return
            failure = KafkaError(f"Kafka broker {node}'s metadata names no broker")
        assert failure is not None
        raise failure

    async def enqueue(self, topic: str, messages: Sequence[Keyed]) -> None:
        """Produces every message; raises if any was not acknowledged by all in-sync replicas
        within the send deadline. After a deadline passed, or any failure that is not about
        the messages themselves (``MESSAGE_ERRORS``), the producer is replaced before the next
        batch: one left waiting on a broker that restarted can hang for good, and one whose
        idempotence state went wrong (``OutOfOrderSequenceNumber`` after a batch expired
        unacknowledged) fails every later batch of the partition at once."""
        if self._stale:
            await self._restart_if_stale()
        producer = self._producer
        try:
            await asyncio.wait_for(self._send(topic, messages), SEND_DEADLINE)
        except TimeoutError:
            self._mark_stale(producer)
            raise
        except KafkaError as e:
            if not isinstance(e, MESSAGE_ERRORS):
                self._mark_stale(producer)
            raise

    def _mark_stale(self, producer: AIOKafkaProducer) -> None:
        # Only the producer that failed: a batch of one already replaced fails no newer one.
        if producer is self._producer:
            self._stale = True

    async def _send(self, topic: str, messages: Sequence[Keyed]) -> None:
        """Appends each message to its partition's open record batch (:class:`_Lane`) and waits
        until every batch carrying one is acknowledged.

        Record batches, not a ``send()`` per message: a ``send()`` (a coroutine, a partitioning
        and a future each) cost the dispatcher 31-33 µs of CPU a message against 13-14 µs this
        way, its keys' hashes kept (2026-12-06; ``python -m loadtest.hot_path`` measures it).
        The partition is the one ``send()`` would choose (the key's murmur2, as the Java
        client's), a partition's batches are submitted in order, and the idempotent producer
        sequences them as it does its own. Concurrent calls share a partition's open batch, as
        ``send()`` calls share the producer's: a batch of each call per partition made a herd's
        concurrent releases wait a produce round trip per call and partition."""
        producer = self._producer
        lanes = self._lanes
        partitions = list(await producer.partitions_for(topic))
        loop = asyncio.get_running_loop()
        waiting: dict[_Batch, None] = {}
        for m in messages:
            key = m.schedule_id.encode()
            value = m.SerializeToString()
            headers = [("cronscale-run-id", m.run_id.encode())]
            partition = self._partitioner(key, partitions, partitions)
            lane = lanes.get((topic, partition))
            if lane is None:
                lane = lanes[(topic, partition)] = _Lane()
            batch = lane.open
            if (
                batch is None
                or batch.builder.append(key=key, value=value, timestamp=None, headers=headers)
                is None
            ):
                batch = _Batch(producer.create_batch(), loop.create_future())
                if (
                    batch.builder.append(key=key, value=value, timestamp=None, headers=headers)
                    is None
                ):
                    raise MessageSizeTooLargeError(
                        f"run message {m.run_id} ({len(value)} bytes) does not fit a batch"
                    )
                lane.open = batch
                lane.queued.append(batch)
                if lane.submitter is None:
                    lane.submitter = asyncio.create_task(
                        _submit(producer, topic, partition, lane),
                        name=f"produce {topic}[{partition}]",
                    )
            waiting[batch] = None
        # Not gather: cancelling this call (its deadline) must not cancel batches other calls
        # wait on too.
        if waiting:
            await asyncio.wait([batch.acked for batch in waiting])
        for batch in waiting:
            batch.acked.result()  # raises what the batch failed with

    async def _restart(self) -> None:
        if self._running:  # the first replacement; while Kafka stays away, one per probe
            logger.warning(
                "replacing the Kafka producer after a send failed or passed its deadline"
            )
        else:
            logger.debug(
                "replacing the Kafka producer again (%d failed starts)", self._failed_starts
            )
        old, self._producer = self._producer, self._new_producer()
        self._running = False
        # The old producer's lanes fail with it; the next messages start new ones.
        self._lanes = {}
        await _close(old, self._stop_deadline)
        await self.start()  # raises while Kafka is away: replaced again next time
        self._stale = False

    async def _restart_if_stale(self) -> None:
        # Concurrent callers find it stale together: one replaces it, the rest use that.
        async with self._restarting:
            if self._stale:
                await self._restart()

    async def _recover(self) -> None:
        """Replaces a stale producer, or starts one that failed to: the probe's restart."""
        try:
            await self._restart_if_stale()
            async with self._restarting:
                if not self._running:
                    await self.start()
        except Exception as e:  # a background task's: the next probe tries again
            # The outage was logged when it began; its end is logged by ``start``.
            logger.debug("the Kafka producer is not back yet: %s: %s", type(e).__name__, e)


async def _close(producer: AIOKafkaProducer, deadline: float) -> None:
    """Stops a replaced producer: flushes what it holds within ``deadline``, else drops it.

    aiokafka's ``stop()`` marks the producer closed first and then waits for its accumulator to
    drain; cut off there, it never stops its sender task or closes its connections, and a later
    ``stop()`` returns at once. That sender went on retrying its batches and delivered them
    once Kafka was back, long after the firings they carry were sent again: so its sender and
    client are closed here (aiokafka's own ``Sender.close`` and ``client.close``), and the
    batches it still held fail."""
    try:
        await asyncio.wait_for(producer.stop(), deadline)
        return
    except Exception as e:
        logger.warning("stopping the old Kafka producer failed (%s); dropping what it holds", e)
    try:
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            await asyncio.wait_for(sender.close(), deadline)
        await asyncio.wait_for(producer.client.close(), deadline)
    except Exception as e:
        logger.warning("closing the old Kafka producer failed: %s", e)


@dataclass(eq=False, slots=True)
class _Batch:
    """A record batch of one partition and the future its senders wait on (the producer's own
    future, known only once the batch is submitted)."""

    builder: BatchBuilder
    acked: asyncio.Future[None]


@dataclass(eq=False, slots=True)
class _Lane:
    """One partition's record batches on their way to the producer, oldest first.

    ``open`` takes messages until its submitter hands it to the producer: ``send_batch`` waits
    until the partition's previous batch has left the producer's accumulator (one request in
    flight per partition), and meanwhile every call's messages for the partition fill ``open``,
    where a batch per call would wait a round trip each. A batch handed over takes no more
    messages (the producer numbers a batch's records for the idempotent producer when it
    drains it)."""

    queued: collections.deque[_Batch] = field(default_factory=collections.deque)
    open: _Batch | None = None
    submitter: asyncio.Task[None] | None = None


async def _submit(producer: AIOKafkaProducer, topic: str, partition: int, lane: _Lane) -> None:
    """Hands ``lane``'s batches to ``producer`` in order, each once the previous one left the
    accumulator; resolves each batch's future with its acknowledgement or failure.

    Cancelled (the queue or the process stopping), it fails the batch in hand and every batch
    behind it with a KafkaError at once: their senders would otherwise wait out their deadline
    for batches no one will hand over."""
    batch: _Batch | None = None
    try:
        while lane.queued:
            batch = lane.queued.popleft()
            if lane.open is batch:
                lane.open = None  # handed over: the next message starts a new batch
            try:
                sent = await producer.send_batch(batch.builder, topic, partition=partition)
            except Exception as e:
                _settle(batch.acked, e)
                batch = None
                continue
            sent.add_done_callback(functools.partial(_acked, batch.acked))
            batch = None
    except asyncio.CancelledError:
        error = KafkaError("the run queue stopped before the record batch was handed over")
        for unsent in ([batch] if batch is not None else []) + list(lane.queued):
            _settle(unsent.acked, error)
        lane.queued.clear()
        lane.open = None
        raise
    finally:
        lane.submitter = None


def _acked(acked: asyncio.Future[None], sent: asyncio.Future[Any]) -> None:
    if sent.cancelled():
        # Not a CancelledError: raised from enqueue, it would read as the caller's own
        # cancellation; a KafkaError has the firing batch sent again.
        _settle(acked, KafkaError("the producer dropped a record batch unsent (stopped?)"))
    else:
        _settle(acked, sent.exception())


def _settle(acked: asyncio.Future[None], error: BaseException | None) -> None:
    if acked.done():
        return
    if error is None:
        acked.set_result(None)
        return
    acked.set_exception(error)
    # Its senders may have given up on it (their deadline): not an unretrieved exception.
    acked.exception()


async def ensure_topics(
    bootstrap: str,
    topics: Sequence[str],
    *,
    partitions: int,
    security: KafkaSecurity | None = None,
) -> None:
    """Creates the run topics if missing (replication 1 locally; production pre-creates them)."""
    admin = await _admin(bootstrap, security)
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t not in existing]
        if missing:
            try:
                await admin.create_topics(
                    [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in missing]
                )
                logger.info("created topics %s", ", ".join(missing))
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def delete_topics(
    bootstrap: str, prefix: str, *, security: KafkaSecurity | None = None
) -> list[str]:
    """Deletes every topic named ``prefix`` or ``prefix.<anything>`` (a benchmark's or test's
    private topics once it is done: left behind, they pile up and every client's metadata
    carries them). Returns the names deleted; raises KafkaError naming a topic the broker
    refused to delete, and Unavailable (with how to start Kafka) if no broker answers."""
    admin = await _admin(bootstrap, security)
    try:
        doomed = sorted(
            t for t in await admin.list_topics() if t == prefix or t.startswith(f"{prefix}.")
        )
        if doomed:
            answer = await admin.delete_topics(doomed)
            refused = [(name, code) for name, code, *_ in answer.topic_error_codes if code]
            if refused:
                raise KafkaError(f"Kafka refused to delete topics (name, error code): {refused}")
        return doomed
    finally:
        await admin.close()


async def _admin(bootstrap: str, security: KafkaSecurity | None) -> AIOKafkaAdminClient:
    """A started admin client; Unavailable saying how to start Kafka if none answers."""
    security = security or KafkaSecurity()
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="cronscale-admin", **security.client_options()
    )
    try:
        await admin.start()
    except KafkaConnectionError as e:
        await admin.close()
        raise _unreachable(bootstrap, security, e) from e
    return admin


def _unreachable(bootstrap: str, security: KafkaSecurity, e: Exception) -> Unavailable:
    if security.sasl or security.tls:
        # aiokafka reports a refused login or certificate as a failure to connect.
        hint = (
            "check that it listens there for "
            f"{security.protocol}, and the credentials (CRONSCALE_KAFKA_USERNAME, "
            "CRONSCALE_KAFKA_PASSWORD) and CA (CRONSCALE_KAFKA_TLS_CA_FILE): a refused login "
            "or certificate looks the same here, the log above says which"
        )
    else:
        hint = (
            "start the local one with `cronscale local up` (or `make dev`), or set "
            "CRONSCALE_KAFKA_BOOTSTRAP"
        )
    return Unavailable(f"cannot reach Kafka at {bootstrap} ({e}); {hint}")
