"""ListDependencies without a schedule answers a bounded page at a time."""

from __future__ import annotations

from cronscale.v1 import scheduler_service_pb2
from tests.e2e.conftest import Stack
from tests.e2e.support import create_schedule, cron_spec


def test_all_edges_come_a_page_at_a_time(stack: Stack) -> None:
    up = create_schedule(stack, name="up", handler="echo", spec=cron_spec("0 0 1 1 *"))
    downs = {create_schedule(stack, name="d", handler="echo", after=[up.id]).id for _ in range(3)}
    seen: set[tuple[str, str]] = set()
    token, pages = "", 0
    while True:
        resp = stack.api.ListDependencies(
            scheduler_service_pb2.ListDependenciesRequest(page_size=2, page_token=token),
            timeout=10,
        )
        pages += 1
        # Two schedules scanned, each with one upstream at most here.
        assert len(resp.edges) <= 2
        seen |= {(e.upstream_id, e.downstream_id) for e in resp.edges}
        token = resp.next_page_token
        if not token:
            break
    assert {(up.id, d) for d in downs} <= seen
    assert pages >= 2
    bad = stack.cli("schedule", "deps", "--json")
    assert bad.returncode == 0 and up.id in bad.stdout, bad.stderr
