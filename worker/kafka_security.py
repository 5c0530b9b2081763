"""How every cronscale process authenticates to Kafka and encrypts the connection.

The local stack is plain on loopback (the default, ``PLAINTEXT``). A production cluster sets,
for the dispatcher and the worker alike:

- ``CRONSCALE_KAFKA_SECURITY_PROTOCOL``: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or
  ``SASL_SSL``;
- for SASL: ``CRONSCALE_KAFKA_SASL_MECHANISM`` (``PLAIN``, ``SCRAM-SHA-256`` or
  ``SCRAM-SHA-512``; default ``PLAIN``), ``CRONSCALE_KAFKA_USERNAME``,
  ``CRONSCALE_KAFKA_PASSWORD``;
- for TLS: ``CRONSCALE_KAFKA_TLS_CA_FILE`` (PEM; the system's CAs when unset) and, for client
  certificates, ``CRONSCALE_KAFKA_TLS_CERT_FILE`` with ``CRONSCALE_KAFKA_TLS_KEY_FILE``. The
  broker's certificate is verified, host name included.

Every Kafka client of the process (producer, consumer, admin) takes :meth:`client_options`.
The password is never logged (it is left out of ``repr``).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.helpers import create_ssl_context

from worker.errors import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, kw_only=True)
class KafkaSecurity:
    """Kafka client security settings, checked when built (:class:`ConfigError` names the
    variable at fault)."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"CRONSCALE_KAFKA_SECURITY_PROTOCOL must be one of {', '.join(PROTOCOLS)}, "
                f"got {self.protocol!r}"
            )
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise ConfigError(
                    f"CRONSCALE_KAFKA_SASL_MECHANISM must be one of {', '.join(MECHANISMS)}, "
                    f"got {self.mechanism!r}"
                )
            if not self.username or not self.password:
                raise ConfigError(
                    f"CRONSCALE_KAFKA_USERNAME and CRONSCALE_KAFKA_PASSWORD are required with "
                    f"CRONSCALE_KAFKA_SECURITY_PROTOCOL={self.protocol}"
                )
        elif self.username or self.password:
            raise ConfigError(
                "CRONSCALE_KAFKA_USERNAME and CRONSCALE_KAFKA_PASSWORD need a SASL "
                "CRONSCALE_KAFKA_SECURITY_PROTOCOL (SASL_SSL or SASL_PLAINTEXT), "
                f"got {self.protocol}"
            )
        if not self.tls and (self.ca_file or self.cert_file or self.key_file):
            raise ConfigError(
                "CRONSCALE_KAFKA_TLS_* files need CRONSCALE_KAFKA_SECURITY_PROTOCOL SSL or "
                f"SASL_SSL, got {self.protocol}"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError(
                "CRONSCALE_KAFKA_TLS_CERT_FILE and CRONSCALE_KAFKA_TLS_KEY_FILE are set together "
                "or not at all"
            )

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSecurity:
        def get(name: str) -> str:
            return env.get(f"CRONSCALE_KAFKA_{name}", "").strip()

        return cls(
            protocol=get("SECURITY_PROTOCOL").upper() or "PLAINTEXT",
            mechanism=get("SASL_MECHANISM").upper() or "PLAIN",
            username=get("USERNAME"),
            password=env.get("CRONSCALE_KAFKA_PASSWORD", ""),
            ca_file=get("TLS_CA_FILE"),
            cert_file=get("TLS_CERT_FILE"),
            key_file=get("TLS_KEY_FILE"),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context: the broker verified against ``ca_file`` (or the system's CAs)."""
        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ca_file or None,
                certfile=self.cert_file or None,
                keyfile=self.key_file or None,
            )
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot load the Kafka TLS files: {e}") from e
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for an aiokafka producer, consumer or admin client."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        if self.sasl:
            options.update(
                sasl_mechanism=self.mechanism,
                sasl_plain_username=self.username,
                sasl_plain_password=self.password,
            )
        return options
