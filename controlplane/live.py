"""Side effects after commit: Channels group messages and topics every
process listens to (sent by controlplane.publishing, heard through
controlplane.topics), and the per-process watcher that wakes long-polls
when the event log advances anywhere.

The durable rows are the truth; everything here is a nudge. A lost nudge
delays a long-poll by at most twice settings.FEED_RECHECK_SECONDS (the
LogWatcher's look at the log head) and loses nothing.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import transaction

from controlplane import topics, turns
from controlplane.errors import warn_of
from controlplane.publishing import publisher

logger = logging.getLogger("switchboard.live")

LOG_TOPIC = "switchboard.log"
HEARD_HERE_KEPT = 10_000  # own announcements remembered, to skip their broker copies (LogWatcher.wake_here)
RANGES_KEPT = 10_000  # announced ranges held between two looks at the log head before they are merged


def credential_group(credential_id: str) -> str:
    """The Channels group of the MCP streams a credential opened;
    `{"type": "credential.revoked"}` to it ends them."""
    return f"credential.{credential_id}"


def member_group(member) -> str:
    """The Channels group of every live socket of one member (the web app's
    pages join it); `{"type": "session.ended"}` to it closes them all."""
    return f"member.{member.public_id}"


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


def kick_once_on_commit(task: str, *args) -> None:
    """`kick_on_commit`, coalesced where the cache is shared (Redis): a run
    of the same task and arguments queued and not yet started is not queued
    again. The task calls `started(task, *args)` before it reads anything,
    so a commit after that queues a run anew and none is missed. A run lost
    on its way leaves the mark for a minute, when the task's sweep has run."""
    def kick_once():
        from django.core.cache import cache

        if shared_layer() and not cache.add(_queued_key(task, args), 1, timeout=60):
            return
        kick(task, *args)

    transaction.on_commit(kick_once, robust=True)


def started(task: str, *args) -> None:
    """From a task queued by `kick_once_on_commit`: a later commit queues it again."""
    if shared_layer():
        from django.core.cache import cache

        cache.delete(_queued_key(task, args))


def _queued_key(task: str, args: tuple) -> str:
    return f"queued:{task}:{':'.join(map(str, args))}"


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


def announce_withheld(space_id: int) -> None:
    """Once the current transaction commits, tell every process's log
    watcher that bodies in `space_id` may have been withheld (a grant's
    barrier started, SPEC §5): no event says so, and live pages that show
    them look again (web.streams). It names no position and no feed."""
    announce_on_commit({"type": "bodies.withheld", "conversations": [], "spaces": [], "members": [],
                        "withheld_spaces": [space_id]})


class Interest:
    """What a waiter waits for, from the log nudges (controlplane.log):
    new events in some conversations, or in some spaces, or addressed to
    some members (inbox feeds), or a change of who may read some spaces
    (membership events) or some of their bodies (`withheld` is then set
    too). `event` is set when one may have arrived; the waiter re-reads
    from the database. A nudge that does not say what changed wakes
    everyone (but says nothing of bodies: a lost nudge of another process
    without Redis is found that way, once a second, and each would have
    every page of an explicit_only space ask again)."""

    def __init__(self, conversations: set[int] = frozenset(), spaces: set[int] = frozenset(), *,
                 events_in: set[int] = frozenset(), addressed: set[int] = frozenset()) -> None:
        self.conversations = conversations
        self.spaces = spaces  # access changes
        self.events_in = events_in
        self.addressed = addressed
        self.event = asyncio.Event()
        self.withheld = False  # bodies of `spaces` may have been withheld since the waiter cleared it

    def matches(self, message: dict) -> bool:
        if self.spaces.intersection(message.get("withheld_spaces", ())):
            self.withheld = True
            return True
        if "conversations" not in message:
            return True
        if (self.conversations.intersection(message["conversations"])
                or self.spaces.intersection(message.get("access_spaces", ()))):
            return True
        if self.events_in and ("spaces" not in message or self.events_in.intersection(message["spaces"])):
            return True
        # An inbox feed shows the addressed events of the spaces its reader
        # may read now: a change of their own membership may show older
        # ones. (Anyone's woke every inbox waiter of the host: one member
        # joining and leaving a space cost every waiting poll a read. A
        # nudge that does not name whose changed is an older process's.)
        if not self.addressed:
            return False
        changed = message.get("access_members")
        return (message.get("members") is None or bool(self.addressed.intersection(message["members"]))
                or (bool(message.get("access_spaces")) if changed is None else
                    bool(self.addressed.intersection(changed))))


