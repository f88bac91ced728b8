"""Live pages over WebSockets.

A conversation socket streams the conversation's messages after the
position the page last saw: the page's newest message on connect, its last
received frame on reconnect. Each pass re-reads from the database, after
checking access again, so frames are never duplicated or skipped, and a
member who loses access gets a 4403 close at the next event (a removal is
itself an event of the space). The log watcher nudges a pass when this
process hears of a commit in the conversation or its space; a pass also
runs every FEED_RECHECK_SECONDS in case a nudge was lost.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.live import log_watcher
from controlplane.models import Member
from inbox.delivery import pending_count
from inbox.writes import inbox_group
from web import messages
from web.access import member_of, readable_conversation

logger = logging.getLogger("switchboard.web")

ACCESS_LOST = 4403  # an application close code: do not reconnect
SERVER_ERROR = 1011  # the page reconnects and resumes from its last frame


def _after_param(scope) -> int | None:
    for pair in scope.get("query_string", b"").decode("latin-1").split("&"):
        name, _, value = pair.partition("=")
        if name == "after":
            return int(value) if value.isdigit() and len(value) < 19 else None
    return 0


class ConversationConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.conversation_id = self.scope["url_route"]["kwargs"]["conversation"]
        self.position = _after_param(self.scope)
        self.interest = self.pump_task = None
        found = None if self.position is None else await database_sync_to_async(self._authorize)()
        if found is None:
            await self.close(code=ACCESS_LOST)  # before accepting: the handshake is refused
            return
        self.member_pk, conversation = found
        self.interest = log_watcher.watch(conversations={conversation.pk}, spaces={conversation.space_id})
        await self.accept()
        self.pump_task = asyncio.create_task(self._pump())

    def _authorize(self):
        member = member_of(self.scope.get("user"))
        conversation = readable_conversation(member, self.conversation_id)
        return None if conversation is None else (member.pk, conversation)

    def _read(self) -> list[dict] | None:
        """Access, checked again, then the next frames; None when access is gone."""
        member = Member.objects.filter(pk=self.member_pk).first()
        conversation = readable_conversation(member, self.conversation_id)
        if conversation is None:
            return None
        return messages.render_rows(conversation, messages.after(conversation, self.position))

    async def _pump(self):
        try:
            await self._stream()
        except Exception:
            logger.exception("live stream of %s failed", self.conversation_id)
            await self.close(code=SERVER_ERROR)

    async def _stream(self):
        caught_up = False
        while True:
            self.interest.event.clear()  # before reading: a commit during the read wakes the next pass
            rows = await database_sync_to_async(self._read)()
            if rows is None:
                await self.send_json({"type": "access.lost"})
                await self.close(code=ACCESS_LOST)
                return
            for row in rows:
                await self.send_json({"type": "message", **row})
                self.position = row["position"]
            if len(rows) == messages.LIVE_BATCH:
                continue
            if not caught_up:
                caught_up = True
                await self.send_json({"type": "live", "position": self.position})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.interest.event.wait(), settings.FEED_RECHECK_SECONDS)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        pass  # the stream is one-way; the composer posts over HTTP

    async def disconnect(self, code):
        if self.pump_task is not None:
            self.pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.pump_task
        if self.interest is not None:
            log_watcher.unwatch(self.interest)


class InboxConsumer(AsyncJsonWebsocketConsumer):
    """The signed-in member's pending-item count, sent on connect and again
    whenever their inbox changes (an item admitted or acknowledged)."""

    async def connect(self):
        self.group = None
        member = await database_sync_to_async(lambda: member_of(self.scope.get("user")))()
        if member is None:
            await self.close(code=ACCESS_LOST)
            return
        self.member_pk, self.group = member.pk, inbox_group(member)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self._send_count()

    def _count(self) -> int | None:
        member = Member.objects.filter(pk=self.member_pk).first()
        if member is None or not member.is_active:
            return None
        return pending_count(member)

    async def _send_count(self):
        count = await database_sync_to_async(self._count)()
        if count is None:
            await self.close(code=ACCESS_LOST)
            return
        await self.send_json({"type": "inbox", "pending": count})

    async def inbox_available(self, event):
        await self._send_count()

    async def inbox_acknowledged(self, event):
        await self._send_count()

    async def disconnect(self, code):
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

