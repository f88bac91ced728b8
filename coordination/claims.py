"""Claims and their silence (SPEC §10): check-ins and expiry.

A claim's silence starts at the later of the task's update time and the
claimant's latest message in the task's discussion. After 75% of
CLAIM_TTL_HOURS of silence the sweep emits one `task_claim_checkin` per
(task, claimant, update time), to the claimant's subscriptions only; after
the full timeout the claim expires and the task reopens
(`task_claim_expired`). `in_review` is exempt (only `claimed` tasks are
swept); CLAIM_TTL_HOURS=0 disables both. Nothing here renews a claim:
only a task update or a claimant message moves the silence.

The scan is bounded: `Task.sweep_at` (indexed over claimed tasks) says when
a claim could next be due, so each scan reads at most SCAN_LIMIT rows from
the front of that index however many claims exist. A task whose claimant
spoke since is read, found not due, and moved on; none stays at the front.
Each task is then decided in its own short transaction with the row
locked, re-reading the claimant's latest message there, so one committed
after the scan began still counts.

Reads and claim attempts sweep the claims they show the same way, from the
same index (on hosts with no worker too): a claim they find alive moves on
in it, so the next read passes it by, and one that expired is never hidden
behind live ones. A claim whose claimant was deleted (the admin site may),
or may no longer write in the space (removed, made an observer, suspended),
is released at its first look; those changes make it due at once
(`look_at_claims_of`).
"""
from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from controlplane.access import require_sender
from controlplane.clock import now, rfc3339
from controlplane.errors import ApiError
from controlplane.log import append_events, hold_head
from controlplane.models import Space
from coordination.events import task_event
from coordination.models import CheckinReceipt, SweepMark, Task
from inbox.models import Message

CHECKIN_AT = 0.75  # of the timeout
SCAN_LIMIT = 100
SCAN_EVERY = dt.timedelta(minutes=1)
SWEEP_MARK = "claims"


def timeout() -> dt.timedelta | None:
    hours = settings.CLAIM_TTL_HOURS
    return dt.timedelta(hours=hours) if hours > 0 else None


def schedule(task: Task) -> None:
    """Set when the sweep first looks at the task's claim (after a change
    of the task row: a fresh update time is a fresh check-in key)."""
    limit = timeout()
    task.sweep_at = task.updated_at + limit * CHECKIN_AT if task.status == Task.Status.CLAIMED and limit else None


def claimant_messages(task: Task):
    """When the claimant wrote in the task's discussion, latest first (the
    `message_author_conversation` index: however many others wrote there)."""
    return (Message.objects.filter(conversation_id=task.conversation_id, author_id=task.claimant_id)
            .order_by("-position").values_list("created_at", flat=True))


def silent_since(task: Task) -> dt.datetime:
    """The later of the task's update and its claimant's latest message in
    the task's discussion."""
    spoke = claimant_messages(task).first()
    return max(task.updated_at, spoke) if spoke else task.updated_at


def locked_task(rows, related: tuple[str, ...]) -> Task | None:
    """The first task of `rows`, its row locked, then read with `related`.
    Locked with its joins, a row another transaction had just changed came
    back joined to the other rows as they were before: PostgreSQL re-checks
    only the locked table's new version, and a claimant just set came back
    as none. A claim's decision took that for a deleted claimant and
    expired the claim a concurrent request had just taken; a task's change
    answered and logged it with no claimant."""
    pk = rows.select_for_update(no_key=True).values_list("pk", flat=True).first()
    return None if pk is None else Task.objects.select_related(*related).get(pk=pk)


def _claimant_gone(task: Task) -> bool:
    """The claimant was deleted, suspended, or may no longer write in the
    task's space (removed from it, or made an observer): no one who could
    act holds the claim."""
    claimant = task.claimant
    if claimant is None or not claimant.is_active:
        return True
    try:
        require_sender(task.space, claimant)  # the rule every task move checks (the space is not archived here)
    except ApiError:
        return True
    return False


def _decide(task_pk: int, at: dt.datetime) -> str | None:
    """Check in on, or expire, one claim, with its row locked, and move it
    on in the sweep index. Returns "checkin", "expired" or None."""
    limit = timeout()
    with transaction.atomic():
        task = locked_task(Task.objects.filter(pk=task_pk, status=Task.Status.CLAIMED),
                           ("space", "conversation", "claimant"))
        if task is None or limit is None:
            return None
        if task.space.archived:  # only active spaces' claims are swept; unarchiving looks again (look_again)
            Task.objects.filter(pk=task.pk).update(sweep_at=at + limit)
            return None
        start = silent_since(task)
        gone = _claimant_gone(task)
        if at >= start + limit and not gone:
            # A message commits holding the log head: one of the claimant's
            # committed meanwhile is read now, and any later comes after the expiry.
            hold_head()
            start = silent_since(task)
        if at >= start + limit or gone:
            claimant = task.claimant
            task.status, task.claimant, task.claimed_at, task.updated_at, task.sweep_at = (
                Task.Status.OPEN, None, None, at, None)
            task.save(update_fields=["status", "claimant", "claimed_at", "updated_at", "sweep_at"])
            append_events([task_event("task_claim_expired", task, actor=None,
                                      extra={"claimant": claimant and f"@{claimant.handle}",
                                             "silent_since": rfc3339(start),
                                             "reason": "claimant_gone" if gone else "silence"})])
            return "expired"
        key = {"task": task, "claimant_id": task.claimant_id, "task_updated_at": task.updated_at}
        checked_in = CheckinReceipt.objects.filter(**key).exists()
        outcome = None
        if not checked_in and at >= start + limit * CHECKIN_AT:
            try:
                with transaction.atomic():
                    CheckinReceipt.objects.create(**key, created_at=at)
            except IntegrityError:  # a concurrent scan's; it emitted the check-in
                pass
            else:
                append_events([task_event(
                    "task_claim_checkin", task, actor=None, targets=(task.claimant_id,),
                    extra={"claimant": f"@{task.claimant.handle}", "silent_since": rfc3339(start),
                           "expires_at": rfc3339(start + limit),
                           "asks": "Post progress and your next checkpoint, a blocker, or release the task."})])
                outcome = "checkin"
            checked_in = True
        task.sweep_at = start + (limit if checked_in else limit * CHECKIN_AT)
        Task.objects.filter(pk=task.pk).update(sweep_at=task.sweep_at)
        return outcome


