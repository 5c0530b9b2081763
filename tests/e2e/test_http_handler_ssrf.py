"""The built-in ``http`` handler in a real worker process: only what the operator allowed is
reached (``--http-allow``), redirects are not followed, and neither URL credentials, query
strings nor payloads reach the worker's log."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cronscale.v1 import schedule_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import (
    DEAD_LETTERED,
    LOGS,
    SUCCEEDED,
    create_schedule,
    json_payload,
    once_spec,
    status_name,
    wait_for_runs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SECRETS = ("pa55w0rd", "t0ps3cret", "r3dir3ct-secret", "ech0-s3cret")


@dataclass
class _Server:
    url: str = ""
    # path -> (status, extra headers)
    answers: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def _serve(host: str, state: _Server) -> Iterator[_Server]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append((self.path, dict(self.headers)))
            status, headers = state.answers.get(self.path.split("?")[0], (200, {}))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    state.url = f"http://{host}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def allowed_server() -> Iterator[_Server]:
    """On 127.0.0.1, which the worker of this test allows."""
    yield from _serve("127.0.0.1", _Server())


@pytest.fixture
def denied_server() -> Iterator[_Server]:
    """On 127.0.0.2: loopback too, but outside the worker's allowlist."""
    yield from _serve("127.0.0.2", _Server())


@pytest.fixture
def allowing_worker(stack: Stack) -> Iterator[int]:
    """The session's worker replaced by one started with ``--http-allow 127.0.0.1/32``;
    yields the offset of its first line in worker.log. The usual worker is back afterwards."""
    stack.kill("worker", signal.SIGTERM)
    log = stack.logs / "worker.log"
    offset = log.stat().st_size if log.exists() else 0
    stack.start(
        "worker", "worker", "--import", "tests.e2e.handlers", "--http-allow", "127.0.0.1/32"
    )
    try:
        yield offset
    finally:
        stack.kill("worker", signal.SIGTERM)
        stack.start("worker", "worker", "--import", "tests.e2e.handlers")


def _once(stack: Stack, name: str, handler: str, payload: dict[str, Any]) -> str:
    schedule = create_schedule(
        stack,
        name=name,
        handler=handler,
        spec=once_spec(datetime.now(UTC) + timedelta(seconds=3)),
        payload=json_payload(payload),
    )
    return schedule.id


def _outcome(stack: Stack, schedule_id: str) -> schedule_pb2.Run:
    runs = wait_for_runs(
        stack,
        schedule_id,
        lambda rs: any(r.status in (SUCCEEDED, DEAD_LETTERED) for r in rs),
        60,
        f"an outcome of {schedule_id}",
    )
    return next(r for r in runs if r.status in (SUCCEEDED, DEAD_LETTERED))


def test_http_reaches_only_allowed_targets_and_logs_no_secrets(
    stack: Stack, allowing_worker: int, allowed_server: _Server, denied_server: _Server
) -> None:
    allowed, denied = allowed_server, denied_server
    allowed.answers["/redirect"] = (
        302,
        {"Location": f"{denied.url}/inner?sig=r3dir3ct-secret"},
    )
    echo_payload = {"card": "ech0-s3cret"}
    with_credentials = allowed.url.replace("http://", "http://alice:pa55w0rd@")
    ids = {
        "allowed": _once(
            stack, "ssrf-allowed", "http", {"url": f"{with_credentials}/hook?token=t0ps3cret"}
        ),
        "denied": _once(stack, "ssrf-denied", "http", {"url": f"{denied.url}/admin"}),
        "metadata": _once(
            stack, "ssrf-metadata", "http", {"url": "http://169.254.169.254/latest/meta-data/"}
        ),
        "redirect": _once(stack, "ssrf-redirect", "http", {"url": f"{allowed.url}/redirect"}),
        "echo": _once(stack, "ssrf-echo", "echo", echo_payload),
    }
    runs = {name: _outcome(stack, sid) for name, sid in ids.items()}
    statuses = {name: status_name(r.status) for name, r in runs.items()}
    assert statuses == {
        "allowed": "RUN_STATUS_SUCCEEDED",
        # Refused targets are not retried: dead-lettered on the first attempt.
        "denied": "RUN_STATUS_DEAD_LETTERED",
        "metadata": "RUN_STATUS_DEAD_LETTERED",
        "redirect": "RUN_STATUS_DEAD_LETTERED",
        "echo": "RUN_STATUS_SUCCEEDED",
    }, {name: r.error for name, r in runs.items()}

    assert "127.0.0.2 (loopback)" in runs["denied"].error
    assert "169.254.169.254 (link-local)" in runs["metadata"].error
    assert f"a redirect to {denied.url}/inner?<redacted>" in runs["redirect"].error
    # The allowed server saw the hook (with its credentials and query) and the redirecting
    # request; the denied one saw nothing, neither directly nor through the redirect.
    assert sorted(path for path, _ in allowed.requests) == ["/hook?token=t0ps3cret", "/redirect"]
    assert denied.requests == []

    log = (stack.logs / "worker.log").read_bytes()[allowing_worker:].decode(errors="replace")
    assert "http allowlist 127.0.0.1/32" in log
    assert f"echo: {len(json_payload(echo_payload))} payload bytes" in log
    others = {name: (stack.logs / f"{name}.log").read_text(errors="replace") for name in LOGS}
    for secret in SECRETS:
        assert secret not in log, f"{secret} is in the worker's log"
        assert all(secret not in r.error for r in runs.values()), f"{secret} is in a run error"
        for name, text in others.items():
            assert secret not in text, f"{secret} is in the {name} log"
