"""Who may read and write what: the one place those rules live (SPEC §3).

A member reads a space when it is open or they are an active member of it,
and a conversation of it when it is a channel or they take part in it. A
suspended member reads nothing; an anonymous caller reads the channels of
open spaces. Every read path asks here: for one object (`can_read_space`,
`readable_conversation`), as a queryset or filter (`readable_spaces`,
`readable_conversations`, `readable_q`), and for a set of members at once
(`readers_of`, `readers_of_conversations`: live streams, webhook wakes).
Absent and unreadable are the same 404.

`get_conversation_to_write` (the send path) and `conversation_readers` (live
streams, `readers_of`) are plain-SQL copies of the same rule;
tests/controlplane/test_access.py checks that every path agrees with it over
every kind of space, role, membership status and conversation.

Who may write lives here too (`require_sender`, and `recheck_writes`, the
send path's last look at its authors and recipients): an active membership
that is not an observer's, in a space that is not archived.
"""
from __future__ import annotations

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from controlplane.db import plain_rows
from controlplane.errors import Conflict, Forbidden, NotFound
from controlplane.models import Conversation, Member, Membership, Participant, Space


def reads_as_member(member: Member | None) -> bool:
    """Whether `member` reads as a member: anonymous callers read as None,
    suspended members not at all."""
    return member is not None and member.status == Member.Status.ACTIVE


def is_active_admin(member: Member | None) -> bool:
    """Admin powers (the admin site, the approval queue, approvals, every
    space) belong to admin members who are active: suspending or demoting
    one ends them at once, whatever their Django user's flags say."""
    return reads_as_member(member) and member.is_admin


