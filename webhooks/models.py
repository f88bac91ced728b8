"""Webhook endpoints, subscriptions, deliveries and attempts (SPEC §8)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from controlplane.clock import now
from controlplane.models import Credential, Member, Space
from controlplane.tokens import public_id


def new_endpoint_id() -> str:
    return public_id("whe")


def new_subscription_id() -> str:
    return public_id("whs")


def new_delivery_id() -> str:
    return public_id("whd")


def new_key_id() -> str:
    return public_id("whk")


class SigningKey(models.Model):
    """An Ed25519 key that signs wakes. One is active; retired keys stay
    published while requests signed with them may still be verified."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        RETIRED = "retired"

    key_id = models.CharField(max_length=40, unique=True, default=new_key_id, editable=False)
    public_key = models.CharField(max_length=64)  # base64url of the raw 32 bytes
    private_key = models.TextField(editable=False)  # encrypted (webhooks.crypto)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(default=now)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["status"], condition=Q(status="active"),
                                               name="one_active_signing_key")]

    def __str__(self) -> str:
        return self.key_id


class EndpointQuerySet(models.QuerySet):
    def owned_by(self, owner) -> EndpointQuerySet:
        """`owner`'s endpoints (a member or its pk), deleted ones left out:
        every listing, lookup and count of them."""
        return self.filter(owner=owner, deleted_at__isnull=True)


