"""Entry points of the long-running processes and the operator commands around them.

``cronscale api``, ``cronscale dispatcher``, ``cronscale worker``, ``cronscale db migrate`` and
``cronscale local up|down|status``. The code they run is imported lazily, inside each command,
so ``cronscale schedule ...`` starts fast and does not load the Cassandra or Kafka drivers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from scheduler.cli.logs import configure_logging
from scheduler.config import Config
from worker.runtime import tune_gc

logger = logging.getLogger(__name__)

# Set by ``cronscale dev`` on its children: the pid of the dev runner. A child whose parent
# vanished (the runner was SIGKILLed) stops itself instead of holding the API port forever.
ENV_PARENT_PID = "CRONSCALE_PARENT_PID"

EXIT_LOCAL_DOWN = 3

# "uvloop" (the default where it is installed) or "asyncio".
ENV_EVENT_LOOP = "CRONSCALE_EVENT_LOOP"


def use_fast_event_loop() -> str:
    """Runs the process's asyncio code on uvloop unless CRONSCALE_EVENT_LOOP=asyncio.

    uvloop makes the per-run bookkeeping of the event loop (tasks, callbacks, timers, sockets)
    several times cheaper; the api, dispatcher and worker spend a large share of their CPU there.
    With it, aiokafka's connections are made to treat a write to a reset connection as the
    broken connection it is (:func:`worker.kafka_uvloop.tolerate_reset_connections`).
    Returns the loop in use, for the start-up log.
    """
    choice = os.environ.get(ENV_EVENT_LOOP, "uvloop").strip().lower() or "uvloop"
    if choice not in ("uvloop", "asyncio"):
        raise SystemExit(f"{ENV_EVENT_LOOP} must be uvloop or asyncio, got {choice!r}")
    if choice == "asyncio":
        return choice
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # On uvloop a request written to a connection the broker just reset raises RuntimeError,
    # which aiokafka does not expect: it ended the client's metadata task for good and wedged a
    # worker after a Kafka restart (worker/kafka_uvloop.py).
    from worker.kafka_uvloop import tolerate_reset_connections

    tolerate_reset_connections()
    return choice


def run_service(main: Callable[[], Coroutine[Any, Any, object]]) -> int:
    """Runs a service coroutine until it returns or SIGINT/SIGTERM arrives; returns 0.

    The first signal cancels the coroutine so its ``finally`` blocks drain and close
    connections; a second one exits at once (status 130).
    """
    logger.debug("event loop: %s", use_fast_event_loop())
    try:
        logger.debug("gc thresholds: %s", tune_gc())
    except ValueError as e:
        raise SystemExit(str(e)) from None
    return asyncio.run(_supervise(main))


async def _supervise(main: Callable[[], Coroutine[Any, Any, object]]) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main())
    stopping = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal stopping
        if stopping:
            logger.warning("second %s: exiting without draining", sig.name)
            os._exit(130)
        stopping = True
        logger.info("received %s: shutting down", sig.name)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await task
    except asyncio.CancelledError:
        if not stopping:
            raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    logger.info("stopped")
    return 0


def _exit_with_parent() -> None:
    """Under ``cronscale dev``: SIGTERM ourselves once the dev runner is gone."""
    raw = os.environ.get(ENV_PARENT_PID, "")
    if not raw.isdigit():
        return
    parent = int(raw)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        logger.warning("the dev runner (pid %d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _start_process(args: argparse.Namespace) -> Config:
    configure_logging(args.log_level, json_lines=args.log_json)
    _exit_with_parent()
    return Config.from_env()


def api(args: argparse.Namespace) -> int:
    """``cronscale api``: the gRPC API server (``scheduler.api.server.serve``)."""
    from scheduler.api.server import serve
    from scheduler.credentials import with_dev_keys

    config = with_dev_keys(_start_process(args))
    return run_service(lambda: serve(config))


def dispatcher(args: argparse.Namespace) -> int:
    """``cronscale dispatcher``: fires due timers (``scheduler.dispatcher.service``)."""
    config = _start_process(args)
    from scheduler.dispatcher.service import run_dispatcher

    return run_service(lambda: run_dispatcher(config))


def worker(args: argparse.Namespace, worker_argv: list[str]) -> int:
    """``cronscale worker ...``: hands every argument it does not know to ``worker.main``."""
    configure_logging(args.log_level, json_lines=args.log_json)
    if args.log_level != "DEBUG":
        # aiokafka logs every group join and coordinator lookup at INFO.
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
    _exit_with_parent()
    logger.debug("event loop: %s", use_fast_event_loop())
    from worker.main import main as worker_main

    result = worker_main(worker_argv)
    return result if isinstance(result, int) else 0


def db_migrate(args: argparse.Namespace) -> int:
    """``cronscale db migrate``: applies the schema migrations that are not applied yet."""
    configure_logging(args.log_level)
    if args.log_level not in ("DEBUG", "INFO"):
        # The error below says what failed and how to fix it; the driver's own connection
        # tracebacks would only bury it.
        logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    from bucketer.cql import StorageUnavailable
    from ops.migrate import migrate

    try:
        migrate(Config.from_env(), out=_print_flush)
    except StorageUnavailable as exc:
        return _fail(str(exc))
    return 0


def db_recount_usage(args: argparse.Namespace) -> int:
    """``cronscale db recount-usage``: sets tenants' schedule counts to what is stored."""
    logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    from bucketer.cql import StorageUnavailable
    from scheduler.errors import InvalidArgument
    from scheduler.tenancy import validate_tenant_id

    try:
        if args.tenant is not None:
            validate_tenant_id(args.tenant, "--tenant")
    except InvalidArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_recount_usage(Config.from_env(), args.tenant))
    except StorageUnavailable as exc:
        return _fail(str(exc))


