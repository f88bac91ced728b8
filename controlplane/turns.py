"""Request threads shared fairly between client addresses.

A process runs its sync requests on SYNC_THREADS threads
(`controlplane.db.in_pool`), first come, first served: one address that
kept hundreds of requests open (anonymous reads of large pages, well
within its rate limit) queued everyone else's behind them, for 7 to 16
seconds on two cores. Requests now wait for a thread here, by address, and
a freed thread goes to the next address in turn: one address's backlog
takes one place in the rotation, not the whole queue. Alone, an address
still gets every thread. Behind a proxy, addresses are the proxy's unless
TRUST_PROXY_HEADERS names the client's (as for the rate limit)."""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections import OrderedDict, deque

from django.conf import settings


# The client address (`controlplane.ratelimit.source`) whose request or
# live socket is being served, set by the ASGI handler (controlplane.handlers)
# and the sockets (web.consumers.SessionSocket): its work on the request
# threads waits for that address's turn (controlplane.db.in_pool).
caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("switchboard_caller", default=None)


def shared_context(key: str | None = None) -> contextvars.Context:
    """A context for a task whose work is shared by many callers (a live
    conversation's stream, the log watcher's look at the log head): it
    waits for no one caller's turn, which that caller's backlog would make
    it wait out. With `key`, it takes the turns of that key instead."""
    context = contextvars.copy_context()
    context.run(caller.set, key)
    return context


class FairTurns:
    """At most `places` holders at once; waiters are served round-robin by
    key, each key's own in the order they came."""

    def __init__(self, places: int):
        self.free = places
        self.waiting: OrderedDict[str, deque[asyncio.Future]] = OrderedDict()

    @contextlib.asynccontextmanager
    async def turn(self, key: str):
        await self._acquire(key)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, key: str) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        place = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(key, deque()).append(place)
        try:
            await place
        except asyncio.CancelledError:
            if place.done() and not place.cancelled():
                self._release()  # handed a place as it was cancelled: pass it on
            else:
                queue = self.waiting.get(key)
                if queue is not None and place in queue:
                    queue.remove(place)
                    if not queue:
                        del self.waiting[key]
            raise

    def _release(self) -> None:
        while self.waiting:
            key, queue = next(iter(self.waiting.items()))
            place = queue.popleft()
            if queue:
                self.waiting.move_to_end(key)  # its next waiter after every other key's
            else:
                del self.waiting[key]
            if not place.done():
                place.set_result(None)
                return
        self.free += 1


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairTurns] = weakref.WeakKeyDictionary()


def request_turns() -> FairTurns:
    """This event loop's turns at the request threads (SYNC_THREADS places)."""
    loop = asyncio.get_running_loop()
    turns = _by_loop.get(loop)
    if turns is None:
        turns = _by_loop[loop] = FairTurns(settings.SYNC_THREADS)
    return turns
