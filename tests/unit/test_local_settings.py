"""ops.local without starting servers: settings, port checks, Java detection, rendering."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.local import LocalSettings, LocalStackError, ServiceStatus, check_ports, format_status
from ops.local.cassandra import CassandraService
from ops.local.kafka import KafkaService, _decode_metadata, random_cluster_id
from ops.local.maven import MARKER_NAME, lib_complete
from ops.local.prereqs import check_java, parse_java_major
from ops.local.process import (
    PidRecord,
    current_timer_slack,
    launch,
    read_pid_file,
    tail,
    timer_slack,
    write_pid_file,
)
from ops.local.settings import REPO_ROOT


def test_defaults_from_an_empty_environment() -> None:
    s = LocalSettings.from_env({})
    assert s.home == REPO_ROOT / ".local"
    assert (s.cassandra_version, s.kafka_version) == ("5.0.8", "4.3.1")
    assert (s.cql_port, s.storage_port, s.jmx_port) == (9042, 7000, 7199)
    assert (s.kafka_port, s.kafka_controller_port) == (9092, 9093)
    assert (s.cassandra_heap, s.kafka_heap) == ("1g", "512m")
    assert s.start_timeout_s == 240.0
    assert s.cassandra_timer_slack_us == 4000
    assert CassandraService(s).timer_slack_ns == 4_000_000
    assert KafkaService(s).timer_slack_ns == 0  # the launching process's
    assert s.lib_dir("cassandra") == s.home / "lib" / "cassandra-5.0.8"
    assert s.lib_dir("kafka") == s.home / "lib" / "kafka-4.3.1"
    assert s.pid_file("kafka") == s.home / "run" / "kafka.pid"
    assert s.kafka_cluster_id_file == s.home / "kafka" / "cluster.id"


def test_every_variable_is_read(tmp_path: Path) -> None:
    s = LocalSettings.from_env(
        {
            "CRONSCALE_LOCAL_HOME": str(tmp_path / "home"),
            "CRONSCALE_CASSANDRA_VERSION": "5.0.7",
            "CRONSCALE_KAFKA_VERSION": "4.2.0",
            "CRONSCALE_LOCAL_CQL_PORT": "19042",
            "CRONSCALE_LOCAL_STORAGE_PORT": "17000",
            "CRONSCALE_LOCAL_JMX_PORT": "0",
            "CRONSCALE_LOCAL_KAFKA_PORT": "19092",
            "CRONSCALE_LOCAL_KAFKA_CONTROLLER_PORT": "19093",
            "CRONSCALE_LOCAL_CASSANDRA_HEAP": "768m",
            "CRONSCALE_LOCAL_KAFKA_HEAP": "1G",
            "CRONSCALE_LOCAL_START_TIMEOUT": "90",
            "CRONSCALE_LOCAL_CASSANDRA_JVM_OPTS": " -da  -XX:+UseParallelGC ",
            "CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US": "0",
        }
    )
    assert s.home == tmp_path / "home"
    assert (s.cassandra_version, s.kafka_version) == ("5.0.7", "4.2.0")
    assert (s.cql_port, s.storage_port, s.jmx_port) == (19042, 17000, 0)
    assert (s.kafka_port, s.kafka_controller_port) == (19092, 19093)
    assert (s.cassandra_heap, s.kafka_heap) == ("768m", "1G")
    assert s.start_timeout_s == 90.0
    # Cassandra's extra JVM options come after the project's own, so they win.
    assert s.cassandra_jvm_opts == ("-da", "-XX:+UseParallelGC")
    assert CassandraService(s).timer_slack_ns == 0
    command = CassandraService(s).command()
    assert command.index("-da") > command.index("-ea")
    # JMX port 0 means off: not a port to check, not on the command line.
    assert [p.port for p in s.ports("cassandra")] == [19042, 17000]
    assert not any("jmx.local.port" in arg for arg in CassandraService(s).command())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CRONSCALE_LOCAL_CQL_PORT": "cql"}, "CRONSCALE_LOCAL_CQL_PORT must be an integer"),
        ({"CRONSCALE_LOCAL_KAFKA_PORT": "70000"}, "CRONSCALE_LOCAL_KAFKA_PORT must be a TCP port"),
        ({"CRONSCALE_LOCAL_KAFKA_PORT": "9042"}, "port 9042 is configured twice"),
        ({"CRONSCALE_LOCAL_KAFKA_HEAP": "lots"}, "invalid kafka heap 'lots'"),
        ({"CRONSCALE_LOCAL_START_TIMEOUT": "-1"}, "CRONSCALE_LOCAL_START_TIMEOUT must be positive"),
        ({"CRONSCALE_CASSANDRA_VERSION": "5.0.8; rm"}, "invalid cassandra version"),
        (
            {"CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US": "1ms"},
            r"CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US must be an integer \(got '1ms'\)",
        ),
        (
            {"CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US": "-1"},
            r"CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US must be between 0 and 100000 "
            r"microseconds \(got -1\)",
        ),
        (
            {"CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US": "100001"},
            r"must be between 0 and 100000 microseconds \(got 100001\)",
        ),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(LocalStackError, match=message):
        LocalSettings.from_env(env)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each socket stays bound until all are chosen (bound and
    closed one at a time, the kernel may hand out the same port twice, which the settings then
    refuse as configured twice)."""
    with contextlib.ExitStack() as held:
        socks = [
            held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def test_a_taken_port_is_named_with_its_variable(tmp_path: Path, taken_port: int) -> None:
    storage, kafka, controller = _free_ports(3)
    settings = LocalSettings(
        home=tmp_path,
        cql_port=taken_port,
        storage_port=storage,
        jmx_port=0,
        kafka_port=kafka,
        kafka_controller_port=controller,
    )
    with pytest.raises(LocalStackError) as caught:
        check_ports(settings)
    assert str(caught.value) == (
        f"port {taken_port} is already in use by another process; "
        "set CRONSCALE_LOCAL_CQL_PORT or stop it"
    )
    # Only the services about to start are checked.
    check_ports(settings, ("kafka",))


def test_free_ports_pass(tmp_path: Path) -> None:
    cql, storage, jmx, kafka, controller = _free_ports(5)
    settings = LocalSettings(
        home=tmp_path,
        cql_port=cql,
        storage_port=storage,
        jmx_port=jmx,
        kafka_port=kafka,
        kafka_controller_port=controller,
    )
    check_ports(settings)


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('java version "1.8.0_392"\nJava(TM) SE Runtime Environment', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "11.0.22-ea" 2024-01-16', 11),
        ("no version here", None),
    ],
)
def test_java_major_version(output: str, major: int | None) -> None:
    assert parse_java_major(output) == major