class AnnouncedPositions:
    """Which log positions the nudges a process heard announced, above
    `checked`, the head it last looked at: a LogWatcher's bookkeeping.

    Every append takes the next positions from the log head, and its
    nudge names them (`first` to `position`, controlplane.log.appended), so
    the positions up to a newer head that no nudge covered are the lost
    ones, however many later commits were announced meanwhile. Kept only
    while someone waits (`checked` is None otherwise), from the highest
    position heard when the waiting began: every smaller one committed
    before it did (commit order, controlplane.log), so a waiter's first read
    sees them all."""

    def __init__(self) -> None:
        self.highest = 0  # the highest position any nudge named
        self.checked: int | None = None
        self._ranges: list[tuple[int, int]] = []  # as heard: in any order, duplicates and all
        self._lost_track = False

    def follow(self) -> None:
        """Someone waits: account for the positions after the highest heard."""
        if self.checked is None:
            self.checked, self._ranges, self._lost_track = self.highest, [], False

    def forget(self) -> None:
        """No one waits: keep nothing."""
        self.checked, self._ranges, self._lost_track = None, [], False

    def heard(self, message: dict) -> None:
        """A nudge: once per commit per process, so only an append. One
        without `first` (an older process's) covers its own position."""
        last = message.get("position")
        if not isinstance(last, int):
            return  # it covers nothing: the look finds the commit unannounced
        if last > self.highest:
            self.highest = last
        if self.checked is not None and last > self.checked:
            first = message.get("first", last)
            self._ranges.append((first if isinstance(first, int) and first <= last else last, last))
            if len(self._ranges) > RANGES_KEPT:
                self._merge()
                if len(self._ranges) > RANGES_KEPT // 2:
                    # So many gaps and no look to account for them: start
                    # again from the highest heard; the next look wakes everyone.
                    self.checked, self._ranges, self._lost_track = max(self.checked, self.highest), [], True

    def missed(self, head: int) -> bool:
        """Whether a position in (checked, head] was never announced (or
        the count was given up); then they are accounted for, and only the
        ranges above `head` are kept."""
        lost, self._lost_track = self._lost_track, False
        if self.checked is None or head <= self.checked:
            return lost
        self._merge()
        covered = sum(min(last, head) - first + 1 for first, last in self._ranges if first <= head)
        expected, self.checked = head - self.checked, head
        self._ranges = [(max(first, head + 1), last) for first, last in self._ranges if last > head]
        return lost or covered < expected

    def _merge(self) -> None:
        """Sorted, overlapping and adjacent ranges joined, nothing at or below `checked`."""
        merged: list[tuple[int, int]] = []
        for first, last in sorted(self._ranges):
            if last <= self.checked:
                continue
            first = max(first, self.checked + 1)
            if merged and first <= merged[-1][1] + 1:
                if last > merged[-1][1]:
                    merged[-1] = (merged[-1][0], last)
            else:
                merged.append((first, last))
        self._ranges = merged


class LogWatcher:
    """One per process: listens to the log topic and wakes local waiters:
    those that took a `mark` on any advance, those that `watch` an
    `Interest` (long-polls, live pages) on the advances it names.

    While anyone waits it also reads the log head every
    FEED_RECHECK_SECONDS, and wakes every waiter when a position it read
    one look ago was not covered by any nudge heard (AnnouncedPositions): a
    lost nudge, or without Redis a commit of another process, even behind
    later commits that were announced. One small read per process, however
    many wait: each waiter re-reading its feed on a timer instead cost a
    read per waiter per interval."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._advanced: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._interests: set[Interest] = set()
        self._waiting = 0
        self._announced = AnnouncedPositions()
        self._pid = 0
        self._origins = itertools.count()
        # The broker's copies of what this process announced itself
        # (wake_here), to skip; the oldest go first if copies are lost.
        self._heard_here: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.closing = False  # the server is shutting down: nothing waits any more

    def close(self) -> None:
        """The server is shutting down (controlplane.uvicorn_process.Server):
        every waiter is woken and waits no more, so long-polls answer and
        MCP streams end now, instead of being cancelled at the graceful
        shutdown's timeout with no final frame."""
        self.closing = True
        if self._advanced is not None:
            self._wake({"type": "closing"})  # names nothing: wakes everyone

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._pid = loop, os.getpid()
            self._advanced = asyncio.Event()
            self._interests, self._waiting, self._announced = set(), 0, AnnouncedPositions()
            self._heard_here.clear()
            # Started by whichever waiter comes first, for every waiter of the process.
            self._tasks = [loop.create_task(work(), context=turns.shared_context())
                           for work in (self._listen, self._check_head)]

    def mark(self) -> asyncio.Event:
        """Take before reading; `wait(mark)` returns at once if the log
        advanced since, so no commit can slip between a read and a wait."""
        self._ensure_started()
        return self._advanced

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        """Until `event` (a mark, an interest's event) is set or `timeout`;
        at once while the server shuts down."""
        if self.closing:
            return
        self._ensure_started()
        self._announced.follow()
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
        self._announced.follow()
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
        self._announced.heard(message)
        self._wake(message)

    def _heard(self, message: dict) -> None:
        """A message of the log topic: skipped if this process announced it itself."""
        if message.get("origin") in self._heard_here:
            del self._heard_here[message["origin"]]
        else:
            self._announced.heard(message)
            self._wake(message)

    def _wake(self, message: dict) -> None:
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
                self._announced.forget()
                continue
            try:
                head = await db_call(head_position)()
            except Exception:
                warn_of(logger, "could not read the log head")
                continue
            if seen is not None and self._announced.missed(seen):
                self._wake({"type": "log.advanced", "position": seen})  # says nothing of what: wakes everyone
            seen = head


def shared_layer() -> bool:
    """Whether the channel layer reaches other processes (Redis), not only this one."""
    layer = get_channel_layer()
    return layer is not None and not isinstance(layer, InMemoryChannelLayer)


log_watcher = LogWatcher()
