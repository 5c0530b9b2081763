"""The API process: SchedulerService, RunReportingService, health and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import UTC, datetime
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cronscale.v1 import (
    api_key_service_pb2,
    api_key_service_pb2_grpc,
    audit_service_pb2,
    audit_service_pb2_grpc,
    dead_letter_service_pb2,
    dead_letter_service_pb2_grpc,
    run_reporting_service_pb2,
    run_reporting_service_pb2_grpc,
    scheduler_service_pb2,
    scheduler_service_pb2_grpc,
    tenant_service_pb2,
    tenant_service_pb2_grpc,
)
from scheduler import metrics
from scheduler.api.audit import AuditInterceptor, AuditServicer
from scheduler.api.audit import Stores as AuditStores
from scheduler.api.auth import AuthInterceptor, KeyVerifier
from scheduler.api.dead_letters import DeadLetterServicer
from scheduler.api.quotas import ApiQuotas
from scheduler.api.reporting import RunReportingServicer
from scheduler.api.schedules import SchedulerServicer
from scheduler.api.scope import ScheduleTenants
from scheduler.api.tenants import ApiKeyServicer, TenantServicer
from scheduler.audit import CassandraAuditLog
from scheduler.cassandra_tenancy import CassandraTenantStore
from scheduler.config import Config
from scheduler.errors import InvalidArgument
from scheduler.health import HealthStatus, Readiness, cassandra_probe
from scheduler.reports import RunReports
from scheduler.retries import failures_of
from scheduler.service import ScheduleService
from scheduler.session import measure_clock, open_stores
from scheduler.startup import until_up
from scheduler.tenancy import Role, new_key

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    scheduler_service_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
    run_reporting_service_pb2.DESCRIPTOR.services_by_name["RunReportingService"].full_name,
    dead_letter_service_pb2.DESCRIPTOR.services_by_name["DeadLetterService"].full_name,
    tenant_service_pb2.DESCRIPTOR.services_by_name["TenantService"].full_name,
    api_key_service_pb2.DESCRIPTOR.services_by_name["ApiKeyService"].full_name,
    audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
)


def _listen(server: grpc.aio.Server, config: Config) -> int:
    """TLS when a certificate and key are configured (both or neither), else plaintext."""
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise InvalidArgument(
            "CRONSCALE_TLS_CERT_FILE", "and CRONSCALE_TLS_KEY_FILE are set together or not at all"
        )
    if not config.tls_cert_file:
        return server.add_insecure_port(config.api_listen)
    creds = grpc.ssl_server_credentials(
        [(Path(config.tls_key_file).read_bytes(), Path(config.tls_cert_file).read_bytes())]
    )
    logger.info("api serves TLS with %s", config.tls_cert_file)
    return server.add_secure_port(config.api_listen, creds)


async def bootstrap_keys(config: Config, tenancy: CassandraTenantStore) -> None:
    """Stores the configured bootstrap keys (hashed) unless they exist: the first admin key of
    a new cluster, the dev stack's keys. Idempotent across restarts and replicas."""
    now = datetime.now(UTC)
    for role, token, env in (
        (Role.ADMIN, config.bootstrap_admin_key, "CRONSCALE_BOOTSTRAP_ADMIN_KEY"),
        (Role.WORKER, config.bootstrap_worker_key, "CRONSCALE_BOOTSTRAP_WORKER_KEY"),
    ):
        if not token:
            continue
        try:
            made = new_key(role=role, token=token, name="bootstrap", now=now)
        except InvalidArgument:
            raise InvalidArgument(env, "is not a cronscale API key (csk_<id>_<secret>)") from None
        if await tenancy.add_key(made.key):
            logger.info("stored the bootstrap %s key %s", role.value, made.key.key_id)


async def serve(config: Config, stop: asyncio.Event | None = None) -> None:
    """Serves until SIGTERM/SIGINT (or ``stop``); drains in-flight calls for up to 5 s."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Started while Cassandra is away: wait for it (scheduler.startup), do not exit.
    stores = await until_up(lambda: open_stores(config), what="opening Cassandra", stop=stop)
    if stores is None:
        return
    try:
        timers, schedules, runs = stores.timers, stores.schedules, stores.runs
        service = ScheduleService(schedules=schedules, runs=runs, timers=timers)

        tenancy = stores.tenants
        await bootstrap_keys(config, tenancy)
        verifier = KeyVerifier(tenancy)
        audit_log = CassandraAuditLog(stores.session, keyspace=config.keyspace)
        # Auth first: it wraps the audit's handler, so the caller is known when it records.
        server = grpc.aio.server(
            interceptors=[
                AuthInterceptor(verifier),
                AuditInterceptor(AuditStores(svc=service, tenancy=tenancy), audit_log),
            ]
        )
        audit_service_pb2_grpc.add_AuditServiceServicer_to_server(AuditServicer(audit_log), server)
        tenant_service_pb2_grpc.add_TenantServiceServicer_to_server(
            TenantServicer(tenancy, tiers=config.tiers), server
        )
        api_key_service_pb2_grpc.add_ApiKeyServiceServicer_to_server(
            ApiKeyServicer(tenancy, verifier), server
        )
        scheduler_service_pb2_grpc.add_SchedulerServiceServicer_to_server(
            SchedulerServicer(service, ApiQuotas(tenancy)), server
        )
        dead_letter_service_pb2_grpc.add_DeadLetterServiceServicer_to_server(
            DeadLetterServicer(service), server
        )
        failures = failures_of(stores)
        reports = RunReports(schedules=schedules, runs=runs, timers=timers, failures=failures)
        run_reporting_service_pb2_grpc.add_RunReportingServiceServicer_to_server(
            RunReportingServicer(reports, ScheduleTenants(schedules)), server
        )
        health_status = HealthStatus(SERVICE_NAMES)
        health_pb2_grpc.add_HealthServicer_to_server(health_status.servicer, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        port = _listen(server, config)
        if port == 0:
            raise OSError(f"cannot listen on {config.api_listen}")
        guard = timers.clock_guard
        await measure_clock(guard, stores.session)
        await server.start()

        # A replica whose clock is off refuses timer writes (UNAVAILABLE), and one that cannot
        # reach Cassandra can do nothing: either way its health says NOT_SERVING (and its log
        # why), so load balancers route around it until the cause ends.
        readiness = Readiness(
            [("Cassandra", cassandra_probe(stores.session))], guard, health_status.publish
        )
        await readiness.probe()
        guard.on_change(lambda ok: background.add(asyncio.ensure_future(readiness.probe())))
        background: set[asyncio.Future[bool]] = set()
        watch = asyncio.create_task(guard.run(stores.session), name="clock-guard")
        probing = asyncio.create_task(readiness.run(), name="readiness")
        metrics.serve_metrics(config.metrics_port)
        logger.info("api listening on %s", config.api_listen)
        await stop.wait()
        watch.cancel()
        probing.cancel()
        await health_status.servicer.enter_graceful_shutdown()
        await server.stop(grace=5)
    finally:
        stores.close()
        logger.info("api stopped")
