"""Cron expressions on the naive wall clock: parsing, validation and matching.

This module knows nothing about time zones or DST; ``scheduler.timespec`` maps the naive wall
times found here onto UTC instants. The grammar is Vixie cron's plus the common extensions:

- 5 fields ``minute hour day-of-month month day-of-week``, or 6 with seconds FIRST
  (Quartz/Spring order), or one of the macros ``@yearly @annually @monthly @weekly @daily
  @midnight @hourly``.
- Items: ``*``, ``N``, ``A-B``, ``*/S``, ``A-B/S``, ``A/S`` (A to the field's end), lists with
  ``,``; month names ``JAN``..``DEC`` and day names ``SUN``..``SAT`` (any case); day-of-week
  ``0``..``7`` (0 and 7 are Sunday); ``L`` (last day) in day-of-month; ``?`` as ``*`` in
  day-of-month / day-of-week. A reversed range wraps around (``FRI-MON``, hours ``22-2``).
- Day-of-month and day-of-week combine with OR when both are restricted (neither is exactly
  ``*`` or ``?``), AND otherwise -- Vixie semantics, croniter's ``day_or=True``.

We parse ourselves rather than delegating to croniter so that every error names the field and
value, and so that matching is a cheap set lookup; ``tests/unit`` checks the result against
croniter on naive datetimes.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from itertools import pairwise

from scheduler.errors import InvalidArgument

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_ITEM = re.compile(r"^(?P<base>[^/]+)(?:/(?P<step>[^/]*))?$")
_NUMBER = re.compile(r"^[0-9]+$")
_ONE_DAY = timedelta(days=1)
# Extensions croniter accepts but we do not: better a precise refusal than a surprise.
_UNSUPPORTED = (
    (re.compile(r"#"), "uses '#' (nth weekday), which is not supported"),
    (
        re.compile(r"^(?:[0-9]+|L)W$", re.IGNORECASE),
        "uses 'W' (nearest weekday), which is not supported",
    ),
    (re.compile(r"^H(?:\(|/|$)", re.IGNORECASE), "uses 'H' (hashed value), which is not supported"),
    (re.compile(r"^\?"), "uses '?', which is only allowed alone in day-of-month or day-of-week"),
)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_SECOND = _Field("second", 0, 59, {})
_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DOM = _Field("day-of-month", 1, 31, {})
_MONTH = _Field("month", 1, 12, _MONTH_NAMES)
# 7 is accepted as a second spelling of Sunday and folded onto 0 after expansion.
_DOW = _Field("day-of-week", 0, 7, _DOW_NAMES)


def _bad(field: _Field, token: str, problem: str) -> InvalidArgument:
    return InvalidArgument("cron", f"{field.name} field '{token}' {problem}")


def _value(field: _Field, token: str) -> int:
    if _NUMBER.match(token):
        number = int(token)
    elif token.upper() in field.names:
        number = field.names[token.upper()]
    else:
        kind = {"month": " or month name", "day-of-week": " or day name"}.get(field.name, "")
        raise _bad(field, token, f"is not a number{kind}")
    if not field.low <= number <= field.high:
        raise _bad(field, token, f"is out of range {field.low}-{field.high}")
    return number


def _expand_item(field: _Field, item: str) -> set[int]:
    match = _ITEM.match(item)
    if match is None:
        raise _bad(field, item, "is not valid cron syntax")
    base, step_text = match.group("base"), match.group("step")
    step = 1
    if step_text is not None:
        if not _NUMBER.match(step_text):
            raise _bad(field, item, "has a step that is not a number")
        step = int(step_text)
        if step < 1:
            raise _bad(field, item, "has a step of 0; the step must be at least 1")
    # The day-of-week cycle is 0-6; 7 only exists as an alias for Sunday.
    top = 6 if field is _DOW else field.high
    if base == "*":
        return set(range(field.low, top + 1, step))
    if "-" in base:
        start_text, _, end_text = base.partition("-")
        start, end = _value(field, start_text), _value(field, end_text)
        if start <= end:
            values = set(range(start, end + 1, step))
        else:
            # A reversed range wraps around the field's cycle, as in Quartz and croniter.
            size = top - field.low + 1
            start = start % 7 if field is _DOW else start
            span = (end - start) % size
            values = {field.low + (start - field.low + k) % size for k in range(0, span + 1, step)}
    elif step_text is not None:
        start = _value(field, base)
        values = set(range(start % 7 if field is _DOW else start, top + 1, step))
    else:
        values = {_value(field, base)}
    return {v % 7 for v in values} if field is _DOW else values


def _expand_field(field: _Field, text: str) -> tuple[frozenset[int], bool]:
    """Expand one field into its values; the flag says the field held ``L`` (last day)."""
    values: set[int] = set()
    last = False
    for item in text.split(","):
        if item == "":
            raise _bad(field, text, "has an empty list item")
        if item == "?" and field in (_DOM, _DOW):
            values.update(range(field.low, 7 if field is _DOW else field.high + 1))
        elif item in ("L", "l"):
            if field is not _DOM:
                raise _bad(field, item, "uses 'L', which is only supported in day-of-month")
            last = True
        else:
            for pattern, problem in _UNSUPPORTED:
                if pattern.search(item):
                    raise _bad(field, item, problem)
            values |= _expand_item(field, item)
    return frozenset(values), last


@dataclass(frozen=True, kw_only=True)
class CronPattern:
    """A validated cron expression as sets of allowed values, matched on naive wall time."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    last_day: bool
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_star: bool
    dow_star: bool
    has_seconds: bool
    is_fixed_time: bool

    def day_matches(self, day: date) -> bool:
        """Whether the calendar day is selected (month, then day-of-month / day-of-week)."""
        if day.month not in self.months:
            return False
        if self.dom_star and self.dow_star:
            return True
        dow_ok = (day.weekday() + 1) % 7 in self.weekdays
        if self.dom_star:
            return dow_ok
        dom_ok = day.day in self.days or (
            self.last_day and day.day == calendar.monthrange(day.year, day.month)[1]
        )
        if self.dow_star:
            return dom_ok
        return dom_ok or dow_ok

    def matches(self, wall: datetime) -> bool:
        """Whether the naive wall time is selected, to the second."""
        return (
            wall.microsecond == 0
            and wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and self.day_matches(wall.date())
        )

    def _first_time_at_or_after(
        self, hour: int, minute: int, second: int
    ) -> tuple[int, int, int] | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, hour)
        if i < len(hours) and hours[i] == hour:
            j = bisect_left(minutes, minute)
            if j < len(minutes) and minutes[j] == minute:
                k = bisect_left(seconds, second)
                if k < len(seconds):
                    return (hour, minute, seconds[k])
                j += 1
            if j < len(minutes):
                return (hour, minutes[j], seconds[0])
            i += 1
        if i < len(hours):
            return (hours[i], minutes[0], seconds[0])
        return None

    def next_at_or_after(self, low: datetime, high: datetime) -> datetime | None:
        """The first selected naive wall time ``t`` with ``low <= t < high``, or None."""
        if low.microsecond:
            low = low.replace(microsecond=0) + timedelta(seconds=1)
        day, last = low.date(), high.date()
        clock: tuple[int, int, int] | None = (low.hour, low.minute, low.second)
        while day <= last:
            if day.month not in self.months:
                # Jump straight to the next selected month: keeps yearly and leap-day
                # schedules from walking every day of the year.
                later = [m for m in self.months if m > day.month]
                if later:
                    day = date(day.year, later[0], 1)
                elif day.year >= 9999:
                    return None
                else:
                    day = date(day.year + 1, self.months[0], 1)
                clock = None
                continue
            if self.day_matches(day):
                found = self._first_time_at_or_after(*clock) if clock else self._first_of_day()
                if found is not None:
                    candidate = datetime(day.year, day.month, day.day, *found)
                    return candidate if candidate < high else None
            if day == date.max:
                return None
            day += _ONE_DAY
            clock = None
        return None

    def _first_of_day(self) -> tuple[int, int, int]:
        return (self.hours[0], self.minutes[0], self.seconds[0])

    def min_period(self) -> timedelta:
        """Smallest wall-clock gap between consecutive fires (DST ignored: approximate)."""
        seconds_of_day = sorted(
            h * 3600 + m * 60 + s for h in self.hours for m in self.minutes for s in self.seconds
        )
        within_day = [b - a for a, b in pairwise(seconds_of_day)]
        # Eight years from a leap year cover every month/weekday/leap-day combination that
        # matters here (2100 is the only nearby exception and only lengthens gaps).
        day, end, previous = date(2024, 1, 1), date(2032, 1, 1), None
        day_gaps: list[int] = []
        while day < end:
            if self.day_matches(day):
                if previous is not None:
                    day_gaps.append((day - previous).days)
                previous = day
            day += _ONE_DAY
        span = seconds_of_day[-1] - seconds_of_day[0]
        across_days = min(day_gaps, default=4 * 366) * 86400 - span
        return timedelta(seconds=min([*within_day, across_days]))


