"""The built-in handlers: echo, sleep, fail, http."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cronscale.v1 import run_reporting_service_pb2 as pb
from tests.fake_reports import acked
from worker import builtin
from worker.config import HttpAllow
from worker.errors import HandlerFailed
from worker.handlers import HandlerContext, HandlerRegistry
from worker.messages import RunTask
from worker.runner import Runner


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


async def test_echo_logs_the_payload_size_not_the_payload(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    payload = b'{"card": "4111-1111-1111-1111"}'
    assert await builtin.echo(ctx(payload)) == payload
    assert "4111" not in caplog.text
    assert f"echo: {len(payload)} payload bytes" in caplog.messages


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
        self.headers: dict[str, str] = {}
        self.requests: list[tuple[str, dict[str, str], bytes]] = []


@pytest.fixture(autouse=True)
def _default_http_allow() -> Iterator[None]:
    """Every test starts (and leaves) the http handler with the default: public only."""
    builtin.configure_http(HttpAllow())
    yield
    builtin.configure_http(HttpAllow())


def allow(*entries: str) -> None:
    builtin.configure_http(HttpAllow.parse(",".join(entries), "test"))


def _serve(host: str, state: _Server, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            state.requests.append((self.path, dict(self.headers), self.rfile.read(length)))
            self.send_response(state.status)
            for name, value in state.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def http_server() -> Iterator[tuple[str, _Server]]:
    """A real HTTP server on 127.0.0.1."""
    state = _Server(200, b"ok")
    for url in _serve("127.0.0.1", state):
        yield url, state


@pytest.fixture
def second_server() -> Iterator[tuple[str, _Server]]:
    """Another real HTTP server, on 127.0.0.2 (all of 127.0.0.0/8 is loopback on Linux)."""
    state = _Server(200, b"second")
    for url in _serve("127.0.0.2", state):
        yield url, state


def post(url: str, **fields: Any) -> HandlerContext:
    return ctx(json.dumps({"url": url, **fields}).encode())


# --- address classification -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),  # AWS, GCP, Azure metadata
        ("169.254.0.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%2", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("fd00:ec2::254", "private"),  # AWS metadata over IPv6
        ("fc00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("0.1.2.3", "reserved"),  # "this network"
        ("192.0.2.1", "reserved"),  # documentation
        ("198.18.0.1", "reserved"),  # benchmarking
        ("2001:db8::1", "reserved"),  # documentation
        ("100.100.100.200", "shared (carrier-grade NAT)"),  # Alibaba Cloud metadata
        # IPv6 forms that lead to an IPv4 address are judged by that address.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("::127.0.0.1", "reserved"),  # IPv4-compatible (deprecated)
    ],
)
def test_denied_addresses_and_why(address: str, reason: str) -> None:
    assert builtin.denied_reason(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "64:ff9b::808:808"],
)
def test_public_addresses_are_not_denied(address: str) -> None:
    assert builtin.denied_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://alice:s3cret@hooks.example/p/q?token=t0p#frag",
            "https://hooks.example/p/q?<redacted>",
        ),
        ("http://user@10.0.0.1:8080/x", "http://10.0.0.1:8080/x"),
        ("http://[::1]:81/", "http://[::1]:81/"),
        ("https://example.com", "https://example.com"),
        ("/relative?sig=abc", "/relative?<redacted>"),
        ("http://h:notaport/", "<unparseable URL>"),
    ],
)
def test_redacted_urls_carry_no_credentials_or_query(url: str, shown: str) -> None:
    assert builtin.redact_url(url) == shown


def test_redacted_urls_are_bounded() -> None:
    shown = builtin.redact_url("https://example.com/" + "a" * 1000)
    assert len(shown) == builtin.HTTP_SHOWN_URL_CHARS and shown.endswith("...")


# --- the http handler against real servers on loopback ----------------------------------------


async def test_http_refuses_loopback_by_default(http_server: tuple[str, _Server]) -> None:
    url, state = http_server
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(f"{url}/hook"))
    assert "127.0.0.1 (loopback)" in str(info.value)
    assert "CRONSCALE_HTTP_ALLOW" in str(info.value)
    assert state.requests == []


async def test_http_refuses_loopback_by_name_by_default(http_server: tuple[str, _Server]) -> None:
    url, state = http_server
    with pytest.raises(HandlerFailed, match=r"is refused: its host resolves to .*\(loopback\)"):
        await builtin.http(post(url.replace("127.0.0.1", "localhost")))
    assert state.requests == []


async def test_http_posts_json_with_the_idempotency_key(
    http_server: tuple[str, _Server],
) -> None:
    allow("127.0.0.0/8")
    url, state = http_server
    payload = {"url": f"{url}/hook", "body": {"n": 1}, "headers": {"X-Team": "billing"}}
    result = await builtin.http(ctx(json.dumps(payload).encode()))
    assert result["status"] == 200
    path, headers, body = state.requests[0]
    assert path == "/hook"
    assert headers["Idempotency-Key"] == "run-42"
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Team"] == "billing"
    assert headers["Host"] == url.removeprefix("http://")
    assert json.loads(body) == {"n": 1}


async def test_http_allowed_by_host_name_keeps_the_host_header(
    http_server: tuple[str, _Server],
) -> None:
    allow("localhost")
    url, state = http_server
    port = url.rsplit(":", 1)[1]
    # localhost may resolve to ::1 first: nothing listens there, so 127.0.0.1 is tried next.
    await builtin.http(post(f"http://localhost:{port}/by-name"))
    assert state.requests[0][1]["Host"] == f"localhost:{port}"


async def test_http_allowlist_is_exact(
    http_server: tuple[str, _Server], second_server: tuple[str, _Server]
) -> None:
    allow("127.0.0.1/32")
    await builtin.http(post(http_server[0]))
    with pytest.raises(HandlerFailed, match=r"127\.0\.0\.2 \(loopback\)"):
        await builtin.http(post(second_server[0]))
    assert len(http_server[1].requests) == 1 and second_server[1].requests == []


async def test_http_refuses_a_redirect_to_a_denied_target(
    http_server: tuple[str, _Server], second_server: tuple[str, _Server]
) -> None:
    allow("127.0.0.1/32")
    url, state = http_server
    target, target_state = second_server
    state.status = 302
    state.headers = {"Location": f"{target}/admin?key=l0cati0n-secret"}
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(f"{url}/start"))
    message = str(info.value)
    assert (
        f"answered 302: a redirect to {target}/admin?<redacted>, which is not followed" in message
    )
    assert "l0cati0n-secret" not in message
    assert len(state.requests) == 1 and target_state.requests == []


async def test_http_refuses_a_redirect_even_to_an_allowed_target(
    http_server: tuple[str, _Server], second_server: tuple[str, _Server]
) -> None:
    allow("127.0.0.0/8")
    url, state = http_server
    state.status = 307
    state.headers = {"Location": second_server[0]}
    with pytest.raises(HandlerFailed, match="answered 307: a redirect"):
        await builtin.http(post(url))
    assert second_server[1].requests == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 (link-local)"),
        ("http://10.0.0.1/", "10.0.0.1 (private)"),
        ("http://192.168.0.1:8080/", "192.168.0.1 (private)"),
        ("http://[::1]/", "::1 (loopback)"),
        ("http://[fe80::1]/", "fe80::1 (link-local)"),
        ("http://[fd00:ec2::254]/", "fd00:ec2::254 (private)"),
        ("http://[::ffff:169.254.169.254]/", "(link-local)"),
        ("http://0.0.0.0:22/", "0.0.0.0 (unspecified)"),
        ("http://224.0.0.1/", "224.0.0.1 (multicast)"),
        ("http://240.0.0.1/", "240.0.0.1 (reserved)"),
        ("http://2130706433/", "127.0.0.1 (loopback)"),  # 127.0.0.1 as one number
        ("http://0x7f.1/", "127.0.0.1 (loopback)"),
    ],
)
async def test_http_refuses_denied_literal_targets(url: str, reason: str) -> None:
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(url, timeout=1))
    assert "is refused" in str(info.value) and reason in str(info.value)


async def test_allowing_loopback_allows_nothing_else() -> None:
    allow("127.0.0.0/8", "::1")
    for url in ("http://169.254.169.254/", "http://10.0.0.1/", "http://[fe80::1]/"):
        with pytest.raises(HandlerFailed, match="is refused"):
            await builtin.http(post(url, timeout=1))


async def test_http_refuses_other_schemes_and_bad_urls() -> None:
    for url, problem in [
        ("ftp://x/", "'url' must be an http(s) URL, got scheme 'ftp'"),
        ("file:///etc/passwd", "got scheme 'file'"),
        ("gopher://127.0.0.1:6379/_INFO", "got scheme 'gopher'"),
        ("//example.com/", "got scheme ''"),
        ("http:///path", "has no host"),
        ("http://example.com:99999/", "is not a valid URL"),
    ]:
        with pytest.raises(HandlerFailed) as info:
            await builtin.http(post(url))
        assert problem in str(info.value), url
    with pytest.raises(HandlerFailed, match="'url' must be an http\\(s\\) URL, got int"):
        await builtin.http(ctx(b'{"url": 7}'))


class _FakeDns:
    """Answers the handler's lookups from a table, and counts them."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[tuple[socket.AddressFamily, tuple[Any, ...]]]:
        self.calls.append(host)
        rounds = self.answers[host]
        addresses = rounds[min(len(self.calls) - 1, len(rounds) - 1)]
        return [
            (socket.AF_INET6, (a, port, 0, 0)) if ":" in a else (socket.AF_INET, (a, port))
            for a in addresses
        ]


