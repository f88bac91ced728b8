"""The root key: generated once in development, required in production,
and never used directly (HKDF per purpose)."""
import stat

import pytest

from controlplane.keys import MissingAdminKey, derive_key, load_root_key


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
