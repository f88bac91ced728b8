"""Approval requests: a send without authority, retained exactly, decided by
an admin. Approval creates one-message grants for the uncovered recipients
and sends the retained message itself, in one transaction; denial records
who and why. Either way the sender gets an `approval` inbox item."""
from __future__ import annotations

from django.db import IntegrityError, transaction

from controlplane.access import is_active_admin
from controlplane.clock import now
from controlplane.errors import (ApiError, Conflict, Forbidden, IdempotencyConflict, InvalidRequest, LimitExceeded,
                                 NotFound)
from controlplane.log import append_events
from controlplane.models import Member, Membership
from controlplane.tokens import public_id
from grants.models import ApprovalRequest, Grant
from grants.render import grant_event
from inbox import notices
from inbox.models import Recipient
from inbox.services import send_message

MAX_REASON_CHARS = 2000
# Approval requests of one sender waiting for an admin: each keeps a whole
# message, and every admin's queue shows them.
MAX_PENDING_PER_SENDER = 20


def retain_for_approval(message, uncovered: list[Member], collective: dict | None = None) -> ApprovalRequest:
    """The approval request retaining `message` (an unsaved Message the send
    refused, with its validated `collective` if it is a collective request):
    the existing one for this sender and key, or a new one. Its fingerprint
    is the send's own (inbox.services.send_fingerprint), so approving sends
    a message whose retry is the same send. The
    key is what a one-message grant is bound to, so one is required. A
    sender has at most MAX_PENDING_PER_SENDER pending (409 LIMIT_EXCEEDED)."""
    key = message.idempotency_key
    if not key:
        raise InvalidRequest("request_approval needs an Idempotency-Key: the approved grant covers that one key.")
    lookup = {"sender": message.author, "idempotency_key": key}
    request = ApprovalRequest.objects.filter(**lookup).first()
    if request is None:
        try:
            with transaction.atomic():
                # The sender's requests take turns here, so the count holds;
                # a retry that waited for another looks again.
                Member.take_turns(message.author_id)
                request = ApprovalRequest.objects.filter(**lookup).first()
                if request is None:
                    _check_pending(message.author, uncovered)
                    present = set(Membership.objects.filter(space=message.space, member__in=uncovered,
                                                            status=Membership.Status.ACTIVE)
                                  .values_list("member_id", flat=True))
                    request = ApprovalRequest.objects.create(
                        **lookup, space=message.space, conversation=message.conversation,
                        recipients=[m.pk for m in uncovered], away=[m.pk for m in uncovered if m.pk not in present],
                        body=message.body,
                        reply_to=message.reply_to.public_id if message.reply_to_id else None,
                        related_paths=message.related_paths, collective=collective,
                        fingerprint=message.fingerprint)
        except IntegrityError:  # a concurrent retry created it first
            request = ApprovalRequest.objects.get(**lookup)
    if request.fingerprint != message.fingerprint:
        raise IdempotencyConflict()
    return request


def _check_pending(sender: Member, uncovered: list[Member]) -> None:
    if ApprovalRequest.objects.filter(sender=sender, status=ApprovalRequest.Status.PENDING).count() \
            >= MAX_PENDING_PER_SENDER:
        raise LimitExceeded(f"At most {MAX_PENDING_PER_SENDER} of your approval requests may wait for a decision.",
                            details={"max": MAX_PENDING_PER_SENDER,
                                     "recipients": [f"@{m.handle}" for m in uncovered]})


def visible_approval_request(public_id_: str, viewer: Member) -> ApprovalRequest:
    """The request, for its sender or an admin; anyone else gets 404."""
    request = (ApprovalRequest.objects.select_related("space", "conversation", "sender", "decided_by", "message")
               .filter(public_id=public_id_).first())
    if request is None or not (is_active_admin(viewer) or request.sender_id == viewer.pk):
        raise NotFound()
    return request


def _lock_pending(request: ApprovalRequest, outcome: str) -> ApprovalRequest | None:
    """Re-read `request` under its row lock. None when it is still pending;
    the request itself when it already has `outcome` (a repeated decision);
    CONFLICT when it was decided the other way."""
    locked = ApprovalRequest.objects.select_for_update(no_key=True).get(pk=request.pk)
    if locked.status == ApprovalRequest.Status.PENDING:
        return None
    if locked.status == outcome:
        return locked
    raise Conflict(f"The request was already {locked.status}.", details={"status": locked.status})


