"""Page sizes of the API's listing RPCs, one rule for all."""

from __future__ import annotations

from scheduler.errors import InvalidArgument

MAX_PAGE = 1000
DEFAULT_PAGE = 100


def page_size(value: int) -> int:
    """A request's page_size: 0 means 100; negative or above 1000 is INVALID_ARGUMENT."""
    if value < 0:
        raise InvalidArgument("page_size", f"must not be negative, got {value}")
    if value > MAX_PAGE:
        raise InvalidArgument("page_size", f"must be at most {MAX_PAGE}, got {value}")
    return value or DEFAULT_PAGE
