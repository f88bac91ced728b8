"""Writing a message with its recipients and its event.

A message's rows: the message, per recipient a handling row and an inbox
item, and its event with addressee rows.

On PostgreSQL the whole write is one statement (data-modifying CTEs from the
log head UPDATE through every insert), sent in one round trip. Unless the
caller holds a transaction, concurrent writes of one process share one
(group commit, `_GroupCommit`): one log head lock, one run of the append
hooks and one COMMIT for the lot. Elsewhere (SQLite) the same rows are
written through the ORM in one transaction. Both give the same rows and the
same commit-order guarantee (controlplane.log).
"""
from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass, field, replace

from django.db import connection, transaction

from controlplane.access import recheck_writes
from controlplane.live import kick_once_on_commit
from controlplane.log import NewEvent, append_events, appended, reserve_positions
from controlplane.models import Event, EventAddressee, LogHead, Member
from inbox import events, mailbox
from inbox.authority import Authority
from inbox.items import message_items
from inbox.models import InboxItem, Mailbox, MailboxShare, Message, Recipient


class _MissingLogHead(Exception):
    """The log head row is made by a migration; a flushed database lacks it."""


class RecipientsRemoved(Exception):
    """A recipient was removed from the space between the send's lookup of
    its recipients and its write: the write rolled back, and the send runs
    again, to whom it goes now (inbox.services.send_message)."""


def _recheck(writes: list[tuple[int, int, list[int]]]) -> None:
    """Each write's (space id, author id, recipient ids) read again, under
    the log head lock the writes hold (controlplane.access.recheck_writes):
    a removed author is refused; a removed recipient is RecipientsRemoved."""
    if recheck_writes([(space, author) for space, author, _ in writes],
                      [(space, member) for space, _, members in writes for member in members]):
        raise RecipientsRemoved()


def _after_commit(message: Message, recipients: list[Member], firewalled: set[int]) -> None:
    """Announce admitted items (ids and counts only: clients read the items
    through read_inbox) and kick classification for firewalled recipients."""
    for member in recipients:
        if member.pk in firewalled:
            kick_once_on_commit("inbox.tasks.classify_pending", member.pk)
        else:
            mailbox.announce_available(member, message_id=message.public_id)


def insert_message(message: Message, recipients: list[Member],
                   authority: dict[int, Authority] | None = None, *, collective: dict | None = None) -> Message:
    """Insert `message` (unsaved; every field but `position` set) with, per
    member of `recipients`, a handling row and an inbox item bound to its
    delivery token, both recording the authority (and its generation) in
    `authority` for that member, and the `message.created` event. Atomic.
    Raises MAILBOX_FULL, IntegrityError on a duplicate (author, key), or
    RecipientsRemoved.

    Either path ends in controlplane.log.appended: the registered append
    hooks (the webhook outbox) in the transaction, the log message after it."""
    authority = authority or {}
    items = message_items(message, recipients, collective=collective)
    for item in items:
        item.grant_id = authority[item.member_id].pk if item.member_id in authority else None
    insert = _insert_in_one_statement if connection.vendor == "postgresql" else _insert_with_orm
    firewalled = insert(message, recipients, items, authority)
    _after_commit(message, recipients, firewalled)
    return message


