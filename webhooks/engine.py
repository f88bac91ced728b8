"""The delivery engine: claim due wakes, send them concurrently, record
every attempt.

- **Claim** (one short transaction): due deliveries are locked with
  `SKIP LOCKED`, so any number of workers never take the same one, and
  moved to `sending` with a lease and the next attempt number. A delivery's
  body is frozen at its first claim; every retry sends the same id and body.
  Per subscription only the oldest unfinished wake is sent, so wakes arrive
  in range order; per endpoint at most `PER_ENDPOINT` are in flight, those
  of every worker counted (webhooks.due.claimable), so a slow receiver
  cannot hold up anyone else's, and one
  member's wakes (their endpoints may share a URL) take at most `PER_OWNER`
  of a claim, and none while `PER_OWNER` are in flight.
- **Send** outside any transaction (webhooks.transport), many at once.
- **Record** (one short transaction): the attempt row, then the outcome,
  but only if the delivery is still this attempt's (a lease that expired
  and was claimed again belongs to the newer attempt).

A worker killed mid-request leaves a `sending` row whose lease runs out;
the next claim takes it again. Nothing is lost; the receiver may see the
same id twice, which delivery ids are for.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, connections, transaction

from controlplane import faults
from controlplane.access import receives_from
from controlplane.clock import now
from controlplane.models import Member, Space
from inbox import mailbox, notices
from inbox.delivery import acknowledge_items, deliverable, oldest_pending
from inbox.models import InboxItem
from webhooks import mcp, outbox
from webhooks.due import (LEASE_EXPIRED, READY, anything_due, cancelled_receipts, claimable, in_flight_of,
                          insert_attempts, mark_delivered, mark_sending, send_next_items, set_by_wrong_clock,
                          soonest_claim_end, soonest_due_at)
from webhooks.models import Delivery, Subscription
from webhooks.wakes import wake_body

if TYPE_CHECKING:  # aiohttp: the web processes import the engine, and send nothing
    from webhooks.transport import Outcome

log = logging.getLogger(__name__)
wake_log = logging.getLogger("switchboard.wake")  # every attempt (docs/observability.md)

PER_ENDPOINT = 4
MAX_IN_FLIGHT = 64
# One member's share of a claim, and their wakes in flight past which a claim
# takes none of theirs: half a worker's room, so slow receivers of one member
# (20 endpoints, and the MCP-managed ones) never take all of it.
PER_OWNER = MAX_IN_FLIGHT // 2
FIRST_RETRY_SECONDS = 5.0
MAX_RETRY_SECONDS = 600.0
JITTER = 0.2
SUSPEND_AFTER_ATTEMPTS = 100
SUSPEND_AFTER = dt.timedelta(hours=1)
TERMINAL_STATUSES = (410, 413)
# No claim is leased further ahead than one lease from its claim; twice that
# leaves room for the clocks of processes that claim at the same moment (one
# lease exactly made a claim just taken by another worker look too long).
LEASE_HORIZON = 2
# No rule sets a due time further ahead than this (the longest retry delay;
# debounce windows are shorter): one that is was set by a clock running ahead.
DUE_HORIZON = dt.timedelta(seconds=MAX_RETRY_SECONDS * (1 + JITTER) + 60)
RECORD_TRIES = 4  # over about three seconds: a database restart's length
RECORD_RETRY_SECONDS = 0.5


@dataclass(frozen=True)
class Job:
    delivery_id: int
    public_id: str
    number: int
    url: str
    sealed_secret: str | None
    body: bytes
    # MCP-managed: signed the Standard Webhooks way with these (sealed)
    # secrets, under `message_id` (an inbox item's event id, or the delivery's).
    mcp_subscription_id: str | None = None
    mcp_secrets: tuple[str, ...] = ()
    message_id: str | None = None
    # For the attempt's log line: the subscription, the range, and the
    # request ids of the sends it carries (webhooks.outbox).
    subscription_id: str = ""
    event_range: tuple[int, int] = (0, 0)
    request_ids: tuple[str, ...] = ()
    # The inbox item a push carries (a 2xx acknowledges it), if any.
    item_id: int | None = None


def may_receive(subscription: Subscription) -> bool:
    """Whether the owner may still be woken: an active member, and for space
    subscriptions one the space, not archived, still delivers to."""
    owner: Member = subscription.owner
    if not owner.is_active:
        return False
    if subscription.kind == Subscription.Kind.SPACE:
        space: Space = subscription.space
        return not space.archived and receives_from(space, owner)
    return True


def lease() -> dt.timedelta:
    """How long a claim lasts: longer than any request (WEBHOOK_LEASE_SECONDS)."""
    return dt.timedelta(seconds=settings.WEBHOOK_LEASE_SECONDS)


def ready_params(at, limit: int = 0) -> dict:
    """The parameters of webhooks.due.READY's reads at `at`."""
    adapt = connection.ops.adapt_datetimefield_value
    return {"at": adapt(at), "horizon": adapt(at + LEASE_HORIZON * lease()), "due_horizon": adapt(at + DUE_HORIZON),
            "per_endpoint": PER_ENDPOINT, "per_owner": PER_OWNER, "limit": limit}


