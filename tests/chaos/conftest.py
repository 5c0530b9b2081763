"""The ``chaos`` marker: ``pytest tests/chaos`` or ``pytest -m chaos`` runs the proof alone,
``pytest -m "not chaos"`` leaves it out."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: fault injection on the real fleet, Cassandra and Kafka (minutes)"
    )
