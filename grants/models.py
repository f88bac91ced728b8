"""Grants and approval requests (SPEC §5)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from controlplane.clock import now
from controlplane.models import Conversation, Member, Space
from controlplane.tokens import public_id


class Grant(models.Model):
    """Authority to send in an `explicit_only` space, created by a space
    owner or an admin under a client-chosen id.

    `status` moves `active → revoking → revoked` (or `→ expired`), each step
    committed on its own: `revoking` is the barrier's fence, and `ending`
    says which terminal status finishing it reaches. `generation` counts
    status changes; a message records the generation it was authorized
    under, so its authority is active exactly while the grant is still
    active at that generation.
    """

    class Kind(models.TextChoices):
        PROJECT = "project"
        PAIR = "pair"
        ONE_MESSAGE = "one_message"

    class Status(models.TextChoices):
        ACTIVE = "active"
        REVOKING = "revoking"
        REVOKED = "revoked"
        EXPIRED = "expired"

    # Client-chosen, unique within its space: an id another space uses
    # tells nobody that it exists.
    public_id = models.CharField(max_length=68)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    sender = models.ForeignKey(Member, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    recipient = models.ForeignKey(Member, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    ending = models.CharField(max_length=16, choices=Status.choices, null=True, blank=True)
    generation = models.PositiveIntegerField(default=1)
    # The message a one-message grant authorized; it authorizes no other.
    # One message may hold several: a group message approved for two
    # uncovered recipients uses a grant for each (one per recipient). Its
    # lookups go through grant_message_recipient, which leads with it.
    message = models.ForeignKey("inbox.Message", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+", db_index=False)
    created_by = models.ForeignKey(Member, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now)
    barrier_started_at = models.DateTimeField(null=True, blank=True)
    barrier_started_by = models.ForeignKey(Member, null=True, blank=True, on_delete=models.SET_NULL,
                                           related_name="+")  # null: expiry
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["space", "public_id"], name="grant_space_id"),
            # A recipient's copy of a message is sent under one grant.
            models.UniqueConstraint(fields=["message", "recipient"], name="grant_message_recipient",
                                    condition=Q(message__isnull=False)),
        ]
        indexes = [
            models.Index(fields=["public_id"], name="grant_public_id"),
            models.Index(fields=["space", "kind", "status"], name="grant_lookup"),
            models.Index(fields=["expires_at"], name="grant_expiry",
                         condition=Q(status="active", expires_at__isnull=False)),
            models.Index(fields=["status"], name="grant_barrier", condition=Q(status="revoking")),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE and (self.expires_at is None or self.expires_at > now())


def new_approval_request_id() -> str:
    return public_id("apr")


class ApprovalRequest(models.Model):
    """A send that lacked authority, retained exactly (sender, recipients,
    key, body, collective, fingerprint) for an admin to approve or deny. Approval sends
    this retained message and nothing else; nobody can edit it."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"

    public_id = models.CharField(max_length=40, unique=True, default=new_approval_request_id, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    sender = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    # The recipients no grant covered, as member pks in send order.
    recipients = models.JSONField()
    # Of those, the participants away from the space when it was retained
    # (a direct or group conversation's): the send gets them no copy, and
    # they read the conversation once back.
    away = models.JSONField(default=list, blank=True)
    idempotency_key = models.CharField(max_length=128)
    body = models.TextField()
    reply_to = models.CharField(max_length=40, null=True, blank=True)
    related_paths = models.JSONField(default=list)
    # A collective request's `{"op", "deadline_ms"}`, as sent; null otherwise.
    collective = models.JSONField(null=True, blank=True)
    fingerprint = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(default=now)
    decided_by = models.ForeignKey(Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(null=True, blank=True)
    message = models.OneToOneField("inbox.Message", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sender", "idempotency_key"], name="approval_sender_key")]
        indexes = [models.Index(fields=["status", "created_at"], name="approval_queue")]

    def __str__(self) -> str:
        return self.public_id