def claim_due(limit: int, recover: bool = True) -> list[Job]:
    """Take up to `limit` due deliveries for this worker. Without `recover`,
    only wakes that fell due (webhooks.due.READY's first read): what lapsed
    leases and wrong clocks left waits for the next claim that recovers."""
    if limit <= 0:
        return []
    at = now()
    jobs = []
    with transaction.atomic():
        due = claimable(limit, READY if recover else READY[:1], lambda asked: ready_params(at, asked), PER_OWNER,
                        PER_ENDPOINT)
        # The rows are locked (PostgreSQL) or the database is (SQLite's
        # BEGIN IMMEDIATE), so what was read is what gets claimed.
        _record_lapsed([d for d in due if d.state == Delivery.State.SENDING], at)
        cancelled, superseded = [], set()
        unbound = [d for d in due if d.subscription.kind == Subscription.Kind.ITEM and d.item_id is None]
        if unbound:
            _bind_items(unbound)
        for delivery in due:
            if not may_receive(delivery.subscription) or not _item_ready(delivery):
                cancelled.append(delivery.pk)
                if delivery.item_id is not None and delivery.body is not None:
                    # A retry whose item was acknowledged meanwhile makes way for
                    # the next pending item; one that found nothing to carry ends.
                    superseded.add(delivery.subscription_id)
        if cancelled:
            Delivery.objects.filter(pk__in=cancelled).update(state=Delivery.State.CANCELLED, finished_at=at,
                                                              claimed_until=None)
            mcp.offer(superseded, only_if_pending=True, kick=False)
        due = [d for d in due if d.pk not in cancelled]
        frozen = {d.pk for d in due if d.body is None}
        for delivery in due:
            if delivery.pk in frozen:
                delivery.body = mcp.body(delivery) if delivery.subscription.managed else wake_body(delivery)
                delivery.first_attempt_at = at
        if due:
            mark_sending(due, frozen, at, at + lease())
        for delivery in due:
            jobs.append(_job(delivery))
    return jobs


def _record_lapsed(lapsed: list[Delivery], at) -> None:
    """The attempts of deliveries claimed again because their lease ran
    out: their worker never recorded them (it died, or lost the database),
    and the history showed no trace of them. `lease_expired`, started when
    the lease did, lasting it."""
    span = lease()
    if rows := [(d.pk, d.attempts, (d.claimed_until or at) - span, int(span.total_seconds() * 1000), None,
                 LEASE_EXPIRED, "") for d in lapsed if d.attempts]:
        insert_attempts(rows)


def _job(delivery: Delivery) -> Job:
    subscription, endpoint = delivery.subscription, delivery.subscription.endpoint
    job = Job(delivery.pk, delivery.public_id, delivery.attempts + 1, endpoint.url, endpoint.secret,
              delivery.body.encode(), subscription_id=subscription.public_id,
              event_range=(delivery.after_position, delivery.through_position),
              request_ids=tuple((delivery.request_ids or "").split()), item_id=delivery.item_id)
    if not subscription.managed:
        return job
    secrets = signing_secrets(endpoint.secret, endpoint.previous_secret, endpoint.previous_secret_until)
    message_id = item_event_id(delivery.item) if delivery.item_id else delivery.public_id
    return dataclasses.replace(job, mcp_subscription_id=subscription.public_id, mcp_secrets=secrets,
                               message_id=message_id)


def signing_secrets(secret: str, previous: str | None, previous_until) -> tuple[str, ...]:
    """The (sealed) secrets an MCP-managed endpoint's deliveries are signed
    with: its secret, and the one it replaced while their overlap lasts."""
    return (secret, previous) if previous_until and previous_until > now() else (secret,)


