"""Conversation history as the web app shows it: pages of messages by
position, rendered to HTML once, for the page, the history pager, the
composer's answer and the live socket alike."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connection
from django.template.loader import render_to_string

from controlplane.access import readers_then_query, readers_then_result
from controlplane.db import datetime_from_db, plain_rows
from controlplane.models import Member
from inbox.models import Message
from inbox.render import withheld_bodies, withheld_positions

HISTORY_PAGE = 50
LIVE_BATCH = 100


@dataclass(frozen=True)
class Author:
    handle: str
    display_name: str


@dataclass(frozen=True)
class Row:
    """What the page shows of a message (the template also takes a Message)."""
    position: int
    public_id: str
    body: str
    created_at: dt.datetime
    author: Author


def _query(conversation_id: int, *, below: int | None = None, above: int | None = None,
           at: list[int] | None = None, limit: int) -> tuple[str, list]:
    """The query of up to `limit` messages, positioned below `below` (newest
    first), above `above` or `at` some positions (oldest first), with its
    parameters; its rows become Rows with `_row`. Plain SQL: a live stream
    reads on after every commit, and building the ORM's query and model
    instances cost more than running it."""
    quote = connection.ops.quote_name
    bound, order, params = "", " DESC", [conversation_id]
    if below is not None:
        bound, params = " AND m.position < %s", [*params, below]
    if above is not None:
        bound, order, params = " AND m.position > %s", "", [*params, above]
    if at is not None:
        bound, order, params = f" AND m.position IN ({', '.join(['%s'] * len(at))})", "", [*params, *at]
    return (f"SELECT m.position, m.public_id, m.body, m.created_at, a.handle, a.display_name "
            f"FROM {quote(Message._meta.db_table)} m JOIN {quote(Member._meta.db_table)} a ON a.id = m.author_id "
            f"WHERE m.conversation_id = %s{bound} ORDER BY m.position{order} LIMIT %s", [*params, limit])


QUERY_WIDTH = 6  # the columns of `_query`


def _row(values) -> Row:
    position, public_id, body, created_at, handle, display_name = values
    return Row(position, public_id, body, datetime_from_db(created_at), Author(handle, display_name))


def _rows(conversation_id: int, **bounds) -> list[Row]:
    return [_row(values) for values in plain_rows(*_query(conversation_id, **bounds))]


def before(conversation_id: int, position: int | None, limit: int = HISTORY_PAGE) -> tuple[list[Row], bool]:
    """The `limit` messages before `position` (the newest without one), oldest
    first, and whether older ones remain."""
    rows = _rows(conversation_id, below=position, limit=limit + 1)
    return rows[:limit][::-1], len(rows) > limit


def withheld_from(conversation_id: int, send_policy: str | None, position: int) -> list[Row]:
    """The messages at or after `position` whose bodies are withheld (the
    newest HISTORY_PAGE × 10), oldest first: what a live page shows them as
    once a grant's barrier starts (web.streams.WITHHELD_FRAME)."""
    positions = withheld_positions(conversation_id, send_policy, position, HISTORY_PAGE * 10)
    return _rows(conversation_id, at=positions, limit=len(positions)) if positions else []


def readers_and_after_query(conversation_id: int, members: set[int], position: int) -> tuple[str, list]:
    """A live stream's pass, in one round trip: which of `members` may read
    the conversation now and its space's send policy
    (controlplane.access.conversation_readers) and, if any of them may, up
    to LIVE_BATCH messages after `position`. `readers_and_after` reads its
    rows. Positions are assigned in commit order, so a reader that has seen
    `position` never misses a later commit below it: reading on from the
    last one seen leaves no gap."""
    return readers_then_query(conversation_id, members, _query(conversation_id, above=position, limit=LIVE_BATCH),
                              QUERY_WIDTH)


def readers_and_after(rows: list[tuple]) -> tuple[set[int], str | None, list[Row]]:
    """The readers, the send policy and the messages, oldest first, of the
    rows of `readers_and_after_query`."""
    readers, send_policy, found = readers_then_result(rows)
    return readers, send_policy, sorted((_row(values) for values in found), key=lambda row: row.position)


def render_rows(send_policy: str | None, messages: list, withheld: set[str] | None = None) -> list[dict]:
    """Each message (a Row or a Message) as {position, id, html}, for a
    space with `send_policy`. A message whose authority was revoked keeps its
    place without its body, as in the feeds (`withheld`: the ids of those,
    when the caller knows them already)."""
    if withheld is None:
        withheld = withheld_bodies((m.public_id, send_policy) for m in messages)
    return [{"position": m.position, "id": m.public_id,
             "html": render_to_string("web/_message.html", {"m": m, "withheld": m.public_id in withheld})}
            for m in messages]
