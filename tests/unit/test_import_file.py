"""`cronscale schedule import`'s file: batches, line numbers and the first bad line, the same
whether the file is read in one process or cut into parts read by several."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cronscale.v1 import scheduler_service_pb2 as api
from scheduler.cli import import_file
from scheduler.cli.import_file import IMPORT_BATCH, ImportFileError, read_import_file


def _line(i: int) -> str:
    return json.dumps(
        {
            "schedule_id": f"s-{i}",
            "schedule": {
                "name": f"n{i}",
                "handler": "echo",
                "spec": {"cron": {"expression": "@daily"}},
            },
        }
    )


def _write(path: Path, count: int, *, blank_every: int = 0) -> dict[str, int]:
    """``count`` schedules, a blank line after every ``blank_every``-th; their line numbers."""
    where: dict[str, int] = {}
    lines: list[str] = []
    for i in range(count):
        lines.append(_line(i))
        where[f"s-{i}"] = len(lines)
        if blank_every and i % blank_every == 0:
            lines.append("   ")
    path.write_text("\n".join(lines) + "\n")
    return where


def _read(path: Path) -> tuple[list[tuple[str, int]], int]:
    batches, total = read_import_file(str(path))
    out: list[tuple[str, int]] = []
    for batch in batches:
        request = api.BatchCreateSchedulesRequest.FromString(batch.request)
        assert len(request.items) == len(batch.lines) <= IMPORT_BATCH
        out += [(item.schedule_id, n) for item, n in zip(request.items, batch.lines, strict=True)]
    return out, total


@pytest.mark.parametrize("part_bytes", [1 << 30, 1 << 12, 997])
def test_every_line_once_with_its_line_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part_bytes: int
) -> None:
    # part_bytes: one part; parts of ~30 lines; a part boundary inside nearly every line.
    monkeypatch.setattr(import_file, "PART_BYTES", part_bytes)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(4)))
    path = tmp_path / "f.jsonl"
    where = _write(path, 1_203, blank_every=7)
    items, total = _read(path)
    assert total == 1_203
    assert items == sorted(where.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("part_bytes", [1 << 30, 1 << 12])
def test_the_first_bad_line_is_named_whichever_part_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part_bytes: int
) -> None:
    monkeypatch.setattr(import_file, "PART_BYTES", part_bytes)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(4)))
    lines = [_line(i) for i in range(400)]
    lines[250] = '{"schedule": {"handler": 3}}'
    lines[320] = "{not json"
    path = tmp_path / "f.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFileError, match=rf"^{path}:251: .*handler"):
        read_import_file(str(path))


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes((_line(0) + "\n").encode() + b'{"schedule_id": "\xff"}\n')
    with pytest.raises(ImportFileError, match=rf"^{path}:2: .*utf-8"):
        read_import_file(str(path))


def test_an_empty_file_has_nothing_to_send(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text("")
    assert read_import_file(str(path)) == ([], 0)
