"""Creating, reading and revoking grants."""
from __future__ import annotations

import datetime as dt
import re

from django.db import IntegrityError, transaction
from django.db.models import Q

from controlplane.clock import now, rfc3339
from controlplane.errors import Conflict, Forbidden, GrantConflict, InvalidRequest, NotFound
from controlplane.idempotency import is_valid_key
from controlplane.log import append_events
from controlplane.access import can_read_space, is_active_admin, readable_spaces
from controlplane.models import Member, Membership, Space
from controlplane.services import member_for_handle, require_owner, require_owner_locked
from grants import barrier
from grants.models import Grant
from grants.render import grant_event

GRANT_ID_RE = re.compile(r"grt_[A-Za-z0-9_-]{1,64}")
# How many spaces' grants of one id a global lookup weighs; ids are chosen by
# each space's owners, so the same id in more spaces than this is reported
# from the first ones found.
MAX_SPACES_PER_ID = 20
# Which parties each kind names; the others must be absent.
PARTIES = {
    Grant.Kind.PROJECT: (),
    Grant.Kind.PAIR: ("sender", "recipient"),
    Grant.Kind.ONE_MESSAGE: ("sender", "recipient", "idempotency_key"),
}


def _check_shape(kind: str, fields: dict) -> None:
    wanted = PARTIES[kind]
    missing = [name for name in wanted if fields.get(name) is None]
    extra = [name for name in ("sender", "recipient", "idempotency_key")
             if name not in wanted and fields.get(name) is not None]
    if missing or extra:
        named = ", ".join(wanted) or "no sender, recipient or idempotency_key"
        raise InvalidRequest(f"A {kind} grant names {named}.", details={"missing": missing, "unexpected": extra})
    key = fields.get("idempotency_key")
    if key is not None and not is_valid_key(key):
        raise InvalidRequest("idempotency_key must be 8–128 visible ASCII characters.")


def _same(grant: Grant, kind: str, sender: Member | None, recipient: Member | None,
          key: str | None, expires_at: dt.datetime | None) -> bool:
    return (grant.kind == kind and grant.sender_id == getattr(sender, "pk", None)
            and grant.recipient_id == getattr(recipient, "pk", None) and grant.idempotency_key == key
            and grant.expires_at == expires_at)


def create_grant(space: Space, *, grant_id: str, kind: str, sender: str | None = None, recipient: str | None = None,
                 idempotency_key: str | None = None, expires_at: dt.datetime | None = None,
                 actor: Member) -> tuple[Grant, bool]:
    """Create a grant under the client's id, or return the one the same
    request created before (created=False). An id is unique within its
    space: the id taken there by a grant that differs in any way is
    GRANT_CONFLICT, and ids other spaces use are not looked at. Space
    owners and admins only."""
    if not GRANT_ID_RE.fullmatch(grant_id):
        raise InvalidRequest("A grant id is grt_ followed by 1–64 of A-Z, a-z, 0-9, _ and -.",
                             details={"id": grant_id})
    if kind not in PARTIES:
        raise InvalidRequest("kind must be project, pair or one_message.")
    _check_shape(kind, {"sender": sender, "recipient": recipient, "idempotency_key": idempotency_key})
    require_owner(space, actor)
    sender_m = member_for_handle(sender) if sender is not None else None
    recipient_m = member_for_handle(recipient) if recipient is not None else None
    if sender_m is not None and sender_m == recipient_m:
        raise InvalidRequest("sender and recipient must be different members.")
    if sender_m is not None and sender_m.pk == actor.pk:  # SPEC §5: never by the member it governs
        raise Forbidden("A grant never names its creator as its sender: it would authorize itself.")

    def existing() -> Grant | None:
        grant = Grant.objects.filter(space=space, public_id=grant_id).first()
        if grant is not None and not _same(grant, kind, sender_m, recipient_m, idempotency_key, expires_at):
            raise GrantConflict(details={"id": grant_id})
        return grant

    if (grant := existing()) is not None:
        return grant, False
    if space.archived:  # it could authorize nothing: an archived space takes no sends
        raise Conflict("The space is archived.")
    if expires_at is not None and expires_at <= now():
        raise InvalidRequest("expires_at must be in the future.", details={"expires_at": rfc3339(expires_at)})
    try:
        with transaction.atomic():
            require_owner_locked(space, actor)  # again, under the owners' locks: one removed meanwhile cannot
            grant = Grant.objects.create(public_id=grant_id, space=space, kind=kind, sender=sender_m,
                                         recipient=recipient_m, idempotency_key=idempotency_key,
                                         expires_at=expires_at, created_by=actor)
            append_events([grant_event("grant.created", grant, actor_id=actor.pk)])
    except IntegrityError:  # the same id, created concurrently
        if (grant := existing()) is None:
            raise
        return grant, False
    return grant, True


def _may_manage(grant: Grant, member: Member) -> bool:
    try:
        require_owner(grant.space, member)
    except Forbidden:
        return False
    return True


def visible_grant(grant_id: str, viewer: Member, *, space: Space | None = None) -> Grant:
    """The grant, for admins, the space's owners and the grant's own sender
    and recipient while they may read its space (as its events in their
    inbox feed: a party never in a private space, or removed from it, learns
    nothing of it); anyone else gets 404. Without `space`, the id is looked
    up among the grants the viewer can see; when several spaces they see
    use it, that is CONFLICT naming those spaces (ask under one of them)."""
    grants = Grant.objects.select_related("space", "sender", "recipient", "message", "created_by").filter(
        public_id=grant_id)
    if space is not None:
        grants = grants.filter(space=space)
    elif not is_active_admin(viewer):
        # Only grants the viewer may see are weighed: another owner's grants
        # of the same id (ids are chosen per space) must not crowd them out.
        owned = Membership.objects.filter(member=viewer, status=Membership.Status.ACTIVE,
                                          role=Membership.Role.OWNER).values("space_id")
        grants = grants.filter(((Q(sender=viewer) | Q(recipient=viewer)) & Q(space__in=readable_spaces(viewer)))
                               | Q(space__in=owned))
    visible = [grant for grant in grants[:MAX_SPACES_PER_ID]
               if _may_manage(grant, viewer)
               or (viewer.pk in (grant.sender_id, grant.recipient_id) and can_read_space(grant.space, viewer))]
    if not visible:
        raise NotFound()
    if len(visible) > 1:
        slugs = sorted(grant.space.slug for grant in visible)
        raise Conflict(f"{grant_id} names a grant in several of your spaces; use /v0/spaces/{{slug}}/grants/"
                       f"{grant_id}.", details={"spaces": slugs})
    return visible[0]


def revoke_grant(grant: Grant, *, actor: Member) -> Grant:
    """Run the revocation barrier (owners and admins), in the request for up
    to grants.barrier.INLINE_SECONDS. Revoking a grant that is already
    revoking goes on with its barrier; a terminal grant is returned as it is."""
    if not _may_manage(grant, actor):
        raise Forbidden("Only the space's owners and admins may revoke its grants.")
    barrier.revoke(grant, actor=actor)
    return visible_grant(grant.public_id, actor, space=grant.space)
