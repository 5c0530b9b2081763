"""The domain's error hierarchy.

Every failure a caller can act on is one of these. The gRPC layer maps each class to one
status code in one place (``scheduler.api.status``); nothing below the API edge knows gRPC.
"""

from __future__ import annotations


class CronscaleError(Exception):
    """Base of every error the domain raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(CronscaleError):
    """A request field is malformed or out of range. ``field`` names it as the proto does."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(CronscaleError):
    """The named entity does not exist (or was deleted)."""


class AlreadyExists(CronscaleError):
    """An entity with this identity already exists."""


class FailedPrecondition(CronscaleError):
    """The entity exists but is in a state that does not allow the operation."""


class Aborted(CronscaleError):
    """A concurrent change won: e.g. an update carried a stale version."""


class Unavailable(CronscaleError):
    """A backing service (Cassandra, Kafka) cannot be reached; the caller may retry."""


class PermissionDenied(CronscaleError):
    """The caller's role or tenant does not allow the operation."""


class ResourceExhausted(CronscaleError):
    """A quota would be exceeded; the message names the quota, its limit and the current use."""
