"""Messages and per-recipient handling state."""
from __future__ import annotations

import secrets

from django.db import models
from django.db.models import Q

from controlplane.access import readable_q
from controlplane.clock import now
from controlplane.models import Conversation, Member, Space
from controlplane.tokens import b64url, public_id


def new_message_id() -> str:
    return public_id("msg")


class MessageQuerySet(models.QuerySet):
    def visible_to(self, member: Member | None) -> "MessageQuerySet":
        """Messages `member` may know exist: channel messages of spaces they
        can read, and direct and group messages they take part in."""
        return self.filter(readable_q(member))


class Message(models.Model):
    """An immutable message. The body is stored exactly as sent."""

    public_id = models.CharField(max_length=40, unique=True, default=new_message_id, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    # Indexed by message_conversation_position, whose first column it is.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages", db_index=False)
    # Indexed by message_author_conversation, whose first column it is.
    author = models.ForeignKey(Member, on_delete=models.PROTECT, related_name="+", db_index=False)
    body = models.TextField()
    body_bytes = models.PositiveIntegerField()
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    related_paths = models.JSONField(default=list)
    mentions = models.JSONField(default=list)  # handles notified, in order of first mention
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)
    fingerprint = models.CharField(max_length=64)
    position = models.BigIntegerField()  # of its message.created event
    created_at = models.DateTimeField(default=now)

    objects = MessageQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["author", "idempotency_key"], condition=Q(idempotency_key__isnull=False),
                                    name="message_sender_key_unique"),
        ]
        indexes = [
            models.Index(fields=["conversation", "position"], name="message_conversation_position"),
            # An author's latest message in a conversation (a claimant's in a
            # task's discussion, coordination.claims.silent_since) however
            # many others wrote there; in place of the author's own index.
            models.Index(fields=["author", "conversation", "position"], name="message_author_conversation"),
        ]

    def __str__(self) -> str:
        return self.public_id


