"""One count of a member's pending items at a time per process, shared by
the inbox sockets of their pages.

Every page a member has open holds an inbox socket, and each socket hears
of every change to that inbox (an item admitted or acknowledged). Counting
once per socket made one change as many reads on the request threads as
the member had pages open (`WAITS_PER_MEMBER` lets them keep a hundred per
process), and anyone can make such changes by sending to them: a hundred
idle pages of one member held every other member's requests for about
0.7 s while messages reached them. Here a socket asking for the count gets
the next one to start: a count already running may have begun before the
change the socket heard of, so the socket waits for the one after it, which
every socket asking meanwhile shares. However many sockets ask, a member's
counts run one at a time, each after the last.
"""
from __future__ import annotations

import asyncio

from controlplane import turns
from controlplane.db import db_call
from controlplane.models import Member
from inbox.delivery import pending_count

_running: dict[int, asyncio.Task] = {}  # member id → the count under way
_next: dict[int, asyncio.Future] = {}  # member id → the count that starts after it


async def pending(member_pk: int) -> int | None:
    """The member's pending-item count, read after this call began; None
    once they are gone or no longer active (the socket signs out)."""
    waiting = _next.get(member_pk)
    if waiting is None:
        waiting = _next[member_pk] = asyncio.get_running_loop().create_future()
        if member_pk not in _running:
            _start(member_pk)
    # Shielded: a socket that closes while it waits cancels its wait, not
    # the count the others share.
    return await asyncio.shield(waiting)


def _count(member_pk: int) -> int | None:
    member = Member.objects.filter(pk=member_pk).first()
    if member is None or not member.is_active:
        return None
    return pending_count(member)


def _start(member_pk: int) -> None:
    result = _next.pop(member_pk)
    # Asked for by the member's sockets, of any address: the count takes the member's own turns.
    _running[member_pk] = asyncio.get_running_loop().create_task(
        _run(member_pk, result), context=turns.shared_context(f"member {member_pk}"))


async def _run(member_pk: int, result: asyncio.Future) -> None:
    try:
        result.set_result(await db_call(_count)(member_pk))
    except Exception as error:
        result.set_exception(error)  # raised in every socket waiting for it
        result.exception()  # and, with none waiting any more, not logged as never retrieved
    finally:
        if not result.done():
            result.cancel()  # the count itself was cancelled (the loop closing)
        del _running[member_pk]
        if member_pk in _next:
            _start(member_pk)