def parse_pattern(expression: str) -> CronPattern:
    """Parse and validate ``expression``; raises ``InvalidArgument("cron", ...)``."""
    text = expression.strip()
    if not text:
        raise InvalidArgument("cron", "expression is empty")
    if text.startswith("@"):
        macro = MACROS.get(text.lower())
        if macro is None:
            raise InvalidArgument(
                "cron", f"unknown macro '{text}'; expected one of {', '.join(MACROS)}"
            )
        text = macro
    parts = text.split()
    if len(parts) not in (5, 6):
        raise InvalidArgument(
            "cron", f"expected 5 fields (or 6 with seconds first), got {len(parts)}"
        )
    has_seconds = len(parts) == 6
    second_text = parts.pop(0) if has_seconds else "0"
    minute_text, hour_text, dom_text, month_text, dow_text = parts
    seconds, _ = _expand_field(_SECOND, second_text)
    minutes, _ = _expand_field(_MINUTE, minute_text)
    hours, _ = _expand_field(_HOUR, hour_text)
    days, last_day = _expand_field(_DOM, dom_text)
    months, _ = _expand_field(_MONTH, month_text)
    weekdays, _ = _expand_field(_DOW, dow_text)
    pattern = CronPattern(
        seconds=tuple(sorted(seconds)),
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        last_day=last_day,
        months=tuple(sorted(months)),
        weekdays=weekdays,
        dom_star=dom_text in ("*", "?"),
        dow_star=dow_text in ("*", "?"),
        has_seconds=has_seconds,
        # Debian cron's rule: a job is "fixed-time" unless its minute or hour begins with '*'.
        is_fixed_time=not has_seconds
        and not minute_text.startswith("*")
        and not hour_text.startswith("*"),
    )
    _check_fires(pattern, expression)
    return pattern


def _check_fires(pattern: CronPattern, expression: str) -> None:
    # Only a day-of-month list on its own can be unsatisfiable (30 February); with OR or a
    # day-of-week alone some day always exists. Feb 29 counts: it exists in leap years.
    if pattern.dom_star or not pattern.dow_star or pattern.last_day:
        return
    longest = {m: calendar.monthrange(2024, m)[1] for m in pattern.months}
    if min(pattern.days) > max(longest.values()):
        months = ",".join(str(m) for m in pattern.months)
        plural = "s" if len(pattern.months) > 1 else ""
        raise InvalidArgument(
            "cron",
            f"'{expression.strip()}' never fires: day-of-month {min(pattern.days)} "
            f"does not occur in month{plural} {months}",
        )
