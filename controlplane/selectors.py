"""Reads that decide access. Absent and invisible are the same 404."""
from __future__ import annotations

from django.db import connection
from django.db.models import Q, QuerySet

from controlplane.errors import NotFound
from controlplane.models import Conversation, Member, Membership, Participant, Space


def active_membership(space: Space, member: Member | None) -> Membership | None:
    if member is None:
        return None
    return Membership.objects.filter(space=space, member=member, status=Membership.Status.ACTIVE).first()


def readable_spaces(member: Member | None) -> QuerySet[Space]:
    """Open spaces, and those `member` actively belongs to."""
    if member is None:
        return Space.objects.filter(visibility=Space.Visibility.OPEN)
    mine = Membership.objects.filter(member=member, status=Membership.Status.ACTIVE).values("space_id")
    return Space.objects.filter(Q(visibility=Space.Visibility.OPEN) | Q(id__in=mine))


def can_read_space(space: Space, member: Member | None) -> bool:
    return space.visibility == Space.Visibility.OPEN or active_membership(space, member) is not None


def get_space_for(slug: str, member: Member | None) -> Space:
    """The space, if `member` may at least see it exists.

    Anonymous callers see open spaces only. Private spaces are invisible to
    non-members; request spaces show their metadata to members of the host
    (a request space must be findable to ask to join).
    """
    space = Space.objects.filter(slug=slug).first()
    if space is None or (member is None and space.visibility != Space.Visibility.OPEN):
        raise NotFound()
    if (space.visibility == Space.Visibility.PRIVATE and not _has_membership(space, member)
            and not (member is not None and member.is_admin)):
        raise NotFound()
    return space


def get_readable_space(slug: str, member: Member | None) -> Space:
    """The space, if `member` may read its members, conversations and feed."""
    space = get_space_for(slug, member)
    if not can_read_space(space, member):
        raise NotFound()
    return space


def _has_membership(space: Space, member: Member | None) -> bool:
    if member is None:
        return False
    return Membership.objects.filter(space=space, member=member).exclude(status=Membership.Status.REMOVED).exists()


def participant_conversations(member: Member) -> QuerySet:
    return Participant.objects.filter(member=member).values("conversation_id")


def readable_conversations(space: Space, member: Member | None) -> QuerySet[Conversation]:
    """Conversations of `space` that `member` can read (assumes the space is
    readable): every channel, and the direct and group conversations they
    take part in."""
    channels = Q(kind=Conversation.Kind.CHANNEL)
    if member is None:
        return space.conversations.filter(channels)
    return space.conversations.filter(channels | Q(id__in=participant_conversations(member)))


def _conversation_to_write_sql(by_name: bool) -> str:
    table = {m.__name__: connection.ops.quote_name(m._meta.db_table)
             for m in (Conversation, Space, Membership, Participant)}
    ref = "c.kind = 'channel' AND c.name = %(ref)s" if by_name else "c.public_id = %(ref)s"
    return f"""
        SELECT c.id, c.public_id, c.space_id, c.kind, c.name,
               s.public_id, s.slug, s.name, s.visibility, s.send_policy, s.archived,
               (SELECT m.role FROM {table['Membership']} m WHERE m.space_id = c.space_id
                   AND m.member_id = %(member)s AND m.status = 'active') AS caller_role
        FROM {table['Conversation']} c JOIN {table['Space']} s ON s.id = c.space_id
        WHERE s.slug = %(slug)s AND {ref}
          AND (c.kind = 'channel' OR EXISTS (SELECT 1 FROM {table['Participant']} p
                                            WHERE p.conversation_id = c.id AND p.member_id = %(member)s))"""


def get_conversation_to_write(slug: str, ref: str, member: Member) -> Conversation:
    """A conversation (by `cnv_…` id or `#name`) that `member` can read, found
    with its space in one query for the send path. It carries `caller_role`
    (the caller's active role in the space, or None), so the sender check
    needs no query either. Absent and unreadable are the same 404.

    Plain SQL: on the hottest path, compiling the equivalent ORM query cost
    more CPU than running it."""
    by_name = ref.startswith("#")
    with connection.cursor() as cursor:
        cursor.execute(_conversation_to_write_sql(by_name),
                       {"slug": slug, "ref": ref[1:] if by_name else ref, "member": member.pk})
        row = cursor.fetchone()
    if row is None:
        raise NotFound()
    conversation = Conversation.from_db(connection.alias, ["id", "public_id", "space_id", "kind", "name"], row[:5])
    conversation.space = Space.from_db(connection.alias,
                                       ["id", "public_id", "slug", "name", "visibility", "send_policy", "archived"],
                                       [row[2], *row[5:10], bool(row[10])])
    conversation.caller_role = row[11]
    if conversation.caller_role is None and conversation.space.visibility != Space.Visibility.OPEN:
        raise NotFound()
    return conversation
