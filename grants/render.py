"""JSON shapes of grants and approval requests, as GrantOut and
ApprovalRequestOut declare them (grants/api/serializers.py)."""
from __future__ import annotations

from controlplane.access import is_active_admin
from controlplane.clock import rfc3339
from controlplane.log import NewEvent
from controlplane.models import Member, Membership
from grants.models import ApprovalRequest, Grant


def render_grant(grant: Grant, viewer: Member | None = None) -> dict:
    """The grant as `viewer` sees it. The message a one-message grant was
    used by is named to its sender and recipient and to admins only: an
    owner who made the grant is no participant, and learns nothing of the
    message (SPEC §5). An event, shared by the parties and the grant's
    creator, names it as the creator may see it."""
    def handle(member):
        return f"@{member.handle}" if member is not None else None

    return {
        "id": grant.public_id,
        "space": grant.space.slug,
        "kind": grant.kind,
        "sender": handle(grant.sender),
        "recipient": handle(grant.recipient),
        "idempotency_key": grant.idempotency_key,
        "expires_at": rfc3339(grant.expires_at),
        "status": grant.status,
        "generation": grant.generation,
        "message": grant.message.public_id if grant.message_id and _party(grant, viewer) else None,
        "created_by": handle(grant.created_by),
        "created_at": rfc3339(grant.created_at),
        "barrier_started_at": rfc3339(grant.barrier_started_at),
        "ended_at": rfc3339(grant.ended_at),
    }


def _party(grant: Grant, viewer: Member | None) -> bool:
    return viewer is not None and (viewer.pk in (grant.sender_id, grant.recipient_id) or is_active_admin(viewer))


def recipient_handles(requests: list[ApprovalRequest]) -> dict[int, str]:
    """The handles of every recipient of `requests`, in one query."""
    return dict(Member.objects.filter(pk__in={pk for r in requests for pk in r.recipients})
                .values_list("pk", "handle"))


def render_approval_requests(requests: list[ApprovalRequest]) -> list[dict]:
    handles = recipient_handles(requests)
    return [render_approval_request(r, handles) for r in requests]


def render_approval_request(request: ApprovalRequest, handles: dict[int, str] | None = None) -> dict:
    handles = recipient_handles([request]) if handles is None else handles
    return {
        "id": request.public_id,
        "status": request.status,
        "space": request.space.slug,
        "conversation": request.conversation.public_id,
        "sender": f"@{request.sender.handle}",
        "recipients": [f"@{handles[pk]}" for pk in request.recipients if pk in handles],
        "idempotency_key": request.idempotency_key,
        "body": request.body,
        "reply_to": request.reply_to,
        "related_paths": request.related_paths,
        "collective": request.collective,
        "fingerprint": request.fingerprint,
        "created_at": rfc3339(request.created_at),
        "decided_by": f"@{request.decided_by.handle}" if request.decided_by_id else None,
        "decided_at": rfc3339(request.decided_at),
        "reason": request.reason,
        "message": request.message.public_id if request.message_id else None,
    }


def grant_event(kind: str, grant: Grant, *, actor_id: int | None) -> NewEvent:
    """`grant.created`, `grant.revoked` or `grant.expired`: for the grant's
    parties who belong to its space and its creator (their inbox feeds), in
    no space feed (a restricted event of no conversation), since grants are
    theirs to see. A party outside the space is told nothing: anyone who
    owns a space could otherwise put events in any member's inbox feed and
    wake their receivers, as often as they liked, and a private space's
    grants woke a member removed from it. Its creator likewise, while a
    member of the space or an active admin (admins manage every space): an
    owner who left was still woken by the revocations of their grants."""
    named = {pk for pk in (grant.sender_id, grant.recipient_id, grant.created_by_id) if pk is not None}
    parties = set(Membership.objects.filter(space_id=grant.space_id, member_id__in=named,
                                            status=Membership.Status.ACTIVE).values_list("member_id", flat=True))
    if grant.created_by_id not in parties and is_active_admin(grant.created_by):
        parties.add(grant.created_by_id)
    return NewEvent(kind, {"grant": render_grant(grant, grant.created_by)}, space_id=grant.space_id,
                    actor_id=actor_id, restricted=True, addressees=tuple(sorted(parties)))
