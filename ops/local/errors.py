"""The one error type of the local stack: its message is meant for a human at a terminal."""

from __future__ import annotations


class LocalStackError(Exception):
    """Bringing the local Cassandra + Kafka up, down or inspecting them failed.

    The message says what went wrong and what to do about it (which environment variable to
    set, what to install) and, for a service that failed to start, ends with the last lines of
    that service's log. The CLI prints it as is and exits with status 1.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
