"""The local Cassandra 5.0 node: config, JVM command line and readiness probe."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from cassandra import AuthenticationFailed, ProtocolVersion
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import RoundRobinPolicy

from ops.local.process import port_open
from ops.local.service import LocalService
from ops.local.settings import CASSANDRA, PACKAGE_DIR

logger = logging.getLogger(__name__)

MAIN_CLASS: Final = "org.apache.cassandra.service.CassandraDaemon"
_PROBE_TIMEOUT_S: Final = 5.0

# The JPMS flags of upstream conf/jvm17-server.options (see INFRA_NOTES.md). Missing ones show up
# as IllegalAccessException ... sun.nio.ch.DirectBuffer.cleaner at startup.
_ADD_EXPORTS: Final = (
    "java.base/jdk.internal.misc",
    "java.management.rmi/com.sun.jmx.remote.internal.rmi",
    "java.management/com.sun.jmx.remote.security",
    "java.rmi/sun.rmi.registry",
    "java.rmi/sun.rmi.server",
    "java.sql/java.sql",
    "java.base/java.lang.ref",
    "jdk.unsupported/sun.misc",
    "jdk.compiler/com.sun.tools.javac.file",
    "jdk.attach/sun.tools.attach",
)
_ADD_OPENS: Final = (
    "java.base/java.lang.module",
    "java.base/jdk.internal.loader",
    "java.base/jdk.internal.ref",
    "java.base/jdk.internal.reflect",
    "java.base/jdk.internal.math",
    "java.base/jdk.internal.module",
    "java.base/jdk.internal.util.jar",
    "java.base/sun.nio.ch",
    "java.base/java.io",
    "java.base/java.nio",
    "java.base/java.lang.reflect",
    "java.base/java.lang",
    "java.base/java.util",
    "jdk.management/com.sun.management.internal",
    "jdk.compiler/com.sun.tools.javac",
)


class CassandraService(LocalService):
    """A single-node Cassandra launched straight from its Maven classpath."""

    name = CASSANDRA
    pom = PACKAGE_DIR / "cassandra-pom.xml"
    version_property = "cassandra.version"

    @property
    def main_jar(self) -> str:
        """``cassandra-all-<version>.jar``."""
        return f"cassandra-all-{self.version}.jar"

    @property
    def yaml_path(self) -> Path:
        """The generated cassandra.yaml."""
        return self.settings.conf_dir(CASSANDRA) / "cassandra.yaml"

    def prepare(self) -> None:
        """Write cassandra.yaml and logback.xml into the conf folder."""
        self._make_dirs()
        s = self.settings
        self._render(
            "cassandra.yaml.tmpl",
            "cassandra.yaml",
            host=s.host,
            storage_port=s.storage_port,
            cql_port=s.cql_port,
            data_dir=s.data_dir(CASSANDRA),
            commitlog_sync=(
                "commitlog_sync: group\ncommitlog_sync_group_window: 10ms"
                if s.commitlog_sync == "group"
                else "commitlog_sync: periodic\ncommitlog_sync_period: 10000ms"
            ),
            extra=s.cassandra_extra_yaml,
        )
        self._copy("logback.xml")

    @property
    def timer_slack_ns(self) -> int:
        """``cassandra_timer_slack_us`` (see LocalSettings): fewer idle wake-ups of the node's
        request threads."""
        return self.settings.cassandra_timer_slack_us * 1000

    def command(self) -> list[str]:
        """The JVM command line: what bin/cassandra would run, for Java 17, in the foreground."""
        s = self.settings
        conf = s.conf_dir(CASSANDRA)
        cmd = [
            s.java,
            *self.markers(),
            f"-Xms{s.cassandra_heap}",
            f"-Xmx{s.cassandra_heap}",
            "-Xss256k",
            "-ea",
            "-XX:+UseG1GC",
            "-XX:+ParallelRefProcEnabled",
            "-XX:MaxTenuringThreshold=1",
            "-XX:+PerfDisableSharedMem",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.net.preferIPv4Stack=true",
            "-Djdk.attach.allowAttachSelf=true",
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Dio.netty.allocator.useCacheForAllThreads=true",
            "-Dio.netty.allocator.maxOrder=11",
            *(f"--add-exports={module}=ALL-UNNAMED" for module in _ADD_EXPORTS),
            *(f"--add-opens={module}=ALL-UNNAMED" for module in _ADD_OPENS),
            *s.cassandra_jvm_opts,
            f"-Dcassandra.config={self.yaml_path.as_uri()}",
            f"-Dcassandra.storagedir={s.data_dir(CASSANDRA)}",
            f"-Dcassandra.logdir={s.logs_dir(CASSANDRA)}",
            f"-Dlogback.configurationFile={(conf / 'logback.xml').as_uri()}",
            # Without it the daemon closes stdout/stderr and the console log stays empty.
            "-Dcassandra-foreground=yes",
            # A lone seed node has no gossip to wait for and no ring state worth reloading.
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.load_ring_state=false",
            "-Dcassandra.superuser_setup_delay_ms=0",
        ]
        if s.jmx_port:
            # Loopback-only JMX, as cassandra-env.sh sets up by default (nodetool uses it).
            # RMI on the same port as the registry (as cassandra-env.sh does), not a random one.
            cmd.append(f"-Dcassandra.jmx.local.port={s.jmx_port}")
            cmd.append(f"-Dcom.sun.management.jmxremote.rmi.port={s.jmx_port}")
        jamm = sorted(self.lib_dir.glob("jamm-*.jar"))
        if jamm:
            cmd.append(f"-javaagent:{jamm[-1]}")
        cmd += ["-cp", self.classpath(), MAIN_CLASS]
        return cmd

    def probe(self) -> str | None:
        """``release <version>`` once ``SELECT release_version FROM system.local`` answers."""
        s = self.settings
        # The native port opens last during startup; the driver is only worth trying after.
        if not port_open(s.host, s.cql_port):
            return None
        version = query_release_version(s.host, s.cql_port, timeout_s=_PROBE_TIMEOUT_S)
        return None if version is None else f"release {version}"


def query_release_version(host: str, port: int, *, timeout_s: float) -> str | None:
    """Connect with cassandra-driver and return ``release_version`` of ``system.local``."""
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=timeout_s)
    cluster: Any = Cluster(
        contact_points=[host],
        port=port,
        # Cassandra 4.0+ speaks v5; pinning it avoids the driver's downgrade warning.
        protocol_version=ProtocolVersion.V5,
        connect_timeout=timeout_s,
        control_connection_timeout=timeout_s,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
    )
    with _driver_logs_demoted():
        try:
            session = cluster.connect()
            row = session.execute("SELECT release_version FROM system.local").one()
        except NoHostAvailable as exc:
            if any(isinstance(e, AuthenticationFailed) for e in exc.errors.values()):
                # A node with authentication on answered the native protocol: it is up.
                return "unknown (authentication required)"
            logger.debug("cassandra at %s:%s not ready: %r", host, port, exc)
            return None
        except Exception as exc:  # any failure at all means "not ready yet"
            logger.debug("cassandra at %s:%s not ready: %r", host, port, exc)
            return None
        finally:
            cluster.shutdown()
    return None if row is None else str(row.release_version)


class _ThisThreadToDebug(logging.Filter):
    """Drops the driver's records from one thread, re-logging them at DEBUG here.

    A probe of a starting (or dying) node fails by design; the driver would log every such
    failure as a WARNING/ERROR with a traceback. Other threads (an application's own sessions
    in the same process) keep their records untouched.
    """

    def __init__(self, thread_id: int) -> None:
        super().__init__()
        self.thread_id = thread_id

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread_id:
            return True
        logger.debug("driver (during probe): %s", record.getMessage())
        return False


@contextmanager
def _driver_logs_demoted() -> Iterator[None]:
    driver_logger = logging.getLogger("cassandra")
    loggers = [driver_logger, *(logging.getLogger(f"cassandra.{n}") for n in _DRIVER_LOGGERS)]
    quiet = _ThisThreadToDebug(threading.get_ident())
    for item in loggers:
        item.addFilter(quiet)
    try:
        yield
    finally:
        for item in loggers:
            item.removeFilter(quiet)


_DRIVER_LOGGERS: Final = ("cluster", "connection", "pool", "io.libevreactor", "io.asyncorereactor")
