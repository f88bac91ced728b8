"""Endpoints, subscriptions, history and replay (SPEC §8); their verification
is webhooks.verification."""
from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.db.models import Q

from controlplane import audit
from controlplane.access import require_receiving
from controlplane.clock import now
from controlplane.errors import Conflict, InvalidRequest, LimitExceeded, NotFound
from controlplane.models import Conversation, LogHead, Member, Space
from coordination.models import Task
from webhooks import crypto, due
from webhooks.engine import lease
from webhooks.wakes import feed_cursor
from webhooks.models import Delivery, Endpoint, SigningKey, Subscription
from webhooks.outbox import extend_or_open, last_through
from webhooks.destinations import validate_url

MAX_ENDPOINTS = 20
MAX_UNFINISHED_REPLAYS = 10
MAX_PER_SPACE = 20
MAX_INBOX = 20
MAX_SUBSCRIPTIONS = 100
MAX_SUBJECTS = 20
MAX_DEBOUNCE_MS = 60_000
RETIRED_KEY_GRACE = dt.timedelta(hours=1)


# --- endpoints --------------------------------------------------------------------

def create_endpoint(owner: Member, url: str, secret: str | None, *, actor: Member) -> Endpoint:
    validate_url(url)
    if secret is not None:
        crypto.parse_secret(secret)
    with transaction.atomic():
        # Lock the owner's row so concurrent creations count each other.
        Member.take_turns(owner.pk)
        if Endpoint.objects.owned_by(owner).filter(managed=False).count() >= MAX_ENDPOINTS:
            raise LimitExceeded(f"At most {MAX_ENDPOINTS} webhook endpoints per owner.")
        endpoint = Endpoint.objects.create(owner=owner, url=url, secret=crypto.seal_secret(secret))
        audit.record("webhook.endpoint_created", endpoint.public_id, actor=actor, owner=owner.public_id)
        return endpoint


def owned_endpoint(endpoint_id: str, owner: Member) -> Endpoint:
    endpoint = Endpoint.objects.owned_by(owner).filter(public_id=endpoint_id).first()
    if endpoint is None:
        raise NotFound("No such webhook endpoint.")
    return endpoint


def is_verified(endpoint: Endpoint) -> bool:
    secret = crypto.open_secret(endpoint.secret)
    return endpoint.verified_at is not None and endpoint.verified_digest == crypto.target_digest(endpoint.url, secret)


def delete_endpoint(endpoint: Endpoint) -> None:
    """Delete the endpoint and its subscriptions, atomically: unsent wakes
    are cancelled (a request in flight may finish, and its attempt is
    recorded). The rows stay until `webhooks.reaper` removes them a day
    later: a worker may be recording a batch with one of its deliveries
    now. Under the owner's lock, as subscriptions are created on it."""
    refuse_managed(endpoint)
    with transaction.atomic():
        Member.take_turns(endpoint.owner_id)
        _delete_subscriptions(Subscription.objects.filter(endpoint=endpoint))
        Endpoint.objects.owned_by(endpoint.owner_id).filter(pk=endpoint.pk).update(deleted_at=now())


# --- subscriptions ----------------------------------------------------------------

def _check_debounce(debounce_ms: int) -> None:
    if not 0 <= debounce_ms <= MAX_DEBOUNCE_MS:
        raise InvalidRequest(f"debounce_ms must be 0–{MAX_DEBOUNCE_MS}.")


def _conversation_subjects(space: Space, subjects: list[dict], owner: Member) -> list[int] | None:
    if not subjects:
        return None
    if len(subjects) > MAX_SUBJECTS:
        raise InvalidRequest(f"At most {MAX_SUBJECTS} subjects.")
    if len({(subject.get("type"), subject.get("id")) for subject in subjects}) < len(subjects):
        raise InvalidRequest("A subscription lists each subject once.")
    ids = []
    for subject in subjects:
        if subject.get("type") == "task":  # a task's events and its discussion are on its channel
            task = Task.objects.select_related("conversation").filter(space=space, public_id=subject.get("id")).first()
            if task is None:
                raise NotFound("No such task in this space.", details={"subject": subject})
            ids.append(task.conversation_id)
            continue
        if subject.get("type") != "conversation":
            raise InvalidRequest("Subjects are conversations or tasks.", details={"subject": subject})
        conversation = Conversation.objects.filter(space=space, public_id=subject.get("id")).first()
        restricted = conversation is not None and conversation.kind != Conversation.Kind.CHANNEL
        if conversation is None or (restricted and not conversation.participants.filter(member=owner).exists()):
            raise NotFound("No such conversation in this space.", details={"subject": subject})
        ids.append(conversation.pk)
    return list(dict.fromkeys(ids))  # a task and its channel are one conversation