class Recipient(models.Model):
    """One recipient's handling of one message, separate from delivery."""

    class State(models.TextChoices):
        PENDING = "pending"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"
        REJECTED = "rejected"  # withdrawn by a revocation barrier before hand-off

    # Indexed by recipient_unique and recipient_member_state, whose first columns they are.
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="recipients", db_index=False)
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+", db_index=False)
    position = models.BigIntegerField()  # the message's, for snapshot order
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    result = models.TextField(null=True, blank=True)
    # The authority this recipient's copy was sent under (explicit_only
    # spaces): the grant and its generation at the time.
    grant = models.ForeignKey("grants.Grant", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    grant_generation = models.PositiveIntegerField(null=True, blank=True)
    rejected_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(null=True, blank=True)  # why it was rejected

    class Meta:
        constraints = [models.UniqueConstraint(fields=["message", "member"], name="recipient_unique")]
        indexes = [models.Index(fields=["member", "state", "position"], name="recipient_member_state")]


def new_delivery_token() -> str:
    """`dlv_` + canonical unpadded base64url of 32 random bytes (43 characters)."""
    return "dlv_" + b64url(secrets.token_bytes(32))


class Admission(models.TextChoices):
    ADMITTED = "admitted"
    UNCLASSIFIED = "unclassified"  # waiting for the firewall
    HELD = "held"  # kept privately for audit; its owner or an admin may release it
    WITHHELD = "withheld"  # its grant is being revoked; the barrier will settle it


class InboxItem(models.Model):
    """One classified, immutable item in a recipient's durable inbox, bound
    to its delivery token before publication. Acknowledgement leaves the row
    as a tombstone, so a token is never rebound to another payload."""

    Admission = Admission

    class State(models.TextChoices):
        PENDING = "pending"
        ACKNOWLEDGED = "acknowledged"
        REJECTED = "rejected"  # a tombstone: withdrawn by a revocation barrier, never handed off

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    token = models.CharField(max_length=47, unique=True, default=new_delivery_token, editable=False)
    kind = models.CharField(max_length=32)
    payload = models.JSONField()
    content_bytes = models.PositiveIntegerField()
    message = models.ForeignKey(Message, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    conversation = models.ForeignKey(Conversation, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # Insertion order: the log position of what produced the item. Positions
    # follow commit order, so order within a conversation is kept.
    position = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=now)
    # The inbox firewall's decision. Only admitted items reach any read path.
    admission = models.CharField(max_length=16, choices=Admission.choices, default=Admission.ADMITTED)
    guidance = models.TextField(null=True, blank=True)  # local policy text, never part of the content
    settled_at = models.DateTimeField(null=True, blank=True)
    # The grant the message was sent to this recipient under, if any.
    grant = models.ForeignKey("grants.Grant", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(null=True, blank=True)  # why it was rejected
    # Whose share of the recipient's mailbox the item counts against (null:
    # a control-plane notice, which counts against no sender's share).
    sender = models.ForeignKey(Member, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                               db_constraint=False, db_index=False)

    class Meta:
        indexes = [
            models.Index(fields=["member", "state", "position", "id"], name="inboxitem_pending",
                         condition=models.Q(admission="admitted")),
            models.Index(fields=["member", "position", "id"], name="inboxitem_unsettled",
                         condition=models.Q(admission="unclassified")),
            # Items a revocation barrier holds back; later items of the same
            # conversation wait behind them.
            models.Index(fields=["member", "conversation", "position"], name="inboxitem_withheld",
                         condition=models.Q(admission="withheld", state="pending")),
            models.Index(fields=["grant"], name="inboxitem_grant_pending",
                         condition=models.Q(grant__isnull=False, state="pending")),
            # The held page (inbox.reads.held_items): without it, a member's
            # held items were found by reading every item they ever had, the
            # acknowledged tombstones included.
            models.Index(fields=["member", "position", "id"], name="inboxitem_held",
                         condition=models.Q(admission="held", state="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.kind} for {self.member_id}"


class Mailbox(models.Model):
    """A recipient's pending inbox content, in bytes: the counter the 10 MiB
    limit is enforced against (raised by a send, lowered by acknowledgement
    or a hold). `firewall` says whether new items wait for classification;
    the row is also the lock that serializes one member's classification."""

    member = models.OneToOneField(Member, primary_key=True, on_delete=models.CASCADE, related_name="+")
    pending_bytes = models.BigIntegerField(default=0)
    firewall = models.BooleanField(default=False)


class MailboxShare(models.Model):
    """One sender's part of a recipient's pending bytes: the counter the
    MAILBOX_SENDER_SHARE limit is enforced against, so one noisy sender
    cannot fill another member's mailbox for everyone."""

    # Indexed by mailboxshare_unique, whose first column it is.
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+", db_index=False)
    sender = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    pending_bytes = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["member", "sender"], name="mailboxshare_unique")]


class FirewallRule(models.Model):
    """One ordered rule of a member's inbox firewall. Every condition given
    must match; the first matching rule decides; no match admits."""

    class Action(models.TextChoices):
        ALLOW = "allow"
        HOLD = "hold"

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    ordinal = models.PositiveSmallIntegerField()
    action = models.CharField(max_length=8, choices=Action.choices)
    sender = models.CharField(max_length=32, null=True, blank=True)  # a handle
    space = models.CharField(max_length=64, null=True, blank=True)  # a slug
    conversation_kind = models.CharField(max_length=16, null=True, blank=True)
    content_pattern = models.CharField(max_length=200, null=True, blank=True)  # a regular expression
    min_bytes = models.PositiveIntegerField(null=True, blank=True)
    guidance = models.TextField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["member", "ordinal"], name="firewallrule_order")]
        ordering = ["member", "ordinal"]


class Collective(models.Model):
    """A collective request (SPEC §7b): a group message whose other members
    answer; one result when all have answered or the deadline passed."""

    class Op(models.TextChoices):
        GATHER = "gather"
        ALL_GATHER = "all_gather"

    class State(models.TextChoices):
        PENDING = "pending"
        COMPLETED = "completed"
        FAILED = "failed"

    message = models.OneToOneField(Message, on_delete=models.CASCADE, related_name="collective")
    op = models.CharField(max_length=16, choices=Op.choices)
    requester = models.ForeignKey(Member, on_delete=models.PROTECT, related_name="+")
    members = models.JSONField()  # the answering members' ids, in membership order
    deadline_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    reason = models.CharField(max_length=32, null=True, blank=True)  # why it failed
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["deadline_at"], name="collective_due", condition=Q(state="pending"))]


class CollectiveAnswer(models.Model):
    """One member's answer: consumed by the result, delivered to nobody else."""

    collective = models.ForeignKey(Collective, on_delete=models.CASCADE, related_name="answers")
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    body = models.TextField()
    answered_at = models.DateTimeField(default=now)
    # The request's Idempotency-Key, if it had one: the same key with another
    # answer is IDEMPOTENCY_CONFLICT, however close together the two came
    # (the route stores its key's record after its work: inbox.collectives.answer).
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["collective", "member"], name="one_answer_per_member")]
