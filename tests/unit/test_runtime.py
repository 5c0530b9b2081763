"""The runtime tuning every long-running process applies (worker.runtime)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from worker.runtime import DEFAULT_GC_THRESHOLD, gc_threshold, tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_default_collects_cycles_far_less_often_than_cpython() -> None:
    assert gc_threshold({}) == DEFAULT_GC_THRESHOLD
    assert gc_threshold({"CRONSCALE_GC_THRESHOLD": " 1000, 5,7 "}) == (1000, 5, 7)
    assert gc_threshold({"CRONSCALE_GC_THRESHOLD": "python"}) is None


@pytest.mark.parametrize("raw", ["1000,5", "a,b,c", "0,10,10", "1,2,3,4", "-5,1,1"])
def test_a_bad_threshold_names_the_variable_and_the_problem(raw: str) -> None:
    with pytest.raises(ValueError) as e:
        gc_threshold({"CRONSCALE_GC_THRESHOLD": raw})
    assert "CRONSCALE_GC_THRESHOLD must be three positive integers" in str(e.value)
    assert repr(raw) in str(e.value)


@pytest.mark.usefixtures("restore_gc")
def test_tune_gc_sets_the_thresholds_and_freezes_what_start_up_made() -> None:
    assert tune_gc({"CRONSCALE_GC_THRESHOLD": "40000,15,90"}) == (40000, 15, 90)
    assert gc.get_threshold() == (40000, 15, 90)
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("restore_gc")
def test_python_keeps_cpython_s_own() -> None:
    before = gc.get_threshold()
    assert tune_gc({"CRONSCALE_GC_THRESHOLD": "python"}) is None
    assert gc.get_threshold() == before
