"""A member's mailbox: the pending-bytes counter and the inbox announcements.

`Mailbox.pending_bytes` is the sum of `content_bytes` over the member's
pending items that count: admitted or awaiting classification, not held
(held content is not pending content) and not yet acknowledged or rejected.
`MailboxShare.pending_bytes` is the same sum over one sender's items, held
ones included: a sender the recipient's firewall holds fills no one's
mailbox but their own share of it, so what they can pile into held rows is
bounded too (a control-plane notice has no sender and counts against no
share). Only this module changes them, in the caller's transaction:
- `reserve` counts a new message's item for each recipient, refusing with
  MAILBOX_FULL past the mailbox limit (`details.reason: "mailbox"`) or the
  sender's share of it (`"sender_share"`) (the PostgreSQL send statement in
  inbox.writes does the same reservation inside its one statement);
- `fits` tells whether bytes would fit, without counting them (a
  collective's result, which shrinks to a reference when they would not);
- `credit` counts bytes that become pending without the limit (a notice,
  a collective's result, whole when it `fits`, else as a reference);
- `debit` uncounts bytes that stop being pending (acknowledged, rejected);
- `hold` and `release` take a held item's bytes out of the mailbox's count
  and back, leaving its sender's share as it was.

Announcements tell a member's live inbox clients (web sockets) that their
inbox changed; they carry ids and counts only, clients read the items
through the inbox feed. They are sent after commit, never before. An
acknowledgement appends no event, so the apps above that follow a
member's pending count without listening (webhooks: an MCP
`inbox.pending` push) register a hook that `announce_acknowledged` runs in
the acknowledging transaction.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from django.conf import settings
from django.db import connection
from django.db.models import F

from controlplane.db import rows_sql
from controlplane.errors import MailboxFull
from controlplane.live import group_send_on_commit
from controlplane.models import Member
from inbox.models import Mailbox, MailboxShare

MAILBOX_LIMIT_BYTES = 10 * 1024 * 1024


def sender_share_limit() -> int:
    """How much of one recipient's mailbox one sender may fill (bytes)."""
    return min(settings.MAILBOX_SENDER_SHARE, MAILBOX_LIMIT_BYTES)


def full(recipients: list[Member], without_room: set[int], without_share: set[int]) -> MailboxFull:
    """MAILBOX_FULL naming the recipients without room: the mailbox's own
    limit first, else the sender's share of it."""
    if without_room:
        return MailboxFull(details={"recipients": [f"@{r.handle}" for r in recipients if r.pk in without_room],
                                    "reason": "mailbox"})
    return MailboxFull("This sender's share of the recipient's mailbox is full; other senders are unaffected.",
                       details={"recipients": [f"@{r.handle}" for r in recipients if r.pk in without_share],
                                "reason": "sender_share"})


def reserve(recipients: list[Member], size: int, *, sender_id: int) -> set[int]:
    """Count `size` more pending bytes for each of `recipients`, in their
    mailbox and in `sender_id`'s share of it, or raise MAILBOX_FULL (the
    caller's transaction rolls the others back). Returns the recipients
    whose firewall classifies new items. Rows are locked in member order, so
    concurrent sends never deadlock."""
    without_room, without_share = set(), set()
    share = sender_share_limit()
    for member in sorted(recipients, key=lambda m: m.pk):
        Mailbox.objects.get_or_create(member=member)
        if not Mailbox.objects.filter(member=member, pending_bytes__lte=MAILBOX_LIMIT_BYTES - size).update(
                pending_bytes=F("pending_bytes") + size):
            without_room.add(member.pk)
        MailboxShare.objects.get_or_create(member=member, sender_id=sender_id)
        if not MailboxShare.objects.filter(member=member, sender_id=sender_id,
                                           pending_bytes__lte=share - size).update(
                pending_bytes=F("pending_bytes") + size):
            without_share.add(member.pk)
    if without_room or without_share:
        raise full(recipients, without_room, without_share)
    return set(Mailbox.objects.filter(member__in=recipients, firewall=True).values_list("member_id", flat=True))


def fits(member_id: int, size: int, *, sender_id: int) -> str | None:
    """Whether `size` more pending bytes from `sender_id` fit `member_id`'s
    mailbox: None, or why not (`"mailbox"`, `"sender_share"`, as in
    MAILBOX_FULL). Counts nothing; the caller holds the mailbox (`lock`)."""
    pending = Mailbox.objects.filter(member_id=member_id).values_list("pending_bytes", flat=True).first() or 0
    if pending + size > MAILBOX_LIMIT_BYTES:
        return "mailbox"
    shared = (MailboxShare.objects.filter(member_id=member_id, sender_id=sender_id)
              .values_list("pending_bytes", flat=True).first() or 0)
    return "sender_share" if shared + size > sender_share_limit() else None


