"""The domain model: schedules, their stored spec, runs, and run ids.

Frozen keyword-only value objects built from rows by ``from_row``; the gRPC layer converts them
to and from protobuf at the edge (scheduler.api.convert).
"""

from __future__ import annotations

import enum
import json
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from functools import cached_property, lru_cache
from typing import Any

from bucketer.model import aware as aware_utc
from scheduler.errors import InvalidArgument
from scheduler.timespec import (
    FireTime,
    GapPolicy,
    OverlapPolicy,
    TimeSpec,
    jitter_offset,
    one_shot,
    parse_cron,
    parse_interval,
)

SPEC_VERSION = 1
DEFAULT_TENANT = "default"
MAX_PAYLOAD_BYTES = 64 * 1024
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HANDLER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
_MS = timedelta(milliseconds=1)


def millis(d: timedelta) -> int:
    """A duration in whole milliseconds, exactly: integer arithmetic, as stored durations are
    read back with ``timedelta(milliseconds=...)`` (``int(d.total_seconds() * 1000)`` stored
    1.001 s as 1000 ms: the float product is 1000.9999999999999)."""
    return d // _MS


def to_millisecond(t: datetime) -> datetime:
    """``t`` truncated to the millisecond, as Cassandra keeps a timestamp (and as run ids name
    a slot): an instant compared with one read back must be cut the same way."""
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


class ScheduleState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"


class RunStatus(enum.StrEnum):
    ENQUEUED = "ENQUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    DEAD_LETTERED = "DEAD_LETTERED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


class SpecKind(enum.StrEnum):
    CRON = "cron"
    INTERVAL = "interval"
    ONCE = "once"
    # No times of its own: a dependency-only schedule fires only after its upstreams succeed.
    NONE = "none"


class OverlapMode(enum.StrEnum):
    """What a slot does when the previous run is still in progress."""

    SKIP = "SKIP"
    ALLOW = "ALLOW"
    BUFFER_ONE = "BUFFER_ONE"
    CANCEL_PREVIOUS = "CANCEL_PREVIOUS"


class MisfireMode(enum.StrEnum):
    """What slots missed while nothing could fire them do."""

    SKIP = "SKIP"
    FIRE_ONCE = "FIRE_ONCE"
    FIRE_ALL = "FIRE_ALL"


class SkipReason(enum.StrEnum):
    """Why a slot did not run (``Run.skip_reason``)."""

    OVERLAP = "overlap"
    MISFIRE = "misfire"
    PAUSED = "paused"
    DST = "dst"
    END_BOUND = "end_bound"
    MAX_RUNS = "max_runs"


