"""The hot-path microbenchmarks (loadtest.hot_path) run against the real Cassandra and Kafka,
print a figure for each step and leave no keyspace behind; the run step's api acknowledges and
records every run (the step fails otherwise)."""

from __future__ import annotations

import re

import pytest
from cassandra.cluster import Session

from loadtest.hot_path import main
from scheduler.config import Config


def test_each_step_prints_its_cost_and_the_keyspace_is_dropped(
    config: Config, session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--events", "40", "--messages", "400", "--runs", "200", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    keyspace = re.search(r"keyspace (cs_hot_[0-9a-f]{8})", out)
    assert keyspace is not None, out
    for step, unit in (
        ("report", "an event"),
        ("plan", "a firing"),
        ("grouped write", "a firing"),
        ("produce", "a message"),
        ("run", "a run"),
    ):
        line = re.search(rf"^{step} +([0-9.]+) µs {unit}", out, re.MULTILINE)
        assert line is not None and float(line[1]) > 0, out
    assert "passes: " in out
    left = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (keyspace[1],),
    ).all()
    assert left == []
