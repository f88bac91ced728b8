"""Topics: messages every process listens to, once each (the log's
advances, new due deliveries). Published by `controlplane.publishing.publisher`,
heard through `listen`. On Redis a topic is a pub/sub channel
(`redis_channel`) with one subscription per listening process; with the
in-memory layer, a group of the same name in the one process there is.

Also the channel-layer groups a long-lived channel keeps (`Memberships`,
which the in-memory topics use too), `stop_task`, which stops a listener
for certain, and `heeding_cancellation` for receives whose caller cancels
them only once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from controlplane.errors import warn_of

logger = logging.getLogger("switchboard.live")

# A topic's subscription that heard nothing for this long pings Redis, so a
# connection that died silently is found and replaced.
SUBSCRIPTION_IDLE_SECONDS = 30.0
CLOSE_SECONDS = 2.0  # a subscription's close
GROUP_READD_SECONDS = 3600
# How long `heeding_cancellation` waits for a cancelled receive to stop: two of stop_task's cancellations.
STOP_WAIT_SECONDS = 1.0


def on_redis() -> bool:
    """Whether topics go through Redis pub/sub: the channel layer is
    channels-redis (REDIS_URL). The in-memory layer's groups carry them in
    a process of their own, and any other layer's groups likewise."""
    return bool(settings.REDIS_URL) and hasattr(get_channel_layer(), "_group_key")


def redis_channel(topic: str) -> str:
    """A topic's Redis pub/sub channel, in this deployment's namespace."""
    return f"{settings.REDIS_NAMESPACE}:topic:{topic}"


async def listen(topic: str, on_message: Callable[[dict], None]) -> None:
    """Call `on_message` with every message published to `topic`
    (`controlplane.publishing.publisher.publish`), until cancelled. On Redis a subscription to its
    pub/sub channel; otherwise a channel of its own in the layer's group
    (renewed, see `Memberships`). Either is made again after a lost
    connection. Returns at once without a channel layer."""
    layer = get_channel_layer()
    if layer is None:
        return
    if on_redis():
        return await _subscribe(topic, on_message)
    while True:
        memberships = None
        try:
            memberships = Memberships(layer, await layer.new_channel())
            await memberships.join(topic)
            while True:
                on_message(await layer.receive(memberships.channel))
                # A receive from a busy channel's buffer never waits: let a cancellation in.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            if memberships is not None:
                await memberships.leave()
            raise
        except Exception:
            # Some layers turn a cancellation (the loop shutting down)
            # into their own errors: stop rather than retry then.
            if memberships is not None:
                await memberships.leave()
            if asyncio.current_task().cancelling():
                raise
            warn_of(logger, "lost the channel layer while listening to %s; retrying", topic)
            await asyncio.sleep(1.0)


async def _subscribe(topic: str, on_message: Callable[[dict], None]) -> None:
    import redis.asyncio

    while True:
        # Named after its channel: Redis's CLIENT LIST tells each process's subscriptions apart.
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5,
                                              client_name=redis_channel(topic))
        subscription = client.pubsub(ignore_subscribe_messages=True)
        try:
            await subscription.subscribe(redis_channel(topic))
            while True:
                message = await subscription.get_message(ignore_subscribe_messages=True,
                                                         timeout=SUBSCRIPTION_IDLE_SECONDS)
                if message is None:
                    await subscription.ping()  # a connection that died silently fails here
                elif message["type"] == "message":
                    on_message(json.loads(message["data"]))
        except asyncio.CancelledError:
            raise
        except Exception:
            if asyncio.current_task().cancelling():
                raise
            warn_of(logger, "lost Redis while listening to %s; subscribing again", topic)
            await asyncio.sleep(1.0)
        finally:
            # Bounded: a close that waits on its cancelled read would keep
            # the task, and the loop's shutdown, waiting for ever (a
            # long-poll's own loop never closed, the request never answered).
            for closing in (subscription, client):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closing.aclose(), CLOSE_SECONDS)


class Memberships:
    """A long-lived channel's groups (a live page's, an MCP stream's),
    joined again every GROUP_READD_SECONDS until left: channels-redis (and
    the in-memory layer) forget a membership `group_expiry` after it was
    made (a day by default), however busy the channel. Without the renewal a
    page open for a day stopped hearing of its inbox and of its session's
    end, and a stream of being replaced."""

    def __init__(self, layer, channel: str, on_renewal: Callable[[], Awaitable[Any]] | None = None) -> None:
        self._layer, self.channel, self._on_renewal = layer, channel, on_renewal
        self._groups: list[str] = []
        self._renewal: asyncio.Task | None = None

    async def join(self, *groups: str) -> None:
        for group in groups:
            await self._layer.group_add(group, self.channel)
            self._groups.append(group)
        if self._renewal is None:
            self._renewal = asyncio.get_running_loop().create_task(self._renew())

    async def rejoin(self) -> None:
        """Join every group again (the layer may have lost them)."""
        for group in self._groups:
            await self._layer.group_add(group, self.channel)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(GROUP_READD_SECONDS)
            try:
                await self.rejoin()
                if self._on_renewal is not None:
                    await self._on_renewal()
            except Exception:
                warn_of(logger, "could not renew a channel's groups; trying again later")

    async def leave(self) -> None:
        """Leave every group, best effort (a second call does nothing)."""
        if self._renewal is not None:
            await stop_task(self._renewal)
            self._renewal = None
        groups, self._groups = self._groups, []
        for group in groups:
            # A channel left behind would get a copy of every message until its membership expires.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._layer.group_discard(group, self.channel), 1.0)


_stopping: set[asyncio.Task] = set()  # heeding_cancellation's stop_task runs, while a receive has not ended


async def heeding_cancellation(receive: Callable[[], Awaitable[Any]]) -> Any:
    """`await receive()`, except that a cancellation ends it within
    STOP_WAIT_SECONDS, heeded or not by the receive itself: it is stopped
    with `stop_task`, waited for that long, and left to stop in the
    background. A consumer's dispatch loop (Channels) ends by cancelling its
    pending channel-layer receive once and waiting for it: a cancellation
    lost by channels-redis (see `stop_task`) kept that wait, and the socket
    with it, open and silent until a message came for some channel of the
    process, which after a Redis restart could be never."""
    task = asyncio.ensure_future(receive())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stopper = asyncio.ensure_future(stop_task(task))
        _stopping.add(stopper)
        stopper.add_done_callback(_stopping.discard)
        # Mostly the receive has ended by the next step, as when awaited;
        # one that lost the cancellation is cancelled again meanwhile.
        await asyncio.wait({stopper}, timeout=STOP_WAIT_SECONDS)
        raise


async def stop_task(task: asyncio.Task) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again while
    it has not: a receive from channels-redis can lose a cancellation that
    comes while the layer's receive lock passes to it, and go on waiting
    for messages that will not come."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    if not task.cancelled() and task.exception() is not None:
        logger.debug("a stopped task had failed", exc_info=task.exception())
