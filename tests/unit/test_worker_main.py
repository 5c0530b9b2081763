"""`cronscale worker` option handling that fails before any service is contacted."""

from __future__ import annotations

import logging

import pytest

from worker.main import main


def test_a_module_that_does_not_import_exits_2(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["--import", "no_such_pkg_for_cronscale.jobs"]) == 2
    assert "cannot import handler module 'no_such_pkg_for_cronscale.jobs'" in caplog.text


def test_a_bad_concurrency_exits_2(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["--concurrency", "0"]) == 2
    assert "concurrency must be at least 1" in caplog.text


def test_unknown_options_are_refused() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--no-such-option"])
    assert info.value.code == 2