async def _recount_usage(config: Config, tenant: str | None) -> int:
    from scheduler.session import open_stores

    stores = await open_stores(config)
    try:
        tenants = [tenant] if tenant else await stores.tenants.counted_tenants()
        for t in tenants:
            before, after = await stores.tenants.recount_schedules(t)
            change = "unchanged" if before == after else f"was {before}"
            _print_flush(f"{t}: {after} schedules ({change})")
    finally:
        stores.close()
    return 0


def local_up(args: argparse.Namespace) -> int:
    """``cronscale local up``: starts (fetching on first use) the local Cassandra and Kafka."""
    from ops.local import LocalSettings, LocalStackError, up

    try:
        up(LocalSettings.from_env(), out=_print_flush)
    except LocalStackError as exc:
        return _fail(str(exc))
    return 0


def local_down(args: argparse.Namespace) -> int:
    """``cronscale local down``: stops the local Cassandra and Kafka this checkout started."""
    from ops.local import LocalSettings, LocalStackError, down

    try:
        down(LocalSettings.from_env(), out=_print_flush)
    except LocalStackError as exc:
        return _fail(str(exc))
    return 0


def local_reset(args: argparse.Namespace) -> int:
    """``cronscale local reset``: stops them and deletes their data (jars, logs stay)."""
    from ops.local import LocalSettings, LocalStackError, reset

    try:
        reset(LocalSettings.from_env(), out=_print_flush)
    except LocalStackError as exc:
        return _fail(str(exc))
    _print_flush("start them empty with `cronscale local up`, then `cronscale db migrate`")
    return 0


def local_status(args: argparse.Namespace) -> int:
    """``cronscale local status``: exit 0 when both services answer, 3 when one is down."""
    from ops.local import LocalSettings, LocalStackError, format_status, status

    try:
        statuses = status(LocalSettings.from_env())
    except LocalStackError as exc:
        return _fail(str(exc))
    print(format_status(statuses))
    return 0 if all(s.state == "up" for s in statuses) else EXIT_LOCAL_DOWN


def _print_flush(line: str) -> None:
    print(line, flush=True)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1
