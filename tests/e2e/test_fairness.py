"""Tenants, tiers and the enqueue-rate and concurrent-runs quotas in the firing path (issue 9),
through the real api, dispatcher and worker: a noisy tenant with 50x the schedules of a quiet
one, all due in the same second, is held to its rate while the quiet one keeps its lag, a capped
tenant never has more runs in progress than its quota, and nothing is lost."""

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
from loadtest.figures import pct
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


CAP, CAPPED_RUNS, RUN_S = 3, 12, 2.0


def test_a_tenant_never_runs_more_than_its_concurrent_runs_quota(stack: Stack) -> None:
    """12 runs of 2 s due in the same second, for a tenant allowed 3 at once: no more than 3
    are ever in progress, the others wait (deferred, recorded) and all run."""
    tag = uuid.uuid4().hex[:6]
    capped = f"capped-{tag}"
    _tenants(stack).CreateTenant(
        t_pb2.CreateTenantRequest(
            tenant=t_pb2.Tenant(
                id=capped, tier="premium", quotas=t_pb2.TenantQuotas(max_concurrent_runs=CAP)
            )
        ),
        timeout=10,
    )
    stack.start("worker-premium", "worker", "--tier", "premium", "--import", "tests.e2e.handlers")
    try:
        at = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
        payload = json.dumps({"seconds": RUN_S}).encode()
        ids = []
        for i in range(CAPPED_RUNS):
            made = stack.api.CreateSchedule(
                scheduler_service_pb2.CreateScheduleRequest(
                    schedule=schedule_pb2.Schedule(
                        name=f"capped-{i}",
                        tenant=capped,
                        handler="e2e.sleep_cancellable",
                        payload=payload,
                        spec=once_spec(at),
                    )
                ),
                timeout=10,
            )
            ids.append(made.id)

        def runs() -> list[schedule_pb2.Run]:
            return [r for sid in ids for r in list_runs(stack, sid)]

        wait_until(
            stack,
            lambda: sum(r.status == SUCCEEDED for r in runs()) == CAPPED_RUNS,
            90,
            "every run of the capped tenant",
            poll=2,
        )
    finally:
        stack.kill("worker-premium", signal.SIGTERM)
    done = runs()
    assert len(done) == CAPPED_RUNS  # one run each: none lost, none doubled
    # Sweep over the runs' starts and finishes (a finish before a start at the same instant).
    edges = sorted(
        [(dt(r.start_time), 1) for r in done] + [(dt(r.finish_time), -1) for r in done],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _t, step in edges:
        running += step
        peak = max(peak, running)
    starts = sorted(dt(r.start_time) for r in done)
    print(
        f"\ncapped tenant ({CAPPED_RUNS} runs of {RUN_S:g} s, at most {CAP} at once): peak "
        f"{peak} in progress; last started {(starts[-1] - at).total_seconds():.2f} s after the "
        f"slot; {sum(r.HasField('deferred') for r in done)} deferred"
    )
    assert peak == CAP
    # Waves of 3: the last wave cannot start before three runs' worth of time has passed.
    assert (starts[-1] - at).total_seconds() >= (CAPPED_RUNS // CAP - 1) * RUN_S
    assert sum(r.HasField("deferred") for r in done) >= CAPPED_RUNS - CAP


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
