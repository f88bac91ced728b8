"""What one member (or one anonymous client address) holds open in a
server process at once: live page sockets and waiting long-polls, together
at most WAITS_PER_MEMBER (0: no cap). Each keeps a connection and a task
for as long as it lasts; the rate limit bounds how fast a member opens
them, this how many stay open. Counted in each process, so the cap bounds
each process's share. (MCP streams have places of their own, shared on
Redis: mcp_endpoint.streams.Places.)"""
from __future__ import annotations

import collections
import threading

from django.conf import settings

_held: collections.Counter[int | str] = collections.Counter()  # a member's pk, or an anonymous caller's address
_lock = threading.Lock()  # event loops run on one thread; a WSGI server's async views do not


def hold(member_pk: int | str) -> bool:
    """Take one of the member's places; False, taking none, past the cap."""
    with _lock:
        if 0 < settings.WAITS_PER_MEMBER <= _held[member_pk]:
            return False
        _held[member_pk] += 1
        return True


def release(member_pk: int | str) -> None:
    """Give back a place `hold` gave."""
    with _lock:
        _held[member_pk] -= 1
        if _held[member_pk] <= 0:
            del _held[member_pk]


def held(member_pk: int | str) -> int:
    return _held[member_pk]
