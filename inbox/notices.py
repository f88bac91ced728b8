"""What other apps ask of the inbox when something happens to its items:
post a notice, withhold the items sent under lapsed authority, and reject
them. Inbox owns these rows; grants (revocation barriers, approvals) and
webhooks (suspension notices) call here and never write them themselves.
All run in the caller's transaction.
"""
from __future__ import annotations

from controlplane.clock import now
from controlplane.log import NewEvent, append_events
from controlplane.models import Member
from inbox import events, mailbox
from inbox.items import content_bytes
from inbox.models import InboxItem, Recipient

# A copy the recipient has already taken over stays delivered.
HANDED_OFF = (Recipient.State.ACKNOWLEDGED, Recipient.State.RESOLVED)


def private_event(kind: str, data: dict, member: Member, **fields) -> NewEvent:
    """The event of a notice that is `member`'s business alone (an approval's
    outcome, their subscription's suspension): in their inbox feed and in
    no space feed, where every reader of the space (anonymous ones, in an
    open space) would see it."""
    return NewEvent(kind, data, restricted=True, addressees=(member.pk,), **fields)


def post_notice(member: Member, payload: dict, event: NewEvent, *, conversation_id: int | None = None,
                position: int | None = None, sender_id: int | None = None,
                admission: str = InboxItem.Admission.ADMITTED) -> InboxItem:
    """Insert a notice from the control plane itself (`approval`,
    `rejected`, `subscription_suspended`, a collective's outcome) into
    `member`'s inbox with its event. A notice is admitted directly (there is
    no peer content for the firewall to judge) unless `admission` says it
    waits for classification (a collective's result, which carries the
    answerers' content), and always fits: it tells of something that already
    happened, so the mailbox limit does not refuse it (a caller whose notice
    carries peer content checks `mailbox.fits` first, and names the
    `sender_id` whose share it counts against). `position` places it in an
    earlier slot (a rejection takes its message's place); by default it goes
    at its event's position."""
    size = content_bytes(payload)
    # the mailbox before the log head, as a send takes them (mailbox.lock)
    mailbox.credit(member.pk, size, sender_id=sender_id)
    (row,) = append_events([event])
    item = InboxItem.objects.create(member=member, kind=payload["kind"], payload=payload, content_bytes=size,
                                    conversation_id=conversation_id, sender_id=sender_id, admission=admission,
                                    position=row.position if position is None else position)
    if admission == InboxItem.Admission.ADMITTED:
        mailbox.announce_available(member)
    return item


def withhold_items_under(authority_id: int) -> int:
    """Withhold from every read path the pending items sent under
    `authority_id` that a reader could see or a firewall could admit.
    Returns how many."""
    return InboxItem.objects.filter(
        grant_id=authority_id, state=InboxItem.State.PENDING,
        admission__in=[InboxItem.Admission.ADMITTED, InboxItem.Admission.UNCLASSIFIED],
    ).update(admission=InboxItem.Admission.WITHHELD)


def reject_items_under(authority_id: int, *, authority_ref: str, reason: str, limit: int) -> bool:
    """Settle up to `limit` pending items sent under `authority_id`, oldest
    first; False once none is left. A copy already handed off stays
    delivered (one the firewall holds is settled as acknowledged: its
    release would be refused); any other becomes `rejected` (a tombstone
    with the reason), its handling row says so, and a `rejected` notice
    takes its place in the inbox, so the conversation's later messages
    follow in order.

    The mailboxes first, then the items (the lock order, mailbox.lock): an
    acknowledgement holds its owner's mailbox and then takes the item, and
    a barrier that held the item while it waited for that mailbox
    deadlocked against it. So the mailboxes of the members whose items come
    first are locked, then those members' items; should they all have been
    settled meanwhile (acknowledged by a reader who read them before they
    were withheld), the caller's next batch, a new transaction, looks again."""
    # Admitted ones are copies already handed off, let through again below:
    # the barrier withheld every other pending item as it started.
    under = (InboxItem.objects.filter(grant_id=authority_id, state=InboxItem.State.PENDING)
             .exclude(admission=InboxItem.Admission.ADMITTED).order_by("position", "id"))
    members = set(under.values_list("member_id", flat=True)[:limit])
    if not members:
        return False
    mailbox.lock(members)  # also before the first notice takes the log head
    items = list(under.select_for_update(of=("self",), no_key=True)
                 .select_related("message__author", "conversation", "member")
                 .filter(member_id__in=members)[:limit])
    handling = {(r.message_id, r.member_id): r for r in Recipient.objects.select_for_update(no_key=True).filter(
        message_id__in={i.message_id for i in items}, member_id__in={i.member_id for i in items},
        grant_id=authority_id)}
    at = now()
    for item in items:
        recipient = handling.get((item.message_id, item.member_id))
        if recipient is not None and recipient.state in HANDED_OFF:
            if item.admission == InboxItem.Admission.WITHHELD:
                item.admission = InboxItem.Admission.ADMITTED
                item.save(update_fields=["admission"])
            elif item.admission == InboxItem.Admission.HELD:  # the firewall's to release, but never released now
                item.state, item.acknowledged_at = InboxItem.State.ACKNOWLEDGED, at
                item.save(update_fields=["state", "acknowledged_at"])
                mailbox.debit(item.member_id, item.content_bytes, sender_id=item.sender_id, held=True)
            continue
        item.state, item.reason, item.settled_at = InboxItem.State.REJECTED, reason, at
        item.save(update_fields=["state", "reason", "settled_at"])
        mailbox.debit(item.member_id, item.content_bytes, sender_id=item.sender_id,
                      held=item.admission == InboxItem.Admission.HELD)
        if recipient is not None:
            recipient.state, recipient.rejected_at, recipient.reason = Recipient.State.REJECTED, at, reason
            recipient.save(update_fields=["state", "rejected_at", "reason"])
        message = item.message
        payload = {"kind": "rejected", "postId": message.public_id, "conversation": item.conversation.public_id,
                   "sender": f"@{message.author.handle}", "grant": authority_ref, "reason": reason}
        post_notice(item.member, payload, events.message_rejected(message, item.member, reason),
                    conversation_id=item.conversation_id, position=item.position)
    return True