def _insert_with_orm(message: Message, recipients: list[Member], items: list[InboxItem],
                     authority: dict[int, Authority]) -> set[int]:
    with transaction.atomic():
        firewalled = mailbox.reserve(recipients, items[0].content_bytes if items else 0, sender_id=message.author_id)
        for item in items:
            if item.member_id in firewalled:
                item.admission = InboxItem.Admission.UNCLASSIFIED
        (message.position,) = reserve_positions(1)
        _recheck([(message.space_id, message.author_id, [r.pk for r in recipients])])
        message.save(force_insert=True)
        Recipient.objects.bulk_create(
            Recipient(message=message, member=r, position=message.position,
                      grant_id=authority[r.pk].pk if r.pk in authority else None,
                      grant_generation=authority[r.pk].generation if r.pk in authority else None)
            for r in recipients)
        for item in items:
            item.message, item.position = message, message.position
        InboxItem.objects.bulk_create(items)
        append_events([events.message_created(message, recipients, screened=firewalled)], [message.position])
    return firewalled


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@functools.cache
def _one_statement_sql() -> str:
    return f"""
WITH quota AS (
    INSERT INTO {_table(Mailbox)} AS box (member_id, pending_bytes, firewall)
    SELECT r.member_id, %(item_bytes)s, false FROM unnest(%(quota_members)s::bigint[]) AS r(member_id)
    WHERE %(item_bytes)s <= %(mailbox_limit)s
    ORDER BY r.member_id
    ON CONFLICT (member_id) DO UPDATE SET pending_bytes = box.pending_bytes + EXCLUDED.pending_bytes
        WHERE box.pending_bytes + EXCLUDED.pending_bytes <= %(mailbox_limit)s
    RETURNING member_id, firewall
), share AS (
    INSERT INTO {_table(MailboxShare)} AS share (member_id, sender_id, pending_bytes)
    SELECT r.member_id, %(author_id)s, %(item_bytes)s FROM unnest(%(quota_members)s::bigint[]) AS r(member_id)
    WHERE %(item_bytes)s <= %(share_limit)s
    ORDER BY r.member_id
    ON CONFLICT (member_id, sender_id) DO UPDATE SET pending_bytes = share.pending_bytes + EXCLUDED.pending_bytes
        WHERE share.pending_bytes + EXCLUDED.pending_bytes <= %(share_limit)s
    RETURNING member_id
), head AS (
    UPDATE {_table(LogHead)} SET position = position + 1
    WHERE id = 1 AND (SELECT count(*) FROM quota) = cardinality(%(quota_members)s::bigint[])
      AND (SELECT count(*) FROM share) = cardinality(%(quota_members)s::bigint[])
    RETURNING position
), msg AS (
    INSERT INTO {_table(Message)} (public_id, space_id, conversation_id, author_id, body, body_bytes, reply_to_id,
                                   related_paths, mentions, idempotency_key, fingerprint, position, created_at)
    SELECT %(public_id)s, %(space_id)s, %(conversation_id)s, %(author_id)s, %(body)s, %(body_bytes)s,
           %(reply_to_id)s, %(related_paths)s::jsonb, %(mentions)s::jsonb, %(idempotency_key)s, %(fingerprint)s,
           head.position, %(created_at)s
    FROM head
    RETURNING id, position
), recipients AS (
    INSERT INTO {_table(Recipient)} (message_id, member_id, position, state, grant_id, grant_generation)
    SELECT msg.id, r.member_id, msg.position, 'pending', r.grant_id, r.generation
    FROM msg, unnest(%(recipients)s::bigint[], %(grants)s::bigint[], %(generations)s::integer[])
        AS r(member_id, grant_id, generation)
), event AS (
    INSERT INTO {_table(Event)} (position, kind, space_id, conversation_id, actor_id, restricted, data, created_at)
    SELECT msg.position, %(kind)s, %(space_id)s, %(conversation_id)s, %(author_id)s, %(restricted)s,
           jsonb_set(%(data)s::jsonb, '{{message,position}}', to_jsonb(msg.position)), %(created_at)s
    FROM msg
), items AS (
    INSERT INTO {_table(InboxItem)} (member_id, token, kind, payload, content_bytes, message_id, conversation_id,
                                     position, state, created_at, admission, grant_id, sender_id)
    SELECT i.member_id, i.token, %(item_kind)s, %(item_payload)s::jsonb, %(item_bytes)s, msg.id,
           %(conversation_id)s, msg.position, 'pending', %(created_at)s,
           CASE WHEN quota.firewall THEN 'unclassified' ELSE 'admitted' END, i.grant_id, %(author_id)s
    FROM msg, unnest(%(recipients)s::bigint[], %(tokens)s::text[], %(grants)s::bigint[])
        AS i(member_id, token, grant_id)
    JOIN quota ON quota.member_id = i.member_id
), addressees AS (
    INSERT INTO {_table(EventAddressee)} (member_id, event_id, space_id)
    SELECT quota.member_id, msg.position, %(space_id)s FROM msg, quota WHERE NOT quota.firewall
)
SELECT (SELECT id FROM msg), (SELECT position FROM msg), ARRAY(SELECT member_id FROM quota),
       ARRAY(SELECT member_id FROM quota WHERE firewall), ARRAY(SELECT member_id FROM share)
"""


