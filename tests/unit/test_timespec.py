"""Table-driven tests of scheduler.timespec: fire times across DST, calendars, errors, jitter.

Expected instants are literal UTC strings worked out from each zone's published rules (and
checked once by hand against zoneinfo); nothing here recomputes them with the code under test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from scheduler.errors import InvalidArgument
from scheduler.timespec import (
    NOTE_GAP_SHIFTED,
    NOTE_GAP_SKIPPED,
    NOTE_OVERLAP_SECOND,
    CronSpec,
    FireTime,
    GapPolicy,
    OverlapPolicy,
    fire_times,
    jitter_offset,
    load_zone,
    one_shot,
    parse_cron,
    parse_interval,
)

SHIFT, SKIP = GapPolicy.SHIFT, GapPolicy.SKIP
ONCE, BOTH = OverlapPolicy.ONCE, OverlapPolicy.BOTH
S, D = NOTE_GAP_SHIFTED, NOTE_OVERLAP_SECOND  # short for the tables


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def iso(fire: FireTime) -> str:
    return fire.utc.strftime("%Y-%m-%dT%H:%M:%SZ")


# (id, expression, zone, gap, overlap, after, expected: "UTC" or ("UTC", note))
Expected = str | tuple[str, str]
DST_CASES: list[tuple[str, str, str, GapPolicy | None, OverlapPolicy | None, str, list[Expected]]]
DST_CASES = [
    # America/New_York 2026: 02:00 EST -> 03:00 EDT on Mar 8 (07:00Z); 02:00 EDT -> 01:00 EST
    # on Nov 1 (06:00Z).
    (
        "ny-gap-two-walltimes-one-fire",
        "0,30 2 * * *",
        "America/New_York",
        None,
        None,
        "2026-03-07T08:00Z",
        [("2026-03-08T07:00:00Z", S), "2026-03-09T06:00:00Z", "2026-03-09T06:30:00Z"],
    ),
    (
        "ny-gap-shift",
        "30 2 * * *",
        "America/New_York",
        None,
        None,
        "2026-03-07T12:00Z",
        [("2026-03-08T07:00:00Z", S), "2026-03-09T06:30:00Z"],
    ),
    (
        "ny-gap-fixed-skip",
        "30 2 * * *",
        "America/New_York",
        SKIP,
        None,
        "2026-03-07T12:00Z",
        ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"],
    ),
    (
        "ny-gap-shift-lands-on-real-03",
        "0 2,3 * * *",
        "America/New_York",
        None,
        None,
        "2026-03-07T09:00Z",
        ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T07:00:00Z"],
    ),
    (
        "ny-gap-wildcard-skips",
        "*/30 * * * *",
        "America/New_York",
        None,
        None,
        "2026-03-08T06:00Z",
        ["2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"],
    ),
    (
        "ny-gap-hour-star-skips",
        "30 * * * *",
        "America/New_York",
        None,
        None,
        "2026-03-08T05:00Z",
        [
            "2026-03-08T05:30:00Z",
            "2026-03-08T06:30:00Z",
            "2026-03-08T07:30:00Z",
            "2026-03-08T08:30:00Z",
        ],
    ),
    (
        "ny-gap-wildcard-shift",
        "30 * * * *",
        "America/New_York",
        SHIFT,
        None,
        "2026-03-08T05:00Z",
        [
            "2026-03-08T05:30:00Z",
            "2026-03-08T06:30:00Z",
            ("2026-03-08T07:00:00Z", S),
            "2026-03-08T07:30:00Z",
        ],
    ),
    (
        "ny-overlap-once",
        "30 1 * * *",
        "America/New_York",
        None,
        None,
        "2026-10-31T12:00Z",
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
    ),
    (
        "ny-overlap-fixed-both",
        "30 1 * * *",
        "America/New_York",
        None,
        BOTH,
        "2026-10-31T12:00Z",
        ["2026-11-01T05:30:00Z", ("2026-11-01T06:30:00Z", D), "2026-11-02T06:30:00Z"],
    ),
    (
        "ny-overlap-02-is-unambiguous",
        "0 2 * * *",
        "America/New_York",
        None,
        None,
        "2026-10-31T12:00Z",
        ["2026-11-01T07:00:00Z", "2026-11-02T07:00:00Z"],
    ),
    (
        "ny-overlap-wildcard-both",
        "*/30 * * * *",
        "America/New_York",
        None,
        None,
        "2026-11-01T04:45Z",
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:30:00Z",
            ("2026-11-01T06:00:00Z", D),
            ("2026-11-01T06:30:00Z", D),
            "2026-11-01T07:00:00Z",
        ],
    ),
    (
        "ny-overlap-wildcard-once",
        "*/30 * * * *",
        "America/New_York",
        None,
        ONCE,
        "2026-11-01T04:45Z",
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T07:00:00Z",
            "2026-11-01T07:30:00Z",
        ],
    ),
    (
        "ny-after-inside-overlap-first",
        "*/15 * * * *",
        "America/New_York",
        None,
        None,
        "2026-11-01T05:30Z",
        ["2026-11-01T05:45:00Z", ("2026-11-01T06:00:00Z", D), ("2026-11-01T06:15:00Z", D)],
    ),
    (
        "ny-after-inside-overlap-second-once",
        "*/15 * * * *",
        "America/New_York",
        None,
        ONCE,
        "2026-11-01T06:30Z",
        ["2026-11-01T07:00:00Z", "2026-11-01T07:15:00Z"],
    ),
    (
        "ny-after-inside-overlap-second-both",
        "*/15 * * * *",
        "America/New_York",
        None,
        None,
        "2026-11-01T06:30Z",
        [("2026-11-01T06:45:00Z", D), "2026-11-01T07:00:00Z"],
    ),
    (
        "ny-hourly-macro",
        "@hourly",
        "America/New_York",
        None,
        None,
        "2026-11-01T04:30Z",
        ["2026-11-01T05:00:00Z", ("2026-11-01T06:00:00Z", D), "2026-11-01T07:00:00Z"],
    ),
    (
        "ny-daily-macro-fixed",
        "@daily",
        "America/New_York",
        None,
        None,
        "2026-03-07T12:00Z",
        ["2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"],
    ),
    # Europe/Berlin 2026: 02:00 CET -> 03:00 CEST on Mar 29 (01:00Z); 03:00 CEST -> 02:00 CET
    # on Oct 25 (01:00Z).
    (
        "berlin-gap-shift",
        "30 2 * * *",
        "Europe/Berlin",
        None,
        None,
        "2026-03-28T12:00Z",
        [("2026-03-29T01:00:00Z", S), "2026-03-30T00:30:00Z"],
    ),
    (
        "berlin-overlap-once",
        "30 2 * * *",
        "Europe/Berlin",
        None,
        None,
        "2026-10-24T12:00Z",
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
    ),
    (
        "berlin-overlap-wildcard",
        "30 * * * *",
        "Europe/Berlin",
        None,
        None,
        "2026-10-24T23:45Z",
        ["2026-10-25T00:30:00Z", ("2026-10-25T01:30:00Z", D), "2026-10-25T02:30:00Z"],
    ),
    (
        "berlin-6field-gap-skipped",
        "0 30 2 * * *",
        "Europe/Berlin",
        None,
        None,
        "2026-03-28T12:00Z",
        ["2026-03-30T00:30:00Z"],
    ),
    (
        "berlin-6field-overlap-both",
        "0 30 2 * * *",
        "Europe/Berlin",
        None,
        None,
        "2026-10-24T12:00Z",
        ["2026-10-25T00:30:00Z", ("2026-10-25T01:30:00Z", D), "2026-10-26T01:30:00Z"],
    ),
    (
        "berlin-6field-seconds-in-gap",
        "*/20 59 1,2 * * *",
        "Europe/Berlin",
        None,
        None,
        "2026-03-29T00:58:30Z",
        [
            "2026-03-29T00:59:00Z",
            "2026-03-29T00:59:20Z",
            "2026-03-29T00:59:40Z",
            "2026-03-29T23:59:00Z",
        ],
    ),
    # Australia/Lord_Howe: +10:30 standard, +11 summer -- a 30-minute shift. 2026: 02:00 ->
    # 02:30 on Oct 4 (15:30Z Oct 3); 02:00 -> 01:30 on Apr 5 (15:00Z Apr 4).
    (
        "lord-howe-gap-shift",
        "15 2 * * *",
        "Australia/Lord_Howe",
        None,
        None,
        "2026-10-03T00:00Z",
        [("2026-10-03T15:30:00Z", S), "2026-10-04T15:15:00Z"],
    ),
    (
        "lord-howe-gap-shift-onto-real-0230",
        "0,15,30,45 2 * * *",
        "Australia/Lord_Howe",
        None,
        None,
        "2026-10-03T12:00Z",
        ["2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z", "2026-10-04T15:00:00Z"],
    ),
    (
        "lord-howe-gap-skip",
        "0,15,30,45 2 * * *",
        "Australia/Lord_Howe",
        SKIP,
        None,
        "2026-10-03T12:00Z",
        ["2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z", "2026-10-04T15:00:00Z"],
    ),
    (
        "lord-howe-overlap-once",
        "45 1 * * *",
        "Australia/Lord_Howe",
        None,
        None,
        "2026-04-04T00:00Z",
        ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    ),
    (
        "lord-howe-overlap-both",
        "45 1 * * *",
        "Australia/Lord_Howe",
        None,
        BOTH,
        "2026-04-04T00:00Z",
        ["2026-04-04T14:45:00Z", ("2026-04-04T15:15:00Z", D), "2026-04-05T15:15:00Z"],
    ),
    (
        "lord-howe-overlap-wildcard",
        "*/15 * * * *",
        "Australia/Lord_Howe",
        None,
        None,
        "2026-04-04T14:20Z",
        [
            "2026-04-04T14:30:00Z",
            "2026-04-04T14:45:00Z",
            ("2026-04-04T15:00:00Z", D),
            ("2026-04-04T15:15:00Z", D),
            "2026-04-04T15:30:00Z",
        ],
    ),
    # Pacific/Chatham: +12:45 / +13:45, transitions at 02:45 standard / 03:45 summer. 2026:
    # spring Sep 27 (14:00Z Sep 26), fall Apr 5 (14:00Z Apr 4).
    (
        "chatham-gap-shift",
        "0 3 * * *",
        "Pacific/Chatham",
        None,
        None,
        "2026-09-26T00:00Z",
        [("2026-09-26T14:00:00Z", S), "2026-09-27T13:15:00Z"],
    ),
    (
        "chatham-overlap-once",
        "0 3 * * *",
        "Pacific/Chatham",
        None,
        None,
        "2026-04-04T00:00Z",
        ["2026-04-04T13:15:00Z", "2026-04-05T14:15:00Z"],
    ),
    (
        "chatham-overlap-hourly",
        "0 * * * *",
        "Pacific/Chatham",
        None,
        None,
        "2026-04-04T12:00Z",
        [
            "2026-04-04T12:15:00Z",
            "2026-04-04T13:15:00Z",
            ("2026-04-04T14:15:00Z", D),
            "2026-04-04T15:15:00Z",
        ],
    ),
    # America/Sao_Paulo had DST until 2019: 2018-11-04 00:00 -03 -> 01:00 -02 (03:00Z) and
    # 2018-02-18 00:00 -02 -> 2018-02-17 23:00 -03 (02:00Z). None in 2026: -03 all year.
    (
        "sao-paulo-2018-midnight-gap",
        "0 0 * * *",
        "America/Sao_Paulo",
        None,
        None,
        "2018-11-03T12:00Z",
        [("2018-11-04T03:00:00Z", S), "2018-11-05T02:00:00Z"],
    ),
    (
        "sao-paulo-2018-hourly-gap",
        "0 * * * *",
        "America/Sao_Paulo",
        None,
        None,
        "2018-11-04T01:30Z",
        ["2018-11-04T02:00:00Z", "2018-11-04T03:00:00Z", "2018-11-04T04:00:00Z"],
    ),
    (
        "sao-paulo-2018-overlap-both",
        "30 23 * * *",
        "America/Sao_Paulo",
        None,
        BOTH,
        "2018-02-17T12:00Z",
        ["2018-02-18T01:30:00Z", ("2018-02-18T02:30:00Z", D), "2018-02-19T02:30:00Z"],
    ),
    (
        "sao-paulo-2026-no-dst",
        "0 0 * * *",
        "America/Sao_Paulo",
        None,
        None,
        "2026-10-31T12:00Z",
        ["2026-11-01T03:00:00Z", "2026-11-02T03:00:00Z"],
    ),
    # Asia/Kolkata: +05:30 all year.
    (
        "kolkata-half-hour-offset",
        "0 9 * * *",
        "Asia/Kolkata",
        None,
        None,
        "2026-03-08T00:00Z",
        ["2026-03-08T03:30:00Z", "2026-03-09T03:30:00Z"],
    ),
    (
        "kolkata-wildcard",
        "*/45 * * * *",
        "Asia/Kolkata",
        None,
        None,
        "2026-03-08T00:00Z",
        ["2026-03-08T00:15:00Z", "2026-03-08T00:30:00Z", "2026-03-08T01:15:00Z"],
    ),
]


@pytest.mark.parametrize(
    ("expression", "zone", "gap", "overlap", "after", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in DST_CASES],
)
def test_fire_times_across_dst(
    expression: str,
    zone: str,
    gap: GapPolicy | None,
    overlap: OverlapPolicy | None,
    after: str,
    expected: list[Expected],
) -> None:
    spec = parse_cron(expression, zone, gap=gap, overlap=overlap)
    fires = fire_times(spec, utc(after), len(expected))
    want = [e if isinstance(e, tuple) else (e, "") for e in expected]
    assert [(iso(f), f.note) for f in fires] == want


# (id, expression, after, expected UTC instants) -- calendar rules, evaluated in UTC.
CALENDAR_CASES = [
    (
        "31st-only-in-long-months",
        "0 0 31 * *",
        "2026-01-31T00:00Z",
        ["2026-03-31", "2026-05-31", "2026-07-31", "2026-08-31", "2026-10-31", "2026-12-31"],
    ),
    (
        "last-day-L",
        "0 0 L * *",
        "2026-01-01T00:00Z",
        ["2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30"],
    ),
    ("last-day-L-leap-february", "0 0 L 2 *", "2027-03-01T00:00Z", ["2028-02-29", "2029-02-28"]),
    (
        "last-day-in-list",
        "0 0 15,L * *",
        "2026-02-01T00:00Z",
        ["2026-02-15", "2026-02-28", "2026-03-15", "2026-03-31"],
    ),
    ("feb-29-leap-years-only", "0 0 29 2 *", "2026-01-01T00:00Z", ["2028-02-29", "2032-02-29"]),
    ("feb-29-skips-2100", "0 0 29 2 *", "2096-03-01T00:00Z", ["2104-02-29"]),
    (
        "vixie-or-dom-dow",
        "0 0 1-7 * MON",
        "2026-06-05T00:00Z",
        [
            "2026-06-06",
            "2026-06-07",
            "2026-06-08",
            "2026-06-15",
            "2026-06-22",
            "2026-06-29",
            "2026-07-01",
        ],
    ),
    (
        "friday-or-13th",
        "0 0 13 * FRI",
        "2026-03-01T00:00Z",
        [
            "2026-03-06",
            "2026-03-13",
            "2026-03-20",
            "2026-03-27",
            "2026-04-03",
            "2026-04-10",
            "2026-04-13",
        ],
    ),
    ("dow-only-is-and", "0 0 * * MON", "2026-06-10T00:00Z", ["2026-06-15", "2026-06-22"]),
    (
        "dom-star-step-is-restricted",
        "0 0 */10 * SUN",
        "2026-06-01T00:00Z",
        ["2026-06-07", "2026-06-11", "2026-06-14", "2026-06-21", "2026-06-28", "2026-07-01"],
    ),
    ("sunday-as-7", "0 0 * * 7", "2026-06-01T00:00Z", ["2026-06-07", "2026-06-14"]),
    (
        "weekend-wraps",
        "0 0 * * SAT-SUN",
        "2026-06-01T00:00Z",
        ["2026-06-06", "2026-06-07", "2026-06-13"],
    ),
    ("month-names", "0 0 1 JAN,jul *", "2026-02-01T00:00Z", ["2026-07-01", "2027-01-01"]),
    (
        "hour-range-wraps",
        "0 22-1 * * *",
        "2026-06-01T21:00Z",
        ["2026-06-01T22", "2026-06-01T23", "2026-06-02T00", "2026-06-02T01", "2026-06-02T22"],
    ),
    (
        "start-step",
        "10/25 9 * * *",
        "2026-06-01T00:00Z",
        ["2026-06-01T09:10", "2026-06-01T09:35", "2026-06-02T09:10"],
    ),
    (
        "six-field-seconds-first",
        "*/20 * * * * *",
        "2026-01-01T00:00:05Z",
        ["2026-01-01T00:00:20", "2026-01-01T00:00:40", "2026-01-01T00:01:00"],
    ),
    (
        "six-field-weekdays",
        "30 15 10 * * MON-FRI",
        "2026-01-02T11:00Z",
        ["2026-01-05T10:15:30", "2026-01-06T10:15:30"],
    ),
    (
        "six-field-question-mark",
        "0 0 12 ? * *",
        "2026-01-02T11:00Z",
        ["2026-01-02T12", "2026-01-03T12"],
    ),
    ("yearly", "@yearly", "2026-05-05T12:10Z", ["2027-01-01", "2028-01-01"]),
    ("annually", "@annually", "2026-05-05T12:10Z", ["2027-01-01"]),
    ("monthly", "@monthly", "2026-05-05T12:10Z", ["2026-06-01", "2026-07-01"]),
    ("weekly-is-sunday", "@weekly", "2026-05-05T12:10Z", ["2026-05-10", "2026-05-17"]),
    ("daily", "@daily", "2026-05-05T12:10Z", ["2026-05-06", "2026-05-07"]),
    ("midnight", "@MIDNIGHT", "2026-05-05T12:10Z", ["2026-05-06"]),
    ("hourly", "@hourly", "2026-05-05T12:10Z", ["2026-05-05T13", "2026-05-05T14"]),
    ("strictly-after-exact-slot", "0 0 * * *", "2026-05-05T00:00Z", ["2026-05-06"]),
    (
        "after-with-microseconds",
        "* * * * *",
        "2026-05-05T00:00:59.999999Z",
        ["2026-05-05T00:01", "2026-05-05T00:02"],
    ),
    ("year-end-rollover", "59 23 31 12 *", "2026-12-31T23:59Z", ["2027-12-31T23:59"]),
]


def _padded(text: str) -> str:
    date_part, _, time_part = text.partition("T")
    hms = [*time_part.split(":"), "00", "00", "00"][:3] if time_part else ["00", "00", "00"]
    return f"{date_part}T{':'.join(h.zfill(2) for h in hms)}Z"


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CALENDAR_CASES],
)
def test_calendar_rules(expression: str, after: str, expected: list[str]) -> None:
    fires = fire_times(parse_cron(expression, "UTC"), utc(after), len(expected))
    assert [iso(f) for f in fires] == [_padded(e) for e in expected]


def test_feb_29_in_a_zone_is_local() -> None:
    spec = parse_cron("0 12 29 2 *", "Europe/Berlin")
    fires = fire_times(spec, utc("2026-01-01T00:00Z"), 2)
    assert [iso(f) for f in fires] == ["2028-02-29T11:00:00Z", "2032-02-29T11:00:00Z"]


# (expression, is_fixed_time, has_seconds, default gap, default overlap)
POLICY_CASES = [
    ("0 2 * * *", True, False, SHIFT, ONCE),
    ("30 1,2 * * *", True, False, SHIFT, ONCE),
    ("0 0-23/2 * * *", True, False, SHIFT, ONCE),
    ("*/15 * * * *", False, False, SKIP, BOTH),
    ("5 * * * *", False, False, SKIP, BOTH),
    ("* 2 * * *", False, False, SKIP, BOTH),
    ("0 */2 * * *", False, False, SKIP, BOTH),
    ("@daily", True, False, SHIFT, ONCE),
    ("@yearly", True, False, SHIFT, ONCE),
    ("@hourly", False, False, SKIP, BOTH),
    ("0 30 2 * * *", False, True, SKIP, BOTH),
    ("0 0 0 1 1 *", False, True, SKIP, BOTH),
]


@pytest.mark.parametrize(("expression", "fixed", "seconds", "gap", "overlap"), POLICY_CASES)
def test_default_policies_follow_debian_rule(
    expression: str, fixed: bool, seconds: bool, gap: GapPolicy, overlap: OverlapPolicy
) -> None:
    spec = parse_cron(expression, "America/New_York")
    assert (spec.is_fixed_time, spec.has_seconds, spec.gap, spec.overlap) == (
        fixed,
        seconds,
        gap,
        overlap,
    )


def test_explicit_policies_override_defaults() -> None:
    spec = parse_cron("*/5 * * * *", "Europe/Berlin", gap=SHIFT, overlap=ONCE)
    assert (spec.gap, spec.overlap, spec.is_fixed_time) == (SHIFT, ONCE, False)
    assert (spec.expression, spec.timezone) == ("*/5 * * * *", "Europe/Berlin")


@pytest.mark.parametrize(
    ("expression", "period"),
    [
        ("*/15 * * * *", timedelta(minutes=15)),
        ("0 0 * * *", timedelta(days=1)),
        ("0 9 * * MON-FRI", timedelta(days=1)),
        ("0 0 * * MON", timedelta(days=7)),
        ("0 0 1 * *", timedelta(days=28)),
        ("0 22,2 * * *", timedelta(hours=4)),
        ("*/20 * * * * *", timedelta(seconds=20)),
        ("@hourly", timedelta(hours=1)),
        ("0 0 29 2 *", timedelta(days=1461)),
    ],
)
def test_min_period(expression: str, period: timedelta) -> None:
    assert parse_cron(expression, "UTC").min_period() == period


def test_local_time_and_fold_are_set() -> None:
    spec = parse_cron("*/30 * * * *", "America/New_York")
    first, second = fire_times(spec, utc("2026-11-01T05:15Z"), 2)
    assert first.local.isoformat() == "2026-11-01T01:30:00-04:00"
    assert first.local.fold == 0
    assert second.local.isoformat() == "2026-11-01T01:00:00-05:00"
    assert second.local.fold == 1
    assert second.local.tzinfo == ZoneInfo("America/New_York")
    assert second.utc.tzinfo is UTC


def test_after_may_be_in_any_zone() -> None:
    spec = parse_cron("0 0 * * *", "UTC")
    tokyo = datetime(2026, 5, 5, 8, 59, tzinfo=ZoneInfo("Asia/Tokyo"))  # 2026-05-04T23:59Z
    fire = spec.next_after(tokyo)
    assert fire is not None
    assert iso(fire) == "2026-05-05T00:00:00Z"


def test_fire_times_strictly_increasing_across_a_year() -> None:
    for expression in ("*/30 * * * *", "30 2 * * *", "0,30 1,2 * * *"):
        spec = parse_cron(expression, "America/New_York", overlap=BOTH)
        fires = fire_times(spec, utc("2026-01-01T00:00Z"), 400 if "*" in expression[:2] else 800)
        instants = [f.utc for f in fires]
        assert all(a < b for a, b in pairwise(instants))


def test_skipped_between_reports_gap_wall_times() -> None:
    spec = parse_cron("0,30 2 * * *", "America/New_York", gap=SKIP)
    skipped = spec.skipped_between(utc("2026-03-01T00:00Z"), utc("2026-03-31T00:00Z"))
    assert skipped == [
        (datetime(2026, 3, 8, 2, 0), NOTE_GAP_SKIPPED),
        (datetime(2026, 3, 8, 2, 30), NOTE_GAP_SKIPPED),
    ]
    assert (
        parse_cron("0,30 2 * * *", "America/New_York").skipped_between(
            utc("2026-03-01T00:00Z"), utc("2026-03-31T00:00Z")
        )
        == []
    )
    assert spec.skipped_between(utc("2026-03-08T07:00Z"), utc("2026-03-31T00:00Z")) == []


def test_skipped_between_looks_at_every_year_of_its_span() -> None:
    """A span from a year without a gap left in it into one with a gap finds the later gap
    (whether a zone-year has a gap is answered once and kept, per zone and year)."""
    spec = parse_cron("30 2 * * *", "America/New_York", gap=SKIP)
    assert spec.skipped_between(utc("2025-12-01T00:00Z"), utc("2025-12-31T00:00Z")) == []
    assert spec.skipped_between(utc("2025-12-01T00:00Z"), utc("2027-01-01T00:00Z")) == [
        (datetime(2026, 3, 8, 2, 30), NOTE_GAP_SKIPPED)
    ]
    utc_spec = parse_cron("30 2 * * *", "UTC", gap=SKIP)
    assert utc_spec.skipped_between(utc("2025-12-01T00:00Z"), utc("2027-01-01T00:00Z")) == []


def test_skipped_between_in_one_year_without_a_gap_still_checks_its_instants() -> None:
    """The answer kept per zone and year comes first only for UTC instants of one year: naive
    ones are still refused, and an instant at another offset is taken in its UTC year."""
    utc_spec = parse_cron("30 2 * * *", "UTC", gap=SKIP)
    assert utc_spec.skipped_between(utc("2026-01-01T00:00Z"), utc("2026-12-31T00:00Z")) == []
    with pytest.raises(InvalidArgument, match="after"):
        utc_spec.skipped_between(datetime(2026, 1, 1), utc("2026-02-01T00:00Z"))
    with pytest.raises(InvalidArgument, match="until"):
        utc_spec.skipped_between(utc("2026-01-01T00:00Z"), datetime(2026, 2, 1))
    with pytest.raises(InvalidArgument, match="after"):  # whatever the gap policy
        parse_cron("30 2 * * *", "UTC", gap=SHIFT).skipped_between(
            datetime(2026, 1, 1), utc("2026-02-01T00:00Z")
        )
    assert (
        parse_cron("30 2 * * *", "America/New_York", gap=SHIFT).skipped_between(
            utc("2026-03-01T00:00Z"), utc("2026-03-31T00:00Z")
        )
        == []
    )  # SHIFT drops no wall time
    # Instants at another offset are taken as the UTC ones they are.
    spec = parse_cron("30 2 * * *", "America/New_York", gap=SKIP)
    new_york = ZoneInfo("America/New_York")
    local = (datetime(2027, 1, 1, 0, 30, tzinfo=new_york), datetime(2027, 12, 1, tzinfo=new_york))
    assert (
        spec.skipped_between(*local)
        == spec.skipped_between(*(t.astimezone(UTC) for t in local))
        == [(datetime(2027, 3, 14, 2, 30), NOTE_GAP_SKIPPED)]
    )


def test_parsed_specs_and_next_slots_are_cached() -> None:
    spec = parse_cron("0 0 * * *", "America/New_York")
    assert parse_cron("0 0 * * *", "America/New_York") is spec
    after = utc("2026-05-05T12:00Z")
    assert spec.next_after(after) is spec.next_after(after)
    assert isinstance(spec, CronSpec)


# --- intervals and one-shots ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("every 90s", 90),
        ("90s", 90),
        ("5m", 300),
        ("1h30m", 5400),
        ("2d", 172_800),
        ("1d 2h", 93_600),
        ("EVERY 10M", 600),
        ("1s", 1),
    ],
)
def test_parse_interval_text(text: str, seconds: int) -> None:
    spec = parse_interval(text, anchor=utc("2026-01-01T00:00Z"))
    assert spec.every == timedelta(seconds=seconds)


def test_interval_runs_on_real_time_through_dst() -> None:
    spec = parse_interval("1h", anchor=utc("2026-03-08T05:00Z"), timezone="America/New_York")
    fires = fire_times(spec, utc("2026-03-08T05:30Z"), 3)
    assert [iso(f) for f in fires] == [
        "2026-03-08T06:00:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T08:00:00Z",
    ]
    assert [f.local.hour for f in fires] == [1, 3, 4]


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2025-12-31T00:00Z", "2026-01-01T00:00:00Z"),  # before the anchor: the anchor
        ("2026-01-01T00:00Z", "2026-01-01T00:01:30Z"),  # exactly on a slot: strictly after
        ("2026-01-01T00:01:29.999Z", "2026-01-01T00:01:30Z"),
        ("2026-01-01T01:00Z", "2026-01-01T01:01:30Z"),
    ],
)
def test_interval_next_after(after: str, expected: str) -> None:
    spec = parse_interval(timedelta(seconds=90), anchor=utc("2026-01-01T00:00Z"))
    fire = spec.next_after(utc(after))
    assert fire is not None
    assert iso(fire) == expected


def test_one_shot() -> None:
    spec = one_shot(datetime(2026, 7, 1, 12, tzinfo=ZoneInfo("Europe/Berlin")), "Asia/Kolkata")
    fire = spec.next_after(utc("2026-07-01T09:59Z"))
    assert fire is not None
    assert iso(fire) == "2026-07-01T10:00:00Z"
    assert fire.local.isoformat() == "2026-07-01T15:30:00+05:30"
    assert spec.next_after(utc("2026-07-01T10:00Z")) is None
    assert len(fire_times(spec, utc("2020-01-01T00:00Z"), 5)) == 1


# --- errors --------------------------------------------------------------------------------

NAIVE = datetime(2026, 1, 1)
ANCHOR = utc("2026-01-01T00:00Z")

ERROR_CASES: list[tuple[str, Callable[[], object], str, str]] = [
    ("empty", lambda: parse_cron("", "UTC"), "cron", "expression is empty"),
    ("blank", lambda: parse_cron("   ", "UTC"), "cron", "expression is empty"),
    (
        "seven-fields",
        lambda: parse_cron("0 0 0 1 1 * 2026", "UTC"),
        "cron",
        "expected 5 fields (or 6 with seconds first), got 7",
    ),
    ("four-fields", lambda: parse_cron("0 0 1 1", "UTC"), "cron", "got 4"),
    (
        "minute-range",
        lambda: parse_cron("61 * * * *", "UTC"),
        "cron",
        "minute field '61' is out of range 0-59",
    ),
    (
        "hour-range",
        lambda: parse_cron("0 24 * * *", "UTC"),
        "cron",
        "hour field '24' is out of range 0-23",
    ),
    (
        "dom-zero",
        lambda: parse_cron("0 0 0 * *", "UTC"),
        "cron",
        "day-of-month field '0' is out of range 1-31",
    ),
    (
        "month-range",
        lambda: parse_cron("0 0 1 13 *", "UTC"),
        "cron",
        "month field '13' is out of range 1-12",
    ),
    (
        "dow-range",
        lambda: parse_cron("0 0 * * 8", "UTC"),
        "cron",
        "day-of-week field '8' is out of range 0-7",
    ),
    (
        "second-range",
        lambda: parse_cron("60 0 0 * * *", "UTC"),
        "cron",
        "second field '60' is out of range 0-59",
    ),
    (
        "range-end",
        lambda: parse_cron("0 9-25 * * *", "UTC"),
        "cron",
        "hour field '25' is out of range 0-23",
    ),
    (
        "month-name",
        lambda: parse_cron("0 0 1 FOO *", "UTC"),
        "cron",
        "month field 'FOO' is not a number or month name",
    ),
    (
        "day-name",
        lambda: parse_cron("0 0 * * FUNDAY", "UTC"),
        "cron",
        "day-of-week field 'FUNDAY' is not a number or day name",
    ),
    ("garbage", lambda: parse_cron("a b c d e", "UTC"), "cron", "minute field 'a' is not a number"),
    (
        "zero-step",
        lambda: parse_cron("*/0 * * * *", "UTC"),
        "cron",
        "minute field '*/0' has a step of 0",
    ),
    (
        "empty-item",
        lambda: parse_cron("1,,2 * * * *", "UTC"),
        "cron",
        "minute field '1,,2' has an empty list item",
    ),
    ("question-in-minute", lambda: parse_cron("? * * * *", "UTC"), "cron", "minute field '?'"),
    ("L-in-dow", lambda: parse_cron("0 0 * * L", "UTC"), "cron", "day-of-week field 'L' uses 'L'"),
    (
        "nth-weekday",
        lambda: parse_cron("0 0 * * 5#3", "UTC"),
        "cron",
        "day-of-week field '5#3' uses '#'",
    ),
    (
        "nearest-weekday",
        lambda: parse_cron("0 0 15W * *", "UTC"),
        "cron",
        "day-of-month field '15W' uses 'W'",
    ),
    ("hash", lambda: parse_cron("H * * * *", "UTC"), "cron", "minute field 'H' uses 'H'"),
    ("never-fires", lambda: parse_cron("0 0 30 2 *", "UTC"), "cron", "'0 0 30 2 *' never fires"),
    (
        "never-fires-short-months",
        lambda: parse_cron("0 0 31 4,6,9,11 *", "UTC"),
        "cron",
        "never fires",
    ),
    ("unknown-macro", lambda: parse_cron("@reboot", "UTC"), "cron", "unknown macro '@reboot'"),
    (
        "unknown-zone",
        lambda: parse_cron("0 0 * * *", "Mars/Base"),
        "timezone",
        "unknown time zone 'Mars/Base'",
    ),
    ("empty-zone", lambda: load_zone(""), "timezone", "must not be empty"),
    ("host-zone", lambda: load_zone("localtime"), "timezone", "unknown time zone"),
    ("zone-directory", lambda: load_zone("America"), "timezone", "unknown time zone"),
    ("zone-path", lambda: load_zone("../etc/passwd"), "timezone", "unknown time zone"),
    (
        "interval-zero",
        lambda: parse_interval("0s", anchor=ANCHOR),
        "interval",
        "must be at least 1s, got 0s",
    ),
    (
        "interval-zero-td",
        lambda: parse_interval(timedelta(0), anchor=ANCHOR),
        "interval",
        "must be at least 1s, got 0s",
    ),
    (
        "interval-negative",
        lambda: parse_interval(timedelta(seconds=-5), anchor=ANCHOR),
        "interval",
        "got -5s",
    ),
    (
        "interval-subsecond",
        lambda: parse_interval(timedelta(milliseconds=500), anchor=ANCHOR),
        "interval",
        "got 0.5s",
    ),
    (
        "interval-garbage",
        lambda: parse_interval("soon", anchor=ANCHOR),
        "interval",
        "cannot parse 'soon'",
    ),
    (
        "interval-negative-text",
        lambda: parse_interval("-5s", anchor=ANCHOR),
        "interval",
        "cannot parse",
    ),
    ("interval-no-unit", lambda: parse_interval("90", anchor=ANCHOR), "interval", "cannot parse"),
    (
        "interval-repeated-unit",
        lambda: parse_interval("1h1h", anchor=ANCHOR),
        "interval",
        "a unit appears twice",
    ),
    (
        "interval-huge",
        lambda: parse_interval("99999999999d", anchor=ANCHOR),
        "interval",
        "too long",
    ),
    (
        "interval-naive-anchor",
        lambda: parse_interval("5m", anchor=NAIVE),
        "anchor",
        "must include a UTC offset",
    ),
    (
        "interval-zone",
        lambda: parse_interval("5m", anchor=ANCHOR, timezone="Nowhere"),
        "timezone",
        "unknown time zone",
    ),
    ("one-shot-naive", lambda: one_shot(NAIVE), "at", "must include a UTC offset"),
    (
        "next-after-naive",
        lambda: parse_cron("0 0 * * *", "UTC").next_after(NAIVE),
        "after",
        "must include a UTC offset",
    ),
    (
        "negative-count",
        lambda: fire_times(parse_cron("@daily", "UTC"), ANCHOR, -1),
        "count",
        "must not be negative",
    ),
    (
        "negative-jitter",
        lambda: jitter_offset("s", timedelta(seconds=-1)),
        "jitter_window",
        "must not be negative",
    ),
]


@pytest.mark.parametrize(
    ("call", "field", "problem"),
    [pytest.param(*case[1:], id=case[0]) for case in ERROR_CASES],
)
def test_invalid_argument_names_field(call: Callable[[], object], field: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        call()
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")
    assert problem in raised.value.problem


# --- jitter --------------------------------------------------------------------------------


JITTER_SCHED_42_MS = 33_429  # blake2b-64("sched-42") * 60_000 >> 64


def test_jitter_is_stable() -> None:
    window = timedelta(seconds=60)
    assert jitter_offset("sched-42", window) == jitter_offset("sched-42", window)
    # Pinned literal: every process and every release must put this schedule on this slot.
    assert jitter_offset("sched-42", window) == timedelta(milliseconds=JITTER_SCHED_42_MS)
    assert jitter_offset("sched-42", window) != jitter_offset("sched-43", window)


@pytest.mark.parametrize(
    "window",
    [timedelta(0), timedelta(microseconds=999), timedelta(milliseconds=1), timedelta(hours=1)],
)
def test_jitter_bounds_and_resolution(window: timedelta) -> None:
    for i in range(2000):
        offset = jitter_offset(f"schedule-{i}", window)
        assert offset % timedelta(milliseconds=1) == timedelta(0)
        if window < timedelta(milliseconds=1):
            assert offset == timedelta(0)
        else:
            assert timedelta(0) <= offset < window


def test_jitter_spreads_evenly() -> None:
    window = timedelta(seconds=60)
    bins = Counter(
        int(jitter_offset(f"tenant-7/schedule-{i}", window).total_seconds()) for i in range(100_000)
    )
    assert sorted(bins) == list(range(60))
    assert all(1_417 <= n <= 1_917 for n in bins.values()), bins  # 1,667 +- 15%
