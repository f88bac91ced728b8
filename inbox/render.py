"""JSON shapes of messages and events, as the contract gives them."""
from __future__ import annotations

from controlplane.clock import rfc3339
from controlplane.models import Event
from inbox.models import Message, Recipient


def render_message(message: Message) -> dict:
    return {
        "id": message.public_id,
        "conversation": message.conversation.public_id,
        "space": message.space.slug,
        "author": f"@{message.author.handle}",
        "body": message.body,
        "reply_to": message.reply_to.public_id if message.reply_to_id else None,
        "related_paths": message.related_paths,
        "mentions": [f"@{h}" for h in message.mentions],
        "created_at": rfc3339(message.created_at),
        "position": message.position,
    }


def render_message_status(message: Message) -> dict:
    """Metadata and handling status; the body is read through its own route."""
    data = render_message(message)
    del data["body"]
    data["body_bytes"] = message.body_bytes
    recipients = Recipient.objects.filter(message=message).select_related("member").order_by("id")
    data["recipients"] = [
        {"member": f"@{r.member.handle}", "state": r.state, "acknowledged_at": rfc3339(r.acknowledged_at),
         "resolved_at": rfc3339(r.resolved_at), "result": r.result}
        for r in recipients
    ]
    return data


def render_event(event: Event) -> dict:
    return {
        "id": event.public_id,
        "position": event.position,
        "kind": event.kind,
        "space": event.space.slug if event.space_id else None,
        "conversation": event.conversation.public_id if event.conversation_id else None,
        "actor": f"@{event.actor.handle}" if event.actor_id else None,
        "created_at": rfc3339(event.created_at),
        "data": event.data,
    }
