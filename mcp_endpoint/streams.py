"""What an `events/stream` consumer listens to while it waits: the commits
its source's interest names (`mcp_endpoint.sources.interest`: the
committing process wakes them at once), its inbox's nudges (the mailbox
announces every admission and acknowledgement to the member's inbox
group), the member's suspension (`session.ended` to the
member's group, as for their live pages), and, for the inbox events,
whether a newer consumer took over.

One consumer owns a member's stream of an inbox event at a time, on any
server process: a new one announces a claim (its start time and a random
token) to the owner group over the channel layer, and an older consumer
that hears a newer claim ends with `terminated`. Claims are ordered the
same way everywhere, so of two that start together exactly one survives;
and a replaced consumer's cleanup only removes its own channel, so however
late it fails, it never ends its replacement.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import secrets
import time

from channels.layers import get_channel_layer

from controlplane.live import Interest, log_watcher, member_group
from controlplane.topics import Memberships, stop_task
from inbox.mailbox import inbox_group
from webhooks.mcp import ITEM, PENDING

CLAIM = "mcp.stream.claim"
# Streams one member may hold open on one server process: each is a task
# that reads again on every nudge (for space events, on every commit in
# the space).
MAX_PER_MEMBER = 8
_open: collections.Counter[int] = collections.Counter()


class TooManyStreams(Exception):
    pass


class StreamOwner:
    def __init__(self, member, source, arguments: dict) -> None:
        self.inbox = source.name in (ITEM, PENDING)
        digest = hashlib.sha256(source.stream_key(arguments).encode()).hexdigest()[:16]
        self.owner_group = f"mcp-stream.{member.public_id}.{digest}"
        self.groups = [member_group(member)] + ([self.owner_group, inbox_group(member)] if self.inbox else [])
        self.member_pk = member.pk
        self.counted = False
        self.claim = (time.time_ns(), secrets.token_hex(8))
        self.replaced = asyncio.Event()
        self.suspended = asyncio.Event()
        self.nudged = asyncio.Event()
        self._layer = get_channel_layer()
        self._channel: str | None = None
        self._listener: asyncio.Task | None = None
        self._memberships: Memberships | None = None
        self._interest: Interest | None = None

    async def start(self) -> None:
        """Raises TooManyStreams past MAX_PER_MEMBER on this process."""
        if _open[self.member_pk] >= MAX_PER_MEMBER:
            raise TooManyStreams()
        _open[self.member_pk] += 1
        self.counted = True
        if self._layer is None:
            return
        self._channel = await self._layer.new_channel()
        self._memberships = Memberships(self._layer, self._channel)
        await self._memberships.join(*self.groups)
        self._listener = asyncio.get_running_loop().create_task(self._listen())
        if self.inbox:
            await self._layer.group_send(self.owner_group, {"type": CLAIM, "at": self.claim[0],
                                                            "token": self.claim[1]})

    async def _listen(self) -> None:
        while True:
            message = await self._layer.receive(self._channel)
            if message.get("type") == CLAIM:
                if (message["at"], message["token"]) > self.claim:
                    self.replaced.set()
            elif message.get("type") == "session.ended":
                self.suspended.set()
            else:
                self.nudged.set()

    def watch(self, **interest) -> None:
        """Before the first read: wake for the commits this
        `controlplane.live.Interest` (its arguments) names, besides the
        nudges. A lost nudge is found by the process's log watcher (its look
        at the log head), not by a re-read of every stream."""
        self._interest = log_watcher.watch(**interest)

    async def wait(self, timeout: float) -> str | None:
        """Until something may have changed (a nudge; for space events, a
        commit the interest names) or `timeout`. Then why the stream must
        end, if it must: "replaced" (a newer consumer took over) or
        "suspended"."""
        waiters = [asyncio.ensure_future(e.wait()) for e in (self.replaced, self.suspended, self.nudged)]
        if self._interest is not None:
            waiters.append(asyncio.ensure_future(log_watcher.wait(self._interest.event, timeout)))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        self.nudged.clear()
        if self._interest is not None:
            self._interest.event.clear()  # before the caller reads: a commit during its read wakes the next wait
        return "replaced" if self.replaced.is_set() else "suspended" if self.suspended.is_set() else None

    async def stop(self) -> None:
        if self._interest is not None:
            log_watcher.unwatch(self._interest)
            self._interest = None
        if self.counted:
            _open[self.member_pk] -= 1
            if _open[self.member_pk] <= 0:
                del _open[self.member_pk]
            self.counted = False
        if self._listener is not None:
            await stop_task(self._listener)
        if self._memberships is not None:
            await self._memberships.leave()
