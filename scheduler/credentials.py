"""Where clients find their API key, and the development keys of the local stack.

A process's key comes from ``--api-key`` or ``CRONSCALE_API_KEY``. Without either, a client
talking to an API on loopback uses the local stack's development admin key: generated once
into ``<local home>/dev-keys.json`` (mode 0600; ``CRONSCALE_LOCAL_HOME``, default
``<repo>/.local``), stored by ``cronscale dev`` and the e2e stack as bootstrap keys, so the
README's tour runs with no extra step. Never used for a remote API. An api started against
the local stack (API and Cassandra on loopback) with no bootstrap keys stores these
(``with_dev_keys``), and a worker reporting to an API on loopback with no key uses the worker
key of the same file (``worker.config``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from scheduler.config import Config
from scheduler.tenancy import make_token

DEV_KEYS_FILE = "dev-keys.json"
ENV_API_KEY = "CRONSCALE_API_KEY"
ENV_CA_FILE = "CRONSCALE_TLS_CA_FILE"


@dataclass(frozen=True, kw_only=True)
class DevKeys:
    admin: str = field(repr=False)
    worker: str = field(repr=False)


def local_home(env: Mapping[str, str] | None = None) -> Path:
    from ops.local import LocalSettings

    return LocalSettings.from_env(os.environ if env is None else env).home


def dev_keys(home: Path, *, create: bool) -> DevKeys | None:
    """The development keys under ``home`` (made there first if ``create``)."""
    path = home / DEV_KEYS_FILE
    try:
        doc = json.loads(path.read_text())
        return DevKeys(admin=doc["admin"], worker=doc["worker"])
    except FileNotFoundError:
        if not create:
            return None
    keys = DevKeys(admin=make_token(), worker=make_token())
    home.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{DEV_KEYS_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"admin": keys.admin, "worker": keys.worker}, f)
    try:
        # Whole or not at all, and the first writer wins: an api and a worker starting
        # together agree on one pair.
        os.link(tmp, path)
    except FileExistsError:
        return dev_keys(home, create=False)
    finally:
        tmp.unlink()
    return keys


def is_local(config: Config) -> bool:
    """Whether a process runs against the local stack: the API and Cassandra on loopback."""
    return _loopback(config.api_listen) and all(
        h in ("127.0.0.1", "localhost", "::1") for h in config.cassandra_hosts
    )


def with_dev_keys(config: Config) -> Config:
    """``config`` with the local stack's development keys as its bootstrap keys, when it runs
    against the local stack and names none: so an api started by hand, by `cronscale dev` or by
    the load harness accepts the keys the CLI and worker pick up there on their own."""
    if config.bootstrap_admin_key or config.bootstrap_worker_key or not is_local(config):
        return config
    keys = dev_keys(local_home(), create=True)
    assert keys is not None
    return replace(config, bootstrap_admin_key=keys.admin, bootstrap_worker_key=keys.worker)


def _loopback(target: str) -> bool:
    host = target.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def client_key(target: str, explicit: str = "", env: Mapping[str, str] | None = None) -> str:
    """The key a client presents to ``target``: explicit, else $CRONSCALE_API_KEY, else (API on
    loopback) the local stack's development admin key; "" if none."""
    e = os.environ if env is None else env
    if explicit:
        return explicit
    if e.get(ENV_API_KEY):
        return e[ENV_API_KEY]
    if _loopback(target):
        keys = dev_keys(local_home(e), create=False)
        if keys is not None:
            return keys.admin
    return ""


def fresh_keys_env() -> dict[str, str]:
    """Environment for a private stack (a benchmark, a chaos fleet): a new admin and worker key,
    bootstrapped by its API, presented by its clients (CRONSCALE_API_KEY) and workers
    (CRONSCALE_API_TOKEN)."""
    admin, worker = make_token(), make_token()
    return {
        "CRONSCALE_BOOTSTRAP_ADMIN_KEY": admin,
        "CRONSCALE_BOOTSTRAP_WORKER_KEY": worker,
        ENV_API_KEY: admin,
        "CRONSCALE_API_TOKEN": worker,
    }


class BearerAuth(grpc.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <key>`` to every unary call of a blocking channel."""

    def __init__(self, key: str) -> None:
        self._key = key

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = (*(details.metadata or ()), ("authorization", f"Bearer {self._key}"))
        return continuation(_CallDetails(details, metadata), request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def authed_channel(target: str, key: str = "") -> grpc.Channel:
    """A blocking channel to ``target`` whose calls carry ``key`` (default: ``client_key``)."""
    key = key or client_key(target)
    channel = grpc.insecure_channel(target)
    return grpc.intercept_channel(channel, BearerAuth(key)) if key else channel