def _stale(at: dt.datetime, limit: dt.timedelta) -> Q:
    """Claims whose next look an earlier CLAIM_TTL_HOURS set: none was set
    while it was 0, and one set under a longer timeout lies past a whole
    timeout from now, where none can."""
    return Q(sweep_at__isnull=True) | Q(sweep_at__gt=at + limit)


def _due_or_stale(at: dt.datetime, limit: dt.timedelta) -> Q:
    """Claims due in the sweep index, and stale ones: a host without a
    worker has no scan to catch those up (`_catch_up`), and its reads must
    still reopen expired work."""
    return Q(sweep_at__lte=at) | _stale(at, limit)


def expire_if_due(space: Space, task_id: str) -> bool:
    """Reads and claim attempts sweep the task's claim themselves, if it is
    due in the sweep index. Cheap when it is not (one indexed read)."""
    if (limit := timeout()) is None:
        return False
    at = now()
    pk = (Task.objects.filter(_due_or_stale(at, limit), space=space, public_id=task_id, status=Task.Status.CLAIMED)
          .values_list("pk", flat=True).first())
    return pk is not None and _decide(pk, at) == "expired"


def expire_due_in(space: Space) -> int:
    """A listing of the space's tasks sweeps its claims first, as a read of
    one task does: up to SCAN_LIMIT of those due in the sweep index, the
    earliest first. Cheap when nothing is due (one indexed read). Returns
    how many expired."""
    if (limit := timeout()) is None:
        return 0
    at = now()
    due = (Task.objects.filter(_due_or_stale(at, limit), space=space, status=Task.Status.CLAIMED)
           .order_by("sweep_at", "id").values_list("pk", flat=True)[:SCAN_LIMIT])
    return [_decide(pk, at) for pk in due].count("expired")


def look_again(sender, space: Space, **kwargs) -> None:
    """An unarchived space's claims are looked at by the next read or scan:
    while it was archived each look put the next a whole timeout away."""
    Task.objects.filter(space=space, status=Task.Status.CLAIMED).update(sweep_at=now())


def look_at_claims_of(sender, space_id: int | None, member_id: int, **kwargs) -> None:
    """A member may no longer write in a space (or, suspended, anywhere;
    controlplane.services.writer_lost): their claims there are due at
    once, and the next read or scan releases them (`_claimant_gone`)
    rather than leaving the work held until the claim's silence runs out.
    One reinstated before that look keeps the claim. The rows are locked
    in id order first: a removal and a suspension of one claimant at once
    updated them in two plans' orders and deadlocked."""
    claims = Task.objects.filter(claimant_id=member_id, status=Task.Status.CLAIMED)
    if space_id is not None:
        claims = claims.filter(space_id=space_id)
    if pks := list(claims.order_by("pk").select_for_update(no_key=True).values_list("pk", flat=True)):
        Task.objects.filter(pk__in=pks).update(sweep_at=now())


def due_claims(at: dt.datetime) -> list[int]:
    """The scan's one read: up to SCAN_LIMIT claims that may be due, from
    the front of the sweep index."""
    return list(Task.objects.filter(status=Task.Status.CLAIMED, sweep_at__lte=at)
                .order_by("sweep_at", "id").values_list("pk", flat=True)[:SCAN_LIMIT])


def _catch_up(at: dt.datetime, limit: dt.timedelta) -> None:
    """Stale claims are due now (up to SCAN_LIMIT a scan)."""
    stale = Task.objects.filter(_stale(at, limit), status=Task.Status.CLAIMED)
    if pks := list(stale.values_list("pk", flat=True)[:SCAN_LIMIT]):
        Task.objects.filter(pk__in=pks, status=Task.Status.CLAIMED).update(sweep_at=at)


def scan() -> dict[str, int]:
    """One bounded pass: check-ins and expiries of claims due now."""
    if (limit := timeout()) is None:
        return {"checkins": 0, "expired": 0, "looked_at": 0}
    at = now()
    _catch_up(at, limit)
    due = due_claims(at)
    outcomes = [_decide(pk, at) for pk in due]
    return {"checkins": outcomes.count("checkin"), "expired": outcomes.count("expired"), "looked_at": len(due)}


def sweep() -> dict[str, int] | None:
    """`scan`, at most once a minute across every worker (None when the last
    scan was less than a minute ago)."""
    if timeout() is None:
        return None
    at = now()
    with transaction.atomic():
        SweepMark.objects.get_or_create(name=SWEEP_MARK, defaults={"last_at": at - SCAN_EVERY})
        if not SweepMark.objects.filter(name=SWEEP_MARK, last_at__lte=at - SCAN_EVERY).update(last_at=at):
            return None
    return scan()
