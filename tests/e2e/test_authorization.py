"""Every RPC x every role x own/foreign resource against the running API, exact status codes.

Tenant A is "own" (the tenant keys belong to, the tenant the worker key serves), tenant B is
"foreign". Admins see both. Keys missing, malformed, unknown or revoked: UNAUTHENTICATED
whatever the call; a role not in the method's row: PERMISSION_DENIED; a tenant role naming a
foreign resource: NOT_FOUND, as for a missing one (creating in, or managing keys of, another
tenant: PERMISSION_DENIED, documented in docs/concepts/tenancy.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from cronscale.v1 import (
    api_key_service_pb2,
    api_key_service_pb2_grpc,
    audit_service_pb2,
    audit_service_pb2_grpc,
    dead_letter_service_pb2,
    dead_letter_service_pb2_grpc,
    run_reporting_service_pb2,
    run_reporting_service_pb2_grpc,
    schedule_pb2,
    scheduler_service_pb2,
    scheduler_service_pb2_grpc,
    tenant_service_pb2,
    tenant_service_pb2_grpc,
)
from scheduler.credentials import authed_channel
from scheduler.tenancy import make_token
from tests.e2e.conftest import Stack
from tests.e2e.support import cron_spec, dur, get_run, json_payload, once_spec, ts, wait_until

OK = grpc.StatusCode.OK
DENIED = grpc.StatusCode.PERMISSION_DENIED
NOT_FOUND = grpc.StatusCode.NOT_FOUND
UNAUTH = grpc.StatusCode.UNAUTHENTICATED

ROLES = ("admin", "tenant-admin", "tenant-reader", "worker")
READ = frozenset({"admin", "tenant-admin", "tenant-reader"})
MANAGE = frozenset({"admin", "tenant-admin"})
ADMIN = frozenset({"admin"})
WORKER = frozenset({"worker"})


@dataclass
class World:
    stack: Stack
    tenants: dict[str, str]  # "own"/"foreign" -> tenant id
    schedule: dict[str, str]
    run: dict[str, str]
    backfill: dict[str, str]
    dead_schedule: dict[str, str]
    dead_run: dict[str, str]
    channels: dict[str, grpc.Channel]

    def admin(self) -> Any:
        return scheduler_service_pb2_grpc.SchedulerServiceStub(self.stack.channel)

    def fresh_schedule(self, side: str) -> str:
        s = self.admin().CreateSchedule(
            scheduler_service_pb2.CreateScheduleRequest(
                schedule=_cron(self.tenants[side], "authz fresh")
            ),
            timeout=10,
        )
        return str(s.id)

    def fresh_key(self, side: str) -> str:
        keys = api_key_service_pb2_grpc.ApiKeyServiceStub(self.stack.channel)
        made = keys.CreateApiKey(
            api_key_service_pb2.CreateApiKeyRequest(
                role="tenant-reader", tenant_id=self.tenants[side]
            ),
            timeout=10,
        )
        return str(made.key.key_id)

    def event(self, side: str, kind: int) -> run_reporting_service_pb2.RunEvent:
        run = get_run(self.stack, self.run[side])
        return run_reporting_service_pb2.RunEvent(
            kind=kind,  # type: ignore[arg-type]
            run_id=run.run_id,
            schedule_id=run.schedule_id,
            scheduled_for=run.scheduled_for,
            attempt=max(run.attempt, 1),
            worker_id="authz-test",
            event_time=ts(datetime.now(UTC)),
        )


def _cron(tenant: str, name: str) -> schedule_pb2.Schedule:
    return schedule_pb2.Schedule(
        tenant=tenant, name=name, handler="echo", spec=cron_spec("0 0 1 1 *", "UTC")
    )


@pytest.fixture(scope="module")
def world(stack: Stack) -> Iterator[World]:
    tok = uuid.uuid4().hex[:8]
    tenants_api = tenant_service_pb2_grpc.TenantServiceStub(stack.channel)
    keys_api = api_key_service_pb2_grpc.ApiKeyServiceStub(stack.channel)
    admin = scheduler_service_pb2_grpc.SchedulerServiceStub(stack.channel)
    dlq = dead_letter_service_pb2_grpc.DeadLetterServiceStub(stack.channel)
    tenants = {"own": f"authz-a-{tok}", "foreign": f"authz-b-{tok}"}
    for t in tenants.values():
        tenants_api.CreateTenant(
            tenant_service_pb2.CreateTenantRequest(tenant=tenant_service_pb2.Tenant(id=t)),
            timeout=10,
        )

    def key(role: str, **kw: Any) -> str:
        resp = keys_api.CreateApiKey(
            api_key_service_pb2.CreateApiKeyRequest(role=role, **kw), timeout=10
        )
        return str(resp.secret)

    revoked = key("tenant-admin", tenant_id=tenants["own"])
    keys_api.RevokeApiKey(
        api_key_service_pb2.RevokeApiKeyRequest(key_id=revoked.split("_")[1]), timeout=10
    )
    target = stack.config.api_target
    channels = {
        "admin": stack.channel,
        "tenant-admin": authed_channel(target, key("tenant-admin", tenant_id=tenants["own"])),
        "tenant-reader": authed_channel(target, key("tenant-reader", tenant_id=tenants["own"])),
        "worker": authed_channel(target, key("worker", tenants=[tenants["own"]])),
        "no key": grpc.insecure_channel(target),
        "malformed key": authed_channel(target, "not-a-key"),
        "unknown key": authed_channel(target, make_token()),
        "revoked key": authed_channel(target, revoked),
    }
    schedule, run, backfill, dead_schedule, dead_run = {}, {}, {}, {}, {}
    for side, t in tenants.items():
        s = admin.CreateSchedule(
            scheduler_service_pb2.CreateScheduleRequest(schedule=_cron(t, "authz")), timeout=10
        )
        schedule[side] = s.id
        r = admin.TriggerSchedule(
            scheduler_service_pb2.TriggerScheduleRequest(id=s.id, force=True), timeout=10
        )
        run[side] = r.run_id
        b = admin.BackfillSchedule(
            scheduler_service_pb2.BackfillScheduleRequest(
                id=s.id,
                start_time=ts(datetime(2024, 1, 1, tzinfo=UTC)),
                end_time=ts(datetime(2024, 6, 1, tzinfo=UTC)),
            ),
            timeout=10,
        )
        backfill[side] = b.backfill_id
        d = admin.CreateSchedule(
            scheduler_service_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.Schedule(
                    tenant=t,
                    name="authz dead",
                    handler="fail",
                    payload=json_payload({"error": "authz"}),
                    spec=once_spec(datetime.now(UTC) + timedelta(seconds=1)),
                    policies=schedule_pb2.SchedulePolicies(
                        retry=schedule_pb2.RetryPolicy(
                            max_attempts=1, initial_backoff=dur(timedelta(seconds=1))
                        )
                    ),
                )
            ),
            timeout=10,
        )
        dead_schedule[side] = d.id
    for side in tenants:

        def succeeded(side: str = side) -> bool:
            return get_run(stack, run[side]).status == schedule_pb2.RUN_STATUS_SUCCEEDED

        wait_until(stack, succeeded, 30, f"the {side} triggered run succeeded")

        def dead(side: str = side) -> bool:
            letters = dlq.ListDeadLetters(
                dead_letter_service_pb2.ListDeadLettersRequest(schedule_id=dead_schedule[side]),
                timeout=10,
            ).dead_letters
            if letters:
                dead_run[side] = letters[0].run_id
            return bool(letters)

        wait_until(stack, dead, 40, f"the {side} dead letter")
    yield World(
        stack=stack,
        tenants=tenants,
        schedule=schedule,
        run=run,
        backfill=backfill,
        dead_schedule=dead_schedule,
        dead_run=dead_run,
        channels=channels,
    )
    for name, ch in channels.items():
        if name != "admin":
            ch.close()


Request = Callable[[World, str], Any]
S = scheduler_service_pb2
R = run_reporting_service_pb2
D = dead_letter_service_pb2
T = tenant_service_pb2
K = api_key_service_pb2


def _update(w: World, side: str) -> Any:
    s = w.admin().GetSchedule(S.GetScheduleRequest(id=w.schedule[side]), timeout=10)
    upd = schedule_pb2.Schedule()
    upd.CopyFrom(s)
    upd.name = "authz updated"
    return S.UpdateScheduleRequest(schedule=upd)


@dataclass(frozen=True)
class Case:
    service: str
    method: str
    roles: frozenset[str]
    request: Request
    # What a tenant role (or the worker, for reporting) gets for the foreign tenant's resource.
    foreign: grpc.StatusCode = NOT_FOUND
    # What an allowed call gets once an earlier one acted on the same resource (None: OK).
    again: grpc.StatusCode | None = None


_STUBS: dict[str, Any] = {
    "SchedulerService": scheduler_service_pb2_grpc.SchedulerServiceStub,
    "RunReportingService": run_reporting_service_pb2_grpc.RunReportingServiceStub,
    "DeadLetterService": dead_letter_service_pb2_grpc.DeadLetterServiceStub,
    "TenantService": tenant_service_pb2_grpc.TenantServiceStub,
    "ApiKeyService": api_key_service_pb2_grpc.ApiKeyServiceStub,
    "AuditService": audit_service_pb2_grpc.AuditServiceStub,
}

_BEAT = R.RUN_EVENT_KIND_HEARTBEAT
_DONE = R.RUN_EVENT_KIND_SUCCEEDED

CASES = [
    Case(
        "SchedulerService",
        "CreateSchedule",
        MANAGE,
        lambda w, side: S.CreateScheduleRequest(schedule=_cron(w.tenants[side], "authz new")),
        foreign=DENIED,
    ),
    Case(
        "SchedulerService",
        "BatchCreateSchedules",
        MANAGE,
        lambda w, side: S.BatchCreateSchedulesRequest(
            items=[S.CreateScheduleRequest(schedule=_cron(w.tenants[side], "authz batch"))]
        ),
        # Refused per item (its error_code PERMISSION_DENIED); the call itself succeeds.
        foreign=OK,
    ),
    Case(
        "SchedulerService", "GetSchedule", READ, lambda w, s: S.GetScheduleRequest(id=w.schedule[s])
    ),
    Case("SchedulerService", "ListSchedules", READ, lambda w, s: S.ListSchedulesRequest(), OK),
    Case(
        "SchedulerService",
        "PauseSchedule",
        MANAGE,
        lambda w, s: S.PauseScheduleRequest(id=w.schedule[s]),
    ),
    Case(
        "SchedulerService",
        "ResumeSchedule",
        MANAGE,
        lambda w, s: S.ResumeScheduleRequest(id=w.schedule[s]),
    ),
    Case(
        "SchedulerService",
        "DeleteSchedule",
        MANAGE,
        lambda w, s: S.DeleteScheduleRequest(id=w.fresh_schedule(s)),
    ),
    Case(
        "SchedulerService",
        "ListRuns",
        READ,
        lambda w, s: S.ListRunsRequest(schedule_id=w.schedule[s]),
    ),
    Case("SchedulerService", "GetRun", READ, lambda w, s: S.GetRunRequest(run_id=w.run[s])),
    Case("SchedulerService", "UpdateSchedule", MANAGE, _update),
    Case(
        "SchedulerService",
        "CancelSchedule",
        MANAGE,
        lambda w, s: S.CancelScheduleRequest(id=w.fresh_schedule(s)),
    ),
    Case(
        "SchedulerService",
        "TriggerSchedule",
        MANAGE,
        lambda w, s: S.TriggerScheduleRequest(id=w.schedule[s], force=True),
    ),
    Case("SchedulerService", "RerunRun", MANAGE, lambda w, s: S.RerunRunRequest(run_id=w.run[s])),
    Case(
        "SchedulerService",
        "BackfillSchedule",
        MANAGE,
        lambda w, s: S.BackfillScheduleRequest(
            id=w.schedule[s],
            start_time=ts(datetime(2024, 1, 1, tzinfo=UTC)),
            end_time=ts(datetime(2024, 6, 1, tzinfo=UTC)),
        ),
    ),
    Case(
        "SchedulerService",
        "GetBackfill",
        READ,
        lambda w, s: S.GetBackfillRequest(backfill_id=w.backfill[s]),
    ),
    Case(
        "SchedulerService",
        "PreviewSchedule",
        READ,
        lambda w, s: S.PreviewScheduleRequest(id=w.schedule[s], count=3),
    ),
    Case(
        "SchedulerService",
        "ListDependencies",
        READ,
        lambda w, s: S.ListDependenciesRequest(schedule_id=w.schedule[s]),
    ),
    Case(
        "RunReportingService",
        "ReportRuns",
        WORKER,
        lambda w, s: R.ReportRunsRequest(events=[w.event(s, _BEAT)]),
        foreign=DENIED,
    ),
    Case("RunReportingService", "StartRun", WORKER, lambda w, s: w.event(s, 0), foreign=DENIED),
    Case("RunReportingService", "HeartbeatRun", WORKER, lambda w, s: w.event(s, 0), DENIED),
    Case("RunReportingService", "CompleteRun", WORKER, lambda w, s: w.event(s, _DONE), DENIED),
    Case(
        "DeadLetterService",
        "ListDeadLetters",
        READ,
        lambda w, s: D.ListDeadLettersRequest(schedule_id=w.dead_schedule[s]),
    ),
    Case(
        "DeadLetterService",
        "GetDeadLetter",
        READ,
        lambda w, s: D.GetDeadLetterRequest(run_id=w.dead_run[s]),
    ),
    Case(
        "DeadLetterService",
        "RedriveDeadLetter",
        MANAGE,
        lambda w, s: D.RedriveDeadLetterRequest(run_id=w.dead_run[s]),
        # A dead letter is re-driven once: the admin's call does, the tenant-admin's finds it
        # done (the authorization and the scope passed).
        again=grpc.StatusCode.FAILED_PRECONDITION,
    ),
    Case(
        "DeadLetterService",
        "RedriveDeadLetters",
        MANAGE,
        lambda w, s: D.RedriveDeadLettersRequest(schedule_id=w.dead_schedule[s]),
    ),
    Case(
        "TenantService",
        "CreateTenant",
        ADMIN,
        lambda w, s: T.CreateTenantRequest(tenant=T.Tenant(id=f"authz-new-{uuid.uuid4().hex[:8]}")),
    ),
    Case("TenantService", "GetTenant", READ, lambda w, s: T.GetTenantRequest(id=w.tenants[s])),
    Case("TenantService", "ListTenants", ADMIN, lambda w, s: T.ListTenantsRequest()),
    Case(
        "TenantService",
        "UpdateTenant",
        ADMIN,
        lambda w, s: T.UpdateTenantRequest(tenant=T.Tenant(id=w.tenants[s], tier="standard")),
    ),
    Case(
        "TenantService",
        "DeleteTenant",
        ADMIN,
        lambda w, s: T.DeleteTenantRequest(id=_new_tenant(w)),
    ),
    Case(
        "ApiKeyService",
        "CreateApiKey",
        MANAGE,
        lambda w, s: K.CreateApiKeyRequest(role="tenant-reader", tenant_id=w.tenants[s]),
        foreign=DENIED,
    ),
    Case(
        "ApiKeyService",
        "ListApiKeys",
        MANAGE,
        lambda w, s: K.ListApiKeysRequest(tenant_id=w.tenants[s]),
        foreign=DENIED,
    ),
    Case(
        "ApiKeyService",
        "RevokeApiKey",
        MANAGE,
        lambda w, s: K.RevokeApiKeyRequest(key_id=w.fresh_key(s)),
    ),
    Case(
        "AuditService",
        "ListAuditEvents",
        READ,
        lambda w, s: audit_service_pb2.ListAuditEventsRequest(tenant_id=w.tenants[s]),
        # Another tenant's entries: an empty answer, as for a tenant with none.
        foreign=OK,
    ),
]


def _new_tenant(w: World) -> str:
    t = f"authz-gone-{uuid.uuid4().hex[:8]}"
    tenant_service_pb2_grpc.TenantServiceStub(w.stack.channel).CreateTenant(
        T.CreateTenantRequest(tenant=T.Tenant(id=t)), timeout=10
    )
    return t


def expected(case: Case, role: str, side: str, acted: set[str]) -> grpc.StatusCode:
    if role not in ROLES:
        return UNAUTH
    if role not in case.roles:
        return DENIED
    if side == "foreign" and role != "admin":
        return case.foreign
    if side in acted and case.again is not None:
        return case.again
    acted.add(side)
    return OK


def _call(w: World, case: Case, role: str, side: str) -> grpc.StatusCode:
    stub = _STUBS[case.service](w.channels[role])
    try:
        getattr(stub, case.method)(case.request(w, side), timeout=15)
    except grpc.RpcError as e:
        return e.code()
    return OK


def test_every_method_of_the_server_is_in_the_table() -> None:
    from scheduler.api.auth import METHOD_ROLES

    served = {f"/cronscale.v1.{c.service}/{c.method}" for c in CASES}
    assert served == set(METHOD_ROLES)
    for c in CASES:
        table = {r.value for r in METHOD_ROLES[f"/cronscale.v1.{c.service}/{c.method}"]}
        assert table == set(c.roles), c.method


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.method)
def test_authorization_matrix(world: World, case: Case) -> None:
    got: dict[tuple[str, str], grpc.StatusCode] = {}
    want: dict[tuple[str, str], grpc.StatusCode] = {}
    acted: set[str] = set()
    for role in world.channels:
        for side in ("own", "foreign"):
            if role not in ROLES and side == "foreign":
                continue
            want[(role, side)] = expected(case, role, side, acted)
            got[(role, side)] = _call(world, case, role, side)
    assert got == want


def test_a_tenant_role_lists_only_its_tenant(world: World) -> None:
    reader = scheduler_service_pb2_grpc.SchedulerServiceStub(world.channels["tenant-reader"])
    seen: set[str] = set()
    token = ""
    while True:
        page = reader.ListSchedules(
            S.ListSchedulesRequest(page_size=1000, page_token=token), timeout=15
        )
        seen |= {s.tenant for s in page.schedules}
        token = page.next_page_token
        if not token:
            break
    assert seen == {world.tenants["own"]}


def test_a_tenant_s_listing_reads_its_index_in_full_pages(world: World) -> None:
    """By the schedules_by_tenant index: every page but the last is full, for a tenant role
    and for an admin naming the tenant; naming another tenant is refused alike whether it
    exists or not; a malformed name is INVALID_ARGUMENT."""
    admin = scheduler_service_pb2_grpc.SchedulerServiceStub(world.channels["admin"])
    reader = scheduler_service_pb2_grpc.SchedulerServiceStub(world.channels["tenant-reader"])
    own = world.tenants["own"]
    created = {
        admin.CreateSchedule(
            S.CreateScheduleRequest(schedule=_cron(own, f"listed-{i}")), timeout=15
        ).id
        for i in range(5)
    }
    for stub, named in ((reader, ""), (reader, own), (admin, own)):
        ids: list[str] = []
        token = ""
        while True:
            page = stub.ListSchedules(
                S.ListSchedulesRequest(page_size=2, page_token=token, tenant=named), timeout=15
            )
            token = page.next_page_token
            assert len(page.schedules) == 2 or not token
            assert {s.tenant for s in page.schedules} <= {own}
            ids += [s.id for s in page.schedules]
            if not token:
                break
        assert created <= set(ids) and len(ids) == len(set(ids))
    for named in (world.tenants["foreign"], "no-such-tenant"):
        with pytest.raises(grpc.RpcError) as denied:
            reader.ListSchedules(S.ListSchedulesRequest(tenant=named), timeout=15)
        assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "tenant: a tenant-reader key lists the schedules of its own tenant" in str(
            denied.value.details()
        )
    with pytest.raises(grpc.RpcError) as bad:
        admin.ListSchedules(S.ListSchedulesRequest(tenant="no spaces"), timeout=15)
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant:" in str(bad.value.details())


def test_a_foreign_batch_item_is_refused_alone(world: World) -> None:
    api = scheduler_service_pb2_grpc.SchedulerServiceStub(world.channels["tenant-admin"])
    resp = api.BatchCreateSchedules(
        S.BatchCreateSchedulesRequest(
            items=[
                S.CreateScheduleRequest(schedule=_cron(world.tenants["foreign"], "x")),
                S.CreateScheduleRequest(schedule=_cron("", "mine")),
            ]
        ),
        timeout=15,
    )
    assert resp.results[0].error_code == "PERMISSION_DENIED"
    assert "items[0].schedule.tenant" in resp.results[0].error
    assert not resp.results[1].error_code
    assert resp.results[1].schedule.tenant == world.tenants["own"]


def test_every_mutating_rpc_leaves_an_audit_entry(world: World) -> None:
    from scheduler.api.audit import AUDITED

    reads = ("Get", "List", "Preview")
    mutating = [
        c for c in CASES if not c.method.startswith(reads) and c.service != "RunReportingService"
    ]
    assert {f"/cronscale.v1.{c.service}/{c.method}" for c in mutating} == set(AUDITED)
    audit = audit_service_pb2_grpc.AuditServiceStub(world.stack.channel)
    for case in mutating:
        role = "tenant-admin" if "tenant-admin" in case.roles else "admin"
        stub = _STUBS[case.service](world.channels[role])
        request = case.request(world, "own")
        full = f"/cronscale.v1.{case.service}/{case.method}"
        try:
            response = getattr(stub, case.method)(request, timeout=15)
        except grpc.RpcError as refused:
            # Only the once-only redrive refuses a repeat: its entry is the matrix test's.
            assert case.method == "RedriveDeadLetter", (case.method, refused)
            response, role = None, ""
        target = AUDITED[full].target(request, response)
        events = audit.ListAuditEvents(
            audit_service_pb2.ListAuditEventsRequest(action=case.method, target=target),
            timeout=15,
        ).events
        assert events, f"no audit entry for {case.method} {target}"
        entry = events[0]
        assert entry.request_id and entry.actor_key_id and entry.tenant_id, entry
        if role:
            assert entry.actor_role == role, (case.method, entry.actor_role)
        if role == "tenant-admin":
            assert entry.tenant_id == world.tenants["own"], (case.method, entry.tenant_id)
        if case.method in ("PauseSchedule", "UpdateSchedule", "CancelSchedule", "DeleteSchedule"):
            assert entry.before_json, case.method
        if case.method not in ("DeleteSchedule", "DeleteTenant"):
            assert entry.after_json, case.method
        assert "secret" not in entry.after_json
    # Tenant roles read only their tenant's entries; the service offers no way to change them.
    reader = audit_service_pb2_grpc.AuditServiceStub(world.channels["tenant-reader"])
    mine = reader.ListAuditEvents(audit_service_pb2.ListAuditEventsRequest(), timeout=15).events
    assert mine and {m.tenant_id for m in mine} == {world.tenants["own"]}
    methods = audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].methods
    assert [m.name for m in methods] == ["ListAuditEvents"]


def test_a_create_request_id_is_scoped_to_the_tenant(world: World) -> None:
    request_id = f"authz-{uuid.uuid4().hex}"
    mine = scheduler_service_pb2_grpc.SchedulerServiceStub(world.channels["tenant-admin"])
    first = mine.CreateSchedule(
        S.CreateScheduleRequest(schedule=_cron("", "rid"), request_id=request_id), timeout=15
    )
    again = mine.CreateSchedule(
        S.CreateScheduleRequest(schedule=_cron("", "rid"), request_id=request_id), timeout=15
    )
    assert again.id == first.id
    other = world.admin().CreateSchedule(
        S.CreateScheduleRequest(
            schedule=_cron(world.tenants["foreign"], "rid"), request_id=request_id
        ),
        timeout=15,
    )
    assert other.id != first.id and other.tenant == world.tenants["foreign"]