@dataclass
class _Write:
    """One message's statement, waiting for its turn in a group commit."""
    params: dict
    recipients: list[Member]
    event: NewEvent
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False   # set instead of a result: this thread commits the next group
    alone: bool = False  # set instead of a result: the group failed, write on your own
    result: tuple[int, int, set[int]] | None = None


def _execute(write: _Write) -> tuple[int, int, set[int], NewEvent]:
    """The statement, in the caller's transaction: (message id, position,
    screened members, the event as appended). Raises MAILBOX_FULL."""
    with connection.cursor() as cursor:
        cursor.execute(_one_statement_sql(), write.params)
        message_id, position, roomy, firewalled, shared = cursor.fetchone()
    recipients = write.recipients
    if len(roomy) < len(recipients) or len(shared) < len(recipients):
        everyone = {r.pk for r in recipients}
        raise mailbox.full(recipients, everyone - set(roomy), everyone - set(shared))
    if message_id is None:
        raise _MissingLogHead()
    screened = set(firewalled)
    event = replace(write.event, addressees=tuple(a for a in write.event.addressees if a not in screened))
    return message_id, position, screened, event


def _run_one_statement(params: dict, recipients: list[Member], event: NewEvent) -> tuple[int, int, set[int]]:
    write = _Write(params, recipients, event)
    return _write_alone(write) if connection.in_atomic_block else _group_commit.write(write)


def _parties(write: _Write) -> tuple[int, int, list[int]]:
    return write.params["space_id"], write.params["author_id"], write.params["recipients"]


def _write_alone(write: _Write) -> tuple[int, int, set[int]]:
    with transaction.atomic():
        message_id, position, screened, event = _execute(write)
        # Statements of their own, under the log head lock the first one
        # took: they see every subscription activated before this position,
        # and every removal of the author or a recipient committed before it.
        _recheck([_parties(write)])
        appended([(position, event)])
    return message_id, position, screened


class _GroupCommit:
    """Concurrent writes of one process commit together.

    The log head row is locked from a write's statement to its COMMIT, so
    one write at a time holds it, and every other waits out the holder's
    append hooks and its COMMIT (in a busy process, most of that wait is the
    holder's thread waiting for its turn to run Python). Here the first
    writer to arrive leads: it takes every write queued by then (up to
    MAX_GROUP), runs their statements in one transaction, the append hooks
    once for all of them, and one COMMIT; then it hands the lead to the
    first write queued meanwhile. The statements run in arrival order, so
    positions follow it, and commit order is the log's guarantee as before:
    the lock is held from the group's first position to its COMMIT.

    A group either commits whole or not at all: if any write in it fails
    (a full mailbox, a duplicate idempotency key raced in, anything), the
    transaction rolls back and every write of the group runs again on its
    own, in its own thread, where it succeeds or fails as it would have
    alone. Guarded by tests/inbox/test_group_commit.py.
    """

    MAX_GROUP = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Write] = []
        self._leading = False

    def write(self, write: _Write) -> tuple[int, int, set[int]]:
        with self._lock:
            if self._leading:
                self._queue.append(write)
            else:
                self._leading = write.lead = True
        if not write.lead:
            write.done.wait()
        if write.lead:
            self._lead(write)
        return _write_alone(write) if write.alone else write.result

    def _lead(self, write: _Write) -> None:
        with self._lock:
            group = [write, *self._queue[: self.MAX_GROUP - 1]]
            del self._queue[: self.MAX_GROUP - 1]
        try:
            for w, result in zip(group, _commit_group(group)):
                w.result = result
        finally:
            # A write without a result (the group rolled back, or the leader
            # was interrupted) runs again alone, in its own thread.
            for w in group:
                w.alone = w.result is None
            with self._lock:
                successor = self._queue.pop(0) if self._queue else None
                if successor is None:
                    self._leading = False
                else:
                    successor.lead = True
            for w in group[1:]:
                w.done.set()
            if successor is not None:
                successor.done.set()


