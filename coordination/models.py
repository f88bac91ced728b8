"""Tasks, their claims and check-in receipts (SPEC §10)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from controlplane.clock import now
from controlplane.models import Conversation, Member, Space
from controlplane.tokens import public_id


# A task's discussion is a channel named `task:<task id>`: a name no one can
# give a channel (channel names have no colon), so no one can take it first.
TASK_CHANNEL_PREFIX = "task:"


def new_task_id() -> str:
    return public_id("tsk")


class Task(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        CLAIMED = "claimed"
        IN_REVIEW = "in_review"
        DONE = "done"

    public_id = models.CharField(max_length=40, unique=True, default=new_task_id, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    # Its discussion (see TASK_CHANNEL_PREFIX).
    conversation = models.OneToOneField(Conversation, on_delete=models.PROTECT, related_name="task")
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    assignee = models.ForeignKey(Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reviewer = models.ForeignKey(Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    claimant = models.ForeignKey(Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    claimed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(Member, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now, editable=False)
    updated_at = models.DateTimeField(default=now)
    # When the claim sweep looks at this claim next (claimed tasks only): no
    # earlier than its check-in or its expiry could be due. The sweep reads
    # the real silence then, and moves this on.
    sweep_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["sweep_at", "id"], name="task_claim_sweep", condition=Q(status="claimed")),
            models.Index(fields=["space", "status", "id"], name="task_space_status"),
        ]

    def __str__(self) -> str:
        return self.public_id


class CheckinReceipt(models.Model):
    """One check-in per (task, claimant, task update time), however many
    sweeps run, concurrently or not: the unique constraint decides."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+")
    claimant = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="+")
    task_updated_at = models.DateTimeField()
    created_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "claimant", "task_updated_at"],
                                               name="one_checkin_per_claim_update")]


class SweepMark(models.Model):
    """When a periodic scan last ran (a scan runs at most once a minute)."""

    name = models.CharField(max_length=40, primary_key=True)
    last_at = models.DateTimeField()