def item_event_id(item: InboxItem) -> str:
    return "evt_" + item.token[4:]


def _bind_items(deliveries: list[Delivery]) -> None:
    """At an `item` subscription's first claim: bind its owner's oldest
    pending item (none left: the delivery is cancelled)."""
    oldest = oldest_pending({d.subscription.owner_id for d in deliveries})
    for delivery in deliveries:
        delivery.item = oldest.get(delivery.subscription.owner_id)


def _item_ready(delivery: Delivery) -> bool:
    """For an `item` subscription's delivery: an item is bound (see
    `_bind_items`), and may still be delivered (on a retry it may have been
    acknowledged by other means meanwhile, or its owner may have left its
    space: the delivery is done with, and the next item is offered)."""
    if delivery.subscription.kind != Subscription.Kind.ITEM:
        return True
    item = delivery.item
    if item is None or item.state != InboxItem.State.PENDING or item.admission != InboxItem.Admission.ADMITTED:
        return False
    # Bound just now (no body yet) from what was deliverable; a retry looks again.
    return delivery.body is None or deliverable(item.member_id).filter(pk=item.pk).exists()


def _finish(delivery: Delivery, state: str) -> None:
    Delivery.objects.filter(pk=delivery.pk).update(state=state, finished_at=now(), claimed_until=None)


def retry_delay(attempt: int, retry_after: float | None) -> float:
    """About 5 s after the first failure, doubling, capped at 10 minutes,
    ±20% jitter; a Retry-After is honoured up to the cap."""
    base = min(FIRST_RETRY_SECONDS * 2 ** (attempt - 1), MAX_RETRY_SECONDS)
    delay = base * random.uniform(1 - JITTER, 1 + JITTER)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, MAX_RETRY_SECONDS)


@dataclass(frozen=True)
class Result:
    job: Job
    outcome: Outcome
    key_id: str
    started_at: dt.datetime


def log_attempt(result: Result) -> Result:
    """One line per attempt, as its answer comes (never the URL, a header or
    the body)."""
    job, outcome = result.job, result.outcome
    verdict = "delivered" if outcome.ok else "failed"
    wake_log.info("wake %s attempt %d %s (%s)", job.public_id, job.number, verdict,
                  outcome.status_code or outcome.error_class,
                  extra={"delivery_id": job.public_id, "subscription_id": job.subscription_id,
                         "attempt": job.number, "outcome": verdict, "status": outcome.status_code,
                         "error": outcome.error_class, "duration_ms": outcome.duration_ms,
                         "after": job.event_range[0], "through": job.event_range[1],
                         "request_ids": list(job.request_ids)})
    return result


def record(results: list[Result], *, hand_off: int = 0, keep_free: int = 0) -> list[Job]:
    """Store the attempts and apply their outcomes, in one transaction. An
    outcome only changes a delivery that is still its attempt's: one whose
    lease ran out and was claimed again belongs to the newer attempt.
    Up to `hand_off` pushed items' next ones (the pump's room, while it may
    claim) are claimed for this worker in the same transaction
    (`_hand_off`): the jobs to send at once. While something else is due,
    `keep_free` of that room is left for the claim that takes it. The other
    pushed subscriptions' next items are offered, for the next claim.

    Each failed outcome is applied in a savepoint of its own: one that cannot
    be (a suspension notice that fails, say) is logged and leaves only its
    own delivery `sending`, to be claimed again when its lease runs out; the
    rest of the batch is recorded."""
    if not results:
        return []
    with transaction.atomic():
        insert_attempts([(r.job.delivery_id, r.job.number, r.started_at, r.outcome.duration_ms,
                          r.outcome.status_code, r.outcome.error_class, r.key_id) for r in results])
        faults.point("webhooks.record")  # mid-record: the transaction is lost with the process
        # Most answers are a 2xx: one statement finishes them all.
        answered = [(r.job.delivery_id, r.job.number) for r in results if r.outcome.ok]
        delivered = mark_delivered(answered, now()) if answered else []
        pushed = [(subscription, item, owner) for subscription, item, owner in delivered if item is not None]
        # A pushed item's 2xx is its receipt, though an unsubscribe cancelled its delivery in flight: it was
        # recorded and the item left pending, to be pushed again after a new subscribe.
        received = cancelled_receipts(answered) if len(delivered) < len(answered) else []
        failed = [r for r in results if not r.outcome.ok]
        return _record_rest(pushed, failed, hand_off, keep_free, received) if pushed or failed or received else []


