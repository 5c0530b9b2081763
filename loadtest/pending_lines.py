"""What a scanner's bookkeeping of pending timers costs per timer, without any store.

    python -m loadtest.pending_lines --timers 200000

Replays the spread load's shape through ``bucketer.pending`` alone: 64 shards, timers due
evenly over each second, read one second ahead (each row looked up twice,
as a read and ``_take`` do, then kept), and handed by rounds every 100 ms (each shard's due
lines taken and popped), each round also finding the first pending timer from the oldest
bucket (``record_progress``). Prints the best of ``--repeat`` passes in CPU microseconds per
timer. To compare two commits, run it from a worktree of each (``loadtest/README.md``).
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from bucketer.model import Timer
from bucketer.pending import Line, PendingTimers

SHARDS = 64
T0 = datetime(2026, 12, 5, tzinfo=UTC)
READ_AHEAD = timedelta(seconds=1)
ROUND = timedelta(milliseconds=100)


def spread(count: int, per_second: int) -> list[Timer]:
    """``count`` timers, ``per_second`` due each second, spread over its milliseconds; in order."""
    timers = [
        Timer(
            fire_time=T0 + timedelta(seconds=i // per_second, milliseconds=(i * 37) % 1000),
            timer_id=f"t{i:08d}",
            shard=i % SHARDS,
            kind="fire",
            key=f"k{i}",
        )
        for i in range(count)
    ]
    timers.sort(key=lambda t: t.position)
    return timers


def _due(line: Line, until: datetime) -> list[Timer]:
    # Before 137c227 a line had no ``due_timers``: a shallow round took ``timers(None, until)``.
    if hasattr(line, "due_timers"):
        return line.due_timers(until)
    return list(line.timers(None, until))


def one_pass(timers: list[Timer]) -> tuple[float, int]:
    """Reads and hands every timer of ``timers`` (in order) round by round; returns the CPU
    seconds it took and how many timers were handed."""
    shards = [PendingTimers() for _ in range(SHARDS)]
    end = timers[-1].fire_time + READ_AHEAD if timers else T0
    started = time.process_time()
    read = handed = 0
    now = timers[0].fire_time if timers else T0
    while now <= end:
        while read < len(timers) and timers[read].fire_time <= now + READ_AHEAD:
            t = timers[read]
            pending = shards[t.shard]
            pending.get(t.position)
            if pending.get(t.position) is None:
                pending.put(t, "")
            read += 1
        for pending in shards:
            for line in list(pending.lines()):
                due = _due(line, now)
                for t in due:
                    pending.pop(t.position)
                handed += len(due)
            pending.first_from(T0)
        now += ROUND
    return time.process_time() - started, handed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=200_000, help="timers put and handed")
    parser.add_argument("--per-second", type=int, default=1_667, help="timers due a second")
    parser.add_argument("--repeat", type=int, default=3, help="passes; the best is reported")
    args = parser.parse_args()
    if args.timers < 1 or args.per_second < 1 or args.repeat < 1:
        parser.error("--timers, --per-second and --repeat must be at least 1")
    timers = spread(args.timers, args.per_second)
    best = min(one_pass(timers)[0] for _ in range(args.repeat))
    per_timer = best / len(timers) * 1e6
    print(f"{per_timer:.2f} CPU µs per timer ({args.timers:,} timers, best of {args.repeat})")


if __name__ == "__main__":
    main()
