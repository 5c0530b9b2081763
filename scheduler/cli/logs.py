"""Logging for the long-running processes (``cronscale api|dispatcher|worker``).

Text lines look like ``2026-12-02T15:00:05.123Z INFO scheduler.api.server: listening on
127.0.0.1:50051 schedule_id=abc``: UTC time, level, logger, message, then every ``extra`` field
(run_id, schedule_id, tenant, ...) as ``key=value``. ``cronscale dev`` relies on the time,
level and logger coming first (see ``LEVEL_PREFIX``). ``--log-json`` prints one JSON object
per line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Matches the start of a record in the text format; lines that do not match continue the
# previous record (tracebacks, multi-line messages).
LEVEL_PREFIX = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z (?P<level>[A-Z]+) (?P<logger>[^\s:]+): "
)

# Attributes every LogRecord has; anything else on a record came in through ``extra``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


def _utc_time(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def record_extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call passed through ``extra``, in the order they were set."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


class TextFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> <logger>: <message> key=value ...`` plus any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """Formats one record; exception and stack text follow on their own lines."""
        line = f"{_utc_time(record)} {record.levelname} {record.name}: {record.getMessage()}"
        extras = record_extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the extras, exc_info."""

    def format(self, record: logging.LogRecord) -> str:
        """Formats one record as a single line of JSON."""
        data: dict[str, Any] = {
            "time": _utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(record_extras(record))
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def configure_logging(level: str = "INFO", *, json_lines: bool = False) -> None:
    """Sends every logger's records at ``level`` and above to stderr in the chosen format.

    Replaces handlers configured earlier, so a process configures logging exactly once, here.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
