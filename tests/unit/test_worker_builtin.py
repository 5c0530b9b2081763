"""The built-in handlers: echo, sleep, fail, http."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from worker import builtin
from worker.errors import HandlerFailed
from worker.handlers import HandlerContext, HandlerRegistry


def ctx(payload: bytes = b"", run_id: str = "run-42") -> HandlerContext:
    return HandlerContext(
        run_id=run_id,
        schedule_id="s1",
        tenant="acme",
        attempt=1,
        scheduled_for=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
    )


def test_builtins_are_registered() -> None:
    registry = HandlerRegistry()
    builtin.register_builtins(registry)
    assert registry.names() == ["echo", "fail", "http", "sleep"]


async def test_echo_returns_the_payload() -> None:
    assert await builtin.echo(ctx(b"hello")) == b"hello"


async def test_fail_has_a_default_message() -> None:
    with pytest.raises(HandlerFailed, match=r"^the fail handler always fails$"):
        await builtin.fail(ctx())


async def test_fail_uses_the_payload_error() -> None:
    with pytest.raises(HandlerFailed, match=r"^disk on fire$"):
        await builtin.fail(ctx(b'{"error": "disk on fire"}'))


async def test_sleep_sleeps_and_validates() -> None:
    await builtin.sleep(ctx(b'{"seconds": 0.01}'))
    with pytest.raises(HandlerFailed, match="'seconds' must be a non-negative number"):
        await builtin.sleep(ctx(b'{"seconds": "soon"}'))
    with pytest.raises(HandlerFailed, match="must be a JSON object"):
        await builtin.sleep(ctx(b"[1]"))


class _Server:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        self.requests: list[tuple[str, dict[str, str], bytes]] = []


@pytest.fixture
def http_server() -> Iterator[tuple[str, _Server]]:
    state = _Server(200, b"ok")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            state.requests.append((self.path, dict(self.headers), self.rfile.read(length)))
            self.send_response(state.status)
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_http_posts_json_with_the_idempotency_key(
    http_server: tuple[str, _Server],
) -> None:
    url, state = http_server
    payload = {"url": f"{url}/hook", "body": {"n": 1}, "headers": {"X-Team": "billing"}}
    result = await builtin.http(ctx(json.dumps(payload).encode()))
    assert result["status"] == 200
    path, headers, body = state.requests[0]
    assert path == "/hook"
    assert headers["Idempotency-Key"] == "run-42"
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Team"] == "billing"
    assert json.loads(body) == {"n": 1}


async def test_http_non_2xx_fails_with_status_and_body_head(
    http_server: tuple[str, _Server],
) -> None:
    url, state = http_server
    state.status = 503
    state.body = b"x" * 2000
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(ctx(json.dumps({"url": url}).encode()))
    message = str(info.value)
    assert f"POST {url} answered 503: " in message
    assert message.endswith("x" * 500)
    assert "x" * 501 not in message


async def test_http_redirects_are_failures(http_server: tuple[str, _Server]) -> None:
    url, state = http_server
    state.status = 302
    with pytest.raises(HandlerFailed, match="answered 302"):
        await builtin.http(ctx(json.dumps({"url": url}).encode()))


async def test_http_unreachable_and_bad_payloads() -> None:
    with pytest.raises(HandlerFailed, match="failed"):
        # Port 9 (discard) is closed on the loopback interface of a test machine.
        await builtin.http(ctx(b'{"url": "http://127.0.0.1:9/", "timeout": 2}'))
    with pytest.raises(HandlerFailed, match="'url' must be an http"):
        await builtin.http(ctx(b'{"url": "ftp://x"}'))
    with pytest.raises(HandlerFailed, match="not JSON"):
        await builtin.http(ctx(b"{"))
