"""A worker's health conditions (worker.health): SERVING only while Kafka and the API both
work, the reason naming each that does not, each failure said once, the gauges following."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from worker.health import API, KAFKA, WorkerHealth


def _gauge(name: str, tier: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"tier": tier})


def test_not_serving_until_kafka_joins_then_following_both_conditions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="worker.health")
    health = WorkerHealth("unit-health")
    assert not health.serving and health.reason == "Kafka: not connected yet"
    assert _gauge("cronscale_worker_kafka_up", "unit-health") == 0
    assert _gauge("cronscale_worker_api_up", "unit-health") == 1

    health.down(KAFKA, "cannot reach 127.0.0.1:1: refused")
    health.down(KAFKA, "cannot reach 127.0.0.1:1: refused")  # a retry: not said again
    assert caplog.text.count("not serving: Kafka: cannot reach 127.0.0.1:1") == 1

    health.up(KAFKA)
    assert health.serving and "serving" in caplog.messages
    assert _gauge("cronscale_worker_kafka_up", "unit-health") == 1

    health.down(API, "127.0.0.1:2 does not take run reports")
    health.down(KAFKA, "an offset commit failed")
    assert not health.serving
    assert health.reason == (
        "API: 127.0.0.1:2 does not take run reports; Kafka: an offset commit failed"
    )
    assert _gauge("cronscale_worker_api_up", "unit-health") == 0

    health.up(API)
    assert not health.serving and health.reason == "Kafka: an offset commit failed"
    health.up(KAFKA)
    health.up(KAFKA)  # already up: nothing changes, nothing said
    assert health.serving and caplog.messages.count("serving again") == 1
