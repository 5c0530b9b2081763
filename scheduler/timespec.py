"""When a schedule fires: cron, fixed intervals and one-shots, in UTC, across DST.

Pure functions and frozen values: no I/O, no clock reads. Every instant handed out is an aware
UTC ``datetime``; comparisons are made on UTC instants, never on wall times.

Cron is evaluated on the wall clock of the schedule's IANA zone (``scheduler.cron`` finds the
naive wall times). Mapping wall times onto instants follows Debian cron by default:

- a *fixed-time* job (5 fields or a macro, neither minute nor hour begins with ``*``) gets
  ``GapPolicy.SHIFT`` and ``OverlapPolicy.ONCE``: a wall time in a spring-forward gap fires once at
  the first instant after the gap; a wall time in a fall-back overlap fires at its first
  occurrence only;
- every other job (minute or hour begins with ``*``, ``@hourly``, every 6-field expression) gets
  ``GapPolicy.SKIP`` and ``OverlapPolicy.BOTH``: the real clock, gap wall times never happen and
  overlap wall times happen twice.

See ``docs/concepts/time-and-dst.md`` for worked examples.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.cron import CronPattern, parse_pattern
from scheduler.errors import InvalidArgument

NOTE_GAP_SHIFTED = "dst_gap_shifted"
NOTE_OVERLAP_SECOND = "dst_overlap_second"
NOTE_GAP_SKIPPED = "dst_gap_skipped"

_SECOND = timedelta(seconds=1)
# Offsets are sampled this often when locating a zone's transitions. In tzdata 2026 no zone has
# two offset changes less than 3 days apart, so each change shows up between two samples.
_SAMPLE_STEP = timedelta(hours=6)
_FIRST_YEAR, _LAST_YEAR = 3, 9997
_FIRST_WALL = datetime(_FIRST_YEAR, 1, 1)
# Names zoneinfo can load that would make evaluation depend on the host.
_HOST_ZONES = frozenset({"localtime", "posixrules"})


class GapPolicy(enum.Enum):
    """What a wall time that a spring-forward transition skips over does."""

    SHIFT = "SHIFT"  # fire once at the first instant after the gap
    SKIP = "SKIP"  # the wall time does not exist: no fire


class OverlapPolicy(enum.Enum):
    """What a wall time that a fall-back transition repeats does."""

    ONCE = "ONCE"  # fire at the first occurrence only
    BOTH = "BOTH"  # fire at both occurrences, in UTC order


@dataclass(frozen=True, kw_only=True)
class FireTime:
    """One firing: its UTC instant (jitter not applied) and the wall time it shows locally."""

    utc: datetime
    local: datetime
    note: str = ""  # "", NOTE_GAP_SHIFTED or NOTE_OVERLAP_SECOND


class TimeSpec(Protocol):
    """Anything that can say when it fires next."""

    def next_after(self, after: datetime) -> FireTime | None:
        """The first firing strictly after the aware instant ``after``; None if never again."""
        ...


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; raises ``InvalidArgument("timezone", ...)`` if unknown or empty."""
    if not name:
        raise InvalidArgument("timezone", "must not be empty")
    if name in _HOST_ZONES or name.startswith("right/"):
        raise InvalidArgument("timezone", f"unknown time zone '{name}'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument("timezone", f"unknown time zone '{name}'") from None


def _require_aware(value: datetime, field_name: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field_name, "must include a UTC offset")
    return value.astimezone(UTC)


def _fire(utc: datetime, zone: ZoneInfo, note: str = "") -> FireTime:
    return FireTime(utc=utc, local=utc.astimezone(zone), note=note)


# --- zone transitions ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Transition:
    at: datetime  # naive UTC: the first instant with the new offset
    before: timedelta
    after: timedelta


def _offset(zone: ZoneInfo, naive_utc: datetime) -> timedelta:
    offset = naive_utc.replace(tzinfo=UTC).astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always knows its offset
    return offset


@lru_cache(maxsize=4096)
def _transitions(zone: ZoneInfo, year: int) -> tuple[_Transition, ...]:
    """Offset changes of ``zone`` in the UTC calendar year, located to the second."""
    # zoneinfo has no public transition table; sampling then bisecting costs ~1 ms per
    # zone-year, once, and handles the far future (POSIX rules) the same as the past.
    end = datetime(year + 1, 1, 1)
    found: list[_Transition] = []
    low = datetime(year, 1, 1) - _SECOND
    low_offset = _offset(zone, low)
    while low < end - _SECOND:
        high = min(low + _SAMPLE_STEP, end - _SECOND)
        high_offset = _offset(zone, high)
        if high_offset != low_offset:
            left, right = low, high
            while right - left > _SECOND:
                middle = left + (right - left) // 2
                middle = middle.replace(microsecond=0)
                if _offset(zone, middle) == low_offset:
                    left = middle
                else:
                    right = middle
            found.append(_Transition(right, low_offset, _offset(zone, right)))
        low, low_offset = high, high_offset
    return tuple(found)


@lru_cache(maxsize=4096)
def _has_gap(zone: ZoneInfo, year: int) -> bool:
    """Whether ``zone`` springs forward (skips wall times) in the UTC calendar year: asked for
    every slot fired, so answered once per zone-year."""
    return any(t.after > t.before for t in _transitions(zone, year))


@dataclass(frozen=True, slots=True)
class _Segment:
    """A stretch of UTC time with one offset; wall times there map 1:1 onto instants."""

    start: datetime  # naive UTC
    end: datetime  # naive UTC, exclusive
    offset: timedelta
    # Set when the segment begins with a spring-forward: the wall times that never happened.
    gap: tuple[datetime, datetime] | None
    # Set after a fall-back: wall times before this already happened under the old offset.
    repeat_until: datetime | None


def _segments(zone: ZoneInfo, after: datetime) -> Iterator[_Segment]:
    """Segments in UTC order, from the one containing naive-UTC ``after``."""
    year = after.year
    past = [t for y in (year - 1, year) for t in _transitions(zone, y) if t.at <= after]
    start, offset = after, _offset(zone, after)
    repeat_until: datetime | None = None
    if past and past[-1].before > past[-1].after:
        repeat_until = past[-1].at + past[-1].before
    gap: tuple[datetime, datetime] | None = None
    while year <= _LAST_YEAR:
        for transition in _transitions(zone, year):
            if transition.at <= after:
                continue
            yield _Segment(start, transition.at, offset, gap, repeat_until)
            start, offset = transition.at, transition.after
            before_wall, after_wall = start + transition.before, start + transition.after
            gap = (before_wall, after_wall) if after_wall > before_wall else None
            repeat_until = before_wall if before_wall > after_wall else None
        # Year ends split segments only so the walk is lazy; they carry no gap of their own.
        year_end = datetime(year + 1, 1, 1)
        yield _Segment(start, year_end, offset, gap, repeat_until)
        start, gap = year_end, None
        year += 1


# --- cron ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CronSpec:
    """A cron expression evaluated in an IANA zone under explicit DST policies."""

    expression: str
    timezone: str
    gap: GapPolicy
    overlap: OverlapPolicy
    is_fixed_time: bool
    has_seconds: bool
    pattern: CronPattern = field(compare=False, repr=False)
    zone: ZoneInfo = field(compare=False, repr=False)

    def next_after(self, after: datetime) -> FireTime | None:
        """The first firing strictly after ``after`` (aware); None past year 9997."""
        return _next_cron(self, _require_aware(after, "after"))

    def min_period(self) -> timedelta:
        """Smallest wall-clock gap between consecutive fires; DST may shorten it by its delta."""
        return _min_period(self.pattern)

    def skipped_between(self, after: datetime, until: datetime) -> list[tuple[datetime, str]]:
        """Wall times in ``(after, until]`` that never fire because a gap dropped them.

        Only ``GapPolicy.SKIP`` drops wall times; each is returned as a naive local wall time
        with the reason ``NOTE_GAP_SKIPPED``, so a caller can record it instead of losing it.
        """
        skipped: list[tuple[datetime, str]] = []
        if (
            after.tzinfo is UTC
            and until.tzinfo is UTC
            and after.year == until.year
            and _FIRST_YEAR <= after.year <= _LAST_YEAR
            and (self.gap is not GapPolicy.SKIP or not _has_gap(self.zone, after.year))
        ):
            # Asked at every slot a dispatcher fires: answered from the zone-year's one answer
            # (UTC, or no spring-forward this year) before any other work. Instants in UTC
            # only: another offset's calendar year may not be the UTC one the answer is for.
            return skipped
        start = max(_require_aware(after, "after").replace(tzinfo=None), _FIRST_WALL)
        stop = _require_aware(until, "until").replace(tzinfo=None)
        if self.gap is not GapPolicy.SKIP or start.year > _LAST_YEAR:
            return skipped
        if not any(
            _has_gap(self.zone, year) for year in range(start.year, min(stop.year, _LAST_YEAR) + 1)
        ):
            return skipped  # no gap in the span (UTC, or no spring-forward in these years)
        for segment in _segments(self.zone, start):
            if segment.start > stop:
                break
            if segment.start > start and segment.gap is not None:
                wall, gap_end = segment.gap
                while (found := self.pattern.next_at_or_after(wall, gap_end)) is not None:
                    skipped.append((found, NOTE_GAP_SKIPPED))
                    wall = found + _SECOND
        return skipped


@lru_cache(maxsize=4096)
def _min_period(pattern: CronPattern) -> timedelta:
    return pattern.min_period()


@lru_cache(maxsize=65_536)
def _next_cron(spec: CronSpec, after: datetime) -> FireTime | None:
    # Cached because a fleet of schedules sharing "0 0 * * *" all ask for the same slot.
    if after.year > _LAST_YEAR:
        return None
    # Years 1-2 would overflow the offset arithmetic; nobody schedules in them.
    naive_after = max(after.replace(tzinfo=None), _FIRST_WALL)
    pattern = spec.pattern
    first = True
    for segment in _segments(spec.zone, naive_after):
        offset = segment.offset
        if not first and segment.gap is not None and spec.gap is GapPolicy.SHIFT:
            gap_start, gap_end = segment.gap
            if pattern.next_at_or_after(gap_start, gap_end) is not None:
                # However many wall times the gap swallowed, they fire once, at the
                # transition; if that instant is itself a selected wall time, no note.
                note = "" if pattern.matches(gap_end) else NOTE_GAP_SHIFTED
                return _fire(segment.start.replace(tzinfo=UTC), spec.zone, note)
        if first:
            low = (naive_after + offset).replace(microsecond=0) + _SECOND
        else:
            low = segment.start + offset
        repeat_until = segment.repeat_until
        if repeat_until is not None and spec.overlap is OverlapPolicy.ONCE:
            low = max(low, repeat_until)
        wall = pattern.next_at_or_after(low, segment.end + offset)
        if wall is not None:
            second = repeat_until is not None and wall < repeat_until
            note = NOTE_OVERLAP_SECOND if second else ""
            return _fire((wall - offset).replace(tzinfo=UTC), spec.zone, note)
        first = False
    return None


@lru_cache(maxsize=4096)
def parse_cron(
    expression: str,
    timezone: str,
    *,
    gap: GapPolicy | None = None,
    overlap: OverlapPolicy | None = None,
) -> CronSpec:
    """Validate a cron expression and zone; None policies take the Debian-cron default.
    Cached: fleets share a few distinct expressions, and a CronSpec is immutable.

    Raises ``InvalidArgument("cron", ...)`` or ``InvalidArgument("timezone", ...)``.
    """
    return _parse_cron(expression, timezone, gap, overlap)


@lru_cache(maxsize=4096)
def _parse_cron(
    expression: str, timezone: str, gap: GapPolicy | None, overlap: OverlapPolicy | None
) -> CronSpec:
    zone = load_zone(timezone)
    pattern = parse_pattern(expression)
    fixed = pattern.is_fixed_time
    return CronSpec(
        expression=expression.strip(),
        timezone=timezone,
        gap=gap or (GapPolicy.SHIFT if fixed else GapPolicy.SKIP),
        overlap=overlap or (OverlapPolicy.ONCE if fixed else OverlapPolicy.BOTH),
        is_fixed_time=fixed,
        has_seconds=pattern.has_seconds,
        pattern=pattern,
        zone=zone,
    )


# --- intervals and one-shots ---------------------------------------------------------------

_INTERVAL = re.compile(r"^(?:every\s+)?((?:[0-9]+\s*[dhms]\s*)+)$", re.IGNORECASE)
_INTERVAL_PART = re.compile(r"([0-9]+)\s*([dhms])", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


@dataclass(frozen=True, kw_only=True)
class IntervalSpec:
    """Fires at ``anchor + k * every`` for k >= 0, in real time: DST does not move it."""

    every: timedelta
    anchor: datetime  # aware UTC
    timezone: str
    zone: ZoneInfo = field(compare=False, repr=False)

    def next_after(self, after: datetime) -> FireTime | None:
        """The first ``anchor + k * every`` strictly after ``after``; None past datetime.max."""
        instant = _require_aware(after, "after")
        steps = 0 if instant < self.anchor else (instant - self.anchor) // self.every + 1
        try:
            return _fire(self.anchor + self.every * steps, self.zone)
        except OverflowError:
            return None


def _format_seconds(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"


def parse_interval(
    every: str | timedelta, *, anchor: datetime, timezone: str = "UTC"
) -> IntervalSpec:
    """An interval from ``"every 90s"``, ``"90s"``, ``"5m"``, ``"1h30m"``, ``"2d"`` or a timedelta.

    Raises ``InvalidArgument("interval", ...)`` below 1 s or when unparseable,
    ``InvalidArgument("anchor", ...)`` for a naive anchor.
    """
    if isinstance(every, timedelta):
        period = every
    else:
        match = _INTERVAL.match(every.strip())
        if match is None:
            raise InvalidArgument(
                "interval", f"cannot parse '{every}'; expected e.g. '90s', '5m', '1h30m' or '2d'"
            )
        parts = [(int(n), unit.lower()) for n, unit in _INTERVAL_PART.findall(match.group(1))]
        units = [unit for _, unit in parts]
        if len(set(units)) != len(units):
            raise InvalidArgument("interval", f"cannot parse '{every}': a unit appears twice")
        try:
            period = timedelta(seconds=sum(n * _UNIT_SECONDS[unit] for n, unit in parts))
        except OverflowError:
            raise InvalidArgument("interval", f"'{every}' is too long") from None
    if period < _SECOND:
        raise InvalidArgument("interval", f"must be at least 1s, got {_format_seconds(period)}")
    return IntervalSpec(
        every=period,
        anchor=_require_aware(anchor, "anchor"),
        timezone=timezone,
        zone=load_zone(timezone),
    )


@dataclass(frozen=True, kw_only=True)
class OneShotSpec:
    """Fires once, at ``at``."""

    at: datetime  # aware UTC
    timezone: str
    zone: ZoneInfo = field(compare=False, repr=False)

    def next_after(self, after: datetime) -> FireTime | None:
        """``at`` if it is strictly after ``after``, else None."""
        if self.at > _require_aware(after, "after"):
            return _fire(self.at, self.zone)
        return None


def one_shot(at: datetime, timezone: str = "UTC") -> OneShotSpec:
    """A single firing at the aware instant ``at``; naive raises ``InvalidArgument("at", ...)``."""
    return OneShotSpec(at=_require_aware(at, "at"), timezone=timezone, zone=load_zone(timezone))


# --- helpers -------------------------------------------------------------------------------


def jitter_offset(schedule_id: str, window: timedelta) -> timedelta:
    """A stable offset in ``[0, window)`` at 1 ms resolution, uniform over schedule ids.

    The same id always gets the same offset (a BLAKE2b hash, not Python's salted ``hash``), so
    every process agrees and a schedule keeps its slot. A zero window gives zero.
    """
    if window < timedelta(0):
        raise InvalidArgument("jitter_window", f"must not be negative, got {window}")
    slots = window // timedelta(milliseconds=1)
    if slots == 0:
        return timedelta(0)
    digest = hashlib.blake2b(schedule_id.encode("utf-8"), digest_size=8).digest()
    # Multiply-shift maps the 64-bit hash onto [0, slots) without modulo's low-slot bias.
    return timedelta(milliseconds=(int.from_bytes(digest, "big") * slots) >> 64)


def fire_times(spec: TimeSpec, after: datetime, count: int) -> list[FireTime]:
    """Up to ``count`` consecutive firings strictly after ``after``, in UTC order."""
    if count < 0:
        raise InvalidArgument("count", f"must not be negative, got {count}")
    fires: list[FireTime] = []
    cursor = after
    while len(fires) < count:
        fire = spec.next_after(cursor)
        if fire is None:
            break
        fires.append(fire)
        cursor = fire.utc
    return fires
