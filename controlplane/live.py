"""Side effects after commit: Channels group messages, topics every process
listens to (published here, heard through controlplane.topics), and the
per-process watcher that wakes long-polls when the event log advances
anywhere.

The durable rows are the truth; everything here is a nudge. A lost nudge
delays a long-poll by at most twice settings.FEED_RECHECK_SECONDS (the
LogWatcher's look at the log head) and loses nothing.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import os
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import transaction

from controlplane import topics

logger = logging.getLogger("switchboard.live")

LOG_TOPIC = "switchboard.log"
# A topic's PUBLISH waits at most this long for Redis (on the publisher's loop).
PUBLISH_TIMEOUT_SECONDS = 1.0
HEARD_HERE_KEPT = 10_000  # own announcements remembered, to skip their broker copies (LogWatcher.wake_here)


def member_group(member) -> str:
    """The Channels group of every live socket of one member (the web app's
    pages join it); `{"type": "session.ended"}` to it closes them all."""
    return f"member.{member.public_id}"


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
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._queued: dict[object, list[tuple[str, dict]]] = {}  # by layer, on the publisher's loop
        self._flushers: dict[object, asyncio.Task] = {}
        self._sending: set[asyncio.Task] = set()
        self._topics: list[tuple[str, str]] = []  # (channel, message) to publish, on the publisher's loop
        self._publishing: asyncio.Task | None = None
        self._topics_client = None  # made on the publisher's loop, for that loop
        self._handed: list[tuple] = []  # (callback, args) for the publisher's loop, under _lock
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
                logger.warning("could not read the groups of %d messages; sending each", len(batch), exc_info=True)
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
            # A forked child inherits the loop object but not its thread.
            if self._own_loop is None or self._own_loop.is_closed() or self._own_loop_pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="switchboard-publisher", daemon=True).start()
                self._own_loop, self._own_loop_pid = loop, os.getpid()
                self._topics, self._publishing, self._topics_client = [], None, None  # the old loop's
                self._handed, self._handing = [], False
            return self._own_loop

    def _hand_over(self, callback, *args) -> None:
        """Run `callback(*args)` on the publisher's own loop, from any
        thread, in order. What is handed over before the loop takes the last
        ones goes with them, for one wake-up: each `call_soon_threadsafe`
        writes to the loop's wake-up socket, and a push worker's record
        announced every acknowledged item so (docs/benchmarks.md, round
        nineteen)."""
        loop = self._background_loop()
        with self._lock:
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
            logger.warning("could not publish to %s", topic, exc_info=True)

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
                logger.warning("could not publish %d topic messages", len(batch), exc_info=True)

    def send(self, group: str, message: dict) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        loop = self._target_loop(layer)
        try:
            if loop is None:
                async_to_sync(layer.group_send)(group, message)
            elif hasattr(layer, "_group_key"):  # channels-redis (on the publisher's loop): batched
                self._hand_over(self._queue, layer, group, message)
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


def kick(task: str, *args) -> None:
    """Queue a django-q2 task now. A nudge: the durable rows are the truth,
    and a periodic sweep finds what a lost kick left behind."""
    from django_q.tasks import async_task

    try:
        async_task(task, *args)
    except Exception:
        logger.warning("could not queue %s", task, exc_info=True)


def kick_on_commit(task: str, *args) -> None:
    """`kick` once the current transaction commits."""
    transaction.on_commit(lambda: kick(task, *args), robust=True)


def group_send_on_commit(group: str, message: dict) -> None:
    """Send `message` to a Channels group once the current transaction commits."""
    transaction.on_commit(lambda: publisher.send(group, message), robust=True)


def publish_on_commit(topic: str, message: dict) -> None:
    """`publisher.publish` once the current transaction commits."""
    transaction.on_commit(lambda: publisher.publish(topic, message), robust=True)


def announce_on_commit(message: dict) -> None:
    """Once the current transaction commits, tell every process's log
    watcher of the advance `message` names: this process's at once, the
    others through the log topic (controlplane.log.appended)."""
    def announce():
        origin = log_watcher.wake_here(message)
        publisher.publish(LOG_TOPIC, message if origin is None else {**message, "origin": origin})

    transaction.on_commit(announce, robust=True)


class Interest:
    """What a waiter waits for, from the log nudges (controlplane.log):
    new events in some conversations, or in some spaces, or addressed to
    some members (inbox feeds), or a change of who may read some spaces
    (membership events). `event` is set when one may have arrived; the
    waiter re-reads from the database. A nudge that does not say what
    changed wakes everyone."""

    def __init__(self, conversations: set[int] = frozenset(), spaces: set[int] = frozenset(), *,
                 events_in: set[int] = frozenset(), addressed: set[int] = frozenset()) -> None:
        self.conversations = conversations
        self.spaces = spaces  # access changes
        self.events_in = events_in
        self.addressed = addressed
        self.event = asyncio.Event()

    def matches(self, message: dict) -> bool:
        if "conversations" not in message:
            return True
        if (self.conversations.intersection(message["conversations"])
                or self.spaces.intersection(message.get("access_spaces", ()))):
            return True
        if self.events_in and ("spaces" not in message or self.events_in.intersection(message["spaces"])):
            return True
        # An inbox feed shows the addressed events of the spaces its reader
        # may read now: a membership change anywhere may show older ones.
        return bool(self.addressed) and (message.get("members") is None or message.get("access_spaces")
                                         or bool(self.addressed.intersection(message["members"])))


class LogWatcher:
    """One per process: listens to the log topic and wakes local waiters:
    those that took a `mark` on any advance, those that `watch` an
    `Interest` (long-polls, live pages) on the advances it names.

    While anyone waits it also reads the log head every
    FEED_RECHECK_SECONDS, and wakes every waiter when a commit it read one
    look ago has still not been announced: a lost nudge, or without Redis a
    commit of another process. One small read per process, however many
    wait: each waiter re-reading its feed on a timer instead cost a read
    per waiter per interval."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._advanced: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._interests: set[Interest] = set()
        self._waiting = 0
        self._announced = 0  # the highest position a nudge named
        self._pid = 0
        self._origins = itertools.count()
        # The broker's copies of what this process announced itself
        # (wake_here), to skip; the oldest go first if copies are lost.
        self._heard_here: collections.OrderedDict[str, None] = collections.OrderedDict()

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._pid = loop, os.getpid()
            self._advanced = asyncio.Event()
            self._interests, self._waiting, self._announced = set(), 0, 0
            self._heard_here.clear()
            self._tasks = [loop.create_task(self._listen()), loop.create_task(self._check_head())]

    def mark(self) -> asyncio.Event:
        """Take before reading; `wait(mark)` returns at once if the log
        advanced since, so no commit can slip between a read and a wait."""
        self._ensure_started()
        return self._advanced

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        """Until `event` (a mark, an interest's event) is set or `timeout`."""
        self._ensure_started()
        self._waiting += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        finally:
            self._waiting -= 1

    def watch(self, **interest) -> Interest:
        """Register an `Interest` (its arguments); `unwatch` it when the
        waiter goes."""
        self._ensure_started()
        interest = Interest(**interest)
        self._interests.add(interest)
        return interest

    def unwatch(self, interest: Interest) -> None:
        self._interests.discard(interest)

    async def stop(self) -> None:
        """Stop listening, at the server's shutdown (the lifespan's): on
        Redis the subscription's connection closes; with a channel layer's
        group, a channel left behind would be sent every nudge until its
        membership expires, a day later. (The tasks a server leaves at its
        exit are cancelled too late to leave.)"""
        tasks, self._tasks = self._tasks, []
        if self._loop is asyncio.get_running_loop():
            for task in tasks:
                await topics.stop_task(task)

    def wake_here(self, message: dict) -> str | None:
        """From any thread: wake this process's waiters for a commit it
        made, without waiting for the broker's round trip. Returns the tag
        that marks the broadcast copy as this process's own, so that it is
        skipped here (None when no watcher runs in this process). Should
        the copy come first, the waiters wake twice: never not at all."""
        loop = self._loop
        if loop is None or self._pid != os.getpid() or loop.is_closed() or not loop.is_running():
            return None
        origin = f"{self._pid}.{id(self)}.{next(self._origins)}"
        try:
            loop.call_soon_threadsafe(self._wake_here, origin, message)
        except RuntimeError:  # the loop closed meanwhile
            return None
        return origin

    def _wake_here(self, origin: str, message: dict) -> None:
        self._heard_here[origin] = None
        while len(self._heard_here) > HEARD_HERE_KEPT:
            self._heard_here.popitem(last=False)
        self._wake(message)

    def _heard(self, message: dict) -> None:
        """A message of the log topic: skipped if this process announced it itself."""
        if message.get("origin") in self._heard_here:
            del self._heard_here[message["origin"]]
        else:
            self._wake(message)

    def _wake(self, message: dict) -> None:
        self._announced = max(self._announced, message.get("position", 0))
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()
        for interest in self._interests:
            if interest.matches(message):
                interest.event.set()

    async def _listen(self) -> None:
        await topics.listen(LOG_TOPIC, self._heard)

    async def _check_head(self) -> None:
        from controlplane.db import db_call
        from controlplane.log import head_position

        seen = None  # the head one look ago
        while True:
            await asyncio.sleep(settings.FEED_RECHECK_SECONDS)
            if not self._interests and not self._waiting:
                seen = None
                continue
            try:
                head = await db_call(head_position)()
            except Exception:
                logger.warning("could not read the log head", exc_info=True)
                continue
            if seen is not None and self._announced < seen:
                self._wake({"type": "log.advanced", "position": seen})  # says nothing of what: wakes everyone
            seen = head


def shared_layer() -> bool:
    """Whether the channel layer reaches other processes (Redis), not only this one."""
    layer = get_channel_layer()
    return layer is not None and not isinstance(layer, InMemoryChannelLayer)


log_watcher = LogWatcher()
