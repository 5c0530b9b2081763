"""The worker's error hierarchy.

Handlers raise :class:`HandlerFailed` (or anything else) to fail a run; the rest describe what
the worker itself refuses: an unknown handler name, a message it cannot read, a module that does
not import, a report the API rejected.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Base of every error the worker raises on purpose."""


class HandlerFailed(WorkerError):
    """A handler's way of saying "this run failed" with a message meant for humans."""


class UnknownHandler(WorkerError):
    """No handler is registered under the name a run message asks for."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown handler {name!r}")
        self.name = name


class DuplicateHandler(WorkerError):
    """A second, different callable was registered under a name that is already taken."""


class HandlerImportError(WorkerError):
    """A module named with ``--import`` could not be imported."""


class MessageDecodeError(WorkerError):
    """A Kafka record is not a run message this worker can run."""


class UnsupportedMessageVersion(MessageDecodeError):
    """A run message carries a ``schema_version`` newer than this worker knows.

    Upgrade the workers first: they must understand a layout before dispatchers produce it.
    """

    def __init__(self, version: int, known: int, *, task: object = None) -> None:
        super().__init__(
            f"run message schema_version {version} is newer than this worker supports "
            f"({known}); upgrade the workers before the dispatchers"
        )
        self.version = version
        self.known = known
        # The fields this worker could still read (a worker.messages.RunTask), or None: enough
        # to report the run as FAILED so the scheduler retries or dead-letters it.
        self.task = task


class ReportRejected(WorkerError):
    """The API refused a run event as invalid; resending it cannot succeed."""


class ConfigError(WorkerError):
    """An environment variable or command-line option has an unusable value."""


class NonRetryable(HandlerFailed):
    """Raised by a handler whose failure retrying cannot cure (a malformed payload, a record
    that no longer exists): the run is dead-lettered now, its remaining attempts unused."""


class RetryAfter(HandlerFailed):
    """Raised by a handler that knows when to try again (a rate limit's Retry-After): the next
    attempt is due ``seconds`` from now instead of after the retry policy's backoff (still
    within its max backoff and max attempts)."""

    def __init__(self, seconds: float, message: str = "") -> None:
        super().__init__(message or f"retry after {seconds:g} s")
        self.seconds = seconds
