"""The three events, read from the database for `events/poll` and
`events/stream` (`read` on a request thread; `read_on_loop` from the
event loop, where the inbox's items are read on the loop's own connection).

- `org.switchboard/inbox.item`: one occurrence per inbox item that became
  available to the caller (a message addressed to them, a firewall
  admission, a notice), in the order their inbox feed heard of it. The
  cursor is a position of that feed; an item acknowledged since is skipped.
- `org.switchboard/inbox.pending`: `{pendingCount}` when it changed. Its
  cursor holds the count last told: a read with it reports the count only
  if it differs, so a client polling an unchanged inbox gets no events.
- `spaces.work.available`: `{space, event_range, url}` when the space's
  feed has events the caller may see after the cursor; the range's cursors
  are the caller's own space-feed cursors, ready for `GET url?cursor=after`.

A null cursor starts from now (SEP-3415): no events, a fresh cursor. A
cursor older than the retention floor starts at the floor instead and says
`truncated`; so does one older than `maxAgeMs` asks for (the first event
of that window).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import weakref
from dataclasses import dataclass, field

from django.db import connection

from controlplane.access import get_readable_space
from controlplane.clock import now, rfc3339
from controlplane.cursors import caller_id, pack_cursor, unpack_cursor
from controlplane.db import Compiled, db_call, model_from_row, padded, plain_rows, run_steps
from controlplane.loop_reads import loop_reads
from controlplane.errors import ResyncRequired
from controlplane.log import log_head_steps
from controlplane.models import Event, EventAddressee, Member, Space
from inbox import delivery, feeds
from inbox.models import InboxItem, Message
from inbox.render import sized_item_occurrence
from mcp_endpoint.schemas import Checked
from webhooks.mcp import ITEM, PENDING, WORK, work_data, work_task

FEED_PAGE = 100
MAX_EVENTS = 50
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class Batch:
    events: list[dict] = field(default_factory=list)
    cursor: str | None = None  # where the next read starts
    truncated: bool = False
    has_more: bool = False
    start: str | None = None  # where this read started (after a truncation: the floor)


@dataclass(frozen=True)
class Source(Checked):
    name: str
    description: str
    input_schema: dict
    payload_schema: dict
    delivery: tuple[str, ...] = ("poll", "push", "webhook")

    def stream_key(self, arguments: dict) -> str:
        return f"mcp:{self.name}" + "".join(f":{arguments[k]}" for k in ("space", "task_id") if arguments.get(k))


SOURCES = {source.name: source for source in [
    Source(ITEM, "One inbox item that became available to you (a direct or group message, a mention, a notice), "
                 "with its delivery token. Pushed items (events/subscribe) are acknowledged by your 2xx.",
           EMPTY,
           {"type": "object", "required": ["kind"], "properties": {
               "kind": {"enum": ["item", "reference"]}, "item": {"type": "object"},
               "deliveryToken": {"type": "string"}, "guidance": {"type": "string"},
               "insertedAt": {"type": "string"}, "itemKind": {"type": "string"}, "bytes": {"type": "integer"}}}),
    Source(PENDING, "How many items are pending in your inbox, whenever it changes (no content).",
           EMPTY,
           {"type": "object", "required": ["pendingCount"], "properties": {"pendingCount": {"type": "integer"}}}),
    Source(WORK, "Events you may see arrived in a space's feed: read them from event_range.after at url.",
           {"type": "object", "required": ["space"], "additionalProperties": False,
            "properties": {"space": {"type": "string", "maxLength": 64, "description": "The space's slug."},
                           "task_id": {"type": "string", "pattern": "^tsk_[a-z2-7]{16}$",
                                       "description": "Only this task's events and discussion."}}},
           {"type": "object", "required": ["space", "event_range", "url"], "properties": {
               "space": {"type": "string"}, "url": {"type": "string"}, "task_id": {"type": "string"},
               "event_range": {"type": "object", "required": ["after", "through"],
                               "properties": {"after": {"type": "string"}, "through": {"type": "string"}}}}}),
]}


def _space(member: Member, arguments: dict) -> Space:
    return get_readable_space(arguments["space"], member)


def interest(member: Member, source: Source, arguments: dict) -> dict:
    """The `controlplane.live.Interest` (its arguments) of the commits that
    may add to a stream. The inbox's: those addressed to the member (the
    committing process wakes its streams at once, as it does its live pages;
    the mailbox's group still brings what the log does not announce, such
    as acknowledgements). `spaces.work.available`: events in the space, and
    changes of who may read it (a reader who lost it is told)."""
    if source.name in (ITEM, PENDING):
        return {"addressed": {member.pk}}
    space = _space(member, arguments)
    return {"events_in": {space.pk}, "spaces": {space.pk}}


# An inbox.item cursor also holds the positions of up to this many items
# it passed while a revocation barrier held them back (`_items_steps`).
MAX_WAITING = 8


def _cursor(member: Member, source: Source, arguments: dict, position: int, waiting: list[int] = ()) -> str:
    return pack_cursor((position, *waiting), caller=caller_id(member), stream=source.stream_key(arguments))


def _position_steps(member: Member, source: Source, arguments: dict, cursor: str | None, max_age_ms: int | None):
    """Where to read after, the items passed that still wait (inbox.item),
    and whether that skips events (truncated): steps. `max_age_ms`
    (SEP-3415's `maxAgeMs`) moves a cursor up to the first event of that
    window; it means nothing without a cursor."""
    head = yield from log_head_steps()
    if cursor is None:
        return head.position, [], False
    position, *waiting = unpack_cursor(cursor, count=range(1, MAX_WAITING + 2), caller=caller_id(member),
                                       stream=source.stream_key(arguments))
    floor = head.floor
    if max_age_ms is not None:
        since = now() - dt.timedelta(milliseconds=min(max_age_ms, MAX_AGE_MS))
        rows = yield _first_since_sql(), [connection.ops.adapt_datetimefield_value(since)]
        floor = max(floor, rows[0][0] - 1 if rows else head.position)
    if position < floor:  # the rejections that would clear its notices' marks may be gone
        return floor, [p for p in waiting if p > 0], True
    if head.resync_needed(position):  # restored from a backup since: what the log holds now, again
        return head.floor, [], True
    return position, waiting, False


# The longest `maxAgeMs` weighed: any longer reaches past the log's retention.
MAX_AGE_MS = 366 * 24 * 3600 * 1000


def _first_since_sql() -> str:
    """The first event created at or after a time: one probe of the log's
    created_at index (events are created in about the order of their
    positions, a transaction's time apart at most)."""
    return f"SELECT position FROM {connection.ops.quote_name(Event._meta.db_table)} " \
           "WHERE created_at >= %s ORDER BY created_at LIMIT 1"


def read(member: Member, source: Source, arguments: dict, cursor: str | None, max_events: int,
         max_age_ms: int | None = None) -> Batch:
    if source.name == PENDING:
        return _pending(member, source, cursor)
    return run_steps(_read_steps(member, source, arguments, cursor, max_events, max_age_ms))


def _pending(member: Member, source: Source, cursor: str | None) -> Batch:
    """The pending count, when it differs from the one `cursor` holds; a
    null cursor starts from now (SEP-3415): no event, a fresh cursor."""
    count = delivery.pending_count(member)
    fresh = _cursor(member, source, {}, count)
    if cursor is None:
        return Batch(cursor=fresh, start=fresh)
    (told,) = unpack_cursor(cursor, count=1, caller=caller_id(member), stream=source.stream_key({}))
    if told == count:
        return Batch(cursor=cursor, start=cursor)
    return Batch([{**pending_occurrence(told, count, _last_addressed(member)), "cursor": fresh}], fresh, start=cursor)


def _last_addressed(member: Member) -> int:
    """The position of the newest event addressed to `member` (0: none),
    one probe of the inbox feed's index."""
    rows = plain_rows(f"SELECT MAX(event_id) FROM {connection.ops.quote_name(EventAddressee._meta.db_table)} "
                      "WHERE member_id = %s", [member.pk])
    return rows[0][0] or 0


# A member's polls and stream reads in one process, at most this many at
# once: the rest wait their turn, so one member's many large reads (each
# up to a feed page's megabyte) take turns with everyone else's instead of
# filling the event loop's connection and the loop itself.
READS_AT_ONCE = 2
_turns: weakref.WeakValueDictionary[int, asyncio.Semaphore] = weakref.WeakValueDictionary()


async def read_on_loop(member: Member, source: Source, arguments: dict, cursor: str | None,
                       max_events: int, max_age_ms: int | None = None) -> Batch:
    """`read` from an event loop, in the member's turn (READS_AT_ONCE): the
    inbox's items on the loop's own connection where there is one
    (controlplane.loop_reads), with no thread hop; the rest on a request
    thread."""
    turn = _turns.get(member.pk)
    if turn is None:
        turn = _turns[member.pk] = asyncio.Semaphore(READS_AT_ONCE)
    async with turn:
        if source.name == ITEM:
            return await loop_reads.run(_read_steps(member, source, arguments, cursor, max_events, max_age_ms))
        return await db_call(read)(member, source, arguments, cursor, max_events, max_age_ms)


def _read_steps(member: Member, source: Source, arguments: dict, cursor: str | None, max_events: int,
                max_age_ms: int | None = None):
    """`read` of the inbox's items or a space's work, as steps. A space's
    work is read with the ORM, inside them: only a request thread runs
    those (`read_on_loop`)."""
    after, waiting, truncated = yield from _position_steps(member, source, arguments, cursor, max_age_ms)
    try:
        if source.name == ITEM:
            batch = yield from _items_steps(member, source, after, waiting, max_events)
        else:
            batch = _work(member, source, arguments, after)
    except ResyncRequired:  # pruned while we read: start again at the floor
        after, truncated = (yield from log_head_steps()).floor, True
        batch = (yield from _items_steps(member, source, after, waiting, max_events)) if source.name == ITEM \
            else Batch()
    batch.truncated = truncated
    batch.start = cursor if cursor is not None and not truncated else _cursor(member, source, arguments, after,
                                                                              waiting)
    if batch.cursor is None:
        batch.cursor = batch.start
    return batch


def pending_occurrence(told: int, count: int, position: int) -> dict:
    """The count, changed from `told`, after the member's events up to
    `position`: a read retried from the same cursor gets the same id,
    whatever the rest of the log does meanwhile (the id names the change,
    not the count: a count can come back without an event of the member's)."""
    return {"eventId": f"pnd_{position}_{told}_{count}", "name": PENDING, "timestamp": rfc3339(now()),
            "data": {"pendingCount": count}}


def _items_steps(member: Member, source: Source, after: int, waiting: list[int], max_events: int):
    """Items the inbox feed made available after `after`: a message's own
    item sits at its message.created position and a notice at its event's;
    a firewall admission, or a rejection whose message is behind this page,
    is found through the message its event names. Steps
    (controlplane.db.run_steps).

    An item a revocation barrier withholds, or one waiting behind such an
    item of its conversation, is passed over and its position kept in the
    cursor (`waiting`): each read looks at those first, and offers each
    once it may be handed out, in its own place (before the later items of
    its conversation). Only a cursor with MAX_WAITING of them stops before
    the next (the other conversations wait too, until the barrier settles).
    A `rejected` notice is offered at its rejection's event, or, when the
    cursor kept its withheld item waiting, in that item's place, as
    `read_inbox` shows it; its position is then kept negated until the read
    passes the rejection's event, which would offer it again."""
    events, position, has_more, size, waiting = [], after, False, 0, list(waiting)

    def cursor() -> str:
        return _cursor(member, source, {}, position, waiting)

    for _ in range(5):  # bounded: feed pages whose events carry no item are skipped over
        page = yield from feeds.inbox_feed_steps(member, position, FEED_PAGE, related=False)
        named = {e.data["message"]["id"] if isinstance(e.data.get("message"), dict) else e.data.get("message"): e
                 for e in page.events if e.kind in ("message.admitted", "message.rejected")}
        surfaced = {e.position: e.position for e in page.events}
        surfaced.update((p, p) for p in waiting if p > 0)
        rejections = set()  # the places of the items whose rejection is on this page
        for public_id, message_position in ((yield _positions_of_messages(list(named))) if named else ()):
            if named[public_id].kind == "message.rejected":
                rejections.add(message_position)
                if message_position in waiting or -message_position in waiting:
                    continue  # offered in its place (or to be): the cursor passed its item withheld
            surfaced[message_position] = named[public_id].position
        rows = (yield _PENDING_AT.sql(member.pk, sorted(surfaced))) if surfaced else []
        found = [(model_from_row(InboxItem, row[:-1]), row[-1]) for row in rows]
        pending = {item.position for item, _ in found}
        waiting = [p for p in waiting if p < 0 or p in pending]  # the rest were acknowledged after all
        for event_position, _id, item, waits in sorted((surfaced[i.position], i.id, i, w) for i, w in found):
            kept = item.position in waiting
            if waits or item.admission == InboxItem.Admission.WITHHELD:
                if kept:
                    continue
                if len(waiting) >= MAX_WAITING:
                    return Batch(events, cursor())
                waiting.append(item.position)
                continue
            in_place = item.kind == "rejected" and event_position == item.position
            if in_place and not kept:
                continue  # it comes at its rejection's event, on a later page
            if len(events) >= max_events:  # what is left of this page comes next time
                return Batch(events, cursor(), has_more=True)
            occurrence, item_size = sized_item_occurrence(item, ITEM)
            if events and size + item_size > feeds.PAGE_BYTES:  # a feed page's bound, at least one item
                return Batch(events, cursor(), has_more=True)
            if kept:
                waiting.remove(item.position)
            if in_place:
                waiting.append(-item.position)
            position, size = max(position, event_position), size + item_size
            events.append({**occurrence, "cursor": cursor()})
        waiting = [p for p in waiting if not (p < 0 and -p in rejections)]  # read past their rejections
        position = page.position
        has_more = page.has_more
        if not has_more or len(events) >= max_events:
            break
    return Batch(events, cursor(), has_more=has_more)


def _positions_of_messages(public_ids: list[str]) -> tuple[str, list]:
    """The (public id, position) of the messages named, in plain SQL."""
    ids = padded(public_ids)
    return (f"SELECT m.public_id, m.position FROM {connection.ops.quote_name(Message._meta.db_table)} m "
            f"WHERE m.public_id IN ({', '.join(['%s'] * len(ids))})", ids)


# A member's pending items at some positions, admitted or withheld, and
# whether each waits behind a withheld one; compiled once per number of
# positions: a stream reads them on every nudge.
def _pending_at(member, positions):
    def pending(admission):  # one admission each: each half keeps its partial index
        return (InboxItem.objects.filter(member_id=member, admission=admission, state=InboxItem.State.PENDING,
                                         position__in=positions).annotate(waits=delivery.held_back())
                .values_list(*(f.attname for f in InboxItem._meta.concrete_fields), "waits"))

    return pending(InboxItem.Admission.ADMITTED).union(pending(InboxItem.Admission.WITHHELD), all=True)


_PENDING_AT = Compiled(_pending_at)


def _work(member: Member, source: Source, arguments: dict, after: int) -> Batch:
    space = _space(member, arguments)
    task = work_task(space, arguments)
    page = feeds.space_feed(space, member, after, FEED_PAGE)
    cursor = _cursor(member, source, arguments, page.position)
    seen = [e for e in page.events if task is None or e.conversation_id == task.conversation_id]
    if not seen:
        return Batch([], cursor, has_more=page.has_more)
    through = page.position
    return Batch([{
        "eventId": f"wrk_{space.public_id[4:]}_{through}", "name": WORK, "timestamp": rfc3339(seen[-1].created_at),
        "data": work_data(space, member, after, through, arguments), "cursor": cursor}], cursor,
        has_more=page.has_more)
