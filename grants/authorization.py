"""The authorization decision for a send: the one place send policy lives.

Under `open`, membership is the authority. Under `explicit_only`, discovery
creates no authority: every recipient needs an active grant of the space
(project, pair, or one-message for exactly this sender, recipient and key).
The grants used are locked until the send commits, exclusively: sends
under one grant queue for it in turn, and so does a revocation, which takes
the same row. (Share locks would let sends go on together, but on
PostgreSQL a steady stream of share lockers can starve the revocation
waiting for the row; the suite's race test showed it.) A send racing a
revocation is therefore admitted before its fence or sees the grant no
longer active, never half.
"""
from __future__ import annotations

from django.db.models import F, Q

from controlplane.clock import now
from controlplane.errors import GrantRequired
from controlplane.models import Member, Space
from grants.models import Grant

# When more than one grant covers a recipient, the narrowest is used: a
# one-message grant made for exactly this message is consumed rather than
# left to sit unused, and a pair grant records more than the project grant.
_PREFERENCE = {Grant.Kind.ONE_MESSAGE: 0, Grant.Kind.PAIR: 1, Grant.Kind.PROJECT: 2}


def _usable() -> Q:
    return Q(status=Grant.Status.ACTIVE) & (Q(expires_at__isnull=True) | Q(expires_at__gt=now()))


def _chosen(grants: list[Grant], author_pk: int, pks: list[int]) -> dict[int, Grant]:
    """Of `grants`, the one each of `pks` is sent under by `author_pk`, in
    order of preference. A project grant covers every member but its
    creator: no grant authorizes the one who made it (SPEC §5); a pair or
    one-message grant covers its recipient for its sender."""
    chosen: dict[int, Grant] = {}
    mine = [g for g in grants if (g.created_by_id != author_pk if g.kind == Grant.Kind.PROJECT
                                  else g.sender_id == author_pk)]
    for grant in sorted(mine, key=lambda g: (_PREFERENCE[g.kind], g.pk)):
        for pk in pks if grant.kind == Grant.Kind.PROJECT else [grant.recipient_id]:
            chosen.setdefault(pk, grant)
    return chosen


def authorize_send(space: Space, author: Member, recipients: list[Member], *,
                   idempotency_key: str | None) -> dict[int, Grant]:
    """Decide whether `author` may send to every one of `recipients`.

    Returns the grant each recipient's copy is sent under, keyed by member
    pk (empty under `open`), or raises GrantRequired naming the recipients
    no grant covers. Under `explicit_only` call it inside the send's
    transaction: the grants stay locked until it commits.
    """
    if space.send_policy == Space.SendPolicy.OPEN or not recipients:
        return {}
    pks = [r.pk for r in recipients]
    in_space = Grant.objects.filter(_usable(), space=space)
    covering = ((Q(kind=Grant.Kind.PROJECT) & ~Q(created_by_id=author.pk))
                | Q(kind=Grant.Kind.PAIR, sender=author, recipient_id__in=pks))
    if idempotency_key:
        covering |= Q(kind=Grant.Kind.ONE_MESSAGE, sender=author, recipient_id__in=pks,
                      idempotency_key=idempotency_key, message__isnull=True)
    # Locked in id order, so concurrent senders never deadlock. (SQLite
    # serializes writers anyway; it has no row locks.)
    chosen = _chosen(list(in_space.filter(covering).order_by("id").select_for_update(no_key=True)), author.pk, pks)
    uncovered = [r for r in recipients if r.pk not in chosen]
    if uncovered:
        raise GrantRequired(details={"recipients": [f"@{r.handle}" for r in uncovered]},
                            uncovered=uncovered)
    return chosen


def uncovered_each(space: Space, authors: list[Member], recipients: list[Member]) -> dict[int, list[Member]]:
    """For each of `authors` (by pk) that standing grants (project, pair)
    do not let send to every one of `recipients` (themselves aside), those
    they do not: `authorize_send`'s rule (`_chosen`) for many authors at
    once. Every grant that could cover any of them is locked in one
    statement, in id order, until the caller commits: deciding author by
    author, two callers each held one author's grants and waited for the
    other's."""
    if space.send_policy == Space.SendPolicy.OPEN or not authors:
        return {}
    grants = list(Grant.objects.filter(_usable(), space=space)
                  .filter(Q(kind=Grant.Kind.PROJECT) | Q(kind=Grant.Kind.PAIR, sender_id__in=[a.pk for a in authors],
                                                         recipient_id__in=[r.pk for r in recipients]))
                  .order_by("id").select_for_update(no_key=True))
    uncovered = {}
    for author in authors:
        others = [r for r in recipients if r.pk != author.pk]
        chosen = _chosen(grants, author.pk, [r.pk for r in others])
        if left := [r for r in others if r.pk not in chosen]:
            uncovered[author.pk] = left
    return uncovered


def consume_one_message_grants(authority: dict[int, Grant], message) -> None:
    """Bind the one-message grants a send used to its message: consumed, they
    authorize nothing else. In the send's transaction, under their locks."""
    ids = {g.pk for g in authority.values() if g.kind == Grant.Kind.ONE_MESSAGE}
    if ids:
        Grant.objects.filter(pk__in=ids, message__isnull=True).update(message=message)


class GrantPolicy:
    """The `explicit_only` send policy, as inbox.authority asks for it
    (registered in GrantsConfig.ready)."""

    authorize = staticmethod(authorize_send)
    uncovered_each = staticmethod(uncovered_each)
    consume = staticmethod(consume_one_message_grants)

    @staticmethod
    def request_approval(message, uncovered: list[Member], collective: dict | None = None) -> dict:
        from grants.approvals import retain_for_approval
        from grants.render import render_approval_request
        return render_approval_request(retain_for_approval(message, uncovered, collective))

    @staticmethod
    def inactive() -> Q:
        return inactive_authority()

    @staticmethod
    def lock_active(grant_id: int) -> bool:
        return Grant.objects.select_for_update(no_key=True).get(pk=grant_id).is_active


def inactive_authority() -> Q:
    """Recipient rows whose authority is no longer active: their grant has
    left `active` (or its generation moved on), or its expiry has passed."""
    return Q(grant__isnull=False) & (~Q(grant__status=Grant.Status.ACTIVE)
                                     | ~Q(grant__generation=F("grant_generation"))
                                     | Q(grant__expires_at__lte=now()))
