"""What the inbox's read routes answer, as JSON-ready dicts: the page of
`read_inbox`, one item by event id (`read_event`), and a page of the
coordination snapshot. The REST views and the MCP tools both answer with
these, so the two surfaces cannot drift apart."""
from __future__ import annotations

import datetime as dt
import secrets

from django.db.models import Exists, OuterRef, Q

from controlplane.clock import now, rfc3339
from controlplane.cursors import caller_id, pack_cursor, unpack_cursor
from controlplane.errors import InvalidRequest, NotFound, ResyncRequired
from controlplane.log import log_head
from controlplane.models import Member
from inbox import authority, collectives, delivery, feeds
from inbox.models import InboxItem, Message, Recipient
from inbox.render import render_answer, render_entry, render_message, withheld_bodies

INBOX_STREAM = "read_inbox"
HELD_STREAM = "held_items"
SNAPSHOT_TTL_SECONDS = 3600


def pending_items(member: Member, cursor: str | None,
                  limit: int = delivery.PAGE_ITEMS) -> tuple[list[InboxItem], str | None]:
    """One page of pending items (`delivery.read_inbox`) and the cursor of the next, if any."""
    caller = caller_id(member)
    bound, after = None, (0, 0)
    if cursor:
        bound, *after = unpack_cursor(cursor, count=3, caller=caller, stream=INBOX_STREAM)
    page = delivery.read_inbox(member, bound=bound, after=tuple(after), limit=limit)
    return page.items, pack_cursor(page.next, caller=caller, stream=INBOX_STREAM) if page.next else None


def inbox_page(member: Member, cursor: str | None, limit: int = delivery.PAGE_ITEMS) -> dict:
    """`{"items": [...], "nextCursor"}`: one page of pending items."""
    items, next_cursor = pending_items(member, cursor, limit)
    return {"items": [render_entry(item) for item in items], "nextCursor": next_cursor}


def held_after(member: Member, position: int, last_id: int, limit: int | None = None):
    """The query of `member`'s held items after (position, id), oldest
    first: a page of `limit` (default delivery.PAGE_ITEMS) and one more
    (the `inboxitem_held` index serves it).
    An item whose authority lapsed is left out: a barrier withholds only
    admitted items, and rejects held ones when it settles."""
    lapsed = Recipient.objects.filter(message=OuterRef("message"), member=OuterRef("member")).filter(
        authority.inactive())
    return (InboxItem.objects.filter(member=member, admission=InboxItem.Admission.HELD,
                                     state=InboxItem.State.PENDING, position__gte=position)
            .filter(Q(position__gt=position) | Q(position=position, id__gt=last_id))
            .filter(~Exists(lapsed)).order_by("position", "id")[: (limit or delivery.PAGE_ITEMS) + 1])


def held_items(member: Member, cursor: str | None, limit: int | None = None) -> tuple[list[InboxItem], str | None]:
    """One page of the items `member`'s firewall holds, oldest first, and the
    cursor of the next page, if any."""
    caller = caller_id(member)
    position, last_id = unpack_cursor(cursor, count=2, caller=caller, stream=HELD_STREAM) if cursor else (0, 0)
    rows = list(held_after(member, position, last_id, limit))
    page = rows[: limit or delivery.PAGE_ITEMS]
    more = len(rows) > len(page)
    return page, pack_cursor((page[-1].position, page[-1].id), caller=caller, stream=HELD_STREAM) if more else None


def held_page(member: Member, cursor: str | None, limit: int | None = None) -> dict:
    """`{"items": [...], "nextCursor"}`: one page of held items."""
    items, next_cursor = held_items(member, cursor, limit)
    return {"items": [render_entry(item) for item in items], "nextCursor": next_cursor}


def acknowledge(member: Member, token: str) -> dict:
    """Acknowledge one delivery token of the caller's own inbox → `{}`."""
    if not isinstance(token, str) or not delivery.TOKEN_RE.fullmatch(token):
        raise InvalidRequest("deliveryToken is dlv_ followed by 43 base64url characters.")
    delivery.acknowledge_delivery(member, token, actor=member)
    return {}


def event_item(item: InboxItem) -> dict:
    """`{"item", "guidance"?}` from the retained row; a tombstone says
    `state: "rejected"` and why, and never carries the content again."""
    if item.state == InboxItem.State.REJECTED:
        payload = {k: v for k, v in item.payload.items() if k != "content"}
        return {"item": payload, "state": "rejected", "reason": item.reason}
    return {"item": item.payload, **({"guidance": item.guidance} if item.guidance else {})}


def read_event(member: Member, event_id: str) -> dict:
    return event_item(delivery.read_event(member, event_id))


def snapshot(member: Member, page: str | None) -> dict:
    """One page of the coordination snapshot (SPEC §6): the caller's
    unresolved messages as of one moment, and a feed cursor at its high
    watermark. Every page of a snapshot reads the moment it was taken."""
    caller = caller_id(member)
    head = log_head()
    if page:
        snapshot_id, high_watermark, issued_at, after = unpack_cursor(page, count=4, caller=caller, stream="snapshot")
        if now().timestamp() - issued_at / 1e6 > SNAPSHOT_TTL_SECONDS:
            raise ResyncRequired("The snapshot has expired; take a new one.")
        if high_watermark < head.floor:  # said as a feed's cursor says it
            raise ResyncRequired("The snapshot's position was pruned; take a new one.", details={"floor": head.floor})
    else:
        # Microseconds: every page reads the state at this moment.
        snapshot_id, high_watermark, issued_at, after = (secrets.randbits(62), head.position,
                                                         int(now().timestamp() * 1e6), 0)
    as_of = dt.datetime.fromtimestamp(issued_at / 1e6, dt.timezone.utc)
    rows, has_more = feeds.unresolved_page(member, high_watermark=high_watermark, as_of=as_of, after=after)
    states = [feeds.state_as_of(r, as_of) for r in rows]
    withheld = withheld_bodies((r.message.public_id, r.message.space.send_policy) for r in rows)
    next_page = None
    if has_more:
        next_page = pack_cursor((snapshot_id, high_watermark, issued_at, rows[-1].position), caller=caller,
                                stream="snapshot")
    return {
        "snapshot_id": f"snp_{snapshot_id:016x}",
        "high_watermark": high_watermark,
        "unresolved": [{"message": render_message(r.message, withheld=r.message.public_id in withheld),
                        "state": state, "acknowledged_at": rfc3339(acknowledged_at)}
                       for r, (state, acknowledged_at) in zip(rows, states)],
        "next_page": next_page,
        "cursor": pack_cursor((high_watermark,), caller=caller, stream="inbox"),
    }


def answer(member: Member, message_id: str, body: str, idempotency_key: str | None = None) -> tuple[dict, bool]:
    """(`{"answer": …}`, created): `member`'s answer to a collective request
    they can see (404 otherwise)."""
    message = Message.objects.visible_to(member).filter(public_id=message_id).first()
    if message is None:
        raise NotFound()
    given, created = collectives.answer(message, body, actor=member, idempotency_key=idempotency_key)
    return {"answer": render_answer(given)}, created


def answers(member: Member, message_id: str) -> dict:
    """`{"ended", "answers"}` of a completed collective request `member`
    can see and is owed the outcome of (404 otherwise if they cannot see it)."""
    message = Message.objects.visible_to(member).filter(public_id=message_id).first()
    if message is None:
        raise NotFound()
    return collectives.answers_for(message, member)