def check_limits(owner: Member, *, space: Space | None) -> None:
    """LIMIT_EXCEEDED past 100 subscriptions, 20 of one space (`space`) or
    20 of the owner's inbox (no space), MCP-managed ones included."""
    live = Subscription.objects.filter(owner=owner).exclude(status=Subscription.Status.DELETED)
    if live.count() >= MAX_SUBSCRIPTIONS:
        raise LimitExceeded(f"At most {MAX_SUBSCRIPTIONS} subscriptions per owner.")
    if space is not None and live.filter(space=space).count() >= MAX_PER_SPACE:
        raise LimitExceeded(f"At most {MAX_PER_SPACE} subscriptions per space and owner.")
    if space is None and live.filter(kind__in=[Subscription.Kind.INBOX, Subscription.Kind.ITEM]).count() >= MAX_INBOX:
        raise LimitExceeded(f"At most {MAX_INBOX} inbox subscriptions per owner.")


def create_subscription(owner: Member, endpoint_id: str, *, space: Space | None = None, subjects=None,
                        exclude_self: bool = False, debounce_ms: int = 1000, activate: bool = False) -> Subscription:
    """A space subscription (`space` given) or an inbox one; created
    inactive, or with `activate` created and activated in one transaction."""
    _check_debounce(debounce_ms)
    endpoint = owned_endpoint(endpoint_id, owner)
    refuse_managed(endpoint)
    if activate:
        _require_verified(endpoint)
    conversation_ids = None
    if space is not None:
        require_receiving(space, owner)
        conversation_ids = _conversation_subjects(space, subjects or [], owner)
    with transaction.atomic():
        Member.take_turns(owner.pk)
        endpoint = owned_endpoint(endpoint_id, owner)  # again under the lock: not deleted meanwhile
        check_limits(owner, space=space)
        subscription = Subscription.objects.create(
            owner=owner, endpoint=endpoint, space=space,
            kind=Subscription.Kind.SPACE if space is not None else Subscription.Kind.INBOX,
            subjects=subjects or [], conversation_ids=conversation_ids, exclude_self=exclude_self,
            debounce_ms=debounce_ms)
        if activate:
            activate_locked(subscription)
    return subscription


def owned_subscription(subscription_id: str, owner: Member, *, space_slug: str | None = None,
                       kinds: tuple[str, ...] | None = None) -> Subscription:
    """`owner`'s subscription (of `kinds`; of the space `space_slug`), 404
    otherwise. Owning it is what it takes: a member who can no longer see
    the space (removed from a private one) still reads, pauses and deletes
    their subscriptions to it, which would else count against their limit
    for good; it wakes them no more (engine.may_receive)."""
    found = Subscription.objects.select_related("endpoint", "space", "owner").filter(
        public_id=subscription_id, owner=owner).exclude(status=Subscription.Status.DELETED)
    if kinds is not None:
        found = found.filter(kind__in=kinds)
    if space_slug is not None:
        found = found.filter(space__slug=space_slug)
    subscription = found.first()
    if subscription is None:
        raise NotFound("No such subscription.")
    return subscription


def _head_position_locked() -> int:
    """The log head, read under its row lock: no append is between taking a
    position and committing while we hold it, so every event at or below it
    is committed and every later one will see what we commit."""
    head = LogHead.objects.select_for_update(no_key=True).filter(id=1).first()
    return head.position if head else 0