DEFAULT_CATCH_UP_WINDOW = timedelta(hours=1)
DEFAULT_MAX_CATCH_UP = 100
# A slot fired later than this counts as missed: its misfire policy decides (Quartz's
# misfireThreshold).
MISFIRE_THRESHOLD = timedelta(seconds=30)
# A run in progress that showed no sign of life (enqueue, heartbeat) for this long no longer
# blocks its schedule's overlap policy (nor a backfill's concurrency): its worker is presumed
# gone.
STALE_RUN = timedelta(minutes=2)
# A run's end is noted on its schedule's next fire timer (RunMessage.next_fire_time) only while
# that timer is due at least this far ahead: further than any scanner reads ahead (its
# lookahead, 1 s, which bounds the fire-ahead too) plus the clock skew a dispatcher tolerates
# (0.5 s), with room for the write itself. Later, the end goes on the schedule row.
DONE_NOTE_LEAD = timedelta(seconds=10)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How failed attempts are retried (``scheduler.retries``); stored inside the policies."""

    max_attempts: int = 3
    initial_backoff: timedelta = timedelta(seconds=10)
    multiplier: float = 2.0
    max_backoff: timedelta = timedelta(minutes=10)
    # The share of each backoff drawn at random: 1.0 is "full jitter".
    jitter: float = 1.0

    def to_doc(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "initial_ms": millis(self.initial_backoff),
            "multiplier": self.multiplier,
            "max_ms": millis(self.max_backoff),
            "jitter": self.jitter,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> RetryPolicy:
        if not doc:
            return cls()
        return cls(
            max_attempts=int(doc["max_attempts"]),
            initial_backoff=timedelta(milliseconds=doc["initial_ms"]),
            multiplier=float(doc["multiplier"]),
            max_backoff=timedelta(milliseconds=doc["max_ms"]),
            jitter=float(doc["jitter"]),
        )


@dataclass(frozen=True, kw_only=True)
class SchedulePolicies:
    """Execution policies, stored as a versioned JSON document in ``schedules.policies``."""

    overlap: OverlapMode = OverlapMode.SKIP
    misfire: MisfireMode = MisfireMode.FIRE_ONCE
    catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    retry: RetryPolicy = RetryPolicy()

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": SPEC_VERSION,
                "overlap": self.overlap.value,
                "misfire": self.misfire.value,
                "catch_up_ms": millis(self.catch_up_window),
                "max_catch_up": self.max_catch_up,
                "retry": self.retry.to_doc(),
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> SchedulePolicies:
        """The policies stored as ``text`` (each distinct text parsed once, as specs are)."""
        return _policies_from_json(text or "")

    @classmethod
    def _parse(cls, text: str) -> SchedulePolicies:
        if not text:
            return cls()
        doc = json.loads(text)
        _require_version(doc, "schedule policies")
        return cls(
            overlap=OverlapMode(doc.get("overlap", "SKIP")),
            misfire=MisfireMode(doc.get("misfire", "FIRE_ONCE")),
            catch_up_window=timedelta(milliseconds=doc.get("catch_up_ms", 3_600_000)),
            max_catch_up=int(doc.get("max_catch_up", DEFAULT_MAX_CATCH_UP)),
            # Stored before version 7 without one: the defaults.
            retry=RetryPolicy.from_doc(doc.get("retry")),
        )


@lru_cache(maxsize=16_384)
def _policies_from_json(text: str) -> SchedulePolicies:
    return SchedulePolicies._parse(text)


@lru_cache(maxsize=16_384)
def _spec_from_json(text: str) -> ScheduleSpec:
    return ScheduleSpec._parse(text)


def _require_version(doc: dict[str, Any], what: str) -> None:
    if doc.get("v", 0) > SPEC_VERSION:
        raise UnsupportedVersion(
            f"{what} version {doc['v']} is newer than this cronscale ({SPEC_VERSION})"
        )


class UnsupportedVersion(Exception):
    """A stored document was written by a newer cronscale than this one."""


class _NeverFires:
    """The time spec of a dependency-only schedule (``SpecKind.NONE``): no slot, ever."""

    def next_after(self, after: datetime) -> FireTime | None:
        return None


_NEVER = _NeverFires()


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """When a schedule fires, as stored (a versioned JSON document in ``schedules.spec``)."""

    kind: SpecKind
    cron: str = ""
    timezone: str = "UTC"
    every: timedelta | None = None
    anchor: datetime | None = None
    at: datetime | None = None
    # None: the expression's default (Debian cron rule).
    dst_gap: GapPolicy | None = None
    dst_overlap: OverlapPolicy | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    max_runs: int = 0
    jitter: timedelta = timedelta(0)

    @cached_property
    def timespec(self) -> TimeSpec:
        """The evaluator of this spec (validated; raises InvalidArgument naming the field)."""
        if self.kind is SpecKind.CRON:
            return parse_cron(
                self.cron, self.timezone or "UTC", gap=self.dst_gap, overlap=self.dst_overlap
            )
        if self.kind is SpecKind.INTERVAL:
            if self.every is None or self.anchor is None:
                raise InvalidArgument("spec.interval.every", "is required")
            return parse_interval(self.every, anchor=self.anchor, timezone=self.timezone)
        if self.kind is SpecKind.NONE:
            return _NEVER
        if self.at is None:
            raise InvalidArgument("spec.once.at", "is required")
        return one_shot(self.at, self.timezone or "UTC")

    def to_json(self) -> str:
        doc: dict[str, Any] = {"v": SPEC_VERSION, "kind": self.kind.value, "tz": self.timezone}
        if self.dst_gap is not None:
            doc["dst_gap"] = self.dst_gap.value
        if self.dst_overlap is not None:
            doc["dst_overlap"] = self.dst_overlap.value
        if self.start_time is not None:
            doc["start"] = self.start_time.isoformat()
        if self.end_time is not None:
            doc["end"] = self.end_time.isoformat()
        if self.max_runs:
            doc["max_runs"] = self.max_runs
        if self.jitter:
            doc["jitter_ms"] = millis(self.jitter)
        if self.kind is SpecKind.CRON:
            doc["cron"] = self.cron
        elif self.kind is SpecKind.INTERVAL:
            assert self.every is not None and self.anchor is not None
            doc["every_ms"] = millis(self.every)
            doc["anchor"] = self.anchor.isoformat()
        elif self.kind is SpecKind.ONCE:
            assert self.at is not None
            doc["at"] = self.at.isoformat()
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ScheduleSpec:
        """The spec stored as ``text``. Specs are immutable and fleets share a few distinct
        ones, so each distinct text is parsed once (with its cron pattern, ``timespec``) and
        the same object handed out again: a dispatcher reads thousands of schedules a second."""
        return _spec_from_json(text)

    @classmethod
    def _parse(cls, text: str) -> ScheduleSpec:
        doc = json.loads(text)
        _require_version(doc, "schedule spec")
        kind = SpecKind(doc["kind"])
        return cls(
            kind=kind,
            cron=doc.get("cron", ""),
            timezone=doc.get("tz", "UTC"),
            every=timedelta(milliseconds=doc["every_ms"]) if "every_ms" in doc else None,
            anchor=datetime.fromisoformat(doc["anchor"]) if "anchor" in doc else None,
            at=datetime.fromisoformat(doc["at"]) if "at" in doc else None,
            dst_gap=GapPolicy(doc["dst_gap"]) if "dst_gap" in doc else None,
            dst_overlap=OverlapPolicy(doc["dst_overlap"]) if "dst_overlap" in doc else None,
            start_time=datetime.fromisoformat(doc["start"]) if "start" in doc else None,
            end_time=datetime.fromisoformat(doc["end"]) if "end" in doc else None,
            max_runs=int(doc.get("max_runs", 0)),
            jitter=timedelta(milliseconds=doc.get("jitter_ms", 0)),
        )


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A registered schedule."""

    schedule_id: str
    tenant: str = DEFAULT_TENANT
    name: str = ""
    handler: str
    spec: ScheduleSpec
    payload: bytes = b""
    state: ScheduleState = ScheduleState.ACTIVE
    version: int = 1
    # Replaced by every change; a timer fires only while it carries the current generation.
    generation: int = 0
    create_time: datetime | None = None
    update_time: datetime | None = None
    pause_note: str = ""
    paused_by: str = ""
    pause_time: datetime | None = None
    max_runtime: timedelta | None = None
    last_fire_time: datetime | None = None
    next_fire_time: datetime | None = None
    policies: SchedulePolicies = field(default_factory=SchedulePolicies)
    # Upstream schedules this one runs after, and schedules that run after this one.
    after: frozenset[str] = frozenset()
    downstream: frozenset[str] = frozenset()
    # Overlap bookkeeping, in plain cells (never a collection: every removed element would be
    # a tombstone on a row touched at every firing). The run enqueued last and its last sign of
    # life (enqueue, heartbeat), and the run that finished last (by enqueue order).
    active_run: str = ""
    active_seen: datetime | None = None
    done_run: str = ""
    # A timer of this schedule failed on its own and was set aside (scheduler.firing): the
    # schedule does not fire until an operator changes or resumes it.
    quarantine_error: str = ""
    quarantine_time: datetime | None = None
    # A run held back by BUFFER_ONE until the running one finishes.
    buffered: BufferedRun | None = None
    # Runs in progress known from elsewhere than the overlap cells, already checked against
    # their run rows: the run of a slot is marked in progress on its schedule's next fire timer
    # (``FireTimer.running``), not on this row, when its end can be noted on that timer.
    running: tuple[str, ...] = ()

    @cached_property
    def slot_offset(self) -> timedelta:
        """How long after each of its slots this schedule fires: its jitter, a stable offset in
        ``[0, spec.jitter)`` derived from its id (``jitter_offset``). Computed once per
        instance (a hash of the id, ~3 µs, asked at every slot a dispatcher fires from its
        schedule cache)."""
        return jitter_offset(self.schedule_id, self.spec.jitter)

    def evolve(self, **changes: Any) -> Schedule:
        """``dataclasses.replace(self, **changes)`` in ~1 µs instead of ~8: a copy of this
        instance's fields with ``changes`` applied, without running ``__init__`` again (a
        Schedule has no ``__post_init__``; what it caches on itself, ``slot_offset``, is left
        behind). For paths that build a schedule per item of a batch
        (``ScheduleService.create_many``); a name that is not a field raises TypeError, as
        ``replace`` does."""
        unknown = changes.keys() - _SCHEDULE_FIELDS
        if unknown:
            raise TypeError(f"Schedule has no field(s) {', '.join(sorted(unknown))}")
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.__dict__.update(changes)
        out.__dict__.pop("slot_offset", None)
        return out

    @classmethod
    def from_row(cls, row: Any) -> Schedule:
        return cls(
            schedule_id=row.schedule_id,
            tenant=row.tenant or DEFAULT_TENANT,
            name=row.name or "",
            handler=row.handler,
            spec=ScheduleSpec.from_json(row.spec),
            payload=bytes(row.payload or b""),
            state=ScheduleState(row.state),
            version=row.version or 0,
            generation=row.generation or 0,
            create_time=aware(row.create_time),
            update_time=aware(row.update_time),
            pause_note=row.pause_note or "",
            paused_by=row.paused_by or "",
            pause_time=aware(row.pause_time),
            max_runtime=(
                timedelta(milliseconds=row.max_runtime_ms) if row.max_runtime_ms else None
            ),
            last_fire_time=aware(row.last_fire_time),
            next_fire_time=aware(row.next_fire_time),
            policies=SchedulePolicies.from_json(getattr(row, "policies", None)),
            after=frozenset(getattr(row, "after", None) or ()),
            downstream=frozenset(getattr(row, "downstream", None) or ()),
            active_run=getattr(row, "active_run", None) or "",
            active_seen=aware(getattr(row, "active_seen", None)),
            done_run=getattr(row, "done_run", None) or "",
            quarantine_error=getattr(row, "quarantine_error", None) or "",
            quarantine_time=aware(getattr(row, "quarantine_time", None)),
            buffered=BufferedRun.from_json(getattr(row, "buffered", None)),
        )

    def in_progress(
        self, now: datetime, *, stale_after: timedelta, besides: Collection[str] = ()
    ) -> list[str]:
        """Run ids still in progress: the run the row marks enqueued last, unless it finished
        or showed no sign of life within ``stale_after`` (its worker vanished), and those of
        ``running``.

        ``besides`` are the runs being decided: a slot fired again (a batch retried after a
        partial failure) finds its own earlier attempt here, and that is not another run.
        """
        found = [r for r in self.running if r not in besides]
        rid = self.active_run
        if not rid or rid == self.done_run or rid in besides or self.active_seen is None:
            return found
        if now - self.active_seen >= stale_after or rid in found:
            return found
        return [rid, *found]


