"""Live pages over WebSockets.

A conversation socket streams the conversation's messages after the
position the page last saw: the page's newest message on connect, its last
received frame on reconnect. It first catches up with reads of its own,
then shares the conversation's stream (web.streams): each pass checks every
socket's access again and re-reads from the database after the positions
they have seen, so frames are never duplicated or skipped, and a member who
loses access gets a 4403 close at the next pass (a removal is an event of
the space, and wakes it). The log watcher starts a pass when this process
hears of a commit in the conversation or of a membership change in its
space; a pass also runs every FEED_RECHECK_SECONDS in case a nudge was lost.
"""
from __future__ import annotations

import asyncio
import functools
import json

from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings

from controlplane import holding, turns
from controlplane.access import readable_conversation
from controlplane.live import member_group
from controlplane.topics import Memberships, heeding_cancellation, stop_task
from controlplane.ratelimit import address_wait, member_request_wait, scope_address, source
from inbox.mailbox import inbox_group
from controlplane.db import db_call
from web import inbox_counts
from web.pages import digits, member_of
from web.sockets import session_group, signed_in_user_id
from web.streams import next_pass, streams

# Application close codes. After any of them the page does not reconnect.
SIGNED_OUT = 4401  # no active member behind the session
ACCESS_LOST = 4403  # the member may not (or no longer) read the conversation
RESYNC = 4409  # too far behind to replay: the page reloads instead
SERVER_ERROR = 1011  # the page reconnects and resumes from its last frame
BACKFILL_BATCHES = 5  # at most this many batches are replayed on connect


class SessionSocket:
    """A socket that ends with its session: signing out, or the member's
    suspension, closes it (4401). Opening one counts as a request against
    the member's rate limit (one budget with the API and the web actions),
    and it holds one of the member's places in this process while it is
    open (controlplane.holding): past either, the handshake is refused, and
    the page retries with backoff."""

    memberships: Memberships | None = None
    holder: int | None = None  # the member whose place the socket holds
    heart: asyncio.Task | None = None
    closed = False

    async def close(self, code=None, reason=None):
        """Once: two reasons may arrive together (signing out, then the
        session's deletion), and the server takes a second close for an
        application error."""
        if not self.closed:
            self.closed = True
            await super().close(code=code, reason=reason)

    @property
    def channel_receive(self):
        return self._channel_receive

    @channel_receive.setter
    def channel_receive(self, receive) -> None:
        # Set by Channels' consumer just before its dispatch loop, which ends
        # by cancelling the receive and waiting for it: see heeding_cancellation.
        self._channel_receive = functools.partial(heeding_cancellation, receive)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """Ignored: both sockets are one-way (the composer and the inbox's
        actions post over HTTP), and a frame the JSON consumer would parse
        could only fail there, a traceback in the log for each one."""

    async def __call__(self, scope, receive, send):
        """The socket's whole life. One that ends without a disconnect (its
        channel-layer receive failed: Redis lost) still leaves its groups
        and stream: its renewal would otherwise add a dead channel to its
        groups for as long as the process lives. (A second `disconnect`
        does nothing.) Its work on the request threads takes its client
        address's turns, as an HTTP request's does (controlplane.turns): it
        took a thread ahead of every request waiting for its turn."""
        key = turns.caller.set(source(scope_address(scope)))
        try:
            return await super().__call__(scope, receive, send)
        finally:
            await self.disconnect(SERVER_ERROR)
            turns.caller.reset(key)

    async def join(self, *groups: str) -> None:
        """Join `groups` for as long as the socket is open (renewed, and the
        session looked at again, every GROUP_READD_SECONDS; left at `leave`)."""
        if self.memberships is None:
            self.memberships = Memberships(self.channel_layer, self.channel_name, on_renewal=self.recheck_session)
        await self.memberships.join(*groups)

    async def recheck_session(self) -> bool:
        """Close the socket (4401) once its session no longer signs its member
        in: it expired, was deleted, or what it rests on changed behind the
        signals' back (web.sockets.recheck_live_sockets hears the rest at once).
        Returns whether it still does."""
        key = getattr(self.scope.get("session"), "session_key", None)
        if key is not None and await db_call(signed_in_user_id)(key) != self.scope["user"].pk:
            await self.close(code=SIGNED_OUT)
            return False
        return True

    async def follow_session(self, member) -> bool:
        """Follow the member's and the session's groups, and start the
        heartbeat: a frame at least every LIVE_HEARTBEAT_SECONDS, so a page
        whose connection went away without a close (a network gone, a NAT
        that forgot it) finds out from the silence and reconnects. Returns
        whether the session still signs the member in, read again once the
        groups are joined: a sign-out or a new password told to them between
        the handshake's read and the joins reached no one, and the socket
        went on for up to GROUP_READD_SECONDS."""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        await self.join(member_group(member), *([session_group(key)] if key else []))
        if not await self.recheck_session():
            return False
        if self.heart is None:
            self.heart = asyncio.get_running_loop().create_task(self._beat())
        return True

    async def _beat(self) -> None:
        frame = json.dumps({"type": "heartbeat"})
        while True:
            await asyncio.sleep(settings.LIVE_HEARTBEAT_SECONDS)
            try:
                await self.send(text_data=frame)
            except Exception:  # noqa: BLE001 - the socket is going: its disconnect stops this
                return

    async def refused(self, member) -> bool:
        """Count the handshake against `member`'s budget and take one of
        their places (if signed in), or against the client address's, as an
        anonymous request is (signed out); past either, refuse it (the page
        backs off before it retries)."""
        if member is None:
            if not await db_call(address_wait)(scope_address(self.scope)):
                return False
            await self.close()
            return True
        if not await db_call(member_request_wait)(member) and holding.hold(member.pk):
            self.holder = member.pk
            return False
        await self.close()
        return True

    async def session_ended(self, event) -> None:
        await self.close(code=SIGNED_OUT)

    async def session_changed(self, event) -> None:
        """The member's password or active flag changed (web.sockets): the
        page reconnects, and its handshake finds whether its session still
        stands."""
        await self.close(code=SERVER_ERROR)

    async def leave(self) -> None:
        """Leave the socket's groups, give back its place, stop its heartbeat."""
        if self.heart is not None:
            await stop_task(self.heart)
            self.heart = None
        if self.holder is not None:
            holding.release(self.holder)
            self.holder = None
        if self.memberships is not None:
            await self.memberships.leave()