def test_missing_java_says_what_to_install() -> None:
    with pytest.raises(LocalStackError, match=r"^Java 17 is required \(found none\); install"):
        check_java("/nonexistent/bin/java")


def test_pid_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "cassandra.pid"
    write_pid_file(path, PidRecord(pid=4242, port=9042))
    assert path.read_text() == "4242\n9042\n"
    assert read_pid_file(path) == PidRecord(pid=4242, port=9042)
    path.write_text("garbage")
    assert read_pid_file(path) is None


def test_lib_folder_is_complete_only_with_marker_and_every_jar(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.jar").write_bytes(b"")
    (lib / "main.jar").write_bytes(b"")
    assert not lib_complete(lib, "main.jar")
    (lib / MARKER_NAME).write_text('{"jars": ["a.jar", "main.jar"]}')
    assert lib_complete(lib, "main.jar")
    (lib / "a.jar").unlink()
    assert not lib_complete(lib, "main.jar")


def test_tail_cuts_long_lines(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "x" * 5000 + "\n")
    lines = tail(log, 3).splitlines()
    assert lines[:2] == ["line 98", "line 99"]
    assert lines[2].endswith(" [...]")
    assert len(lines[2]) < 500
    assert tail(tmp_path / "missing.log").endswith("does not exist)")


def test_rendered_config_uses_the_settings(tmp_path: Path) -> None:
    settings = dataclasses.replace(
        LocalSettings.from_env({}),
        home=tmp_path,
        cql_port=19042,
        storage_port=17000,
        kafka_port=19092,
        kafka_controller_port=19093,
    )
    CassandraService(settings).prepare()
    yaml = (tmp_path / "cassandra" / "conf" / "cassandra.yaml").read_text()
    assert "native_transport_port: 19042\n" in yaml
    assert 'seeds: "127.0.0.1:17000"' in yaml
    assert "paxos_variant: v2\n" in yaml
    assert f"  - {tmp_path}/cassandra/data/data\n" in yaml
    assert "$" not in yaml
    assert (tmp_path / "cassandra" / "conf" / "logback.xml").is_file()

    kafka = KafkaService(settings)
    kafka.write_config()  # prepare() would also format the storage, which runs Java
    props = dict(
        line.split("=", 1)
        for line in kafka.properties_path.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["auto.create.topics.enable"] == "false"


def test_cluster_ids_look_like_kafka_uuids() -> None:
    for _ in range(200):
        cid = random_cluster_id()
        assert len(cid) == 22
        assert not cid.startswith("-")


def test_metadata_response_decoding() -> None:
    def string(text: str | None) -> bytes:
        if text is None:
            return struct.pack(">h", -1)
        return struct.pack(">h", len(text)) + text.encode()

    payload = (
        struct.pack(">iii", 1, 0, 1)
        + struct.pack(">i", 1)
        + string("127.0.0.1")
        + struct.pack(">i", 9092)
        + string(None)
        + string("abc")
        + struct.pack(">ii", 1, 0)
    )
    metadata = _decode_metadata(payload)
    assert metadata.cluster_id == "abc"
    assert metadata.controller_id == 1
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(1, "127.0.0.1", 9092)]


def test_format_status_says_why_a_service_is_down() -> None:
    text = format_status(
        [
            ServiceStatus(
                name="cassandra", state="down", pid=4242, port=9042, detail="process 4242 exited"
            ),
            ServiceStatus(name="kafka", state="up", pid=4243, port=9092, detail="cluster abc"),
        ]
    )
    first, second = text.splitlines()
    assert first.startswith("cassandra  down (process 4242 exited)")
    assert "pid 4242" in first and first.endswith("port 9042")
    assert second.startswith("kafka      up (cluster abc)")


def test_a_server_is_launched_with_its_timer_slack_and_ours_is_put_back(tmp_path: Path) -> None:
    ours = current_timer_slack()
    log = tmp_path / "slack.log"
    # The child reports its own slack, and a process it starts inherits it (so do threads).
    proc = launch(
        ["sh", "-c", "cat /proc/self/timerslack_ns; (cat /proc/self/timerslack_ns)"],
        log_path=log,
        cwd=tmp_path,
        timer_slack_ns=750_000,
    )
    assert proc.wait(timeout=30) == 0
    assert log.read_text().split() == ["750000", "750000"]
    assert current_timer_slack() == ours
    # 0: the child keeps the launching thread's.
    proc = launch(["cat", "/proc/self/timerslack_ns"], log_path=log, cwd=tmp_path)
    assert proc.wait(timeout=30) == 0
    assert log.read_text().split() == [str(ours)]


def test_the_timer_slack_is_put_back_when_the_launch_fails(tmp_path: Path) -> None:
    ours = current_timer_slack()
    with pytest.raises(FileNotFoundError):
        launch(
            [str(tmp_path / "no-such-server")],
            log_path=tmp_path / "x.log",
            cwd=tmp_path,
            timer_slack_ns=2_000_000,
        )
    assert current_timer_slack() == ours
    with timer_slack(0):
        assert current_timer_slack() == ours
