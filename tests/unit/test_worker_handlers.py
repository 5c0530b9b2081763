"""The handler registry, the decorator, the context and module loading."""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from worker.errors import DuplicateHandler, HandlerImportError, UnknownHandler
from worker.handlers import HandlerContext, HandlerRegistry, handler, load_imports


def ctx(payload: bytes = b"") -> HandlerContext:
    return HandlerContext(
        run_id="r1",
        schedule_id="s1",
        tenant="acme",
        attempt=1,
        scheduled_for=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
    )


async def test_async_handler_is_called_directly() -> None:
    registry = HandlerRegistry()

    @handler("a", registry=registry)
    async def a(c: HandlerContext) -> str:
        return c.run_id

    assert await registry.get("a")(ctx()) == "r1"
    assert "a" in registry


async def test_plain_handler_runs_in_a_thread() -> None:
    registry = HandlerRegistry()
    seen: list[str] = []

    @registry.handler("plain")
    def plain(c: HandlerContext) -> int:
        seen.append(threading.current_thread().name)
        return c.attempt + 1

    assert await registry.get("plain")(ctx()) == 2
    assert seen and seen[0] != threading.main_thread().name


async def test_async_callable_object_is_recognised() -> None:
    class Job:
        async def __call__(self, c: HandlerContext) -> str:
            return "obj"

    registry = HandlerRegistry()
    registry.register("obj", Job())
    assert await registry.get("obj")(ctx()) == "obj"


def test_unknown_handler_names_the_handler() -> None:
    with pytest.raises(UnknownHandler) as info:
        HandlerRegistry().get("nope")
    assert str(info.value) == "unknown handler 'nope'"


def test_duplicate_names_are_refused_but_reregistration_is_harmless() -> None:
    registry = HandlerRegistry()

    async def one(c: HandlerContext) -> None: ...

    async def two(c: HandlerContext) -> None: ...

    registry.register("x", one)
    registry.register("x", one)
    with pytest.raises(DuplicateHandler, match="'x' is already registered"):
        registry.register("x", two)
    assert registry.names() == ["x"]


def test_context_json() -> None:
    assert ctx().json() is None
    assert ctx(b'{"a": [1, 2]}').json() == {"a": [1, 2]}
    with pytest.raises(ValueError):
        ctx(b"not json").json()


async def test_context_default_heartbeat_is_a_no_op() -> None:
    await ctx().heartbeat()


def test_load_imports_registers_decorated_handlers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cs_test_jobs_ok.py").write_text(
        "from worker.handlers import handler\n"
        "@handler('cs_test.loaded')\n"
        "async def loaded(ctx):\n"
        "    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from worker.handlers import default_registry

    load_imports(["cs_test_jobs_ok"])
    assert "cs_test.loaded" in default_registry
    sys.modules.pop("cs_test_jobs_ok", None)


def test_load_imports_explains_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cs_test_jobs_broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HandlerImportError, match="'cs_test_jobs_broken': RuntimeError: boom"):
        load_imports(["cs_test_jobs_broken"])
    with pytest.raises(HandlerImportError, match="'no_such_module_xyz': ModuleNotFoundError"):
        load_imports(["no_such_module_xyz"])