_SCHEDULE_FIELDS = frozenset(f.name for f in fields(Schedule))


@dataclass(frozen=True, kw_only=True)
class BufferedRun:
    """A slot (or a manual trigger) BUFFER_ONE holds back: fired when the run in progress
    finishes."""

    run_id: str
    scheduled_for: datetime
    # A TriggerSchedule run (released as a manual run).
    manual: bool = False

    def to_json(self) -> str:
        doc: dict[str, Any] = {"v": 1, "run_id": self.run_id, "at": self.scheduled_for.isoformat()}
        if self.manual:
            doc["manual"] = True
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | None) -> BufferedRun | None:
        if not text:
            return None
        doc = json.loads(text)
        return cls(
            run_id=doc["run_id"],
            scheduled_for=datetime.fromisoformat(doc["at"]),
            manual=bool(doc.get("manual", False)),
        )


@dataclass(frozen=True, kw_only=True)
class Run:
    """One execution (or skipped slot) of a schedule."""

    run_id: str
    schedule_id: str
    scheduled_for: datetime
    status: RunStatus
    attempt: int = 1
    handler: str = ""
    tenant: str = DEFAULT_TENANT
    manual: bool = False
    enqueue_time: datetime | None = None
    start_time: datetime | None = None
    finish_time: datetime | None = None
    worker_id: str = ""
    error: str = ""
    skip_reason: str = ""
    origin_run_id: str = ""
    backfill_id: str = ""
    # A failed attempt that will be retried: when the next one is due.
    next_attempt_time: datetime | None = None
    # The worker's last sign of life for a RUNNING run.
    heartbeat_time: datetime | None = None
    # How long the tenant's enqueue-rate quota held the run back (scheduler.fairness).
    deferred: timedelta | None = None
    # An operator or a CANCEL_PREVIOUS slot asked its worker to cancel it.
    cancel_requested: bool = False

    @classmethod
    def from_row(cls, row: Any) -> Run:
        return cls(
            run_id=row.run_id,
            schedule_id=row.schedule_id,
            scheduled_for=aware(row.scheduled_for) or datetime.min.replace(tzinfo=UTC),
            status=RunStatus(row.status) if row.status else RunStatus.ENQUEUED,
            attempt=row.attempt or 1,
            handler=row.handler or "",
            tenant=row.tenant or DEFAULT_TENANT,
            manual=bool(row.manual),
            enqueue_time=aware(row.enqueue_time),
            start_time=aware(row.start_time),
            finish_time=aware(row.finish_time),
            worker_id=row.worker_id or "",
            # A duplicate delivery's FAILED and SUCCEEDED of one attempt share their cells'
            # timestamp: SUCCEEDED wins the status, and its run shows no error.
            error=(row.error or "") if row.status != RunStatus.SUCCEEDED.value else "",
            skip_reason=row.skip_reason or "",
            origin_run_id=getattr(row, "origin_run_id", None) or "",
            backfill_id=getattr(row, "backfill_id", None) or "",
            next_attempt_time=aware(getattr(row, "next_attempt_time", None)),
            heartbeat_time=aware(getattr(row, "heartbeat_time", None)),
            deferred=(
                timedelta(milliseconds=row.deferred_ms)
                if getattr(row, "deferred_ms", None)
                else None
            ),
            cancel_requested=bool(getattr(row, "cancel_requested", None)),
        )