def _notify_sender(request: ApprovalRequest) -> None:
    payload = {"kind": "approval", "approvalRequest": request.public_id, "status": request.status,
               "conversation": request.conversation.public_id, "idempotencyKey": request.idempotency_key,
               "postId": request.message.public_id if request.message_id else None,
               "decidedBy": f"@{request.decided_by.handle}", "reason": request.reason}
    event = notices.private_event("approval.decided", {"approval_request": request.public_id,
                                                       "status": request.status, "message": payload["postId"]},
                                  request.sender, conversation_id=request.conversation_id,
                                  actor_id=request.decided_by_id)
    notices.post_notice(request.sender, payload, event, conversation_id=request.conversation_id)


def approve(request: ApprovalRequest, *, actor: Member) -> ApprovalRequest:
    """Create a one-message grant for each retained recipient and send the
    retained message exactly, as its sender, in one transaction: a retained
    collective request goes as one, its deadline counted from this send. If the
    send cannot go as approved (a recipient is no longer covered, the sender
    lost the right to write), nothing changes and the error says why."""
    if not is_active_admin(actor):
        raise NotFound()
    if request.sender_id == actor.pk:  # SPEC §5: a grant is never made by the member it governs
        raise Forbidden("An approval request is approved by another admin than its sender.")
    with transaction.atomic():
        if done := _lock_pending(request, ApprovalRequest.Status.APPROVED):
            return done
        request.refresh_from_db()
        sender, conversation = request.sender, request.conversation
        made = [Grant.objects.create(public_id=public_id("grt"), space_id=request.space_id,
                                     kind=Grant.Kind.ONE_MESSAGE, sender=sender, recipient=recipient,
                                     idempotency_key=request.idempotency_key, created_by=actor)
                for recipient in Member.objects.filter(pk__in=request.recipients).order_by("pk")]
        try:
            result = send_message(conversation, body=request.body, reply_to=request.reply_to,
                                  related_paths=request.related_paths, idempotency_key=request.idempotency_key,
                                  collective=request.collective, actor=sender,
                                  lock_also=(sender.pk,))  # its notice, below, counts into the sender's mailbox
        except ApiError as exc:
            # No grant for a recipient added since, a full mailbox, the
            # sender no longer a member, the key used for another message…
            raise Conflict(f"The retained message cannot be sent as approved: {exc.message}",
                           details={"cause": exc.code, **exc.details}) from None
        if result.created and (gone := _not_received(result.message, set(request.recipients) - set(request.away))):
            # Away from the space since: the message would go to no one it was approved for.
            raise Conflict("The retained message cannot be sent as approved: "
                           f"{', '.join(gone)} no longer belong to the space.",
                           details={"cause": "CONFLICT", "recipients": gone})
        # What the send did not use (it went, or had gone, under other
        # authority with the same key: an owner's one-message grant, a pair
        # grant) could authorize nothing else: its key is spent.
        made = [grant.pk for grant in made]
        Grant.objects.filter(pk__in=made, message__isnull=True).delete()
        # Recorded as create_grant records one, after the send: the send
        # takes the mailboxes before the log head, as every writer does.
        if used := list(Grant.objects.filter(pk__in=made).select_related(
                "space", "sender", "recipient", "message", "created_by").order_by("pk")):
            append_events([grant_event("grant.created", grant, actor_id=actor.pk) for grant in used])
        request.status, request.decided_by, request.decided_at = ApprovalRequest.Status.APPROVED, actor, now()
        request.message = result.message
        request.save(update_fields=["status", "decided_by", "decided_at", "message"])
        _notify_sender(request)
    return request


def _not_received(message, retained: set[int]) -> list[str]:
    """The handles of the retained recipients `message` got no copy for."""
    received = set(Recipient.objects.filter(message=message).values_list("member_id", flat=True))
    return [f"@{handle}" for handle in Member.objects.filter(pk__in=retained - received)
            .order_by("handle").values_list("handle", flat=True)]


def deny(request: ApprovalRequest, reason: str, *, actor: Member) -> ApprovalRequest:
    """Record the denial, who made it and why; the message is never sent."""
    if not is_active_admin(actor):
        raise NotFound()
    reason = (reason or "").strip()
    if not reason or len(reason) > MAX_REASON_CHARS or "\x00" in reason:
        raise InvalidRequest(f"A denial needs a reason of 1–{MAX_REASON_CHARS} characters, none of them NUL.")
    with transaction.atomic():
        if done := _lock_pending(request, ApprovalRequest.Status.DENIED):
            return done
        request.refresh_from_db()
        request.status, request.decided_by, request.decided_at = ApprovalRequest.Status.DENIED, actor, now()
        request.reason = reason
        request.save(update_fields=["status", "decided_by", "decided_at", "reason"])
        _notify_sender(request)
    return request
