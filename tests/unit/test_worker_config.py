"""WorkerConfig from the environment."""

from __future__ import annotations

import ipaddress
import re

import pytest

from worker.config import HttpAllow, WorkerConfig
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
    assert (config.revoke_grace, config.new_group_lookback, config.sync_threads) == (2, 600, 16)
    assert config.group_instance_id == ""
    assert config.commit_stuck == 60
    assert config.report_interval == 0.1


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
            "CRONSCALE_WORKER_REVOKE_GRACE": "0.5",
            "CRONSCALE_WORKER_NEW_GROUP_LOOKBACK": "0",
            "CRONSCALE_WORKER_SYNC_THREADS": "4",
            "CRONSCALE_WORKER_GROUP_INSTANCE_ID": " worker-3 ",
            "CRONSCALE_WORKER_COMMIT_STUCK": "90",
            "CRONSCALE_WORKER_REPORT_INTERVAL": "0.25",
        }
    )
    assert config.topic == "t1.runs.premium"
    assert config.group_id == "t1.runs.premium.workers"
    assert (config.kafka_bootstrap, config.api_target) == ("kafka:9092", "api:50051")
    assert (config.concurrency, config.default_timeout) == (8, 2.5)
    assert (config.instance_id, config.metrics_port) == ("w-7", 9400)
    assert (config.revoke_grace, config.new_group_lookback, config.sync_threads) == (0.5, 0, 4)
    assert config.group_instance_id == "worker-3"
    assert config.commit_stuck == 90
    assert config.report_interval == 0.25


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"CRONSCALE_WORKER_CONCURRENCY": "many"}, "CRONSCALE_WORKER_CONCURRENCY must be a number"),
        ({"CRONSCALE_WORKER_REPORT_INTERVAL": "0"}, "report interval must be above 0"),
        ({"CRONSCALE_WORKER_REPORT_INTERVAL": "6"}, "above 0 and at most 5 s, got 6"),
        ({"CRONSCALE_WORKER_CONCURRENCY": "0"}, "concurrency must be at least 1"),
        ({"CRONSCALE_WORKER_DEFAULT_TIMEOUT": "-1"}, "default timeout must be positive"),
        ({"CRONSCALE_WORKER_REVOKE_GRACE": "-1"}, "revoke grace must not be negative"),
        ({"CRONSCALE_WORKER_NEW_GROUP_LOOKBACK": "-5"}, "lookback must not be negative"),
        ({"CRONSCALE_WORKER_SYNC_THREADS": "0"}, "sync threads must be at least 1"),
        ({"CRONSCALE_WORKER_COMMIT_STUCK": "0"}, "commit stuck timeout must be positive"),
        ({"CRONSCALE_WORKER_COMMIT_STUCK": "soon"}, "CRONSCALE_WORKER_COMMIT_STUCK must be a"),
    ],
)
def test_bad_values_are_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        WorkerConfig.from_env(env)


def test_metrics_bind_loopback_unless_told() -> None:
    assert WorkerConfig.from_env({}).metrics_addr == "127.0.0.1"
    assert WorkerConfig.from_env({"CRONSCALE_METRICS_ADDR": "0.0.0.0"}).metrics_addr == "0.0.0.0"
    with pytest.raises(ConfigError, match="metrics address must not be empty"):
        WorkerConfig(metrics_addr=" ")


def test_http_allow_defaults_to_public_addresses_only() -> None:
    allow = WorkerConfig.from_env({}).http_allow
    assert allow == HttpAllow()
    assert str(allow) == "none (public addresses only)"
    assert not allow.allows_address(ipaddress.ip_address("127.0.0.1"))
    assert not allow.allows_host("localhost")


def test_http_allow_from_the_environment() -> None:
    config = WorkerConfig.from_env(
        {"CRONSCALE_HTTP_ALLOW": "127.0.0.0/8, 10.1.2.3 fd00::/8,Hooks.Corp.Example.,*.svc.local"}
    )
    allow = config.http_allow
    assert str(allow) == "127.0.0.0/8, 10.1.2.3/32, fd00::/8, hooks.corp.example, *.svc.local"
    ip = ipaddress.ip_address
    assert allow.allows_address(ip("127.9.9.9"))
    assert allow.allows_address(ip("::ffff:127.0.0.1"))  # IPv4-mapped
    assert allow.allows_address(ip("10.1.2.3"))
    assert not allow.allows_address(ip("10.1.2.4"))
    assert allow.allows_address(ip("fd00:ec2::254"))
    assert not allow.allows_address(ip("::1"))
    assert allow.allows_host("HOOKS.corp.example.")
    assert not allow.allows_host("evil-hooks.corp.example")
    assert allow.allows_host("billing.svc.local") and allow.allows_host("a.b.svc.local")
    assert not allow.allows_host("svc.local") and not allow.allows_host("evilsvc.local")


@pytest.mark.parametrize(
    "entry", ["10.0.0.0/33", "http://10.0.0.1/", "bad/host", "under_score.example", "*", "a..b"]
)
def test_bad_http_allow_entries_are_named(entry: str) -> None:
    with pytest.raises(
        ConfigError, match=f"CRONSCALE_HTTP_ALLOW: {re.escape(repr(entry))} is neither"
    ):
        WorkerConfig.from_env({"CRONSCALE_HTTP_ALLOW": f"127.0.0.1,{entry}"})
