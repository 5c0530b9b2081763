"""``cronscale tenant ...``, ``key ...`` and ``audit list``: tenants, their quotas, API keys
and the audit log.

``tenant bootstrap`` is the one command that needs no key: it writes the first admin key of a
cluster straight into Cassandra (it needs the database's reach, which is the trust it rests
on) and prints the key once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from cronscale.v1 import api_key_service_pb2 as key_pb2
from cronscale.v1 import audit_service_pb2 as audit_pb2
from cronscale.v1 import tenant_service_pb2 as tenant_pb2
from scheduler.cli.build import parse_at
from scheduler.cli.client import audit_stub, tenant_stubs
from scheduler.cli.output import _key_values, _table, dumps, format_time, message_to_json

RpcCommand = Callable[[argparse.Namespace], Any]


def format_tenant(t: tenant_pb2.Tenant) -> str:
    q = t.quotas
    return _key_values(
        [
            ("id", t.id),
            ("tier", t.tier),
            ("max_schedules", str(q.max_schedules or "unlimited")),
            ("max_concurrent_runs", str(q.max_concurrent_runs or "unlimited")),
            (
                "max_enqueue_rate",
                f"{q.max_enqueue_rate:g}/s" if q.max_enqueue_rate else "unlimited",
            ),
            ("enqueue_burst", f"{q.enqueue_burst:g}" if q.enqueue_burst else "-"),
            ("max_payload_bytes", str(q.max_payload_bytes or "server limit")),
            ("created", format_time(t.create_time)),
            ("updated", format_time(t.update_time)),
        ]
    )


def format_key(k: key_pb2.ApiKey) -> str:
    return _key_values(
        [
            ("key_id", k.key_id),
            ("role", k.role),
            ("tenant", k.tenant_id or "-"),
            ("tenants", ", ".join(k.tenants) or ("all" if k.role == "worker" else "-")),
            ("name", k.name or "-"),
            ("created", format_time(k.create_time)),
            ("revoked", format_time(k.revoke_time) if k.HasField("revoke_time") else "-"),
        ]
    )


def _tenant_from_args(args: argparse.Namespace) -> tenant_pb2.Tenant:
    return tenant_pb2.Tenant(
        id=args.tenant_id,
        tier=args.tier or "",
        quotas=tenant_pb2.TenantQuotas(
            max_schedules=args.max_schedules,
            max_concurrent_runs=args.max_concurrent_runs,
            max_enqueue_rate=args.max_enqueue_rate,
            enqueue_burst=args.enqueue_burst,
            max_payload_bytes=args.max_payload_bytes,
        ),
    )


def _print(args: argparse.Namespace, message: Any, text: str) -> None:
    print(dumps(message_to_json(message)) if args.json else text)


async def create_tenant(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (tenants, _):
        t = await tenants.CreateTenant(
            tenant_pb2.CreateTenantRequest(tenant=_tenant_from_args(args)), timeout=args.timeout
        )
    _print(args, t, format_tenant(t))
    return 0


async def get_tenant(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (tenants, _):
        t = await tenants.GetTenant(
            tenant_pb2.GetTenantRequest(id=args.tenant_id), timeout=args.timeout
        )
    _print(args, t, format_tenant(t))
    return 0


async def list_tenants(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (tenants, _):
        resp = await tenants.ListTenants(tenant_pb2.ListTenantsRequest(), timeout=args.timeout)
    text = _table(
        ("ID", "TIER", "MAX_SCHEDULES", "RATE/S", "CREATED"),
        [
            (
                t.id,
                t.tier,
                str(t.quotas.max_schedules or "-"),
                f"{t.quotas.max_enqueue_rate:g}" if t.quotas.max_enqueue_rate else "-",
                format_time(t.create_time),
            )
            for t in resp.tenants
        ],
    )
    _print(args, resp, text)
    return 0


async def update_tenant(args: argparse.Namespace) -> int:
    """Replaces tier and quotas: options not given keep their stored value."""
    async with tenant_stubs(args.api) as (tenants, _):
        current = await tenants.GetTenant(
            tenant_pb2.GetTenantRequest(id=args.tenant_id), timeout=args.timeout
        )
        t = tenant_pb2.Tenant()
        t.CopyFrom(current)
        if args.tier is not None:
            t.tier = args.tier
        for name in (
            "max_schedules",
            "max_concurrent_runs",
            "max_enqueue_rate",
            "enqueue_burst",
            "max_payload_bytes",
        ):
            value = getattr(args, name)
            if value is not None:
                setattr(t.quotas, name, value)
        updated = await tenants.UpdateTenant(
            tenant_pb2.UpdateTenantRequest(tenant=t), timeout=args.timeout
        )
    _print(args, updated, format_tenant(updated))
    return 0


async def delete_tenant(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (tenants, _):
        await tenants.DeleteTenant(
            tenant_pb2.DeleteTenantRequest(id=args.tenant_id), timeout=args.timeout
        )
    print(dumps({"deleted": args.tenant_id}) if args.json else f"deleted tenant {args.tenant_id}")
    return 0


async def create_key(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (_, keys):
        resp = await keys.CreateApiKey(
            key_pb2.CreateApiKeyRequest(
                role=args.role,
                tenant_id=args.tenant or "",
                tenants=args.serves or [],
                name=args.name or "",
            ),
            timeout=args.timeout,
        )
    if args.json:
        print(dumps({"key": message_to_json(resp.key), "secret": resp.secret}))
    else:
        print(format_key(resp.key))
        print(f"\nkey (shown once, store it now):\n{resp.secret}")
    return 0


async def list_keys(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (_, keys):
        resp = await keys.ListApiKeys(
            key_pb2.ListApiKeysRequest(tenant_id=args.tenant or ""), timeout=args.timeout
        )
    text = _table(
        ("KEY_ID", "ROLE", "TENANT", "NAME", "CREATED", "REVOKED"),
        [
            (
                k.key_id,
                k.role,
                k.tenant_id or "-",
                k.name or "-",
                format_time(k.create_time),
                format_time(k.revoke_time) if k.HasField("revoke_time") else "-",
            )
            for k in resp.keys
        ],
    )
    _print(args, resp, text)
    return 0


async def revoke_key(args: argparse.Namespace) -> int:
    async with tenant_stubs(args.api) as (_, keys):
        k = await keys.RevokeApiKey(
            key_pb2.RevokeApiKeyRequest(key_id=args.key_id), timeout=args.timeout
        )
    _print(args, k, format_key(k))
    return 0


async def list_audit(args: argparse.Namespace) -> int:
    """``audit list``: newest first, filtered; a page (or ``--all``). The server may answer a
    short page before the last (a call reads a bounded number of partitions): pages are
    followed until one page's worth is shown or the listing ends."""
    request = audit_pb2.ListAuditEventsRequest(
        tenant_id=args.tenant or "",
        target=args.target or "",
        actor_key_id=args.actor or "",
        action=args.action or "",
        page_size=args.page_size,
    )
    if args.since is not None:
        request.start_time.FromDatetime(args.since)
    if args.until is not None:
        request.end_time.FromDatetime(args.until)
    events: list[audit_pb2.AuditEvent] = []
    token = args.page_token
    want = args.page_size or 100  # the server's default page
    async with audit_stub(args.api) as stub:
        while True:
            request.page_token = token
            if not args.all:
                request.page_size = want - len(events)
            resp = await stub.ListAuditEvents(request, timeout=args.timeout)
            events.extend(resp.events)
            token = resp.next_page_token
            if not token or (not args.all and len(events) >= want):
                break
    if args.json:
        print(dumps({"events": [message_to_json(e) for e in events], "next_page_token": token}))
        return 0
    print(
        _table(
            ("TIME", "TENANT", "ACTOR", "ROLE", "ACTION", "TARGET", "REQUEST_ID"),
            [
                (
                    format_time(e.time),
                    e.tenant_id,
                    e.actor_key_id,
                    e.actor_role,
                    e.action,
                    e.target,
                    e.request_id,
                )
                for e in events
            ],
        )
    )
    if token:
        print(f"\nmore: --page-token {token}")
    return 0