@dataclass(frozen=True, kw_only=True)
class RunRef:
    """Where a run lives: its schedule and slot, recovered from the run id."""

    schedule_id: str
    scheduled_for: datetime
    suffix: str = field(default="")


# Run ids read as `<schedule_id>@<slot in UTC, ms>` (plus `~<random>` for manual runs): derived
# from (schedule_id, scheduled_for) so a re-fired slot gets the same id, and parseable so GetRun
# and run reports find the run's partition without an index table.
_RUN_TIME_FORMAT = "%Y%m%dT%H%M%S"


def run_id_for(
    schedule_id: str, scheduled_for: datetime, *, manual: bool = False, suffix: str = ""
) -> str:
    """The run id of a slot.

    ``manual`` adds a random suffix (a trigger is a fresh run); ``suffix`` a deterministic one
    (``bf`` for a backfill run, ``d<hash>`` for a dependent run, ``dst-HHMM`` for a slot a DST
    gap dropped), so those never collide with the slot's scheduled run.
    """
    t = scheduled_for.astimezone(UTC)
    if t.year >= 1000:
        # _RUN_TIME_FORMAT, formatted directly: strftime was most of this function's cost, and
        # the dispatcher names every run it fires.
        stamp = (
            f"{t.year}{t.month:02d}{t.day:02d}T{t.hour:02d}{t.minute:02d}{t.second:02d}"
            f".{t.microsecond // 1000:03d}Z"
        )
    else:  # strftime's own rendering of a year before 1000
        stamp = f"{t.strftime(_RUN_TIME_FORMAT)}.{t.microsecond // 1000:03d}Z"
    rid = f"{schedule_id}@{stamp}"
    if manual:
        rid += "~" + secrets.token_hex(4)
    elif suffix:
        rid += "~" + suffix
    return rid


