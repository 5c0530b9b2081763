"""The clients' security settings against real secured servers: a private Cassandra with
PasswordAuthenticator and TLS, and a private Kafka with a SASL_SSL (PLAIN) listener, both
serving a certificate made here. Migrating, the stores, the dispatcher's producer and the
worker's consumer all get through with the right settings; a wrong password, an unverifiable
certificate and a plaintext client are refused, each with an error that says so."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc.aio
import pytest

from bucketer.cql import CassandraSecurity, StorageUnavailable, connect
from cronscale.v1 import run_message_pb2
from cronscale.v1 import run_reporting_service_pb2 as rr_pb2
from cronscale.v1 import run_reporting_service_pb2_grpc as rr_grpc
from ops.local import LocalSettings, down, up
from ops.migrate import migrate
from scheduler.config import Config
from scheduler.errors import Unavailable
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.session import open_stores
from tests.services import private_stack_settings
from tests.services import test_config as isolated_config
from tests.tls import self_signed
from worker.config import WorkerConfig
from worker.handlers import HandlerContext, HandlerRegistry
from worker.kafka_security import KafkaSecurity
from worker.main import run_worker

pytestmark = pytest.mark.integration

KAFKA_USER, KAFKA_PASSWORD = "cronscale", "kafka-s3cret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class Secured:
    config: Config
    wrong_ca: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    home = tmp_path_factory.mktemp("secured")
    tls = home / "tls"
    tls.mkdir()
    cert, key = self_signed(tls, "server")
    wrong_ca, _ = self_signed(tls, "other")
    keystore = tls / "server.pem"  # key and certificate in one PEM, as both servers read it
    keystore.write_bytes(key.read_bytes() + cert.read_bytes())
    settings = private_stack_settings(home)
    secure_port = _free_port()
    settings = dataclasses.replace(
        settings,
        cassandra_extra_yaml=(
            "authenticator: PasswordAuthenticator\n"
            "client_encryption_options:\n"
            "  enabled: true\n"
            "  optional: true\n"  # plain too, for the stack's readiness probe
            "  ssl_context_factory:\n"
            "    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory\n"
            f"  keystore: {keystore}\n"
        ),
        kafka_extra_properties=_kafka_sasl_ssl(settings, secure_port, keystore),
    )
    up(settings, out=lambda _line: None)
    try:
        config = isolated_config(
            cassandra_hosts=(settings.host,),
            cassandra_port=settings.cql_port,
            cassandra_security=CassandraSecurity(
                username="cassandra", password="cassandra", ca_file=str(cert)
            ),
            kafka_bootstrap=f"{settings.host}:{secure_port}",
            kafka_security=KafkaSecurity(
                protocol="SASL_SSL",
                mechanism="PLAIN",
                username=KAFKA_USER,
                password=KAFKA_PASSWORD,
                ca_file=str(cert),
            ),
        )
        _wait_for_superuser(config)
        yield Secured(config=config, wrong_ca=wrong_ca)
    finally:
        down(settings, out=lambda _line: None)


def _kafka_sasl_ssl(settings: LocalSettings, port: int, keystore: Path) -> str:
    """A SASL_SSL listener beside the plain one (later keys win over the template's)."""
    plain = f"PLAINTEXT://{settings.host}:{settings.kafka_port}"
    controller = f"CONTROLLER://{settings.host}:{settings.kafka_controller_port}"
    secure = f"SASL_SSL://{settings.host}:{port}"
    return "\n".join(
        [
            f"listeners={plain},{controller},{secure}",
            f"advertised.listeners={plain},{controller},{secure}",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
            "SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms=PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config="
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{KAFKA_USER}="{KAFKA_PASSWORD}";',
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={keystore}",
        ]
    )


def _wait_for_superuser(config: Config) -> None:
    """Cassandra creates its default superuser some seconds after it starts answering."""
    deadline = time.monotonic() + 60
    while True:
        try:
            session = connect(
                config.cassandra_hosts,
                config.cassandra_port,
                security=config.cassandra_security,
            )
        except StorageUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
            continue
        session.cluster.shutdown()
        return


async def test_cassandra_takes_the_credentials_over_tls_and_refuses_the_rest(
    secured: Secured,
) -> None:
    config = secured.config
    await asyncio.to_thread(migrate, config, lambda _line: None)
    stores = await open_stores(config)
    try:
        assert stores.timers.shard_count == config.shard_count
    finally:
        stores.close()
    wrong_password = dataclasses.replace(config.cassandra_security, password="not-the-password")
    with pytest.raises(StorageUnavailable, match=r"(?i)authentication|credentials"):
        connect(config.cassandra_hosts, config.cassandra_port, security=wrong_password)
    unverifiable = dataclasses.replace(config.cassandra_security, ca_file=str(secured.wrong_ca))
    with pytest.raises(StorageUnavailable, match=r"(?i)certificate"):
        connect(config.cassandra_hosts, config.cassandra_port, security=unverifiable)
    with pytest.raises(StorageUnavailable):
        connect(config.cassandra_hosts, config.cassandra_port)  # plaintext, no credentials


class _Acks(rr_grpc.RunReportingServiceServicer):
    async def ReportRuns(
        self, request: rr_pb2.ReportRunsRequest, context: object
    ) -> rr_pb2.ReportRunsResponse:
        return rr_pb2.ReportRunsResponse(
            acks=[rr_pb2.RunEventAck(run_id=e.run_id) for e in request.events]
        )

    async def StartRun(self, request: rr_pb2.RunEvent, context: object) -> rr_pb2.RunEventAck:
        raise NotImplementedError

    HeartbeatRun = CompleteRun = StartRun


async def test_kafka_takes_sasl_over_tls_from_the_producer_and_the_worker(
    secured: Secured,
) -> None:
    config = secured.config
    topic = config.topic()
    await ensure_topics(
        config.kafka_bootstrap, [topic], partitions=1, security=config.kafka_security
    )
    queue = KafkaRunQueue(config.kafka_bootstrap, security=config.kafka_security)
    await queue.start()
    try:
        message = run_message_pb2.RunMessage(
            schema_version=1,
            run_id="secured-1",
            schedule_id="secured",
            tenant="acme",
            handler="count",
            attempt=1,
        )
        message.scheduled_for.FromDatetime(datetime.now(UTC))
        message.enqueue_time.FromDatetime(datetime.now(UTC))
        await queue.enqueue(topic, [message])
    finally:
        await queue.stop()

    api_port = _free_port()
    server = grpc.aio.server()
    rr_grpc.add_RunReportingServiceServicer_to_server(_Acks(), server)
    server.add_insecure_port(f"127.0.0.1:{api_port}")
    await server.start()
    ran: list[str] = []
    registry = HandlerRegistry()

    async def count(ctx: HandlerContext) -> None:
        ran.append(ctx.run_id)

    registry.register("count", count)
    worker_config = WorkerConfig(
        kafka_bootstrap=config.kafka_bootstrap,
        kafka_security=config.kafka_security,
        topic_prefix=config.topic_prefix,
        api_target=f"127.0.0.1:{api_port}",
        instance_id="secured-worker",
    )
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(worker_config, stop, registry))
    try:
        deadline = time.monotonic() + 60
        while "secured-1" not in ran:
            assert time.monotonic() < deadline, "the worker did not run the message"
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        await server.stop(None)

    with pytest.raises(Unavailable, match="a refused login"):
        await ensure_topics(
            config.kafka_bootstrap,
            [topic],
            partitions=1,
            security=dataclasses.replace(config.kafka_security, password="not-the-password"),
        )