def _record_rest(pushed: list[tuple[int, int, int]], failed: list[Result], hand_off: int, keep_free: int,
                 received: list[tuple[int, int]]) -> list[Job]:
    """The pushed items' 2xx answers, as (subscription id, item id, owner id)
    of the deliveries `mark_delivered` finished, and the failures of a batch:
    deliveries before mailboxes, as always. `received`: (item id, owner id)
    of pushed items whose deliveries were cancelled in flight, acknowledged
    as the others are. Returns `_hand_off`'s jobs."""
    # The deliveries only (not their subscriptions, which a send's commit
    # checks its new deliveries' keys against), as no-key locks (mailbox.lock).
    current = {d.pk: d for d in Delivery.objects.select_for_update(of=("self",), no_key=True)
               .select_related("subscription")
               .filter(pk__in=[r.job.delivery_id for r in failed], state=Delivery.State.SENDING)} if failed else {}
    # Every mailbox this batch may count into (a suspension notice) or out
    # of (a pushed item acknowledged), in member order, before the log head.
    mailbox.lock([owner for _, _, owner in pushed] + [owner for _, owner in received]
                 + [d.subscription.owner_id for d in current.values()])
    for r in failed:
        delivery = current.get(r.job.delivery_id)
        if delivery is None or delivery.attempts != r.job.number:
            continue  # cancelled, or a newer attempt owns it
        try:
            with transaction.atomic():
                _failed(delivery, r.outcome)
        except Exception:
            log.exception("recording the failed attempt %d of %s failed; it is retried after its lease",
                          r.job.number, r.job.public_id)
    # A 2xx for a pushed inbox item acknowledges it, in the transaction
    # that records the attempt, and the next pending item is offered at once.
    if acknowledged := [item for _, item, _ in pushed] + [item for item, _ in received]:
        acknowledge_items(acknowledged)
    if not pushed:
        return []
    if hand_off:
        return _hand_off(pushed, hand_off, keep_free)
    mcp.offer({subscription for subscription, _, _ in pushed}, only_if_pending=True, kick=False)
    return []


def _hand_off(pushed: list[tuple[int, int, int]], room: int, keep_free: int) -> list[Job]:
    """The next pending item of each pushed subscription's owner, claimed
    for this worker at once (webhooks.due.send_next_items) for up to `room`
    of them, the oldest items first, less `keep_free` if a claim would find
    a wake due now (`webhooks.due.anything_due`); the others are offered.
    Chains with long backlogs thus never hold every send of a worker while
    other wakes wait, and cost nothing more while none do. A hand-off is
    what offering the item and claiming the offer would do, without a
    claim's reads and second transaction. The item is the one a claim would
    bind (`oldest_pending`: admitted, not held back); a subscription that
    may no longer send, or has another delivery unfinished, gets none here,
    as a claim would cancel or skip it."""
    owners = {owner for _, _, owner in pushed}
    oldest = oldest_pending(owners)
    waiting = sorted(((subscription, oldest[owner]) for subscription, _, owner in pushed if owner in oldest),
                     key=lambda pair: pair[1].pk)
    # A member's hand-offs take places of their PER_OWNER as a claim's wakes do: past them, offered.
    places = {owner: PER_OWNER - count for owner, count in in_flight_of(owners, ready_params(now())).items()}
    owner_of = {subscription: owner for subscription, _, owner in pushed}
    within, over = [], []
    for subscription, item in waiting:
        owner = owner_of[subscription]
        places[owner] = places.get(owner, PER_OWNER) - 1
        (within if places[owner] >= 0 else over).append((subscription, item))
    if len(within) > room - keep_free and anything_due(ready_params(now(), limit=1)):
        room = max(0, room - keep_free)
    if over or len(within) > room:
        mcp.offer({subscription for subscription, _ in over + within[room:]}, kick=False)
    items = dict(within[:room])
    bodies = {subscription: mcp.item_body(item) for subscription, item in items.items()}
    at = now()
    claimed_now = send_next_items([(s, item.pk, bodies[s]) for s, item in items.items()], at, at + lease())
    jobs = []
    for subscription, (delivery_id, public_id, subscription_public_id, url, secret, previous, previous_until) \
            in claimed_now.items():
        item = items[subscription]
        jobs.append(Job(delivery_id, public_id, 1, url, secret, bodies[subscription].encode(),
                        mcp_subscription_id=subscription_public_id,
                        mcp_secrets=signing_secrets(secret, previous, previous_until),
                        message_id=item_event_id(item), subscription_id=subscription_public_id, item_id=item.pk))
    return jobs


