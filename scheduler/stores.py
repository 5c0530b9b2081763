"""The control plane's storage and queue boundary: what the firing path, run reporting and
retries need from a store, as Protocols with their contracts (the Cassandra classes in
``scheduler.cassandra``, ``scheduler.dead_letters`` and ``bucketer.cassandra`` implement them;
only those know CQL; ``session.open_stores`` builds them all in one place).

Hot-path writes are *items* (``bucketer.cql.Write``: a partition key, a statement, its values)
that callers collect from several stores and hand to one ``write`` call, which sends them
grouped by partition in unlogged batches, many in flight: no store method on the firing path
costs a round trip of its own per run.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from bucketer.cql import Write
from bucketer.model import Timer
from scheduler.dead_letters import Attempt, DeadLetter
from scheduler.kafka import Keyed
from scheduler.model import Run, RunEventRecord, Schedule


class TimerStore(Protocol):
    """The durable timer wheel (bucketer.cassandra.CassandraTimerStore)."""

    shard_count: int

    async def put(self, timers: Iterable[Timer], *, now: datetime | None = None) -> None:
        """Writes timers; a fire time in the past is moved to ``now`` (a timer is never put
        where no scanner reads any more). Idempotent per (fire time, timer id)."""
        ...

    def rows(self, timers: Iterable[Timer], *, now: datetime | None = None) -> list[Write]:
        """``put`` as write items, for a caller that writes them with other rows."""
        ...

    async def repeat_if_slow(self, timers: Iterable[Timer], *, written_at: datetime) -> None:
        """After a caller's grouped write of ``rows(timers, now=written_at)``: puts the due ones
        again at a fresh now if the write ended too late for the scanners' grace window."""
        ...

    def settle_rows(self, timers: Iterable[Timer], *, now: datetime) -> list[Write]:
        """Items that make not-yet-due timers (written with a ``stamp``) inert in place, so
        they never fire, whichever write lands first; no tombstone."""
        ...

    async def read(self, timer: Timer) -> Timer | None:
        """The live timer stored at ``timer``'s place, or None (repair checks only)."""
        ...

    def done_rows(self, notes: Iterable[tuple[Timer, str]], *, now: datetime) -> list[Write]:
        """Items noting a run id in the ``done_run`` cell of timers not yet due (each given by
        its place), read back with the timer; a place with no timer gets a row scanners skip."""
        ...


class ScheduleStore(Protocol):
    """Schedules as the firing path and run reporting see them."""

    async def get_many(self, ids: Sequence[str]) -> dict[str, Schedule]:
        """The schedules among ``ids`` that exist, in one multi-partition read."""
        ...

    async def changes(self, since: datetime, until: datetime) -> Sequence[tuple[datetime, str]]:
        """The changes announced between ``since`` and ``until`` (when, schedule id): every
        change to a schedule's state, generation, spec, policies, handler, payload or dependents
        is announced before it is written."""
        ...

    def mark_active(self, schedule_id: str, run_id: str, now: datetime) -> Write:
        """Item: ``run_id`` is the schedule's run in progress, ordered by ``now`` (the enqueue
        instant), never by arrival."""
        ...

    def touch_active(self, schedule_id: str, now: datetime) -> Write:
        """Item: the schedule's run in progress showed a sign of life at ``now`` (a heartbeat),
        or will at ``now`` (its retry's due time)."""
        ...

    def set_buffered(self, schedule_id: str, buffered_json: str) -> Write:
        """Item: the run BUFFER_ONE holds back."""
        ...

    def record_completed(self, schedule_id: str, last_slot: datetime) -> Write:
        """Item: the schedule can never fire again (its last slot fired)."""
        ...

    async def quarantine(self, timer: Timer, error: str, now: datetime) -> None:
        """Sets a poison timer aside with its error, shown on its schedule."""
        ...


