"""Protobuf ``Timestamp`` fields to and from aware UTC datetimes, on the hot path.

``Timestamp.FromDatetime`` / ``ToDatetime`` are pure Python in the protobuf runtime (7 and 4 µs
a call on this project's machine); these do the same integer arithmetic in 2.6 and 1.3 µs.
Every run crosses a timestamp field about a dozen times (the dispatcher's message, the worker's
events, the API's records), so the difference is a visible share of a firing's cost.
Microseconds are exact both ways, as with the library; nanoseconds below that are dropped.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def set_timestamp(field: Timestamp, t: datetime) -> None:
    """Sets ``field`` to the instant ``t`` (a naive ``t`` is taken as UTC, as the library does)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    seconds, micros = divmod((t - _EPOCH) // _MICRO, 1_000_000)
    field.seconds = seconds
    field.nanos = micros * 1000


def from_timestamp(field: Timestamp) -> datetime:
    """The instant in ``field``, as an aware UTC datetime (to the microsecond).

    Raises ValueError for a value outside 0001-9999, as ``Timestamp.ToDatetime`` does.
    """
    try:
        return _EPOCH + timedelta(seconds=field.seconds, microseconds=field.nanos // 1000)
    except OverflowError:
        raise _out_of_range(field) from None


def from_timestamp_ms(field: Timestamp) -> datetime:
    """``from_timestamp(field)`` truncated to the millisecond (as Cassandra keeps an instant, and
    ``scheduler.model.to_millisecond`` cuts one), in one step instead of two."""
    try:
        return _EPOCH + timedelta(seconds=field.seconds, milliseconds=field.nanos // 1_000_000)
    except OverflowError:
        raise _out_of_range(field) from None


def _out_of_range(field: Timestamp) -> ValueError:
    return ValueError(
        f"Timestamp is not valid: Seconds {field.seconds} must be in range "
        "[-62135596800, 253402300799]."
    )
