"""django-q2 entry points for the delivery engine."""
from __future__ import annotations

import asyncio

from django.core.cache import cache

from webhooks import engine, mcp

TIMER_KEY = "webhooks:timer"
# Short runs: a stopping cluster waits for its tasks, and a lease left by a
# killed worker expires soon. The timer hands over to a fresh run while
# anything falls due within a minute.
RUN_SECONDS = 10


def deliver() -> int:
    """Send what is due. One worker at a time (per cache) is also the timer:
    it stays for the run, sending each wake as its debounce window or retry
    time comes; the others send what is due now and return. Kicked after each
    new wake commits, and swept once a minute."""
    mcp.offer_waiting()
    timer = cache.add(TIMER_KEY, 1, timeout=RUN_SECONDS + 5)
    try:
        sent = asyncio.run(engine.pump(seconds=RUN_SECONDS, wait=timer))
    finally:
        if timer:
            cache.delete(TIMER_KEY)
    if timer and engine.next_due_in(60) is not None:
        from django_q.tasks import async_task

        async_task("webhooks.tasks.deliver")  # the next run takes over the timer
    return sent