class Endpoint(models.Model):
    """A receiver URL owned by a member, with an optional Standard Webhooks
    secret (stored encrypted, never shown). A deleted one's row stays, with
    its subscriptions and their history, until `webhooks.reaper` removes it
    a day later: a worker may be recording one of its deliveries."""

    public_id = models.CharField(max_length=40, unique=True, default=new_endpoint_id, editable=False)
    owner = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    url = models.CharField(max_length=2048)
    secret = models.TextField(null=True, blank=True, editable=False)  # encrypted
    # A verification holds for this URL and secret: the keyed digest of both.
    verified_digest = models.CharField(max_length=64, null=True, blank=True, editable=False)
    verified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=now)
    # The receiver of one MCP-managed subscription (events/subscribe): changed
    # only through MCP. After a secret rotation the previous secret (sealed)
    # also signs deliveries until `previous_secret_until`.
    managed = models.BooleanField(default=False)
    previous_secret = models.TextField(null=True, blank=True, editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = EndpointQuerySet.as_manager()

    def __str__(self) -> str:
        return self.public_id


class Subscription(models.Model):
    class Kind(models.TextChoices):
        SPACE = "space"  # range wakes of a space's feed
        INBOX = "inbox"  # range wakes of the owner's inbox feed
        ITEM = "item"  # the owner's pending inbox items, one at a time (MCP inbox.item)

    class Status(models.TextChoices):
        INACTIVE = "inactive"
        ACTIVE = "active"
        PAUSED = "paused"
        SUSPENDED = "suspended"
        DELETED = "deleted"

    public_id = models.CharField(max_length=40, unique=True, default=new_subscription_id, editable=False)
    owner = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="subscriptions")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    space = models.ForeignKey(Space, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    subjects = models.JSONField(default=list)  # [{"type": "conversation", "id": "cnv_…"}]
    conversation_ids = models.JSONField(null=True, blank=True)  # pks of the subjects; null: every event
    exclude_self = models.BooleanField(default=False)
    debounce_ms = models.PositiveIntegerField(default=1000)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.INACTIVE)
    version = models.PositiveIntegerField(default=1)
    activation_position = models.BigIntegerField(null=True, blank=True)
    # Suspension: why, the last error class, and whether it is terminal (410/413).
    suspended_reason = models.TextField(null=True, blank=True)
    suspended_error = models.CharField(max_length=64, null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True)
    terminal = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=now)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # MCP-managed (events/subscribe): the event name and arguments, and the
    # lease; past `lease_expires_at` nothing is sent (pending work is kept).
    mcp_name = models.CharField(max_length=64, null=True, blank=True)
    mcp_arguments = models.JSONField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The credential that made or last refreshed it: revoking that ends it.
    credential = models.ForeignKey(Credential, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    @property
    def managed(self) -> bool:
        return self.mcp_name is not None

    class Meta:
        indexes = [
            models.Index(fields=["space"], name="subscription_space_active", condition=Q(status="active")),
            models.Index(fields=["owner"], name="subscription_inbox_active",
                         condition=Q(status="active", kind="inbox")),
            models.Index(fields=["owner"], name="subscription_item_active",
                         condition=Q(status="active", kind="item")),
        ]

    def __str__(self) -> str:
        return self.public_id


REQUEST_IDS_MAX = 512


class Delivery(models.Model):
    """One wake: a range of a subscription's feed, from `after` (the previous
    wake's `through`) to `through`.

    `open` while it still gathers events within the debounce window (its
    `through` moves on); frozen at its first attempt, after which every retry
    sends the same id and body; `pending` between attempts (`due_at` is the
    next one); `sending` while a worker holds it (until `claimed_until`)."""

    class State(models.TextChoices):
        OPEN = "open"
        PENDING = "pending"
        SENDING = "sending"
        DELIVERED = "delivered"
        FAILED = "failed"  # the subscription was suspended
        CANCELLED = "cancelled"  # deleted, paused past, or its owner lost access

    UNFINISHED = (State.OPEN, State.PENDING, State.SENDING)

    public_id = models.CharField(max_length=40, unique=True, default=new_delivery_id, editable=False)
    # Indexed by delivery_history, whose first column it is.
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries",
                                     db_index=False)
    after_position = models.BigIntegerField()
    through_position = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    due_at = models.DateTimeField()
    body = models.TextField(null=True, blank=True)  # the exact bytes (UTF-8), frozen at the first attempt
    attempts = models.PositiveIntegerField(default=0)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    replay_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                  db_index=False)  # delivery_replays
    created_at = models.DateTimeField(default=now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # An `item` subscription's delivery carries one inbox item, chosen at its
    # first claim (the owner's oldest pending one) and acknowledged by a 2xx.
    item = models.ForeignKey("inbox.InboxItem", null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                             db_index=False)  # delivery_items
    # The request ids (controlplane.tracing) of the sends whose events it
    # carries, space-separated, the first ones that fit: for its attempts'
    # log lines (webhooks.outbox).
    request_ids = models.CharField(max_length=REQUEST_IDS_MAX, null=True, blank=True, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["subscription"], condition=Q(state="open"),
                                               name="one_open_delivery")]
        indexes = [
            # In the claim's order (webhooks.due.due_sql): it reads due wakes
            # oldest first and stops at its batch, with no sort of the backlog.
            models.Index(fields=["due_at", "id"], name="delivery_due_in_order",
                         condition=Q(state__in=["open", "pending"])),
            models.Index(fields=["claimed_until"], name="delivery_claimed", condition=Q(state="sending")),
            models.Index(fields=["subscription", "id"], name="delivery_unfinished",
                         condition=Q(state__in=["pending", "sending"])),
            models.Index(fields=["subscription", "id"], name="delivery_history"),
            # A delivery's row is written three times (offered, sending,
            # finished), each version into every index it belongs to: the
            # foreign keys that are almost always null (a wake carries no
            # item; few deliveries are replays) index only their non-null
            # rows, which are all their lookups (`= id` implies not null).
            models.Index(fields=["item"], name="delivery_items", condition=Q(item__isnull=False)),
            models.Index(fields=["replay_of"], name="delivery_replays", condition=Q(replay_of__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.public_id


class Attempt(models.Model):
    """One HTTP attempt of a delivery: when, how long, and its outcome (a
    status code or an error class). Never a URL, header or secret."""

    # Indexed by attempt_number, whose first column it is.
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_rows", db_index=False)
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error_class = models.CharField(max_length=64, null=True, blank=True)
    key_id = models.CharField(max_length=40)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="attempt_number")]