def activate(subscription: Subscription) -> int:
    """Activate: only events committed after this qualify. Returns the
    activation position (the activation cursor's)."""
    refuse_managed(subscription)
    _require_verified(subscription.endpoint)
    if subscription.kind == Subscription.Kind.SPACE:
        require_receiving(subscription.space, subscription.owner)
    with transaction.atomic():
        activate_locked(subscription)
    subscription.refresh_from_db()
    return subscription.activation_position


def _require_verified(endpoint: Endpoint) -> None:
    if not is_verified(endpoint):
        raise Conflict("Verify the endpoint first: it must answer a signed challenge.",
                       details={"endpoint_id": endpoint.public_id})


def refuse_managed(record) -> None:
    """The ordinary webhook routes leave MCP-managed endpoints and
    subscriptions alone: events/subscribe and events/unsubscribe change them."""
    if record.managed:
        raise Conflict("This is managed through MCP (events/subscribe and events/unsubscribe).",
                       details={"managed_by": "mcp"})


def _lock_undeleted(subscription: Subscription) -> Subscription:
    """`subscription`'s row, locked, unless it was deleted since it was read
    (NOT_FOUND): a change that read it before must not bring it back."""
    locked = Subscription.objects.select_for_update(no_key=True).get(pk=subscription.pk)
    if locked.status == Subscription.Status.DELETED:
        raise NotFound("No such subscription.")
    return locked


def activate_locked(subscription: Subscription) -> None:
    """Activate `subscription` under its row lock, in the caller's transaction."""
    locked = _lock_undeleted(subscription)
    if locked.status == Subscription.Status.SUSPENDED and locked.terminal:
        raise Conflict("The receiver rejected this subscription for good; create a new one.")
    if locked.activation_position is None:
        locked.activation_position = _head_position_locked()
        locked.status = Subscription.Status.ACTIVE
        locked.version += 1
        locked.save(update_fields=["activation_position", "status", "version"])


def update_subscription(subscription: Subscription, *, status: str | None, debounce_ms: int | None) -> Subscription:
    """Pause, resume (with a catch-up wake for what was missed) or change the
    debounce window. A space subscription resumes only as it activates:
    while its owner receives from the space."""
    refuse_managed(subscription)
    if debounce_ms is not None:
        _check_debounce(debounce_ms)
    if status == Subscription.Status.ACTIVE and subscription.kind == Subscription.Kind.SPACE:
        require_receiving(subscription.space, subscription.owner)
    with transaction.atomic():
        locked = _lock_undeleted(subscription)
        changed = []
        if debounce_ms is not None and debounce_ms != locked.debounce_ms:
            locked.debounce_ms = debounce_ms
            changed.append("debounce_ms")
        if status is not None and status != locked.status:
            if locked.activation_position is None:
                raise Conflict("Activate the subscription first.")
            if locked.terminal:
                raise Conflict("The receiver rejected this subscription for good; create a new one.")
            locked.status = status
            changed.append("status")
            if status == Subscription.Status.ACTIVE:
                locked.suspended_reason = locked.suspended_error = locked.suspended_at = None
                changed += ["suspended_reason", "suspended_error", "suspended_at"]
        if changed:
            locked.version += 1
            locked.save(update_fields=[*changed, "version"])
            if "status" in changed and locked.status == Subscription.Status.ACTIVE:
                catch_up_locked(locked)
    subscription.refresh_from_db()
    return subscription


def catch_up_locked(subscription: Subscription) -> None:
    """On resuming a range subscription, under its row lock: one catch-up
    wake for everything since its last one."""
    head = _head_position_locked()
    if head > last_through(subscription.pk):
        extend_or_open(subscription.pk, head, debounce_ms=0)


def delete_subscription(subscription: Subscription, *, managed: bool = False) -> None:
    """Delete; unsent wakes are cancelled (a request in flight may finish).
    MCP-managed subscriptions only through events/unsubscribe (`managed`).
    The row stays (its history with it): the delivery engine and the outbox
    may be writing its deliveries now."""
    if not managed:
        refuse_managed(subscription)
    with transaction.atomic():
        _delete_subscriptions(Subscription.objects.filter(pk=subscription.pk))


