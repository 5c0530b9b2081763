"""``cronscale tenant create|get|list|update|delete``: tenants' tiers and quotas."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc

from cronscale.v1 import tenant_service_pb2 as t
from cronscale.v1 import tenant_service_pb2_grpc as t_grpc
from scheduler.cli.output import _key_values, _table, dumps, format_time, message_to_json

RpcCommand = Callable[[argparse.Namespace], Any]


@asynccontextmanager
async def tenant_stub(target: str) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        yield t_grpc.TenantServiceStub(channel)


def _rate(value: float) -> str:
    return f"{value:g}/s" if value else "unlimited"


def format_tenant(x: t.Tenant) -> str:
    q = x.quotas
    return _key_values(
        [
            ("id", x.id),
            ("tier", x.tier),
            ("max_enqueue_rate", _rate(q.max_enqueue_rate)),
            ("enqueue_burst", f"{q.enqueue_burst:g}" if q.enqueue_burst else "1 s of the rate"),
            ("max_payload_bytes", str(q.max_payload_bytes or "server limit")),
            ("create_time", format_time(x.create_time)),
            ("update_time", format_time(x.update_time)),
        ]
    )


def _tenant(args: argparse.Namespace) -> t.Tenant:
    return t.Tenant(
        id=args.id,
        tier=args.tier or "",
        quotas=t.TenantQuotas(
            max_enqueue_rate=args.max_enqueue_rate or 0.0,
            enqueue_burst=args.enqueue_burst or 0.0,
            max_payload_bytes=args.max_payload_bytes or 0,
        ),
    )


def _show(args: argparse.Namespace, x: t.Tenant) -> None:
    print(dumps(message_to_json(x)) if args.json else format_tenant(x))


async def create(args: argparse.Namespace) -> int:
    """``tenant create ID [--tier ...] [quotas]``."""
    return await _write(args, "CreateTenant", t.CreateTenantRequest)


async def update(args: argparse.Namespace) -> int:
    """``tenant update ID [--tier ...] [quotas]``: replaces tier and quotas."""
    return await _write(args, "UpdateTenant", t.UpdateTenantRequest)


async def _write(args: argparse.Namespace, method: str, request: Any) -> int:
    async with tenant_stub(args.api) as stub:
        x = await getattr(stub, method)(request(tenant=_tenant(args)), timeout=args.timeout)
    _show(args, x)
    return 0


async def get(args: argparse.Namespace) -> int:
    async with tenant_stub(args.api) as stub:
        x = await stub.GetTenant(t.GetTenantRequest(id=args.id), timeout=args.timeout)
    _show(args, x)
    return 0


async def list_tenants(args: argparse.Namespace) -> int:
    async with tenant_stub(args.api) as stub:
        resp = await stub.ListTenants(t.ListTenantsRequest(), timeout=args.timeout)
    if args.json:
        print(dumps({"tenants": [message_to_json(x) for x in resp.tenants]}))
    else:
        rows = [
            (x.id, x.tier, _rate(x.quotas.max_enqueue_rate), str(x.quotas.max_payload_bytes or "-"))
            for x in resp.tenants
        ]
        print(_table(("ID", "TIER", "MAX_ENQUEUE_RATE", "MAX_PAYLOAD_BYTES"), rows))
    return 0


async def delete(args: argparse.Namespace) -> int:
    async with tenant_stub(args.api) as stub:
        await stub.DeleteTenant(t.DeleteTenantRequest(id=args.id), timeout=args.timeout)
    print(f"deleted tenant {args.id}")
    return 0


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: Sequence[argparse.ArgumentParser],
    parser: Callable[..., argparse.ArgumentParser],
    rpc: Callable[[RpcCommand], Callable[[argparse.Namespace], int]],
) -> None:
    """``cronscale tenant ...``."""
    tenant = parser(commands, "tenant", "tenants: their tier and quotas")
    sub = tenant.add_subparsers(dest="tenant_command", metavar="SUBCOMMAND", required=True)
    for name, summary, command in (
        ("create", "register a tenant", create),
        ("update", "replace a tenant's tier and quotas", update),
    ):
        p = parser(sub, name, summary, parents)
        p.add_argument("id", metavar="ID")
        p.add_argument("--tier", help="one of the configured tiers (default standard)")
        p.add_argument(
            "--max-enqueue-rate", type=float, metavar="PER_S", help="firings a second (0: no limit)"
        )
        p.add_argument(
            "--enqueue-burst", type=float, metavar="N", help="firings at once above the rate"
        )
        p.add_argument("--max-payload-bytes", type=int, metavar="BYTES")
        p.set_defaults(run=rpc(command))
    for name, summary, command in (
        ("get", "show a tenant", get),
        ("delete", "remove a tenant's tier and quotas", delete),
    ):
        p = parser(sub, name, summary, parents)
        p.add_argument("id", metavar="ID")
        p.set_defaults(run=rpc(command))
    ls = parser(sub, "list", "list tenants", parents)
    ls.set_defaults(run=rpc(list_tenants))