def admin_member(user) -> Member | None:
    """The active admin member behind a Django user, or None."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    member = getattr(user, "member", None)
    return member if is_active_admin(member) else None


def active_membership(space: Space, member: Member | None) -> Membership | None:
    if not reads_as_member(member):
        return None
    return Membership.objects.filter(space=space, member=member, status=Membership.Status.ACTIVE).first()


def own_space_ids(member: Member) -> QuerySet:
    """The ids of the spaces `member` actively belongs to, as a subquery
    (the caller checks that they read as a member)."""
    return Membership.objects.filter(member=member, status=Membership.Status.ACTIVE).values("space_id")


def readable_spaces(member: Member | None) -> QuerySet[Space]:
    """Open spaces, and those `member` actively belongs to."""
    if member is None:
        return Space.objects.filter(visibility=Space.Visibility.OPEN)
    if not reads_as_member(member):
        return Space.objects.none()
    return Space.objects.filter(Q(visibility=Space.Visibility.OPEN) | Q(id__in=own_space_ids(member)))


def space_readable_by_row_member(space: str, member: str = "member_id") -> Q:
    """`readable_spaces` as a filter over rows that each name their own
    member (`member`, a column) and a space (`space`, a relation path),
    for reads across many members at once: rows of no space, of an open
    space, or of one their member actively belongs to. (The member's own
    status is the caller's to check.)"""
    memberships = Membership.objects.filter(member_id=OuterRef(member), space_id=OuterRef(f"{space}_id"),
                                            status=Membership.Status.ACTIVE)
    return (Q(**{f"{space}__isnull": True}) | Q(**{f"{space}__visibility": Space.Visibility.OPEN})
            | Exists(memberships))


def space_received_by_row_member(space: str, member: str = "member_id") -> Q:
    """`receives_from` as such a filter: readable, and not removed from it
    (an open space's removed members still read it, and receive nothing)."""
    removed = Membership.objects.filter(member_id=OuterRef(member), space_id=OuterRef(f"{space}_id"),
                                        status=Membership.Status.REMOVED)
    return space_readable_by_row_member(space, member) & ~Exists(removed)


def may_administer(space: Space, member: Member | None) -> bool:
    """Owners of the space, and active admins, administer it."""
    if is_active_admin(member):
        return True
    membership = active_membership(space, member)
    return membership is not None and membership.role == Membership.Role.OWNER


def can_read_space(space: Space, member: Member | None) -> bool:
    if member is not None and not reads_as_member(member):
        return False
    return space.visibility == Space.Visibility.OPEN or active_membership(space, member) is not None


def removed_sql(space: str, member: str) -> str:
    """SQL true when the member (`member`, an expression) was removed from
    the space (`space`, an expression) and has not joined again."""
    table = connection.ops.quote_name(Membership._meta.db_table)
    return (f"EXISTS (SELECT 1 FROM {table} removed WHERE removed.space_id = {space} "
            f"AND removed.member_id = {member} AND removed.status = '{Membership.Status.REMOVED.value}')")


def receiving_sql(space: str, member: str) -> str:
    """SQL true when deliveries from the space (`space`, an expression of
    its id) reach the member (`member`, of theirs) as `receives_from`
    decides, less the member's own status, the caller's to check (a
    suspended owner's wakes wait): an active membership, or an open space
    they were not removed from. A removed member who asked to join a request
    space again is pending: nothing reaches them yet."""
    memberships = connection.ops.quote_name(Membership._meta.db_table)
    spaces = connection.ops.quote_name(Space._meta.db_table)
    return (f"(EXISTS (SELECT 1 FROM {memberships} active WHERE active.space_id = {space} "
            f"AND active.member_id = {member} AND active.status = '{Membership.Status.ACTIVE.value}') "
            f"OR (EXISTS (SELECT 1 FROM {spaces} open_space WHERE open_space.id = {space} "
            f"AND open_space.visibility = '{Space.Visibility.OPEN.value}') AND NOT {removed_sql(space, member)}))")


def receives_from(space: Space, member: Member) -> bool:
    """Whether deliveries from `space` (mentions, space subscriptions'
    wakes) reach `member`: they read it, and were not removed from it.
    Removal stops all delivery from a space at once (SPEC §3), from an
    open one too, which anyone, the removed included, still reads (by
    polling its feed); joining again restores it. The mention path applies
    the same rule in SQL (`removed_sql`, inbox.services._recipients)."""
    return can_read_space(space, member) and not _removed_from_open(space, member)


def _removed_from_open(space: Space, member: Member) -> bool:
    """(Elsewhere a removed member reads nothing of the space.)"""
    return (space.visibility == Space.Visibility.OPEN
            and Membership.objects.filter(space=space, member=member, status=Membership.Status.REMOVED).exists())


def require_receiving(space: Space, member: Member) -> None:
    """Subscribing to a space's wakes asks what sending them asks
    (`receives_from`): 404 for a space `member` cannot read, 403 for one
    they were removed from (they still see it)."""
    if not can_read_space(space, member):
        raise NotFound()
    if _removed_from_open(space, member):
        raise Forbidden("You were removed from this space: join it again to be woken by it.")


def get_space_for(slug: str, member: Member | None) -> Space:
    """The space, if `member` may at least see it exists.

    Anonymous callers see open spaces only. Private spaces are invisible to
    non-members; request spaces show their metadata to members of the host
    (a request space must be findable to ask to join).
    """
    space = Space.objects.filter(slug=slug).first()
    if member is not None and not reads_as_member(member):
        raise NotFound()
    if space is None or (member is None and space.visibility != Space.Visibility.OPEN):
        raise NotFound()
    if (space.visibility == Space.Visibility.PRIVATE and not _has_membership(space, member)
            and not is_active_admin(member)):
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
    return space.conversations.filter(_conversation_q(member, ""))


def readable_conversations_in(spaces, member: Member) -> QuerySet[Conversation]:
    """`readable_conversations` of each of `spaces` (readable ones), in one query."""
    return Conversation.objects.filter(_conversation_q(member, ""), space__in=spaces)


def _conversation_q(member: Member | None, prefix: str) -> Q:
    channels = Q(**{f"{prefix}kind": Conversation.Kind.CHANNEL})
    if member is None:
        return channels
    return channels | Q(**{f"{prefix}id__in": participant_conversations(member)})


def readable_q(member: Member | None, *, space: str = "space", conversation: str = "conversation") -> Q:
    """A filter for rows that belong to a space and a conversation (named by
    `space` and `conversation`), keeping those `member` may read."""
    if member is None:
        return Q(**{f"{space}__visibility": Space.Visibility.OPEN}) & _conversation_q(None, f"{conversation}__")
    if not reads_as_member(member):
        return Q(pk__in=[])
    return Q(**{f"{space}__in": readable_spaces(member)}) & _conversation_q(member, f"{conversation}__")


def visible_memberships(space: Space, viewer: Member | None) -> QuerySet[Membership]:
    """The memberships of a readable `space` that `viewer` may list: active
    ones, and for those who manage them (its owners, the host's admins)
    pending ones too (removed members are history)."""
    memberships = space.memberships.select_related("member")
    membership = active_membership(space, viewer)
    if (membership is not None and membership.role == Membership.Role.OWNER) or is_active_admin(viewer):
        return memberships.exclude(status=Membership.Status.REMOVED)
    return memberships.filter(status=Membership.Status.ACTIVE)


def readers_of(conversation: Conversation, members: set[int]) -> set[int]:
    """Which of `members` (pks) may read `conversation` now, in one query."""
    return conversation_readers(conversation.pk, members)[0]


def conversation_readers(conversation_id: int, members: set[int]) -> tuple[set[int], str | None]:
    """Which of `members` (pks) may read the conversation now, and its
    space's send policy as it is now (None if the conversation is gone), in
    one query: a live stream's pass asks this on every commit.

    Plain SQL: compiling the equivalent ORM query (and loading the
    conversation and its space first) cost more than running it."""
    readers, send_policy, _ = conversation_readers_then(conversation_id, members)
    return readers, send_policy


def conversation_readers_then(conversation_id: int, members: set[int], then: tuple[str, list] | None = None,
                              width: int = 0) -> tuple[set[int], str | None, list[tuple]]:
    """`conversation_readers`, and the rows of `then` (a query of `width`
    columns with its parameters: a live pass's messages) in the same round
    trip, only if one of `members` may read the conversation (else none)."""
    return readers_then_result(plain_rows(*readers_then_query(conversation_id, members, then, width)))


def readers_then_query(conversation_id: int, members: set[int], then: tuple[str, list] | None = None,
                       width: int = 0) -> tuple[str, list]:
    """`conversation_readers_then`'s statement and parameters, for a caller
    that runs it elsewhere (controlplane.loop_reads); `readers_then_result`
    reads its rows."""
    ids = list(members) or [None]  # IN (NULL) matches nobody: the policy, and no reader
    sql, params = _readers_sql(len(ids)), [*ids, conversation_id]
    if then is not None:
        empty = ", NULL" * width
        sql = (f"WITH r AS ({sql}) SELECT r.send_policy, r.id{empty} FROM r UNION ALL "
               f"SELECT NULL, NULL, q.* FROM ({then[0]}) q WHERE EXISTS (SELECT 1 FROM r WHERE r.id IS NOT NULL)")
        params += then[1]
    return sql, params


def readers_then_result(rows: list[tuple]) -> tuple[set[int], str | None, list[tuple]]:
    # The rule's rows carry the policy (and a reader, or none); `then`'s rows carry neither.
    rule = [row[:2] for row in rows if row[0] is not None]
    if not rule:
        return set(), None, []
    return {member for _, member in rule if member is not None}, rule[0][0], [row[2:] for row in rows
                                                                             if row[0] is None]


# The read rule's values in its plain-SQL copies, as SQL literals of the
# models' own choices.
ACTIVE_MEMBER, ACTIVE_MEMBERSHIP = f"'{Member.Status.ACTIVE}'", f"'{Membership.Status.ACTIVE}'"
OPEN, CHANNEL = f"'{Space.Visibility.OPEN}'", f"'{Conversation.Kind.CHANNEL}'"


def _readers_sql(count: int) -> str:
    table = {m.__name__: connection.ops.quote_name(m._meta.db_table)
             for m in (Conversation, Space, Membership, Participant, Member)}
    return f"""
        SELECT s.send_policy, m.id
        FROM {table['Conversation']} c JOIN {table['Space']} s ON s.id = c.space_id
        LEFT JOIN {table['Member']} m ON m.id IN ({", ".join(["%s"] * count)}) AND m.status = {ACTIVE_MEMBER}
          AND (s.visibility = {OPEN} OR EXISTS (SELECT 1 FROM {table['Membership']} ms WHERE ms.space_id = c.space_id
                                                AND ms.member_id = m.id AND ms.status = {ACTIVE_MEMBERSHIP}))
          AND (c.kind = {CHANNEL} OR EXISTS (SELECT 1 FROM {table['Participant']} p
                                            WHERE p.conversation_id = c.id AND p.member_id = m.id))
        WHERE c.id = %s"""


def readers_of_conversations(conversation_ids: set[int], members: set[int]) -> dict[int, set[int]]:
    """`readers_of` for many conversations at once: conversation pk → which
    of `members` may read it (conversations nobody of them reads are absent).
    Direct and group conversations take one query together; each channel
    among them one more."""
    if not conversation_ids or not members:
        return {}
    belongs = Membership.objects.filter(space_id=OuterRef("conversation__space_id"), member_id=OuterRef("member_id"),
                                        status=Membership.Status.ACTIVE)
    pairs = set(Participant.objects
                .filter(Q(conversation__space__visibility=Space.Visibility.OPEN) | Exists(belongs),
                        conversation_id__in=conversation_ids, member_id__in=members,
                        member__status=Member.Status.ACTIVE)
                .exclude(conversation__kind=Conversation.Kind.CHANNEL).values_list("conversation_id", "member_id"))
    for channel in Conversation.objects.select_related("space").filter(id__in=conversation_ids,
                                                                        kind=Conversation.Kind.CHANNEL):
        pairs |= {(channel.pk, pk) for pk in readers_of(channel, members)}
    readers: dict[int, set[int]] = {}
    for conversation_id, member_id in pairs:
        readers.setdefault(conversation_id, set()).add(member_id)
    return readers


def readable_conversation(member: Member | None, public_id: str) -> Conversation | None:
    """The conversation, with its space, if `member` (a signed-in member) may
    read it now."""
    if not reads_as_member(member):
        return None
    conversation = Conversation.objects.select_related("space").filter(public_id=public_id).first()
    if conversation is None or member.pk not in readers_of(conversation, {member.pk}):
        return None
    return conversation


def get_readable_conversation(member: Member, public_id: str) -> Conversation:
    conversation = readable_conversation(member, public_id)
    if conversation is None:
        raise NotFound("No such conversation, or you cannot read it.")
    return conversation


def _conversation_to_write_sql(by_name: bool) -> str:
    table = {m.__name__: connection.ops.quote_name(m._meta.db_table)
             for m in (Conversation, Space, Membership, Participant)}
    ref = f"c.kind = {CHANNEL} AND c.name = %(ref)s" if by_name else "c.public_id = %(ref)s"
    return f"""
        SELECT c.id, c.public_id, c.space_id, c.kind, c.name,
               s.public_id, s.slug, s.name, s.visibility, s.send_policy, s.archived,
               (SELECT m.role FROM {table['Membership']} m WHERE m.space_id = c.space_id
                   AND m.member_id = %(member)s AND m.status = {ACTIVE_MEMBERSHIP}) AS caller_role
        FROM {table['Conversation']} c JOIN {table['Space']} s ON s.id = c.space_id
        WHERE s.slug = %(slug)s AND {ref}
          AND (c.kind = {CHANNEL} OR EXISTS (SELECT 1 FROM {table['Participant']} p
                                            WHERE p.conversation_id = c.id AND p.member_id = %(member)s))"""


def get_conversation_to_write(slug: str, ref: str, member: Member) -> Conversation:
    """A conversation (by `cnv_…` id or `#name`) that `member` can read, found
    with its space in one query for the send path. It carries `caller_role`
    (the caller's active role in the space, or None), so the sender check
    needs no query either. Absent and unreadable are the same 404.

    Plain SQL: on the hottest path, compiling the equivalent ORM query cost
    more CPU than running it."""
    if not reads_as_member(member):
        raise NotFound()
    by_name = ref.startswith("#")
    with connection.cursor() as cursor:
        cursor.execute(_conversation_to_write_sql(by_name),
                       {"slug": slug, "ref": ref[1:] if by_name else ref, "member": member.pk})
        row = cursor.fetchone()
    if row is None:
        raise NotFound()
    # Partial instances of the columns the send path reads: converting
    # whole rows (controlplane.db.model_from_row) cost a send 75 µs more.
    conversation = Conversation.from_db(connection.alias, ["id", "public_id", "space_id", "kind", "name"], row[:5])
    conversation.space = Space.from_db(connection.alias,
                                       ["id", "public_id", "slug", "name", "visibility", "send_policy", "archived"],
                                       [row[2], *row[5:10], bool(row[10])])
    conversation.caller_role = row[11]
    if conversation.caller_role is None and conversation.space.visibility != Space.Visibility.OPEN:
        raise NotFound()
    return conversation


# --- who may write -----------------------------------------------------------

LOOK_UP_ROLE = object()


def require_sender(space: Space, actor: Member, role: str | None = LOOK_UP_ROLE) -> None:
    """Writing in a space needs an active, non-observer membership. `role`
    is the actor's active role when the caller has already read it."""
    if role is LOOK_UP_ROLE:
        membership = active_membership(space, actor)
        role = membership.role if membership else None
    _require_writer(role, space.archived)


def _require_writer(role: str | None, archived: bool) -> None:
    if role is None or role == Membership.Role.OBSERVER:
        raise Forbidden("Only active members (not observers) may write in this space.")
    if archived:
        raise Conflict("The space is archived.")


def recheck_writes(authors: list[tuple[int, int]], recipients: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """The parties of message writes again, read fresh, as the last statement
    of the writes, which hold the log head lock by then (inbox.writes): a
    removal that committed after the send looked them up is seen here, and
    one that commits later must wait for the head, so its `member.removed`
    follows the message (tests/inbox/test_send_races.py).
    - `authors`, (space id, author id): require_sender again; no message
      lands after its author's removal.
    - `recipients`, (space id, member id): returned, those removed from the
      space since (a recipient was never one removed when looked up); no
      message lands in their inbox, and the caller writes again without them.
    One plain read for all of them."""
    pairs = sorted({*authors, *recipients})
    values = ", ".join(["(%s, %s)"] * len(pairs))
    rows = plain_rows(
        f"SELECT ms.space_id, ms.member_id, ms.status, ms.role, s.archived FROM {Membership._meta.db_table} ms "
        f"JOIN {Space._meta.db_table} s ON s.id = ms.space_id "
        f"WHERE (ms.space_id, ms.member_id) IN (VALUES {values}) AND ms.status IN (%s, %s)",
        [*(n for pair in pairs for n in pair), Membership.Status.ACTIVE.value, Membership.Status.REMOVED.value])
    found = {(space_id, member_id): (status, role, archived) for space_id, member_id, status, role, archived in rows}
    for pair in authors:
        status, role, archived = found.get(pair, (None, None, False))
        _require_writer(role if status == Membership.Status.ACTIVE else None, archived)
    return {pair for pair in recipients if found.get(pair, (None,))[0] == Membership.Status.REMOVED}
