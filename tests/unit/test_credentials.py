"""Where clients find their key, the development keys, and the key format."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scheduler.config import Config
from scheduler.credentials import client_key, dev_keys, with_dev_keys
from scheduler.errors import InvalidArgument
from scheduler.tenancy import Role, make_token, new_key, parse_token
from worker.config import WorkerConfig


def test_dev_keys_are_made_once_private_and_kept(tmp_path: Path) -> None:
    assert dev_keys(tmp_path, create=False) is None
    made = dev_keys(tmp_path, create=True)
    again = dev_keys(tmp_path, create=True)
    assert made is not None and again == made
    assert made.admin != made.worker
    assert os.stat(tmp_path / "dev-keys.json").st_mode & 0o077 == 0
    assert [p.name for p in tmp_path.iterdir()] == ["dev-keys.json"]


def test_client_key_precedence(tmp_path: Path) -> None:
    keys = dev_keys(tmp_path, create=True)
    assert keys is not None
    env = {"CRONSCALE_LOCAL_HOME": str(tmp_path)}
    assert client_key("127.0.0.1:50051", "csk_explicit", env) == "csk_explicit"
    assert client_key("127.0.0.1:50051", "", {**env, "CRONSCALE_API_KEY": "csk_env"}) == "csk_env"
    assert client_key("127.0.0.1:50051", "", env) == keys.admin
    # Never the development key for a remote API.
    assert client_key("api.example.com:443", "", env) == ""


def test_the_worker_takes_the_dev_worker_key_on_loopback_only(tmp_path: Path) -> None:
    keys = dev_keys(tmp_path, create=True)
    assert keys is not None
    env = {"CRONSCALE_LOCAL_HOME": str(tmp_path)}
    assert WorkerConfig.from_env(env).api_token == keys.worker
    assert WorkerConfig.from_env({**env, "CRONSCALE_API_TOKEN": "csk_w"}).api_token == "csk_w"
    assert WorkerConfig.from_env({**env, "CRONSCALE_API": "10.0.0.5:50051"}).api_token == ""


def test_with_dev_keys_only_against_the_local_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRONSCALE_LOCAL_HOME", str(tmp_path))
    local = with_dev_keys(Config())
    keys = dev_keys(tmp_path, create=False)
    assert keys is not None and local.bootstrap_admin_key == keys.admin
    remote = with_dev_keys(Config(cassandra_hosts=("10.0.0.7",)))
    assert remote.bootstrap_admin_key == ""
    chosen = with_dev_keys(Config(bootstrap_admin_key="csk_mine"))
    assert chosen.bootstrap_admin_key == "csk_mine" and not chosen.bootstrap_worker_key


def test_keys_are_stored_as_salted_hashes() -> None:
    from datetime import UTC, datetime

    token = make_token()
    key_id, secret = parse_token(token)
    one = new_key(role=Role.WORKER, token=token, now=datetime.now(UTC)).key
    two = new_key(role=Role.WORKER, token=token, now=datetime.now(UTC)).key
    assert one.key_id == key_id and one.salt != two.salt and one.digest != two.digest
    # A different last character (the secret's own may be "A": this failed 1 run in 64).
    wrong = secret[:-1] + ("B" if secret.endswith("A") else "A")
    assert one.matches(secret) and two.matches(secret) and not one.matches(wrong)
    assert secret.encode() not in one.digest and "secret" not in repr(
        new_key(role=Role.ADMIN, now=datetime.now(UTC))
    )
    for bad in ("", "csk_", "csk_zz_" + secret, token + "x", "Bearer " + token):
        with pytest.raises(InvalidArgument):
            parse_token(bad)


def test_a_secret_holding_underscores_parses_whole() -> None:
    # token_urlsafe draws from A-Z a-z 0-9 - _, so a secret may hold "_" anywhere; the id is the
    # part before the second "_", the secret all that follows it.
    secret = "_a_" + "b" * 39 + "_"
    key_id, parsed = parse_token(f"csk_0123456789abcdef_{secret}")
    assert (key_id, parsed) == ("0123456789abcdef", secret)
