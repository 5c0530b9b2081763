"""The handlers every worker has: ``echo``, ``sleep``, ``fail`` and ``http``.

Importing this module registers them in the default registry (``worker.main`` does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from typing import Any

from worker.errors import HandlerFailed
from worker.handlers import HandlerContext, HandlerRegistry, default_registry

logger = logging.getLogger(__name__)

DEFAULT_FAIL_MESSAGE = "the fail handler always fails"
HTTP_DEFAULT_TIMEOUT = 10.0
# How much of a failing response's body goes into the run's error text.
HTTP_ERROR_BODY_BYTES = 500


async def echo(ctx: HandlerContext) -> bytes:
    """Logs the payload and returns it."""
    logger.info(
        "echo %s",
        ctx.payload[:1000].decode("utf-8", errors="replace"),
        extra=_ids(ctx),
    )
    return ctx.payload


async def sleep(ctx: HandlerContext) -> None:
    """Sleeps ``{"seconds": 1.5}`` (default 1) seconds; for tests and load tests."""
    seconds = _object(ctx, "sleep").get("seconds", 1.0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise HandlerFailed(f"sleep: 'seconds' must be a non-negative number, got {seconds!r}")
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


async def http(ctx: HandlerContext) -> dict[str, Any]:
    """POSTs ``body`` as JSON to ``url`` with ``Idempotency-Key: <run_id>``; 2xx is success.

    Payload: ``{"url": "https://...", "body": <any JSON>, "headers": {...}, "timeout": 10}``;
    only ``url`` is required. Redirects are not followed (a 3xx fails the run).
    """
    doc = _object(ctx, "http")
    url = doc.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise HandlerFailed(f"http: 'url' must be an http(s) URL, got {url!r}")
    headers = doc.get("headers") or {}
    if not isinstance(headers, dict):
        raise HandlerFailed(f"http: 'headers' must be an object, got {headers!r}")
    timeout = doc.get("timeout", HTTP_DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise HandlerFailed(f"http: 'timeout' must be a positive number, got {timeout!r}")
    body = json.dumps(doc["body"]).encode() if "body" in doc else b""
    all_headers = {"Content-Type": "application/json"}
    all_headers.update({str(k): str(v) for k, v in headers.items()})
    # Last, so a payload cannot replace the key that makes retries safe.
    all_headers["Idempotency-Key"] = ctx.run_id
    status, text = await asyncio.to_thread(_post, url, body, all_headers, float(timeout))
    if not 200 <= status < 300:
        raise HandlerFailed(f"POST {url} answered {status}: {text}")
    return {"status": status, "body": text}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect())


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _opener.open(request, timeout=timeout) as response:
            return response.status, _head(response.read(HTTP_ERROR_BODY_BYTES))
    except urllib.error.HTTPError as e:
        with e:
            return e.code, _head(e.read(HTTP_ERROR_BODY_BYTES))
    except urllib.error.URLError as e:
        raise HandlerFailed(f"POST {url} failed: {e.reason}") from e
    except TimeoutError as e:
        raise HandlerFailed(f"POST {url} got no answer within {timeout:g} s") from e


def _head(data: bytes) -> str:
    return data[:HTTP_ERROR_BODY_BYTES].decode("utf-8", errors="replace")


def _object(ctx: HandlerContext, name: str) -> dict[str, Any]:
    try:
        doc = ctx.json()
    except ValueError as e:
        raise HandlerFailed(f"{name}: the payload is not JSON: {e}") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise HandlerFailed(f"{name}: the payload must be a JSON object, got {type(doc).__name__}")
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
