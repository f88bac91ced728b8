"""Every state change of the core goes through here.

Each service runs in one transaction, records its actor in the events it
appends, and appends those events as its last write (controlplane.log).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.dispatch import Signal

from controlplane import audit, events
from controlplane.access import may_administer, require_sender
from controlplane.clock import now
from controlplane.errors import Conflict, Forbidden, InvalidRequest, LimitExceeded, NotFound
from controlplane.live import group_send_on_commit, member_group
from controlplane.log import append_events
from controlplane.models import Conversation, Member, Membership, Participant, Space
from controlplane.names import checked_name
from controlplane.sessions import end_sessions

HANDLE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{1,31}")
SLUG_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
CHANNEL_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,79}")
MAX_GROUP_MEMBERS = 64
MAX_SPACES_PER_MEMBER = 100  # spaces one member (not an admin) created and has not archived
MAX_CHANNELS_PER_SPACE = 1_000
MAX_GROUPS_PER_MEMBER = 1_000  # in one space


def parse_handle(value: str) -> str:
    """`@alice` or `alice` → `alice`, or InvalidRequest."""
    handle = value[1:] if isinstance(value, str) and value.startswith("@") else value
    if not isinstance(handle, str) or not HANDLE_RE.fullmatch(handle):
        raise InvalidRequest("A handle is 2–32 characters of a-z, 0-9, _ and -, starting with a letter or digit.",
                             details={"handle": value if isinstance(value, str) else None})
    return handle


def member_for_handle(value: str) -> Member:
    member = Member.objects.filter(handle=parse_handle(value)).first()
    if member is None:
        raise NotFound("No such member.", details={"member": value})
    return member


# --- members and credentials ---------------------------------------------------

def create_member(handle: str, *, kind: str = Member.Kind.AGENT, display_name: str = "", is_admin: bool = False,
                  password: str | None = None, actor: Member | None) -> Member:
    """Create a member; humans (and admins) also get a Django user for the
    web app, and a password, if one is given, that passes the password
    validators (AUTH_PASSWORD_VALIDATORS, as the admin's forms check)."""
    handle = parse_handle(handle)
    checked_name("display_name", display_name, Member._meta.get_field("display_name").max_length, blank=True)
    if kind not in Member.Kind.values:
        raise InvalidRequest("kind must be human, agent or operator.", details={"kind": kind})
    if password is not None:
        if kind != Member.Kind.HUMAN and not is_admin:
            raise InvalidRequest("Only humans and admins sign in to the web app: no password for this member.")
        try:
            validate_password(password)
        except ValidationError as exc:
            raise InvalidRequest(" ".join(exc.messages)) from None
    try:
        with transaction.atomic():
            user = None
            if kind == Member.Kind.HUMAN or is_admin:
                user = get_user_model().objects.create_user(username=handle, password=password,
                                                            is_staff=is_admin, is_superuser=is_admin)
            member = Member.objects.create(handle=handle, kind=kind, display_name=display_name or handle,
                                           is_admin=is_admin, user=user)
            audit.record("member.created", member.public_id, actor=actor, kind=kind, is_admin=is_admin)
            return member
    except IntegrityError:
        raise Conflict("That handle is taken.", details={"handle": f"@{handle}"}) from None


def update_member(member: Member, *, status: str | None = None, is_admin: bool | None = None,
                  actor: Member | None) -> Member:
    """Suspend or reinstate `member`, or give or withdraw admin powers.

    Takes effect at once and everywhere: the Django user's flags follow (a
    suspended member's web and admin sessions end, for good; a demoted
    one's admin powers do), their credentials are refused from the next request,
    and a suspended member's live sockets close after the commit. Atomic;
    changing nothing is a no-op."""
    if status is not None and status not in Member.Status.values:
        raise InvalidRequest("status must be active or suspended.", details={"status": status})
    with transaction.atomic():
        locked = Member.objects.select_for_update(no_key=True).get(pk=member.pk)
        changed = {}
        if status is not None and status != locked.status:
            changed["status"] = locked.status = status
        if is_admin is not None and is_admin != locked.is_admin:
            changed["is_admin"] = locked.is_admin = is_admin
        if not changed:
            return locked
        locked.save(update_fields=list(changed))
        active = locked.status == Member.Status.ACTIVE
        if locked.user_id is not None:
            get_user_model().objects.filter(pk=locked.user_id).update(
                is_active=active, is_staff=active and locked.is_admin, is_superuser=active and locked.is_admin)
        audit.record("member.updated", locked.public_id, actor=actor, **changed)
        if not active:
            writer_lost.send(sender=Member, space_id=None, member_id=locked.pk)
            if locked.user_id is not None:
                end_sessions(locked.user_id)  # Django would honour them again on reinstatement
            group_send_on_commit(member_group(locked), {"type": "session.ended"})
    return locked


# --- spaces and memberships -----------------------------------------------------

def create_space(*, slug: str, name: str, visibility: str, send_policy: str, actor: Member) -> Space:
    """Create a space; its creator becomes its first owner. Checks its own
    input, whoever calls (the API and the web form parse it first)."""
    if not SLUG_RE.fullmatch(slug):
        raise InvalidRequest("A slug is 1–64 characters of a-z, 0-9 and -, starting with a letter or digit.",
                             details={"slug": slug})
    for field, value, allowed in (("visibility", visibility, Space.Visibility.values),
                                  ("send_policy", send_policy, Space.SendPolicy.values)):
        if value not in allowed:
            raise InvalidRequest(f"{field} is one of {', '.join(allowed)}.", details={field: value})
    checked_name("name", name, Space._meta.get_field("name").max_length)
    try:
        with transaction.atomic():
            # The creator's row serializes their creations, so the count holds (as webhooks' caps do).
            Member.take_turns(actor.pk)
            created = Space.objects.filter(created_by=actor, archived=False).count()
            if created >= MAX_SPACES_PER_MEMBER and not actor.is_admin:
                raise LimitExceeded(f"A member creates at most {MAX_SPACES_PER_MEMBER} spaces; an admin can "
                                    "archive one to make room.")
            space = Space.objects.create(slug=slug, name=name, visibility=visibility, send_policy=send_policy,
                                         created_by=actor)
            owner = Membership.objects.create(space=space, member=actor, role=Membership.Role.OWNER)
            append_events([events.space_created(space, actor=actor), events.member_joined(owner, actor=actor)])
    except IntegrityError:
        raise Conflict("That slug is taken.", details={"slug": slug}) from None
    return space


def _lock_owners(space: Space) -> None:
    """Who owns the space holds still until the caller's transaction ends.
    The space's row is the lock: which rows are its owners changes as each
    change commits, so locking those rows in id order was no single order
    (owners demoting and removing each other at once deadlocked)."""
    list(Space.objects.select_for_update(no_key=True).filter(pk=space.pk).values_list("pk"))


def _lock_memberships(space: Space, member: Member) -> Membership | None:
    """Lock the space's owners (always first) and `member`'s row; return the latter."""
    _lock_owners(space)
    return Membership.objects.select_for_update(no_key=True).filter(space=space, member=member).first()


def _keep_an_owner(space: Space, leaving: Membership) -> None:
    """A space keeps at least one owner who may act: a suspended owner
    does not count. The caller holds the owners' lock (`_lock_owners`), so
    two owners demoting or removing each other cannot both pass."""
    if leaving.role != Membership.Role.OWNER or leaving.status != Membership.Status.ACTIVE:
        return
    others = (Membership.objects.filter(space=space, role=Membership.Role.OWNER, status=Membership.Status.ACTIVE,
                                        member__status=Member.Status.ACTIVE)
              .exclude(pk=leaving.pk).exists())
    if not others:
        raise Conflict("A space keeps at least one owner.")


@dataclass(frozen=True)
class MembershipChange:
    membership: Membership
    created: bool  # a membership came into being (none before, or removed)


def _create_membership(space: Space, member: Member, *, status: str, role: str) -> Membership | None:
    """A new membership row, or None when a concurrent request created one first."""
    try:
        with transaction.atomic():
            return Membership.objects.create(space=space, member=member, status=status, role=role)
    except IntegrityError:
        return None


def _set_membership(membership: Membership, *, status: str, role: str) -> MembershipChange:
    created = membership.status == Membership.Status.REMOVED
    membership.status, membership.role, membership.updated_at = status, role, now()
    membership.save(update_fields=["status", "role", "updated_at"])
    return MembershipChange(membership, created)


def join_space(space: Space, *, actor: Member) -> MembershipChange:
    """Join an open space, or ask to join a request space (pending until an
    owner admits). Private spaces are joined only by an owner adding you.
    One who joins again after leaving or being removed keeps an observer's
    role if they had it (anyone else joins as a member). Idempotent:
    joining again returns the current membership (a private space's
    members' too; anyone else gets 404 there)."""
    status = Membership.Status.ACTIVE if space.visibility == Space.Visibility.OPEN else Membership.Status.PENDING
    with transaction.atomic():
        current = Membership.objects.select_for_update(no_key=True).filter(space=space, member=actor).first()
        if current is not None and current.status != Membership.Status.REMOVED:
            return MembershipChange(current, False)  # in an archived space too: nothing changes
        if space.visibility == Space.Visibility.PRIVATE:
            raise NotFound()
        if space.archived:
            raise Conflict("The space is archived.")
        if current is None:
            created = _create_membership(space, actor, status=status, role=Membership.Role.MEMBER)
            if created is None:  # an owner's add (or another join) won the race: theirs stands
                return MembershipChange(Membership.objects.get(space=space, member=actor), False)
            change = MembershipChange(created, True)
        else:
            # An observer who left comes back an observer: leaving and joining again
            # would otherwise undo an owner's demotion. Owners come back as members.
            role = Membership.Role.OBSERVER if current.role == Membership.Role.OBSERVER else Membership.Role.MEMBER
            change = _set_membership(current, status=status, role=role)
        if status == Membership.Status.ACTIVE:
            append_events([events.member_joined(change.membership, actor=actor)])
        return change


def require_owner(space: Space, actor: Member) -> None:
    if not may_administer(space, actor):
        raise Forbidden("Only the space's owners may do this.")


def member_to_manage(space: Space, value: str, *, actor: Member) -> Member:
    """The member `value` names, for an owner's change to their membership
    of `space` (anyone's own leaving aside): one who may not manage is
    refused (403) before the handle is looked up, so they learn nothing of
    which handles exist (it was 404 "No such member" for those no one holds)."""
    if parse_handle(value) != actor.handle:
        require_owner(space, actor)
    return member_for_handle(value)


def require_owner_locked(space: Space, actor: Member) -> None:
    """`require_owner` under the owners' lock, in the caller's
    transaction (as membership changes take it): an owner removed
    meanwhile cannot act once the removal commits."""
    _lock_owners(space)
    require_owner(space, actor)


def add_member(space: Space, member: Member, *, role: str | None = None, actor: Member) -> MembershipChange:
    """Owners add a member, admit a pending request, or change a role. With
    no `role`, an active member keeps theirs; anyone else joins as a member."""
    if role is not None and role not in Membership.Role.values:
        raise InvalidRequest("role must be owner, member or observer.", details={"role": role})
    with transaction.atomic():
        current = _lock_memberships(space, member)
        require_owner(space, actor)  # under the owners' lock: a just-removed owner cannot act
        if not member.is_active:  # told to owners only
            raise Conflict("The member is suspended.")
        if space.archived and (current is None or current.status != Membership.Status.ACTIVE):
            raise Conflict("The space is archived.")  # no one new, as for joining
        if current is None:
            created = _create_membership(space, member, status=Membership.Status.ACTIVE,
                                         role=role or Membership.Role.MEMBER)
            if created is not None:
                append_events([events.member_joined(created, actor=actor)])
                return MembershipChange(created, True)
            # a concurrent join won the race: the owner's decision applies to its row
            current = Membership.objects.select_for_update(no_key=True).get(space=space, member=member)
        if role is None:
            role = current.role if current.status == Membership.Status.ACTIVE else Membership.Role.MEMBER
        if current.status == Membership.Status.ACTIVE and current.role == role:
            return MembershipChange(current, False)
        if role != Membership.Role.OWNER:
            _keep_an_owner(space, current)
        joined = current.status != Membership.Status.ACTIVE
        if not joined and role == Membership.Role.OBSERVER:
            writer_lost.send(sender=Membership, space_id=space.pk, member_id=member.pk)
        change = _set_membership(current, status=Membership.Status.ACTIVE, role=role)
        if joined:
            append_events([events.member_joined(change.membership, actor=actor)])
        return change


# Sent (with `space`) when an admin unarchives a space: apps above this one
# take up again what archiving paused (coordination: its claims' expiry).
space_unarchived = Signal()

# Sent (with `space_id`, None for every space, and `member_id`) in the
# transaction of a change after which a member may no longer write in a
# space (a removal, a demotion to observer) or anywhere (a suspension):
# coordination looks at their claims at once. Receivers lock only rows of
# their own and append nothing: a removal sends it before its hooks, which
# take mailboxes and the log head.
writer_lost = Signal()

RemovalHook = Callable[[int, int], None]

# Work a removal does in its transaction before it appends `member.removed`,
# as `hook(space id, member id)`, once the membership reads as removed. Apps
# above this one register here from their AppConfig.ready(): the collective
# requests' removal check (inbox.collectives.fail_for_removed). Not an append
# hook: one runs under the log head, and a hook that locks rows and mailboxes
# must take them before it (inbox.mailbox.lock).
_REMOVAL_HOOKS: list[RemovalHook] = []


def register_removal_hook(hook: RemovalHook) -> None:
    if hook not in _REMOVAL_HOOKS:
        _REMOVAL_HOOKS.append(hook)


def remove_member(space: Space, member: Member, *, actor: Member) -> None:
    """Remove a member (owners) or leave (anyone). Delivery from the space
    stops at once: every read path checks the active membership. The
    removal hooks run in the same transaction, before the removal's event."""
    with transaction.atomic():
        membership = _lock_memberships(space, member)
        if member.pk != actor.pk:
            require_owner(space, actor)  # under the owners' lock: a just-removed owner cannot act
        if membership is None or membership.status == Membership.Status.REMOVED:
            raise NotFound("Not a member of this space.")
        _keep_an_owner(space, membership)
        was_active = membership.status == Membership.Status.ACTIVE
        membership.status, membership.updated_at = Membership.Status.REMOVED, now()
        membership.save(update_fields=["status", "updated_at"])
        if was_active:
            writer_lost.send(sender=Membership, space_id=space.pk, member_id=member.pk)
            for hook in _REMOVAL_HOOKS:
                hook(space.pk, member.pk)
            append_events([events.member_removed(membership, actor=actor)])


# --- conversations ------------------------------------------------------------

def create_channel(space: Space, name: str, *, actor: Member) -> Conversation:
    require_sender(space, actor)
    name = name[1:] if name.startswith("#") else name
    if not CHANNEL_RE.fullmatch(name):
        raise InvalidRequest("A channel name is 1–80 characters of a-z, 0-9, _ and -.", details={"name": name})
    try:
        with transaction.atomic():
            Space.objects.select_for_update(no_key=True).filter(pk=space.pk).first()  # serializes the count
            # A name with a colon is no channel of a member's making (a task's discussion, coordination).
            channels = (Conversation.objects.filter(space=space, kind=Conversation.Kind.CHANNEL)
                        .exclude(name__contains=":").count())
            if channels >= MAX_CHANNELS_PER_SPACE:
                raise LimitExceeded(f"A space has at most {MAX_CHANNELS_PER_SPACE} channels.")
            conversation = Conversation.objects.create(space=space, kind=Conversation.Kind.CHANNEL, name=name,
                                                       address=f"#{name}", created_by=actor)
            append_events([events.conversation_created(conversation, [], actor=actor)])
    except IntegrityError:
        raise Conflict("A channel with that name exists.", details={"name": f"#{name}"}) from None
    return conversation


def get_or_create_direct(space: Space, other: Member, *, actor: Member) -> tuple[Conversation, bool]:
    """The direct conversation of the pair; the same pair always gets the same one."""
    if other.pk == actor.pk:
        raise InvalidRequest("A direct conversation needs another member.")
    pair = sorted([actor, other], key=lambda m: m.pk)
    return _get_or_create_participants(space, Conversation.Kind.DIRECT, pair,
                                       f"direct:{pair[0].pk}:{pair[1].pk}", actor=actor)


def check_group_size(count: int) -> None:
    """A group has 2–MAX_GROUP_MEMBERS members (the caller among them).
    Callers that look members up by handle check the count first."""
    if not 2 <= count <= MAX_GROUP_MEMBERS:
        raise InvalidRequest(f"A group has 2–{MAX_GROUP_MEMBERS} members.")


def get_or_create_group(space: Space, members: list[Member], *, actor: Member) -> tuple[Conversation, bool]:
    """The group with exactly this ordered member list (which includes the caller)."""
    ids = [m.pk for m in members]
    if len(set(ids)) != len(ids):
        raise InvalidRequest("A group lists each member once.")
    check_group_size(len(ids))
    if actor.pk not in ids:
        raise InvalidRequest("A group you create must include you.")
    return _get_or_create_participants(space, Conversation.Kind.GROUP, members,
                                       "group:" + ",".join(map(str, ids)), actor=actor)


def _check_groups_made(space: Space, actor: Member) -> None:
    """Every distinct ordered member list is a group of its own: a member
    makes at most MAX_GROUPS_PER_MEMBER in one space (the caller holds
    their row, which serializes the count)."""
    made = Conversation.objects.filter(space=space, kind=Conversation.Kind.GROUP, created_by=actor).count()
    if made >= MAX_GROUPS_PER_MEMBER:
        raise LimitExceeded(f"A member makes at most {MAX_GROUPS_PER_MEMBER} groups in a space.")


def participants_named(space: Space, handles: list[str], *, actor: Member) -> list[Member]:
    """The members `handles` name, for a conversation of `actor`'s. A handle
    no one holds is answered, after the write check, as one not in the space:
    it was 404, so anyone learned which handles exist."""
    names = [parse_handle(h) for h in handles]
    found = {m.handle: m for m in Member.objects.filter(handle__in=names)}
    if len(found) < len(set(names)):
        require_sender(space, actor)
        _refuse_outsiders(space, names, list(found.values()))
    return [found[name] for name in names]


def _refuse_outsiders(space: Space, names: list[str], members: list[Member]) -> None:
    """400 naming those of `names` (of whom `members` exist) not active in the space."""
    readers = set(Membership.objects.filter(space=space, member__in=members, status=Membership.Status.ACTIVE)
                  .values_list("member__handle", flat=True))
    if outsiders := [f"@{name}" for name in names if name not in readers]:
        raise InvalidRequest("Every member must be an active member of the space.", details={"members": outsiders})


def _get_or_create_participants(space: Space, kind: str, members: list[Member], address: str, *,
                                 actor: Member) -> tuple[Conversation, bool]:
    # The caller is one of `members`: an existing conversation is theirs to
    # read, in an archived space too (its history stays readable).
    existing = Conversation.objects.filter(space=space, address=address).first()
    if existing is not None:
        return existing, False
    require_sender(space, actor)
    _refuse_outsiders(space, [m.handle for m in members], members)
    if suspended := [f"@{m.handle}" for m in members if m.status != Member.Status.ACTIVE]:
        raise Conflict("A suspended member is added to no conversation.", details={"members": suspended})
    try:
        with transaction.atomic():
            if kind == Conversation.Kind.GROUP:
                # The maker's row serializes the count; the same group made meanwhile is found, not refused.
                Member.take_turns(actor.pk)
                if (made := Conversation.objects.filter(space=space, address=address).first()) is not None:
                    return made, False
                _check_groups_made(space, actor)
            conversation = Conversation.objects.create(space=space, kind=kind, address=address, created_by=actor)
            Participant.objects.bulk_create(
                Participant(conversation=conversation, member=m, ordinal=i) for i, m in enumerate(members))
            append_events([events.conversation_created(conversation, members, actor=actor)])
    except IntegrityError:  # created concurrently: same address, same conversation
        return Conversation.objects.get(space=space, address=address), False
    return conversation, True
