"""Long-polling for feed views (`wait_ms`).

The wrapped DRF view does each read in a worker thread and gives its
database connection back at once; the wait itself is a coroutine on the
event loop, woken by the process's LogWatcher, so a waiting request holds no
thread and no database connection, and is cancelled if the client goes away.

While it waits, a long-poll holds one of its member's places in the
process (controlplane.holding); past the cap it is answered 429 at once.

A view that names what its feed shows (`wants_wakes`: events of a space,
events addressed to a member) is woken only by the commits that name it,
so a commit costs a re-read of the feeds it touched, not of every feed
waiting in the process.
"""
from __future__ import annotations

import asyncio

from django.conf import settings
from django.db import connections

from controlplane import holding
from controlplane.db import in_pool
from controlplane.errors import RateLimited
from controlplane.live import log_watcher
from controlplane.ratelimit import client_address, source

MAX_WAIT_MS = 30_000


def _wait_ms(request) -> int:
    try:
        value = int(request.GET.get("wait_ms", "0"))
    except ValueError:
        return 0  # the view itself answers INVALID_REQUEST
    return value if 0 < value <= MAX_WAIT_MS else 0


def _release_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


def wants_wakes(request, **interest) -> None:
    """From a feed view: the `controlplane.live.Interest` (its arguments)
    of the commits that may add to this feed."""
    request._request.switchboard_wake = interest


def _holder(request) -> int | str:
    """Whose places a waiting long-poll takes: its member's, or an anonymous
    caller's client address's (counted as the rate limit counts them)."""
    user = request.user  # the DRF view set it (None: anonymous)
    return user.pk if user is not None else f"address:{source(client_address(request))}"


def long_polling(sync_view):
    """Wrap a feed view (from `as_view()`) into an async long-polling view."""

    def read_once(request, *args, **kwargs):
        try:
            return sync_view(request, *args, **kwargs)
        finally:
            _release_connections()

    read = in_pool(read_once)

    async def view(request, *args, **kwargs):
        wait_ms = _wait_ms(request) if request.method in ("GET", "HEAD") else 0
        if not wait_ms:
            return await read(request, *args, **kwargs)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        interest = holder = None
        try:
            while True:
                mark = log_watcher.mark()
                if interest is not None:
                    interest.event.clear()  # before reading: a commit during the read wakes the next wait
                response = await read(request, *args, **kwargs)
                remaining = deadline - loop.time()
                # (A space feed's page may have no events and more to read: the events it
                # looked at were others' direct messages, inbox.feeds.space_feed.)
                if remaining <= 0 or log_watcher.closing or response.status_code != 200 or \
                        response.data["events"] or response.data["has_more"]:
                    return response
                if holder is None:
                    place = _holder(request)
                    if not holding.hold(place):
                        return RateLimited.after(1, "Too many requests of yours are waiting at once.").json_response()
                    holder = place
                request.switchboard_repoll = True
                if interest is None and (wake := getattr(request, "switchboard_wake", None)):
                    # Only the commits this feed may show wake it from now on.
                    interest = log_watcher.watch(**wake)
                    if mark.is_set():
                        continue  # the log advanced before the interest was registered: read again
                if interest is None:
                    await log_watcher.wait(mark, min(remaining, settings.FEED_RECHECK_SECONDS))
                else:  # a lost nudge wakes it too: the watcher looks at the log head (LogWatcher)
                    await log_watcher.wait(interest.event, remaining)
        finally:
            if interest is not None:
                log_watcher.unwatch(interest)
            if holder is not None:
                holding.release(holder)

    # drf-spectacular documents the wrapped DRF view.
    view.cls, view.initkwargs = sync_view.cls, sync_view.initkwargs
    view.csrf_exempt = True
    return view
