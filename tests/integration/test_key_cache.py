"""The API's key verifier on the real tenants store: hashes, revocation, the cache's bound."""

from __future__ import annotations

from datetime import UTC, datetime

from cassandra.cluster import Session

from scheduler.api.auth import KEY_CACHE_TTL_S, KeyVerifier
from scheduler.cassandra_tenancy import CassandraTenantStore
from scheduler.config import Config
from scheduler.tenancy import Role, make_token, new_key, parse_token


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_revoked_key_stops_within_the_cache_ttl(session: Session, migrated: Config) -> None:
    store = CassandraTenantStore(session, keyspace=migrated.keyspace)
    made = new_key(role=Role.WORKER, tenants=frozenset({"acme"}), now=datetime.now(UTC))
    assert await store.add_key(made.key)
    assert not await store.add_key(made.key)  # a bootstrap key stored again: no-op
    stored = await store.get_key(made.key.key_id)
    assert stored is not None and stored.digest != made.token.encode()

    clock = Clock()
    here, there = KeyVerifier(store, clock=clock), KeyVerifier(store, clock=clock)
    who = await here.verify(made.token)
    assert who is not None and who.role is Role.WORKER and who.tenants == {"acme"}
    assert await there.verify(made.token) is not None
    # A wrong secret with the right id, and an unknown key, fail alike.
    key_id = made.key.key_id
    assert await here.verify(f"csk_{key_id}_{parse_token(make_token())[1]}") is None
    assert await here.verify(make_token()) is None

    await store.revoke_key(key_id, datetime.now(UTC))
    here.forget(key_id)  # the replica that revoked it
    assert await here.verify(made.token) is None
    clock.now += KEY_CACHE_TTL_S - 0.1
    assert await there.verify(made.token) is not None  # still cached on another replica
    clock.now += 0.2
    assert await there.verify(made.token) is None
