"""``cronscale worker``: the worker process.

``main(argv)`` parses ``[--import MODULE ...] [--concurrency N] [--tier NAME]
[--http-allow CIDR|HOST ...]``, imports the
handler modules, and consumes the tier's topic until SIGTERM or SIGINT, then drains: it stops
fetching, gives running handlers a grace period, reports, commits and leaves the group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

from worker import builtin, metrics
from worker.config import HttpAllow, WorkerConfig
from worker.consumer import KafkaRunConsumer
from worker.errors import ConfigError, HandlerImportError
from worker.handlers import HandlerRegistry, default_registry, load_imports
from worker.health import API, WorkerHealth
from worker.reporter import RunReporter
from worker.runner import Runner
from worker.runtime import tune_gc

logger = logging.getLogger(__name__)

_IDS = ("run_id", "schedule_id", "tenant", "topic", "partition", "offset")


async def run_worker(
    config: WorkerConfig,
    stop: asyncio.Event,
    registry: HandlerRegistry | None = None,
) -> None:
    """Runs a worker until ``stop`` is set; returns after the drain.

    ``registry`` defaults to the one ``@handler`` fills (built-ins included).
    """
    registry = registry or default_registry
    retries = metrics.REPORT_RETRIES.labels(config.tier)
    health = WorkerHealth(config.tier)

    def on_retry() -> None:
        # The reporter logs why and retries with backoff; the runner sets it back on an ack.
        retries.inc()
        health.down(API, f"{config.api_target} does not take run reports")

    reporter = RunReporter(
        config.api_target,
        token=config.api_token,
        root_certificates=(
            await asyncio.to_thread(Path(config.api_ca_file).read_bytes)
            if config.api_ca_file
            else None
        ),
        flush_interval=config.report_interval,
        on_retry=on_retry,
    )
    await reporter.start()
    health_server = await health.serve(config.health_listen) if config.health_listen else None
    try:
        runner = Runner(
            registry=registry,
            reporter=reporter,
            worker_id=config.instance_id,
            tier=config.tier,
            default_timeout=config.default_timeout,
            heartbeat_interval=config.heartbeat_interval,
            sync_threads=config.sync_threads,
            health=health,
        )
        builtin.configure_http(config.http_allow, runner.threads)
        await KafkaRunConsumer(config, runner, health).run(stop)
    finally:
        await reporter.close()
        if health_server is not None:
            await health.servicer.enter_graceful_shutdown()
            await health_server.stop(grace=1)


def main(argv: list[str]) -> int:
    """Entry point of ``cronscale worker``; returns the process exit code.

    0 after a clean shutdown, 2 for bad options or a handler module that does not import.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging()
    try:
        config = WorkerConfig.from_env()
        overrides: dict[str, object] = {}
        if args.concurrency is not None:
            overrides["concurrency"] = args.concurrency
        if args.tier is not None:
            overrides["tier"] = args.tier
        if args.http_allow:
            overrides["http_allow"] = HttpAllow.parse(" ".join(args.http_allow), "--http-allow")
        config = dataclasses.replace(config, **overrides)  # type: ignore[arg-type]
        # `cronscale worker --import mypkg.jobs` run from a project directory should find mypkg,
        # as `python -m` would; console scripts do not put the working directory on sys.path.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        load_imports(args.imports)
    except (ConfigError, HandlerImportError) as e:
        logger.error("%s", e)
        return 2
    logger.info(
        "worker %s starting: tier %s, topic %s, API %s, handlers %s, http allowlist %s",
        config.instance_id,
        config.tier,
        config.topic,
        config.api_target,
        ", ".join(default_registry.names()),
        config.http_allow,
    )
    try:
        tune_gc()
    except ValueError as e:
        logger.error("%s", e)
        return 2
    metrics.serve_metrics(config.metrics_port, config.metrics_addr)
    asyncio.run(_serve(config))
    return 0


async def _serve(config: WorkerConfig) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            logger.warning("second %s: exiting without draining", signal.Signals(signum).name)
            if main_task is not None:
                main_task.cancel()
            return
        logger.info("%s received: draining", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await run_worker(config, stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    logger.info("worker %s stopped", config.instance_id)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronscale worker",
        description="Run handlers for the run messages of one tier's Kafka topic.",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module whose @handler functions to load (repeatable)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="handlers run at once (default: $CRONSCALE_WORKER_CONCURRENCY or 64)",
    )
    parser.add_argument(
        "--tier",
        default=None,
        help="the tier whose topic to consume (default: $CRONSCALE_TIER or standard)",
    )
    parser.add_argument(
        "--http-allow",
        dest="http_allow",
        action="append",
        default=[],
        metavar="CIDR|HOST",
        help="a network, address or host name (*.domain for its subdomains) the http handler "
        "may reach although it is not public; repeatable or comma-separated; replaces "
        "$CRONSCALE_HTTP_ALLOW (default: public addresses only)",
    )
    return parser


class _Formatter(logging.Formatter):
    """``time level logger message key=value...`` with the ids a record carries in ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = [f"{k}={getattr(record, k)}" for k in _IDS if getattr(record, k, "") != ""]
        return f"{line} {' '.join(ids)}" if ids else line


def _configure_logging() -> None:
    root = logging.getLogger()
    if root.handlers:
        return  # the embedding program (or a test) configured logging already
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(os.environ.get("CRONSCALE_LOG_LEVEL", "INFO").upper())
    # aiokafka is chatty at INFO about every group join and coordinator lookup.
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


__all__ = ["builtin", "main", "run_worker"]
