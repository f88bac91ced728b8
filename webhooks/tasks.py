"""django-q2 entry points for the delivery engine."""
from __future__ import annotations

import asyncio

from django.core.cache import cache

from webhooks import engine, mcp, pump
from webhooks.due import TIMER_KEY

# Short runs: a stopping cluster waits for its tasks, and a lease left by a
# killed worker expires soon. The timer hands over to a fresh run while
# anything falls due within a minute.
RUN_SECONDS = 10
# The timer renews its key every second while it runs: a killed timer's key
# is gone within TIMER_KEY_SECONDS, and new wakes queue tasks again.
TIMER_KEY_SECONDS = 3


def deliver() -> int:
    """Send what is due. One worker at a time (per cache) is also the timer:
    it stays for the run, sending each wake as its debounce window or retry
    time comes, nudged by every new one (webhooks.due); the others send what
    is due now and return. Kicked after a new wake commits while no timer
    runs, and swept once a minute."""
    mcp.offer_waiting()
    timer = cache.add(TIMER_KEY, 1, timeout=TIMER_KEY_SECONDS)
    renew = (lambda: cache.touch(TIMER_KEY, TIMER_KEY_SECONDS)) if timer else None
    try:
        sent = asyncio.run(pump.run(seconds=RUN_SECONDS, wait=timer, renew=renew))
    finally:
        if timer:
            cache.delete(TIMER_KEY)
    # After the key is gone: a wake committed while it was held queued no
    # task (webhooks.due.kick_on_commit), and is found here.
    if timer and engine.next_due_in(60) is not None:
        from django_q.tasks import async_task

        async_task("webhooks.tasks.deliver")  # the next run takes over the timer
    return sent
