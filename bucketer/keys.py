"""Bucket and shard keys of the timer wheel: pure, stable across processes and languages."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

BUCKET_SECONDS = 60


def minute_bucket(t: datetime) -> int:
    """The minute bucket holding instant ``t``: whole minutes since the Unix epoch (UTC)."""
    if t.tzinfo is None:
        raise ValueError("minute_bucket needs an aware datetime")
    return int(t.timestamp()) // BUCKET_SECONDS


def bucket_start(bucket: int) -> datetime:
    """The first instant of ``bucket``."""
    return datetime.fromtimestamp(bucket * BUCKET_SECONDS, tz=UTC)


def bucket_end(bucket: int) -> datetime:
    """The first instant after ``bucket``."""
    return datetime.fromtimestamp((bucket + 1) * BUCKET_SECONDS, tz=UTC)


def shard_of(key: str, shard_count: int) -> int:
    """The shard of a timer key: the first 8 bytes of blake2b(key), big-endian, modulo the count.

    Deterministic across processes (unlike ``hash()``) and documented, so a client in another
    language can compute it too.
    """
    if shard_count <= 0:
        raise ValueError("shard_count must be positive")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count
