"""Cassandra plumbing shared by the stores: named queries, asyncio bridging, grouped writes.

Queries live in ``*.cql`` files as named blocks (``-- name: put_timer``), parsed once and
prepared by name, so a store reads as a list of named queries.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import operator
import re
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, cast

from cassandra import (
    ConsistencyLevel,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    Session,
)
from cassandra.cqltypes import DateType
from cassandra.marshal import int64_pack
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.protocol import OverloadedErrorMessage
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
)

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)

# Rows per unlogged batch: large enough to amortize the request, small enough to stay well
# under batch_size_fail_threshold with typical timer and run rows.
BATCH_ROWS = 100


Params = Sequence[Any] | Mapping[str, Any]
"""Statement parameters: positional for ``?`` markers, by name for ``:name`` markers."""


class Write(NamedTuple):
    """One row write for :func:`write_grouped`: the partition it lands in (any hashable that
    names it), the prepared statement and its parameters."""

    partition: Any
    statement: PreparedStatement
    params: Params


class StorageUnavailable(Exception):
    """Cassandra could not be reached or did not answer."""


# Driver errors that say Cassandra was unreachable, overloaded or slow: retrying may succeed.
TRANSIENT_STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    StorageUnavailable,
    OperationTimedOut,
    NoHostAvailable,
    Unavailable,
    ReadTimeout,
    WriteTimeout,
    OverloadedErrorMessage,
)


def parse_named_queries(text: str) -> dict[str, str]:
    """Splits a ``.cql`` file into ``{name: statement}`` by its ``-- name:`` markers."""
    matches = list(_NAME.finditer(text))
    queries: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = "\n".join(
            line for line in text[m.end() : end].splitlines() if not line.strip().startswith("--")
        ).strip()
        body = body.rstrip(";").strip()
        if not body:
            raise ValueError(f"query {m['name']!r} is empty")
        if m["name"] in queries:
            raise ValueError(f"query {m['name']!r} is defined twice")
        queries[m["name"]] = body
    return queries


_TABLE = re.compile(r"\b(FROM|INTO|UPDATE)\s+([a-z_][a-z0-9_]*)\b(?!\.)", re.IGNORECASE)


def qualify(cql: str, keyspace: str) -> str:
    """Prefixes the table of a statement with the keyspace.

    The ``.cql`` files name tables bare so one file serves every keyspace (tests use one each);
    Cassandra 5 warns about prepared statements that rely on a session keyspace.
    """
    return _TABLE.sub(lambda m: f"{m[1]} {keyspace}.{m[2]}", cql, count=1)


class Queries:
    """Named statements of one ``.cql`` file, prepared once against a session."""

    def __init__(self, session: Session, path: Path, *, keyspace: str) -> None:
        self.keyspace = keyspace
        self._statements: dict[str, PreparedStatement] = {}
        for name, cql in parse_named_queries(path.read_text()).items():
            self._statements[name] = session.prepare(qualify(cql, keyspace))

    def __getitem__(self, name: str) -> PreparedStatement:
        return self._statements[name]


@functools.lru_cache(maxsize=512)
def _row_class(names: tuple[str, ...]) -> Any:
    clean = [re.sub(r"\W", "_", n).strip("_") or f"c{i}" for i, n in enumerate(names)]
    return collections.namedtuple("Row", clean, rename=True)


def cached_named_tuple_factory(colnames: Sequence[str], rows: Sequence[Any]) -> list[Any]:
    """Rows as named tuples, like the driver's default factory, but with the row class made
    once per distinct column list: the default builds a new ``namedtuple`` class for every
    result set, which profiled at ~4% of a dispatcher's CPU."""
    cls = _row_class(tuple(colnames))
    return [cls._make(r) for r in rows]


