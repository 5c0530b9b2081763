"""Prometheus metrics of the control plane (dispatcher and API)."""

from __future__ import annotations

import logging
import os

from prometheus_client import Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

# The address /metrics binds unless CRONSCALE_METRICS_ADDR says otherwise: loopback only.
DEFAULT_METRICS_ADDR = "127.0.0.1"

_LAG_BUCKETS = (0.05, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)

RUNS_ENQUEUED = Counter(
    "cronscale_runs_enqueued_total", "Runs produced to Kafka by dispatchers.", ["tier"]
)
FIRE_LAG = Histogram(
    "cronscale_fire_lag_seconds",
    "Time from a run's scheduled_for to its acknowledgement by Kafka.",
    buckets=_LAG_BUCKETS,
)
TIMERS_SUPERSEDED = Counter(
    "cronscale_timers_superseded_total",
    "Due timers dropped because their schedule changed, paused or was deleted since.",
)
TIMERS_RECHECKED = Counter(
    "cronscale_timers_rechecked_total",
    "Due fire timers written again 2 s later because the change that wrote them (create, "
    "update, resume) may not have landed yet.",
)
TIMERS_QUARANTINED = Counter(
    "cronscale_timers_quarantined_total",
    "Due timers set aside because firing them failed on its own (poison), by timer kind.",
    ["kind"],
)
REFIRES_AVOIDED = Counter(
    "cronscale_refires_avoided_total",
    "Runs a new shard owner found already taken by a worker and did not produce again.",
)
RUNS_SKIPPED = Counter(
    "cronscale_runs_skipped_total", "Slots recorded SKIPPED instead of running.", ["reason"]
)
RUNS_RETRIED = Counter(
    "cronscale_runs_retried_total",
    "Failed, timed-out or lost attempts given a next attempt (scheduler.retries).",
    ["reason"],
)
RUNS_DEAD_LETTERED = Counter(
    "cronscale_runs_dead_lettered_total",
    "Runs dead-lettered after their last attempt; minus redriven, the DLQ's growth.",
    ["tier"],
)
DEAD_LETTERS_REDRIVEN = Counter(
    "cronscale_dead_letters_redriven_total", "Dead letters re-driven by operators."
)
RUNS_LOST = Counter(
    "cronscale_runs_lost_total",
    "Attempts whose lease came due while they were not started or stopped heartbeating.",
    ["state"],
)
FIRING_BATCH = Histogram(
    "cronscale_firing_batch_timers",
    "Due timers handed to the firing logic at once (a batch: one write round, one produce).",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
)
SCHEDULE_CACHE = Counter(
    "cronscale_schedule_cache_total",
    "Fire timers decided from the dispatcher's schedule cache (outcome=hit) or after reading "
    "their schedules (outcome=read): scheduler.schedule_cache.",
    ["outcome"],
)
LEASES_CARRIED = Counter(
    "cronscale_leases_carried_total",
    "Leases carried by a schedule's next fire timer, resolved when it fired: outcome=settled "
    "(the run had finished: nothing written) or written (still open: put as a lease timer).",
    ["outcome"],
)
TIMERS_REPAIRED = Counter(
    "cronscale_timers_repaired_total",
    "Schedules found ACTIVE without a timer by the repair sweep and re-armed.",
)
FIRINGS_DEFERRED = Counter(
    "cronscale_firings_deferred_total",
    "Firings put off by their tenant's quota: quota=rate (enqueue rate) or concurrency "
    "(max concurrent runs).",
    ["tier", "quota"],
)
READY = Gauge(
    "cronscale_ready",
    "1 while this api or dispatcher serves (Cassandra, and for a dispatcher Kafka, answer; "
    "clock within tolerance), else 0 (its log says why).",
)
OWNED_SHARDS = Gauge("cronscale_owned_shards", "Shards this dispatcher owns.")
TIMERS_PENDING = Gauge(
    "cronscale_timers_pending",
    "Timers read ahead and waiting in memory to come due (a deep value means firing lags).",
)
RUN_REPORTS = Counter(
    "cronscale_run_reports_total", "Run events recorded from workers.", ["status"]
)


def serve_metrics(port: int, addr: str | None = None) -> None:
    """Serves /metrics on ``addr``:``port`` (port 0 = off).

    ``addr`` defaults to ``$CRONSCALE_METRICS_ADDR``, else loopback; ``0.0.0.0`` exposes it.
    """
    if port > 0:
        addr = addr or os.environ.get("CRONSCALE_METRICS_ADDR", "").strip() or DEFAULT_METRICS_ADDR
        start_http_server(port, addr=addr)
        logger.info("serving Prometheus metrics on %s port %d", addr, port)
