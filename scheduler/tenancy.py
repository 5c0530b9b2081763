"""Tenants, their quotas, API keys and the roles they carry (issue 9).

A key is ``csk_<key_id>_<secret>``: ``key_id`` (16 hex characters) names the stored row, the
secret is 32 random bytes (base64url). Only ``sha256(salt || secret)`` and the salt are
stored; the secret is shown once, when the key is created. A fast hash is enough: the secret
has 256 bits of entropy, so there is nothing to brute-force (docs/decisions/0009-api-keys.md).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler.errors import InvalidArgument
from scheduler.fairness import DEFAULT_TIER
from scheduler.model import aware

KEY_PREFIX = "csk_"
_KEY = re.compile(r"^csk_(?P<key_id>[0-9a-f]{16})_(?P<secret>[A-Za-z0-9_-]{43})$")
_TENANT_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_KEY_NAME_CHARS = 200
# Upper bounds that keep a quota a quota (and the arithmetic on it exact).
MAX_SCHEDULES_LIMIT = 1_000_000_000
MAX_CONCURRENT_LIMIT = 10_000_000
MAX_RATE_LIMIT = 1_000_000.0
MAX_PAYLOAD_LIMIT = 16 * 1024 * 1024


class Role(enum.StrEnum):
    """What a key may do. ``admin`` spans every tenant; the others are bound to one tenant,
    except ``worker``, which reports runs of the tenants it lists (all when it lists none)."""

    ADMIN = "admin"
    TENANT_ADMIN = "tenant-admin"
    TENANT_READER = "tenant-reader"
    WORKER = "worker"


def parse_role(value: str, field: str = "role") -> Role:
    try:
        return Role(value)
    except ValueError:
        names = ", ".join(r.value for r in Role)
        raise InvalidArgument(field, f"unknown role {value!r}; one of {names}") from None


def validate_tenant_id(value: str, field: str = "tenant.id") -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not _TENANT_ID.match(value):
        raise InvalidArgument(field, "letters, digits, '-', '_', '.' only, at most 128 characters")
    return value


@dataclass(frozen=True, kw_only=True)
class TenantQuotas:
    """A tenant's limits; 0 means unlimited (payload: the server's own limit)."""

    max_schedules: int = 0
    max_concurrent_runs: int = 0
    max_enqueue_rate: float = 0.0
    enqueue_burst: float = 0.0
    max_payload_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class Tenant:
    tenant_id: str
    tier: str = DEFAULT_TIER
    quotas: TenantQuotas = TenantQuotas()
    create_time: datetime | None = None
    update_time: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Tenant:
        return cls(
            tenant_id=row.tenant_id,
            tier=row.tier or DEFAULT_TIER,
            quotas=TenantQuotas(
                max_schedules=int(row.max_schedules or 0),
                max_concurrent_runs=int(row.max_concurrent_runs or 0),
                max_enqueue_rate=float(row.max_enqueue_rate or 0.0),
                enqueue_burst=float(row.enqueue_burst or 0.0),
                max_payload_bytes=int(row.max_payload_bytes or 0),
            ),
            create_time=aware(row.create_time),
            update_time=aware(row.update_time),
        )


def validate_tenant(t: Tenant, tiers: tuple[str, ...], field: str = "tenant") -> None:
    """INVALID_ARGUMENT naming the field for a bad id, an unknown tier or a bad quota."""
    validate_tenant_id(t.tenant_id, f"{field}.id")
    if t.tier not in tiers:
        raise InvalidArgument(
            f"{field}.tier", f"unknown tier {t.tier!r}; configured tiers: {', '.join(tiers)}"
        )
    q, qf = t.quotas, f"{field}.quotas"
    for name, value, limit in (
        ("max_schedules", q.max_schedules, MAX_SCHEDULES_LIMIT),
        ("max_concurrent_runs", q.max_concurrent_runs, MAX_CONCURRENT_LIMIT),
        ("max_payload_bytes", q.max_payload_bytes, MAX_PAYLOAD_LIMIT),
    ):
        if not 0 <= value <= limit:
            raise InvalidArgument(f"{qf}.{name}", f"must be between 0 and {limit}, got {value}")
    for fname, rate in (
        ("max_enqueue_rate", q.max_enqueue_rate),
        ("enqueue_burst", q.enqueue_burst),
    ):
        if not (rate == rate and 0.0 <= rate <= MAX_RATE_LIMIT):  # rate == rate: not NaN
            raise InvalidArgument(
                f"{qf}.{fname}", f"must be between 0 and {MAX_RATE_LIMIT:g}, got {rate:g}"
            )
    if q.enqueue_burst and not q.max_enqueue_rate:
        raise InvalidArgument(f"{qf}.enqueue_burst", "needs max_enqueue_rate")


@dataclass(frozen=True, kw_only=True)
class ApiKey:
    """A stored key: never its secret, only the salted hash."""

    key_id: str
    role: Role
    # The tenant a tenant role is bound to; "" for admin and worker keys.
    tenant_id: str = ""
    # A worker key's tenants; empty: every tenant.
    tenants: frozenset[str] = frozenset()
    name: str = ""
    salt: bytes = b""
    digest: bytes = b""
    create_time: datetime | None = None
    revoke_time: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoke_time is not None

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.digest, hash_secret(self.salt, secret))

    @classmethod
    def from_row(cls, row: Any) -> ApiKey:
        return cls(
            key_id=row.key_id,
            role=Role(row.role),
            tenant_id=row.tenant_id or "",
            tenants=frozenset(row.tenants or ()),
            name=row.name or "",
            salt=bytes(row.salt or b""),
            digest=bytes(row.digest or b""),
            create_time=aware(row.create_time),
            revoke_time=aware(row.revoke_time),
        )


def hash_secret(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode()).digest()


@dataclass(frozen=True, kw_only=True)
class NewKey:
    """A key just made: ``token`` is what the caller presents, shown this once."""

    key: ApiKey
    token: str = field(repr=False)


def make_token() -> str:
    """A fresh API key, ``csk_<16 hex>_<43 base64url>`` (the secret may itself hold ``_``)."""
    return f"{KEY_PREFIX}{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"


def new_key(
    *,
    role: Role,
    tenant_id: str = "",
    tenants: frozenset[str] = frozenset(),
    name: str = "",
    now: datetime,
    token: str | None = None,
) -> NewKey:
    """A fresh key (or, with ``token``, the stored form of a key an operator chose for the
    bootstrap: it must be well formed)."""
    if token is None:
        token = make_token()
    key_id, secret = parse_token(token)
    salt = secrets.token_bytes(16)
    return NewKey(
        key=ApiKey(
            key_id=key_id,
            role=role,
            tenant_id=tenant_id,
            tenants=tenants,
            name=name,
            salt=salt,
            digest=hash_secret(salt, secret),
            create_time=now,
        ),
        token=token,
    )


def parse_token(token: str) -> tuple[str, str]:
    """(key_id, secret) of a well-formed key; InvalidArgument (never echoing it) otherwise."""
    m = _KEY.match(token)
    if m is None:
        raise InvalidArgument("authorization", "is not a cronscale API key (csk_<id>_<secret>)")
    return m["key_id"], m["secret"]


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who is calling: the verified key's id, role and reach."""

    key_id: str
    role: Role
    tenant_id: str = ""
    tenants: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    def sees(self, tenant: str) -> bool:
        """Whether resources of ``tenant`` exist for this caller."""
        if self.role is Role.ADMIN:
            return True
        if self.role is Role.WORKER:
            return not self.tenants or tenant in self.tenants
        return tenant == self.tenant_id

    @classmethod
    def of(cls, key: ApiKey) -> Principal:
        return cls(key_id=key.key_id, role=key.role, tenant_id=key.tenant_id, tenants=key.tenants)
