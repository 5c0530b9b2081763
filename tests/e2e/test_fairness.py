"""Tenants, tiers and the enqueue-rate quota in the firing path (issue 9), through the real
api, dispatcher and worker: a noisy tenant with 50x the schedules of a quiet one, all due in
the same second, is held to its rate while the quiet one keeps its lag, and nothing is lost."""

from __future__ import annotations

import json
import signal
import uuid
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from cronscale.v1 import schedule_pb2, scheduler_service_pb2
from cronscale.v1 import tenant_service_pb2 as t_pb2
from cronscale.v1 import tenant_service_pb2_grpc as t_grpc
from loadtest.firing import pct
from tests.e2e.conftest import Stack
from tests.e2e.support import SUCCEEDED, dt, list_runs, once_spec, refusal, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NOISY, QUIET = 500, 10
RATE, BURST = 100.0, 20.0


def _tenants(stack: Stack) -> t_grpc.TenantServiceStub:
    return t_grpc.TenantServiceStub(stack.channel)


def _create_many(stack: Stack, tenant: str, n: int, at: datetime) -> list[str]:
    items = [
        scheduler_service_pb2.CreateScheduleRequest(
            schedule=schedule_pb2.Schedule(
                name=f"{tenant}-{i}", tenant=tenant, handler="echo", spec=once_spec(at)
            )
        )
        for i in range(n)
    ]
    ids: list[str] = []
    for start in range(0, n, 500):
        resp = stack.api.BatchCreateSchedules(
            scheduler_service_pb2.BatchCreateSchedulesRequest(items=items[start : start + 500]),
            timeout=60,
        )
        assert all(not r.error for r in resp.results), [r.error for r in resp.results][:3]
        ids.extend(r.schedule.id for r in resp.results)
    return ids


def test_a_noisy_tenant_is_held_to_its_rate_and_the_quiet_one_keeps_its_lag(
    stack: Stack,
) -> None:
    tag = uuid.uuid4().hex[:6]
    noisy, quiet = f"noisy-{tag}", f"quiet-{tag}"
    tenants = _tenants(stack)
    tenants.CreateTenant(
        t_pb2.CreateTenantRequest(
            tenant=t_pb2.Tenant(
                id=noisy,
                tier="free",
                quotas=t_pb2.TenantQuotas(max_enqueue_rate=RATE, enqueue_burst=BURST),
            )
        ),
        timeout=10,
    )
    tenants.CreateTenant(
        t_pb2.CreateTenantRequest(tenant=t_pb2.Tenant(id=quiet, tier="standard")), timeout=10
    )
    # The noisy tenant's tier has a topic of its own: a worker dedicated to it runs its runs
    # (the stack's worker serves `standard` only).
    stack.start("worker-free", "worker", "--tier", "free", "--import", "tests.e2e.handlers")
    try:
        _noisy_and_quiet(stack, noisy, quiet)
    finally:
        stack.kill("worker-free", signal.SIGTERM)


