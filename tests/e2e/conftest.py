"""End-to-end fixtures: the real api, dispatcher and worker processes on the real services."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bucketer.cql import connect
from cronscale.v1 import scheduler_service_pb2_grpc
from ops.migrate import migrate
from scheduler.config import Config
from scheduler.credentials import authed_channel
from scheduler.tenancy import make_token
from tests.services import require_services, test_config

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    """The cronscale processes of one test session, each started with `python -m scheduler.cli`.

    The API bootstraps an admin key and a worker key made here: ``channel`` (and ``api``)
    present the admin key on every call, the worker its worker key, ``cli`` the admin key."""

    def __init__(self, config: Config, logs: Path) -> None:
        self.config = config
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.admin_key = make_token()
        self.worker_key = make_token()
        # The first dispatcher serves Prometheus metrics here.
        self.dispatcher_metrics_port = _free_port()
        self.env = {
            **os.environ,
            "CRONSCALE_KEYSPACE": config.keyspace,
            "CRONSCALE_TOPIC_PREFIX": config.topic_prefix,
            "CRONSCALE_TOPIC_PARTITIONS": str(config.topic_partitions),
            "CRONSCALE_API": config.api_target,
            "CRONSCALE_API_LISTEN": config.api_listen,
            "CRONSCALE_SHARDS": str(config.shard_count),
            # Misfire tests take the dispatchers down for a few seconds, not half a minute.
            "CRONSCALE_MISFIRE_THRESHOLD": "3",
            # Workers learn of a cancel at a run's heartbeat: cancel tests wait ~1 s, not 10.
            "CRONSCALE_WORKER_HEARTBEAT_INTERVAL": "1",
            # Lost-run tests wait for a lease: seconds, not minutes (every run holds one).
            "CRONSCALE_RUN_LEASE": "10",
            "CRONSCALE_HEARTBEAT_LEASE": "5",
            "PYTHONPATH": str(REPO),
            "CRONSCALE_BOOTSTRAP_ADMIN_KEY": self.admin_key,
            "CRONSCALE_BOOTSTRAP_WORKER_KEY": self.worker_key,
            "CRONSCALE_API_KEY": self.admin_key,
            "CRONSCALE_API_TOKEN": self.worker_key,
        }
        self.channel = authed_channel(config.api_target, self.admin_key)
        self.api = scheduler_service_pb2_grpc.SchedulerServiceStub(self.channel)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        # The dispatcher (also when a test replaces it) serves metrics on a known port.
        metrics_port = self.dispatcher_metrics_port if name == "dispatcher" else 0
        env = {
            **self.env,
            "CRONSCALE_INSTANCE_ID": f"{name}-{time.monotonic_ns()}",
            "CRONSCALE_METRICS_PORT": str(metrics_port),
        }
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler.cli", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(timeout=30)

    def cli(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "scheduler.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
            cwd=REPO,
        )

    def wait_healthy(self, timeout: float = 60) -> None:
        stub = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + timeout
        while True:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited early:\n{self.tail(name)}")
            if time.monotonic() > deadline:
                pytest.fail(f"api not healthy after {timeout} s:\n{self.tail('api')}")
            time.sleep(0.2)

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
        self.channel.close()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    port = _free_port()
    config = test_config(api_listen=f"127.0.0.1:{port}", api_target=f"127.0.0.1:{port}")
    require_services(config)
    migrate(config, out=lambda _line: None)
    s = Stack(config, tmp_path_factory.mktemp("e2e-logs"))
    try:
        s.start("api", "api")
        s.start("dispatcher", "dispatcher")
        s.start("worker", "worker", "--import", "tests.e2e.handlers")
        s.wait_healthy()
        yield s
    finally:
        s.stop_all()
        session = connect(config.cassandra_hosts, config.cassandra_port)
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=60)
        finally:
            session.cluster.shutdown()
