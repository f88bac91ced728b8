"""The host-wide event log.

Commit-order guarantee: positions are taken from the single `LogHead` row
with `UPDATE … RETURNING` as the last write of the writer's transaction. The
row lock that UPDATE takes is held until COMMIT, so position assignment and
commit happen in one serialized section: a transaction that gets a larger
position can only do so after every smaller position has committed (and,
on PostgreSQL, become visible: locks are released after the commit is
visible). A reader that has seen position p can therefore never later find
a newly committed event at a position <= p. See docs/architecture.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection, transaction

from controlplane.clock import now
from controlplane.db import model_columns, model_from_row, run_steps
from controlplane.live import announce_on_commit
from controlplane.models import Event, EventAddressee, LogHead
from controlplane.tracing import current_request_id


@dataclass(frozen=True)
class NewEvent:
    kind: str
    data: dict
    space_id: int | None = None
    conversation_id: int | None = None
    actor_id: int | None = None
    restricted: bool = False
    addressees: tuple[int, ...] = field(default_factory=tuple)
    # The members whose space subscriptions it may wake (a check-in is the
    # claimant's business); None: every subscriber who may read it.
    targets: tuple[int, ...] | None = None
    # The member a membership event is about: what they may read changed,
    # so their inbox feeds may show older events (controlplane.live).
    member_id: int | None = None
    # The request that appended it (controlplane.tracing), for the wakes it
    # causes to name; provenance, not content.
    request_id: str | None = field(default_factory=current_request_id, compare=False, repr=False)


# A log nudge names at most this many addressees; more wake every inbox reader.
NUDGE_MEMBERS = 1000

AppendHook = Callable[[list[tuple[int, NewEvent]]], None]

# Work that must commit with the events, run by `appended` in the appending
# transaction after the positions are taken. Apps above this one register
# here from their AppConfig.ready(): the webhook outbox
# (webhooks.outbox.enqueue_wakes). A hook runs under the log head: it must
# lock no row another writer holds while it waits for the log head (a
# mailbox, inbox.mailbox.lock), so work that does registers elsewhere
# (controlplane.services.register_removal_hook).
_APPEND_HOOKS: list[AppendHook] = []


def register_append_hook(hook: AppendHook) -> None:
    if hook not in _APPEND_HOOKS:
        _APPEND_HOOKS.append(hook)


def appended(entries: list[tuple[int, NewEvent]]) -> None:
    """What every append does once its rows are written, whichever way they
    were written (append_events, or inbox.writes' one PostgreSQL statement):
    in the transaction, the append hooks; after the commit, a wake of this
    process's waiters and one message to every other process (long-polls
    and live pages fan it out locally, so a commit costs one broker
    message). `entries` are in position order, at consecutive positions
    (one reservation, or a group commit's statements under one lock), which
    the message names from `first` to `position`: a log watcher counts the
    positions no message covered as lost nudges (controlplane.live)."""
    for hook in _APPEND_HOOKS:
        hook(entries)
    events = [event for _, event in entries]
    addressees = {m for e in events for m in e.addressees}
    announce_on_commit({"type": "log.advanced", "first": entries[0][0], "position": entries[-1][0],
                        "conversations": sorted({e.conversation_id for e in events if e.conversation_id}),
                        "spaces": sorted({e.space_id for e in events if e.space_id}),
                        # spaces where who may read changed (live pages re-check), and whose access changed
                        "access_spaces": sorted({e.space_id for e in events
                                                 if e.space_id and e.kind.startswith("member.")}),
                        "access_members": sorted({e.member_id for e in events if e.member_id is not None}),
                        # whose inbox feeds it reached (None: too many to name, everyone's)
                        "members": sorted(addressees) if len(addressees) <= NUDGE_MEMBERS else None})


def head_position() -> int:
    """The position of the newest event committed, in one plain read."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT position FROM {LogHead._meta.db_table} WHERE id = 1")
        row = cursor.fetchone()
    return row[0] if row else 0


_ALLOCATE_SQL = f"UPDATE {LogHead._meta.db_table} SET position = position + %s WHERE id = 1 RETURNING position"


def reserve_positions(count: int) -> list[int]:
    """Take the next `count` positions, in the caller's transaction.

    From here to COMMIT every other writer waits on the log head row, so do
    it as late as possible: after validation, right before the final inserts.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("positions are reserved inside the writer's transaction")
    with connection.cursor() as cursor:
        cursor.execute(_ALLOCATE_SQL, [count])
        row = cursor.fetchone()
        if row is None:  # the head row is made by a migration; a flushed database lacks it
            LogHead.objects.get_or_create(id=1)
            cursor.execute(_ALLOCATE_SQL, [count])
            row = cursor.fetchone()
        last = row[0]
    return list(range(last - count + 1, last + 1))


def hold_head() -> None:
    """Wait for the writers holding the log head to commit, and hold it
    until the caller's transaction ends: what they wrote is read from now
    on, and what anyone writes next comes after this transaction's events.
    (SQLite's writers take turns anyway.)"""
    if connection.features.has_select_for_update:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {LogHead._meta.db_table} WHERE id = 1 FOR NO KEY UPDATE")


def append_events(events: list[NewEvent], positions: list[int] | None = None) -> list[Event]:
    """Append `events` to the log in the caller's transaction, at `positions`
    if the caller reserved them already, else at freshly reserved ones."""
    if not events:
        return []
    positions = positions or reserve_positions(len(events))
    created_at = now()
    rows = [
        Event(position=position, kind=e.kind, space_id=e.space_id, conversation_id=e.conversation_id,
              actor_id=e.actor_id, restricted=e.restricted, data=e.data, created_at=created_at)
        for position, e in zip(positions, events, strict=True)
    ]
    Event.objects.bulk_create(rows)
    addressees = [
        EventAddressee(member_id=member_id, event_id=row.position, space_id=e.space_id)
        for row, e in zip(rows, events)
        for member_id in e.addressees
    ]
    if addressees:
        EventAddressee.objects.bulk_create(addressees)
    appended(list(zip(positions, events)))
    return rows


def log_head() -> LogHead:
    """The log head row as it is now (unlocked): every read's bound and the
    retention floor. Plain SQL: reads ask for it on every page."""
    return run_steps(log_head_steps())


def log_head_steps():
    """`log_head` as steps (controlplane.db.run_steps)."""
    table = connection.ops.quote_name(LogHead._meta.db_table)
    rows = yield f"SELECT {model_columns(LogHead, 'h')} FROM {table} h WHERE h.id = 1", []
    return model_from_row(LogHead, rows[0]) if rows else LogHead()


PRUNE_BATCH = 5_000


def prune_events(*, older_than) -> int:
    """Delete events created before `older_than`, raising the retention floor
    past them first. Returns how many were deleted.

    The floor is raised in its own statement (it briefly takes the log head
    lock) and committed before anything is deleted, so a reader always learns
    of a gap (410) rather than silently skipping it; the deletes then run in
    small batches that hold no lock writers need."""
    boundary = (Event.objects.filter(created_at__lt=older_than).order_by("-position")
                .values_list("position", flat=True).first())
    if boundary is None:
        return 0
    LogHead.objects.filter(id=1, floor__lt=boundary).update(floor=boundary)
    deleted = 0
    while True:
        batch = list(Event.objects.filter(position__lte=boundary).order_by("position")
                     .values_list("position", flat=True)[:PRUNE_BATCH])
        if not batch:
            return deleted
        with transaction.atomic():
            EventAddressee.objects.filter(event_id__in=batch).delete()
            deleted += Event.objects.filter(position__in=batch).delete()[1].get(Event._meta.label, 0)