async def test_http_resolves_once_and_connects_to_the_checked_address(
    http_server: tuple[str, _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the second answer (a denied address) is never asked for nor used."""
    allow("127.0.0.1/32")
    url, state = http_server
    port = url.rsplit(":", 1)[1]
    dns = _FakeDns({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    monkeypatch.setattr(builtin, "_getaddrinfo", dns)
    await builtin.http(post(f"http://rebind.test:{port}/x"))
    assert dns.calls == ["rebind.test"]
    assert state.requests[0][1]["Host"] == f"rebind.test:{port}"


async def test_http_skips_denied_addresses_and_refuses_hosts_with_only_denied_ones(
    http_server: tuple[str, _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    allow("127.0.0.1/32")
    url, state = http_server
    port = url.rsplit(":", 1)[1]
    dns = _FakeDns(
        {
            "mixed.test": [["10.9.9.9", "169.254.169.254", "127.0.0.1"]],
            "internal.test": [["10.1.2.3", "fd12::1"]],
        }
    )
    monkeypatch.setattr(builtin, "_getaddrinfo", dns)
    await builtin.http(post(f"http://mixed.test:{port}/"))
    assert len(state.requests) == 1
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(f"http://internal.test:{port}/"))
    assert "10.1.2.3 (private), fd12::1 (private)" in str(info.value)


async def test_http_host_names_allow_whatever_they_resolve_to(
    http_server: tuple[str, _Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    allow("*.corp.test")
    url, state = http_server
    port = url.rsplit(":", 1)[1]
    dns = _FakeDns({"hooks.corp.test": [["127.0.0.1"]], "corp.test": [["127.0.0.1"]]})
    monkeypatch.setattr(builtin, "_getaddrinfo", dns)
    await builtin.http(post(f"http://hooks.corp.test:{port}/"))
    assert state.requests[0][1]["Host"] == f"hooks.corp.test:{port}"
    with pytest.raises(HandlerFailed, match="is refused"):
        await builtin.http(post(f"http://corp.test:{port}/"))


async def test_http_unresolvable_host_names_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(host: str, port: int) -> list[tuple[socket.AddressFamily, tuple[Any, ...]]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(builtin, "_getaddrinfo", fail)
    with pytest.raises(HandlerFailed, match=r"'url' host nowhere\.test does not resolve"):
        await builtin.http(post("http://nowhere.test/"))


async def test_http_headers_cannot_redirect_the_request(http_server: tuple[str, _Server]) -> None:
    allow("127.0.0.0/8")
    url, state = http_server
    for name in ("Host", "content-length", "Transfer-Encoding", "Connection"):
        with pytest.raises(HandlerFailed, match=f"'headers' must not set {name}"):
            await builtin.http(post(url, headers={name: "x"}))
    with pytest.raises(HandlerFailed, match="'headers' value of X-A contains a line break"):
        await builtin.http(post(url, headers={"X-A": "1\r\nHost: admin.internal"}))
    with pytest.raises(HandlerFailed, match="'headers' has an invalid header name"):
        await builtin.http(post(url, headers={"X A": "1"}))
    assert state.requests == []


async def test_http_non_2xx_fails_with_status_and_a_capped_body_head(
    http_server: tuple[str, _Server],
) -> None:
    allow("127.0.0.0/8")
    url, state = http_server
    state.status = 503
    state.body = b"x" * 2000
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(url))
    message = str(info.value)
    cap = builtin.HTTP_ERROR_BODY_BYTES
    assert f"POST {url} answered 503: " in message
    assert message.endswith("x" * cap)
    assert "x" * (cap + 1) not in message
    assert cap <= 500


async def test_http_body_head_has_no_line_breaks(http_server: tuple[str, _Server]) -> None:
    allow("127.0.0.0/8")
    url, state = http_server
    state.status = 500
    state.body = b"line one\r\n2026-01-01 ERROR forged log line\x1b[31m"
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(url))
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)


async def test_http_unreachable_and_bad_payloads() -> None:
    allow("127.0.0.0/8")
    with pytest.raises(HandlerFailed, match="failed"):
        # Port 9 (discard) is closed on the loopback interface of a test machine.
        await builtin.http(ctx(b'{"url": "http://127.0.0.1:9/", "timeout": 2}'))
    with pytest.raises(HandlerFailed, match="'timeout' must be a positive number"):
        await builtin.http(ctx(b'{"url": "http://127.0.0.1:9/", "timeout": 0}'))
    with pytest.raises(HandlerFailed, match="'headers' must be an object, got str"):
        await builtin.http(ctx(b'{"url": "http://127.0.0.1:9/", "headers": "x"}'))
    with pytest.raises(HandlerFailed, match="not JSON"):
        await builtin.http(ctx(b"{"))


class _Reporter:
    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        return acked(pb.RunEventAck(run_id=event.run_id))


async def test_credentials_and_queries_never_reach_logs_or_errors(
    http_server: tuple[str, _Server], caplog: pytest.LogCaptureFixture
) -> None:
    """Through the runner, which logs a failed run's error: the URL's password and query are in
    no log line and in no run error, and the credentials still reach the server."""
    caplog.set_level(logging.DEBUG)
    allow("127.0.0.0/8")
    url, state = http_server
    state.status = 500
    registry = HandlerRegistry()
    builtin.register_builtins(registry)
    runner = Runner(registry=registry, reporter=_Reporter(), worker_id="w-1")
    secret_url = url.replace("http://", "http://alice:pa55w0rd@") + "/hook?token=t0ps3cret"
    payload = json.dumps({"url": secret_url, "body": {"card": "4111-1111"}}).encode()
    outcome = await runner.run(
        RunTask(
            run_id="run-7",
            schedule_id="s1",
            tenant="acme",
            handler="http",
            payload=payload,
            scheduled_for=datetime.now(UTC) - timedelta(seconds=1),
            enqueue_time=None,
            attempt=1,
            manual=False,
            max_runtime=10,
        )
    )
    assert not outcome.succeeded
    assert f"POST {url}/hook?<redacted> answered 500" in outcome.error
    for secret in ("pa55w0rd", "alice", "t0ps3cret", "4111-1111"):
        assert secret not in caplog.text, secret
        assert secret not in outcome.error, secret
    # ... while the request itself carried them.
    path, headers, _ = state.requests[0]
    assert path == "/hook?token=t0ps3cret"
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"alice:pa55w0rd").decode()
    # Refusals do not show them either.
    builtin.configure_http(HttpAllow())
    with pytest.raises(HandlerFailed) as info:
        await builtin.http(post(secret_url))
    assert "pa55w0rd" not in str(info.value) and "t0ps3cret" not in str(info.value)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, _Server, list[str | None], Path]]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate for "localhost"."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    server_names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def on_sni(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        server_names.append(name)

    context.sni_callback = on_sni
    state = _Server(200, b"ok")
    for url in _serve("127.0.0.1", state, context):
        yield url, state, server_names, cert


async def test_https_sends_the_url_host_as_sni_and_host_and_checks_the_certificate(
    tls_server: tuple[str, _Server, list[str | None], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, state, server_names, cert = tls_server
    port = url.rsplit(":", 1)[1]
    allow("127.0.0.1/32")
    dns = _FakeDns({"localhost": [["127.0.0.1"]]})
    monkeypatch.setattr(builtin, "_getaddrinfo", dns)
    # Not trusted yet: the self-signed certificate fails verification.
    with pytest.raises(HandlerFailed, match="CERTIFICATE_VERIFY_FAILED"):
        await builtin.http(post(f"https://localhost:{port}/tls"))
    monkeypatch.setattr(builtin, "_tls_context", lambda: ssl.create_default_context(cafile=cert))
    assert (await builtin.http(post(f"https://localhost:{port}/tls")))["status"] == 200
    assert server_names[-1] == "localhost"
    assert state.requests[0][1]["Host"] == f"localhost:{port}"


async def test_http_requests_past_their_deadline_do_not_use_up_the_threads(
    http_server: tuple[str, _Server],
) -> None:
    """More requests to a server that never answers than asyncio's default executor has threads
    time out; on the worker's pool they are abandoned, and the next request goes out at once."""
    url, _ = http_server
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts connections (the kernel does) and never answers
    registry = HandlerRegistry()
    builtin.register_builtins(registry)
    runner = Runner(registry=registry, reporter=_Acks(), worker_id="w", sync_threads=8)
    builtin.configure_http(HttpAllow.parse("127.0.0.0/8", "test"), runner.threads)
    hung = {"url": f"http://127.0.0.1:{silent.getsockname()[1]}/", "timeout": 30}
    try:
        await asyncio.gather(
            *(runner.run(_task(f"hung-{i}", hung, max_runtime=0.3)) for i in range(8))
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        outcome = await runner.run(_task("next", {"url": f"{url}/hook"}, max_runtime=5))
        assert outcome.succeeded, outcome.error
        assert loop.time() - t0 < 2
        assert runner.threads.abandoned == 8
    finally:
        silent.close()


class _Acks:
    def submit(self, event: pb.RunEvent) -> asyncio.Future[pb.RunEventAck]:
        return acked(pb.RunEventAck(run_id=event.run_id))


def _task(run_id: str, payload: dict[str, Any], max_runtime: float) -> RunTask:
    return RunTask(
        run_id=run_id,
        schedule_id="s",
        tenant="acme",
        handler="http",
        payload=json.dumps(payload).encode(),
        scheduled_for=datetime.now(UTC),
        enqueue_time=None,
        attempt=1,
        manual=False,
        max_runtime=max_runtime,
    )
