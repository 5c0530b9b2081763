"""The registration benchmark's one-call-a-schedule mode (``loadtest.registration --single``)
against a real api, Cassandra and all: it reports both passes, and Cassandra's own counters show
what each kind of id costs: a plain row write for an id the server mints, a Paxos round (a read
of the row, ``system.paxos`` writes) for an id the client chooses."""

from __future__ import annotations

import re

import pytest

from loadtest.registration import main


def test_single_calls_report_each_pass_and_what_each_kind_of_id_costs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--single", "30", "--in-flight", "4"]) == 0
    out = capsys.readouterr().out
    passes = re.findall(
        r"^CreateSchedule, (server|client)-chosen ids: 30 calls \(4 in flight\).* "
        r"= ([0-9,]+) schedules/s.*\n- Cassandra's operations per schedule.*: (.*)$",
        out,
        re.MULTILINE,
    )
    assert [p[0] for p in passes] == ["server", "client"], out
    (_, minted_rate, minted_ops), (_, chosen_rate, chosen_ops) = passes
    assert int(minted_rate.replace(",", "")) > 0 and int(chosen_rate.replace(",", "")) > 0
    # The LWT reads the row first; its keyspace is the benchmark's own. (Paxos's table is
    # counted over the node, where other stacks' shard leases write too.)
    assert "schedules 1 partition writes" in minted_ops
    assert "schedules 1 partition reads" not in minted_ops
    assert "schedules 1 partition reads, 1 partition writes" in chosen_ops
    assert "system.paxos" in chosen_ops
