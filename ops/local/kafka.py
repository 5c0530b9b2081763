"""The local Kafka 4.x node (KRaft combined mode): config, storage format, command, probe."""

from __future__ import annotations

import base64
import logging
import socket
import struct
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ops.local.errors import LocalStackError
from ops.local.service import LocalService
from ops.local.settings import KAFKA, PACKAGE_DIR

logger = logging.getLogger(__name__)

MAIN_CLASS: Final = "kafka.Kafka"
STORAGE_TOOL: Final = "kafka.tools.StorageTool"
NODE_ID: Final = 1
_PROBE_TIMEOUT_S: Final = 3.0
_FORMAT_TIMEOUT_S: Final = 120.0


class KafkaService(LocalService):
    """A single Kafka node that is both broker and controller."""

    name = KAFKA
    pom = PACKAGE_DIR / "kafka-pom.xml"
    version_property = "kafka.version"

    @property
    def main_jar(self) -> str:
        """``kafka_2.13-<version>.jar``."""
        return f"kafka_2.13-{self.version}.jar"

    @property
    def properties_path(self) -> Path:
        """The generated server.properties."""
        return self.settings.conf_dir(KAFKA) / "server.properties"

    def prepare(self) -> None:
        """Write server.properties and log4j2.xml; format the storage on first use."""
        self.write_config()
        s = self.settings
        if not (s.data_dir(KAFKA) / "meta.properties").exists():
            self._format_storage(self._cluster_id())

    def write_config(self) -> None:
        """Create the folders and write server.properties and log4j2.xml (no Java involved)."""
        self._make_dirs()
        s = self.settings
        self._render(
            "kafka-server.properties.tmpl",
            "server.properties",
            host=s.host,
            port=s.kafka_port,
            controller_port=s.kafka_controller_port,
            data_dir=s.data_dir(KAFKA),
            extra=s.kafka_extra_properties,
        )
        self._copy("log4j2.xml")

    def _cluster_id(self) -> str:
        path = self.settings.kafka_cluster_id_file
        try:
            recorded = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            recorded = ""
        if recorded:
            return recorded
        cluster_id = random_cluster_id()
        path.write_text(cluster_id + "\n", encoding="ascii")
        return cluster_id

    def _jvm_base(self, heap: str) -> list[str]:
        s = self.settings
        return [
            s.java,
            *self.markers(),
            f"-Xms{heap}",
            f"-Xmx{heap}",
            f"-Dlog4j2.configurationFile={(s.conf_dir(KAFKA) / 'log4j2.xml').as_uri()}",
            f"-Dkafka.logs.dir={s.logs_dir(KAFKA)}",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
        ]

    def _format_storage(self, cluster_id: str) -> None:
        cmd = [
            *self._jvm_base("256m"),
            "-cp",
            self.classpath(),
            STORAGE_TOOL,
            "format",
            "-t",
            cluster_id,
            "-c",
            str(self.properties_path),
            "--ignore-formatted",
        ]
        logger.debug("formatting kafka storage: %s", " ".join(cmd))
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise LocalStackError(
                f"formatting the kafka storage took longer than {_FORMAT_TIMEOUT_S:.0f} s"
            ) from None
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            raise LocalStackError(
                f"formatting the kafka storage failed (exit {proc.returncode}):\n"
                + "\n".join(lines[-30:])
            )

    def command(self) -> list[str]:
        """The JVM command line, with kafka-run-class.sh's performance options."""
        return [
            *self._jvm_base(self.settings.kafka_heap),
            "-server",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:MaxInlineLevel=15",
            "-XX:+ExitOnOutOfMemoryError",
            "-cp",
            self.classpath(),
            MAIN_CLASS,
            str(self.properties_path),
        ]

    def probe(self) -> str | None:
        """``cluster <id>`` once a Metadata request lists this broker and an active controller."""
        s = self.settings
        metadata = fetch_metadata(s.host, s.kafka_port, timeout_s=_PROBE_TIMEOUT_S)
        if metadata is None or metadata.controller_id < 0:
            return None
        if not any(b.node_id == NODE_ID and b.port == s.kafka_port for b in metadata.brokers):
            return None
        return f"cluster {metadata.cluster_id}"


def random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding.

    Same format as ``StorageTool random-uuid``, which also avoids a leading ``-`` so the id
    cannot be mistaken for a command-line flag.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True, kw_only=True)
class BrokerInfo:
    """One broker of a Metadata response."""

    node_id: int
    host: str
    port: int


@dataclass(frozen=True, kw_only=True)
class ClusterMetadata:
    """The cluster part of a Metadata response."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


_METADATA_API_KEY: Final = 3
_METADATA_VERSION: Final = 4  # the newest non-flexible version: plain int16-length strings
_CORRELATION_ID: Final = 1
_CLIENT_ID: Final = b"cronscale-local-probe"


def fetch_metadata(host: str, port: int, *, timeout_s: float) -> ClusterMetadata | None:
    """Send one Kafka Metadata v4 request (no topics) and decode the brokers; None on failure.

    A raw request keeps the probe synchronous and independent of any client library's event
    loop: the broker answers it only once its request handlers are running.
    """
    header = (
        struct.pack(">hhih", _METADATA_API_KEY, _METADATA_VERSION, _CORRELATION_ID, len(_CLIENT_ID))
        + _CLIENT_ID
    )
    body = struct.pack(">ib", 0, 0)  # zero topics, allow_auto_topic_creation=false
    request = struct.pack(">i", len(header) + len(body)) + header + body
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(request)
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            payload = _recv_exact(sock, size)
        return _decode_metadata(payload)
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as exc:
        logger.debug("kafka at %s:%s not ready: %r", host, port, exc)
        return None


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            raise ValueError("connection closed mid-response")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str | None:
        length = self.take(">h")
        if length < 0:
            return None
        raw = self.data[self.offset : self.offset + length]
        if len(raw) != length:
            raise ValueError("truncated string")
        self.offset += length
        return raw.decode("utf-8")


def _decode_metadata(payload: bytes) -> ClusterMetadata:
    reader = _Reader(payload)
    if reader.take(">i") != _CORRELATION_ID:
        raise ValueError("unexpected correlation id")
    reader.take(">i")  # throttle_time_ms
    brokers = []
    for _ in range(reader.take(">i")):
        node_id = reader.take(">i")
        host = reader.string() or ""
        port = reader.take(">i")
        reader.string()  # rack
        brokers.append(BrokerInfo(node_id=node_id, host=host, port=port))
    cluster_id = reader.string()
    controller_id = reader.take(">i")
    return ClusterMetadata(
        cluster_id=cluster_id, controller_id=controller_id, brokers=tuple(brokers)
    )
