"""`cronscale local up|down|status` for real: Cassandra and Kafka JVMs in a private home.

The stack under test lives in its own home folder on its own ports, so the main local stack
that the other integration tests use (default ports, <repo>/.local) is never touched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import RoundRobinPolicy

from ops.local import LocalSettings, LocalStackError, down, reset, status, up
from ops.local.process import port_in_use

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[LocalSettings]:
    settings = dataclasses.replace(
        LocalSettings.from_env(),
        home=tmp_path / "local",
        cql_port=19042,
        storage_port=17000,
        jmx_port=17199,
        kafka_port=19092,
        kafka_controller_port=19093,
    )
    yield settings
    # Whatever happened above, leave no JVM of this stack behind.
    down(settings, out=lambda _line: None)


def _cassandra_release(settings: LocalSettings) -> str:
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=10)
    cluster = Cluster(
        contact_points=[settings.host],
        port=settings.cql_port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
    )
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        return str(row.release_version)
    finally:
        cluster.shutdown()


async def _kafka_round_trip(settings: LocalSettings) -> bytes:
    """Create a topic, produce one record idempotently, consume it in a group and commit."""
    bootstrap = f"{settings.host}:{settings.kafka_port}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("local-stack-smoke", 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait("local-stack-smoke", b"hello", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "local-stack-smoke",
        bootstrap_servers=bootstrap,
        group_id="local-stack-smoke",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=60)
        await consumer.commit()  # needs __consumer_offsets: replication factor 1 on one node
    finally:
        await consumer.stop()
    value: bytes = record.value
    return value


@pytest.mark.timeout(600)
def test_up_is_idempotent_status_sees_a_crash_and_down_cleans_up(
    settings: LocalSettings,
) -> None:
    lines: list[str] = []
    first = up(settings, out=lines.append)
    cassandra, kafka = first.service("cassandra"), first.service("kafka")
    assert cassandra.started and kafka.started
    assert f"starting cassandra {settings.cassandra_version} on 127.0.0.1:19042..." in lines
    assert any(line.startswith("cassandra ready after ") for line in lines)
    assert any(line.startswith("kafka ready after ") for line in lines)
    assert (settings.home / "lib" / f"cassandra-{settings.cassandra_version}").is_dir()
    assert (settings.home / "kafka" / "cluster.id").is_file()

    # Both answer real clients.
    assert _cassandra_release(settings) == settings.cassandra_version
    assert asyncio.run(_kafka_round_trip(settings)) == b"hello"
    assert [(s.name, s.state, s.pid) for s in status(settings)] == [
        ("cassandra", "up", cassandra.pid),
        ("kafka", "up", kafka.pid),
    ]

    # A second up starts nothing.
    lines.clear()
    second = up(settings, out=lines.append)
    assert not second.started_any
    assert second.service("cassandra").pid == cassandra.pid
    assert second.service("kafka").pid == kafka.pid
    assert lines == [
        f"cassandra already up (pid {cassandra.pid}, port 19042)",
        f"kafka already up (pid {kafka.pid}, port 19092)",
    ]

    # Cassandra dies behind the stack's back: status notices.
    os.kill(cassandra.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    # While the JVM is dying it is "down (process running but not answering ...)".
    while (report := status(settings))[0].detail != f"process {cassandra.pid} exited":
        assert time.monotonic() < deadline, report
        time.sleep(0.2)
    assert report[0].state == "down"
    assert report[0].pid == cassandra.pid
    assert (report[1].name, report[1].state) == ("kafka", "up")

    # down stops Kafka, forgets the dead Cassandra, and removes every pid file.
    lines.clear()
    stops = {stop.name: stop for stop in down(settings, out=lines.append)}
    assert stops["kafka"].pid == kafka.pid
    assert stops["kafka"].outcome in ("terminated", "killed")
    assert stops["cassandra"].outcome == "not running"
    assert any(line.startswith(f"stopped kafka (pid {kafka.pid})") for line in lines)
    assert list((settings.home / "run").glob("*.pid")) == []
    assert not port_in_use(settings.host, settings.kafka_port)
    assert [(s.state, s.detail) for s in status(settings)] == [
        ("down", "not started"),
        ("down", "not started"),
    ]

    # And down again is a no-op.
    lines.clear()
    down(settings, out=lines.append)
    assert lines == ["cassandra is not running", "kafka is not running"]

    # reset deletes what both servers wrote; the jars and Kafka's cluster id stay.
    for name in ("cassandra", "kafka"):
        assert any(settings.data_dir(name).rglob("*")), name
    lines.clear()
    reset(settings, out=lines.append)
    assert lines[:2] == ["cassandra is not running", "kafka is not running"]
    assert [line.split(" (")[0] for line in lines[2:]] == [
        "deleted cassandra's data",
        "deleted kafka's data",
    ]
    assert not settings.data_dir("cassandra").exists()
    assert not settings.data_dir("kafka").exists()
    assert (settings.home / "lib" / f"cassandra-{settings.cassandra_version}").is_dir()
    assert (settings.home / "kafka" / "cluster.id").is_file()
    lines.clear()
    reset(settings, out=lines.append)
    assert lines[2:] == ["cassandra has no data to delete", "kafka has no data to delete"]


def test_reset_deletes_nothing_while_a_port_of_the_stack_is_held(settings: LocalSettings) -> None:
    """A server this stack has no pid of may be writing into its home: reset refuses."""
    data = settings.data_dir("kafka")
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("kept\n")
    with socket.socket() as held:
        held.bind((settings.host, settings.kafka_port))
        held.listen()
        with pytest.raises(LocalStackError, match="port 19092 is still in use"):
            reset(settings, out=lambda _line: None)
    assert (data / "meta.properties").read_text() == "kept\n"
