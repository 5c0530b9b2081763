"""Dependencies between schedules: ``after`` edges, their reverse ``downstream`` sets, cycles.

A schedule's ``after`` set names the schedules it runs after (its upstreams); it is the source
of truth. Each upstream keeps the reverse edge in its ``downstream`` set, so that a success
report of one of its runs (``scheduler.reports``) knows whom to fire without a scan. The graph
is a DAG: a schedule can never (transitively) run after itself.

Write order, so that a crash between two writes is harmless:

- create: the schedule row first, then ``downstream += id`` on each upstream. A crash in
  between leaves a schedule that does not fire after its upstreams yet (the create call failed;
  the caller retries or deletes it); never an upstream firing a schedule that does not exist.
- delete: the schedule row first, then ``downstream -= id`` on each upstream. A crash in between
  leaves a dangling id in an upstream's ``downstream`` set; the dispatcher drops a dependent run
  whose schedule is gone or no longer lists that upstream in ``after``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cassandra.cluster import Session

from bucketer.cql import Queries, Write, write_grouped
from scheduler.cassandra import CassandraScheduleStore
from scheduler.errors import FailedPrecondition, InvalidArgument
from scheduler.model import Schedule, validate_schedule_id

logger = logging.getLogger(__name__)

FIELD = "schedule.after"
# Upstreams one schedule may name, and schedules one cycle check may visit.
MAX_UPSTREAMS = 100
MAX_GRAPH_WALK = 100_000


@dataclass(frozen=True, kw_only=True, order=True)
class Edge:
    """``downstream_id`` runs after each successful run of ``upstream_id``."""

    upstream_id: str
    downstream_id: str


def find_cycle(
    schedule_id: str, after: Iterable[str], upstreams: Mapping[str, Iterable[str]]
) -> list[str] | None:
    """The shortest cycle through ``schedule_id`` if it ran after ``after``, or None.

    ``upstreams`` maps other schedules to their ``after`` sets (missing ones have none; the
    entry of ``schedule_id`` itself is ignored, ``after`` replaces it). The cycle is returned in
    firing order, upstream first, starting and ending with ``schedule_id``: for ``x`` after
    ``y`` and ``y`` after ``x`` it is ``[x, y, x]``.
    """
    parent: dict[str, str] = {}
    queue: deque[str] = deque()
    for up in sorted(set(after)):
        if up == schedule_id:
            return [schedule_id, schedule_id]
        parent[up] = schedule_id
        queue.append(up)
    while queue:
        node = queue.popleft()
        for up in sorted(set(upstreams.get(node, ()))):
            if up == schedule_id:
                chain = [node]
                while chain[-1] != schedule_id:
                    chain.append(parent[chain[-1]])
                return [schedule_id, *chain]
            if up not in parent:
                parent[up] = node
                queue.append(up)
    return None


def format_cycle(cycle: Sequence[str]) -> str:
    """``a -> b -> a``."""
    return " -> ".join(cycle)


class DependencyGraph:
    """Validation and upkeep of the ``after``/``downstream`` edges of stored schedules."""

    def __init__(self, schedules: CassandraScheduleStore, session: Session) -> None:
        self._schedules = schedules
        self._session = session
        self._q = Queries(
            session, Path(__file__).with_name("dependencies.cql"), keyspace=schedules.q.keyspace
        )

    async def validate(self, s: Schedule, *, field: str = FIELD) -> None:
        """Checks ``s.after`` before ``s`` is stored (create or update): every upstream is a
        stored schedule of the same tenant (another tenant's is "unknown"), and no cycle
        forms. Raises InvalidArgument naming ``field``; reads the upstream closure breadth
        first, one batched read per level."""
        if not s.after:
            return
        if len(s.after) > MAX_UPSTREAMS:
            raise InvalidArgument(
                field, f"names {len(s.after)} schedules; at most {MAX_UPSTREAMS} are allowed"
            )
        for up in sorted(s.after):
            if not up:
                raise InvalidArgument(field, "holds an empty schedule id")
            validate_schedule_id(up, field)
            if s.schedule_id and up == s.schedule_id:
                raise InvalidArgument(
                    field, f"cycle {format_cycle([up, up])}: a schedule cannot run after itself"
                )
        found = await self._schedules.get_many(sorted(s.after))
        for up in sorted(s.after):
            other = found.get(up)
            # Another tenant's schedule answers as a missing one: its existence is not ours
            # to learn.
            if other is None or other.tenant != s.tenant:
                raise InvalidArgument(field, f"unknown schedule {up!r}")
        if s.schedule_id:
            await self.check_no_cycle(s.schedule_id, s.after, field=field, known=found)

    async def check_no_cycle(
        self,
        schedule_id: str,
        after: Iterable[str],
        *,
        field: str = FIELD,
        known: Mapping[str, Schedule] | None = None,
    ) -> None:
        """InvalidArgument(``field``, ``cycle a -> b -> a``) if ``schedule_id`` running after
        ``after`` closes a cycle. Walks the stored ``after`` sets upstream breadth first, one
        batched ``get_many`` per level (UpdateSchedule calls this with the new ``after``)."""
        graph = await self._upstream_graph(set(after), known or {})
        cycle = find_cycle(schedule_id, after, graph)
        if cycle is not None:
            raise InvalidArgument(field, f"cycle {format_cycle(cycle)}")

    async def _upstream_graph(
        self, roots: set[str], known: Mapping[str, Schedule]
    ) -> dict[str, frozenset[str]]:
        graph: dict[str, frozenset[str]] = {sid: s.after for sid, s in known.items()}
        frontier = {r for r in roots if r not in graph}
        for s in graph.values():
            frontier |= {u for u in s if u not in graph}
        while frontier:
            if len(graph) + len(frontier) > MAX_GRAPH_WALK:
                raise FailedPrecondition(
                    f"the dependency graph upstream of this schedule exceeds {MAX_GRAPH_WALK} "
                    "schedules; cycle check refused"
                )
            fetched = await self._schedules.get_many(sorted(frontier))
            for sid in frontier:
                graph[sid] = fetched[sid].after if sid in fetched else frozenset()
            frontier = {u for sid in fetched for u in fetched[sid].after if u not in graph}
        return graph

    async def link(self, schedule_id: str, upstreams: Iterable[str]) -> None:
        """Adds ``schedule_id`` to each upstream's ``downstream`` set (grouped writes)."""
        await self._set_downstream("add_downstream", schedule_id, upstreams)

    async def unlink(self, schedule_id: str, upstreams: Iterable[str]) -> None:
        """Removes ``schedule_id`` from each upstream's ``downstream`` set (grouped writes)."""
        await self._set_downstream("remove_downstream", schedule_id, upstreams)

    async def _set_downstream(self, query: str, schedule_id: str, upstreams: Iterable[str]) -> None:
        ups = sorted(set(upstreams))
        await self._schedules.announced(
            ups,
            lambda: write_grouped(
                self._session, [Write(up, self._q[query], ({schedule_id}, up)) for up in ups]
            ),
        )

    async def relink(
        self, schedule_id: str, old_after: Iterable[str], new_after: Iterable[str]
    ) -> None:
        """After an update changed ``after``: adds the new reverse edges, drops the old ones."""
        old, new = set(old_after), set(new_after)
        await self.link(schedule_id, new - old)
        await self.unlink(schedule_id, old - new)

    async def dependents(self, s: Schedule) -> list[str]:
        """The stored schedules that run after ``s`` (its ``downstream`` set, dangling ids
        and stale edges filtered out by reading them)."""
        if not s.downstream:
            return []
        found = await self._schedules.get_many(sorted(s.downstream))
        return sorted(d for d, other in found.items() if s.schedule_id in other.after)

    async def check_deletable(self, s: Schedule) -> None:
        """FailedPrecondition naming the schedules that still run after ``s``."""
        deps = await self.dependents(s)
        if deps:
            names = ", ".join(repr(d) for d in deps)
            raise FailedPrecondition(
                f"schedule {s.schedule_id!r} has dependents ({names} run after it); delete "
                "them or remove it from their `after` first"
            )

    async def edges(self, schedule_id: str) -> list[Edge]:
        """Edges upstream -> downstream touching ``schedule_id``: its ``after`` set and its
        (verified) dependents, two reads."""
        s = await self._schedules.get(schedule_id)
        out = {Edge(upstream_id=u, downstream_id=schedule_id) for u in s.after}
        out |= {Edge(upstream_id=schedule_id, downstream_id=d) for d in await self.dependents(s)}
        return sorted(out)

    async def edges_page(self, page_size: int, page_token: str) -> tuple[list[Edge], str]:
        """The edges into the schedules of one page of the schedules table (``page_size``
        schedules scanned), and the next page's token ('' when done): every edge once over
        all pages, each call bounded."""
        page, token = await self._schedules.list(page_size, page_token)
        edges = {Edge(upstream_id=u, downstream_id=s.schedule_id) for s in page for u in s.after}
        return sorted(edges), token