def _commit_group(group: list[_Write]) -> list[tuple[int, int, set[int]]]:
    """The group's statements, hooks and COMMIT in one transaction: a result
    per write, or none at all if any of them failed (all rolled back)."""
    try:
        with transaction.atomic():
            _lock_mailboxes(group)
            done = [_execute(w) for w in group]
            _recheck([_parties(w) for w in group])
            appended([(position, event) for _, position, _, event in done])
    except Exception:
        return []
    return [(message_id, position, screened) for message_id, position, screened, _ in done]


def _lock_mailboxes(group: list[_Write]) -> None:
    """Lock every mailbox the group's statements count into, in member order,
    before the first of them. Each statement locks its own recipients' rows
    in that order, but a group runs several: its lock order would follow
    arrival order, and a group, another node's group, and an acknowledgement
    (inbox.mailbox.debit_many) could each hold a row the other wants (found
    by the fault matrix)."""
    if len(group) > 1:
        mailbox.lock((m for w in group for m in w.params["quota_members"]), create=True)


_group_commit = _GroupCommit()


def _insert_in_one_statement(message: Message, recipients: list[Member], items: list[InboxItem],
                             authority: dict[int, Authority]) -> set[int]:
    message.position = 0  # set by the statement; rendered into the event by jsonb_set
    event = events.message_created(message, recipients)
    params = {
        "public_id": message.public_id, "space_id": message.space_id, "conversation_id": message.conversation_id,
        "author_id": message.author_id, "body": message.body, "body_bytes": message.body_bytes,
        "reply_to_id": message.reply_to_id, "related_paths": json.dumps(message.related_paths),
        "mentions": json.dumps(message.mentions), "idempotency_key": message.idempotency_key,
        "fingerprint": message.fingerprint, "created_at": message.created_at,
        "recipients": [r.pk for r in recipients], "kind": event.kind,
        "grants": [authority[r.pk].pk if r.pk in authority else None for r in recipients],
        "generations": [authority[r.pk].generation if r.pk in authority else None for r in recipients],
        "restricted": event.restricted,
        "data": json.dumps(event.data),
        "tokens": [item.token for item in items],
        "item_kind": items[0].kind if items else None,
        "item_payload": json.dumps(items[0].payload) if items else None,
        "item_bytes": items[0].content_bytes if items else 0,
        # Sorted, so concurrent sends lock mailbox rows in one order.
        "quota_members": sorted(r.pk for r in recipients), "mailbox_limit": mailbox.MAILBOX_LIMIT_BYTES,
        "share_limit": mailbox.sender_share_limit(),
    }
    # A transaction, because a full mailbox is found mid-statement and the
    # other recipients' counters must roll back with it.
    try:
        message_id, position, firewalled = _run_one_statement(params, recipients, event)
    except _MissingLogHead:
        LogHead.objects.get_or_create(id=1)
        message_id, position, firewalled = _run_one_statement(params, recipients, event)
    message.id, message.position = message_id, position
    message._state.adding, message._state.db = False, connection.alias
    return firewalled
