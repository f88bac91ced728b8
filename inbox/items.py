"""Classifying a message into inbox items, one per recipient (SPEC §7)."""
from __future__ import annotations

import json

from controlplane.models import Conversation, Member
from inbox.models import InboxItem, Message


def content_bytes(payload: dict) -> int:
    """The stored size of an item's content (compact UTF-8 JSON)."""
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


def message_items(message: Message, recipients: list[Member], *, collective: dict | None = None) -> list[InboxItem]:
    """One unsaved item per recipient, classified by conversation kind:
    `direct`, `group` (with the exact ordered membership) or `mention`; a
    group message that asks for answers is a `collective.request` carrying
    `collective` (its op and deadline)."""
    if not recipients:
        return []
    conversation = message.conversation
    common = {"postId": message.public_id, "conversation": conversation.public_id,
              "sender": f"@{message.author.handle}", "content": message.body}
    if conversation.kind == Conversation.Kind.DIRECT:
        payload = {"kind": "direct", **common}
    elif conversation.kind == Conversation.Kind.GROUP:
        members = [f"@{p.member.handle}" for p in conversation.participants.select_related("member")]
        payload = {"kind": "group", **common, "group": conversation.public_id, "members": members}
        if collective is not None:
            payload = {**payload, "kind": "collective.request", "collective": collective}
    else:
        payload = {"kind": "mention", **common, "space": message.space.slug}
    size = content_bytes(payload)
    return [InboxItem(member=member, kind=payload["kind"], payload=payload, content_bytes=size, message=message,
                      conversation=conversation, sender_id=message.author_id) for member in recipients]
