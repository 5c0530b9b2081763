"""The handlers every worker has: ``echo``, ``sleep``, ``fail`` and ``http``.

Importing this module registers them in the default registry (``worker.main`` does).

The ``http`` handler takes its URL from tenants, so it reaches public addresses only: loopback,
link-local (cloud metadata), private, unspecified, multicast and reserved targets are refused
unless the operator allows them (:func:`configure_http`, ``CRONSCALE_HTTP_ALLOW``). The host is
resolved once and the connection goes to an address that was checked, so a DNS answer that
changes between check and use cannot bypass the rule.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.client as http_client
import ipaddress
import json
import logging
import re
import socket
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

from worker.config import HttpAllow, IPAddress
from worker.errors import HandlerFailed, NonRetryable
from worker.handlers import HandlerContext, HandlerRegistry, default_registry
from worker.threads import SyncThreads

logger = logging.getLogger(__name__)

DEFAULT_FAIL_MESSAGE = "the fail handler always fails"
HTTP_DEFAULT_TIMEOUT = 10.0
# How much of a response's body goes into the run's error text (or result).
HTTP_ERROR_BODY_BYTES = 300
# How much of a URL (credentials and query already removed) goes into error texts.
HTTP_SHOWN_URL_CHARS = 200
# Headers a payload may not set: they are derived from the URL and the body, and overriding
# them would let a tenant reach another virtual host behind an allowed address or smuggle
# requests.
HTTP_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUE_FORBIDDEN = re.compile(r"[\r\n\x00]")

# IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64, RFC 6052 and 8215).
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)

# What the http handler may reach besides public addresses; set by the worker at start.
_http_allow = HttpAllow()
# A request past its run's deadline runs on until its own timeout: on the worker's pool it is
# abandoned there (counted, its slot freed) instead of holding one of the few threads of
# asyncio's default executor.
_http_threads: SyncThreads | None = None


async def echo(ctx: HandlerContext) -> bytes:
    """Returns the payload; logs only its size (payloads can carry anything)."""
    logger.info("echo: %d payload bytes", len(ctx.payload), extra=_ids(ctx))
    return ctx.payload


async def sleep(ctx: HandlerContext) -> None:
    """Sleeps ``{"seconds": 1.5}`` (default 1) seconds; for tests and load tests."""
    seconds = _object(ctx, "sleep").get("seconds", 1.0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise NonRetryable(f"sleep: 'seconds' must be a non-negative number, got {seconds!r}")
    await asyncio.sleep(seconds)


async def fail(ctx: HandlerContext) -> None:
    """Always raises :class:`HandlerFailed` with ``{"error": "..."}`` or a default text."""
    try:
        doc = ctx.json()
    except ValueError:
        doc = None
    message = DEFAULT_FAIL_MESSAGE
    if isinstance(doc, dict) and doc.get("error"):
        message = str(doc["error"])
    raise HandlerFailed(message)


def configure_http(allow: HttpAllow, threads: SyncThreads | None = None) -> None:
    """Sets what the ``http`` handler may reach besides public addresses, and the threads its
    blocking requests run on (the worker's own pool; asyncio's default executor when None).
    The worker calls it."""
    global _http_allow, _http_threads
    _http_allow = allow
    _http_threads = threads


def denied_reason(address: IPAddress) -> str | None:
    """Why the ``http`` handler refuses ``address`` by default; ``None`` for a public address.

    An IPv6 address that carries an IPv4 address (IPv4-mapped, NAT64, 6to4) is judged by the
    IPv4 address it leads to.
    """
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return denied_reason(address.ipv4_mapped)
        if any(address in n for n in _NAT64):
            return denied_reason(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address.sixtofour is not None:
            inner = denied_reason(address.sixtofour)
            if inner is not None:
                return inner
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if any(address in n for n in _PRIVATE if n.version == address.version):
        return "private"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "shared (carrier-grade NAT)"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


def redact_url(url: str) -> str:
    """``url`` fit for logs and run errors: no credentials, no query, no fragment, bounded.

    ``https://user:pw@host/p?token=x`` becomes ``https://host/p?<redacted>``.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    shown = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else parts.path
    if parts.query:
        shown += "?<redacted>"
    if len(shown) > HTTP_SHOWN_URL_CHARS:
        shown = shown[: HTTP_SHOWN_URL_CHARS - 3] + "..."
    return shown


