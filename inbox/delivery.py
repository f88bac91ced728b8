"""The durable inbox: reading pages, acknowledging deliveries, reading one
item by event id (SPEC §7). Reads never acknowledge anything."""
from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from controlplane.clock import now
from controlplane.errors import InvalidEventId, UnknownDelivery, UnknownEvent
from controlplane.log import log_head
from controlplane.models import Member
from controlplane.tokens import b64url
from inbox import mailbox
from inbox.models import InboxItem

PAGE_ITEMS = 50
PAGE_BYTES = 2 * 1024 * 1024
TOKEN_RE = re.compile(r"dlv_[A-Za-z0-9_-]{43}")
EVENT_ID_RE = re.compile(r"evt_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class InboxPage:
    items: list[InboxItem]
    # (upper insertion bound, last position, last id) to continue from, or None
    next: tuple[int, int, int] | None


def _pending_in_order(member: Member, bound: int | None, after: tuple[int, int]):
    """`member`'s pending admitted items after `after` (position, id), in
    insertion order, up to the insertion bound."""
    position, last_id = after
    # An item a revocation barrier withholds holds back its conversation's
    # later items until the barrier settles it (almost always: none).
    withheld_before = InboxItem.objects.filter(member=member, admission=InboxItem.Admission.WITHHELD,
                                               state=InboxItem.State.PENDING, conversation=OuterRef("conversation"),
                                               position__lt=OuterRef("position"))
    rows = InboxItem.objects.filter(member=member, admission=InboxItem.Admission.ADMITTED,
                                    state=InboxItem.State.PENDING, position__gte=position)
    if bound is not None:
        rows = rows.filter(position__lte=bound)
    # `position__gte` repeats what the OR implies so the index seeks to the
    # cursor instead of scanning every earlier item.
    return (rows.filter(Q(position__gt=position) | Q(position=position, id__gt=last_id))
            .filter(~Exists(withheld_before)).order_by("position", "id"))


def oldest_pending(member: Member) -> InboxItem | None:
    """The item `read_inbox` would show `member` first (what a push
    subscription of their inbox offers next)."""
    return _pending_in_order(member, None, (0, 0)).first()


def read_inbox(member: Member, *, bound: int | None = None, after: tuple[int, int] = (0, 0)) -> InboxPage:
    """One page of `member`'s pending items in insertion order: at most
    PAGE_ITEMS items and PAGE_BYTES of content (at least one item).

    The first page fixes the upper insertion bound (the log head, which
    every committed item is at or below); continuations keep it, so items
    arriving during a traversal belong to the next read. Acknowledged items
    simply drop out of later pages."""
    if bound is None:
        bound = log_head().position
    rows = list(_pending_in_order(member, bound, after)[: PAGE_ITEMS + 1])
    page, size = [], 0
    for row in rows[:PAGE_ITEMS]:
        if page and size + row.content_bytes > PAGE_BYTES:
            break
        page.append(row)
        size += row.content_bytes
    more = len(rows) > len(page)
    return InboxPage(page, (bound, page[-1].position, page[-1].id) if more else None)


def pending_count(member: Member) -> int:
    """How many items `member` has pending (admitted and unacknowledged)."""
    return InboxItem.objects.filter(member=member, admission=InboxItem.Admission.ADMITTED,
                                    state=InboxItem.State.PENDING).count()


def acknowledge_delivery(member: Member, token: str, *, actor: Member) -> None:
    """Acknowledge the item bound to `token`. Idempotent; the row stays as a
    tombstone keeping the token's binding. Unknown or foreign tokens are
    404 UNKNOWN_DELIVERY. Only the inbox's owner acknowledges, so the item's
    member and `acknowledged_at` record who and when (no audit row on the
    hottest write)."""
    if actor.pk != member.pk:
        raise UnknownDelivery()
    with transaction.atomic():
        item = (InboxItem.objects.select_for_update()
                .filter(member=member, token=token, admission=InboxItem.Admission.ADMITTED).first())
        if item is None:
            raise UnknownDelivery()
        settle_acknowledged(item)


def settle_acknowledged(item: InboxItem) -> bool:
    """Acknowledge a pending item locked by the caller (its owner's own
    acknowledgement, or a push receiver's 2xx): the tombstone state, the
    mailbox's bytes, the live count. False if it was no longer pending."""
    if item.state != InboxItem.State.PENDING:
        return False
    item.state, item.acknowledged_at = InboxItem.State.ACKNOWLEDGED, now()
    item.save(update_fields=["state", "acknowledged_at"])
    mailbox.debit(item.member_id, item.content_bytes, sender_id=item.sender_id)
    mailbox.announce_acknowledged(item.member)
    return True


def token_for_event_id(event_id: str) -> str:
    """`evt_…` → `dlv_…`, accepting only canonical base64url of 32 bytes:
    an alias that decodes to the same bytes is 400 INVALID_EVENT_ID."""
    if not isinstance(event_id, str) or not EVENT_ID_RE.fullmatch(event_id):
        raise InvalidEventId()
    encoded = event_id[4:]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=")
    except (binascii.Error, ValueError):
        raise InvalidEventId() from None
    if len(raw) != 32 or b64url(raw) != encoded:
        raise InvalidEventId()
    return "dlv_" + encoded


def read_event(member: Member, event_id: str) -> InboxItem:
    """The retained item for `event_id`, acknowledged or not, or the
    tombstone a revocation barrier left of it. No side effects."""
    item = InboxItem.objects.filter(
        Q(admission=InboxItem.Admission.ADMITTED)
        | Q(state=InboxItem.State.REJECTED, admission=InboxItem.Admission.WITHHELD),
        member=member, token=token_for_event_id(event_id)).first()
    if item is None:
        raise UnknownEvent()
    return item
