"""A second host on this machine: a network namespace joined to the root one by a veth pair.

Processes started with :meth:`SimulatedHost.command` run inside the namespace: their loopback
is their own, and they reach the root namespace's Cassandra, Kafka and api only over the veth
pair, through two relays (``loadtest.forward``): one in the namespace listening on its loopback
at the services' ports, one in the root namespace listening on the veth address. The processes
need no configuration of their own (every address is still 127.0.0.1, which is also what Kafka
advertises), and the traffic stays on this machine.

Needs root (``ip netns``); :meth:`SimulatedHost.up` says so if it is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType


class NetnsUnavailable(RuntimeError):
    """The namespace or its link could not be set up."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsUnavailable(
            f"`ip {' '.join(args)}` failed ({done.stderr.strip() or done.returncode}); a "
            "simulated host needs root and iproute2 (`apt-get install iproute2`)"
        )


class SimulatedHost:
    """Namespace ``name`` at ``10.77.<index>.2``; the root side of its link is ``.1``."""

    def __init__(self, name: str, index: int, *, env: dict[str, str], logs: Path) -> None:
        if not 1 <= index <= 254:
            raise ValueError(f"index must be 1-254, got {index}")
        self.name = name
        self.host_ip = f"10.77.{index}.1"
        self.address = f"10.77.{index}.2"
        # Interface names are at most 15 characters.
        self._outside = f"cso{index}"
        self._inside = f"csi{index}"
        self._env = env
        self._logs = logs
        self._relays: list[subprocess.Popen[bytes]] = []

    def up(self, ports: Sequence[int]) -> None:
        """Creates the namespace and its link, and relays ``ports`` (on 127.0.0.1 inside) to
        the same ports on the root namespace's loopback."""
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` command: install iproute2 (`apt-get install iproute2`)")
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self._outside, "type", "veth", "peer", "name", self._inside)
            _ip("link", "set", self._inside, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self._outside)
            _ip("link", "set", self._outside, "up")
            for args in (
                ("addr", "add", f"{self.address}/30", "dev", self._inside),
                ("link", "set", self._inside, "up"),
                ("link", "set", "lo", "up"),
            ):
                _ip("netns", "exec", self.name, "ip", *args)
            self.relay(ports)
        except BaseException:
            self.down()
            raise

    def relay(self, ports: Sequence[int]) -> list[subprocess.Popen[bytes]]:
        """Relays ``ports`` (on 127.0.0.1 inside) to the same ports on the root namespace's
        loopback, through a relay pair of their own; returns it (for :meth:`stop_relays`)."""
        before = len(self._relays)
        self._relay([f"{self.host_ip}:{p}=127.0.0.1:{p}" for p in ports], inside=False)
        self._relay([f"127.0.0.1:{p}={self.host_ip}:{p}" for p in ports], inside=True)
        return self._relays[before:]

    def stop_relays(self, relays: Sequence[subprocess.Popen[bytes]]) -> None:
        """Stops relays :meth:`relay` started: their ports drop off, the others stay."""
        for proc in relays:
            proc.kill()
            proc.wait()
            self._relays.remove(proc)

    def _relay(self, routes: list[str], *, inside: bool) -> None:
        cmd = [sys.executable, "-m", "loadtest.forward", *routes]
        where = "inside" if inside else "outside"
        with (self._logs / f"relay-{self.name}-{where}.log").open("ab") as log:
            proc = subprocess.Popen(
                self.command(cmd) if inside else cmd,
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self._relays.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise NetnsUnavailable(
                f"the {where} relay of {self.name} did not start; see "
                f"{self._logs / f'relay-{self.name}-{where}.log'}"
            )

    @property
    def relay_pids(self) -> list[int]:
        return [p.pid for p in self._relays]

    def command(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside the namespace (the same pid: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def cut(self) -> None:
        """Takes the link down: the host drops off the network (its processes keep running)."""
        _ip("link", "set", self._outside, "down")

    def down(self) -> None:
        """Stops the relays and removes the namespace (its end of the link goes with it)."""
        for proc in self._relays:
            proc.kill()
        for proc in self._relays:
            proc.wait()
        self._relays.clear()
        subprocess.run(["ip", "link", "del", self._outside], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def __enter__(self) -> SimulatedHost:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()
