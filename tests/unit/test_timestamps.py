"""The hot-path timestamp conversions agree with protobuf's own, to the microsecond."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from scheduler.model import to_millisecond
from worker.timestamps import from_timestamp, from_timestamp_ms, set_timestamp


def test_conversions_agree_with_the_library_across_eras_and_zones() -> None:
    rng = random.Random(7)
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    for _ in range(5000):
        us = rng.randrange(-2_000_000_000_000_000, 4_000_000_000_000_000)
        t = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).astimezone(
            rng.choice(zones)
        )
        ours, theirs = Timestamp(), Timestamp()
        set_timestamp(ours, t)
        theirs.FromDatetime(t)
        assert (ours.seconds, ours.nanos) == (theirs.seconds, theirs.nanos), t
        assert from_timestamp(ours) == theirs.ToDatetime(tzinfo=UTC) == t


def test_a_naive_datetime_is_utc_and_nanoseconds_are_truncated() -> None:
    ts = Timestamp()
    set_timestamp(ts, datetime(2026, 3, 8, 2, 30, 0, 123456))
    assert ts.ToDatetime(tzinfo=UTC) == datetime(2026, 3, 8, 2, 30, 0, 123456, tzinfo=UTC)
    ts.nanos = 123_456_999
    assert from_timestamp(ts) == datetime(2026, 3, 8, 2, 30, 0, 123456, tzinfo=UTC)
    before_epoch = Timestamp(seconds=-1, nanos=999_999_999)
    assert from_timestamp(before_epoch) == before_epoch.ToDatetime(tzinfo=UTC)


def test_an_instant_outside_years_1_to_9999_is_refused_as_the_library_refuses_it() -> None:
    for seconds in (253_402_300_800, -62_135_596_801, 10**12):
        with pytest.raises(ValueError, match=f"Seconds {seconds} must be in range"):
            from_timestamp(Timestamp(seconds=seconds))


def test_the_millisecond_form_is_the_instant_cut_to_the_millisecond() -> None:
    rng = random.Random(11)
    for _ in range(5000):
        ts = Timestamp(
            seconds=rng.randrange(-62135596800, 253402300799), nanos=rng.randrange(0, 10**9)
        )
        assert from_timestamp_ms(ts) == to_millisecond(from_timestamp(ts)), ts
    with pytest.raises(ValueError, match="Seconds 253402300800 must be in range"):
        from_timestamp_ms(Timestamp(seconds=253402300800))
