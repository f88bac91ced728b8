"""The outbox: wakes are written in the same transaction as the events that
cause them.

After an event is appended (and its position taken under the log head lock),
every active subscription it qualifies for gets its open delivery's
`through` moved up to it, or a new open delivery chained to the previous
one's `through` and due after the subscription's debounce window. Both
happen in the event's own transaction, so a committed event always has its
wake, and a rolled-back one never does. The kick that follows the commit is
only a nudge; the once-a-minute sweep is the guarantee. A wake also keeps
the request ids of the sends it carries (controlplane.tracing), which its
attempts' log lines name.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Iterable

from django.db import connection

from controlplane.access import readers_of_conversations, receiving_sql
from controlplane.clock import now
from controlplane.db import ids_in, plain_rows
from controlplane.log import NewEvent
from webhooks import due, mcp
from webhooks.models import REQUEST_IDS_MAX, Delivery, Subscription, new_delivery_id

_SUBSCRIPTIONS = connection.ops.quote_name(Subscription._meta.db_table)


def _active_subscriptions(space_ids: set[int], members: set[int]) -> list[tuple]:
    """(id, kind, owner, space, conversation ids, exclude_self, debounce) of the
    active subscriptions these spaces or addressees might wake: one plain
    statement, run for every append, that almost always finds nothing. A
    space subscription of an owner who no longer receives from its space
    (removed from it, or pending again) wakes for nothing until they do
    (`receiving_sql`)."""
    clauses, params = [], []
    if space_ids:
        # Only an owner's who receives from the space: others' wakes would be cancelled as they are sent
        # (SPEC §3), and the cancelled deliveries in their history told them when the space was busy.
        clauses.append(f"(kind = 'space' AND space_id IN ({', '.join(['%s'] * len(space_ids))}) "
                       f"AND {receiving_sql(f'{_SUBSCRIPTIONS}.space_id', f'{_SUBSCRIPTIONS}.owner_id')})")
        params += sorted(space_ids)
    if members:
        clauses.append(f"(kind IN ('inbox', 'item') AND owner_id IN ({', '.join(['%s'] * len(members))}))")
        params += sorted(members)
    if not clauses:
        return []
    sql = (f"SELECT id, kind, owner_id, space_id, conversation_ids, exclude_self, debounce_ms FROM {_SUBSCRIPTIONS} "
           f"WHERE status = 'active' AND ({' OR '.join(clauses)}) ORDER BY id")
    return plain_rows(sql, params)


def _qualifies(row: tuple, event: NewEvent, readers: dict[int, set[int]]) -> bool:
    _, kind, owner, space_id, conversation_ids, exclude_self, _ = row
    if kind in (Subscription.Kind.INBOX, Subscription.Kind.ITEM):
        return owner in event.addressees
    if event.space_id != space_id or (exclude_self and event.actor_id == owner):
        return False
    if event.targets is not None and owner not in event.targets:
        return False
    if conversation_ids is not None and event.conversation_id not in conversation_ids:
        return False
    # Direct and group events only for subscribers who may read them.
    return not event.restricted or owner in readers.get(event.conversation_id, ())


def enqueue_wakes(entries: Iterable[tuple[int, NewEvent]]) -> None:
    """Record the wakes `entries` (position, event) cause. Call it in the
    events' transaction, after their positions are taken."""
    entries = list(entries)
    rows = _active_subscriptions({e.space_id for _, e in entries if e.space_id},
                                 {m for _, e in entries for m in e.addressees})
    if not rows:
        return
    rows = [(*row[:4], json.loads(row[4]) if isinstance(row[4], str) else row[4], *row[5:]) for row in rows]
    restricted = {e.conversation_id for _, e in entries if e.restricted and e.conversation_id}
    owners = {row[2] for row in rows if row[1] == Subscription.Kind.SPACE}
    readers = readers_of_conversations(restricted, owners) if restricted and owners else {}
    for row in rows:
        qualifying = [(position, event) for position, event in entries if _qualifies(row, event, readers)]
        if qualifying and row[1] == Subscription.Kind.ITEM:
            mcp.offer([row[0]])  # one pending item at a time, chosen when claimed
        elif qualifying:
            extend_or_open(row[0], max(position for position, _ in qualifying), debounce_ms=row[6],
                           request_ids=[event.request_id for _, event in qualifying])


_COUNTING = (f"SELECT id, debounce_ms FROM {_SUBSCRIPTIONS} WHERE status = 'active' AND kind = 'inbox' "
             f"AND mcp_name = %s AND ")


def offer_to_joiners(entries: Iterable[tuple[int, NewEvent]]) -> None:
    """A member who joins a space (again) has the items of it that waited
    for them pushed at once: while they were away their item subscriptions'
    offers found nothing deliverable, and the items waited for the minute's
    sweep (webhooks.mcp.offer_waiting, as a reinstatement does). Membership
    changes are rare: the loop over a send's events finds none."""
    for member_id in {event.member_id for _, event in entries if event.kind == "member.joined"}:
        mcp.offer_waiting(member_id)


