"""Checks for the tools the local stack needs on the machine: Java 17 and Maven."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from typing import Final

from ops.local.errors import LocalStackError

logger = logging.getLogger(__name__)

REQUIRED_JAVA_MAJOR: Final = 17
_VERSION_RE: Final = re.compile(r'version "([^"]+)"')


def parse_java_major(version_output: str) -> int | None:
    """The major version in ``java -version`` output (``"1.8.0_392"`` -> 8, ``"17.0.15"`` -> 17)."""
    match = _VERSION_RE.search(version_output)
    if match is None:
        return None
    parts = re.split(r"[.\-+_]", match.group(1))
    try:
        if parts[0] == "1" and len(parts) > 1:
            return int(parts[1])
        return int(parts[0])
    except ValueError:
        return None


def check_java(java: str) -> str:
    """Fail unless ``java`` is a Java 17 runtime; return its version string (e.g. ``17.0.15``).

    Cassandra 5.0 runs on Java 11 and 17 only and Kafka 4 brokers need 17, so 17 it is.
    """
    found = "none"
    if shutil.which(java) is not None:
        try:
            proc = subprocess.run(
                [java, "-version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            found = f"{java} failed to run: {exc}"
        else:
            output = proc.stderr + proc.stdout
            match = _VERSION_RE.search(output)
            major = parse_java_major(output)
            if match is not None and major == REQUIRED_JAVA_MAJOR:
                logger.debug("using java %s at %s", match.group(1), shutil.which(java))
                return match.group(1)
            found = match.group(1) if match is not None else output.strip()[:200] or "unknown"
    raise LocalStackError(f"Java 17 is required (found {found}); install openjdk-17-jdk")


def check_maven(mvn: str) -> None:
    """Fail unless the Maven executable ``mvn`` is on the PATH."""
    if shutil.which(mvn) is None:
        raise LocalStackError("Maven (mvn) is required: apt-get install maven")
