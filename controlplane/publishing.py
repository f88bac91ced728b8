"""The publisher: Channels group messages and topics sent from sync code
(a request's thread, a worker's database thread) after their commits,
without a new event loop per message. controlplane.live says when to send;
controlplane.topics is where every process hears the topics."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from controlplane import topics
from controlplane.errors import warn_of

logger = logging.getLogger("switchboard.live")

# A topic's PUBLISH waits at most this long for Redis (on the publisher's loop).
PUBLISH_TIMEOUT_SECONDS = 1.0


class Publisher:
    """Sends to Channels groups from sync code without a new event loop per
    message (what `async_to_sync` would cost on every send).

    In-memory layers live on the server's event loop, so messages are handed
    to that loop (`bind_server_loop`, called by the ASGI application). Other
    layers (Redis) get one long-lived background loop per process, so their
    connection pools stay warm. Without either (tests, management commands)
    it falls back to `async_to_sync`. Sends are fire-and-forget: a failure is
    logged, never raised into the request that committed.

    At most IN_FLIGHT sends run at once per loop; the rest wait their turn.
    Unbounded, a burst of commits opened more connections than the Redis
    pool holds, and redis-py's asyncio pool fails at its limit instead of
    waiting (MaxConnectionsError), losing nudges.

    On Redis, the messages queued while a batch goes out leave together:
    one pipelined read finds which of their groups have a member, and only
    those get a `group_send` (two to four round trips each, even to an
    empty group). Most groups are empty most of the time: a member's inbox
    group has members only while their inbox page or an MCP stream is open.

    Topics (`publish`, heard through `controlplane.topics.listen`) are what every process
    listens to, once each: the log's advances after every commit, new due
    deliveries. On Redis each is one PUBLISH to a pub/sub channel that each
    listening process subscribes to, sent from the background loop like a
    group message (those queued meanwhile in one pipeline): a `group_send`
    to every process's channel in a group took three round trips and a
    script there, whose interpreter time delayed the same process's live
    pass, and a PUBLISH from the committing thread made the send's own
    response wait (docs/benchmarks.md, round seventeen).
    """

    IN_FLIGHT = 32

    def __init__(self) -> None:
        self._server_loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._own_loop_pid = 0
        self._lock = threading.Lock()
        self._forget_loop()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a forked child (django-q2's workers): a lock another thread
        held at the fork stays held, with no thread left to release it, and
        the parent's loop, its tasks and what was handed to it stay the
        parent's (a flusher inherited mid-batch would never finish here)."""
        self._lock = threading.Lock()
        self._forget_loop()

    def _forget_loop(self) -> None:
        """What belongs to the publisher's loop (and lives on it), dropped with it."""
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._queued: dict[object, list[tuple[str, dict]]] = {}  # by layer
        self._flushers: dict[object, asyncio.Task] = {}
        self._sending: set[asyncio.Task] = set()
        self._topics: list[tuple[str, str]] = []  # (channel, message) to publish
        self._publishing: asyncio.Task | None = None
        self._topics_client = None  # made on the loop, for that loop
        self._handed: list[tuple] = []  # (callback, args) for the loop, under _lock
        self._handing = False  # whether the loop has been asked to take them

    async def _send(self, layer, group: str, message: dict) -> None:
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:  # created on its own loop, by that loop's thread
            gate = self._gates[loop] = asyncio.Semaphore(self.IN_FLIGHT)
        async with gate:
            await layer.group_send(group, message)

    def _queue(self, layer, group: str, message: dict) -> None:
        """On the publisher's loop: queue a message for `layer`'s next batch,
        and start its flusher unless it is running."""
        self._queued.setdefault(layer, []).append((group, message))
        flusher = self._flushers.get(layer)
        if flusher is None or flusher.done():
            self._flushers[layer] = asyncio.get_running_loop().create_task(self._flush(layer))

    async def _flush(self, layer) -> None:
        """Send what is queued for `layer`, a batch per read of its groups:
        what queues meanwhile goes with the next."""
        while batch := self._queued.pop(layer, None):
            try:
                listened = await listened_groups(layer, {group for group, _ in batch})
            except Exception:
                warn_of(logger, "could not read the groups of %d messages; sending each", len(batch))
                listened = {group for group, _ in batch}
            for group, message in batch:
                if group in listened:
                    send = asyncio.get_running_loop().create_task(self._send(layer, group, message))
                    self._sending.add(send)  # a strong reference until it is done
                    send.add_done_callback(self._sending.discard)
                    send.add_done_callback(_log_failure)

    def bind_server_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._server_loop = loop

    def _background_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            return self._background_loop_locked()

    def _background_loop_locked(self) -> asyncio.AbstractEventLoop:
        # A forked child inherits the loop object but not its thread.
        if self._own_loop is None or self._own_loop.is_closed() or self._own_loop_pid != os.getpid():
            self._forget_loop()  # the old loop's
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="switchboard-publisher", daemon=True).start()
            self._own_loop, self._own_loop_pid = loop, os.getpid()
        return self._own_loop

    def _hand_over(self, callback, *args) -> None:
        """Run `callback(*args)` on the publisher's own loop, from any
        thread, in order. What is handed over before the loop takes the last
        ones goes with them, for one wake-up: each `call_soon_threadsafe`
        writes to the loop's wake-up socket, and a push worker's record
        announced every acknowledged item so (docs/benchmarks.md, round
        nineteen)."""
        with self._lock:
            loop = self._background_loop_locked()
            self._handed.append((callback, args))
            if self._handing:
                return
            self._handing = True
        try:
            loop.call_soon_threadsafe(self._take_handed)
        except BaseException:
            with self._lock:
                self._handing = False
            raise

    def _take_handed(self) -> None:
        with self._lock:
            handed, self._handed, self._handing = self._handed, [], False
        for callback, args in handed:
            try:
                callback(*args)
            except Exception:
                logger.warning("could not queue a message to publish", exc_info=True)

    def _target_loop(self, layer) -> asyncio.AbstractEventLoop | None:
        if isinstance(layer, InMemoryChannelLayer):
            loop = self._server_loop
            return loop if loop is not None and loop.is_running() else None
        return self._background_loop()

    def publish(self, topic: str, message: dict) -> None:
        """Tell every process that `listen`s to `topic` of `message`: one
        PUBLISH on Redis; without it, the in-memory layer's group of that
        name (this process is the only one). A failure is logged."""
        if not topics.on_redis():
            self.send(topic, message)
            return
        try:
            self._hand_over(self._queue_topic, topics.redis_channel(topic), json.dumps(message, separators=(",", ":")))
        except Exception:
            warn_of(logger, "could not publish to %s", topic)

    def _queue_topic(self, channel: str, message: str) -> None:
        """On the publisher's loop: queue a PUBLISH, and start publishing
        unless it runs."""
        self._topics.append((channel, message))
        if self._publishing is None or self._publishing.done():
            self._publishing = asyncio.get_running_loop().create_task(self._publish_topics())

    async def _publish_topics(self) -> None:
        """Publish what is queued, in order: what queues meanwhile goes in
        the next pipeline."""
        if self._topics_client is None:
            import redis.asyncio

            self._topics_client = redis.asyncio.Redis.from_url(
                settings.REDIS_URL, socket_timeout=PUBLISH_TIMEOUT_SECONDS,
                socket_connect_timeout=PUBLISH_TIMEOUT_SECONDS)
        while self._topics:
            batch, self._topics = self._topics, []
            try:
                async with self._topics_client.pipeline(transaction=False) as pipe:
                    for channel, message in batch:
                        pipe.publish(channel, message)
                    await pipe.execute()
            except Exception:
                warn_of(logger, "could not publish %d topic messages", len(batch))

    def send(self, group: str, message: dict) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            if hasattr(layer, "_group_key"):  # channels-redis (on the publisher's loop): batched
                self._hand_over(self._queue, layer, group, message)
            elif (loop := self._target_loop(layer)) is None:
                async_to_sync(layer.group_send)(group, message)
            else:
                asyncio.run_coroutine_threadsafe(self._send(layer, group, message), loop).add_done_callback(
                    _log_failure)
        except Exception:
            logger.warning("group_send to %s failed", group, exc_info=True)


async def listened_groups(layer, groups: set[str]) -> set[str]:
    """Which of `groups` have a member on a channels-redis `layer`: one
    pipelined read per Redis host. Memberships past the layer's
    `group_expiry` still count: the one `group_send` they bring about
    removes them."""
    by_host: dict[int, list[str]] = {}
    for group in groups:
        by_host.setdefault(layer.consistent_hash(group), []).append(group)
    listened = set()
    for host, names in by_host.items():
        pipe = layer.connection(host).pipeline(transaction=False)
        for group in names:
            pipe.zcard(layer._group_key(group))
        listened.update(group for group, members in zip(names, await pipe.execute()) if members)
    return listened


def _log_failure(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("group_send failed", exc_info=future.exception())


publisher = Publisher()
