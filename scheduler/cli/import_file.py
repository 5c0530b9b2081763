"""Reading ``cronscale schedule import``'s JSON-lines file: every line parsed before anything is
sent, the work split over the machine's cores for a large file, each batch kept serialized.

A parsed ``CreateScheduleRequest`` costs ~1.5 KiB of memory and its wire form ~80 bytes, so a
file of 10,000,000 lines would take ~15 GiB parsed; batches kept serialized ~1.5 GiB. The
parse (``json_format.Parse``, ~30 µs a line) is the command's own cost, and it has to finish
before the first call: a large file is cut into byte ranges at line boundaries, one per core,
each parsed by a process of its own.
"""

from __future__ import annotations

import multiprocessing
import os
from array import array
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from google.protobuf import json_format

from cronscale.v1 import scheduler_service_pb2 as api

# Items per BatchCreateSchedules call (the server takes up to ``service.MAX_BATCH_CREATE``).
IMPORT_BATCH = 500
# A file is cut into parts of at least this many bytes (~25,000 lines of ~170 bytes, ~0.8 s of
# parsing) per process; a smaller file is parsed in the command's own process.
PART_BYTES = 4 << 20


@dataclass(frozen=True)
class ImportBatch:
    """One BatchCreateSchedules call's items, serialized, and the file line of each item."""

    request: bytes
    lines: array[int]


@dataclass(frozen=True)
class _Part:
    """What one byte range of the file held: its batches (line numbers counted from the
    range's first line, 1), how many lines started in it, and its first bad line (its number
    counted the same way, and the problem)."""

    batches: list[ImportBatch]
    lines: int
    error: tuple[int, str] | None


class ImportFileError(Exception):
    """A line of the file that is not a CreateScheduleRequest: ``path:line: problem``."""


def read_import_file(path: str) -> tuple[list[ImportBatch], int]:
    """The file's requests in batches of ``IMPORT_BATCH``, and how many: one
    CreateScheduleRequest per line, in the proto JSON mapping
    (``{"schedule_id": "...", "schedule": {"name": ..., "handler": ..., "spec": {...}}}``),
    blank lines skipped. The first line that does not parse raises ImportFileError naming it,
    so that nothing is sent from a file with a bad line."""
    size = os.path.getsize(path)
    count = max(1, min(len(os.sched_getaffinity(0)), size // PART_BYTES))
    bounds = [size * i // count for i in range(count + 1)]
    if count == 1:
        parts = [_read_part(path, 0, size)]
    else:
        # spawn, not fork: the command may already hold gRPC's threads.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(count, mp_context=context) as pool:
            parts = list(pool.map(_read_part, [path] * count, bounds[:-1], bounds[1:]))
    batches: list[ImportBatch] = []
    before = 0  # lines that started in the earlier parts
    for part in parts:
        if part.error is not None:
            number, problem = part.error
            raise ImportFileError(f"{path}:{before + number}: {problem}")
        for batch in part.batches:
            if before:
                batch = ImportBatch(batch.request, array("L", (n + before for n in batch.lines)))
            batches.append(batch)
        before += part.lines
    return batches, sum(len(b.lines) for b in batches)


def _read_part(path: str, start: int, end: int) -> _Part:
    """The lines that start at a byte in ``[start, end)``, parsed."""
    batches: list[ImportBatch] = []
    items: list[api.CreateScheduleRequest] = []
    numbers = array("L")

    def close() -> None:
        nonlocal items, numbers
        request = api.BatchCreateSchedulesRequest(items=items).SerializeToString()
        batches.append(ImportBatch(request, numbers))
        items, numbers = [], array("L")

    number = 0
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            f.readline()  # the rest of a line that started before this part
        position = f.tell()
        while position < end:
            raw = f.readline()
            if not raw:
                break
            position += len(raw)
            number += 1
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                items.append(json_format.Parse(line, api.CreateScheduleRequest()))
            except (UnicodeDecodeError, json_format.ParseError) as e:
                return _Part(batches, number, (number, str(e)))
            numbers.append(number)
            if len(items) == IMPORT_BATCH:
                close()
    if items:
        close()
    return _Part(batches, number, None)
