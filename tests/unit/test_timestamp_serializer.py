"""``bucketer.cql.serialize_timestamp`` against the driver's ``DateType.serialize``: the same
bytes for every instant of years 1-9999, aware in UTC or another zone, naive, and for the
values the driver also takes (milliseconds as numbers)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cassandra.cqltypes import DateType

from bucketer.cql import serialize_timestamp

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FIRST, LAST = -62135596800, 253402300799  # 0001-01-01, 9999-12-31T23:59:59


def drivers(value: object) -> bytes:
    return bytes(DateType.serialize(value, 4))


def test_random_instants_serialize_as_the_driver_serializes_them() -> None:
    rng = random.Random(20261206)
    zone = ZoneInfo("Asia/Kolkata")
    for _ in range(20_000):
        moment = EPOCH + timedelta(
            seconds=rng.randint(FIRST + 86400, LAST - 86400), microseconds=rng.randint(0, 999_999)
        )
        for value in (moment, moment.replace(tzinfo=None), moment.astimezone(zone)):
            assert serialize_timestamp(value, 4) == drivers(value), value


@pytest.mark.parametrize(
    "value",
    [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_500, tzinfo=UTC),  # truncated toward zero
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),  # the float's rounding
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=ZoneInfo("America/New_York")),  # LMT, west of UTC
        1_764_849_600_123,
        1.5,
    ],
)
def test_edges_and_numbers_serialize_as_the_driver_serializes_them(value: object) -> None:
    assert serialize_timestamp(value, 4) == drivers(value)


def test_what_the_driver_refuses_is_refused_the_same_way() -> None:
    with pytest.raises(TypeError, match="DateType arguments"):
        DateType.serialize("2026-12-06", 4)
    with pytest.raises(TypeError, match="DateType arguments"):
        serialize_timestamp("2026-12-06", 4)
