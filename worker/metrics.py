"""The worker's Prometheus metrics (one set per process, in the default registry)."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800, 3600)
_DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

RUNS_STARTED = Counter(
    "cronscale_worker_runs_started_total", "Runs whose handler the worker started.", ["tier"]
)
RUNS_SUCCEEDED = Counter(
    "cronscale_worker_runs_succeeded_total", "Runs whose handler returned.", ["tier"]
)
RUNS_FAILED = Counter(
    "cronscale_worker_runs_failed_total",
    "Runs whose handler raised, timed out or was not found.",
    ["tier"],
)
MESSAGES_SKIPPED = Counter(
    "cronscale_worker_messages_skipped_total",
    "Kafka records not run: not run messages this worker can run (undecodable, "
    "unsupported_version), or runs done already (finished_before: named by the previous "
    "owner's commit; duplicate_run: a second message of an attempt run here; ran_before: the "
    "API said so when asked about a message delivered again).",
    ["tier", "reason"],
)
START_LAG = Histogram(
    "cronscale_worker_start_lag_seconds",
    "Handler start time minus the run's scheduled time.",
    ["tier"],
    buckets=_LAG_BUCKETS,
)
RUN_DURATION = Histogram(
    "cronscale_worker_run_duration_seconds",
    "How long handlers ran.",
    ["tier"],
    buckets=_DURATION_BUCKETS,
)
REPORT_RETRIES = Counter(
    "cronscale_worker_report_retries_total",
    "Batches of run events resent because the API did not take them.",
    ["tier"],
)

API_UP = Gauge(
    "cronscale_worker_api_up",
    "1 while the API takes the worker's run reports, 0 from a failed report until one succeeds.",
    ["tier"],
)
KAFKA_UP = Gauge(
    "cronscale_worker_kafka_up",
    "1 while the worker's last Kafka start or offset commit succeeded, 0 after a failure.",
    ["tier"],
)
COMMIT_FAILURES = Counter(
    "cronscale_worker_commit_failures_total",
    "Offset commits Kafka did not take (retried with the next commit).",
    ["tier"],
)
CONSUMERS_REPLACED = Counter(
    "cronscale_worker_consumers_replaced_total",
    "Kafka consumers replaced because an offset commit waited past "
    "CRONSCALE_WORKER_COMMIT_STUCK (a wedged client, or Kafka away that long).",
    ["tier"],
)
RUNS_HANDED_OVER = Counter(
    "cronscale_worker_runs_handed_over_total",
    "Runs still in progress when their partition was revoked, finished here and committed "
    "as done for the next owner.",
    ["tier"],
)

SYNC_THREADS_BUSY = Gauge(
    "cronscale_worker_sync_threads_busy",
    "Threads of the sync-handler pool running a handler (abandoned ones included).",
    ["tier"],
)
SYNC_THREADS_ABANDONED = Gauge(
    "cronscale_worker_sync_threads_overrunning",
    "Sync handlers past their timeout or cancelled, still running in their thread.",
    ["tier"],
)
SYNC_THREADS_ABANDONED_TOTAL = Counter(
    "cronscale_worker_sync_threads_abandoned_total",
    "Sync handlers given up on (timed out or cancelled) while their thread still ran.",
    ["tier"],
)


def serve_metrics(port: int, addr: str = "127.0.0.1") -> None:
    """Serves ``/metrics`` on ``addr``:``port`` (in a daemon thread); port 0 does nothing.

    ``addr`` is loopback by default (``CRONSCALE_METRICS_ADDR``); ``0.0.0.0`` exposes it.
    """
    if port > 0:
        start_http_server(port, addr=addr)
        logger.info("serving Prometheus metrics on %s port %d", addr, port)