def lock(member_ids: Iterable[int], *, create: bool = False) -> None:
    """Lock these members' mailbox rows, in member order, in the caller's
    transaction. The lock order of the whole system: a writer takes every
    mailbox it will count into or out of, in member order, before the log
    head (a send's statement does; so must anything that posts a notice or
    settles items for several members in one transaction), so no two
    writers wait for each other in a cycle (tests/inbox/test_lock_order.py).
    Every explicit row lock is a no-key lock (`select_for_update(no_key=True)`,
    what an UPDATE takes): a plain FOR UPDATE also blocks the foreign-key
    checks other transactions make at COMMIT against the row (Django's
    foreign keys are deferred), a wait no lock order can see.
    With `create`, the rows that do not exist yet are made first, in the
    same order: a new row is locked by its insert, so rows made later, one
    statement at a time, would be taken out of order."""
    members = sorted(set(member_ids))
    if not members:
        return
    if connection.vendor != "postgresql":  # SQLite has no row locks: a write transaction holds the database
        if create:
            Mailbox.objects.bulk_create([Mailbox(member_id=m) for m in members], ignore_conflicts=True)
        return
    # Plain SQL: a group of sends and a push worker's record take these on
    # every commit, and building the ORM's queries cost more than running them.
    table = connection.ops.quote_name(Mailbox._meta.db_table)
    with connection.cursor() as cursor:
        if create:
            cursor.execute(f"INSERT INTO {table} (member_id, pending_bytes, firewall) "
                           f"SELECT m, 0, false FROM unnest(%s::bigint[]) m ORDER BY m ON CONFLICT DO NOTHING",
                           [members])
        cursor.execute(f"SELECT 1 FROM {table} WHERE member_id = ANY(%s::bigint[]) ORDER BY member_id "
                       f"FOR NO KEY UPDATE", [members])


def credit(member_id: int, size: int, *, sender_id: int | None) -> None:
    """Count `size` bytes that became pending, whatever the limits: they
    tell of something that already happened or was already counted once."""
    Mailbox.objects.get_or_create(member_id=member_id)
    Mailbox.objects.filter(member_id=member_id).update(pending_bytes=F("pending_bytes") + size)
    if sender_id is not None:
        MailboxShare.objects.get_or_create(member_id=member_id, sender_id=sender_id)
        MailboxShare.objects.filter(member_id=member_id, sender_id=sender_id).update(
            pending_bytes=F("pending_bytes") + size)


def debit(member_id: int, size: int, *, sender_id: int | None, held: bool = False) -> None:
    """Uncount `size` bytes that stopped being pending; those of a `held`
    item only from its sender's share (the mailbox stopped counting them
    when it was held)."""
    if not held:
        debit_many([(member_id, sender_id, size)])
    elif sender_id is not None:
        lock([member_id])
        _subtract(MailboxShare, ["member_id", "sender_id"], [(member_id, sender_id, size)])


def hold(member_id: int, size: int) -> None:
    """A held item's bytes leave the mailbox's count; its sender's share
    keeps them, so a held sender fills no more than that share."""
    lock([member_id])
    _subtract(Mailbox, ["member_id"], [(member_id, size)])


def release(member_id: int, size: int) -> None:
    """A released item's bytes count in the mailbox again, whatever the
    limit (they were counted in its sender's share all along)."""
    credit(member_id, size, sender_id=None)


def debit_many(entries: Iterable[tuple[int, int | None, int]]) -> None:
    """Uncount (member id, sender id or None, bytes) entries: two statements
    however many, after `lock`ing the mailboxes."""
    mine, shares = Counter(), Counter()
    for member_id, sender_id, size in entries:
        mine[member_id] += size
        if sender_id is not None:
            shares[member_id, sender_id] += size
    if not mine:
        return
    lock(mine)
    _subtract(Mailbox, ["member_id"], [(m, n) for m, n in mine.items()])
    if shares:
        _subtract(MailboxShare, ["member_id", "sender_id"], [(m, s, n) for (m, s), n in shares.items()])


def _subtract(model, keys: list[str], rows: list[tuple]) -> None:
    """pending_bytes -= n for each (*keys, n) of `rows`, in one statement."""
    table = connection.ops.quote_name(model._meta.db_table)
    values, params = rows_sql(rows, {**dict.fromkeys(keys, "BIGINT"), "n": "BIGINT"})
    match = " AND ".join(f"{table}.{key} = v.{key}" for key in keys)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET pending_bytes = {table}.pending_bytes - v.n FROM ({values}) v "
                       f"WHERE {match}", params)


def inbox_group(member: Member) -> str:
    """The Channels group of a member's live inbox clients."""
    return f"inbox.{member.public_id}"


def announce_available(member: Member, *, message_id: str | None = None) -> None:
    """After commit: one more item is pending in `member`'s inbox."""
    note = {"type": "inbox.available", "items": 1}
    if message_id is not None:
        note["message"] = message_id
    group_send_on_commit(inbox_group(member), note)


AcknowledgedHook = Callable[[set[int]], None]
_acknowledged_hooks: list[AcknowledgedHook] = []


def register_acknowledged_hook(hook: AcknowledgedHook) -> None:
    """Run `hook(member pks)` in every transaction that acknowledges items
    of those members (once per app: a hook registered twice runs once)."""
    if hook not in _acknowledged_hooks:
        _acknowledged_hooks.append(hook)


def announce_acknowledged(members: Iterable[Member]) -> None:
    """Items of `members` were acknowledged: their live inbox clients hear
    it after commit, and the acknowledged hooks run now."""
    pks = set()
    for member in members:
        group_send_on_commit(inbox_group(member), {"type": "inbox.acknowledged"})
        pks.add(member.pk)
    if pks:
        for hook in _acknowledged_hooks:
            hook(pks)
