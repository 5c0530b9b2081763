"""Settings of the local stack: versions, ports, heaps, and where everything lives on disk."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ops.local.errors import LocalStackError

logger = logging.getLogger(__name__)

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
"""The checkout this package lives in; the default home is ``<repo>/.local``."""

PACKAGE_DIR: Final = Path(__file__).resolve().parent
"""Where the poms and config templates ship."""

CASSANDRA: Final = "cassandra"
KAFKA: Final = "kafka"
SERVICES: Final = (CASSANDRA, KAFKA)

ENV_HOME: Final = "CRONSCALE_LOCAL_HOME"
ENV_CASSANDRA_VERSION: Final = "CRONSCALE_CASSANDRA_VERSION"
ENV_KAFKA_VERSION: Final = "CRONSCALE_KAFKA_VERSION"
ENV_CQL_PORT: Final = "CRONSCALE_LOCAL_CQL_PORT"
ENV_STORAGE_PORT: Final = "CRONSCALE_LOCAL_STORAGE_PORT"
ENV_JMX_PORT: Final = "CRONSCALE_LOCAL_JMX_PORT"
ENV_KAFKA_PORT: Final = "CRONSCALE_LOCAL_KAFKA_PORT"
ENV_KAFKA_CONTROLLER_PORT: Final = "CRONSCALE_LOCAL_KAFKA_CONTROLLER_PORT"
ENV_CASSANDRA_HEAP: Final = "CRONSCALE_LOCAL_CASSANDRA_HEAP"
ENV_CASSANDRA_JVM_OPTS: Final = "CRONSCALE_LOCAL_CASSANDRA_JVM_OPTS"
ENV_CASSANDRA_TIMER_SLACK_US: Final = "CRONSCALE_LOCAL_CASSANDRA_TIMER_SLACK_US"
# The most a timed wait of the local Cassandra may be stretched by (µs): a tenth of a second.
MAX_TIMER_SLACK_US: Final = 100_000
# Why 4 ms: see LocalSettings.cassandra_timer_slack_us.
DEFAULT_CASSANDRA_TIMER_SLACK_US: Final = 4000
ENV_COMMITLOG_SYNC: Final = "CRONSCALE_LOCAL_COMMITLOG_SYNC"
COMMITLOG_SYNC_MODES: Final = ("periodic", "group")
ENV_KAFKA_HEAP: Final = "CRONSCALE_LOCAL_KAFKA_HEAP"
ENV_START_TIMEOUT: Final = "CRONSCALE_LOCAL_START_TIMEOUT"
ENV_JAVA: Final = "CRONSCALE_LOCAL_JAVA"
ENV_MVN: Final = "CRONSCALE_LOCAL_MVN"

MAX_PORT: Final = 65535
_HEAP_RE: Final = re.compile(r"^[1-9][0-9]*[kKmMgG]$")
_VERSION_RE: Final = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.\-]*$")


@dataclass(frozen=True, kw_only=True)
class PortSpec:
    """One TCP port a local service listens on, with the variable that moves it."""

    port: int
    env: str
    purpose: str


@dataclass(frozen=True, kw_only=True)
class LocalSettings:
    """Everything ``cronscale local up|down|status`` needs to know.

    Build it with :meth:`from_env`; tests use :func:`dataclasses.replace` on the result to move
    the home folder and ports. All state (jars, data, logs, generated config, pid files) lives
    under ``home``, so two settings with different homes and ports are two independent stacks.
    ``jmx_port = 0`` disables Cassandra's JMX (nodetool then cannot connect).
    """

    home: Path
    cassandra_version: str = "5.0.8"
    kafka_version: str = "4.3.1"
    host: str = "127.0.0.1"
    cql_port: int = 9042
    storage_port: int = 7000
    jmx_port: int = 7199
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    cassandra_heap: str = "1g"
    # JVM options appended to Cassandra's command line (a later option wins over ours), as
    # JVM_EXTRA_OPTS does for bin/cassandra: e.g. "-da" or a collector of another kind.
    cassandra_jvm_opts: tuple[str, ...] = ()
    # The timer slack of Cassandra's threads (µs; 0: the kernel's, 50 µs): how much later than
    # asked the kernel may end their timed waits, to group wake-ups. Between requests the
    # node's request threads spin in parks of ~10 µs each for up to 10 ms (its shared executor
    # pool, SEPWorker); at the kernel's 50 µs that was ~20,000 context switches a second at
    # 100,000 firings a minute, a third of the node's CPU on this 2-core box; 3,900-5,200 at
    # 1 ms, 2,200-3,200 at 4 ms (loadtest/README.md, "Cassandra's request threads waking for
    # nothing" and "The targets again with the timer slack"). Wake-ups for work are not
    # delayed: a request unparks a thread directly.
    cassandra_timer_slack_us: int = DEFAULT_CASSANDRA_TIMER_SLACK_US
    # "periodic" (Cassandra's default: fast, may lose the last acknowledged writes when the node
    # is killed) or "group" (acknowledged only once the commit log is synced, 10 ms windows).
    commitlog_sync: str = "periodic"
    kafka_heap: str = "512m"
    # Lines appended to the generated cassandra.yaml and server.properties (a later Kafka key
    # wins over the template's): a stack with authentication and TLS turned on, as the test of
    # the clients' security settings starts. Empty for the development stack.
    cassandra_extra_yaml: str = ""
    kafka_extra_properties: str = ""
    start_timeout_s: float = 240.0
    stop_timeout_s: float = 30.0
    java: str = "java"
    mvn: str = "mvn"

    def __post_init__(self) -> None:
        if not self.home.is_absolute():
            raise LocalStackError(f"the local home must be an absolute path (got {self.home})")
        for name, version in (("cassandra", self.cassandra_version), ("kafka", self.kafka_version)):
            if not _VERSION_RE.match(version):
                raise LocalStackError(f"invalid {name} version {version!r}")
        for name, heap in (("cassandra", self.cassandra_heap), ("kafka", self.kafka_heap)):
            if not _HEAP_RE.match(heap):
                raise LocalStackError(
                    f"invalid {name} heap {heap!r}: use a JVM size such as 512m or 1g"
                )
        if self.commitlog_sync not in COMMITLOG_SYNC_MODES:
            raise LocalStackError(
                f"{ENV_COMMITLOG_SYNC} must be one of {', '.join(COMMITLOG_SYNC_MODES)} "
                f"(got {self.commitlog_sync!r})"
            )
        if not 0 <= self.cassandra_timer_slack_us <= MAX_TIMER_SLACK_US:
            raise LocalStackError(
                f"{ENV_CASSANDRA_TIMER_SLACK_US} must be between 0 and {MAX_TIMER_SLACK_US} "
                f"microseconds (got {self.cassandra_timer_slack_us})"
            )
        if self.start_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise LocalStackError("start and stop timeouts must be positive")
        specs = self.ports(CASSANDRA) + self.ports(KAFKA)
        seen: dict[int, str] = {}
        for spec in specs:
            if not 1 <= spec.port <= MAX_PORT:
                raise LocalStackError(
                    f"{spec.env} must be a TCP port between 1 and {MAX_PORT} (got {spec.port})"
                )
            if spec.port in seen:
                raise LocalStackError(
                    f"port {spec.port} is configured twice ({seen[spec.port]} and {spec.env})"
                )
            seen[spec.port] = spec.env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LocalSettings:
        """Read the settings from ``env`` (default ``os.environ``); unset or empty means default.

        Raises :class:`LocalStackError` naming the variable when a value does not parse.
        """
        source = os.environ if env is None else env

        def text(name: str, default: str) -> str:
            value = source.get(name, "").strip()
            return value or default

        def integer(name: str, default: int) -> int:
            raw = text(name, str(default))
            try:
                return int(raw)
            except ValueError:
                raise LocalStackError(f"{name} must be an integer (got {raw!r})") from None

        def seconds(name: str, default: float) -> float:
            raw = text(name, str(default))
            try:
                value = float(raw)
            except ValueError:
                raise LocalStackError(f"{name} must be a number of seconds (got {raw!r})") from None
            if value <= 0:
                raise LocalStackError(f"{name} must be positive (got {raw!r})")
            return value

        home = Path(text(ENV_HOME, str(REPO_ROOT / ".local"))).expanduser().resolve()
        settings = cls(
            home=home,
            cassandra_version=text(ENV_CASSANDRA_VERSION, "5.0.8"),
            kafka_version=text(ENV_KAFKA_VERSION, "4.3.1"),
            cql_port=integer(ENV_CQL_PORT, 9042),
            storage_port=integer(ENV_STORAGE_PORT, 7000),
            jmx_port=integer(ENV_JMX_PORT, 7199),
            kafka_port=integer(ENV_KAFKA_PORT, 9092),
            kafka_controller_port=integer(ENV_KAFKA_CONTROLLER_PORT, 9093),
            cassandra_heap=text(ENV_CASSANDRA_HEAP, "1g"),
            cassandra_jvm_opts=tuple(source.get(ENV_CASSANDRA_JVM_OPTS, "").split()),
            cassandra_timer_slack_us=integer(
                ENV_CASSANDRA_TIMER_SLACK_US, DEFAULT_CASSANDRA_TIMER_SLACK_US
            ),
            commitlog_sync=text(ENV_COMMITLOG_SYNC, "periodic"),
            kafka_heap=text(ENV_KAFKA_HEAP, "512m"),
            start_timeout_s=seconds(ENV_START_TIMEOUT, 240.0),
            java=text(ENV_JAVA, "java"),
            mvn=text(ENV_MVN, "mvn"),
        )
        logger.debug("local stack settings: %s", settings)
        return settings

    # Layout under the home folder -------------------------------------------------------------

    def version(self, service: str) -> str:
        """The configured version of ``service`` ("cassandra" or "kafka")."""
        return self.cassandra_version if service == CASSANDRA else self.kafka_version

    def lib_dir(self, service: str) -> Path:
        """``home/lib/<service>-<version>``: the service's own classpath."""
        return self.home / "lib" / f"{service}-{self.version(service)}"

    def service_dir(self, service: str) -> Path:
        """``home/<service>``: holds ``data``, ``logs`` and ``conf``."""
        return self.home / service

    def data_dir(self, service: str) -> Path:
        """``home/<service>/data``."""
        return self.service_dir(service) / "data"

    def logs_dir(self, service: str) -> Path:
        """``home/<service>/logs``."""
        return self.service_dir(service) / "logs"

    def conf_dir(self, service: str) -> Path:
        """``home/<service>/conf``: generated configuration, rewritten on every start."""
        return self.service_dir(service) / "conf"

    def console_log(self, service: str) -> Path:
        """The file the service's stdout and stderr go to (tailed in error messages)."""
        return self.logs_dir(service) / "console.log"

    @property
    def run_dir(self) -> Path:
        """``home/run``: pid files and the lock that serialises up/down."""
        return self.home / "run"

    def pid_file(self, service: str) -> Path:
        """``home/run/<service>.pid``: the pid on line 1, the client port on line 2."""
        return self.run_dir / f"{service}.pid"

    @property
    def kafka_cluster_id_file(self) -> Path:
        """``home/kafka/cluster.id``: the KRaft cluster id the storage was formatted with."""
        return self.service_dir(KAFKA) / "cluster.id"

    def client_port(self, service: str) -> int:
        """The port clients connect to: CQL for Cassandra, PLAINTEXT for Kafka."""
        return self.cql_port if service == CASSANDRA else self.kafka_port

    def ports(self, service: str) -> list[PortSpec]:
        """Every port ``service`` listens on, client port first."""
        if service == CASSANDRA:
            specs = [
                PortSpec(port=self.cql_port, env=ENV_CQL_PORT, purpose="CQL"),
                PortSpec(port=self.storage_port, env=ENV_STORAGE_PORT, purpose="storage"),
            ]
            if self.jmx_port:
                specs.append(PortSpec(port=self.jmx_port, env=ENV_JMX_PORT, purpose="JMX"))
            return specs
        return [
            PortSpec(port=self.kafka_port, env=ENV_KAFKA_PORT, purpose="broker"),
            PortSpec(
                port=self.kafka_controller_port, env=ENV_KAFKA_CONTROLLER_PORT, purpose="controller"
            ),
        ]
