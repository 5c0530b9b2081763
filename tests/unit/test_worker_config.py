"""WorkerConfig from the environment."""

from __future__ import annotations

import pytest

from worker.config import WorkerConfig
from worker.errors import ConfigError


def test_defaults() -> None:
    config = WorkerConfig.from_env({})
    assert config.kafka_bootstrap == "127.0.0.1:9092"
    assert config.api_target == "127.0.0.1:50051"
    assert config.topic == "cronscale.runs.standard"
    assert config.group_id == "cronscale.runs.standard.workers"
    assert config.concurrency == 64
    assert config.default_timeout == 300
    assert config.metrics_port == 0
    assert config.instance_id  # host-pid


def test_environment_overrides() -> None:
    config = WorkerConfig.from_env(
        {
            "CRONSCALE_KAFKA_BOOTSTRAP": "kafka:9092",
            "CRONSCALE_TOPIC_PREFIX": "t1.runs",
            "CRONSCALE_TIER": "premium",
            "CRONSCALE_API": "api:50051",
            "CRONSCALE_WORKER_CONCURRENCY": "8",
            "CRONSCALE_WORKER_DEFAULT_TIMEOUT": "2.5",
            "CRONSCALE_INSTANCE_ID": "w-7",
            "CRONSCALE_METRICS_PORT": "9400",
        }
    )
    assert config.topic == "t1.runs.premium"
    assert config.group_id == "t1.runs.premium.workers"
    assert (config.kafka_bootstrap, config.api_target) == ("kafka:9092", "api:50051")
    assert (config.concurrency, config.default_timeout) == (8, 2.5)
    assert (config.instance_id, config.metrics_port) == ("w-7", 9400)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"CRONSCALE_WORKER_CONCURRENCY": "many"}, "CRONSCALE_WORKER_CONCURRENCY must be a number"),
        ({"CRONSCALE_WORKER_CONCURRENCY": "0"}, "concurrency must be at least 1"),
        ({"CRONSCALE_WORKER_DEFAULT_TIMEOUT": "-1"}, "default timeout must be positive"),
    ],
)
def test_bad_values_are_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        WorkerConfig.from_env(env)