@dataclass(frozen=True)
class _Target:
    """A checked ``url``: where to connect and what to send."""

    scheme: str
    host: str  # ASCII (IDNA) host name or IP literal, without brackets
    port: int
    request_target: str  # path and query, as sent on the request line
    shown: str  # redact_url(url)
    authorization: str | None  # from credentials in the URL


async def http(ctx: HandlerContext) -> dict[str, Any]:
    """POSTs ``body`` as JSON to ``url`` with ``Idempotency-Key: <run_id>``; 2xx is success.

    Payload: ``{"url": "https://...", "body": <any JSON>, "headers": {...}, "timeout": 10}``;
    only ``url`` is required. Redirects are not followed (a 3xx fails the run). Targets that are
    not public addresses are refused unless allowed (see the module's documentation).
    Credentials in the URL are sent as HTTP basic authentication.
    """
    doc = _object(ctx, "http")
    target = _parse_url(doc.get("url"))
    headers = doc.get("headers") or {}
    if not isinstance(headers, dict):
        raise NonRetryable(f"http: 'headers' must be an object, got {type(headers).__name__}")
    timeout = doc.get("timeout", HTTP_DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise NonRetryable(f"http: 'timeout' must be a positive number, got {timeout!r}")
    body = json.dumps(doc["body"]).encode() if "body" in doc else b""
    all_headers = {"Content-Type": "application/json", "User-Agent": "cronscale-worker"}
    if target.authorization is not None:
        all_headers["Authorization"] = target.authorization
    for key, value in headers.items():
        name, text = str(key), str(value)
        if not _HEADER_NAME.match(name):
            raise NonRetryable(f"http: 'headers' has an invalid header name {name[:100]!r}")
        if name.lower() in HTTP_RESERVED_HEADERS:
            raise NonRetryable(f"http: 'headers' must not set {name} (it comes from the request)")
        if _HEADER_VALUE_FORBIDDEN.search(text):
            raise NonRetryable(f"http: 'headers' value of {name} contains a line break or NUL")
        for existing in [k for k in all_headers if k.lower() == name.lower()]:
            del all_headers[existing]
        all_headers[name] = text
    # Last, so a payload cannot replace the key that makes retries safe.
    all_headers["Idempotency-Key"] = ctx.run_id
    allow = _http_allow

    def request(_: object = None) -> tuple[int, str, str | None]:
        return _post(target, allow, body, all_headers, float(timeout))

    threads = _http_threads
    if threads is None:
        status, text, location = await asyncio.to_thread(request)
    else:
        status, text, location = await threads.run(request, None, name=f"http {ctx.run_id}")
    logger.debug("http: POST %s answered %d", target.shown, status, extra=_ids(ctx))
    if 300 <= status < 400:
        where = f" to {redact_url(location)}" if location else ""
        raise NonRetryable(
            f"POST {target.shown} answered {status}: a redirect{where}, which is not followed"
        )
    if not 200 <= status < 300:
        # A client error other than a timeout or a rate limit will not change on a retry.
        hopeless = 400 <= status < 500 and status not in (408, 425, 429)
        raise (NonRetryable if hopeless else HandlerFailed)(
            f"POST {target.shown} answered {status}: {text}"
        )
    return {"status": status, "body": text}


def _parse_url(url: object) -> _Target:
    if not isinstance(url, str):
        raise NonRetryable(f"http: 'url' must be an http(s) URL, got {type(url).__name__}")
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        # The message names the problem (e.g. the port), never the URL itself.
        raise NonRetryable(f"http: 'url' {shown} is not a valid URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise NonRetryable(f"http: 'url' must be an http(s) URL, got scheme {parts.scheme[:20]!r}")
    raw_host = parts.hostname
    if not raw_host:
        raise NonRetryable(f"http: 'url' {shown} has no host")
    try:
        ipaddress.ip_address(raw_host)
        host = raw_host
    except ValueError:
        try:
            host = raw_host.encode("idna").decode("ascii")
        except UnicodeError:
            raise NonRetryable(f"http: 'url' {shown} has an invalid host name") from None
    request_target = parts.path or "/"
    if parts.query:
        request_target += f"?{parts.query}"
    if any(c in request_target for c in " \r\n\x00"):
        raise NonRetryable(f"http: 'url' {shown} contains a blank or a control character")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return _Target(
        scheme=scheme,
        host=host,
        port=port if port is not None else (443 if scheme == "https" else 80),
        request_target=request_target,
        shown=shown,
        authorization=authorization,
    )


_SockAddr = tuple[Any, ...]


def _getaddrinfo(host: str, port: int) -> list[tuple[socket.AddressFamily, _SockAddr]]:
    """The host's addresses (tests replace this to play DNS)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [(family, sockaddr) for family, _, _, _, sockaddr in infos]


def _resolve(target: _Target, allow: HttpAllow) -> list[tuple[socket.AddressFamily, _SockAddr]]:
    """The checked addresses to connect to; raises :class:`HandlerFailed` when none is allowed.

    Resolved once: the connection goes to one of these, never to a fresh lookup.
    """
    try:
        infos = _getaddrinfo(target.host, target.port)
    except (OSError, UnicodeError) as e:
        raise NonRetryable(f"http: 'url' host {target.host} does not resolve: {e}") from None
    by_name = allow.allows_host(target.host)
    usable: list[tuple[socket.AddressFamily, _SockAddr]] = []
    refused: list[str] = []
    for family, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        reason = None if by_name or allow.allows_address(address) else denied_reason(address)
        if reason is None:
            usable.append((family, sockaddr))
        else:
            refused.append(f"{address} ({reason})")
    if not usable:
        if not refused:
            raise NonRetryable(f"http: 'url' host {target.host} has no IP address")
        raise NonRetryable(
            f"http: 'url' {target.shown} is refused: its host resolves to "
            f"{', '.join(refused[:4])}, and only public addresses are reachable unless the "
            "worker's operator allows more (CRONSCALE_HTTP_ALLOW or --http-allow)"
        )
    if refused:
        logger.info(
            "http: skipping addresses of %s that are not allowed: %s",
            target.host,
            ", ".join(refused[:4]),
        )
    return usable


def _connect(
    addresses: list[tuple[socket.AddressFamily, _SockAddr]], timeout: float
) -> socket.socket:
    """A TCP connection to the first of ``addresses`` that answers."""
    error: OSError | None = None
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            sock.close()
            error = e
    assert error is not None  # addresses is never empty
    raise error


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Verifies certificates and host names against the system's CAs."""
    return ssl.create_default_context()


def _post(
    target: _Target, allow: HttpAllow, body: bytes, headers: dict[str, str], timeout: float
) -> tuple[int, str, str | None]:
    """Sends the request; returns the status, the body's head and a redirect's Location."""
    addresses = _resolve(target, allow)
    connection: http_client.HTTPConnection | None = None
    try:
        sock = _connect(addresses, timeout)
        if target.scheme == "https":
            try:
                # SNI and certificate checks use the URL's host, not the address connected to.
                sock = _tls_context().wrap_socket(sock, server_hostname=target.host)
            except BaseException:
                sock.close()
                raise
            connection = http_client.HTTPSConnection(
                target.host, target.port, timeout=timeout, context=_tls_context()
            )
        else:
            connection = http_client.HTTPConnection(target.host, target.port, timeout=timeout)
        # A connected socket: http.client sends on it instead of resolving the host again, and
        # still writes Host from the URL's host and port.
        connection.sock = sock
        connection.request("POST", target.request_target, body=body, headers=headers)
        response = connection.getresponse()
        return (
            response.status,
            _head(response.read(HTTP_ERROR_BODY_BYTES)),
            response.getheader("Location"),
        )
    except TimeoutError:
        raise HandlerFailed(f"POST {target.shown} got no answer within {timeout:g} s") from None
    except (OSError, http_client.HTTPException) as e:
        reason = str(e)[:200] or type(e).__name__
        raise HandlerFailed(f"POST {target.shown} failed: {reason}") from None
    finally:
        if connection is not None:
            connection.close()


def _head(data: bytes) -> str:
    """The first bytes of a body as text, without line breaks or other control characters."""
    text = data[:HTTP_ERROR_BODY_BYTES].decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text)


def _object(ctx: HandlerContext, name: str) -> dict[str, Any]:
    try:
        doc = ctx.json()
    except ValueError as e:
        raise NonRetryable(f"{name}: the payload is not JSON: {e}") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise NonRetryable(f"{name}: the payload must be a JSON object, got {type(doc).__name__}")
    return doc


def _ids(ctx: HandlerContext) -> dict[str, str]:
    return {"run_id": ctx.run_id, "schedule_id": ctx.schedule_id, "tenant": ctx.tenant}


def register_builtins(registry: HandlerRegistry) -> None:
    """Registers the built-in handlers in ``registry``."""
    registry.register("echo", echo)
    registry.register("sleep", sleep)
    registry.register("fail", fail)
    registry.register("http", http)


register_builtins(default_registry)
