"""The revocation barrier (SPEC §5): `active → revoking → revoked`, or
`→ expired` when the grant's `expires_at` passes.

Starting the barrier is one transaction: under the grant's row lock the
status becomes `revoking` (so no send is admitted under it any more: sends
hold the same row locked while they decide and commit) and every
pending item sent under it is withheld from every read path.

Finishing it settles those items in batches, each batch its own
transaction, and sets the terminal status when none is left: an item
already handed off stays delivered, any other is rejected with a notice in
its place (inbox.notices, which owns those rows, does both). Then the
collective requests sent under it fail (inbox.collectives.fail_under).

Every step is durable; `recover()` finishes barriers a crash interrupted,
and runs at worker start and once a minute.

A revocation request finishes its barrier for up to INLINE_SECONDS and then
answers `revoking`, leaving the rest to a worker (grants.tasks.finish_barrier,
and the minute's `recover` if that nudge is lost): a grant with a large
backlog holds no request for longer than that.
"""
from __future__ import annotations

import logging
import time

from django.db import transaction

from controlplane import faults
from controlplane.clock import now
from controlplane.live import announce_withheld, kick
from controlplane.log import append_events
from controlplane.models import Member
from grants.models import Grant
from grants.render import grant_event
from inbox import collectives, notices

log = logging.getLogger(__name__)

BATCH = 500
INLINE_SECONDS = 5.0


def start_barrier(grant_pk: int, *, ending: str, actor: Member | None) -> Grant:
    """Fence `grant`: `revoking`, and its pending items withheld. A no-op for
    a grant that is not active; an expiry only fences a grant that is due."""
    with transaction.atomic():
        grant = Grant.objects.select_for_update(no_key=True).get(pk=grant_pk)
        if grant.status != Grant.Status.ACTIVE:
            return grant
        if ending == Grant.Status.EXPIRED and (grant.expires_at is None or grant.expires_at > now()):
            return grant
        grant.status, grant.ending, grant.generation = Grant.Status.REVOKING, ending, grant.generation + 1
        grant.barrier_started_at, grant.barrier_started_by = now(), actor
        grant.save(update_fields=["status", "ending", "generation", "barrier_started_at", "barrier_started_by"])
        notices.withhold_items_under(grant.pk)
        announce_withheld(grant.space_id)  # live pages showing its messages' bodies look again
    return grant


def finish_barrier(grant_pk: int, *, until: float | None = None) -> Grant:
    """Settle every item sent under a `revoking` grant, then make the grant
    terminal. Safe to run any number of times, from any process. With
    `until` (a `time.monotonic()` deadline), stop after the batch that
    passes it, still `revoking`, and have a worker finish."""
    while True:
        if until is not None and time.monotonic() >= until:
            kick("grants.tasks.finish_barrier", grant_pk)
            return Grant.objects.get(pk=grant_pk)
        faults.point("barrier.step")  # between two durable steps
        with transaction.atomic():
            grant = Grant.objects.select_for_update(no_key=True).get(pk=grant_pk)
            if grant.status != Grant.Status.REVOKING:
                break  # finished, by this call or an earlier one (which may have stopped short of what follows)
            verb = "expired" if grant.ending == Grant.Status.EXPIRED else "was revoked"
            # Not naming the grant: the reason is shown to every reader of a
            # channel (the message's status, `message.rejected` in the space
            # feed), and only the grant's parties may learn of it. The
            # recipient's `rejected` item names it (`authority_ref`).
            reason = f"The grant this message was sent under {verb} before it was delivered."
            if not notices.reject_items_under(grant.pk, authority_ref=grant.public_id, reason=reason, limit=BATCH):
                grant.status, grant.generation, grant.ended_at = grant.ending, grant.generation + 1, now()
                grant.save(update_fields=["status", "generation", "ended_at"])
                append_events([grant_event(f"grant.{grant.status}", grant, actor_id=grant.barrier_started_by_id)])
                break
    collectives.fail_under(grant_pk)  # after its last batch: the requests' rejections come first in the log
    return grant


def revoke(grant: Grant, *, actor: Member) -> Grant:
    """Revoke `grant`: start its barrier, then finish it."""
    start_barrier(grant.pk, ending=Grant.Status.REVOKED, actor=actor)
    return finish_barrier(grant.pk, until=time.monotonic() + INLINE_SECONDS)


def expire_due() -> int:
    """Put every active grant whose `expires_at` has passed through the
    barrier. Returns how many expired."""
    due = _expired(1000)
    for pk in due:
        start_barrier(pk, ending=Grant.Status.EXPIRED, actor=None)
        finish_barrier(pk)
    return len(due)


# How far past the earliest expired grant a look reaches, in grants: the
# turns are taken among these (a bounded read of the `grant_expiry` index).
LOOK_AHEAD = 5000


def _expired(limit: int) -> list[int]:
    """Active grants past their expiry, taken in turns by space among the
    earliest LOOK_AHEAD (the `grant_expiry` index): the earliest of every
    space first, then each space's second, and so on. Earliest first across
    spaces, one owner's 2,000 expiring at once held back the fence of every
    later grant of every other space by 35 s; ranking every expired grant
    in SQL sorted them all on every look (113 ms with 100,000). One
    indexed read when none is due."""
    earliest = (Grant.objects.filter(status=Grant.Status.ACTIVE, expires_at__lte=now())
                .order_by("expires_at").values_list("pk", "space_id")[:LOOK_AHEAD])
    turns: dict[int, int] = {}
    ranked = []
    for place, (pk, space_id) in enumerate(earliest):
        turns[space_id] = turn = turns.get(space_id, 0) + 1
        ranked.append((turn, place, pk))
    return [pk for _, _, pk in sorted(ranked)[:limit]]


def fence_expired(limit: int = 100) -> int:
    """The fence of every active grant whose `expires_at` has passed, at
    once, and a worker to finish each barrier. A worker command's watch
    (controlplane.schedules.Watcher), about once a second: the minute's
    schedule (`expire_due`) started them 30–90 s late, and meanwhile the
    inbox paths went on handing out what the grant had admitted. One
    indexed read when none is due."""
    due = _expired(limit)
    for pk in due:
        start_barrier(pk, ending=Grant.Status.EXPIRED, actor=None)
        kick("grants.tasks.finish_barrier", pk)
    return len(due)


def recover() -> int:
    """Finish every barrier that was started and not finished (a process
    stopped between the two steps), and fail the collective requests of
    those that ended. Returns how many barriers were finished."""
    pending = list(Grant.objects.filter(status=Grant.Status.REVOKING).values_list("pk", flat=True))
    for pk in pending:
        finish_barrier(pk)
    collectives.fail_under()  # a barrier that ended before its process could fail them
    if pending:
        log.info("finished %d interrupted revocation barrier(s)", len(pending))
    return len(pending)
