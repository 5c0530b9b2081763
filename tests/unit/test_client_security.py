"""Cassandra and Kafka client security settings from the environment: what each variable
turns on, and a precise error naming the variable for every setting that cannot work."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from scheduler.config import Config
from scheduler.errors import InvalidArgument
from tests.tls import self_signed
from worker.config import WorkerConfig
from worker.errors import ConfigError
from worker.kafka_security import KafkaSecurity


def test_plain_by_default() -> None:
    config = Config.from_env({})
    assert config.kafka_security.client_options() == {"security_protocol": "PLAINTEXT"}
    assert config.cassandra_security.cluster_options() == {}
    assert WorkerConfig.from_env({}).kafka_security == KafkaSecurity()


def test_sasl_ssl_with_a_ca(tmp_path: Path) -> None:
    ca, _ = self_signed(tmp_path, "ca")
    env = {
        "CRONSCALE_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "CRONSCALE_KAFKA_SASL_MECHANISM": "scram-sha-512",
        "CRONSCALE_KAFKA_USERNAME": "cronscale",
        "CRONSCALE_KAFKA_PASSWORD": "s3cret",
        "CRONSCALE_KAFKA_TLS_CA_FILE": str(ca),
    }
    for security in (
        Config.from_env(env).kafka_security,
        WorkerConfig.from_env(env).kafka_security,
    ):
        options = security.client_options()
        assert options["security_protocol"] == "SASL_SSL"
        assert options["sasl_mechanism"] == "SCRAM-SHA-512"
        assert (options["sasl_plain_username"], options["sasl_plain_password"]) == (
            "cronscale",
            "s3cret",
        )
        context = options["ssl_context"]
        assert isinstance(context, ssl.SSLContext) and context.check_hostname
        assert "s3cret" not in repr(security)


def test_cassandra_credentials_and_tls(tmp_path: Path) -> None:
    ca, _ = self_signed(tmp_path, "ca")
    cert, key = self_signed(tmp_path, "client")
    config = Config.from_env(
        {
            "CRONSCALE_CASSANDRA_USERNAME": "cronscale",
            "CRONSCALE_CASSANDRA_PASSWORD": "s3cret",
            "CRONSCALE_CASSANDRA_TLS_CA_FILE": str(ca),
            "CRONSCALE_CASSANDRA_TLS_CERT_FILE": str(cert),
            "CRONSCALE_CASSANDRA_TLS_KEY_FILE": str(key),
        }
    )
    options = config.cassandra_security.cluster_options()
    assert options["auth_provider"].username == "cronscale"
    assert options["ssl_context"].verify_mode is ssl.CERT_REQUIRED
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("env", "field", "problem"),
    [
        (
            {"CRONSCALE_KAFKA_SECURITY_PROTOCOL": "TLS"},
            "CRONSCALE_KAFKA_SECURITY_PROTOCOL",
            "one of",
        ),
        (
            {"CRONSCALE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
            "CRONSCALE_KAFKA_USERNAME",
            "required",
        ),
        (
            {
                "CRONSCALE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "CRONSCALE_KAFKA_SASL_MECHANISM": "GSSAPI",
                "CRONSCALE_KAFKA_USERNAME": "u",
                "CRONSCALE_KAFKA_PASSWORD": "p",
            },
            "CRONSCALE_KAFKA_SASL_MECHANISM",
            "one of",
        ),
        ({"CRONSCALE_KAFKA_USERNAME": "u"}, "CRONSCALE_KAFKA_USERNAME", "need a SASL"),
        ({"CRONSCALE_KAFKA_TLS_CA_FILE": "/ca.pem"}, "CRONSCALE_KAFKA_TLS_*", "SSL or SASL_SSL"),
        (
            {"CRONSCALE_KAFKA_SECURITY_PROTOCOL": "SSL", "CRONSCALE_KAFKA_TLS_CERT_FILE": "/c"},
            "CRONSCALE_KAFKA_TLS_CERT_FILE",
            "together",
        ),
        ({"CRONSCALE_CASSANDRA_USERNAME": "u"}, "CRONSCALE_CASSANDRA_USERNAME", "together"),
        (
            {"CRONSCALE_CASSANDRA_TLS_CERT_FILE": "/c", "CRONSCALE_CASSANDRA_TLS_KEY_FILE": "/k"},
            "CRONSCALE_CASSANDRA_TLS_CERT_FILE",
            "CA_FILE",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_variable(
    env: dict[str, str], field: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        Config.from_env(env)
    assert str(raised.value).startswith(field) and problem in str(raised.value)
    if field.startswith("CRONSCALE_KAFKA"):
        with pytest.raises(ConfigError, match=field.replace("*", r"\*")):
            WorkerConfig.from_env(env)


def test_an_unreadable_ca_file_names_the_problem(tmp_path: Path) -> None:
    security = KafkaSecurity(protocol="SSL", ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="cannot load the Kafka TLS files"):
        security.client_options()
