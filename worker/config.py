"""Configuration of a worker process.

Everything comes from ``CRONSCALE_*`` environment variables so one image runs against the local
stack (the defaults) or a production cluster; ``cronscale worker`` options override a few.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from worker.errors import ConfigError
from worker.kafka_security import KafkaSecurity
from worker.reporter import FLUSH_INTERVAL

# A report may wait at most this long for others (a run's ack, its offset commit and a STARTED
# seen by operators all wait with it).
MAX_REPORT_INTERVAL = 5.0

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A DNS name, optionally "*." for every name below it; labels of letters, digits and hyphens.
_HOST_NAME = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


@dataclass(frozen=True)
class HttpAllow:
    """Targets the ``http`` built-in may reach although they are not public addresses.

    ``networks`` match the addresses a URL's host resolves to; ``hosts`` match the URL's host
    name itself (``*.corp.example`` matches every name below ``corp.example``), whatever it
    resolves to. Empty (the default) allows public addresses only.
    """

    networks: tuple[IPNetwork, ...] = ()
    hosts: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, source: str) -> HttpAllow:
        """Parses CIDRs, addresses and host names separated by commas or blanks.

        Raises :class:`ConfigError` naming ``source`` (the variable or option) and the entry.
        """
        networks: list[IPNetwork] = []
        hosts: list[str] = []
        for entry in text.replace(",", " ").split():
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not _HOST_NAME.match(name) or len(name) > 253:
                raise ConfigError(
                    f"{source}: {entry!r} is neither a CIDR, an IP address nor a host name"
                )
            hosts.append(name)
        return cls(tuple(networks), tuple(hosts))

    def allows_address(self, address: IPAddress) -> bool:
        """Whether ``address`` (or the IPv4 address an IPv4-mapped one carries) is allowed."""
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        return any(a in n for a in candidates for n in self.networks if a.version == n.version)

    def allows_host(self, host: str) -> bool:
        """Whether the host name ``host`` is allowed by name."""
        name = host.lower().rstrip(".")
        for allowed in self.hosts:
            if allowed.startswith("*."):
                if name.endswith(allowed[1:]):
                    return True
            elif name == allowed:
                return True
        return False

    def __str__(self) -> str:
        entries = [str(n) for n in self.networks] + list(self.hosts)
        return ", ".join(entries) if entries else "none (public addresses only)"


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Where Kafka and the API are, which tier this worker serves and how hard it works."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    # Topics are "<prefix>.<tier>"; tests use a unique prefix to stay isolated.
    topic_prefix: str = "cronscale.runs"
    tier: str = "standard"
    # gRPC target of the API server that records run events.
    api_target: str = "127.0.0.1:50051"
    # Optional bearer token sent as "authorization" metadata on every report.
    api_token: str = field(default="", repr=False)
    # A CA (PEM) to verify the API's TLS certificate with; empty: plaintext.
    api_ca_file: str = ""
    concurrency: int = 64
    # Seconds a run may take when its message carries no max_runtime.
    default_timeout: float = 300.0
    # Seconds a run event may wait for others before the worker reports them to the API in
    # one ReportRuns call (worker.reporter; sooner when 500 are waiting). Longer: fewer,
    # larger calls and grouped writes; the outcome's ack (and the offset commit) comes later.
    report_interval: float = FLUSH_INTERVAL
    # Seconds between the automatic heartbeats of a running handler (keeps its lease alive).
    heartbeat_interval: float = 10.0
    # Seconds that running handlers get to finish after SIGTERM before they are cancelled.
    shutdown_grace: float = 10.0
    # Seconds a rebalance waits for the running handlers of revoked partitions before handing
    # them over (they run on here; the next owner skips them). The whole group waits with it.
    revoke_grace: float = 2.0
    # A partition without a committed offset (a new consumer group, offsets expired) starts at
    # its first message of the last this-many seconds, not at the start of the retention;
    # 0 starts at the earliest retained message.
    new_group_lookback: float = 600.0
    # Seconds a takeover waits for Kafka to say where a partition was left (its committed
    # offset and metadata, its end); past that, the runs of every message produced before
    # the takeover ask the API whether they ran already.
    offset_lookup_timeout: float = 10.0
    # Seconds an offset commit may wait before the worker takes its Kafka consumer for wedged
    # and replaces it (the runs in progress go on; the new consumer rejoins the group, under the
    # same static member name if there is one). Kafka away that long replaces it too, and the
    # new one waits for Kafka as at start-up. Longer than consumer.COMMIT_SLOW (5 s).
    commit_stuck: float = 60.0
    # Threads for plain (sync) handlers, apart from asyncio's default pool.
    sync_threads: int = 16
    # Kafka static membership: a stable name for this worker slot (a StatefulSet pod name, a
    # systemd instance). A worker restarted under the same name gets its partitions back with
    # no rebalance of the others; empty (the default) joins as a new member each start. Two
    # live processes must never share one.
    group_instance_id: str = ""
    instance_id: str = ""
    # 0 disables the Prometheus endpoint.
    metrics_port: int = 0
    # The address the Prometheus endpoint binds: loopback unless an operator opens it up.
    metrics_addr: str = "127.0.0.1"
    # Where the worker answers gRPC health checks (worker.health), e.g. "0.0.0.0:50071";
    # empty: nowhere.
    health_listen: str = ""
    # How to authenticate to Kafka and encrypt the connection (worker.kafka_security).
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    # What the ``http`` built-in may reach besides public addresses.
    http_allow: HttpAllow = field(default_factory=HttpAllow)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.default_timeout <= 0:
            raise ConfigError(f"default timeout must be positive, got {self.default_timeout}")
        if not 0 < self.report_interval <= MAX_REPORT_INTERVAL:
            raise ConfigError(
                f"report interval must be above 0 and at most {MAX_REPORT_INTERVAL:g} s, "
                f"got {self.report_interval}"
            )
        if self.heartbeat_interval <= 0:
            raise ConfigError(f"heartbeat interval must be positive, got {self.heartbeat_interval}")
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown grace must not be negative, got {self.shutdown_grace}")
        if self.revoke_grace < 0:
            raise ConfigError(f"revoke grace must not be negative, got {self.revoke_grace}")
        if self.offset_lookup_timeout <= 0:
            raise ConfigError(
                f"offset lookup timeout must be positive, got {self.offset_lookup_timeout}"
            )
        if self.commit_stuck <= 0:
            raise ConfigError(f"commit stuck timeout must be positive, got {self.commit_stuck}")
        if self.new_group_lookback < 0:
            raise ConfigError(
                f"new group lookback must not be negative, got {self.new_group_lookback}"
            )
        if self.sync_threads < 1:
            raise ConfigError(f"sync threads must be at least 1, got {self.sync_threads}")
        if not self.tier:
            raise ConfigError("tier must not be empty")
        if not self.metrics_addr.strip():
            raise ConfigError("metrics address must not be empty")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        """Builds the configuration from ``CRONSCALE_*`` variables (``os.environ`` by default).

        Raises :class:`ConfigError` naming the variable when a number does not parse.
        """
        e = os.environ if env is None else env

        def _num(name: str, default: float, kind: type[int] | type[float]) -> float:
            raw = e.get(name, "").strip()
            if not raw:
                return default
            try:
                return kind(raw)
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {raw!r}") from None

        return cls(
            # Without an explicit bootstrap, follow the local stack's port.
            kafka_bootstrap=e.get("CRONSCALE_KAFKA_BOOTSTRAP")
            or f"127.0.0.1:{e.get('CRONSCALE_LOCAL_KAFKA_PORT') or 9092}",
            topic_prefix=e.get("CRONSCALE_TOPIC_PREFIX") or "cronscale.runs",
            tier=e.get("CRONSCALE_TIER") or "standard",
            api_target=e.get("CRONSCALE_API") or "127.0.0.1:50051",
            api_token=e.get("CRONSCALE_API_TOKEN")
            or e.get("CRONSCALE_API_KEY")
            or _dev_worker_key(e, e.get("CRONSCALE_API") or "127.0.0.1:50051"),
            api_ca_file=e.get("CRONSCALE_TLS_CA_FILE", ""),
            concurrency=int(_num("CRONSCALE_WORKER_CONCURRENCY", 64, int)),
            default_timeout=_num("CRONSCALE_WORKER_DEFAULT_TIMEOUT", 300.0, float),
            report_interval=_num("CRONSCALE_WORKER_REPORT_INTERVAL", FLUSH_INTERVAL, float),
            heartbeat_interval=_num("CRONSCALE_WORKER_HEARTBEAT_INTERVAL", 10.0, float),
            shutdown_grace=_num("CRONSCALE_WORKER_SHUTDOWN_GRACE", 10.0, float),
            revoke_grace=_num("CRONSCALE_WORKER_REVOKE_GRACE", 2.0, float),
            offset_lookup_timeout=_num("CRONSCALE_WORKER_OFFSET_LOOKUP_TIMEOUT", 10.0, float),
            commit_stuck=_num("CRONSCALE_WORKER_COMMIT_STUCK", 60.0, float),
            new_group_lookback=_num("CRONSCALE_WORKER_NEW_GROUP_LOOKBACK", 600.0, float),
            sync_threads=int(_num("CRONSCALE_WORKER_SYNC_THREADS", 16, int)),
            group_instance_id=e.get("CRONSCALE_WORKER_GROUP_INSTANCE_ID", "").strip(),
            instance_id=e.get("CRONSCALE_INSTANCE_ID") or f"{socket.gethostname()}-{os.getpid()}",
            metrics_port=int(_num("CRONSCALE_METRICS_PORT", 0, int)),
            metrics_addr=e.get("CRONSCALE_METRICS_ADDR", "").strip() or "127.0.0.1",
            health_listen=e.get("CRONSCALE_WORKER_HEALTH_LISTEN", "").strip(),
            kafka_security=KafkaSecurity.from_env(e),
            http_allow=HttpAllow.parse(e.get("CRONSCALE_HTTP_ALLOW", ""), "CRONSCALE_HTTP_ALLOW"),
        )

    @property
    def topic(self) -> str:
        """The Kafka topic that carries this tier's run messages."""
        return f"{self.topic_prefix}.{self.tier}"

    @property
    def group_id(self) -> str:
        """The consumer group shared by every worker of this tier."""
        return f"{self.topic_prefix}.{self.tier}.workers"


def _dev_worker_key(env: Mapping[str, str], api_target: str) -> str:
    """The local stack's development worker key (``<local home>/dev-keys.json``, written by
    ``scheduler.credentials``) when the API is on loopback and no key is configured; "" else."""
    host = api_target.rsplit(":", 1)[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        return ""
    home = Path(env.get("CRONSCALE_LOCAL_HOME") or Path(__file__).resolve().parents[1] / ".local")
    try:
        return str(json.loads((home.expanduser() / "dev-keys.json").read_text())["worker"])
    except (OSError, ValueError, KeyError):
        return ""
