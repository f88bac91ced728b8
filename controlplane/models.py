"""Core records: members, credentials, spaces, memberships, conversations,
the host-wide event log and idempotency records."""
from __future__ import annotations

from django.conf import settings
from django.contrib.sessions.base_session import AbstractBaseSession
from django.core.exceptions import ValidationError
from django.db import models

from controlplane.clock import now
from controlplane.tokens import public_id


def new_member_id() -> str:
    return public_id("mem")


def new_credential_id() -> str:
    return public_id("crd")


def new_space_id() -> str:
    return public_id("spc")


def new_conversation_id() -> str:
    return public_id("cnv")


class Member(models.Model):
    class Kind(models.TextChoices):
        HUMAN = "human"
        AGENT = "agent"
        OPERATOR = "operator"

    class Status(models.TextChoices):
        ACTIVE = "active"
        SUSPENDED = "suspended"

    public_id = models.CharField(max_length=40, unique=True, default=new_member_id, editable=False)
    handle = models.CharField(max_length=32, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.AGENT)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    is_admin = models.BooleanField(default=False)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="member")
    created_at = models.DateTimeField(default=now, editable=False)

    # DRF treats the authenticated principal as `request.user`.
    is_authenticated = True
    is_anonymous = False

    def __str__(self) -> str:
        return f"@{self.handle}"

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE

    @classmethod
    def take_turns(cls, member_id: int) -> None:
        """Lock the member's row until the transaction ends, so that what
        they create or remove (spaces, groups, endpoints, subscriptions,
        approval requests) takes turns and a count read under it holds. A
        no-key lock: rows that refer to the member stay free to write."""
        cls.objects.select_for_update(no_key=True).filter(pk=member_id).first()


class Credential(models.Model):
    """A bearer credential. Only the token's hash is stored."""

    public_id = models.CharField(max_length=40, unique=True, default=new_credential_id, editable=False)
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="credentials")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    name = models.CharField(max_length=100, blank=True, default="", help_text="its owner's label")
    created_at = models.DateTimeField(default=now, editable=False)

    def __str__(self) -> str:
        return self.public_id


class Space(models.Model):
    class Visibility(models.TextChoices):
        OPEN = "open"
        REQUEST = "request"
        PRIVATE = "private"

    class SendPolicy(models.TextChoices):
        OPEN = "open"
        EXPLICIT_ONLY = "explicit_only"

    public_id = models.CharField(max_length=40, unique=True, default=new_space_id, editable=False)
    slug = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.OPEN)
    send_policy = models.CharField(max_length=16, choices=SendPolicy.choices, default=SendPolicy.OPEN)
    archived = models.BooleanField(default=False)
    created_by = models.ForeignKey(Member, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now, editable=False)

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        """A space's send policy may tighten, never relax (the admin's form
        asks here): messages sent under explicit_only keep the grants they
        were sent under, and the read paths look for revoked ones only in
        explicit_only spaces (inbox.render.may_withhold), so relaxing one
        would show bodies whose authority was revoked."""
        if (self.pk and self.send_policy != self.SendPolicy.EXPLICIT_ONLY
                and Space.objects.filter(pk=self.pk, send_policy=self.SendPolicy.EXPLICIT_ONLY).exists()):
            raise ValidationError({"send_policy": "An explicit_only space stays explicit_only: its messages keep "
                                                  "the grants they were sent under."})


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        MEMBER = "member"
        OBSERVER = "observer"

    class Status(models.TextChoices):
        PENDING = "pending"  # asked to join a `request` space
        ACTIVE = "active"
        REMOVED = "removed"

    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="memberships")
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(default=now, editable=False)
    updated_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["space", "member"], name="membership_unique")]
        indexes = [models.Index(fields=["member", "status"], name="membership_member_status")]


class Conversation(models.Model):
    class Kind(models.TextChoices):
        CHANNEL = "channel"
        DIRECT = "direct"
        GROUP = "group"

    public_id = models.CharField(max_length=40, unique=True, default=new_conversation_id, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="conversations")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=80, null=True, blank=True)
    # "#name", "direct:<id>:<id>" (sorted) or "group:<id>,<id>,…" (in order):
    # uniqueness of the address makes get-or-create race-free.
    address = models.CharField(max_length=2000)
    created_by = models.ForeignKey(Member, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["space", "address"], name="conversation_address_unique")]

    def __str__(self) -> str:
        return self.public_id