@dataclass(frozen=True, kw_only=True)
class CassandraSecurity:
    """How a process authenticates to Cassandra and encrypts the connection. The local stack
    is plain (the default); a production cluster sets ``CRONSCALE_CASSANDRA_USERNAME`` and
    ``CRONSCALE_CASSANDRA_PASSWORD`` (PasswordAuthenticator), ``CRONSCALE_CASSANDRA_TLS_CA_FILE``
    (PEM: TLS on, each node's certificate verified against it; node addresses come from the
    cluster's own tables, so host names are not matched) and, for client certificates,
    ``CRONSCALE_CASSANDRA_TLS_CERT_FILE`` with ``CRONSCALE_CASSANDRA_TLS_KEY_FILE``."""

    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.username) != bool(self.password):
            raise ValueError(
                "CRONSCALE_CASSANDRA_USERNAME and CRONSCALE_CASSANDRA_PASSWORD are set together "
                "or not at all"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError(
                "CRONSCALE_CASSANDRA_TLS_CERT_FILE and CRONSCALE_CASSANDRA_TLS_KEY_FILE are set "
                "together or not at all"
            )
        if self.cert_file and not self.ca_file:
            raise ValueError(
                "CRONSCALE_CASSANDRA_TLS_CERT_FILE needs CRONSCALE_CASSANDRA_TLS_CA_FILE (TLS on)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CassandraSecurity:
        def get(name: str) -> str:
            return env.get(f"CRONSCALE_CASSANDRA_{name}", "").strip()

        return cls(
            username=get("USERNAME"),
            password=env.get("CRONSCALE_CASSANDRA_PASSWORD", ""),
            ca_file=get("TLS_CA_FILE"),
            cert_file=get("TLS_CERT_FILE"),
            key_file=get("TLS_KEY_FILE"),
        )

    def cluster_options(self) -> dict[str, Any]:
        """Keyword arguments for the driver's ``Cluster``."""
        options: dict[str, Any] = {}
        if self.username:
            options["auth_provider"] = PlainTextAuthProvider(self.username, self.password)
        if self.ca_file:
            context = ssl.create_default_context(cafile=self.ca_file)
            context.check_hostname = False  # nodes are addressed by IP, from system.peers
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
            options["ssl_context"] = context
        return options


def connect(
    hosts: Sequence[str],
    port: int,
    keyspace: str | None = None,
    *,
    security: CassandraSecurity | None = None,
) -> Session:
    """Opens a token-aware session; raises StorageUnavailable with how to start Cassandra."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=10.0,
        row_factory=cached_named_tuple_factory,
    )
    cluster = Cluster(
        contact_points=list(hosts),
        port=port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        # v4, not v5: v5 frames every request and response in checksummed segments, which the
        # driver builds and checks in Python (cassandra/segment.py); nothing here needs v5.
        # At 100,000 firings a minute v4 cost the dispatcher 9 % and the api 7 % less CPU per
        # firing (loadtest/README.md, two pairs of runs).
        protocol_version=4,
        connect_timeout=10,
        # The driver leaves Nagle's algorithm on, so a request written while the previous one
        # on its connection is unacknowledged waited for the peer's delayed ACK (~40 ms on
        # Linux): 32-row batches of small rows went at 2,800 rows/s instead of 44,000.
        sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        # Back within 2 s of Cassandra's return (the default backs off to 600 s; ~16 s was
        # seen after a restart, with every firing and report refused meanwhile).
        reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.25, max_delay=2.0),
        **(security or CassandraSecurity()).cluster_options(),
    )
    try:
        session = cluster.connect(keyspace)
    except Exception as e:
        cluster.shutdown()
        raise StorageUnavailable(
            f"cannot reach Cassandra at {','.join(hosts)}:{port} ({e}); start the local one "
            "with `cronscale local up` (or `make dev`), or set CRONSCALE_CASSANDRA_HOSTS"
        ) from e
    return session


def first(rows: Sequence[Any]) -> Any:
    """The first row of a result, or None."""
    return rows[0] if rows else None


async def aexecute(session: Session, statement: Any, params: Params | None = None) -> list[Any]:
    """Runs a statement without blocking the event loop; returns the first page of rows."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[Any]] = loop.create_future()
    rf: ResponseFuture = session.execute_async(statement, params)

    def _ok(rows: Any) -> None:
        loop.call_soon_threadsafe(_set, rows, None)

    def _err(exc: BaseException) -> None:
        loop.call_soon_threadsafe(_set, None, exc)

    def _set(rows: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(rows if rows is not None else [])

    rf.add_callbacks(_ok, _err)
    return await fut


async def aexecute_all(session: Session, statement: Any, params: Params | None = None) -> list[Any]:
    """Like ``aexecute`` but follows every page (for multi-partition reads)."""
    rows: list[Any] = []
    await aeach_page(session, statement, params, rows.extend)
    return rows


async def aeach_page(
    session: Session,
    statement: Any,
    params: Params | None,
    on_page: Callable[[Sequence[Any]], None],
) -> None:
    """Runs a statement and hands every page of its rows, in order, to ``on_page`` (called on
    the driver's thread, one page at a time): a long read that need not hold every row."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    rf: ResponseFuture = session.execute_async(statement, params)

    def _settle(exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(None)

    def _ok(page: Any) -> None:
        try:
            on_page(page or ())
        except BaseException as e:
            loop.call_soon_threadsafe(_settle, e)
            return
        if rf.has_more_pages:
            rf.start_fetching_next_page()
        else:
            loop.call_soon_threadsafe(_settle, None)

    def _err(exc: BaseException) -> None:
        loop.call_soon_threadsafe(_settle, exc)

    rf.add_callbacks(_ok, _err)
    await fut


async def execute_conditional(
    session: Session, statement: Any, params: Params | None = None
) -> tuple[bool, dict[str, Any]]:
    """Runs an LWT; returns (applied, the current values Cassandra returned when not applied)."""
    rows = await aexecute(session, statement, params)
    row = first(rows)
    if row is None:
        return True, {}
    data = row._asdict() if hasattr(row, "_asdict") else dict(row)
    # The named-tuple row factory cleans "[applied]" into "applied".
    flag = data.pop("[applied]", None)
    if flag is None:
        flag = data.pop("applied")
    return bool(flag), data


class _Binding(NamedTuple):
    """What binding one prepared statement needs: its bind markers' names and serializers."""

    names: tuple[str, ...]
    serializers: tuple[Callable[[Any, int], bytes], ...]
    routing: tuple[int, ...]
    protocol_version: int
    # The values of a dict that names every marker, in the markers' order (KeyError if one is
    # missing): one C call instead of a lookup per marker.
    pick: Callable[[Mapping[str, Any]], Sequence[Any]]


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Sequence[Any]]:
    if len(names) > 1:
        return operator.itemgetter(*names)
    if names:
        name = names[0]
        return lambda params: (params[name],)
    return lambda params: ()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def serialize_timestamp(value: Any, protocol_version: int) -> bytes:
    """``DateType.serialize`` (a ``timestamp`` column), the same bytes for every value, a
    third of its cost for a ``datetime``: the driver converts through ``utctimetuple`` and
    ``calendar.timegm`` (1.6 µs a value on the development box; ~0.5 µs here). A firing binds
    about eight timestamps. The milliseconds are computed by the driver's own formula (float
    and truncation included), so a far-future or pre-1970 instant lands on the same millisecond.
    """
    if type(value) is datetime:
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        try:
            seconds = (moment - _EPOCH) // _SECOND
        except OverflowError:  # an offset pushing it outside years 1-9999: the driver's error
            return cast(bytes, DateType.serialize(value, protocol_version))
        return cast(bytes, int64_pack(int(seconds * 1e3 + value.microsecond / 1e3)))
    return cast(bytes, DateType.serialize(value, protocol_version))


def _serializer(cql_type: Any) -> Callable[[Any, int], bytes]:
    if cql_type.serialize is DateType.serialize:  # DateType, TimestampType
        return serialize_timestamp
    return cast(Callable[[Any, int], bytes], cql_type.serialize)


_bindings: dict[int, tuple[PreparedStatement, _Binding]] = {}


def _binding(stmt: PreparedStatement) -> _Binding:
    # Keyed by id, holding the statement so its id is never reused while the entry lives;
    # a process prepares a few dozen statements.
    entry = _bindings.get(id(stmt))
    if entry is None:
        meta = stmt.column_metadata
        names = tuple(c.name for c in meta)
        binding = _Binding(
            names,
            tuple(_serializer(c.type) for c in meta),
            tuple(stmt.routing_key_indexes or ()),
            stmt.protocol_version,
            _picker(names),
        )
        _bindings[id(stmt)] = entry = (stmt, binding)
    return entry[1]


def bind(stmt: PreparedStatement, params: Params) -> BoundStatement:
    """``stmt.bind(params)``, the hot path's way: the same bound statement (each value
    serialized by its column's type, None as null, ``UNSET_VALUE`` and missing trailing or
    named values as unset), without the driver's per-value work for column encryption, which
    no session here uses: it builds a column descriptor (a named tuple) for every value, ~10 %
    of a dispatcher's binding at 100,000 firings a minute. Anything unusual (encryption, a
    protocol before v4, parameters that are neither a sequence nor a dict, too many values, a
    value of the wrong type) goes through the driver, for its checks and errors.
    """
    binding = _binding(stmt)
    if (
        params is None
        or stmt.column_encryption_policy is not None
        or binding.protocol_version < 4
        or (isinstance(params, Mapping) and not isinstance(params, dict))
    ):
        return stmt.bind(params)
    values: Sequence[Any]
    if isinstance(params, dict):
        try:
            values = binding.pick(params)
        except KeyError:  # markers left out are unset
            values = [params.get(name, UNSET_VALUE) for name in binding.names]
    else:
        values = params
        if len(values) > len(binding.names):
            return stmt.bind(params)
    version = binding.protocol_version
    try:
        serialized = [
            None if v is None else UNSET_VALUE if v is UNSET_VALUE else ser(v, version)
            for v, ser in zip(values, binding.serializers, strict=False)
        ]
    except Exception:
        return stmt.bind(params)  # the driver's error, naming the column
    serialized.extend([UNSET_VALUE] * (len(binding.names) - len(serialized)))
    if any(serialized[i] is UNSET_VALUE for i in binding.routing):
        return stmt.bind(params)  # the driver's error: a partition key left unset
    bound = BoundStatement(stmt)
    bound.raw_values = values
    bound.values = serialized
    return bound


def partition_groups(
    items: Iterable[Write],
) -> dict[Any, list[tuple[PreparedStatement, Params]]]:
    """Groups writes by partition, keeping order."""
    groups: dict[Any, list[tuple[PreparedStatement, Params]]] = {}
    for key, stmt, params in items:
        groups.setdefault(key, []).append((stmt, params))
    return groups


async def write_grouped(
    session: Session,
    items: Iterable[Write],
    *,
    in_flight: int = 16,
) -> None:
    """Writes rows as unlogged batches, many in flight, never one request per row.

    Rows are grouped by partition, and partitions by the replica that owns them (token-aware;
    by size alone when every host replicates every partition), into batches of up to
    BATCH_ROWS rows: a batch then goes to a node that applies all of it locally, and a
    firing's rows (its run, its schedule's bookkeeping, its next timer) cost a share of a
    request instead of a round trip each. A partition's rows stay in one batch, so
    they are applied atomically.
    """
    await run_bounded(session, grouped_batches(session, items), in_flight=in_flight)


def grouped_batches(
    session: Session, items: Iterable[Write]
) -> list[BatchStatement | BoundStatement]:
    """The unlogged batches :func:`write_grouped` sends for ``items``, bound and grouped; a
    lone row goes as its own statement (a batch of one costs both ends more for nothing)."""
    by_replica: dict[Any, list[list[BoundStatement]]] = {}
    metadata = session.cluster.metadata
    # Whether every host replicates every partition (one node, or a replication factor as large
    # as the cluster), as the first partition's replicas tell: then any coordinator is a
    # replica of every row, and the rows go in batches by size alone, without a routing key
    # and a replica lookup per partition (~3 µs each).
    everywhere: bool | None = None
    for group in partition_groups(items).values():
        # Each row is bound (serialized) once: the first one also gives the routing key.
        bound = [bind(stmt, params) for stmt, params in group]
        if everywhere:
            by_replica.setdefault(None, []).append(bound)
            continue
        key = bound[0].routing_key
        replicas = metadata.get_replicas(bound[0].keyspace, key) if key is not None else []
        if everywhere is None and replicas:
            everywhere = len(replicas) >= len(metadata.all_hosts())
        owner = None if everywhere or not replicas else replicas[0]
        by_replica.setdefault(owner, []).append(bound)
    batches: list[BatchStatement | BoundStatement] = []
    for groups in by_replica.values():
        if len(groups) == 1 and len(groups[0]) == 1:
            batches.append(groups[0][0])
            continue
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        rows = 0
        for whole in groups:
            # A partition larger than a batch (a peak minute of one shard) is split; its rows
            # are idempotent puts, so only the per-partition atomicity is given up.
            for start in range(0, len(whole), BATCH_ROWS):
                chunk = whole[start : start + BATCH_ROWS]
                if rows and rows + len(chunk) > BATCH_ROWS:
                    batches.append(batch)
                    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
                    rows = 0
                for row in chunk:
                    batch.add(row)
                rows += len(chunk)
        if rows:
            batches.append(batch)
    return batches


async def run_bounded(session: Session, statements: Sequence[Any], *, in_flight: int) -> None:
    """Executes prepared statements or batches with at most ``in_flight`` outstanding."""
    if not statements:
        return
    if len(statements) == 1:
        await aexecute(session, statements[0])
        return
    sem = asyncio.Semaphore(in_flight)

    async def one(stmt: Any) -> None:
        async with sem:
            await aexecute(session, stmt)

    await asyncio.gather(*(one(s) for s in statements))
