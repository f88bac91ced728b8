"""The revocation barrier (SPEC §5): `active → revoking → revoked`, or
`→ expired` when the grant's `expires_at` passes.

Starting the barrier is one transaction: under the grant's row lock the
status becomes `revoking` (so no send is admitted under it any more: sends
hold the same row in share mode while they decide and commit) and every
pending item sent under it is withheld from every read path.

Finishing it settles those items in batches, each batch its own
transaction, and sets the terminal status when none is left:
- an item already handed off (acknowledged in the inbox, or acknowledged or
  resolved as a message) stays delivered;
- any other becomes `rejected`: the item stays as a tombstone with the
  reason, the recipient's handling row says `rejected`, and a `rejected`
  notice takes the item's place in the inbox, so the conversation's later
  messages go on in order behind it.

Every step is durable; `recover()` finishes barriers a crash interrupted,
and runs at worker start and once a minute.
"""
from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F

from controlplane.clock import now
from controlplane.models import Member
from grants.models import Grant
from inbox import events
from inbox.models import InboxItem, Mailbox, Recipient
from inbox.writes import insert_notice

log = logging.getLogger(__name__)

BATCH = 500
HANDED_OFF = (Recipient.State.ACKNOWLEDGED, Recipient.State.RESOLVED)


def start_barrier(grant_pk: int, *, ending: str, actor: Member | None) -> Grant:
    """Fence `grant`: `revoking`, and its pending items withheld. A no-op for
    a grant that is not active; an expiry only fences a grant that is due."""
    with transaction.atomic():
        grant = Grant.objects.select_for_update().get(pk=grant_pk)
        if grant.status != Grant.Status.ACTIVE:
            return grant
        if ending == Grant.Status.EXPIRED and (grant.expires_at is None or grant.expires_at > now()):
            return grant
        grant.status, grant.ending, grant.generation = Grant.Status.REVOKING, ending, grant.generation + 1
        grant.barrier_started_at, grant.barrier_started_by = now(), actor
        grant.save(update_fields=["status", "ending", "generation", "barrier_started_at", "barrier_started_by"])
        InboxItem.objects.filter(grant=grant, state=InboxItem.State.PENDING,
                                 admission__in=[InboxItem.Admission.ADMITTED, InboxItem.Admission.UNCLASSIFIED]
                                 ).update(admission=InboxItem.Admission.WITHHELD)
    return grant


def finish_barrier(grant_pk: int) -> Grant:
    """Settle every item sent under a `revoking` grant, then make the grant
    terminal. Safe to run any number of times, from any process."""
    while True:
        with transaction.atomic():
            grant = Grant.objects.select_for_update().get(pk=grant_pk)
            if grant.status != Grant.Status.REVOKING:
                return grant
            items = list(InboxItem.objects.select_for_update(of=("self",))
                         .select_related("message__author", "conversation", "member")
                         .filter(grant=grant, state=InboxItem.State.PENDING).order_by("position", "id")[:BATCH])
            if not items:
                grant.status, grant.generation, grant.ended_at = grant.ending, grant.generation + 1, now()
                grant.save(update_fields=["status", "generation", "ended_at"])
                return grant
            _settle(grant, items)


def _settle(grant: Grant, items: list[InboxItem]) -> None:
    handling = {(r.message_id, r.member_id): r for r in Recipient.objects.select_for_update().filter(
        message_id__in={i.message_id for i in items}, member_id__in={i.member_id for i in items}, grant=grant)}
    verb = "expired" if grant.ending == Grant.Status.EXPIRED else "was revoked"
    reason = f"The grant {grant.public_id} this message was sent under {verb} before it was delivered."
    at = now()
    for item in items:
        recipient = handling.get((item.message_id, item.member_id))
        if recipient is not None and recipient.state in HANDED_OFF:
            # The recipient has it already: it stays delivered.
            if item.admission == InboxItem.Admission.WITHHELD:
                item.admission = InboxItem.Admission.ADMITTED
                item.save(update_fields=["admission"])
            continue
        counted = item.admission != InboxItem.Admission.HELD  # held content is not pending content
        item.state, item.reason, item.settled_at = InboxItem.State.REJECTED, reason, at
        item.save(update_fields=["state", "reason", "settled_at"])
        if counted:
            Mailbox.objects.filter(member_id=item.member_id).update(
                pending_bytes=F("pending_bytes") - item.content_bytes)
        if recipient is not None:
            recipient.state, recipient.rejected_at, recipient.reason = Recipient.State.REJECTED, at, reason
            recipient.save(update_fields=["state", "rejected_at", "reason"])
        message = item.message
        payload = {"kind": "rejected", "postId": message.public_id, "conversation": item.conversation.public_id,
                   "sender": f"@{message.author.handle}", "grant": grant.public_id, "reason": reason}
        insert_notice(item.member, payload, events.message_rejected(message, item.member, reason),
                      conversation_id=item.conversation_id, position=item.position)


def revoke(grant: Grant, *, actor: Member) -> Grant:
    """Revoke `grant`: start its barrier, then finish it."""
    start_barrier(grant.pk, ending=Grant.Status.REVOKED, actor=actor)
    return finish_barrier(grant.pk)


def expire_due() -> int:
    """Put every active grant whose `expires_at` has passed through the
    barrier. Returns how many expired."""
    due = list(Grant.objects.filter(status=Grant.Status.ACTIVE, expires_at__lte=now())
               .order_by("expires_at").values_list("pk", flat=True)[:1000])
    for pk in due:
        start_barrier(pk, ending=Grant.Status.EXPIRED, actor=None)
        finish_barrier(pk)
    return len(due)


def recover() -> int:
    """Finish every barrier that was started and not finished (a process
    stopped between the two steps). Returns how many were finished."""
    pending = list(Grant.objects.filter(status=Grant.Status.REVOKING).values_list("pk", flat=True))
    for pk in pending:
        finish_barrier(pk)
    if pending:
        log.info("finished %d interrupted revocation barrier(s)", len(pending))
    return len(pending)
