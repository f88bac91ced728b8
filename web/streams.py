"""One live stream per conversation per process, shared by its sockets.

However many pages have a conversation open on this process, a commit in it
costs one pass: one round trip for which of their members may still read it
and the messages after the lowest position any of them has seen, rendered
once. Each socket then gets the frames after its own position, or a 4403
close if its member lost access. A pass runs on the event loop, its query
on the loop's own connection where there is one (controlplane.loop_reads):
it shares the loop with every socket and request of the process, so work
per socket there would add up.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass

from django.conf import settings

from controlplane import turns
from controlplane.db import db_call, plain_rows
from controlplane.loop_reads import loop_reads
from controlplane.live import log_watcher
from controlplane.models import Conversation
from inbox.render import may_withhold
from web import messages

logger = logging.getLogger("switchboard.web")

LOOP_FRAMES = 8  # a pass renders at most this many frames on the event loop itself
# A socket whose page has not taken a pass's frames within this long (its
# buffers full: the page stopped reading) leaves the stream and is closed;
# its page, if it ever reads again, reconnects from its last frame.
SEND_SECONDS = 2.0


# Bodies the page shows may have been withheld since (a grant's barrier
# started): the page asks which (web.views.conversations.history).
WITHHELD_FRAME = json.dumps({"type": "withheld"})


@dataclass
class Pass:
    readers: set[int]
    frames: list[tuple[int, str]]  # (position, the frame's JSON text), in position order
    full: bool  # a whole batch: more may follow at once
    withheld: bool = False  # bodies may have been withheld: the sockets are told after the frames


def read_pass(conversation_id: int, members: set[int], after: int) -> Pass:
    """A pass on this thread's database connection."""
    rows = plain_rows(*messages.readers_and_after_query(conversation_id, members, after))
    return _pass(*messages.readers_and_after(rows))


async def next_pass(conversation_id: int, members: set[int], after: int) -> Pass:
    """`read_pass` from the event loop: its query through `loop_reads` (on
    PostgreSQL under the server, with no thread hop either way), its frames
    rendered on the loop; on a request thread where a body may be withheld
    (an explicit_only space's grants are looked up), or where there are more
    than LOOP_FRAMES (a catch-up), so that rendering them never holds up
    every socket and request of the process."""
    rows = await loop_reads.rows(*messages.readers_and_after_query(conversation_id, members, after))
    readers, send_policy, found = messages.readers_and_after(rows)
    if len(found) > LOOP_FRAMES or (found and may_withhold(send_policy)):
        return await db_call(_pass)(readers, send_policy, found)
    return _pass(readers, send_policy, found)


def _pass(readers: set[int], send_policy: str | None, rows: list[messages.Row]) -> Pass:
    frames = [(row["position"], json.dumps({"type": "message", **row}))
              for row in messages.render_rows(send_policy, rows)]
    return Pass(readers, frames, len(rows) == messages.LIVE_BATCH)


class ConversationStream:
    """The sockets (consumers) of one conversation on this event loop. A
    socket has `member_pk` and `position` (the last one it was sent), and
    answers `deliver(frames, caught_up)`, `tell(text)`, `lose_access()` and
    `fail()`."""

    def __init__(self, conversation: Conversation, on_empty) -> None:
        self.conversation_id = conversation.pk
        self.sockets: set = set()
        self.interest = log_watcher.watch(conversations={conversation.pk}, spaces={conversation.space_id})
        self._on_empty = on_empty
        # Made by the first socket to join, for every socket: none's caller.
        self._task = asyncio.get_running_loop().create_task(self._run(), context=turns.shared_context())

    def join(self, socket) -> None:
        self.sockets.add(socket)
        self.interest.event.set()  # a pass for its backfill

    def leave(self, socket) -> None:
        self.sockets.discard(socket)
        if not self.sockets:
            self.interest.event.set()  # end the stream now, not at the next commit

    async def _run(self) -> None:
        try:
            while self.sockets:
                self.interest.event.clear()  # before reading: a commit during the pass wakes the next one
                withheld, self.interest.withheld = self.interest.withheld, False
                sockets = list(self.sockets)
                result = await next_pass(
                    self.conversation_id, {s.member_pk for s in sockets}, min(s.position for s in sockets))
                result.withheld = withheld
                if len(sockets) == 1:
                    await self._deliver(sockets[0], result)
                else:  # side by side: a page that stops reading holds up no other
                    await asyncio.gather(*(self._deliver(socket, result) for socket in sockets))
                if result.full:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.interest.event.wait(), settings.FEED_RECHECK_SECONDS)
        except Exception:
            logger.exception("live stream of conversation %s failed", self.conversation_id)
            # Emptied and forgotten before any close is awaited: a socket
            # joining meanwhile starts a new stream instead of this ended one.
            sockets, self.sockets = list(self.sockets), set()
            self._on_empty(self)
            await asyncio.gather(*(_close(socket) for socket in sockets))
        finally:
            log_watcher.unwatch(self.interest)
            self._on_empty(self)

    async def _deliver(self, socket, result: Pass) -> None:
        if socket not in self.sockets:
            return  # it left during the pass
        try:
            async with asyncio.timeout(SEND_SECONDS):
                if socket.member_pk not in result.readers:
                    self.leave(socket)
                    await socket.lose_access()
                    return
                frames = [(position, text) for position, text in result.frames if position > socket.position]
                await socket.deliver(frames, caught_up=not result.full)
                if result.withheld:
                    await socket.tell(WITHHELD_FRAME)
        except Exception as error:
            stalled = isinstance(error, TimeoutError)
            logger.warning("%s; dropping it", "a live socket stopped reading" if stalled
                           else "could not send to a live socket", exc_info=not stalled)
            self.leave(socket)
            # If it is still open, its page reconnects rather than wait on no stream;
            # the close waits on that page too, so the pass does not.
            _closing.add(task := asyncio.get_running_loop().create_task(_close(socket)))
            task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task] = set()  # closes under way, held until they end


async def _close(socket) -> None:
    """Close `socket` (1011: its page reconnects from its last frame), if it
    still can be within SEND_SECONDS: each on its own, so one already gone
    or no longer reading stops no other."""
    try:
        async with asyncio.timeout(SEND_SECONDS):
            await socket.fail()
    except Exception:
        logger.debug("could not close a live socket (gone already, or not reading?)", exc_info=True)


class Streams:
    """This process's streams, by conversation. Streams belong to the event
    loop that made them (one per server process; tests make new loops)."""

    def __init__(self) -> None:
        self._streams: dict[tuple[asyncio.AbstractEventLoop, int], ConversationStream] = {}

    def join(self, socket, conversation: Conversation) -> ConversationStream:
        key = (asyncio.get_running_loop(), conversation.pk)
        stream = self._streams.get(key)
        if stream is None or not stream.sockets:
            stream = self._streams[key] = ConversationStream(
                conversation, on_empty=lambda s, key=key: self._forget(key, s))
        stream.join(socket)
        return stream

    def running(self) -> int:
        """How many streams this event loop has."""
        loop = asyncio.get_running_loop()
        return sum(1 for stream_loop, _ in self._streams if stream_loop is loop)

    def _forget(self, key, stream: ConversationStream) -> None:
        if self._streams.get(key) is stream:
            del self._streams[key]


streams = Streams()
