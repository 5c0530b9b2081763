"""Process configuration for the control plane (api, dispatcher, CLI).

Everything comes from the environment so the same image runs against the local stack (defaults)
or external clusters in production (``CRONSCALE_CASSANDRA_HOSTS``, ``CRONSCALE_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from bucketer.cql import CassandraSecurity
from scheduler.errors import InvalidArgument
from scheduler.fairness import DEFAULT_TIER
from worker.errors import ConfigError
from worker.kafka_security import KafkaSecurity

# How long before its slot a fire timer is handed (decision 0011): at 100,000 firings a minute
# on the development box, handler start p50 ~0.10 s against ~0.18 s without, for less CPU.
DEFAULT_FIRE_AHEAD_MS = 300
# Turns per round of each tier when a backlog is dispatched round-robin across tenants.
DEFAULT_TIER_WEIGHTS = {"free": 1, "standard": 2, "premium": 4}


@dataclass(frozen=True, kw_only=True)
class Config:
    """Where the backing services are and how this process presents itself."""

    cassandra_hosts: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 9042
    # Credentials and TLS for a production cluster (bucketer.cql.CassandraSecurity); plain by
    # default, as the local stack is.
    cassandra_security: CassandraSecurity = field(default_factory=CassandraSecurity)
    keyspace: str = "cronscale"
    # "SimpleStrategy:1" locally; "NetworkTopologyStrategy:dc1=3,dc2=3" in production.
    replication: str = "SimpleStrategy:1"
    kafka_bootstrap: str = "127.0.0.1:9092"
    # How to authenticate to Kafka and encrypt the connection (worker.kafka_security);
    # plain by default, as the local stack is.
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    # Topics are "<prefix>.<tier>"; tests use a unique prefix to stay isolated.
    topic_prefix: str = "cronscale.runs"
    topic_partitions: int = 6
    api_listen: str = "127.0.0.1:50051"
    api_target: str = "127.0.0.1:50051"
    # 0 disables the metrics endpoint.
    metrics_port: int = 0
    # Where a dispatcher answers gRPC health checks (e.g. "0.0.0.0:50061"); empty: nowhere.
    # The api answers them on api_listen.
    health_listen: str = ""
    # Fixed when the keyspace is created (stored in cluster_settings); this is the initial value.
    shard_count: int = 64
    instance_id: str = ""
    # A slot fired later than this is a misfire: its schedule's misfire policy decides.
    misfire_threshold_s: float = 30.0
    # Fire timers are handed this long before their time: the run rows are written and the
    # schedule's next timer put ahead, and the run message is produced at the slot's time
    # (scheduler.firing, decision 0011). 300 ms by default; 0 hands them at their time; at most
    # the scanner's 1 s lookahead.
    fire_ahead_ms: int = DEFAULT_FIRE_AHEAD_MS
    # Schedules a dispatcher keeps in memory to fire without reading them
    # (scheduler.schedule_cache), least recently fired evicted first; 0 reads every schedule.
    schedule_cache: int = 200_000
    # A process whose clock differs from Cassandra's by more than this owns no shards and
    # writes no timers (bucketer.clock); keep it well inside the scanners' 2 s grace window.
    clock_skew_tolerance_ms: int = 500
    # Run leases (scheduler.retries): an attempt not finished this long after it was enqueued
    # is checked on, and found lost if not started or silent for the heartbeat lease.
    run_lease_s: float = 300.0
    heartbeat_lease_s: float = 60.0
    # A dispatcher whose Kafka probe has failed this long, while Cassandra answers, releases
    # its shards to peers that can produce (bucketer.ownership), and claims again once it can.
    kafka_step_aside_s: float = 30.0
    # The repair sweep (scheduler.repair): how often, and how many schedules a second; an
    # interval of 0 turns it off.
    repair_interval_s: float = 3600.0
    repair_rate: float = 500.0
    # Tenant tiers, each with its own run topic ("<prefix>.<tier>"); the first is the default.
    tiers: tuple[str, ...] = ("standard", "free", "premium")
    # When more firings are due than a dispatcher hands over in one round, tenants take turns,
    # each taking this many of its tier's schedules per turn (a tier not listed: 1).
    tier_weights: tuple[tuple[str, int], ...] = tuple(DEFAULT_TIER_WEIGHTS.items())
    # Keys the API stores on start if absent (the first admin key of a new cluster, the dev
    # stack's worker key): `csk_<16 hex>_<43 base64url>`. Never logged.
    bootstrap_admin_key: str = field(default="", repr=False)
    bootstrap_worker_key: str = field(default="", repr=False)
    # The API serves TLS when both are set (PEM files); clients verify it with
    # CRONSCALE_TLS_CA_FILE. Empty: plaintext (the local stack on loopback).
    tls_cert_file: str = ""
    tls_key_file: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Config:
        """Builds the configuration from ``CRONSCALE_*`` variables, defaults for the rest."""
        e = dict(os.environ if env is None else env)

        def _int(name: str, default: int) -> int:
            raw = e.get(name)
            if raw is None or raw == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise InvalidArgument(name, f"must be an integer, got {raw!r}") from None

        hosts = tuple(h.strip() for h in e.get("CRONSCALE_CASSANDRA_HOSTS", "127.0.0.1").split(","))
        api = e.get("CRONSCALE_API", "127.0.0.1:50051")
        tiers = _tiers(e.get("CRONSCALE_TIERS", "standard,free,premium"))
        return cls(
            cassandra_hosts=tuple(h for h in hosts if h),
            # Without explicit client settings, follow the local stack's ports.
            cassandra_port=_int("CRONSCALE_CASSANDRA_PORT", _int("CRONSCALE_LOCAL_CQL_PORT", 9042)),
            cassandra_security=_security(CassandraSecurity.from_env, e),
            keyspace=e.get("CRONSCALE_KEYSPACE", "cronscale"),
            replication=e.get("CRONSCALE_REPLICATION", "SimpleStrategy:1"),
            kafka_bootstrap=e.get("CRONSCALE_KAFKA_BOOTSTRAP")
            or f"127.0.0.1:{_int('CRONSCALE_LOCAL_KAFKA_PORT', 9092)}",
            kafka_security=_security(KafkaSecurity.from_env, e),
            topic_prefix=e.get("CRONSCALE_TOPIC_PREFIX", "cronscale.runs"),
            topic_partitions=_int("CRONSCALE_TOPIC_PARTITIONS", 6),
            api_listen=e.get("CRONSCALE_API_LISTEN", api),
            api_target=api,
            metrics_port=_int("CRONSCALE_METRICS_PORT", 0),
            health_listen=e.get("CRONSCALE_HEALTH_LISTEN", ""),
            shard_count=_int("CRONSCALE_SHARDS", 64),
            instance_id=e.get("CRONSCALE_INSTANCE_ID", f"{socket.gethostname()}-{os.getpid()}"),
            misfire_threshold_s=float(_int("CRONSCALE_MISFIRE_THRESHOLD", 30)),
            fire_ahead_ms=_fire_ahead(_int("CRONSCALE_FIRE_AHEAD_MS", DEFAULT_FIRE_AHEAD_MS)),
            schedule_cache=_not_negative(
                "CRONSCALE_SCHEDULE_CACHE", _int("CRONSCALE_SCHEDULE_CACHE", 200_000)
            ),
            clock_skew_tolerance_ms=_int("CRONSCALE_CLOCK_SKEW_TOLERANCE_MS", 500),
            run_lease_s=float(_int("CRONSCALE_RUN_LEASE", 300)),
            heartbeat_lease_s=float(_int("CRONSCALE_HEARTBEAT_LEASE", 60)),
            kafka_step_aside_s=float(_int("CRONSCALE_KAFKA_STEP_ASIDE", 30)),
            repair_interval_s=float(_int("CRONSCALE_REPAIR_INTERVAL", 3600)),
            repair_rate=float(_int("CRONSCALE_REPAIR_RATE", 500)),
            tiers=tiers,
            tier_weights=_tier_weights(e.get("CRONSCALE_TIER_WEIGHTS"), tiers),
            bootstrap_admin_key=e.get("CRONSCALE_BOOTSTRAP_ADMIN_KEY", ""),
            bootstrap_worker_key=e.get("CRONSCALE_BOOTSTRAP_WORKER_KEY", ""),
            tls_cert_file=e.get("CRONSCALE_TLS_CERT_FILE", ""),
            tls_key_file=e.get("CRONSCALE_TLS_KEY_FILE", ""),
        )

    def topic(self, tier: str = DEFAULT_TIER) -> str:
        """The Kafka topic that carries run messages of ``tier``."""
        return f"{self.topic_prefix}.{tier}"

    def dead_letter_topic(self) -> str:
        """The Kafka topic that carries dead letters (``cronscale.v1.DeadLetter``)."""
        return f"{self.topic_prefix}.dlq"


_Security = TypeVar("_Security", CassandraSecurity, KafkaSecurity)


def _security(build: Callable[[Mapping[str, str]], _Security], env: dict[str, str]) -> _Security:
    """A client security setting from the environment; its error (which starts with the
    variable at fault) as InvalidArgument naming that variable."""
    try:
        return build(env)
    except (ValueError, ConfigError) as e:
        name, _, problem = str(e).partition(" ")
        raise InvalidArgument(name, problem) from None


def _tiers(raw: str) -> tuple[str, ...]:
    tiers = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    for t in tiers:
        if not _TIER.match(t):
            raise InvalidArgument("CRONSCALE_TIERS", f"tier {t!r} is not a name like 'premium'")
    if DEFAULT_TIER not in tiers:
        raise InvalidArgument("CRONSCALE_TIERS", f"must include {DEFAULT_TIER!r}, got {raw!r}")
    return tiers


MAX_TIER_WEIGHT = 100


def _tier_weights(raw: str | None, tiers: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """``tier=weight`` pairs, comma separated, for tiers of ``tiers`` (a weight of a tier
    that is not configured would be a typo, silently ignored: refused instead). Unset: the
    default weights of the configured tiers among free, standard and premium."""
    if raw is None:
        return tuple((t, w) for t, w in DEFAULT_TIER_WEIGHTS.items() if t in tiers)
    name = "CRONSCALE_TIER_WEIGHTS"
    out: dict[str, int] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        tier, sep, value = (x.strip() for x in part.partition("="))
        if not sep:
            raise InvalidArgument(name, f"{part!r} is not tier=weight")
        if tier not in tiers:
            raise InvalidArgument(name, f"tier {tier!r} is not one of CRONSCALE_TIERS {tiers}")
        if not value.isdigit() or not 1 <= int(value) <= MAX_TIER_WEIGHT:
            raise InvalidArgument(
                name,
                f"weight of {tier!r} must be an integer from 1 to {MAX_TIER_WEIGHT}, got {value!r}",
            )
        out[tier] = int(value)
    return tuple(out.items())


_TIER = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


MAX_FIRE_AHEAD_MS = 1000


def _not_negative(name: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(name, f"must be 0 or more, got {value}")
    return value


def _fire_ahead(ms: int) -> int:
    if not 0 <= ms <= MAX_FIRE_AHEAD_MS:
        raise InvalidArgument(
            "CRONSCALE_FIRE_AHEAD_MS",
            f"must be between 0 and {MAX_FIRE_AHEAD_MS} (the scanner's lookahead), got {ms}",
        )
    return ms