def parse_run_id(run_id: str) -> RunRef:
    """Splits a run id into its schedule and slot; InvalidArgument('run_id') if malformed."""
    schedule_id, sep, rest = run_id.rpartition("@")
    if not sep or not _ID.match(schedule_id):
        raise InvalidArgument("run_id", f"{run_id!r} is not a cronscale run id")
    stamp, _, suffix = rest.partition("~")
    try:
        base, _, millis = stamp.rstrip("Z").partition(".")
        t = datetime.strptime(base, _RUN_TIME_FORMAT).replace(tzinfo=UTC)
        t += timedelta(milliseconds=int(millis or "0"))
    except ValueError:
        raise InvalidArgument("run_id", f"{run_id!r} is not a cronscale run id") from None
    return RunRef(schedule_id=schedule_id, scheduled_for=t, suffix=suffix)


BACKFILL_SUFFIX = "bf"


def is_backfill_run(run_id: str) -> bool:
    """Whether ``run_id`` is a backfill run's (``run_id_for(..., suffix=BACKFILL_SUFFIX)``).
    Backfill runs never count as their schedule's runs in progress (overlap policies)."""
    return run_id.endswith("~" + BACKFILL_SUFFIX)


MAX_REQUEST_ID_CHARS = 128


def validate_request_id(value: str, field_name: str = "request_id") -> str:
    """A client's idempotency key: any text up to 128 characters."""
    if len(value) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(
            field_name, f"is {len(value)} characters; the limit is {MAX_REQUEST_ID_CHARS}"
        )
    return value


