"""The root secret and the per-purpose keys derived from it.

`SERVER_ADMIN_KEY` is the only secret an operator manages. Every other key
(Django's SECRET_KEY, cursor HMAC keys, secret-encryption keys) is derived
from it with HKDF-SHA256 and a purpose label, so rotating one purpose never
needs a new root and no derived key reveals another.
"""
from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MIN_ROOT_KEY_CHARS = 32
DEVELOPMENT_KEY_FILE = "server_admin_key"


class MissingAdminKey(RuntimeError):
    pass


def development_checkout(var_dir: Path) -> bool:
    """A checkout that `make run` set up: no key configured, and the
    development key it generated kept in var/. `DEBUG` defaults to on there,
    so `manage.py` works in a new shell as it does under `make`."""
    return not os.environ.get("SERVER_ADMIN_KEY") and (var_dir / DEVELOPMENT_KEY_FILE).is_file()


def private_dir(path: Path) -> None:
    """Make `path` (var/: the embedded database with its sessions and
    message bodies, the development key) if it is missing, readable by its
    owner only; one of ours that others may read is closed to them."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = path.stat()
    if status.st_mode & 0o077 and status.st_uid == os.getuid():
        path.chmod(0o700)


def load_root_key(*, debug: bool, var_dir: Path) -> str:
    """The root key from the environment, or (development only) from var/."""
    key = os.environ.get("SERVER_ADMIN_KEY", "")
    if key:
        if len(key) < MIN_ROOT_KEY_CHARS:
            raise MissingAdminKey(f"SERVER_ADMIN_KEY must be at least {MIN_ROOT_KEY_CHARS} characters")
        return key
    if not debug:
        raise MissingAdminKey(
            f"SERVER_ADMIN_KEY is not set: in production set it to a secret of {MIN_ROOT_KEY_CHARS}+ characters"
            " (docs/configuration.md); for development run `make run` once, or set DEBUG=1")
    path = var_dir / DEVELOPMENT_KEY_FILE
    if not path.exists():
        private_dir(var_dir)
        # Written aside, then linked into place, which fails if another
        # process got there first: processes starting at once agree on one
        # key, and none reads a file its creator has not written yet.
        draft = var_dir / f".{DEVELOPMENT_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(48))
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()  # a failed write leaves no copy of a key behind either
    return path.read_text().strip()


@lru_cache(maxsize=None)
def derive_key(root: str, purpose: str, length: int = 32) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=length,
        salt=b"switchboard/v1",
        info=purpose.encode(),
    ).derive(root.encode())


def purpose_key(purpose: str, length: int = 32) -> bytes:
    """A key for one purpose ("cursor", "secret-encryption", …)."""
    from django.conf import settings

    return derive_key(settings.SERVER_ADMIN_KEY, purpose, length)


def redis_namespace(root_key: str) -> str:
    """The prefix of every Redis name of the deployment with this root key."""
    return "switchboard-" + derive_key(root_key, "redis-namespace", 6).hex()
