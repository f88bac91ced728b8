"""Public ids and bearer tokens."""
from __future__ import annotations

import base64
import hashlib
import re
import secrets

TOKEN_PREFIX = "sbt_"
TOKEN_RE = re.compile(r"sbt_[A-Za-z0-9_-]{43}")  # use with fullmatch


def public_id(prefix: str) -> str:
    """An opaque id such as `mem_3k2j…`: 80 random bits, lowercase base32."""
    return f"{prefix}_{base64.b32encode(secrets.token_bytes(10)).decode().lower()}"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def new_bearer_token() -> str:
    """`sbt_` + 43 base64url characters (32 random bytes)."""
    return TOKEN_PREFIX + b64url(secrets.token_bytes(32))


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: there is
    # nothing to brute-force, and lookups stay one indexed query.
    return hashlib.sha256(token.encode()).hexdigest()
