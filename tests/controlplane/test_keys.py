"""The root key: generated once in development, required in production,
and never used directly (HKDF per purpose)."""
import os
import stat
import subprocess
import sys

import pytest

from controlplane.keys import MissingAdminKey, derive_key, load_root_key
from tests.servers import ROOT


def test_production_requires_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("SERVER_ADMIN_KEY", raising=False)
    with pytest.raises(MissingAdminKey):
        load_root_key(debug=False, var_dir=tmp_path)
    assert not (tmp_path / "server_admin_key").exists()


def test_development_generates_one_private_key(tmp_path, monkeypatch):
    monkeypatch.delenv("SERVER_ADMIN_KEY", raising=False)
    first = load_root_key(debug=True, var_dir=tmp_path)
    second = load_root_key(debug=True, var_dir=tmp_path)
    assert first == second and len(first) >= 32
    assert stat.S_IMODE((tmp_path / "server_admin_key").stat().st_mode) == 0o600


def test_environment_key_wins_and_must_be_long(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVER_ADMIN_KEY", "k" * 40)
    assert load_root_key(debug=False, var_dir=tmp_path) == "k" * 40
    monkeypatch.setenv("SERVER_ADMIN_KEY", "short")
    with pytest.raises(MissingAdminKey):
        load_root_key(debug=False, var_dir=tmp_path)


def test_purposes_get_independent_keys():
    root = "r" * 40
    assert derive_key(root, "cursor") != derive_key(root, "secret-encryption")
    assert derive_key(root, "cursor") != derive_key("s" * 40, "cursor")
    assert derive_key(root, "cursor") == derive_key(root, "cursor")
    assert len(derive_key(root, "cursor")) == 32


def run_manage(*args: str, var_dir, **env) -> subprocess.CompletedProcess:
    """`manage.py` as a user runs it in a new shell: none of the suite's
    settings, a SQLite database in `var_dir`."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**run_env(var_dir), **env})


def run_env(var_dir) -> dict:
    """A new shell's environment: none of the suite's settings, the embedded database in `var_dir`."""
    clean = {k: v for k, v in os.environ.items()
             if k not in {"DEBUG", "SERVER_ADMIN_KEY", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    return {**clean, "SWITCHBOARD_VAR_DIR": str(var_dir)}


def test_a_checkout_set_up_for_development_needs_nothing_exported(tmp_path):
    # given: what `make run` leaves (DEBUG=1 generated the key in var/)
    assert run_manage("migrate", "-v", "0", var_dir=tmp_path, DEBUG="1").returncode == 0
    # when: a new shell, nothing exported
    created = run_manage("createmember", "rae", var_dir=tmp_path)
    token = run_manage("issuecredential", "rae", var_dir=tmp_path)
    # then
    assert created.returncode == 0 and created.stdout.startswith("mem_"), created.stderr
    assert token.returncode == 0 and token.stdout.startswith("sbt_"), token.stderr


def test_var_is_its_owners_alone_new_or_made_before(tmp_path):
    # given a var/ that does not exist yet, and one an earlier version made readable by anyone
    made_before = tmp_path / "before"
    made_before.mkdir(mode=0o755)
    os.chmod(made_before, 0o755)
    for var_dir in (tmp_path / "new", made_before):
        # when a process sets up the embedded database there (umask as a login shell's)
        migrated = subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, capture_output=True,
                                  timeout=120, preexec_fn=lambda: os.umask(0o022),
                                  env={**run_env(var_dir), "DEBUG": "1"})
        # then the folder that holds its sessions, message bodies and key is closed to other users
        assert migrated.returncode == 0, migrated.stderr
        assert (var_dir / "switchboard.sqlite3").exists()
        assert stat.S_IMODE(var_dir.stat().st_mode) == 0o700


def test_a_missing_key_in_production_is_one_clear_line(tmp_path):
    # when: no key configured and no development key kept
    result = run_manage("issuecredential", "admin", var_dir=tmp_path)
    # then
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "SERVER_ADMIN_KEY is not set" in result.stderr
    assert not (tmp_path / "server_admin_key").exists()


def test_debug_off_said_out_loud_still_requires_the_key(tmp_path):
    # given: a development key kept, but the operator says production
    (tmp_path / "server_admin_key").write_text("d" * 64)
    # when
    result = run_manage("issuecredential", "admin", var_dir=tmp_path, DEBUG="0")
    # then
    assert result.returncode == 1 and "SERVER_ADMIN_KEY is not set" in result.stderr



def test_processes_starting_at_once_agree_on_one_whole_key(tmp_path, monkeypatch):
    """Two suites, or a server's processes, can start at once on a new
    checkout: each must read the one key whole, never a file its creator
    has not written yet (an empty key, and so another Redis namespace)."""
    # given: a key that takes a while to make, and a second process starting meanwhile
    import secrets
    import threading
    import time

    monkeypatch.delenv("SERVER_ADMIN_KEY", raising=False)
    token = secrets.token_urlsafe

    def slow_token(n):
        time.sleep(0.3)
        return token(n)

    monkeypatch.setattr(secrets, "token_urlsafe", slow_token)
    keys = []
    first = threading.Thread(target=lambda: keys.append(load_root_key(debug=True, var_dir=tmp_path)))
    # when
    first.start()
    time.sleep(0.1)
    keys.append(load_root_key(debug=True, var_dir=tmp_path))
    first.join()
    # then: one key, whole, and nothing else left in var/
    assert len(set(keys)) == 1 and len(keys[0]) >= 32
    assert [p.name for p in tmp_path.iterdir()] == ["server_admin_key"]


def test_the_example_receiver_makes_var_its_owners_alone_when_it_comes_first(tmp_path):
    # given no var/ yet, and a login shell's umask
    from webhooks.example_receiver import certificates

    previous = os.umask(0o022)
    try:
        # when `make receiver` runs before `make run`, making var/receiver
        certificates(tmp_path / "var" / "receiver")
    finally:
        os.umask(previous)
    # then var/ is closed to other users from the start, as the server makes it
    assert stat.S_IMODE((tmp_path / "var").stat().st_mode) == 0o700
