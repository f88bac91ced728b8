"""Reading the event log: the space feed, the inbox feed and snapshots.

Every read is one indexed range scan from the cursor's position, so a page
costs the same with a thousand or a million events in the log.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from django.db import connection
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q

from controlplane.access import participant_conversations, readable_spaces, reads_as_member
from controlplane.db import Compiled, ids_in, model_columns, models_from_row, run_steps, unprepared_rows
from controlplane.errors import ResyncRequired
from controlplane.log import log_head_steps
from controlplane.models import Conversation, Event, EventAddressee, Member, Space
from inbox.models import InboxItem, Recipient

FEED_PAGE_MAX = 100


# A page's events as JSON, at most (a page holds at least one event). A
# hundred messages of 8 KiB of body and 8 KiB of related paths, each
# character one JSON writes as six (`\u0001`), made one page of 9.6 MB, for
# anyone reading an open space, and each held while its client read it.
PAGE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class FeedPage:
    events: list[Event]
    position: int  # the next cursor's position
    has_more: bool


def within_bytes(rendered: list[dict], page: FeedPage) -> tuple[list[dict], int, bool]:
    """The rendered events of `page` that fit PAGE_BYTES as the API writes
    them (compact UTF-8 JSON), with the cursor's position and `has_more`:
    cut short, the page ends at its last event kept, and has more. (Sized
    whole first: event by event costs twice as much, on the rare page that
    needs it.)"""
    if len(json.dumps(rendered, ensure_ascii=False, separators=(",", ":")).encode()) <= PAGE_BYTES:
        return rendered, page.position, page.has_more
    size = 0
    for count, event in enumerate(rendered):
        size += len(json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode())
        if count and size > PAGE_BYTES:
            return rendered[:count], rendered[count - 1]["position"], True
    return rendered, page.position, page.has_more


def start_position_steps(after: int | None):
    """Where a read without a cursor starts: at the oldest retained event."""
    return (yield from log_head_steps()).floor if after is None else after


def check_retained(after: int | None) -> None:
    """410 RESYNC_REQUIRED when the cursor is below the retention floor, or
    its reader may have read events a restore from a backup lost
    (`LogHead.resync_needed`): read on, it would never learn of them.

    Checked after reading the page: the floor is raised (and committed)
    before any event is deleted, so a prune that removed events this read
    should have returned is always seen here."""
    run_steps(check_retained_steps(after))


def check_retained_steps(after: int | None):
    if after is None:
        return
    head = yield from log_head_steps()
    if head.resync_needed(after):
        if after < head.floor:
            raise ResyncRequired(details={"floor": head.floor, "reason": "pruned"})
        raise ResyncRequired("The cursor is past the log as restored from a backup, which lost events it had read; "
                             "take a fresh snapshot.", details={"floor": head.floor, "reason": "restored"})


# An event's relations a page loads with it, as select_related would.
_RELATED = (("space", Space, "s"), ("conversation", Conversation, "c"), ("actor", Member, "a"))


def _page_steps(positions: list[int] | tuple[str, list], after: int, limit: int, *, related: bool = True):
    """A page of events after `after`, in order, with their space,
    conversation and actor unless not `related`: the events at `positions`,
    the page's and one more to tell whether more follow, given as a list or
    as a query (sql, params) of them, read with the events in one round
    trip. Steps (controlplane.db.run_steps), in plain SQL."""
    if isinstance(positions, list):
        if not positions:
            return FeedPage([], after, False)
        known = (positions[:limit][-1], len(positions) > limit)  # the page's end, whatever a prune removed
        condition, params = ids_in("e.position", positions[:limit])
    else:
        known = None
        condition, params = f"e.position > %s AND e.position IN ({positions[0]})", [after, *positions[1]]
    quote = connection.ops.quote_name
    joined = _RELATED if related else ()
    columns = ", ".join([model_columns(Event, "e"), *(model_columns(model, alias) for _, model, alias in joined)])
    joins = "".join(f" LEFT JOIN {quote(model._meta.db_table)} {alias} ON {alias}.id = e.{name}_id"
                    for name, model, alias in joined)
    rows = yield (f"SELECT {columns} FROM {quote(Event._meta.db_table)} e{joins} WHERE {condition} "
                  f"ORDER BY e.position"), params
    events = []
    for row in rows[:limit]:
        event, *relations = models_from_row([Event, *(model for _, model, _ in joined)], row)
        for (name, _, _), instance in zip(joined, relations):
            if instance is not None:
                setattr(event, name, instance)
        events.append(event)
    position, has_more = known or (events[-1].position if events else after, len(rows) > limit)
    return FeedPage(events, position, has_more)


# How many of a space's events one page looks at, seen or not. Others'
# direct and group messages are not the viewer's to see: a page that looked
# past all of them cost more the more there were, and its cursor stayed
# before them, so every later poll (and a long-poll's every re-read) looked
# past them all again; two members of an open space could slow every other
# reader's feed by talking to each other.
SCAN_MAX = 1000


def space_feed(space: Space, viewer: Member | None, after: int | None, limit: int) -> FeedPage:
    """Events of `space` that `viewer` may see: everything except direct and
    group conversation events they do not take part in. The caller has
    checked that `viewer` can read the space. A page looks at SCAN_MAX of
    the space's events at most. Its cursor is at its last event, or where it
    was given for an empty page (SPEC §6), unless the page looked at all it
    could: then it moves past those (`has_more`), or the next read would
    look at the same ones. (A cursor that moved on past events the reader
    may not see told anyone polling an open space when its members wrote
    to each other.) The positions are planned for their space on every read
    (`unprepared_rows`): a small space's page comes from its own index, a
    busy space's from the log's."""
    # Both reads below end at the log head as it is now: every event up to it
    # has committed (controlplane.log), so the second, which moves the cursor,
    # can pass no event the first did not see (one committed in between).
    log = run_steps(log_head_steps())
    start, head = log.floor if after is None else after, log.position
    visible = Q(restricted=False)
    if viewer is not None:
        visible |= Q(conversation__in=participant_conversations(viewer))
    looked, params = (Event.objects.filter(space=space, position__gt=start, position__lte=head).order_by("position")
                      .annotate(seen=ExpressionWrapper(visible, output_field=BooleanField()))
                      .values_list("position", "seen")[:SCAN_MAX]).query.sql_with_params()
    # Read as it goes: a page's worth of visible events ends the scan, as does SCAN_MAX looked at.
    positions = [position for position, in unprepared_rows(
        (f'SELECT s."position" FROM ({looked}) s WHERE s.seen LIMIT {limit + 1}', params))]
    page = run_steps(_page_steps(positions, start, limit))
    if len(positions) <= limit:  # short of a page: did it look at all it could?
        ((end, count),) = unprepared_rows((f'SELECT MAX(s."position"), COUNT(*) FROM ({looked}) s', params))
        if count == SCAN_MAX:
            page = FeedPage(page.events, end, True)
    check_retained(after)
    return page


def _addressed(viewer: Member, after: int, limit: int):
    """The positions of the events addressed to `viewer` after `after`, in
    spaces they can still read and of no space, in order: a page and one more."""
    return (EventAddressee.objects.filter(member=viewer, event_id__gt=after)
            .filter(Q(space__in=readable_spaces(viewer)) | Q(space__isnull=True))
            .order_by("event_id").values_list("event_id", flat=True)[: limit + 1])


# `_addressed` for an active reader, compiled once per page size: MCP inbox
# streams read the inbox feed on every nudge, and building the query cost
# more than running it.
_ADDRESSED: dict[int, Compiled] = {}


def _addressed_query(viewer: Member, after: int, limit: int) -> tuple[str, list]:
    """`_addressed`'s SQL and parameters: compiled once per page size for a
    reader who reads as a member."""
    if not reads_as_member(viewer):  # the rare reader the rule reads no space for
        return _addressed(viewer, after, limit).query.sql_with_params()
    compiled = _ADDRESSED.get(limit)
    if compiled is None:  # built for a stand-in who reads as a member, as `viewer` does
        compiled = _ADDRESSED[limit] = Compiled(
            lambda member, at: _addressed(Member(pk=member, status=Member.Status.ACTIVE), at, limit))
    return compiled.sql(viewer.pk, after)


def inbox_feed(viewer: Member, after: int | None, limit: int) -> FeedPage:
    """Events addressed to `viewer` in spaces they can still read, and those
    of no space (notices about their own subscriptions)."""
    return run_steps(inbox_feed_steps(viewer, after, limit))


def inbox_feed_steps(viewer: Member, after: int | None, limit: int, *, related: bool = True):
    """`inbox_feed` as steps (controlplane.db.run_steps): an MCP inbox
    stream reads it on its event loop, without the events' relations."""
    start = yield from start_position_steps(after)
    page = yield from _page_steps(_addressed_query(viewer, start, limit), start, limit, related=related)
    yield from check_retained_steps(after)
    return page


