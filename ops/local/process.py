"""Processes, pid files and ports: the operating-system side of the local stack."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ops.local.errors import LocalStackError

logger = logging.getLogger(__name__)

# Popen objects of the servers this Python process launched, kept for the life of the process:
# polling them reaps a server that died (otherwise it lingers as a zombie that still "exists"),
# and dropping them would make Popen.__del__ warn that the child is still running.
_CHILDREN: Final[dict[int, subprocess.Popen[bytes]]] = {}

_KILL_WAIT_S: Final = 10.0

StopOutcome = Literal["terminated", "killed", "already exited"]


@dataclass(frozen=True, kw_only=True)
class PidRecord:
    """The content of a pid file."""

    pid: int
    port: int


def read_pid_file(path: Path) -> PidRecord | None:
    """The record in ``path``, or None when it is missing or unreadable."""
    try:
        lines = path.read_text(encoding="ascii").split()
        return PidRecord(pid=int(lines[0]), port=int(lines[1]))
    except (OSError, ValueError, IndexError):
        return None


def write_pid_file(path: Path, record: PidRecord) -> None:
    """Write ``record`` (pid on line 1, port on line 2) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{record.pid}\n{record.port}\n", encoding="ascii")
    tmp.replace(path)


def remove_pid_file(path: Path) -> None:
    """Delete ``path`` if it exists."""
    path.unlink(missing_ok=True)


# prctl(2) options: the calling thread's timer slack, which threads and processes it creates
# inherit (and keep across execve).
_PR_SET_TIMERSLACK: Final = 29
_PR_GET_TIMERSLACK: Final = 30


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int = 0) -> int:
    result = int(_libc().prctl(option, ctypes.c_ulong(value), 0, 0, 0))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")
    return result


def current_timer_slack() -> int:
    """This thread's timer slack, in nanoseconds (OSError, or AttributeError where the C library
    has no prctl: not Linux)."""
    return _prctl(_PR_GET_TIMERSLACK)


@contextlib.contextmanager
def timer_slack(ns: int) -> Iterator[None]:
    """This thread's timer slack set to ``ns`` nanoseconds for the block, then put back: a
    process started inside the block keeps ``ns``, and so does every thread it starts. 0 (or a
    system without prctl) leaves it alone."""
    if ns <= 0:
        yield
        return
    try:
        before = current_timer_slack()
        _prctl(_PR_SET_TIMERSLACK, ns)
    except (OSError, AttributeError) as e:  # not Linux: no prctl, or no timer slack
        logger.warning("cannot set the timer slack of the process to launch: %s", e)
        yield
        return
    try:
        yield
    finally:
        _prctl(_PR_SET_TIMERSLACK, before)


def launch(
    cmd: list[str], *, log_path: Path, cwd: Path, timer_slack_ns: int = 0
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session with stdout and stderr going to ``log_path``, and with
    ``timer_slack_ns`` as its timer slack (0: this process's).

    The previous run's log is kept as ``<log>.prev`` so a crash can still be read after a restart.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():
        log_path.replace(log_path.with_name(log_path.name + ".prev"))
    logger.debug("launching %s", " ".join(cmd))
    with log_path.open("wb") as log, timer_slack(timer_slack_ns):
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc


def exit_code(pid: int) -> int | None:
    """The exit code of a server this process launched, once it has exited, else None."""
    child = _CHILDREN.get(pid)
    return None if child is None else child.poll()


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (reaping it when it is our child)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            return False
    else:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child: its parent reaps it
        else:
            if reaped == pid:
                return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return _proc_state(pid) != "Z"


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name in parentheses may itself contain spaces or parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] if fields else None


def cmdline(pid: int) -> str | None:
    """The command line of ``pid`` with arguments separated by spaces, or None if unknown."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return None
        return _ps_cmdline(pid)
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip() or None


def _ps_cmdline(pid: int) -> str | None:
    try:
        proc = subprocess.run(
            ["ps", "-ww", "-o", "args=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


def owned_by_stack(pid: int, markers: list[str]) -> bool:
    """Whether ``pid`` is running and its command line carries every one of ``markers``.

    The servers are launched with ``-Dcronscale.local.service=...`` and
    ``-Dcronscale.local.home=...``, so a pid recycled by an unrelated process is never signalled.
    """
    if not is_running(pid):
        return False
    line = cmdline(pid)
    if line is None:
        return False
    # Whole-argument matches: a home of /tmp/a must not match a process started for /tmp/ab.
    padded = f" {line} "
    return all(f" {marker} " in padded for marker in markers)


def stop(pids: list[int], *, timeout_s: float) -> dict[int, StopOutcome]:
    """SIGTERM every pid at once, give them ``timeout_s`` to exit, then SIGKILL the rest."""
    outcomes: dict[int, StopOutcome] = {}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            outcomes[pid] = "already exited"
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        if pid not in outcomes and _wait_exit(pid, deadline - time.monotonic()):
            outcomes[pid] = "terminated"
    for pid in pids:
        if pid in outcomes:
            continue
        logger.warning("pid %s ignored SIGTERM for %.0f s; sending SIGKILL", pid, timeout_s)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            outcomes[pid] = "terminated"
            continue
        if not _wait_exit(pid, _KILL_WAIT_S):
            raise LocalStackError(f"process {pid} survived SIGKILL for {_KILL_WAIT_S:.0f} s")
        outcomes[pid] = "killed"
    return outcomes


def _wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def port_in_use(host: str, port: int) -> bool:
    """Whether something already holds ``host:port`` (a listener, or a socket bound to it).

    Tested by binding with SO_REUSEADDR, exactly as the servers will: TIME_WAIT leftovers of
    an earlier run do not count as "in use", a wildcard or loopback listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise LocalStackError(f"cannot bind {host}:{port}: {exc.strerror}") from None
    return False


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 30, width: int = 400) -> str:
    """The last ``lines`` lines of ``path``, each cut to ``width`` characters.

    Cassandra logs its whole configuration as one line of ~10,000 characters; uncut, that one
    line would drown the error message it is quoted in.
    """
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            last = deque(handle, maxlen=lines)
    except OSError:
        return f"({path} does not exist)"
    cut = [line.rstrip("\n") if len(line) <= width else line[:width] + " [...]" for line in last]
    return "\n".join(cut).rstrip("\n") or f"({path} is empty)"
