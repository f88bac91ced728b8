"""Conversation history as the web app shows it: pages of messages by
position, rendered to HTML once, for the page, the history pager, the
composer's answer and the live socket alike."""
from __future__ import annotations

from django.template.loader import render_to_string

from controlplane.models import Conversation
from inbox.models import Message
from inbox.render import withheld_bodies

HISTORY_PAGE = 50
LIVE_BATCH = 100


def _messages(conversation: Conversation):
    return Message.objects.filter(conversation=conversation).select_related("author")


def before(conversation: Conversation, position: int | None, limit: int = HISTORY_PAGE) -> tuple[list[Message], bool]:
    """The `limit` messages before `position` (the newest without one), oldest
    first, and whether older ones remain."""
    rows = _messages(conversation)
    if position is not None:
        rows = rows.filter(position__lt=position)
    rows = list(rows.order_by("-position")[: limit + 1])
    return rows[:limit][::-1], len(rows) > limit


def after(conversation: Conversation, position: int, limit: int | None = None) -> list[Message]:
    """Messages after `position`, oldest first. Positions are assigned in
    commit order, so a reader that has seen `position` never misses a later
    commit below it: reading on from the last one seen leaves no gap."""
    return list(_messages(conversation).filter(position__gt=position).order_by("position")[:limit or LIVE_BATCH])


def render_rows(conversation: Conversation, messages: list[Message]) -> list[dict]:
    """Each message as {position, id, html}. A message whose authority was
    revoked keeps its place without its body, as in the feeds."""
    withheld = withheld_bodies((m.public_id, conversation.space) for m in messages)
    return [{"position": m.position, "id": m.public_id,
             "html": render_to_string("web/_message.html", {"m": m, "withheld": m.public_id in withheld})}
            for m in messages]
