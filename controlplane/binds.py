"""Where `serve` is reached from its HOST:PORT: read by the settings, the
server commands and the example webhook receiver (which must not load the
settings: they would make a development key where it runs)."""
from __future__ import annotations

import os

DEFAULT_BIND = "127.0.0.1:8000"


def bound_url(bind: str) -> str:
    """The URL a local browser reaches `serve` at, from its HOST:PORT."""
    host, _, port = bind.rpartition(":")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host).strip("[]")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def bind() -> str:
    """Where `serve` listens unless told: SWITCHBOARD_BIND."""
    return os.environ.get("SWITCHBOARD_BIND", DEFAULT_BIND)


def public_url() -> str:
    """Where Switchboard is reached (the issuer of every wake, links in
    payloads): SWITCHBOARD_PUBLIC_URL, else where SWITCHBOARD_BIND serves."""
    return (os.environ.get("SWITCHBOARD_PUBLIC_URL") or bound_url(bind())).rstrip("/")