class RunStore(Protocol):
    """Run history: rows ordered by (attempt, status rank), never by a clock."""

    async def write(self, items: Sequence[Write]) -> None:
        """Writes items (of any store) grouped by partition."""
        ...

    def insert_rows(self, runs: Iterable[Run]) -> list[Write]:
        """Items recording runs ENQUEUED or SKIPPED at their own cell time."""
        ...

    def cancel_rows(self, run_ids: Iterable[str]) -> list[Write]:
        """Items asking the runs' workers to cancel them (seen at a heartbeat)."""
        ...

    async def record_events(
        self, events: Sequence[RunEventRecord], *, now: datetime, also: Sequence[Write] = ()
    ) -> None:
        """Applies workers' reports (and ``also``) in one grouped write."""
        ...

    def event_rows(
        self, events: Sequence[RunEventRecord], *, now: datetime, retried: Collection[str] = ()
    ) -> list[Write]:
        """``record_events`` as items; a failed attempt of a run among ``retried`` (its retry
        follows) leaves the run in progress on its schedule."""
        ...

    def retry_at_row(self, run_id: str, failed_attempt: int, at: datetime) -> Write:
        """Item: the retry after ``failed_attempt`` is due ``at`` (a later time wins)."""
        ...

    def dead_letter_row(self, e: RunEventRecord) -> Write:
        """Item: the run is DEAD_LETTERED after its last attempt ``e``."""
        ...

    def attempt_rows(self, failed: Iterable[RunEventRecord]) -> list[Write]:
        """Items keeping failed attempts (a dead letter's history)."""
        ...

    async def attempts(self, run_id: str) -> list[Attempt]:
        """The run's failed attempts, oldest first."""
        ...

    async def get_many(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The runs among ``run_ids`` that exist: one read each, so only for the few runs
        whose lease came due unsettled or whose retry is due."""
        ...

    async def delivered(self, attempts: Mapping[str, int]) -> set[str]:
        """Which runs a worker has taken at the given attempt or a later one (for timers a new
        shard owner may fire again)."""
        ...

    async def ended(
        self, run_ids: Sequence[str], *, now: datetime, stale_after: timedelta
    ) -> set[str]:
        """Which runs have ended (latest attempt over with no retry pending, or skipped): one
        read each, for the few runs a schedule row shows in progress while their end was noted
        on a fire timer."""
        ...

    async def still_running(
        self, run_ids: Sequence[str], *, now: datetime, stale_after: timedelta
    ) -> set[str]:
        """Which runs are still in progress by their run rows (not ended, a sign of life
        within ``stale_after``; no row yet: within ``stale_after`` of the slot): one read each,
        for the runs a fire timer carries when its slot cannot be decided from the cache."""
        ...

    async def running_of(
        self, schedule_id: str, *, now: datetime, stale_after: timedelta
    ) -> list[str]:
        """The schedule's runs in progress by its recent run rows (backfills left out): for
        API calls that weigh them, never for a firing."""
        ...

    async def cancel_requested(self, run_ids: Sequence[str]) -> set[str]:
        """Which runs an operator or CANCEL_PREVIOUS asked to cancel."""
        ...

    async def finished(self, attempts: Mapping[str, int]) -> set[str]:
        """Which runs have an outcome recorded for the given attempt, or a later attempt (for
        the few messages a worker may be running again, never for every run)."""
        ...

    async def clear_buffered(self, schedule_id: str, buffered_json: str) -> bool:
        """Takes the held-back run off the schedule, once."""
        ...


class DeadLetterStore(Protocol):
    """Runs whose last attempt failed."""

    def rows(self, d: DeadLetter) -> list[Write]:
        """Items storing ``d`` (idempotent)."""
        ...


class DeadLetterReader(Protocol):
    """Dead letters as the dispatcher publishes them."""

    async def get(self, run_id: str, history: Sequence[Attempt] = ()) -> DeadLetter:
        """The dead letter of ``run_id`` (NotFound if none), with ``history`` attached."""
        ...


class RunQueue(Protocol):
    """The run topics (scheduler.kafka.KafkaRunQueue)."""

    async def enqueue(self, topic: str, messages: Sequence[Keyed]) -> None:
        """Produces every message, acknowledged by all in-sync replicas, or raises."""
        ...