def _delete_subscriptions(subscriptions) -> None:
    """Mark `subscriptions` (a queryset) deleted and cancel their unfinished
    deliveries, in the caller's transaction."""
    at = now()
    # The deliveries before their subscriptions, as a worker recording a
    # failure takes them (a delivery, then its subscription to suspend it).
    unfinished = Delivery.objects.filter(subscription__in=subscriptions, state__in=Delivery.UNFINISHED)
    unfinished.update(state=Delivery.State.CANCELLED, finished_at=at)
    subscriptions.exclude(status=Subscription.Status.DELETED).update(status=Subscription.Status.DELETED,
                                                                     deleted_at=at)
    # Again, under the subscriptions' locks: a replay that held one added
    # its copy after the first pass, and it stayed pending for good.
    unfinished.update(state=Delivery.State.CANCELLED, finished_at=at)


def activation_cursor(subscription: Subscription) -> str:
    return feed_cursor(subscription, subscription.activation_position)


# --- history and replay -------------------------------------------------------------

def deliveries_of(*subscriptions: Subscription):
    """The delivery history of `subscriptions`: every wake but those still
    open (in their debounce window), and but an item push's offer that
    found no item to carry and was never sent (each subscribe made one,
    shown as a `cancelled` wake no one had cancelled)."""
    return (Delivery.objects.filter(subscription__in=subscriptions).exclude(state=Delivery.State.OPEN)
            .exclude(state=Delivery.State.CANCELLED, item__isnull=True, attempts=0,
                     subscription__kind=Subscription.Kind.ITEM))


def replay(delivery_id: str, owner: Member) -> Delivery:
    """Send the same range again, as a new wake (a new id: the receiver has
    seen the old one). Its own subscription's rules apply. Only while the
    subscription is active (a paused or suspended one would hold it, and
    every claim would pass it over), and at most MAX_UNFINISHED_REPLAYS of
    one subscription not yet sent: 409 otherwise."""
    original = (Delivery.objects.select_related("subscription").filter(
        public_id=delivery_id, subscription__owner=owner).exclude(state=Delivery.State.OPEN).first())
    if original is None or original.subscription.status == Subscription.Status.DELETED:
        raise NotFound("No such delivery.")
    refuse_managed(original.subscription)
    with transaction.atomic():
        subscription = Subscription.objects.select_for_update(no_key=True).get(pk=original.subscription_id)
        if subscription.status == Subscription.Status.DELETED:  # meanwhile: as before it
            raise NotFound("No such delivery.")
        if subscription.status != Subscription.Status.ACTIVE:
            raise Conflict("Resume the subscription first: only an active one sends a replay.",
                           details={"status": subscription.status})
        if Delivery.objects.filter(subscription=subscription, state__in=Delivery.UNFINISHED,
                                   replay_of__isnull=False).count() >= MAX_UNFINISHED_REPLAYS:
            raise LimitExceeded(f"At most {MAX_UNFINISHED_REPLAYS} replays of one subscription wait to be sent.")
        copy = Delivery.objects.create(subscription=original.subscription, after_position=original.after_position,
                                       through_position=original.through_position, state=Delivery.State.PENDING,
                                       due_at=now(), replay_of=original)
        due.kick_on_commit()
    return copy


# --- signing keys -------------------------------------------------------------------

def published_keys() -> list[SigningKey]:
    """The active key, and each retired key while a request signed with it
    may still be verified: for an hour after retirement, and as long as a
    delivery claimed before its retirement is still in flight. (Retries are
    signed afresh with the active key.)"""
    crypto.active_signing_key()
    oldest_claim = (Delivery.objects.filter(state=Delivery.State.SENDING, claimed_until__isnull=False)
                    .order_by("claimed_until").values_list("claimed_until", flat=True).first())
    still_needed = Q(retired_at__gte=now() - RETIRED_KEY_GRACE)
    if oldest_claim is not None:
        still_needed |= Q(retired_at__gte=oldest_claim - lease())
    keys = SigningKey.objects.filter(Q(status=SigningKey.Status.ACTIVE) | still_needed)
    return sorted(keys, key=lambda k: (k.status != SigningKey.Status.ACTIVE, k.created_at))
