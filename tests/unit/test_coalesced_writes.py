"""bucketer.cql.CoalescedWrites: rows of several callers written as one, each caller's failure
its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bucketer.cql import CoalescedWrites, Write


def _row(partition: str, value: int) -> Write:
    return Write((partition,), None, (value,))


class Store:
    """Records each write; a write holding a row of ``poison`` fails."""

    def __init__(self, poison: int | None = None) -> None:
        self.writes: list[list[Write]] = []
        self.poison = poison

    async def write(self, items: Sequence[Write]) -> None:
        await asyncio.sleep(0)
        self.writes.append(list(items))
        if self.poison is not None and any(w.params == (self.poison,) for w in items):
            raise RuntimeError(f"row {self.poison} refused")


async def test_callers_within_the_window_share_one_write() -> None:
    store = Store()
    together = CoalescedWrites(store.write, window=0.05, max_rows=100)
    first = asyncio.create_task(together.write([_row("a", 1), _row("b", 2)]))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(together.write([_row("a", 3)]))
    await asyncio.sleep(0)
    assert not first.done() and store.writes == []  # waiting for the window
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert [[w.params for w in write] for write in store.writes] == [[(1,), (2,), (3,)]]
    # The next caller opens a window of its own.
    await together.write([_row("c", 4)])
    assert len(store.writes) == 2 and together.waiting == 0


async def test_enough_rows_start_the_write_at_once() -> None:
    store = Store()
    together = CoalescedWrites(store.write, window=60, max_rows=3)
    await asyncio.wait_for(together.write([_row("a", i) for i in range(3)]), 1)
    assert len(store.writes) == 1


async def test_a_failed_write_is_retried_by_each_caller_alone() -> None:
    store = Store(poison=2)
    together = CoalescedWrites(store.write, window=0.02, max_rows=100)
    good = asyncio.create_task(together.write([_row("a", 1)]))
    bad = asyncio.create_task(together.write([_row("b", 2)]))
    await asyncio.wait({good, bad}, timeout=1)
    assert good.result() is None
    with pytest.raises(RuntimeError, match="row 2 refused"):
        bad.result()
    # The shared write, then each caller's own rows alone.
    assert sorted(len(w) for w in store.writes) == [1, 1, 2]


async def test_a_cancelled_caller_leaves_its_rows_to_be_written() -> None:
    store = Store()
    together = CoalescedWrites(store.write, window=0.02, max_rows=100)
    gone = asyncio.create_task(together.write([_row("a", 1)]))
    await asyncio.sleep(0)
    gone.cancel()
    stays = asyncio.create_task(together.write([_row("a", 2)]))
    await asyncio.wait_for(stays, 1)
    assert [[w.params for w in write] for write in store.writes] == [[(1,), (2,)]]
    assert gone.cancelled()


async def test_nothing_to_write_opens_no_window() -> None:
    store = Store()
    together = CoalescedWrites(store.write, window=60, max_rows=100)
    await asyncio.wait_for(together.write([]), 1)
    assert store.writes == [] and together.waiting == 0