def validate_schedule_id(value: str, field_name: str = "schedule_id") -> str:
    if not _ID.match(value):
        raise InvalidArgument(
            field_name,
            f"{value!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit",
        )
    return value


def validate_handler(value: str) -> str:
    if not value:
        raise InvalidArgument("schedule.handler", "is required")
    if not _HANDLER.match(value):
        raise InvalidArgument(
            "schedule.handler",
            f"{value!r} must start with a letter or '_' and hold only letters, digits and ._:-",
        )
    return value


def validate_payload(payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            "schedule.payload",
            f"is {len(payload)} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes",
        )
    return payload


# A generation is the milliseconds since the epoch when it was minted, shifted left by this many
# bits, with that many random bits below: 63 bits in all (a signed bigint) until the year 2248.
_GENERATION_RANDOM_BITS = 20


def new_generation() -> int:
    """A fresh fire token for a change to a schedule (decision 0002): unique to the change, and
    ordered by the wall-clock time it was minted (``generation_minted``), so that a dispatcher
    can tell a timer of a change still being written from one a later change superseded."""
    ms = int(datetime.now(UTC).timestamp() * 1000)
    return (ms << _GENERATION_RANDOM_BITS) | secrets.randbits(_GENERATION_RANDOM_BITS)


def generation_minted(generation: int) -> datetime:
    """When ``generation`` was minted by ``new_generation``. A generation minted before time
    entered it (a random 63-bit number) decodes to a meaningless time, mostly in the future."""
    ms = generation >> _GENERATION_RANDOM_BITS
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def day_of(t: datetime) -> int:
    """The UTC day number (days since the epoch) of ``t``: the run history partition."""
    return int(t.timestamp()) // 86400


def aware(t: datetime | None) -> datetime | None:
    """Cassandra hands back naive UTC datetimes (or null); make them aware."""
    return None if t is None else aware_utc(t)


class FollowUp(enum.Enum):
    """Whether the API has work to do when a run ends (RunMessage.follow_up)."""

    UNKNOWN = 0
    NONE = 1
    REQUIRED = 2


@dataclass(frozen=True, kw_only=True)
class RunEventRecord:
    """A worker's report about one run, as the store applies it (status None = heartbeat)."""

    run_id: str
    schedule_id: str
    scheduled_for: datetime
    status: RunStatus | None
    event_time: datetime
    attempt: int = 1
    worker_id: str = ""
    error: str = ""
    # Echoed from the run message: when it was enqueued, and whether anything follows its end.
    enqueue_time: datetime | None = None
    follow_up: FollowUp = FollowUp.UNKNOWN
    # An outcome that also stands for the start (the worker merged both events).
    start_time: datetime | None = None
    # A failure the handler declared hopeless (dead-lettered at once), or one whose handler
    # asked for its next attempt after this delay.
    non_retryable: bool = False
    retry_after: timedelta | None = None
    # Echoed from the run message: when the attempt's lease timer is due (None: no lease).
    lease_expire_time: datetime | None = None
    # A STARTED whose worker asks first whether the attempt has run already (RunEvent.check_done).
    check_done: bool = False
    # Echoed from the run message: when the schedule's next fire timer is due, on whose row the
    # run's end is noted while that timer is at least ``DONE_NOTE_LEAD`` away (None: not set).
    next_fire_time: datetime | None = None

    def done_noted_on_timer(self, now: datetime) -> bool:
        """Whether this event's end of run goes on the next fire timer's row instead of the
        schedule row: a terminal event of a run whose message named that timer, recorded while
        the timer is still far enough from due that no scanner can have read it."""
        return (
            self.status is not None
            and self.status is not RunStatus.RUNNING
            and self.next_fire_time is not None
            and now + DONE_NOTE_LEAD < self.next_fire_time
        )
