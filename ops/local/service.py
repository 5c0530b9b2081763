"""What every local server (Cassandra, Kafka) provides to the stack that starts and stops it."""

from __future__ import annotations

import abc
import logging
import shutil
import string
from pathlib import Path
from typing import ClassVar

from ops.local.settings import PACKAGE_DIR, LocalSettings, PortSpec

logger = logging.getLogger(__name__)


class LocalService(abc.ABC):
    """One JVM server of the local stack, configured from :class:`LocalSettings`.

    The stack drives every service through the same steps: resolve its classpath (``pom``,
    ``version_property``, ``main_jar``), :meth:`prepare` its config and storage,
    launch :meth:`command`, and poll :meth:`probe` until it answers.
    """

    name: ClassVar[str]
    pom: ClassVar[Path]
    version_property: ClassVar[str]

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings

    @property
    def version(self) -> str:
        """The configured server version."""
        return self.settings.version(self.name)

    @property
    @abc.abstractmethod
    def main_jar(self) -> str:
        """The jar that proves the classpath was resolved, e.g. ``cassandra-all-5.0.8.jar``."""

    @property
    def lib_dir(self) -> Path:
        """The folder holding this service's classpath."""
        return self.settings.lib_dir(self.name)

    @property
    def port(self) -> int:
        """The port clients use."""
        return self.settings.client_port(self.name)

    @property
    def address(self) -> str:
        """``host:port`` that clients use."""
        return f"{self.settings.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        """Where the pid of the running server is recorded."""
        return self.settings.pid_file(self.name)

    @property
    def console_log(self) -> Path:
        """The server's stdout and stderr."""
        return self.settings.console_log(self.name)

    def ports(self) -> list[PortSpec]:
        """Every port the server listens on."""
        return self.settings.ports(self.name)

    def markers(self) -> list[str]:
        """JVM arguments that identify this server of this stack in a process listing."""
        return [
            f"-Dcronscale.local.service={self.name}",
            f"-Dcronscale.local.home={self.settings.home}",
        ]

    def classpath(self) -> str:
        """A JVM classpath wildcard over the lib folder."""
        return str(self.lib_dir / "*")

    @abc.abstractmethod
    def prepare(self) -> None:
        """Create the data, log and conf folders, write the config; format storage if needed.

        Called right before every launch: config is regenerated from the templates each time.
        Raises :class:`~ops.local.errors.LocalStackError` when preparation fails.
        """

    @property
    def timer_slack_ns(self) -> int:
        """The timer slack the server is launched with (ns; 0: the launching process's)."""
        return 0

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The full ``java ...`` command line that runs the server in the foreground."""

    @abc.abstractmethod
    def probe(self) -> str | None:
        """Ask the server whether it serves clients; a short detail when it does, else None.

        Never raises for "not ready yet": connection refused, timeouts and protocol errors all
        mean None. Each call returns within a few seconds.
        """

    # Helpers for subclasses -------------------------------------------------------------------

    def _make_dirs(self) -> None:
        for path in (
            self.settings.data_dir(self.name),
            self.settings.logs_dir(self.name),
            self.settings.conf_dir(self.name),
        ):
            path.mkdir(parents=True, exist_ok=True)

    def _render(self, template: str, target: str, **values: object) -> Path:
        text = (PACKAGE_DIR / template).read_text(encoding="utf-8")
        rendered = string.Template(text).substitute({k: str(v) for k, v in values.items()})
        path = self.settings.conf_dir(self.name) / target
        path.write_text(rendered, encoding="utf-8")
        return path

    def _copy(self, source: str) -> Path:
        path = self.settings.conf_dir(self.name) / source
        shutil.copyfile(PACKAGE_DIR / source, path)
        return path