def record_or_leave(results: list[Result], hand_off: int = 0, keep_free: int = 0) -> list[Job]:
    """`record`, for the pump (webhooks.pump). A lost connection (the database restarted) is
    replaced and the batch recorded again, RECORD_TRIES times in all: the
    receivers' answers are only in memory. If it still cannot be recorded,
    its deliveries stay `sending` and their leases bring them back; the pump
    goes on."""
    for attempt in range(1, RECORD_TRIES + 1):
        try:
            return record(results, hand_off=hand_off, keep_free=keep_free)
        except (OperationalError, InterfaceError):
            connections.close_all()  # a broken connection is not reused
            if attempt == RECORD_TRIES:
                log.exception("recording %d webhook attempts failed; they are retried after their leases",
                              len(results))
            else:
                time.sleep(RECORD_RETRY_SECONDS * attempt)
        except Exception:
            connections.close_all()
            log.exception("recording %d webhook attempts failed; they are retried after their leases", len(results))
            return []
    return []


def _failed(delivery: Delivery, outcome: Outcome) -> None:
    if outcome.status_code in TERMINAL_STATUSES:
        suspend(delivery.subscription, f"The receiver answered {outcome.status_code}: a terminal rejection.",
                f"http_{outcome.status_code}", terminal=True)
        _finish(delivery, Delivery.State.FAILED)
    elif delivery.attempts >= SUSPEND_AFTER_ATTEMPTS and now() - delivery.first_attempt_at >= SUSPEND_AFTER:
        error = outcome.error_class or f"http_{outcome.status_code}"
        suspend(delivery.subscription, f"{delivery.attempts} attempts over more than an hour failed.", error,
                terminal=False)
        _finish(delivery, Delivery.State.FAILED)
        # Its range back to the outbox (not a replay's, an old range sent again;
        # nor a pushed item's, which stays pending in the inbox).
        if delivery.subscription.kind != Subscription.Kind.ITEM and delivery.replay_of_id is None:
            outbox.hand_back(delivery)
    else:
        Delivery.objects.filter(pk=delivery.pk).update(
            state=Delivery.State.PENDING, claimed_until=None,
            due_at=now() + dt.timedelta(seconds=retry_delay(delivery.attempts, outcome.retry_after)))


def suspend(subscription: Subscription, reason: str, error: str, *, terminal: bool) -> None:
    """Suspend the subscription and tell its owner (an inbox item and an
    event in their inbox feed). In the caller's transaction."""

    locked = Subscription.objects.select_for_update(no_key=True).get(pk=subscription.pk)
    if locked.status in (Subscription.Status.SUSPENDED, Subscription.Status.DELETED):
        return
    locked.status, locked.suspended_reason, locked.suspended_error = Subscription.Status.SUSPENDED, reason, error
    locked.suspended_at, locked.terminal = now(), terminal
    locked.save(update_fields=["status", "suspended_reason", "suspended_error", "suspended_at", "terminal"])
    payload = {"kind": "subscription.suspended", "subscription": locked.public_id, "reason": reason,
               "lastError": error, "terminal": terminal}
    event = notices.private_event("subscription.suspended", {"subscription": locked.public_id, "reason": reason,
                                                             "last_error": error, "terminal": terminal},
                                  locked.owner, space_id=locked.space_id)
    notices.post_notice(locked.owner, payload, event)


def next_due_in(horizon: float) -> float | None:
    """Seconds until the next delivery falls due (0 if one is due), or None
    if none does within `horizon` seconds."""
    at = now()
    params = ready_params(at)
    candidates = [
        soonest_due_at(params),
        soonest_claim_end(params),
        at if set_by_wrong_clock(params) else None,  # due now
    ]
    waits = [max(0.0, (c - at).total_seconds()) for c in candidates if c is not None]
    soonest = min(waits, default=None)
    return soonest if soonest is not None and soonest <= horizon else None
