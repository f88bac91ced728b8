"""Where `serve` is reached from its HOST:PORT: read by the settings, the
server commands and the example webhook receiver (which must not load the
settings: they would make a development key where it runs)."""
from __future__ import annotations


def bound_url(bind: str) -> str:
    """The URL a local browser reaches `serve` at, from its HOST:PORT."""
    host, _, port = bind.rpartition(":")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host).strip("[]")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"
