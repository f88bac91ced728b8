"""django-q2 entry points for the delivery engine."""
from __future__ import annotations

import asyncio

from django.core.cache import cache

from webhooks import engine

TIMER_KEY = "webhooks:timer"
RUN_SECONDS = 45  # under django-q2's task timeout (60 s)


def deliver() -> int:
    """Send what is due. One worker at a time (per cache) is also the timer:
    it stays for the run, sending each wake as its debounce window or retry
    time comes; the others send what is due now and return. Kicked after each
    new wake commits, and swept once a minute."""
    timer = cache.add(TIMER_KEY, 1, timeout=RUN_SECONDS + 15)
    try:
        sent = asyncio.run(engine.pump(seconds=RUN_SECONDS, wait=timer))
    finally:
        if timer:
            cache.delete(TIMER_KEY)
    if timer and engine.next_due_in(60) is not None:
        from django_q.tasks import async_task

        async_task("webhooks.tasks.deliver")  # the next run takes over the timer
    return sent
