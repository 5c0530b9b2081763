"""The dispatcher process: wires the timer wheel to the firing logic and runs until stopped."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import timedelta

from bucketer.wheel import TimerWheel
from scheduler import metrics
from scheduler.backfill import BackfillDriver, CassandraBackfillStore
from scheduler.config import Config
from scheduler.fairness import CachedDirectory, ConcurrencyGate, TenantLanes, Throttle
from scheduler.firing import Firing
from scheduler.health import HealthStatus, Readiness, cassandra_probe, serve_health
from scheduler.kafka import KafkaRunQueue, ensure_topics
from scheduler.repair import RepairSweep
from scheduler.retries import DeadLetterPublisher, failures_of
from scheduler.schedule_cache import ScheduleCache
from scheduler.service import ScheduleService
from scheduler.session import measure_clock, open_stores
from scheduler.startup import until_up
from scheduler.timers import FIRE, tenant_of

logger = logging.getLogger(__name__)


async def run_dispatcher(config: Config, stop: asyncio.Event | None = None) -> None:
    """Runs a dispatcher until SIGTERM/SIGINT (or ``stop``), then releases its shards."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Health answers from the start: NOT_SERVING while Cassandra or Kafka is still awaited.
    status = HealthStatus()
    health_server = (
        await serve_health(config.health_listen, status) if config.health_listen else None
    )
    try:
        await _dispatch(config, stop, status)
    finally:
        if health_server is not None:
            await status.servicer.enter_graceful_shutdown()
            await health_server.stop(grace=1)


async def _dispatch(config: Config, stop: asyncio.Event, status: HealthStatus) -> None:
    # Started while Cassandra or Kafka is away: wait for it (scheduler.startup), do not exit.
    stores = await until_up(lambda: open_stores(config), what="opening Cassandra", stop=stop)
    if stores is None:
        return
    try:
        timers, schedules, runs = stores.timers, stores.schedules, stores.runs
        queue = KafkaRunQueue(config.kafka_bootstrap, security=config.kafka_security)

        async def start_kafka() -> bool:
            await ensure_topics(
                config.kafka_bootstrap,
                [*(config.topic(t) for t in config.tiers), config.dead_letter_topic()],
                partitions=config.topic_partitions,
                security=config.kafka_security,
            )
            await queue.start()
            return True

        if await until_up(start_kafka, what="starting the Kafka producer", stop=stop) is None:
            await queue.stop()  # told to stop before Kafka came: close the unstarted producer
            return
        try:

            def share() -> float:
                """This dispatcher's share of the shards: its part of each tenant's quotas."""
                return len(wheel.owned_shards) / max(timers.shard_count, 1)

            lanes = TenantLanes(dict(config.tier_weights), tenant_of)
            firing = Firing(
                schedules=schedules,
                runs=runs,
                timers=timers,
                queue=queue,
                backfills=BackfillDriver(
                    store=CassandraBackfillStore(stores.session, keyspace=config.keyspace),
                    schedules=schedules,
                ),
                topic=config.topic,
                tenants=CachedDirectory(stores.tenants.limits),
                throttle=Throttle(share=share),
                concurrency=ConcurrencyGate(runs, share=share),
                lanes=lanes,
                failures=failures_of(stores),
                dead_letters=DeadLetterPublisher(
                    dead_letters=stores.dead_letters,
                    runs=runs,
                    queue=queue,
                    topic=config.dead_letter_topic(),
                ),
                misfire_threshold=timedelta(seconds=config.misfire_threshold_s),
                start_lease=timedelta(seconds=config.run_lease_s),
                heartbeat_lease=timedelta(seconds=config.heartbeat_lease_s),
                fire_ahead=timedelta(milliseconds=config.fire_ahead_ms),
                cache=ScheduleCache(schedules, capacity=config.schedule_cache),
            )
            guard = timers.clock_guard
            # Cassandra or Kafka out of reach, or this clock off the cluster's: NOT_SERVING,
            # and the log says why. (The wheel already stops firing for each of these.)
            readiness = Readiness(
                [("Cassandra", cassandra_probe(stores.session)), ("Kafka", queue.probe)],
                guard,
                status.publish,
            )
            step_aside = timedelta(seconds=config.kafka_step_aside_s)
            wheel = TimerWheel(
                timers,
                instance=config.instance_id,
                on_due=firing.start,
                on_poison=firing.quarantine,
                is_transient=firing.is_transient,
                lanes=lanes,
                # Fire timers early; their messages still go out at the slot's time.
                ahead={FIRE: timedelta(milliseconds=config.fire_ahead_ms)},
                # Cut off from Kafka alone (its leases renew through Cassandra), a dispatcher
                # hands its shards to peers that can produce rather than stall them.
                fit=lambda: readiness.down_for("Kafka", step_aside),
            )
            metrics.OWNED_SHARDS.set_function(lambda: len(wheel.owned_shards))
            metrics.TIMERS_PENDING.set_function(wheel.scanner.pending_count)
            metrics.serve_metrics(config.metrics_port)
            logger.info(
                "dispatcher %s started (%d shards, topic %s)",
                config.instance_id,
                timers.shard_count,
                config.topic(),
            )
            await measure_clock(guard, stores.session)
            watch = asyncio.create_task(guard.run(stores.session), name="clock")
            probing = asyncio.create_task(readiness.run(), name="readiness")
            background = [watch, probing]
            if config.repair_interval_s > 0:
                sweep = RepairSweep(
                    ScheduleService(schedules=schedules, runs=runs, timers=timers),
                    rate=config.repair_rate,
                )
                background.append(
                    asyncio.create_task(
                        sweep.run(
                            stop,
                            leading=lambda: 0 in wheel.owned_shards,
                            interval=timedelta(seconds=config.repair_interval_s),
                        ),
                        name="repair-sweep",
                    )
                )
            try:
                await wheel.run(stop)
            finally:
                for task in background:
                    task.cancel()
        finally:
            await queue.stop()
    finally:
        stores.close()
        logger.info("dispatcher %s stopped", config.instance_id)