async def _bootstrap(name: str) -> str:
    from scheduler.cassandra_tenancy import CassandraTenantStore
    from scheduler.config import Config
    from scheduler.session import open_session
    from scheduler.tenancy import Role, new_key

    config = Config.from_env()
    session = await asyncio.to_thread(open_session, config)
    try:
        store = CassandraTenantStore(session, keyspace=config.keyspace)
        made = new_key(role=Role.ADMIN, name=name, now=datetime.now(UTC))
        await store.add_key(made.key)
        return made.token
    finally:
        session.cluster.shutdown()


def bootstrap(args: argparse.Namespace) -> int:
    """``cronscale tenant bootstrap``: a new admin key, written to Cassandra, printed once."""
    logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    from bucketer.cql import StorageUnavailable
    from scheduler.errors import CronscaleError

    try:
        token = asyncio.run(_bootstrap(args.name))
    except (StorageUnavailable, CronscaleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        "admin key (shown once; export CRONSCALE_API_KEY=<key> or pass --api-key):",
        file=sys.stderr,
    )
    print(token)
    return 0


def _quota_options(p: argparse.ArgumentParser, *, update: bool) -> None:
    d: Any = None if update else 0
    p.add_argument("--tier", default=None, help="one of the configured tiers (default standard)")
    p.add_argument("--max-schedules", type=int, default=d, metavar="N", help="0: unlimited")
    p.add_argument("--max-concurrent-runs", type=int, default=d, metavar="N", help="0: unlimited")
    p.add_argument(
        "--max-enqueue-rate", type=float, default=d, metavar="PER_S", help="0: unlimited"
    )
    p.add_argument("--enqueue-burst", type=float, default=d, metavar="N", help="0: one second's")
    p.add_argument(
        "--max-payload-bytes", type=int, default=d, metavar="N", help="0: the server's limit"
    )


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: Sequence[argparse.ArgumentParser],
    parser: Callable[..., argparse.ArgumentParser],
    rpc: Callable[[RpcCommand], Callable[[argparse.Namespace], int]],
    add_page_options: Callable[[argparse.ArgumentParser, str], None],
) -> None:
    """``cronscale tenant ...``, ``cronscale key ...`` and ``cronscale audit list``."""
    tenant = parser(commands, "tenant", "tenants: tier and quotas (admin keys)")
    sub = tenant.add_subparsers(dest="tenant_command", metavar="SUBCOMMAND", required=True)
    create = parser(sub, "create", "register a tenant", parents)
    create.add_argument("tenant_id", metavar="TENANT_ID")
    _quota_options(create, update=False)
    create.set_defaults(run=rpc(create_tenant))
    get = parser(sub, "get", "show a tenant", parents)
    get.add_argument("tenant_id", metavar="TENANT_ID")
    get.set_defaults(run=rpc(get_tenant))
    parser(sub, "list", "list tenants", parents).set_defaults(run=rpc(list_tenants))
    update = parser(sub, "update", "change a tenant's tier or quotas", parents)
    update.add_argument("tenant_id", metavar="TENANT_ID")
    _quota_options(update, update=True)
    update.set_defaults(run=rpc(update_tenant))
    delete = parser(sub, "delete", "remove a tenant and revoke its keys", parents)
    delete.add_argument("tenant_id", metavar="TENANT_ID")
    delete.set_defaults(run=rpc(delete_tenant))
    boot = parser(sub, "bootstrap", "write a first admin key into Cassandra and print it once")
    boot.add_argument("--name", default="bootstrap", help="a label for the key")
    boot.set_defaults(run=bootstrap)

    key = parser(commands, "key", "API keys (shown once, stored hashed)")
    ksub = key.add_subparsers(dest="key_command", metavar="SUBCOMMAND", required=True)
    kc = parser(ksub, "create", "make a key; prints it once", parents)
    kc.add_argument(
        "--role",
        required=True,
        choices=("admin", "tenant-admin", "tenant-reader", "worker"),
        help="what the key may do",
    )
    kc.add_argument("--tenant", metavar="TENANT_ID", help="the tenant of a tenant-* key")
    kc.add_argument(
        "--serves",
        metavar="TENANT_ID",
        action="append",
        help="worker keys: a tenant it reports runs for (repeat; none: all)",
    )
    kc.add_argument("--name", help="a label, e.g. 'ci deploys'")
    kc.set_defaults(run=rpc(create_key))
    kl = parser(ksub, "list", "list keys (never their secrets)", parents)
    kl.add_argument(
        "--tenant", metavar="TENANT_ID", help="whose keys (admins: none = admin+worker)"
    )
    kl.set_defaults(run=rpc(list_keys))
    kr = parser(ksub, "revoke", "revoke a key (other API replicas: within 10 s)", parents)
    kr.add_argument("key_id", metavar="KEY_ID")
    kr.set_defaults(run=rpc(revoke_key))

    audit = parser(commands, "audit", "the audit log (read only)")
    asub = audit.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    al = parser(asub, "list", "audit entries, newest first", parents)
    al.add_argument("--tenant", metavar="TENANT_ID", help="admins: only this tenant's")
    al.add_argument("--target", metavar="ID", help="a schedule, run, tenant or key id")
    al.add_argument("--actor", metavar="KEY_ID", help="changes made with this key")
    al.add_argument("--action", metavar="RPC", help="e.g. DeleteSchedule")
    al.add_argument("--since", metavar="ISO8601", type=parse_at, help="default: 30 days ago")
    al.add_argument("--until", metavar="ISO8601", type=parse_at, help="default: now")
    add_page_options(al, "entries")
    al.set_defaults(run=rpc(list_audit))