def _noisy_and_quiet(stack: Stack, noisy: str, quiet: str) -> None:
    at = (datetime.now(UTC) + timedelta(seconds=12)).replace(microsecond=0)
    noisy_ids = _create_many(stack, noisy, NOISY, at)
    quiet_ids = _create_many(stack, quiet, QUIET, at)

    def runs_of(ids: list[str]) -> list[schedule_pb2.Run]:
        return [r for sid in ids for r in list_runs(stack, sid)]

    wait_until(
        stack,
        lambda: sum(r.status == SUCCEEDED for r in runs_of(noisy_ids)) == NOISY,
        90,
        "every run of the noisy tenant",
        poll=3,
    )
    noisy_runs, quiet_runs = runs_of(noisy_ids), runs_of(quiet_ids)
    assert len(noisy_runs) == NOISY and len(quiet_runs) == QUIET  # one run each: none lost
    assert all(r.status == SUCCEEDED for r in quiet_runs)

    def lags(runs: list[schedule_pb2.Run]) -> list[float]:
        return sorted((dt(r.start_time) - dt(r.scheduled_for)).total_seconds() for r in runs)

    quiet_lag, noisy_lag = lags(quiet_runs), lags(noisy_runs)
    print(
        f"\nquiet tenant ({QUIET} runs): lag p50 {pct(quiet_lag, 0.5):.3f} s, "
        f"p99 {pct(quiet_lag, 0.99):.3f} s, max {quiet_lag[-1]:.3f} s; "
        f"noisy tenant ({NOISY} runs at {RATE:g}/s): p50 {pct(noisy_lag, 0.5):.3f} s, "
        f"p99 {pct(noisy_lag, 0.99):.3f} s, max {noisy_lag[-1]:.3f} s"
    )
    assert quiet_lag[-1] < 2.0
    # Held to its rate: the burst at once, the rest at 100/s, so the last starts ~4.8 s late
    # (and not much sooner: the quota was enforced).
    expected_spread = (NOISY - BURST) / RATE
    assert noisy_lag[-1] >= expected_spread * 0.8
    deferred = [r for r in noisy_runs if r.HasField("deferred")]
    assert len(deferred) >= NOISY - BURST - 5
    assert all(not r.HasField("deferred") for r in quiet_runs)


def test_tenant_bad_input_names_the_field(stack: Stack) -> None:
    tenants = _tenants(stack)
    tid = f"t-{uuid.uuid4().hex[:6]}"

    def create(t: t_pb2.Tenant) -> object:
        return tenants.CreateTenant(t_pb2.CreateTenantRequest(tenant=t), timeout=10)

    code, details = refusal(lambda: create(t_pb2.Tenant(id=tid, tier="gold")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "tenant.tier" in details
    assert "gold" in details
    bad_rate = t_pb2.Tenant(id=tid, quotas=t_pb2.TenantQuotas(max_enqueue_rate=-1))
    code, details = refusal(lambda: create(bad_rate))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant.quotas.max_enqueue_rate" in details
    code, details = refusal(lambda: create(t_pb2.Tenant()))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "tenant.id" in details
    # Nothing was written by the refused calls.
    code, _ = refusal(lambda: tenants.GetTenant(t_pb2.GetTenantRequest(id=tid), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND

    created = create(t_pb2.Tenant(id=tid, tier="premium"))
    assert isinstance(created, t_pb2.Tenant) and created.tier == "premium"
    code, _ = refusal(lambda: create(t_pb2.Tenant(id=tid)))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    updated = tenants.UpdateTenant(
        t_pb2.UpdateTenantRequest(
            tenant=t_pb2.Tenant(id=tid, quotas=t_pb2.TenantQuotas(max_enqueue_rate=5))
        ),
        timeout=10,
    )
    assert updated.tier == "standard" and updated.quotas.max_enqueue_rate == 5
    listed = tenants.ListTenants(t_pb2.ListTenantsRequest(), timeout=10)
    assert tid in {t.id for t in listed.tenants}
    tenants.DeleteTenant(t_pb2.DeleteTenantRequest(id=tid), timeout=10)
    code, _ = refusal(lambda: tenants.DeleteTenant(t_pb2.DeleteTenantRequest(id=tid), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND


def test_the_tenant_cli(stack: Stack) -> None:
    api = ["--api", stack.config.api_target]
    tid = f"cli-{uuid.uuid4().hex[:6]}"
    made = stack.cli(
        "tenant", "create", tid, "--tier", "premium", "--max-enqueue-rate", "50", "--json", *api
    )
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    assert doc["tier"] == "premium" and doc["quotas"]["max_enqueue_rate"] == 50
    shown = stack.cli("tenant", "get", tid, *api)
    assert shown.returncode == 0 and "50/s" in shown.stdout
    assert tid in stack.cli("tenant", "list", *api).stdout
    bad = stack.cli("tenant", "update", tid, "--tier", "gold", *api)
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "tenant.tier" in bad.stderr
    assert stack.cli("tenant", "delete", tid, *api).returncode == 0
    gone = stack.cli("tenant", "get", tid, *api)
    assert gone.returncode == 1 and "NOT_FOUND" in gone.stderr
