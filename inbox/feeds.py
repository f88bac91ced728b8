"""Reading the event log: the space feed, the inbox feed and snapshots.

Every read is one indexed range scan from the cursor's position, so a page
costs the same with a thousand or a million events in the log.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connection
from django.db.models import Exists, OuterRef, Q

from controlplane.access import participant_conversations, readable_spaces, reads_as_member
from controlplane.db import Compiled, padded, unprepared_rows
from controlplane.errors import ResyncRequired
from controlplane.log import log_head
from controlplane.models import Event, EventAddressee, Member, Space
from inbox.models import InboxItem, Recipient

FEED_PAGE_MAX = 100


@dataclass(frozen=True)
class FeedPage:
    events: list[Event]
    position: int  # the next cursor's position
    has_more: bool


def start_position(after: int | None) -> int:
    """Where a read without a cursor starts: at the oldest retained event."""
    return log_head().floor if after is None else after


def check_retained(after: int | None) -> None:
    """410 RESYNC_REQUIRED when the cursor is below the retention floor.

    Checked after reading the page: the floor is raised (and committed)
    before any event is deleted, so a prune that removed events this read
    should have returned is always seen here."""
    if after is None:
        return
    floor = log_head().floor
    if after < floor:
        raise ResyncRequired(details={"floor": floor})


def _page(positions: list[int], after: int, limit: int) -> FeedPage:
    """The events at `positions` (a page's and one more, in order)."""
    has_more = len(positions) > limit
    positions = positions[:limit]
    rows = list(Event.objects.filter(position__in=padded(positions)).select_related("space", "conversation", "actor")
                .order_by("position")) if positions else []
    return FeedPage(rows, positions[-1] if positions else after, has_more)


def space_feed(space: Space, viewer: Member | None, after: int | None, limit: int) -> FeedPage:
    """Events of `space` that `viewer` may see: everything except direct and
    group conversation events they do not take part in. The caller has
    checked that `viewer` can read the space. The positions are planned for
    their space on every read (`unprepared_rows`): a small space's page
    comes from its own index, a busy space's from the log's."""
    start = start_position(after)
    visible = Q(restricted=False)
    if viewer is not None:
        visible |= Q(conversation__in=participant_conversations(viewer))
    positions = (Event.objects.filter(visible, space=space, position__gt=start).order_by("position")
                 .values_list("position")[: limit + 1])
    page = _page([position for position, in unprepared_rows(positions)], start, limit)
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


def _addressed_positions(viewer: Member, after: int, limit: int) -> list[int]:
    if not reads_as_member(viewer):  # the rare reader the rule reads no space for
        return list(_addressed(viewer, after, limit))
    compiled = _ADDRESSED.get(limit)
    if compiled is None:  # built for a stand-in who reads as a member, as `viewer` does
        compiled = _ADDRESSED[limit] = Compiled(
            lambda member, at: _addressed(Member(pk=member, status=Member.Status.ACTIVE), at, limit))
    with connection.cursor() as cursor:
        cursor.execute(*compiled.sql(viewer.pk, after))
        return [position for position, in cursor.fetchall()]


def inbox_feed(viewer: Member, after: int | None, limit: int) -> FeedPage:
    """Events addressed to `viewer` in spaces they can still read, and those
    of no space (notices about their own subscriptions)."""
    start = start_position(after)
    page = _page(_addressed_positions(viewer, start, limit), start, limit)
    check_retained(after)
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
