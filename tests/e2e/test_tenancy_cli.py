"""Tenants, keys and quotas from the CLI, the bootstrap path, and keys kept out of the logs
and the database."""

from __future__ import annotations

import json
import uuid

from bucketer.cql import connect
from scheduler.tenancy import parse_token
from tests.e2e.conftest import Stack


def _cli(stack: Stack, *args: str, key: str | None = None) -> tuple[int, str]:
    env_key = {} if key is None else {"CRONSCALE_API_KEY": key}
    saved = dict(stack.env)
    stack.env.update(env_key)
    try:
        done = stack.cli(*args)
    finally:
        stack.env.clear()
        stack.env.update(saved)
    return done.returncode, done.stdout + done.stderr


def _schedule(stack: Stack, key: str, name: str, *extra: str) -> tuple[int, str]:
    return _cli(
        stack,
        "schedule",
        "create",
        "--name",
        name,
        "--handler",
        "echo",
        "--cron",
        "0 0 1 1 *",
        *extra,
        key=key,
    )


def test_tenant_keys_and_quotas_from_the_cli(stack: Stack) -> None:
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    code, out = _cli(stack, "tenant", "create", tenant, "--max-schedules", "2", "--json")
    assert code == 0, out
    assert json.loads(out)["quotas"]["max_schedules"] == 2
    code, out = _cli(stack, "tenant", "create", tenant)
    assert code == 1 and "ALREADY_EXISTS" in out
    code, out = _cli(stack, "tenant", "create", f"{tenant}-x", "--tier", "gold")
    assert code == 1 and "INVALID_ARGUMENT: tenant.tier: unknown tier 'gold'" in out, out
    code, out = _cli(stack, "tenant", "create", f"{tenant}-y", "--max-schedules", "-1")
    assert code == 1 and "tenant.quotas.max_schedules" in out, out

    code, out = _cli(stack, "key", "create", "--role", "tenant-admin", "--tenant", tenant, "--json")
    assert code == 0, out
    made = json.loads(out)
    secret, key_id = made["secret"], made["key"]["key_id"]

    for i in range(2):
        code, out = _schedule(stack, secret, f"q{i}")
        assert code == 0, out
    code, out = _schedule(stack, secret, "q2")
    assert code == 1, out
    assert f"RESOURCE_EXHAUSTED: max_schedules: tenant '{tenant}' has 2 schedules" in out, out

    code, out = _cli(
        stack, "tenant", "update", tenant, "--max-schedules", "10", "--max-payload-bytes", "8"
    )
    assert code == 0, out
    # The API caches a tenant's quotas up to 10 s; a fresh tenant shows the rule at once.
    other = f"cli-{uuid.uuid4().hex[:8]}"
    assert _cli(stack, "tenant", "create", other, "--max-payload-bytes", "8")[0] == 0
    code, out = _cli(stack, "key", "create", "--role", "tenant-admin", "--tenant", other, "--json")
    other_secret = json.loads(out)["secret"]
    code, out = _schedule(stack, other_secret, "big", "--payload", '{"a": "0123456789"}')
    assert code == 1 and "schedule.payload" in out and "max_payload_bytes" in out, out

    code, out = _cli(stack, "key", "list", "--tenant", tenant, "--json")
    assert code == 0 and key_id in out and secret not in out, out
    # A tenant-admin may not mint admin keys.
    code, out = _cli(stack, "key", "create", "--role", "admin", key=secret)
    assert code == 1 and "PERMISSION_DENIED" in out, out
    code, out = _cli(stack, "key", "revoke", key_id)
    assert code == 0, out
    code, out = _cli(stack, "audit", "list", "--tenant", tenant, "--action", "RevokeApiKey")
    assert code == 0 and key_id in out and "RevokeApiKey" in out, out
    code, out = _schedule(stack, secret, "after revoke")
    assert code == 1 and "UNAUTHENTICATED" in out, out
    code, out = _cli(stack, "schedule", "list", key="csk_nope")
    assert code == 1 and "UNAUTHENTICATED" in out, out


def test_bootstrap_prints_a_working_admin_key_once(stack: Stack) -> None:
    done = stack.cli("tenant", "bootstrap")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith("csk_")
    code, out = _cli(stack, "tenant", "list", key=token)
    assert code == 0, out


def test_keys_never_appear_in_logs_or_tables(stack: Stack) -> None:
    code, out = _cli(stack, "key", "create", "--role", "worker", "--json")
    assert code == 0, out
    fresh = json.loads(out)["secret"]
    # Use every key once so each passes through the API (and its logs).
    assert _cli(stack, "tenant", "list", key=fresh)[0] == 1  # a worker key: PERMISSION_DENIED
    secrets = [stack.admin_key, stack.worker_key, fresh]
    parts = [parse_token(s)[1] for s in secrets]  # the secret may itself hold "_"
    for log in stack.logs.glob("*.log"):
        text = log.read_text(errors="replace")
        for p in parts:
            assert p not in text, f"a key's secret is in {log.name}"
    session = connect(stack.config.cassandra_hosts, stack.config.cassandra_port)
    try:
        tables = [
            r.table_name
            for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
                (stack.config.keyspace,),
            )
        ]
        for table in tables:
            for row in session.execute(f"SELECT * FROM {stack.config.keyspace}.{table}"):
                text = repr(tuple(row))
                for p in parts:
                    assert p not in text, f"a key's secret is in table {table}"
    finally:
        session.cluster.shutdown()


def test_a_schedule_count_off_from_the_stored_schedules_is_recounted(stack: Stack) -> None:
    """The count behind max_schedules is a counter: a counted create whose schedule write then
    failed leaves it high, and the tenant is refused below its quota. `cronscale db
    recount-usage` sets it to what is stored."""
    tenant = f"recount-{uuid.uuid4().hex[:8]}"
    assert _cli(stack, "tenant", "create", tenant, "--max-schedules", "3")[0] == 0
    code, out = _cli(stack, "key", "create", "--role", "tenant-admin", "--tenant", tenant, "--json")
    assert code == 0, out
    secret = json.loads(out)["secret"]
    for i in range(2):
        code, out = _schedule(stack, secret, f"r{i}")
        assert code == 0, out
    session = connect(stack.config.cassandra_hosts, stack.config.cassandra_port)
    try:
        session.execute(
            f"UPDATE {stack.config.keyspace}.tenant_usage SET schedules = schedules + 5 "
            "WHERE tenant_id = %s",
            (tenant,),
        )
    finally:
        session.cluster.shutdown()
    code, out = _schedule(stack, secret, "r2")
    assert code == 1 and f"tenant '{tenant}' has 7 schedules" in out, out

    code, out = _cli(stack, "db", "recount-usage", "--tenant", tenant)
    assert code == 0 and f"{tenant}: 2 schedules (was 7)" in out, out
    code, out = _schedule(stack, secret, "r2")
    assert code == 0, out
    code, out = _cli(stack, "db", "recount-usage")
    assert code == 0 and f"{tenant}: 3 schedules (unchanged)" in out, out

    code, out = _cli(stack, "db", "recount-usage", "--tenant", "no such tenant")
    assert code == 2 and "--tenant: letters, digits" in out, out
