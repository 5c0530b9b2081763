"""Resolving a server's runtime classpath from Maven Central into a lib folder, once."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ops.local.errors import LocalStackError

logger = logging.getLogger(__name__)

MARKER_NAME: Final = ".resolved.json"
"""Written last, after every jar is in place: its absence means the folder is incomplete."""

_MVN_TIMEOUT_S: Final = 900.0


@dataclass(frozen=True, kw_only=True)
class ResolveResult:
    """What one resolution produced."""

    lib_dir: Path
    jars: int
    seconds: float


def lib_complete(lib_dir: Path, main_jar: str) -> bool:
    """Whether ``lib_dir`` holds a finished resolution that includes ``main_jar``.

    A folder is complete when its marker exists and every jar the marker lists is present, so a
    copy interrupted half-way (or a jar deleted by hand) is resolved again.
    """
    marker = lib_dir / MARKER_NAME
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        jars = [str(name) for name in recorded["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return main_jar in jars and all((lib_dir / name).is_file() for name in jars)


def resolve(
    *,
    mvn: str,
    pom: Path,
    version_property: str,
    version: str,
    lib_dir: Path,
    main_jar: str,
) -> ResolveResult:
    """Copy the runtime dependencies of ``pom`` at ``version`` into ``lib_dir``.

    Maven copies into a sibling ``.partial`` folder that replaces ``lib_dir`` only when the copy
    succeeded and holds ``main_jar``; the marker file is written last. Raises
    :class:`LocalStackError` with Maven's last output lines on failure.
    """
    started = time.monotonic()
    partial = lib_dir.with_name(lib_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(pom),
        f"-D{version_property}={version}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
    ]
    logger.debug("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        raise LocalStackError(
            f"Maven did not finish resolving {pom.name} within {_MVN_TIMEOUT_S:.0f} s"
        ) from None
    jars = sorted(path.name for path in partial.glob("*.jar"))
    if proc.returncode != 0 or main_jar not in jars:
        shutil.rmtree(partial, ignore_errors=True)
        output = (proc.stdout + proc.stderr).strip().splitlines()
        tail = "\n".join(output[-30:]) or "(no output)"
        raise LocalStackError(
            f"Maven could not resolve {main_jar} (exit {proc.returncode}; is Maven Central "
            f"reachable and version {version} published?):\n{tail}"
        )
    (partial / MARKER_NAME).write_text(
        json.dumps({"pom": pom.name, "version": version, "jars": jars}, indent=1) + "\n",
        encoding="utf-8",
    )
    shutil.rmtree(lib_dir, ignore_errors=True)
    partial.rename(lib_dir)
    return ResolveResult(lib_dir=lib_dir, jars=len(jars), seconds=time.monotonic() - started)