def _after_param(scope) -> int | None:
    for pair in scope.get("query_string", b"").decode("latin-1").split("&"):
        name, _, value = pair.partition("=")
        if name == "after":
            return digits(value)
    return 0


class ConversationConsumer(SessionSocket, AsyncWebsocketConsumer):
    stream = None  # set once it has caught up; a consumer that ended before that has none

    async def connect(self):
        self.conversation_id = self.scope["url_route"]["kwargs"]["conversation"]
        self.position = _after_param(self.scope)
        self.caught_up = False
        if self.position is None:
            await self.close()  # a malformed request: the handshake is refused
            return
        member, conversation = await db_call(self._authorize)()
        if await self.refused(member):
            return
        # Accepted before saying no, so the page sees why (a refused
        # handshake looks like a network failure) and stops reconnecting.
        await self.accept()
        if member is None:
            await self.close(code=SIGNED_OUT)
            return
        if conversation is None:
            await self.lose_access()
            return
        self.member_pk = member.pk
        if not await self.follow_session(member):
            return
        if await self._catch_up(conversation):
            # Caught up alone, it shares the conversation's stream from now on.
            self.stream = streams.join(self, conversation)

    def _authorize(self):
        member = member_of(self.scope.get("user"))
        return member, readable_conversation(member, self.conversation_id)

    async def _catch_up(self, conversation) -> bool:
        """Replay what the page missed with reads of its own, so a page far
        behind never holds back the stream the others share."""
        for _ in range(BACKFILL_BATCHES):
            result = await next_pass(conversation.pk, {self.member_pk}, self.position)
            if self.member_pk not in result.readers:
                await self.lose_access()
                return False
            await self.deliver(result.frames, caught_up=False)
            if not result.full:
                return True
        await self.send(text_data=json.dumps({"type": "resync"}))
        await self.close(code=RESYNC)
        return False

    # --- called by the conversation's stream (web.streams) ---

    async def deliver(self, frames: list[tuple[int, str]], caught_up: bool) -> None:
        for position, text in frames:
            await self.send(text_data=text)
            self.position = position
        if caught_up and not self.caught_up:
            self.caught_up = True
            await self.send(text_data=json.dumps({"type": "live", "position": self.position}))

    async def tell(self, text: str) -> None:
        """A frame that is no message (web.streams.WITHHELD_FRAME)."""
        await self.send(text_data=text)

    async def lose_access(self) -> None:
        await self.send(text_data=json.dumps({"type": "access.lost"}))
        await self.close(code=ACCESS_LOST)

    async def fail(self) -> None:
        await self.close(code=SERVER_ERROR)

    async def disconnect(self, code):
        if self.stream is not None:
            self.stream.leave(self)
        await self.leave()


class InboxConsumer(SessionSocket, AsyncJsonWebsocketConsumer):
    """The signed-in member's pending-item count, sent on connect and again
    whenever their inbox changes (an item admitted or acknowledged)."""

    async def connect(self):
        member = await db_call(lambda: member_of(self.scope.get("user")))()
        if await self.refused(member):
            return
        await self.accept()
        if member is None:
            await self.close(code=SIGNED_OUT)
            return
        self.member_pk = member.pk
        await self.join(inbox_group(member))
        if await self.follow_session(member):
            await self._send_count()

    async def _send_count(self):
        count = await inbox_counts.pending(self.member_pk)  # shared with the member's other sockets
        if count is None:
            await self.close(code=SIGNED_OUT)
            return
        await self.send_json({"type": "inbox", "pending": count})

    async def inbox_available(self, event):
        await self._send_count()

    async def inbox_acknowledged(self, event):
        await self._send_count()

    async def disconnect(self, code):
        await self.leave()