def acknowledged(members: set[int]) -> None:
    """An acknowledgement lowered these members' pending counts without
    appending an event (inbox.mailbox's acknowledged hook): each active
    `inbox.pending` push of theirs gets a wake, which reads the count when
    it is sent (one already open carries it). One plain statement, run for
    every acknowledgement, that almost always finds nothing. In the
    acknowledgement's transaction, except after an owner's on PostgreSQL,
    one statement committed on its own: a crash between the two leaves
    the pushed count to the next change."""
    which, params = ids_in("owner_id", sorted(members))
    rows = plain_rows(_COUNTING + which, [mcp.PENDING, *params])
    if not rows:
        return
    at = now()
    Delivery.objects.bulk_create(
        [Delivery(subscription_id=pk, after_position=(after := last_through(pk)), through_position=after,
                  due_at=at + dt.timedelta(milliseconds=debounce_ms)) for pk, debounce_ms in rows],
        ignore_conflicts=True)  # an open one (one_open_delivery) already carries the count
    due.kick_on_commit()


def last_through(subscription_id: int) -> int:
    """Where the subscription's next wake starts: the previous wake's
    `through`, or the activation position for the first."""
    # Wakes are chained in id order (replays repeat an old range), so the
    # newest one ends where the next begins: one index probe, however long
    # the history.
    last = (Delivery.objects.filter(subscription_id=subscription_id, replay_of__isnull=True).order_by("-id")
            .values_list("through_position", flat=True).first())
    if last is not None:
        return last
    return Subscription.objects.filter(pk=subscription_id).values_list("activation_position", flat=True).get()


def hand_back(failed: Delivery) -> None:
    """A wake that failed as its subscription was suspended (not for good):
    its range never reached the receiver, so it goes back to the outbox for
    the resume's catch-up (SPEC §8). The wake opened after it (events that
    came during its retries) starts where it started; with none, a wake of
    its range is opened. Either waits, as every wake of a suspended
    subscription does, and the resume extends it to the head."""
    moved = Delivery.objects.filter(subscription_id=failed.subscription_id, state=Delivery.State.OPEN,
                                    after_position=failed.through_position).update(after_position=failed.after_position)
    if not moved:
        adapt = connection.ops.adapt_datetimefield_value
        with connection.cursor() as cursor:
            cursor.execute(_open_sql(), [new_delivery_id(), failed.subscription_id, failed.after_position,
                                         failed.through_position, Delivery.State.OPEN, adapt(now()), 0, adapt(now()),
                                         None])


def _fitting(request_ids: Iterable[str | None]) -> str:
    """The distinct ids, space-separated, as many as fit in the column."""
    fitting = ""
    for request_id in dict.fromkeys(filter(None, request_ids)):
        if len(fitting) + len(request_id) + 1 > REQUEST_IDS_MAX:
            break
        fitting = f"{fitting} {request_id}" if fitting else request_id
    return fitting


@functools.cache
def _extend_sql(with_request_ids: bool) -> str:
    """The open delivery's `through` moved up to `position`, and its request
    ids followed by the new ones while they fit (a window's first sends are
    kept). Plain SQL: it runs for every qualifying append, under the log
    head lock, where compiling the ORM's equivalent cost more than running it."""
    table = connection.ops.quote_name(Delivery._meta.db_table)
    ids = (", request_ids = CASE WHEN request_ids IS NULL THEN %(ids)s "
           "WHEN LENGTH(request_ids) <= %(room)s THEN request_ids || %(tail)s ELSE request_ids END"
           if with_request_ids else "")
    return (f"UPDATE {table} SET through_position = CASE WHEN through_position < %(position)s "
            f"THEN %(position)s ELSE through_position END{ids} "
            f"WHERE subscription_id = %(subscription)s AND state = 'open'")


@functools.cache
def _open_sql() -> str:
    """A new open delivery, unless one is open already (`one_open_delivery`)."""
    columns = ("public_id", "subscription_id", "after_position", "through_position", "state", "due_at", "attempts",
               "created_at", "request_ids")
    return (f"INSERT INTO {connection.ops.quote_name(Delivery._meta.db_table)} ({', '.join(columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT DO NOTHING")


def extend_or_open(subscription_id: int, position: int, *, debounce_ms: int,
                   request_ids: Iterable[str | None] = ()) -> None:
    """Move the open delivery's `through` to `position`, or open a new one
    chained to the last `through`. A delivery a worker has frozen meanwhile
    is no longer open, so the event goes to a new wake. The wake also
    records `request_ids` (the sends that caused it), in the same statement.

    An open delivery can also be made meanwhile without the log head (an
    acknowledgement's `inbox.pending` wake, `acknowledged`): the insert
    then waits for it to commit, makes nothing, and the event goes to it
    (before, the insert failed on the constraint: a 500 for a grant made
    while its recipient's pushed item was acknowledged)."""
    ids = _fitting(request_ids)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        while True:
            cursor.execute(_extend_sql(bool(ids)), {"position": position, "subscription": subscription_id,
                                                    "ids": ids, "tail": " " + ids,
                                                    "room": REQUEST_IDS_MAX - len(ids) - 1})
            if cursor.rowcount:
                return
            after = last_through(subscription_id)
            if position <= after:
                return
            at = now()
            cursor.execute(_open_sql(), [new_delivery_id(), subscription_id, after, position, Delivery.State.OPEN,
                                         adapt(at + dt.timedelta(milliseconds=debounce_ms)), 0, adapt(at),
                                         ids or None])
            if cursor.rowcount:
                due.kick_on_commit()
                return
