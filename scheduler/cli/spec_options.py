"""Command-line options for a spec's bounds, jitter and DST rules, and for execution policies.

Shared by ``schedule create`` and ``schedule preview`` (and usable by any command that builds a
spec); :mod:`scheduler.cli.build` turns the parsed values into protobuf fields.
"""

from __future__ import annotations

import argparse

from scheduler.cli.build import (
    DST_GAPS,
    DST_OVERLAPS,
    MISFIRES,
    OVERLAPS,
    parse_at,
    parse_choice,
    parse_duration,
)

_DST_OPTIONS = ("dst_gap", "dst_overlap")


def add_spec_options(p: argparse.ArgumentParser, *, max_runs: bool = True) -> None:
    """``--jitter --start --end [--max-runs] --dst-gap --dst-overlap``."""
    p.add_argument(
        "--jitter",
        metavar="DURATION",
        type=parse_duration,
        help="delay each slot by a stable offset in [0, DURATION) derived from the schedule id "
        "(at most the shortest period), e.g. 30s",
    )
    p.add_argument(
        "--start", metavar="ISO8601", type=parse_at, help="no slot before this instant fires"
    )
    p.add_argument(
        "--end",
        metavar="ISO8601",
        type=parse_at,
        help="no slot after this instant fires; the schedule then completes",
    )
    if max_runs:
        p.add_argument(
            "--max-runs",
            metavar="N",
            type=int,
            help="complete after N fired runs (default: no limit)",
        )
    p.add_argument(
        "--dst-gap",
        metavar="SHIFT|SKIP",
        type=parse_choice,
        choices=sorted(DST_GAPS),
        help="--cron wall times a spring-forward skips: fire after the gap (SHIFT) or not "
        "(SKIP); default: SHIFT for a fixed-time job, SKIP for a wildcard one",
    )
    p.add_argument(
        "--dst-overlap",
        metavar="ONCE|BOTH",
        type=parse_choice,
        choices=sorted(DST_OVERLAPS),
        help="--cron wall times a fall-back repeats: fire once or at both; default: ONCE for a "
        "fixed-time job, BOTH for a wildcard one",
    )


def add_policy_options(p: argparse.ArgumentParser) -> None:
    """``--overlap --misfire --catch-up-window --max-catch-up`` and the retry policy."""
    p.add_argument(
        "--overlap",
        metavar="|".join(OVERLAPS),
        type=parse_choice,
        choices=list(OVERLAPS),
        help="when the previous run is still running (default SKIP)",
    )
    p.add_argument(
        "--misfire",
        metavar="|".join(MISFIRES),
        type=parse_choice,
        choices=list(MISFIRES),
        help="slots missed while the fleet was down or the schedule paused (default FIRE_ONCE)",
    )
    p.add_argument(
        "--catch-up-window",
        metavar="DURATION",
        type=parse_duration,
        help="FIRE_ALL runs missed slots no older than this (default 1h)",
    )
    p.add_argument(
        "--max-catch-up",
        metavar="N",
        type=int,
        help="FIRE_ALL runs at most N missed slots (default 100)",
    )
    p.add_argument(
        "--max-attempts",
        metavar="N",
        type=int,
        help="attempts in all before a failing run is dead-lettered; 1 never retries (default 3)",
    )
    p.add_argument(
        "--initial-backoff",
        metavar="DURATION",
        type=parse_duration,
        help="wait before the second attempt (default 10s)",
    )
    p.add_argument(
        "--backoff-multiplier",
        metavar="X",
        type=float,
        help="each further wait is the previous one times X (default 2)",
    )
    p.add_argument(
        "--max-backoff",
        metavar="DURATION",
        type=parse_duration,
        help="no wait is longer than this (default 10m)",
    )
    p.add_argument(
        "--retry-jitter",
        dest="jitter_share",
        metavar="SHARE",
        type=float,
        help="share of each wait drawn at random, 0 to 1 (default 1: full jitter)",
    )


def check_dst_needs_cron(args: argparse.Namespace) -> str | None:
    """A usage problem if DST options come without ``--cron`` (they live in the cron spec)."""
    if args.cron is None:
        for name in _DST_OPTIONS:
            if getattr(args, name, None) is not None:
                return f"argument --{name.replace('_', '-')}: applies only to --cron"
    return None
