"""JSON shapes of messages and events, as the contract gives them."""
from __future__ import annotations

import json
from collections.abc import Iterable

from controlplane.clock import rfc3339
from controlplane.models import Event, Space
from inbox import authority
from inbox.models import InboxItem, Message, Recipient


def may_withhold(send_policy: str | None) -> bool:
    """Whether a message of a space with `send_policy` (None: not known) may
    have its body withheld: only explicit_only spaces have grants, and an
    explicit_only space stays one (Space.clean)."""
    return send_policy is None or send_policy == Space.SendPolicy.EXPLICIT_ONLY


def withheld_bodies(messages: Iterable[tuple[str, str | None]]) -> set[str]:
    """Of these (message id, its space's send policy) pairs, the messages
    whose bodies are withheld because their authority is no longer active
    (SPEC §5). Only explicit_only spaces have grants, so only their messages
    (and those whose space the caller does not know) are looked up."""
    ids = {message_id for message_id, send_policy in messages if may_withhold(send_policy)}
    if not ids:
        return set()
    return set(Recipient.objects.filter(message__public_id__in=ids).filter(authority.inactive())
               .values_list("message__public_id", flat=True))


def withheld_positions(conversation_id: int, send_policy: str | None, start: int, limit: int) -> list[int]:
    """The positions, newest first, of up to `limit` messages of a
    conversation (of a space with `send_policy`) at or after `start` whose
    bodies are withheld, as `withheld_bodies` finds them."""
    if not may_withhold(send_policy):
        return []
    return list(Recipient.objects.filter(message__conversation_id=conversation_id, message__position__gte=start)
                .filter(authority.inactive()).order_by("-message__position")
                .values_list("message__position", flat=True).distinct()[:limit])


def _withhold(rendered: dict) -> dict:
    return {**rendered, "body": None, "body_withheld": "AUTHORITY_REVOKED"}


def render_message(message: Message, *, withheld: bool = False) -> dict:
    rendered = {
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
    return _withhold(rendered) if withheld else rendered


def render_sent(message: Message, created: bool) -> dict:
    """A send's answer: the message it made, or for a retry the original as
    the feeds show it now: a retry must not give back a body its authority
    no longer covers (SPEC §5: revoked authority never restores body access)."""
    withheld = not created and message.public_id in withheld_bodies([(message.public_id, message.space.send_policy)])
    return render_message(message, withheld=withheld)


def render_message_status(message: Message) -> dict:
    """Metadata and handling status; the body is read through its own route."""
    data = render_message(message)
    del data["body"]
    data["body_bytes"] = message.body_bytes
    recipients = Recipient.objects.filter(message=message).select_related("member").order_by("id")
    data["recipients"] = [
        {"member": f"@{r.member.handle}", "state": r.state, "acknowledged_at": rfc3339(r.acknowledged_at),
         "resolved_at": rfc3339(r.resolved_at), "result": r.result, "rejected_at": rfc3339(r.rejected_at),
         "reason": r.reason}
        for r in recipients
    ]
    return data


def render_events(events: list[Event]) -> list[dict]:
    """Events as the feeds give them: a message whose authority was revoked
    keeps its place and metadata, without its body."""
    withheld = withheld_bodies((e.data["message"]["id"], e.space.send_policy if e.space_id else None) for e in events
                               if e.kind in ("message.created", "message.admitted"))
    return [render_event(e, withheld=withheld) for e in events]


def render_event(event: Event, *, withheld: set[str] = frozenset()) -> dict:
    data = event.data
    if event.kind in ("message.created", "message.admitted") and data["message"]["id"] in withheld:
        data = {**data, "message": _withhold(data["message"])}
    return {
        "id": event.public_id,
        "position": event.position,
        "kind": event.kind,
        "space": event.space.slug if event.space_id else None,
        "conversation": event.conversation.public_id if event.conversation_id else None,
        "actor": f"@{event.actor.handle}" if event.actor_id else None,
        "created_at": rfc3339(event.created_at),
        "data": data,
    }


RULE_FIELDS = ["action", "sender", "space", "conversation_kind", "content_pattern", "min_bytes", "guidance"]


def render_entry(item: InboxItem) -> dict:
    entry = {"deliveryToken": item.token, "item": item.payload, "insertedAt": rfc3339(item.created_at)}
    if item.guidance:
        entry["guidance"] = item.guidance  # local policy beside the item, never inside the peer's content
    return entry


MAX_ITEM_ENVELOPE = 256 * 1024  # SPEC §13: the largest content-bearing MCP event
CURSOR_ROOM = 400  # bytes kept for the cursor a polled or streamed occurrence carries (a push's is null)


def item_occurrence(item: InboxItem, name: str) -> dict:
    """One inbox item as an MCP event occurrence (the `inbox.item` event,
    polled, streamed or pushed): the item itself, with its delivery token and
    guidance, when the whole UTF-8 envelope (the occurrence, with room for
    its cursor) fits in 256 KiB, else a reference to fetch with read_event.
    The event id is the token's `evt_` form."""
    return sized_item_occurrence(item, name)[0]


def sized_item_occurrence(item: InboxItem, name: str) -> tuple[dict, int]:
    """`item_occurrence`, with its size as compact UTF-8 JSON, cursor room
    included (a poll's or stream's batch is bounded by the sum)."""
    occurrence = {"eventId": "evt_" + item.token[4:], "name": name, "timestamp": rfc3339(item.created_at),
                  "data": {"kind": "item", **render_entry(item)}, "cursor": None}
    size = len(json.dumps(occurrence, separators=(",", ":"), ensure_ascii=False).encode()) + CURSOR_ROOM
    if size > MAX_ITEM_ENVELOPE:
        occurrence["data"] = {"kind": "reference", "itemKind": item.kind, "bytes": item.content_bytes,
                              "deliveryToken": item.token}
        size = len(json.dumps(occurrence, separators=(",", ":"), ensure_ascii=False).encode()) + CURSOR_ROOM
    del occurrence["cursor"]
    return occurrence, size


def render_rules(rules) -> dict:
    rendered = [{name: getattr(rule, name) for name in RULE_FIELDS} for rule in rules]
    for rule in rendered:
        rule["sender"] = f"@{rule['sender']}" if rule["sender"] else None
    return {"rules": rendered}


def render_answer(answer) -> dict:
    """A member's answer to a collective request, as shown to that member."""
    return {"message": answer.collective.message.public_id, "member": f"@{answer.member.handle}",
            "body": answer.body, "answered_at": rfc3339(answer.answered_at)}
