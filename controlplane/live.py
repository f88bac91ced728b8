"""Side effects after commit: Channels group messages, and the per-process
watcher that wakes long-polls when the event log advances anywhere.

The durable rows are the truth; everything here is a nudge. A lost nudge
delays a long-poll by at most settings.FEED_RECHECK_SECONDS and loses nothing.
"""
from __future__ import annotations

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("switchboard.live")

LOG_GROUP = "switchboard.log"
GROUP_READD_SECONDS = 3600


def _group_send_now(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # a nudge must never fail the request that committed
        logger.warning("group_send to %s failed", group, exc_info=True)


def group_send_on_commit(group: str, message: dict) -> None:
    """Send `message` to a Channels group once the current transaction commits."""
    transaction.on_commit(lambda: _group_send_now(group, message), robust=True)


def conversation_group(conversation_public_id: str) -> str:
    return f"conversation.{conversation_public_id}"


class LogWatcher:
    """One per process: listens on the log group and wakes local waiters."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._advanced: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._advanced = asyncio.Event()
            self._task = loop.create_task(self._listen())

    def mark(self) -> asyncio.Event:
        """Take before reading; `wait(mark)` returns at once if the log
        advanced since, so no commit can slip between a read and a wait."""
        self._ensure_started()
        return self._advanced

    async def wait(self, mark: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(mark.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            pass

    def _wake(self) -> None:
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    async def _listen(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(LOG_GROUP, channel)
                while True:
                    try:
                        await asyncio.wait_for(layer.receive(channel), GROUP_READD_SECONDS)
                    except (asyncio.TimeoutError, TimeoutError):
                        await layer.group_add(LOG_GROUP, channel)
                        continue
                    self._wake()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Some layers turn a cancellation (the loop shutting down)
                # into their own errors: stop rather than retry then.
                if asyncio.current_task().cancelling():
                    raise
                logger.warning("log watcher lost its channel layer; retrying", exc_info=True)
                await asyncio.sleep(1.0)


log_watcher = LogWatcher()
