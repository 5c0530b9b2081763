"""The run queue's Kafka backend: produce run messages to a tier's topic, in batches."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError
from aiokafka.protocol.metadata import MetadataRequest

from scheduler.errors import Unavailable
from worker.kafka_security import KafkaSecurity

logger = logging.getLogger(__name__)

RUN_MESSAGE_SCHEMA_VERSION = 1
# A batch's sends must be acknowledged within this (above the 10 s request timeout, which
# covers one request, not a wait for metadata or buffer space on a broken connection).
SEND_DEADLINE = 15.0


class Keyed(Protocol):
    """What the queue produces: a run message or a dead letter (both carry these ids)."""

    @property
    def run_id(self) -> str: ...
    @property
    def schedule_id(self) -> str: ...
    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...


class KafkaRunQueue:
    """Produces RunMessages with ``acks=all`` and the idempotent producer.

    ``enqueue`` sends a whole batch and returns when every message is acknowledged: messages
    are keyed by schedule id, so one schedule's runs stay in order on one partition.
    """

    def __init__(
        self, bootstrap: str, *, linger_ms: int = 5, security: KafkaSecurity | None = None
    ) -> None:
        self._bootstrap = bootstrap
        self._linger_ms = linger_ms
        self._security = security or KafkaSecurity()
        self._stale = False
        self._producer = self._new_producer()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
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
            await self._producer.start()
        except KafkaConnectionError as e:
            await self._producer.stop()
            self._producer = self._new_producer()
            raise _unreachable(self._bootstrap, self._security, e) from e

    async def stop(self) -> None:
        await self._producer.stop()

    async def probe(self) -> None:
        """Returns when a broker answers a metadata request; raises (KafkaError) when none
        does: the dispatcher's health probe of Kafka.

        The request names no topic, so the broker answers with its brokers alone. (Asking for
        all metadata, as the client's ``fetch_all_metadata`` does, made every probe, every 2 s,
        carry every topic of the cluster: 633 on the development broker, 2.4 % of a busy
        dispatcher's samples.)"""
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
        within the send deadline. After a deadline passed the producer is replaced before the
        next batch: one left waiting on a broker that restarted can hang for good."""
        if self._stale:
            await self._restart()
        try:
            await asyncio.wait_for(self._send(topic, messages), SEND_DEADLINE)
        except TimeoutError:
            self._stale = True
            raise

    async def _send(self, topic: str, messages: Sequence[Keyed]) -> None:
        futures = []
        for m in messages:
            headers = [("cronscale-run-id", m.run_id.encode())]
            futures.append(
                await self._producer.send(
                    topic,
                    value=m.SerializeToString(),
                    key=m.schedule_id.encode(),
                    headers=headers,
                )
            )
        await asyncio.gather(*futures)

    async def _restart(self) -> None:
        logger.warning("replacing the Kafka producer after a send passed its deadline")
        old, self._producer = self._producer, self._new_producer()
        try:
            await asyncio.wait_for(old.stop(), 5)
        except Exception as e:
            logger.warning("stopping the old producer failed: %s", e)
        await self._producer.start()  # raises while Kafka is away: replaced again next time
        self._stale = False


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
