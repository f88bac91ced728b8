"""The durable inbox: reading pages, acknowledging deliveries, reading one
item by event id (SPEC §7). Reads never acknowledge anything."""
from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, Subquery

from controlplane.access import space_received_by_row_member
from controlplane.clock import now
from controlplane.db import Compiled, ids_in, model_columns, model_from_row
from controlplane.errors import AuthorityRevoked, InvalidEventId, UnknownDelivery, UnknownEvent
from controlplane.log import log_head
from controlplane.models import Member
from controlplane.tokens import b64url
from inbox import mailbox
from inbox.models import InboxItem, Mailbox, MailboxShare

PAGE_ITEMS = 50
PAGE_BYTES = 2 * 1024 * 1024
TOKEN_RE = re.compile(r"dlv_[A-Za-z0-9_-]{43}")
EVENT_ID_RE = re.compile(r"evt_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class InboxPage:
    items: list[InboxItem]
    # (upper insertion bound, last position, last id) to continue from, or None
    next: tuple[int, int, int] | None


def _pending_in_order(member: Member, bound: int | None, after: tuple[int, int], *, receivable_only: bool = False):
    """`member`'s pending admitted items after `after` (position, id), in
    insertion order, up to the insertion bound; with `receivable_only`, only
    those of spaces that still deliver to the member (`receives_from`: an
    item stays in the inbox of a member who left or was removed from its
    space, open ones included, but is no longer pushed)."""
    position, last_id = after
    rows = InboxItem.objects.filter(member=member, admission=InboxItem.Admission.ADMITTED,
                                    state=InboxItem.State.PENDING, position__gte=position)
    if bound is not None:
        rows = rows.filter(position__lte=bound)
    if receivable_only:
        rows = rows.filter(space_received_by_row_member("conversation__space"))
    # `position__gte` repeats what the OR implies so the index seeks to the
    # cursor instead of scanning every earlier item.
    return (rows.filter(Q(position__gt=position) | Q(position=position, id__gt=last_id))
            .filter(~held_back()).order_by("position", "id"))


def held_back() -> Q:
    """Whether an item waits behind an earlier item of its conversation that
    a revocation barrier withholds, or that the firewall has yet to judge:
    until that one is settled, no read path hands out the later ones (SPEC
    §5, §7: order within a conversation; almost always: none). An admitted
    item follows an unjudged one only if its send raced the clearing of its
    member's firewall flag (firewall.refresh_firewall_flag)."""
    def earlier(admission: str) -> Exists:
        return Exists(InboxItem.objects.filter(member_id=OuterRef("member_id"), admission=admission,
                                               state=InboxItem.State.PENDING, conversation=OuterRef("conversation"),
                                               position__lt=OuterRef("position")))
    return Q(earlier(InboxItem.Admission.WITHHELD)) | Q(earlier(InboxItem.Admission.UNCLASSIFIED))


def deliverable(member):
    """`member`'s (a pk, or an OuterRef to one) pending items that may be
    delivered to them now, in the order `read_inbox` shows them: admitted,
    not held back, of no space or of one that still delivers to them."""
    return _pending_in_order(member, None, (0, 0), receivable_only=True)


def oldest_pending(member_ids: Iterable[int]) -> dict[int, InboxItem]:
    """For each of `member_ids` with a pending item they may still receive
    (SPEC §3: removal from a space stops all delivery from it), the item
    `read_inbox` would show them first of those (what a push subscription
    of their inbox offers next): two statements however many members. (As one, `id IN (the
    firsts)`, the planner may hash the whole inbox table to find them.)"""
    with connection.cursor() as cursor:
        cursor.execute(*_FIRSTS.sql(sorted(set(member_ids))))
        firsts = [pk for pk, in cursor.fetchall() if pk is not None]
        if not firsts:
            return {}
        table = connection.ops.quote_name(InboxItem._meta.db_table)
        which, params = ids_in("i.id", firsts)
        cursor.execute(f"SELECT {model_columns(InboxItem, 'i')} FROM {table} i WHERE {which}", params)
        items = [model_from_row(InboxItem, row) for row in cursor.fetchall()]
    return {item.member_id: item for item in items}


def read_inbox(member: Member, *, bound: int | None = None, after: tuple[int, int] = (0, 0),
               limit: int = PAGE_ITEMS) -> InboxPage:
    """One page of `member`'s pending items in insertion order: at most
    `limit` (up to PAGE_ITEMS) items and PAGE_BYTES of content (at least one item).

    The first page fixes the upper insertion bound (the log head, which
    every committed item is at or below); continuations keep it, so items
    arriving during a traversal belong to the next read. Acknowledged items
    simply drop out of later pages."""
    if bound is None:
        bound = log_head().position
    with connection.cursor() as cursor:
        cursor.execute(*_PAGE.sql(member.pk, bound, *after))
        rows = [model_from_row(InboxItem, row) for row in cursor.fetchall()]
    page, size = [], 0
    for row in rows[:min(limit, PAGE_ITEMS)]:
        if page and size + row.content_bytes > PAGE_BYTES:
            break
        page.append(row)
        size += row.content_bytes
    more = len(rows) > len(page)
    return InboxPage(page, (bound, page[-1].position, page[-1].id) if more else None)


# The two reads above, compiled once (controlplane.db.Compiled): building
# the held-item rule's query cost several times running it.
_FIRSTS = Compiled(lambda members: Member.objects.filter(pk__in=members).annotate(
    first=Subquery(deliverable(OuterRef("pk")).values("pk")[:1])).values_list("first", flat=True))
_PAGE = Compiled(lambda member, bound, position, last_id: _pending_in_order(member, bound, (position, last_id))
                 .values_list(*(field.attname for field in InboxItem._meta.concrete_fields))[: PAGE_ITEMS + 1])


def pending_count(member: Member) -> int:
    """How many items `member` has pending: those `read_inbox` hands out
    (admitted and unacknowledged, none held back behind an earlier item of
    its conversation). The held-back rule costs a look per item, so it
    runs only when something it looks for is there (almost never)."""
    pending = InboxItem.objects.filter(member=member, state=InboxItem.State.PENDING)
    admitted = pending.filter(admission=InboxItem.Admission.ADMITTED)
    if pending.filter(admission__in=(InboxItem.Admission.WITHHELD, InboxItem.Admission.UNCLASSIFIED)).exists():
        admitted = admitted.filter(~held_back())
    return admitted.count()


def acknowledge_delivery(member: Member, token: str, *, actor: Member) -> None:
    """Acknowledge the item bound to `token`. Idempotent; the row stays as a
    tombstone keeping the token's binding. Unknown or foreign tokens are
    404 UNKNOWN_DELIVERY. Only the inbox's owner acknowledges, so the item's
    member and `acknowledged_at` record who and when (no audit row on the
    hottest write).

    A token whose item a revocation barrier withdrew (or is withdrawing) is
    known, so the answer is `{}` as for any token already settled, and
    nothing changes (the item is not handed off; its `rejected` notice says
    why). Held and unclassified items' tokens were never given out, and
    stay unknown (one the barrier withdrew before its classification
    answers `{}` too: a token cannot be guessed)."""
    if actor.pk != member.pk:
        raise UnknownDelivery()
    acknowledge = _acknowledge_in_one_statement if connection.vendor == "postgresql" else _acknowledge_with_orm
    if not acknowledge(member, token) and not InboxItem.objects.filter(
            member=member, token=token, admission=InboxItem.Admission.WITHHELD).exists():
        raise UnknownDelivery()


def _acknowledge_with_orm(member: Member, token: str) -> bool:
    """Whether `token` names an admitted item of `member` (acknowledged now,
    if it was pending)."""
    with transaction.atomic():
        item = (InboxItem.objects.select_for_update(no_key=True)
                .filter(member=member, token=token, admission=InboxItem.Admission.ADMITTED).first())
        if item is None:
            return False
        item.member = member  # announced by member: no query for it
        settle_acknowledged([item])
    return True


# Which items a settling statement takes (`_settle_sql`), which mailbox it
# locks before them, and which admissions it settles: an owner's one token
# (its own mailbox; an admitted item), or the items a batch of push
# receivers answered with a 2xx (none: the record has `mailbox.lock`ed every
# owner's already; a withheld one too, see `acknowledge_items`).
BY_TOKEN = ("member_id = %(member)s AND token = %(token)s", "member_id = %(member)s", "admission = %(admitted)s")
BY_IDS = ("id = ANY(%(ids)s)", "false", "admission IN (%(admitted)s, %(withheld)s)")


@functools.cache
def _settle_sql(which: tuple[str, str, str]) -> str:
    """`settle_acknowledged` for the items `which` names, as one
    PostgreSQL statement. It returns how many items it found, and the
    members whose items it settled (to announce to) as (id, public id)."""
    items, boxes, admissions = which
    item, box, share, member = (connection.ops.quote_name(model._meta.db_table)
                                for model in (InboxItem, Mailbox, MailboxShare, Member))
    return (
        # The mailbox first, then the item rows, then the mailbox's counts:
        # the system's lock order (mailbox.lock). A push worker's record
        # holds the mailbox and then takes the items; taking the item first
        # deadlocked against it. The subquery on `locked` is uncorrelated,
        # so it runs once, before the item scan.
        f"WITH locked AS MATERIALIZED (SELECT 1 FROM {box} WHERE {boxes} FOR NO KEY UPDATE), "
        f"item AS (SELECT id, member_id, sender_id, content_bytes, state FROM {item} "
        f"  WHERE {items} AND {admissions} AND (SELECT count(*) FROM locked) >= 0 "
        f"  ORDER BY id FOR NO KEY UPDATE), "
        f"settled AS (UPDATE {item} i SET state = %(acknowledged)s, acknowledged_at = %(at)s, "
        f"  admission = %(admitted)s FROM item "
        f"  WHERE i.id = item.id AND item.state = %(pending)s "
        f"  RETURNING item.member_id, item.sender_id, item.content_bytes), "
        # (A data-modifying WITH runs to completion whether or not it is read.)
        # Summed first: an UPDATE … FROM applies one source row per target row.
        f"debited AS (UPDATE {box} b SET pending_bytes = b.pending_bytes - s.n "
        f"  FROM (SELECT member_id, SUM(content_bytes) AS n FROM settled GROUP BY member_id) s "
        f"  WHERE b.member_id = s.member_id), "
        f"shared AS (UPDATE {share} m SET pending_bytes = m.pending_bytes - s.n "
        f"  FROM (SELECT member_id, sender_id, SUM(content_bytes) AS n FROM settled GROUP BY member_id, sender_id) s "
        f"  WHERE m.member_id = s.member_id AND m.sender_id = s.sender_id) "
        f"SELECT (SELECT count(*) FROM item), "
        f"  ARRAY(SELECT ARRAY[id::text, public_id] FROM {member} WHERE id IN (SELECT member_id FROM settled))")


def _settle_in_one_statement(which: tuple[str, str, str], params: dict) -> tuple[int, list[Member]]:
    """How many items the statement found, and the members whose items it
    settled (announced to)."""
    params = {**params, "admitted": InboxItem.Admission.ADMITTED, "withheld": InboxItem.Admission.WITHHELD,
              "acknowledged": InboxItem.State.ACKNOWLEDGED, "pending": InboxItem.State.PENDING, "at": now()}
    with connection.cursor() as cursor:
        cursor.execute(_settle_sql(which), params)
        found, settled = cursor.fetchone()
    members = [Member(pk=int(pk), public_id=public_id) for pk, public_id in settled]
    mailbox.announce_acknowledged(members)
    return found, members


def _acknowledge_in_one_statement(member: Member, token: str) -> bool:
    """`_acknowledge_with_orm` as one PostgreSQL statement, atomic on its
    own: an acknowledgement is a hot write, and this is one round trip
    instead of six, with no query to compile."""
    found, _ = _settle_in_one_statement(BY_TOKEN, {"member": member.pk, "token": token})
    return found > 0


def acknowledge_items(item_ids: list[int]) -> None:
    """What a batch of push receivers' 2xx does: acknowledge those of these
    items that are still pending, in the caller's transaction, which has
    `mailbox.lock`ed their owners' mailboxes (the lock order: the debits
    touch several members' rows). One statement on PostgreSQL.

    An item a revocation barrier withheld while its push was on its way is
    acknowledged too, and admitted again: it was received with a 2xx, so
    it was handed off and stays delivered (SPEC §5), as the barrier itself
    keeps a copy handed off before it. (Pushes only ever start with
    admitted items: `webhooks.engine._item_ready`.)"""
    if not item_ids:
        return
    if connection.vendor == "postgresql":
        _acknowledge_items_in_one_statement(item_ids)
    else:
        _acknowledge_items_with_orm(item_ids)


def _acknowledge_items_with_orm(item_ids: list[int]) -> None:
    settle_acknowledged(list(InboxItem.objects.select_for_update(no_key=True).select_related("member")
                             .filter(pk__in=item_ids, admission__in=[InboxItem.Admission.ADMITTED,
                                                                     InboxItem.Admission.WITHHELD]).order_by("pk")))


def _acknowledge_items_in_one_statement(item_ids: list[int]) -> None:
    _settle_in_one_statement(BY_IDS, {"ids": list(item_ids)})


def settle_acknowledged(items: list[InboxItem]) -> list[InboxItem]:
    """Acknowledge the pending ones of `items`, locked by the caller (an
    owner's own acknowledgement, or push receivers' 2xx): the tombstone
    state, the mailboxes' bytes, the live counts, in a few statements
    however many. Returns those that were still pending."""
    settled = [item for item in items if item.state == InboxItem.State.PENDING]
    if not settled:
        return []
    at = now()
    InboxItem.objects.filter(pk__in=[item.pk for item in settled]).update(
        state=InboxItem.State.ACKNOWLEDGED, acknowledged_at=at, admission=InboxItem.Admission.ADMITTED)
    for item in settled:
        item.state, item.acknowledged_at = InboxItem.State.ACKNOWLEDGED, at
        item.admission = InboxItem.Admission.ADMITTED
    mailbox.debit_many([(item.member_id, item.sender_id, item.content_bytes) for item in settled])
    mailbox.announce_acknowledged({item.member_id: item.member for item in settled}.values())
    return settled


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
    tombstone a revocation barrier left of it. No side effects. While the
    barrier runs, before its tombstone, the item is 403 AUTHORITY_REVOKED:
    its token may have been read before the fence, and "unknown" told its
    reader it never was. One the firewall holds or has yet to judge is
    unknown: no read path hands it out."""
    item = InboxItem.objects.filter(member=member, token=token_for_event_id(event_id)).first()
    if item is None or item.admission in (InboxItem.Admission.HELD, InboxItem.Admission.UNCLASSIFIED):
        raise UnknownEvent()
    if item.admission == InboxItem.Admission.WITHHELD and item.state != InboxItem.State.REJECTED:
        raise AuthorityRevoked("The authority this item was sent under was revoked or expired; "
                               "it is being withdrawn.")
    return item
