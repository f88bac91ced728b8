"""MCP-managed webhook subscriptions: the Events extension's webhook mode
(`events/subscribe`, `events/unsubscribe`), on the same rows, claims,
attempts, retries, suspension and SSRF-safe transport as every other
subscription.

- A subscription is keyed by (member, URL, event name, canonical-JSON
  arguments); its id (`sub_…`) is a keyed digest of that key, so a refresh
  with the same identity keeps it. Each has a managed endpoint of its own,
  which the ordinary webhook routes refuse to change.
- Before it is first used, and whenever its secret changes, the receiver
  answers a signed `{"type": "verification", "challenge"}` (the endpoint
  verification of webhooks.services, cached 10 minutes per member, URL and
  secret). A new secret replaces the old, which keeps signing beside it for
  ROTATION_OVERLAP.
- Leases: 24 hours by default (also for `ttlMs: null`), at least 60 seconds,
  at most 7 days. Past its lease nothing is sent; pending work is kept for
  a refresh, until a new subscription of the member needs its place under
  the limits. A refresh of a subscription suspended after its retries ran
  out resumes it.
- Unsubscribing deletes the subscription; the hourly `reap_deleted`
  removes it with its managed endpoint a day later.
- `inbox.item` sends one pending inbox item at a time, oldest first; a 2xx
  acknowledges it (webhooks.engine) and the next is offered at once.
  `inbox.pending` and `spaces.work.available` are range wakes, like inbox
  and space subscriptions, with bodies in the extension's shape.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Iterable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import BooleanField, Exists, OuterRef
from django.db.models.expressions import RawSQL

from controlplane.access import get_readable_space, require_receiving
from controlplane.clock import now, rfc3339
from controlplane.cursors import caller_id, pack_cursor
from controlplane.errors import Conflict, Forbidden, InvalidUrl, LimitExceeded, NotFound
from controlplane.keys import purpose_key
from controlplane.models import Credential, Member, Space
from coordination.models import Task
from inbox.delivery import deliverable, pending_count
from inbox.models import InboxItem
from inbox.render import item_occurrence
from webhooks import crypto, due
from webhooks.models import Delivery, Endpoint, Subscription
from webhooks.destinations import validate_url
from webhooks.reaper import DELETED_KEPT, remove_endpoints

ITEM = "org.switchboard/inbox.item"
PENDING = "org.switchboard/inbox.pending"
WORK = "spaces.work.available"
KINDS = {ITEM: Subscription.Kind.ITEM, PENDING: Subscription.Kind.INBOX, WORK: Subscription.Kind.SPACE}

DEFAULT_LEASE = dt.timedelta(hours=24)
MIN_LEASE = dt.timedelta(seconds=60)
MAX_LEASE = dt.timedelta(days=7)
ROTATION_OVERLAP = dt.timedelta(minutes=5)
SUBSCRIPTION_HEADER = "X-MCP-Subscription-Id"


def canonical(arguments: dict) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def subscription_id(member: Member, url: str, name: str, arguments: dict) -> str:
    """Deterministic over the subscription's identity, and keyed, so it says
    nothing about the URL or arguments to whoever sees it."""
    key = "\x00".join([member.public_id, url, name, canonical(arguments)]).encode()
    digest = hmac.new(purpose_key("mcp-subscription-id"), key, hashlib.sha256).digest()
    return "sub_" + base64.b32encode(digest[:10]).decode().lower()  # the shape of every public id


def lease_for(ttl_ms: int | None) -> dt.timedelta:
    """The lease granted for a suggested TTL (none, or null: the default)."""
    if ttl_ms is None:
        return DEFAULT_LEASE
    bounded = min(max(ttl_ms, MIN_LEASE // dt.timedelta(milliseconds=1)), MAX_LEASE // dt.timedelta(milliseconds=1))
    return dt.timedelta(milliseconds=bounded)  # bounded first: any integer is a suggestion


def subscribe(member: Member, name: str, arguments: dict, url: str, secret: str, *, ttl_ms: int | None,
              resolver=None, credential_id: str | None = None) -> dict:
    """Create or refresh the subscription for this identity; verify the
    receiver first when its URL and secret are not verified yet. Returns
    `{id, refreshBefore, cursor, truncated}`. A subscription its receiver
    rejected for good (410, 413) is not revived by a refresh: unsubscribe
    and subscribe again once the receiver is fixed. It is the credential's
    (`credential_id`, the public id) that made or last refreshed it:
    revoking that one deletes it (`end_for_credential`)."""
    # Imported here: webhooks.services imports the engine, which imports this module.
    from webhooks.services import catch_up_locked
    from webhooks.verification import verify_endpoint

    if not url.lower().startswith("https://"):  # even where development allows plain http for wakes
        raise InvalidUrl("An MCP callback URL must be https://.", details={"reason": "not_https"})
    url = validate_url(url)
    crypto.parse_secret(secret)
    space = get_readable_space(arguments["space"], member) if name == WORK else None
    if space is not None:
        require_receiving(space, member)
    task = work_task(space, arguments) if name == WORK else None
    public_id = subscription_id(member, url, name, arguments)
    existing = Subscription.objects.filter(public_id=public_id, owner=member).select_related("endpoint").first()
    live = _refuse_or_count(existing, member, space, make_room=False)
    candidate = Endpoint(owner=member, url=url, secret=crypto.seal_secret(secret), managed=True)
    if live and existing.endpoint.verified_digest == crypto.target_digest(url, secret) \
            and existing.lease_expires_at is not None and existing.lease_expires_at > now():
        # A refresh within its lease, to the URL and secret its receiver consented to: no new
        # challenge (each one was a request to the receiver, and counted against VERIFY_PER_HOUR).
        verified_at = existing.endpoint.verified_at
    else:
        # The receiver's consent, outside any transaction (network I/O).
        verified_at = verify_endpoint(candidate, resolver=resolver, mcp_subscription_id=public_id)
    lease_until = now() + lease_for(ttl_ms)
    with transaction.atomic():
        # The member's subscribes and unsubscribes take turns (as ordinary
        # subscriptions are created): the row and the limits are as read.
        Member.take_turns(member.pk)
        # Read under that turn, which a revocation takes before it deletes the credential: one revoked
        # while the receiver was being verified (outside any transaction) made a subscription that no
        # revocation ends, sending the member's messages for up to its week's lease.
        credential = Credential.objects.filter(public_id=credential_id, member=member).first()
        if credential_id is not None and credential is None:
            raise Forbidden("The credential making this request was revoked.")
        row = Subscription.objects.filter(public_id=public_id, owner=member).first()
        live = _refuse_or_count(row, member, space, make_room=True)
        if row is None:
            candidate.save()
            row = Subscription.objects.create(public_id=public_id, owner=member, endpoint=candidate,
                                              kind=KINDS[name], space=space, debounce_ms=0, mcp_name=name,
                                              mcp_arguments=arguments,
                                              conversation_ids=[task.conversation_id] if task else None)
        _store_secret(row.endpoint_id, candidate.secret, verified_at, rotate=live)
        fields = {"lease_expires_at": lease_until, "credential": credential}
        if not live:  # new, or deleted before: starts afresh from now
            fields.update(status=Subscription.Status.INACTIVE, activation_position=None, terminal=False,
                          suspended_reason=None, suspended_error=None, suspended_at=None, deleted_at=None)
        resumed = live and row.status == Subscription.Status.SUSPENDED  # after its retries ran out: sent again
        if resumed:
            fields.update(status=Subscription.Status.ACTIVE, suspended_reason=None, suspended_error=None,
                          suspended_at=None)
        Subscription.objects.filter(pk=row.pk).update(**fields)
        row.refresh_from_db()
        if not live:
            _activate(row)
        if row.kind == Subscription.Kind.ITEM:
            offer([row.pk])
        elif resumed:
            catch_up_locked(Subscription.objects.select_for_update(no_key=True).get(pk=row.pk))
    return {"id": public_id, "refreshBefore": rfc3339(lease_until), "cursor": None, "truncated": False}


def _refuse_or_count(row: Subscription | None, member: Member, space: Space | None, *, make_room: bool) -> bool:
    """Whether `row` (this identity's subscription, if any) is live. One its
    receiver rejected for good is refused. A new one counts against the
    member's limits; past them, with `make_room` (under the member's lock),
    the member's subscriptions whose lease ran out (not those rejected for
    good) are deleted to make room."""
    from webhooks.services import check_limits

    live = row is not None and row.status != Subscription.Status.DELETED
    if live and row.terminal:
        raise Conflict("The receiver rejected this subscription for good (HTTP 410 or 413); unsubscribe, fix the "
                       "receiver and subscribe again.", details={"reason": "terminal"})
    if not live:
        try:
            check_limits(member, space=space)
        except LimitExceeded:
            lapsed = list(_lapsed(member))
            if not lapsed:
                raise
            if make_room:
                _delete(lapsed)
                check_limits(member, space=space)
    return live


def _lapsed(member: Member):
    """`member`'s MCP subscriptions whose lease ran out, but for those
    rejected for good (which only an unsubscribe clears)."""
    return (Subscription.objects.filter(owner=member, mcp_name__isnull=False, lease_expires_at__lte=now(),
                                        terminal=False).exclude(status=Subscription.Status.DELETED))


def _delete(subscriptions) -> None:
    from webhooks.services import delete_subscription

    for subscription in subscriptions:
        delete_subscription(subscription, managed=True)


def _activate(subscription: Subscription) -> None:
    from webhooks.services import activate_locked

    activate_locked(subscription)


def _store_secret(endpoint_id: int, sealed: str, verified_at, *, rotate: bool) -> None:
    """The endpoint's secret is the one just verified; on a rotation the
    previous one keeps signing beside it for ROTATION_OVERLAP. A
    subscription made anew (after an unsubscribe) keeps no earlier one."""
    endpoint = Endpoint.objects.select_for_update(no_key=True).get(pk=endpoint_id)
    secret = crypto.open_secret(sealed)
    if not rotate:
        endpoint.previous_secret = endpoint.previous_secret_until = None
    elif crypto.open_secret(endpoint.secret) != secret:
        endpoint.previous_secret, endpoint.previous_secret_until = endpoint.secret, now() + ROTATION_OVERLAP
    endpoint.secret, endpoint.verified_at = sealed, verified_at
    endpoint.verified_digest = crypto.target_digest(endpoint.url, secret)
    endpoint.save()


def unsubscribe(member: Member, name: str, arguments: dict, url: str) -> bool:
    """Delete the subscription of this identity: unsent deliveries are
    cancelled (pending inbox items stay in the inbox). False if none. Its
    managed endpoint counts against no limit, and goes with it a day later
    (`reap_deleted`)."""
    with transaction.atomic():
        Member.take_turns(member.pk)  # as subscribe does
        subscription = (Subscription.objects.filter(public_id=subscription_id(member, url, name, arguments),
                                                    owner=member).exclude(status=Subscription.Status.DELETED)
                        .first())
        if subscription is None:
            return False
        _delete([subscription])
    return True


def end_for_credential(sender, credential: Credential, **kwargs) -> None:
    """Delete the subscriptions `credential` made or last refreshed, in its
    revocation's transaction (controlplane.bearer.credential_revoked): they
    send whole messages, and a token taken and then revoked kept them going
    until their lease ran out, up to a week."""
    Member.take_turns(credential.member_id)  # as subscribe and unsubscribe do
    _delete(Subscription.objects.filter(credential=credential, mcp_name__isnull=False)
            .exclude(status=Subscription.Status.DELETED))


def reap_deleted(limit: int = 1000) -> int:
    """Remove, with their managed endpoints and deliveries, MCP
    subscriptions deleted more than DELETED_KEPT ago, at most `limit` a run
    (webhooks.reaper.remove_endpoints: under the owner's lock, as subscribe
    takes it), and only if still deleted (a subscribe may bring one back).
    Returns how many."""
    candidates = list(Subscription.objects.filter(
        mcp_name__isnull=False, status=Subscription.Status.DELETED, deleted_at__lt=now() - DELETED_KEPT,
        endpoint__managed=True).values_list("pk", "owner_id")[:limit])
    return sum(remove_endpoints(owner_id, Endpoint.objects.filter(
        managed=True, subscriptions__pk=pk, subscriptions__status=Subscription.Status.DELETED))
        for pk, owner_id in candidates)


def offer_waiting(owner_id: int | None = None) -> int:
    """The sweep's guarantee for `item` subscriptions (a lost kick, a
    notice committed after its event's hook ran): each one (of `owner_id`'s,
    with one) that may send, has a pending item and nothing unfinished gets
    a delivery. Returns how many were offered."""
    pending = deliverable(OuterRef("owner"))
    unfinished = Delivery.objects.filter(subscription=OuterRef("pk"), state__in=Delivery.UNFINISHED)
    may_send = RawSQL(due.sendable("%s", connection.ops.quote_name(Subscription._meta.db_table)),
                      [connection.ops.adapt_datetimefield_value(now())], output_field=BooleanField())
    subscriptions = Subscription.objects.filter(owner_id=owner_id) if owner_id is not None else Subscription.objects
    waiting = list(subscriptions.filter(may_send, kind=Subscription.Kind.ITEM)
                   .filter(Exists(pending)).exclude(Exists(unfinished))
                   .values_list("pk", flat=True))
    with transaction.atomic():
        offer(waiting)
    return len(waiting)


def offer(subscription_ids: Iterable[int], *, only_if_pending: bool = False, kick: bool = True) -> None:
    """Make sure each `item` subscription has a delivery to send: an open
    one, due now, unless one is unfinished already (one item in flight).
    Which item it carries is chosen when it is first claimed (a delivery
    that finds none is cancelled, and offers nothing more); a worker that
    records a 2xx and may go on claiming binds and claims the next one
    itself instead, while it has room (webhooks.engine._hand_off).
    `only_if_pending`: only if its owner has a pending item now (after a
    hand-off; an append hook may run before its notice's item exists, so it
    offers regardless). In the caller's transaction, one statement however
    many (webhooks.due.open_item_deliveries); the kick after commit is a
    nudge, the sweep the guarantee.
    The engine itself offers with `kick=False`: its own pump claims what is
    due as soon as it records."""
    ids = list(set(subscription_ids))
    if ids and due.open_item_deliveries(ids, now(), only_if_pending=only_if_pending) and kick:
        due.kick_on_commit()


def body(delivery: Delivery) -> str:
    """The extension's webhook body: `{eventId, name, timestamp, data,
    cursor}`. For `inbox.item` the event id is the item's; the range wakes'
    is the delivery's, the same on every retry."""
    subscription = delivery.subscription
    if subscription.kind == Subscription.Kind.ITEM:
        return item_body(delivery.item)
    data = {"pendingCount": pending_count(subscription.owner)} if subscription.mcp_name == PENDING else _work(delivery)
    return _dumps({"eventId": delivery.public_id, "name": subscription.mcp_name,
                   "timestamp": rfc3339(delivery.created_at), "data": data})


def item_body(item: InboxItem) -> str:
    """The webhook body of a push of `item` (`inbox.item`)."""
    return _dumps(item_occurrence(item, ITEM))


def _dumps(occurrence: dict) -> str:
    return json.dumps({**occurrence, "cursor": None}, separators=(",", ":"), ensure_ascii=False)


def work_task(space: Space, arguments: dict) -> Task | None:
    """The task `spaces.work.available`'s optional `task_id` narrows it to
    (its events and its discussion), which must be one of `space`'s."""
    if arguments.get("task_id") is None:
        return None
    task = Task.objects.filter(space=space, public_id=arguments["task_id"]).first()
    if task is None:
        raise NotFound("No such task in this space.", details={"task_id": arguments["task_id"]})
    return task


def work_data(space: Space, owner: Member, after: int, through: int, arguments: dict) -> dict:
    """`spaces.work.available`'s data: the range of the space feed to read,
    as the owner's own cursors, and the task it is narrowed to, if any."""
    stream, caller = f"space:{space.public_id}", caller_id(owner)
    data = {"space": space.slug, "url": f"{settings.SWITCHBOARD_PUBLIC_URL}/v0/spaces/{space.slug}/events",
            "event_range": {"after": pack_cursor((after,), caller=caller, stream=stream),
                            "through": pack_cursor((through,), caller=caller, stream=stream)}}
    if arguments.get("task_id"):
        data["task_id"] = arguments["task_id"]
    return data


def _work(delivery: Delivery) -> dict:
    subscription = delivery.subscription
    return work_data(subscription.space, subscription.owner, delivery.after_position, delivery.through_position,
                     subscription.mcp_arguments or {})