class Participant(models.Model):
    """A member of a direct or group conversation, in order."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="participants")
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="participations")
    ordinal = models.PositiveSmallIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["conversation", "member"], name="participant_unique")]
        indexes = [models.Index(fields=["member", "conversation"], name="participant_member")]
        ordering = ["ordinal"]


class Event(models.Model):
    """One entry of the host-wide log. `position` is assigned in commit
    order (see controlplane.log and docs/architecture.md)."""

    position = models.BigIntegerField(primary_key=True)
    kind = models.CharField(max_length=64)
    # No index of its own: `event_space_position` starts with it (with one,
    # a space feed's plan read the whole space through it and sorted).
    space = models.ForeignKey(Space, null=True, on_delete=models.CASCADE, related_name="+", db_index=False)
    conversation = models.ForeignKey(Conversation, null=True, on_delete=models.CASCADE, related_name="+")
    actor = models.ForeignKey(Member, null=True, on_delete=models.SET_NULL, related_name="+")
    # Restricted events (direct and group conversations) are visible to the
    # conversation's participants only, never to the rest of the space.
    restricted = models.BooleanField(default=False)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=now)

    class Meta:
        indexes = [
            models.Index(fields=["space", "position"], name="event_space_position"),
            models.Index(fields=["created_at"], name="event_created_at"),
        ]

    @property
    def public_id(self) -> str:
        return f"ev_{self.position}"


class EventAddressee(models.Model):
    """Who an event is addressed to: the index behind the inbox feed."""

    # Indexed by addressee_member_position, whose first column it is.
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="addressees")
    # null: a notice about the member's own things (a suspended inbox subscription)
    space = models.ForeignKey(Space, null=True, on_delete=models.CASCADE, related_name="+")

    class Meta:
        indexes = [models.Index(fields=["member", "event"], name="addressee_member_position")]


class LogHead(models.Model):
    """The single row that serializes position assignment.

    `position` is the last assigned position; `floor` is the retention floor
    (every event at or below it may be gone). After a restore from a backup
    (`manage.py restored`), positions go on past `lost_to`, and a cursor
    past `lost_from` (the restored log's head) read events the restore lost."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    position = models.BigIntegerField(default=0)
    floor = models.BigIntegerField(default=0)
    lost_from = models.BigIntegerField(default=0)
    lost_to = models.BigIntegerField(default=0)

    def resync_needed(self, after: int) -> bool:
        """Whether a reader at `after` must start again: events it may have
        read are pruned, lost in a restore, or past the log's head (a
        restore no one marked)."""
        return after < self.floor or self.lost_from < after <= self.lost_to or after > self.position


class IdempotencyRecord(models.Model):
    owner = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    scope = models.CharField(max_length=600)  # method and path
    key = models.CharField(max_length=128)
    fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    # The answer as JSON text, not jsonb (which sorts an object's keys): a
    # replay returns the original body, key order and all (SPEC §2).
    body = models.TextField()
    created_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "scope", "key"], name="idempotency_unique")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created_at")]



class AuditEntry(models.Model):
    """Who did what, for changes no event records (credentials, members,
    firewall rules, releases, receivers). Written by controlplane.audit in
    the change's own transaction; never holds a secret."""

    at = models.DateTimeField(default=now)
    actor = models.ForeignKey(Member, null=True, on_delete=models.SET_NULL, related_name="+")  # null: the system
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=80)  # the public id of what changed
    detail = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["target", "at"], name="audit_target"),
                   models.Index(fields=["actor", "at"], name="audit_actor")]
        verbose_name_plural = "audit entries"


class UserSession(AbstractBaseSession):
    """A web session, with the user it signs in (controlplane.sessions):
    suspending a member deletes their sessions, which Django only refuses
    while the user is inactive and would honour again on reinstatement."""

    user_id = models.IntegerField(null=True, db_index=True)

    @classmethod
    def get_session_store_class(cls):
        from controlplane.sessions import SessionStore

        return SessionStore
