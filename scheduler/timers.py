"""What the control plane stores in a timer.

Two kinds: a ``FireTimer`` is a schedule's pending slot (which schedule, which slot, which
generation, how many runs fired before it); a ``RunTimer`` is one prepared run the dispatcher
should enqueue as soon as it is due (a manual trigger, a rerun, a run BUFFER_ONE held back, a
dependent run, a backfill slot). Both are versioned JSON in the timer's ``data``. A third,
``BackfillTimer``, drives one backfill: each time it is due the dispatcher enqueues the next
slots its concurrency allows (``scheduler.backfill``) and puts it again a moment later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bucketer.keys import shard_of
from bucketer.model import Timer, from_micros, micros
from scheduler.model import UnsupportedVersion

FIRE = "fire"
RUN = "run"
BACKFILL = "backfill"
LEASE = "lease"
DEAD_LETTER = "dlq"
_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class FireTimer:
    """A schedule's pending firing.

    ``slot`` is the spec's time (what the next slot is computed from); ``scheduled_for`` is the
    slot plus the schedule's jitter (when it fires, and what its run id derives from).
    ``fired`` counts the runs fired before this slot (for ``max_runs``). ``deferred_ms`` is how
    long the tenant's enqueue quota has put this slot off so far (it is due that much after
    ``scheduled_for``); ``quota_behind`` marks a slot already past when its timer was written
    by a deferred firing. Neither kind of lateness is a misfire (scheduler.fairness).
    """

    schedule_id: str
    generation: int
    slot: datetime
    scheduled_for: datetime
    fired: int = 0
    deferred_ms: int = 0
    quota_behind: bool = False
    # Put off last by the concurrent-runs cap, which books nothing ahead (a rate deferral
    # books the slot's token): admitted afresh when due.
    capped: bool = False
    # The schedule's tenant: the timer's lane when a backlog is dispatched round-robin
    # across tenants (bucketer.lanes); "" in timers written before it was recorded.
    tenant: str = ""
    # The lease of the run fired at the previous slot, carried here instead of written as a
    # timer of its own: the slot comes due before the lease does, and the dispatcher that
    # fires it settles the lease from the schedule row it reads anyway (the run finished) or
    # writes it as a lease timer then (scheduler.firing, "carried leases").
    lease: LeaseTimer | None = None
    # The first timer of a change (create, update, resume, a repair): stored in a row of its
    # own, id "<schedule id>~<generation>", not under the schedule id its chain's timers share.
    # At the slot of the timer it supersedes, a shared row was overwritten after a scanner had
    # read the old timer; the scanner hands a position once, so the change's timer was never
    # handed, the old one was dropped as superseded, and the schedule stopped until a repair.
    first: bool = False
    # The schedule's runs in progress when this timer was written, marked here instead of on
    # the schedule row (decision 0013): the run fired at the previous slot, or the ones still in
    # progress when that slot was skipped for them; for a change's first timer, those the API
    # found in progress. Weighed by the overlap policy when the slot cannot be decided from the
    # dispatcher's cache, after a look at their run rows.
    running: tuple[str, ...] = ()

    @property
    def held_by_quota(self) -> bool:
        return self.deferred_ms > 0 or self.quota_behind

    def to_timer(self, shard_count: int) -> Timer:
        doc: dict[str, Any] = {
            "v": _VERSION,
            "g": self.generation,
            "slot_us": micros(self.slot),
            "at_us": micros(self.scheduled_for),
            "n": self.fired,
        }
        if self.deferred_ms:
            doc["d_ms"] = self.deferred_ms
        if self.quota_behind:
            doc["qb"] = True
        if self.capped:
            doc["cc"] = True
        if self.tenant:
            doc["t"] = self.tenant
        if self.lease is not None:
            doc["pl"] = [
                self.lease.run_id,
                self.lease.attempt,
                micros(self.lease.fire_at),
                self.lease.stamp,
            ]
        if self.running:
            doc["rn"] = list(self.running)
        fire_at = self.scheduled_for + timedelta(milliseconds=self.deferred_ms)
        timer_id = first_timer_id(self.schedule_id, self.generation) if self.first else None
        return _timer(
            FIRE, self.schedule_id, timer_id or self.schedule_id, fire_at, doc, shard_count
        )

    @classmethod
    def from_timer(cls, timer: Timer) -> FireTimer:
        doc = _load(timer)
        lease = None
        if "pl" in doc:
            run_id, attempt, fire_us, stamp = doc["pl"]
            lease = LeaseTimer(
                schedule_id=timer.key,
                run_id=str(run_id),
                attempt=int(attempt),
                fire_at=from_micros(int(fire_us)),
                stamp=None if stamp is None else int(stamp),
            )
        return cls(
            schedule_id=timer.key,
            generation=int(doc["g"]),
            slot=from_micros(doc["slot_us"]),
            scheduled_for=from_micros(doc["at_us"]),
            fired=int(doc.get("n", 0)),
            deferred_ms=int(doc.get("d_ms", 0)),
            quota_behind=bool(doc.get("qb", False)),
            capped=bool(doc.get("cc", False)),
            tenant=str(doc.get("t", "")),
            lease=lease,
            first=timer.timer_id != timer.key,
            running=tuple(map(str, doc.get("rn", ()))),
        )


@dataclass(frozen=True, kw_only=True)
class RunTimer:
    """One prepared run to enqueue when due (not subject to the schedule's slots)."""

    schedule_id: str
    run_id: str
    scheduled_for: datetime
    fire_at: datetime
    manual: bool = False
    origin_run_id: str = ""
    backfill_id: str = ""
    # Above 1: a retry of the run (scheduler.retries).
    attempt: int = 1
    # How long the tenant's quotas have put it off so far (scheduler.fairness), and whether
    # the concurrent-runs cap did it last (see FireTimer.capped).
    deferred_ms: int = 0
    capped: bool = False
    # The schedule's tenant (see FireTimer.tenant).
    tenant: str = ""

    def to_timer(self, shard_count: int) -> Timer:
        doc: dict[str, Any] = {
            "v": _VERSION,
            "run": self.run_id,
            "at_us": micros(self.scheduled_for),
            "manual": self.manual,
        }
        if self.origin_run_id:
            doc["origin"] = self.origin_run_id
        if self.backfill_id:
            doc["backfill"] = self.backfill_id
        if self.deferred_ms:
            doc["d_ms"] = self.deferred_ms
        if self.capped:
            doc["cc"] = True
        if self.tenant:
            doc["t"] = self.tenant
        timer_id = self.run_id
        if self.attempt > 1:
            doc["attempt"] = self.attempt
            timer_id = f"{self.run_id}#{self.attempt}"
        # The run id (and attempt) is the timer id: putting the same run twice is one timer.
        return _timer(RUN, self.schedule_id, timer_id, self.fire_at, doc, shard_count)

    @classmethod
    def from_timer(cls, timer: Timer) -> RunTimer:
        doc = _load(timer)
        return cls(
            schedule_id=timer.key,
            run_id=doc["run"],
            scheduled_for=from_micros(doc["at_us"]),
            fire_at=timer.fire_time,
            manual=bool(doc.get("manual", False)),
            origin_run_id=doc.get("origin", ""),
            backfill_id=doc.get("backfill", ""),
            attempt=int(doc.get("attempt", 1)),
            deferred_ms=int(doc.get("d_ms", 0)),
            capped=bool(doc.get("cc", False)),
            tenant=str(doc.get("t", "")),
        )


@dataclass(frozen=True, kw_only=True)
class LeaseTimer:
    """The lease of one enqueued attempt: due ``fire_at``, when the attempt should have
    finished or at least still be heartbeating (scheduler.retries).

    Written with the run's first message, at the enqueue instant (``stamp``, µs) as its write
    timestamp; the API settles it (``CassandraTimerStore.settle_rows``) when the attempt's
    outcome arrives, so a run that finishes in time costs no read when its lease comes due.
    A run fired from a slot whose schedule's next slot comes due first has its lease carried
    by that next fire timer instead (``FireTimer.lease``), and written only if it is still
    unsettled then.
    It carries no data: the run id and attempt are in its timer id, the rest is on the run row
    its check reads anyway (one written per firing, so it costs no JSON either way).
    """

    schedule_id: str
    run_id: str
    attempt: int
    fire_at: datetime
    stamp: int | None = None

    def to_timer(self, shard_count: int) -> Timer:
        return Timer(
            fire_time=self.fire_at,
            timer_id=f"{self.run_id}{_LEASE_MARK}{self.attempt}",
            shard=shard_of(self.schedule_id, shard_count),
            kind=LEASE,
            key=self.schedule_id,
            stamp=self.stamp,
        )

    @classmethod
    def from_timer(cls, timer: Timer) -> LeaseTimer:
        run_id, mark, attempt = timer.timer_id.rpartition(_LEASE_MARK)
        if not mark or not attempt.isdigit():
            raise ValueError(f"not a lease timer id: {timer.timer_id!r}")
        return cls(
            schedule_id=timer.key,
            run_id=run_id,
            attempt=int(attempt),
            fire_at=timer.fire_time,
        )


_LEASE_MARK = "#lease"


@dataclass(frozen=True, kw_only=True)
class DeadLetterTimer:
    """A dead letter to publish on the dead-letter topic: written with the dead letter's rows
    by whoever dead-lettered the run (the API, or a dispatcher's lease check), fired by a
    dispatcher, which produces it. So no API replica talks to Kafka, and a Kafka outage only
    delays the message: the timer is fired again until the produce succeeds."""

    schedule_id: str
    run_id: str
    fire_at: datetime

    def to_timer(self, shard_count: int) -> Timer:
        return _timer(
            DEAD_LETTER,
            self.schedule_id,
            f"{self.run_id}#dlq",
            self.fire_at,
            {"v": _VERSION, "run": self.run_id},
            shard_count,
        )

    @classmethod
    def from_timer(cls, timer: Timer) -> DeadLetterTimer:
        doc = _load(timer)
        return cls(schedule_id=timer.key, run_id=doc["run"], fire_at=timer.fire_time)


@dataclass(frozen=True, kw_only=True)
class BackfillTimer:
    """The next step of a backfill. ``tick`` must equal the backfill row's ``tick`` or the
    timer is stale (a duplicate after a crash) and dropped; each step advances both by one."""

    backfill_id: str
    tick: int
    fire_at: datetime

    def to_timer(self, shard_count: int) -> Timer:
        doc = {"v": _VERSION, "tick": self.tick}
        return _timer(
            BACKFILL,
            self.backfill_id,
            f"{self.backfill_id}#{self.tick}",
            self.fire_at,
            doc,
            shard_count,
        )

    @classmethod
    def from_timer(cls, timer: Timer) -> BackfillTimer:
        doc = _load(timer)
        return cls(backfill_id=timer.key, tick=int(doc["tick"]), fire_at=timer.fire_time)


# The tenant in a timer's document, when it holds no escaped character (the documents are
# written compact, and no other key ends in "t").
_TENANT = re.compile(rb'[{,]"t":"([^"\\]*)"[,}]')


def tenant_of(timer: Timer) -> str:
    """The tenant a fire or run timer fires for ("" for other kinds, and for timers written
    before tenants were recorded on them).

    Read without decoding the whole document when the tenant needs no unescaping: a deep
    backlog's fair order asks for every due timer's tenant each round (~0.5 µs a timer, where
    ``json.loads`` took ~4 µs)."""
    if timer.kind not in (FIRE, RUN) or b'"t":' not in timer.data:
        return ""
    plain = _TENANT.search(timer.data)
    if plain is not None:
        return plain.group(1).decode()
    try:
        return str(json.loads(timer.data).get("t", ""))
    except ValueError:
        return ""  # poison is the firing path's to quarantine, not the fairness order's


def first_timer_id(schedule_id: str, generation: int) -> str:
    """The id of the first fire timer of the change that minted ``generation``."""
    return f"{schedule_id}~{generation}"


def fire_timer_place(schedule_id: str, fire_at: datetime, shard_count: int) -> Timer:
    """Where a schedule's fire timer due ``fire_at`` (not put off by a quota) is stored: its id
    is the schedule's (``FireTimer.to_timer``). For a note left on it before it is due: its
    place alone, no data."""
    return _timer(FIRE, schedule_id, schedule_id, fire_at, None, shard_count)


# ``json.dumps`` with any argument builds a new encoder per call: one, built once.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _timer(
    kind: str,
    key: str,
    timer_id: str,
    fire_at: datetime,
    doc: dict[str, Any] | None,
    shard_count: int,
) -> Timer:
    """A timer of ``kind`` for ``key``; ``doc`` None: a place only, no data."""
    return Timer(
        fire_time=fire_at,
        timer_id=timer_id,
        shard=shard_of(key, shard_count),
        kind=kind,
        key=key,
        data=b"" if doc is None else _encode(doc).encode(),
    )


def _load(timer: Timer) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(timer.data)
    if doc.get("v", 0) > _VERSION:
        raise UnsupportedVersion(f"{timer.kind} timer version {doc['v']} is newer than {_VERSION}")
    return doc
