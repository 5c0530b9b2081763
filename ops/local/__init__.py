"""The real local Cassandra 5.0 + Kafka 4.x behind ``cronscale local up|down|status``.

Both servers are resolved from Maven Central into ``<home>/lib`` on first use and run as plain
JVM processes on Java 17 (no Docker). Everything lives under the home folder (default
``<repo>/.local``, env ``CRONSCALE_LOCAL_HOME``); see docs/operations/local-stack.md.

Typical use::

    from ops.local import LocalSettings, up, down, status, format_status

    settings = LocalSettings.from_env()
    up(settings)                      # idempotent: returns at once when both already answer
    print(format_status(status(settings)))
    down(settings)
"""

from ops.local.errors import LocalStackError
from ops.local.settings import LocalSettings, PortSpec
from ops.local.stack import (
    ServiceStatus,
    ServiceStop,
    ServiceUp,
    UpResult,
    check_ports,
    down,
    format_status,
    reset,
    status,
    up,
)

__all__ = [
    "LocalSettings",
    "LocalStackError",
    "PortSpec",
    "ServiceStatus",
    "ServiceStop",
    "ServiceUp",
    "UpResult",
    "check_ports",
    "down",
    "format_status",
    "reset",
    "status",
    "up",
]