SNAPSHOT_PAGE_MAX = 100


def unresolved_page(viewer: Member, *, high_watermark: int, as_of: dt.datetime, after: int,
                    limit: int | None = None):
    """One page of `viewer`'s messages that were unresolved at `as_of` (the
    snapshot's issue time) at or below its high watermark, in position
    order, from spaces they can still read, leaving out those their firewall
    holds or has not classified yet: `(recipient rows, has_more)`. Every
    page of one snapshot reads the same moment, so a message resolved or
    acknowledged while a client pages keeps the state it had (see
    `state_as_of`)."""
    limit = limit or SNAPSHOT_PAGE_MAX
    screened = InboxItem.objects.filter(member=viewer, message=OuterRef("message"),
                                        admission__in=[InboxItem.Admission.HELD, InboxItem.Admission.UNCLASSIFIED])
    rows = list(Recipient.objects.filter(~Exists(screened), member=viewer, position__gt=after,
                                         position__lte=high_watermark,
                                         message__space__in=readable_spaces(viewer))
                .filter(Q(resolved_at__isnull=True) | Q(resolved_at__gt=as_of))
                .filter(Q(rejected_at__isnull=True) | Q(rejected_at__gt=as_of))
                .select_related("message__space", "message__conversation", "message__author", "message__reply_to")
                .order_by("position")[: limit + 1])
    return rows[:limit], len(rows) > limit


def state_as_of(row: Recipient, as_of: dt.datetime) -> tuple[str, dt.datetime | None]:
    """A recipient row's (state, acknowledged_at) as they were at `as_of`."""
    if row.acknowledged_at is not None and row.acknowledged_at <= as_of:
        return Recipient.State.ACKNOWLEDGED, row.acknowledged_at
    return Recipient.State.PENDING, None
